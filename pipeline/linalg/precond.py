"""Preconditioners for ``K + μI`` (μ = λ or nλ): none, Jacobi, Nyström.

The Nyström preconditioner follows Díaz, Epperly, Frangella, Tropp & Webber,
*Robust, randomized preconditioning for kernel ridge regression* (2023): a
rank-r factor ``F`` (``K ≈ F Fᵀ``) from randomly pivoted Cholesky (the
accelerated, rejection-sampling variant of Epperly, Tropp & Webber, 2024) or
from uniformly sampled centres, and

    P = F Fᵀ + μ I,   P⁻¹ = U diag(1 / (σ² + μ)) Uᵀ + (I - U Uᵀ) / μ,

where ``F = U Σ Vᵀ`` (thin SVD), the Woodbury identity in a numerically stable
form. Building it touches K only through ``diagonal``, ``columns`` and
``submatrix`` of an operator (:mod:`pipeline.linalg.matvec`), each computed
blockwise: K is never formed. Memory is O(N·r).

The adaptive-rank RPCholesky Nyström preconditioner, for small shifts
(``make_preconditioner(..., "adaptive")``): with a rank-r factor ``K ≈ F Fᵀ`` and
``P = F Fᵀ + μ I`` the preconditioned system has condition number at most
``1 + ‖K - F Fᵀ‖₂ / μ`` (Díaz et al. 2023, above). A fixed rank therefore fails as μ shrinks: on diamonds
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

This module is the one home of Nyström (issue #43). The builder:
:func:`build_nystrom` (centres ``"uniform"`` | ``"rpcholesky"`` | ``"adaptive"``)
gives a :class:`NystromFactor` (F, its centres, the build's record); below it
:func:`nystrom_factor` (the fixed-rank methods), :func:`rpcholesky`,
:func:`uniform_nystrom` and :func:`adaptive_rpcholesky`. The applies of
``(F Fᵀ + μ I)⁻¹``: :class:`NystromPreconditioner` (fixed rank, eigen form, what
``make_preconditioner("nystrom")`` gives), :class:`Float32NystromPreconditioner`
(Cholesky form, F in its own dtype; ``NystromFactor.woodbury``), and per fold
:class:`FoldNystromBlock` (every fold and shift of the block CV;
``NystromFactor.folds``) and :class:`FoldNystrom` (one fold, the CV path that
solves one λ at a time). The products with F one row block at a time
(``_ft_times``, ``_f_times``, ``_gram``, ``_woodbury``) are defined here only.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.linalg
import scipy.sparse.linalg

from pipeline.constants import FACTOR_ROW_STEP
from pipeline.engine import available_cores
from pipeline.engine.parallel import blas_threads
from pipeline.linalg.matvec import check_shift
from pipeline.options import PRECONDITIONERS as OPTION_PRECONDITIONERS
from pipeline.storage import fingerprint_blocks, fingerprint_obj

__all__ = [
    "CENTRES",
    "DEFAULT_FACTOR",
    "DEFAULT_MEMORY_BUDGET",
    "Float32NystromPreconditioner",
    "FoldNystrom",
    "FoldNystromBlock",
    "IdentityPreconditioner",
    "JacobiPreconditioner",
    "NystromFactor",
    "NystromPreconditioner",
    "adaptive_nystrom_preconditioner",
    "adaptive_rpcholesky",
    "build_nystrom",
    "make_preconditioner",
    "nystrom_factor",
    "residual_norm",
    "rpcholesky",
    "uniform_nystrom",
]

log = logging.getLogger(__name__)

PRECONDITIONERS = OPTION_PRECONDITIONERS  # (pipeline.options: the one vocabulary)

# -- products with a factor F (n x r, float32 or float64), one row block at a time ------
#: rows of F upcast to float64 at once (bounds the temporaries; pipeline.constants)
_ROW_STEP = FACTOR_ROW_STEP


def _ft_times(F: np.ndarray, R: np.ndarray) -> np.ndarray:
    """``Fᵀ R`` in float64, F upcast one row block at a time (no n x r float64 copy)."""
    out = np.zeros((F.shape[1], R.shape[1]))
    for s in range(0, F.shape[0], _ROW_STEP):
        out += np.asarray(F[s : s + _ROW_STEP], dtype=np.float64).T @ R[s : s + _ROW_STEP]
    return out


def _f_times(F: np.ndarray, C: np.ndarray) -> np.ndarray:
    """``F C`` in float64, F upcast one row block at a time."""
    out = np.empty((F.shape[0], C.shape[1]))
    for s in range(0, F.shape[0], _ROW_STEP):
        out[s : s + _ROW_STEP] = np.asarray(F[s : s + _ROW_STEP], dtype=np.float64) @ C
    return out


def _gram(F: np.ndarray) -> np.ndarray:
    """``Fᵀ F`` (r x r, float64), F upcast one row block at a time; refuses NaN/inf."""
    G = np.zeros((F.shape[1],) * 2)
    for s in range(0, F.shape[0], _ROW_STEP):
        Fb = np.asarray(F[s : s + _ROW_STEP], dtype=np.float64)
        G += Fb.T @ Fb
    if not np.all(np.isfinite(G)):
        raise ValueError("the Nyström factor F contains NaN or infinite values")
    return G


def _woodbury(
    F: np.ndarray, R: np.ndarray, inner: Any, shift: Any, mask: np.ndarray | None = None
) -> np.ndarray:
    """``(R - F inner(Fᵀ R)) / shift`` (rows outside ``mask`` keep ``R / shift``): the
    Woodbury apply of ``(F Fᵀ + μ I)⁻¹`` with ``inner`` applying ``(μ I + FᵀF)⁻¹`` (one
    operator) or a fold's ``(s I + F_TᵀF_T)⁻¹`` per column (``shift`` then per column)."""
    Y = _f_times(F, inner(_ft_times(F, R)))
    if mask is not None:
        Y *= mask
    np.subtract(R, Y, out=Y)
    Y /= shift
    return Y


class IdentityPreconditioner:
    """No preconditioning: ``apply(R) = R``."""

    def apply(self, R: np.ndarray) -> np.ndarray:
        return np.array(R, dtype=np.float64, copy=True)

    @property
    def fingerprint(self) -> str:
        return fingerprint_obj({"preconditioner": "none"})

    def __repr__(self) -> str:
        return "IdentityPreconditioner()"


class JacobiPreconditioner:
    """``M = diag(K) + μ``: rescales rows of very different magnitude.

    For a stationary kernel (RBF, Laplacian) diag(K) is constant, so Jacobi is a
    multiple of the identity and does not change CG's iterates.
    """

    def __init__(self, diag: np.ndarray, shift: float) -> None:
        d = np.asarray(diag, dtype=np.float64).ravel() + check_shift(shift)
        if not np.all(d > 0):
            raise ValueError(
                f"Jacobi needs diag(K) + shift > 0, got minimum {d.min():.3e}; "
                "the kernel diagonal must be non-negative"
            )
        self.inv_diag = 1.0 / d
        self.shift = float(shift)

    @classmethod
    def from_operator(cls, op: Any) -> JacobiPreconditioner:
        return cls(op.diagonal(), op.shift)

    def apply(self, R: np.ndarray) -> np.ndarray:
        R = np.asarray(R, dtype=np.float64)
        return R * (self.inv_diag if R.ndim == 1 else self.inv_diag[:, None])

    @property
    def fingerprint(self) -> str:
        return fingerprint_obj(
            {
                "preconditioner": "jacobi",
                "d": fingerprint_blocks([self.inv_diag]),
                "shift": self.shift,
            }
        )

    def __repr__(self) -> str:
        return f"JacobiPreconditioner(n={self.inv_diag.size}, shift={self.shift!r})"


def nystrom_fingerprint(
    shift: float,
    rank: int,
    eigvals: np.ndarray,
    info: dict,
    *,
    exclude: tuple[str, ...] = ("pivots",),
    kind: str = "nystrom",
) -> str:
    """Fingerprint of a low-rank-plus-shift preconditioner (CG checkpoints key on it):
    its kind, shift, rank, leading eigenvalues and build info (less ``exclude``)."""
    return fingerprint_obj(
        {
            "preconditioner": kind,
            "shift": shift,
            "rank": rank,
            "eig": [float(v) for v in eigvals[:8]],
            **{k: v for k, v in info.items() if k not in exclude},
        }
    )


class NystromPreconditioner:
    """``(F Fᵀ + μ I)⁻¹`` applied through Woodbury, from a factor ``F`` (n x r).

    Parameters
    ----------
    F : ndarray, shape (n, r)
        Low-rank factor with ``K ≈ F Fᵀ``.
    shift : float
        μ, the value added to K's diagonal in the system being solved.
    info : dict, optional
        What built F (method, rank, seed, pivots...), kept for the fingerprint.
    overwrite_f : bool
        Let the factorisation overwrite ``F`` with U to save one N x r copy.
    """

    def __init__(
        self, F: np.ndarray, shift: float, info: dict | None = None, *, overwrite_f: bool = False
    ) -> None:
        F = np.asarray(F, dtype=np.float64)
        if F.ndim != 2:
            raise ValueError(f"F must be 2-D (n, r), got shape {F.shape}")
        if not np.all(np.isfinite(F)):
            raise ValueError("the Nyström factor F contains NaN or infinite values")
        self.shift = check_shift(shift)
        # F = U Σ Vᵀ from the r x r eigendecomposition of FᵀF = V Σ² Vᵀ, U = F V Σ⁻¹,
        # written into F's own rows block by block: peak N·r once (plus r²), where an
        # SVD of F needed about 3·N·r of workspace (2.08 GB peak at N=100k, r=500).
        # Squaring loses only the directions with σ² below eps·σ₁², which a
        # preconditioner drops anyway (their Woodbury coefficient is ~0).
        w, V = scipy.linalg.eigh(F.T @ F, check_finite=False)
        w, V = w[::-1], V[:, ::-1]
        keep = w > (w[0] if w.size else 0.0) * np.finfo(float).eps * max(F.shape)
        w, V = w[keep], V[:, keep]
        W = V / np.sqrt(w)
        U = F if (overwrite_f and F.flags.c_contiguous and W.shape[1] == F.shape[1]) else None
        if U is None:
            U = np.empty((F.shape[0], W.shape[1]))
        step = 8192
        for start in range(0, F.shape[0], step):
            rows = slice(start, start + step)
            U[rows] = F[rows] @ W  # the right side is a temporary: safe when U is F
        self.U = U
        self.eigvals = w
        # U diag(1/(σ²+μ) - 1/μ) Uᵀ + I/μ
        self._coef = 1.0 / (self.eigvals + self.shift) - 1.0 / self.shift
        self.info = dict(info or {})
        self.rank = int(self.U.shape[1])

    def apply(self, R: np.ndarray) -> np.ndarray:
        R = np.asarray(R, dtype=np.float64)
        one_d = R.ndim == 1
        R2 = R.reshape(R.shape[0], -1)
        out = R2 / self.shift
        out += self.U @ (self._coef[:, None] * (self.U.T @ R2))
        return out[:, 0] if one_d else out

    @property
    def fingerprint(self) -> str:
        return nystrom_fingerprint(self.shift, self.rank, self.eigvals, self.info)

    def __repr__(self) -> str:
        return (
            f"NystromPreconditioner(n={self.U.shape[0]}, rank={self.rank}, "
            f"shift={self.shift!r}, method={self.info.get('method')!r})"
        )


# ---------------------------------------------------------------------------
# low-rank factors
# ---------------------------------------------------------------------------
def _check_rank(rank: int, n: int) -> int:
    if int(rank) != rank or rank < 1:
        raise ValueError(f"rank must be an integer >= 1, got {rank!r}")
    if rank > n:
        raise ValueError(f"rank {rank} is larger than the number of samples N={n}; use rank <= N")
    return int(rank)


def _rejection_cholesky(H: np.ndarray, d: np.ndarray, u: np.ndarray, lmax: int) -> list[int]:
    """Accept candidate j with probability (Schur diag)_jj / d_j, updating the Schur
    complement of ``H`` in place (the rejection step of accelerated RPCholesky)."""
    b = H.shape[0]
    accepted: list[int] = []
    for j in range(b):
        hjj = H[j, j]
        if not (hjj > 0) or u[j] * d[j] > hjj:
            continue
        accepted.append(j)
        col = H[j + 1 :, j] / np.sqrt(hjj)
        H[j + 1 :, j + 1 :] -= np.outer(col, col)
        if len(accepted) == lmax:
            break
    return accepted


def rpcholesky(
    op: Any,
    rank: int,
    *,
    block: int | None = None,
    random_state: int | np.random.Generator | None = 0,
    max_rounds: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Randomly pivoted Cholesky (accelerated, blockwise): ``K ≈ F Fᵀ``, F of shape (n, r).

    Parameters
    ----------
    op : KernelOperator (or anything with ``n``, ``diagonal``, ``columns``, ``submatrix``)
    rank : int
        Number of pivots r (1 <= r <= N).
    block : int, optional
        Candidates drawn per round (default ``ceil(r/2)``, at most 1000). Each
        accepted batch costs one blockwise ``columns`` call of N x batch.
    random_state : int or Generator
    max_rounds : int, optional
        Stop after this many rounds even if fewer than r pivots were accepted
        (default ``20 + 4 r / block``).

    Returns
    -------
    F : ndarray, shape (n, k), k <= rank (fewer only if the residual vanished)
    pivots : ndarray of int, shape (k,)
    """
    n = int(op.n)
    rank = _check_rank(rank, n)
    rng = np.random.default_rng(random_state)
    b = int(block) if block is not None else min(1000, max(1, -(-rank // 2)))
    max_rounds = max_rounds if max_rounds is not None else 20 + 4 * (-(-rank // b))
    d = np.array(op.diagonal(), dtype=np.float64)
    trace0 = float(d.sum())
    F = np.zeros((n, rank))
    pivots: list[int] = []
    k = 0
    rounds = 0
    while k < rank and rounds < max_rounds:
        rounds += 1
        total = d.sum()
        if not (total > trace0 * 1e-14):
            break
        cand = rng.choice(n, size=b, replace=True, p=d / total)
        H = op.submatrix(cand) - F[cand, :k] @ F[cand, :k].T
        accepted = _rejection_cholesky(H, d[cand], rng.random(b), rank - k)
        if not accepted:
            continue
        T = np.unique(cand[accepted])  # duplicates have zero Schur diagonal after the first
        G = op.columns(T) - F[:, :k] @ F[T, :k].T
        L = _safe_cholesky(G[T])
        Fn = scipy.linalg.solve_triangular(L, G.T, lower=True).T
        F[:, k : k + T.size] = Fn
        d -= np.einsum("ij,ij->i", Fn, Fn)
        np.maximum(d, 0.0, out=d)
        d[T] = 0.0
        pivots.extend(int(t) for t in T)
        k += T.size
    log.info(
        "RPCholesky: rank %d in %d rounds, residual trace %.3e of %.3e", k, rounds, d.sum(), trace0
    )
    return F[:, :k], np.asarray(pivots, dtype=np.int64)


def _safe_cholesky(S: np.ndarray) -> np.ndarray:
    S = 0.5 * (S + S.T)
    jitter = 0.0
    scale = max(float(np.max(np.diag(S))), np.finfo(float).tiny)
    for _ in range(8):
        try:
            return scipy.linalg.cholesky(S + jitter * np.eye(S.shape[0]), lower=True)
        except np.linalg.LinAlgError:
            jitter = scale * 1e-12 if jitter == 0 else jitter * 100
    raise np.linalg.LinAlgError("pivot block is not positive definite even with jitter")


def uniform_nystrom(
    op: Any, rank: int, *, random_state: int | np.random.Generator | None = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Nyström factor from r uniformly sampled centres S: ``F = K[:, S] L⁻ᵀ``, ``K_SS = L Lᵀ``.

    Returns ``(F, centres)``. The centre block gets a tiny relative jitter when it
    is numerically singular (duplicate points).
    """
    n = int(op.n)
    rank = _check_rank(rank, n)
    rng = np.random.default_rng(random_state)
    S = np.sort(rng.choice(n, size=rank, replace=False))
    C = op.columns(S)
    W = 0.5 * (C[S] + C[S].T)
    # eigen-based square root: robust when K_SS is singular
    w, V = scipy.linalg.eigh(W)
    keep = w > max(w.max(), 0) * 1e-12 * rank
    F = (C @ V[:, keep]) / np.sqrt(w[keep])
    return F, S


def nystrom_factor(
    op: Any, rank: int, *, method: str = "rpcholesky", random_state: Any = 0
) -> tuple[np.ndarray, np.ndarray]:
    """``(F, pivots)`` by ``method`` ``"rpcholesky"`` or ``"uniform"``."""
    if method == "rpcholesky":
        return rpcholesky(op, rank, random_state=random_state)
    if method == "uniform":
        return uniform_nystrom(op, rank, random_state=random_state)
    raise ValueError(f"unknown Nyström method {method!r}; use 'rpcholesky' or 'uniform'")


def make_preconditioner(
    name: str | None,
    op: Any,
    *,
    rank: int = 500,
    method: str = "rpcholesky",
    random_state: int | None = 0,
) -> IdentityPreconditioner | JacobiPreconditioner | NystromPreconditioner:
    """Build the preconditioner ``name`` (``"none"``, ``"jacobi"``, ``"nystrom"``,
    ``"adaptive"``) for the operator ``op`` (its ``shift`` is μ). For Nyström, ``rank``
    is capped at N; ``"adaptive"`` chooses its own rank
    (:func:`adaptive_nystrom_preconditioner`)."""
    if name is None or name == "none":
        return IdentityPreconditioner()
    if name == "jacobi":
        return JacobiPreconditioner.from_operator(op)
    if name == "nystrom":
        rank = _check_rank(rank, int(op.n))
        t0 = time.perf_counter()
        F, piv = nystrom_factor(op, rank, method=method, random_state=random_state)
        info = {
            "method": method,
            "requested_rank": rank,
            "random_state": random_state,
            "build_seconds": time.perf_counter() - t0,
            "pivots": piv,
        }
        F = np.ascontiguousarray(F)
        pre = NystromPreconditioner(F, op.shift, info=info, overwrite_f=True)
        del F
        pre.info.pop("build_seconds")
        pre.build_seconds = info["build_seconds"]
        return pre
    if name == "adaptive":
        # adaptive-rank RPCholesky, float32 factor (below);
        # ``rank`` is ignored: the rank grows until |K - F F^T| <= 5 * shift or the budget
        return adaptive_nystrom_preconditioner(op, random_state=random_state)
    raise ValueError(f"unknown preconditioner {name!r}; use one of {PRECONDITIONERS}")


# -- adaptive rank ----------------------------------------------------------------------
#: stop growing when the estimated ‖K - F Fᵀ‖ is at most this multiple of the shift
#: (κ ≤ 1 + factor; measured on diamonds N=10k, μ=1e-2: ρ/μ = 7 gives 10 iterations)
DEFAULT_FACTOR = 5.0
#: bytes the factor F may use (float32: 1 GiB is rank 6,700 at N = 40,000)
DEFAULT_MEMORY_BUDGET = 1 << 30


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
        G = _gram(F)
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
        out = _woodbury(
            self.F, R2, lambda T: scipy.linalg.cho_solve(self._chol, T, check_finite=False),
            self.shift,
        )  # fmt: skip
        return out[:, 0] if one_d else out

    @property
    def fingerprint(self) -> str:
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
    nf = build_nystrom(
        op,
        centres="adaptive",
        shift=op.shift,
        factor=factor,
        block=block,
        memory_budget=memory_budget,
        max_rank=max_rank,
        dtype=dtype,
        random_state=random_state,
    )
    F, piv, info = nf.F, nf.centres, nf.info
    info["random_state"] = (
        random_state if not isinstance(random_state, np.random.Generator) else None
    )
    pre = Float32NystromPreconditioner(F, op.shift, info=info)
    pre.pivots = piv
    pre.build_seconds = info["seconds"]
    return pre


# -- the fold variants: one factor of the full K, restricted to each fold's rows ----------
class FoldNystromBlock:
    """``(F_T F_Tᵀ + s I)⁻¹`` for each column's fold T and shift s, on padded columns.

    The preconditioner of the block PCG over every (λ, fold) system
    (:func:`pipeline.models.selection.blockcg.block_pcg`): one factor F of the full
    K, restricted to each fold by Woodbury, ``(F_T F_Tᵀ + s I)⁻¹ = (I - F_T (s I +
    F_Tᵀ F_T)⁻¹ F_Tᵀ) / s``, with ``F_Tᵀ F_T = V diag(w) Vᵀ`` (one r x r
    eigendecomposition per fold, shared by every λ: only ``1/(w + s)`` changes).

    Parameters
    ----------
    F : ndarray (n, r), float32 or float64, or None
        Nyström factor of the full K (None or r = 0: the scaled identity ``I / s``).
    trains : list of index arrays
        Each fold's training rows; ``F_Tᵀ F_T`` is ``FᵀF`` minus the other rows' part.
    """

    def __init__(self, F: np.ndarray | None, trains: Sequence[np.ndarray]) -> None:
        self.F = None if F is None or F.shape[1] == 0 else F
        self.eig: list[tuple[np.ndarray, np.ndarray]] = []
        if self.F is None:
            return
        G = _gram(self.F)
        n = self.F.shape[0]

        def fold_eig(tr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            out = np.ones(n, dtype=bool)
            out[np.asarray(tr)] = False
            Fv = np.asarray(self.F[out], dtype=np.float64)
            w, V = scipy.linalg.eigh(G - Fv.T @ Fv, check_finite=False)
            return np.maximum(w, 0.0), V

        # one r x r eigendecomposition per fold, the folds on a thread pool with BLAS at
        # one thread each (LAPACK releases the GIL; a 2-thread OpenBLAS eigh on a busy
        # 2-core machine ran 15-30x slower than one thread)
        workers = max(1, min(available_cores(), len(trains)))
        with blas_threads(1), ThreadPoolExecutor(workers) as pool:
            self.eig = list(pool.map(fold_eig, trains))

    @property
    def rank(self) -> int:
        return 0 if self.F is None else int(self.F.shape[1])

    @property
    def nbytes(self) -> int:
        if self.F is None:
            return 0
        return int(self.F.nbytes + sum(V.nbytes for _, V in self.eig))

    def apply(
        self, R: np.ndarray, folds: np.ndarray, shifts: np.ndarray, mask: np.ndarray
    ) -> np.ndarray:
        """``M⁻¹ R`` column by column; ``mask`` (n, k) is 1 on each column's training rows."""
        if self.F is None:
            return R / shifts

        def inner(T: np.ndarray) -> np.ndarray:
            C = np.empty_like(T)
            for f in np.unique(folds):
                cols = np.flatnonzero(folds == f)
                w, V = self.eig[int(f)]
                C[:, cols] = V @ ((V.T @ T[:, cols]) / (w[:, None] + shifts[cols][None, :]))
            return C

        return _woodbury(self.F, R, inner, shifts, mask)


class FoldNystrom:
    """``(F_T F_Tᵀ + s I)⁻¹`` on one fold's training rows, re-shiftable, from ``F_T`` (m x r).

    The single-fold form of :class:`FoldNystromBlock` (the CV path that solves one λ
    at a time, :func:`pipeline.models.selection.cgpath.cg_fold_predictions`): Woodbury
    with ``F_Tᵀ F_T = V diag(w) Vᵀ`` and ``U = F_T V`` kept (m x r per fold),
    ``(F_T F_Tᵀ + s I)⁻¹ = (I - U diag(1 / (w + s)) Uᵀ) / s``, exact for any F (no
    orthonormal basis needed, so an r x r eigendecomposition replaces the thin SVD
    of the m x r factor: 0.6 s against 1.3 s at m=6400, r=1000). Its products are
    associated as ``U (c Uᵀ R)`` where the block form computes ``F_T V (c Vᵀ F_Tᵀ R)``:
    the same map, other rounding, kept so that the routed CV's scores keep their bits.
    """

    def __init__(self, F_T: np.ndarray) -> None:
        w, V = scipy.linalg.eigh(F_T.T @ F_T, check_finite=False)
        self.U = F_T @ V
        self.w = np.maximum(w, 0.0)

    def apply(self, R: np.ndarray, shift: float) -> np.ndarray:
        coef = 1.0 / (self.w + shift)
        return (R - self.U @ (coef[:, None] * (self.U.T @ R))) / shift


# -- the one builder -----------------------------------------------------------------------
#: how the centres (the pivots of F) are chosen: uniformly at random (FALKON's), by
#: randomly pivoted Cholesky at a fixed rank, or by RPCholesky grown until it resolves K
#: at the shift (:func:`adaptive_rpcholesky`)
CENTRES = ("uniform", "rpcholesky", "adaptive")


@dataclass
class NystromFactor:
    """A Nyström factor ``F`` (n x r, ``K ≈ F Fᵀ``), its centres and how it was built.

    ``centres`` are the rows of K that span F (the pivots, or the uniformly sampled
    points); ``info`` holds the build's record (``method``; with ``"adaptive"`` also
    its rank, ρ estimate, cap...). :meth:`woodbury` and :meth:`folds` give the apply of
    ``(F Fᵀ + μ I)⁻¹`` for one operator or per fold.
    """

    F: np.ndarray
    centres: np.ndarray
    info: dict = field(default_factory=dict)

    @property
    def rank(self) -> int:
        return int(self.F.shape[1])

    def woodbury(self, shift: float) -> Float32NystromPreconditioner:
        """``(F Fᵀ + shift I)⁻¹`` for one operator (F kept in its own dtype)."""
        return Float32NystromPreconditioner(self.F, shift, info=self.info)

    def folds(self, trains: Sequence[np.ndarray]) -> FoldNystromBlock:
        """``(F_T F_Tᵀ + s I)⁻¹`` per fold T (training rows ``trains``), any shift s."""
        return FoldNystromBlock(self.F, trains)


def build_nystrom(
    op: Any,
    *,
    centres: str = "rpcholesky",
    rank: int | None = None,
    shift: float | None = None,
    max_rank: int | None = None,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    factor: float = DEFAULT_FACTOR,
    block: int = 250,
    dtype: Any = np.float32,
    random_state: Any = 0,
) -> NystromFactor:
    """The one Nyström builder: ``K ≈ F Fᵀ`` from the operator ``op``
    (``n``, ``diagonal``, ``columns``, ``submatrix``), K never formed.

    Parameters
    ----------
    centres : {"uniform", "rpcholesky", "adaptive"}
        ``"uniform"``: ``rank`` centres sampled uniformly (:func:`uniform_nystrom`);
        ``"rpcholesky"``: ``rank`` pivots by randomly pivoted Cholesky
        (:func:`rpcholesky`); ``"adaptive"``: RPCholesky grown until
        ``‖K - F Fᵀ‖ <= 5 shift`` or ``max_rank`` / ``memory_budget``
        (:func:`adaptive_rpcholesky`, float32 F).
    rank : int
        The rank of the fixed-rank methods (1 <= rank <= N).
    shift : float
        μ, the shift the factor must resolve K at (``"adaptive"`` only).
    max_rank, memory_budget, factor, block, dtype
        The adaptive build's caps, target ``ρ̂ / μ``, pivots per round and storage
        dtype (:func:`adaptive_rpcholesky`).
    """
    if centres == "adaptive":
        if shift is None:
            raise ValueError("centres='adaptive' needs shift= (the smallest shift to resolve)")
        F, piv, info = adaptive_rpcholesky(
            op,
            shift,
            factor=factor,
            block=block,
            memory_budget=memory_budget,
            max_rank=max_rank,
            dtype=dtype,
            random_state=random_state,
        )
        return NystromFactor(F, piv, info)
    if centres not in ("rpcholesky", "uniform"):
        raise ValueError(f"unknown Nyström centres {centres!r}; use one of {CENTRES}")
    if rank is None:
        raise ValueError(f"centres={centres!r} needs rank= (the number of centres)")
    F, piv = nystrom_factor(op, rank, method=centres, random_state=random_state)
    return NystromFactor(F, piv, {"method": centres})
