"""pipeline.KernelRidge inside scikit-learn's and dask-ml's GridSearchCV.

dask-ml 2025.1.0 with dask 2026.8 (docs/PERFORMANCE.md): its r2 scorer and its KFold are
broken, so the dask-ml search uses ``neg_mean_squared_error`` and scikit-learn's
``KFold``.
"""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.kernel_ridge import KernelRidge as SkKernelRidge
from sklearn.model_selection import GridSearchCV, KFold

from pipeline import KernelRidge, KernelRidgeCV

GRID = {"alpha": [1e-3, 1e-2, 1e-1, 1.0], "gamma": [0.1, 0.5, 2.0]}


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(7)
    X = rng.standard_normal((100, 3))
    y = np.cos(X[:, 0]) + X[:, 1] * X[:, 2] + 0.1 * rng.standard_normal(100)
    return X, y


def test_sklearn_gridsearch_around_pipeline_kernel_ridge(data):
    X, y = data
    ours = GridSearchCV(KernelRidge(kernel="rbf"), GRID, cv=5).fit(X, y)
    ref = GridSearchCV(SkKernelRidge(kernel="rbf"), GRID, cv=5).fit(X, y)
    np.testing.assert_allclose(
        ours.cv_results_["mean_test_score"], ref.cv_results_["mean_test_score"], atol=1e-9
    )
    assert ours.best_params_ == ref.best_params_
    assert isinstance(ours.best_estimator_, KernelRidge)
    cv = KernelRidgeCV(GRID["alpha"], param_grid={"gamma": GRID["gamma"]}, cv=5).fit(X, y)
    assert cv.best_params_ == ours.best_params_
    np.testing.assert_allclose(
        cv.cv_results_["mean_test_score"], ours.cv_results_["mean_test_score"], atol=1e-9
    )


def test_dask_ml_gridsearch_around_pipeline_kernel_ridge(data):
    dcv = pytest.importorskip("dask_ml.model_selection")
    X, y = data
    folds = KFold(n_splits=4, shuffle=True, random_state=0)
    ours = dcv.GridSearchCV(
        KernelRidge(kernel="rbf"), GRID, cv=folds, scoring="neg_mean_squared_error"
    ).fit(X, y)
    ref = GridSearchCV(
        SkKernelRidge(kernel="rbf"), GRID, cv=folds, scoring="neg_mean_squared_error"
    ).fit(X, y)
    np.testing.assert_allclose(
        ours.cv_results_["mean_test_score"], ref.cv_results_["mean_test_score"], rtol=1e-8
    )
    assert ours.best_params_ == ref.best_params_
    assert isinstance(ours.best_estimator_, KernelRidge)
    cv = KernelRidgeCV(
        GRID["alpha"],
        param_grid={"gamma": GRID["gamma"]},
        cv=folds,
        scoring="neg_mean_squared_error",
    ).fit(X, y)
    assert cv.best_params_ == ours.best_params_
