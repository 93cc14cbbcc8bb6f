"""``krr run`` with ``solver.cg_precision`` (#17 item 5): a named ``mixed`` runs the
mixed-precision solve and says so in the solve stage's outputs; ``auto`` (the default)
leaves the stage's identity as it was, a named choice changes it."""

from __future__ import annotations

import numpy as np

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
    "solver": {"method": "cg", "tol": 1e-9},
    "block_size": 128,
    "evaluate": {"baseline": "none"},
}


def _go(run, *overrides):
    cfg = load_config(BASE, list(overrides))
    return cfg, run_stages(run, default_stages(), cfg.stage_params(), identity=cfg.identity())


def test_a_named_mixed_precision_solve_runs_and_is_recorded(tmp_path):
    cfg64, rep64 = _go(tmp_path / "f64", "solver.cg_precision=float64")
    cfgm, repm = _go(tmp_path / "mixed", "solver.cg_precision=mixed")
    solve = repm.outputs["solve"]
    assert solve["plan"]["cg_precision"] == "mixed" and solve["converged"]
    assert "mixed (as asked)" in solve["plan_reason"]
    assert rep64.outputs["solve"]["plan"]["cg_precision"] == "float64"
    a64, am = load_alpha(rep64.outputs["solve"]), load_alpha(solve)
    np.testing.assert_allclose(am, a64, rtol=0, atol=1e-6 * np.abs(a64).max())
    assert cfgm.stage_params()["solve"] != cfg64.stage_params()["solve"]


def test_the_default_leaves_the_solve_stages_identity_unchanged():
    default = load_config(BASE, []).stage_params()["solve"]["solver"]
    assert "cg_precision" not in default  # runs made before the choice existed keep theirs
    named = load_config(BASE, ["solver.cg_precision=mixed"]).stage_params()["solve"]["solver"]
    assert named["cg_precision"] == "mixed"
