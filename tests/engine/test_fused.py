"""The fused tile engine (pipeline.engine) against the dense kernel(X, Y) @ V."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from pipeline.engine import (
    evaluators,
    is_fused,
    kernel_matvec,
    kernel_tile,
    predict_accumulate,
    task_threads,
)
from pipeline.kernels import RBF, Laplacian, Linear, Polynomial, Warped
from pipeline.kernels.warping import Standardize
from pipeline.linalg.matvec import MatrixFreeKernelOperator

FUSED = [
    RBF(gamma=0.3),
    RBF(length_scale=2.0),
    Laplacian(gamma=0.2),
    Linear(),
    Polynomial(degree=3, coef0=1.0),
    Polynomial(degree=4, gamma=0.5, coef0=0.5),
    Polynomial(degree=2, coef0=0.0),
]
#: normwise relative error max|ours - ref| / max|ref|
TOL64 = 1e-12
#: float32 kernel values: ~1e-7 measured (module docstring of pipeline.engine.fused)
TOL32 = 2e-6
#: small sub-blocks, so that small tests still cross many (ragged) block edges
SMALL = (16, 40)


class MyRBF(RBF):
    """Not the RBF class itself: must take the generic path, never the fused one."""


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(203, 5)) + 3.0  # off the origin: exercises the centring
    Y = rng.normal(size=(131, 5)) + 3.0
    return X, Y, rng.normal(size=(131, 3)), rng.normal(size=(203, 3))


@pytest.mark.parametrize("kernel", FUSED, ids=repr)
@pytest.mark.parametrize("block_shape", [None, SMALL, (7, 300)])
@pytest.mark.parametrize("kd", ["float64", "float32"])
def test_matvec_symmetric_pair_matches_dense(data, kernel, block_shape, kd):
    X, Y, V, Vi = data
    assert is_fused(kernel)
    K = kernel(X, Y)
    out, out_t = np.zeros((203, 3)), np.zeros((131, 3))
    kernel_matvec(
        kernel, X, Y, V, out, True, Vi=Vi, out_t=out_t,
        kernel_dtype=kd, n_threads=2, block_shape=block_shape,
    )  # fmt: skip
    tol = TOL64 if kd == "float64" else TOL32
    assert _rel(out, K @ V) <= tol
    assert _rel(out_t, K.T @ Vi) <= tol


@pytest.mark.parametrize("kernel", FUSED, ids=repr)
@pytest.mark.parametrize("ncols", [None, 1, 4])
@pytest.mark.parametrize("kd", ["float64", "float32"])
def test_diagonal_tile_matches_dense(data, kernel, ncols, kd):
    X = data[0]
    K = kernel(X)
    rng = np.random.default_rng(1)
    v = rng.normal(size=(203,) if ncols is None else (203, ncols))
    out = np.zeros_like(v)
    kernel_matvec(kernel, X, None, v, out, kernel_dtype=kd, block_shape=SMALL)
    assert _rel(out, K @ v) <= (TOL64 if kd == "float64" else TOL32)
    # out += : accumulates onto what is there
    kernel_matvec(kernel, X, None, v, out, kernel_dtype=kd, block_shape=SMALL)
    assert _rel(out, 2 * (K @ v)) <= (TOL64 if kd == "float64" else TOL32)


@pytest.mark.parametrize("shape", [(1, 1), (1, 57), (57, 1), (300, 517), (513, 257)])
def test_ragged_shapes_and_prediction(shape):
    rng = np.random.default_rng(2)
    X, Y = rng.normal(size=(shape[0], 4)), rng.normal(size=(shape[1], 4))
    A = rng.normal(size=(shape[1], 2))
    for kernel in (RBF(gamma=0.5), Laplacian(gamma=0.5)):
        out = np.zeros((shape[0], 2))
        predict_accumulate(kernel, X, Y, A, out, n_threads=2)
        assert _rel(out, kernel(X, Y) @ A) <= TOL64


@pytest.mark.parametrize("kernel", [*FUSED, 2.0 * RBF() + Linear()], ids=repr)
@pytest.mark.parametrize("kd", ["float64", "float32"])
def test_kernel_tile(data, kernel, kd):
    X, Y = data[0], data[1]
    tol = TOL64 if kd == "float64" else TOL32
    T = np.empty((203, 131))
    kernel_tile(kernel, X, Y, T, kernel_dtype=kd, n_threads=2, block_shape=SMALL)
    assert _rel(T, kernel(X, Y)) <= tol
    S = np.empty((203, 203), dtype=np.float32 if kd == "float32" else np.float64)
    kernel_tile(kernel, X, None, S, kernel_dtype=kd, block_shape=SMALL)
    assert np.array_equal(S, S.T)  # a diagonal tile is exactly symmetric
    assert _rel(S, kernel(X)) <= tol


def test_generic_fallback_matches_and_logs_once(data, caplog):
    X, Y, V, Vi = data
    for kernel in (
        MyRBF(gamma=0.3),
        Warped(RBF(gamma=0.3), Standardize(mean=[3.0] * 5, scale=[2.0] * 5)),
    ):
        assert not is_fused(kernel)
        evaluators._logged.discard(type(kernel))  # whatever ran before in this process
        with caplog.at_level(logging.INFO, logger="pipeline.engine.evaluators"):
            caplog.clear()
            for _ in range(3):
                out, out_t = np.zeros((203, 3)), np.zeros((131, 3))
                kernel_matvec(kernel, X, Y, V, out, True, Vi=Vi, out_t=out_t, block_shape=SMALL)
                K = kernel(X, Y)
                assert _rel(out, K @ V) <= TOL64
                assert _rel(out_t, K.T @ Vi) <= TOL64
                d = np.zeros((203, 3))
                kernel_matvec(kernel, X, None, Vi, d, block_shape=SMALL)
                assert _rel(d, kernel(X) @ Vi) <= TOL64
            msgs = [r for r in caplog.records if "generic" in r.getMessage()]
            assert len(msgs) == 1
            assert type(kernel).__name__ in msgs[0].getMessage()


@pytest.mark.parametrize("kernel", [RBF(gamma=0.3), Laplacian(), MyRBF(gamma=0.3)], ids=repr)
@pytest.mark.parametrize("kd", ["float64", "float32"])
def test_bitwise_reproducible_across_runs_and_threads(kernel, kd):
    rng = np.random.default_rng(3)
    X, Y = rng.normal(size=(700, 6)), rng.normal(size=(333, 6))
    V, Vi = rng.normal(size=(333, 2)), rng.normal(size=(700, 2))
    results = []
    for nt in (1, 2, 2, 1):
        out, out_t = np.zeros((700, 2)), np.zeros((333, 2))
        kernel_matvec(kernel, X, Y, V, out, True, Vi=Vi, out_t=out_t, kernel_dtype=kd, n_threads=nt)
        d = np.zeros((700, 2))
        kernel_matvec(kernel, X, None, Vi, d, kernel_dtype=kd, n_threads=nt)
        results.append((out, out_t, d))
    for other in results[1:]:
        for a, b in zip(results[0], other, strict=True):
            assert np.array_equal(a, b)


def test_operator_bitwise_independent_of_inner_threads():
    rng = np.random.default_rng(4)
    X, v = rng.normal(size=(500, 3)), rng.normal(size=500)
    ops = [
        MatrixFreeKernelOperator(X, RBF(gamma=0.5), 0.1, block_size=128, n_threads=n)
        for n in (1, 2)
    ]
    a, b = ops[0].matvec(v), ops[1].matvec(v)
    assert np.array_equal(a, b)
    assert _rel(a, RBF(gamma=0.5)(X) @ v + 0.1 * v) <= TOL64
    # float32 kernel values: opt-in, close, and fingerprinted apart
    op32 = MatrixFreeKernelOperator(X, RBF(gamma=0.5), 0.1, block_size=128, kernel_dtype="float32")
    assert _rel(op32.matvec(v), a) <= TOL32
    assert op32.fingerprint != ops[0].fingerprint


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
def test_float32_refuses_values_that_overflow(data):
    X, Y, V, _ = data
    out = np.zeros((203, 3))
    # (gamma x.y + coef0)^degree reaches ~1e60 here: float32 cannot hold it
    big = Polynomial(degree=30, gamma=1.0, coef0=10.0)
    with pytest.raises(ValueError, match=r"float32.*Polynomial.*kernel_dtype='float64'"):
        kernel_matvec(big, X, Y, V, out, kernel_dtype="float32")
    with pytest.raises(ValueError, match=r"float32.*Polynomial"):
        kernel_tile(big, X, Y, np.empty((203, 131), np.float32), kernel_dtype="float32")
    # data whose squared distances overflow float32
    with pytest.raises(ValueError, match=r"float32.*RBF"):
        kernel_matvec(RBF(gamma=1e-3), X * 1e20, Y * 1e20, V, out, kernel_dtype="float32")
    with pytest.raises(ValueError, match=r"float32.*Linear"):
        kernel_matvec(Linear(), X * 1e20, Y * 1e20, V, out, kernel_dtype="float32")
    # the generic path checks the values it gets
    with pytest.raises(ValueError, match=r"float32.*Scaled"):
        kernel_matvec(1.0 * big, X, Y, V, out, kernel_dtype="float32")
    # float64 has the range: the same call works and matches the dense product
    out[:] = 0
    kernel_matvec(big, X, Y, V, out)
    assert _rel(out, big(X, Y) @ V) <= TOL64


def test_float32_generic_and_fractional_polynomial_paths(data):
    # the generic path rounded float64 rows to float32 before the kernel saw them: data
    # far from the origin lost its differences (1e-3 error against the fused RBF's 1e-6);
    # a polynomial of degree < 1 checked only its value, not the GEMM's base (inf)
    rng = np.random.default_rng(0)
    Xf = 1e4 + rng.standard_normal((300, 4))

    class MyRBF(RBF):  # not fused: the generic path
        pass

    for k in (MyRBF(gamma=1.0), RBF(gamma=1.0) + 0.0 * Linear()):
        tile = np.empty((300, 300), np.float32)
        kernel_tile(k, Xf, Xf, tile, kernel_dtype="float32")
        assert np.abs(tile - k(Xf, Xf)).max() <= 1e-6
    X = np.abs(rng.standard_normal((50, 3))) * 1e19
    V = rng.standard_normal((50, 1))
    with pytest.raises(ValueError, match=r"float32.*Polynomial"):
        kernel_matvec(Polynomial(degree=0.5, gamma=1.0, coef0=1.0), X, X, V, np.zeros((50, 1)),
                      kernel_dtype="float32")  # fmt: skip


def test_argument_errors(data):
    X, Y, V, Vi = data
    with pytest.raises(ValueError, match="kernel_dtype"):
        kernel_matvec(RBF(), X, Y, V, np.zeros((203, 3)), kernel_dtype="float16")
    with pytest.raises(ValueError, match="float64"):
        kernel_matvec(RBF(), X, Y, V, np.zeros((203, 3), np.float32))
    with pytest.raises(ValueError, match=r"shape \(131,\)"):
        kernel_matvec(RBF(), X, Y, Vi, np.zeros((203, 3)))
    with pytest.raises(ValueError, match="Vi= and out_t="):
        kernel_matvec(RBF(), X, Y, V, np.zeros((203, 3)), True)
    with pytest.raises(ValueError, match="off-diagonal"):
        kernel_matvec(RBF(), X, None, Vi, np.zeros((203, 3)), True, Vi=Vi, out_t=Vi.copy())
    with pytest.raises(ValueError, match="n_threads"):
        kernel_matvec(RBF(), X, Y, V, np.zeros((203, 3)), n_threads=0)


def test_task_threads():
    from pipeline.engine import available_cores

    cores = available_cores()
    # as many tasks as cores running at once: one inner thread each
    assert task_threads(10_000, concurrency=cores) == 1
    # a single task: it gets every core
    assert task_threads(1, concurrency=cores) == cores
    # the synchronous scheduler runs one task at a time
    import dask

    with dask.config.set(scheduler="synchronous"):
        assert task_threads(10_000) == cores
    with dask.config.set(num_workers=cores):
        assert task_threads(10_000) == 1


@pytest.mark.parametrize("n", [1, 2, 63, 64, 65, 130, 300, 512])
def test_symmetrize_in_slabs_is_the_triangle_copy(n):
    """The slab mirror of diagonal sub-blocks makes the same copies as one fancy-indexed
    copy of the strict lower triangle: the same bits, the lower triangle untouched."""
    from pipeline.engine.evaluators import _symmetrize

    E = np.random.default_rng(n).standard_normal((n, n))
    ref = E.copy()
    iu = np.triu_indices(n, 1)
    ref[iu] = ref.T[iu]
    low = np.tril(E).copy()
    _symmetrize(E)
    np.testing.assert_array_equal(E, ref)
    np.testing.assert_array_equal(np.tril(E), low)


def test_float32_products_use_twice_the_rows_of_float64():
    """Product sub-blocks: float32 GEMM-family evaluators take 512 x 512 (the bytes of
    float64's 256 x 512); an explicit block_shape is kept as given."""
    from pipeline.engine.evaluators import BLOCK_GEMM, prepare
    from pipeline.engine.fused import _product_block_shape

    X = np.random.default_rng(0).standard_normal((40, 3))
    ev32 = prepare(RBF(gamma=0.5), X, None, np.float32)
    ev64 = prepare(RBF(gamma=0.5), X, None, np.float64)
    assert _product_block_shape(None, ev32) == (2 * BLOCK_GEMM[0], BLOCK_GEMM[1])
    assert _product_block_shape(None, ev64) == BLOCK_GEMM
    assert _product_block_shape((8, 16), ev32) == (8, 16)
