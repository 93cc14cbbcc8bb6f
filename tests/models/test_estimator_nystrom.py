"""``KernelRidge(solver="nystrom", n_centers=M, centers=...)``: Nyström KRR by FALKON
through the plan and :func:`pipeline.fit.execute`, fitted as the one model type (the
centres as ``X_fit_``), so predict, save and load are unchanged (issue #45 item 1)."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import pipeline
from pipeline import KernelRidge
from pipeline.kernels import make_kernel
from pipeline.plan.fit_plan import FitPlan, Resources, plan_fit

N, D, M = 400, 3, 60


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((N, D))
    Y = np.c_[np.sin(X[:, 0]), X[:, 1] * X[:, 2]]
    w = rng.uniform(0.5, 2.0, N)
    return X, Y, w


def _reference(X, Y, C, lam, w=None):
    k = make_kernel("rbf", gamma=0.5)
    Knm, Kmm = k(X, C), k(C, C)
    W = np.ones(len(X)) if w is None else w
    beta = np.linalg.solve(Knm.T @ (W[:, None] * Knm) + lam * Kmm, Knm.T @ (W[:, None] * Y))
    return beta


@pytest.mark.parametrize("convention", ["sklearn", "n_samples"])
def test_fit_predict_save_load(data, tmp_path, convention):
    X, Y, w = data
    est = KernelRidge(
        alpha=1e-3 if convention == "n_samples" else 0.2, kernel="rbf", gamma=0.5,
        solver="nystrom", n_centers=M, tol=1e-10, alpha_convention=convention,
    ).fit(X, Y, sample_weight=w)  # fmt: skip
    assert est.solver_ == "nystrom" and est.fit_info_["converged"]
    assert est.dual_coef_.shape == (M, 2) and est.X_fit_.shape == (M, D)
    np.testing.assert_array_equal(est.X_fit_, X[est.centers_])
    lam = 1e-3 * w.sum() if convention == "n_samples" else 0.2  # n = sum of the weights
    np.testing.assert_allclose(est.effective_alpha_, [lam, lam])
    beta = _reference(X, Y, est.X_fit_, lam, w)
    k = make_kernel("rbf", gamma=0.5)
    pred = est.predict(X)
    np.testing.assert_allclose(pred, k(X, est.X_fit_) @ beta, rtol=0, atol=1e-7)
    est.save(tmp_path / "m")
    back = pipeline.load(tmp_path / "m")
    assert back.solver_ == "nystrom" and back.get_params()["n_centers"] == M
    np.testing.assert_array_equal(back.predict(X), pred)


def test_centres_follow_centers_and_random_state(data):
    X, Y, _ = data
    kw = dict(alpha=0.1, kernel="rbf", solver="nystrom", n_centers=M)
    a = KernelRidge(**kw, random_state=1).fit(X, Y[:, 0])
    b = KernelRidge(**kw, random_state=1).fit(X, Y[:, 0])
    c = KernelRidge(**kw, random_state=2).fit(X, Y[:, 0])
    r = KernelRidge(**kw, random_state=1, centers="rpcholesky").fit(X, Y[:, 0])
    np.testing.assert_array_equal(a.dual_coef_, b.dual_coef_)  # bitwise
    assert not np.array_equal(a.centers_, c.centers_)
    assert not np.array_equal(a.centers_, r.centers_) and r.centers_.size == M
    assert a.dual_coef_.shape == (M,)


def test_as_many_centres_as_rows_is_the_exact_solver_with_a_log_line(data, caplog):
    from sklearn.kernel_ridge import KernelRidge as SkKR

    X, Y, _ = data
    with caplog.at_level(logging.INFO):
        est = KernelRidge(alpha=0.1, kernel="rbf", solver="nystrom", n_centers=N).fit(X, Y)
    assert est.solver_ == "dense" and est.X_fit_.shape == (N, D)
    assert "n_centers=400 >= n_samples=400 is no approximation" in caplog.text
    sk = SkKR(alpha=0.1, kernel="rbf").fit(X, Y)
    np.testing.assert_allclose(est.predict(X), sk.predict(X), atol=1e-10)


def test_the_exact_fallback_with_a_store_runs_out_of_core(data, tmp_path):
    X, Y, _ = data
    est = KernelRidge(
        alpha=0.1, kernel="rbf", solver="nystrom", n_centers=N, store=str(tmp_path / "s")
    ).fit(X[:100], Y[:100])
    assert est.solver_ in ("cholesky", "cg") and est.X_fit_.shape == (100, D)


@pytest.mark.parametrize("bad", [0, -5, 2.5, "100", True])
def test_bad_n_centers_refused_before_any_work(data, bad):
    X, Y, _ = data
    with pytest.raises(ValueError, match="n_centers") as err:
        KernelRidge(alpha=0.1, kernel="rbf", solver="nystrom", n_centers=bad).fit(X, Y)
    assert repr(bad) in str(err.value)


def test_refusals(data):
    X, Y, _ = data
    with pytest.raises(ValueError, match="centers='kmeans' is not valid"):
        KernelRidge(kernel="rbf", solver="nystrom", centers="kmeans").fit(X, Y)
    with pytest.raises(ValueError, match="solver='nystrom' needs alpha > 0"):
        KernelRidge(alpha=0.0, kernel="rbf", solver="nystrom", n_centers=M).fit(X, Y)
    with pytest.raises(ValueError, match="solver='nystrom' takes one alpha"):
        KernelRidge(alpha=[0.1, 0.2], kernel="rbf", solver="nystrom", n_centers=M).fit(X, Y)
    with pytest.raises(ValueError, match="solver='nystrom' needs a named kernel"):
        KernelRidge(kernel="precomputed", solver="nystrom", n_centers=M).fit(X @ X.T, Y)


def test_auto_never_chooses_nystrom_and_the_plan_records_its_knobs():
    k = make_kernel("rbf")
    for n in (1_000, 200_000):
        for in_memory in (True, False):
            res = Resources(memory_bytes=8e9, disk_bytes=1e13, in_memory=in_memory)
            plan, _ = plan_fit(n, 8, k, res, {"solver": "auto", "alpha": 0.1})
            assert plan.solver != "nystrom"
            assert "n_centers" not in plan.to_dict()  # other plans' records keep their keys
    res = Resources(memory_bytes=8e9, disk_bytes=1e13)
    plan, why = plan_fit(
        5000, 8, k, res, {"solver": "nystrom", "alpha": 0.1, "n_centers": 300,
                          "centers": "rpcholesky"},
    )  # fmt: skip
    assert plan.solver == "nystrom" and "Nyström approximation" in why
    rec = plan.to_dict()
    assert rec["n_centers"] == 300 and rec["centers"] == "rpcholesky"
    assert FitPlan.from_dict(rec).to_dict() == rec


def test_a_store_holds_the_checkpoint_and_a_rerun_resumes(data, tmp_path, caplog, monkeypatch):
    # the cost model's choice here is the direct method (one pass, then the M x M factor):
    # a fit killed in its pass resumes from the pass's last checkpoint (every 10 blocks
    # by default), to the bits of a fit without a store; a rerun is then a pure resume
    from pipeline.linalg import nystrom_solve as ns

    X, Y, _ = data
    kw = dict(alpha=0.05, kernel="rbf", solver="nystrom", n_centers=M, block_size=32)
    whole = KernelRidge(**kw).fit(X, Y)
    assert whole.fit_info_["method"] == "direct" and whole.fit_info_["n_blocks"] == 13
    real, seen = ns.NystromNormalOperator._block, {"n": 0}

    def block(self, xb):
        seen["n"] += 1
        if seen["n"] == 12:  # killed in block 11: the last state is at block 10
            raise KeyboardInterrupt
        return real(self, xb)

    monkeypatch.setattr(ns.NystromNormalOperator, "_block", block)
    with pytest.raises(KeyboardInterrupt):
        KernelRidge(**kw, store=str(tmp_path / "s")).fit(X, Y)
    monkeypatch.setattr(ns.NystromNormalOperator, "_block", real)
    with caplog.at_level(logging.INFO):
        a = KernelRidge(**kw, store=str(tmp_path / "s")).fit(X, Y)
    assert a.fit_info_["store"].startswith(str(tmp_path / "s"))
    assert "resuming the Nyström pass from block 10 of 13" in caplog.text
    assert a.fit_info_["resumed"] and a.fit_info_["start_block"] == 10
    np.testing.assert_array_equal(a.dual_coef_, whole.dual_coef_)
    b = KernelRidge(**kw, store=str(tmp_path / "s")).fit(X, Y)  # the same fit: solved already
    assert b.fit_info_["resumed"] and b.fit_info_["start_block"] == 13
    np.testing.assert_array_equal(b.dual_coef_, whole.dual_coef_)


def test_a_store_holds_the_pcg_checkpoint_and_a_rerun_resumes(data, tmp_path, caplog, monkeypatch):
    # the PCG (the cost model's choice where the kernel blocks' SYRK costs more than CG's
    # passes), forced here: its CG checkpoints resume
    import pipeline.fit

    monkeypatch.setattr(pipeline.fit, "nystrom_method", lambda *a, **k: ("pcg", "forced"))
    X, Y, _ = data
    kw = dict(alpha=0.05, kernel="rbf", solver="nystrom", n_centers=M, tol=1e-10,
              store=str(tmp_path / "s"))  # fmt: skip
    a = KernelRidge(**kw).fit(X, Y)
    assert a.fit_info_["store"].startswith(str(tmp_path / "s"))
    assert a.fit_info_["method"] == "pcg" and not a.fit_info_["resumed"]
    with caplog.at_level(logging.INFO):
        b = KernelRidge(**kw).fit(X, Y)  # the same fit: resumes at its last checkpoint
    assert "resuming CG 'nystrom'" in caplog.text and b.fit_info_["start_iter"] > 0
    assert b.fit_info_["resumed"]
    np.testing.assert_array_equal(a.dual_coef_, b.dual_coef_)


def test_scikit_learns_grid_search_tunes_n_centers(data):
    # (KernelRidgeCV has no Nyström search yet: scikit-learn's GridSearchCV clones it)
    from sklearn.model_selection import GridSearchCV

    X, Y, _ = data
    grid = {"alpha": [0.01, 0.1], "n_centers": [20, 60]}
    gs = GridSearchCV(KernelRidge(kernel="rbf", solver="nystrom"), grid, cv=3).fit(X, Y[:, 0])
    best = gs.best_estimator_
    assert best.solver_ == "nystrom"
    assert best.X_fit_.shape == (gs.best_params_["n_centers"], D)


def test_a_stagnating_pcg_is_solved_by_the_direct_pass(monkeypatch, caplog):
    """Uniform centres on rows that repeat (X rounded to 0.1) make K_MM nearly singular:
    FALKON's PCG stagnates (it raised ``CGStagnationError``, where scikit-learn's
    ``Nystroem`` + ``Ridge`` fits). The fit solves the same system by the direct pass
    instead, says so, and equals a direct fit to the bit."""
    import pipeline.fit

    rng = np.random.default_rng(0)
    X = np.round(rng.normal(size=(2000, 2)), 1)
    y = np.sin(X[:, 0]) + 0.1 * rng.standard_normal(2000)
    kw = dict(alpha=1e-5, kernel="rbf", gamma=0.05, solver="nystrom", n_centers=300)
    monkeypatch.setattr(pipeline.fit, "nystrom_method", lambda *a, **k: ("direct", "forced"))
    direct = KernelRidge(**kw).fit(X, y)
    monkeypatch.setattr(pipeline.fit, "nystrom_method", lambda *a, **k: ("pcg", "forced"))
    with caplog.at_level(logging.WARNING):
        m = KernelRidge(**kw).fit(X, y)
    assert "FALKON's PCG stagnated" in caplog.text
    assert m.fit_info_["method"] == "direct" and m.fit_info_["fallback_from"] == "pcg"
    assert m.fit_info_["centers"] == "uniform"
    np.testing.assert_array_equal(m.dual_coef_, direct.dual_coef_)
    assert np.sqrt(np.mean((m.predict(X) - y) ** 2)) < 0.15


def test_a_stagnating_pcgs_direct_pass_takes_its_centres_rather_than_choosing_again(
    monkeypatch,
):
    """The direct pass after a stagnated PCG solves on the PCG's centres: RPCholesky's
    pivots (a pass over X) are chosen once, and the fit equals a direct fit to the bit."""
    import pipeline.fit
    import pipeline.linalg.nystrom_solve as ns

    rng = np.random.default_rng(0)
    X = np.round(rng.normal(size=(2000, 2)), 1)
    y = np.sin(X[:, 0]) + 0.1 * rng.standard_normal(2000)
    kw = dict(alpha=1e-5, kernel="rbf", gamma=0.05, solver="nystrom", n_centers=300,
              centers="rpcholesky")  # fmt: skip
    monkeypatch.setattr(pipeline.fit, "nystrom_method", lambda *a, **k: ("direct", "forced"))
    direct = KernelRidge(**kw).fit(X, y)
    chosen = []
    real = ns.nystrom_centres
    monkeypatch.setattr(ns, "nystrom_centres", lambda *a, **k: chosen.append(1) or real(*a, **k))
    monkeypatch.setattr(pipeline.fit, "nystrom_method", lambda *a, **k: ("pcg", "forced"))
    m = KernelRidge(**kw).fit(X, y)
    assert m.fit_info_.get("fallback_from") == "pcg", "the PCG did not stagnate here"
    assert len(chosen) == 1 and m.fit_info_["centers"] == "rpcholesky"
    np.testing.assert_array_equal(m.dual_coef_, direct.dual_coef_)
