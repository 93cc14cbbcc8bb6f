"""Which strategy a :class:`~pipeline.models.selection.KernelRidgeCV` search runs, and
the checks made before any work.

- :func:`check_params`: the search's options, by name;
- :func:`band_workers`: concurrent band reductions, as cores and memory allow;
- :func:`choose_solver`: the solver asked for, checked against the data and the
  memory, or ``solver="auto"``'s choice
  (:func:`pipeline.plan.cv_routing.choose_cv_solver`);
- :func:`choose_search`: all of it, plus the refusals of a solver that cannot serve
  the splits and of a grid over the time budget
  (:func:`~pipeline.models.selection.guard.check_budget`), as a :class:`SearchChoice`.

The routing rules and cost models themselves are pure functions in
:mod:`pipeline.plan.cv_routing`; this module measures what they need (cores,
memory, whether the band LAPACK routine exists) and raises the errors.
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline.linalg.dense_memory import check_dense_memory
from pipeline.models.selection.guard import check_budget
from pipeline.options import ALPHA_CONVENTION_ALIASES
from pipeline.plan.cv_routing import choose_cv_solver, memory_need

__all__ = [
    "CONVENTIONS",
    "EIGEN_MODES",
    "IN_MEMORY",
    "SOLVERS",
    "SearchChoice",
    "band_workers",
    "check_params",
    "choose_search",
    "choose_solver",
]

SOLVERS = ("auto", "band", "eigen", "dense", "cholesky", "cg")
CONVENTIONS = tuple(ALPHA_CONVENTION_ALIASES)  # ("sklearn", "n_samples", "n")
EIGEN_MODES = ("auto", "lgo", "fold")
#: the solvers that hold the kernel matrix in memory (their refit is a KernelRidge fit)
IN_MEMORY = ("band", "eigen", "dense")


def check_params(cv: Any) -> None:
    """ValueError naming the first invalid option of the search ``cv``."""
    for name, value, allowed in (
        ("solver", cv.solver, SOLVERS),
        ("lambda_convention", cv.lambda_convention, CONVENTIONS),
        ("eigen_mode", cv.eigen_mode, EIGEN_MODES),
    ):
        if value not in allowed:
            raise ValueError(f"{name}={value!r} is not valid; choose one of {allowed}")
    tol = getattr(cv, "tol", None)
    if tol is not None and (isinstance(tol, bool) or not isinstance(tol, numbers.Real)
                            or not 0 < tol < 1):  # fmt: skip
        # a relative residual: at tol >= 1 every CG solve stops at alpha = 0
        raise ValueError(f"tol must be a float in (0, 1), e.g. 1e-6, got {tol!r}")
    scoring = getattr(cv, "scoring", None)
    if isinstance(scoring, list | tuple | set | dict):
        raise ValueError(
            f"scoring={scoring!r}: give one scorer name or callable; a multi-metric search "
            "is not supported (run one search per metric)"
        )
    if cv.solver in ("cholesky",) and cv.store is None:
        raise ValueError(
            f"solver={cv.solver!r} needs store= (a directory or fsspec URL for the Gram "
            "and factor arrays)"
        )


def band_workers(n_jobs: int | None, n: int, n_tasks: int) -> int:
    """Concurrent band reductions: ``n_jobs``, else one per core as memory allows
    (each holds one training-set copy; up to two kernel matrices are in flight)."""
    from pipeline.linalg.dense_memory import SAFETY_FRACTION, available_memory

    if n_jobs:
        return max(1, int(n_jobs))
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    workers = max(1, min(cores, n_tasks))
    budget = available_memory() * SAFETY_FRACTION
    while workers > 1 and memory_need("band", n, workers) > budget:
        workers -= 1
    return workers


def choose_solver(
    cv: Any,
    n: int,
    kind: str,
    n_alpha: int,
    splits: list,
    workers: int,
    band_available: Callable[[], bool],
) -> str:
    """The solver of the search ``cv`` on ``n`` rows: the one asked for (checked), else
    ``solver="auto"``'s choice. ``band_available()`` says whether the band LAPACK
    routine exists here."""

    if cv.solver == "band":
        if kind == "loo":
            raise ValueError(
                "solver='band' does one reduction per split; for cv='loo' use "
                "solver='eigen' (exact leave-one-out from one eigendecomposition)"
            )
        if not band_available():
            raise RuntimeError(
                "solver='band' needs LAPACK dsytrd_sy2sb from SciPy's bundled OpenBLAS, "
                "which was not found here; use solver='eigen' or 'dense'"
            )
    if cv.solver in IN_MEMORY:
        check_dense_memory(
            memory_need(cv.solver, n, workers, cv.n_jobs),
            what=f"KernelRidgeCV(solver={cv.solver!r}) with n={n}",
        )
        return cv.solver
    if cv.solver != "auto":
        return cv.solver

    def fits(nbytes: int) -> bool:
        try:
            check_dense_memory(nbytes, what="")
        except MemoryError:
            return False
        return True

    return choose_cv_solver(
        n,
        kind,
        n_alpha,
        splits,
        fits=fits,
        band_ok=kind != "loo" and band_available(),
        has_store=cv.store is not None,
        band_workers=workers,
        n_jobs=cv.n_jobs,
        eigen_requested=cv.eigen_mode,
    )


@dataclass(frozen=True)
class SearchChoice:
    """The solver of a search, its concurrent band reductions and its predicted seconds."""

    solver: str
    band_workers: int
    predicted_seconds: float


def choose_search(
    cv: Any,
    n: int,
    kind: str,
    splits: list,
    *,
    n_alpha: int,
    n_settings: int,
    n_targets: int,
    band_available: Callable[[], bool],
) -> SearchChoice:
    """Choose and check the search's solver before any work (see the module notes)."""
    workers = band_workers(cv.n_jobs, n, n_settings * len(splits))
    solver = choose_solver(cv, n, kind, n_alpha, splits, workers, band_available)
    if solver in ("cg", "dense") and kind == "loo":
        raise ValueError(
            "cv='loo' needs solver='eigen' (in memory) or 'cholesky' (exact LOO from the "
            f"factor); solver={solver!r} solves one system per left-out row"
        )
    if (
        solver == "cg"
        and kind == "splits"
        and any(np.unique(tr).size != len(tr) for tr, _ in splits)
    ):  # its block solve keeps one row per index: not the training set sklearn uses
        raise ValueError(
            "these splits repeat rows in a training set (e.g. bootstrap samples), which "
            "solver='cg' does not support; use solver='eigen', 'dense' or 'band'"
        )
    if solver == "cholesky" and kind == "splits":
        raise ValueError(
            f"solver='cholesky' needs splits whose training set is the complement of the "
            f"test set (K-fold, held-out, LOO); cv={cv.cv!r} is not; use solver='cg' or "
            "an in-memory solver"
        )
    predicted = check_budget(
        cv.max_search_seconds, solver, n, n_alpha, n_settings, splits,
        n_targets=n_targets, kind=kind,
    )  # fmt: skip
    return SearchChoice(solver, workers, predicted)
