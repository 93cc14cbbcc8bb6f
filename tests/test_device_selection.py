"""The ``device`` knob (issue #46): its spellings (estimator, config, plan), its one
resolution in the plan (:func:`pipeline.plan.fit_plan.plan_fit` through
:func:`pipeline.engine.backend.resolve_device`), the plan's record and reason, the
refusals before any work, the pins a CPU fit keeps, and the fit's device branches run on
the CPU with the NumPy and array-api-strict backends (no GPU here)."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

import pipeline.engine.backend as backend
import pipeline.plan.fit_plan as fit_plan
from pipeline import KernelRidge, options
from pipeline.engine.backend import Backend, get_backend
from pipeline.errors import DeviceUnavailableError
from pipeline.kernels import make_kernel
from pipeline.options import solver_choices
from pipeline.plan.fit_plan import (
    DEVICE_RECORD_KEYS,
    RECORD_KEYS,
    FitPlan,
    Probes,
    Resources,
    fp64_warning,
    plan_fit,
)

INF = float("inf")
RES = Resources(INF, INF, in_memory=False)
RES_MEM = Resources(INF, INF, in_memory=True)


@pytest.fixture
def no_gpu(monkeypatch):
    """This process sees no GPU (whether or not CuPy is installed here)."""
    monkeypatch.setattr(backend, "cuda_available", lambda: (False, "CuPy is not installed"))


@pytest.fixture
def fake_gpu(monkeypatch):
    """The plan resolves ``"cuda"`` and ``"auto"`` to a GPU (a stand-in backend: the
    plan reads only its device, never touches its arrays)."""
    gpu = Backend("cupy", np, "cuda")
    monkeypatch.setattr(
        fit_plan, "resolve_device", lambda d: (gpu, f"device={d!r}: 1 CUDA device(s)")
    )
    return gpu


# -- the knob ------------------------------------------------------------------------


def test_the_knob_is_one_definition_spelt_by_config_estimator_and_plan():
    k = options.knobs()["device"]
    assert k.default == "cpu" and k.choices == ("cpu", "cuda", "auto")
    assert k.spelt_by == {"config", "estimator", "plan"}
    assert options.DEVICES == backend.DEVICES  # the backend's values are the tree's
    assert "device" in options.SOLVER_KNOBS
    assert KernelRidge().get_params()["device"] == "cpu"
    from pipeline.stages.config import SolverConfig

    assert SolverConfig().device == "cpu" and SolverConfig(device="auto").options().device == "auto"
    with pytest.raises(ValueError, match="device"):
        SolverConfig(device="gpu")
    with pytest.raises(ValueError, match=r"device='gpu' is not valid; choose one of"):
        solver_choices(device="gpu")


def test_the_estimator_refuses_a_bad_device_before_any_work(tmp_path):
    X, y = np.random.default_rng(0).normal(size=(20, 2)), np.arange(20.0)
    with pytest.raises(ValueError, match="device"):
        KernelRidge(device="gpu", kernel="rbf", store=tmp_path / "s").fit(X, y)
    assert not (tmp_path / "s").exists()


# -- "cuda" without a GPU, "auto" ------------------------------------------------------


def test_cuda_without_a_gpu_is_refused_naming_the_extra_before_any_work(no_gpu, tmp_path):
    X, y = np.random.default_rng(0).normal(size=(30, 2)), np.arange(30.0)
    for solver in ("dense", "cholesky", "cg", "auto"):
        est = KernelRidge(kernel="rbf", solver=solver, device="cuda", store=tmp_path / "s")
        with pytest.raises(DeviceUnavailableError, match=r"krr-pipeline\[gpu\]"):
            est.fit(X, y)
        assert not (tmp_path / "s").exists()  # no store written
        assert not hasattr(est, "dual_coef_")
    with pytest.raises(DeviceUnavailableError, match=r"krr-pipeline\[gpu\]"):
        plan_fit(100, 2, make_kernel("rbf"), RES, solver_choices(device="cuda"))
    assert issubclass(DeviceUnavailableError, ValueError)


def test_auto_without_a_gpu_plans_the_cpu_with_a_log_line_and_the_reason(no_gpu, caplog):
    with caplog.at_level(logging.INFO, logger="pipeline.engine.backend"):
        plan, reason = plan_fit(
            100, 2, make_kernel("rbf"), RES, solver_choices(solver="cholesky", device="auto")
        )
    assert plan.device == "cpu" and plan.options.device == "auto"
    assert "device='auto' fell back to the CPU" in reason
    assert "running on the CPU" in caplog.text
    # the record of a CPU plan is the CPU's: no device keys
    assert list(plan.to_dict()) == list(RECORD_KEYS)
    est = KernelRidge(kernel="rbf", device="auto", alpha=0.1)
    X, y = np.random.default_rng(1).normal(size=(40, 3)), np.linspace(0, 1, 40)
    ref = KernelRidge(kernel="rbf", alpha=0.1).fit(X, y)
    np.testing.assert_array_equal(est.fit(X, y).dual_coef_, ref.dual_coef_)  # the same bits


# -- the plan on a GPU -----------------------------------------------------------------


def test_a_gpu_plan_records_its_device_and_reason_after_the_cpu_keys(fake_gpu):
    k = make_kernel("rbf")
    plan, reason = plan_fit(
        100, 2, k, RES_MEM, solver_choices(solver="dense", device="cuda"), probes=Probes(True)
    )
    assert plan.device == "cuda" and "device='cuda'" in reason
    assert "device=cuda" in plan.describe()
    rec = plan.to_dict()
    assert list(rec) == [*RECORD_KEYS, *DEVICE_RECORD_KEYS]
    assert rec["device"] == "cuda" and "CUDA device" in rec["device_reason"]
    back = FitPlan.from_dict(json.loads(json.dumps(rec)))
    assert back.device == "cuda" and back.to_dict() == rec
    # "auto" with a GPU: the same decision, the ask kept in the options
    plan, _ = plan_fit(100, 2, k, RES_MEM, solver_choices(solver="dense", device="auto"))
    assert plan.device == "cuda" and plan.options.device == "auto"


def test_a_cpu_plan_record_is_byte_identical_to_the_default_devices():
    k = make_kernel("rbf")
    for solver in ("cholesky", "cg", "dense"):
        base, r0 = plan_fit(300, 3, k, RES_MEM, solver_choices(solver=solver))
        cpu, r1 = plan_fit(300, 3, k, RES_MEM, solver_choices(solver=solver, device="cpu"))
        assert json.dumps(cpu.to_dict()) == json.dumps(base.to_dict()) and r0 == r1
        assert "device" not in json.dumps(cpu.to_dict()) and "device" not in cpu.describe()


def test_solvers_without_a_gpu_path_run_on_the_cpu_and_say_so(fake_gpu):
    k = make_kernel("rbf")
    here = Probes(True)
    cases = [
        (dict(solver="primal"), make_kernel("linear"), here, "solver='primal' has no GPU path"),
        (dict(solver="nystrom", n_centers=10), k, here, "solver='nystrom' has no GPU path"),
        (dict(solver="cholesky", keep_gram=False), k, here, "keep_gram=False"),
        (dict(solver="cholesky", factor_dtype="float32"), k, here, "a float32 factor"),
        (dict(solver="cg", matvec="stored"), k, here, "stored Gram"),
        (dict(solver="dense"), None, here, "a callable or precomputed kernel"),
    ]
    for choices, kern, probes, said in cases:
        plan, reason = plan_fit(
            100, 2, kern, RES_MEM, solver_choices(device="cuda", **choices), probes=probes
        )
        assert plan.device == "cpu", choices
        assert said in reason and "it runs on the CPU" in reason, reason
    for solver, store, probes in [
        ("cholesky", None, here),  # in place in device memory
        ("cholesky", "/tmp/s", here),  # the stored Gram's tiles streamed to the device
        ("cholesky", None, Probes(False)),  # (rows not in memory: the stored Gram too)
        ("cg", None, here),
        ("cg", "/tmp/s", Probes(False)),
    ]:
        choices = solver_choices(solver=solver, device="cuda", matvec="recompute", store=store)
        plan, _ = plan_fit(100, 2, k, RES, choices, probes=probes)
        assert plan.device == "cuda", (solver, store)


@pytest.mark.parametrize("cc", [(6, 1), (7, 5), (8, 6), (8, 9), (12, 0)])
def test_float64_on_a_gpu_with_a_low_fp64_rate_warns_in_the_reason(fake_gpu, cc, caplog):
    res = Resources(INF, INF, gpu_memory_bytes=8e9, gpu_name="GeForce", gpu_compute_capability=cc)
    with caplog.at_level(logging.WARNING, logger="pipeline.plan.fit_plan"):
        plan, reason = plan_fit(
            100, 2, make_kernel("rbf"), res, solver_choices(solver="dense", device="cuda")
        )
    assert "warning: GeForce (compute capability" in reason and "1/32 to 1/64" in reason
    assert "warning: GeForce" in plan.device_reason and "8.0 GB free" in reason
    assert "GeForce" in caplog.text
    # float32 work has no warning: a float32 factor, mixed-precision CG
    assert fp64_warning(FitPlan(solver="cholesky", factor_dtype="float32"), res) == ""
    assert fp64_warning(FitPlan(solver="cg", cg_precision="mixed"), res) == ""
    assert fp64_warning(FitPlan(solver="cg"), res) != ""


@pytest.mark.parametrize("cc", [(6, 0), (7, 0), (8, 0), (9, 0), (10, 0)])
def test_float64_on_a_datacentre_gpu_has_no_warning(fake_gpu, cc):
    res = Resources(INF, INF, gpu_memory_bytes=8e10, gpu_name="H200", gpu_compute_capability=cc)
    plan, reason = plan_fit(
        100, 2, make_kernel("rbf"), res, solver_choices(solver="dense", device="cuda")
    )
    assert "warning" not in reason and plan.device == "cuda" and "H200" in reason


def test_the_plan_does_not_import_cupy():
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(fit_plan))
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not any("cupy" in str(m) for m in names)


def test_cpu_resources_measure_no_gpu(monkeypatch):
    from pipeline import fit

    def boom():
        raise AssertionError("the CPU looked for a GPU")

    monkeypatch.setattr(fit, "cuda_available", boom)
    r = fit.measure_resources(None)
    assert r.gpu_memory_bytes is None and r.gpu_name is None and r.gpu_compute_capability is None
    monkeypatch.setattr(fit, "cuda_available", lambda: (False, "no"))
    assert fit.measure_resources(None, device="auto").gpu_name is None


# -- fingerprints and records that a CPU fit keeps --------------------------------------


def test_the_fit_identity_names_a_device_only_off_the_cpu():
    y = np.arange(4.0)
    k = make_kernel("rbf")
    est = KernelRidge(kernel="rbf")
    est._seed = None
    ident = est._fit_identity(k, "x", y, None)
    assert "device" not in ident["params"]
    gpu = KernelRidge(kernel="rbf", device="cuda")
    gpu._seed = None
    other = gpu._fit_identity(k, "x", y, None)
    assert other["params"]["device"] == "cuda"
    assert {**other["params"], "device": None} != ident["params"]
    other["params"].pop("device")
    assert other == ident


def test_the_solve_stage_fingerprint_names_a_device_only_off_the_cpu():
    from pipeline.stages.config import load_config

    base = {"data": {"source": "sklearn", "name": "diabetes"}, "kernel": {"name": "rbf"}}
    cpu = load_config({**base, "solver": {"method": "cg"}}).stage_params()["solve"]
    dflt = load_config({**base, "solver": {"method": "cg", "device": "cpu"}})
    assert "device" not in cpu["solver"] and dflt.stage_params()["solve"] == cpu
    gpu = load_config({**base, "solver": {"method": "cg", "device": "auto"}})
    assert gpu.stage_params()["solve"]["solver"]["device"] == "auto"


def test_a_saved_cpu_model_records_no_device(tmp_path):
    from pipeline.models.model_io import _json_params

    assert "device" not in _json_params(KernelRidge(kernel="rbf"))
    assert _json_params(KernelRidge(kernel="rbf", device="auto"))["device"] == "auto"


def test_sklearn_clone_keeps_the_device():
    from sklearn.base import clone

    assert clone(KernelRidge(device="auto")).get_params()["device"] == "auto"


# -- krr run / krr validate --------------------------------------------------------------


def test_krr_refuses_cuda_without_a_gpu_as_a_config_error(no_gpu, tmp_path, capsys):
    import yaml

    from pipeline import cli

    conf = tmp_path / "c.yaml"
    conf.write_text(
        yaml.safe_dump(
            {
                "data": {"source": "sklearn", "name": "diabetes"},
                "kernel": {"name": "rbf"},
                "solver": {"method": "cg", "device": "cuda"},
            }
        )
    )
    for cmd in (["validate", str(conf)], ["run", str(conf), "--run-dir", str(tmp_path / "r")]):
        assert cli.main(cmd) == cli.EXIT_BAD_CONFIG
        err = capsys.readouterr().err
        assert "solver.device" in err and "krr-pipeline[gpu]" in err, err[-600:]
    assert not (tmp_path / "r").exists()


def test_a_plan_stage_refusing_the_device_is_a_config_error():
    from pipeline.cli import errors as cli_errors
    from pipeline.errors import StageFailed

    cause = DeviceUnavailableError("no GPU")
    e = StageFailed("plan", cause)
    e.__cause__ = cause
    assert cli_errors._classify_stage_error(e) == cli_errors.EXIT_BAD_CONFIG


# -- the fit's device branches, run on the CPU ---------------------------------------------


def _on(monkeypatch, name):
    """Plans resolve "cuda" to a GPU, and the fit runs its device branch on backend
    ``name`` (NumPy or array-api-strict): the device code, on the host."""
    if name == "array_api_strict":
        pytest.importorskip("array_api_strict")
    import pipeline.fit as fit

    be = get_backend(name)
    monkeypatch.setattr(
        fit_plan, "resolve_device", lambda d: (Backend("cupy", np, "cuda"), "a stand-in GPU")
    )
    monkeypatch.setattr(fit, "device_backend", lambda plan: be if plan.device == "cuda" else None)
    monkeypatch.setattr(
        "pipeline.models.estimator.resolve_device", lambda d: (be, "a stand-in GPU")
    )
    import pipeline.engine.device as dev

    calls = []  # the device's kernel tiles: proof that the device branch ran
    block = dev.kernel_block

    def spy(be_, *args, **kw):
        assert be_ is be
        calls.append(1)
        return block(be_, *args, **kw)

    monkeypatch.setattr(dev, "kernel_block", spy)
    return calls


def _data(n=300, d=4, t=1, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    y = np.sin(X @ rng.normal(size=(d, t))) + 0.1 * rng.normal(size=(n, t))
    return X, (y[:, 0] if t == 1 else y)


@pytest.mark.parametrize("name", ["numpy", "array_api_strict"])
@pytest.mark.parametrize("solver", ["dense", "cholesky"])
def test_the_device_fit_matches_the_cpu_fit(monkeypatch, name, solver):
    calls = _on(monkeypatch, name)
    X, y = _data(t=2)
    kw = dict(kernel="rbf", gamma=0.3, alpha=0.05, solver=solver)
    ref = KernelRidge(**kw).fit(X, y)
    assert not calls
    est = KernelRidge(**kw, device="cuda").fit(X, y)
    assert est.solver_ == solver and calls
    if solver == "cholesky":  # (the dense solver keeps no fit_info_)
        assert est.fit_info_["device"]["backend"] == name
    np.testing.assert_allclose(est.dual_coef_, ref.dual_coef_, rtol=1e-10, atol=1e-12)
    again = KernelRidge(**kw, device="cuda").fit(X, y)
    np.testing.assert_array_equal(again.dual_coef_, est.dual_coef_)  # bitwise, one backend


@pytest.mark.parametrize("name", ["numpy", "array_api_strict"])
def test_the_device_fit_takes_sample_weights_as_the_cpu_does(monkeypatch, name):
    calls = _on(monkeypatch, name)
    X, y = _data()
    w = np.random.default_rng(3).uniform(0.0, 2.0, size=X.shape[0])
    w[:5] = 0.0
    kw = dict(kernel="rbf", gamma=0.3, alpha=0.05, solver="dense", alpha_convention="n_samples")
    ref = KernelRidge(**kw).fit(X, y, sample_weight=w)
    est = KernelRidge(**kw, device="cuda").fit(X, y, sample_weight=w)
    assert calls
    np.testing.assert_allclose(est.dual_coef_, ref.dual_coef_, rtol=1e-10, atol=1e-12)


def test_the_device_fit_refuses_alpha_zero_and_per_target_alphas(monkeypatch):
    _on(monkeypatch, "numpy")
    X, y = _data(t=2)
    for alpha in (0.0, [0.1, 0.2]):
        with pytest.raises(ValueError, match="one alpha > 0 for every target"):
            KernelRidge(kernel="rbf", alpha=alpha, solver="dense", device="cuda").fit(X, y)


@pytest.mark.parametrize("name", ["numpy", "array_api_strict"])
@pytest.mark.parametrize("precision", ["float64", "mixed"])
def test_the_device_cg_matches_the_cpu_cg(monkeypatch, name, precision):
    _on(monkeypatch, name)
    X, y = _data()
    kw = dict(kernel="rbf", gamma=0.3, alpha=0.05, solver="cg", tol=1e-12, matvec="recompute",
              cg_precision=precision, max_iter=500)  # fmt: skip
    from pipeline.linalg import matvec

    ref = KernelRidge(**kw).fit(X, y)
    made = []
    real = matvec.DeviceKernelOperator

    def spy(*args, **kw_):
        made.append(kw_["kernel_dtype"])
        return real(*args, **kw_)

    monkeypatch.setattr(matvec, "DeviceKernelOperator", spy)
    est = KernelRidge(**kw, device="cuda").fit(X, y)
    assert made == (["float64"] if precision == "float64" else ["float64", "float32"])
    np.testing.assert_allclose(est.dual_coef_, ref.dual_coef_, rtol=1e-9, atol=1e-11)


# -- prediction on the device -------------------------------------------------------------


def test_predict_runs_on_the_cpu_without_a_gpu(no_gpu, monkeypatch):
    from pipeline.models import estimator

    monkeypatch.setattr(estimator, "cuda_available", lambda: (False, "no"))
    assert estimator.predict_backend("cpu") is None
    assert estimator.predict_backend("cuda") is None  # a GPU model predicts anywhere
    assert estimator.predict_backend("auto") is None


@pytest.mark.parametrize("name", ["numpy", "array_api_strict"])
def test_predict_on_the_device_matches_the_cpu(monkeypatch, name):

    from pipeline.models import estimator

    if name == "array_api_strict":
        pytest.importorskip("array_api_strict")
    be = get_backend(name)
    X, y = _data()
    est = KernelRidge(kernel="rbf", gamma=0.3, alpha=0.05).fit(X, y)
    ref = est.predict(X[:50])
    seen = []
    monkeypatch.setattr(estimator, "predict_backend", lambda d: seen.append(d) or be)
    est.set_params(device="cuda")
    np.testing.assert_allclose(est.predict(X[:50]), ref, rtol=1e-10, atol=1e-12)
    assert seen == ["cuda"]


# -- a cluster's GPU workers ----------------------------------------------------------------


class _FakeClient:
    def __init__(self, resources):
        self._workers = {f"tcp://w{i}": {"resources": r} for i, r in enumerate(resources)}

    def scheduler_info(self):
        return {"workers": self._workers}


@pytest.mark.parametrize(
    ("device", "resources", "annotated"),
    [
        ("cuda", [{"GPU": 1}, {}], True),
        ("cuda", [{}, {}], False),  # no GPU worker: never asked for (it would wait for ever)
        ("cpu", [{"GPU": 1}], False),  # a CPU fit's graphs keep their annotations
    ],
)
def test_a_gpu_fits_tasks_ask_the_cluster_for_a_gpu(monkeypatch, device, resources, annotated):
    import dask
    import dask.array as da

    import pipeline.fit as fit

    monkeypatch.setattr(fit, "active_client", lambda: _FakeClient(resources))
    seen = {}

    def body(plan, X, y, kernel, **options):
        seen["annotations"] = dict(dask.get_annotations())
        seen["graph"] = (da.ones(4, chunks=2) + 1).__dask_graph__()
        return "done"

    monkeypatch.setattr(fit, "_execute_plan", body)
    assert fit.execute(FitPlan(solver="cg", device=device), None, np.zeros(3), None) == "done"
    layers = [getattr(layer, "annotations", None) or {} for layer in seen["graph"].layers.values()]
    if annotated:
        assert seen["annotations"] == {"resources": {"GPU": 1}}
        assert layers and all(a.get("resources") == {"GPU": 1} for a in layers)
    else:
        assert "resources" not in seen["annotations"]
        assert not any("resources" in a for a in layers)
    monkeypatch.setattr(fit, "active_client", lambda: None)
    assert fit._workers_have_gpus() is False


@pytest.mark.parametrize("name", ["numpy", "array_api_strict"])
def test_the_stored_device_cholesky_matches_the_cpu_and_resumes_from_its_tiles(
    monkeypatch, tmp_path, name
):
    _on(monkeypatch, name)
    X, y = _data(n=200)
    kw = dict(kernel="rbf", gamma=0.3, alpha=0.05, solver="cholesky", block_size=64)
    ref = KernelRidge(**kw, store=tmp_path / "cpu").fit(X, y)
    est = KernelRidge(**kw, store=tmp_path / "gpu", device="cuda").fit(X, y)
    np.testing.assert_allclose(est.dual_coef_, ref.dual_coef_, rtol=1e-10, atol=1e-12)
    info = est.fit_info_
    assert info["device"]["backend"] == name and info["factor_tiles_computed"] == 10  # 4x4 lower
    assert ref.fit_info_["store"] != info["store"]  # another fit's directory
    again = KernelRidge(**kw, store=tmp_path / "gpu", device="cuda").fit(X, y)
    assert again.fit_info_["device"]["tiles_resumed"] == 10
    assert again.fit_info_["factor_tiles_computed"] == 0
    np.testing.assert_array_equal(again.dual_coef_, est.dual_coef_)  # bitwise


@pytest.mark.parametrize("method", ["cholesky", "cg"])
def test_krr_run_on_the_device_records_it_and_matches_the_cpu(monkeypatch, tmp_path, method):
    import glob

    import pipeline

    _on(monkeypatch, "numpy")
    alphas, plans = {}, {}
    for device in ("cpu", "cuda"):
        cfg = {
            "data": {"source": "sklearn", "name": "diabetes"},
            "kernel": {"name": "rbf", "params": {"gamma": 0.1}},
            "lambda": 0.5, "block_size": 128, "evaluate": {"baseline": "none"},
            "solver": {"method": method, "device": device},
            "cluster": {"processes": False, "n_workers": 1},
        }  # fmt: skip
        rep = pipeline.run(pipeline.load_config(cfg), run_dir=tmp_path / device)
        plans[device] = rep.outputs["solve"]["plan"]
        (path,) = glob.glob(str(tmp_path / device / "results" / "*" / "solve" / "alpha.npy"))
        alphas[device] = np.load(path)
    assert "device" not in plans["cpu"] and plans["cuda"]["device"] == "cuda"
    assert list(plans["cuda"])[-2:] == list(DEVICE_RECORD_KEYS)
    np.testing.assert_allclose(alphas["cuda"], alphas["cpu"], rtol=1e-10, atol=1e-12)


def test_a_killed_device_cholesky_resumes_from_its_stored_tiles(monkeypatch, tmp_path):
    _on(monkeypatch, "numpy")
    import pipeline.linalg.cholesky as cd  # the driver's reader of the stored Gram

    X, y = _data(n=200)
    kw = dict(kernel="rbf", gamma=0.3, alpha=0.05, solver="cholesky", block_size=64,
              device="cuda")  # fmt: skip
    whole = KernelRidge(**kw, store=tmp_path / "whole").fit(X, y)
    real = cd.stored_tiles

    def dying(gram):
        read = real(gram)
        calls = []

        def tile_fn(i, j):
            calls.append((i, j))
            if len(calls) > 6:  # the fit dies after 6 of its 10 Gram tiles
                raise KeyboardInterrupt("killed")
            return read(i, j)

        return tile_fn

    monkeypatch.setattr(cd, "stored_tiles", dying)
    with pytest.raises(KeyboardInterrupt):
        KernelRidge(**kw, store=tmp_path / "s").fit(X, y)
    monkeypatch.setattr(cd, "stored_tiles", real)
    again = KernelRidge(**kw, store=tmp_path / "s").fit(X, y)
    info = again.fit_info_
    assert info["device"]["tiles_resumed"] >= 1 and info["factor_tiles_computed"] < 10
    assert info["device"]["tiles_resumed"] + info["factor_tiles_computed"] == 10
    np.testing.assert_array_equal(again.dual_coef_, whole.dual_coef_)  # the same bits
