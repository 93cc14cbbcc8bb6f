"""Routing of ``KernelRidgeCV(solver="auto")`` and its cost model: pure functions.

Costs are in units of n³ flops of potrf-speed work (see
:data:`~pipeline.policy.constants.EIG_FLOPS_PER_N3` and
:data:`~pipeline.policy.constants.BAND_FLOPS_PER_M3` for their calibration).
``splits`` is a list of ``(train_idx, test_idx)`` pairs; only their lengths matter.
Whether a candidate fits in memory is asked through ``fits(bytes) -> bool``,
so this module does no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from pipeline.policy.constants import BAND_FLOPS_PER_M3, EIG_FLOPS_PER_N3, IN_MEMORY_MAX_N

__all__ = [
    "band_cost",
    "choose_cv_solver",
    "dense_cost",
    "eigen_cost",
    "eigen_mode",
    "memory_need",
]


def eigen_mode(n: int, kind: str, n_alpha: int, splits: Sequence, requested: str = "auto") -> str:
    """``"loo"``, ``"lgo"`` (one eigendecomposition of K) or ``"fold"`` (one per fold)."""
    if kind == "loo":
        return "loo"
    if kind != "complement":
        return "fold"
    if requested != "auto":
        return requested
    lgo = EIG_FLOPS_PER_N3 * n**3 + sum(n_alpha * len(te) ** 2 * n for _, te in splits)
    fold = sum(EIG_FLOPS_PER_N3 * len(tr) ** 3 for tr, _ in splits)
    return "lgo" if lgo <= fold else "fold"


def eigen_cost(n: int, kind: str, n_alpha: int, splits: Sequence, requested: str = "auto") -> float:
    """Cost of the eigen strategy in the chosen :func:`eigen_mode`."""
    mode = eigen_mode(n, kind, n_alpha, splits, requested)
    if mode in ("loo", "lgo"):
        return EIG_FLOPS_PER_N3 * n**3 + sum(
            n_alpha * len(te) ** 2 * n for _, te in splits if mode == "lgo"
        )
    return sum(EIG_FLOPS_PER_N3 * len(tr) ** 3 for tr, _ in splits)


def band_cost(splits: Sequence) -> float:
    """One band reduction per training set."""
    return sum(BAND_FLOPS_PER_M3 * len(tr) ** 3 for tr, _ in splits)


def dense_cost(n_alpha: int, splits: Sequence) -> float:
    """One Cholesky per (λ, fold)."""
    return sum(n_alpha * len(tr) ** 3 / 3.0 for tr, _ in splits)


def memory_need(solver: str, n: int, band_workers: int = 1, n_jobs: int | None = None) -> int:
    """Peak bytes of an in-memory strategy.

    ``band``: two kernel matrices plus one training-set copy per concurrent
    reduction. Others: K plus an eigenvector matrix or a fold copy, ~3 N² floats,
    once per kernel setting searched concurrently (``n_jobs`` threads).
    """
    if solver == "band":
        return (2 + band_workers) * n * n * 8
    return 3 * n * n * 8 * max(1, int(n_jobs or 1))


def choose_cv_solver(
    n: int,
    kind: str,
    n_alpha: int,
    splits: Sequence,
    *,
    fits: Callable[[int], bool],
    band_ok: bool,
    has_store: bool,
    band_workers: int = 1,
    n_jobs: int | None = None,
    eigen_requested: str = "auto",
    in_memory_max_n: int = IN_MEMORY_MAX_N,
) -> str:
    """``solver="auto"`` of the search: the cheapest in-memory strategy that fits, up to
    ``in_memory_max_n`` rows; else ``"cholesky"`` with a store, else ``"cg"``."""
    costs: dict[str, Any] = {
        "eigen": eigen_cost(n, kind, n_alpha, splits, eigen_requested),
        "dense": dense_cost(n_alpha, splits),
    }
    if kind != "loo" and band_ok:
        costs["band"] = band_cost(splits)
    if n <= in_memory_max_n:
        for name in sorted(costs, key=costs.get):
            if fits(memory_need(name, n, band_workers, n_jobs)):
                return name
    return "cholesky" if has_store else "cg"
