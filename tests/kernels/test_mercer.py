"""Mercer check: symmetry, PSD and the smallest eigenvalue on a sample."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.kernels import (
    RBF,
    AdditiveChi2,
    Chi2,
    Constant,
    Cosine,
    Exp,
    FunctionScaled,
    GaussianEnvelope,
    Kernel,
    Laplacian,
    Linear,
    MercerReport,
    Normalized,
    Polynomial,
    Product,
    RowNorm,
    Scaled,
    Sigmoid,
    Standardize,
    Warped,
    check_mercer,
)

RNG = np.random.default_rng(7)
X = RNG.normal(size=(150, 5))
XP = np.abs(X)  # non-negative, for chi²


class Difference(Kernel):
    """k1 - k2: not a closure rule, so not a kernel in general (test-only, unregistered)."""

    name = "test-difference"

    def __init__(self, k1, k2):
        self.k1 = k1
        self.k2 = k2

    def _eval(self, A, B, symmetric):
        return self.k1._eval(A, B, symmetric) - self.k2._eval(A, B, symmetric)


class Skewed(Kernel):
    """An RBF plus an antisymmetric part: not symmetric."""

    name = "test-skewed"

    def __init__(self):
        pass

    def _eval(self, A, B, symmetric):
        return RBF(0.5)._eval(A, B, symmetric) + 0.1 * (A[:, :1] - B[:, :1].T)


PSD_KERNELS = {
    "linear": Linear(),
    "poly": Polynomial(3, coef0=1.0),
    "rbf": RBF(0.3),
    "laplacian": Laplacian(0.5),
    "cosine": Cosine(),
    "constant": Constant(2.0),
    "sum": RBF(0.3) + Polynomial(2),
    "product": Product(Laplacian(0.2), Linear()),
    "scaled": Scaled(RBF(1.0), 4.0),
    "exp": Exp(Linear(), 0.2),
    "warped": Warped(RBF(0.5), Standardize.from_data(X)),
    "function_scaled": FunctionScaled(RBF(0.5), RowNorm()),
    "normalized": Normalized(Polynomial(2) + Laplacian()),
    "rbf_from_exp": FunctionScaled(Exp(Linear(), 0.4), GaussianEnvelope(0.2)),
    "nested": Exp(Normalized(2.0 * RBF(0.2) * Linear() + Constant(0.5)), 0.5),
}


@pytest.mark.parametrize("kid", sorted(PSD_KERNELS))
def test_psd_kernels_and_closure_rules_pass(kid):
    k = PSD_KERNELS[kid]
    rep = check_mercer(k, X)
    assert isinstance(rep, MercerReport)
    assert rep.symmetric and rep.psd and rep.is_mercer, rep
    assert rep.min_eigenvalue >= -1e-8 * max(1.0, rep.max_eigenvalue)
    assert rep.max_asymmetry <= 1e-10 * max(1.0, rep.max_eigenvalue)
    assert rep.n_samples == X.shape[0]
    assert k.is_mercer


def test_chi2_is_psd_on_nonnegative_data():
    assert check_mercer(Chi2(0.5), XP).is_mercer


def test_sigmoid_can_be_indefinite():
    k = Sigmoid(gamma=1.0, coef0=-1.0)
    rep = check_mercer(k, X)
    assert rep.symmetric and not rep.psd
    assert rep.min_eigenvalue < -1e-3 * rep.max_eigenvalue
    assert not k.is_mercer


def test_additive_chi2_is_only_conditionally_psd():
    rep = check_mercer(AdditiveChi2(), XP)
    assert rep.symmetric and not rep.psd
    # zero diagonal: the eigenvalues sum to 0, so the smallest is clearly negative
    assert rep.min_eigenvalue < -1e-3 * abs(rep.max_eigenvalue)


def test_difference_of_kernels_is_not_psd():
    k = Difference(RBF(0.1), RBF(1.0))
    rep = check_mercer(k, X)
    assert rep.symmetric and not rep.psd and not rep.is_mercer
    assert rep.min_eigenvalue < -1e-2


def test_negative_weight_polynomial_not_psd():
    rep = check_mercer(Polynomial(2, gamma=1.0, coef0=-3.0), X)
    assert not rep.psd
    assert not Polynomial(2, coef0=-3.0).is_mercer


def test_asymmetric_kernel_is_flagged():
    rep = check_mercer(Skewed(), X)
    assert not rep.symmetric and not rep.is_mercer
    assert rep.max_asymmetry > 0.1


def test_min_eigenvalue_matches_numpy():
    K = RBF(0.3)(X)
    rep = check_mercer(RBF(0.3), X)
    eig = np.linalg.eigvalsh(K)
    assert rep.min_eigenvalue == pytest.approx(eig[0], abs=1e-10)
    assert rep.max_eigenvalue == pytest.approx(eig[-1], rel=1e-10)


def test_subsample_is_seeded_and_capped():
    big = RNG.normal(size=(500, 3))
    a = check_mercer(Laplacian(), big, max_samples=120, random_state=1)
    b = check_mercer(Laplacian(), big, max_samples=120, random_state=1)
    c = check_mercer(Laplacian(), big, max_samples=120, random_state=2)
    assert a.n_samples == 120 and a == b
    assert a.min_eigenvalue != c.min_eigenvalue


def test_plain_callable_and_tolerance():
    rep = check_mercer(lambda A, B: A @ B.T - 1e-6 * np.eye(len(A)), X[:, :2])
    assert rep.min_eigenvalue < 0 and rep.psd  # within the relative tolerance
    assert not check_mercer(lambda A, B: A @ B.T - 1e-6 * np.eye(len(A)), X[:, :2], tol=0).psd


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(tol=-1.0), "tol"),
        (dict(max_samples=0), "max_samples"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        check_mercer(RBF(), X, **kwargs)


def test_bad_inputs():
    with pytest.raises(ValueError, match="2-D"):
        check_mercer(RBF(), X[0])
    with pytest.raises(ValueError, match="NaN or inf"), np.errstate(over="ignore"):
        check_mercer(Exp(Linear(), 1.0), X * 100)
    with pytest.raises(ValueError, match="shape"):
        check_mercer(lambda A, B: A, X)


def test_sum_of_sampled_closure_rules():
    """Random compositions of PSD parts stay PSD (closure under +, ·, a·, exp)."""
    rng = np.random.default_rng(11)
    parts = [RBF(0.5), Linear(), Laplacian(0.3), Polynomial(2), Cosine(), Constant(1.0)]
    for _ in range(12):
        k = parts[rng.integers(len(parts))]
        for _ in range(3):
            other = parts[rng.integers(len(parts))]
            op = rng.integers(4)
            if op == 0:
                k = k + other
            elif op == 1:
                k = k * other
            elif op == 2:
                k = float(rng.uniform(0, 3)) * k
            else:
                k = Exp(Normalized(k), float(rng.uniform(0, 1)))
        rep = check_mercer(k, X[:80])
        assert rep.is_mercer and k.is_mercer, (k, rep)
