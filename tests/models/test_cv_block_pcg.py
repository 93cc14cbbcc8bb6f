"""Issue #18: the out-of-core CV search (block PCG over every fold and λ) never scores
an unconverged solve, agrees with the dense reference, and refuses bad input early."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline import KernelRidgeCV
from pipeline.kernels import RBF
from pipeline.models.selection.blockcg import FoldNystromBlock, block_pcg


def _data(n=240, d=3, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    y = np.sin(2 * X[:, 0]) + 0.5 * X[:, 1] ** 2 + 0.1 * rng.standard_normal(n)
    return X, y


# ------------------------------------------------------------ never score a diverged solve


def test_unconverged_cg_settings_are_redone_exactly_and_recorded():
    X, y = _data()
    alphas = [1e-12, 1e-2, 1.0]
    kw = dict(kernel="rbf", param_grid={"gamma": [0.5, 2.0]}, cv=4)
    # no preconditioner and 5 iterations: λ = 1e-12 cannot converge
    cg = KernelRidgeCV(
        alphas, solver="cg", preconditioner="none", max_iter=5, refit=False, **kw
    ).fit(X, y)
    dense = KernelRidgeCV(alphas, solver="dense", **kw).fit(X, y)
    st = cg.search_stats_
    assert st["redone_direct"] >= 2 * 4  # λ = 1e-12 of both settings, every fold
    bad = st["unconverged_settings"]
    assert {tuple(sorted(u["setting"].items())) for u in bad} == {
        (("gamma", 0.5),),
        (("gamma", 2.0),),
    }
    for u in bad:
        assert u["redone_by"] == "cholesky"
        assert {s["reason"] for s in u["solves"]} <= {"max_iter", "stagnation", "breakdown"}
        assert any(s["lambda_index"] == 0 for s in u["solves"])
    # the scores of the redone settings are the direct ones (to the direct solve's rounding)
    lam0 = [i for i, p in enumerate(cg.cv_results_["params"]) if p["alpha"] == 1e-12]
    np.testing.assert_allclose(
        cg.cv_results_["mean_test_score"][lam0],
        dense.cv_results_["mean_test_score"][lam0],
        rtol=1e-6,
    )
    assert cg.search_statistics_["redone_direct"] == st["redone_direct"]


def test_an_unconverged_solve_that_cannot_be_redone_fails_loudly(monkeypatch):
    import pipeline.linalg.dense_memory as memory
    from pipeline.models.selection.direct import UnconvergedSolveError

    X, y = _data(n=120)
    monkeypatch.setattr(memory, "available_memory", lambda: 10_000)
    with pytest.raises(UnconvergedSolveError, match="did not reach the CG tolerance"):
        KernelRidgeCV(
            [1e-12], kernel="rbf", gamma=1.0, cv=3, solver="cg", preconditioner="none",
            max_iter=3,
        ).fit(X, y)  # fmt: skip


def test_block_pcg_reports_nan_products_and_keeps_good_columns():
    rng = np.random.default_rng(1)
    n = 60
    X = rng.standard_normal((n, 2))
    K = RBF(gamma=0.5)(X)
    calls = {"n": 0}

    def kmul(V):
        calls["n"] += 1
        out = K @ V
        if calls["n"] == 3:
            out[:, 0] = np.nan  # column 0 breaks (a diverged product)
        return out

    masks = np.ones((1, n), dtype=bool)
    B = rng.standard_normal((n, 2))
    res = block_pcg(
        kmul, B, np.array([1e-2, 1e-2]), np.array([0, 0]), masks,
        FoldNystromBlock(None, [np.arange(n)]), tol=1e-10, max_iter=500,
    )  # fmt: skip
    assert res.reason[0] == "nonfinite" and res.reason[1] is None
    np.testing.assert_allclose((K + 1e-2 * np.eye(n)) @ res.x[:, 1], B[:, 1], atol=1e-7)


def test_routed_cg_path_records_and_redoes_unconverged_lambdas():
    from pipeline.models.selection.cgpath import cg_fold_predictions
    from pipeline.models.selection.direct import UnconvergedSolveError
    from pipeline.models.selection.route import DenseKernelOperator

    X, y = _data(n=120)
    K = RBF(gamma=1.0)(X)
    idx = np.arange(120)
    tests = np.array_split(idx, 3)
    trains = [np.setdiff1d(idx, t) for t in tests]
    shifts = np.array([[1.0] * 3, [1e-12] * 3])
    failures: list = []
    preds = cg_fold_predictions(
        DenseKernelOperator(K), y[:, None], trains, tests, shifts, preconditioner="none",
        max_iter=80, failures=failures,
    )  # fmt: skip
    assert [f["lambda_index"] for f in failures] == [1]
    assert all(p[1] is None for p in preds) and all(p[0] is not None for p in preds)
    with pytest.raises(UnconvergedSolveError, match="never scored"):
        cg_fold_predictions(
            DenseKernelOperator(K), y[:, None], trains, tests, shifts, preconditioner="none",
            max_iter=4,
        )  # fmt: skip


# ------------------------------------------------------------ agreement with the dense reference


@pytest.fixture(scope="module")
def dense_ref():
    X, y = _data(n=150, seed=3)
    kw = dict(kernel="rbf", param_grid={"gamma": [0.1, 0.5, 2.0]}, cv=5, refit=False)
    alphas = [1e-4, 1e-3, 1e-2, 1e-1, 1.0]
    return X, y, alphas, kw, KernelRidgeCV(alphas, solver="dense", **kw).fit(X, y)


@pytest.mark.parametrize("block_size", [150, 64, 37])  # one tile; ragged last tiles
@pytest.mark.parametrize("kernel_dtype", ["float32", "float64"])
def test_block_cg_scores_match_the_dense_reference_over_chunkings(
    dense_ref, block_size, kernel_dtype
):
    X, y, alphas, kw, ref = dense_ref
    # every system to tol (screening, on by default, leaves the other λ at 1e-3)
    m = KernelRidgeCV(
        alphas, solver="cg", preconditioner="adaptive", tol=1e-10, block_size=block_size,
        kernel_dtype=kernel_dtype, screen_tol=None, **kw,
    ).fit(X, y)  # fmt: skip
    for f in range(5):
        np.testing.assert_allclose(
            m.cv_results_[f"split{f}_test_score"], ref.cv_results_[f"split{f}_test_score"],
            rtol=1e-7, atol=1e-8,
        )  # fmt: skip
    assert m.best_params_ == ref.best_params_
    st = m.search_stats_
    assert st.get("redone_direct", 0) == 0
    assert st["cg_passes_float64"] >= 3  # the float64 residual checks
    assert (st["cg_passes_float32"] > 0) == (kernel_dtype == "float32")
    # the choice is verified by float64 solves to 1e-10
    assert abs(st["verified_score_difference"]) < 1e-8


def test_one_pass_serves_every_fold_and_lambda():
    """The block solve takes far fewer kernel passes than one CG per (λ, fold) would."""
    X, y = _data(n=200, seed=5)
    m = KernelRidgeCV(
        np.logspace(-3, 0, 6), kernel="rbf", gamma=0.5, cv=5, solver="cg", refit=False,
        preconditioner="adaptive", tol=1e-8,
    ).fit(X, y)  # fmt: skip
    st = m.search_stats_
    assert st["cg_solves"] == 6 * 5
    assert st["cg_passes_float32"] + st["cg_passes_float64"] < st["cg_solves"]


def test_screening_solves_only_the_best_lambdas_tightly(dense_ref):
    X, y, alphas, kw, ref = dense_ref
    m = KernelRidgeCV(
        alphas, solver="cg", preconditioner="adaptive", tol=1e-10, screen_tol=1e-3,
        screen_top=2, **kw,
    ).fit(X, y)  # fmt: skip
    st = m.search_stats_
    assert st["screened_lambdas"] == 3 * (len(alphas) - 2)
    assert all(len(s["refined_lambda_indices"]) == 2 for s in st["screen"])
    # each setting's screening passes are counted apart from the search's total
    screen32 = [s["passes_float32"] for s in st["screen"]]
    assert all(p >= 1 for p in screen32) and sum(screen32) < st["cg_passes_float32"]
    assert sum(s["passes_float64"] for s in st["screen"]) < st["cg_passes_float64"]
    assert m.best_params_ == ref.best_params_
    # the screened scores carry the loose solve's error (measured here: < 1e-3 in R²);
    # the refined ones, including the chosen setting, are exact to the tight tolerance
    err = np.abs(m.cv_results_["mean_test_score"] - ref.cv_results_["mean_test_score"])
    assert err.max() < 1e-3
    assert err[m.best_index_] < 1e-8
    assert abs(st["verified_score_difference"]) < 1e-8


def test_an_unconverged_refit_is_not_returned():
    from pipeline.models.selection.direct import UnconvergedSolveError

    X, y = _data(n=120)
    with pytest.raises(UnconvergedSolveError, match="the refit of"):
        KernelRidgeCV(
            [1e-6, 1e-3], kernel="rbf", gamma=2.0, cv=3, solver="cg", preconditioner="none",
            max_iter=5,
        ).fit(X, y)  # fmt: skip


# ------------------------------------------------ the defaults (issue #45, item 5)


def test_the_search_screens_with_the_adaptive_factor_by_default(dense_ref):
    """Defaults only: the adaptive factor (its rank chosen, at most the cap) and
    screening to 1e-3, then the best 3 λ of each setting to tol; the chosen setting is
    the dense reference's and its verified score is exact."""
    from pipeline.constants import CV_SCREEN_TOL
    from pipeline.plan.cv_routing import rank_cap

    X, y, alphas, kw, ref = dense_ref
    m = KernelRidgeCV(alphas, solver="cg", **kw)
    assert (m.preconditioner, m.screen_tol, m.rank) == ("adaptive", CV_SCREEN_TOL, None)
    m.fit(X, y)
    st = m.search_stats_
    assert st["screened_lambdas"] == 3 * (len(alphas) - 3)
    assert [s["screen_tol"] for s in st["screen"]] == [1e-3] * 3
    assert all(len(s["refined_lambda_indices"]) == 3 for s in st["screen"])
    assert st["preconditioner_builds"] == 3  # one per setting
    assert all(1 <= r <= rank_cap(len(y)) for r in st["preconditioner_ranks"])
    assert m.best_params_ == ref.best_params_
    assert abs(st["verified_score_difference"]) < 1e-8


def test_screen_tol_none_turns_screening_off_and_nystrom_stays_reachable(dense_ref):
    from pipeline.constants import CV_DEFAULT_RANK

    X, y, alphas, kw, ref = dense_ref
    r = min(len(y), CV_DEFAULT_RANK)  # the fixed rank, at most n (150 here)
    m = KernelRidgeCV(
        alphas, solver="cg", screen_tol=None, preconditioner="nystrom", tol=1e-10, **kw
    ).fit(X, y)
    st = m.search_stats_
    assert "screen" not in st and st.get("screened_lambdas", 0) == 0
    assert st["preconditioner_ranks"] == [r] * 3  # the fixed rank, for each setting
    np.testing.assert_allclose(
        m.cv_results_["mean_test_score"], ref.cv_results_["mean_test_score"], atol=1e-8
    )
    # screening applies to solver cg only: the exact solvers take the default and ignore it
    eig = KernelRidgeCV(alphas, solver="eigen", **kw).fit(X, y)
    assert eig.screen_tol == 1e-3 and "screen" not in eig.search_stats_
    np.testing.assert_array_equal(eig.best_index_, ref.best_index_)


def test_the_config_section_takes_the_defaults_and_null_turns_screening_off():
    """krr run's cv section: the same defaults; null reaches the search as None (the
    select stage hands the section's search knobs to search_from_config as they are)."""
    from pipeline.models.selection.report import CV_SECTION_KEYS, search_from_config
    from pipeline.stages.config import CvConfig

    for given, want in (({}, (1e-3, "adaptive")), ({"screen_tol": None}, (None, "adaptive"))):
        dump = CvConfig(alphas=[1.0], **given).stage_dump()
        section = {k: v for k, v in dump.items() if k in CV_SECTION_KEYS}
        options = {k: v for k, v in dump.items() if k not in CV_SECTION_KEYS}
        search = search_from_config(section, **options)
        assert (search.screen_tol, search.preconditioner) == want, given
