"""Matérn (nu = 1/2, 3/2, 5/2) and ARD length scales (RBF, Matérn): scikit-learn parity,
the estimators, CV grids, specs and fingerprints, and every bad input before any work."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from sklearn.gaussian_process.kernels import RBF as GPRBF
from sklearn.gaussian_process.kernels import Matern as GPMatern
from sklearn.model_selection import GridSearchCV, KFold

from pipeline import KernelRidge, KernelRidgeCV
from pipeline.engine import evaluators
from pipeline.kernels import (
    RBF,
    Matern,
    SelectFeatures,
    Standardize,
    Warped,
    kernel_fingerprint,
    kernel_from_spec,
    make_kernel,
    spec_round_trips,
)
from pipeline.stages.config import ConfigError, load_config

RNG = np.random.default_rng(45)
X = RNG.normal(size=(61, 3)) + 2.0
Y = RNG.normal(size=(23, 3)) + 2.0
y = np.sin(X).sum(axis=1) + 0.1 * RNG.normal(size=61)
LS = [0.7, 1.9, 1.2]
NUS = (0.5, 1.5, 2.5)


def _rel(a, b):
    return float(np.max(np.abs(a - b) / np.abs(b)))


def _sk(kernel):
    ls = np.asarray(kernel.length_scale, dtype=float)
    if isinstance(kernel, Matern):
        return GPMatern(nu=kernel.nu, length_scale=ls)
    return GPRBF(length_scale=ls)


@pytest.mark.parametrize("nu", NUS)
@pytest.mark.parametrize("ls", [1.3, LS, np.array(LS)], ids=["iso", "ard-list", "ard-array"])
def test_matern_matches_scikit_learn(nu, ls):
    k = Matern(nu=nu, length_scale=ls)
    ref = _sk(k)
    assert _rel(k(X, Y), ref(X, Y)) <= 1e-12
    assert _rel(k(X), ref(X)) <= 1e-12
    np.testing.assert_array_equal(k.diag(X), np.ones(len(X)))


def test_ard_rbf_matches_scikit_learn_and_the_scalar_rbf():
    k = RBF(length_scale=LS)
    assert k.ard and _rel(k(X, Y), _sk(k)(X, Y)) <= 1e-12
    # equal length scales are the isotropic kernel
    same = RBF(length_scale=[1.5, 1.5, 1.5])
    np.testing.assert_allclose(same(X, Y), RBF(length_scale=1.5)(X, Y), rtol=1e-13)
    np.testing.assert_allclose(
        Matern(nu=1.5, length_scale=[1.5] * 3)(X, Y), Matern(nu=1.5, length_scale=1.5)(X, Y),
        rtol=1e-13,
    )  # fmt: skip


def test_matern_limits_and_defaults():
    assert Matern().get_params() == {"nu": 1.5, "length_scale": 1.0}  # scikit-learn's defaults
    # nu = 1/2 is the exponential kernel exp(-r)
    r = np.sqrt(((X[:, None, :] - Y[None, :, :]) ** 2).sum(-1))
    np.testing.assert_allclose(Matern(nu=0.5)(X, Y), np.exp(-r), rtol=1e-13)


@pytest.mark.parametrize(
    "spec",
    [
        {"name": "matern", "params": {"nu": 2.5, "length_scale": [0.7, 1.9, 1.2]}},
        {"name": "matern", "params": {"nu": 0.5, "length_scale": 2.0}},
        {"name": "rbf", "params": {"gamma": None, "length_scale": [0.7, 1.9, 1.2]}},
    ],
)
def test_spec_round_trip_json_and_yaml(spec):
    k = kernel_from_spec(spec)
    assert k.to_spec() == spec and spec_round_trips(k)
    for text in (json.dumps(spec), yaml.safe_dump(spec)):
        back = kernel_from_spec(yaml.safe_load(text))
        assert back == k and kernel_fingerprint(back) == kernel_fingerprint(k)
    # a numpy length-scale vector is stored as a list: the same spec and fingerprint
    arr = type(k)(**{**spec["params"], "length_scale": np.asarray(spec["params"]["length_scale"])})
    assert arr.to_spec() == spec and kernel_fingerprint(arr) == kernel_fingerprint(k)


def test_new_kernels_have_their_own_fingerprints():
    kernels = [
        RBF(length_scale=1.0),
        RBF(length_scale=[1.0, 1.0, 1.0]),
        Matern(nu=0.5),
        Matern(nu=1.5),
        Matern(nu=2.5),
        Matern(nu=1.5, length_scale=[1.0, 1.0, 1.0]),
        Matern(nu=1.5, length_scale=[1.0, 1.0, 2.0]),
    ]
    assert len({kernel_fingerprint(k) for k in kernels}) == len(kernels)


def test_algebra_and_warping():
    m, r = Matern(nu=2.5, length_scale=LS), RBF(length_scale=[1.0, 2.0])
    k = 0.5 * m + Matern(nu=0.5) * RBF(0.2) + Warped(r, SelectFeatures([2, 0]))
    ref = (
        0.5 * _sk(m)(X, Y)
        + GPMatern(nu=0.5)(X, Y) * np.exp(-0.2 * ((X[:, None] - Y[None]) ** 2).sum(-1))
        + GPRBF([1.0, 2.0])(X[:, [2, 0]], Y[:, [2, 0]])
    )
    np.testing.assert_allclose(k(X, Y), ref, rtol=1e-12)
    assert spec_round_trips(k) and k.is_mercer
    assert k.get_params()["k1__k1__kernel__nu"] == 2.5
    k.set_params(k1__k1__kernel__nu=0.5)
    assert k.k1.k1.kernel.nu == 0.5


# ---- the estimators -------------------------------------------------------------
@pytest.mark.parametrize("nu", NUS)
@pytest.mark.parametrize("ls", [1.1, LS], ids=["iso", "ard"])
def test_kernel_ridge_matches_a_dense_numpy_reference(nu, ls):
    K = _sk(Matern(nu=nu, length_scale=ls))(X)
    coef = np.linalg.solve(K + 0.3 * np.eye(len(X)), y)
    pred = _sk(Matern(nu=nu, length_scale=ls))(Y, X) @ coef
    params = {"nu": nu, "length_scale": ls}
    for model in (
        KernelRidge(kernel="matern", kernel_params=params, alpha=0.3, solver="dense"),
        KernelRidge(kernel=Matern(**params), alpha=0.3),
        KernelRidge(kernel={"name": "matern", "params": params}, alpha=0.3, solver="dense"),
    ):
        model.fit(X, y)
        np.testing.assert_allclose(model.dual_coef_, coef, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(model.predict(Y), pred, rtol=1e-9, atol=1e-12)


def test_kernel_ridge_out_of_core_matern_ard(tmp_path):
    k = Matern(nu=2.5, length_scale=LS)
    K = _sk(k)(X)
    coef = np.linalg.solve(K + 0.3 * np.eye(len(X)), y)
    # block_size 16 on 61 rows: a ragged last tile
    model = KernelRidge(kernel=k, alpha=0.3, solver="cholesky", store=tmp_path, block_size=16)
    model.fit(X, y)
    np.testing.assert_allclose(model.dual_coef_, coef, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(model.predict(Y), _sk(k)(Y, X) @ coef, rtol=1e-9, atol=1e-12)


def test_rbf_length_scale_vector_through_kernel_params():
    m = KernelRidge(kernel="rbf", kernel_params={"length_scale": LS}, alpha=0.5).fit(X, y)
    coef = np.linalg.solve(GPRBF(LS)(X) + 0.5 * np.eye(len(X)), y)
    np.testing.assert_allclose(m.dual_coef_, coef, rtol=1e-9, atol=1e-12)
    with pytest.raises(ValueError, match="not both"):
        KernelRidge(kernel="rbf", gamma=0.1, kernel_params={"length_scale": LS}).fit(X, y)
    with pytest.raises(ValueError, match="does not take parameters"):
        KernelRidge(kernel="matern", kernel_params={"degree": 2, "bogus": 1}).fit(X, y)


def test_cv_grid_over_nu_and_length_scale_matches_grid_search():
    alphas = [0.1, 1.0]
    grid = {"nu": [0.5, 2.5], "length_scale": [1.0, np.array(LS), [2.0, 2.0, 0.5]]}
    cv = KFold(3)
    ours = KernelRidgeCV(alphas=alphas, kernel="matern", param_grid=grid, cv=cv, solver="dense")
    ours.fit(X, y)
    sk = GridSearchCV(
        KernelRidge(kernel=Matern(), solver="dense"),
        {"alpha": alphas, **{f"kernel__{k}": v for k, v in grid.items()}},
        cv=cv,
    ).fit(X, y)
    np.testing.assert_allclose(
        ours.cv_results_["mean_test_score"], sk.cv_results_["mean_test_score"], rtol=1e-8
    )
    best = {k.removeprefix("kernel__"): v for k, v in sk.best_params_.items()}
    assert ours.best_params_["nu"] == best["nu"] and ours.best_alpha_ == best["alpha"]
    np.testing.assert_array_equal(ours.best_params_["length_scale"], best["length_scale"])
    # the grid's numpy vector is kept as a plain list (candidates compare, serialise)
    assert [0.7, 1.9, 1.2] in list(ours.cv_results_["param_length_scale"])
    json.dumps(ours.cv_results_["params"])
    np.testing.assert_allclose(ours.predict(Y), ours.best_estimator_.predict(Y))


# ---- bad input: a ValueError naming the value and the fix, before any work -------------
@pytest.mark.parametrize(
    "build, said",
    [
        (lambda: Matern(nu=2.0), "nu=2.0"),
        (lambda: Matern(nu=True), "nu=True"),
        (lambda: Matern(nu="1.5"), "nu='1.5'"),
        (lambda: Matern(nu=float("inf")), "rbf"),
        (lambda: Matern(length_scale=0.0), "0.0"),
        (lambda: Matern(length_scale=[1.0, -2.0]), "-2.0"),
        (lambda: Matern(length_scale=[1.0, float("nan")]), "nan"),
        (lambda: Matern(length_scale=[]), "non-empty"),
        (lambda: Matern(length_scale=[[1.0, 2.0]]), "1-D"),
        (lambda: Matern(length_scale=["a"]), "'a'"),
        (lambda: Matern(length_scale=[True, 1.0]), "True"),
        (lambda: RBF(length_scale=[1.0, 0.0]), "0.0"),
        (lambda: RBF(gamma=0.5, length_scale=[1.0, 2.0]), "not both"),
        (lambda: make_kernel("matern", nu=3.5), "0.5, 1.5 or 2.5"),
        (lambda: Matern().set_params(nu=1.0), "nu=1.0"),
    ],
)
def test_bad_parameters_name_the_value(build, said):
    with pytest.raises(ValueError) as info:
        build()
    assert said in str(info.value)


def _no_tiles(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("a kernel tile was evaluated before the width check")

    monkeypatch.setattr(evaluators, "prepare", refuse)
    monkeypatch.setattr("pipeline.engine.fused.prepare", refuse)


WIDTH = "length_scale has 2 entries but X has 3 features; give one length scale per feature"


@pytest.mark.parametrize(
    "kernel",
    [
        Matern(length_scale=[1.0, 2.0]),
        RBF(length_scale=[1.0, 2.0]),
        0.5 * Matern(length_scale=[1.0, 2.0]) + RBF(),
        Warped(RBF(length_scale=[1.0, 2.0]), Standardize([0.0] * 3, [1.0] * 3)),
    ],
    ids=repr,
)
def test_wrong_ard_width_fails_before_any_work(kernel, monkeypatch, tmp_path):
    with pytest.raises(ValueError, match=WIDTH):
        kernel(X, Y)
    with pytest.raises(ValueError, match=WIDTH):
        kernel.check_n_features(3)
    if not isinstance(kernel, Warped):
        kernel.check_n_features(2)
    _no_tiles(monkeypatch)
    for solver, extra in (
        ("dense", {}),
        ("cholesky", {"store": tmp_path}),
        ("cg", {"store": tmp_path}),
    ):
        with pytest.raises(ValueError, match=WIDTH):
            KernelRidge(kernel=kernel, solver=solver, **extra).fit(X, y)


def test_warped_width_uses_the_warped_features():
    k = Warped(Matern(length_scale=[1.0, 2.0]), SelectFeatures([2, 0]))
    k.check_n_features(3)  # two features after the warping: fits
    k(X, Y)
    with pytest.raises(ValueError, match="has 1 features"):
        Warped(Matern(length_scale=[1.0, 2.0]), SelectFeatures([1])).check_n_features(3)


def test_cv_grid_with_a_wrong_width_fails_before_any_work(monkeypatch):
    _no_tiles(monkeypatch)
    grid = {"length_scale": [1.0, [1.0, 2.0, 3.0], [1.0, 2.0]]}
    with pytest.raises(
        ValueError, match=WIDTH + r".*param_grid setting \{'length_scale': \[1.0, 2.0\]\}"
    ):
        KernelRidgeCV(kernel="matern", param_grid=grid, cv=3).fit(X, y)
    with pytest.raises(ValueError, match=r"param_grid\['nu'\] value 2.0 is invalid.*nu=2.0"):
        KernelRidgeCV(kernel="matern", param_grid={"nu": [0.5, 2.0]}, cv=3).fit(X, y)


BASE = {"data": {"source": "sklearn", "name": "diabetes"}}


def test_config_kernel_and_cv_grid():
    kernel = {"name": "matern", "params": {"nu": 1.5, "length_scale": [1.0] * 10}}
    cfg = load_config({**BASE, "kernel": kernel})
    assert cfg.kernel.build() == Matern(nu=1.5, length_scale=[1.0] * 10)
    cv = {"alphas": [0.1, 1.0], "param_grid": {"nu": [0.5, 2.5], "length_scale": [1.0, 3.0]}}
    load_config({**BASE, "kernel": {"name": "matern"}, "cv": cv})
    with pytest.raises(ConfigError, match=r"0\.5, 1\.5 or 2\.5.*nu=2\.0"):
        load_config({**BASE, "kernel": {"name": "matern", "params": {"nu": 2.0}}})
    with pytest.raises(ConfigError, match=r"length_scale.*-1\.0"):
        load_config({**BASE, "kernel": {"name": "rbf", "params": {"length_scale": [1.0, -1.0]}}})
    with pytest.raises(ConfigError, match=r"cv\.param_grid\['nu'\] value 3\.0"):
        load_config(
            {**BASE, "kernel": {"name": "matern"}, "cv": {**cv, "param_grid": {"nu": [3.0]}}}
        )


def test_evaluate_baseline_of_an_ard_rbf_is_precomputed():
    from pipeline.stages.evaluate import _sklearn_kernel

    assert _sklearn_kernel(RBF(length_scale=LS).to_spec(), 3) == ("precomputed", {})
    assert _sklearn_kernel(RBF(length_scale=2.0).to_spec(), 3) == ("rbf", {"gamma": 0.125})
    assert _sklearn_kernel(Matern().to_spec(), 3) == ("precomputed", {})


def test_krr_run_with_a_wrong_width_is_a_config_error(tmp_path, capsys):
    from pipeline import cli

    bad = {"name": "matern", "params": {"nu": 2.5, "length_scale": [1.0, 2.0, 3.0]}}
    conf = {**BASE, "kernel": bad, "lambda": 0.5, "evaluate": {"baseline": "none"},
            # in threads: the refusal is made in this process; no worker processes to start
            "cluster": {"processes": False, "n_workers": 1}}  # fmt: skip
    grid = {"alphas": [0.1, 1.0], "folds": 3, "param_grid": {"length_scale": [1.0, [1.0] * 3]}}
    for i, c in enumerate([conf, {**conf, "kernel": {"name": "matern"}, "cv": grid}]):
        path = tmp_path / f"c{i}.yaml"
        path.write_text(yaml.safe_dump(c))
        code = cli.main(["run", str(path), "--run-dir", str(tmp_path / f"run{i}"), "-q"])
        err = capsys.readouterr().err
        assert code == cli.EXIT_BAD_CONFIG, err[-800:]
        assert "length_scale has 3 entries but X has 10 features" in err
