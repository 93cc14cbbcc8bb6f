"""Which strategy a :class:`~pipeline.models.selection.KernelRidgeCV` search runs, and
the checks made before any work.

- :func:`check_params`: the search's options, by name (the search knobs as the option
  tree defines them, :class:`pipeline.options.CvOptions`);
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

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline.engine.where import available_cores
from pipeline.linalg import dense_memory
from pipeline.linalg.dense_memory import check_dense_memory
from pipeline.models.selection.guard import check_budget
from pipeline.models.selection.nystrom_cv import check_nystrom_search
from pipeline.models.selection.refine import check_subsample
from pipeline.options import (
    ALPHA_CONVENTION_ALIASES,
    CV_EIGEN_MODES,
    CV_SOLVERS,
    CvOptions,
    Knob,
    knobs,
)
from pipeline.plan.cv_routing import choose_cv_solver, memory_need
from pipeline.validation import check_option

__all__ = [
    "CONVENTIONS",
    "CV_PARAMS",
    "EIGEN_MODES",
    "IN_MEMORY",
    "SOLVERS",
    "SearchChoice",
    "band_workers",
    "cg_pricing",
    "check_params",
    "choose_search",
    "choose_solver",
]

SOLVERS = CV_SOLVERS
CONVENTIONS = tuple(ALPHA_CONVENTION_ALIASES)  # ("sklearn", "n_samples", "n")
EIGEN_MODES = CV_EIGEN_MODES
#: the search knobs of the option tree (pipeline.options.CvOptions) that KernelRidgeCV
#: takes: their defaults and checks are the tree's
CV_PARAMS = knobs(CvOptions, spelt_by="estimator")
#: knobs checked where they are read, with their own messages: the time budget by
#: guard.check_budget; n_jobs also takes scikit-learn's -1 (below 1: one at a time); the
#: subsample by refine.check_subsample (two rows per fold)
_CHECKED_WHERE_READ = ("n_jobs", "max_search_seconds", "subsample")
#: the solvers that hold the kernel matrix in memory (their refit is a KernelRidge fit)
IN_MEMORY = ("band", "eigen", "dense")


def check_knob(name: str, value: Any, knob: Knob) -> None:
    """Check a search knob against the option tree (:class:`pipeline.options.CvOptions`):
    an allowed value (the search's messages list them as a tuple), else as the
    estimators check (:func:`pipeline.validation.check_option`: a relative residual in
    (0, 1), at tol >= 1 every CG solve stops at alpha = 0; a positive integer...)."""
    if knob.choices is None:
        check_option(name, value, knob)
    elif value not in knob.choices:
        if name == "preconditioner":  # the CV solvers' own message (cvblock, cgpath)
            raise ValueError(
                f"preconditioner={value!r} is not supported by the CV search; "
                "use 'nystrom', 'adaptive' or 'none'"
            )
        raise ValueError(f"{name}={value!r} is not valid; choose one of {knob.choices}")


def check_params(cv: Any) -> None:
    """ValueError naming the first invalid option of the search ``cv``: the solver, the
    λ convention, then the other search knobs in the tree's order."""
    check_knob("solver", cv.solver, CV_PARAMS["solver"])
    if cv.lambda_convention not in CONVENTIONS:
        raise ValueError(
            f"lambda_convention={cv.lambda_convention!r} is not valid; choose one of {CONVENTIONS}"
        )
    for name, knob in CV_PARAMS.items():
        if name not in ("solver", *_CHECKED_WHERE_READ):
            check_knob(name, getattr(cv, name), knob)
    check_subsample(cv.subsample, cv.cv)
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
    if n_jobs:
        return max(1, int(n_jobs))
    workers = max(1, min(available_cores(), n_tasks))
    budget = dense_memory.available_memory() * dense_memory.SAFETY_FRACTION
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
        **cg_pricing(cv),
    )


def cg_pricing(cv: Any) -> dict[str, Any]:
    """The search's options that its cost model reads
    (:func:`pipeline.plan.cv_routing.predicted_search_seconds`): how the block CG runs
    (preconditioner, rank, tol, screening) and the λ convention (the Cholesky's shifts)."""
    return {
        "preconditioner": cv.preconditioner,
        "rank": cv.rank,
        "tol": cv.tol,
        "screen_tol": cv.screen_tol,
        "convention": cv.lambda_convention,
        "screen_centers": getattr(cv, "screen_centers", None),
        "screen_top": int(cv.screen_top),
    }


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
    if solver == "nystrom":  # its refusals before any work (scorer, M, splits, memory)
        check_nystrom_search(cv, n, kind, splits)
        return SearchChoice(solver, 1, 0.0)
    predicted = check_budget(
        cv.max_search_seconds, solver, n, n_alpha, n_settings, splits,
        n_targets=n_targets, kind=kind, **cg_pricing(cv),
    )  # fmt: skip
    return SearchChoice(solver, workers, predicted)
