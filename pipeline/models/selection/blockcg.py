"""Block PCG over many shifted fold systems at once: one kernel pass per iteration.

Every column ``c`` of the block is its own system

    (M_c K M_c + s_c I) x_c = M_c y,

where ``M_c`` is the 0/1 diagonal of fold ``f_c``'s training rows and ``s_c``
its shift (λ or n_train·λ). Columns are zero-padded to the full n rows, so
the product of *every* (fold, λ, target) column with the full K is one pass of
the fused engine (``kmul``), and the kernel entries evaluated in that pass are
shared by all of them. Each column runs its own preconditioned CG (own step
sizes; converged columns leave the product), so several λ are solved together
instead of one after the other. The iteration is the package's one CG loop,
:func:`pipeline.linalg.cg.conjugate_gradient`, given a column-aware operator and
preconditioner.

The preconditioner (:class:`~pipeline.linalg.precond.FoldNystromBlock`) is one Nyström factor ``F``
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

from pipeline.constants import STAGNATION_WINDOW
from pipeline.linalg.cg import conjugate_gradient
from pipeline.linalg.precond import FoldNystromBlock  # its one home: the Nyström module

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

    One call of :func:`pipeline.linalg.cg.conjugate_gradient` (the package's one CG
    loop) with a column-aware operator ``V -> M_c K V + s_c V`` and preconditioner,
    no true-residual checks (the caller's refinement computes the float64 residual)
    and failing columns frozen with their reason instead of raising.

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

    def matvec(V: np.ndarray, cols: np.ndarray) -> np.ndarray:
        AV = np.asarray(kmul(V), dtype=np.float64)
        AV *= Mc[:, cols]
        AV += V * shifts[cols]
        return AV

    class _Columns:
        def apply(self, R: np.ndarray, cols: np.ndarray) -> np.ndarray:
            return precond.apply(R, folds[cols], shifts[cols], Mc[:, cols])

    res = conjugate_gradient(
        matvec,
        B,
        preconditioner=_Columns(),
        tol=tol,
        max_iter=max_iter,
        true_residual_every=0,
        stagnation_window=stagnation_window,
        confirm=False,
        column_operator=True,
        column_failures="freeze",
        warn=False,
        start_dots="active",
    )
    return BlockCGResult(
        x=res.x, rel=res.rel_residual, reason=res.column_reason, n_iter=res.n_iter,
        n_products=res.n_matvec,
    )  # fmt: skip
