"""In-memory kernel matrices and predictions through the fused evaluators
(:mod:`pipeline.engine.dense`), and the in-memory paths' refusal of a kernel that
overflows.

Issue #43 (one tile evaluation path): the in-memory ``KernelRidge.predict`` and
fit evaluated whole tiles with the kernel object's own numpy code (0.495x a
cache-blocked loop); they now take the fused evaluators, with the kernel object
only as the fallback for kernels the evaluators do not know. Predictions may
move only at the 1e-12 relative level. Issue #44: the in-memory fit returned a
NaN model when the kernel overflowed float64 (scikit-learn raises, as do the
out-of-core Cholesky and CG); every in-memory path now raises
``NonFiniteKernelError``.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from pipeline import KernelRidge
from pipeline.engine.dense import kernel_matrix, kernel_predict
from pipeline.errors import NonFiniteKernelError
from pipeline.fit import fit_reference
from pipeline.kernels import RBF, Laplacian, Linear, Polynomial, Sigmoid
from pipeline.models.artifact import Model

FUSED = [
    RBF(gamma=0.3),
    Laplacian(gamma=0.2),
    Linear(),
    Polynomial(degree=3, coef0=1.0),
]
#: fallbacks: a subclass, a composition, a kernel the evaluators do not know
OTHERS = [RBF(gamma=0.3) + Linear(), Sigmoid(gamma=0.01, coef0=0.1)]


class MyRBF(RBF):
    """Not the RBF class itself: the kernel object's own evaluation, never fused."""


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))


def _data(n: int, m: int, d: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    # off the origin: exercises the centring
    return rng.normal(size=(n, d)) + 2.0, rng.normal(size=(m, d)) + 2.0, rng


@pytest.mark.parametrize("kernel", FUSED, ids=repr)
@pytest.mark.parametrize("shape", [(1, 1, 3), (257, 513, 8), (600, 300, 5)])
def test_kernel_matrix_equals_the_kernel_objects(kernel, shape):
    n, m, d = shape
    X, Y, _ = _data(n, m, d)
    K = kernel_matrix(kernel, X)
    ref = kernel(X)
    assert K.dtype == ref.dtype == np.float64 and K.shape == ref.shape
    assert _rel(K, ref) < 1e-13
    np.testing.assert_array_equal(K, K.T)  # exactly symmetric
    R = kernel_matrix(kernel, X, Y)
    assert R.shape == (n, m) and _rel(R, kernel(X, Y)) < 1e-13


@pytest.mark.parametrize("kernel", FUSED, ids=repr)
def test_kernel_matrix_keeps_the_kernel_objects_dtype_and_rounds_once(kernel):
    """float32 iff every input is: each value is the float64 one rounded once (the
    kernel object's float32 values come from a float64 exponent, rounded once)."""
    X, Y, _ = _data(120, 70, 4)
    X32 = X.astype(np.float32)
    K = kernel_matrix(kernel, X32)
    assert K.dtype == np.float32
    exact = kernel(X32.astype(np.float64))
    assert _rel(K.astype(np.float64), exact) < 2e-7
    assert kernel_matrix(kernel, X32, Y).dtype == np.float64


@pytest.mark.parametrize("kernel", OTHERS + [MyRBF(gamma=0.3)], ids=repr)
def test_unknown_kernels_keep_the_kernel_objects_bits(kernel):
    X, Y, rng = _data(90, 40, 3)
    np.testing.assert_array_equal(kernel_matrix(kernel, X), kernel(X))
    np.testing.assert_array_equal(kernel_matrix(kernel, X, Y), kernel(X, Y))
    assert kernel_predict(kernel, X, Y, rng.normal(size=40)) is None


@pytest.mark.parametrize("kernel", FUSED, ids=repr)
@pytest.mark.parametrize(
    "shape",
    # ragged everywhere: strips of 256 rows, blocks of 512 columns, chunks of 300 rows
    [(1, 1, 2), (255, 511, 8), (257, 513, 8), (1001, 1537, 3), (700, 40, 16)],
)
@pytest.mark.parametrize("targets", [None, 3])
def test_kernel_predict_moves_predictions_only_at_1e12(kernel, shape, targets):
    n, m, d = shape
    X, Xf, rng = _data(n, m, d)
    a = rng.normal(size=m if targets is None else (m, targets))
    ref = kernel(X, Xf) @ a
    for chunk in (300, 1 << 16):
        p = kernel_predict(kernel, X, Xf, a, chunk_rows=chunk)
        assert p.shape == ref.shape and p.dtype == np.float64
        assert _rel(p, ref) < 1e-12
    # float32 new rows against a float64 training set: float64 kernel values, as before
    X32 = X.astype(np.float32)
    assert _rel(kernel_predict(kernel, X32, Xf, a), kernel(X32, Xf) @ a) < 1e-12
    # sparse new rows
    assert _rel(kernel_predict(kernel, sp.csr_matrix(X), Xf, a, chunk_rows=300), ref) < 1e-12


def test_kernel_predict_is_the_same_for_any_thread_count():
    X, Xf, rng = _data(1100, 700, 5)
    a = rng.normal(size=700)
    one = kernel_predict(RBF(gamma=0.2), X, Xf, a, n_threads=1)
    np.testing.assert_array_equal(one, kernel_predict(RBF(gamma=0.2), X, Xf, a, n_threads=2))


@pytest.mark.parametrize("kernel", ["rbf", "laplacian", "linear", "poly"])
def test_estimator_predictions_move_only_at_1e12(kernel):
    """In-memory fit and predict: against the kernel object's own K and its solve.

    Data off the origin makes the dot-product kernels' predictions sums of terms
    10,000 times larger that cancel: there the move is measured against that scale
    (``|K| |a|``; 1.4e-12 of the prediction itself at this size, 3e-17 of the
    scale), and at 1e-12 of the prediction on centred data.
    """
    from pipeline.linalg.dense_dual import solve_dual

    dot = kernel in ("linear", "poly")
    for shift in (0.0, -2.0) if dot else (0.0,):
        X, Xn, rng = _data(600, 777, 6)
        X, Xn = X + shift, Xn + shift
        y = rng.normal(size=(600, 2))
        model = KernelRidge(alpha=1.0, kernel=kernel, gamma=0.1, solver="dense").fit(X, y)
        k = model.kernel_
        dual = solve_dual(k(X), y, 1.0)
        if dot and not shift:
            assert _rel(model.dual_coef_, dual) < 1e-11
            p, Kn = model.predict(Xn), k(Xn, X)
            scale = np.max(np.abs(Kn) @ np.abs(model.dual_coef_))
            assert np.max(np.abs(p - Kn @ model.dual_coef_)) / scale < 1e-15
            continue
        assert _rel(model.dual_coef_, dual) < 1e-12
        assert _rel(model.predict(Xn), k(Xn, X) @ dual) < 1e-12
        Xn32 = Xn.astype(np.float32)
        assert _rel(model.predict(Xn32), k(Xn32, X) @ dual) < 1e-12


def test_float32_model_predicts_with_float64_kernel_values():
    """A model fitted on float32 rows: its K is float32 (as scikit-learn's), and its
    predictions now use float64 kernel values: the exact ones to 1e-12, where the
    float32-rounded kernel values they used before were 3e-6 off here."""
    X, Xn, rng = _data(300, 400, 4)
    X32, Xn32 = X.astype(np.float32), Xn.astype(np.float32)
    model = KernelRidge(alpha=1.0, kernel="rbf", gamma=0.1).fit(X32, rng.normal(size=300))
    exact = model.kernel_(Xn32.astype(np.float64), X32.astype(np.float64)) @ model.dual_coef_
    assert _rel(model.predict(Xn32), exact) < 1e-12
    old = model.kernel_(Xn32, X32) @ model.dual_coef_
    assert 1e-8 < _rel(old, exact) < 1e-5


def test_estimator_takes_the_fused_path_for_known_kernels(monkeypatch):
    """The kernel object's own RBF code is never called for fit or predict (it was)."""
    X, Xn, rng = _data(200, 50, 3)
    y = rng.normal(size=200)
    ref = KernelRidge(alpha=0.5, kernel="rbf", solver="dense").fit(X, y)
    expected = ref.predict(Xn)

    def boom(*a, **k):
        raise AssertionError("the kernel object's whole-tile code ran")

    monkeypatch.setattr(RBF, "_eval", boom)
    model = KernelRidge(alpha=0.5, kernel="rbf", solver="dense").fit(X, y)
    np.testing.assert_array_equal(model.predict(Xn), expected)
    ref_model = Model.from_fit(fit_reference(X, y, "rbf", 0.5, solver="dense"), X, "rbf", 0.5)
    assert _rel(ref_model.predict(Xn), expected) < 1e-12


def test_fallback_kernels_predict_as_before():
    X, Xn, rng = _data(150, 60, 3)
    y = rng.normal(size=150)
    for k in OTHERS + [MyRBF(gamma=0.3)]:
        model = KernelRidge(alpha=1.0, kernel=k, solver="dense").fit(X, y)
        np.testing.assert_allclose(model.predict(Xn), k(Xn, X) @ model.dual_coef_, rtol=1e-12)


# -- issue #44: a kernel that overflows is refused on every in-memory path ---------------
HUGE = 1e110  # (x . y)^3 overflows float64; the rows themselves are finite


def _huge(n=40, d=3):
    rng = np.random.default_rng(1)
    return rng.uniform(1, 2, size=(n, d)) * HUGE, rng.normal(size=n)


@pytest.mark.parametrize(
    "make",
    [
        lambda: KernelRidge(kernel="poly", degree=3, gamma=1.0),
        lambda: KernelRidge(kernel=Polynomial(degree=3, gamma=1.0), solver="dense"),
        lambda: KernelRidge(kernel=Polynomial(degree=3, gamma=1.0) + RBF()),  # the fallback
        lambda: KernelRidge(kernel=lambda a, b: np.dot(a, b) ** 3),  # a callable
    ],
)
def test_in_memory_fit_refuses_an_overflowing_kernel(make):
    X, y = _huge()
    with pytest.raises(NonFiniteKernelError, match=r"non-finite value \(inf or NaN\).*overflow"):
        make().fit(X, y)


def test_in_memory_primal_fit_refuses_an_overflowing_kernel():
    X, y = _huge()
    with pytest.raises(NonFiniteKernelError, match="overflow"):
        KernelRidge(kernel="linear", solver="primal").fit(X * 1e50, y)


def test_reference_fit_refuses_an_overflowing_kernel():
    X, y = _huge()
    with pytest.raises(NonFiniteKernelError, match="overflow"):
        fit_reference(X, y, Polynomial(degree=3, gamma=1.0), 1.0, solver="dense")


@pytest.mark.parametrize("kernel", [Polynomial(degree=3, gamma=1.0), Polynomial(degree=3) + RBF()])
def test_in_memory_predict_refuses_an_overflowing_kernel(kernel):
    X, y = _huge()
    model = KernelRidge(kernel=kernel, solver="dense").fit(X / HUGE, y)
    with pytest.raises(NonFiniteKernelError, match=r"K\(X, (X_fit|Y)\).*overflow"):
        model.predict(X)


# -- kernel columns (the Nystrom preconditioner's K[rows][:, cols]) -----------------------
@pytest.mark.parametrize("kernel", FUSED + OTHERS, ids=repr)
def test_kernel_columns_take_the_fused_evaluators(kernel):
    from pipeline.engine import kernel_tile
    from pipeline.engine.passes import KernelSource

    X, Y, rng = _data(70, 50, 4)
    ri, cj = rng.permutation(70)[:9], rng.permutation(50)[:13]
    a, b = KernelSource(kernel).pieces(0, 1, X, Y, ri, cj, cj[:5], ri[:4])
    assert _rel(a, kernel(X[ri], Y[cj])) < 1e-13 and _rel(b, kernel(Y[cj[:5]], X[ri[:4]])) < 1e-13
    if kernel in FUSED:  # the fused bits (before: the kernel object's)
        want = kernel_tile(kernel, X[ri], Y[cj], np.empty((9, 13)), n_threads=1)
    else:
        want = kernel(X[ri], Y[cj])
    np.testing.assert_array_equal(a, want)


def test_kernel_perceptron_refuses_an_overflowing_kernel():
    from pipeline import KernelPerceptron

    X, y = _huge()
    with pytest.raises(NonFiniteKernelError, match="overflow"):
        KernelPerceptron(kernel="poly", degree=3, gamma=1.0).fit(X, y > 0)


def test_kernel_ridge_cv_refuses_an_overflowing_kernel():
    from pipeline import KernelRidgeCV

    X, y = _huge(60)
    with pytest.raises(NonFiniteKernelError, match="overflow"):
        KernelRidgeCV(alphas=[0.1, 1.0], kernel="poly", degree=3, gamma=1.0, cv=3).fit(X, y)


def test_out_of_core_fit_directory_is_not_one_of_the_old_evaluation(tmp_path, monkeypatch):
    """A KernelRidge store written before the Gram was fused (its Gram under the old
    fingerprint) is another directory: refit, it is recomputed beside it, never
    refused (StoreMismatchError) nor mixed with the new tiles."""
    X, _, rng = _data(120, 1, 3)
    y = rng.normal(size=120)
    est = KernelRidge(kernel="rbf", solver="cholesky", store=str(tmp_path), block_size=50)
    old_identity = KernelRidge._fit_identity

    def before(self, *a):
        ident = old_identity(self, *a)
        ident.pop("tiles", None)  # the identity the earlier code named its directory by
        return ident

    monkeypatch.setattr(KernelRidge, "_fit_identity", before)
    est.fit(X, y)
    old_dir = est.fit_info_["store"]
    # that directory's Gram as the earlier evaluation stored it: another fingerprint
    import zarr

    arr = zarr.open_array(store=old_dir, path="gram", mode="r+")
    arr.attrs["fingerprint"] = "0" * 64
    monkeypatch.setattr(KernelRidge, "_fit_identity", old_identity)
    est.fit(X, y)
    assert est.fit_info_["store"] != old_dir
    ref = KernelRidge(kernel="rbf", solver="dense").fit(X, y)
    assert _rel(est.predict(X), ref.predict(X)) < 1e-8
