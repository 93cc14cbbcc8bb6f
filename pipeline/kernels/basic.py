"""The standard kernels: linear, polynomial, RBF (Gaussian), Laplacian, constant.

Conventions follow :mod:`sklearn.metrics.pairwise`: ``gamma=None`` means
``1 / n_features``, and ``gamma`` may be 0 (the same range scikit-learn's
``KernelRidge`` accepts). Inner products and distances are accumulated in
float64 whatever the input dtype.
"""

from __future__ import annotations

import numpy as np

from pipeline.kernels.base import Kernel, check_real, register


def _f64(X: np.ndarray) -> np.ndarray:
    return X.astype(np.float64, copy=False)


def _inner(X: np.ndarray, Y: np.ndarray, symmetric: bool) -> np.ndarray:
    """``X @ Y.T`` accumulated in float64."""
    X64 = _f64(X)
    return X64 @ (X64 if symmetric else _f64(Y)).T


def _row_sq_norms(X: np.ndarray) -> np.ndarray:
    X64 = _f64(X)
    return np.einsum("ij,ij->i", X64, X64)


def _sq_dists(X: np.ndarray, Y: np.ndarray, symmetric: bool) -> np.ndarray:
    """Squared Euclidean distances, accumulated in float64, clipped at 0.

    Both sides are first shifted by the mean of ``X`` (distances are
    translation invariant), so data far from the origin does not lose its
    small differences to the cancellation in ``|x|² + |y|² - 2 x·y``.
    """
    X64 = _f64(X)
    shift = X64.mean(axis=0) if X64.shape[0] else np.zeros(X64.shape[1])
    Xc = X64 - shift
    Yc = Xc if symmetric else _f64(Y) - shift
    xx = np.einsum("ij,ij->i", Xc, Xc)
    yy = xx if symmetric else np.einsum("ij,ij->i", Yc, Yc)
    d = Xc @ Yc.T
    d *= -2.0
    d += xx[:, None]
    d += yy[None, :]
    np.maximum(d, 0.0, out=d)
    if symmetric:
        np.fill_diagonal(d, 0.0)
    return d


def _gamma(gamma: float | None, n_features: int) -> float:
    return 1.0 / n_features if gamma is None else float(gamma)


@register
class Linear(Kernel):
    """k(x, y) = x·y."""

    name = "linear"

    def __init__(self) -> None:
        pass

    def _eval(self, X, Y, symmetric):
        return _inner(X, Y, symmetric)

    def _diag(self, X):
        return _row_sq_norms(X)


@register
class Polynomial(Kernel):
    """k(x, y) = (gamma·x·y + coef0)^degree; gamma=None means 1/n_features.

    PSD (``is_mercer``) when ``coef0 >= 0`` and ``degree`` is a whole number.
    """

    name = "polynomial"

    def __init__(self, degree: float = 3, gamma: float | None = None, coef0: float = 1.0) -> None:
        self.degree = degree
        self.gamma = gamma
        self.coef0 = coef0
        self._check_params()

    def _check_params(self) -> None:
        check_real(self, "degree", self.degree, low=0)
        check_real(self, "gamma", self.gamma, low=0, allow_none=True)
        check_real(self, "coef0", self.coef0)

    @property
    def is_mercer(self) -> bool:  # type: ignore[override]
        return self.coef0 >= 0 and float(self.degree).is_integer()

    def _eval(self, X, Y, symmetric):
        K = _inner(X, Y, symmetric)
        K *= _gamma(self.gamma, X.shape[1])
        K += self.coef0
        K **= self.degree
        return K

    def _diag(self, X):
        return (_gamma(self.gamma, X.shape[1]) * _row_sq_norms(X) + self.coef0) ** self.degree


@register
class RBF(Kernel):
    """Gaussian kernel k(x, y) = exp(-gamma·||x - y||²).

    Give either ``gamma`` or ``length_scale`` (gamma = 1 / (2·length_scale²));
    with neither, gamma = 1/n_features as in scikit-learn.
    """

    name = "rbf"

    def __init__(self, gamma: float | None = None, length_scale: float | None = None) -> None:
        self.gamma = gamma
        self.length_scale = length_scale
        self._check_params()

    def _check_params(self) -> None:
        if self.gamma is not None and self.length_scale is not None:
            raise ValueError(
                f"RBF: give gamma ({self.gamma!r}) or length_scale ({self.length_scale!r}), not both"
            )
        check_real(self, "gamma", self.gamma, low=0, allow_none=True)
        check_real(
            self, "length_scale", self.length_scale, low=0, low_inclusive=False, allow_none=True
        )

    def effective_gamma(self, n_features: int) -> float:
        """The gamma actually used for data with ``n_features`` columns."""
        if self.gamma is not None:
            return float(self.gamma)
        if self.length_scale is not None:
            return 1.0 / (2.0 * float(self.length_scale) ** 2)
        return 1.0 / n_features

    def _eval(self, X, Y, symmetric):
        D = _sq_dists(X, Y, symmetric)
        D *= -self.effective_gamma(X.shape[1])
        if X.dtype == np.float32:
            # the exponent is accumulated in float64; exp itself is faster in float32
            return np.exp(D.astype(np.float32))
        return np.exp(D, out=D)

    def _diag(self, X):
        return np.ones(X.shape[0])


#: elements per row block in the feature-wise loops (two float64 temporaries
#: of this size stay in L2 cache)
_BLOCK_ELEMS = 1 << 15


def featurewise_sum(X: np.ndarray, Y: np.ndarray, term) -> np.ndarray:
    """``D[i, j] = Σ_f term(X[i, f], Y[j, f])`` in float64, summed in feature order.

    ``term(x_col, y_row, out, tmp)`` writes the per-feature term for a block
    (``x_col`` of shape (r, 1), ``y_row`` of shape (m,)) into ``out``; ``tmp``
    is scratch of the same shape. The output is built in row blocks so the
    temporaries stay in cache and never reach the size of a tile.
    """
    X64, YT = _f64(X), np.ascontiguousarray(_f64(Y).T)
    n, m = X64.shape[0], YT.shape[1]
    D = np.zeros((n, m))
    r = max(1, _BLOCK_ELEMS // max(m, 1))
    out_buf, tmp_buf = np.empty((r, m)), np.empty((r, m))
    for s in range(0, n, r):
        acc = D[s : s + r]
        out, tmp = out_buf[: acc.shape[0]], tmp_buf[: acc.shape[0]]
        for f in range(X64.shape[1]):
            term(X64[s : s + r, f, None], YT[f], out, tmp)
            acc += out
    return D


def _abs_diff(x, y, out, tmp):
    np.subtract(x, y, out=out)
    np.abs(out, out=out)


def _l1_dists(X: np.ndarray, Y: np.ndarray) -> np.ndarray:
    """Manhattan distances in float64."""
    return featurewise_sum(X, Y, _abs_diff)


@register
class Laplacian(Kernel):
    """k(x, y) = exp(-gamma·||x - y||₁); gamma=None means 1/n_features."""

    name = "laplacian"

    def __init__(self, gamma: float | None = None) -> None:
        self.gamma = gamma
        self._check_params()

    def _check_params(self) -> None:
        check_real(self, "gamma", self.gamma, low=0, allow_none=True)

    def _eval(self, X, Y, symmetric):
        D = _l1_dists(X, Y)
        D *= -_gamma(self.gamma, X.shape[1])
        return np.exp(D, out=D)

    def _diag(self, X):
        return np.ones(X.shape[0])


@register
class Constant(Kernel):
    """k(x, y) = c, with c >= 0."""

    name = "constant"

    def __init__(self, value: float = 1.0) -> None:
        self.value = value
        self._check_params()

    def _check_params(self) -> None:
        check_real(self, "value", self.value, low=0)

    def _eval(self, X, Y, symmetric):
        return np.full((X.shape[0], Y.shape[0]), float(self.value))

    def _diag(self, X):
        return np.full(X.shape[0], float(self.value))
