"""Mixed-precision CG: float32 kernel products, float64 answers (iterative refinement).

The outer loop keeps ``x`` and the residual ``r = b - A x`` in float64, with
``A`` applied in float64 (one exact product per outer step). Each inner solve
is preconditioned CG on the correction equation ``A₃₂ d = r`` with the float32
kernel operator (the fused engine evaluates kernel entries in float32 and sums
in float64, about 1.6x the float64 rate), run to a modest relative tolerance
``inner_tol``; then ``x += d``. Each outer step multiplies the residual by
about ``max(inner_tol, κ·δ)`` where δ is the relative error of the float32
product, so a relative residual of 1e-10 is reached in a few outer steps
whenever ``κ·δ`` is well below 1, without float64 products throughout.

When the float32 error is too large for the conditioning (``κ·δ`` near 1) the
outer residual stops falling; the solve then raises
:class:`pipeline.linalg.cg.CGStagnationError` suggesting float64 products.

A ``b`` far from 1 in magnitude is solved scaled by an exact power of two, as
float64 CG does (:func:`pipeline.float_range.pow2_exponents`): its norms would
underflow or overflow, and its float32 products round to zero below about 1e-45.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import pipeline.errors as errors
from pipeline.float_range import pow2_exponents
from pipeline.linalg.cg import (
    CGDivergenceError,
    CGStagnationError,
    check_operator_kernel,
    conjugate_gradient,
)
from pipeline.linalg.matvec import MatrixFreeKernelOperator

__all__ = ["MixedCGResult", "float32_twin", "iterative_refinement", "mixed_precision_cg"]

log = logging.getLogger(__name__)


@dataclass
class MixedCGResult:
    """Outcome of :func:`mixed_precision_cg`.

    Attributes
    ----------
    x : ndarray, the float64 solution (layout of ``b``)
    converged : bool, the float64 relative residual reached ``tol``
    rel_residual : float, final float64 relative residual
    n_outer : int, refinement steps (float64 products)
    n_inner : int, inner CG iterations in total (float32 products)
    n_matvec_low, n_matvec_high : int, products in each precision
    history : ndarray (n_inner + 1,), relative residual per inner iteration,
        estimated as (outer residual) x (inner relative residual)
    outer_history : list of (inner iterations so far, float64 relative residual)
    wall_time : float
    """

    x: np.ndarray
    converged: bool
    rel_residual: float
    n_outer: int
    n_inner: int
    n_matvec_low: int
    n_matvec_high: int
    history: np.ndarray
    outer_history: list
    wall_time: float


class _FloorStop:
    """Callback: stop the inner CG when it stops making progress (float32 floor)."""

    def __init__(self, patience: int) -> None:
        self.patience, self.best, self.since = int(patience), np.inf, 0

    def __call__(self, st: Any) -> bool:
        cur = float(np.max(st.history[-1]))
        if cur < 0.9 * self.best:
            self.best, self.since = cur, 0
        else:
            self.since += 1
        return self.since >= self.patience


def iterative_refinement(
    rel: np.ndarray,
    target: np.ndarray,
    step: Callable[[int, np.ndarray, np.ndarray], bool],
    *,
    max_steps: int,
    inner_floor: float,
    margin: float = 1.0,
    live: Callable[[], np.ndarray] | None = None,
) -> int:
    """The one outer loop of iterative refinement: while a column's float64
    relative residual ``rel`` is above its ``target``, solve its correction equation to
    a modest tolerance and recompute the residual with float64 products.

    The loop owns the control: which columns still need work (``rel > target`` and
    ``live()``), the inner tolerance each needs, ``max(margin · target / rel,
    inner_floor)`` capped at 0.5 (asking no more than the outer target needs, no less
    than the floor of the inner products), and the step count. ``step(k, cols, inner)``
    does step k for the columns ``cols`` with the inner tolerances ``inner``: the inner
    solve (``x += d``), the float64 residual, ``rel[cols]`` updated in place and any
    failure recorded (or raised); it returns False to end the refinement.
    :func:`mixed_precision_cg` (one right-hand side, the whole solve's inner budget) and
    the block CV's refinement (:func:`pipeline.models.selection.cvblock.block_cv_predictions`,
    every (λ, fold, target) column, failing columns frozen) are its two calls.

    Returns the number of steps taken.
    """
    k = 0
    while k < max_steps:
        todo = rel > target
        if live is not None:
            todo &= live()
        cols = np.flatnonzero(todo)
        if not cols.size:
            break
        k += 1
        inner = np.maximum(margin * target[cols] / np.maximum(rel[cols], 1e-300), inner_floor)
        if not step(k, cols, np.minimum(inner, 0.5)):
            break
    return k


def float32_twin(op: Any) -> Any:
    """The same matrix-free operator with float32 kernel tiles
    (``MatrixFreeKernelOperator(..., kernel_dtype="float32")``)."""
    if not isinstance(op, MatrixFreeKernelOperator):
        raise ValueError(
            f"mixed precision needs a matrix-free operator (it recomputes the kernel in float32), "
            f"got {type(op).__name__}; use float64 CG for a stored Gram"
        )
    return MatrixFreeKernelOperator(
        op.X,
        op.kernel,
        op.shift,
        block_size=op.grid.block_size,
        kernel_dtype="float32",
        n_threads=op.n_threads,
    )


def mixed_precision_cg(
    matvec_high: Callable[[np.ndarray], np.ndarray],
    matvec_low: Callable[[np.ndarray], np.ndarray],
    b: np.ndarray,
    *,
    preconditioner: Any = None,
    tol: float = 1e-10,
    inner_tol: float = 1e-3,
    inner_patience: int = 3,
    max_outer: int = 30,
    max_inner: int = 1000,
    stagnation_window: int | None = 200,
    x0: np.ndarray | None = None,
    on_outer: Callable[[int, np.ndarray, float], Any] | None = None,
) -> MixedCGResult:
    """Solve ``A x = b`` to a float64 relative residual ``tol`` with cheap inner products.

    Parameters
    ----------
    matvec_high : callable
        ``V -> A V`` in float64 (the exact operator), used once per outer step.
    matvec_low : callable
        ``V -> A V`` with float32 kernel entries (e.g. :func:`float32_twin`).
    b : ndarray, shape (n,)
    preconditioner : object with ``apply(R)``, optional
    tol : float
        Target ``‖b - A x‖ / ‖b‖`` with the float64 product.
    inner_tol : float
        Relative tolerance of each inner solve (on its own right-hand side).
    inner_patience : int
        An inner solve also ends when its residual has not fallen by 10% in this
        many iterations: it has reached the floor of the float32 product, and
        the next float64 residual takes over.
    max_outer, max_inner : int
        Refinement steps; inner (float32) iterations of the whole solve, all inner
        solves together (as ``max_iter`` bounds a float64 CG).
    stagnation_window : int or None
        Passed to the inner CG.
    x0 : ndarray, optional
        Starting point (e.g. a checkpointed outer iterate); its float64 residual is
        computed first (one more float64 product).
    on_outer : callable ``(k, x, rel)``, optional
        Called after each accepted outer step with the float64 iterate and its
        relative residual (e.g. to checkpoint it).

    Raises
    ------
    CGStagnationError
        An outer step failed to halve the residual: the float32 products are
        too inexact for this conditioning (use float64 CG or Cholesky). Its
        ``x`` attribute holds the last accepted iterate, so a float64 solve can
        go on from there.
    CGDivergenceError
        NaN or inf anywhere.
    """
    check_operator_kernel(matvec_high)
    check_operator_kernel(matvec_low)
    b = np.asarray(b, dtype=np.float64)
    if b.ndim != 1:
        raise ValueError(f"mixed_precision_cg solves one right-hand side (n,), got {b.shape}")
    if not np.all(np.isfinite(b)):
        raise ValueError("the right-hand side y contains NaN or infinite values; clean it first")
    if not (0 < inner_tol < 1):
        raise ValueError(f"inner_tol must lie in (0, 1), got {inner_tol!r} (e.g. 1e-4)")
    t0 = time.perf_counter()
    # the solve runs on 2**e b (e = 0 for an ordinary b); x and x0 are scaled alike
    e = int(pow2_exponents(np.max(np.abs(b), initial=0.0)))
    b = np.ldexp(b, e) if e else b

    def unscaled(v: np.ndarray) -> np.ndarray:
        return np.ldexp(v, -e) if e else v

    b_norm = float(np.linalg.norm(b))
    x = np.zeros_like(b)
    if b_norm == 0:
        return MixedCGResult(x, True, 0.0, 0, 0, 0, 0, np.zeros(1), [(0, 0.0)], 0.0)
    n_inner = n_low = n_high = 0
    if x0 is None:
        r = b.copy()
    else:
        x = np.array(x0, dtype=np.float64).reshape(b.shape)
        x = np.ldexp(x, e) if e else x
        r = b - np.asarray(matvec_high(x), dtype=np.float64).reshape(b.shape)
        n_high += 1
    rel = np.array([float(np.linalg.norm(r)) / b_norm])  # the refinement loop's state
    history = [float(rel[0])]
    outer = [(0, float(rel[0]))]

    def step(k: int, _cols: np.ndarray, itol: np.ndarray) -> bool:
        nonlocal x, r, n_inner, n_low, n_high
        old = float(rel[0])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", errors.CGConvergenceWarning)
            res = conjugate_gradient(
                matvec_low,
                r,
                preconditioner=preconditioner,
                tol=float(itol[0]),  # max(inner_tol, 0.5 tol / rel), at most 0.5
                max_iter=max_inner - n_inner,  # what the budget has left
                true_residual_every=0,
                stagnation_window=stagnation_window,
                callback=_FloorStop(inner_patience),
            )
        n_inner += res.n_iter
        n_low += res.n_matvec
        history.extend((old * res.history[1:, 0]).tolist())
        accepted, x = x, x + res.x
        r = b - np.asarray(matvec_high(x), dtype=np.float64).reshape(b.shape)
        n_high += 1
        if not np.all(np.isfinite(r)):
            raise CGDivergenceError(
                f"mixed-precision CG diverged at outer step {k} (NaN or inf residual); "
                "use float64 CG or the Cholesky solver"
            )
        new = float(np.linalg.norm(r)) / b_norm
        history[-1] = new
        outer.append((n_inner, new))
        log.info("mixed CG: outer %d, %d inner iterations, rel. residual %.3e", k, n_inner, new)
        if n_inner >= max_inner:  # the budget ran out, not the precision: an unconverged
            if new <= old:  # result (max_iter reached) with the better iterate, never
                rel[0] = new  # "stagnation" (and no float64 fallback past max_iter)
            else:
                x = accepted
            if on_outer is not None:
                on_outer(k, unscaled(x), float(rel[0]))
            return False
        if new > 0.5 * old:
            err = CGStagnationError(
                f"mixed-precision CG stagnated at outer step {k}: the float64 relative residual "
                f"went from {old:.3e} to {new:.3e} (target {tol:.1e}). The float32 products are "
                "too inexact for this conditioning: use float64 products (kernel_dtype="
                "'float64'), solver='cholesky', a larger lambda or a higher preconditioner rank."
            )
            err.x = unscaled(accepted)  # the last accepted iterate
            err.n_matvec_low, err.n_matvec_high, err.n_inner = n_low, n_high, n_inner
            raise err
        rel[0] = new
        if on_outer is not None:
            on_outer(k, unscaled(x), new)
        return True

    k = iterative_refinement(
        rel,
        np.array([tol], dtype=np.float64),
        step,
        max_steps=max_outer if max_inner > 0 else 0,
        inner_floor=inner_tol,
        margin=0.5,
    )
    rel = float(rel[0])
    return MixedCGResult(
        x=unscaled(x),
        converged=rel <= tol,
        rel_residual=rel,
        n_outer=k,
        n_inner=n_inner,
        n_matvec_low=n_low,
        n_matvec_high=n_high,
        history=np.asarray(history),
        outer_history=outer,
        wall_time=time.perf_counter() - t0,
    )
