"""``krr run`` with ``solver: {method: nystrom, n_centers: M, centers: ...}`` (issue #45
item 1): no Gram stage, X_train streamed from the ingest store, β and its centres in the
solve stage's outputs, a model whose rows are the centres; other methods' stage
identities unchanged."""

from __future__ import annotations

import numpy as np

import pipeline
from pipeline.kernels import make_kernel
from pipeline.stages import default_stages
from pipeline.stages.config import load_config
from pipeline.stages.runner import run_stages
from pipeline.stages.solve import load_alpha

BASE = {
    "data": {"source": "sklearn", "name": "diabetes"},
    "split": {"test_fraction": 0.25},
    "preprocess": {"standardize_y": True},
    "kernel": {"name": "rbf", "params": {"gamma": 0.05}},
    "lambda": 0.05,
    "solver": {"method": "nystrom", "n_centers": 60, "tol": 1e-10},
    "block_size": 128,
    "evaluate": {"baseline": "none"},
}


def _go(run, *overrides):
    cfg = load_config(BASE, list(overrides))
    return cfg, run_stages(run, default_stages(), cfg.stage_params(), identity=cfg.identity())


def test_a_nystrom_run_solves_saves_and_predicts_with_the_centres(tmp_path):
    cfg, rep = _go(tmp_path / "run")
    solve = rep.outputs["solve"]
    assert solve["method"] == "nystrom" and solve["converged"]
    assert solve["plan"]["n_centers"] == 60 and solve["plan"]["centers"] == "uniform"
    assert "gram" not in rep.outputs  # no Gram stage
    beta, centres = load_alpha(solve), np.asarray(solve["centres"])
    assert beta.shape[0] == 60 == centres.size
    # the model's rows are the centres; it predicts as k(x, C) β on scaled rows
    ing = rep.outputs["ingest"]
    from pipeline.stages.ingest import open_rows
    from pipeline.stages.outputs import IngestOutput

    X_train = open_rows(IngestOutput.from_json(ing), "X_train").compute()
    model = pipeline.load(rep.outputs["model"]["path"])
    np.testing.assert_array_equal(model.X_fit_, X_train[centres])
    k = make_kernel("rbf", gamma=0.05)
    Knm = k(X_train, X_train[centres])
    y = open_rows(IngestOutput.from_json(ing), "y_train").compute().reshape(len(X_train), -1)
    ref = np.linalg.solve(Knm.T @ Knm + 0.05 * k(X_train[centres]), Knm.T @ y)
    np.testing.assert_allclose(Knm @ beta, Knm @ ref, rtol=0, atol=1e-7)
    assert rep.outputs["evaluate"]["metrics"]["r2"] > 0.3  # predicted with the centres


def test_other_methods_keep_their_solve_identity():
    cg = load_config(BASE, ["solver.method=cg"]).stage_params()["solve"]["solver"]
    assert "n_centers" not in cg and "centers" not in cg
    ny = load_config(BASE, []).stage_params()["solve"]["solver"]
    assert ny["n_centers"] == 60 and ny["centers"] == "uniform"
