"""KernelRidgeCV's CG path accepts the adaptive preconditioner (one factor for every fold and λ)."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline import KernelRidgeCV


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
