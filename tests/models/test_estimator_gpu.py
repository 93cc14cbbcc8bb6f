"""``KernelRidge(device="cuda")`` against ``device="cpu"`` on a real GPU (issue #46): the
same coefficients to 1e-10 (relative, float64) for the in-memory dense dual, the
Cholesky (X in memory: factored in place in device memory) and CG (recomputed products
on the device); the plan records the device and why. Skipped without CuPy and a GPU
(the CPU suite runs the same branches on NumPy and array-api-strict:
``tests/test_device_selection.py``)."""

from __future__ import annotations

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")
try:
    _N_GPUS = int(cupy.cuda.runtime.getDeviceCount())
except Exception:  # noqa: BLE001 - CUDA raises its own runtime errors without a driver
    _N_GPUS = 0
if _N_GPUS == 0:
    pytest.skip("no CUDA device", allow_module_level=True)

from pipeline import KernelRidge  # noqa: E402

N = 3000


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(46)
    X = rng.normal(size=(N, 6))
    y = np.sin(X @ rng.normal(size=6)) + 0.05 * rng.normal(size=N)
    return X, y


def _rel(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


@pytest.mark.parametrize("solver", ["dense", "cholesky"])
def test_the_gpu_fit_matches_the_cpu_fit(data, solver, caplog):
    X, y = data
    kw = dict(kernel="rbf", gamma=0.2, alpha=1e-2, solver=solver)
    cpu = KernelRidge(**kw).fit(X, y)
    with caplog.at_level("INFO"):
        gpu = KernelRidge(**kw, device="cuda").fit(X, y)
    assert gpu.solver_ == solver
    assert _rel(gpu.dual_coef_, cpu.dual_coef_) <= 1e-10
    again = KernelRidge(**kw, device="cuda").fit(X, y)
    np.testing.assert_array_equal(again.dual_coef_, gpu.dual_coef_)  # bitwise on one backend
    assert _rel(gpu.predict(X[:500]), cpu.predict(X[:500])) <= 1e-10


def test_the_stored_gpu_cholesky_matches_the_cpu_and_resumes(data, tmp_path):
    X, y = data
    kw = dict(kernel="rbf", gamma=0.2, alpha=1e-2, solver="cholesky", block_size=1024)
    cpu = KernelRidge(**kw, store=tmp_path / "cpu").fit(X, y)
    gpu = KernelRidge(**kw, store=tmp_path / "gpu", device="cuda").fit(X, y)
    assert gpu.fit_info_["device"]["backend"] == "cupy"
    assert _rel(gpu.dual_coef_, cpu.dual_coef_) <= 1e-10
    again = KernelRidge(**kw, store=tmp_path / "gpu", device="cuda").fit(X, y)
    assert again.fit_info_["factor_tiles_computed"] == 0  # resumed from the stored tiles
    np.testing.assert_array_equal(again.dual_coef_, gpu.dual_coef_)


@pytest.mark.parametrize("precision", ["float64", "mixed"])
def test_the_gpu_cg_matches_the_cpu_cg(data, precision):
    X, y = data
    kw = dict(kernel="rbf", gamma=0.2, alpha=1e-2, solver="cg", matvec="recompute",
              cg_precision=precision, tol=1e-13, max_iter=2000)  # fmt: skip
    cpu = KernelRidge(**kw).fit(X, y)
    gpu = KernelRidge(**kw, device="cuda").fit(X, y)
    assert gpu.fit_info_["converged"]
    assert _rel(gpu.dual_coef_, cpu.dual_coef_) <= 1e-10


def test_the_gpu_plan_names_the_device_and_its_memory(data):
    from pipeline.fit import measure_resources
    from pipeline.kernels import make_kernel
    from pipeline.options import solver_choices
    from pipeline.plan.fit_plan import Probes, plan_fit

    res = measure_resources(None, device="cuda")
    assert res.gpu_memory_bytes > 0 and res.gpu_name and len(res.gpu_compute_capability) == 2
    plan, reason = plan_fit(
        N, 6, make_kernel("rbf"), res, solver_choices(solver="dense", device="cuda"),
        probes=Probes(True),
    )  # fmt: skip
    assert plan.device == "cuda" and plan.to_dict()["device"] == "cuda"
    assert "device='cuda'" in reason and res.gpu_name in reason
    auto, _ = plan_fit(N, 6, make_kernel("rbf"), res, solver_choices(device="auto"))
    assert auto.device == "cuda"
