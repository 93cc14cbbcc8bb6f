"""Routing of ``KernelRidgeCV(solver="auto")`` and its cost model: pure functions.

Costs are in units of n³ flops of potrf-speed work (see
:data:`~pipeline.constants.EIG_FLOPS_PER_N3` and
:data:`~pipeline.constants.BAND_FLOPS_PER_M3` for their calibration).
``splits`` is a list of ``(train_idx, test_idx)`` pairs; only their lengths matter.
Whether a candidate fits in memory is asked through ``fits(bytes) -> bool``,
so this module does no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from pipeline.constants import (
    BAND_FLOPS_PER_M3,
    BAND_GEMM_EFFICIENCY,
    BAND_REDUCTION_FLOPS_PER_M3,
    CG_MARGIN,
    CG_PASS_OVERHEAD,
    CHOLESKY_GFLOPS,
    CV_BLOCK_COLUMN_SECONDS,
    CV_BLOCK_PASSES,
    CV_DEFAULT_RANK,
    CV_EIGH_FLOPS_PER_R3,
    CV_FIXED_RANK_PASS_EXPONENT,
    CV_PANELS_PER_FACTORISATION,
    CV_PRECOND_BUDGET,
    CV_RANK_FLOOR,
    CV_RANK_SCALE,
    CV_SCREEN_CENTERS,
    CV_SCREEN_TOL,
    CV_SCREEN_TOP,
    CV_TOL,
    CV_UNPRECONDITIONED_PASS_FACTOR,
    CV_UNSCREENED_PASS_FACTOR,
    CV_VERIFY_PASSES,
    EIG_FLOPS_PER_N3,
    IN_MEMORY_MAX_N,
    KERNEL_ENTRIES_PER_SECOND,
    adaptive_rank_cap,
)
from pipeline.plan.calibrated import SimpleCostModel
from pipeline.plan.cg_cost import chebyshev_bound
from pipeline.plan.cholesky_cost import cholesky_flops

__all__ = [
    "band_cost",
    "cg_passes",
    "cg_rank",
    "choose_cv_solver",
    "dense_cost",
    "eigen_cost",
    "eigen_mode",
    "memory_need",
    "nystrom_screened",
    "precond_rank_cap",
    "predicted_search_seconds",
    "rank_cap",
    "route_choice",
    "suggest_smaller_grid",
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
    return sum(n_alpha * cholesky_flops(len(tr)) for tr, _ in splits)


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
    **cg: Any,
) -> str:
    """``solver="auto"`` of the search: the cheapest in-memory strategy that fits, up to
    ``in_memory_max_n`` rows; else, with a store, ``"cholesky"`` for leave-one-out or
    when one factorisation per λ (and its residual panels) is predicted cheaper than the
    block CG as the search would run it (``cg``: the keywords of
    :func:`predicted_search_seconds`: ``preconditioner``, ``rank``, ``tol``,
    ``screen_tol``, ``n_targets``, ``convention``; their defaults are the search's);
    else ``"cg"``."""
    costs: dict[str, Any] = {"eigen": eigen_cost(n, kind, n_alpha, splits, eigen_requested)}
    if kind != "loo":  # one system per left-out row: leave-one-out is eigen's (or the factor's)
        costs["dense"] = dense_cost(n_alpha, splits)
    if kind != "loo" and band_ok:
        costs["band"] = band_cost(splits)
    if n <= in_memory_max_n:
        for name in sorted(costs, key=costs.get):
            if fits(memory_need(name, n, band_workers, n_jobs)):
                return name
    if has_store and kind == "loo":
        return "cholesky"  # exact LOO from the factor; CG cannot give diag((K + λI)⁻¹)
    if has_store and kind == "complement":  # the factor's LGO panels need complements
        per = predicted_search_seconds("cholesky", n, n_alpha, 1, splits, **cg)
        if per < predicted_search_seconds("cg", n, n_alpha, 1, splits, **cg):
            return "cholesky"
    return "cg"


def route_choice(
    rho: float,
    t_pass: float,
    shifts: Sequence[Sequence[float]],
    train_sizes: Sequence[int],
    *,
    gemm_rate_one_thread: float,
    n_workers: int,
    tol: float,
    margin: float = CG_MARGIN,
) -> tuple[str, int, float, float]:
    """In memory, CG or band reductions for one kernel setting:
    ``(solver, predicted CG iterations, CG seconds, band seconds)``.

    ``rho`` is ‖K - F Fᵀ‖₂ of the rank-r preconditioner, ``t_pass`` the measured seconds
    of one product with K, ``shifts[f]`` the shifts of fold f (one per λ). CG's
    iterations are the Chebyshev bound (:func:`~pipeline.plan.cg_cost.chebyshev_bound`)
    of ``κ = 1 + ρ/s`` for each λ from scratch (warm
    starts are not counted); the band reductions run at
    :data:`~pipeline.constants.BAND_GEMM_EFFICIENCY` of the one-thread GEMM rate
    on ``n_workers`` threads. CG is chosen when predicted cheaper than ``margin`` times
    the band reductions.
    """
    its = sum(
        max(chebyshev_bound(1.0 + rho / s, tol) for s in fold_shifts)
        for fold_shifts in zip(*shifts)
    )
    cg_s = its * t_pass * CG_PASS_OVERHEAD
    rate = gemm_rate_one_thread * BAND_GEMM_EFFICIENCY
    band_s = sum(BAND_REDUCTION_FLOPS_PER_M3 * m**3 for m in train_sizes) / (
        rate * max(1, n_workers)
    )
    return ("cg" if cg_s < margin * band_s else "band"), its, cg_s, band_s


def _block_pass_seconds(n: int, columns: int) -> float:
    entries = n * (n + 1) / 2.0
    return entries * (1.0 / KERNEL_ENTRIES_PER_SECOND + columns * CV_BLOCK_COLUMN_SECONDS)


def rank_cap(n: int) -> int:
    """The adaptive preconditioner's rank cap for n rows (before the memory cap):
    ``max(CV_RANK_FLOOR, CV_RANK_SCALE * n^(2/3))``, at most n."""
    return adaptive_rank_cap(n, scale=CV_RANK_SCALE, floor=CV_RANK_FLOOR)


def precond_rank_cap(n: int, n_folds: int, budget: int = CV_PRECOND_BUDGET) -> int:
    """Largest rank r with ``4 n r + 8 n_folds r² <= budget`` (F in float32 plus one
    r x r basis per fold), at least 1 and at most n."""
    a, b = 8.0 * n_folds, 4.0 * n
    r = (-b + math.sqrt(b * b + 4 * a * budget)) / (2 * a)
    return int(max(1, min(n, r)))


def cg_rank(n: int, n_folds: int, preconditioner: str = "adaptive", rank: int | None = None) -> int:
    """The rank of the block PCG's Nyström factor for n rows (0: no preconditioner):
    ``"nystrom"``: ``rank`` (default :data:`CV_DEFAULT_RANK`); ``"adaptive"``: at most its
    cap (``rank`` caps it further; priced at the cap). Both are capped by
    :func:`rank_cap` and the memory (:func:`precond_rank_cap`)."""
    if preconditioner in ("none", None):
        return 0
    cap = min(precond_rank_cap(n, n_folds), rank_cap(n))
    if preconditioner == "nystrom":
        return min(int(rank or min(n, CV_DEFAULT_RANK)), cap, n)
    return min(cap, int(rank)) if rank else cap


def cg_passes(
    n: int,
    n_folds: int,
    preconditioner: str = "adaptive",
    rank: int | None = None,
    screened: bool = True,
) -> float:
    """Kernel passes of the block PCG per kernel setting: :data:`CV_BLOCK_PASSES` for the
    search's default run (adaptive factor, screening), times
    :data:`CV_UNSCREENED_PASS_FACTOR` without screening, and, for a Nyström factor of
    fixed rank r below the adaptive cap r_a, times ``(r_a / r)`` to the power
    :data:`CV_FIXED_RANK_PASS_EXPONENT`, at most
    :data:`CV_UNPRECONDITIONED_PASS_FACTOR` (the factor without a preconditioner)."""
    passes = float(CV_BLOCK_PASSES)
    if not screened:
        passes *= CV_UNSCREENED_PASS_FACTOR
    if preconditioner in ("none", None):
        return passes * CV_UNPRECONDITIONED_PASS_FACTOR
    if preconditioner == "nystrom":
        r, r_a = cg_rank(n, n_folds, "nystrom", rank), cg_rank(n, n_folds, "adaptive")
        if r < r_a:
            worse = (r_a / r) ** CV_FIXED_RANK_PASS_EXPONENT
            passes *= min(CV_UNPRECONDITIONED_PASS_FACTOR, worse)
    return passes


def nystrom_screened(
    solver: str, kind: str, n: int, n_candidates: int, screen_centers: int | None,
    screen_top: int,
) -> bool:  # fmt: skip
    """Whether a search scores its grid by Nyström KRR first and solves only its
    finalists exactly (``KernelRidgeCV(screen_centers=)``): the block CG's searches
    (``solver == "cg"``) over complementary splits (K-fold, held out: the Nyström
    statistics' folds), with fewer centres than rows, and a grid larger than its
    finalists (``screen_top`` candidates and one λ below each of their settings')."""
    return (
        solver == "cg"
        and kind == "complement"
        and screen_centers is not None
        and int(screen_centers) < n
        and n_candidates > 2 * int(screen_top)
    )


def _screen_seconds(n: int, m: int, n_settings: int, n_folds: int) -> float:
    """The Nyström screen: per setting, M RPCholesky centres (``2 n M²`` flops), the
    statistics (a SYRK of ``n M²``, twice where mapped) and one M x M eigendecomposition
    per fold (``CV_EIGH_FLOPS_PER_R3 M³``, as the block CG's fold restrictions)."""
    flops = 4 * n * m * m + n_folds * CV_EIGH_FLOPS_PER_R3 * m**3
    return n_settings * (flops / (CHOLESKY_GFLOPS * 1e9) + n * m / KERNEL_ENTRIES_PER_SECOND)


def _precond_seconds(n: int, r: int, n_folds: int) -> float:
    """One factor of rank r (``2 n r²`` flops) and its restriction to each fold (an r x r
    eigendecomposition per fold)."""
    return (2 * n * r * r + n_folds * CV_EIGH_FLOPS_PER_R3 * r**3) / (CHOLESKY_GFLOPS * 1e9)


def predicted_search_seconds(
    solver: str,
    n: int,
    n_alpha: int,
    n_settings: int,
    splits: Sequence,
    *,
    n_targets: int = 1,
    eigen_requested: str = "auto",
    kind: str = "complement",
    preconditioner: str = "adaptive",
    rank: int | None = None,
    tol: float = CV_TOL,
    screen_tol: float | None = CV_SCREEN_TOL,
    convention: str = "sklearn",
    screen_centers: int | None = CV_SCREEN_CENTERS,
    screen_top: int = CV_SCREEN_TOP,
    verify: bool = True,
) -> float:
    """Predicted seconds of a whole search (every kernel setting) with ``solver``.

    ``cholesky``: per setting, the Gram, then per λ one tile Cholesky of the full Gram per
    distinct shift (one; under the ``"n_samples"``/``"n"`` convention one per distinct
    training-set size) priced as the fit plan's (simple) cost model prices it, plus the
    L⁻¹ panels of its residuals (:data:`CV_PANELS_PER_FACTORISATION` factorisations);
    ``cg``: per setting, :func:`cg_passes` block passes over the lower kernel tiles,
    every (λ, fold, target) column in each pass (half of them on average: screening and
    converged columns drop out), one Nyström factor of rank :func:`cg_rank` and its
    fold restrictions, and once per search the verification of the chosen setting (one
    more factor and :data:`CV_VERIFY_PASSES` float64 passes). The keywords
    ``preconditioner``, ``rank``, ``tol`` and ``screen_tol`` are the search's (screening
    runs when ``screen_tol`` is above ``tol``); their defaults are
    :class:`~pipeline.options.CvOptions`'. With the Nyström screen
    (:func:`nystrom_screened`: ``screen_centers``, ``screen_top``): the screen
    (:func:`_screen_seconds`), then ``cg`` unscreened on at most ``screen_top`` settings of
    ``screen_top + 1`` λ, without the verification (the finalists' solves are float64 to
    its tolerance); the rounds that depend on the scores are not priced (a finalist's
    descent down the λ grid, a setting the screen leaves unresolved: at most one more
    ``cg`` search per such setting), so the screened figure is a floor. The in-memory solvers: their flop counts
    (:func:`eigen_cost`, :func:`band_cost`, :func:`dense_cost`) at
    :data:`CHOLESKY_GFLOPS` plus the kernel matrix.
    """
    rate = CHOLESKY_GFLOPS * 1e9
    kernel = n * n / KERNEL_ENTRIES_PER_SECOND
    once = 0.0
    if nystrom_screened(solver, kind, n, n_alpha * n_settings, screen_centers, screen_top):
        screen = _screen_seconds(n, int(screen_centers), n_settings, len(splits))
        finals = predicted_search_seconds(
            "cg", n, min(n_alpha, screen_top + 1), min(n_settings, screen_top), splits,
            n_targets=n_targets, kind=kind, preconditioner=preconditioner, rank=rank, tol=tol,
            screen_tol=None, convention=convention, screen_centers=None, verify=False,
        )  # fmt: skip
        return float(screen + finals)
    if solver == "cg":
        nf = len(splits)
        columns = n_alpha * nf * n_targets
        r = cg_rank(n, nf, preconditioner, rank)
        screened = screen_tol is not None and screen_tol > tol
        passes = cg_passes(n, nf, preconditioner, rank, screened)
        precond = _precond_seconds(n, r, nf)
        per = passes * _block_pass_seconds(n, max(1, columns // 2)) + kernel + precond
        if verify:  # (the Nyström screen's finalists are solved to its tolerance already)
            once = precond + CV_VERIFY_PASSES * _block_pass_seconds(n, nf * n_targets)
    elif solver == "cholesky":
        if kind == "loo" or convention not in ("n_samples", "n"):
            shifts = 1
        else:  # the shift is λ times the training rows: one factor per distinct count
            shifts = max(1, len({len(tr) for tr, _ in splits}))
        factor = SimpleCostModel().cholesky_seconds(n, 1)
        per = n_alpha * shifts * factor * (1.0 + CV_PANELS_PER_FACTORISATION) + kernel / 2
    elif solver == "eigen":
        per = eigen_cost(n, kind, n_alpha, splits, eigen_requested) / rate + kernel
    elif solver == "band":
        per = band_cost(splits) / rate + kernel
    else:
        per = dense_cost(n_alpha, splits) / rate + kernel
    return float(per * n_settings + once)


def suggest_smaller_grid(
    solver: str,
    n: int,
    n_alpha: int,
    n_settings: int,
    splits: Sequence,
    budget: float,
    **kw: Any,
) -> str:
    """A grid (λ count x kernel settings, else fewer rows) predicted to fit ``budget`` s."""
    for settings in range(n_settings, 0, -1):
        for alphas in range(n_alpha, 0, -1):
            if predicted_search_seconds(solver, n, alphas, settings, splits, **kw) <= budget:
                return f"{alphas} lambda(s) x {settings} kernel setting(s)"
    rows = n
    while rows > 100:
        rows = int(rows * 0.8)
        scale = rows / n
        sub = [(range(int(len(tr) * scale)), range(int(len(te) * scale))) for tr, te in splits]
        if predicted_search_seconds(solver, rows, 1, 1, sub, **kw) <= budget:
            return f"1 lambda x 1 kernel setting on a subsample of about {rows} rows"
    return "a much smaller problem (no grid on these rows fits the budget)"
