"""A changed default keeps the identity of runs made before (``Stage.identity``).

Issue #45 made the adaptive preconditioner CG's default (it was ``nystrom``, rank 500)
and, for the search, screening to ``CV_SCREEN_TOL`` (it was none). The solve and select
stages' fingerprints spell the new defaults as the old ones, so a run directory made
before keeps its solve and selection; any other spelling is another stage.
"""

from __future__ import annotations

import pipeline.constants as C
from pipeline.stages import default_stages, load_config
from pipeline.stages.stage import stage_fingerprint

STAGES = {s.name: s for s in default_stages()}


def _fp(name: str, params: dict) -> str:
    return stage_fingerprint(STAGES[name], params, {})


def _with(params: dict, key: str, **changes) -> dict:
    return {**params, key: {**params[key], **changes}}


def test_the_solve_stage_spells_the_default_preconditioner_as_before(diabetes_config):
    solve = load_config(diabetes_config()).stage_params()["solve"]
    assert solve["solver"]["preconditioner"] == "adaptive" and solve["solver"]["rank"] is None
    before = _with(solve, "solver", preconditioner="nystrom", rank=C.DEFAULT_RANK)
    assert _fp("solve", solve) == _fp("solve", before)
    # a named rank is its own solve; so is a nystrom or adaptive with another rank
    assert _fp("solve", _with(solve, "solver", rank=800)) != _fp("solve", solve)
    assert _fp("solve", _with(solve, "solver", preconditioner="jacobi")) != _fp("solve", solve)
    # the arguments the stage runs with are the config's, not the view
    STAGES["solve"].identity(solve)
    assert solve["solver"]["preconditioner"] == "adaptive" and solve["solver"]["rank"] is None


def test_the_select_stage_spells_the_default_search_as_before(diabetes_config):
    cv = {"alphas": [0.1, 1.0], "folds": 3}
    select = load_config(diabetes_config(cv=cv)).stage_params()["select"]
    assert select["cv"]["preconditioner"] == "adaptive"
    assert select["cv"]["screen_tol"] == C.CV_SCREEN_TOL
    before = _with(select, "cv", preconditioner="nystrom", screen_tol=None)
    assert _fp("select", select) == _fp("select", before)
    assert _fp("select", _with(select, "cv", screen_tol=1e-4)) != _fp("select", select)
    assert _fp("select", _with(select, "cv", preconditioner="none")) != _fp("select", select)
    # no cv section: nothing to view
    plain = load_config(diabetes_config()).stage_params()["select"]
    assert STAGES["select"].identity(plain) is plain


def test_nystrom_stages_name_the_version_of_their_arithmetic(diabetes_config):
    """A Nyström solve or search made by older arithmetic (session 41: the direct pass
    in the centres' basis where it rounded past use, the CV's moment-formula scores) is
    another stage, recomputed: its identity carries ``NYSTROM_RECIPE``; other methods'
    identities do not change."""
    from pipeline.linalg.nystrom_solve import NYSTROM_RECIPE

    solve = load_config(diabetes_config(), ["solver.method=nystrom"]).stage_params()["solve"]
    assert STAGES["solve"].identity(solve)["nystrom_recipe"] == NYSTROM_RECIPE
    plain = load_config(diabetes_config()).stage_params()["solve"]
    assert "nystrom_recipe" not in STAGES["solve"].identity(plain)
    cv = {"alphas": [0.1, 1.0], "folds": 3, "solver": "nystrom", "n_centers": 50}
    select = load_config(diabetes_config(cv=cv)).stage_params()["select"]
    assert STAGES["select"].identity(select)["nystrom_recipe"] == NYSTROM_RECIPE
    cg = {"alphas": [0.1, 1.0], "folds": 3}
    plain = load_config(diabetes_config(cv=cg)).stage_params()["select"]
    assert "nystrom_recipe" not in STAGES["select"].identity(plain)
    # evaluate.compare fits Nyström models too; without it the stage is as before
    ev = load_config(diabetes_config(), ["evaluate.compare=true"]).stage_params()["evaluate"]
    assert STAGES["evaluate"].identity(ev)["nystrom_recipe"] == NYSTROM_RECIPE
    plain = load_config(diabetes_config()).stage_params()["evaluate"]
    assert STAGES["evaluate"].identity(plain) is plain
