"""The adaptive-rank Nyström preconditioner is selectable wherever a preconditioner is.

KernelRidgeCV's CG path accepts it too (one factor for every fold and λ).
"""

from __future__ import annotations

import numpy as np
import pytest

from pipeline import KernelRidge, KernelRidgeCV
from pipeline.kernels import RBF


@pytest.fixture(scope="module")
def hard_problem():
    rng = np.random.default_rng(3)
    n = 1500
    X = rng.normal(size=(n, 3))
    y = np.sin(2 * X[:, 0]) + X[:, 1] * X[:, 2] + 0.05 * rng.normal(size=n)
    lam = 1e-3
    K = RBF(gamma=0.5)(X)
    ref = np.linalg.solve(K + lam * np.eye(n), y)
    return X, y, lam, ref


def _fit(X, y, lam, pre, rank=None):
    return KernelRidge(
        alpha=lam,
        kernel="rbf",
        gamma=0.5,
        solver="cg",
        preconditioner=pre,
        rank=rank,
        tol=1e-8,
        max_iter=3000,
        matvec="recompute",
    ).fit(X, y)


def test_adaptive_preconditioner_through_the_estimator(hard_problem):
    X, y, lam, ref = hard_problem
    ada = _fit(X, y, lam, "adaptive")
    rel = np.linalg.norm(ada.dual_coef_ - ref) / np.linalg.norm(ref)
    assert rel < 1e-6
    assert ada.solver_ == "cg"
    nys = _fit(X, y, lam, "nystrom", rank=50)
    assert ada.n_iter_ < nys.n_iter_, (ada.n_iter_, nys.n_iter_)


def test_config_accepts_adaptive_and_names_the_choices():
    from pydantic import ValidationError

    from pipeline.stages.config import SolverConfig

    assert SolverConfig(preconditioner="adaptive").preconditioner == "adaptive"
    with pytest.raises(ValidationError) as exc:
        SolverConfig(preconditioner="adaptiv")
    msg = str(exc.value)
    for name in ("none", "jacobi", "nystrom", "adaptive"):
        assert name in msg


def test_estimator_rejects_a_bad_name_listing_adaptive():
    with pytest.raises(ValueError, match="adaptive"):
        KernelRidge(solver="cg", preconditioner="adaptiv").fit(np.ones((4, 1)), np.ones(4))


def test_cv_cg_with_the_adaptive_preconditioner_matches_nystrom():
    rng = np.random.default_rng(4)
    X = rng.normal(size=(400, 3))
    y = np.sin(X[:, 0]) + 0.05 * rng.normal(size=400)
    kw = dict(alphas=[1e-1, 1e-2, 1e-3], kernel="rbf", gamma=0.5, cv=3, solver="cg", tol=1e-10)
    ada = KernelRidgeCV(preconditioner="adaptive", **kw).fit(X, y)
    nys = KernelRidgeCV(preconditioner="nystrom", **kw).fit(X, y)
    assert ada.best_alpha_ == nys.best_alpha_
    assert ada.solver_ == "cg" and ada.search_stats_["preconditioner_builds"] >= 1
    np.testing.assert_allclose(
        ada.cv_results_["mean_test_score"], nys.cv_results_["mean_test_score"], rtol=1e-6
    )


def test_cv_cg_rejects_an_unknown_preconditioner_naming_adaptive():
    from pipeline.models.selection.cgpath import cg_fold_predictions

    with pytest.raises(ValueError, match="adaptive"):
        cg_fold_predictions(
            None, np.ones((4, 1)), [np.arange(2)], [np.arange(2, 4)], np.ones((1, 1)),
            preconditioner="bogus",
        )  # fmt: skip


def test_cv_config_accepts_adaptive():
    from pipeline.stages.config import CvConfig

    assert CvConfig(alphas=[0.1], preconditioner="adaptive").preconditioner == "adaptive"
