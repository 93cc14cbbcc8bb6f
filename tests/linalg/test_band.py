"""Band reduction for many shifts, and the band CV solver built on it."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import linalg
from sklearn.kernel_ridge import KernelRidge as SkKernelRidge
from sklearn.model_selection import GridSearchCV, KFold, ShuffleSplit

from pipeline.kernels import RBF, Laplacian
from pipeline.linalg.band import band_available, band_reduce
from pipeline.models.selection import KernelRidgeCV
from pipeline.models.selection.band import band_fold_predictions, take_block

pytestmark = pytest.mark.skipif(not band_available(), reason="no dsytrd_sy2sb in SciPy's LAPACK")


@pytest.mark.parametrize(
    "m,kd", [(1, None), (2, None), (3, 1), (50, 192), (301, 16), (777, None), (1000, 96)]
)
def test_band_solve_matches_scipy_for_every_shift(m, kd):
    """Ragged sizes (m not a multiple of kd), kd >= m, one and two targets."""
    rng = np.random.default_rng(m)
    X = rng.standard_normal((m, 4))
    K = RBF(gamma=0.3)(X)
    Y = rng.standard_normal((m, 2))
    shifts = [1e-4, 1e-2, 1.0, 30.0]
    red = band_reduce(K, kd)
    assert red.kd == min(kd or 192, max(1, m - 1))
    out = red.solve(Y, shifts)
    assert out.shape == (4, m, 2)
    for i, s in enumerate(shifts):
        ref = linalg.solve(K + s * np.eye(m), Y, assume_a="pos")
        # relative to the solution, the accuracy of a Cholesky solve (cond up to ~1e7)
        np.testing.assert_allclose(out[i], ref, atol=1e-9 * np.abs(ref).max())
    one = red.solve(Y[:, 0], shifts[:1])
    # one column against two: BLAS takes other kernels (GEMV, GEMM), so the last bits
    # differ (1.5e-12 of the largest entry at cond 1e7 on AMD EPYC's OpenBLAS)
    scale = np.abs(out[0, :, 0]).max()
    np.testing.assert_allclose(one[0, :, 0], out[0, :, 0], rtol=0, atol=1e-11 * scale)


def test_band_reduction_is_an_orthogonal_similarity():
    rng = np.random.default_rng(1)
    K = Laplacian(gamma=0.5)(rng.standard_normal((120, 3)))
    red = band_reduce(K, 8)
    B = np.zeros((120, 120))
    for d in range(9):
        i = np.arange(120 - d)
        B[i + d, i] = B[i, i + d] = red.band[d, : 120 - d]
    Q = red._apply(np.eye(120, order="F"), b"N")
    np.testing.assert_allclose(Q.T @ Q, np.eye(120), atol=1e-13)
    np.testing.assert_allclose(Q @ B @ Q.T, K, atol=1e-13)
    assert red.band.shape == (9, 120)


def test_not_positive_definite_shift_is_named():
    K = -np.eye(5)
    with pytest.raises(ValueError, match=r"K \+ 0.5 I is not positive definite"):
        band_reduce(K).solve(np.ones(5), [2.0, 0.5])


def test_overwrite_reduces_in_place_and_default_keeps_the_input():
    rng = np.random.default_rng(2)
    K = RBF(gamma=0.2)(rng.standard_normal((40, 2)))
    K0 = K.copy()
    band_reduce(K, 4)
    np.testing.assert_array_equal(K, K0)
    red = band_reduce(K, 4, overwrite=True)
    assert np.shares_memory(red.A, K) and not np.array_equal(K, K0)


@pytest.mark.parametrize("kind", ["runs", "random", "empty"])
def test_take_block(kind):
    rng = np.random.default_rng(3)
    K = rng.standard_normal((60, 60))
    idx = {
        "runs": np.r_[0:10, 25:60],
        "random": np.sort(rng.choice(60, 37, replace=False)),
        "empty": np.array([], dtype=int),
    }[kind]
    np.testing.assert_array_equal(take_block(K, idx), K[np.ix_(idx, idx)])
    other = np.r_[10:25]
    np.testing.assert_array_equal(take_block(K, other, idx), K[np.ix_(other, idx)])


def test_fold_predictions_match_the_training_solve():
    rng = np.random.default_rng(4)
    X = rng.standard_normal((200, 3))
    y = np.c_[np.sin(X[:, 0]), X[:, 1]]
    K = RBF(gamma=0.4)(X)
    tr, te = np.r_[0:60, 100:200], np.r_[60:100]
    preds = band_fold_predictions(K, y, tr, te, [1e-3, 0.1], kd=32)
    for p, s in zip(preds, [1e-3, 0.1]):
        ref = K[np.ix_(te, tr)] @ linalg.solve(K[np.ix_(tr, tr)] + s * np.eye(160), y[tr])
        np.testing.assert_allclose(p, ref, atol=1e-9)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(5)
    X = rng.standard_normal((257, 4))  # ragged folds
    y = np.sin(X[:, 0]) + X[:, 1] * X[:, 2] + 0.1 * rng.standard_normal(257)
    return X, y


@pytest.mark.parametrize(
    "cv", [KFold(5), KFold(4, shuffle=True, random_state=1), ShuffleSplit(3, random_state=0)]
)
def test_band_search_matches_sklearn_gridsearch(data, cv):
    """Complement folds, shuffled folds, and splits whose training set is not the
    complement of the test set."""
    X, y = data
    alphas, gammas = [1e-4, 1e-2, 1.0, 10.0], [0.05, 0.5]
    sk = GridSearchCV(SkKernelRidge(kernel="rbf"), {"alpha": alphas, "gamma": gammas}, cv=cv).fit(
        X, y
    )
    m = KernelRidgeCV(alphas, param_grid={"gamma": gammas}, cv=cv, solver="band").fit(X, y)
    np.testing.assert_allclose(
        m.cv_results_["mean_test_score"], sk.cv_results_["mean_test_score"], atol=1e-9
    )
    assert m.best_params_ == {k: float(v) for k, v in sk.best_params_.items()}
    n_splits = cv.get_n_splits(X)
    assert m.search_stats_["band_reductions"] == 2 * n_splits
    assert m.search_stats_["fold_fits_equivalent"] == 2 * n_splits * 4


def test_band_threads_give_the_same_result(data):
    X, y = data
    kw = dict(alphas=[1e-3, 0.1], param_grid={"gamma": [0.1, 1.0]}, cv=3, solver="band")
    one = KernelRidgeCV(n_jobs=1, **kw).fit(X, y)
    three = KernelRidgeCV(n_jobs=3, **kw).fit(X, y)
    assert one.search_stats_["band_workers"] == 1 and three.search_stats_["band_workers"] == 3
    # the same work; only the BLAS thread count (rounding order) differs
    np.testing.assert_allclose(
        one.cv_results_["mean_test_score"], three.cv_results_["mean_test_score"], rtol=1e-12
    )
    assert one.best_params_ == three.best_params_


def test_auto_picks_band_for_many_alphas_and_dense_for_one(data):
    X, y = data
    many = KernelRidgeCV(np.logspace(-3, 1, 8), cv=5).fit(X, y)
    assert many.solver_ == "band"
    one = KernelRidgeCV([0.1], cv=5).fit(X, y)
    assert one.solver_ == "dense"
    loo = KernelRidgeCV([0.1, 1.0], cv="loo").fit(X[:60], y[:60])
    assert loo.solver_ == "eigen"


def test_band_not_positive_definite_kernel_names_the_shift():
    rng = np.random.default_rng(6)
    X = rng.standard_normal((40, 2))
    y = X[:, 0]
    with pytest.raises(ValueError, match="not positive definite"):
        KernelRidgeCV([1e-6], kernel="sigmoid", cv=2, solver="band").fit(X, y)
