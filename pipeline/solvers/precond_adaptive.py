"""Adaptive-rank RPCholesky Nyström preconditioner for small shifts.

With a rank-r factor ``K ≈ F Fᵀ`` and ``P = F Fᵀ + μ I`` the preconditioned
system has condition number at most ``1 + ‖K - F Fᵀ‖₂ / μ`` (Díaz, Epperly,
Frangella, Tropp & Webber 2023, "Robust, randomized preconditioning for kernel
ridge regression"). A fixed rank therefore fails as μ shrinks: on diamonds
(N = 10,000, RBF γ = 0.1, μ = 1e-2) rank 500 leaves ‖K - F Fᵀ‖/μ ≈ 76 and CG
needs 30 iterations, rank 2,000 leaves 0.4 and CG needs 4.

:func:`adaptive_rpcholesky` grows the factor in blocks of pivots (the
accelerated, rejection-sampling RPCholesky of Epperly, Tropp & Webber) until an
estimate of ``ρ = ‖K - F Fᵀ‖₂`` is at most ``factor · μ``, or until the factor
fills its memory budget (then it stops with a log line and reports
``capped=True``). The estimate is cheap: the top eigenvalue of the residual on
a fixed random subsample S of m rows, ``(N/m) λ_max(K_SS - F_S F_Sᵀ)`` (the
classic subsample estimate of an integral operator's eigenvalues), which never
touches the N x N matrix. :func:`residual_norm` gives the honest power-iteration
figure with the operator's product when one wants to check it.

The factor is stored in float32 by default (half the memory); the
preconditioner :class:`Float32NystromPreconditioner` applies it in float64,
block by block, so ``P⁻¹`` is an exactly symmetric positive definite linear map
(that of the float32 factor) and CG's theory holds.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import numpy as np
import scipy.linalg
import scipy.sparse.linalg

from pipeline.solvers.matvec import check_shift
from pipeline.solvers.precond import _rejection_cholesky, _safe_cholesky

__all__ = [
    "DEFAULT_FACTOR",
    "DEFAULT_MEMORY_BUDGET",
    "Float32NystromPreconditioner",
    "adaptive_nystrom_preconditioner",
    "adaptive_rpcholesky",
    "residual_norm",
]

log = logging.getLogger(__name__)

#: stop growing when the estimated ‖K - F Fᵀ‖ is at most this multiple of the shift
#: (κ ≤ 1 + factor; measured on diamonds N=10k, μ=1e-2: ρ/μ = 7 gives 10 iterations)
DEFAULT_FACTOR = 5.0
#: bytes the factor F may use (float32: 1 GiB is rank 6,700 at N = 40,000)
DEFAULT_MEMORY_BUDGET = 1 << 30
_ROW_STEP = 8192


def _subsample_rho(op: Any, E: np.ndarray, v0: np.ndarray | None) -> tuple[float, np.ndarray]:
    """``(N/m) λ_max(E)`` for the residual ``E = K_SS - F_S F_Sᵀ`` on the subsample S,
    and the top eigenvector (the warm start of the next round's Lanczos)."""
    m = E.shape[0]
    if m <= 64:
        w, V = np.linalg.eigh(E)
        top, vec = float(w[-1]), V[:, -1]
    else:  # Lanczos on the m x m residual (a full eigh costs seconds at m = 2000)
        if v0 is None:
            v0 = np.random.default_rng(m).standard_normal(m)
        w, V = scipy.sparse.linalg.eigsh(E, k=1, which="LA", v0=v0, tol=1e-2)
        top, vec = float(w[0]), V[:, 0]
    return max(top, 0.0) * op.n / m, vec


def residual_norm(op: Any, F: np.ndarray, *, iterations: int = 8, random_state: Any = 0) -> float:
    """Power-iteration estimate of ``‖K - F Fᵀ‖₂`` with the operator's product
    (``iterations`` products; ``op.matvec`` includes the shift, removed here)."""
    rng = np.random.default_rng(random_state)
    v = rng.standard_normal(op.n)
    v /= np.linalg.norm(v)
    rho = 0.0
    for _ in range(int(iterations)):
        w = np.asarray(op.matvec(v), dtype=np.float64) - op.shift * v
        w -= _f_times(F, _ft_times(F, v[:, None]))[:, 0]
        rho = float(np.linalg.norm(w))
        if rho == 0.0:
            break
        v = w / rho
    return rho


def _ft_times(F: np.ndarray, R: np.ndarray) -> np.ndarray:
    """``Fᵀ R`` in float64 with F upcast one row block at a time."""
    out = np.zeros((F.shape[1], R.shape[1]))
    for s in range(0, F.shape[0], _ROW_STEP):
        out += np.asarray(F[s : s + _ROW_STEP], dtype=np.float64).T @ R[s : s + _ROW_STEP]
    return out


def _f_times(F: np.ndarray, C: np.ndarray) -> np.ndarray:
    out = np.empty((F.shape[0], C.shape[1]))
    for s in range(0, F.shape[0], _ROW_STEP):
        out[s : s + _ROW_STEP] = np.asarray(F[s : s + _ROW_STEP], dtype=np.float64) @ C
    return out


def adaptive_rpcholesky(
    op: Any,
    shift: float,
    *,
    factor: float = DEFAULT_FACTOR,
    block: int = 250,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    max_rank: int | None = None,
    dtype: Any = np.float32,
    sample: int = 1500,
    random_state: int | np.random.Generator | None = 0,
) -> tuple[np.ndarray, np.ndarray, dict]:
    """Grow a randomly pivoted Cholesky factor until ``ρ̂ <= factor · shift``.

    Parameters
    ----------
    op : KernelOperator (``n``, ``diagonal``, ``columns``, ``submatrix``)
    shift : float
        μ, the diagonal shift of the system CG will solve.
    factor : float
        Target ``ρ̂ / μ`` (the preconditioned condition number is ``<= 1 + factor``).
    block : int
        Candidate pivots drawn per round (one ``columns`` call per round).
    memory_budget : int
        Bytes the factor may occupy; the rank is capped at
        ``memory_budget // (N · itemsize)`` and a capped build logs a warning.
    max_rank : int, optional
        A further cap on the rank (default N).
    dtype : float32 or float64
        Storage dtype of F.
    sample : int
        Rows of the subsample on which ``ρ`` is estimated (at most N).
    random_state : int or Generator

    Returns
    -------
    F : ndarray, shape (N, k)
        A view of the first k columns of the (N, cap) buffer (pages past k are
        never touched, so they take no memory).
    pivots : ndarray of int, shape (k,)
    info : dict
        ``rank``, ``rho_estimate``, ``target``, ``capped``, ``cap``, ``rounds``,
        ``seconds``, ``history`` (rank, ρ̂) per round.
    """
    n = int(op.n)
    mu = check_shift(shift)
    if not (factor > 0 and math.isfinite(factor)):
        raise ValueError(f"factor must be a positive number, got {factor!r} (e.g. factor=5)")
    if int(block) < 1:
        raise ValueError(f"block must be an integer >= 1, got {block!r}")
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise ValueError(f"dtype must be float32 or float64, got {dtype}")
    budget_rank = int(memory_budget) // (n * dtype.itemsize)
    if budget_rank < 1:
        raise ValueError(
            f"memory_budget={memory_budget} bytes cannot hold even one column of the "
            f"{n} x r factor ({n * dtype.itemsize} bytes per column); raise it"
        )
    cap = min(n, budget_rank, int(max_rank) if max_rank is not None else n)
    rng = np.random.default_rng(random_state)
    t0 = time.perf_counter()
    target = factor * mu
    d = np.array(op.diagonal(), dtype=np.float64)
    trace0 = float(d.sum())
    S = np.sort(rng.choice(n, size=min(int(sample), n), replace=False))
    E_SS = np.array(op.submatrix(S), dtype=np.float64)  # K_SS - F_S F_Sᵀ, kept up to date
    F = np.zeros((n, cap), dtype=dtype)  # untouched pages cost no memory
    pivots: list[int] = []
    k = 0
    rounds = stalls = 0
    b = int(block)
    history: list[tuple[int, float]] = []
    rho, v_top = _subsample_rho(op, E_SS, None)
    while k < cap:
        if rho <= target:
            break
        total = d.sum()
        if not (total > trace0 * 1e-14):
            rho = 0.0
            break
        rounds += 1
        cand = rng.choice(n, size=b, replace=True, p=d / total)
        Fc = np.asarray(F[cand, :k], dtype=np.float64)
        H = op.submatrix(cand) - Fc @ Fc.T
        accepted = _rejection_cholesky(H, d[cand], rng.random(cand.size), cap - k)
        if not accepted:
            stalls += 1
            if stalls > 20:
                break
            continue
        stalls = 0
        T = np.unique(cand[accepted])
        G = op.columns(T)
        if k:
            FT = np.asarray(F[T, :k], dtype=np.float64)
            for s in range(0, n, _ROW_STEP):
                G[s : s + _ROW_STEP] -= np.asarray(F[s : s + _ROW_STEP, :k], np.float64) @ FT.T
        L = _safe_cholesky(G[T])
        Fn = scipy.linalg.solve_triangular(L, G.T, lower=True, check_finite=False).T
        del G
        F[:, k : k + T.size] = Fn
        FnS = np.asarray(F[S, k : k + T.size], dtype=np.float64)  # as stored
        E_SS -= FnS @ FnS.T
        d -= np.einsum("ij,ij->i", Fn, Fn)
        del Fn
        np.maximum(d, 0.0, out=d)
        d[T] = 0.0
        pivots.extend(int(t) for t in T)
        k += T.size
        rho, v_top = _subsample_rho(op, E_SS, v_top)
        history.append((k, rho))
        log.debug("adaptive RPCholesky: rank %d, estimated rho/shift %.3g", k, rho / mu)
    capped = rho > target and k >= cap
    info = {
        "method": "rpcholesky-adaptive",
        "rank": k,
        "rho_estimate": float(rho),
        "target": float(target),
        "factor": float(factor),
        "capped": bool(capped),
        "cap": int(cap),
        "rounds": rounds,
        "seconds": time.perf_counter() - t0,
        "history": history,
        "dtype": str(dtype),
    }
    if capped:
        log.warning(
            "adaptive RPCholesky capped at rank %d (memory budget %.2f GB for N=%d in %s): "
            "estimated |K - F F^T| / shift = %.3g > target %.3g, so CG may need more "
            "iterations; raise the memory budget, raise lambda, or use the Cholesky solver",
            k,
            memory_budget / 1e9,
            n,
            dtype,
            rho / mu,
            factor,
        )
    elif rho > target:  # no pivot accepted in 20 tries: the residual is numerically exhausted
        log.info(
            "adaptive RPCholesky: stopped at rank %d after %d rounds (%.1f s): no new pivot "
            "was accepted in 20 tries; estimated |K - F F^T| / shift = %.3g (target %.3g)",
            k,
            rounds,
            info["seconds"],
            rho / mu,
            factor,
        )
    else:
        log.info(
            "adaptive RPCholesky: rank %d in %d rounds (%.1f s), estimated |K - F F^T| / shift "
            "= %.3g <= %.3g",
            k,
            rounds,
            info["seconds"],
            rho / mu,
            factor,
        )
    return F[:, :k], np.asarray(pivots, dtype=np.int64), info


class Float32NystromPreconditioner:
    """``(F Fᵀ + μ I)⁻¹`` for a factor F kept in its own dtype (float32 halves memory).

    ``P⁻¹ R = (R - F (μI + FᵀF)⁻¹ Fᵀ R) / μ`` (Woodbury, as in FALKON), with the
    r x r Cholesky of ``μI + FᵀF`` computed in float64. F is upcast to float64 one
    row block at a time, so the map is linear and, for the stored F, exactly
    ``(F Fᵀ + μ I)⁻¹`` up to float64 rounding: symmetric positive definite.
    ``eigvals`` holds ``diag(C)² - μ`` (C the Cholesky factor), a cheap summary.

    Parameters
    ----------
    F : ndarray, shape (n, r), float32 or float64
    shift : float
    info : dict, optional
        What built F (kept for the fingerprint; ``history`` and ``pivots`` excluded).
    """

    def __init__(self, F: np.ndarray, shift: float, info: dict | None = None) -> None:
        if F.ndim != 2:
            raise ValueError(f"F must be 2-D (n, r), got shape {F.shape}")
        self.shift = check_shift(shift)
        G = np.zeros((F.shape[1], F.shape[1]))
        for s in range(0, F.shape[0], _ROW_STEP):
            Fb = np.asarray(F[s : s + _ROW_STEP], dtype=np.float64)
            G += Fb.T @ Fb
        if not np.all(np.isfinite(G)):
            raise ValueError("the Nyström factor F contains NaN or infinite values")
        # Woodbury with a Cholesky of μI + FᵀF (r³/3 flops): an eigendecomposition of
        # FᵀF (the form of NystromPreconditioner) took 5-14 s at r = 1,250 on the shared
        # 2-core machine, more than the whole RPCholesky build
        G[np.diag_indices_from(G)] += self.shift
        self._chol = scipy.linalg.cho_factor(G, lower=True, check_finite=False)
        d = np.diag(self._chol[0])
        self.F = F
        self.eigvals = np.sort(d**2 - self.shift)[::-1]  # a summary for the fingerprint
        self.rank = int(F.shape[1])
        self.info = dict(info or {})

    @property
    def nbytes(self) -> int:
        return int(self.F.shape[0] * self.F.shape[1] * self.F.dtype.itemsize)

    def apply(self, R: np.ndarray) -> np.ndarray:
        R = np.asarray(R, dtype=np.float64)
        one_d = R.ndim == 1
        R2 = R.reshape(R.shape[0], -1)
        S = scipy.linalg.cho_solve(self._chol, _ft_times(self.F, R2), check_finite=False)
        out = R2 - _f_times(self.F, S)
        out /= self.shift
        return out[:, 0] if one_d else out

    @property
    def fingerprint(self) -> str:
        from pipeline.solvers.precond import nystrom_fingerprint

        return nystrom_fingerprint(
            self.shift,
            self.rank,
            self.eigvals,
            self.info,
            exclude=("pivots", "history", "seconds"),
        )

    def __repr__(self) -> str:
        return (
            f"Float32NystromPreconditioner(n={self.F.shape[0]}, rank={self.rank}, "
            f"shift={self.shift!r}, dtype={self.F.dtype})"
        )


def adaptive_nystrom_preconditioner(
    op: Any,
    *,
    factor: float = DEFAULT_FACTOR,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    dtype: Any = np.float32,
    block: int = 250,
    max_rank: int | None = None,
    random_state: Any = 0,
) -> Float32NystromPreconditioner:
    """The adaptive-rank RPCholesky Nyström preconditioner for ``op`` (shift ``op.shift``).

    See :func:`adaptive_rpcholesky` for the parameters; ``pre.info`` says which
    rank was reached, the estimated ``ρ``, and whether the memory budget capped it.
    """
    F, piv, info = adaptive_rpcholesky(
        op,
        op.shift,
        factor=factor,
        block=block,
        memory_budget=memory_budget,
        max_rank=max_rank,
        dtype=dtype,
        random_state=random_state,
    )
    info["random_state"] = (
        random_state if not isinstance(random_state, np.random.Generator) else None
    )
    pre = Float32NystromPreconditioner(F, op.shift, info=info)
    pre.pivots = piv
    pre.build_seconds = info["seconds"]
    return pre
