"""The tile Cholesky on the GPU (CuPy): the same checks as test_cholesky_device.py, plus
agreement with cupy.linalg.cholesky, in-place device tiles and an N=8192 timing (printed,
not asserted). Skipped without CuPy or without a CUDA device."""

from __future__ import annotations

import time

import numpy as np
import pytest
import scipy.linalg
from _tiles import dies_after, rbf_matrix, rel, write_gram

cupy = pytest.importorskip("cupy")
try:
    _N_GPUS = int(cupy.cuda.runtime.getDeviceCount())
except Exception:  # noqa: BLE001 - CUDA raises its own runtime errors
    _N_GPUS = 0
if _N_GPUS == 0:
    pytest.skip("no CUDA device", allow_module_level=True)

from pipeline.engine.backend import get_backend  # noqa: E402
from pipeline.errors import DeviceUnavailableError, NotPositiveDefiniteError  # noqa: E402
from pipeline.linalg.cholesky_device import (  # noqa: E402
    check_device_memory,
    device_block,
    device_cholesky,
    open_device_factor,
    stored_tiles,
)


@pytest.fixture(scope="module")
def be():
    return get_backend("cupy")


def slicer(K, block):
    def tile_fn(i, j):
        return K[i * block : (i + 1) * block, j * block : (j + 1) * block]

    return tile_fn


def device_slicer(K, block, given=None):
    """Gram tiles made on the device (fresh CuPy arrays, as kernel_block gives)."""
    Kd = cupy.asarray(K)

    def tile_fn(i, j):
        t = cupy.array(Kd[i * block : (i + 1) * block, j * block : (j + 1) * block], order="C")
        if given is not None:
            given[(i, j)] = t
        return t

    return tile_fn


@pytest.mark.parametrize("n, block", [(700, 128), (650, 100)])
def test_matches_cupy_numpy_and_scipy(be, n, block):
    K = rbf_matrix(n, seed=n)
    shift = 1e-3
    f = device_cholesky(be, slicer(K, block), n, block, shift=shift)
    L = f.to_numpy()
    ref = cupy.linalg.cholesky(cupy.asarray(K + shift * np.eye(n))).get()
    assert rel(L, ref) < 1e-10
    assert rel(L, np.linalg.cholesky(K + shift * np.eye(n))) < 1e-10
    host = device_cholesky(get_backend("numpy"), slicer(K, block), n, block, shift=shift)
    assert rel(L, host.to_numpy()) < 1e-10  # across backends
    cho = scipy.linalg.cho_factor(K + shift * np.eye(n), lower=True)
    rng = np.random.default_rng(0)
    for rhs in (rng.standard_normal(n), rng.standard_normal((n, 3))):
        assert rel(f.solve(rhs), scipy.linalg.cho_solve(cho, rhs)) < 1e-10
    again = device_cholesky(be, slicer(K, block), n, block, shift=shift)
    np.testing.assert_array_equal(again.to_numpy(), L)  # bitwise reproducible


def test_device_tiles_are_factored_in_place(be):
    n, block = 512, 128
    K = rbf_matrix(n, seed=1)
    given = {}
    f = device_cholesky(be, device_slicer(K, block, given), n, block, shift=1e-3)
    for j in range(n // block):
        assert f.tiles[(j, j)].data.ptr == given[(j, j)].data.ptr  # POTRF in place
    assert rel(f.to_numpy(), np.linalg.cholesky(K + 1e-3 * np.eye(n))) < 1e-10


def test_memory_limit_and_resume_bitwise(be, tmp_path):
    n, block = 650, 128
    K = rbf_matrix(n, seed=2)
    full = device_cholesky(be, device_slicer(K, block), n, block, shift=1e-3).to_numpy()
    tile = block * block * 8
    small = device_cholesky(be, slicer(K, block), n, block, shift=1e-3, memory_limit=5 * tile)
    assert small.info["evictions"] > 0
    np.testing.assert_array_equal(small.to_numpy(), full)
    L = open_device_factor(str(tmp_path), "g", n, block, 1e-3, be)
    calls = []
    dying = dies_after(7, slicer(K, block), calls)

    with pytest.raises(RuntimeError, match="killed"):
        device_cholesky(be, dying, n, block, shift=1e-3, L=L)
    assert L.markers.done() == set(calls)
    f = device_cholesky(be, slicer(K, block), n, block, shift=1e-3, L=L, memory_limit=4 * tile)
    assert f.info["tiles_resumed"] == 7
    np.testing.assert_array_equal(f.to_numpy(), full)
    np.testing.assert_array_equal(L.zarr("r")[:], np.tril(full))


def test_stored_gram_not_pd_and_jitter(be, tmp_path):
    n, block = 400, 128
    K = rbf_matrix(n, seed=9)
    gram = write_gram(tmp_path, K, block)
    L = open_device_factor(str(tmp_path), gram, n, block, 1e-3, be)
    f = device_cholesky(be, stored_tiles(gram), n, block, shift=1e-3, L=L)
    assert rel(L.zarr("r")[:], np.linalg.cholesky(K + 1e-3 * np.eye(n))) < 1e-10
    assert f.info["tiles_computed"] == 10
    bad = K - 0.05 * np.eye(n)
    with pytest.raises(NotPositiveDefiniteError) as e:
        device_cholesky(be, slicer(bad, block), n, block, shift=1e-3)
    _, info = scipy.linalg.lapack.dpotrf(bad + 1e-3 * np.eye(n), lower=1)
    assert e.value.row == info - 1 and e.value.tile == (e.value.row // block,) * 2
    j = device_cholesky(be, slicer(bad, block), n, block, shift=1e-3, jitter=1e-2)
    assert j.jitter


def test_memory_check_and_block(be):
    check_device_memory(be, 100_000, 4096)  # 100k: a 4096 tile column is 3.4 GiB
    assert device_block(100_000, be) == 4096
    n = 10**7  # a 4096 tile column: 328 GB
    with pytest.raises(DeviceUnavailableError, match=r"use block=\d+") as e:
        check_device_memory(be, n, 4096)
    fit = int(str(e.value).split("use block=")[1].split(" ")[0])
    check_device_memory(be, n, fit)


def test_timing_n8192(be):
    n = 8192
    X = cupy.random.default_rng(0).standard_normal((n, 8))
    sq = cupy.sum(X * X, axis=1)
    Kd = cupy.exp(-0.1 * cupy.maximum(sq[:, None] + sq[None, :] - 2 * X @ X.T, 0))
    for block in (1024, 2048, 4096):

        def tile_fn(i, j, block=block):
            s = slice(i * block, (i + 1) * block)
            return cupy.array(Kd[s, j * block : (j + 1) * block], order="C")

        device_cholesky(be, tile_fn, n, block, shift=1e-2)  # warm up (cuBLAS, pool)
        t0 = time.perf_counter()
        f = device_cholesky(be, tile_fn, n, block, shift=1e-2)
        be.synchronize()
        dt = time.perf_counter() - t0
        t1 = time.perf_counter()
        ref = cupy.linalg.cholesky(Kd + 1e-2 * cupy.eye(n))
        be.synchronize()
        dref = time.perf_counter() - t1
        err = float(cupy.linalg.norm(cupy.asarray(f.to_numpy()) - ref) / cupy.linalg.norm(ref))
        print(
            f"\nN={n} block={block}: device_cholesky {dt:.3f} s "
            f"({f.info['gflops']:.0f} GFLOP/s), cupy.linalg.cholesky {dref:.3f} s, rel {err:.1e}"
        )
        assert err < 1e-10
        f.free()


@pytest.mark.parametrize("tiles_held", [19, 33])
def test_the_panel_schedule_streams_and_gives_the_same_bits(be, tmp_path, tiles_held):
    n, block = 1333, 128  # 11 tile rows, the last ragged
    K = rbf_matrix(n, seed=4)
    full = device_cholesky(be, device_slicer(K, block), n, block, shift=1e-3)
    limit = tiles_held * block * block * 8
    f = device_cholesky(be, device_slicer(K, block), n, block, shift=1e-3, memory_limit=limit)
    assert f.info["schedule"] == "panels" and f.info["panels"] > 1 and f.info["uploads"] > 0
    np.testing.assert_array_equal(f.to_numpy(), full.to_numpy())
    y = np.random.default_rng(2).standard_normal((n, 2))
    np.testing.assert_array_equal(f.solve(y), full.solve(y))
    tiles = device_cholesky(be, device_slicer(K, block), n, block, shift=1e-3,
                            memory_limit=limit, schedule="tiles")  # fmt: skip
    np.testing.assert_array_equal(tiles.to_numpy(), full.to_numpy())
    # with a store: every tile stored from its host copy; a killed run resumes bitwise
    L = open_device_factor(str(tmp_path), "g", n, block, 1e-3, be)
    calls = []
    dying = dies_after(25, device_slicer(K, block), calls)

    with pytest.raises(RuntimeError, match="killed"):
        device_cholesky(be, dying, n, block, shift=1e-3, L=L, memory_limit=limit)
    done = L.markers.done()
    assert 0 < len(done) < 25
    g = device_cholesky(be, device_slicer(K, block), n, block, shift=1e-3, L=L,
                        memory_limit=limit)  # fmt: skip
    assert g.info["tiles_resumed"] == len(done) and g.info["schedule"] == "panels"
    np.testing.assert_array_equal(g.to_numpy(), full.to_numpy())
    np.testing.assert_array_equal(L.zarr("r")[:], np.tril(full.to_numpy()))


def test_a_stored_gram_read_ahead_streams_into_the_panels(be, tmp_path):
    n, block = 1333, 128
    K = rbf_matrix(n, seed=6)
    gram = write_gram(tmp_path, K, block)
    full = device_cholesky(be, stored_tiles(gram), n, block, shift=1e-3)
    limit = 19 * block * block * 8
    f = device_cholesky(be, stored_tiles(gram), n, block, shift=1e-3, memory_limit=limit,
                        read_ahead=4)  # fmt: skip
    assert f.info["schedule"] == "panels"
    np.testing.assert_array_equal(f.to_numpy(), full.to_numpy())
