"""Kernel objects: ``k(X, Y=None)``, ``k.diag(X)``, get/set params, dict specs.

numpy only: this layer never imports dask or zarr.
"""

from __future__ import annotations

import inspect
from typing import Any, ClassVar

import numpy as np

_REGISTRY: dict[str, type[Kernel]] = {}


def register(cls: type[Kernel]) -> type[Kernel]:
    """Class decorator: make a kernel constructible from its spec name."""
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise ValueError(f"kernel name {cls.name!r} registered twice")
    _REGISTRY[cls.name] = cls
    return cls


def registered_names() -> list[str]:
    return sorted(_REGISTRY)


def result_dtype(X: np.ndarray, Y: np.ndarray | None = None) -> np.dtype:
    """float32 only when every input is float32, else float64."""
    dts = [np.asarray(X).dtype] + ([] if Y is None else [np.asarray(Y).dtype])
    return np.dtype(np.float32) if all(d == np.float32 for d in dts) else np.dtype(np.float64)


def as_2d(X: Any, dtype: np.dtype) -> np.ndarray:
    X = np.asarray(X)
    if X.ndim != 2:
        raise ValueError(f"kernel inputs must be 2-D (n_samples, n_features), got shape {X.shape}")
    return X.astype(dtype, copy=False)


class Kernel:
    """Base class. Subclasses set ``name`` and implement ``_eval`` and ``_diag``.

    Parameters are the keyword arguments of ``__init__``, stored under the same
    attribute names (the scikit-learn convention), so ``get_params``,
    ``set_params`` and ``to_spec`` work without per-kernel code.
    """

    name: ClassVar[str] = "kernel"
    #: True if the kernel is PSD for every valid parameter setting
    is_mercer: ClassVar[bool] = True

    # -- evaluation ---------------------------------------------------------
    def __call__(self, X: Any, Y: Any = None) -> np.ndarray:
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
        dt = result_dtype(X)
        return np.asarray(self._diag(as_2d(X, dt)), dtype=dt)

    def _eval(self, X: np.ndarray, Y: np.ndarray, symmetric: bool) -> np.ndarray:
        raise NotImplementedError

    def _diag(self, X: np.ndarray) -> np.ndarray:
        return np.einsum("ii->i", self._eval(X, X, True)).copy()

    # -- parameters ---------------------------------------------------------
    @classmethod
    def _param_names(cls) -> list[str]:
        sig = inspect.signature(cls.__init__)
        return [
            p.name
            for p in sig.parameters.values()
            if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        params = {n: getattr(self, n) for n in self._param_names()}
        if deep:
            for n, v in list(params.items()):
                if isinstance(v, Kernel):
                    for sub, sv in v.get_params(deep=True).items():
                        params[f"{n}__{sub}"] = sv
        return params

    def set_params(self, **params: Any) -> Kernel:
        valid = self._param_names()
        nested: dict[str, dict[str, Any]] = {}
        for key, value in params.items():
            head, _, sub = key.partition("__")
            if head not in valid:
                raise ValueError(
                    f"invalid parameter {head!r} for kernel {type(self).__name__}; "
                    f"valid parameters are {valid}"
                )
            if sub:
                nested.setdefault(head, {})[sub] = value
            else:
                setattr(self, head, value)
        for head, sub_params in nested.items():
            getattr(self, head).set_params(**sub_params)
        self._check_params()
        return self

    def _check_params(self) -> None:
        """Validate parameters; raise ValueError naming the bad value."""

    # -- serialisation ------------------------------------------------------
    def to_spec(self) -> dict[str, Any]:
        """A plain, JSON-able dict: ``{"name": ..., "params": {...}}``."""
        params = {}
        for n in self._param_names():
            v = getattr(self, n)
            params[n] = _to_spec_value(v, n, self)
        return {"name": self.name, "params": params}

    def __repr__(self) -> str:
        args = ", ".join(f"{n}={getattr(self, n)!r}" for n in self._param_names())
        return f"{type(self).__name__}({args})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Kernel) and self.to_spec() == other.to_spec()

    def __hash__(self) -> int:
        return hash(repr(self.to_spec()))

    # -- algebra (implemented in pipeline.kernels.compose) -------------------
    def __add__(self, other: Kernel) -> Kernel:
        from pipeline.kernels.compose import Sum

        return Sum(self, other)

    def __mul__(self, other: Any) -> Kernel:
        from pipeline.kernels.compose import Product, Scaled

        if isinstance(other, Kernel):
            return Product(self, other)
        return Scaled(self, float(other))

    __rmul__ = __mul__


def _to_spec_value(v: Any, pname: str, k: Kernel) -> Any:
    if isinstance(v, Kernel):
        return v.to_spec()
    if hasattr(v, "to_spec"):
        return v.to_spec()
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, np.ndarray):
        return v.tolist()
    if v is None or isinstance(v, bool | int | float | str):
        return v
    if isinstance(v, list | tuple):
        return [_to_spec_value(x, pname, k) for x in v]
    raise TypeError(
        f"parameter {pname}={v!r} of {type(k).__name__} cannot be serialised to a spec; "
        "use a registered kernel or warping function"
    )


def kernel_from_spec(spec: dict[str, Any]) -> Kernel:
    """Rebuild a kernel from :meth:`Kernel.to_spec` output (registry lookup, no eval)."""
    if not isinstance(spec, dict) or "name" not in spec:
        raise ValueError(f"a kernel spec is a dict with 'name' and 'params', got {spec!r}")
    name = spec["name"]
    if name not in _REGISTRY:
        raise ValueError(f"unknown kernel {name!r} in spec; known kernels: {registered_names()}")
    cls = _REGISTRY[name]
    params = dict(spec.get("params", {}))
    for k, v in params.items():
        if isinstance(v, dict) and "name" in v:
            if v["name"] in _REGISTRY:
                params[k] = kernel_from_spec(v)
            else:
                from pipeline.kernels.warping import warping_from_spec

                params[k] = warping_from_spec(v)
    return cls(**params)
