"""Sample weights on every solver of ``pipeline.KernelRidge`` (issue #20, item 6).

scikit-learn's KernelRidge solves ``(W^1/2 K W^1/2 + alpha I) beta = W^1/2 y`` and
returns ``dual_coef_ = W^1/2 beta``. The out-of-core solvers (Cholesky with the Gram
kept or factored in place, a float32 factor, CG with a stored or recomputed
operator, ``solver="auto"`` past memory) must give the same coefficients, for
several tile sizes including ragged last tiles; bad weights are refused before any
work with a message that names the value and the fix.
"""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.kernel_ridge import KernelRidge as SkKernelRidge

from pipeline import KernelRidge
from pipeline.plan.fit_plan import Resources, plan_fit

N = 203  # ragged last tile for every block size below but 203


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(11)
    X = rng.normal(size=(N, 3))
    y = np.c_[np.sin(X[:, 0]) + 0.1 * rng.normal(size=N), X[:, 1] * X[:, 2]]
    w = rng.uniform(0.2, 3.0, size=N)
    w[[0, 7, 100, N - 1]] = 0.0  # zero weights: those rows drop out, as in scikit-learn
    return X, y, w


def _ref(X, y, w, **kw):
    return SkKernelRidge(alpha=0.3, kernel="rbf", gamma=0.4, **kw).fit(X, y, sample_weight=w)


CASES = [
    ("cholesky", dict(block_size=64)),  # 64, 64, 64, 11
    ("cholesky", dict(block_size=50, keep_gram=False)),  # in place, last tile 3 rows
    ("cholesky", dict(block_size=203)),  # one tile
    ("cholesky", dict(block_size=37, factor_dtype="float32")),  # refined to float64
    ("cg", dict(block_size=64, tol=1e-12)),  # matrix-free, Nystrom
    ("cg", dict(block_size=70, tol=1e-12, matvec="stored")),
    ("cg", dict(block_size=50, tol=1e-12, preconditioner="jacobi")),
]


@pytest.mark.parametrize("solver, kw", CASES, ids=[f"{s}-{k}" for s, k in CASES])
def test_out_of_core_weights_match_scikit_learn(data, tmp_path, solver, kw):
    X, y, w = data
    ref = _ref(X, y, w)
    est = KernelRidge(
        alpha=0.3, kernel="rbf", gamma=0.4, solver=solver, store=tmp_path / "s", **kw
    ).fit(X, y, sample_weight=w)
    assert est.solver_ == solver
    tol = 1e-10 if solver == "cholesky" else 1e-9
    np.testing.assert_allclose(est.dual_coef_, ref.dual_coef_, rtol=tol, atol=tol)
    np.testing.assert_allclose(est.predict(X), ref.predict(X), rtol=1e-9, atol=1e-9)
    assert np.all(est.dual_coef_[w == 0] == 0)
    # the weighted fit is its own: unweighted data in the same store is another subdirectory
    plain = KernelRidge(
        alpha=0.3, kernel="rbf", gamma=0.4, solver=solver, store=tmp_path / "s", **kw
    ).fit(X, y[:, 0])
    assert plain.fit_info_["store"] != est.fit_info_["store"]
    np.testing.assert_allclose(
        plain.dual_coef_,
        SkKernelRidge(alpha=0.3, kernel="rbf", gamma=0.4).fit(X, y[:, 0]).dual_coef_,
        rtol=1e-8,
        atol=1e-9,
    )


def test_temporary_store_scalar_weight_and_one_target(data):
    X, y, _ = data
    est = KernelRidge(alpha=0.3, kernel="rbf", gamma=0.4, solver="cholesky", block_size=64)
    est.fit(X, y[:, 0], sample_weight=2.5)
    ref = _ref(X, y[:, 0], 2.5)
    np.testing.assert_allclose(est.dual_coef_, ref.dual_coef_, rtol=1e-10, atol=1e-12)


def test_integer_weights_equal_repeated_rows_out_of_core(data):
    X, y, _ = data
    reps = np.random.default_rng(3).integers(0, 4, size=N)
    kw = dict(alpha=0.3, kernel="rbf", gamma=0.4, solver="cholesky", block_size=48)
    weighted = KernelRidge(**kw).fit(X, y, sample_weight=reps)
    repeated = KernelRidge(**kw).fit(np.repeat(X, reps, axis=0), np.repeat(y, reps, axis=0))
    np.testing.assert_allclose(weighted.predict(X), repeated.predict(X), rtol=1e-8, atol=1e-9)


def test_n_samples_convention_uses_the_weight_sum(data):
    X, y, w = data
    kw = dict(alpha=1e-3, kernel="rbf", gamma=0.4, alpha_convention="n_samples")
    dense = KernelRidge(solver="dense", **kw).fit(X, y, sample_weight=w)
    chol = KernelRidge(solver="cholesky", block_size=64, **kw).fit(X, y, sample_weight=w)
    np.testing.assert_allclose(chol.dual_coef_, dense.dual_coef_, rtol=1e-10, atol=1e-12)
    assert chol.effective_alpha_[0] == pytest.approx(1e-3 * w.sum(), rel=1e-12)
    assert dense.effective_alpha_[0] == pytest.approx(1e-3 * w.sum(), rel=1e-12)


def test_auto_with_a_store_goes_out_of_core_with_weights(data, tmp_path):
    X, y, w = data
    est = KernelRidge(
        alpha=0.3, kernel="rbf", gamma=0.4, solver="auto", block_size=64, store=tmp_path / "s"
    ).fit(X, y, sample_weight=w)
    assert est.solver_ in ("cholesky", "cg")
    np.testing.assert_allclose(est.predict(X), _ref(X, y, w).predict(X), rtol=1e-7, atol=1e-7)


def test_plan_sends_weighted_fits_past_memory_out_of_core():
    from pipeline.kernels import RBF

    tiny = Resources(memory_bytes=1e6, disk_bytes=1e12, in_memory=True)
    plan, reason = plan_fit(50_000, 5, RBF(0.1), tiny, {"alpha": 0.1, "sample_weight": True})
    assert plan.out_of_core, reason
    assert "can only be solved in memory" not in reason


@pytest.mark.parametrize(
    "weights, match",
    [
        (-1.0, r"non-negative, got min -1\.0 \(row 0\); drop the rows"),
        ("neg", r"non-negative, got min -0\.5 \(row 5\); drop the rows"),
        (0.0, "zero for every sample.*give at least one sample a positive weight"),
        ("nan", "sample_weight"),
    ],
)
@pytest.mark.parametrize("solver", ["cholesky", "cg"])
def test_bad_weights_are_refused_before_any_work(data, tmp_path, solver, weights, match):
    X, y, _ = data
    if weights == "neg":
        weights = np.ones(N)
        weights[5] = -0.5
    elif weights == "nan":
        weights = np.ones(N)
        weights[9] = np.nan
    store = tmp_path / "s"
    est = KernelRidge(kernel="rbf", solver=solver, store=store)
    with pytest.raises(ValueError, match=match):
        est.fit(X, y, sample_weight=weights)
    assert not store.exists()
