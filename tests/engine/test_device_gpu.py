"""pipeline.engine.device on CuPy (a GPU): the checks of test_device_backend.py, the
fused raw CUDA kernel against the GEMM path, and CuPy against NumPy in float64. The
Nyström build on the GPU is tests/linalg/test_nystrom_device.py's CuPy case.

Skipped without CuPy or without a CUDA device."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.engine import device
from pipeline.engine.backend import get_backend
from pipeline.engine.dense import kernel_matrix, kernel_predict
from pipeline.kernels import RBF, Laplacian, Linear, Matern, Polynomial
from pipeline.linalg.cg import conjugate_gradient
from pipeline.linalg.matvec import DeviceKernelOperator, MatrixFreeKernelOperator
from pipeline.linalg.precond import NystromPreconditioner, build_nystrom

cupy = pytest.importorskip("cupy")
try:
    _N_GPUS = int(cupy.cuda.runtime.getDeviceCount())
except Exception:  # noqa: BLE001 - CUDA raises its own runtime errors
    _N_GPUS = 0
if _N_GPUS == 0:
    pytest.skip("no CUDA device", allow_module_level=True)

D = 5
ARD = np.linspace(0.8, 2.5, D)
KERNELS = [
    RBF(gamma=0.3),
    RBF(length_scale=ARD),
    Matern(nu=0.5, length_scale=1.3),
    Matern(nu=1.5, length_scale=ARD),
    Matern(nu=2.5, length_scale=2.0),
    Laplacian(gamma=0.2),
    Linear(),
    Polynomial(degree=3, gamma=0.1, coef0=1.0),
]
IDS = [repr(k) for k in KERNELS]


@pytest.fixture(scope="module")
def be():
    return get_backend("cupy")


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(7)
    X = rng.standard_normal((300, D)) + 4.0
    Y = rng.standard_normal((70, D)) + 4.0
    V = rng.standard_normal((300, 3))
    return X, Y, V


@pytest.fixture
def raw(monkeypatch):
    """Set device.USE_RAW_KERNEL for one test."""

    def set_(on: bool) -> None:
        monkeypatch.setattr(device, "USE_RAW_KERNEL", on)

    return set_


def _rel(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.parametrize("kernel", KERNELS, ids=IDS)
def test_kernel_block_on_gpu(be, kernel, data):
    X, Y, _ = data
    K = device.kernel_block(be, kernel, X, Y)
    assert isinstance(K, cupy.ndarray)
    np.testing.assert_allclose(K.get(), kernel(X, Y), rtol=1e-12, atol=1e-12)
    S = device.kernel_block(be, kernel, X).get()
    np.testing.assert_allclose(S, kernel(X), rtol=1e-12, atol=1e-12)
    assert np.array_equal(S, S.T)
    # device input stays on the device (no host round trip needed)
    Kd = device.kernel_block(be, kernel, cupy.asarray(X), cupy.asarray(Y)).get()
    np.testing.assert_array_equal(Kd, K.get())


@pytest.mark.parametrize("kernel", KERNELS, ids=IDS)
@pytest.mark.parametrize("block_rows", [64, 100, 1000])
def test_matvec_on_gpu(be, kernel, block_rows, data, raw):
    raw(False)
    X, _, V = data
    ref = kernel(X) @ V + 0.7 * V
    out = device.matvec(be, kernel, X, V, shift=0.7, block_rows=block_rows)
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-12 * np.abs(ref).max())
    one = device.matvec(be, kernel, X, V[:, 0], block_rows=block_rows)
    assert one.shape == (300,)
    np.testing.assert_allclose(one, kernel(X) @ V[:, 0], rtol=1e-12,
                               atol=1e-12 * np.abs(ref).max())  # fmt: skip
    out32 = device.matvec(be, kernel, X, V, shift=0.7, kernel_dtype="float32",
                          block_rows=block_rows)  # fmt: skip
    assert _rel(out32, ref) < 1e-5


@pytest.mark.parametrize("kernel", KERNELS, ids=IDS)
def test_predict_and_pieces_on_gpu(be, kernel, data):
    X, Y, V = data
    K = kernel(X)
    tol = dict(rtol=1e-12, atol=1e-12 * np.abs(K).max())
    ref = kernel(Y, X) @ V
    np.testing.assert_allclose(device.predict(be, kernel, X, V, Y, block_rows=64), ref,
                               rtol=1e-12, atol=1e-12 * np.abs(ref).max())  # fmt: skip
    idx = [5, 0, 299, 140, 141]
    np.testing.assert_allclose(device.diagonal(be, kernel, X), np.diag(K), **tol)
    np.testing.assert_allclose(device.columns(be, kernel, X, idx), K[:, idx], **tol)
    S = device.submatrix(be, kernel, X, idx)
    np.testing.assert_allclose(S, K[np.ix_(idx, idx)], **tol)
    assert np.array_equal(S, S.T)


@pytest.mark.parametrize("kernel", KERNELS, ids=IDS)
def test_cupy_agrees_with_numpy(be, kernel, data, raw):
    raw(False)
    X, Y, V = data
    a = device.matvec(be, kernel, X, V, shift=0.3, block_rows=128)
    b = device.matvec("numpy", kernel, X, V, shift=0.3, block_rows=128)
    assert _rel(a, b) < 1e-10
    assert (
        _rel(device.predict(be, kernel, X, V, Y), device.predict("numpy", kernel, X, V, Y)) < 1e-10
    )


@pytest.mark.parametrize("kernel", [RBF(gamma=0.3), RBF(length_scale=ARD)], ids=["rbf", "rbf-ard"])
@pytest.mark.parametrize("n", [1, 127, 1000])  # one row; under one tile; ragged tiles
def test_raw_kernel_vs_gemm(be, kernel, n, raw):
    rng = np.random.default_rng(n)
    X = rng.standard_normal((n, D)) + 2.0
    V = rng.standard_normal((n, 2))
    dk = device.DeviceKernel(be, kernel, X, kernel_dtype="float32", block_rows=256)
    assert device._raw_applies(be, dk.kernel, "float32", D)
    raw(True)
    a = dk.matvec(V, shift=0.2)
    raw(False)
    b = dk.matvec(V, shift=0.2)
    ref = kernel(X) @ V + 0.2 * V
    assert _rel(a, b) < 1e-5
    assert _rel(a, ref) < 1e-5
    raw(True)
    assert np.array_equal(a, dk.matvec(V, shift=0.2))  # bitwise repeatable
    one = dk.matvec(V[:, 0], shift=0.2)
    assert np.array_equal(one, a[:, 0])


def test_raw_kernel_not_taken(be):
    assert device._raw_applies(be, RBF(0.1), "float64", D)  # built in float64 too
    assert not device._raw_applies(be, RBF(0.1), "float64", device.RAW_MAX_FEATURES // 2 + 1)
    assert not device._raw_applies(be, RBF(0.1), "float32", device.RAW_MAX_FEATURES + 1)
    assert not device._raw_applies(be, Matern(nu=0.5), "float32", D)
    rng = np.random.default_rng(0)
    X = rng.standard_normal((200, device.RAW_MAX_FEATURES + 3))
    V = rng.standard_normal(200)
    out = device.matvec(be, RBF(0.01), X, V, kernel_dtype="float32")  # the GEMM path
    assert _rel(out, RBF(0.01)(X) @ V) < 1e-5


def test_bitwise_repeatable_on_gpu(be, data, raw):
    raw(False)
    X, Y, V = data
    for kd in ("float64", "float32"):
        dk = device.DeviceKernel(be, Matern(nu=1.5, length_scale=ARD), X, kernel_dtype=kd,
                                 block_rows=64)  # fmt: skip
        a = dk.matvec(V, shift=0.1)
        assert np.array_equal(a, dk.matvec(V, shift=0.1))
        assert np.array_equal(dk.predict(V, Y), dk.predict(V, Y))


def test_dense_seam_on_gpu(be, data):
    X, Y, V = data
    k = Matern(nu=2.5, length_scale=ARD)
    np.testing.assert_allclose(kernel_matrix(k, X, Y, backend="cupy"), kernel_matrix(k, X, Y),
                               rtol=1e-12, atol=1e-14)  # fmt: skip
    np.testing.assert_allclose(kernel_predict(k, Y, X, V, backend=be), kernel_predict(k, Y, X, V),
                               rtol=1e-12, atol=1e-12)  # fmt: skip


def test_operator_on_gpu(be, data):
    X, _, V = data
    k = RBF(length_scale=ARD)
    lam = 0.05
    cpu = MatrixFreeKernelOperator(X, k, lam, block_size=64)
    dev = DeviceKernelOperator(X, k, lam, backend=be, block_rows=64)
    assert dev.fingerprint != cpu.fingerprint
    b = V[:, 0]
    x_cpu = conjugate_gradient(cpu, b, tol=1e-13, max_iter=1000).x
    x_dev = conjugate_gradient(dev, b, tol=1e-13, max_iter=1000).x
    assert _rel(x_dev, x_cpu) < 1e-10
    F_cpu = build_nystrom(cpu, centres="rpcholesky", rank=40)
    F_dev = build_nystrom(dev, centres="rpcholesky", rank=40)
    Pc = conjugate_gradient(cpu, b, tol=1e-13, max_iter=1000, preconditioner=F_cpu.woodbury(lam))
    Pd = conjugate_gradient(dev, b, tol=1e-13, max_iter=1000, preconditioner=F_dev.woodbury(lam))
    assert _rel(Pd.x, Pc.x) < 1e-10


def test_default_block_rows_and_benchmark(be):
    b = device.default_block_rows(be)
    assert 256 <= b <= device.DEVICE_BLOCK_ROWS and b & (b - 1) == 0
    X = np.random.default_rng(0).standard_normal((2000, 16))
    r = device.benchmark_matvec(be, RBF(0.05), X, kernel_dtype="float32", repeats=2)
    assert r["backend"] == "cupy" and r["raw_kernel"] and r["best_s"] > 0


@pytest.mark.parametrize("kernel", [RBF(0.3), RBF(length_scale=ARD)], ids=["rbf", "rbf-ard"])
def test_raw_kernel_predicts_as_the_gemm_path(be, kernel, raw):
    rng = np.random.default_rng(5)
    X = rng.standard_normal((700, D)) + 2.0
    Xn = rng.standard_normal((333, D)) + 2.0
    a = rng.standard_normal((700, 2))
    dk = device.DeviceKernel(be, kernel, X, kernel_dtype="float32", block_rows=256)
    raw(True)
    p = dk.predict(a, Xn)
    raw(False)
    q = dk.predict(a, Xn)
    assert _rel(p, q) < 1e-5
    assert _rel(p, kernel(Xn, X) @ a) < 1e-5


def test_raw_kernel_in_float64_is_the_float64_product(be, raw):
    rng = np.random.default_rng(9)
    X = rng.standard_normal((900, D)) + 2.0
    V = rng.standard_normal((900, 2))
    k = RBF(0.4)
    dk = device.DeviceKernel(be, k, X, kernel_dtype="float64", block_rows=256)
    raw(True)
    a = dk.matvec(V, shift=0.3)
    raw(False)
    b = dk.matvec(V, shift=0.3)
    ref = k(X) @ V + 0.3 * V
    assert _rel(a, ref) < 1e-12 and _rel(b, ref) < 1e-12
    raw(True)
    Xn = rng.standard_normal((77, D))
    assert _rel(dk.predict(V, Xn), k(Xn, X) @ V) < 1e-12


def test_woodbury_preconditioner_on_the_gpu(be):
    rng = np.random.default_rng(1)
    F = rng.standard_normal((20_000, 40)).astype(np.float32)
    R = rng.standard_normal((20_000, 3))
    host = NystromPreconditioner(F, 0.05).apply(R)
    gpu = NystromPreconditioner(F, 0.05, backend=be).apply(R)
    assert _rel(gpu, host) < 1e-10
