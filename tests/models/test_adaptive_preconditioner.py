"""The adaptive-rank Nyström preconditioner is selectable wherever a preconditioner is."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline import KernelRidge
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
