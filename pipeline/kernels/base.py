"""Kernel objects: ``k(X, Y=None)``, ``k.diag(X)``, get/set params, dict specs.

numpy only: this layer never imports dask or zarr.

A spec is a plain JSON-able dict ``{"name": ..., "params": {...}}``. Nested
kernels and input warpings (:mod:`pipeline.kernels.warping`) appear in
``params`` as their own specs; they are rebuilt through name registries, never
with ``eval`` or ``pickle``.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import numbers
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from pipeline.errors import NonFiniteKernelError  # noqa: F401 (its old home)

_REGISTRY: dict[str, type[Kernel]] = {}
#: readers of the nested specs that are not kernels, by kind: :mod:`pipeline.kernels.warping`
#: adds ``"warping"`` (its ``warping_from_spec``) when it loads; it imports this module
SPEC_READERS: dict[str, Callable[[dict[str, Any]], Any]] = {}
#: the warpings' names, one spec namespace with the kernels': :mod:`pipeline.kernels.warping`
#: adds each warping it registers (a kernel may not take one, nor a warping a kernel's)
WARPING_NAMES: set[str] = set()


def register(cls: type[Kernel]) -> type[Kernel]:
    """Class decorator: make a kernel constructible from its spec name."""
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise ValueError(f"kernel name {cls.name!r} registered twice")
    if cls.name in WARPING_NAMES:
        raise ValueError(f"kernel name {cls.name!r} is already a warping name")
    _REGISTRY[cls.name] = cls
    return cls


def registered_names() -> list[str]:
    """Names accepted by :func:`kernel_from_spec` (sorted)."""
    return sorted(_REGISTRY)


def result_dtype(X: Any, Y: Any = None) -> np.dtype:
    """float32 only when every input is float32, else float64."""
    dts = [_dtype_of(X)] + ([] if Y is None else [_dtype_of(Y)])
    return np.dtype(np.float32) if all(d == np.float32 for d in dts) else np.dtype(np.float64)


def _dtype_of(X: Any) -> np.dtype:
    dt = getattr(X, "dtype", None)
    return np.dtype(dt) if dt is not None else np.asarray(X).dtype


def as_2d(X: Any, dtype: np.dtype) -> np.ndarray:
    """``X`` as a 2-D array of ``dtype`` (scipy sparse matrices are densified)."""
    if hasattr(X, "toarray") and hasattr(X, "nnz"):
        X = X.toarray()
    X = np.asarray(X)
    if X.ndim != 2:
        raise ValueError(f"kernel inputs must be 2-D (n_samples, n_features), got shape {X.shape}")
    return X.astype(dtype, copy=False)


def check_real(
    owner: Any,
    name: str,
    value: Any,
    *,
    low: float | None = None,
    low_inclusive: bool = True,
    allow_none: bool = False,
) -> None:
    """Raise ValueError naming ``value`` unless it is a finite real number in range."""
    if value is None and allow_none:
        return
    who = type(owner).__name__
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
    ok = ok and bool(np.isfinite(value))
    if ok and low is not None:
        ok = value >= low if low_inclusive else value > low
    if not ok:
        if low is None:
            rng = "a finite real number"
        elif low == 0 and not low_inclusive:
            rng = "a positive finite number"
        else:
            rng = f"a finite number {'>=' if low_inclusive else '>'} {low:g}"
        none = " or None" if allow_none else ""
        raise ValueError(f"{who}: {name} must be {rng}{none}, got {value!r}")


def _param_state(obj: Any) -> list[tuple[Any, dict[str, Any]]]:
    """``obj`` and every parametrized object nested in it, each with its parameters'
    current values (the objects themselves, not copies)."""
    values = {n: getattr(obj, n) for n in obj._param_names()}
    out = [(obj, values)]
    for v in values.values():
        if hasattr(v, "_param_names") and not isinstance(v, type):
            out += _param_state(v)
    return out


class Parametrized:
    """scikit-learn style parameters: the keyword arguments of ``__init__``.

    Each parameter is stored unchanged under its own attribute name (so
    ``sklearn.base.clone`` works); conversions happen at evaluation time.
    """

    @classmethod
    def _param_names(cls) -> list[str]:
        sig = inspect.signature(cls.__init__)
        return [
            p.name
            for p in sig.parameters.values()
            if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """Parameters by name; with ``deep``, nested ones as ``outer__inner``."""
        params = {n: getattr(self, n) for n in self._param_names()}
        if deep:
            for n, v in list(params.items()):
                if hasattr(v, "get_params") and not isinstance(v, type):
                    for sub, sv in v.get_params(deep=True).items():
                        params[f"{n}__{sub}"] = sv
        return params

    def set_params(self, **params: Any) -> Parametrized:
        """Set parameters (``outer__inner`` for nested ones) and validate.

        On a ValueError the previous values are restored.
        """
        valid = self._param_names()
        nested: dict[str, dict[str, Any]] = {}
        direct: dict[str, Any] = {}
        for key, value in params.items():
            head, _, sub = key.partition("__")
            if head not in valid:
                raise ValueError(
                    f"invalid parameter {head!r} for {type(self).__name__}; "
                    f"valid parameters are {valid}"
                )
            if sub:
                nested.setdefault(head, {})[sub] = value
            else:
                direct[head] = value
        saved = _param_state(self)  # every (object, its parameters), nested ones too
        try:
            for n, v in direct.items():
                setattr(self, n, v)
            self._check_params()
            for head, sub_params in nested.items():
                inner = getattr(self, head)
                if not hasattr(inner, "set_params"):
                    raise ValueError(
                        f"parameter {head!r} of {type(self).__name__} is {inner!r}, "
                        f"which has no nested parameters {sorted(sub_params)}"
                    )
                inner.set_params(**sub_params)
            self._check_params()
        except (ValueError, TypeError):
            for obj, values in saved:  # the same objects, their old values
                for n, v in values.items():
                    setattr(obj, n, v)
            raise
        return self

    def _check_params(self) -> None:
        """Validate parameters; raise ValueError naming the bad value."""

    def _spec_params(self) -> dict[str, Any]:
        return {n: _to_spec_value(getattr(self, n), n, self) for n in self._param_names()}

    def __repr__(self) -> str:
        args = ", ".join(f"{n}={getattr(self, n)!r}" for n in self._param_names())
        return f"{type(self).__name__}({args})"

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if type(self) is not type(other):
            return False
        try:
            return self.to_spec() == other.to_spec()  # type: ignore[attr-defined]
        except TypeError:  # holds an in-memory callable: identity only
            return False

    def __hash__(self) -> int:
        try:
            return hash(repr(self.to_spec()))  # type: ignore[attr-defined]
        except TypeError:
            return id(self)


class Kernel(Parametrized):
    """Base class. Subclasses set ``name`` and implement ``_eval`` (and ``_diag``).

    Parameters are the keyword arguments of ``__init__``, stored under the same
    attribute names (the scikit-learn convention), so ``get_params``,
    ``set_params`` and ``to_spec`` work without per-kernel code.

    ``_eval(X, Y, symmetric)`` receives 2-D arrays already cast to the result
    dtype (float32 iff all inputs are float32, else float64) and must return a
    *new* array: compositions modify it in place. ``symmetric`` is True when
    the caller passed ``Y=None`` (then ``Y is X``).
    """

    name: ClassVar[str] = "kernel"
    #: True if the kernel is PSD for every valid parameter setting (instances of
    #: compositions and :class:`~pipeline.kernels.Polynomial` answer per setting)
    is_mercer: ClassVar[bool] = True

    # -- evaluation ---------------------------------------------------------
    def __call__(self, X: Any, Y: Any = None) -> np.ndarray:
        """The kernel matrix ``K[i, j] = k(X[i], Y[j])`` (``Y=None`` means ``X``)."""
        dt = result_dtype(X, Y)
        X = as_2d(X, dt)
        Yv = X if Y is None else as_2d(Y, dt)
        if Yv.shape[1] != X.shape[1]:
            raise ValueError(
                f"X has {X.shape[1]} features but Y has {Yv.shape[1]}; they must match"
            )
        out = self._eval(X, Yv, Y is None)
        return np.asarray(out, dtype=dt)

    def diag(self, X: Any) -> np.ndarray:
        """``k(X[i], X[i])`` for every row, without forming the matrix."""
        dt = result_dtype(X)
        return np.asarray(self._diag(as_2d(X, dt)), dtype=dt)

    def check_n_features(self, n_features: int) -> None:
        """Raise ValueError if a per-feature parameter does not fit ``n_features`` columns.

        An ARD length-scale vector (:class:`~pipeline.kernels.RBF`,
        :class:`~pipeline.kernels.Matern`) must have one entry per feature. Nested
        kernels are checked too. The estimators and the fit plan call this before
        any kernel evaluation, so a wrong width fails before any work.
        """
        for n in self._param_names():
            v = getattr(self, n)
            for part in v if isinstance(v, list | tuple) else (v,):
                if isinstance(part, Kernel):
                    part.check_n_features(n_features)

    def _eval(self, X: np.ndarray, Y: np.ndarray, symmetric: bool) -> np.ndarray:
        raise NotImplementedError

    def _diag(self, X: np.ndarray) -> np.ndarray:
        # fallback: diagonal blocks, never the full n x n matrix
        out = np.empty(X.shape[0])
        step = 256
        for s in range(0, X.shape[0], step):
            xb = X[s : s + step]
            out[s : s + step] = np.diagonal(self._eval(xb, xb, True))
        return out

    # -- serialisation ------------------------------------------------------
    def to_spec(self) -> dict[str, Any]:
        """A plain, JSON-able dict: ``{"name": ..., "params": {...}}``.

        Raises TypeError when a parameter (e.g. an in-memory Python callable)
        has no spec.
        """
        return {"name": self.name, "params": self._spec_params()}

    # -- algebra: the registered "sum", "product", "scaled" and "constant" kernels
    # (pipeline.kernels.compose, pipeline.kernels.basic; they import this module)
    def __add__(self, other: Any) -> Kernel:
        if isinstance(other, Kernel):
            return _REGISTRY["sum"](self, other)
        if isinstance(other, numbers.Real) and not isinstance(other, bool):
            return _REGISTRY["sum"](self, _REGISTRY["constant"](float(other)))
        return NotImplemented

    def __radd__(self, other: Any) -> Kernel:
        # sum([k1, k2, ...]) starts from 0
        if isinstance(other, numbers.Real) and not isinstance(other, bool) and other == 0:
            return self
        return self.__add__(other)

    def __mul__(self, other: Any) -> Kernel:
        if isinstance(other, Kernel):
            return _REGISTRY["product"](self, other)
        if isinstance(other, numbers.Real) and not isinstance(other, bool):
            return _REGISTRY["scaled"](self, float(other))
        return NotImplemented

    __rmul__ = __mul__


def _to_spec_value(v: Any, pname: str, owner: Any) -> Any:
    if hasattr(v, "to_spec") and not isinstance(v, type):
        return v.to_spec()
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, np.ndarray):
        return v.tolist()
    if v is None or isinstance(v, bool | int | float | str):
        return v
    if isinstance(v, list | tuple):
        return [_to_spec_value(x, pname, owner) for x in v]
    raise TypeError(
        f"parameter {pname}={v!r} of {type(owner).__name__} cannot be serialised to a spec; "
        "use a registered kernel or warping function (see pipeline.kernels.warping) "
        "instead of an arbitrary Python callable (stores, saved models and krr run need "
        "a spec; KernelRidge fits such a kernel in memory: solver='dense', no store)"
    )


def _from_spec_value(v: Any) -> Any:
    """Rebuild nested kernel / warping specs inside a params value."""
    if isinstance(v, dict) and "name" in v:
        if v.get("kind") == "warping" or v["name"] not in _REGISTRY:
            return SPEC_READERS["warping"](v)
        return kernel_from_spec(v)
    if isinstance(v, list) and any(isinstance(x, dict) for x in v):
        return [_from_spec_value(x) for x in v]
    return v


def check_spec_keys(spec: dict[str, Any], what: str, also: tuple[str, ...] = ()) -> None:
    """Refuse a spec (kernel or warping) with keys besides ``name``, ``params`` and
    ``also`` (a warping's ``kind``): ``{"name": "rbf", "gamma": 0.3}`` would otherwise
    build ``RBF()`` with its default γ."""
    extra = sorted(set(spec) - {"name", "params", *also})
    if extra:
        hint = {"name": spec["name"], "params": {k: spec[k] for k in extra}}
        raise ValueError(
            f"{what} spec {spec!r} has keys {extra} besides 'name' and 'params'; "
            f"its parameters go under 'params': {hint!r}"
        )


def kernel_from_spec(spec: dict[str, Any]) -> Kernel:
    """Rebuild a kernel from :meth:`Kernel.to_spec` output (registry lookup, no eval)."""
    if not isinstance(spec, dict) or "name" not in spec:
        raise ValueError(f"a kernel spec is a dict with 'name' and 'params', got {spec!r}")
    name = spec["name"]
    if name not in _REGISTRY:
        raise ValueError(f"unknown kernel {name!r} in spec; known kernels: {registered_names()}")
    cls = _REGISTRY[name]
    check_spec_keys(spec, "kernel")
    params = spec.get("params", {}) or {}
    if not isinstance(params, dict):
        raise ValueError(f"spec params for kernel {name!r} must be a dict, got {params!r}")
    unknown = sorted(set(params) - set(cls._param_names()))
    if unknown:
        raise ValueError(
            f"kernel {name!r} does not take parameters {unknown}; "
            f"valid parameters are {cls._param_names()}"
        )
    return cls(**{k: _from_spec_value(v) for k, v in params.items()})


def _class_path(obj: Any) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def _identity_value(v: Any, spec_value: Any) -> Any:
    if hasattr(v, "to_spec") and not isinstance(v, type):
        return kernel_identity(v)
    if isinstance(v, list | tuple) and any(hasattr(x, "to_spec") for x in v):
        return [_identity_value(x, sx) for x, sx in zip(v, spec_value, strict=True)]
    return spec_value


def kernel_identity(kernel: Any) -> dict[str, Any]:
    """The kernel's spec with each node's module-qualified class added (``"class"``).

    Two kernels with the same registered name and parameters but different
    classes (e.g. a subclass of :class:`~pipeline.kernels.RBF` with another
    formula) have the same :meth:`Kernel.to_spec` but different identities.
    Nested kernels and warpings are annotated too. Raises TypeError like
    ``to_spec`` for a kernel holding an in-memory callable.
    """
    spec = kernel.to_spec()
    params = dict(spec.get("params") or {})
    for name in list(params):
        params[name] = _identity_value(getattr(kernel, name, None), params[name])
    return {**spec, "params": params, "class": _class_path(kernel)}


def kernel_fingerprint(kernel: Any) -> str:
    """Content hash of everything that defines a kernel's values: spec plus classes.

    Use this (never ``to_spec`` alone) wherever a kernel enters a fingerprint
    (stored Gram matrices, operators, fitted models), so a subclass with
    another formula never reuses results computed with its parent.
    """
    text = json.dumps(kernel_identity(kernel), sort_keys=True, separators=(",", ":"))
    return "kernel-" + hashlib.sha256(text.encode()).hexdigest()


def spec_round_trips(kernel: Any) -> bool:
    """Whether ``kernel_from_spec(kernel.to_spec())`` rebuilds the same classes and params."""
    try:
        return kernel_identity(kernel_from_spec(kernel.to_spec())) == kernel_identity(kernel)
    except (ValueError, TypeError):
        return False
