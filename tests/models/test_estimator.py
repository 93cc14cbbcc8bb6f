"""pipeline.KernelRidge against sklearn.kernel_ridge.KernelRidge (in-memory path)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.base import clone
from sklearn.datasets import load_diabetes
from sklearn.exceptions import NotFittedError
from sklearn.kernel_ridge import KernelRidge as SKKernelRidge
from sklearn.model_selection import GridSearchCV, KFold

from pipeline import KernelRidge
from pipeline.kernels import RBF, SKLEARN_KERNELS, Linear, Polynomial, make_kernel
from pipeline.linalg import dense_memory as memory_mod
from pipeline.linalg.dense_memory import InsufficientMemoryError

RTOL = 1e-8


def _rel_err(a, b):
    return np.max(np.abs(a - b)) / np.max(np.abs(b))


def _kernel_kwargs(name):
    # scikit-learn's chi2 fails with gamma=None (it multiplies by None), so give gamma
    return {"gamma": 0.5} if name == "chi2" else {}


def _diabetes():
    X, y = load_diabetes(return_X_y=True)
    return X, y


def _synthetic(n=150, d=4, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(0.0, 1.0, (n, d))  # non-negative, so the chi2 kernels apply
    y = np.column_stack([np.sin(3 * X[:, 0]) + X[:, 1], X[:, 2] ** 2])
    y += 0.05 * rng.standard_normal(y.shape)
    return X, y


def _fit_both(kernel, X, y, **kw):
    with warnings.catch_warnings(record=True) as w_ours:
        warnings.simplefilter("always")
        ours = KernelRidge(kernel=kernel, **kw).fit(X, y)
    with warnings.catch_warnings(record=True) as w_sk:
        warnings.simplefilter("always")
        ref = SKKernelRidge(kernel=kernel, **kw).fit(X, y)
    singular = lambda ws: any("Singular matrix" in str(x.message) for x in ws)  # noqa: E731
    assert singular(w_ours) == singular(w_sk)
    return ours, ref


@pytest.mark.parametrize("kernel", SKLEARN_KERNELS)
def test_matches_sklearn_on_diabetes(kernel):
    X, y = _diabetes()
    if "chi2" in kernel:
        X = np.abs(X)
    ours, ref = _fit_both(kernel, X, y, alpha=0.1, **_kernel_kwargs(kernel))
    Xt = X[::3] * 1.1
    assert _rel_err(ours.predict(Xt), ref.predict(Xt)) < RTOL


@pytest.mark.parametrize("kernel", SKLEARN_KERNELS)
def test_matches_sklearn_on_synthetic_multioutput(kernel):
    X, y = _synthetic()
    kw = dict(alpha=0.5, gamma=0.8, degree=2, coef0=0.5)
    ours, ref = _fit_both(kernel, X, y, **kw)
    Xt, _ = _synthetic(n=40, seed=1)
    p = ours.predict(Xt)
    assert p.shape == (40, 2)
    assert _rel_err(p, ref.predict(Xt)) < RTOL
    if kernel != "additive_chi2":  # not PSD: both take the least-squares path
        assert _rel_err(ours.dual_coef_, ref.dual_coef_) < 1e-7


def test_sample_weight_per_target_alpha_and_float_weight():
    X, y = _synthetic()
    sw = np.random.default_rng(2).uniform(0.0, 3.0, len(y))
    kw = dict(alpha=[0.1, 2.0], kernel="rbf", gamma=1.0)
    ours = KernelRidge(**kw).fit(X, y, sample_weight=sw)
    ref = SKKernelRidge(**kw).fit(X, y, sample_weight=sw)
    assert _rel_err(ours.predict(X), ref.predict(X)) < RTOL
    ours = KernelRidge(kernel="laplacian").fit(X, y[:, 0], sample_weight=2.0)
    ref = SKKernelRidge(kernel="laplacian").fit(X, y[:, 0], sample_weight=2.0)
    assert _rel_err(ours.predict(X), ref.predict(X)) < RTOL


@pytest.mark.parametrize("fmt", ["csr", "csc"])
@pytest.mark.parametrize("kernel", ["linear", "rbf", "poly", "cosine"])
def test_sparse_input(fmt, kernel):
    X, y = _synthetic()
    X[X < 0.5] = 0.0
    Xs = sp.csr_matrix(X) if fmt == "csr" else sp.csc_matrix(X)
    ours = KernelRidge(kernel=kernel, alpha=0.3).fit(Xs, y)
    ref = SKKernelRidge(kernel=kernel, alpha=0.3).fit(Xs, y)
    assert sp.issparse(ours.X_fit_)
    assert _rel_err(ours.predict(Xs), ref.predict(Xs)) < RTOL
    assert _rel_err(ours.predict(X), ref.predict(X)) < RTOL


def test_callable_precomputed_objects_and_specs():
    X, y = _synthetic(n=60)

    def kfun(a, b, scale=1.0):
        return scale * np.exp(-np.sum((a - b) ** 2))

    ours = KernelRidge(kernel=kfun, kernel_params={"scale": 2.0}).fit(X, y)
    ref = SKKernelRidge(kernel=kfun, kernel_params={"scale": 2.0}).fit(X, y)
    assert ours.kernel_ is None
    assert _rel_err(ours.predict(X[:10]), ref.predict(X[:10])) < RTOL

    K = RBF(gamma=1.0)(X)
    pre = KernelRidge(kernel="precomputed", alpha=0.2).fit(K, y)
    ref = SKKernelRidge(kernel="rbf", gamma=1.0, alpha=0.2).fit(X, y)
    np.testing.assert_array_equal(K, RBF(gamma=1.0)(X))  # the user's K is untouched
    assert _rel_err(pre.predict(RBF(gamma=1.0)(X[:7], X)), ref.predict(X[:7])) < RTOL

    for k in (RBF(gamma=1.0), RBF(gamma=1.0).to_spec()):
        ours = KernelRidge(kernel=k, alpha=0.2).fit(X, y)
        assert _rel_err(ours.predict(X), ref.predict(X)) < RTOL
    # kernel_params set on a copy of a Kernel object
    k = RBF(gamma=5.0)
    ours = KernelRidge(kernel=k, kernel_params={"gamma": 1.0}, alpha=0.2).fit(X, y)
    assert k.gamma == 5.0
    assert _rel_err(ours.predict(X), ref.predict(X)) < RTOL
    # composite kernels work as objects
    comp = 0.5 * RBF(gamma=1.0) + Polynomial(degree=2)
    ours = KernelRidge(kernel=comp).fit(X, y)
    Kc = 0.5 * RBF(gamma=1.0)(X) + Polynomial(degree=2)(X)
    pre = KernelRidge(kernel="precomputed").fit(Kc, y)
    assert _rel_err(ours.predict(X), pre.predict(Kc)) < 1e-10


def test_alpha_zero_least_squares_fallback_warns_like_sklearn():
    X = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [2.0, 1.0], [0.0, 1.0]])
    y = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    with pytest.warns(UserWarning, match="Singular matrix in solving dual problem"):
        ours = KernelRidge(alpha=0.0, kernel="linear").fit(X, y)
    with pytest.warns(UserWarning, match="Singular matrix in solving dual problem"):
        ref = SKKernelRidge(alpha=0.0, kernel="linear").fit(X, y)
    assert ours.solver_ == "dense"  # alpha = 0 never takes the primal
    assert _rel_err(ours.predict(X), ref.predict(X)) < RTOL
    # alpha = 0 with a positive definite K: plain interpolation, no warning
    Xr, yr = _synthetic(n=30)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ours = KernelRidge(alpha=0.0, kernel="rbf", gamma=1.0).fit(Xr, yr)
    np.testing.assert_allclose(ours.predict(Xr), yr, atol=1e-6)


def test_n_samples_convention_equals_sklearn_with_scaled_alpha():
    X, y = _diabetes()
    n = len(y)
    for kernel in ("rbf", "linear"):
        ours = KernelRidge(kernel=kernel, alpha=1e-3, alpha_convention="n_samples").fit(X, y)
        ref = SKKernelRidge(kernel=kernel, alpha=1e-3 * n).fit(X, y)
        assert _rel_err(ours.predict(X), ref.predict(X)) < RTOL
        np.testing.assert_allclose(ours.effective_alpha_, [1e-3 * n])


def test_primal_and_dense_agree_and_auto_uses_cost_model():
    X, y = _diabetes()
    auto = KernelRidge(kernel="linear", alpha=0.01).fit(X, y)
    dense = KernelRidge(kernel=Linear(), alpha=0.01, solver="dense").fit(X, y)
    assert auto.solver_ == "primal" and dense.solver_ == "dense"
    assert _rel_err(auto.predict(X), dense.predict(X)) < 1e-10
    assert _rel_err(auto.dual_coef_, dense.dual_coef_) < 1e-8
    assert KernelRidge(kernel="linear").fit(X[:6], y[:6]).solver_ == "dense"  # n < D
    with pytest.raises(ValueError, match="primal"):
        KernelRidge(kernel="rbf", solver="primal").fit(X, y)
    with pytest.raises(ValueError, match="alpha > 0"):
        KernelRidge(kernel="linear", solver="primal", alpha=0.0).fit(X, y)


def test_grid_search_cv():
    X, y = _diabetes()
    grid = GridSearchCV(
        KernelRidge(kernel="rbf"),
        {"alpha": [0.01, 0.1], "gamma": [0.1, 1.0]},
        cv=KFold(3, shuffle=True, random_state=0),
    )
    grid.fit(X, y)
    ref = GridSearchCV(
        SKKernelRidge(kernel="rbf"),
        {"alpha": [0.01, 0.1], "gamma": [0.1, 1.0]},
        cv=KFold(3, shuffle=True, random_state=0),
    ).fit(X, y)
    assert grid.best_params_ == ref.best_params_
    np.testing.assert_allclose(
        grid.cv_results_["mean_test_score"], ref.cv_results_["mean_test_score"], rtol=1e-8
    )


def test_params_clone_and_out_of_core_solvers():
    est = KernelRidge(alpha=0.3, kernel="rbf", solver="cg", tol=1e-8, rank=50, block_size=1024)
    params = est.get_params()
    for name in (
        "block_size",
        "store",
        "tol",
        "max_iter",
        "preconditioner",
        "rank",
        "matvec",
        "alpha_convention",
        "random_state",
        "solver",
    ):
        assert name in params
    assert clone(est).get_params() == params
    X, y = _synthetic(n=20)
    for solver in ("cholesky", "cg"):
        est = KernelRidge(solver=solver, tol=1e-12).fit(X, y)
        assert est.solver_ == solver
        ref = KernelRidge(solver="dense").fit(X, y)
        np.testing.assert_allclose(est.predict(X), ref.predict(X), rtol=1e-6, atol=1e-9)
    with pytest.raises(NotFittedError):
        KernelRidge().predict(X)


def test_float32_input():
    X, y = _synthetic()
    ours = KernelRidge(kernel="rbf").fit(X.astype(np.float32), y)
    ref = KernelRidge(kernel="rbf").fit(X, y)
    assert ours.predict(X.astype(np.float32)).dtype == np.float64
    assert _rel_err(ours.predict(X.astype(np.float32)), ref.predict(X)) < 1e-5


class _Spy(RBF):
    """An RBF that counts its evaluations, to prove errors come before any work."""

    calls = 0

    def _eval(self, X, Y, symmetric):
        type(self).calls += 1
        return super()._eval(X, Y, symmetric)


@pytest.mark.parametrize(
    "case, exc, match",
    [
        ("nan_X", ValueError, "NaN"),
        ("inf_X", ValueError, "infinity"),
        ("nan_y", ValueError, "NaN"),
        ("X_1d", ValueError, "Reshape your data"),
        ("zero_rows", ValueError, "0 sample"),
        ("length_mismatch", ValueError, "inconsistent numbers of samples"),
        ("alpha_negative", ValueError, "alpha must be >= 0"),
        ("alpha_nan", ValueError, "alpha must be finite"),
        ("alpha_wrong_length", ValueError, "one per target"),
        ("sample_weight_negative", ValueError, "non-negative"),
        ("sample_weight_length", ValueError, "one weight per row"),
        ("bad_solver", ValueError, "solver='qr' is not valid"),
        ("bad_convention", ValueError, "alpha_convention"),
        ("precomputed_not_square", ValueError, "square"),
        ("y_none", ValueError, "requires y"),
    ],
)
def test_bad_input_raises_before_any_work(case, exc, match):
    X, y = _synthetic(n=30)
    y = y[:, 0]
    est = KernelRidge(kernel=_Spy(gamma=1.0))
    kw = {}
    if case == "nan_X":
        X[3, 1] = np.nan
    elif case == "inf_X":
        X[3, 1] = np.inf
    elif case == "nan_y":
        y[2] = np.nan
    elif case == "X_1d":
        X = X[:, 0]
    elif case == "zero_rows":
        X, y = X[:0], y[:0]
    elif case == "length_mismatch":
        y = y[:-1]
    elif case == "alpha_negative":
        est.set_params(alpha=-1.0)
    elif case == "alpha_nan":
        est.set_params(alpha=np.nan)
    elif case == "alpha_wrong_length":
        est.set_params(alpha=[1.0, 2.0, 3.0])
    elif case == "sample_weight_negative":
        kw["sample_weight"] = -np.ones(len(y))
    elif case == "sample_weight_length":
        kw["sample_weight"] = np.ones(len(y) + 1)
    elif case == "bad_solver":
        est.set_params(solver="qr")
    elif case == "bad_convention":
        est.set_params(alpha_convention="mean")
    elif case == "precomputed_not_square":
        est = KernelRidge(kernel="precomputed")
    elif case == "y_none":
        y = None
    _Spy.calls = 0
    with pytest.raises(exc, match=match):
        est.fit(X, y, **kw)
    assert _Spy.calls == 0


def test_unknown_kernel_negative_weight_and_feature_count():
    X, y = _synthetic(n=30)
    with pytest.raises(ValueError, match="unknown kernel 'rbff'"):
        KernelRidge(kernel="rbff").fit(X, y)
    with pytest.raises(ValueError, match="-0.5|negative|weight"):
        KernelRidge(
            kernel=make_kernel(
                {"name": "scaled", "params": {"kernel": RBF().to_spec(), "weight": -0.5}}
            )
        ).fit(X, y)
    est = KernelRidge(kernel="rbf").fit(X, y)
    with pytest.raises(ValueError, match="X has 3 features, but KernelRidge is expecting 4"):
        est.predict(X[:, :3])
    pre = KernelRidge(kernel="precomputed").fit(RBF()(X), y)
    with pytest.raises(ValueError, match="expecting 30 features"):
        pre.predict(RBF()(X[:5], X[:20]))


def test_memory_guard_refuses_before_work(monkeypatch):
    X, y = _synthetic(n=200)
    monkeypatch.setattr(memory_mod, "available_memory", lambda: 100_000)
    _Spy.calls = 0
    with pytest.raises(InsufficientMemoryError, match="solver='cholesky'"):
        KernelRidge(kernel=_Spy(), solver="dense").fit(X, y)
    assert _Spy.calls == 0


@pytest.mark.parametrize("solver", ["dense", "cholesky"])
def test_a_spec_dicts_own_parameters_win_over_the_estimators_defaults(solver, tmp_path):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 3))
    y = (X @ [1.0, -2.0, 0.5]) ** 2
    kw = {"store": str(tmp_path), "block_size": 128} if solver == "cholesky" else {}
    spec = {"name": "polynomial", "params": {"degree": 2, "gamma": 0.5, "coef0": 0.0}}
    a = KernelRidge(kernel=spec, alpha=1e-3, solver=solver, **kw).fit(X, y)
    b = KernelRidge(kernel=Polynomial(degree=2, gamma=0.5, coef0=0.0), alpha=1e-3, solver=solver,
                    **kw).fit(X, y)  # fmt: skip
    # degree=3 and coef0=1 (the estimator's defaults) used to replace the spec's values
    assert a.kernel_.get_params() == b.kernel_.get_params()
    np.testing.assert_array_equal(a.predict(X), b.predict(X))
    # what the spec leaves out is still filled from the estimator's parameters
    c = KernelRidge(kernel={"name": "polynomial", "params": {"degree": 2}}, gamma=0.25,
                    solver=solver, **kw).fit(X, y)  # fmt: skip
    assert c.kernel_.get_params()["gamma"] == 0.25 and c.kernel_.get_params()["degree"] == 2
    assert c.kernel_.get_params()["coef0"] == 1
