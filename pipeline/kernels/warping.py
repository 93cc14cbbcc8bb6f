"""Named, serialisable input warpings and real functions for kernel composition.

Two kinds of callables, both :class:`Warping` objects:

- *input warpings* map ``(n, d) -> (n, d')``, for :class:`~pipeline.kernels.Warped`
  (``k(f(x), f(y))``): :class:`Standardize`, :class:`LinearMap`,
  :class:`SelectFeatures`, :class:`ElementwiseScale`, :class:`L2Normalize`,
  :class:`Chain`;
- *real functions* map ``(n, d) -> (n,)``, for
  :class:`~pipeline.kernels.FunctionScaled` (``f(x)·k(x, y)·f(y)``):
  :class:`RowNorm`, :class:`InverseRowNorm`, :class:`GaussianEnvelope`,
  :class:`Coordinate`.

A warping serialises to ``{"name": ..., "kind": "warping", "params": {...}}``
(arrays as nested lists) and comes back through :func:`warping_from_spec`, a
registry lookup: no ``eval``, no ``pickle``. An arbitrary Python callable can
be used in memory, but a kernel holding one cannot be serialised: ``to_spec``
raises TypeError.

Parameters are stored as given (scikit-learn convention) and converted to
float64 arrays at call time; they are validated when set.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from pipeline.kernels.base import (
    SPEC_READERS,
    WARPING_NAMES,
    Parametrized,
    _from_spec_value,
    check_real,
    check_spec_keys,
    registered_names,
)

_WARPINGS: dict[str, type[Warping]] = {}


def register_warping(cls: type[Warping]) -> type[Warping]:
    """Class decorator: make a warping constructible from its spec name."""
    if cls.name in _WARPINGS and _WARPINGS[cls.name] is not cls:
        raise ValueError(f"warping name {cls.name!r} registered twice")
    if cls.name in registered_names():
        raise ValueError(f"warping name {cls.name!r} is already a kernel name")
    _WARPINGS[cls.name] = cls
    WARPING_NAMES.add(cls.name)
    return cls


def registered_warpings() -> list[str]:
    """Names accepted by :func:`warping_from_spec` (sorted)."""
    return sorted(_WARPINGS)


class Warping(Parametrized):
    """Base class: ``f(X) -> ndarray``; subclasses set ``name`` and implement ``_apply``."""

    name: ClassVar[str] = "warping"
    #: "input" maps (n, d) -> (n, d'); "function" maps (n, d) -> (n,)
    output: ClassVar[str] = "input"

    def __call__(self, X: Any) -> np.ndarray:
        X = np.asarray(X)
        if X.ndim != 2:
            raise ValueError(
                f"{type(self).__name__} takes 2-D input (n_samples, n_features), got {X.shape}"
            )
        return self._apply(X.astype(np.float64, copy=False))

    def _apply(self, X: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def to_spec(self) -> dict[str, Any]:
        """``{"name": ..., "kind": "warping", "params": {...}}``, JSON-able."""
        return {"name": self.name, "kind": "warping", "params": self._spec_params()}


def warping_from_spec(spec: dict[str, Any]) -> Warping:
    """Rebuild a warping from :meth:`Warping.to_spec` output (registry lookup, no eval)."""
    if not isinstance(spec, dict) or "name" not in spec:
        raise ValueError(f"a warping spec is a dict with 'name' and 'params', got {spec!r}")
    name = spec["name"]
    if name not in _WARPINGS:
        raise ValueError(
            f"unknown warping or kernel {name!r} in spec; known warpings: "
            f"{registered_warpings()}; known kernels: "
            f"{registered_names()}"
        )
    cls = _WARPINGS[name]
    check_spec_keys(spec, "warping", also=("kind",))
    params = spec.get("params", {}) or {}
    unknown = sorted(set(params) - set(cls._param_names()))
    if unknown:
        raise ValueError(
            f"warping {name!r} does not take parameters {unknown}; "
            f"valid parameters are {cls._param_names()}"
        )
    return cls(**{k: _from_spec_value(v) for k, v in params.items()})


SPEC_READERS["warping"] = warping_from_spec

# -- validation helpers -------------------------------------------------------


def _vector(owner: Any, name: str, value: Any, *, positive: bool = False) -> np.ndarray:
    try:
        a = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(
            f"{type(owner).__name__}: {name} must be a 1-D array of numbers, got {value!r}"
        ) from None
    if a.ndim != 1 or a.size == 0:
        raise ValueError(
            f"{type(owner).__name__}: {name} must be a non-empty 1-D array, got shape {a.shape}"
        )
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{type(owner).__name__}: {name} must be finite, got {value!r}")
    if positive and np.any(a <= 0):
        raise ValueError(
            f"{type(owner).__name__}: {name} must be > 0 everywhere, got {a[a <= 0][0]!r}"
        )
    return a


def _check_width(owner: Any, X: np.ndarray, width: int, what: str) -> None:
    if X.shape[1] != width:
        raise ValueError(
            f"{type(owner).__name__}: X has {X.shape[1]} features but {what} has {width}"
        )


# -- input warpings (n, d) -> (n, d') ------------------------------------------


@register_warping
class Standardize(Warping):
    """(x - mean) / scale, per feature, with stored ``mean`` and ``scale`` (> 0) arrays.

    :meth:`from_data` fits them like scikit-learn's ``StandardScaler``.
    """

    name = "standardize"

    def __init__(self, mean: Any, scale: Any) -> None:
        self.mean = mean
        self.scale = scale
        self._check_params()

    def _check_params(self) -> None:
        m = _vector(self, "mean", self.mean)
        s = _vector(self, "scale", self.scale, positive=True)
        if m.shape != s.shape:
            raise ValueError(
                f"Standardize: mean has {m.size} entries but scale has {s.size}; they must match"
            )

    @classmethod
    def from_data(cls, X: Any) -> Standardize:
        """Mean and population standard deviation of ``X`` (0 -> 1, as StandardScaler)."""
        X = np.asarray(X, dtype=np.float64)
        scale = X.std(axis=0)
        scale[scale == 0] = 1.0
        return cls(X.mean(axis=0), scale)

    def _apply(self, X):
        mean = np.asarray(self.mean, dtype=np.float64)
        _check_width(self, X, mean.size, "mean")
        return (X - mean) / np.asarray(self.scale, dtype=np.float64)


@register_warping
class LinearMap(Warping):
    """x @ matrix + offset: projections, whitening, Mahalanobis-type metrics.

    ``matrix`` has shape (n_features, n_out); ``offset`` (length n_out) is optional.
    """

    name = "linear_map"

    def __init__(self, matrix: Any, offset: Any = None) -> None:
        self.matrix = matrix
        self.offset = offset
        self._check_params()

    def _check_params(self) -> None:
        try:
            A = np.asarray(self.matrix, dtype=np.float64)
        except (TypeError, ValueError):
            raise ValueError(
                f"LinearMap: matrix must be a 2-D array, got {self.matrix!r}"
            ) from None
        if A.ndim != 2 or A.size == 0 or not np.all(np.isfinite(A)):
            raise ValueError(
                f"LinearMap: matrix must be a finite, non-empty 2-D array, got shape {A.shape}"
            )
        if self.offset is not None:
            b = _vector(self, "offset", self.offset)
            if b.size != A.shape[1]:
                raise ValueError(
                    f"LinearMap: offset has {b.size} entries but matrix has {A.shape[1]} columns"
                )

    def _apply(self, X):
        A = np.asarray(self.matrix, dtype=np.float64)
        _check_width(self, X, A.shape[0], "matrix (rows)")
        Z = X @ A
        if self.offset is not None:
            Z += np.asarray(self.offset, dtype=np.float64)
        return Z


@register_warping
class SelectFeatures(Warping):
    """Keep the listed feature columns (0-based indices, in the given order)."""

    name = "select_features"

    def __init__(self, indices: Any) -> None:
        self.indices = indices
        self._check_params()

    def _check_params(self) -> None:
        idx = np.asarray(self.indices)
        if idx.ndim != 1 or idx.size == 0 or not np.issubdtype(idx.dtype, np.integer):
            raise ValueError(
                f"SelectFeatures: indices must be a non-empty list of ints, got {self.indices!r}"
            )
        if idx.min() < 0:
            raise ValueError(f"SelectFeatures: indices must be >= 0, got {int(idx.min())}")

    def _apply(self, X):
        idx = np.asarray(self.indices, dtype=np.intp)
        if idx.max() >= X.shape[1]:
            raise ValueError(
                f"SelectFeatures: index {int(idx.max())} is out of range for {X.shape[1]} features"
            )
        return X[:, idx]


@register_warping
class ElementwiseScale(Warping):
    """x * scale, per feature (e.g. ``1 / length_scales`` for an ARD kernel)."""

    name = "elementwise_scale"

    def __init__(self, scale: Any) -> None:
        self.scale = scale
        self._check_params()

    def _check_params(self) -> None:
        _vector(self, "scale", self.scale)

    def _apply(self, X):
        s = np.asarray(self.scale, dtype=np.float64)
        _check_width(self, X, s.size, "scale")
        return X * s


@register_warping
class L2Normalize(Warping):
    """x / ||x||₂ per row; an all-zero row stays zero."""

    name = "l2_normalize"

    def __init__(self) -> None:
        pass

    def _apply(self, X):
        n = np.sqrt(np.einsum("ij,ij->i", X, X))
        n[n == 0] = 1.0
        return X / n[:, None]


@register_warping
class Chain(Warping):
    """Apply the input warpings in ``steps`` one after another."""

    name = "chain"

    def __init__(self, steps: list) -> None:
        self.steps = steps
        self._check_params()

    def _check_params(self) -> None:
        if not isinstance(self.steps, list | tuple) or not self.steps:
            raise ValueError(
                f"Chain: steps must be a non-empty list of warpings, got {self.steps!r}"
            )
        for s in self.steps:
            if not callable(s):
                raise ValueError(f"Chain: every step must be a warping or callable, got {s!r}")

    def _apply(self, X):
        for s in self.steps:
            X = np.asarray(s(X), dtype=np.float64)
        return X


# -- real functions (n, d) -> (n,) --------------------------------------------


@register_warping
class RowNorm(Warping):
    """f(x) = ||x||₂."""

    name = "row_norm"
    output = "function"

    def __init__(self) -> None:
        pass

    def _apply(self, X):
        return np.sqrt(np.einsum("ij,ij->i", X, X))


@register_warping
class InverseRowNorm(Warping):
    """f(x) = 1 / ||x||₂, and 0 for x = 0: ``FunctionScaled(Linear(), InverseRowNorm())`` is cosine."""

    name = "inverse_row_norm"
    output = "function"

    def __init__(self) -> None:
        pass

    def _apply(self, X):
        n = np.sqrt(np.einsum("ij,ij->i", X, X))
        out = np.zeros_like(n)
        out[n > 0] = 1.0 / n[n > 0]
        return out


@register_warping
class GaussianEnvelope(Warping):
    """f(x) = exp(-gamma·||x||²).

    ``FunctionScaled(Exp(Linear(), 2·gamma), GaussianEnvelope(gamma))`` is
    ``RBF(gamma)`` (the seed's factorisation of the Gaussian kernel); the
    factorised form overflows for large ``gamma·||x||²``, so use :class:`RBF`
    in practice.
    """

    name = "gaussian_envelope"
    output = "function"

    def __init__(self, gamma: float = 1.0) -> None:
        self.gamma = gamma
        self._check_params()

    def _check_params(self) -> None:
        check_real(self, "gamma", self.gamma, low=0)

    def _apply(self, X):
        return np.exp(-float(self.gamma) * np.einsum("ij,ij->i", X, X))


@register_warping
class Coordinate(Warping):
    """f(x) = x[index]: sum of ``FunctionScaled(Constant(1), Coordinate(i))`` over i is linear."""

    name = "coordinate"
    output = "function"

    def __init__(self, index: int = 0) -> None:
        self.index = index
        self._check_params()

    def _check_params(self) -> None:
        if (
            not isinstance(self.index, int | np.integer)
            or isinstance(self.index, bool)
            or self.index < 0
        ):
            raise ValueError(f"Coordinate: index must be an int >= 0, got {self.index!r}")

    def _apply(self, X):
        if self.index >= X.shape[1]:
            raise ValueError(
                f"Coordinate: index {self.index} is out of range for {X.shape[1]} features"
            )
        return X[:, int(self.index)].copy()
