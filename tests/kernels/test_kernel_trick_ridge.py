"""The kernel trick: the degree-2 polynomial kernel is an inner product of explicit
quadratic features, and kernel ridge with it equals primal ridge on those features."""

from __future__ import annotations

from itertools import combinations

import numpy as np
import pytest

from pipeline import KernelRidge
from pipeline.fit import fit_reference
from pipeline.kernels import Polynomial
from pipeline.linalg.dense_primal import solve_primal
from pipeline.models.artifact import Model


def quadratic_features(X: np.ndarray, gamma: float, coef0: float) -> np.ndarray:
    """phi with phi(x)·phi(x') = (gamma x·x' + coef0)^2.

    (g x·x' + c)^2 = sum_i (g x_i^2)(g x'_i^2) + sum_{i<j} (sqrt2 g x_i x_j)(...)
                     + sum_i (sqrt(2 c g) x_i)(...) + c^2.
    """
    n, d = X.shape
    cols = [gamma * X[:, i] ** 2 for i in range(d)]
    cols += [np.sqrt(2.0) * gamma * X[:, i] * X[:, j] for i, j in combinations(range(d), 2)]
    cols += [np.sqrt(2.0 * coef0 * gamma) * X[:, i] for i in range(d)]
    cols += [np.full(n, coef0)]
    return np.column_stack(cols)


@pytest.fixture
def data():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((150, 4))
    y = X[:, 0] * X[:, 1] - X[:, 2] ** 2 + 0.5 * X[:, 3] + 0.1 * rng.standard_normal(150)
    Xt = rng.standard_normal((40, 4))
    return X, y, Xt


@pytest.mark.parametrize("gamma, coef0", [(1.0, 1.0), (0.3, 2.0)])
def test_polynomial_kernel_is_inner_product_of_quadratic_features(data, gamma, coef0):
    X, _, Xt = data
    Phi, Phit = quadratic_features(X, gamma, coef0), quadratic_features(Xt, gamma, coef0)
    assert Phi.shape[1] == 4 + 6 + 4 + 1
    k = Polynomial(degree=2, gamma=gamma, coef0=coef0)
    np.testing.assert_allclose(k(X), Phi @ Phi.T, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(k(Xt, X), Phit @ Phi.T, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("alpha_convention", ["sklearn", "n_samples"])
def test_kernel_ridge_equals_primal_ridge_on_explicit_features(data, alpha_convention):
    X, y, Xt = data
    gamma, coef0, alpha = 0.5, 1.0, 0.1 if alpha_convention == "sklearn" else 1e-3
    Phi, Phit = quadratic_features(X, gamma, coef0), quadratic_features(Xt, gamma, coef0)
    krr = KernelRidge(
        kernel="poly",
        degree=2,
        gamma=gamma,
        coef0=coef0,
        alpha=alpha,
        alpha_convention=alpha_convention,
    ).fit(X, y)
    coef = solve_primal(Phi, y, alpha, alpha_convention=alpha_convention)
    np.testing.assert_allclose(krr.predict(Xt), Phit @ coef, rtol=1e-8, atol=1e-10)
    # the representer theorem: the primal weights are Phi^T dual_coef
    np.testing.assert_allclose(Phi.T @ krr.dual_coef_, coef, rtol=1e-7, atol=1e-10)
    # and the linear kernel on the explicit features (auto picks the primal: n > D)
    lin = KernelRidge(kernel="linear", alpha=alpha, alpha_convention=alpha_convention)
    lin.fit(Phi, y)
    assert lin.solver_ == "primal"
    np.testing.assert_allclose(lin.predict(Phit), krr.predict(Xt), rtol=1e-8, atol=1e-10)
    ref = fit_reference(Phi, y, "linear", alpha, alpha_convention=alpha_convention, solver="dense")
    ref = Model.from_fit(ref, Phi, "linear", alpha, alpha_convention=alpha_convention)
    np.testing.assert_allclose(ref.predict(Phit), krr.predict(Xt), rtol=1e-8, atol=1e-10)
