"""Kernels built from kernels: the closure rules that keep a kernel PSD.

- ``Scaled(k, a)``: a·k(x, y) with a >= 0 (also ``a * k``);
- ``Sum(k1, k2)``: k1 + k2 (also ``k1 + k2``);
- ``Product(k1, k2)``: k1·k2 (also ``k1 * k2``);
- ``Warped(k, f)``: k(f(x), f(y)) for an input warping f;
- ``FunctionScaled(k, f)``: f(x)·k(x, y)·f(y) for a real function f;
- ``Normalized(k)``: k(x, y) / sqrt(k(x, x)·k(y, y)) (cosine normalisation);
- ``Exp(k, scale)``: exp(scale·k(x, y)) with scale >= 0.

``f`` is a registered warping from :mod:`pipeline.kernels.warping` (serialisable)
or any Python callable (in memory only: ``to_spec`` then raises TypeError).
Each of these is PSD when its parts are (``is_mercer`` answers per instance).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from pipeline.kernels.base import Kernel, check_real, register
from pipeline.kernels.warping import Warping


def _check_kernel(owner: Kernel, name: str, value: Any) -> None:
    if not isinstance(value, Kernel):
        raise TypeError(
            f"{type(owner).__name__}: {name} must be a Kernel (see pipeline.kernels), got {value!r}"
        )


def _check_callable(owner: Kernel, name: str, value: Any) -> None:
    if not callable(value):
        raise TypeError(
            f"{type(owner).__name__}: {name} must be a warping from "
            f"pipeline.kernels.warping or a callable, got {value!r}"
        )


def _child_mercer(k: Any) -> bool:
    return bool(getattr(k, "is_mercer", False))


@register
class Scaled(Kernel):
    """a·k(x, y) with a weight ``a >= 0`` (a negative weight breaks PSD)."""

    name = "scaled"

    def __init__(self, kernel: Kernel, weight: float = 1.0) -> None:
        self.kernel = kernel
        self.weight = weight
        self._check_params()

    def _check_params(self) -> None:
        _check_kernel(self, "kernel", self.kernel)
        check_real(self, "weight", self.weight, low=0)

    @property
    def is_mercer(self) -> bool:  # type: ignore[override]
        return _child_mercer(self.kernel)

    def _eval(self, X, Y, symmetric):
        K = self.kernel._eval(X, Y, symmetric)
        K *= self.weight
        return K

    def _diag(self, X):
        return float(self.weight) * np.asarray(self.kernel._diag(X), dtype=np.float64)


class _Binary(Kernel):
    """k1 ∘ k2 for an elementwise operator ``_op`` (a numpy ufunc)."""

    _op: ClassVar[np.ufunc]

    def __init__(self, k1: Kernel, k2: Kernel) -> None:
        self.k1 = k1
        self.k2 = k2
        self._check_params()

    def _check_params(self) -> None:
        _check_kernel(self, "k1", self.k1)
        _check_kernel(self, "k2", self.k2)

    @property
    def is_mercer(self) -> bool:  # type: ignore[override]
        return _child_mercer(self.k1) and _child_mercer(self.k2)

    def _eval(self, X, Y, symmetric):
        K = self.k1._eval(X, Y, symmetric)
        K2 = self.k2._eval(X, Y, symmetric)
        if K.dtype != np.result_type(K, K2):
            return self._op(K, K2)
        return self._op(K, K2, out=K)  # in place when the dtype allows

    def _diag(self, X):
        return self._op(np.asarray(self.k1._diag(X), dtype=np.float64), self.k2._diag(X))


@register
class Sum(_Binary):
    """k1(x, y) + k2(x, y)."""

    name = "sum"
    _op = np.add


@register
class Product(_Binary):
    """k1(x, y)·k2(x, y) (elementwise; the Schur product theorem keeps PSD)."""

    name = "product"
    _op = np.multiply


def _warp(f: Callable, X: np.ndarray, owner: Kernel) -> np.ndarray:
    Z = np.asarray(f(X))
    if Z.ndim != 2 or Z.shape[0] != X.shape[0]:
        raise ValueError(
            f"{type(owner).__name__}: the warping {f!r} must map ({X.shape[0]}, n_features) "
            f"to ({X.shape[0]}, n_out), got shape {Z.shape}"
        )
    if not np.issubdtype(Z.dtype, np.floating):
        Z = Z.astype(np.float64)
    return Z


def _values(f: Callable, X: np.ndarray, owner: Kernel) -> np.ndarray:
    v = np.asarray(f(X), dtype=np.float64)
    if v.ndim == 2 and v.shape[1] == 1:
        v = v[:, 0]
    if v.shape != (X.shape[0],):
        raise ValueError(
            f"{type(owner).__name__}: the function {f!r} must map ({X.shape[0]}, n_features) "
            f"to ({X.shape[0]},) values, got shape {v.shape}"
        )
    return v


@register
class Warped(Kernel):
    """k(f(x), f(y)) for an input warping ``f: (n, d) -> (n, d')``.

    ``f`` is evaluated in float64 when it holds float64 parameters (e.g.
    :class:`~pipeline.kernels.warping.Standardize`); the result dtype still
    follows the inputs.
    """

    name = "warped"

    def __init__(self, kernel: Kernel, f: Callable) -> None:
        self.kernel = kernel
        self.f = f
        self._check_params()

    def _check_params(self) -> None:
        _check_kernel(self, "kernel", self.kernel)
        _check_callable(self, "f", self.f)

    @property
    def is_mercer(self) -> bool:  # type: ignore[override]
        return _child_mercer(self.kernel)

    def _eval(self, X, Y, symmetric):
        FX = _warp(self.f, X, self)
        FY = FX if symmetric else _warp(self.f, Y, self)
        if FY.dtype != FX.dtype:
            FX = FX.astype(np.float64)
            FY = FY.astype(np.float64)
        if FY.shape[1] != FX.shape[1]:
            raise ValueError(
                f"{type(self).__name__}: f gave {FX.shape[1]} and {FY.shape[1]} columns"
            )
        return self.kernel._eval(FX, FY, symmetric)

    def check_n_features(self, n_features: int) -> None:
        """The inner kernel sees the warped features: their number is known for a
        registered warping (applied to one zero row), not for an arbitrary callable."""
        if not isinstance(self.f, Warping):
            return
        with np.errstate(all="ignore"):
            width = _warp(self.f, np.zeros((1, int(n_features))), self).shape[1]
        self.kernel.check_n_features(width)

    def _diag(self, X):
        return self.kernel._diag(_warp(self.f, X, self))


@register
class FunctionScaled(Kernel):
    """f(x)·k(x, y)·f(y) for a real function ``f: (n, d) -> (n,)``.

    With ``f(x) = 1/sqrt(k(x, x))`` this is cosine normalisation
    (:class:`Normalized`); with ``f(x) = exp(-gamma·|x|²)`` and
    ``k = Exp(Linear(), 2·gamma)`` it is the RBF kernel.
    """

    name = "function_scaled"

    def __init__(self, kernel: Kernel, f: Callable) -> None:
        self.kernel = kernel
        self.f = f
        self._check_params()

    def _check_params(self) -> None:
        _check_kernel(self, "kernel", self.kernel)
        _check_callable(self, "f", self.f)

    @property
    def is_mercer(self) -> bool:  # type: ignore[override]
        return _child_mercer(self.kernel)

    def _eval(self, X, Y, symmetric):
        fx = _values(self.f, X, self)
        fy = fx if symmetric else _values(self.f, Y, self)
        K = self.kernel._eval(X, Y, symmetric)
        if K.dtype == np.float32:
            fx, fy = fx.astype(np.float32), fy.astype(np.float32)
        K *= fx[:, None]
        K *= fy[None, :]
        return K

    def _diag(self, X):
        fx = _values(self.f, X, self)
        return fx * fx * self.kernel._diag(X)


def _rsqrt_diag(owner: Kernel, d: np.ndarray) -> np.ndarray:
    d = np.asarray(d, dtype=np.float64)
    if d.size and not (d.min() >= 0):  # also catches NaN
        raise ValueError(
            f"{type(owner).__name__}: cosine normalisation needs k(x, x) >= 0, "
            f"but {type(owner.kernel).__name__} gives k(x, x) = {d.min()!r}"
        )
    out = np.zeros_like(d)
    pos = d > 0
    out[pos] = 1.0 / np.sqrt(d[pos])
    return out


@register
class Normalized(Kernel):
    """Cosine normalisation k(x, y) / sqrt(k(x, x)·k(y, y)), from ``kernel.diag``.

    A point with k(x, x) = 0 gives 0 (for a PSD kernel k(x, y) is then 0
    too), as scikit-learn's cosine kernel does for zero rows.
    ``Normalized(Linear())`` is the cosine kernel.
    """

    name = "normalized"

    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel
        self._check_params()

    def _check_params(self) -> None:
        _check_kernel(self, "kernel", self.kernel)

    @property
    def is_mercer(self) -> bool:  # type: ignore[override]
        return _child_mercer(self.kernel)

    def _eval(self, X, Y, symmetric):
        rx = _rsqrt_diag(self, self.kernel._diag(X))
        ry = rx if symmetric else _rsqrt_diag(self, self.kernel._diag(Y))
        K = np.asarray(self.kernel._eval(X, Y, symmetric), dtype=np.float64)
        K *= rx[:, None]
        K *= ry[None, :]
        return K

    def _diag(self, X):
        d = np.asarray(self.kernel._diag(X), dtype=np.float64)
        _rsqrt_diag(self, d)
        return (d > 0).astype(np.float64)


@register
class Exp(Kernel):
    """exp(scale·k(x, y)) with ``scale >= 0`` (PSD when k is: a limit of sums of products)."""

    name = "exp"

    def __init__(self, kernel: Kernel, scale: float = 1.0) -> None:
        self.kernel = kernel
        self.scale = scale
        self._check_params()

    def _check_params(self) -> None:
        _check_kernel(self, "kernel", self.kernel)
        check_real(self, "scale", self.scale, low=0)

    @property
    def is_mercer(self) -> bool:  # type: ignore[override]
        return _child_mercer(self.kernel)

    def _eval(self, X, Y, symmetric):
        K = np.asarray(self.kernel._eval(X, Y, symmetric), dtype=np.float64)
        K *= self.scale
        return np.exp(K, out=K)

    def _diag(self, X):
        return np.exp(float(self.scale) * np.asarray(self.kernel._diag(X), dtype=np.float64))
