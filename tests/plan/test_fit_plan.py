"""One fit plan (issue #16, item 1): one FitPlan, one auto rule, one execute().

``krr run`` and ``KernelRidge(solver="auto")`` plan the same fit with
:func:`pipeline.plan.fit_plan.plan_fit` and log the same plan and reason; every
default lives once in :mod:`pipeline.constants`.
"""

from __future__ import annotations

import logging
import re

import numpy as np
import pytest

from pipeline import KernelRidge
from pipeline import constants as C
from pipeline.fit import row_probes
from pipeline.kernels import make_kernel
from pipeline.plan.fit_plan import FitPlan, Resources, plan_fit

GB = 1e9
RES = Resources(memory_bytes=16 * GB, disk_bytes=100 * GB, in_memory=False)


def test_one_default_each_from_the_constants():
    p = FitPlan()
    assert (p.block_size, p.rank, p.options.tol, p.options.max_iter) == (
        C.DEFAULT_BLOCK_SIZE,
        C.DEFAULT_RANK,
        C.DEFAULT_TOL,
        C.DEFAULT_MAX_ITER,
    )
    plan, reason = plan_fit(
        300, 5, None, RES, {"solver": "cg", "matvec": "matrix_free", "preconditioner": "nystrom"}
    )
    # old spellings map to the one vocabulary; the rank is capped at n; defaults filled in
    assert plan.solver == "cg" and plan.matvec == "recompute" and plan.rank == 300
    # the default preconditioner is the adaptive one, its rank capped by the N-scaled rule
    # (and memory); a named rank is its cap
    ada, _ = plan_fit(300, 5, None, RES, {"solver": "cg"})
    assert ada.options.preconditioner == C.DEFAULT_PRECONDITIONER == "adaptive"
    assert ada.rank == C.adaptive_rank_cap(300) == 256
    big, _ = plan_fit(1_000_000, 5, None, RES, {"solver": "cg"})
    budget = min(C.ADAPTIVE_MEMORY_BUDGET, C.ADAPTIVE_MEMORY_FRACTION * 16 * GB)
    assert big.rank == int(budget) // (4 * 1_000_000) < C.adaptive_rank_cap(1_000_000)
    assert plan_fit(300, 5, None, RES, {"solver": "cg", "rank": 100})[0].rank == 100
    assert plan.options.tol == C.DEFAULT_TOL and plan.options.max_iter == C.DEFAULT_MAX_ITER
    assert "requested" in reason
    plan, _ = plan_fit(300, 5, None, RES, {"solver": "cg", "alpha_convention": "n"})
    assert plan.alpha_convention == "n_samples"
    with pytest.raises(ValueError, match="matvec='sideways'.*'stored', 'recompute' or 'auto'"):
        plan_fit(300, 5, None, RES, {"solver": "cg", "matvec": "sideways"})


def test_auto_rule_crosses_at_the_row_threshold_and_takes_a_cost_model():
    # the old simple model (still selectable) crosses at CHOLESKY_MAX_N rows whatever λ;
    # the default, calibrated one depends on λ (tests/plan/test_policy_grid.py
    # checks it against measured times)
    n = C.CHOLESKY_MAX_N
    assert plan_fit(n, 10, None, RES, cost_model="simple")[0].solver == "cholesky"
    assert plan_fit(n + 1, 10, None, RES, cost_model="simple")[0].solver == "cg"
    rbf = make_kernel("rbf")
    assert plan_fit(n, 10, rbf, RES, {"alpha": 1e-1})[0].solver == "cg"
    assert plan_fit(n, 10, rbf, RES, {"alpha": 1e-4})[0].solver == "cholesky"

    class CholeskyAlwaysSlow:
        name = "test"

        def cholesky_seconds(self, n, d, kernel=None):
            return 1e9

        def cg_seconds(self, n, d, kernel=None):
            return 1.0

    plan, reason = plan_fit(1000, 10, None, RES, cost_model=CholeskyAlwaysSlow())
    assert plan.solver == "cg" and "test model" in reason
    # a kernel not known to be PSD never gets CG, whatever the cost model says
    plan, reason = plan_fit(1000, 10, make_kernel("sigmoid"), RES, cost_model=CholeskyAlwaysSlow())
    assert plan.solver == "cholesky" and "PSD" in reason


def test_estimator_in_memory_rule_unchanged():
    res = Resources(memory_bytes=16 * GB, disk_bytes=100 * GB, in_memory=True)
    from pipeline.kernels import Linear, make_kernel

    assert plan_fit(10_000, 10, Linear(), res)[0].solver == "primal"
    assert plan_fit(500, 10, make_kernel("rbf"), res)[0].solver == "dense"
    small = Resources(memory_bytes=1e4, disk_bytes=100 * GB, in_memory=True)
    plan, reason = plan_fit(500, 10, make_kernel("rbf"), small)
    assert plan.solver == "cholesky" and "out-of-core" in reason
    # callables (kernel None) only run in memory
    assert plan_fit(500, 10, None, small)[0].solver == "dense"


def test_the_plan_keeps_the_predictions_that_decided():
    """``FitPlan.predicted_seconds`` holds the seconds the reason states: out of core the
    Cholesky's and CG's, of which the plan took the faster; nothing for a named solver or
    where a rule on space decided; and nothing of it is recorded."""
    res = Resources(memory_bytes=64 * GB, disk_bytes=1000 * GB, in_memory=False)
    rbf = make_kernel("rbf", gamma=0.1)
    chosen = set()
    for n in (5_000, 60_000):
        plan, reason = plan_fit(n, 8, rbf, res, {"alpha": 1e-2})
        p = plan.predicted_seconds
        assert set(p) == {"cholesky", "cg"}, (n, p)
        assert f"{p['cholesky']:.3g} s" in reason and f"{p['cg']:.3g} s" in reason, reason
        assert plan.solver == min(p, key=p.get)
        assert "predicted_seconds" not in plan.to_dict()
        assert FitPlan.from_dict(plan.to_dict()).predicted_seconds == {}
        chosen.add(plan.solver)
    assert chosen == {"cholesky", "cg"}
    named = plan_fit(60_000, 8, rbf, res, {"alpha": 1e-2, "solver": "cholesky"})[0]
    assert named.solver == "cholesky" and named.predicted_seconds == {}
    no_disk = Resources(memory_bytes=64 * GB, disk_bytes=1 * GB, in_memory=False)
    plan, reason = plan_fit(60_000, 8, rbf, no_disk, {"alpha": 1e-2})
    assert plan.solver == "cg" and "disk" in reason and plan.predicted_seconds == {}


def _states(reason: str, predicted: dict) -> bool:
    """Whether ``reason`` gives the plan's two in-memory predictions, as it words them."""
    return (
        f"CG is predicted at {predicted['cg']:.3g} s against {predicted['dense']:.3g} s" in reason
    )


def test_in_memory_auto_takes_cg_only_when_the_model_prices_it_far_cheaper():
    """The dense dual that fits is kept unless the one cost model predicts matrix-free CG
    IN_MEMORY_CG_MARGIN times faster: a large, well-conditioned problem (flights' λ = 1:
    the dense dual took 319.8 s on 36,826 rows, CG on twice the rows 66.6 s)."""
    res = Resources(memory_bytes=64 * GB, disk_bytes=100 * GB, in_memory=True)
    rbf = make_kernel({"name": "rbf", "params": {"gamma": 0.1}})
    plan, reason = plan_fit(36_826, 10, rbf, res, {"alpha": 1.0})
    assert plan.solver == "cg" and plan.store is None
    assert "needs" in reason and _states(reason, plan.predicted_seconds)
    assert plan.predicted_seconds["cg"] * C.IN_MEMORY_CG_MARGIN < plan.predicted_seconds["dense"]
    # a hard λ: CG's iterations price it above the dense solve, which stays, and the
    # reason gives both predictions (the user may name CG)
    plan, reason = plan_fit(18_000, 8, rbf, res, {"alpha": 1e-6})
    kept = f"(not more than {C.IN_MEMORY_CG_MARGIN:g}x faster)"
    assert plan.solver == "dense" and kept in reason and _states(reason, plan.predicted_seconds)
    assert (
        not plan.predicted_seconds["cg"] * C.IN_MEMORY_CG_MARGIN < plan.predicted_seconds["dense"]
    )
    # measured ρ: CG priced with it, not at its floor
    X = np.random.default_rng(1).standard_normal((12_000, 8))
    k = make_kernel("rbf", gamma=0.25)
    plan, reason = plan_fit(12_000, 8, k, res, {"alpha": 1e-2}, probes=row_probes(X, k))
    assert plan.solver == "dense" and "at best" not in reason
    assert "matrix-free CG is predicted at" in reason and kept in reason
    # small problems stay dense whatever λ; per-target alphas and callables stay dense
    assert plan_fit(2_000, 10, rbf, res, {"alpha": 1.0})[0].solver == "dense"
    assert plan_fit(36_826, 10, rbf, res, {"alpha": [1.0, 2.0]})[0].solver == "dense"
    assert plan_fit(36_826, 10, None, res, {"alpha": 1.0})[0].solver == "dense"
    # a named solver is never second-guessed
    assert plan_fit(36_826, 10, rbf, res, {"alpha": 1.0, "solver": "dense"})[0].solver == "dense"


def _plan_lines(text: str) -> list[str]:
    return [
        re.sub(r"^.*fit plan \([^)]*\): ", "", ln) for ln in text.splitlines() if "fit plan (" in ln
    ]


def test_krr_run_and_estimator_log_the_same_plan(tmp_path, monkeypatch, caplog, diabetes_config):
    import pipeline.fit as fit_mod
    import pipeline.linalg.dense_memory as memory
    from pipeline import cli
    from pipeline.stages.ingest import open_rows
    from pipeline.stages.manifest import Manifest

    monkeypatch.setattr(fit_mod, "_disk_free", lambda store: 100 * GB)
    monkeypatch.setattr(memory, "available_memory", lambda: int(16 * GB))
    cfg = diabetes_config("plan.yaml", name="plan", solver={"method": "auto"})
    run_dir = tmp_path / "run"
    with caplog.at_level(logging.INFO):
        assert cli.main(["run", str(cfg), "--run-dir", str(run_dir)]) == 0
    run_lines = _plan_lines(caplog.text)
    assert len(run_lines) == 1, caplog.text
    ing = Manifest.load(run_dir).stages["ingest"].outputs
    X = np.asarray(open_rows(ing, "X_train").compute())
    y = np.asarray(open_rows(ing, "y_train").compute())
    caplog.clear()
    with caplog.at_level(logging.INFO):
        est = KernelRidge(
            alpha=0.5, kernel="rbf", gamma=0.05, solver="auto", block_size=128,
            store=tmp_path / "est",
        ).fit(X, y)  # fmt: skip
    est_lines = _plan_lines(caplog.text)
    assert est_lines == run_lines
    assert est.solver_ == "cholesky" and "solver=cholesky" in run_lines[0]
    solve = Manifest.load(run_dir).stages["solve"].outputs
    assert solve["method"] == "cholesky" and solve["plan"]["solver"] == "cholesky"
    np.testing.assert_allclose(
        est.dual_coef_, np.load(solve["alpha"]).reshape(est.dual_coef_.shape), rtol=1e-8, atol=1e-10
    )


def test_the_plan_line_says_who_chooses_the_rank():
    k = make_kernel("rbf")
    ch = {"solver": "cg", "alpha": 1e-2}
    nys, _ = plan_fit(50_000, 8, k, RES, {**ch, "preconditioner": "nystrom", "rank": 300})
    ada, _ = plan_fit(50_000, 8, k, RES, {**ch, "preconditioner": "adaptive", "rank": 300})
    assert "rank=300" in nys.describe()
    # the adaptive preconditioner grows its own rank up to 300: the log must not claim 300
    assert "rank=adaptive, at most 300" in ada.describe() and "rank=300" not in ada.describe()


def test_small_fits_skip_the_subsample_estimate(monkeypatch):
    # when the Cholesky beats CG even at CG's floor (ρ = 0), measuring ρ (about 1 s)
    # cannot change the choice: a 2,000-row fit is planned without it
    import pipeline.linalg.spectrum as spectrum
    from pipeline.plan import fit_plan

    calls = []
    real = spectrum.estimate_residual
    monkeypatch.setattr(
        spectrum, "estimate_residual", lambda *a, **k: calls.append(a[0].shape) or real(*a, **k)
    )
    k = make_kernel("rbf", gamma=0.1)
    X = np.random.default_rng(0).standard_normal((2_000, 8))
    plan, reason = plan_fit(2_000, 8, k, RES, {"alpha": 1e-2}, probes=row_probes(X, k))
    assert plan.solver == "cholesky" and calls == [] and fit_plan.FLOOR_RHO_SOURCE in reason
    X = np.random.default_rng(0).standard_normal((8_000, 8))
    plan, reason = plan_fit(8_000, 8, k, RES, {"alpha": 1e-1}, probes=row_probes(X, k))
    assert calls == [(8_000, 8)] and "measured on a subsample" in reason


def test_in_memory_fits_measure_rho_only_when_cg_could_replace_the_dense_dual(monkeypatch):
    """With the dense dual in memory, CG replaces it only when predicted
    IN_MEMORY_CG_MARGIN times faster. When CG priced at its floor (ρ = 0, its fastest
    product variant) is not, the plan takes the dense dual without measuring ρ (about
    1 s at 4,000 rows, which made a 3,000-row default fit take 4x the dense one's time):
    the same plan as with the measurement, on a grid where both solvers win."""
    from pipeline.engine.placement import Probes
    from pipeline.plan import fit_plan

    res = Resources(memory_bytes=20 * GB, disk_bytes=1000 * GB, in_memory=True)
    measured: list[int] = []
    chosen = set()
    for n, gamma in ((3_000, 0.25), (24_000, 1.0)):
        X = np.random.default_rng(1).standard_normal((n, 8))
        k = make_kernel("rbf", gamma=gamma)
        real = row_probes(X, k)
        rho = {}

        def residual(rank, real=real, rho=rho):  # each rank measured once
            measured.append(rank)
            if rank not in rho:
                rho[rank] = real.residual(rank)
            return rho[rank]

        probes = Probes(True, residual, real.float32_risk)
        for lam in (1e-3, 1.0, 10.0):
            before = len(measured)
            plan, reason = plan_fit(n, 8, k, res, {"alpha": lam}, probes=probes)
            gated = len(measured) == before
            with monkeypatch.context() as m:  # the plan when ρ is always measured
                m.setattr(fit_plan, "_cg_may_beat_dense", lambda *a: (True, "", {}))
                always = plan_fit(n, 8, k, res, {"alpha": lam}, probes=probes)[0]
            assert (plan.solver, plan.matvec, plan.cg_precision) == (
                always.solver, always.matvec, always.cg_precision,
            )  # fmt: skip
            assert gated == (n == 3_000), (n, lam, reason)  # ρ = 0 at the floor: λ-blind
            chosen.add(plan.solver)
    assert chosen == {"dense", "cg"}


def test_out_of_core_fits_measure_rho_only_when_cg_could_save_more_than_the_measurement(
    monkeypatch,
):
    """Out of core, measuring ρ on a subsample costs about as much as a 3,000-row
    Cholesky (:meth:`CalibratedCostModel.probe_seconds`). It pays only when CG, priced at
    its floor (ρ = 0, its fastest product variant), beats the Cholesky by more than that
    price; else the plan takes the Cholesky without it. At 6,000 rows the measurement
    made CG win by less than it cost (kin40k: the default fit took 2.31 s, the Cholesky
    1.72 s); at 24,000 rows ρ is still measured, and decides."""
    from pipeline.engine.placement import Probes
    from pipeline.plan.calibrated import CalibratedCostModel

    res = Resources(memory_bytes=20 * GB, disk_bytes=1000 * GB, in_memory=False)
    k = make_kernel("rbf", gamma=0.1)
    for n, lam in ((3_000, 1e-3), (6_000, 0.1), (24_000, 1.0)):
        X = np.random.default_rng(0).standard_normal((n, 8))
        real, measured = row_probes(X, k), []

        def residual(rank, real=real, measured=measured):
            measured.append(rank)
            return real.residual(rank)

        probes = Probes(False, residual, None)
        plan, reason = plan_fit(n, 8, k, res, {"alpha": lam}, probes=probes)
        with monkeypatch.context() as m:  # a free measurement: made wherever ρ could matter
            m.setattr(CalibratedCostModel, "probe_seconds", lambda *a: 0.0)
            free, free_why = plan_fit(n, 8, k, res, {"alpha": lam}, probes=probes)
        if n == 24_000:
            assert measured == [C.ADAPTIVE_PROBE_RANK] * 2 and plan == free, reason
            assert plan.solver == "cg" and "measured on a subsample" in reason
            continue
        assert plan.solver == "cholesky" and "measured on a subsample" not in reason
        if n == 3_000:  # the Cholesky wins even against CG's floor: the same plan
            assert measured == [] and plan == free and reason == free_why
        else:  # measured, ρ makes CG win, by less than measuring it cost
            assert measured == [C.ADAPTIVE_PROBE_RANK] and free.solver == "cg"
            assert "less than measuring ρ would cost" in reason, reason


def test_the_plan_sizes_tiles_by_the_clients_worker_count():
    from pipeline.engine.placement import dask_block_size

    k = make_kernel("rbf")
    ch = {"solver": "cholesky", "alpha": 1e-2}
    many = Resources(memory_bytes=16 * GB, disk_bytes=10_000 * GB, in_memory=False, workers=64)
    plan, _ = plan_fit(200_000, 8, k, many, ch)
    assert plan.block_size == dask_block_size(200_000, 64) != C.DEFAULT_BLOCK_SIZE
    # no client (one worker): the default tile; a chosen block size always wins
    assert plan_fit(200_000, 8, k, RES, ch)[0].block_size == C.DEFAULT_BLOCK_SIZE
    assert plan_fit(200_000, 8, k, many, {**ch, "block_size": 3000})[0].block_size == 3000


def test_the_tile_is_sized_for_the_workers_only_where_the_tiles_run_on_them():
    """An in-place factor that computes its Gram from X runs here under
    ``factor_scheduler="auto"`` whatever the cluster (``engine.where.factor_executor``), so its
    tile is this process's default; ``"dask"`` sends it to the workers, also when they
    run on this machine, and sizes the tile for them."""
    from pipeline.engine.placement import dask_block_size

    k = make_kernel("rbf")
    n = 200_000
    X = np.zeros((n, 2))
    many = Resources(memory_bytes=16 * GB, disk_bytes=10_000 * GB, in_memory=False, workers=64)
    local = Resources(
        memory_bytes=16 * GB, disk_bytes=10_000 * GB, in_memory=False, workers=64, workers_here=True
    )
    sized = dask_block_size(n, 64)
    assert sized != C.DEFAULT_BLOCK_SIZE

    def block(res, X=None, **ch):
        ch = {"solver": "cholesky", "alpha": 1e-2, **ch}
        return plan_fit(n, 2, k, res, ch, probes=row_probes(X, k))[0].block_size

    in_place = {"keep_gram": False}
    assert block(many, X, **in_place) == C.DEFAULT_BLOCK_SIZE  # factored here, from X
    assert block(many, None, **in_place) == sized  # no X here: the Gram is stored, on them
    assert block(many, X) == sized  # kept Gram: the factor runs on the workers
    assert block(many, X, factor_scheduler="dask", **in_place) == sized
    assert block(many, X, factor_scheduler="threads") == C.DEFAULT_BLOCK_SIZE
    # workers on this machine: "auto" factors on threads here, "dask" on them
    assert block(local, X) == C.DEFAULT_BLOCK_SIZE
    assert block(local, X, factor_scheduler="dask") == sized
    # CG's tiles go to workers on other machines, as before
    ch = {"solver": "cg", "alpha": 1e-2, "keep_gram": False}
    cg = plan_fit(n, 2, k, many, ch, probes=row_probes(X, k))[0]
    assert cg.block_size == sized
