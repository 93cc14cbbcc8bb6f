"""The fused evaluators for Matérn (nu = 1/2, 3/2, 5/2) and ARD RBF against scikit-learn's
kernels: every entry point, several chunkings with ragged last blocks, float32, threads."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.gaussian_process.kernels import RBF as GPRBF
from sklearn.gaussian_process.kernels import Matern as GPMatern

from pipeline.engine import evaluators, is_fused, kernel_matvec, kernel_tile, predict_accumulate
from pipeline.engine.dense import kernel_matrix, kernel_predict
from pipeline.kernels import RBF, Matern
from pipeline.linalg.matvec import MatrixFreeKernelOperator

LS = [0.8, 2.5, 1.3, 0.6, 1.7]
KERNELS = [
    Matern(nu=0.5, length_scale=1.7),
    Matern(nu=1.5, length_scale=2.2),
    Matern(nu=2.5, length_scale=1.9),
    Matern(nu=0.5, length_scale=LS),
    Matern(nu=1.5, length_scale=LS),
    Matern(nu=2.5, length_scale=np.array(LS)),
    RBF(length_scale=LS),
]
#: several sub-block shapes: the default, small ones with ragged edges everywhere, tall ones
BLOCKS = [None, (16, 40), (7, 300)]
#: float32 kernel values: the Matérn distance near 0 is the root of a float32 cancellation
TOL32 = 2e-5


class MyMatern(Matern):
    """Not the Matern class itself: the generic path, never the fused one."""


def _sk(kernel):
    ls = np.asarray(kernel.length_scale, dtype=float)
    if isinstance(kernel, Matern):
        return GPMatern(nu=kernel.nu, length_scale=ls)
    return GPRBF(length_scale=ls)


def _rel(a, b):
    """Entrywise relative error (kernel values are positive)."""
    return float(np.max(np.abs(a - b) / np.abs(b)))


def _normwise(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(45)
    X = rng.normal(size=(203, 5)) + 3.0  # off the origin: exercises the centring
    Y = rng.normal(size=(131, 5)) + 3.0
    return X, Y, rng.normal(size=(131, 3)), rng.normal(size=(203, 3))


@pytest.mark.parametrize("kernel", KERNELS, ids=repr)
@pytest.mark.parametrize("block_shape", BLOCKS)
def test_tiles_match_scikit_learn(data, kernel, block_shape):
    X, Y = data[0], data[1]
    assert is_fused(kernel)
    ref = _sk(kernel)
    T = np.empty((203, 131))
    kernel_tile(kernel, X, Y, T, n_threads=2, block_shape=block_shape)
    assert _rel(T, ref(X, Y)) <= 1e-12
    S = np.empty((203, 203))
    kernel_tile(kernel, X, None, S, n_threads=2, block_shape=block_shape)
    assert np.array_equal(S, S.T) and np.all(np.diag(S) == 1.0)
    assert _rel(S, ref(X)) <= 1e-12
    S32 = np.empty((203, 203), dtype=np.float32)
    kernel_tile(kernel, X, None, S32, kernel_dtype="float32", block_shape=block_shape)
    assert np.array_equal(S32, S32.T) and _rel(S32, ref(X)) <= TOL32


@pytest.mark.parametrize("kernel", KERNELS, ids=repr)
@pytest.mark.parametrize("block_shape", BLOCKS)
@pytest.mark.parametrize("kd", ["float64", "float32"])
def test_matvec_symmetric_pair_and_diagonal_tile(data, kernel, block_shape, kd):
    X, Y, V, Vi = data
    ref = _sk(kernel)
    K, KX = ref(X, Y), ref(X)
    tol = 1e-12 if kd == "float64" else TOL32
    out, out_t = np.zeros((203, 3)), np.zeros((131, 3))
    kernel_matvec(
        kernel, X, Y, V, out, True, Vi=Vi, out_t=out_t, kernel_dtype=kd, block_shape=block_shape
    )
    assert _normwise(out, K @ V) <= tol and _normwise(out_t, K.T @ Vi) <= tol
    d = np.zeros(203)
    kernel_matvec(kernel, X, None, Vi[:, 0], d, kernel_dtype=kd, block_shape=block_shape)
    assert _normwise(d, KX @ Vi[:, 0]) <= tol


@pytest.mark.parametrize("shape", [(1, 1), (1, 57), (57, 1), (300, 517), (513, 257)])
def test_ragged_shapes_prediction_and_dense_entry_points(shape):
    rng = np.random.default_rng(2)
    X, Y = rng.normal(size=(shape[0], 5)), rng.normal(size=(shape[1], 5))
    A = rng.normal(size=(shape[1], 2))
    for kernel in (Matern(nu=2.5, length_scale=LS), RBF(length_scale=LS), Matern(nu=0.5)):
        ref = _sk(kernel)(X, Y)
        out = np.zeros((shape[0], 2))
        predict_accumulate(kernel, X, Y, A, out, n_threads=2)
        assert _normwise(out, ref @ A) <= 1e-12
        assert _rel(kernel_matrix(kernel, X, Y), ref) <= 1e-12
        assert _normwise(kernel_predict(kernel, X, Y, A), ref @ A) <= 1e-12


@pytest.mark.parametrize("kernel", KERNELS[2:], ids=repr)
@pytest.mark.parametrize("block_size", [64, 100])  # 203 rows: ragged last tiles
def test_operator_over_tilings(data, kernel, block_size):
    X, v = data[0], data[3][:, 0]
    op = MatrixFreeKernelOperator(X, kernel, 0.1, block_size=block_size, n_threads=2)
    assert _normwise(op.matvec(v), _sk(kernel)(X) @ v + 0.1 * v) <= 1e-12


@pytest.mark.parametrize(
    "kernel", [Matern(nu=1.5, length_scale=LS), RBF(length_scale=LS)], ids=repr
)
@pytest.mark.parametrize("kd", ["float64", "float32"])
def test_bitwise_reproducible_across_runs_and_threads(kernel, kd):
    rng = np.random.default_rng(3)
    X, Y = rng.normal(size=(700, 5)), rng.normal(size=(333, 5))
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


def test_subclass_takes_the_generic_path_with_the_same_values(data):
    X, Y = data[0], data[1]
    k = MyMatern(nu=2.5, length_scale=LS)
    assert not is_fused(k)
    T = np.empty((203, 131))
    kernel_tile(k, X, Y, T, block_shape=(16, 40))
    assert _rel(T, _sk(k)(X, Y)) <= 1e-12


def test_float32_refuses_what_overflows_and_checks_the_width(data):
    X, Y = data[0], data[1]
    tiny = Matern(nu=0.5, length_scale=[1e-20] * 5)
    with pytest.raises(ValueError, match="float32"):
        kernel_tile(tiny, X, Y, np.empty((203, 131)), kernel_dtype="float32")
    with pytest.raises(ValueError, match="length_scale has 2 entries but X has 5 features"):
        evaluators.prepare(Matern(length_scale=[1.0, 2.0]), X, Y, np.float64)
    with pytest.raises(ValueError, match="length_scale has 2 entries but X has 5 features"):
        kernel_tile(RBF(length_scale=[1.0, 2.0]), X, Y, np.empty((203, 131)))


def test_duplicate_rows_in_an_off_diagonal_tile():
    """r of two equal rows comes from |x|² + |y|² - 2x·y: its rounding, square-rooted, is
    what the kinked nu = 1/2 kernel shows (docs/PERFORMANCE.md); the smooth ones do not."""
    rng = np.random.default_rng(1)
    X = rng.normal(size=(100, 5)) * 3 + 10
    for nu, tol in ((0.5, 1e-6), (1.5, 1e-12), (2.5, 1e-12)):
        out = np.empty((100, 50))
        kernel_tile(Matern(nu=nu), X, X[:50].copy(), out)
        assert np.max(np.abs(np.diag(out[:50]) - 1.0)) <= tol
