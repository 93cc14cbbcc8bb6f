"""The in-memory ``solver="auto"`` rule (``IN_MEMORY_CG_MARGIN``) against measured times.

``workflows/benchmarks/bench_inmemory_rule.json`` holds 48 kin40k cases (the first 6,000 to
15,000 training rows of split 0, RBF γ 0.05-1, λ 1e-3-1): the measured seconds of
``KernelRidge(solver="dense")`` and of ``solver="cg"``, and the preconditioner residuals ρ
that the plan measured on the rows. These tests replay the plan's in-memory choice for each
case from the code, with those ρ (the benchmark's ``replay``, each size's fastest dense fit
standing for all its cases), and check it against the measurements. They never time
anything. A change to the rule's rates, margin or probe is checked here; where the plan
asks for a ρ the file does not hold, run the benchmark again (its docstring has the
command).
"""

from __future__ import annotations

import json

import pytest
from _workflows import BENCH, load_workflow

from pipeline import constants as C

#: a case sent to CG may take at most this much longer than the dense dual (timing noise)
REGRET = 1.3
#: the rule's total over the grid, against every case taking its faster solver
TOTAL = 1.10


@pytest.fixture(scope="module")
def bench():
    """``bench_inmemory_rule.py`` as a module: its :func:`replay` is the one replay of the
    plan on recorded cases (the benchmark prints it for other margins)."""
    return load_workflow("benchmarks/bench_inmemory_rule.py")


@pytest.fixture(scope="module")
def grid() -> dict:
    doc = json.loads((BENCH / "bench_inmemory_rule.json").read_text())
    assert doc["meta"]["kernel"] == "rbf" and doc["meta"]["d"] == 8
    return doc


def _replay(bench, grid: dict) -> list[tuple[dict, str, dict[str, float]]]:
    """Each case, the solver the plan chooses for it now, and the two measured times."""
    out = bench.replay(grid["cases"], grid["meta"]["d"])
    assert {s for _, s, _ in out} <= {"dense", "cg"}
    return out


def _total(replayed) -> tuple[float, float]:
    """The rule's total seconds over the grid, and the best possible."""
    return (
        sum(t[s] for _, s, t in replayed),
        sum(min(t.values()) for _, _, t in replayed),
    )


def test_the_grid_covers_both_winners(bench, grid):
    # a grid on which one solver always wins could not catch a rule that always picks it
    faster = {min(("dense", "cg"), key=lambda s: t[s]) for _, _, t in _replay(bench, grid)}
    assert faster == {"dense", "cg"} and len(grid["cases"]) >= 24


def test_cg_is_chosen_only_where_it_is_not_slower(bench, grid):
    slower = [
        (c["rows"], c["gamma"], c["lambda"], t)
        for c, s, t in _replay(bench, grid)
        if s == "cg" and t["cg"] > REGRET * t["dense"]
    ]
    assert slower == []


def test_the_rule_is_near_the_best_total(bench, grid):
    total, best = _total(_replay(bench, grid))
    assert total <= TOTAL * best, (total, best)


def test_the_old_margin_leaves_cg_out_where_it_is_far_faster(bench, grid, monkeypatch):
    # the margin of 2 kept the dense dual at 12,000 rows where CG was about 2x faster
    def far_slower(replayed):
        return sum(t[s] > 1.5 * min(t.values()) for _, s, t in replayed)

    now = _replay(bench, grid)
    monkeypatch.setattr(C, "IN_MEMORY_CG_MARGIN", 2.0)
    old = _replay(bench, grid)
    assert _total(old)[0] > _total(now)[0]
    assert far_slower(old) >= far_slower(now) + 3
