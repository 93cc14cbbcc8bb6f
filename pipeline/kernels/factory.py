"""Build a kernel object from a scikit-learn style name and params, or pass one through."""

from __future__ import annotations

from typing import Any

from pipeline.kernels.base import _REGISTRY, Kernel, kernel_from_spec, registered_names

#: scikit-learn's names that differ from ours
_ALIASES = {"poly": "polynomial", "gaussian": "rbf"}

#: the kernel names scikit-learn's KernelRidge takes (besides "precomputed" and callables)
SKLEARN_KERNELS = (
    "additive_chi2",
    "chi2",
    "cosine",
    "laplacian",
    "linear",
    "poly",
    "polynomial",
    "rbf",
    "sigmoid",
)

#: the parameters scikit-learn's KernelRidge forwards to every named kernel
#: (``pairwise_kernels(..., filter_params=True)`` drops those a kernel does not take)
SKLEARN_FORWARDED = ("gamma", "degree", "coef0")


def make_kernel(kernel: str | Kernel | dict, **params: Any) -> Kernel:
    """Return a :class:`Kernel` for a name (scikit-learn's names), a spec dict, or a Kernel.

    Parameters
    ----------
    kernel : str, dict or Kernel
        A registered name (``registered_names()``, plus scikit-learn's ``"poly"``
        and ``"gaussian"``), a spec from :meth:`Kernel.to_spec`, or a Kernel
        (returned as is; ``params`` are then ignored, as scikit-learn ignores
        gamma/degree/coef0 for a callable kernel).
    **params
        Kernel parameters. Values that are None are dropped, and so are
        scikit-learn's forwarded ``gamma``, ``degree`` and ``coef0`` when the
        kernel does not take them (scikit-learn's ``filter_params=True``), so
        ``make_kernel(name, gamma=g, degree=d, coef0=c)`` works for every
        name. Any other parameter the kernel does not take is a ValueError.

    Returns
    -------
    Kernel
    """
    if isinstance(kernel, Kernel):
        return kernel
    if isinstance(kernel, dict):
        k = kernel_from_spec(kernel)
        kwargs = _filter(kernel.get("name"), type(k)._param_names(), params)
        return k.set_params(**kwargs) if kwargs else k
    if not isinstance(kernel, str):
        raise TypeError(f"kernel must be a name, a spec dict or a Kernel, got {kernel!r}")
    name = _ALIASES.get(kernel, kernel)
    if name not in _REGISTRY:
        known = sorted(set(registered_names()) | set(_ALIASES))
        raise ValueError(f"unknown kernel {kernel!r}; known kernels: {known}")
    cls = _REGISTRY[name]
    kwargs = _filter(kernel, cls._param_names(), params)
    try:
        return cls(**kwargs)
    except TypeError as e:
        if "required positional argument" in str(e):
            raise ValueError(
                f"kernel {kernel!r} needs parameters {cls._param_names()}; got {sorted(kwargs)}"
            ) from None
        raise


def _filter(kernel: Any, accepted_names: list[str], params: dict[str, Any]) -> dict[str, Any]:
    """Drop None values and the forwarded sklearn params the kernel does not take."""
    accepted = set(accepted_names)
    extra = {
        p: v
        for p, v in params.items()
        if p not in accepted and v is not None and p not in SKLEARN_FORWARDED
    }
    if extra:
        raise ValueError(
            f"kernel {kernel!r} does not take parameters {sorted(extra)}; "
            f"valid parameters are {sorted(accepted)}"
        )
    return {p: v for p, v in params.items() if p in accepted and v is not None}


def resolve_estimator_kernel(
    kernel: Any,
    *,
    gamma: float | None = None,
    degree: float = 3,
    coef0: float = 1,
    kernel_params: dict | None = None,
) -> Kernel | None:
    """The Kernel an estimator's scikit-learn style parameters describe.

    Names go through :func:`make_kernel` with ``gamma``, ``degree`` and ``coef0``, and
    ``kernel_params`` (the parameters the names do not cover, e.g.
    ``kernel="matern", kernel_params={"nu": 2.5, "length_scale": [1.0, 2.0]}``; they win
    over the forwarded three; scikit-learn ignores ``kernel_params`` for names, where
    its kernels take nothing else).
    A spec dict describes its kernel as its Kernel object does: its own
    parameters win, and ``gamma``, ``degree`` and ``coef0`` only fill those it
    leaves out (the estimators' defaults ``degree=3, coef0=1`` are never None, so
    forwarding them replaced a spec's ``degree=2`` by 3). A Kernel object is used
    as is, or a copy with ``kernel_params`` applied. Returns None for
    ``"precomputed"`` and for callables on two rows, which the estimators
    evaluate through scikit-learn as scikit-learn does.
    """
    if isinstance(kernel, str) and kernel == "precomputed":
        return None
    if isinstance(kernel, Kernel):
        if kernel_params:
            import copy

            return copy.deepcopy(kernel).set_params(**kernel_params)
        return kernel
    forwarded = {"gamma": gamma, "degree": degree, "coef0": coef0}
    extra = dict(kernel_params or {})
    if isinstance(kernel, dict):
        own = kernel.get("params") or {}
        fill = {p: v for p, v in forwarded.items() if p not in own and p not in extra}
        return make_kernel(kernel, **fill, **extra)
    if isinstance(kernel, str):
        return make_kernel(kernel, **{**forwarded, **extra})
    if callable(kernel):
        return None
    raise TypeError(
        "kernel must be a kernel name, a Kernel object, a spec dict, 'precomputed' or a "
        f"callable, got {kernel!r}"
    )
