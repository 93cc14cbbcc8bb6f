"""In memory, which solver serves a kernel setting: preconditioned CG or band reductions.

A band reduction per fold costs about ``4/3 m³`` flops whatever the kernel. CG
costs a pass over K per iteration, and with a rank-r Nyström preconditioner
``P = F Fᵀ + s I`` its condition number is at most ``1 + ‖K - F Fᵀ‖₂ / s``. For a
smooth kernel (RBF with a small gamma) the residual norm ρ falls below the
smallest shift at r of a few hundred, and CG converges in a handful of
iterations per λ; for a rough one it needs thousands. :func:`route_setting`
measures ρ (a short power iteration on ``K - F Fᵀ``) and the time of one product
with K, bounds the iterations by the Chebyshev bound, and picks CG only when it
is predicted to cost less than half the band reductions. The factor F is then
the CG preconditioner, so the routing work is not lost.
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline.constants import (
    CG_MARGIN,
    GEMM_PROBE_SIZE,
    ROUTE_POWER_ITERATIONS,
    ROUTE_RHO_SAFETY,
)
from pipeline.engine.parallel import blas_threads
from pipeline.linalg.dense_operator import DenseKernelOperator
from pipeline.linalg.precond import NystromFactor, build_nystrom
from pipeline.plan.cv_routing import route_choice

__all__ = ["DenseKernelOperator", "Route", "route_setting"]


@functools.cache
def _gemm_rate_one_thread(size: int = GEMM_PROBE_SIZE) -> float:
    """Flop rate of one float64 GEMM on one BLAS thread (a 30 ms probe), measured once per
    process: the machine does not change under it, and every search and kernel setting of
    a process is then routed on the same figure."""

    a = np.random.default_rng(0).standard_normal((size, size))
    with blas_threads(1):
        a @ a
        t0 = time.perf_counter()
        a @ a
        dt = time.perf_counter() - t0
    return 2.0 * size**3 / max(dt, 1e-6)


@dataclass
class Route:
    """The choice for one kernel setting and the figures it rests on."""

    solver: str
    rho: float
    predicted_cg_iterations: int
    predicted_cg_seconds: float
    predicted_band_seconds: float
    #: the Nyström factor of K measured here, CG's preconditioner when CG is chosen
    factor: NystromFactor | None


def route_setting(
    K: np.ndarray,
    shifts: list[list[float]],
    train_sizes: list[int],
    *,
    n_workers: int,
    tol: float,
    rank: int,
    random_state: Any = 0,
    power_iterations: int = ROUTE_POWER_ITERATIONS,
) -> Route:
    """Choose CG or band reductions for one kernel setting.

    Parameters
    ----------
    K : ndarray (n, n), the kernel matrix
    shifts : shifts[f] = the diagonal shifts of fold f (one per λ)
    train_sizes : training-set size of each fold
    n_workers : concurrent band reductions
    tol : CG relative tolerance
    rank : Nyström rank r of the preconditioner
    """
    n = K.shape[0]
    n_folds = len(train_sizes)
    nf = build_nystrom(
        DenseKernelOperator(K), centres="rpcholesky", rank=min(int(rank), n),
        random_state=random_state,
    )  # fmt: skip
    F = nf.F
    # block power iteration on K - F Fᵀ, as many columns as folds: it also times the
    # product CG repeats at every iteration
    V = np.random.default_rng(random_state).standard_normal((n, n_folds))
    V /= np.linalg.norm(V, axis=0)
    rho, t_pass = 0.0, math.inf
    for _ in range(power_iterations):
        t0 = time.perf_counter()
        W = K @ V
        t_pass = min(t_pass, time.perf_counter() - t0)
        W -= F @ (F.T @ V)
        norms = np.linalg.norm(W, axis=0)
        rho = float(norms.max())
        V = W / np.where(norms > 0, norms, 1.0)
    rho *= ROUTE_RHO_SAFETY  # the power iteration approaches ρ from below
    # the cost model is pipeline.plan.cv_routing.route_choice; CG_MARGIN is read here,
    # at call time, so that it can be set for one search (the tests force each route)
    solver, its, cg_s, band_s = route_choice(
        rho, t_pass, shifts, train_sizes, gemm_rate_one_thread=_gemm_rate_one_thread(),
        n_workers=n_workers, tol=tol, margin=CG_MARGIN,
    )  # fmt: skip
    return Route(solver, rho, its, cg_s, band_s, nf if solver == "cg" else None)
