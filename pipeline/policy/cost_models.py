"""The cost models :func:`pipeline.policy.plan.plan_fit` knows by name, and how it calls them.

``"calibrated"`` (the default) is :class:`pipeline.policy.calibrated.CalibratedCostModel`;
``"simple"`` is :class:`SimpleCostModel`, the λ-blind constants kept for comparison. Any
object with ``cholesky_seconds(n, d, kernel)`` and ``cg_seconds(n, d, kernel)`` methods
plugs in; :func:`_seconds` passes it only the keywords (``shift``, ``tol``, ``rho``,
``matvec``, ``precision``) its methods accept.
"""

from __future__ import annotations

from typing import Any

from pipeline.options import COST_MODELS
from pipeline.policy import constants as C
from pipeline.policy.calibrated import CalibratedCostModel

__all__ = [
    "COST_MODELS",
    "SimpleCostModel",
    "make_cost_model",
    "predicted_cg_seconds",
    "predicted_cholesky_seconds",
]

#: cost models :func:`pipeline.policy.plan.plan_fit` knows by name


def predicted_cholesky_seconds(n: int, d: int, kernel: Any = None) -> float:
    """Seconds of an out-of-core Cholesky: N³/3 flops at ``CHOLESKY_GFLOPS``."""
    return n**3 / 3.0 / (C.CHOLESKY_GFLOPS * 1e9)


def predicted_cg_seconds(n: int, d: int, kernel: Any = None) -> float:
    """Seconds of a Nyström-preconditioned CG: ``CG_TYPICAL_PRODUCTS`` products of
    N² kernel entries at ``KERNEL_ENTRIES_PER_SECOND``."""
    return C.CG_TYPICAL_PRODUCTS * float(n) ** 2 / C.KERNEL_ENTRIES_PER_SECOND


class SimpleCostModel:
    """The old λ-blind model: :func:`predicted_cholesky_seconds` and
    :func:`predicted_cg_seconds` (``cost_model="simple"``). It ignores λ and the data,
    so it picks the slower solver on much of the measured grid
    (``bench_policy_grid.py``); the default is
    :class:`pipeline.policy.calibrated.CalibratedCostModel`."""

    name = "simple"

    def cholesky_seconds(self, n: int, d: int, kernel: Any = None) -> float:
        return predicted_cholesky_seconds(n, d, kernel)

    def cg_seconds(self, n: int, d: int, kernel: Any = None) -> float:
        return predicted_cg_seconds(n, d, kernel)


def _accepts(fn: Any, key: str) -> bool:
    import inspect

    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == key or p.kind is p.VAR_KEYWORD for p in params)


def _seconds(fn: Any, n: int, d: int, kernel: Any, **kw: Any) -> float:
    """``fn(n, d, kernel)``, with those of ``kw`` (``shift``, ``tol``) that ``fn`` accepts."""
    extra = {k: v for k, v in kw.items() if v is not None and _accepts(fn, k)}
    return float(fn(n, d, kernel, **extra))


def make_cost_model(
    name: Any,
    *,
    block_size: int = C.DEFAULT_BLOCK_SIZE,
    rank: int = C.DEFAULT_RANK,
    tol: float = C.DEFAULT_TOL,
    factor_dtype: str = C.DEFAULT_FACTOR_DTYPE,
) -> Any:
    """The cost model ``name`` (``None`` or ``"calibrated"``, ``"simple"``); an object
    with ``cholesky_seconds`` and ``cg_seconds`` is returned as is."""
    if name == "simple":
        return SimpleCostModel()
    if name is None or name == "calibrated":
        return CalibratedCostModel(
            block_size=block_size,
            rank=rank,
            tol=tol,
            factor_dtype=factor_dtype if factor_dtype in ("float64", "float32") else "float64",
        )
    if hasattr(name, "cholesky_seconds") and hasattr(name, "cg_seconds"):
        return name
    raise ValueError(
        f"cost_model={name!r} is not valid; choose one of {COST_MODELS} or pass an object "
        "with cholesky_seconds(n, d, kernel) and cg_seconds(n, d, kernel) methods"
    )
