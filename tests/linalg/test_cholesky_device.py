"""The tile Cholesky on a backend (pipeline.linalg.cholesky_device), run here on the host
backends (NumPy and array-api-strict) so that the device-generic code cannot rot while no
GPU checks it; the CuPy run is tests/linalg/test_cholesky_device_gpu.py."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import scipy.linalg
from _tiles import dies_after, rbf_matrix, rel, write_gram

from pipeline.engine.backend import get_backend
from pipeline.errors import (
    DeviceUnavailableError,
    IncompleteArrayError,
    NonFiniteKernelError,
    NotPositiveDefiniteError,
)
from pipeline.kernels import RBF
from pipeline.linalg.cholesky import tile_cholesky
from pipeline.linalg.cholesky_device import (
    check_device_memory,
    device_block,
    device_cholesky,
    device_factor_fingerprint,
    open_device_factor,
    stored_tiles,
)
from pipeline.linalg.cholesky_options import JitterPolicy

pytest.importorskip("array_api_strict")
BACKENDS = ["numpy", "array_api_strict"]


def _indefinite_once(X):
    """The RBF matrix of ``X`` (γ = 10) less 1e-11 on its diagonal. Where ``X`` repeats one
    row, that direction's eigenvalue is -1e-11, far past rounding, and the next is
    about 1e-8: every backend's POTRF fails at the repeated row, and the first jitter
    (1e-10) recovers it. (An exactly singular K at γ = 0.3 has dozens of eigenvalues at
    rounding level, and where POTRF failed, and whether a jittered tile let the later
    tiles through, depended on the CPU's BLAS kernels.)"""
    K = RBF(gamma=10.0)(X)
    K[np.diag_indices_from(K)] -= 1e-11
    return K


def slicer(K, block):
    def tile_fn(i, j):
        return K[i * block : (i + 1) * block, j * block : (j + 1) * block]

    return tile_fn


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("n, block", [(300, 64), (333, 100), (256, 128)])
def test_factor_and_solve_match_numpy_and_scipy(name, n, block):
    be = get_backend(name)
    K = rbf_matrix(n, seed=n)
    before = K.copy()
    shift = 1e-3
    f = device_cholesky(be, slicer(K, block), n, block, shift=shift, lam=shift)
    ref = np.linalg.cholesky(K + shift * np.eye(n))
    L = f.to_numpy()
    assert rel(L, ref) < 1e-12
    assert np.array_equal(np.triu(L, 1), np.zeros_like(L))
    np.testing.assert_array_equal(K, before)  # the caller's matrix is not written
    cho = scipy.linalg.cho_factor(K + shift * np.eye(n), lower=True)
    rng = np.random.default_rng(0)
    y, Y = rng.standard_normal(n), rng.standard_normal((n, 3))
    for rhs in (y, Y):
        x = f.solve(rhs)
        assert x.shape == rhs.shape
        assert rel(x, scipy.linalg.cho_solve(cho, rhs)) < 1e-10
    T = -(-n // block)
    assert f.info["tiles_computed"] == T * (T + 1) // 2 and f.info["tiles_resumed"] == 0
    assert f.info["evictions"] == 0 and f.info["gflops"] > 0
    assert len(f.tiles) == T * (T + 1) // 2
    f.free()
    with pytest.raises(RuntimeError, match="freed"):
        f.solve(y)


def test_in_place_on_numpy_the_gram_tile_becomes_the_factor_tile():
    be = get_backend("numpy")
    n, block = 200, 64
    K = rbf_matrix(n, seed=4)
    given = {}

    def tile_fn(i, j):  # a fresh, owned tile each call, as kernel_block gives
        t = np.array(K[i * block : (i + 1) * block, j * block : (j + 1) * block])
        given[(i, j)] = t
        return t

    f = device_cholesky(be, tile_fn, n, block, shift=1e-3)
    # off-diagonal tiles: the TRSM's result; every diagonal tile is its Gram tile's buffer
    for j in range(-(-n // block)):
        assert np.shares_memory(f.tiles[(j, j)], given[(j, j)])


@pytest.mark.parametrize("name", BACKENDS)
def test_backends_agree(name):
    n, block = 333, 64
    K = rbf_matrix(n, seed=7)
    a = device_cholesky(get_backend("numpy"), slicer(K, block), n, block, shift=1e-4)
    b = device_cholesky(get_backend(name), slicer(K, block), n, block, shift=1e-4)
    assert rel(a.to_numpy(), b.to_numpy()) < 1e-12


@pytest.mark.parametrize("name", BACKENDS)
def test_memory_limit_evicts_and_gives_the_same_bits(name, tmp_path):
    be = get_backend(name)
    n, block = 333, 64  # 6 tile rows, the last ragged
    K = rbf_matrix(n, seed=2)
    full = device_cholesky(be, slicer(K, block), n, block, shift=1e-3)
    tile = block * block * 8
    small = device_cholesky(be, slicer(K, block), n, block, shift=1e-3, memory_limit=5 * tile)
    assert small.info["evictions"] > 0 and small.info["uploads"] > 0
    assert small.info["peak_tile_bytes"] <= 5 * tile
    np.testing.assert_array_equal(small.to_numpy(), full.to_numpy())
    y = np.random.default_rng(1).standard_normal(n)
    np.testing.assert_array_equal(small.solve(y), full.solve(y))
    # evicted tiles come back from the store when there is one
    L = open_device_factor(str(tmp_path), "g", n, block, 1e-3, be)
    stored = device_cholesky(be, slicer(K, block), n, block, shift=1e-3, lam=1e-3, L=L,
                             memory_limit=4 * tile)  # fmt: skip
    assert stored.info["evictions"] > 0
    np.testing.assert_array_equal(stored.to_numpy(), full.to_numpy())
    with pytest.raises(ValueError, match="fewer than 4"):
        device_cholesky(be, slicer(K, block), n, block, shift=1e-3, memory_limit=3 * tile)


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("tiles_held", [19, 26, 33])
def test_the_panel_schedule_gives_the_tile_schedules_bits(name, tiles_held):
    be = get_backend(name)
    n, block = 333, 32  # 11 tile rows (66 tiles), the last ragged
    K = rbf_matrix(n, seed=2)
    full = device_cholesky(be, slicer(K, block), n, block, shift=1e-3)
    limit = tiles_held * block * block * 8
    f = device_cholesky(be, slicer(K, block), n, block, shift=1e-3, memory_limit=limit,
                        schedule="panels")  # fmt: skip
    assert f.info["schedule"] == "panels" and f.info["panels"] > 1
    assert f.info["uploads"] > 0 and f.info["peak_tile_bytes"] <= limit
    np.testing.assert_array_equal(f.to_numpy(), full.to_numpy())
    y = np.random.default_rng(1).standard_normal((n, 2))
    np.testing.assert_array_equal(f.solve(y), full.solve(y))
    # fewer uploads than the tile schedule at the same limit: a tile serves the panel
    tiles = device_cholesky(be, slicer(K, block), n, block, shift=1e-3, memory_limit=limit,
                            schedule="tiles")  # fmt: skip
    np.testing.assert_array_equal(tiles.to_numpy(), full.to_numpy())
    assert f.info["uploads"] < tiles.info["uploads"]


def test_auto_picks_panels_on_a_device_whose_factor_does_not_fit():
    n, block = 333, 64
    K = rbf_matrix(n, seed=2)
    limit = 14 * block * block * 8  # the factor has 21 tiles, the tile order needs 15
    dev = device_cholesky(get_backend("array_api_strict"), slicer(K, block), n, block,
                          shift=1e-3, memory_limit=limit)  # fmt: skip
    host = device_cholesky(get_backend("numpy"), slicer(K, block), n, block, shift=1e-3,
                           memory_limit=limit)  # fmt: skip
    assert dev.info["schedule"] == "panels" and host.info["schedule"] == "tiles"
    same = device_cholesky(get_backend("array_api_strict"), slicer(K, block), n, block,
                           shift=1e-3)  # fmt: skip
    np.testing.assert_array_equal(dev.to_numpy(), same.to_numpy())
    small = device_cholesky(get_backend("array_api_strict"), slicer(K, block), n, block,
                            shift=1e-3, memory_limit=5 * block * block * 8)  # fmt: skip
    assert small.info["schedule"] == "tiles"  # a one-column panel does not fit
    with pytest.raises(ValueError, match="fewer than one tile column's panel needs"):
        device_cholesky(get_backend("numpy"), slicer(K, block), n, block, shift=1e-3,
                        memory_limit=5 * block * block * 8, schedule="panels")  # fmt: skip
    with pytest.raises(ValueError, match="schedule must be"):
        device_cholesky(get_backend("numpy"), slicer(K, block), n, block, shift=1e-3,
                        schedule="rows")  # fmt: skip


@pytest.mark.parametrize("name", BACKENDS)
def test_the_panel_schedule_resumes_bitwise_and_stores_every_tile(name, tmp_path):
    be = get_backend(name)
    n, block = 340, 64  # 6 tile rows, 21 tiles
    K = rbf_matrix(n, seed=5)
    ref = device_cholesky(be, slicer(K, block), n, block, shift=1e-3).to_numpy()
    limit = 14 * block * block * 8
    L = open_device_factor(str(tmp_path), "gram-fp", n, block, 1e-3, be)
    calls = []
    dying = dies_after(14, slicer(K, block), calls)

    with pytest.raises(RuntimeError, match="killed"):
        device_cholesky(be, dying, n, block, shift=1e-3, L=L, memory_limit=limit,
                        schedule="panels")  # fmt: skip
    done = L.markers.done()
    assert 0 < len(done) < 14 and done <= set(calls)  # the finished panels are stored
    f = device_cholesky(be, slicer(K, block), n, block, shift=1e-3, L=L, memory_limit=limit,
                        schedule="panels")  # fmt: skip
    assert f.info["tiles_resumed"] == len(done) and f.info["tiles_computed"] == 21 - len(done)
    np.testing.assert_array_equal(f.to_numpy(), ref)
    np.testing.assert_array_equal(L.zarr("r")[:], np.tril(ref))  # the store holds L
    again = device_cholesky(be, slicer(K, block), n, block, shift=1e-3, L=L, memory_limit=limit,
                            schedule="panels")  # fmt: skip
    assert again.info["tiles_computed"] == 0
    np.testing.assert_array_equal(again.to_numpy(), ref)


@pytest.mark.parametrize("name", BACKENDS)
def test_the_panel_schedule_jitters_fails_and_factors_in_float32_as_the_tile_schedule(
    name, tmp_path
):
    be = get_backend(name)
    n, block = 330, 32  # 11 tile rows
    panels = dict(memory_limit=20 * block * block * 8, schedule="panels")
    X = np.random.default_rng(3).standard_normal((n, 2))
    X[200] = X[199]  # two equal rows (tile 6): K is indefinite there, and only there
    K = _indefinite_once(X)
    with pytest.raises(NotPositiveDefiniteError) as tiles_err:
        device_cholesky(be, slicer(K, block), n, block, shift=0.0, lam=0.0)
    L = open_device_factor(str(tmp_path), "g", n, block, 0.0, be)
    with pytest.raises(NotPositiveDefiniteError) as panel_err:
        device_cholesky(be, slicer(K, block), n, block, shift=0.0, lam=0.0, L=L, **panels)
    assert (
        panel_err.value.tile == tiles_err.value.tile and panel_err.value.row == tiles_err.value.row
    )
    assert L.markers.done()  # the panels before the failing one were stored
    tiles = device_cholesky(be, slicer(K, block), n, block, shift=0.0, lam=0.0, jitter=True)
    f = device_cholesky(be, slicer(K, block), n, block, shift=0.0, lam=0.0, jitter=True, **panels)
    assert f.info["panels"] > 1 and f.jitter == tiles.jitter and f.jitter
    np.testing.assert_array_equal(f.to_numpy(), tiles.to_numpy())
    K2 = rbf_matrix(n, seed=1)
    f32 = device_cholesky(be, slicer(K2, block), n, block, shift=1e-2, dtype="float32",
                          memory_limit=20 * block * block * 4, schedule="panels")  # fmt: skip
    t32 = device_cholesky(be, slicer(K2, block), n, block, shift=1e-2, dtype="float32")
    assert f32.info["panels"] > 1 and f32.to_numpy().dtype == np.float32
    np.testing.assert_array_equal(f32.to_numpy(), t32.to_numpy())


def test_the_panel_schedule_fills_a_host_target_and_keeps_its_upper_triangle():
    be = get_backend("numpy")
    n, block = 333, 64
    K = rbf_matrix(n, seed=3)
    full = device_cholesky(be, slicer(K, block), n, block, shift=1e-3)
    A = np.array(K, order="F")
    f = device_cholesky(
        be, lambda i, j: np.array(slicer(A, block)(i, j)), n, block, shift=1e-3, target=A,
        memory_limit=14 * block * block * 8, schedule="panels",
    )  # fmt: skip
    assert f.info["panels"] > 1
    np.testing.assert_array_equal(np.tril(A), full.to_numpy())
    np.testing.assert_array_equal(np.triu(A, 1), np.triu(K, 1))


def test_a_host_matrix_as_the_target_holds_the_factor_and_keeps_its_upper_triangle():
    # the in-memory dense solve's blocked factor (dense_dual._potrf_blocked) runs this way
    be = get_backend("numpy")
    n, block = 333, 64  # 6 tile rows, the last ragged
    K = rbf_matrix(n, seed=3)
    full = device_cholesky(be, slicer(K, block), n, block, shift=1e-3)
    A = np.array(K, order="F")
    tile = block * block * 8
    f = device_cholesky(
        be, lambda i, j: np.array(slicer(A, block)(i, j)), n, block, shift=1e-3, target=A,
        memory_limit=4 * tile,
    )  # fmt: skip
    assert f.info["evictions"] > 0 and f.info["uploads"] > 0  # tiles came back from A
    np.testing.assert_array_equal(np.tril(A), full.to_numpy())
    np.testing.assert_array_equal(np.triu(A, 1), np.triu(K, 1))
    np.testing.assert_array_equal(f.to_numpy(), full.to_numpy())
    with pytest.raises(ValueError, match="target must be"):
        device_cholesky(be, slicer(K, block), n, block, shift=1e-3, target=A[:-1])


@pytest.mark.parametrize("name", BACKENDS)
def test_resume_after_a_failure_is_bitwise_the_same(name, tmp_path):
    be = get_backend(name)
    n, block = 340, 64
    K = rbf_matrix(n, seed=5)
    ref = device_cholesky(be, slicer(K, block), n, block, shift=1e-3).to_numpy()
    L = open_device_factor(str(tmp_path), "gram-fp", n, block, 1e-3, be)
    calls = []
    dying = dies_after(8, slicer(K, block), calls)

    with pytest.raises(RuntimeError, match="killed"):
        device_cholesky(be, dying, n, block, shift=1e-3, L=L)
    assert L.markers.done() == set(calls)  # every finished tile is stored and marked
    f = device_cholesky(be, slicer(K, block), n, block, shift=1e-3, L=L)
    assert f.info["tiles_resumed"] == 8 and f.info["tiles_computed"] == 21 - 8
    np.testing.assert_array_equal(f.to_numpy(), ref)
    np.testing.assert_array_equal(L.zarr("r")[:], np.tril(ref))  # the store holds L
    again = device_cholesky(be, slicer(K, block), n, block, shift=1e-3, L=L)
    assert again.info["tiles_computed"] == 0
    np.testing.assert_array_equal(again.to_numpy(), ref)


def test_fingerprint_chains_the_cpu_recipe_and_the_backend(tmp_path):
    a = device_factor_fingerprint("g", 1e-3, "sklearn", None, "float64", get_backend("numpy"))
    b = device_factor_fingerprint(
        "g", 1e-3, "sklearn", None, "float64", get_backend("array_api_strict")
    )
    c = device_factor_fingerprint("g", 1e-3, "sklearn", True, "float64", get_backend("numpy"))
    assert len({a, b, c}) == 3
    L = open_device_factor(str(tmp_path), "g", 100, 32, 1e-3, get_backend("numpy"))
    assert L.fingerprint == a and L.zarr("r").attrs["device"] == "numpy"
    with pytest.raises(ValueError, match="block 32"):
        device_cholesky(get_backend("numpy"), None, 100, 64, shift=1e-3, L=L)


@pytest.mark.parametrize("name", BACKENDS)
def test_not_positive_definite_names_the_tile(name):
    be = get_backend(name)
    n, block = 300, 64
    rng = np.random.default_rng(0)
    Q = np.linalg.qr(rng.standard_normal((n, n)))[0]
    ev = np.linspace(1.0, 2.0, n)
    ev[150] = -0.5  # one negative eigenvalue
    K = (Q * ev) @ Q.T
    K = (K + K.T) / 2
    ref_L = np.linalg.cholesky(K[:150, :150])  # the leading block up to 150 is PD
    assert ref_L.shape == (150, 150)
    with pytest.raises(NotPositiveDefiniteError) as e:
        device_cholesky(be, slicer(K, block), n, block, shift=0.0, lam=0.0)
    err = e.value
    assert err.tile[0] == err.tile[1] and err.lam == 0.0 and err.convention == "sklearn"
    assert err.row == err.tile[0] * block + err.pivot - 1
    # LAPACK's unblocked-order answer for the whole matrix: the first leading minor that
    # is not positive definite
    _, info = scipy.linalg.lapack.dpotrf(K, lower=1)
    assert info > 0 and err.row == info - 1


def test_not_positive_definite_as_the_cpu(tmp_path):
    n, block = 200, 64
    K = rbf_matrix(n, seed=3) - 0.05 * np.eye(n)  # K's small eigenvalues pushed below 0
    with pytest.raises(NotPositiveDefiniteError) as cpu:
        tile_cholesky(write_gram(tmp_path, K, block), 1e-3, progress=False)
    with pytest.raises(NotPositiveDefiniteError) as dev:
        device_cholesky(get_backend("numpy"), slicer(K, block), n, block, shift=1e-3)
    assert (dev.value.tile, dev.value.row) == (cpu.value.tile, cpu.value.row)
    assert str(dev.value) == str(cpu.value)


@pytest.mark.parametrize("name", BACKENDS)
def test_jitter_recovers_and_is_recorded(name, tmp_path):
    be = get_backend(name)
    n, block = 200, 64
    X = np.random.default_rng(3).standard_normal((n, 2))
    X[100] = X[99]  # two equal rows: K is indefinite there, and only there
    K = _indefinite_once(X)
    with pytest.raises(NotPositiveDefiniteError):
        device_cholesky(be, slicer(K, block), n, block, shift=0.0, lam=0.0)
    L = open_device_factor(str(tmp_path), "g", n, block, 0.0, be, jitter=True)
    f = device_cholesky(be, slicer(K, block), n, block, shift=0.0, lam=0.0, jitter=True, L=L)
    assert "1.1" in f.jitter and all(v > 0 for v in f.jitter.values())  # rows 99, 100
    assert L.markers.record((1, 1))["jitter"] == f.jitter["1.1"]
    D = np.zeros(n)
    for key, eps in f.jitter.items():
        j = int(key.split(".")[0])
        D[j * block : (j + 1) * block] = eps
    Lf = f.to_numpy()
    assert rel(Lf @ Lf.T, K + np.diag(D)) < 1e-12
    resumed = device_cholesky(be, slicer(K, block), n, block, shift=0.0, jitter=True, L=L)
    assert resumed.jitter == f.jitter


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # inf - inf in the updates
@pytest.mark.parametrize("entry, block_row", [((70, 5), 1), ((150, 150), 2)])
def test_non_finite_kernel(name, entry, block_row):
    n, block = 200, 64
    K = rbf_matrix(n)
    K[entry] = K[entry[::-1]] = np.inf if entry[0] != entry[1] else np.nan
    with pytest.raises(NonFiniteKernelError, match=f"rows of block {block_row}"):
        device_cholesky(get_backend(name), slicer(K, block), n, block, shift=1e-3)


@pytest.mark.parametrize("name", BACKENDS)
def test_stored_gram_route(name, tmp_path):
    be = get_backend(name)
    n, block = 330, 100
    K = rbf_matrix(n, seed=9)
    gram = write_gram(tmp_path, K, block)
    L = open_device_factor(str(tmp_path), gram, n, block, 1e-3, be)
    f = device_cholesky(be, stored_tiles(gram), n, block, shift=1e-3, L=L, lam=1e-3)
    ref = scipy.linalg.cholesky(K + 1e-3 * np.eye(n), lower=True)
    assert rel(f.to_numpy(), ref) < 1e-12
    assert L.markers.done() == set(gram.grid.lower_tiles())
    assert rel(L.zarr("r")[:], ref) < 1e-12
    assert L.markers.record((1, 0))["device"] == name


@pytest.mark.parametrize("schedule", ["tiles", "panels"])
def test_a_failed_store_write_raises_and_the_rerun_resumes_from_the_tiles_stored(
    tmp_path, monkeypatch, schedule
):
    """The write-behind is the engine's TileIO: a store write that fails reaches the
    caller (no hang, no factor returned), the tiles stored before it keep their markers,
    and a rerun on a working store gives the same factor bit for bit."""
    be = get_backend("numpy")
    n, block = 330, 32
    K = rbf_matrix(n, seed=4)
    limit = dict(memory_limit=20 * block * block * 8, schedule=schedule)
    ref = device_cholesky(be, slicer(K, block), n, block, shift=1e-3, **limit)
    L = open_device_factor(str(tmp_path), "g", n, block, 1e-3, be)
    real, writes = type(L).write_tile, []

    def full_disk(self, i, j, tile, **info):
        writes.append((i, j))
        if len(writes) == 30:
            raise OSError("disk full")
        return real(self, i, j, tile, **info)

    with monkeypatch.context() as m:
        m.setattr(type(L), "write_tile", full_disk)
        with pytest.raises(OSError, match="disk full"):
            device_cholesky(be, slicer(K, block), n, block, shift=1e-3, L=L, **limit)
    stored = L.markers.done()
    assert 0 < len(stored) < 66 and (writes[29] not in stored)
    f = device_cholesky(be, slicer(K, block), n, block, shift=1e-3, L=L, **limit)
    assert f.info["tiles_resumed"] == len(stored)
    np.testing.assert_array_equal(f.to_numpy(), ref.to_numpy())


def test_tile_cholesky_on_a_device_backend_runs_the_resident_schedule_and_resumes(tmp_path):
    """The one driver: ``tile_cholesky(gram, lam, backend=be)`` off the NumPy backend is
    the resident-tile schedule over the stored Gram, its tiles stored under the
    backend's fingerprint; a rerun computes nothing and gives the same factor."""
    be = get_backend("array_api_strict")
    n, block = 330, 100
    K = rbf_matrix(n, seed=9)
    gram = write_gram(tmp_path, K, block)
    f = tile_cholesky(gram, 1e-3, backend=be, name="dev", progress=False)
    assert f.info["backend"] == "array_api_strict" and f.info["tiles_resumed"] == 0
    ref = scipy.linalg.cholesky(K + 1e-3 * np.eye(n), lower=True)
    assert rel(f.to_numpy(), ref) < 1e-12
    assert f.L.name == "dev" and f.L.markers.done() == set(gram.grid.lower_tiles())
    assert f.L.fingerprint == device_factor_fingerprint(gram, 1e-3, "sklearn", None, "float64", be)
    again = tile_cholesky(gram, 1e-3, backend=be, name="dev", progress=False)
    assert again.info["tiles_computed"] == 0 and again.info["tiles_resumed"] == 10
    np.testing.assert_array_equal(again.to_numpy(), f.to_numpy())
    host = tile_cholesky(gram, 1e-3, name="host", progress=False)  # no backend: the tasks
    assert not hasattr(host, "info") and rel(host.L.zarr("r")[:], ref) < 1e-12
    on_numpy = tile_cholesky(gram, 1e-3, backend=get_backend("numpy"), name="np", progress=False)
    assert on_numpy.info["backend"] == "numpy" and rel(on_numpy.to_numpy(), ref) < 1e-12


def test_tile_cholesky_on_a_device_backend_refuses_before_any_work(tmp_path):
    """An incomplete Gram and ``keep_gram=False`` are refused before a factor tile is
    made or a store opened (the host's checks, in the one driver)."""
    be = get_backend("array_api_strict")
    gram = write_gram(tmp_path, rbf_matrix(200, seed=2), 64)
    gram.markers.unmark((2, 1))
    with pytest.raises(IncompleteArrayError, match="1 of 10 lower tiles"):
        tile_cholesky(gram, 1e-3, backend=be, name="dev", progress=False)
    with pytest.raises(ValueError, match="keep_gram=False .* has no array_api_strict schedule"):
        tile_cholesky(gram, 1e-3, backend=be, keep_gram=False, check_gram=False, progress=False)
    assert not (tmp_path / "dev").exists()


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("schedule", ["tiles", "panels"])
def test_a_stored_gram_read_ahead_gives_the_same_factor_and_resumes(name, schedule, tmp_path):
    be = get_backend(name)
    n, block = 330, 32  # 11 tile rows
    K = rbf_matrix(n, seed=9)
    gram = write_gram(tmp_path, K, block)
    limit = dict(memory_limit=20 * block * block * 8, schedule=schedule)
    ref = device_cholesky(be, stored_tiles(gram), n, block, shift=1e-3, **limit)
    readers, asked = set(), []

    def reading(i, j):
        readers.add(threading.current_thread().name)
        asked.append((i, j))
        return stored_tiles(gram)(i, j)

    f = device_cholesky(be, reading, n, block, shift=1e-3, read_ahead=3, **limit)
    np.testing.assert_array_equal(f.to_numpy(), ref.to_numpy())
    assert all(r.startswith("tile-read") for r in readers) and len(asked) == 66
    L = open_device_factor(str(tmp_path), gram, n, block, 1e-3, be)
    calls = []
    dying = dies_after(40, stored_tiles(gram), calls)

    with pytest.raises(RuntimeError, match="killed"):
        device_cholesky(be, dying, n, block, shift=1e-3, L=L, read_ahead=3, **limit)
    done = L.markers.done()
    asked.clear()
    g = device_cholesky(be, reading, n, block, shift=1e-3, L=L, read_ahead=3, **limit)
    assert g.info["tiles_resumed"] == len(done) > 0 and len(asked) == 66 - len(done)
    np.testing.assert_array_equal(g.to_numpy(), ref.to_numpy())


def test_float32_factor():
    be = get_backend("numpy")
    n, block = 200, 64
    K = rbf_matrix(n, seed=1)
    f = device_cholesky(be, slicer(K, block), n, block, shift=1e-2, dtype="float32")
    L = f.to_numpy()
    assert L.dtype == np.float32
    assert rel(L, np.linalg.cholesky(K + 1e-2 * np.eye(n))) < 1e-5


class _FakeGPU:
    """A backend that reports device memory, for the size checks."""

    name = "fake-gpu"

    def __init__(self, free):
        self.free = free

    def memory(self):
        return self.free, 2 * self.free


def test_device_block_and_memory_check():
    assert device_block(1000, get_backend("numpy")) == 256
    assert device_block(100, get_backend("array_api_strict")) == 100
    big = _FakeGPU(140 * 2**30)
    assert device_block(100_000, big) == 4096
    assert device_block(1000, big) == 1000
    small = _FakeGPU(2**30)  # 1 GiB free: a 4096 column of a 100k factor needs 3.4 GiB
    b = device_block(100_000, small)
    assert 128 <= b < 4096 and b % 128 == 0
    check_device_memory(get_backend("numpy"), 10**6, 4096)  # the host: never raises
    check_device_memory(big, 100_000, 4096)
    with pytest.raises(DeviceUnavailableError, match=r"use block=\d+") as e:
        check_device_memory(small, 100_000, 4096)
    fit = int(str(e.value).split("use block=")[1].split(" ")[0])
    check_device_memory(small, 100_000, fit)  # the size it names fits
    with pytest.raises(DeviceUnavailableError, match="no tile size fits"):
        check_device_memory(_FakeGPU(2**20), 100_000, 4096)


def test_jitter_policy_object_accepted():
    be = get_backend("numpy")
    K = rbf_matrix(100)
    f = device_cholesky(be, slicer(K, 64), 100, 64, shift=1e-3, jitter=JitterPolicy())
    assert f.jitter == {}
