"""pipeline.KernelPerceptron: the dual, mistake-driven perceptron with theta0 (seed 002)."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning

from pipeline import KernelPerceptron
from pipeline.kernels import RBF


def _circles(n=200, seed=0):
    """Two concentric rings: separable under RBF, not linearly."""
    rng = np.random.default_rng(seed)
    r = np.where(np.arange(n) % 2 == 0, 1.0, 2.5) + 0.15 * rng.standard_normal(n)
    t = rng.uniform(0, 2 * np.pi, n)
    X = np.column_stack([r * np.cos(t), r * np.sin(t)])
    y = np.where(np.arange(n) % 2 == 0, "inner", "outer")
    return X, y


def test_converges_with_zero_training_errors_under_rbf():
    X, y = _circles()
    clf = KernelPerceptron(kernel=RBF(gamma=0.5), max_epochs=50).fit(X, y)
    assert clf.converged_
    assert 1 <= clf.n_iter_ < 50
    assert np.all(clf.predict(X) == y)
    assert list(clf.classes_) == ["inner", "outer"]
    # sparse solution: only the mistakes carry weight
    assert 0 < np.count_nonzero(clf.mistakes_) < len(y)
    # a fresh sample from the same rings is mostly right
    Xt, yt = _circles(seed=1)
    assert np.mean(clf.predict(Xt) == yt) > 0.95


def test_decision_function_is_the_dual_formula_with_theta0():
    X, y = _circles(n=80)
    k = RBF(gamma=0.5)
    clf = KernelPerceptron(kernel=k).fit(X, y)
    ys = np.where(y == clf.classes_[1], 1.0, -1.0)
    a = clf.mistakes_
    np.testing.assert_array_equal(clf.dual_coef_, a * ys)
    assert clf.intercept_ == pytest.approx(np.sum(a * ys))  # theta0 = sum a_i y_i
    Xt, _ = _circles(n=20, seed=3)
    manual = (k(Xt, X) + 1.0) @ (a * ys)  # sum_i a_i y_i [K(x_i, x) + 1]
    np.testing.assert_allclose(clf.decision_function(Xt), manual, rtol=1e-12)
    # every training point is on the right side after convergence
    assert np.all(ys * clf.decision_function(X) > 0)


def test_theta0_needed_for_offset_data():
    # linearly separable only with an offset: x > 3 against x < 3, all x > 0
    X = np.linspace(1.0, 5.0, 40)[:, None]
    y = (X[:, 0] > 3.05).astype(int)
    with_bias = KernelPerceptron(kernel="linear", max_epochs=1000).fit(X, y)
    assert with_bias.converged_ and np.all(with_bias.predict(X) == y)
    with pytest.warns(ConvergenceWarning):
        no_bias = KernelPerceptron(kernel="linear", fit_intercept=False, max_epochs=20).fit(X, y)
    assert no_bias.intercept_ == 0.0
    assert not no_bias.converged_


def test_xor_not_linearly_separable_warns_but_rbf_separates():
    X = np.array([[0.0, 0.0], [1.0, 1.0], [0.0, 1.0], [1.0, 0.0]])
    y = np.array([0, 0, 1, 1])
    with pytest.warns(ConvergenceWarning, match="max_epochs"):
        KernelPerceptron(kernel="linear", max_epochs=30).fit(X, y)
    clf = KernelPerceptron(kernel="rbf", gamma=2.0).fit(X, y)
    assert clf.converged_ and np.all(clf.predict(X) == y)


def test_multiclass_one_vs_rest_and_precomputed():
    rng = np.random.default_rng(0)
    centers = np.array([[0.0, 0.0], [4.0, 0.0], [0.0, 4.0]])
    X = np.vstack([c + 0.5 * rng.standard_normal((30, 2)) for c in centers])
    y = np.repeat([0, 1, 2], 30)
    clf = KernelPerceptron(kernel="rbf", gamma=0.5).fit(X, y)
    assert clf.decision_function(X).shape == (90, 3)
    assert np.all(clf.predict(X) == y)
    K = RBF(gamma=0.5)(X)
    pre = KernelPerceptron(kernel="precomputed").fit(K, y)
    np.testing.assert_array_equal(pre.predict(K), clf.predict(X))


def test_bad_input():
    X, y = _circles(n=20)
    with pytest.raises(ValueError, match="max_epochs"):
        KernelPerceptron(max_epochs=0).fit(X, y)
    with pytest.raises(ValueError, match="only one class"):
        KernelPerceptron().fit(X, np.zeros(len(X)))
    with pytest.raises(ValueError, match="NaN"):
        KernelPerceptron().fit(np.full_like(X, np.nan), y)
    with pytest.raises(ValueError, match="unknown kernel"):
        KernelPerceptron(kernel="rbff").fit(X, y)
    clf = KernelPerceptron().fit(X, y)
    with pytest.raises(ValueError, match="features"):
        clf.predict(X[:, :1])


def test_refuses_a_kernel_that_does_not_fit_in_memory(monkeypatch):
    import pipeline.linalg.dense_memory as memory
    from pipeline.linalg.dense_memory import InsufficientMemoryError

    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 2))
    y = (X[:, 0] > 0).astype(int)
    monkeypatch.setattr(memory, "available_memory", lambda: 1_000)
    with pytest.raises(InsufficientMemoryError, match="kernel perceptron"):
        KernelPerceptron(kernel="rbf").fit(X, y)
