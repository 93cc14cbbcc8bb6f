"""Nyström kernel ridge regression solved by FALKON's preconditioned CG (``solver="nystrom"``).

The problem (scikit-learn's λ, that of ``K + λ I`` in the exact problem): with M centres
C (rows of X), sample weights W (identity when none),

    minimise  Σ_i w_i (y_i - k(x_i, C) β)²  +  λ βᵀ K_MM β,

whose normal equations are ``H β = K_nMᵀ W y`` with ``H = K_nMᵀ W K_nM + λ K_MM``;
the prediction is ``ŷ(x) = k(x, C) β``, so a fitted model is the exact model's type
with ``X_fit`` = the centres and ``dual_coef`` = β. With M = N centres it is exact
kernel ridge regression (``(W K + λ I) β = W y``, scikit-learn's weighted solution).

The preconditioner is FALKON's (Rudi, Carratino & Rosasco, *FALKON: an optimal large
scale kernel method*, 2017; Meanti, Carratino, Rosasco & Rudi, *Kernel methods through
the roof*, 2020), built from K_MM alone with two Cholesky factorisations:

    T = chol(K_MM + ε I)            (upper: K_MM + ε I = Tᵀ T),
    A = chol(T Tᵀ / M + λ' I)       (upper), λ' = λ / n,

where n = Σ w_i (the number of rows without weights). FALKON writes its penalty per
sample (its objective is the mean squared error, so its λ is our λ / n): with uniform
centres ``K_nMᵀ W K_nM ≈ (n / M) K_MM²``, hence ``H ≈ n (K_MM² / M + λ' K_MM) = n Tᵀ
(T Tᵀ / M + λ' I) T = n Tᵀ Aᵀ A T`` (ε aside), and ``B = T⁻¹ A⁻¹`` makes ``Bᵀ H B / n``
close to the identity. CG runs on that system, ``(Bᵀ H B / n) γ = Bᵀ K_nMᵀ W y / n``,
and ``β = B γ``: the package's one CG loop (:func:`pipeline.linalg.cg.conjugate_gradient`,
per-column, multi-output), checkpointed through :func:`pipeline.linalg.cg_checkpoint.
resumable_cg` when given a store. Its relative residual is that of the preconditioned
system.

The products ``K_nMᵀ W K_nM U`` run matrix-free over row blocks of X (streamed from
its store when X is not in memory: it is never held whole): for each block X_b in a
fixed order, ``G_b = k(X_b, C)`` (b x M, the fused tile evaluator,
:func:`pipeline.engine.fused.kernel_tile`), then ``Σ_b G_bᵀ (w_b ∘ (G_b U))``
accumulated in float64 in block order, so the result is bitwise reproducible for a
given block size. Memory is O(M² + b·M); time O(N·M·iterations). When all the blocks
fit in ``cache_bytes`` (1 GiB by default) they are kept after the first pass instead of
recomputed (the same bits; a speed-for-memory trade only below that size). ``product_dtype=
"float32"`` evaluates G_b and runs its two products in float32 (the per-block sums are
accumulated in float64).

The centres: ``"uniform"`` draws M rows without replacement
(:func:`pipeline.linalg.precond.uniform_centre_indices`, the Nyström builder's
recipe; K is not evaluated); ``"rpcholesky"`` takes the pivots of the one Nyström
builder (:func:`pipeline.linalg.precond.build_nystrom`), which holds an N x M factor
while it selects them (O(N·M) memory for that step; X in memory).
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.linalg
import scipy.sparse.linalg

from pipeline.blas_guard import gram_t, gram_t_identity
from pipeline.constants import NYSTROM_CACHE_BYTES, NYSTROM_MAPPED_FROM
from pipeline.engine.dense import check_finite_kernel
from pipeline.engine.evaluators import evaluation_identity
from pipeline.engine.fused import kernel_tile
from pipeline.errors import CGStagnationError, IndefiniteKernelError
from pipeline.kernels import kernel_fingerprint, make_kernel
from pipeline.linalg.cg import CGResult, conjugate_gradient
from pipeline.linalg.cg_checkpoint import SlotCheckpoint, resumable_cg
from pipeline.linalg.dense_dual import cho_factor, cholesky
from pipeline.linalg.matvec import check_shift, make_operator
from pipeline.linalg.precond import build_nystrom, uniform_centre_indices
from pipeline.linalg.predict_source import as_input_blocks
from pipeline.options import NYSTROM_CENTRES
from pipeline.storage import fingerprint_blocks, fingerprint_obj

__all__ = [
    "NYSTROM_RECIPE",
    "NYSTROM_CENTRES",
    "FalkonPreconditioner",
    "NystromNormalOperator",
    "NystromSolution",
    "ShiftPath",
    "add_block_sums",
    "centre_kernel",
    "check_n_centers",
    "kernel_blocks",
    "nystrom_centres",
    "nystrom_solve",
]

log = logging.getLogger(__name__)

#: the products' precisions: float32 kernel blocks and products, float64 sums
PRODUCT_DTYPES = ("float64", "float32")
#: how the M x M system is solved: FALKON's PCG, or one pass and a factorisation
NYSTROM_METHODS = ("pcg", "direct")
#: the version of the Nyström solve's arithmetic, in the run stages' identities (a stage
#: of an older version is recomputed): 2, the direct pass sums the blocks mapped by T⁻¹
#: where the centres' basis rounds too much (``NystromNormalOperator.mapped``), and the CV
#: scores its folds from a pass that predicts them; 3, the basis rule
#: weighs that rounding against the shift λ (``FalkonPreconditioner.maps_rows``: small λ
#: now map where they did not)
NYSTROM_RECIPE = 3
#: FALKON's relative jitter of K_MM (times M and K_MM's largest diagonal entry)
JITTER = 1e-13
#: the smallest eigenvalue of ``T⁻ᵀ K_MM T⁻¹`` (at most 1) for which :class:`ShiftPath`
#: solves every shift from one eigendecomposition: its rounding is one factorisation's
#: times ``1 / κ_min`` (the κ_min measured: docs/CV_AT_SCALE.md)
PATH_KAPPA_MIN = 1e-6
#: bytes of one kernel block G_b (b x M) when the caller names no block size
BLOCK_BYTES = 64 << 20


def check_n_centers(n_centers: Any) -> int:
    """``n_centers`` as an int >= 1, or a ValueError naming the value."""
    ok = isinstance(n_centers, int | np.integer) and not isinstance(n_centers, bool | np.bool_)
    if not ok or int(n_centers) < 1:
        raise ValueError(
            f"n_centers must be a positive integer (the number of Nyström centres M), got "
            f"{n_centers!r}; e.g. n_centers=1000"
        )
    return int(n_centers)


def _check_centres(centers: Any) -> str:
    if centers not in NYSTROM_CENTRES:
        raise ValueError(f"centers={centers!r} is not valid; choose one of {NYSTROM_CENTRES}")
    return str(centers)


# -- X, streamed in row blocks ---------------------------------------------------------------
class _Rows:
    """X as row blocks of ``block`` rows, in order: slices of an in-memory array, or
    the blocks of its store (read one at a time, never held whole)."""

    def __init__(self, X: Any, block: int) -> None:
        self.block = int(block)
        if isinstance(X, np.ndarray):
            if X.ndim != 2:
                raise ValueError(f"X must be 2-D (n_samples, n_features), got shape {X.shape}")
            self.X, self.lazy = X, None
        else:
            self.X, self.lazy = None, as_input_blocks(X, self.block)
        src = self.X if self.X is not None else self.lazy
        self.n, self.d = int(src.shape[0]), int(src.shape[1])

    @property
    def n_blocks(self) -> int:
        return -(-self.n // self.block)

    def __iter__(self) -> Iterator[tuple[int, np.ndarray]]:
        return self.iter_from(0)

    def iter_from(self, start: int) -> Iterator[tuple[int, np.ndarray]]:
        """The blocks from block ``start`` on (those before are not read)."""
        for i in range(int(start), self.n_blocks):
            s = i * self.block
            if self.X is not None:
                xb = self.X[s : s + self.block]
            else:
                xb = self.lazy.blocks[i].compute()
            yield s, np.ascontiguousarray(xb, dtype=np.float64)

    def take(self, idx: np.ndarray) -> np.ndarray:
        """The rows ``idx`` (the centres), float64."""
        src = self.X if self.X is not None else self.lazy
        rows = src[np.asarray(idx, dtype=np.int64)]
        rows = rows.compute() if hasattr(rows, "compute") else rows
        return np.ascontiguousarray(rows, dtype=np.float64)

    def whole(self) -> np.ndarray:
        return self.X if self.X is not None else np.asarray(self.lazy.compute())


def _check_finite_rows(xb: np.ndarray) -> None:
    """ValueError unless the rows ``xb`` of X (a row block, or the centres) are finite."""
    if not np.all(np.isfinite(xb)):
        raise ValueError("X contains NaN or infinite values; clean or impute them first")


# -- the pass over the rows: the one home of the Nyström solver's and its CV's passes ----------
def kernel_blocks(
    rows: _Rows, block: Callable[[np.ndarray], np.ndarray], *, start: int = 0,
    check: bool = True,
) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:  # fmt: skip
    """``(first row, X_b, G_b)`` for each row block X_b of ``rows`` from block ``start`` on,
    in order, with ``G_b = block(X_b)``, the kernel block ``k(X_b, C)`` (b x M; the fused
    tile evaluator, :func:`pipeline.engine.fused.kernel_tile`, into a buffer of the
    caller's). X_b and G_b are checked finite (ValueError, :class:`~pipeline.kernels.base.
    NonFiniteKernelError`) unless ``check`` is False: a repeat of a pass that checked them
    (the tile evaluator gives the same bits again; the checks cost ~9 % of a recomputed
    pass).

    The solver's sums and products (:meth:`NystromNormalOperator.pass_sums`,
    :meth:`~NystromNormalOperator.normal_product`) and the CV's statistics
    (:func:`pipeline.models.selection.nystrom_cv.fold_statistics`) all run on this pass,
    accumulating in its order (:func:`add_block_sums`)."""
    for s, xb in rows.iter_from(start):
        if check:
            _check_finite_rows(xb)
        G = block(xb)
        if check:
            check_finite_kernel(G, "the kernel K(X, C) of the Nyström centres")
        yield s, xb, G


def add_block_sums(
    G: np.ndarray, yb: np.ndarray, w: np.ndarray | None, acc: np.ndarray,
    normal: np.ndarray | None = None,
) -> None:  # fmt: skip
    """Add one row block's terms into the pass's float64 sums: ``G_bᵀ W_b y_b`` into
    ``acc`` (M x t) and ``G_bᵀ W_b G_b`` (a SYRK) into ``normal`` (M x M; skipped when
    None). ``w``: the block's weights as a column (b x 1), None for unit weights; the
    products run in G's dtype (float32 products, float64 sums)."""
    yb = yb if w is None else yb * w
    acc += np.asarray(G.T @ yb.astype(G.dtype, copy=False), dtype=np.float64)
    if normal is not None:
        Gw = G if w is None else G * np.sqrt(w, dtype=G.dtype)
        normal += np.asarray(gram_t(Gw), dtype=np.float64)  # a SYRK


def centre_kernel(kernel: Any, C: np.ndarray, n_threads: int | None = None) -> np.ndarray:
    """``K_MM = k(C, C)`` of the centres C, float64, checked finite."""
    K_MM = np.empty((C.shape[0], C.shape[0]))
    kernel_tile(kernel, C, None, K_MM, kernel_dtype="float64", n_threads=n_threads)
    check_finite_kernel(K_MM, "the kernel K(C, C) of the Nyström centres")
    return K_MM


def nystrom_centres(
    X: Any,
    kernel: Any,
    n_centers: int,
    *,
    centers: str = "uniform",
    random_state: Any = 0,
    block_size: int = 2048,
    pivot_order: bool = False,
) -> np.ndarray:
    """The row indices (sorted) of the M centres of X.

    ``"uniform"``: M rows drawn without replacement (K not evaluated); ``"rpcholesky"``:
    the pivots of :func:`pipeline.linalg.precond.build_nystrom` at rank M (fewer when
    K's residual vanishes first, e.g. duplicated rows; X is read into memory), in the
    order they were picked with ``pivot_order`` (so the first m are a rank-m RPCholesky's
    own: the CV screen's nested fidelities, ``nystrom_cv.setting_statistics``).
    """
    m = check_n_centers(n_centers)
    centers = _check_centres(centers)
    rows = X if isinstance(X, _Rows) else None
    n = int(X.shape[0]) if rows is None else rows.n
    if m > n:
        raise ValueError(f"n_centers={m} exceeds the number of samples N={n}; use n_centers <= N")
    if centers == "uniform":
        return uniform_centre_indices(n, m, random_state=random_state)
    if rows is None and not isinstance(X, np.ndarray):
        rows = _Rows(X, block_size)
    Xm = X if rows is None else rows.whole()
    op = make_operator("matrix-free", 1.0, X=Xm, kernel=kernel, block_size=block_size)
    nf = build_nystrom(op, centres="rpcholesky", rank=m, random_state=random_state)
    piv = np.asarray(nf.centres, dtype=np.int64)
    return piv if pivot_order else np.sort(piv)


# -- FALKON's preconditioner -------------------------------------------------------------------
class FalkonPreconditioner:
    """``B = T⁻¹ A⁻¹`` with ``K_MM + ε I = Tᵀ T`` and ``T Tᵀ / M + λ' I = Aᵀ A`` (both upper).

    Parameters
    ----------
    K_MM : ndarray (M, M)
        The centres' kernel matrix.
    shift_per_sample : float
        λ' = λ / n (n = Σ w), FALKON's per-sample penalty.

    Attributes
    ----------
    jitter : float
        ε, ``JITTER · M · max(diag K_MM)``, raised tenfold until ``K_MM + ε I`` factors.
    """

    def __init__(self, K_MM: np.ndarray, shift_per_sample: float) -> None:
        M = K_MM.shape[0]
        scale = max(float(np.max(np.diag(K_MM))), np.finfo(np.float64).tiny)
        eps = JITTER * M * scale
        for _ in range(12):
            try:
                T = cholesky(K_MM + eps * np.eye(M), lower=False, overwrite_a=True)
                break
            except np.linalg.LinAlgError:
                eps *= 10.0
        else:
            raise IndefiniteKernelError(
                f"K_MM + {eps:.3g} I (the Nyström centres' kernel matrix) is not positive "
                "definite: the kernel is not positive semi-definite, which FALKON's "
                "preconditioner needs; use a Mercer kernel such as 'rbf', or an exact solver"
            )
        self.K_MM = K_MM  # (a reference: read by mapped_kernel, never written)
        self.T = T
        self.A = self._factor_a(shift_per_sample)
        self.jitter = float(eps)
        self.scale = scale
        self._mapped_k: np.ndarray | None = None
        self._inv_norm2: float | None = None

    def _factor_a(self, shift_per_sample: float) -> np.ndarray:
        """``A = chol(T Tᵀ / M + λ' I)`` (upper)."""
        M = self.T.shape[0]
        S = gram_t(self.T.T) / M  # T Tᵀ
        S[np.diag_indices(M)] += shift_per_sample
        return cholesky(S, lower=False, overwrite_a=True)

    def leading(self, m: int) -> FalkonPreconditioner:
        """The preconditioner of the first ``m`` centres in this one's basis: T's leading
        block (T is triangular, so ``G T⁻¹``'s first m columns are those of the first m
        centres' own map) and its ε; A is left unset (:meth:`with_shift` factors one; T is
        all that :class:`ShiftPath` and :meth:`map_rows` read)."""
        pre = copy.copy(self)
        pre.K_MM = self.K_MM[:m, :m]
        pre.T = np.ascontiguousarray(self.T[:m, :m])
        pre.A = None
        pre._mapped_k = None
        pre._inv_norm2 = None
        return pre

    def with_shift(self, shift_per_sample: float) -> FalkonPreconditioner:
        """The preconditioner of the same K_MM at another λ': T (and ε) kept, only A
        factored anew (the bits of building it anew)."""
        pre = copy.copy(self)
        pre.A = self._factor_a(shift_per_sample)
        return pre

    def _solve(self, R: Any, which: str, trans: int) -> np.ndarray:
        F = self.T if which == "T" else self.A
        return scipy.linalg.solve_triangular(F, R, lower=False, trans=trans, check_finite=False)

    def basis_rounding(self, n_rows: int) -> float:
        """The relative rounding of ``K_nMᵀ W K_nM`` formed in the centres' basis, once
        mapped by ``T⁻¹``: ``eps · n_rows · max diag(K_MM) · ‖T⁻¹‖₂²``, with ``‖T⁻¹‖₂² =
        1 / λ_min(K_MM + ε I)`` by Lanczos on ``T⁻¹ T⁻ᵀ`` (two triangular solves of M²
        flops per step; LAPACK's 1-norm estimate was 25x high at 3,000,000 rows)."""
        if self._inv_norm2 is None:
            M = self.T.shape[0]

            def inv(v: np.ndarray) -> np.ndarray:
                return self._solve(self._solve(v, "T", 1), "T", 0)

            op = scipy.sparse.linalg.LinearOperator((M, M), matvec=inv, dtype=np.float64)
            top = scipy.sparse.linalg.eigsh(
                op, k=1, which="LA", v0=np.ones(M), tol=1e-2, return_eigenvectors=False
            )
            self._inv_norm2 = float(top[0])
        return float(np.finfo(np.float64).eps * n_rows * self.scale * self._inv_norm2)

    def maps_rows(self, n_rows: int, shift: float) -> bool:
        """Whether a direct solve over ``n_rows`` rows at the diagonal ``shift`` (the
        smallest, for several) sums its blocks mapped by ``T⁻¹`` (:meth:`map_rows`): the
        relative error that the centres' basis brings to the solution, about
        ``basis_rounding · max diag(K_MM) / shift`` (the formed matrix's rounding over the
        system's smallest eigenvalue), reaches :data:`~pipeline.constants.
        NYSTROM_MAPPED_FROM`. The one rule of the solver's direct pass and the CV's
        statistics."""
        return self.basis_rounding(n_rows) * self.scale >= NYSTROM_MAPPED_FROM * float(shift)

    def map_rows(self, G: np.ndarray) -> np.ndarray:
        """``G T⁻¹`` in float64: kernel rows in the basis where ``K_MM`` is about I."""
        G64 = np.asarray(G, dtype=np.float64)
        return scipy.linalg.solve_triangular(
            self.T, G64.T, lower=False, trans=1, check_finite=False
        ).T

    def mapped_kernel(self) -> np.ndarray:
        """``T⁻ᵀ K_MM T⁻¹`` (symmetric) of this preconditioner's own K_MM, made once and kept
        (copies by :meth:`with_shift` share it; :meth:`leading` makes its own)."""
        if self._mapped_k is None:
            Z = self._solve(self.K_MM, "T", 1)  # T⁻ᵀ K
            Km = self._solve(np.ascontiguousarray(Z.T), "T", 1)  # T⁻ᵀ K T⁻¹
            self._mapped_k = 0.5 * (Km + Km.T)
        return self._mapped_k

    def apply_a_t(self, R: np.ndarray) -> np.ndarray:
        """``A⁻ᵀ R``."""
        return self._solve(R, "A", 1)

    def apply(self, G: np.ndarray) -> np.ndarray:
        """``B G = T⁻¹ A⁻¹ G``."""
        return self._solve(self._solve(G, "A", 0), "T", 0)

    def apply_t(self, R: np.ndarray) -> np.ndarray:
        """``Bᵀ R = A⁻ᵀ T⁻ᵀ R``."""
        return self._solve(self._solve(R, "T", 1), "A", 1)


# -- the preconditioned normal operator -------------------------------------------------------
class ShiftPath:
    """Every shift of one Nyström system from one eigendecomposition: ``β(s)`` solving
    ``(S + s K_MM) β = r`` for all s at once (the λ path of the CV's folds).

    ``Φ = T⁻¹ U κ^-½`` (``T⁻ᵀ K_MM T⁻¹ = U diag(κ) Uᵀ``, from ``pre``: FALKON's T) makes
    ``Φᵀ K_MM Φ = I``, so with ``Φᵀ S Φ = V diag(μ) Vᵀ`` the system is diagonal in ``Φ V``:
    ``β(s) = Φ V (μ + s)⁻¹ Vᵀ Φᵀ r``. It is the system the direct solve factors per shift
    (:meth:`NystromNormalOperator.solve_direct`), solved exactly, not a second
    approximation; its rounding is that of one factorisation times ``1 / κ_min``, so it
    is offered only where ``κ_min >= PATH_KAPPA_MIN`` (:meth:`make`; near-duplicate
    centres make K_MM singular and κ_min about 0: the caller then solves shift by
    shift). With ``mapped`` the sums S and r are of the rows mapped by ``T⁻¹`` already
    (:meth:`FalkonPreconditioner.map_rows`), and are projected by ``U κ^-½`` alone."""

    def __init__(self, phi: np.ndarray, proj: np.ndarray, kappa_min: float) -> None:
        self.phi = phi
        self.proj = proj
        self.kappa_min = float(kappa_min)

    @classmethod
    def make(cls, pre: FalkonPreconditioner, mapped: bool) -> ShiftPath | None:
        """The path of ``pre``'s K_MM, or None where κ_min < :data:`PATH_KAPPA_MIN`."""
        kappa, U = scipy.linalg.eigh(pre.mapped_kernel(), check_finite=False)
        if not kappa[0] >= PATH_KAPPA_MIN * kappa[-1]:
            return None
        W = U / np.sqrt(kappa)
        phi = pre._solve(W, "T", 0)  # T⁻¹ U κ^-½
        return cls(phi, W if mapped else phi, kappa[0] / kappa[-1])

    def coefficients(
        self, S: np.ndarray, r: np.ndarray, shifts: Any
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(β, residual)``: β (M x len(shifts)·t), shift after shift, each with the t
        columns of ``r``; the relative residual of each column in the diagonalised system."""
        P = self.proj
        H = P.T @ S @ P
        mu, V = scipy.linalg.eigh(0.5 * (H + H.T), check_finite=False)
        rp = P.T @ r
        c = V.T @ rp
        s = np.asarray(shifts, dtype=np.float64)
        Y = (c[:, None, :] / (mu[:, None, None] + s[None, :, None])).reshape(len(mu), -1)
        Z = V @ Y  # the solutions in Φ's coordinates
        rhs = np.tile(rp, (1, len(s)))
        R = H @ Z + Z * np.repeat(s, rp.shape[1])[None, :] - rhs
        nb = np.linalg.norm(rhs, axis=0)
        res = np.linalg.norm(R, axis=0) / np.where(nb > 0, nb, 1.0)
        return self.phi @ Z, res


class NystromNormalOperator:
    """``γ -> Bᵀ (K_nMᵀ W K_nM + λ K_MM) B γ / n``, the system CG solves.

    Built by :func:`nystrom_solve`; ``fingerprint`` names everything its products
    depend on (X, kernel, centres, λ, weights, block size, product dtype), for the CG
    checkpoints.
    """

    def __init__(
        self,
        rows: _Rows,
        kernel: Any,
        centres: np.ndarray,
        X_centres: np.ndarray,
        shift: float,
        weights: np.ndarray | None,
        product_dtype: str,
        n_threads: int | None,
        cache_bytes: int = 0,
        direct: bool = False,
    ) -> None:
        self.rows = rows
        self.kernel = kernel
        self.centres = centres
        self.C = X_centres
        self.shift = float(shift)
        self.weights = weights
        self.product_dtype = np.dtype(product_dtype)
        self.n_threads = n_threads
        self.n_eff = float(rows.n if weights is None else np.sum(weights))
        self.K_MM = centre_kernel(kernel, X_centres, n_threads)
        self.pre = FalkonPreconditioner(self.K_MM, self.shift / self.n_eff)
        self.n = len(centres)
        #: the direct solve's pass sums the blocks mapped by T⁻¹ (:meth:`FalkonPreconditioner.
        #: map_rows`) where the centres' own basis would round too much
        self.mapped = bool(direct) and self.pre.maps_rows(rows.n, self.shift)
        self._buf: np.ndarray | None = None
        #: the kernel blocks, kept after the first pass when all of them fit ``cache_bytes``
        self.cache = rows.n * self.n * self.product_dtype.itemsize <= int(cache_bytes)
        self._cached: list[tuple[int, np.ndarray]] | None = None
        self._x_fp: str | None = None
        self.n_products = 0

    # the kernel block G_b = k(X_b, C), into one reused buffer
    def _block(self, xb: np.ndarray) -> np.ndarray:
        b = xb.shape[0]
        if self.cache:  # a block of its own, kept
            G = np.empty((b, self.n), dtype=self.product_dtype)
        else:
            if self._buf is None or self._buf.shape[0] < b:
                self._buf = np.empty((max(b, self.rows.block), self.n), dtype=self.product_dtype)
            G = self._buf[:b]
        kernel_tile(self.kernel, xb, self.C, G, kernel_dtype=self.product_dtype.name,
                    n_threads=self.n_threads)  # fmt: skip
        return G

    def _blocks(
        self, start: int = 0, *, fresh: bool = False
    ) -> Iterator[tuple[int, np.ndarray | None, np.ndarray]]:
        """``(first row, X_b, G_b)`` for each row block from block ``start`` on, in order
        (:func:`kernel_blocks`): the kept blocks (X_b None) unless ``fresh``, once a whole
        pass has kept them (when they fit ``cache_bytes``); else :meth:`_block`'s. A
        ``fresh`` pass (:meth:`pass_sums`, the first) checks X_b and G_b finite; the
        products' passes after it recompute the same blocks unchecked."""
        if self._cached is not None and not fresh:
            for s, G in self._cached[int(start) :]:
                yield s, None, G
            return
        keep: list[tuple[int, np.ndarray]] = []
        for s, xb, G in kernel_blocks(self.rows, self._block, start=start, check=fresh):
            if self.cache:
                keep.append((s, G))
            yield s, xb, G
        if self.cache and start == 0:
            self._cached = keep

    def _weights(self, s: int, b: int) -> np.ndarray | None:
        return None if self.weights is None else self.weights[s : s + b, None]

    def rhs(self, y: np.ndarray, normal: np.ndarray | None = None) -> np.ndarray:
        """``Bᵀ K_nMᵀ W y / n`` (y of shape (N, t)); also X's fingerprint, one pass.

        ``normal`` (M x M, float64, zeros): ``K_nMᵀ W K_nM`` is added into it in the same
        pass, block by block in order (the direct solve's one pass over X)."""
        return self.sums_rhs(self.pass_sums(y, normal))

    def sums_rhs(self, acc: np.ndarray) -> np.ndarray:
        """The system's right-hand side from the pass's ``K_nMᵀ W y``: ``Bᵀ acc / n``; in
        the mapped basis (``mapped``) ``acc`` is ``T⁻ᵀ K_nMᵀ W y`` already: ``A⁻ᵀ acc / n``."""
        if self.mapped:
            return self.pre.apply_a_t(acc / self.n_eff)
        return self.pre.apply_t(acc / self.n_eff)

    def pass_sums(
        self, y: np.ndarray, normal: np.ndarray | None = None, *, acc: np.ndarray | None = None,
        start: int = 0, x_parts: list[str] | None = None,
        on_block: Callable[[int, np.ndarray, list[str] | None], Any] | None = None,
    ) -> np.ndarray:  # fmt: skip
        """The pass of :meth:`rhs` from row block ``start`` on: ``K_nMᵀ W y`` (not
        preconditioned) added into ``acc`` (zeros when None), ``K_nMᵀ W K_nM`` into
        ``normal``, block by block in order, so a pass resumed with the sums of blocks
        ``< start`` (and ``x_parts``, the streamed X's fingerprints of those blocks) has
        the uninterrupted pass's bits. ``on_block(next block, acc, x_parts)`` is called
        after each block (``x_parts`` None when X is not streamed). With ``mapped``, both
        sums are of the blocks mapped by ``T⁻¹``."""
        acc = np.zeros((self.n, y.shape[1])) if acc is None else acc
        stream_fp = self._x_fp is None and self.rows.X is None
        block_fps = list(x_parts or []) if stream_fp else None
        for i, (s, xb, G) in enumerate(self._blocks(start, fresh=True), start=int(start)):
            if block_fps is not None:  # fingerprinted block by block: X is never held whole
                block_fps.append(fingerprint_blocks([xb]))
            b = G.shape[0]
            Gs = self.pre.map_rows(G) if self.mapped else G
            add_block_sums(Gs, y[s : s + b], self._weights(s, b), acc, normal)
            if on_block is not None:
                on_block(i + 1, acc, block_fps)
        if block_fps is not None:
            self._x_fp = fingerprint_obj(block_fps)
        return acc

    def normal_product(self, U: np.ndarray) -> np.ndarray:
        """``(K_nMᵀ W K_nM + λ K_MM) U``, summed over the row blocks in order."""
        acc = self.shift * (self.K_MM @ U)
        Ud = U.astype(self.product_dtype, copy=False)
        for s, _, G in self._blocks():
            Z = np.asarray(G @ Ud, dtype=np.float64)
            w = self._weights(s, G.shape[0])
            if w is not None:
                Z *= w
            acc += np.asarray(G.T @ Z.astype(self.product_dtype, copy=False), dtype=np.float64)
        self.n_products += 1
        return acc

    def solve_direct(self, normal: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """γ solving the preconditioned system ``P γ = b`` directly, ``P = Bᵀ (K_nMᵀ W K_nM
        + λ K_MM) B / n`` formed from ``normal`` (``K_nMᵀ W K_nM``, from :meth:`rhs`): the
        same system CG iterates on, and as well conditioned, factored once (M³/3).
        With ``mapped``, ``normal`` is ``T⁻ᵀ K_nMᵀ W K_nM T⁻¹`` and ``P = A⁻ᵀ (normal + λ
        T⁻ᵀ K_MM T⁻¹) A⁻¹ / n``, the same matrix without the rounding of the unmapped sum.
        Returns (γ, the relative residual of each column, float64)."""
        if self.mapped:
            H = normal + self.shift * self.pre.mapped_kernel()
            P = self.pre.apply_a_t(self.pre.apply_a_t(H).T) / self.n_eff  # A⁻ᵀ H A⁻¹
        else:
            H = normal + self.shift * self.K_MM
            P = self.pre.apply_t(self.pre.apply_t(H).T) / self.n_eff  # Bᵀ (Bᵀ H)ᵀ = Bᵀ H B
        P = 0.5 * (P + P.T)
        try:
            c = cho_factor(P)
            g = scipy.linalg.cho_solve(c, b, check_finite=False)
        except np.linalg.LinAlgError:  # not positive definite in floating point: least squares
            g = scipy.linalg.lstsq(P, b, check_finite=False)[0]
        nb = np.linalg.norm(b, axis=0)
        res = np.linalg.norm(P @ g - b, axis=0) / np.where(nb > 0, nb, 1.0)
        self.n_products += 1
        return g, res

    def matvec(self, V: np.ndarray) -> np.ndarray:
        V2 = np.asarray(V, dtype=np.float64).reshape(self.n, -1)
        out = self.pre.apply_t(self.normal_product(self.pre.apply(V2)) / self.n_eff)
        return out.reshape(np.shape(V))

    __call__ = matvec

    def coef(self, gamma: np.ndarray) -> np.ndarray:
        """``β = B γ``."""
        g = np.asarray(gamma, dtype=np.float64)
        return self.pre.apply(g.reshape(self.n, -1)).reshape(g.shape)

    def _inputs(self, x_fp: Any) -> dict[str, Any]:
        return {
            "solver": "nystrom",
            "X": x_fp,
            "kernel": kernel_fingerprint(self.kernel),
            "centres": fingerprint_blocks([self.centres]),
            "shift": self.shift,
            "weights": None if self.weights is None else fingerprint_blocks([self.weights]),
            "block_size": self.rows.block,
            "product_dtype": self.product_dtype.name,
            **evaluation_identity(self.kernel, self.product_dtype),  # the engine's exp
            **gram_t_identity(len(self.centres)),  # KᵀK and T Tᵀ in panels past SYRK_PANEL
            **({"basis": "mapped"} if self.mapped else {}),  # the direct pass's sums
        }

    @property
    def fingerprint(self) -> str:
        if self._x_fp is None:
            self._x_fp = fingerprint_obj(
                [fingerprint_blocks([xb]) for _, xb in self.rows]
            )  # the same recipe as the streaming pass of ``rhs``
        return fingerprint_obj(self._inputs(self._x_fp))

    def pass_fingerprint(self, Y: np.ndarray) -> str:
        """The direct pass's identity (its checkpoints'): the operator's inputs and y's
        fingerprint. X in memory enters whole (a hash, no kernel work); a streamed X,
        which the pass fingerprints block by block as it reads it, enters by its shape
        and the centres' rows (its blocks' fingerprints are saved with the state)."""
        if self.rows.X is not None:
            self.fingerprint  # noqa: B018 (sets self._x_fp: X's blocks, hashed)
            x_id: Any = self._x_fp
        else:
            x_id = {"streamed": [self.rows.n, self.rows.d], "rows": fingerprint_blocks([self.C])}
        return fingerprint_obj(
            {"operator": self._inputs(x_id), "method": "direct",
             "y": fingerprint_blocks([np.asarray(Y, dtype=np.float64)])}
        )  # fmt: skip


@dataclass
class NystromSolution:
    """What :func:`nystrom_solve` returns.

    Attributes
    ----------
    coef : ndarray (M,) or (M, t)
        β, the coefficients of the centres (a model's ``dual_coef``).
    centres : ndarray of int (M,)
        The centres' row indices in X.
    X_centres : ndarray (M, D), float64
        The centres (a model's ``X_fit``).
    cg : CGResult
        The preconditioned CG solve (its ``x`` is γ).
    info : dict
        JSON-able details: ``n_centers``, ``centers``, ``jitter``, ``n_iter``,
        ``converged``, ``rel_residual``, ``block_size``, ``product_dtype``, ``seconds``.
    """

    coef: np.ndarray
    centres: np.ndarray
    X_centres: np.ndarray
    cg: CGResult
    info: dict[str, Any] = field(default_factory=dict)


def _direct_pass(
    op: NystromNormalOperator, Y: np.ndarray, store: str | None, every: int
) -> tuple[np.ndarray, np.ndarray, int, int]:
    """The direct method: one pass (``K_nMᵀ W K_nM`` and ``K_nMᵀ W y``), then the factored
    M x M system. Returns (γ, the relative residuals, the block it started from, the
    number of blocks).

    With ``store``, the pass's state (the next block, both float64 sums, the streamed X's
    block fingerprints so far) is saved every ``every`` row blocks, and γ once solved
    (a rerun of the same solve is then a pure resume), through the CG checkpoints'
    storage contract (:class:`pipeline.linalg.cg_checkpoint.SlotCheckpoint`: two slots
    ``_nystrom/pass/slot{0,1}.npz``, the marker ``_markers/nystrom-pass/state``,
    CRC-32C, :meth:`NystromNormalOperator.pass_fingerprint`). The sums continue in
    block order, so a resumed pass has the uninterrupted pass's bits.
    """
    n_blocks = op.rows.n_blocks
    if store is None:
        normal = np.zeros((op.n, op.n))
        b = op.rhs(Y, normal)
        g, rel = op.solve_direct(normal, b)
        return g, rel, 0, n_blocks
    if int(every) != every or every < 1:
        raise ValueError(f"checkpoint interval 'every' must be an integer >= 1, got {every!r}")
    fp = op.pass_fingerprint(Y)
    ckpt = SlotCheckpoint(
        store, fp, marker="nystrom-pass", folder="_nystrom/pass", position="block",
        label="Nyström pass checkpoint",
    )  # fmt: skip
    got = ckpt.read_state()
    t = Y.shape[1]
    if got is not None:
        z, meta = got
        k = int(meta["block"])
        shapes = (
            z.get("gamma", np.empty(0)).shape == (op.n, t) if meta.get("done")
            else z.get("acc", np.empty(0)).shape == (op.n, t)
            and z.get("normal", np.empty(0)).shape == (op.n, op.n)
        )  # fmt: skip
        if not 0 < k <= n_blocks or not shapes:
            log.warning("Nyström pass checkpoint in %s does not fit this solve; ignoring it",
                        ckpt.root)  # fmt: skip
            got = None
    if got is not None and meta.get("done"):
        log.info("resuming the Nyström pass: solved already (%d blocks)", n_blocks)
        if meta.get("x_fp") is not None:
            op._x_fp = str(meta["x_fp"])
        return z["gamma"], z["rel"], n_blocks, n_blocks
    start, acc, normal, parts = 0, None, np.zeros((op.n, op.n)), None
    if got is not None:
        start = k
        acc, normal = np.array(z["acc"], dtype=np.float64), np.array(z["normal"], dtype=np.float64)
        parts = meta.get("x_parts")
        log.info("resuming the Nyström pass from block %d of %d", start, n_blocks)

    def save(nxt: int, acc: np.ndarray, x_parts: list[str] | None) -> None:
        if nxt % every == 0 and nxt < n_blocks:
            meta = {"block": nxt, "fingerprint": fp, "done": False, "x_parts": x_parts}
            ckpt.write_state({"acc": acc, "normal": normal}, meta, nxt)

    acc = op.pass_sums(Y, normal, acc=acc, start=start, x_parts=parts, on_block=save)
    b = op.sums_rhs(acc)
    g, rel = op.solve_direct(normal, b)
    meta = {"block": n_blocks, "fingerprint": fp, "done": True, "x_fp": op._x_fp}
    ckpt.write_state({"gamma": g, "rel": rel}, meta, n_blocks)
    return g, rel, start, n_blocks


def _block_rows(block_size: int | None, m: int) -> int:
    if block_size is None:
        return int(min(8192, max(256, BLOCK_BYTES // (8 * m))))
    if int(block_size) != block_size or int(block_size) < 1:
        raise ValueError(f"block_size must be a positive integer, got {block_size!r}")
    return int(block_size)


def nystrom_solve(
    X: Any,
    y: Any,
    kernel: Any,
    shift: float,
    *,
    n_centers: int,
    centers: str = "uniform",
    sample_weight: Any = None,
    block_size: int | None = None,
    tol: float = 1e-6,
    max_iter: int | None = None,
    random_state: Any = 0,
    product_dtype: str = "float64",
    store: str | None = None,
    checkpoint_every: int = 10,
    callback: Callable[..., Any] | None = None,
    centre_indices: Any = None,
    n_threads: int | None = None,
    cache_bytes: int | None = None,
    method: str = "pcg",
) -> NystromSolution:
    """Nyström kernel ridge regression by FALKON: solve ``(K_nMᵀ W K_nM + λ K_MM) β = K_nMᵀ W y``.

    Parameters
    ----------
    X : ndarray, dask array, zarr array or path (N, D)
        Training inputs, finite; anything but a numpy array is streamed in row blocks.
    y : ndarray (N,) or (N, t)
    kernel : Kernel, str or spec dict
    shift : float
        λ > 0 in scikit-learn's convention (the exact problem's ``K + λ I``).
    n_centers : int
        M, the number of centres (1 <= M <= N).
    centers : {"uniform", "rpcholesky"}
    sample_weight : ndarray (N,), optional
        Non-negative weights w (the caller has checked them).
    block_size : int, optional
        Rows of X per kernel block (default: a block of about 64 MiB, 256 to 8192 rows).
        The sums' order, so the result's bits, follow it.
    tol, max_iter : CG's relative residual tolerance (of the preconditioned system) and
        iteration limit (default 1000).
    random_state : int
        Seed of the centres.
    product_dtype : {"float64", "float32"}
        Precision of the kernel blocks and their products (float64 sums either way).
    store : str, optional
        Checkpoint directory: the solve saves its state every ``checkpoint_every`` CG
        iterations (``"pcg"``) or row blocks of the one pass (``"direct"``: the next
        block, the two float64 sums, X's fingerprints so far; γ once solved) and resumes
        the same solve from it, to the bits of an uninterrupted one (``info["resumed"]``,
        ``info["start_block"]``). The default, 10 blocks, writes the M x M sum (8·M²
        bytes) once per 10·b·M² flops of SYRK: a few percent of the pass at b >= 1000.
    checkpoint_every : int
        CG iterations, or row blocks, between two checkpoints.
    callback : callable, optional
        Called with the CG state after every iteration (``"pcg"`` only).
    centre_indices : array of int, optional
        Use these centres (row indices) instead of choosing them. A stagnating PCG
        (:class:`~pipeline.errors.CGStagnationError`) carries its own as the error's
        ``centre_indices``, for a direct pass on the same centres.
    n_threads : int, optional
        Threads of the kernel evaluation (default: every core).
    cache_bytes : int, optional
        Keep the kernel blocks (N x M in all) in memory after the first pass when they
        fit in this many bytes (default :data:`~pipeline.constants.NYSTROM_CACHE_BYTES`; 0: recompute them at every
        product, memory O(M² + b·M)). The result is the same to the bit either way.
    method : {"pcg", "direct"}
        ``"pcg"``: FALKON's preconditioned CG, a pass over X per iteration. ``"direct"``:
        one pass over X accumulates ``K_nMᵀ W K_nM`` (N·M² flops, a SYRK per block) with
        the right-hand side, then the preconditioned M x M system is factored (M³/3):
        the same system and solution (to CG's tolerance), cheaper whenever N·M² flops of
        SYRK cost less than CG's passes (:func:`pipeline.plan.cg_cost.nystrom_method`
        chooses). Memory O(M² + b·M) either way; both resumable with ``store``.

    Returns
    -------
    NystromSolution
    """
    t0 = time.perf_counter()
    kernel = make_kernel(kernel)
    shift = check_shift(shift)
    if product_dtype not in PRODUCT_DTYPES:
        raise ValueError(
            f"product_dtype={product_dtype!r} is not valid; choose one of {PRODUCT_DTYPES}"
        )
    centers = _check_centres(centers)
    m = check_n_centers(n_centers)
    if method not in NYSTROM_METHODS:
        raise ValueError(f"method={method!r} is not valid; choose one of {NYSTROM_METHODS}")
    y = np.asarray(y, dtype=np.float64)
    one_d = y.ndim == 1
    Y = y.reshape(y.shape[0], -1)
    rows = _Rows(X, _block_rows(block_size, m))
    n = rows.n
    if Y.shape[0] != n:
        raise ValueError(f"y has {Y.shape[0]} rows but X has {n}; they must match")
    w = None
    if sample_weight is not None:
        w = np.asarray(sample_weight, dtype=np.float64).reshape(-1)
        if w.shape[0] != n:
            raise ValueError(f"sample_weight has {w.shape[0]} entries but X has {n} rows")
        if not np.all(np.isfinite(w)) or np.any(w < 0) or not np.sum(w) > 0:
            raise ValueError(
                "sample_weight must be finite and non-negative with a positive sum, got "
                f"min {np.min(w)!r}, sum {np.sum(w)!r}"
            )
    if centre_indices is None:
        idx = nystrom_centres(
            rows, kernel, m, centers=centers, random_state=random_state, block_size=rows.block
        )
    else:
        idx = np.asarray(centre_indices, dtype=np.int64).reshape(-1)
    C = rows.take(idx)
    _check_finite_rows(C)
    cache = NYSTROM_CACHE_BYTES if cache_bytes is None else int(cache_bytes)
    if method == "direct":
        cache = 0  # one pass: nothing is read twice
    op = NystromNormalOperator(
        rows, kernel, idx, C, shift, w, product_dtype, n_threads, cache, direct=method == "direct"
    )
    start_block = 0
    if method == "direct":
        t1 = time.perf_counter()
        g, rel, start_block, n_blocks = _direct_pass(op, Y, store, checkpoint_every)
        # the factorisation's residual is checked against tol as CG's is: a least-squares
        # fallback on a singular system that misses it is reported unconverged, never as solved
        ok = np.asarray(rel) <= float(np.max(tol))
        res = CGResult(
            g, bool(ok.all()), 0, 0, 1, rel, rel[None, :], tol, 0, time.perf_counter() - t1,
            column_converged=ok, column_reason=[None if o else "residual" for o in ok],
        )  # fmt: skip
    else:
        b = op.rhs(Y)
        try:
            if store is None:
                res = conjugate_gradient(
                    op.matvec, b, tol=tol, max_iter=max_iter, callback=callback
                )
            else:
                res = resumable_cg(
                    op, b, store, name="nystrom", every=checkpoint_every, tol=tol,
                    max_iter=max_iter, callback=callback,
                )  # fmt: skip
        except CGStagnationError as err:  # the caller's direct pass takes these centres
            err.centre_indices = idx
            raise
    beta = op.coef(res.x)
    info = {
        "n_centers": int(idx.size),
        "centers": centers if centre_indices is None else "given",
        "jitter": op.pre.jitter,
        "n_iter": int(res.n_iter),
        "start_iter": int(res.start_iter),
        "converged": bool(res.converged),
        "rel_residual": np.asarray(res.rel_residual).tolist(),
        "block_size": rows.block,
        "product_dtype": op.product_dtype.name,
        "method": method,
        "resumed": bool(start_block > 0 or res.start_iter > 0),
        "seconds": time.perf_counter() - t0,
    }
    if method == "direct":
        info.update(start_block=int(start_block), n_blocks=int(n_blocks),
                    basis="mapped" if op.mapped else "centres")  # fmt: skip
    log.info(
        "Nyström (%s): M=%d %s centres, %d CG iterations, relative residual %s, %.2f s",
        "FALKON PCG" if method == "pcg" else "direct, one pass", idx.size, info["centers"],
        res.n_iter, info["rel_residual"], info["seconds"],
    )  # fmt: skip
    coef = beta[:, 0] if one_d else beta
    return NystromSolution(coef, idx, C, res, info)
