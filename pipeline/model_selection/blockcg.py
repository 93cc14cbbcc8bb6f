"""Block PCG over many shifted fold systems at once: one kernel pass per iteration.

Every column ``c`` of the block is its own system

    (M_c K M_c + s_c I) x_c = M_c y,

where ``M_c`` is the 0/1 diagonal of fold ``f_c``'s training rows and ``s_c``
its shift (λ or n_train·λ). Columns are zero-padded to the full n rows, so
the product of *every* (fold, λ, target) column with the full K is one pass of
the fused engine (``kmul``), and the kernel entries evaluated in that pass are
shared by all of them. Each column runs its own preconditioned CG (own step
sizes; converged columns leave the product), so several λ are solved together
instead of one after the other.

The preconditioner (:class:`~pipeline.solvers.precond.FoldNystromBlock`) is one Nyström factor ``F``
(``K ≈ F Fᵀ``) of the kernel setting, restricted to each fold's training rows
and applied with a shift per column: ``(F_T F_Tᵀ + s I)⁻¹ = (I - F_T (s I +
F_Tᵀ F_T)⁻¹ F_Tᵀ) / s`` (Woodbury), with ``F_Tᵀ F_T = V diag(w) Vᵀ`` (one r x r
eigendecomposition per fold, shared by every λ: only ``1/(w + s)`` changes).

A column that breaks down (``pᵀAp <= 0``), produces NaN/inf, stagnates or
reaches ``max_iter`` is reported with its reason; it is never silently kept.
A column of ``B`` far from 1 in magnitude is solved scaled by an exact power of two
(:func:`pipeline.float_range.pow2_exponents`), as float64 CG does: its norms and
inner products would underflow or overflow.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from pipeline.float_range import pow2_exponents
from pipeline.policy.constants import STAGNATION_WINDOW
from pipeline.solvers.precond import FoldNystromBlock  # its one home: the Nyström module

__all__ = ["BlockCGResult", "FoldNystromBlock", "block_pcg"]


@dataclass
class BlockCGResult:
    """Outcome of :func:`block_pcg`: per column ``x``, ``rel`` (relative residual of the
    recurrence), ``reason`` (None when it reached ``tol``, else ``"breakdown"``,
    ``"nonfinite"``, ``"stagnation"`` or ``"max_iter"``); ``n_iter``, ``n_products``."""

    x: np.ndarray
    rel: np.ndarray
    reason: list
    n_iter: int
    n_products: int

    @property
    def converged(self) -> np.ndarray:
        return np.array([r is None for r in self.reason])


def _dots(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.einsum("ij,ij->j", a, b)


def block_pcg(
    kmul: Callable[[np.ndarray], np.ndarray],
    B: np.ndarray,
    shifts: np.ndarray,
    folds: np.ndarray,
    masks: np.ndarray,
    precond: FoldNystromBlock,
    *,
    tol: np.ndarray | float,
    max_iter: int,
    stagnation_window: int = STAGNATION_WINDOW,
) -> BlockCGResult:
    """Per-column PCG from zero on the padded fold systems (see the module docstring).

    Parameters
    ----------
    kmul : callable
        ``V -> K V`` for ``V`` of shape (n, k) (the full K).
    B : ndarray (n, c)
        Right-hand sides, zero outside each column's training rows.
    shifts : ndarray (c,)
    folds : ndarray of int (c,)
    masks : ndarray of bool (n_folds, n)
        Training rows of each fold.
    precond : FoldNystromBlock
    tol : float or ndarray (c,)
        Relative residual ``‖r‖ / ‖b‖`` at which a column stops (recurrence residual:
        the caller checks the true residual).
    max_iter : int
    """
    n, c = B.shape
    tol = np.broadcast_to(np.asarray(tol, dtype=np.float64), (c,))
    Mc = masks[folds].T.astype(np.float64)  # (n, c)
    k = pow2_exponents(np.max(np.abs(B), axis=0, initial=0.0))  # 0 for an ordinary column
    scaled = bool(np.any(k))
    X = np.zeros((n, c))
    R = np.ldexp(B, k) if scaled else B.copy()
    bn = np.linalg.norm(R, axis=0)
    safe = np.where(bn > 0, bn, 1.0)
    rel = np.where(bn > 0, 1.0, 0.0)
    reason: list = [None] * c
    active = rel > tol
    P = np.zeros((n, c))
    rz = np.zeros(c)
    act = np.flatnonzero(active)
    if act.size:
        Z = precond.apply(R[:, act], folds[act], shifts[act], Mc[:, act])
        P[:, act] = Z
        rz[act] = _dots(R[:, act], Z)
    best = rel.copy()
    best_at = np.zeros(c, dtype=np.int64)
    it = products = 0

    def stop(cols: np.ndarray, why: str) -> None:
        for col in cols:
            reason[int(col)] = why
        active[cols] = False

    while active.any() and it < max_iter:
        act = np.flatnonzero(active)
        Pa = P[:, act]
        AP = np.asarray(kmul(Pa), dtype=np.float64)
        products += 1
        AP *= Mc[:, act]
        AP += Pa * shifts[act]
        pAp = _dots(Pa, AP)
        bad = ~np.isfinite(pAp) | ~(pAp > 0)
        if bad.any():
            stop(act[bad & ~np.isfinite(pAp)], "nonfinite")
            stop(act[bad & np.isfinite(pAp)], "breakdown")
            keep = ~bad
            act, Pa, AP, pAp = act[keep], Pa[:, keep], AP[:, keep], pAp[keep]
            if not act.size:
                break
        a = rz[act] / pAp
        X[:, act] += Pa * a
        R[:, act] -= AP * a
        it += 1
        rel[act] = np.linalg.norm(R[:, act], axis=0) / safe[act]
        nonfin = act[~np.isfinite(rel[act])]
        if nonfin.size:
            stop(nonfin, "nonfinite")
        active[act[rel[act] <= tol[act]]] = False
        improved = rel < 0.99 * best
        best[improved] = rel[improved]
        best_at[improved] = it
        if stagnation_window:
            stuck = np.flatnonzero(active & (it - best_at >= stagnation_window))
            if stuck.size:
                stop(stuck, "stagnation")
        go = np.flatnonzero(active)
        if go.size:
            Z = precond.apply(R[:, go], folds[go], shifts[go], Mc[:, go])
            rz_new = _dots(R[:, go], Z)
            P[:, go] = Z + P[:, go] * (rz_new / rz[go])
            rz[go] = rz_new
    stop(np.flatnonzero(active), "max_iter")
    X[:, [i for i, r in enumerate(reason) if r == "nonfinite"]] = 0.0
    if scaled:
        X = np.ldexp(X, -k)
    return BlockCGResult(x=X, rel=rel, reason=reason, n_iter=it, n_products=products)
