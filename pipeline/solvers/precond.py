"""Preconditioners for ``K + μI`` (μ = λ or nλ): none, Jacobi, Nyström.

The Nyström preconditioner follows Díaz, Epperly, Frangella, Tropp & Webber,
*Robust, randomized preconditioning for kernel ridge regression* (2023): a
rank-r factor ``F`` (``K ≈ F Fᵀ``) from randomly pivoted Cholesky (the
accelerated, rejection-sampling variant of Epperly, Tropp & Webber, 2024) or
from uniformly sampled centres, and

    P = F Fᵀ + μ I,   P⁻¹ = U diag(1 / (σ² + μ)) Uᵀ + (I - U Uᵀ) / μ,

where ``F = U Σ Vᵀ`` (thin SVD), the Woodbury identity in a numerically stable
form. Building it touches K only through ``diagonal``, ``columns`` and
``submatrix`` of an operator (:mod:`pipeline.solvers.matvec`), each computed
blockwise: K is never formed. Memory is O(N·r).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import scipy.linalg

from pipeline.options import PRECONDITIONERS as OPTION_PRECONDITIONERS
from pipeline.solvers.matvec import check_shift
from pipeline.storage import fingerprint_blocks, fingerprint_obj

__all__ = [
    "IdentityPreconditioner",
    "JacobiPreconditioner",
    "NystromPreconditioner",
    "make_preconditioner",
    "nystrom_factor",
    "rpcholesky",
    "uniform_nystrom",
]

log = logging.getLogger(__name__)

PRECONDITIONERS = OPTION_PRECONDITIONERS  # (pipeline.options: the one vocabulary)


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
    (:func:`pipeline.solvers.precond_adaptive.adaptive_nystrom_preconditioner`)."""
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
        # adaptive-rank RPCholesky, float32 factor (pipeline.solvers.precond_adaptive);
        # ``rank`` is ignored: the rank grows until |K - F F^T| <= 5 * shift or the budget
        from pipeline.solvers.precond_adaptive import adaptive_nystrom_preconditioner

        return adaptive_nystrom_preconditioner(op, random_state=random_state)
    raise ValueError(f"unknown preconditioner {name!r}; use one of {PRECONDITIONERS}")
