"""Issue #18, bad input refused before any work: a grid over budget, a γ grid for a
kernel without γ, more folds than rows; and the routing of large searches.

Cross-validation inputs found wrong by the session-26 review (each test fails on the
old code): scores of repeated training rows, splits taken for complements, LOO with
the dense solver, None in a grid, multi-metric scoring, group splitters, tol >= 1.
"""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.kernel_ridge import KernelRidge as SK
from sklearn.model_selection import GridSearchCV, GroupKFold

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


def _data(n=100):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n, 3))
    return X, X[:, 0] + 0.1 * rng.normal(size=n)


def test_repeated_training_rows_are_refused_by_cg_and_not_taken_for_complements():
    X, y = _data()
    rng = np.random.default_rng(1)
    boot = [(rng.integers(0, 100, 100), np.arange(90, 100)) for _ in range(2)]
    with pytest.raises(ValueError, match="repeat rows in a training set"):
        KernelRidgeCV(alphas=[0.1], cv=boot, solver="cg").fit(X, y)
    # each fold: the complement of its test rows minus row 99, plus a repeat of row 0
    splits = []
    for f in range(4):
        te = np.arange(20 * f, 20 * f + 20)
        tr = np.setdiff1d(np.arange(100), np.r_[te, 99])
        splits.append((np.r_[tr, tr[0]], te))
    ref = GridSearchCV(SK(kernel="rbf"), {"alpha": [0.1, 1.0]}, cv=splits).fit(X, y)
    for solver in ("eigen", "dense"):
        m = KernelRidgeCV(alphas=[0.1, 1.0], cv=splits, solver=solver).fit(X, y)
        np.testing.assert_allclose(m.cv_results_["mean_test_score"],
                                   ref.cv_results_["mean_test_score"], rtol=1e-9)  # fmt: skip


def test_loo_dense_multimetric_and_tol_are_refused_before_any_work():
    X, y = _data(40)
    with pytest.raises(ValueError, match="cv='loo' needs solver='eigen'"):
        KernelRidgeCV(alphas=[0.1], cv="loo", solver="dense").fit(X, y)
    for scoring in (["r2", "neg_mean_squared_error"], {"a": "r2"}):
        with pytest.raises(ValueError, match="multi-metric search is not supported"):
            KernelRidgeCV(alphas=[0.1], scoring=scoring).fit(X, y)
    with pytest.raises(ValueError, match=r"tol must be a float in \(0, 1\)"):
        KernelRidgeCV(alphas=[0.1], tol=2.0, solver="cg").fit(X, y)


def test_group_splitters_and_none_in_a_grid(tmp_path):
    X, y = _data(90)
    g = np.repeat(np.arange(9), 10)
    m = KernelRidgeCV(alphas=[0.1, 1.0], cv=GroupKFold(3)).fit(X, y, groups=g)
    ref = GridSearchCV(SK(kernel="rbf"), {"alpha": [0.1, 1.0]}, cv=GroupKFold(3))
    ref.fit(X, y, groups=g)
    np.testing.assert_allclose(m.cv_results_["mean_test_score"],
                               ref.cv_results_["mean_test_score"], rtol=1e-9)  # fmt: skip
    pytest.importorskip("matplotlib")
    from pipeline.models.selection.report import save_search_report

    m = KernelRidgeCV(alphas=[0.1, 1.0], param_grid={"gamma": [None, 0.5]}).fit(X, y)
    out = save_search_report(m, tmp_path)  # sorting None beside floats raised TypeError
    assert "cv_heatmap" in out


def test_auto_leave_one_out_on_a_few_rows_and_a_numpy_tol():
    # solver="auto" chose dense for leave-one-out on <= 10 rows, which is then refused;
    # np.float32(tol) was refused by KernelRidgeCV (session 26)
    from sklearn.model_selection import LeaveOneOut

    X, y = _data(8)
    m = KernelRidgeCV(alphas=[0.1], cv="loo").fit(X, y)
    ref = GridSearchCV(SK(kernel="rbf"), {"alpha": [0.1]}, cv=LeaveOneOut(),
                       scoring="neg_mean_squared_error").fit(X, y)  # fmt: skip
    assert m.solver_ != "dense"
    m2 = KernelRidgeCV(alphas=[0.1], cv="loo", scoring="neg_mean_squared_error").fit(X, y)
    np.testing.assert_allclose(m2.best_score_, ref.best_score_, rtol=1e-9)
    KernelRidgeCV(alphas=[0.1], tol=np.float32(1e-4)).fit(*_data(40))
