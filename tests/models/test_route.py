"""solver="auto" in memory: per kernel setting, preconditioned CG or band reductions."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn.kernel_ridge import KernelRidge as SkKernelRidge
from sklearn.model_selection import GridSearchCV, KFold

import pipeline.models.selection.route as route
from pipeline.kernels import RBF
from pipeline.linalg.band import band_available
from pipeline.models.selection import KernelRidgeCV
from pipeline.plan.cg_cost import chebyshev_bound

pytestmark = pytest.mark.skipif(not band_available(), reason="no dsytrd_sy2sb in SciPy's LAPACK")


def test_chebyshev_bound_of_the_cg_route():
    assert chebyshev_bound(1.0, 1e-10) == 1
    # (sqrt(100)+1)/(sqrt(100)-1) = 11/9: ceil(ln(2e10) / ln(11/9))
    assert chebyshev_bound(100.0, 1e-10) == math.ceil(math.log(2e10) / math.log(11 / 9))
    ks = [chebyshev_bound(k, 1e-8) for k in (1.5, 10, 1e3, 1e6)]
    assert ks == sorted(ks) and ks[-1] > 10 * ks[0]


def test_route_measures_the_residual_of_the_nystrom_factor():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((400, 3))
    smooth, rough = RBF(gamma=0.01)(X), RBF(gamma=5.0)(X)
    shifts = [[1e-4, 1e-2, 1.0]] * 4
    kw = dict(n_workers=2, tol=1e-10, rank=100)
    rs = route.route_setting(smooth, shifts, [300] * 4, **kw)
    rr = route.route_setting(rough, shifts, [300] * 4, **kw)
    # the residual norm is a real spectral norm of K - F F^T
    assert 0 <= rs.rho < 1e-3 < rr.rho <= 1.1 * np.linalg.eigvalsh(rough)[-1]
    assert rs.predicted_cg_iterations < rr.predicted_cg_iterations
    assert (rs.factor is not None) == (rs.solver == "cg")


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(1)
    X = rng.standard_normal((300, 3))
    y = np.sin(X[:, 0]) + X[:, 1] * X[:, 2] + 0.1 * rng.standard_normal(300)
    return X, y


@pytest.fixture(scope="module")
def sk(data):
    X, y = data
    grid = {"alpha": [1e-3, 1e-2, 0.1, 1.0, 10.0], "gamma": [0.01, 2.0]}
    return GridSearchCV(SkKernelRidge(kernel="rbf"), grid, cv=KFold(5)).fit(X, y)


@pytest.mark.parametrize("forced", ["cg", "band"])
def test_auto_routes_every_setting_and_matches_sklearn(data, sk, monkeypatch, forced):
    """Forcing the choice (through the margin) checks both routes end to end."""
    X, y = data
    monkeypatch.setattr(route, "CG_MARGIN", 1e12 if forced == "cg" else 0.0)
    m = KernelRidgeCV(
        [1e-3, 1e-2, 0.1, 1.0, 10.0], param_grid={"gamma": [0.01, 2.0]}, cv=KFold(5)
    ).fit(X, y)
    assert m.solver_ == "band"
    assert [r["solver"] for r in m.search_stats_["routes"]] == [forced, forced]
    st = m.search_stats_
    if forced == "cg":
        assert st["band_reductions"] == 0 and st["cg_iterations"] > 0
        assert st["preconditioner_builds"] == 2
    else:
        assert st["band_reductions"] == 2 * 5 and st["cg_iterations"] == 0
    assert st["kernel_matrices"] == 2  # the routed K is reused, not rebuilt
    tol = 1e-7 if forced == "cg" else 1e-9
    np.testing.assert_allclose(
        m.cv_results_["mean_test_score"], sk.cv_results_["mean_test_score"], atol=tol
    )
    assert m.best_params_ == {k: float(v) for k, v in sk.best_params_.items()}


def test_explicit_band_solver_does_not_route(data):
    X, y = data
    m = KernelRidgeCV([0.1, 1.0], param_grid={"gamma": [0.01]}, cv=3, solver="band").fit(X, y)
    assert "routes" not in m.search_stats_ and m.search_stats_["band_reductions"] == 3


def test_a_kernel_that_is_not_psd_is_never_routed_to_cg(monkeypatch):
    """CG would not fail on an indefinite K; the band Cholesky names the bad shift."""
    monkeypatch.setattr(route, "CG_MARGIN", 1e12)  # CG would win every routing
    rng = np.random.default_rng(6)
    X = rng.standard_normal((40, 2))
    with pytest.raises(ValueError, match="not positive definite"):
        KernelRidgeCV(np.logspace(-7, -6, 6), kernel="sigmoid", cv=2).fit(X, X[:, 0])
