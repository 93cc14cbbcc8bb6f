"""Kernel tiles and kernel passes on a :class:`~pipeline.engine.backend.Backend`.

The device-generic counterpart of :mod:`pipeline.engine.evaluators` and
:mod:`pipeline.engine.fused`: the same kernels, written with the backend's array
namespace ``xp`` only (array API calls), so that one code path runs on NumPy, on
the array API's reference namespace (CI) and on a GPU through CuPy (cuBLAS for the
GEMMs). The CPU paths keep their own cache-blocked code; this module is taken only
when a caller names a backend.

- :func:`kernel_block`: one block ``K(Xi, Xj)`` (``Xj=None``: the symmetric
  diagonal block, exactly symmetric, exponent 0 on its diagonal), as a backend array;
- :func:`matvec`: ``(K + shift·I) V`` (float64, on the host), K never formed: row
  blocks x column blocks of about ``block_rows`` x ``block_rows``;
- :func:`predict`: ``K(X_new, X_train) @ alpha``;
- :func:`diagonal`, :func:`columns`, :func:`submatrix`: the pieces of K the
  preconditioners need (:func:`pipeline.linalg.precond.build_nystrom`;
  ``DeviceKernel.columns(idx, on_device=True)`` leaves the columns on the device for
  its pivoted Cholesky);
- :class:`DeviceKernel`: all of these on one uploaded ``X`` (uploaded once, its
  per-row data prepared once), for the many products of CG
  (:class:`pipeline.linalg.matvec.DeviceKernelOperator`).

Kernels, as the evaluators: :class:`~pipeline.kernels.RBF` and
:class:`~pipeline.kernels.Matern` (ν = 1/2, 3/2, 5/2; scalar or ARD length scale)
by one GEMM of augmented rows ``[2γ·x, -γ|x|², 1]·[y, 1, -γ|y|²]ᵀ`` giving the
exponent (rows centred by a common mean first, so data far from the origin keeps
its small differences; Matérn: clip at 0, square root, closed form);
:class:`~pipeline.kernels.Laplacian` by a fixed-order sum of ``|x_f - y_f|`` over the
features; :class:`~pipeline.kernels.Linear` and :class:`~pipeline.kernels.Polynomial`
by one GEMM then the power. Any other kernel: ``kernel(host Xi, host Xj)`` per
block, then uploaded (one log line per kernel class).

Precision and reproducibility: ``kernel_dtype="float64"`` (default) computes
everything in float64 (equal to the kernel object's values to ~1e-15 relative);
``"float32"`` computes the entries and each block's product in float32 and adds
the block products into float64 accumulators (as :mod:`pipeline.engine.fused`).
Every sum has a fixed order (column blocks in order, the features in order), so two
calls on one backend with the same shapes and ``block_rows`` give the same bits.

On CuPy, the RBF matvec and prediction take a fused raw CUDA kernel (one thread per
row, column tiles through shared memory, no kernel block in memory), built per feature
width and precision: ``"float32"`` (float32 entries and sums within a tile of 128
columns, added to a float64 accumulator) or ``"float64"`` (everything in float64),
unless :data:`USE_RAW_KERNEL` is False or the data has more than
:data:`RAW_MAX_FEATURES` features (half that in float64: the tile's rows must fit in
shared memory); the GEMM path is the reference.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from pipeline.engine.backend import Backend, get_backend
from pipeline.engine.evaluators import (
    F32_LIMIT,
    _gemm_exp_params,
    _log_generic,
    _refuse_f32,
    _symmetrize,
    check_poly_float32,
)
from pipeline.kernels import RBF, Kernel, Laplacian, Linear, Matern, Polynomial, make_kernel
from pipeline.kernels.basic import inverse_length_scales

log = logging.getLogger(__name__)

__all__ = [
    "DEVICE_BLOCK_ROWS",
    "HOST_BLOCK_ROWS",
    "RAW_MAX_FEATURES",
    "USE_RAW_KERNEL",
    "DeviceKernel",
    "benchmark_matvec",
    "columns",
    "default_block_rows",
    "diagonal",
    "kernel_block",
    "matvec",
    "predict",
    "submatrix",
]

#: take the fused raw CUDA kernel for the float32 RBF matvec on CuPy (False: the
#: GEMM path, the reference)
USE_RAW_KERNEL = True
#: most features the raw kernel takes (its rows live in registers / shared memory)
RAW_MAX_FEATURES = 64
#: block edge on the host backends (numpy, array_api_strict)
HOST_BLOCK_ROWS = 512
#: largest block edge on a GPU
DEVICE_BLOCK_ROWS = 8192
#: rows of X_new per prediction chunk (their per-row data prepared at once)
PREDICT_CHUNK_ROWS = 1 << 16

_FUSED = (RBF, Matern, Laplacian, Linear, Polynomial)
_KERNEL_DTYPES = ("float64", "float32")


def _backend(be: Backend | str) -> Backend:
    return get_backend(be) if isinstance(be, str) else be


def _kd(kernel_dtype: Any) -> str:
    kd = np.dtype(kernel_dtype).name
    if kd not in _KERNEL_DTYPES:
        raise ValueError(f"kernel_dtype must be 'float64' or 'float32', got {kernel_dtype!r}")
    return kd


def default_block_rows(be: Backend | str, n_columns: int = 1) -> int:
    """The block edge for :func:`matvec` on ``be``: :data:`HOST_BLOCK_ROWS` on the
    host backends; on a GPU the largest power of two up to :data:`DEVICE_BLOCK_ROWS`
    whose working set (about six float64 blocks plus ``n_columns`` vectors) takes at
    most half of the free device memory."""
    be = _backend(be)
    mem = be.memory()
    if mem is None:
        return HOST_BLOCK_ROWS
    free = mem[0] // 2
    b = DEVICE_BLOCK_ROWS
    while b > 256 and 8 * (6 * b * b + 4 * b * max(1, n_columns)) > free:
        b //= 2
    return b


def _on_host(a: Any) -> bool:
    """Whether ``a`` is a host (NumPy or array-like) value rather than a backend array."""
    if isinstance(a, np.ndarray | np.generic):
        return True
    return not (type(a).__module__.startswith("cupy") or hasattr(a, "__array_namespace__"))


def _upload(be: Backend, X: Any, what: str = "X") -> Any:
    """``X`` as a float64 2-D array of ``be`` (one copy to the device from the host)."""
    if _on_host(X):
        X = np.ascontiguousarray(X, dtype=np.float64)
    a = be.asarray(X)
    if a.ndim != 2:
        raise ValueError(f"{what} must be a 2-D array (n_samples, n_features), got shape {a.shape}")
    if a.dtype != be.xp.float64:
        a = be.xp.astype(a, be.xp.float64)
    return a


def _index(be: Backend, idx: Any, n: int) -> Any:
    idx = np.asarray(idx, dtype=np.int64).ravel()
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        raise ValueError(
            f"column indices must lie in [0, {n}), got range [{idx.min()}, {idx.max()}]"
        )
    return be.asarray(idx)


def _max(xp: Any, a: Any) -> float:
    return float(xp.max(a)) if a.shape[0] else 0.0


class _Prep:
    """``K(rows, cols)`` block by block on a backend: the per-row data of both sides
    (centred, scaled, augmented rows) computed once, each block on demand.

    ``rows`` and ``cols`` are float64 arrays of the backend; ``centre`` the vector
    both are centred by (stationary kernels). ``cols=None``: the symmetric case
    (``cols`` is ``rows``).
    """

    def __init__(self, be: Backend, kernel: Kernel, rows: Any, cols: Any, centre: Any, kd: str):
        xp = be.xp
        self.be, self.kernel, self.kd = be, kernel, kd
        self.xdt = be.dtype(kd)
        d = int(rows.shape[1])
        if cols is not None and int(cols.shape[1]) != d:
            raise ValueError(
                f"Xi has {d} features but Xj has {int(cols.shape[1])}; they must match"
            )
        sym = cols is None
        typ = type(kernel)
        if typ not in _FUSED:
            _log_generic(kernel)
            self.family = "generic"
            self.A = be.to_numpy(rows)
            self.B = self.A if sym else be.to_numpy(cols)
            return
        if typ in (RBF, Matern):
            self.family = "matern" if typ is Matern else "exp"
            self.nu = float(kernel.nu) if typ is Matern else None
            g, w = _gemm_exp_params(kernel, d)
            xc = rows - centre
            yc = xc if sym else cols - centre
            if w is not None:
                wd = be.asarray(w)
                xc = xc * wd
                yc = xc if sym else yc * wd
            nx = xp.sum(xc * xc, axis=1)
            ny = nx if sym else xp.sum(yc * yc, axis=1)
            if kd == "float32":
                bound = abs(g) * (math.sqrt(_max(xp, nx)) + math.sqrt(_max(xp, ny))) ** 2
                if not bound <= F32_LIMIT:
                    _refuse_f32(kernel, bound)
            ones_x = xp.ones((int(xc.shape[0]), 1), dtype=xp.float64)
            ones_y = xp.ones((int(yc.shape[0]), 1), dtype=xp.float64)
            A = xp.concat([xc * (2.0 * g), xp.reshape(nx * -g, (-1, 1)), ones_x], axis=1)
            B = xp.concat([yc, ones_y, xp.reshape(ny * -g, (-1, 1))], axis=1)
        elif typ is Laplacian:
            self.family = "l1"
            self.g = 1.0 / d if kernel.gamma is None else float(kernel.gamma)
            A = rows - centre
            B = A if sym else cols - centre
            if kd == "float32":
                bound = self.g * (
                    _max(xp, xp.sum(xp.abs(A), axis=1)) + _max(xp, xp.sum(xp.abs(B), axis=1))
                )
                if not bound <= F32_LIMIT:
                    _refuse_f32(kernel, bound)
        else:
            self.family = "poly"
            x, y = rows, (rows if sym else cols)
            nxm = math.sqrt(_max(xp, xp.sum(x * x, axis=1)))
            nym = math.sqrt(_max(xp, xp.sum(y * y, axis=1)))
            if typ is Polynomial:
                g = 1.0 / d if kernel.gamma is None else float(kernel.gamma)
                c = float(kernel.coef0)
                self.degree = float(kernel.degree)
                A = xp.concat([x * g, xp.full((int(x.shape[0]), 1), c, dtype=xp.float64)], axis=1)
                B = xp.concat([y, xp.ones((int(y.shape[0]), 1), dtype=xp.float64)], axis=1)
            else:
                self.degree = 1.0
                A, B = x, y
            if kd == "float32":
                check_poly_float32(kernel, nxm, nym, d)
        if kd == "float32":
            same = B is A
            A = xp.astype(A, self.xdt)
            B = A if same else xp.astype(B, self.xdt)
        self.A, self.B = A, B

    def take(self, ridx: Any = None, cidx: Any = None) -> _Prep:
        """The same evaluator on the rows ``ridx`` and the columns ``cidx`` (None: all)."""
        p = _Prep.__new__(_Prep)
        p.__dict__.update(self.__dict__)
        if self.family == "generic":
            p.A = self.A if ridx is None else self.A[self.be.to_numpy(ridx)]
            p.B = self.B if cidx is None else self.B[self.be.to_numpy(cidx)]
            return p
        xp = self.be.xp
        p.A = self.A if ridx is None else xp.take(self.A, ridx, axis=0)
        p.B = self.B if cidx is None else xp.take(self.B, cidx, axis=0)
        return p

    def block(
        self, r0: int, r1: int, c0: int, c1: int, diag: bool = False, same: Any = None
    ) -> Any:
        """``K(rows[r0:r1], cols[c0:c1])`` in ``kd``. ``diag``: the rows are the columns
        (exactly symmetric result, exponent 0 on the diagonal); ``same``: a boolean
        block, True where the row and the column are one point (exponent 0 there)."""
        xp = self.be.xp
        fam = self.family
        if fam == "generic":
            return self._generic(r0, r1, c0, c1, diag)
        a, b = self.A[r0:r1, :], self.B[c0:c1, :]
        if fam == "l1":
            E = xp.zeros((r1 - r0, c1 - c0), dtype=self.xdt)
            bt = xp.matrix_transpose(b)
            for f in range(int(a.shape[1])):  # fixed order: the features in turn
                E = E + xp.abs(a[:, f : f + 1] - bt[f : f + 1, :])
            # |a - b| == |b - a| exactly: a diagonal block is symmetric, 0 on its diagonal
            if same is not None:
                E = xp.where(same, xp.zeros_like(E), E)
            return xp.exp(E * -self.g)
        E = xp.matmul(a, xp.matrix_transpose(b))
        if fam == "poly":
            if diag:
                E = _mirror(xp, E, zero_diagonal=False)
            return _power(xp, E, self.degree)
        if diag:
            E = _mirror(xp, E, zero_diagonal=True)
        if same is not None:
            E = xp.where(same, xp.zeros_like(E), E)
        if fam == "exp":
            return xp.exp(E)
        # Matérn: E = (√(2ν)·r)², up to rounding that can make it slightly negative
        t = xp.sqrt(xp.clip(E, min=0.0))
        if self.nu == 0.5:
            return xp.exp(-t)
        e = xp.exp(-t)
        if self.nu == 2.5:
            return e * ((t * (1.0 / 3.0) + 1.0) * t + 1.0)
        return e * (t + 1.0)

    def _generic(self, r0: int, r1: int, c0: int, c1: int, diag: bool) -> Any:
        xs = self.A[r0:r1]
        if diag:
            K = np.array(self.kernel(xs), dtype=np.float64)
            _symmetrize(K)
        else:
            K = np.asarray(self.kernel(xs, self.B[c0:c1]), dtype=np.float64)
        if self.kd == "float32" and K.size:
            top = float(np.nanmax(np.abs(K), initial=0.0))
            if top > F32_LIMIT:
                _refuse_f32(self.kernel, top)
        return self.be.asarray(K, dtype=self.kd)


def _mirror(xp: Any, E: Any, *, zero_diagonal: bool) -> Any:
    """The square block ``E`` with its strict lower triangle copied onto the upper one
    (exactly symmetric), its diagonal 0 if ``zero_diagonal``."""
    n = int(E.shape[0])
    i = xp.reshape(xp.arange(n), (-1, 1))
    j = xp.reshape(xp.arange(n), (1, -1))
    out = xp.where(i < j, xp.matrix_transpose(E), E)
    if zero_diagonal:
        out = xp.where(i == j, xp.zeros_like(out), out)
    return out


def _power(xp: Any, E: Any, degree: float) -> Any:
    if degree == 1.0:
        return E
    if degree == 0.0:
        return xp.ones_like(E)  # as numpy: x**0 == 1 for every x
    if degree == 2.0:
        return E * E
    return xp.pow(E, degree)


def _symmetric_prep(be: Backend, kernel: Kernel, X: Any, kd: str) -> _Prep:
    centre = xp_mean(be, X)
    return _Prep(be, kernel, X, None, centre, kd)


def xp_mean(be: Backend, X: Any) -> Any:
    """The column means of ``X`` (zeros for no rows), as a ``(1, d)`` backend array."""
    xp = be.xp
    if int(X.shape[0]) == 0:
        return xp.zeros((1, int(X.shape[1])), dtype=X.dtype)
    return xp.reshape(xp.mean(X, axis=0), (1, -1))


# ---------------------------------------------------------------------------
# the fused raw CUDA kernel (CuPy only)
# ---------------------------------------------------------------------------
_RAW_SOURCE = r"""
#define TILE 128
/* DIM, the number of features, is a compile-time constant (one build per width), so a
   row's features stay in registers and the loops over them unroll; REAL is float (the
   kernel's values and the sums within one column tile in float32, __expf) or double */
#if REAL_IS_DOUBLE
typedef double REAL;
#define EXP(x) exp(x)
#define FMA(a, b, c) fma(a, b, c)
#else
typedef float REAL;
#define EXP(x) __expf(x)
#define FMA(a, b, c) fmaf(a, b, c)
#endif
extern "C" __global__ void rbf_matvec(
    const REAL* __restrict__ X, const REAL* __restrict__ Y, const REAL* __restrict__ v,
    double* __restrict__ out, const int n, const int m, const REAL g)
{
    __shared__ REAL ys[TILE * DIM];
    __shared__ REAL vs[TILE];
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    REAL xi[DIM];
#pragma unroll
    for (int f = 0; f < DIM; ++f) xi[f] = (i < n) ? X[(long long)i * DIM + f] : (REAL)0;
    double acc = 0.0;
    for (int c0 = 0; c0 < m; c0 += TILE) {
        const int cn = min(TILE, m - c0);
        __syncthreads();
        for (int t = threadIdx.x; t < cn * DIM; t += blockDim.x) ys[t] = Y[(long long)c0 * DIM + t];
        for (int t = threadIdx.x; t < cn; t += blockDim.x) vs[t] = v[c0 + t];
        __syncthreads();
        REAL s = 0;  /* REAL within one column tile, in column order */
        for (int c = 0; c < cn; ++c) {
            REAL d2 = 0;
#pragma unroll
            for (int f = 0; f < DIM; ++f) { const REAL t = xi[f] - ys[c * DIM + f]; d2 = FMA(t, t, d2); }
            s = FMA(EXP(-g * d2), vs[c], s);
        }
        acc += (double)s;  /* float64 across tiles */
    }
    if (i < n) out[i] = acc;
}
"""
_RAW_THREADS = 128
_raw_kernels: dict[tuple[int, str], Any] = {}


def _raw_rbf(d: int, kd: str = "float32") -> Any:
    """The raw kernel built for ``d`` features in ``kd`` (compiled once per pair)."""
    kern = _raw_kernels.get((d, kd))
    if kern is None:
        import cupy

        opts = (f"-DDIM={int(d)}", f"-DREAL_IS_DOUBLE={int(kd == 'float64')}")
        kern = _raw_kernels[d, kd] = cupy.RawKernel(_RAW_SOURCE, "rbf_matvec", options=opts)
    return kern


def _raw_applies(be: Backend, kernel: Kernel, kd: str, d: int) -> bool:
    return (
        USE_RAW_KERNEL
        and be.name == "cupy"
        and type(kernel) is RBF
        and kd in ("float32", "float64")
        and 1 <= d <= (RAW_MAX_FEATURES if kd == "float32" else RAW_MAX_FEATURES // 2)
    )


def _raw_rows(
    be: Backend, kernel: RBF, X: Any, centre: Any = None, kd: str = "float32"
) -> tuple[Any, float]:
    """Rows centred by ``centre`` (default: their mean; ARD: scaled by 1/length_scale)
    in ``kd``, and γ."""
    import cupy

    d = int(X.shape[1])
    xc = X - (xp_mean(be, X) if centre is None else centre)
    if kernel.ard:
        xc = xc * be.asarray(inverse_length_scales(kernel, kernel.length_scale, d))
        g = 0.5
    else:
        g = kernel.effective_gamma(d)
    return cupy.ascontiguousarray(xc, dtype=np.dtype(kd)), float(g)


def _raw_matvec(rows32: Any, cols32: Any, g: float, V: Any) -> Any:
    """``K(rows, cols) @ V`` (float64, device) by the raw kernel, one launch per column
    of ``V``."""
    import cupy

    n, d = (int(s) for s in rows32.shape)
    m = int(cols32.shape[0])
    dt = rows32.dtype
    out = cupy.empty((n, int(V.shape[1])), dtype=cupy.float64)
    col = cupy.empty(n, dtype=cupy.float64)
    kern = _raw_rbf(d, np.dtype(dt).name)
    grid = ((n + _RAW_THREADS - 1) // _RAW_THREADS,)
    for k in range(int(V.shape[1])):
        v = cupy.ascontiguousarray(V[:, k], dtype=dt)
        kern(grid, (_RAW_THREADS,), (rows32, cols32, v, col, np.int32(n), np.int32(m),
                                     dt.type(g)))  # fmt: skip
        out[:, k] = col
    return out


# ---------------------------------------------------------------------------
# the passes on one uploaded X
# ---------------------------------------------------------------------------
class DeviceKernel:
    """The kernel passes on one ``X`` uploaded once to a backend.

    Parameters
    ----------
    be : Backend or str
        The backend (``"numpy"``, ``"cupy"``, ``"array_api_strict"``).
    kernel : Kernel, str or spec dict
    X : array-like (n, d)
        Host or backend array; uploaded (as float64) once.
    kernel_dtype : {"float64", "float32"}
        dtype of the kernel entries and of each block's product.
    block_rows : int, optional
        Block edge; default :func:`default_block_rows`.
    """

    def __init__(
        self,
        be: Backend | str,
        kernel: Any,
        X: Any,
        *,
        kernel_dtype: str = "float64",
        block_rows: int | None = None,
    ) -> None:
        self.be = _backend(be)
        self.kernel = make_kernel(kernel)
        self.X = _upload(self.be, X)
        self.n, self.d = int(self.X.shape[0]), int(self.X.shape[1])
        self.kernel.check_n_features(self.d)
        self.kernel_dtype = _kd(kernel_dtype)
        if block_rows is not None and int(block_rows) < 1:
            raise ValueError(f"block_rows must be >= 1 or None, got {block_rows!r}")
        self.block_rows = None if block_rows is None else int(block_rows)
        self._prep: _Prep | None = None
        self._raw: tuple[Any, float] | None = None

    @property
    def prep(self) -> _Prep:
        if self._prep is None:
            self._prep = _symmetric_prep(self.be, self.kernel, self.X, self.kernel_dtype)
        return self._prep

    def _b(self, m: int = 1) -> int:
        return self.block_rows or default_block_rows(self.be, m)

    def matvec(self, V: Any, shift: float = 0.0) -> np.ndarray:
        """``(K + shift·I) V`` as a float64 host array, shape of ``V``."""
        be, xp = self.be, self.be.xp
        if _on_host(V):
            V = np.asarray(V, dtype=np.float64)
        one_d = V.ndim == 1
        if V.ndim not in (1, 2) or int(V.shape[0]) != self.n:
            raise ValueError(
                f"matvec needs a vector of length {self.n} or an array ({self.n}, m), "
                f"got shape {tuple(V.shape)}"
            )
        Vd = be.asarray(V, dtype="float64")
        if one_d:
            Vd = xp.reshape(Vd, (-1, 1))
        m = int(Vd.shape[1])
        out = np.empty((self.n, m), dtype=np.float64)
        if _raw_applies(be, self.kernel, self.kernel_dtype, self.d):
            if self._raw is None:
                self._raw = _raw_rows(be, self.kernel, self.X, kd=self.kernel_dtype)
            rows32, g = self._raw
            acc = _raw_matvec(rows32, rows32, g, Vd)
            if shift:
                acc = acc + Vd * float(shift)
            out[...] = be.to_numpy(acc)
        else:
            self._blocks_into(out, self.prep, Vd, shift, self._b(m), symmetric=True)
        return out[:, 0] if one_d else out

    def _blocks_into(
        self, out: np.ndarray, prep: _Prep, Vd: Any, shift: float, b: int, symmetric: bool
    ) -> None:
        """``out = K(rows, cols) @ Vd (+ shift·Vd)`` by blocks, row block by row block."""
        be, xp = self.be, self.be.xp
        f32 = self.kernel_dtype == "float32"
        Vk = xp.astype(Vd, xp.float32) if f32 else Vd
        nr, nc = int(prep.A.shape[0]), int(prep.B.shape[0])
        for r0 in range(0, nr, b):
            r1 = min(nr, r0 + b)
            acc = None
            for c0 in range(0, nc, b):  # fixed order: the column blocks in turn
                c1 = min(nc, c0 + b)
                E = prep.block(r0, r1, c0, c1, diag=symmetric and r0 == c0)
                P = xp.matmul(E, Vk[c0:c1, :])
                if f32:
                    P = xp.astype(P, xp.float64)
                acc = P if acc is None else acc + P
            if acc is None:
                acc = xp.zeros((r1 - r0, int(Vd.shape[1])), dtype=xp.float64)
            if shift:
                acc = acc + Vd[r0:r1, :] * float(shift)
            out[r0:r1] = be.to_numpy(acc)

    __call__ = matvec

    def diagonal(self) -> np.ndarray:
        """The diagonal of K, float64 on the host."""
        xp = self.be.xp
        typ = type(self.kernel)
        if typ in (RBF, Matern, Laplacian):
            return np.ones(self.n)  # exponent 0 on a diagonal: exp(0) == 1
        if typ not in _FUSED:
            return np.asarray(self.kernel.diag(self.be.to_numpy(self.X)), dtype=np.float64)
        p = self.prep
        A, B = p.A, p.B
        if self.kernel_dtype == "float32":
            A, B = xp.astype(A, xp.float64), xp.astype(B, xp.float64)
        return self.be.to_numpy(_power(xp, xp.sum(A * B, axis=1), p.degree))

    def columns(self, idx: Sequence[int], *, on_device: bool = False) -> Any:
        """``K[:, idx]``, shape ``(n, len(idx))``, float64: on the host, or with
        ``on_device`` a new array of the backend (no copy to the host: the pivoted
        Cholesky of :func:`pipeline.linalg.precond.build_nystrom` updates it there)."""
        be, xp = self.be, self.be.xp
        ci = _index(be, idx, self.n)
        k = int(ci.shape[0])
        p = self.prep.take(None, ci)
        if on_device:
            out = xp.empty((self.n, k), dtype=xp.float64)
        else:
            out = np.empty((self.n, k), dtype=np.float64)
        b = self._b(k)
        for r0 in range(0, self.n, b):
            r1 = min(self.n, r0 + b)
            same = xp.reshape(xp.arange(r0, r1, dtype=xp.int64), (-1, 1)) == xp.reshape(ci, (1, -1))
            E = xp.astype(p.block(r0, r1, 0, k, same=same), xp.float64)
            out[r0:r1, :] = E if on_device else be.to_numpy(E)
        return out

    def submatrix(self, idx: Sequence[int]) -> np.ndarray:
        """``K[idx][:, idx]``, exactly symmetric, float64 on the host."""
        be, xp = self.be, self.be.xp
        ii = _index(be, idx, self.n)
        k = int(ii.shape[0])
        p = self.prep.take(ii, ii)
        return be.to_numpy(xp.astype(p.block(0, k, 0, k, diag=True), xp.float64))

    def predict(self, alpha: Any, X_new: Any) -> np.ndarray:
        """``K(X_new, X) @ alpha`` (float64, host), rows centred by X's mean."""
        be, xp = self.be, self.be.xp
        a = np.asarray(alpha, dtype=np.float64) if _on_host(alpha) else alpha
        one_d = a.ndim == 1
        if int(a.shape[0]) != self.n:
            raise ValueError(f"alpha has {int(a.shape[0])} rows but X_train has {self.n}")
        Ad = be.asarray(a, dtype="float64")
        if one_d:
            Ad = xp.reshape(Ad, (-1, 1))
        m = int(Ad.shape[1])
        if _on_host(X_new):
            X_new = np.asarray(X_new)
        nn = int(X_new.shape[0])
        out = np.empty((nn, m), dtype=np.float64)
        centre = xp_mean(be, self.X)
        b = self._b(m)
        raw = _raw_applies(be, self.kernel, self.kernel_dtype, self.d)
        if raw and self._raw is None:
            self._raw = _raw_rows(be, self.kernel, self.X, kd=self.kernel_dtype)
        for s in range(0, nn, PREDICT_CHUNK_ROWS):
            xb = _upload(be, X_new[s : s + PREDICT_CHUNK_ROWS], "X_new")
            if raw:  # the fused kernel, rows centred by the training rows' mean
                rows32, g = _raw_rows(be, self.kernel, xb, centre, self.kernel_dtype)
                out[s : s + int(xb.shape[0])] = be.to_numpy(
                    _raw_matvec(rows32, self._raw[0], g, Ad)
                )
                continue
            prep = _Prep(be, self.kernel, xb, self.X, centre, self.kernel_dtype)
            self._blocks_into(out[s : s + int(xb.shape[0])], prep, Ad, 0.0, b, symmetric=False)
        return out[:, 0] if one_d else out


# ---------------------------------------------------------------------------
# module functions
# ---------------------------------------------------------------------------
def kernel_block(
    be: Backend | str, kernel: Any, Xi: Any, Xj: Any = None, *, dtype: str = "float64"
) -> Any:
    """``K(Xi, Xj)`` as a backend array of shape ``(ni, nj)`` in ``dtype``.

    ``Xj=None``: the symmetric diagonal block ``K(Xi, Xi)``, exactly symmetric (the
    stationary kernels' exponent 0 on its diagonal). Rows centred by ``Xi``'s mean
    for the stationary kernels, as :mod:`pipeline.engine.evaluators`.
    """
    be = _backend(be)
    kernel = make_kernel(kernel)
    kd = _kd(dtype)
    xi = _upload(be, Xi, "Xi")
    xj = None if Xj is None else _upload(be, Xj, "Xj")
    kernel.check_n_features(int(xi.shape[1]))
    p = _Prep(be, kernel, xi, xj, xp_mean(be, xi), kd)
    ni = int(xi.shape[0])
    nj = ni if xj is None else int(xj.shape[0])
    return p.block(0, ni, 0, nj, diag=xj is None)


def matvec(
    be: Backend | str,
    kernel: Any,
    X: Any,
    V: Any,
    *,
    shift: float = 0.0,
    kernel_dtype: str = "float64",
    block_rows: int | None = None,
) -> np.ndarray:
    """``(K(X, X) + shift·I) @ V`` as a float64 host array (``V``: ``(n,)`` or
    ``(n, m)``), K never formed. See :class:`DeviceKernel` to reuse the upload."""
    dk = DeviceKernel(be, kernel, X, kernel_dtype=kernel_dtype, block_rows=block_rows)
    return dk.matvec(V, shift=shift)


def predict(
    be: Backend | str,
    kernel: Any,
    X_train: Any,
    alpha: Any,
    X_new: Any,
    *,
    kernel_dtype: str = "float64",
    block_rows: int | None = None,
) -> np.ndarray:
    """``K(X_new, X_train) @ alpha`` as a float64 host array, K never formed."""
    dk = DeviceKernel(be, kernel, X_train, kernel_dtype=kernel_dtype, block_rows=block_rows)
    return dk.predict(alpha, X_new)


def diagonal(be: Backend | str, kernel: Any, X: Any) -> np.ndarray:
    """The diagonal of ``K(X, X)``, float64 on the host."""
    return DeviceKernel(be, kernel, X).diagonal()


def columns(be: Backend | str, kernel: Any, X: Any, idx: Sequence[int]) -> np.ndarray:
    """``K(X, X)[:, idx]``, float64 on the host, shape ``(n, len(idx))``."""
    return DeviceKernel(be, kernel, X).columns(idx)


def submatrix(be: Backend | str, kernel: Any, X: Any, idx: Sequence[int]) -> np.ndarray:
    """``K(X, X)[idx][:, idx]``, float64 on the host, exactly symmetric."""
    return DeviceKernel(be, kernel, X).submatrix(idx)


def benchmark_matvec(
    be: Backend | str,
    kernel: Any,
    X: Any,
    *,
    n_vectors: int = 1,
    kernel_dtype: str = "float64",
    block_rows: int | None = None,
    repeats: int = 3,
    seed: int = 0,
) -> dict[str, Any]:
    """Time :meth:`DeviceKernel.matvec` (X uploaded once, then ``repeats`` products).

    Returns a dict: ``backend``, ``n``, ``d``, ``m``, ``kernel_dtype``, ``block_rows``,
    ``raw_kernel`` (whether the raw CUDA kernel ran), ``first_s`` (the first
    product, with the preparation and any compilation), ``best_s`` and ``times_s``
    (the later ones), and ``gflops`` (``2·n²·(d + m)`` per product over ``best_s``).
    """
    dk = DeviceKernel(be, kernel, X, kernel_dtype=kernel_dtype, block_rows=block_rows)
    V = np.random.default_rng(seed).standard_normal((dk.n, int(n_vectors)))
    Vd = dk.be.asarray(V, dtype="float64")
    times = []
    for _ in range(max(1, int(repeats)) + 1):
        dk.be.synchronize()
        t0 = time.perf_counter()
        dk.matvec(Vd)
        dk.be.synchronize()
        times.append(time.perf_counter() - t0)
    best = min(times[1:])
    return {
        "backend": dk.be.name,
        "n": dk.n,
        "d": dk.d,
        "m": int(n_vectors),
        "kernel_dtype": dk.kernel_dtype,
        "block_rows": dk._b(int(n_vectors)),
        "raw_kernel": _raw_applies(dk.be, dk.kernel, dk.kernel_dtype, dk.d),
        "first_s": times[0],
        "best_s": best,
        "times_s": times[1:],
        "gflops": 2.0 * dk.n * dk.n * (dk.d + int(n_vectors)) / best / 1e9 if best > 0 else None,
    }
