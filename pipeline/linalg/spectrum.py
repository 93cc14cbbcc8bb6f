"""The plan's probes of the data: the preconditioner's residual and the float32 factor's
risk, measured at plan time on a seeded subsample of the rows.

The plan (:mod:`pipeline.plan`) imports no solver: it reads these measurements as data
(:class:`pipeline.engine.placement.Probes`, built from the rows by
:func:`pipeline.fit.row_probes`). The float32 risk is described in
:mod:`pipeline.plan.factor_precision`.

CG's iterations depend on ``ρ = ‖K - F Fᵀ‖₂``, the residual of its rank-r Nyström
preconditioner, against the shift μ (``κ ≤ 1 + ρ/μ``). ρ depends on the data, so
when the plan has the training rows it measures ρ on a few of them:

1. draw ``m`` rows uniformly (:func:`~pipeline.constants.spectrum_sample_rows`: at
   least 4 r, so the rank-r factor leaves a residual to measure), with a fixed seed;
2. form their m x m kernel matrix and its rank-r RPCholesky factor (the
   preconditioner's own algorithm, :func:`pipeline.linalg.precond.build_nystrom`);
3. take the top eigenvalue of the residual by a few power iterations, and scale
   it by ``N / m``: the eigenvalues of an N x N Gram grow as N times those of the
   kernel's integral operator, so the r-th of K_N is about N/m times the r-th of K_m.

The real solves' iterations are :data:`~pipeline.constants.CG_BOUND_FRACTION` of the
Chebyshev bound of this ρ (docs/PERFORMANCE.md#the-solver-policy-against-measured-times).
The estimate costs one m x m kernel matrix, an m x r factor and one product of the residual
(applied as ``K V - F (Fᵀ V)``, never formed) with a block of 4 vectors per power iteration.
Deterministic: the same rows give the same ρ, so ``krr run`` and ``KernelRidge`` plan
the same fit alike.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

import pipeline.constants as C
from pipeline.engine.dense import kernel_matrix
from pipeline.linalg.dense_operator import DenseKernelOperator
from pipeline.linalg.precond import build_nystrom

__all__ = ["estimate_residual", "float32_factor_risk", "subsample_rows"]

EPS32 = float(np.finfo(np.float32).eps)


def subsample_rows(X: Any, m: int, rng: np.random.Generator) -> np.ndarray:
    """``m`` of ``X``'s rows (all of them when ``m >= N``), drawn uniformly by the seeded
    ``rng`` and kept in order, as float64: the plan's measurements on the data use them."""
    n = int(X.shape[0])
    idx = np.arange(n) if m >= n else np.sort(rng.choice(n, size=m, replace=False))
    return np.asarray(X[idx], dtype=np.float64)


def _top_eigenvalue(
    apply: Callable[[np.ndarray], np.ndarray], m: int, iterations: int, rng: np.random.Generator
) -> float:
    """Largest eigenvalue of the m x m PSD operator ``apply`` (``V -> R V``) by block power
    iteration (a lower bound that converges fast when the top eigenvalues are separated):
    one product per iteration, ``R V`` serving both the Rayleigh quotient and the next
    step."""
    V = rng.standard_normal((int(m), 4))
    top = 0.0
    W = apply(V)
    for _ in range(int(iterations)):
        V, _ = np.linalg.qr(W)
        W = apply(V)
        top = float(np.max(np.linalg.eigvalsh(V.T @ W)))
    return max(top, 0.0)


def estimate_residual(
    X: Any,
    kernel: Any,
    rank: int,
    *,
    random_state: int = C.DEFAULT_RANDOM_STATE,
    sample: int | None = None,
) -> float | None:
    """Estimated ``‖K - F Fᵀ‖₂`` of the rank-``rank`` RPCholesky factor of the N x N Gram.

    Parameters
    ----------
    X : array-like of shape (n_samples, n_features)
        The training rows as the kernel sees them (numpy, or anything indexable by
        a sorted integer array whose result ``np.asarray`` reads, e.g. a Dask array).
    kernel : Kernel
        Evaluated on the subsample by the fused evaluators
        (:func:`pipeline.engine.dense.kernel_matrix`).
    rank : int
        The preconditioner's rank.
    random_state : int
        Seed of the subsample and of the factor's pivots.
    sample : int, optional
        Rows of the subsample (default
        :func:`~pipeline.constants.spectrum_sample_rows`).

    Returns
    -------
    float or None
        ρ for N rows; 0.0 when the rank covers every row; None when the subsample
        is too small to resolve the rank (the caller falls back to its table).
    """

    n = int(X.shape[0])
    rank = int(rank)
    if rank >= n:
        return 0.0
    m = C.spectrum_sample_rows(n, rank) if sample is None else int(min(sample, n))
    if rank * 2 > m:
        return None
    rng = np.random.default_rng(random_state)
    Xs = subsample_rows(X, m, rng)  # the same draws: rng goes on to the power iterations
    K = np.asarray(kernel_matrix(kernel, Xs), dtype=np.float64)  # fused; a new array
    F = build_nystrom(
        DenseKernelOperator(K), centres="rpcholesky", rank=rank, random_state=random_state
    ).F

    def residual(V: np.ndarray) -> np.ndarray:  # (K - F Fᵀ) V, without forming F Fᵀ
        return K @ V - F @ (F.T @ V)

    rho = _top_eigenvalue(residual, m, C.SPECTRUM_POWER_ITERATIONS, rng)
    return rho * n / m


def float32_factor_risk(
    X: np.ndarray, kernel: Any, shift: float, *, random_state: int = C.DEFAULT_RANDOM_STATE
) -> float:
    """``ε₃₂ · λmax(K) / (λmin(K_m) + shift)`` from a seeded subsample of ``X``'s rows."""

    n = int(X.shape[0])
    m = int(min(n, C.FACTOR_FLOAT32_SAMPLE_ROWS))
    ev = np.linalg.eigvalsh(
        kernel_matrix(kernel, subsample_rows(X, m, np.random.default_rng(random_state)))
    )
    lmax = float(ev[-1]) * n / m
    return EPS32 * lmax / (max(float(ev[0]), 0.0) + float(shift))
