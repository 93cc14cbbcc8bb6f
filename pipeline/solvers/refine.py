"""Refinement of a low-precision factor's solution with the fastest product available.

A float32 factor (:func:`pipeline.solvers.tile_cholesky` with ``dtype=float32``)
solves ``(K + shift I) alpha = y`` to about single precision. Refinement (CG in
float64, preconditioned by the factor, started from its solution; see
:func:`pipeline.solvers.triangular.refine_solution`) reaches double precision in
a few steps, each one product by ``K + shift I`` and one pass over the factor.

The product decides the cost. Rereading the stored float64 Gram costs
``4 N^2`` bytes of disk per step (N = 15,000: 0.9 GB, about 1 s at 1 GB/s, plus
the reads' overheads); the matrix-free operator recomputes the kernel from X with
the fused cache-blocked engine (:mod:`pipeline.tiles`, about 1e9 kernel entries
per second on 2 cores, so ``N^2 / 2 / 1e9`` s: 0.11 s at N = 15,000) and reads no
disk at all. :func:`refinement_operator` picks matrix-free whenever X and the
kernel are given, else the stored Gram.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from pipeline.float_range import pow2_exponents
from pipeline.solvers.triangular import (
    FactorPreconditioner,
    _as_factor,
    _sweep_blas,
    back_substitution,
    back_sweep,
    forward_substitution,
    forward_sweep,
)


class NativeFactorPreconditioner(FactorPreconditioner):
    """``(L L.T)⁻¹`` in the factor's own precision (float32 GEMV/TRSM on float32 tiles).

    :class:`~pipeline.solvers.triangular.FactorPreconditioner` works in float64,
    so numpy upcasts every float32 tile (a ``b^2 * 8`` byte copy) at every product:
    that cast, not the arithmetic, was most of a refinement step. A preconditioner
    only needs to be approximately ``A⁻¹``, and the float32 factor is only single
    precision anyway, so its solves run in float32; CG keeps everything else
    (residuals, iterates, products by ``K + shift I``) in float64.
    """

    def apply(self, R: np.ndarray) -> np.ndarray:
        L = self.L
        dt = np.dtype(L.dtype)
        if dt == np.float64:
            return super().apply(R)
        R = np.asarray(R)
        one_d = R.ndim == 1
        z = np.array(R.reshape(L.shape[0], -1), dtype=dt, order="C")
        with _sweep_blas():
            self._sweeps(z)
        out = z.astype(np.float64)
        return out[:, 0] if one_d else out

    def _sweeps(self, z: np.ndarray) -> None:
        # the solvers' one forward and back sweep, in z's precision (float32 here)
        forward_sweep(self.L, z)
        back_sweep(self.L, z)


def refinement_operator(
    shift: float,
    *,
    X: Any = None,
    kernel: Any = None,
    gram: Any = None,
    block_size: int | None = None,
) -> Any:
    """The product ``K + shift I`` refinement uses: matrix-free from ``X`` when
    ``X`` and ``kernel`` are given (no disk), else the stored ``gram``."""
    from pipeline.solvers.matvec import MatrixFreeKernelOperator, StoredKernelOperator

    if X is not None and kernel is not None:
        bs = block_size or (gram.block_size if gram is not None else 2048)
        return MatrixFreeKernelOperator(
            np.asarray(X, dtype=np.float64), kernel, shift, block_size=bs
        )
    if gram is not None:
        return StoredKernelOperator(gram, shift)
    raise ValueError(
        "refinement needs the product K + shift*I: pass X= and kernel= (matrix-free, "
        "fastest) or gram= (the stored Gram)"
    )


def refine_with_operator(
    factor: Any,
    op: Any,
    y: np.ndarray,
    alpha: np.ndarray,
    *,
    tol: float = 1e-11,
    max_iter: int = 100,
    stats: dict | None = None,
    max_steps: int = 8,
) -> np.ndarray:
    """Refine ``alpha`` to ``‖y - op(alpha)‖ / ‖y‖ <= tol`` by iterative refinement.

    Each step computes the true float64 residual ``r = y - op(alpha)`` and solves
    ``op d = r`` by CG preconditioned by ``factor`` to a relative
    ``0.1 * tol * ‖y‖ / ‖r‖`` (between 1e-8 and 1e-2), then adds ``d``. One CG run
    from ``alpha`` loses this accuracy: its recursive residual drifts from the
    true one at about ``κ ε`` of its starting residual, so at κ ≈ 1e6 it stalled at
    1.2e-11 and then diverged (seen on AMD EPYC). Restarting from the true
    residual keeps that drift relative to a residual already small, so the floor
    is the product's own rounding.

    A residual that stalls above ``tol`` but at or below float64's rounding
    floor for the product (``ε ‖(K + shift I)|alpha|‖ / ‖y‖``, see
    :func:`_at_rounding_floor`) is accepted: ``stats["refine_rounding_floor"]``
    then records that floor, and ``stats["rel_residual"]`` the residual reached.

    Raises
    ------
    CGConvergenceError
        ``tol`` not reached within ``max_steps`` steps or ``max_iter`` CG
        iterations in all, or a step that fails to reduce the residual while it
        is above float64's rounding floor: a refinement that stops short is an
        error, never a quiet alpha.
    """
    from pipeline.solvers.cg import (
        CGConvergenceError,
        CGConvergenceWarning,
        conjugate_gradient,
    )

    stats = stats if stats is not None else {}
    y2 = np.asarray(y, dtype=np.float64).reshape(np.shape(y)[0], -1)
    # a column far from 1 is refined as 2**k y (exact; k = 0 keeps ordinary y's bits):
    # at y ~ 1e-200 ‖y‖ underflowed to 0 and refinement stopped at once (issue #44)
    k = pow2_exponents(np.max(np.abs(y2), axis=0, initial=0.0))
    y2 = np.ldexp(y2, k)
    x = np.ldexp(np.array(alpha, dtype=np.float64).reshape(y2.shape), k)
    y_norm = np.linalg.norm(y2, axis=0)
    y_norm[y_norm == 0] = 1.0
    pre = NativeFactorPreconditioner(factor)
    if np.any(k != 0):  # a float32 first solve of such a y itself gave 0 or inf: redo it
        x[:, k != 0] = pre.apply(y2[:, k != 0])
    its = steps = 0
    history = []
    while True:
        r = y2 - np.asarray(op.matvec(x), dtype=np.float64).reshape(y2.shape)
        rel = np.linalg.norm(r, axis=0) / y_norm
        history.append(float(np.max(rel)))
        if np.all(rel <= tol):
            break
        stalled = len(history) > 1 and history[-1] > 0.5 * history[-2]
        if stalled and _at_rounding_floor(op, x, rel, tol, y_norm, stats):
            break  # as close as float64 products can tell: a float64 solve gets no closer
        if steps >= max_steps or its >= max_iter or stalled:
            raise CGConvergenceError(
                f"refinement of the factor's solution did not converge: relative residual "
                f"{history[-1]:.3e} > tol {tol:.1e} after {steps} steps and {its} CG "
                f"iterations (residuals {', '.join(f'{h:.1e}' for h in history)}): the "
                "system is too ill-conditioned for this tol in float64. Loosen tol, use a "
                "larger lambda, or a float64 factor (factor_dtype='float64')."
            )
        todo = rel > tol
        inner = float(np.clip(0.1 * tol / np.max(rel[todo]), 1e-8, 1e-2))
        rhs = np.where(todo, r, 0.0)  # a converged column stays as it is
        with warnings.catch_warnings():  # an inner solve short of its tol is judged
            warnings.simplefilter("ignore", CGConvergenceWarning)  # by the next true residual
            res = conjugate_gradient(  # the loop's next true residual confirms it
                op.matvec,
                rhs,
                preconditioner=pre,
                tol=inner,
                max_iter=max(1, max_iter - its),
                confirm=False,
            )
        x += res.x.reshape(x.shape)
        its += int(res.n_iter)
        steps += 1
    stats["refine_iterations"] = its
    stats["refine_steps"] = steps
    stats["rel_residual"] = history[-1]
    stats["refine_history"] = history
    stats["refine_operator"] = type(op).__name__
    return np.ldexp(x, -k).reshape(np.shape(alpha))


def _at_rounding_floor(
    op: Any, x: np.ndarray, rel: np.ndarray, tol: float, y_norm: np.ndarray, stats: dict
) -> bool:
    """Whether every column short of ``tol`` has stalled at float64's rounding floor.

    A product ``(K + shift I) x`` computed in float64 is off by up to about
    ``ε ‖(K + shift I) |x|‖`` (summation rounding; ``|K|`` is ``K`` for the
    non-negative kernels such as RBF and Laplacian, and a lower bound
    otherwise, so the test errs towards refusing). Where the true residual has
    stopped falling at or below that, no float64 computation can tell the
    iterate from the exact solution: at lambda = 1e-4 on 8,000 diamonds rows
    the float64 Cholesky's own residual was 4.7e-11, this floor 2.6e-10 and the
    refinement's stall 2.6e-11. Costs one product, only when stalled.
    """
    eps = float(np.finfo(np.float64).eps)
    abs_prod = np.asarray(op.matvec(np.abs(x)), dtype=np.float64).reshape(x.shape)
    floor = eps * np.linalg.norm(abs_prod, axis=0) / y_norm
    short = rel > tol
    if not np.all(rel[short] <= floor[short]):
        return False
    stats["refine_rounding_floor"] = float(np.max(floor[short]))
    return True


def solve_refined(
    factor: Any,
    y: Any,
    *,
    X: Any = None,
    kernel: Any = None,
    gram: Any = None,
    tol: float = 1e-11,
    max_iter: int = 100,
    stats: dict | None = None,
) -> np.ndarray:
    """Solve with a (float32 or float64) stored factor, refined with the fastest product.

    Parameters
    ----------
    factor : CholeskyFactor
        From :func:`pipeline.solvers.tile_cholesky` (its ``shift`` is used).
    y : array-like of shape (n,) or (n, m)
    X, kernel : optional
        Training inputs and kernel: refinement products are then matrix-free.
    gram : TiledArray, optional
        The stored Gram (used when X is not given).
    tol : float
        Relative residual to reach.
    stats : dict, optional
        Filled with ``refine_iterations``, ``rel_residual``, ``refine_operator``,
        ``solve_s``, ``refine_s``.

    Returns
    -------
    alpha : ndarray, float64, shaped like ``y``
    """
    import time

    from pipeline.solvers.cholesky import release_tile_cache

    stats = stats if stats is not None else {}
    L = _as_factor(factor)
    t0 = time.perf_counter()
    try:
        if np.dtype(L.dtype) == np.float32:  # solves in float32: no per-tile upcast
            alpha = NativeFactorPreconditioner(L).apply(np.asarray(y, dtype=np.float64))
        else:
            alpha = back_substitution(L, forward_substitution(L, y))
        stats["solve_s"] = time.perf_counter() - t0
        if np.dtype(L.dtype) == np.float32 or X is not None or gram is not None:
            op = refinement_operator(factor.shift, X=X, kernel=kernel, gram=gram)
            t1 = time.perf_counter()
            alpha = refine_with_operator(L, op, y, alpha, tol=tol, max_iter=max_iter, stats=stats)
            stats["refine_s"] = time.perf_counter() - t1
    finally:
        release_tile_cache(L)
    return alpha
