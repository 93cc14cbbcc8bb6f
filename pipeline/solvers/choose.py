"""``solver="auto"`` for the out-of-core solvers: kept for compatibility.

The rule and its constants moved to :mod:`pipeline.policy` (``plan.out_of_core_choice``,
``plan.matvec_choice``, ``constants``): :func:`pipeline.policy.plan.plan_fit` is the
one ``auto`` rule of every fit. These wrappers keep the old names and spellings
(``"matrix-free"`` for the recomputing operator).
"""

from __future__ import annotations

from pipeline.policy.constants import CHOLESKY_MAX_N, DISK_MARGIN
from pipeline.policy.plan import (
    cg_memory_bytes,
    cholesky_disk_bytes,
    gram_disk_bytes,
    matvec_choice,
    out_of_core_choice,
)

__all__ = ["choose_matvec_mode", "choose_solver", "cholesky_disk_bytes", "cg_memory_bytes"]
__all__ += ["CHOLESKY_MAX_N", "DISK_MARGIN", "gram_disk_bytes"]


def choose_solver(
    n: int,
    n_features: int,
    disk_free: float,
    mem_free: float,
    *,
    rank: int = 500,
    cholesky_max_n: int | None = None,
    alpha: float | None = None,
) -> tuple[str, str]:
    """Choose ``"cholesky"`` or ``"cg"`` for an N x N kernel system (see
    :func:`pipeline.policy.plan.out_of_core_choice`); returns ``(name, reason)``.

    With ``alpha`` (the diagonal shift) the one cost model weighs CG's iterations
    against the Cholesky. Without it, as this function was first called, CG's
    iterations cannot be predicted, so the λ-blind ``"simple"`` model decides
    (:data:`CHOLESKY_MAX_N` rows).
    """
    return out_of_core_choice(
        n,
        n_features,
        disk_free,
        mem_free,
        rank=rank,
        cholesky_max_n=cholesky_max_n,
        cost_model=None if alpha is not None else "simple",
        shift=alpha,
    )


def choose_matvec_mode(n: int, n_features: int, disk_free: float) -> tuple[str, str]:
    """``"stored"`` or ``"matrix-free"`` for CG, with the reason."""
    mode, reason = matvec_choice(n, n_features, disk_free)
    return ("matrix-free" if mode == "recompute" else mode), reason
