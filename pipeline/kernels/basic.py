"""The standard kernels: linear, polynomial, RBF (Gaussian), Laplacian, constant.

Conventions follow :mod:`sklearn.metrics.pairwise`: ``gamma=None`` means
``1 / n_features``, and ``gamma`` may be 0 (the same range scikit-learn's
``KernelRidge`` accepts). Inner products and distances are accumulated in
float64 whatever the input dtype.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any

import numpy as np

from pipeline.blas_guard import gram_t
from pipeline.kernels.base import Kernel, check_real, register


def _f64(X: np.ndarray) -> np.ndarray:
    return X.astype(np.float64, copy=False)


def _inner(X: np.ndarray, Y: np.ndarray, symmetric: bool) -> np.ndarray:
    """``X @ Y.T`` accumulated in float64."""
    X64 = _f64(X)
    return gram_t(X64.T) if symmetric else X64 @ _f64(Y).T  # (X Xᵀ: the SYRK guard)


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
    d = gram_t(Xc.T) if symmetric else Xc @ Yc.T  # (Xc Xcᵀ: the SYRK guard)
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


def check_length_scale(owner: Kernel, value: Any, *, allow_none: bool = False) -> None:
    """Raise ValueError unless ``value`` is a positive finite number or a non-empty 1-D
    array of them (one length scale per feature: ARD)."""
    if value is None and allow_none:
        return
    if np.ndim(value) == 0:
        v = value.item() if isinstance(value, np.ndarray) else value
        check_real(owner, "length_scale", v, low=0, low_inclusive=False, allow_none=allow_none)
        return
    who = type(owner).__name__
    try:
        a = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        a = None
    ok = (
        a is not None
        and a.ndim == 1
        and a.size > 0
        and not any(isinstance(v, bool) for v in np.asarray(value, dtype=object).ravel())
    )
    if not ok:
        raise ValueError(
            f"{who}: length_scale must be a positive number or a non-empty 1-D list of them "
            f"(one per feature), got {value!r}"
        )
    bad = a[~(np.isfinite(a) & (a > 0))]
    if bad.size:
        raise ValueError(
            f"{who}: every length_scale must be a positive finite number, got {bad[0]!r} in "
            f"length_scale={a.tolist()!r}"
        )


def is_ard(length_scale: Any) -> bool:
    """Whether ``length_scale`` is a vector (one length scale per feature)."""
    return length_scale is not None and np.ndim(length_scale) > 0


def check_ard_width(owner: Kernel, length_scale: Any, n_features: int) -> None:
    """Raise ValueError unless an ARD ``length_scale`` has one entry per feature."""
    if not is_ard(length_scale):
        return
    width = int(np.size(length_scale))
    if width != int(n_features):
        raise ValueError(
            f"{type(owner).__name__}: length_scale has {width} entries but X has "
            f"{int(n_features)} features; give one length scale per feature ({int(n_features)} "
            "values) or a single number for all of them"
        )


def inverse_length_scales(owner: Kernel, length_scale: Any, n_features: int) -> np.ndarray:
    """``1 / length_scale`` per feature (float64, shape (n_features,)) for an ARD kernel."""
    check_ard_width(owner, length_scale, n_features)
    return 1.0 / np.asarray(length_scale, dtype=np.float64)


@register
class RBF(Kernel):
    """Gaussian kernel k(x, y) = exp(-gamma·||x - y||²).

    Give either ``gamma`` or ``length_scale`` (gamma = 1 / (2·length_scale²));
    with neither, gamma = 1/n_features as in scikit-learn. ``length_scale`` may
    be a 1-D array with one entry per feature (ARD, as
    :class:`sklearn.gaussian_process.kernels.RBF`):
    k(x, y) = exp(-||(x - y) / length_scale||² / 2).
    """

    name = "rbf"

    def __init__(self, gamma: float | None = None, length_scale: Any = None) -> None:
        self.gamma = gamma
        self.length_scale = length_scale
        self._check_params()

    def _check_params(self) -> None:
        if self.gamma is not None and self.length_scale is not None:
            raise ValueError(
                f"RBF: give gamma ({self.gamma!r}) or length_scale ({self.length_scale!r}), not both"
            )
        check_real(self, "gamma", self.gamma, low=0, allow_none=True)
        check_length_scale(self, self.length_scale, allow_none=True)

    @property
    def ard(self) -> bool:
        """Whether ``length_scale`` is a per-feature vector (no single gamma then)."""
        return is_ard(self.length_scale)

    def check_n_features(self, n_features: int) -> None:
        check_ard_width(self, self.length_scale, n_features)

    def effective_gamma(self, n_features: int) -> float:
        """The gamma actually used for data with ``n_features`` columns.

        Raises ValueError for an ARD kernel (one length scale per feature: no single gamma).
        """
        if self.ard:
            raise ValueError(
                f"RBF(length_scale={self.length_scale!r}) has one length scale per feature "
                "(ARD), so no single gamma; use inverse_length_scales"
            )
        if self.gamma is not None:
            return float(self.gamma)
        if self.length_scale is not None:
            return 1.0 / (2.0 * float(self.length_scale) ** 2)
        return 1.0 / n_features

    def _eval(self, X, Y, symmetric):
        if self.ard:
            w = inverse_length_scales(self, self.length_scale, X.shape[1])
            D = _sq_dists(_f64(X) * w, None if symmetric else _f64(Y) * w, symmetric)
            D *= -0.5
        else:
            D = _sq_dists(X, Y, symmetric)
            D *= -self.effective_gamma(X.shape[1])
        if X.dtype == np.float32:
            # the exponent is accumulated in float64; exp itself is faster in float32
            return np.exp(D.astype(np.float32))
        return np.exp(D, out=D)

    def _diag(self, X):
        self.check_n_features(X.shape[1])
        return np.ones(X.shape[0])


#: the Matérn smoothness values with a closed form, and their sqrt(2 nu)
MATERN_NUS = {0.5: 1.0, 1.5: math.sqrt(3.0), 2.5: math.sqrt(5.0)}


def matern_from_scaled_dists(
    T: np.ndarray,
    nu: float,
    S: np.ndarray | None = None,
    exp: Callable[[np.ndarray], np.ndarray] | None = None,
) -> np.ndarray:
    """The Matérn kernel in place from ``T = sqrt(2 nu)·r`` (r the scaled distance).

    nu = 0.5: exp(-t); 1.5: (1 + t)·exp(-t); 2.5: (1 + t·(1 + t/3))·exp(-t).
    ``S`` is scratch of ``T``'s shape (overwritten; nu = 1.5 and 2.5 use it): no
    other temporaries, so the fused evaluators call this on cache-sized blocks.
    ``exp(A)`` computes ``exp`` of ``A`` in place (default ``np.exp``; the fused
    evaluators pass the engine's own).
    """
    if exp is None:
        exp = _np_exp_inplace
    if nu == 0.5:
        np.negative(T, out=T)
        return exp(T)
    if S is None:
        S = np.empty_like(T)
    if nu == 2.5:
        np.multiply(T, 1.0 / 3.0, out=S)
        S += 1.0
        S *= T
        S += 1.0  # S = 1 + t + t²/3
        np.negative(T, out=T)
        exp(T)
        T *= S
        return T
    np.negative(T, out=S)
    exp(S)  # S = exp(-t)
    T += 1.0
    T *= S
    return T


def _np_exp_inplace(a: np.ndarray) -> np.ndarray:
    return np.exp(a, out=a)


@register
class Matern(Kernel):
    """Matérn kernel with smoothness ``nu`` in {0.5, 1.5, 2.5}, as
    :class:`sklearn.gaussian_process.kernels.Matern`.

    With r = ||(x - y) / length_scale||: nu = 0.5 gives exp(-r) (the exponential
    kernel), 1.5 gives (1 + √3 r)·exp(-√3 r), 2.5 gives (1 + √5 r + 5r²/3)·exp(-√5 r).
    ``length_scale`` is a positive number or a 1-D array with one entry per
    feature (ARD). Other ``nu`` have no closed form here: nu -> inf is
    :class:`RBF`.
    """

    name = "matern"

    def __init__(self, nu: float = 1.5, length_scale: Any = 1.0) -> None:
        self.nu = nu
        self.length_scale = length_scale
        self._check_params()

    def _check_params(self) -> None:
        nu = self.nu
        ok = isinstance(nu, numbers.Real) and not isinstance(nu, bool) and nu in MATERN_NUS
        if not ok:
            raise ValueError(
                f"Matern: nu must be 0.5, 1.5 or 2.5 (the smoothness values with a closed "
                f"form), got nu={nu!r}; use one of them, or kernel='rbf' for nu = inf"
            )
        check_length_scale(self, self.length_scale)

    @property
    def ard(self) -> bool:
        """Whether ``length_scale`` is a per-feature vector."""
        return is_ard(self.length_scale)

    def check_n_features(self, n_features: int) -> None:
        check_ard_width(self, self.length_scale, n_features)

    def scaled_rows(self, X: np.ndarray) -> tuple[np.ndarray, float]:
        """``(X', c)``: the rows in float64 with per-feature scaling applied (ARD), and the
        factor ``c`` with ``sqrt(2 nu)·r = c·||x' - y'||``."""
        c = MATERN_NUS[float(self.nu)]
        if self.ard:
            return _f64(X) * inverse_length_scales(self, self.length_scale, X.shape[1]), c
        return _f64(X), c / float(self.length_scale)

    def _eval(self, X, Y, symmetric):
        Xs, c = self.scaled_rows(X)
        Ys = None if symmetric else self.scaled_rows(Y)[0]
        T = _sq_dists(Xs, Ys, symmetric)
        np.sqrt(T, out=T)
        T *= c
        return matern_from_scaled_dists(T, float(self.nu))

    def _diag(self, X):
        self.check_n_features(X.shape[1])
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
