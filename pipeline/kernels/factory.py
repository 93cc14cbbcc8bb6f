"""Build a kernel object from a scikit-learn style name and params, or pass one through."""

from __future__ import annotations

from typing import Any

from pipeline.kernels.base import Kernel, kernel_from_spec, registered_names

_ALIASES = {"poly": "polynomial", "gaussian": "rbf"}


def make_kernel(kernel: str | Kernel | dict, **params: Any) -> Kernel:
    """Return a :class:`Kernel` for a name (scikit-learn's names), a spec dict, or a Kernel.

    ``params`` with value None are dropped, so scikit-learn-style
    ``gamma=None, degree=3, coef0=1`` can be forwarded for any kernel; params a
    kernel does not take are an error only when they are not None.
    """
    if isinstance(kernel, Kernel):
        return kernel
    if isinstance(kernel, dict):
        return kernel_from_spec(kernel)
    if not isinstance(kernel, str):
        raise TypeError(f"kernel must be a name, a spec dict or a Kernel, got {kernel!r}")
    name = _ALIASES.get(kernel, kernel)
    if name not in registered_names():
        raise ValueError(f"unknown kernel {kernel!r}; known kernels: {registered_names()}")
    spec = {"name": name, "params": {}}
    k = kernel_from_spec(spec)
    accepted = set(k._param_names())
    extra = {p: v for p, v in params.items() if p not in accepted and v is not None}
    if extra:
        raise ValueError(f"kernel {kernel!r} does not take parameters {sorted(extra)}")
    k.set_params(**{p: v for p, v in params.items() if p in accepted and v is not None})
    return k
