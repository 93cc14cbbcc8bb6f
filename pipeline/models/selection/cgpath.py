"""K-fold CV on the CG path: one operator, one preconditioner factor, warm starts over λ.

For a kernel setting, every fold's system ``(K_TT + s I) x = y_T`` is solved
with products by the *full* K (stored tiles or recomputed from X): the folds'
vectors are zero-padded to length n, stacked as the columns of one block, and
multiplied in one pass over the tiles. The folds are stacked into one long
vector, so CG runs on the block-diagonal system of all folds at once.

- one Nyström factor ``F`` (``K ≈ F Fᵀ``, randomly pivoted Cholesky, by
  :func:`~pipeline.linalg.precond.build_nystrom`) per kernel setting; each fold's
  preconditioner is ``(F_T F_Tᵀ + s I)⁻¹`` in the one fold form,
  :class:`~pipeline.linalg.precond.FoldNystromBlock` (one r x r eigendecomposition
  per fold, applied to the stacked vectors padded to n rows), and only its diagonal
  coefficients change with λ (the one fold form of every CG search; the ``band``
  solver's checkpoints carry its recipe version,
  :data:`pipeline.models.selection.checkpoint.PREDICTIONS_RECIPE`);
- λ values are solved from the largest (best conditioned) to the smallest,
  each warm-started from the previous solution;
- held-out predictions ``K_VT x_T`` for every fold and λ come from one more
  product at the end.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

import pipeline.constants as C
from pipeline.linalg.cg import CGConvergenceError, CGConvergenceWarning, conjugate_gradient
from pipeline.linalg.precond import FoldNystromBlock, NystromFactor, build_nystrom
from pipeline.models.selection.direct import UnconvergedSolveError
from pipeline.plan.cv_routing import cg_rank

__all__ = ["cg_fold_predictions"]


def _kernel_product(op: Any, V: np.ndarray) -> np.ndarray:
    """``K V`` from an operator computing ``(K + shift I) V``."""
    return op.matvec(V) - op.shift * V


def cg_fold_predictions(
    op: Any,
    y: np.ndarray,
    trains: list[np.ndarray],
    tests: list[np.ndarray],
    shifts: np.ndarray,
    *,
    preconditioner: str = "nystrom",
    rank: int | None = None,
    tol: float = C.CV_TOL,
    max_iter: int | None = None,
    random_state: Any = 0,
    warm_start: bool = True,
    factor: NystromFactor | None = None,
    stats: dict | None = None,
    failures: list | None = None,
) -> list[list[np.ndarray]]:
    """Held-out predictions ``preds[f][l]`` for each fold f and shift row ``shifts[l]``.

    Parameters
    ----------
    op : KernelOperator
        Products with the full K (``pipeline.linalg.matvec.make_operator``).
    y : ndarray (n, t)
    trains, tests : lists of index arrays, one per fold
    shifts : ndarray (n_lambda, n_folds)
        Diagonal shift of every (λ, fold) system; solved in decreasing order of
        the row mean, each row warm-started from the previous one.
    preconditioner : {"nystrom", "adaptive", "none"}
        ``"adaptive"``: one RPCholesky factor whose rank grows until it resolves K
        at the smallest shift of the grid (:func:`~pipeline.linalg.precond.build_nystrom`
        with ``centres="adaptive"``), shared by every fold and λ as the Nyström factor is.
    rank : int, optional
        Nyström rank (default ``min(n, 200)``); with ``"adaptive"``, a cap on the rank.
        Both within the caps the search's cost model prices
        (:func:`pipeline.plan.cv_routing.cg_rank`).
    warm_start : bool
        Start each λ from the previous λ's solution (else from zero).
    factor : NystromFactor, optional
        A Nyström factor (``K ≈ F Fᵀ``) already built for this kernel (the routing's,
        :class:`~pipeline.models.selection.route.Route`): used
        instead of building one (``preconditioner="nystrom"``).
    failures : list, optional
        A λ whose solve does not reach ``tol`` (NaN, divergence, stagnation,
        ``max_iter``) is never scored: it is appended here as a dict (``lambda_index``,
        ``reason``, ``rel_residual``) and its predictions are None, for the caller to
        redo exactly (:mod:`pipeline.models.selection.direct`). Without the list such
        a solve raises :class:`~pipeline.models.selection.direct.UnconvergedSolveError`.
    """
    stats = stats if stats is not None else {}
    n, t = y.shape
    nf = len(trains)
    offs = np.concatenate([[0], np.cumsum([len(tr) for tr in trains])])
    m = int(offs[-1])

    pre: FoldNystromBlock | None = None
    if preconditioner == "nystrom":
        built = factor
        if built is None:
            r = cg_rank(n, nf, "nystrom", rank)  # the rank the search's cost model prices
            built = build_nystrom(op, centres="rpcholesky", rank=r, random_state=random_state)
        stats["preconditioner_builds"] = stats.get("preconditioner_builds", 0) + 1
        pre = built.folds(trains)
    elif preconditioner == "adaptive":
        cap = cg_rank(n, nf, "adaptive", rank)  # the cap the search's cost model prices
        pre = build_nystrom(
            op,
            centres="adaptive",
            shift=float(np.min(shifts)),
            max_rank=cap,
            memory_budget=None,
            random_state=random_state,
        ).folds(trains)
        stats["preconditioner_builds"] = stats.get("preconditioner_builds", 0) + 1
    elif preconditioner not in ("none", None):
        raise ValueError(
            f"preconditioner={preconditioner!r} is not supported by the CV search; "
            "use 'nystrom', 'adaptive' or 'none'"
        )

    def scatter(v: np.ndarray) -> np.ndarray:
        """(m, k) stacked fold vectors -> (n, nf * k) zero-padded columns."""
        k = v.shape[1]
        P = np.zeros((n, nf * k))
        for f, tr in enumerate(trains):
            P[tr, f * k : (f + 1) * k] = v[offs[f] : offs[f + 1]]
        return P

    def make_matvec(srow: np.ndarray):
        def mv(v: np.ndarray) -> np.ndarray:
            k = v.shape[1]
            KP = _kernel_product(op, scatter(v))
            out = np.empty_like(v)
            for f, tr in enumerate(trains):
                out[offs[f] : offs[f + 1]] = (
                    KP[tr, f * k : (f + 1) * k] + srow[f] * v[offs[f] : offs[f + 1]]
                )
            return out

        return mv

    masks: dict[int, np.ndarray] = {}  # k -> (n, nf * k): 1 on each column's fold rows

    class _Stacked:
        """The fold preconditioner on the stacked vectors: padded to one column per
        (fold, column), the block form applied with each fold's shift, gathered back."""

        def __init__(self, srow: np.ndarray) -> None:
            self.srow = srow

        def apply(self, R: np.ndarray) -> np.ndarray:
            R = R.reshape(R.shape[0], -1)
            if pre is None:
                return R.copy(order="K")  # (the layout CG gave)
            k = R.shape[1]
            if k not in masks:
                masks[k] = scatter(np.ones((m, k)))
            folds = np.repeat(np.arange(nf), k)
            Z = pre.apply(scatter(R), folds, np.repeat(self.srow, k).astype(float), masks[k])
            out = np.empty_like(R)
            for f, tr in enumerate(trains):
                out[offs[f] : offs[f + 1]] = Z[tr, f * k : (f + 1) * k]
            return out

    b = np.concatenate([y[tr] for tr in trains], axis=0)  # (m, t)
    order = np.argsort(-shifts.mean(axis=1), kind="stable")
    sols: dict[int, np.ndarray] = {}
    x0 = None
    failed: dict[int, dict] = {}
    for li in order:
        srow = shifts[li]
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", CGConvergenceWarning)
                res = conjugate_gradient(
                    make_matvec(srow),
                    b,
                    x0=x0,
                    preconditioner=_Stacked(srow),
                    tol=tol,
                    max_iter=max_iter,
                )
        except CGConvergenceError as exc:  # divergence (NaN/inf) or stagnation
            failed[int(li)] = {
                "lambda_index": int(li),
                "reason": type(exc).__name__,
                "message": str(exc)[:300],
            }
            stats["cg_not_converged"] = stats.get("cg_not_converged", 0) + 1
            continue
        stats["cg_iterations"] = stats.get("cg_iterations", 0) + int(res.n_iter)
        stats["cg_matvecs"] = stats.get("cg_matvecs", 0) + int(res.n_matvec)
        stats["cg_solves"] = stats.get("cg_solves", 0) + 1
        if not res.converged or not np.all(np.isfinite(res.x)):
            stats["cg_not_converged"] = stats.get("cg_not_converged", 0) + 1
            failed[int(li)] = {
                "lambda_index": int(li),
                "reason": "max_iter" if res.n_iter >= res.max_iter else "breakdown",
                "rel_residual": float(np.max(res.rel_residual)),
                "n_iter": int(res.n_iter),
            }
            continue
        sols[int(li)] = res.x.reshape(m, t)
        x0 = sols[int(li)] if warm_start else None
    if failed and failures is None:
        raise UnconvergedSolveError(
            f"CG did not reach tol={tol:.1e} for the shifts {[shifts[i].tolist() for i in failed]}"
            f" ({sorted({f['reason'] for f in failed.values()})}); a diverged solve is never "
            "scored: use an exact solver, a larger lambda or a stronger preconditioner"
        )
    if failures is not None:
        failures.extend(failed[li] for li in sorted(failed))
    # one product for every (λ, fold): columns ordered (λ, fold, target)
    L = shifts.shape[0]
    good = [li for li in range(L) if li in sols]
    preds: list[list[Any]] = [[None] * L for _ in tests]
    if not good:
        return preds
    Xall = np.concatenate([sols[li] for li in good], axis=1)  # (m, G * t)
    KP = _kernel_product(op, scatter(Xall))  # (n, nf * G * t)
    stats["cg_matvecs"] = stats.get("cg_matvecs", 0) + 1
    k = len(good) * t
    for f, te in enumerate(tests):
        block = KP[te, f * k : (f + 1) * k]
        for gi, li in enumerate(good):
            preds[f][li] = block[:, gi * t : (gi + 1) * t]
    return preds
