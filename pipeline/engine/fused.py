"""Fused, cache-blocked kernel evaluation: ``K @ V``, ``Kᵀ @ V`` and whole tiles.

A kernel tile is never formed. Its rows are cut into *strips* of
``block_shape[0]`` rows (256 by default), each strip into sub-blocks of
``block_shape[1]`` columns (512); a sub-block is evaluated into per-thread
scratch that stays in the L2 cache (:mod:`pipeline.engine.evaluators`: one
GEMM plus one ``np.exp``, ``out=`` everywhere), then multiplied by the
matching rows of ``V`` (a GEMV, or a GEMM for several columns) while it is
still in cache. The products are accumulated in float64.

Parallelism and reproducibility
-------------------------------
Strips are the tasks of a thread pool (``n_threads`` workers; numpy's ufuncs
and BLAS release the GIL, so two threads scale on two cores), with BLAS held
to one thread meanwhile. Each strip returns its own partial results and the
calling thread adds them in strip order, so the result is **bitwise identical
for any thread count and any scheduling**: the decomposition depends on the
shapes and ``block_shape`` only.

Inside Dask tasks, :func:`pipeline.engine.where.task_threads` gives the inner
thread count (``cores // concurrent tasks``), so tasks never oversubscribe the cores.

Precision
---------
``kernel_dtype="float64"`` (default) evaluates everything in float64 (equal to the
dense ``kernel(Xi, Xj) @ V`` to ~1e-15 relative). ``kernel_dtype="float32"``
computes distances, exponential and tile in float32; ``V`` is cast to float32 once
and each sub-block's float32 product is added into float64 accumulators, so only
sums within one sub-block (512 columns or rows) are float32. The relative error of
``K v`` is about 1e-7 times ``gamma·(|x|² + |y|²)``: enough for prediction and a
preconditioner, not for CG to 1e-10. A kernel whose values (or data) can exceed
float32's range is refused with a ValueError, never turned into ``inf``.

Whole tiles (the Gram build): a rectangular tile is evaluated in full-width strips
of about one sub-block's entries straight into the caller's C-contiguous ``out``
(no scratch, no copy); a diagonal tile in scratch sub-blocks, each copied into its
lower position and, transposed, its upper one.

Measured speed, and why at large D the exponent's GEMM is the floor:
docs/PERFORMANCE.md#kernel-times-vector.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from pipeline.engine.evaluators import BLOCK_GEMM, BlockEvaluator, _Generic, prepare
from pipeline.engine.parallel import blas_threads
from pipeline.engine.where import available_cores
from pipeline.kernels import Kernel, make_kernel

__all__ = [
    "kernel_matvec",
    "kernel_tile",
    "predict_accumulate",
]

KERNEL_DTYPES = ("float64", "float32")

_local = threading.local()
_pools: dict[tuple[int, int], ThreadPoolExecutor] = {}
_pools_lock = threading.Lock()


# -- threads (how many: pipeline.engine.where) ----------------------------------------
def _pool(n: int) -> ThreadPoolExecutor:
    # keyed by pid too: a forked child inherits the dict but not the threads
    key = (os.getpid(), n)
    with _pools_lock:
        pool = _pools.get(key)
        if pool is None:
            pool = _pools[key] = ThreadPoolExecutor(n, thread_name_prefix="pipeline-tiles")
        return pool


def _run(fn: Callable, jobs: list[tuple], n_threads: int) -> list[Any]:
    with blas_threads(1):
        if n_threads <= 1 or len(jobs) <= 1:
            return [fn(*job) for job in jobs]
        return list(_pool(n_threads).map(lambda job: fn(*job), jobs))


#: largest per-thread buffer (bytes) an evaluator's per-call data may reuse;
#: beyond it (e.g. a whole training set as one block) allocate afresh
_PREP_REUSE_BYTES = 64 * 2**20


def _prep_buffer(name: str, size: int, dtype: np.dtype) -> np.ndarray:
    """Per-thread reused buffers for :func:`~pipeline.engine.evaluators.prepare`.

    Safe because an evaluator lives only inside one entry-point call, in the
    calling thread, and no call is nested in another in the same thread; the
    names differ from the strip scratch (``E``, ``T``, ``tmp``, ``ptmp``),
    which the calling thread also uses when it runs strips itself.
    """
    if size * dtype.itemsize > _PREP_REUSE_BYTES:
        return np.empty(size, dtype)
    return _scratch("prep-" + name, size, dtype)


def _scratch(name: str, size: int, dtype: np.dtype) -> np.ndarray:
    """A flat per-thread buffer of at least ``size`` elements (reused across calls)."""
    bufs = _local.__dict__.setdefault("bufs", {})
    key = (name, dtype.str)
    buf = bufs.get(key)
    if buf is None or buf.size < size:
        buf = bufs[key] = np.empty(size, dtype=dtype)
    return buf[:size]


# -- argument checks ------------------------------------------------------------------
def _kernel_dtype(kernel_dtype: Any) -> np.dtype:
    name = np.dtype(kernel_dtype).name if kernel_dtype is not None else "float64"
    if name not in KERNEL_DTYPES:
        raise ValueError(
            f"kernel_dtype must be 'float64' or 'float32', got {kernel_dtype!r}; "
            "float32 trades ~1e-7 relative error for speed"
        )
    return np.dtype(name)


def _threads(n_threads: int | None) -> int:
    if n_threads is None:
        return available_cores()
    n = int(n_threads)
    if n < 1:
        raise ValueError(f"n_threads must be >= 1 (or None for every core), got {n_threads!r}")
    return n


def _prepare(
    kernel: Any, kernel_dtype: Any, n_threads: Any, Xi: Any, Xj: Any
) -> tuple[Any, Any, int, np.ndarray, np.ndarray, bool]:
    """The checked arguments every entry point starts from: the kernel, the
    evaluation dtype, the thread count, both row blocks and whether ``Xj`` is ``Xi``."""
    kernel = make_kernel(kernel)
    kd = _kernel_dtype(kernel_dtype)
    nt = _threads(n_threads)
    Xi = _rows(Xi, "Xi")
    same = Xj is None
    Xj = Xi if same else _rows(Xj, "Xj")
    if Xj.shape[1] != Xi.shape[1]:
        raise ValueError(f"Xi has {Xi.shape[1]} features but Xj has {Xj.shape[1]}; they must match")
    return kernel, kd, nt, Xi, Xj, same


def _rows(X: Any, name: str) -> np.ndarray:
    X = np.asarray(X)
    if X.ndim != 2:
        raise ValueError(f"{name} must be 2-D (n_samples, n_features), got shape {X.shape}")
    if X.dtype not in (np.float32, np.float64):
        X = X.astype(np.float64)
    return X


def _cols(a: Any, n: int, name: str, *, out: bool = False) -> np.ndarray:
    """``a`` as a 2-D (n, m) view; ``out`` arrays must be float64 and writable."""
    if out:
        if not isinstance(a, np.ndarray) or a.dtype != np.float64 or not a.flags.writeable:
            raise ValueError(
                f"{name} must be a writable float64 numpy array (the accumulator), got "
                f"{getattr(a, 'dtype', type(a).__name__)}"
            )
    else:
        a = np.asarray(a, dtype=np.float64)
    if a.ndim not in (1, 2) or a.shape[0] != n:
        raise ValueError(f"{name} must have shape ({n},) or ({n}, m), got {a.shape}")
    a2 = a[:, None] if a.ndim == 1 else a
    return a2 if out else np.ascontiguousarray(a2)


def _block_shape(block_shape: Any, ev: BlockEvaluator) -> tuple[int, int]:
    if block_shape is None:
        return ev.block_shape
    r, c = (int(v) for v in block_shape)
    if r < 1 or c < 1:
        raise ValueError(f"block_shape must be two positive ints (rows, cols), got {block_shape!r}")
    return r, c


def _product_block_shape(block_shape: Any, ev: BlockEvaluator) -> tuple[int, int]:
    """The products' sub-block: as :func:`_block_shape`, but a float32 GEMM-family
    evaluator takes twice the rows (the same bytes as float64's 256 x 512: fewer
    numpy calls per entry, less waiting for the GIL)."""
    if block_shape is None and ev.dtype == np.float32 and ev.block_shape == BLOCK_GEMM:
        return 2 * BLOCK_GEMM[0], BLOCK_GEMM[1]
    return _block_shape(block_shape, ev)


# -- the strip task ---------------------------------------------------------------------
def _strip_products(
    ev: BlockEvaluator,
    r0: int,
    r1: int,
    cend: int,
    diag_tile: bool,
    V: np.ndarray,
    Vi: np.ndarray | None,
    C: int,
    size: int,
) -> tuple[np.ndarray, np.ndarray | None]:
    """Rows ``r0:r1``: ``K[r0:r1, :cend] @ V[:cend]`` (+ the diagonal block when
    ``diag_tile``) and, with ``Vi``, ``K[r0:r1, :cend]ᵀ @ Vi[r0:r1]``."""
    kd = ev.dtype
    r = r1 - r0
    m = V.shape[1]
    E_flat = _scratch("E", size, kd)
    T_flat = _scratch("T", size, kd) if ev.needs_scratch else None
    # products land in kd (float32 ones are added into the float64 accumulators)
    tmp = _scratch("tmp", r * m, kd).reshape(r, m)
    ptmp = _scratch("ptmp", C * m, kd) if kd != np.float64 else None
    acc = np.zeros((r, m))
    pt = np.empty((cend, m)) if Vi is not None else None
    blocks = [(c0, min(c0 + C, cend), False) for c0 in range(0, cend, C)]
    if diag_tile:
        blocks.append((r0, r1, True))
    for c0, c1, diag in blocks:
        n_el = r * (c1 - c0)
        E = E_flat[:n_el].reshape(r, c1 - c0)
        T = None if T_flat is None else T_flat[:n_el].reshape(E.shape)
        ev.fill(E, r0, r1, c0, c1, diag, T)
        # np.dot, not np.matmul: matmul's GEMV holds the GIL (numpy#11821); np.dot
        # calls the same BLAS routine (the same bits, tested against matmul)
        if m == 1:  # GEMVs
            np.dot(E, V[c0:c1, 0], out=tmp[:, 0])
        else:
            np.dot(E, V[c0:c1], out=tmp)
        acc += tmp
        if pt is not None and not diag:
            dst = pt[c0:c1] if kd == np.float64 else ptmp[: (c1 - c0) * m].reshape(c1 - c0, m)
            if m == 1:
                np.dot(E.T, Vi[r0:r1, 0], out=dst[:, 0])
            else:
                np.dot(E.T, Vi[r0:r1], out=dst)
            if kd != np.float64:
                pt[c0:c1] = dst
    return acc, pt


def kernel_matvec(
    kernel: Kernel | str | dict,
    Xi: Any,
    Xj: Any,
    V: Any,
    out: np.ndarray,
    symmetric_pair: bool = False,
    *,
    Vi: Any = None,
    out_t: np.ndarray | None = None,
    kernel_dtype: Any = "float64",
    n_threads: int | None = None,
    block_shape: tuple[int, int] | None = None,
) -> None:
    """``out += K(Xi, Xj) @ V``, evaluating each kernel entry once, in cache.

    Parameters
    ----------
    kernel : Kernel, str or spec dict
        Any kernel; RBF and Matérn (also ARD), Laplacian, linear and polynomial are
        fused, others go through the generic per-block path (one log message per class).
    Xi : array-like of shape (ni, d)
        Rows of the tile.
    Xj : array-like of shape (nj, d) or None
        Columns of the tile. None means ``Xi`` (a diagonal tile ``K(Xi, Xi)``):
        only its lower part is evaluated, each entry used for both triangles.
    V : array-like of shape (nj,) or (nj, m)
        Right-hand side.
    out : ndarray of float64, shape (ni,) or (ni, m)
        Accumulator, updated in place.
    symmetric_pair : bool
        Also ``out_t += K(Xi, Xj).T @ Vi`` from the same entries (an
        off-diagonal lower tile of a symmetric K, used twice).
    Vi : array-like of shape (ni,) or (ni, m)
        With ``symmetric_pair``: the vector the transposed tile multiplies.
    out_t : ndarray of float64, shape (nj,) or (nj, m)
        With ``symmetric_pair``: the transposed product's accumulator.
    kernel_dtype : {"float64", "float32"}
        dtype of the kernel values (see the module docstring); sums longer
        than one sub-block are float64 either way.
    n_threads : int or None
        Threads over row strips (None: every core; inside a Dask task pass
        :func:`~pipeline.engine.where.task_threads`). The result does not depend on it, bit for bit.
    block_shape : (int, int), optional
        Sub-block (rows, columns); default: the kernel family's best.

    Raises
    ------
    ValueError
        Inconsistent shapes, a non-float64 accumulator, or float32 values the
        kernel could overflow.
    """
    kernel, kd, nt, Xi, Xj, same = _prepare(kernel, kernel_dtype, n_threads, Xi, Xj)
    ni, nj = Xi.shape[0], Xj.shape[0]
    V2 = _cols(V, nj, "V")
    out2 = _cols(out, ni, "out", out=True)
    if out2.shape[1] != V2.shape[1]:
        raise ValueError(f"out has {out2.shape[1]} columns but V has {V2.shape[1]}")
    Vi2 = out_t2 = None
    if symmetric_pair:
        if same:
            raise ValueError(
                "symmetric_pair=True needs an off-diagonal tile (Xj given); with Xj=None the "
                "diagonal tile's transposed half is already included in out"
            )
        if Vi is None or out_t is None:
            raise ValueError("symmetric_pair=True needs Vi= and out_t=")
        Vi2 = _cols(Vi, ni, "Vi")
        out_t2 = _cols(out_t, nj, "out_t", out=True)
        if Vi2.shape[1] != V2.shape[1] or out_t2.shape[1] != V2.shape[1]:
            raise ValueError(
                f"V, Vi and out_t must have the same number of columns, got "
                f"{V2.shape[1]}, {Vi2.shape[1]}, {out_t2.shape[1]}"
            )
    elif Vi is not None or out_t is not None:
        raise ValueError("Vi= and out_t= are only used with symmetric_pair=True")
    if ni == 0 or nj == 0:
        return
    ev = prepare(kernel, Xi, None if same else Xj, kd, _prep_buffer)
    R, C = _product_block_shape(block_shape, ev)
    size = R * max(C, R)
    strips = [(r0, min(r0 + R, ni)) for r0 in range(0, ni, R)]
    if kd == np.float32:
        V2 = V2.astype(np.float32)
        Vi2 = None if Vi2 is None else Vi2.astype(np.float32)
    if same:
        jobs = [(ev, r0, r1, r0, True, V2, V2, C, size) for r0, r1 in strips]
    else:
        jobs = [(ev, r0, r1, nj, False, V2, Vi2, C, size) for r0, r1 in strips]
    results = _run(_strip_products, jobs, nt)
    # fixed-order combination: bitwise the same for any thread count
    target_t = out2 if same else out_t2
    for (r0, r1), (acc, pt) in zip(strips, results, strict=True):
        out2[r0:r1] += acc
        if pt is not None and pt.shape[0]:
            target_t[: pt.shape[0]] += pt


def predict_accumulate(
    kernel: Kernel | str | dict,
    X_new: Any,
    X_train: Any,
    dual_coef: Any,
    out: np.ndarray,
    **kwargs: Any,
) -> None:
    """``out += K(X_new, X_train) @ dual_coef``: the rectangular case of :func:`kernel_matvec`.

    Keyword arguments (``kernel_dtype``, ``n_threads``, ``block_shape``) as there.
    """
    kernel_matvec(kernel, X_new, X_train, dual_coef, out, **kwargs)


# -- whole tiles (the Gram build) ------------------------------------------------------------
def _strip_tile(
    ev: BlockEvaluator,
    r0: int,
    r1: int,
    cend: int,
    diag_tile: bool,
    out: np.ndarray,
    C: int,
    size: int,
) -> None:
    r = r1 - r0
    # scratch, then one copy (sub-blocks written straight into ``out`` collide in the
    # cache at power-of-two row strides); for diagonal tiles and for an ``out`` that
    # :func:`_strip_tile_direct` cannot write (another dtype, not contiguous)
    E_flat = _scratch("E", size, ev.dtype)
    T_flat = _scratch("T", size, ev.dtype) if ev.needs_scratch else None
    blocks = [(c0, min(c0 + C, cend), False) for c0 in range(0, cend, C)]
    if diag_tile:
        blocks.append((r0, r1, True))
    for c0, c1, diag in blocks:
        n_el = r * (c1 - c0)
        E = E_flat[:n_el].reshape(r, c1 - c0)
        T = None if T_flat is None else T_flat[:n_el].reshape(E.shape)
        ev.fill(E, r0, r1, c0, c1, diag, T)
        out[r0:r1, c0:c1] = E
        if diag_tile and not diag:
            out[c0:c1, r0:r1] = E.T


def _strip_tile_direct(
    ev: BlockEvaluator,
    r0: int,
    r1: int,
    cend: int,
    diag_tile: bool,
    out: np.ndarray,
    C: int,
    size: int,
) -> None:
    """Rows ``r0:r1`` of a rectangular tile, evaluated straight into ``out`` (same
    dtype, C-contiguous): the strip is contiguous there, so the GEMM writes it and
    ``np.exp`` runs on it in place while it is in cache."""
    T = None
    if ev.needs_scratch:
        T = _scratch("T", (r1 - r0) * cend, ev.dtype).reshape(r1 - r0, cend)
    ev.fill(out[r0:r1], r0, r1, 0, cend, False, T)


def kernel_tile(
    kernel: Kernel | str | dict,
    Xi: Any,
    Xj: Any,
    out: np.ndarray,
    *,
    kernel_dtype: Any = "float64",
    n_threads: int | None = None,
    block_shape: tuple[int, int] | None = None,
) -> np.ndarray:
    """Write the tile ``K(Xi, Xj)`` into ``out`` (float64 or float32, shape (ni, nj)).

    ``Xj=None`` means ``K(Xi, Xi)``: its lower part is evaluated and mirrored,
    so the tile is exactly symmetric. ``kernel_dtype`` is the evaluation
    dtype (``out`` may differ: values are cast on the copy). Returns ``out``.
    """
    kernel, kd, nt, Xi, Xj, same = _prepare(kernel, kernel_dtype, n_threads, Xi, Xj)
    ni, nj = Xi.shape[0], Xj.shape[0]
    if (
        not isinstance(out, np.ndarray)
        or out.shape != (ni, nj)
        or out.dtype not in (np.float32, np.float64)
        or not out.flags.writeable
    ):
        raise ValueError(
            f"out must be a writable float32/float64 array of shape ({ni}, {nj}), got "
            f"{getattr(out, 'shape', None)} {getattr(out, 'dtype', type(out).__name__)}"
        )
    if ni == 0 or nj == 0:
        return out
    ev = prepare(kernel, Xi, None if same else Xj, kd, _prep_buffer)
    R, C = _block_shape(block_shape, ev)
    size = R * max(C, R)
    fn = _strip_tile
    if not same and out.dtype == kd and out.flags.c_contiguous and not isinstance(ev, _Generic):
        # full-width strips of about one sub-block's entries, evaluated in place
        fn, R = _strip_tile_direct, max(1, min(ni, (R * C) // nj))
    jobs = [
        (ev, r0, min(r0 + R, ni), r0 if same else nj, same, out, C, size) for r0 in range(0, ni, R)
    ]
    _run(fn, jobs, nt)
    return out
