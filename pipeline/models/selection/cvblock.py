"""K-fold CV of one kernel setting by block PCG: all folds and all λ in one block.

The out-of-core strategy of :class:`~pipeline.models.selection.KernelRidgeCV`
(``solver="cg"``). For one kernel setting:

1. one Nyström factor ``F`` of K (adaptive-rank RPCholesky grown until
   ``‖K - F Fᵀ‖`` is about 5x the smallest shift of the grid, capped by a memory
   budget; or a fixed-rank one), restricted to each fold by an r x r
   eigendecomposition (:class:`~pipeline.models.selection.blockcg.FoldNystromBlock`);
2. every (λ, fold, target) system is a column of one block; each CG iteration
   is ONE pass of the fused engine over the lower kernel tiles for every column
   still running (:func:`~pipeline.models.selection.blockcg.block_pcg`);
3. mixed precision: the inner solves use float32 kernel values (``kernel_dtype``),
   and the residual is recomputed with float64 products after each inner solve
   (iterative refinement: ``x += A32⁻¹ (b - A64 x)`` to the inner tolerance)
   until the float64 relative residual is ``<= tol``: the solvers' one refinement
   loop, :func:`pipeline.linalg.cg_mixed.iterative_refinement`. Held-out predictions
   ``K_VT x_T`` are the test rows of the last float64 product: no extra pass;
4. a column that does not reach ``tol`` (NaN, breakdown, stagnation, iteration
   cap) is reported in ``failures`` and never scored (the strategy redoes it
   exactly, :mod:`pipeline.models.selection.direct`).

A target far from 1 in magnitude is solved scaled by an exact power of two
(:func:`pipeline.float_range.pow2_exponents`) and its predictions scaled back:
the residual norms would underflow or overflow.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

import pipeline.constants as C
from pipeline.float_range import pow2_exponents
from pipeline.linalg.cg_mixed import iterative_refinement
from pipeline.linalg.precond import FoldNystromBlock, build_nystrom
from pipeline.models.selection.blockcg import block_pcg
from pipeline.models.selection.direct import UnconvergedSolveError
from pipeline.plan.cv_routing import cg_rank

__all__ = ["block_cv_predictions"]

log = logging.getLogger("pipeline.models.selection")


def _factor(op, preconditioner, rank, min_shift, n_folds, random_state, stats):
    n = op.n
    if preconditioner in ("none", None):
        return None, {}
    # the rank (a cap for adaptive) the search's cost model prices: cv_routing.cg_rank
    r = cg_rank(n, n_folds, preconditioner, rank)
    if preconditioner == "nystrom":
        nf = build_nystrom(op, centres="rpcholesky", rank=r, random_state=random_state)
        info = {"method": "nystrom", "rank": nf.rank}
    elif preconditioner == "adaptive":
        nf = build_nystrom(
            op, centres="adaptive", shift=float(min_shift), max_rank=r,
            memory_budget=None, random_state=random_state,
        )  # fmt: skip
        info = nf.info
    else:
        raise ValueError(
            f"preconditioner={preconditioner!r} is not supported by the CV search; "
            "use 'nystrom', 'adaptive' or 'none'"
        )
    stats["preconditioner_builds"] = stats.get("preconditioner_builds", 0) + 1
    stats.setdefault("preconditioner_ranks", []).append(nf.rank)
    return nf.host_factor(), info  # the block PCG runs on the host


def block_cv_predictions(
    op64: Any,
    y: np.ndarray,
    trains: list[np.ndarray],
    tests: list[np.ndarray],
    shifts: np.ndarray,
    *,
    op32: Any = None,
    preconditioner: str = "adaptive",
    rank: int | None = None,
    tol: float = C.CV_TOL,
    max_iter: int | None = None,
    random_state: Any = 0,
    stats: dict | None = None,
    failures: list | None = None,
    screen_tol: float | None = None,
    refine: Any = None,
) -> list[list[Any]]:
    """Held-out predictions ``preds[f][l]`` for every fold f and shift row ``shifts[l]``.

    Parameters
    ----------
    op64 : KernelOperator
        Float64 products with the full K (``matvec`` includes ``op64.shift``,
        removed here); also ``diagonal``/``columns``/``submatrix`` for the factor.
    y : ndarray (n, t)
    trains, tests : index arrays per fold
    shifts : ndarray (n_lambda, n_folds)
    op32 : KernelOperator, optional
        Float32 products for the inner solves (None: float64 throughout).
    preconditioner : {"adaptive", "nystrom", "none"}
    rank : int, optional
        Nyström rank ("nystrom"), or a cap on the adaptive rank.
    tol : float
        Float64 relative residual every system must reach.
    max_iter : int, optional
        Cap on the inner iterations of each refinement step (default 1000).
    failures : list, optional
        Unconverged systems are appended as dicts (``lambda_index``, ``fold``,
        ``reason``, ``rel_residual``) with predictions None; without the list they
        raise :class:`~pipeline.models.selection.direct.UnconvergedSolveError`.
    screen_tol : float, optional
        Screening: solve every system to this float64 relative residual first, then
        call ``refine(preds)`` (the held-out predictions so far, ``preds[f][l]``),
        which returns the λ indices to solve on to ``tol``; the others keep their
        screening solution (``stats["screened_lambdas"]``).
    """
    stats = stats if stats is not None else {}
    n, t = y.shape
    L, nf = shifts.shape
    t0 = time.perf_counter()
    # each target solved as 2**e y (e = 0 for an ordinary one), its predictions scaled back
    e = pow2_exponents(np.max(np.abs(y), axis=0, initial=0.0))
    scaled = bool(np.any(e))
    if scaled:
        y = np.ldexp(np.asarray(y, dtype=np.float64), e)
    F, _ = _factor(op64, preconditioner, rank, shifts.min(), nf, random_state, stats)
    pre = FoldNystromBlock(F, trains)
    stats.setdefault("seconds", {})
    stats["seconds"]["preconditioner"] = round(
        stats["seconds"].get("preconditioner", 0) + time.perf_counter() - t0, 4
    )
    masks = np.zeros((nf, n), dtype=bool)
    for f, tr in enumerate(trains):
        masks[f, tr] = True
    # columns ordered (λ, fold, target)
    lam_of = np.repeat(np.arange(L), nf * t)
    fold_of = np.tile(np.repeat(np.arange(nf), t), L)
    tgt_of = np.tile(np.arange(t), L * nf)
    col_shift = shifts[lam_of, fold_of].astype(np.float64)
    c = L * nf * t
    B = np.zeros((n, c))
    for j in range(c):
        tr = trains[fold_of[j]]
        B[tr, j] = y[tr, tgt_of[j]]
    Mc = masks[fold_of].T.astype(np.float64)
    bn = np.linalg.norm(B, axis=0)
    safe = np.where(bn > 0, bn, 1.0)

    def kmul(op: Any, V: np.ndarray) -> np.ndarray:
        out = op.matvec(V)
        out -= op.shift * V
        return out

    X = np.zeros((n, c))
    KX = np.zeros((n, c))
    R = B.copy()
    rel = np.where(bn > 0, 1.0, 0.0)
    reason: list = [None] * c
    inner_op = op32 if op32 is not None else op64
    cap = int(max_iter or C.DEFAULT_MAX_ITER)
    count = {"passes32": 0, "passes64": 0, "iters": 0}

    def refine_to(target: np.ndarray) -> None:
        """Iterative refinement until every live column's float64 residual <= target:
        the solvers' one refinement loop
        (:func:`pipeline.linalg.cg_mixed.iterative_refinement`) with this step."""

        def step(_k: int, todo: np.ndarray, inner: np.ndarray) -> bool:
            """One refinement step of the live columns ``todo``: block PCG on the correction
            equations (float32 products when ``op32``), then the float64 residuals."""
            res = block_pcg(
                lambda V: kmul(inner_op, V),
                R[:, todo],
                col_shift[todo],
                fold_of[todo],
                masks,
                pre,
                tol=inner,
                max_iter=cap,
            )
            count["iters"] += res.n_iter
            count["passes32" if op32 is not None else "passes64"] += res.n_products
            for k, j in enumerate(todo):
                if res.reason[k] in ("nonfinite", "breakdown", "stagnation"):
                    reason[j] = res.reason[k]
            ok = np.array([reason[j] is None for j in todo])
            todo = todo[ok]
            if not todo.size:
                return False
            X[:, todo] += res.x[:, ok]
            # float64 residual (and the held-out predictions) of every updated column
            KX[:, todo] = kmul(op64, X[:, todo])
            count["passes64"] += 1
            if not np.all(np.isfinite(KX[:, todo])):
                for j in todo[~np.all(np.isfinite(KX[:, todo]), axis=0)]:
                    reason[j] = "nonfinite"
            R[:, todo] = B[:, todo] - KX[:, todo] * Mc[:, todo] - X[:, todo] * col_shift[todo]
            rel[todo] = np.linalg.norm(R[:, todo], axis=0) / safe[todo]
            stats.setdefault("refinement_residuals", []).append(float(np.max(rel[todo])))
            for k, j in enumerate(todo):
                if res.reason[ok.nonzero()[0][k]] == "max_iter" and rel[j] > target[j]:
                    reason[j] = "max_iter"
            return True

        iterative_refinement(
            rel,
            target,
            step,
            max_steps=C.CV_MAX_REFINEMENTS,
            inner_floor=C.CV_INNER_TOL if op32 is not None else 0.0,
            live=lambda: np.array([r is None for r in reason]),
        )

    def predictions() -> list[list[Any]]:
        out: list[list[Any]] = [[None] * L for _ in range(nf)]
        for li in range(L):
            for f, te in enumerate(tests):
                cols = (li * nf + f) * t + np.arange(t)
                if all(reason[j] is None for j in cols):
                    block = KX[np.ix_(te, cols)]  # columns: the t targets in order
                    out[f][li] = np.ldexp(block, -e) if scaled else block
        return out

    target = np.full(c, float(tol))
    if screen_tol is not None and screen_tol > tol and refine is not None:
        # screening: every system to screen_tol, then only the chosen λ to tol
        target[:] = float(screen_tol)
        refine_to(target)
        screen_passes = (count["passes32"], count["passes64"])
        keep = sorted({int(li) for li in refine(predictions())})
        target[np.isin(lam_of, keep)] = float(tol)
        stats["screened_lambdas"] = stats.get("screened_lambdas", 0) + L - len(keep)
        stats.setdefault("screen", []).append(
            {
                "screen_tol": float(screen_tol),
                "refined_lambda_indices": keep,
                "passes_float32": screen_passes[0],
                "passes_float64": screen_passes[1],
            }
        )
    refine_to(target)
    for j in range(c):
        if reason[j] is None and not rel[j] <= target[j]:
            reason[j] = "max_iter"
    iters, passes32, passes64 = count["iters"], count["passes32"], count["passes64"]
    stats["cg_iterations"] = stats.get("cg_iterations", 0) + iters
    stats["cg_matvecs"] = stats.get("cg_matvecs", 0) + passes32 + passes64
    stats["cg_passes_float32"] = stats.get("cg_passes_float32", 0) + passes32
    stats["cg_passes_float64"] = stats.get("cg_passes_float64", 0) + passes64
    stats["cg_solves"] = stats.get("cg_solves", 0) + c
    failed: dict[tuple[int, int], dict] = {}
    for j in range(c):
        if reason[j] is not None:
            key = (int(lam_of[j]), int(fold_of[j]))
            failed.setdefault(
                key,
                {
                    "lambda_index": key[0],
                    "fold": key[1],
                    "shift": float(col_shift[j]),
                    "reason": reason[j],
                    "rel_residual": float(rel[j]),
                },
            )
    if failed:
        stats["cg_not_converged"] = stats.get("cg_not_converged", 0) + len(failed)
        if failures is None:
            raise UnconvergedSolveError(
                f"{len(failed)} CV solve(s) did not reach tol={tol:.1e}: "
                f"{list(failed.values())[:3]}; a diverged solve is never scored"
            )
        failures.extend(failed[k] for k in sorted(failed))
    log.info(
        "block CV: %d columns, rank %d, %d iterations, %d float32 + %d float64 passes, "
        "max residual %.2e, %d unconverged, %.1f s",
        c,
        pre.rank,
        iters,
        passes32,
        passes64,
        float(np.max(np.where(np.isfinite(rel), rel, np.inf))) if c else 0.0,
        len(failed),
        time.perf_counter() - t0,
    )
    return predictions()
