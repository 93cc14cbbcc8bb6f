"""Per-kernel evaluation of one cache-sized sub-block of a kernel tile.

:func:`prepare` turns ``(kernel, Xi, Xj)`` into a *block evaluator*: the
per-row data every sub-block needs (centred and scaled rows, squared norms,
feature-major copies) is computed once per call, and ``fill(E, r0, r1, c0,
c1, diag, T)`` then writes ``K(Xi[r0:r1], Xj[c0:c1])`` into the preallocated,
C-contiguous scratch ``E`` (``T`` is a second scratch of the same size), with
``out=`` everywhere and no temporaries the size of a block.

Fused kernels (exact class match, so a subclass that overrides ``_eval`` is
never fused by mistake):

- :class:`~pipeline.kernels.RBF`: one GEMM over rows augmented with
  ``[2γ·x, -γ|x|², 1]`` and ``[y, 1, -γ|y|²]`` gives the exponent
  ``-γ|x - y|²`` directly, then ``exp`` in place (the engine's own
  :func:`~pipeline.engine.vexp.exp_inplace`, float64 or float32). Rows are centred by
  ``Xi``'s mean first (as :func:`pipeline.kernels.basic._sq_dists` does), so
  data far from the origin keeps its small differences.
  ARD (a ``length_scale`` per feature) scales the centred rows by
  ``1/length_scale`` once per call, then the same GEMM.
- :class:`~pipeline.kernels.Matern` (ν = 1/2, 3/2, 5/2, scalar or ARD length
  scale): the same augmented GEMM gives ``(√(2ν)·r)²``; then clip at 0, ``np.sqrt``
  and the closed form (:func:`pipeline.kernels.basic.matern_from_scaled_dists`:
  one ``exp`` and, for ν > 1/2, a few multiply-adds into a second scratch block).
  In float32 the distance near 0 is the square root of a float32 cancellation
  (about 3e-4·|x|/ℓ absolute), coarser than the RBF's, which needs no root.
- :class:`~pipeline.kernels.Laplacian`: ``Σ_f |x_f - y_f| = Σx + Σy - 2·Σ_f
  min(x_f, y_f)``, so each feature costs two passes (min, add) instead of
  three; rows centred as above.
- :class:`~pipeline.kernels.Linear` and :class:`~pipeline.kernels.Polynomial`:
  one GEMM (``[γ·x, coef0]·[y, 1]`` for the polynomial), then an integer power
  by repeated squaring (``np.power`` for other degrees).

Any other kernel takes the generic path: ``kernel(Xi_sub, Xj_sub)`` per
sub-block (``kernel(Xi_sub)`` on a diagonal block, exactly as a symmetric
evaluation), announced by one log message per kernel class. Same values,
less speed; never a silently different result.

A diagonal block (``diag=True``: the same rows on both sides) is made exactly
symmetric, with the stationary kernels' exponent set to 0 on its diagonal, so
a symmetric tile stays symmetric to the last bit.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from functools import lru_cache
from typing import Any

import numpy as np

from pipeline.engine.vexp import EXP32_ID, EXP_ID, exp_inplace
from pipeline.kernels import RBF, Kernel, Laplacian, Linear, Matern, Polynomial
from pipeline.kernels.basic import (
    MATERN_NUS,
    inverse_length_scales,
    matern_from_scaled_dists,
)

log = logging.getLogger(__name__)

__all__ = ["F32_LIMIT", "BlockEvaluator", "evaluation_identity", "prepare"]

#: largest value a float32 kernel tile may be asked to hold: float32's maximum
#: with a 16x margin for the rounding inside the GEMM that produces it
F32_LIMIT = float(np.finfo(np.float32).max) / 16

#: sub-block shape (rows, columns) by evaluator family (docs/PERFORMANCE.md#kernel-times-vector):
#: GEMM-based kernels 256 x 512 (1 MB of float64), the Laplacian 128 x 512 (two scratch blocks in L2)
BLOCK_GEMM = (256, 512)
BLOCK_FEATUREWISE = (128, 512)

_logged: set[type] = set()
_log_lock = threading.Lock()


def _log_generic(kernel: Kernel) -> None:
    cls = type(kernel)
    with _log_lock:
        if cls in _logged:
            return
        _logged.add(cls)
    log.info(
        "pipeline.engine: no fused evaluation for kernel class %s; using the generic "
        "per-block path kernel(Xi_sub, Xj_sub) (same values, slower)",
        cls.__name__,
    )


@lru_cache(maxsize=16)
def _upper(r: int) -> tuple[np.ndarray, np.ndarray]:
    return np.triu_indices(r, 1)


def _symmetrize(E: np.ndarray, slab: int = 64) -> None:
    """Copy the strict lower triangle of the square block ``E`` onto its upper one.

    In slabs of ``slab`` rows: only each slab's diagonal square goes through an index
    array (a fancy-indexed copy of the whole triangle is slow); the same bits.
    """
    n = E.shape[0]
    for r0 in range(0, n, slab):
        r1 = min(n, r0 + slab)
        d = E[r0:r1, r0:r1]
        iu = _upper(r1 - r0)
        d[iu] = d.T[iu]
        if r1 < n:
            E[r0:r1, r1:] = E[r1:, r0:r1].T


def _refuse_f32(kernel: Kernel, bound: float) -> None:
    raise ValueError(
        f"kernel_dtype='float32' cannot hold the values of {kernel!r} on this data: "
        f"intermediate or kernel values can reach {bound:.3g}, beyond float32's range "
        f"(max {np.finfo(np.float32).max:.3g}); use kernel_dtype='float64' (the default; "
        "float32 inputs select float32 in pipeline.linalg.blockwise, so cast them to float64 there), "
        "or rescale the inputs (e.g. standardise them) or lower gamma / coef0 / degree"
    )


def _cast(kernel: Kernel, a: np.ndarray, kd: np.dtype) -> np.ndarray:
    out = np.ascontiguousarray(a, dtype=kd)
    if kd == np.float32 and not np.isfinite(out).all() and np.isfinite(a).all():
        _refuse_f32(kernel, float(np.max(np.abs(a))))
    return out


def _centred(Xi: np.ndarray, Xj: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    X64 = Xi.astype(np.float64, copy=False)
    shift = X64.mean(axis=0) if X64.shape[0] else np.zeros(X64.shape[1])
    xc = X64 - shift
    yc = xc if Xj is None else Xj.astype(np.float64, copy=False) - shift
    return xc, yc


def _sq_norms(x: np.ndarray) -> np.ndarray:
    return np.einsum("ij,ij->i", x, x)


def _max(a: np.ndarray) -> float:
    return float(a.max()) if a.size else 0.0


class BlockEvaluator:
    """Fills sub-blocks of ``K(Xi, Xj)``; built by :func:`prepare`.

    Attributes
    ----------
    dtype : numpy.dtype
        dtype of the kernel values (the scratch ``E``).
    block_shape : tuple of int
        The sub-block shape of this evaluator family.
    needs_scratch : bool
        Whether ``fill`` uses the second scratch ``T``.
    """

    dtype: np.dtype
    block_shape: tuple[int, int] = BLOCK_GEMM
    needs_scratch: bool = False

    def fill(self, E: np.ndarray, r0: int, r1: int, c0: int, c1: int, diag: bool, T: Any) -> None:
        """Write ``K(Xi[r0:r1], Xj[c0:c1])`` into ``E`` (shape ``(r1-r0, c1-c0)``)."""
        raise NotImplementedError


def _transpose_into(dst: np.ndarray, src: np.ndarray, rows: int = 64) -> None:
    """``dst[...] = src.T`` in slabs of ``rows`` rows of ``src`` (each slab stays in L1)."""
    for r0 in range(0, src.shape[0], rows):
        dst[:, r0 : r0 + rows] = src[r0 : r0 + rows].T


def _gemm_exp_params(kernel: RBF | Matern, d: int) -> tuple[float, np.ndarray | None]:
    """``(a, w)``: the augmented GEMM gives ``-a·|x' - y'|²`` for rows ``x' = x·w``
    (``w`` per feature, None for none). RBF: ``a = γ`` (ARD: ``w = 1/ℓ``, ``a = 1/2``);
    Matérn: ``a = -2ν/ℓ²`` (ARD: ``w = 1/ℓ``, ``a = -2ν``), so the GEMM gives
    ``(√(2ν)·r)²`` directly."""
    if isinstance(kernel, Matern):
        c = MATERN_NUS[float(kernel.nu)]
        if kernel.ard:
            return -(c**2), inverse_length_scales(kernel, kernel.length_scale, d)
        return -((c / float(kernel.length_scale)) ** 2), None
    if kernel.ard:
        return 0.5, inverse_length_scales(kernel, kernel.length_scale, d)
    return kernel.effective_gamma(d), None


class _GemmExp(BlockEvaluator):
    """exp(A_rᵀ · B_c): the RBF exponent from one augmented GEMM (Matérn: the scaled
    squared distance from the same GEMM, then its closed form).

    ``A`` and ``B`` are kept feature-major (``(d + 2, n)``, C-contiguous): every
    preparation step is then a ufunc over rows of ``n`` elements, and each
    sub-block's GEMM reads contiguous panels. An ARD kernel's rows are scaled by
    ``1/length_scale`` once here (one pass over the rows), after the centring.
    """

    def __init__(
        self,
        kernel: RBF | Matern,
        Xi: np.ndarray,
        Xj: np.ndarray | None,
        kd: np.dtype,
        buffers: Callable[[str, int, np.dtype], np.ndarray] | None = None,
    ):
        self.dtype = kd
        self.nu = float(kernel.nu) if isinstance(kernel, Matern) else None
        self.needs_scratch = self.nu is not None and self.nu != 0.5

        def alloc(name: str, shape: tuple[int, int], dtype: Any) -> np.ndarray:
            if buffers is None:
                return np.empty(shape, dtype)
            return buffers(name, shape[0] * shape[1], np.dtype(dtype)).reshape(shape)

        X64 = Xi.astype(np.float64, copy=False)
        n, d = X64.shape
        g, w = _gemm_exp_params(kernel, d)
        # A = [2g·x; -g|x|²; 1], B = [y; 1; -g|y|²], x and y centred by Xi's mean
        A = alloc("A64", (d + 2, n), np.float64)
        xc = A[:d]
        _transpose_into(xc, X64)
        shift = xc.mean(axis=1) if n else np.zeros(d)
        np.subtract(xc, shift[:, None], out=xc)
        if w is not None:
            np.multiply(xc, w[:, None], out=xc)
        nx = np.einsum("ij,ij->j", xc, xc)
        if Xj is None:
            B = alloc("B64", (d + 2, n), np.float64)
            B[:d] = xc
            ny = nx
        else:
            Y64 = Xj.astype(np.float64, copy=False)
            B = alloc("B64", (d + 2, Y64.shape[0]), np.float64)
            yc = B[:d]
            _transpose_into(yc, Y64)
            np.subtract(yc, shift[:, None], out=yc)
            if w is not None:
                np.multiply(yc, w[:, None], out=yc)
            ny = np.einsum("ij,ij->j", yc, yc)
        if kd == np.float32:
            bound = abs(g) * (math.sqrt(_max(nx)) + math.sqrt(_max(ny))) ** 2
            if not bound <= F32_LIMIT:
                _refuse_f32(kernel, bound)
        np.multiply(xc, 2.0 * g, out=xc)
        np.multiply(nx, -g, out=A[d])
        A[d + 1] = 1.0
        B[d] = 1.0
        np.multiply(ny, -g, out=B[d + 1])
        if kd == np.float64:
            self.A, self.B = A, B
            return
        self.A = alloc("A32", A.shape, kd)
        self.B = alloc("B32", B.shape, kd)
        for dst, src in ((self.A, A), (self.B, B)):
            np.copyto(dst, src, casting="same_kind")
            if not np.isfinite(dst).all() and np.isfinite(src).all():
                _refuse_f32(kernel, float(np.max(np.abs(src))))

    def fill(self, E, r0, r1, c0, c1, diag, T):
        # np.dot releases the GIL around BLAS (np.matmul may not; see fused._strip_products)
        np.dot(self.A[:, r0:r1].T, self.B[:, c0:c1], out=E)
        if diag:
            _symmetrize(E)
            np.fill_diagonal(E, 0.0)
        if self.nu is None:
            exp_inplace(E)
            return
        # Matérn: E = (√(2ν)·r)², up to rounding that can make it slightly negative
        np.maximum(E, 0.0, out=E)
        np.sqrt(E, out=E)
        matern_from_scaled_dists(E, self.nu, T, exp=exp_inplace)


class _L1Exp(BlockEvaluator):
    """exp(-γ·|x - y|₁) by the min identity, two passes per feature."""

    block_shape = BLOCK_FEATUREWISE
    needs_scratch = True

    def __init__(self, kernel: Laplacian, Xi: np.ndarray, Xj: np.ndarray | None, kd: np.dtype):
        self.dtype = kd
        xc, yc = _centred(Xi, Xj)
        d = xc.shape[1]
        g = 1.0 / d if kernel.gamma is None else float(kernel.gamma)
        # with x' = 2γx: -γ|x - y|₁ = Σ_f min(x'_f, y'_f) - (Σx' + Σy') / 2
        xs = _cast(kernel, xc * (2.0 * g), kd)
        ys = xs if Xj is None else _cast(kernel, yc * (2.0 * g), kd)
        sx = xs.sum(axis=1, dtype=np.float64)
        sy = sx if Xj is None else ys.sum(axis=1, dtype=np.float64)
        if kd == np.float32:
            bound = float(np.abs(xs).sum(axis=1).max(initial=0.0)) + float(
                np.abs(ys).sum(axis=1).max(initial=0.0)
            )
            if not bound <= F32_LIMIT:
                _refuse_f32(kernel, bound)
        self.hx = (-0.5 * sx).astype(kd)
        self.hy = (-0.5 * sy).astype(kd)
        self.xt = np.ascontiguousarray(xs.T)
        self.yt = self.xt if Xj is None else np.ascontiguousarray(ys.T)

    def fill(self, E, r0, r1, c0, c1, diag, T):
        np.add(self.hx[r0:r1, None], self.hy[None, c0:c1], out=E)
        for xf, yf in zip(self.xt, self.yt, strict=True):
            np.minimum(xf[r0:r1, None], yf[None, c0:c1], out=T)
            np.add(E, T, out=E)
        if diag:  # exactly symmetric already: every term is
            np.fill_diagonal(E, 0.0)
        exp_inplace(E)


def _power(E: np.ndarray, degree: float, T: np.ndarray) -> None:
    """``E **= degree`` in place; whole degrees up to 64 by repeated squaring."""
    d = float(degree)
    if d == 1.0:
        return
    if d == 0.0:
        E.fill(1.0)  # as numpy: x**0 == 1 for every x
        return
    if d.is_integer() and d <= 64:
        n = int(d)
        if n == 2:
            np.multiply(E, E, out=E)
            return
        np.copyto(T, E)  # T: the running square
        n -= 1
        while n:
            if n & 1:
                np.multiply(E, T, out=E)
            n >>= 1
            if n:
                np.multiply(T, T, out=T)
        return
    np.power(E, d, out=E)


def check_poly_float32(kernel: Kernel, nx: float, ny: float, d: int) -> None:
    """Refuse float32 values for a linear or polynomial kernel whose entries, bounded by
    the rows' largest norms ``nx`` and ``ny``, can pass :data:`F32_LIMIT` (the one rule,
    for the host evaluators and :mod:`pipeline.engine.device`)."""
    if isinstance(kernel, Polynomial):
        g = 1.0 / d if kernel.gamma is None else float(kernel.gamma)
        c = float(kernel.coef0)
        base = g * nx * ny + abs(c)
        log_bound = float(kernel.degree) * math.log(base) if base > 0 else -math.inf
        # the GEMM's base itself must fit too: with 0 < degree < 1 the value can fit
        # in float32 while base overflows it (inf ** 0.5 is inf)
        bound = max(math.exp(min(log_bound, 700.0)), base)
        over = log_bound > math.log(F32_LIMIT) or base > F32_LIMIT
    else:
        bound = nx * ny
        over = not bound <= F32_LIMIT
    if over:
        _refuse_f32(kernel, bound)


class _GemmPoly(BlockEvaluator):
    """(A_r · B_cᵀ)^degree: linear (degree 1, no augmentation) and polynomial kernels."""

    def __init__(self, kernel: Kernel, Xi: np.ndarray, Xj: np.ndarray | None, kd: np.dtype):
        self.dtype = kd
        x = Xi.astype(np.float64, copy=False)
        y = x if Xj is None else Xj.astype(np.float64, copy=False)
        nx = math.sqrt(_max(_sq_norms(x)))
        ny = nx if Xj is None else math.sqrt(_max(_sq_norms(y)))
        if isinstance(kernel, Polynomial):
            d = x.shape[1]
            g = 1.0 / d if kernel.gamma is None else float(kernel.gamma)
            c = float(kernel.coef0)
            self.degree = float(kernel.degree)
            A = np.empty((x.shape[0], d + 1))
            np.multiply(x, g, out=A[:, :d])
            A[:, d] = c
            B = np.empty((y.shape[0], d + 1))
            B[:, :d] = y
            B[:, d] = 1.0
        else:
            self.degree = 1.0
            A, B = x, y
        if kd == np.float32:
            check_poly_float32(kernel, nx, ny, x.shape[1])
        self.needs_scratch = self.degree not in (0.0, 1.0, 2.0)
        self.A = _cast(kernel, A, kd)
        self.B = self.A if B is A else _cast(kernel, B, kd)

    def fill(self, E, r0, r1, c0, c1, diag, T):
        np.dot(self.A[r0:r1], self.B[c0:c1].T, out=E)
        if diag:
            _symmetrize(E)
        _power(E, self.degree, T)


class _Generic(BlockEvaluator):
    """``kernel(Xi_sub, Xj_sub)`` per sub-block, for kernels without a fused form."""

    def __init__(self, kernel: Kernel, Xi: np.ndarray, Xj: np.ndarray | None, kd: np.dtype):
        _log_generic(kernel)
        self.dtype = kd
        self.kernel = kernel
        # the rows keep their own precision: only the values are cast to kd (rounding
        # float64 rows to float32 first lost the small differences of data far from
        # the origin, 1,000 times the fused RBF's error)
        # float32 rows with kd float64 are promoted (exactly): a kernel evaluates in
        # float32 when all its inputs are float32 (1e-7 errors under "float64")
        up = np.float64 if kd == np.float64 else None
        self.Xi = np.ascontiguousarray(Xi, dtype=up or np.asarray(Xi).dtype)
        self.Xj = (
            self.Xi if Xj is None else np.ascontiguousarray(Xj, dtype=up or np.asarray(Xj).dtype)
        )

    def fill(self, E, r0, r1, c0, c1, diag, T):
        xs = self.Xi[r0:r1]
        K = self.kernel(xs) if diag else self.kernel(xs, self.Xj[c0:c1])
        if self.dtype == np.float32 and K.size:
            top = float(np.nanmax(np.abs(K), initial=0.0))  # a NaN row stays NaN
            if top > F32_LIMIT:  # inf, or a value float32 cannot hold
                _refuse_f32(self.kernel, top)
        np.copyto(E, K, casting="unsafe")
        if diag:  # a kernel's own symmetric evaluation may differ in the last bit
            _symmetrize(E)


_FUSED = {
    RBF: _GemmExp,
    Matern: _GemmExp,
    Laplacian: _L1Exp,
    Linear: _GemmPoly,
    Polynomial: _GemmPoly,
}


def is_fused(kernel: Kernel) -> bool:
    """Whether ``kernel`` has a fused evaluator (else the generic per-block path runs)."""
    return type(kernel) in _FUSED


def evaluation_identity(kernel: Any, kernel_dtype: Any) -> dict[str, str]:
    """What, besides the kernel and the dtypes, fixes the bits of the fused evaluation of
    ``kernel`` in ``kernel_dtype``: ``{"exp": EXP_ID}`` (float64) or ``{"exp":
    EXP32_ID}`` (float32) where the evaluator takes the engine's ``exp`` (RBF, Matérn,
    Laplacian), else ``{}``.

    The one rule for every fingerprint of a stored result made of fused kernel values
    (the Gram, a matrix-free operator's CG checkpoint, the Nyström solve, an
    estimator's store, CV settings, predictions): merged into the recipe, it leaves the
    recipes of other kernels as they were, and moves the others, so a result made with
    ``np.exp``'s bits is recomputed, never mixed with these.
    """
    k = kernel if isinstance(kernel, Kernel) else None
    ids = {np.dtype(np.float64): EXP_ID, np.dtype(np.float32): EXP32_ID}
    if k is None or np.dtype(kernel_dtype) not in ids:
        return {}
    if _FUSED.get(type(k)) not in (_GemmExp, _L1Exp):
        return {}
    return {"exp": ids[np.dtype(kernel_dtype)]}


def prepare(
    kernel: Kernel,
    Xi: np.ndarray,
    Xj: np.ndarray | None,
    kd: Any,
    buffers: Callable[[str, int, np.dtype], np.ndarray] | None = None,
) -> BlockEvaluator:
    """The block evaluator of ``K(Xi, Xj)`` (``Xj=None``: ``K(Xi, Xi)``) in dtype ``kd``.

    ``buffers(name, size, dtype)``, if given, supplies flat arrays for the per-call
    data instead of fresh allocations (per-thread buffers reused across calls: no
    page faults). The evaluator is then valid only until the next call that reuses
    them.

    Raises
    ------
    ValueError
        ``kd`` is float32 and the kernel's values (or the data) can exceed
        float32's range; the message names the kernel and the fix.
    """
    kd = np.dtype(kd)
    cls = _FUSED.get(type(kernel), _Generic)
    if cls is _GemmExp:
        return cls(kernel, Xi, Xj, kd, buffers)
    return cls(kernel, Xi, Xj, kd)
