"""Cross-validation inputs found wrong by the session-26 review (each test fails on the
old code): scores of repeated training rows, splits taken for complements, LOO with
the dense solver, None in a grid, multi-metric scoring, group splitters, tol >= 1."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.kernel_ridge import KernelRidge as SK
from sklearn.model_selection import GridSearchCV, GroupKFold

from pipeline import KernelRidgeCV


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
