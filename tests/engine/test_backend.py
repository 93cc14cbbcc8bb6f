"""The backend seam (:mod:`pipeline.engine.backend`): per-tile linear algebra on every
backend, and the resolution of the user's ``device``.

NumPy and array-api-strict run here (CI); CuPy runs where it and a GPU exist
(``workflows/benchmarks/gpu_check.sh``), with the same assertions."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from pipeline.engine import backend as B
from pipeline.errors import DeviceUnavailableError


def _have_gpu() -> bool:
    return B.cuda_available()[0]


BACKENDS = [
    "numpy",
    "array_api_strict",
    pytest.param(
        "cupy",
        marks=[pytest.mark.gpu, pytest.mark.skipif(not _have_gpu(), reason="no CuPy/GPU")],
    ),
]


@pytest.fixture(params=BACKENDS)
def be(request):
    if request.param == "array_api_strict":
        pytest.importorskip("array_api_strict")
    return B.get_backend(request.param)


def _spd(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((n, n))
    return A @ A.T + n * np.eye(n)


@pytest.mark.parametrize("n", [1, 7, 64])
def test_cholesky_lower_factors_and_zeroes_the_upper_triangle(be, n):
    A = _spd(n)
    L, info = be.cholesky_lower(be.asarray(A))
    L = be.to_numpy(L)
    assert info == 0
    np.testing.assert_allclose(L @ L.T, A, rtol=1e-13, atol=1e-12 * n)
    assert not np.triu(L, 1).any()
    np.testing.assert_allclose(L, np.linalg.cholesky(A), rtol=1e-12, atol=1e-13)


def test_cholesky_lower_reports_the_failing_column_as_lapack(be):
    A = _spd(20)
    A[5, 5] = -1.0
    _, info = be.cholesky_lower(be.asarray(A))
    assert info == 6


def test_cholesky_lower_in_place_uses_the_callers_buffer_where_it_can(be):
    A = _spd(16)
    a = be.asarray(A.copy())  # (NumPy's asarray is the same buffer: it is overwritten)
    L, info = be.cholesky_lower(a, overwrite=True)
    assert info == 0
    np.testing.assert_allclose(be.to_numpy(L), np.linalg.cholesky(A), rtol=1e-12, atol=1e-13)
    if be.name == "numpy":
        assert np.shares_memory(L, a)
    elif be.name == "cupy":
        assert L.data.ptr == a.data.ptr


@pytest.mark.parametrize("trans", [False, True])
def test_solve_triangular_and_trsm(be, trans):
    A = _spd(30, 1)
    Ln = np.linalg.cholesky(A)
    L = be.asarray(Ln)
    rng = np.random.default_rng(2)
    Y = rng.standard_normal((30, 3))
    X = be.to_numpy(be.solve_triangular(L, be.asarray(Y), lower=True, trans=trans))
    np.testing.assert_allclose((Ln.T if trans else Ln) @ X, Y, rtol=1e-12, atol=1e-12)
    Z = be.to_numpy(be.trsm_right_lower_t(L, be.asarray(Y.T.copy())))
    np.testing.assert_allclose(Z @ Ln.T, Y.T, rtol=1e-12, atol=1e-12)


def test_gemm_nt_sub(be):
    rng = np.random.default_rng(3)
    a, x, y = (
        rng.standard_normal((9, 11)),
        rng.standard_normal((9, 4)),
        rng.standard_normal((11, 4)),
    )
    out = be.to_numpy(be.gemm_nt_sub(be.asarray(a.copy()), be.asarray(x), be.asarray(y)))
    np.testing.assert_allclose(out, a - x @ y.T, rtol=1e-14, atol=1e-14)


def test_syrk_lower_sub_updates_the_lower_triangle(be):
    rng = np.random.default_rng(4)
    a, x = rng.standard_normal((9, 9)), rng.standard_normal((9, 4))
    out = be.to_numpy(be.syrk_lower_sub(be.asarray(a.copy()), be.asarray(x)))
    np.testing.assert_allclose(np.tril(out), np.tril(a - x @ x.T), rtol=1e-14, atol=1e-14)


def test_round_trip_and_dtype(be):
    a = np.arange(6.0).reshape(2, 3)
    d = be.asarray(a, dtype="float32")
    back = be.to_numpy(d)
    assert back.dtype == np.float32
    np.testing.assert_array_equal(back, a)
    be.synchronize()
    mem = be.memory()
    assert (mem is None) == (be.device == "cpu")


def test_unknown_backend_and_device_are_refused_with_the_choices():
    with pytest.raises(ValueError, match="unknown backend 'torch'.*numpy"):
        B.get_backend("torch")
    with pytest.raises(ValueError, match="device must be one of .*'gpu'"):
        B.resolve_device("gpu")


def test_cpu_device_is_numpy():
    be, why = B.resolve_device("cpu")
    assert be.name == "numpy" and "cpu" in why


def test_cuda_without_a_gpu_names_the_extra(monkeypatch):
    monkeypatch.setattr(B, "cuda_available", lambda: (False, "CuPy is not installed (x)"))
    with pytest.raises(DeviceUnavailableError, match=r"krr-pipeline\[gpu\]") as e:
        B.resolve_device("cuda")
    assert isinstance(e.value, ValueError)
    assert "CuPy is not installed" in str(e.value)


def test_auto_falls_back_to_the_cpu_with_a_log_line(monkeypatch, caplog):
    monkeypatch.setattr(B, "cuda_available", lambda: (False, "CuPy finds no CUDA device"))
    with caplog.at_level(logging.INFO, logger="pipeline.engine.backend"):
        be, why = B.resolve_device("auto")
    assert be.name == "numpy"
    assert "fell back to the CPU" in why and "no CUDA device" in why
    assert "running on the CPU" in caplog.text


@pytest.mark.gpu
@pytest.mark.skipif(not _have_gpu(), reason="no CuPy/GPU")
def test_auto_picks_the_gpu_when_there_is_one():
    be, why = B.resolve_device("auto")
    assert be.name == "cupy" and "found a GPU" in why


def test_tile_copies_round_trip_and_make_reserved_host_tiles_ahead(be):
    xp = be.xp
    copies = B.TileCopies(be)
    shapes = {(0, 0): (64, 64), (1, 0): (37, 64)}  # a ragged one
    copies.reserve(shapes, "float64")
    rng = np.random.default_rng(0)
    for key, shape in shapes.items():
        host = copies.host_tile(key, shape, "float64")
        assert host.shape == shape and host.dtype == np.float64 and not host.any()
        src = be.asarray(rng.standard_normal(shape))
        copies.download(key, src, host)
        copies.downloaded(key)
        np.testing.assert_array_equal(host, be.to_numpy(src))
        slot = copies.slot(64 * 64, "float64")
        tile, ticket = copies.upload(key, host, slot)
        copies.ready(ticket)
        np.testing.assert_array_equal(be.to_numpy(xp.asarray(tile)), host)
        copies.release(slot)
    # a host tile asked for in another shape than reserved, or never reserved: made now
    copies.reserve({"x": (8, 8)}, "float64")
    assert copies.host_tile("x", (4, 4), "float64").shape == (4, 4)
    assert copies.host_tile("y", (3, 5), "float32").dtype == np.float32
    copies.reserve({"z": (8, 8)}, "float64")
    copies.close()  # what nobody asked for is dropped
    assert copies.host_tile("z", (8, 8), "float64").shape == (8, 8)
    copies.synchronize()
