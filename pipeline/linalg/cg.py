"""Preconditioned conjugate gradients for ``A X = B`` with A symmetric positive definite.

The solver sees only a ``matvec`` closure (``V -> A V`` for ``V`` of shape
``(n, k)``), a preconditioner with ``apply(R) -> M⁻¹ R``, a warm start and a
per-iteration callback. Several right-hand sides are solved together by
per-column CG sharing one product per iteration: the columns keep their own
step sizes (and, if asked, their own tolerance), and converged columns leave the
product.

This is the package's one CG loop. The other iterative solvers are callers:
mixed precision (:mod:`pipeline.linalg.cg_mixed`) is an outer refinement loop
whose inner solves are this loop on the float32 operator; checkpointed solves
(:mod:`pipeline.linalg.cg_checkpoint`) are this loop with a saving callback; the
CV searches run it on their fold systems, stacked
(:mod:`pipeline.models.selection.cgpath`) or as columns each with its own fold and
shift (``column_operator=True``, :mod:`pipeline.models.selection.blockcg`), where a
failing column is frozen with its reason (``column_failures="freeze"``) and the
others go on.

Convergence is on the relative residual ``‖b - A x‖ / ‖b‖ <= tol``. The
residual the recurrence updates drifts from the true one, so the true residual
is recomputed every ``true_residual_every`` iterations (and replaces the
recurrence), and a column is declared converged only after its true residual is
checked. A column likely to pass that check after the next step rides along in that
step's product (``[p_k, x_k]``, :func:`_likely_done`), so the check costs no product of
its own. The whole state (:class:`CGState`) is handed to the callback, which is
how :mod:`pipeline.linalg.cg_checkpoint` saves and resumes solves.

A column of ``b`` whose largest magnitude lies outside about [1e-30, 1e30] is
solved as ``2**k b`` with its largest magnitude in [0.5, 1)
(:func:`pipeline.float_range.pow2_exponents`), and its solution scaled back by
``2**-k``: the norms and inner products are sums of squares, and on a y of order
1e-200 they underflowed to zero (CG stopped at once with alpha = 0) or, near
1e-160, to subnormals (alpha 0.75 % off at tol 1e-8). The power of two is exact,
so the scaled solve's iterates are the unscaled ones' times ``2**k``; ordinary
columns are not scaled at all.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

import pipeline.errors as errors
from pipeline.errors import (
    CGDivergenceError,
    CGStagnationError,
    IndefiniteKernelError,
    SolveNotConverged,
)
from pipeline.float_range import pow2_exponents

#: old names of :class:`pipeline.errors.SolveNotConverged` and
#: :class:`pipeline.errors.IndefiniteKernelError` (the same classes)
CGConvergenceError = SolveNotConverged
CGIndefiniteKernelError = IndefiniteKernelError

__all__ = [
    "CGConvergenceError",
    "CGDivergenceError",
    "CGIndefiniteKernelError",
    "CGStagnationError",
    "CGResult",
    "CGState",
    "Preconditioner",
    "conjugate_gradient",
]


def __getattr__(name: str) -> Any:
    # CGConvergenceWarning is made on first use (it subclasses scikit-learn's
    # ConvergenceWarning: importing this module must not import scikit-learn)
    if name == "CGConvergenceWarning":
        return errors.CGConvergenceWarning
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


log = logging.getLogger(__name__)


#: a column whose best relative residual has not fallen below this fraction of its
#: value ``stagnation_window`` iterations ago is stagnating
STAGNATION_PROGRESS = 0.99


def check_operator_kernel(matvec: Any) -> None:
    """Refuse an operator (or its bound ``matvec``) whose kernel has ``is_mercer`` False.

    CG on an indefinite ``K + λI`` can break down or return a wrong answer
    without noticing. Operators without a ``kernel`` attribute (a stored Gram, a
    plain callable) are not checked here.
    """
    owner = getattr(matvec, "__self__", matvec)
    kernel = getattr(owner, "kernel", None)
    if kernel is not None and not bool(getattr(kernel, "is_mercer", True)):
        raise CGIndefiniteKernelError(
            f"CG needs a positive semi-definite kernel, and {kernel!r} is not one "
            "(is_mercer is False): CG can break down or return a wrong alpha on an indefinite "
            "K + lambda*I. Use the Cholesky solver (it names the shift that fails) or a Mercer "
            "kernel such as rbf."
        )


class Preconditioner(Protocol):
    def apply(self, R: np.ndarray) -> np.ndarray:  # pragma: no cover - protocol
        """Return ``M⁻¹ R`` for ``R`` of shape ``(n, k)``."""


class _Identity:
    def apply(self, R: np.ndarray, cols: Any = None) -> np.ndarray:
        return R.copy()


@dataclass
class CGState:
    """Everything needed to continue a solve (per-column CG).

    Arrays are ``(n, m)``; ``rz``, ``b_norm`` and ``active`` are ``(m,)``.
    ``history`` holds one row of relative residuals per iteration (row 0 is the
    start), from the recurrence or, when recomputed, the true residual.
    ``rhs_exponent`` (``(m,)`` ints, or None: all zero) is the power of two the
    solve scaled each column of ``b`` by: ``x``, ``r``, ``p``, ``z`` (and ``rz``,
    ``b_norm``) are those of ``A x = 2**rhs_exponent * b``, so the solution so far
    is ``np.ldexp(x, -rhs_exponent)``. Not saved with a checkpoint: ``b`` gives it.
    """

    x: np.ndarray
    r: np.ndarray
    p: np.ndarray
    z: np.ndarray
    rz: np.ndarray
    b_norm: np.ndarray
    active: np.ndarray
    iteration: int
    n_matvec: int
    history: list[np.ndarray] = field(default_factory=list)
    rhs_exponent: np.ndarray | None = None

    @property
    def rel_residual(self) -> np.ndarray:
        return self.history[-1]

    def copy(self) -> CGState:
        return CGState(
            *(np.array(a, copy=True) for a in (self.x, self.r, self.p, self.z, self.rz)),
            b_norm=self.b_norm.copy(),
            active=self.active.copy(),
            iteration=self.iteration,
            n_matvec=self.n_matvec,
            history=[h.copy() for h in self.history],
            rhs_exponent=None if self.rhs_exponent is None else self.rhs_exponent.copy(),
        )


@dataclass
class CGResult:
    """Outcome of :func:`conjugate_gradient`.

    Attributes
    ----------
    x : ndarray, shape (n,) or (n, m)
        The solution (same layout as ``b``).
    converged : bool
        Every column reached ``tol`` (true residual).
    n_iter : int
        CG iterations, counted from the start of the solve (a resumed solve
        includes the iterations done before the checkpoint).
    start_iter : int
        Iteration the solve started from (0, or the checkpoint's iteration).
    n_matvec : int
        Operator applications (columns applied together count once), including
        the true-residual recomputations.
    rel_residual : ndarray, shape (m,)
        Final relative residual of each column (true residual where checked).
    history : ndarray, shape (n_iter + 1, m)
        Relative residual per iteration and column.
    tol, max_iter : float (or ndarray (m,): one per column, as given), int
    wall_time : float
        Seconds spent in this call (not counting the time before a resume).
    """

    x: np.ndarray
    converged: bool
    n_iter: int
    start_iter: int
    n_matvec: int
    rel_residual: np.ndarray
    history: np.ndarray
    tol: float
    max_iter: int
    wall_time: float
    column_converged: np.ndarray | None = None
    #: per column: None (reached ``tol``), or why it stopped short: ``"breakdown"``
    #: (``pᵀAp <= 0``), ``"nonfinite"`` and ``"stagnation"`` (with
    #: ``column_failures="freeze"``; else they raise), ``"max_iter"``, or
    #: ``"stopped"`` (by the callback)
    column_reason: list | None = None


def _check_args(b: np.ndarray, tol: Any, max_iter: int | None) -> int:
    tol_a = np.asarray(tol, dtype=np.float64)
    # a relative residual: at tol >= 1, x = 0 already "converged"
    if tol_a.ndim > 1 or not np.all((tol_a > 0) & (tol_a < 1)):
        raise ValueError(f"tol must lie in (0, 1), got {tol!r} (e.g. tol=1e-6)")
    if max_iter is not None and (int(max_iter) != max_iter or max_iter < 1):
        raise ValueError(f"max_iter must be an integer >= 1, got {max_iter!r}")
    if b.ndim not in (1, 2) or b.shape[0] < 1:
        raise ValueError(f"b must have shape (n,) or (n, m) with n >= 1, got {b.shape}")
    if tol_a.ndim == 1 and tol_a.shape != b.shape[1:2]:
        raise ValueError(
            f"tol must be a number or one per column of b {b.shape}, got {tol_a.shape}"
        )
    if not np.all(np.isfinite(b)):
        raise ValueError("the right-hand side y contains NaN or infinite values; clean it first")
    return int(max_iter) if max_iter is not None else max(10 * b.shape[0], 1)


def _finite(a: np.ndarray, what: str) -> None:
    if not np.all(np.isfinite(a)):
        raise CGDivergenceError(
            f"{what} returned NaN or inf values during CG; the solve is abandoned (a diverged "
            "solve is never scored). Check the data and the kernel, raise lambda, or use the "
            "Cholesky solver."
        )


def _cols_dot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.einsum("ij,ij->j", a, b)


#: a column rides along in a step's product (:func:`_likely_done`) when its residual fell
#: in each of the last two steps and the residual the next step would reach at their
#: average rate is within this multiple of its tolerance: riding costs a column of the
#: product (about a tenth of a product, measured), a separate confirmation a whole one
RIDE_MARGIN = 4.0


def _likely_done(history: list[np.ndarray], act: np.ndarray, tols: np.ndarray) -> np.ndarray:
    """The active columns likely to stop after the next step (:data:`RIDE_MARGIN`): a
    function of the residual history alone, so a resumed solve decides as the
    uninterrupted one did, and its iterates keep their bits."""
    if len(history) < 3:
        return act[:0]
    now, mid, before = history[-1][act], history[-2][act], history[-3][act]
    falling = (now < mid) & (mid < before)
    with np.errstate(divide="ignore", invalid="ignore"):
        guess = np.where(falling, now * np.sqrt(now / before), np.inf)
    return act[guess <= RIDE_MARGIN * tols[act]]


def conjugate_gradient(
    matvec: Callable[..., np.ndarray],
    b: np.ndarray,
    *,
    x0: np.ndarray | None = None,
    preconditioner: Any = None,
    tol: float | np.ndarray = 1e-6,
    max_iter: int | None = None,
    callback: Callable[[CGState], Any] | None = None,
    strict: bool = False,
    true_residual_every: int = 50,
    state: CGState | None = None,
    stagnation_window: int | None = 200,
    confirm: bool = True,
    column_operator: bool = False,
    column_failures: str = "raise",
    warn: bool = True,
    start_dots: str = "all",
) -> CGResult:
    """Solve ``A x = b`` (A SPD, given by ``matvec``) by preconditioned CG.

    The package's one CG loop: every solver that iterates (the float64 solve,
    the inner solves of mixed precision, a checkpointed solve, the CV searches'
    fold blocks) calls it.

    Parameters
    ----------
    matvec : callable
        ``V -> A V`` for ``V`` of shape ``(n, k)``; must return ``(n, k)``.
    b : ndarray, shape (n,) or (n, m)
        Right-hand side(s); the columns are solved together.
    x0 : ndarray, optional
        Warm start (same shape as ``b``); zeros by default.
    preconditioner : object with ``apply(R)``, optional
        Applies ``M⁻¹`` (SPD) to an ``(n, k)`` block. None: no preconditioning.
    tol : float or ndarray (m,)
        Stop a column when ``‖b - A x‖ / ‖b‖ <= tol`` (one tolerance per column
        of ``b``, or one for all).
    max_iter : int, optional
        Iteration cap (default ``10 n``). Counted from the start of the solve,
        so a resumed solve does at most ``max_iter - state.iteration`` more.
    callback : callable, optional
        Called as ``callback(state)`` after every iteration with the live
        :class:`CGState` (copy what you keep). Returning True stops the solve.
    strict : bool
        Raise :class:`CGConvergenceError` instead of warning when ``tol`` is
        not reached.
    true_residual_every : int
        Recompute ``r = b - A x`` every this many iterations (0: only when a
        column looks converged). Each recomputation costs one product.
    state : CGState, optional
        Continue from a saved state (e.g. a checkpoint) instead of starting.
    stagnation_window : int or None
        Raise :class:`CGStagnationError` when a column's best relative residual
        has not fallen by 1% over this many iterations (None or 0: never).
    confirm : bool
        Before stopping a column on its recursive residual, recompute its true
        residual ``b - A x`` (one product) and stop only if that meets ``tol``.
        False saves the product where the caller computes the true residual
        itself right after (iterative refinement's outer loop does).
    column_operator : bool
        The columns are different systems: call ``matvec(V, cols)`` and
        ``preconditioner.apply(R, cols)``, where ``cols`` are the indices of the
        columns of ``b`` that ``V`` and ``R`` hold (e.g. each column's own fold
        and shift, :func:`pipeline.models.selection.blockcg.block_pcg`).
    column_failures : {"raise", "freeze"}
        ``"freeze"``: a column whose product, preconditioner output or residual
        is NaN or inf, or that stagnates, stops (``result.column_reason`` says
        why; a NaN column's ``x`` is zero) and the other columns go on, instead
        of raising for the whole solve.
    warn : bool
        Warn (:class:`CGConvergenceWarning`) when ``tol`` is not reached (False:
        the caller reads ``result.column_reason``).
    start_dots : {"all", "active"}
        How the starting ``r·z`` is summed: over the whole ``(n, m)`` block, or over
        the active columns as gathered for the preconditioner (as every later
        iteration sums it). The same numbers, other last bits (numpy sums a
        gathered block's columns in another order): kept so that each caller's
        iterates keep the bits they had before the loops were merged ("active":
        :func:`pipeline.models.selection.blockcg.block_pcg`).

    Returns
    -------
    CGResult

    Raises
    ------
    CGStagnationError
        No progress for ``stagnation_window`` iterations.
    CGDivergenceError
        NaN or inf in a product, the preconditioner output or the residual.
    CGIndefiniteKernelError
        ``matvec`` belongs to an operator whose kernel is not PSD.
    """
    check_operator_kernel(matvec)
    b = np.asarray(b, dtype=np.float64)
    max_iter = _check_args(b, tol, max_iter)
    if int(true_residual_every) < 0:
        raise ValueError(f"true_residual_every must be >= 0, got {true_residual_every!r}")
    if column_failures not in ("raise", "freeze"):
        raise ValueError(f"column_failures must be 'raise' or 'freeze', got {column_failures!r}")
    freeze = column_failures == "freeze"
    if start_dots not in ("all", "active"):
        raise ValueError(f"start_dots must be 'all' or 'active', got {start_dots!r}")
    one_d = b.ndim == 1
    B = b.reshape(b.shape[0], -1)
    n, m = B.shape
    tols = np.broadcast_to(np.asarray(tol, dtype=np.float64), (m,))
    tol_txt = f"{float(np.max(tols, initial=0.0)):.1e}" if np.ndim(tol) else f"{tol:.1e}"
    # columns far from 1 in magnitude are solved scaled by an exact power of two
    k = pow2_exponents(np.max(np.abs(B), axis=0))
    scaled = bool(np.any(k))
    if scaled:
        B = np.ldexp(B, k)
    M = preconditioner if preconditioner is not None else _Identity()
    # z is only read by whoever holds the state: kept up to date for a callback
    keep_z = callback is not None
    t0 = time.perf_counter()

    def A(V: np.ndarray, cols: np.ndarray) -> np.ndarray:
        out = matvec(V, cols) if column_operator else matvec(V)
        out = np.asarray(out, dtype=np.float64).reshape(V.shape[0], -1)
        if out.shape != V.shape:
            raise ValueError(f"matvec returned shape {out.shape} for input {V.shape}")
        if not freeze:
            _finite(out, "the operator product")
        return out

    def P(R: np.ndarray, cols: np.ndarray) -> np.ndarray:
        out = M.apply(R, cols) if column_operator else M.apply(R)
        out = np.asarray(out, dtype=np.float64).reshape(R.shape)
        if not freeze:
            _finite(out, "the preconditioner")
        return out

    if state is None:
        b_norm = np.linalg.norm(B, axis=0)
        if x0 is None:
            X = np.zeros((n, m))
            R = B.copy()
            n_mv = 0
        else:
            X = np.array(x0, dtype=np.float64)
            if X.size != n * m or X.shape[0] != n:
                raise ValueError(f"x0 must have the shape of b {b.shape}, got {np.shape(x0)}")
            X = X.reshape(n, m)
            if X.shape != (n, m):
                raise ValueError(f"x0 must have the shape of b {b.shape}, got {np.shape(x0)}")
            if not np.all(np.isfinite(X)):
                raise ValueError("x0 contains NaN or infinite values")
            if scaled:
                X = np.ldexp(X, k)
            R = B - A(X, np.arange(m))
            n_mv = 1
        safe = np.where(b_norm > 0, b_norm, 1.0)
        rel = np.linalg.norm(R, axis=0) / safe
        rel[b_norm == 0] = 0.0
        if x0 is not None:
            X[:, b_norm == 0] = 0.0
            R[:, b_norm == 0] = 0.0
        active = rel > tols
        Z = np.zeros_like(R)
        rz = np.zeros(m)
        if active.any():
            Ra = R[:, active]
            Za = P(Ra, np.flatnonzero(active))
            Z[:, active] = Za
            if start_dots == "active":
                rz[active] = _cols_dot(Ra, Za)
        if start_dots == "all":
            rz = _cols_dot(R, Z)
        state = CGState(
            x=X,
            r=R,
            p=Z.copy() if keep_z else Z,
            z=Z if keep_z else np.zeros((n, 0)),
            rz=rz,
            b_norm=b_norm,
            active=active,
            iteration=0,
            n_matvec=n_mv,
            history=[rel],
        )
    else:
        if state.x.shape != (n, m):
            raise ValueError(f"state has shape {state.x.shape}, but b has {B.shape}")
        state = state.copy()
        if scaled:
            b_norm = np.linalg.norm(B, axis=0)
            if not np.array_equal(state.b_norm, b_norm):
                # a state of the unscaled system (saved before b was scaled): scale it
                for name in ("x", "r", "p", "z"):
                    setattr(state, name, np.ldexp(getattr(state, name), k))
                state.rz = np.ldexp(state.rz, 2 * k)
                state.b_norm = b_norm
    state.rhs_exponent = k if scaled else None
    start_iter = state.iteration
    safe_norm = np.where(state.b_norm > 0, state.b_norm, 1.0)
    every = int(true_residual_every)
    stopped_by_callback = False
    breakdown: list[int] = []
    reason: list = [None] * m

    st = state
    window = int(stagnation_window or 0)
    if window < 0:
        raise ValueError(f"stagnation_window must be >= 0 or None, got {stagnation_window!r}")

    def stop(cols: np.ndarray, why: str) -> None:
        for c in cols:
            reason[int(c)] = why
        st.active[cols] = False

    best = st.history[-1].copy()
    best_at = np.full(m, st.iteration)
    while st.active.any() and st.iteration < max_iter:
        act = np.flatnonzero(st.active)
        Pa = st.p[:, act]
        periodic = bool(every) and (st.iteration + 1) % every == 0
        # the columns likely to stop after this step ride along in its product:
        # A x_{k+1} = A x_k + alpha A p_k, so their confirmation costs no product of its own
        ride = _likely_done(st.history, act, tols) if confirm and not column_operator else act[:0]
        if ride.size and not periodic:
            W = A(np.hstack([Pa, st.x[:, ride]]), np.concatenate([act, ride]))
            APa, AX = W[:, : act.size], dict(zip(ride.tolist(), W[:, act.size :].T))
        else:
            APa, AX = A(Pa, act), {}
        st.n_matvec += 1
        pAp = _cols_dot(Pa, APa)
        bad = ~(pAp > 0) | ~np.isfinite(pAp)
        if bad.any():
            # the operator is not positive definite along p (or rounding has won)
            breakdown.extend(int(c) for c in act[bad])
            stop(act[bad & ~np.isfinite(pAp)], "nonfinite")
            stop(act[bad & np.isfinite(pAp)], "breakdown")
            keep = ~bad
            act, Pa, APa, pAp = act[keep], Pa[:, keep], APa[:, keep], pAp[keep]
            if act.size == 0:
                break
        alpha = st.rz[act] / pAp
        st.x[:, act] += Pa * alpha
        st.r[:, act] -= APa * alpha
        st.iteration += 1
        rel = st.history[-1].copy()
        if periodic:
            st.r[:, act] = B[:, act] - A(st.x[:, act], act)
            st.n_matvec += 1
        rel[act] = np.linalg.norm(st.r[:, act], axis=0) / safe_norm[act]
        done = act[rel[act] <= tols[act]]
        if confirm and done.size and not periodic:
            # confirm on the true residual before stopping a column
            R_true = np.empty((n, done.size))
            step = dict(zip(act.tolist(), alpha))
            rode = np.array([int(c) in AX for c in done], dtype=bool)
            for j in np.flatnonzero(rode):
                c = int(done[j])
                R_true[:, j] = B[:, c] - (AX[c] + APa[:, np.searchsorted(act, c)] * step[c])
            if not rode.all():
                R_true[:, ~rode] = B[:, done[~rode]] - A(st.x[:, done[~rode]], done[~rode])
                st.n_matvec += 1
            st.r[:, done] = R_true
            rel[done] = np.linalg.norm(R_true, axis=0) / safe_norm[done]
            done = done[rel[done] <= tols[done]]
        st.active[done] = False
        st.history.append(rel)
        if not np.all(np.isfinite(rel)):
            if freeze:
                stop(act[~np.isfinite(rel[act])], "nonfinite")
            else:
                raise CGDivergenceError(
                    f"CG diverged at iteration {st.iteration}: the relative residual is "
                    f"{rel.tolist()[:5]} (NaN or inf). The solve is abandoned; check the data "
                    "and the kernel, raise lambda, or use the Cholesky solver."
                )
        improved = rel < STAGNATION_PROGRESS * best
        best[improved] = rel[improved]
        best_at[improved] = st.iteration
        if window:
            stuck = st.active & (st.iteration - best_at >= window)
            if stuck.any() and freeze:
                stop(np.flatnonzero(stuck), "stagnation")
            elif stuck.any():
                worst = float(np.max(rel[stuck]))
                raise CGStagnationError(
                    f"CG stagnated: no progress for {window} iterations (column(s) "
                    f"{np.flatnonzero(stuck)[:5].tolist()}, relative residual {worst:.3e} > "
                    f"tol {tol_txt} at iteration {st.iteration}). The system is too "
                    "ill-conditioned for this preconditioner: use solver='cholesky' (exact, no "
                    "iterations), a larger lambda, or a higher preconditioner rank."
                )
        go = np.flatnonzero(st.active)
        if go.size:
            Zg = P(st.r[:, go], go)
            rz_new = _cols_dot(st.r[:, go], Zg)
            beta = rz_new / st.rz[go]
            if keep_z:
                st.z[:, go] = Zg
            st.p[:, go] = Zg + st.p[:, go] * beta
            st.rz[go] = rz_new
        if callback is not None and callback(st):
            stopped_by_callback = True
            break

    stop(np.flatnonzero(st.active), "stopped" if stopped_by_callback else "max_iter")
    rel_final = st.history[-1]
    col_conv = rel_final <= tols
    converged = bool(col_conv.all())
    x_out = st.x.copy() if keep_z else st.x  # the state outlives the call only via callback
    if freeze:
        x_out[:, [c for c, why in enumerate(reason) if why == "nonfinite"]] = 0.0
    if scaled:
        x_out = np.ldexp(x_out, -k)
    result = CGResult(
        x=x_out[:, 0].copy() if one_d else x_out,
        converged=converged,
        n_iter=st.iteration,
        start_iter=start_iter,
        n_matvec=st.n_matvec,
        rel_residual=rel_final.copy(),
        history=np.vstack(st.history),
        tol=float(tol) if np.ndim(tol) == 0 else tols.copy(),
        max_iter=max_iter,
        wall_time=time.perf_counter() - t0,
        column_converged=col_conv,
        column_reason=reason,
    )
    if not converged and not stopped_by_callback and (strict or warn):
        worst = float(np.max(rel_final))
        why = (
            f"breakdown (p·Ap <= 0) in column(s) {sorted(set(breakdown))[:5]}: the operator is "
            "not numerically positive definite; increase the ridge"
            if breakdown
            else f"stopped at max_iter={max_iter}"
        )
        msg = (
            f"CG did not converge: relative residual {worst:.3e} > tol {tol_txt} after "
            f"{st.iteration} iterations ({why}). Raise max_iter, use a preconditioner "
            "(e.g. 'nystrom'), or loosen tol."
        )
        if strict:
            raise CGConvergenceError(msg)
        warnings.warn(msg, errors.CGConvergenceWarning, stacklevel=2)
    log.info(
        "CG: %d iterations (from %d), %d products, rel. residual %.3e, %.2fs",
        st.iteration,
        start_iter,
        st.n_matvec,
        float(np.max(rel_final)),
        result.wall_time,
    )
    return result
