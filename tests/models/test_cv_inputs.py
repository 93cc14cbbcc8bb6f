"""Issue #18, bad input refused before any work: a grid over budget, a γ grid for a
kernel without γ, more folds than rows; and the routing of large searches."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline import KernelRidgeCV
from pipeline.plan.cv_routing import choose_cv_solver, predicted_search_seconds


def _xy(n=60):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((n, 3))
    return X, X[:, 0] + 0.1 * rng.standard_normal(n)


def _no_work(monkeypatch):
    """Any kernel evaluation fails the test: the refusals come first."""
    import pipeline.models.selection.strategies as strategies

    def boom(*a, **k):
        raise AssertionError("work started before the input was checked")

    for name in ("BandStrategy", "InMemoryStrategy", "CGPathStrategy", "CholeskyStrategy"):
        monkeypatch.setattr(getattr(strategies, name), "__init__", boom)


def test_a_grid_over_the_time_budget_is_refused_with_prediction_and_smaller_grid(monkeypatch):
    X, y = _xy()
    _no_work(monkeypatch)
    import pipeline.models.selection.search as search

    # 35,000 rows, 10 lambdas x 3 gammas: predicted far above 60 s
    big = 35_000
    idx = np.arange(big)
    splits = [(np.setdiff1d(idx, te), te) for te in np.array_split(idx, 5)]
    pred = predicted_search_seconds("cg", big, 10, 3, splits)
    assert pred > 60
    monkeypatch.setattr(search, "make_splits", lambda *a, **k: (splits, "complement"))
    monkeypatch.setattr(
        search, "validate_X_y", lambda est, X, y: (np.zeros((big, 3)), np.zeros(big))
    )
    m = KernelRidgeCV(
        np.logspace(-3, 0, 10), param_grid={"gamma": [0.01, 0.1, 1.0]}, solver="cg",
        max_search_seconds=60,
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"predicted to take [\d,]+ s.*max_search_seconds=60") as e:
        m.fit(X, y)
    assert "e.g." in str(e.value) and ("lambda" in str(e.value) or "rows" in str(e.value))
    # a budget that fits runs normally (small data, real work)
    monkeypatch.undo()
    ok = KernelRidgeCV([0.1, 1.0], cv=3, solver="eigen", max_search_seconds=3600).fit(X, y)
    assert ok.search_stats_["predicted_search_seconds"] < 3600


@pytest.mark.parametrize("bad", [0, -5, "soon"])
def test_max_search_seconds_must_be_positive(bad):
    X, y = _xy()
    with pytest.raises(ValueError, match="max_search_seconds"):
        KernelRidgeCV([1.0], cv=3, max_search_seconds=bad).fit(X, y)


def test_a_gamma_grid_for_the_linear_kernel_names_kernel_and_parameter(monkeypatch):
    X, y = _xy()
    _no_work(monkeypatch)
    with pytest.raises(ValueError, match=r"'gamma'.*Linear\(\).*no parameter 'gamma'"):
        KernelRidgeCV([1.0], kernel="linear", param_grid={"gamma": [0.1, 1.0]}).fit(X, y)


def test_more_folds_than_rows_is_refused(monkeypatch):
    X, y = _xy(n=8)
    _no_work(monkeypatch)
    with pytest.raises(ValueError, match=r"cv=10 folds is more than the 8 rows"):
        KernelRidgeCV([1.0], cv=10).fit(X, y)
    from sklearn.model_selection import KFold

    with pytest.raises(ValueError, match=r"asks for 9 folds but there are only 8 rows"):
        KernelRidgeCV([1.0], cv=KFold(9)).fit(X, y)


def test_cv_config_takes_the_budget():
    from pipeline.stages.config import ConfigError, load_config

    base = {"data": {"source": "sklearn", "name": "diabetes"}}
    c = load_config({**base, "cv": {"alphas": [1.0], "max_search_seconds": 600}})
    assert c.cv.max_search_seconds == 600
    with pytest.raises(ConfigError, match="max_search_seconds"):
        load_config({**base, "cv": {"alphas": [1.0], "max_search_seconds": -1}})


def test_large_searches_route_to_the_block_cg_even_with_a_store():
    n = 35_000
    idx = np.arange(n)
    splits = [(np.setdiff1d(idx, te), te) for te in np.array_split(idx, 5)]
    kw = dict(fits=lambda b: False, band_ok=True, has_store=True)
    # 10 lambdas: one factorisation each (cholesky) costs far more than the block CG
    assert choose_cv_solver(n, "complement", 10, splits, **kw) == "cg"
    assert predicted_search_seconds("cg", n, 10, 1, splits) < predicted_search_seconds(
        "cholesky", n, 10, 1, splits
    )
    # LOO needs the factor
    assert choose_cv_solver(n, "loo", 10, splits, **kw) == "cholesky"
