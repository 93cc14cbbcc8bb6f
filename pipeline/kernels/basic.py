"""The standard kernels: linear, polynomial, RBF (Gaussian), Laplacian, constant."""

from __future__ import annotations

import numpy as np

from pipeline.kernels.base import Kernel, register


def _sq_dists(X: np.ndarray, Y: np.ndarray, symmetric: bool) -> np.ndarray:
    """Squared Euclidean distances, accumulated in float64, clipped at 0."""
    X64 = X.astype(np.float64, copy=False)
    Y64 = X64 if symmetric else Y.astype(np.float64, copy=False)
    xx = np.einsum("ij,ij->i", X64, X64)
    yy = xx if symmetric else np.einsum("ij,ij->i", Y64, Y64)
    d = X64 @ Y64.T
    d *= -2.0
    d += xx[:, None]
    d += yy[None, :]
    np.maximum(d, 0.0, out=d)
    if symmetric:
        np.fill_diagonal(d, 0.0)
    return d


def _check_positive(k: Kernel, name: str, value: float | None, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if value is None or not np.isfinite(value) or value <= 0:
        raise ValueError(
            f"{type(k).__name__}: {name} must be a positive finite number, got {value!r}"
        )


@register
class Linear(Kernel):
    """k(x, y) = x·y."""

    name = "linear"

    def __init__(self) -> None:
        pass

    def _eval(self, X, Y, symmetric):
        return X.astype(np.float64, copy=False) @ Y.astype(np.float64, copy=False).T

    def _diag(self, X):
        X64 = X.astype(np.float64, copy=False)
        return np.einsum("ij,ij->i", X64, X64)


@register
class Polynomial(Kernel):
    """k(x, y) = (gamma·x·y + coef0)^degree; gamma=None means 1/n_features."""

    name = "polynomial"

    def __init__(self, degree: float = 3, gamma: float | None = None, coef0: float = 1.0) -> None:
        self.degree = degree
        self.gamma = gamma
        self.coef0 = coef0
        self._check_params()

    def _check_params(self) -> None:
        _check_positive(self, "gamma", self.gamma, allow_none=True)
        if self.degree is None or self.degree < 0:
            raise ValueError(f"Polynomial: degree must be >= 0, got {self.degree!r}")

    def _gamma(self, X):
        return 1.0 / X.shape[1] if self.gamma is None else float(self.gamma)

    def _eval(self, X, Y, symmetric):
        K = X.astype(np.float64, copy=False) @ Y.astype(np.float64, copy=False).T
        K *= self._gamma(X)
        K += self.coef0
        return K**self.degree

    def _diag(self, X):
        X64 = X.astype(np.float64, copy=False)
        return (self._gamma(X) * np.einsum("ij,ij->i", X64, X64) + self.coef0) ** self.degree


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
        _check_positive(self, "gamma", self.gamma, allow_none=True)
        _check_positive(self, "length_scale", self.length_scale, allow_none=True)

    def effective_gamma(self, n_features: int) -> float:
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


@register
class Laplacian(Kernel):
    """k(x, y) = exp(-gamma·||x - y||₁); gamma=None means 1/n_features."""

    name = "laplacian"

    def __init__(self, gamma: float | None = None) -> None:
        self.gamma = gamma
        self._check_params()

    def _check_params(self) -> None:
        _check_positive(self, "gamma", self.gamma, allow_none=True)

    def _eval(self, X, Y, symmetric):
        g = 1.0 / X.shape[1] if self.gamma is None else float(self.gamma)
        X64 = X.astype(np.float64, copy=False)
        Y64 = Y.astype(np.float64, copy=False)
        D = np.zeros((X.shape[0], Y.shape[0]))
        # one feature at a time keeps the temporary at one tile, not tile x n_features
        for f in range(X.shape[1]):
            D += np.abs(X64[:, f, None] - Y64[None, :, f])
        D *= -g
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
        if self.value is None or not np.isfinite(self.value) or self.value < 0:
            raise ValueError(f"Constant: value must be >= 0 and finite, got {self.value!r}")

    def _eval(self, X, Y, symmetric):
        return np.full((X.shape[0], Y.shape[0]), float(self.value))

    def _diag(self, X):
        return np.full(X.shape[0], float(self.value))
