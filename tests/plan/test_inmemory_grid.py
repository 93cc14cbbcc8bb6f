"""The in-memory ``solver="auto"`` rule (``IN_MEMORY_CG_MARGIN``) against measured times.

``workflows/benchmarks/bench_inmemory_rule.json`` holds 48 kin40k cases (the first 6,000 to
15,000 training rows of split 0, RBF γ 0.05-1, λ 1e-3-1): the measured seconds of
``KernelRidge(solver="dense")`` and of ``solver="cg"``, and the preconditioner residuals ρ
that the plan measured on the rows. These tests replay the plan's in-memory choice for each
case from the code, with those ρ, and check it against the measurements. They never time
anything. A change to the rule's rates, margin or probe is checked here; where the plan
asks for a ρ the file does not hold, run the benchmark again (its docstring has the
command).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline import constants as C
from pipeline.engine.placement import Probes, Resources
from pipeline.kernels import make_kernel
from pipeline.plan.fit_plan import plan_fit

GRID = Path(__file__).resolve().parents[2] / "workflows" / "benchmarks" / "bench_inmemory_rule.json"
RES = Resources(memory_bytes=16 << 30, disk_bytes=100 << 30, in_memory=True)
#: a case sent to CG may take at most this much longer than the dense dual (timing noise)
REGRET = 1.3
#: the rule's total over the grid, against every case taking its faster solver
TOTAL = 1.10


@pytest.fixture(scope="module")
def grid() -> dict:
    doc = json.loads(GRID.read_text())
    assert doc["meta"]["kernel"] == "rbf" and doc["meta"]["d"] == 8
    return doc


def _replay(grid: dict) -> list[tuple[dict, str, dict[str, float]]]:
    """Each case, the solver the plan chooses for it now, and the two measured times. The
    dense dual's work depends on N and D only, so each size's fastest dense fit stands for
    all its cases (in the benchmark's order a dense fit right after a CG fit ran 2-5 s
    slower, which would favour CG exactly where the rule took it)."""
    dense = {}
    for c in grid["cases"]:
        dense[c["rows"]] = min(c["dense_s"], dense.get(c["rows"], c["dense_s"]))
    out = []
    for c in grid["cases"]:

        def residual(rank: int, c: dict = c) -> float:
            got = c["rho_by_rank"].get(str(int(rank)))
            assert got is not None, (
                f"the plan asks for ρ at rank {rank} on {c['rows']} rows, which the grid "
                "does not hold: run bench_inmemory_rule.py --json again"
            )
            return got

        kernel = make_kernel("rbf", gamma=c["gamma"])
        probes = Probes(True, residual, lambda shift: 0.0)
        plan, _ = plan_fit(c["rows"], 8, kernel, RES, {"alpha": c["lambda"]}, probes=probes)
        assert plan.solver in ("dense", "cg"), plan
        out.append((c, plan.solver, {"dense": dense[c["rows"]], "cg": c["cg_s"]}))
    return out


def _total(replayed) -> tuple[float, float]:
    """The rule's total seconds over the grid, and the best possible."""
    return (
        sum(t[s] for _, s, t in replayed),
        sum(min(t.values()) for _, _, t in replayed),
    )


def test_the_grid_covers_both_winners(grid):
    # a grid on which one solver always wins could not catch a rule that always picks it
    faster = {min(("dense", "cg"), key=lambda s: t[s]) for _, _, t in _replay(grid)}
    assert faster == {"dense", "cg"} and len(grid["cases"]) >= 24


def test_cg_is_chosen_only_where_it_is_not_slower(grid):
    slower = [
        (c["rows"], c["gamma"], c["lambda"], t)
        for c, s, t in _replay(grid)
        if s == "cg" and t["cg"] > REGRET * t["dense"]
    ]
    assert slower == []


def test_the_rule_is_near_the_best_total(grid):
    total, best = _total(_replay(grid))
    assert total <= TOTAL * best, (total, best)


def test_the_old_margin_leaves_cg_out_where_it_is_far_faster(grid, monkeypatch):
    # the margin of 2 kept the dense dual at 12,000 rows where CG was about 2x faster
    def far_slower(replayed):
        return sum(t[s] > 1.5 * min(t.values()) for _, s, t in replayed)

    now = _replay(grid)
    monkeypatch.setattr(C, "IN_MEMORY_CG_MARGIN", 2.0)
    old = _replay(grid)
    assert _total(old)[0] > _total(now)[0]
    assert far_slower(old) >= far_slower(now) + 3
