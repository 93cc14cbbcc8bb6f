"""The rest of scikit-learn's pairwise kernels: sigmoid, cosine, chi² and additive chi².

Each equals :func:`sklearn.metrics.pairwise.pairwise_kernels` with the same
name and parameters (tested to 1e-12), so :class:`pipeline.KernelRidge` takes
every kernel name :class:`sklearn.kernel_ridge.KernelRidge` does.
"""

from __future__ import annotations

import numpy as np

from pipeline.kernels.base import Kernel, check_real, register
from pipeline.kernels.basic import _f64, _gamma, _inner, _row_sq_norms, featurewise_sum


@register
class Sigmoid(Kernel):
    """k(x, y) = tanh(gamma·x·y + coef0); gamma=None means 1/n_features.

    Not a Mercer kernel: its Gram matrix is indefinite for many data sets and
    parameters (``is_mercer = False``), so Cholesky-based solvers may fail.
    """

    name = "sigmoid"
    is_mercer = False

    def __init__(self, gamma: float | None = None, coef0: float = 1.0) -> None:
        self.gamma = gamma
        self.coef0 = coef0
        self._check_params()

    def _check_params(self) -> None:
        check_real(self, "gamma", self.gamma, low=0, allow_none=True)
        check_real(self, "coef0", self.coef0)

    def _eval(self, X, Y, symmetric):
        K = _inner(X, Y, symmetric)
        K *= _gamma(self.gamma, X.shape[1])
        K += self.coef0
        return np.tanh(K, out=K)

    def _diag(self, X):
        return np.tanh(_gamma(self.gamma, X.shape[1]) * _row_sq_norms(X) + self.coef0)


def _unit_rows(X: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm in float64; all-zero rows stay zero (as sklearn)."""
    X64 = _f64(X)
    norms = np.sqrt(_row_sq_norms(X64))
    norms[norms == 0.0] = 1.0
    return X64 / norms[:, None]


@register
class Cosine(Kernel):
    """k(x, y) = x·y / (||x||·||y||); a zero row gives 0 (scikit-learn's convention).

    The same as ``Normalized(Linear())`` in :mod:`pipeline.kernels.compose`.
    """

    name = "cosine"

    def __init__(self) -> None:
        pass

    def _eval(self, X, Y, symmetric):
        Xn = _unit_rows(X)
        return Xn @ (Xn if symmetric else _unit_rows(Y)).T

    def _diag(self, X):
        return (_row_sq_norms(X) > 0).astype(np.float64)


def _check_nonnegative(k: Kernel, X: np.ndarray, which: str) -> None:
    if X.size and X.min() < 0:
        raise ValueError(
            f"{type(k).__name__} needs non-negative inputs (e.g. histograms); "
            f"{which} has a value {X.min()!r} < 0"
        )


def _additive_chi2(k: Kernel, X: np.ndarray, Y: np.ndarray, symmetric: bool) -> np.ndarray:
    """-Σ_f (x_f - y_f)² / (x_f + y_f) in float64, with 0/0 terms taken as 0."""
    _check_nonnegative(k, X, "X")
    if not symmetric:
        _check_nonnegative(k, Y, "Y")
    K = featurewise_sum(X, Y, _chi2_term)
    np.negative(K, out=K)
    return K


def _chi2_term(x, y, out, den):
    np.subtract(x, y, out=out)
    np.square(out, out=out)
    np.add(x, y, out=den)
    zero = den == 0
    den[zero] = 1.0  # 0/0 terms (x_f = y_f = 0) count as 0; the numerator is 0 there
    np.divide(out, den, out=out)


@register
class AdditiveChi2(Kernel):
    """k(x, y) = -Σ_f (x_f - y_f)² / (x_f + y_f), for non-negative x, y.

    The negative of the chi² distance, so only *conditionally* positive
    definite: its Gram matrix has a negative eigenvalue as soon as two rows
    differ (the diagonal is zero, the trace is zero). As scikit-learn's
    documentation says, it is not a Mercer kernel (``is_mercer = False``);
    use :class:`Chi2` (its exponential) for a PSD kernel.
    """

    name = "additive_chi2"
    is_mercer = False

    def __init__(self) -> None:
        pass

    def _eval(self, X, Y, symmetric):
        return _additive_chi2(self, X, Y, symmetric)

    def _diag(self, X):
        _check_nonnegative(self, X, "X")
        return np.zeros(X.shape[0])


@register
class Chi2(Kernel):
    """k(x, y) = exp(-gamma·Σ_f (x_f - y_f)² / (x_f + y_f)), for non-negative x, y.

    ``gamma`` defaults to 1 (scikit-learn's ``chi2_kernel`` default, unlike the
    1/n_features of the other kernels). PSD for gamma >= 0.
    """

    name = "chi2"

    def __init__(self, gamma: float | None = 1.0) -> None:
        self.gamma = gamma
        self._check_params()

    def _check_params(self) -> None:
        check_real(self, "gamma", self.gamma, low=0, allow_none=True)

    def _eval(self, X, Y, symmetric):
        K = _additive_chi2(self, X, Y, symmetric)
        K *= 1.0 if self.gamma is None else float(self.gamma)
        return np.exp(K, out=K)

    def _diag(self, X):
        _check_nonnegative(self, X, "X")
        return np.ones(X.shape[0])
