"""The ``cv`` config section and the select stage: validation, wiring, invalidation."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline.stages import default_stages, run_stages
from pipeline.stages.config import ConfigError, load_config
from pipeline.stages.ingest import open_rows
from pipeline.stages.status import run_status

BASE = {"data": {"source": "sklearn", "name": "diabetes"}}
CV = {"alphas": [0.1, 1.0, 10.0], "param_grid": {"gamma": [0.01, 0.1]}, "folds": 3}


def cfg_with(cv, *overrides):
    return load_config({**BASE, "cv": cv}, list(overrides))


# ---------------------------------------------------------------- config


def test_cv_section_is_optional_and_typed():
    assert load_config(BASE).cv is None
    c = cfg_with({"alphas": {"logspace": [-2, 1, 4]}, "folds": 0.2, "scoring": "r2"})
    np.testing.assert_allclose(c.cv.alphas, [0.01, 0.1, 1.0, 10.0])
    assert c.cv.folds == 0.2 and isinstance(c.cv.folds, float)
    assert cfg_with({"alphas": [1], "folds": "loo"}).cv.folds == "loo"
    assert cfg_with({"alphas": [1], "folds": 4}).cv.folds == 4
    assert cfg_with({"alphas": [1], "solver": "band"}).cv.solver == "band"


@pytest.mark.parametrize(
    ("cv", "match"),
    [
        ({"alphas": []}, r"cv\.alphas: the alphas grid is empty"),
        ({"alphas": [1.0, 0.0]}, r"cv\.alphas: alphas must all be finite and > 0, got 0\.0"),
        ({"alphas": [1.0, -1e-3]}, r"cv\.alphas: .* > 0"),
        ({"alphas": "many"}, r"cv\.alphas: .*valid list"),
        ({"alphas": {"logspace": [0, 1]}}, r"cv\.alphas: .*logspace: \[lo, hi, num\]"),
        ({"alphas": [1], "folds": 1}, r"cv\.folds: folds=1: K-fold needs at least 2"),
        ({"alphas": [1], "folds": 1.5}, r"cv\.folds: .*held-out fraction"),
        ({"alphas": [1], "folds": "ten"}, r"cv\.folds: .*'loo'.*'ten'"),
        ({"alphas": [1], "solver": "svd"}, r"cv\.solver"),
        (
            {"alphas": [1], "scoring": "neg_mean_squared_eror"},
            r"did you mean 'neg_mean_squared_error'",
        ),
        (
            {"alphas": [1], "param_grid": {"gamma": []}},
            r"cv\.param_grid\['gamma'\] is an empty list",
        ),
        ({"alphas": [1], "param_grid": {"alpha": [1]}}, r"give the ridge penalties as cv\.alphas"),
        ({"alphas": [1], "tol": "tight"}, r"cv\.tol: .*'tight'"),
    ],
)
def test_bad_cv_sections_name_the_key(cv, match):
    with pytest.raises(ConfigError, match=match):
        cfg_with(cv)


def test_unknown_cv_key_suggests_nearest():
    with pytest.raises(
        ConfigError, match=r"cv\.param_gird: unknown key; did you mean 'cv\.param_grid'"
    ):
        cfg_with({"alphas": [1], "param_gird": {"gamma": [1]}})


def test_gamma_grid_for_a_kernel_without_gamma():
    with pytest.raises(ConfigError, match=r"cv\.param_grid has 'gamma' but kernel .*no parameter"):
        load_config(
            {
                **BASE,
                "kernel": {"name": "linear"},
                "cv": {"alphas": [1], "param_grid": {"gamma": [1]}},
            }
        )


def test_cv_overrides_and_stage_params():
    a = cfg_with(CV).stage_params()
    b = cfg_with(CV, "cv.alphas=[0.5, 5]").stage_params()
    assert load_config(BASE).stage_params()["select"]["cv"] is None
    assert a["select"]["cv"]["alphas"] == [0.1, 1.0, 10.0]
    assert b["select"]["cv"]["alphas"] == [0.5, 5.0]
    # the grid is the select stage's argument only: downstream stages see the selection
    assert a["gram"] == b["gram"] and a["solve"] == b["solve"]


# ---------------------------------------------------------------- stage


RUN = {
    **BASE,
    "split": {"test_fraction": 0.25},
    "preprocess": {"standardize_y": True},
    "kernel": {"name": "rbf", "params": {"gamma": 0.5}},
    "lambda": 0.5,
    "solver": {"method": "cholesky"},
    "block_size": 128,
    "evaluate": {"baseline": "none"},
}


def go(run, cv, *overrides):
    cfg = load_config({**RUN, **({"cv": cv} if cv else {})}, list(overrides))
    return run_stages(run, default_stages(), cfg.stage_params(), identity=cfg.identity())


def test_select_feeds_lambda_and_kernel_downstream(tmp_path):
    from sklearn.kernel_ridge import KernelRidge as SkKR
    from sklearn.model_selection import GridSearchCV, KFold

    from pipeline.models.artifact import load_artifact

    run = tmp_path / "run"
    cv = {**CV, "alphas": [0.03, 0.3, 3.0], "param_grid": {"gamma": [0.01, 0.1, 1.0]}}
    cv.update(shuffle=True, random_state=0, scoring="neg_mean_squared_error")
    rep = go(run, cv)
    assert rep.ran == ["ingest", "select", "gram", "solve", "model", "predict", "evaluate"]
    sel = rep.outputs["select"]

    # scikit-learn's own grid search on the same training rows agrees on the choice
    ing = rep.outputs["ingest"]
    X = open_rows(ing, "X_train").compute()
    y = open_rows(ing, "y_train").compute().ravel()
    gs = GridSearchCV(
        SkKR(kernel="rbf"),
        {"alpha": cv["alphas"], "gamma": cv["param_grid"]["gamma"]},
        cv=KFold(3, shuffle=True, random_state=0),
        scoring="neg_mean_squared_error",
    ).fit(X, y)
    assert sel["best_params"] == pytest.approx(gs.best_params_)
    # in the data's units of y: the MSE on the standardised rows times the y scale squared
    scale = (ing.get("y_scaler") or {"scale": [1.0]})["scale"][0]
    assert sel["best_score"] == pytest.approx(gs.best_score_ * scale**2, rel=1e-8)

    # downstream stages ran with the selection, not with lambda=0.5, gamma=0.5
    assert sel["lam"] == gs.best_params_["alpha"]
    assert rep.outputs["solve"]["lam"] == sel["lam"]
    assert rep.outputs["solve"]["shift"] == pytest.approx(sel["lam"])
    art = load_artifact(rep.outputs["model"]["path"])
    assert art.kernel.to_spec() == sel["kernel"]
    assert art.kernel.get_params()["gamma"] == gs.best_params_["gamma"]
    assert 0.2 < rep.outputs["evaluate"]["metrics"]["r2"] < 0.8

    # the search report is in the select stage's directory
    d = run / "select"
    for name in ("cv_results.csv", "cv_search.json", "cv_score_vs_alpha.png", "cv_heatmap.png"):
        assert (d / name).is_file(), name
    assert (d / "cv_score_vs_alpha.png").read_bytes()[:4] == b"\x89PNG"
    summary = json.loads((d / "cv_search.json").read_text())
    assert summary["best_params"] == pytest.approx(gs.best_params_)
    assert len((d / "cv_results.csv").read_text().strip().splitlines()) == 1 + 9

    st = run_status(run)
    assert st["complete"]
    assert {s["stage"]: s["state"] for s in st["stages"]}["select"] == "done"


def test_grid_changes_invalidate_by_what_is_selected(tmp_path):
    run = tmp_path / "run"
    cv = {"alphas": [0.1, 1.0], "param_grid": {"gamma": [0.03]}, "folds": 3}
    rep = go(run, cv)
    first = rep.outputs["select"]["best_params"]
    gram_markers = sorted((run / "gram" / "gram.zarr" / "_markers" / "gram").iterdir())
    mtimes = [p.stat().st_mtime_ns for p in gram_markers]

    # a new grid whose winner is the same: selection reruns, the rest is kept
    rep = go(run, {**cv, "alphas": [first["alpha"], 1e3]})
    assert rep.ran == ["select"]
    assert rep.skipped_done == ["ingest", "gram", "solve", "model", "predict", "evaluate"]
    assert [p.stat().st_mtime_ns for p in gram_markers] == mtimes

    # only lambda differs: the Gram is kept, the solve is redone
    other = 1e3
    rep = go(run, {**cv, "alphas": [other]})
    assert rep.outputs["select"]["lam"] == other
    assert rep.ran == ["select", "solve", "model", "predict", "evaluate"]
    assert rep.outputs["solve"]["lam"] == other

    # another gamma selected: the Gram is rebuilt
    rep = go(run, {**cv, "alphas": [other], "param_grid": {"gamma": [0.2]}})
    assert rep.ran == ["select", "gram", "solve", "model", "predict", "evaluate"]
    assert rep.outputs["select"]["kernel"]["params"]["gamma"] == 0.2

    # cv removed: the configured lambda and kernel apply again
    rep = go(run, None)
    assert rep.disabled == ["select"]
    assert rep.outputs["solve"]["lam"] == RUN["lambda"]
    assert "select" not in rep.outputs
    st = {s["stage"]: s["state"] for s in run_status(run)["stages"]}
    assert st["select"] == "skipped" and st["solve"] == "done"


def test_select_failure_names_the_stage(tmp_path):
    from pipeline.stages import StageFailed

    # more folds than training rows: refused by the search, recorded as the select stage's
    with pytest.raises(StageFailed, match="stage 'select' failed"):
        go(tmp_path / "run", {"alphas": [1.0], "folds": 1000})


def test_a_subsampled_search_refines_lambda_on_all_rows_and_reports_it(tmp_path):
    """``cv.subsample``: the grid on a subsample, λ refined on all training rows (the
    curve in the outputs, cv_refine.png and the report); the solve uses the refined λ."""
    from pipeline.models.artifact import load_artifact
    from pipeline.report import write_report

    run = tmp_path / "run"
    cv = {"alphas": [0.01, 0.1, 1.0], "folds": 3, "subsample": 90}
    rep = go(run, cv, "kernel.params.gamma=0.1")
    sel = rep.outputs["select"]
    r = sel["refine"]
    assert sel["subsample"] == 90 and r["n_train"] == rep.outputs["ingest"]["n_train"]
    assert r["method"] == "loo-eigen" and len(r["alphas"]) == len(r["scores"]) == 7
    assert sel["lam"] == r["alpha"] == sel["best_params"]["alpha"]
    assert r["subsample_alpha"] in cv["alphas"]
    assert (run / "select" / "cv_refine.png").stat().st_size > 0
    assert rep.outputs["solve"]["lam"] == r["alpha"]
    assert load_artifact(rep.outputs["model"]["path"]).kernel.to_spec() == sel["kernel"]
    html = write_report(run).read_text()
    assert 'id="cv-refine"' in html and "λ refined on all" in html
