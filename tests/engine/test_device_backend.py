"""pipeline.engine.device on the host backends (numpy, array_api_strict): the
device-generic kernel blocks, matvec, prediction and pieces of K against the kernel
objects' dense K, and DeviceKernelOperator in CG and the Nyström builder.

The GPU file (test_device_gpu.py) runs the same checks on CuPy."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from pipeline.engine import device
from pipeline.engine.backend import get_backend
from pipeline.engine.dense import kernel_matrix, kernel_predict
from pipeline.kernels import RBF, Laplacian, Linear, Matern, Polynomial
from pipeline.kernels.base import Kernel
from pipeline.linalg.cg import conjugate_gradient
from pipeline.linalg.matvec import DeviceKernelOperator, MatrixFreeKernelOperator
from pipeline.linalg.precond import build_nystrom

pytest.importorskip("array_api_strict")

BACKENDS = ["numpy", "array_api_strict"]
D = 5
ARD = np.linspace(0.8, 2.5, D)
KERNELS = [
    RBF(gamma=0.3),
    RBF(length_scale=ARD),
    Matern(nu=0.5, length_scale=1.3),
    Matern(nu=1.5, length_scale=ARD),
    Matern(nu=2.5, length_scale=2.0),
    Matern(nu=2.5, length_scale=ARD),
    Laplacian(gamma=0.2),
    Linear(),
    Polynomial(degree=3, gamma=0.1, coef0=1.0),
]
IDS = [repr(k) for k in KERNELS]


class Doubled(Kernel):
    """A kernel the evaluators do not know (the generic fallback)."""

    name = "test_doubled_rbf"

    def _eval(self, X, Y, symmetric):
        return 2.0 * RBF(gamma=0.4)(X, None if symmetric else Y)

    def _diag(self, X):
        return np.full(X.shape[0], 2.0)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(7)
    X = rng.standard_normal((83, D)) + 4.0  # off the origin: the centring matters
    Y = rng.standard_normal((29, D)) + 4.0
    V = rng.standard_normal((83, 3))
    return X, Y, V


def _rel(a, b):
    return float(np.max(np.abs(np.asarray(a) - b)) / max(np.max(np.abs(b)), 1e-300))


@pytest.mark.parametrize("be", BACKENDS)
@pytest.mark.parametrize("kernel", KERNELS, ids=IDS)
def test_kernel_block_matches_dense(be, kernel, data):
    X, Y, _ = data
    backend = get_backend(be)
    K = backend.to_numpy(device.kernel_block(backend, kernel, X, Y))
    assert K.shape == (83, 29) and K.dtype == np.float64
    np.testing.assert_allclose(K, kernel(X, Y), rtol=1e-12, atol=1e-13)
    S = backend.to_numpy(device.kernel_block(be, kernel, X))
    np.testing.assert_allclose(S, kernel(X), rtol=1e-12, atol=1e-13)
    assert np.array_equal(S, S.T)  # exactly symmetric
    if not isinstance(kernel, Linear | Polynomial):
        assert np.all(np.diag(S) == 1.0)  # exponent 0 on the diagonal


@pytest.mark.parametrize("be", BACKENDS)
def test_kernel_block_float32(be, data):
    X, Y, _ = data
    K = get_backend(be).to_numpy(device.kernel_block(be, RBF(0.3), X, Y, dtype="float32"))
    assert K.dtype == np.float32
    np.testing.assert_allclose(K, RBF(0.3)(X, Y), rtol=0, atol=5e-6)


@pytest.mark.parametrize("be", BACKENDS)
def test_generic_fallback(be, data, caplog):
    X, Y, V = data
    k = Doubled()
    with caplog.at_level(logging.INFO, logger="pipeline.engine.evaluators"):
        K = get_backend(be).to_numpy(device.kernel_block(be, k, X, Y))
    np.testing.assert_array_equal(K, k(X, Y))
    out = device.matvec(be, k, X, V, shift=0.5, block_rows=20)
    np.testing.assert_allclose(out, k(X) @ V + 0.5 * V, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(device.diagonal(be, k, X), np.full(83, 2.0))


@pytest.mark.parametrize("be", BACKENDS)
@pytest.mark.parametrize("kernel", KERNELS, ids=IDS)
@pytest.mark.parametrize("block_rows", [16, 40, 500])  # ragged last blocks; one block
def test_matvec_matches_dense(be, kernel, block_rows, data):
    X, _, V = data
    K = kernel(X)
    out = device.matvec(be, kernel, X, V, shift=0.7, block_rows=block_rows)
    assert out.shape == V.shape and out.dtype == np.float64
    ref = K @ V + 0.7 * V
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-12 * np.abs(ref).max())
    v1 = device.matvec(be, kernel, X, V[:, 0], block_rows=block_rows)
    assert v1.shape == (83,)
    np.testing.assert_allclose(v1, K @ V[:, 0], rtol=1e-12, atol=1e-12 * np.abs(ref).max())


@pytest.mark.parametrize("be", BACKENDS)
@pytest.mark.parametrize(
    "kernel", [KERNELS[0], KERNELS[3], KERNELS[6]], ids=IDS[:1] + IDS[3:4] + IDS[6:7]
)
def test_matvec_float32(be, kernel, data):
    X, _, V = data
    ref = kernel(X) @ V + 0.7 * V
    out = device.matvec(be, kernel, X, V, shift=0.7, kernel_dtype="float32", block_rows=30)
    assert out.dtype == np.float64
    assert _rel(out, ref) < 1e-5
    assert _rel(out, ref) > 0  # float32 entries: not the float64 result


@pytest.mark.parametrize("be", BACKENDS)
@pytest.mark.parametrize("kernel", KERNELS, ids=IDS)
def test_predict_matches_dense(be, kernel, data):
    X, Y, V = data
    ref = kernel(Y, X) @ V
    out = device.predict(be, kernel, X, V, Y, block_rows=25)
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-12 * np.abs(ref).max())
    one = device.predict(be, kernel, X, V[:, 1], Y)
    np.testing.assert_allclose(one, ref[:, 1],
                               rtol=1e-12, atol=1e-12 * np.abs(ref).max())  # fmt: skip


@pytest.mark.parametrize("be", BACKENDS)
@pytest.mark.parametrize("kernel", KERNELS, ids=IDS)
def test_pieces_of_k(be, kernel, data):
    X, _, _ = data
    K = kernel(X)
    idx = [5, 0, 82, 40, 41]
    tol = dict(rtol=1e-12, atol=1e-12 * np.abs(K).max())
    np.testing.assert_allclose(device.diagonal(be, kernel, X), np.diag(K), **tol)
    C = device.columns(be, kernel, X, idx)
    assert C.shape == (83, 5)
    np.testing.assert_allclose(C, K[:, idx], **tol)
    if not isinstance(kernel, Linear | Polynomial):
        assert np.all(C[idx, np.arange(5)] == 1.0)  # the diagonal entries exactly
    S = device.submatrix(be, kernel, X, idx)
    np.testing.assert_allclose(S, K[np.ix_(idx, idx)], **tol)
    assert np.array_equal(S, S.T)
    with pytest.raises(ValueError, match="column indices must lie in"):
        device.columns(be, kernel, X, [0, 83])


@pytest.mark.parametrize("be", BACKENDS)
def test_bitwise_repeatable(be, data):
    X, Y, V = data
    for kd in ("float64", "float32"):
        dk = device.DeviceKernel(be, Matern(nu=1.5, length_scale=ARD), X, kernel_dtype=kd,
                                 block_rows=32)  # fmt: skip
        a, b = dk.matvec(V, shift=0.1), dk.matvec(V, shift=0.1)
        assert np.array_equal(a, b)
        fresh = device.matvec(be, Matern(nu=1.5, length_scale=ARD), X, V, shift=0.1,
                              kernel_dtype=kd, block_rows=32)  # fmt: skip
        assert np.array_equal(a, fresh)
        assert np.array_equal(dk.predict(V, Y), dk.predict(V, Y))


def test_backends_agree(data):
    X, Y, V = data
    k = RBF(length_scale=ARD)
    a = device.matvec("numpy", k, X, V, shift=0.3, block_rows=32)
    b = device.matvec("array_api_strict", k, X, V, shift=0.3, block_rows=32)
    assert _rel(a, b) < 1e-10


def test_bad_input(data):
    X, Y, V = data
    with pytest.raises(ValueError, match="matvec needs a vector of length 83"):
        device.matvec("numpy", RBF(0.3), X, V[:10])
    with pytest.raises(ValueError, match="kernel_dtype must be"):
        device.matvec("numpy", RBF(0.3), X, V, kernel_dtype="float16")
    with pytest.raises(ValueError, match="features"):
        device.kernel_block("numpy", RBF(0.3), X, Y[:, :3])
    with pytest.raises(ValueError, match="float32"):
        device.kernel_block("numpy", Polynomial(degree=40, gamma=10.0), X * 100, dtype="float32")


def test_default_block_rows():
    assert device.default_block_rows("numpy") == device.HOST_BLOCK_ROWS
    assert device.default_block_rows(get_backend("array_api_strict")) == device.HOST_BLOCK_ROWS


# -- the engine seam (dense.py) ---------------------------------------------------------
@pytest.mark.parametrize("be", BACKENDS)
def test_dense_seam(be, data):
    X, Y, V = data
    k = Matern(nu=2.5, length_scale=ARD)
    K = kernel_matrix(k, X, Y, backend=be)
    np.testing.assert_allclose(K, kernel_matrix(k, X, Y), rtol=1e-12, atol=1e-14)
    S = kernel_matrix(k, X, backend=get_backend(be))
    assert np.array_equal(S, S.T)
    K32 = kernel_matrix(k, X.astype(np.float32), backend=be)
    assert K32.dtype == np.float32  # the kernel object's dtype rule
    p = kernel_predict(k, Y, X, V[:, 0], backend=be)
    np.testing.assert_allclose(p, kernel_predict(k, Y, X, V[:, 0]), rtol=1e-12, atol=1e-13)
    assert kernel_predict(Doubled(), Y, X, V[:, 0], backend=be) is None


def test_dense_numpy_backend_is_the_cpu_path(data):
    X, Y, V = data
    k = RBF(0.3)
    assert np.array_equal(kernel_matrix(k, X, Y, backend="numpy"), kernel_matrix(k, X, Y))
    assert np.array_equal(kernel_predict(k, Y, X, V, backend="numpy"), kernel_predict(k, Y, X, V))


# -- DeviceKernelOperator ---------------------------------------------------------------
LAM = 0.05


@pytest.fixture(scope="module")
def cpu_solutions(data):
    """CG on the CPU operator, plain and Nyström-preconditioned (computed once)."""
    X, _, V = data
    cpu = MatrixFreeKernelOperator(X, RBF(length_scale=ARD), LAM, block_size=32)
    b = V[:, 0]
    x = conjugate_gradient(cpu, b, tol=1e-13, max_iter=500).x
    F = build_nystrom(cpu, centres="rpcholesky", rank=20)
    xp = conjugate_gradient(cpu, b, tol=1e-13, max_iter=500, preconditioner=F.woodbury(LAM)).x
    return cpu, x, xp


@pytest.mark.parametrize("be", BACKENDS)
def test_operator_in_cg_and_nystrom(be, data, cpu_solutions):
    X, _, V = data
    cpu, x_cpu, xp_cpu = cpu_solutions
    dev = DeviceKernelOperator(X, RBF(length_scale=ARD), LAM, backend=be, block_rows=32)
    assert dev.n == 83 and dev.shape == (83, 83)
    np.testing.assert_allclose(dev @ V, cpu @ V, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dev(V[:, 0]), cpu(V[:, 0]), rtol=1e-12, atol=1e-12)
    b = V[:, 0]
    x_dev = conjugate_gradient(dev, b, tol=1e-13, max_iter=500).x
    assert _rel(x_dev, x_cpu) < 1e-10
    F_dev = build_nystrom(dev, centres="rpcholesky", rank=20)
    Pd = conjugate_gradient(dev, b, tol=1e-13, max_iter=500, preconditioner=F_dev.woodbury(LAM))
    assert _rel(Pd.x, xp_cpu) < 1e-10
    assert _rel(Pd.x, x_cpu) < 1e-10


def test_operator_fingerprint_and_shift(data):
    X, _, V = data
    k = RBF(0.3)
    cpu = MatrixFreeKernelOperator(X, k, 0.1)
    dev = DeviceKernelOperator(X, k, 0.1, backend="numpy", block_rows=16)
    strict = DeviceKernelOperator(X, k, 0.1, backend="array_api_strict")
    assert dev.fingerprint != cpu.fingerprint
    assert dev.fingerprint != strict.fingerprint
    assert dev.fingerprint == DeviceKernelOperator(X, k, 0.1, backend="numpy").fingerprint
    two = dev.with_shift(0.2)
    assert two.shift == 0.2 and dev.shift == 0.1
    assert two.device_kernel is dev.device_kernel  # X not uploaded again
    assert two.fingerprint != dev.fingerprint
    np.testing.assert_allclose(two @ V - dev @ V, 0.1 * V, atol=1e-12)
    assert DeviceKernelOperator(X.astype(np.float32), k, 0.1, backend="numpy").kernel_dtype == (
        "float32"
    )
    with pytest.raises(ValueError, match="shift"):
        DeviceKernelOperator(X, k, 0.0, backend="numpy")
