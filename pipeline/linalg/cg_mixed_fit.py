"""Mixed-precision CG as one fit runs it: checkpointed, resumable, never worse than float64.

:func:`pipeline.linalg.cg_mixed.mixed_precision_cg` does the arithmetic (float32
kernel products inside, float64 residuals outside). This module wraps it for
:func:`pipeline.fit.execute` (``FitPlan.cg_precision == "mixed"``):

- **Checkpoints.** After each outer step the float64 iterate is saved with
  :class:`pipeline.linalg.cg_checkpoint.CGCheckpoint` (two slots, checksummed,
  marker last); a killed solve resumes from it (its residual is recomputed with one
  float64 product). The fingerprint is the float64 solve's plus ``precision``, so a
  float64 checkpoint is never mistaken for a mixed one.
- **Fallback.** When the float32 products are too inexact for the conditioning the
  outer residual stops falling (:class:`~pipeline.linalg.cg.CGStagnationError`);
  the solve logs why and goes on with float64 products from the last accepted
  iterate, so choosing ``mixed`` can cost time but never the answer.
- **One result type.** It returns a :class:`~pipeline.linalg.cg.CGResult`, like
  float64 CG: ``n_iter`` counts the inner (float32) iterations plus any float64
  ones, ``n_matvec`` all products.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

import pipeline.errors as errors
from pipeline.constants import MIXED_INNER_PATIENCE, MIXED_INNER_TOL
from pipeline.linalg.cg import (
    CGResult,
    CGStagnationError,
    CGState,
    conjugate_gradient,
)
from pipeline.linalg.cg_checkpoint import CGCheckpoint, cg_fingerprint, resumable_cg
from pipeline.linalg.cg_mixed import float32_twin, mixed_precision_cg
from pipeline.linalg.precond import IdentityPreconditioner

__all__ = ["mixed_cg_fit"]

log = logging.getLogger(__name__)


def _state(x: np.ndarray, rel: float, k: int) -> CGState:
    """A checkpointable state holding only the outer iterate (its residual is
    recomputed on resume)."""
    col = x.reshape(-1, 1)
    zero = np.zeros_like(col)
    return CGState(
        x=col,
        r=zero,
        p=zero,
        z=zero,
        rz=np.zeros(1),
        b_norm=np.ones(1),
        active=np.array([True]),
        iteration=int(k),
        n_matvec=0,
        history=[np.array([float(rel)])],
    )


def _one_column(
    op: Any,
    b: np.ndarray,
    *,
    preconditioner: Any,
    tol: float,
    max_iter: int,
    store: str | None,
    name: str,
    callback: Callable[[Any], Any] | None,
    low: Any = None,
) -> CGResult:
    t0 = time.perf_counter()
    ckpt = x0 = None
    start = 0
    if store is not None:
        pre = preconditioner if preconditioner is not None else IdentityPreconditioner()
        what = {"precision": "mixed"}
        if low is not None:  # inner products from another operator (a float32 Gram)
            what["low"] = low.fingerprint
        fp = cg_fingerprint(op.fingerprint, pre.fingerprint, b, tol, what)
        ckpt = CGCheckpoint(store, fp, name=f"{name}-mixed", every=1)
        saved = ckpt.load()
        if saved is not None:
            x0, start = saved.x.reshape(b.shape), int(saved.iteration)
            log.info("resuming mixed-precision CG %r from outer step %d", name, start)

    def on_outer(k: int, x: np.ndarray, rel: float) -> None:
        state = _state(x, rel, start + k)
        if ckpt is not None:
            ckpt.save(state)
        if callback is not None:
            callback(state)

    low = float32_twin(op) if low is None else low
    try:
        mixed = mixed_precision_cg(
            op.matvec,
            low.matvec,
            b,
            preconditioner=preconditioner,
            tol=tol,
            inner_tol=max(MIXED_INNER_TOL, tol),
            inner_patience=MIXED_INNER_PATIENCE,
            max_inner=max_iter,
            x0=x0,
            on_outer=on_outer,
        )
    except CGStagnationError as err:
        log.warning(
            "mixed-precision CG %r: %s Going on with float64 products from the last "
            "accepted iterate.",
            name,
            err,
        )
        # one iteration budget for the whole solve: what the float32 iterations left
        left = max(1, max_iter - err.n_inner)
        kw = dict(preconditioner=preconditioner, tol=tol, max_iter=left, x0=err.x)
        if store is not None:
            res = resumable_cg(op, b, store, name=f"{name}-float64", callback=callback, **kw)
        else:
            res = conjugate_gradient(op.matvec, b, callback=callback, **kw)
        res.n_matvec += err.n_matvec_low + err.n_matvec_high
        res.n_iter += err.n_inner  # the float32 iterations before the fallback too
        res.wall_time = time.perf_counter() - t0
        return res
    if not mixed.converged:  # as float64 CG does: a result short of tol is never silent
        warnings.warn(
            f"mixed-precision CG {name!r} did not converge: relative residual "
            f"{mixed.rel_residual:.3e} > tol {tol:.1e} after {mixed.n_inner} inner iterations. "
            "Raise max_iter, use a preconditioner (e.g. 'nystrom'), loosen tol, or use "
            "cg_precision='float64'.",
            errors.CGConvergenceWarning,
            stacklevel=3,
        )
    hist = np.asarray(mixed.history, dtype=np.float64).reshape(-1, 1)
    return CGResult(
        x=mixed.x,
        converged=bool(mixed.converged),
        n_iter=int(mixed.n_inner),
        start_iter=start,
        n_matvec=int(mixed.n_matvec_low + mixed.n_matvec_high),
        rel_residual=np.array([mixed.rel_residual]),
        history=hist,
        tol=float(tol),
        max_iter=int(max_iter),
        wall_time=time.perf_counter() - t0,
    )


def mixed_cg_fit(
    op: Any,
    y: np.ndarray,
    *,
    preconditioner: Any = None,
    tol: float = 1e-6,
    max_iter: int = 1000,
    store: str | None = None,
    name: str = "cg",
    callback: Callable[[Any], Any] | None = None,
    low: Any = None,
) -> CGResult:
    """Solve ``op x = y`` to a float64 relative residual ``tol`` with float32 inner products.

    Parameters
    ----------
    op : MatrixFreeKernelOperator
        The float64 operator ``K + μI`` (its float32 twin does the inner products).
    y : ndarray of shape (n,) or (n, outputs)
        Each column is solved on its own (checkpoint ``{name}-mixed`` or
        ``{name}-{j}-mixed``).
    preconditioner, tol, max_iter : as for :func:`pipeline.linalg.cg.conjugate_gradient`
        ``max_iter`` bounds each inner solve.
    store : str, optional
        Checkpoint directory (as ``resumable_cg``'s); None: no checkpoints.
    callback : callable, optional
        Called with a :class:`~pipeline.linalg.cg.CGState` after each outer step.
    low : operator, optional
        The inner products' operator; default ``op``'s float32 twin. A stored
        float32 Gram (:class:`~pipeline.linalg.matvec.StoredKernelOperator`)
        is one: CG on it alone converges to the rounded Gram's solution, and
        ``op`` (float64, matrix-free from X) turns that into the float64 one.

    Returns
    -------
    CGResult
    """
    y = np.asarray(y, dtype=np.float64)
    if y.ndim == 1:
        return _one_column(
            op, y, preconditioner=preconditioner, tol=tol, max_iter=max_iter,
            store=store, name=name, callback=callback, low=low,
        )  # fmt: skip
    parts = [
        _one_column(
            op,
            y[:, j],
            preconditioner=preconditioner,
            tol=tol,
            max_iter=max_iter,
            store=store,
            name=f"{name}-{j}",
            callback=callback,
            low=low,
        )  # fmt: skip
        for j in range(y.shape[1])
    ]
    rows = max(p.history.shape[0] for p in parts)
    hist = np.full((rows, len(parts)), np.nan)
    for j, p in enumerate(parts):
        hist[: p.history.shape[0], j] = p.history[:, 0]
    return CGResult(
        x=np.column_stack([p.x for p in parts]),
        converged=all(p.converged for p in parts),
        n_iter=max(p.n_iter for p in parts),
        start_iter=min(p.start_iter for p in parts),
        n_matvec=sum(p.n_matvec for p in parts),
        rel_residual=np.concatenate([np.ravel(p.rel_residual) for p in parts]),
        history=hist,
        tol=float(tol),
        max_iter=int(max_iter),
        wall_time=sum(p.wall_time for p in parts),
    )
