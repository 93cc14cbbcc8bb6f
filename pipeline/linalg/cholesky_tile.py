"""One factor tile's arithmetic: the tile kernels of the left-looking tile Cholesky.

``_factor_tile`` computes factor tile ``L_ij`` (``i >= j``) from the Gram tile
``K_ij`` and finished factor tiles (:mod:`pipeline.linalg.cholesky` runs it on its
executors, writes and caches the result):

    A    = K_ij + shift * delta_ij * I - sum_{k<j} L_ik @ L_jk.T
    L_jj = potrf(A)                 (i == j; in float64 for a float32 factor too)
    L_ij = A @ inv(L_jj).T          (i > j, a TRSM)

Every call is a BLAS-3 or LAPACK call that releases the GIL, in a fixed k order, so
the result is bitwise reproducible."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

import pipeline.constants as C
from pipeline.engine import blas as gil_free_blas
from pipeline.engine.tile_io import TileIO
from pipeline.errors import NonFiniteKernelError, NotPositiveDefiniteError
from pipeline.linalg.cholesky_cache import _read_factor_tile
from pipeline.linalg.cholesky_exec import prefetch_gram_tile, read_gram_tile
from pipeline.linalg.cholesky_options import JitterPolicy
from pipeline.storage import TiledArray
from pipeline.storage import buffers as tile_buffers


def _check_finite_diagonal(a: np.ndarray, i: int, when: str) -> None:
    """Raise if diagonal tile ``i`` has a non-finite diagonal entry (O(b), no pass over the
    tile): an inf or NaN anywhere in the Gram's rows up to it reaches this diagonal through
    the updates (before the POTRF), or its factor (after it). Without this, the factor
    finished with NaN and the solve blamed y."""
    diag = np.diagonal(a)
    if np.isfinite(diag).all():
        return
    r = int(np.flatnonzero(~np.isfinite(diag))[0])
    raise NonFiniteKernelError(
        f"the kernel matrix holds a non-finite value (inf or NaN) in the rows of block {i}: "
        f"diagonal entry {r} of that block is {diag[r]} {when} its Cholesky factorisation. "
        f"The kernel's values overflow {a.dtype} (e.g. a high polynomial degree on large "
        "features): standardise X, or lower the degree or gamma"
        + (", or use factor_dtype='float64'" if a.dtype == np.float32 else "")
    )


#: lower Cholesky factor of the tile whose *lower* triangle ``a`` holds (C order), in
#: float64, GIL-free (the same LAPACK call as SciPy's ``potrf(a.T, lower=0)``, so the same
#: bits), so the other tile threads keep doing their I/O meanwhile
_potrf_lower = gil_free_blas.potrf_lower_float64


def _float64_scratch(a: np.ndarray) -> np.ndarray:
    """``a``'s values in a float64 tile from :mod:`pipeline.storage.buffers` (one that
    an earlier diagonal tile gave back, when there is one)."""
    d = tile_buffers.take(a.shape, np.dtype(np.float64))
    np.copyto(d, a)
    return d


def _trsm_right_lower_t(ljj: np.ndarray, a: np.ndarray) -> np.ndarray:
    """Solve ``X @ ljj.T = a`` for X in place of ``a`` (both C-contiguous); GIL-free."""
    return gil_free_blas.trsm_right_lower_t(ljj, a)


def _updated_tile(
    gram: TiledArray,
    L: TiledArray,
    i: int,
    j: int,
    shift: float,
    dtype: np.dtype,
    k_tile: np.ndarray | None = None,
    io: TileIO | None = None,
) -> np.ndarray:
    """``K_ij + shift*delta_ij*I - sum_k L_ik L_jk^T`` (for i == j: lower triangle only).

    Accumulated in place, GEMM off the diagonal and SYRK on it (half the flops),
    in a fixed k order, so the result is reproducible bit for bit. The BLAS calls
    release the GIL (:mod:`pipeline.engine.blas`; SciPy's f2py ``gemm``/``syrk``/
    ``trsm`` wrappers hold it, which serialised the tile threads), so tile
    threads overlap.
    """
    if k_tile is None:
        k_tile = gram.read_tile(i, j)
    # zarr returns a fresh array: reuse it when it already is writable C-ordered float64
    a = np.require(k_tile, dtype=dtype, requirements=["C", "W"])
    if a is k_tile and not k_tile.flags.owndata:
        a = k_tile.copy()
    if i == j:
        a[np.diag_indices_from(a)] += shift
    for k in range(j):
        ljk = _read_factor_tile(L, j, k, io)
        if i == j:
            gil_free_blas.syrk_lower_sub(a, ljk)
        else:
            gil_free_blas.gemm_nt_sub(a, _read_factor_tile(L, i, k, io), ljk)
    return a


def _factor_tile(
    gram: TiledArray,
    L: TiledArray,
    i: int,
    j: int,
    shift: float,
    lam: float,
    convention: str,
    jitter: JitterPolicy | None,
    k_tile: np.ndarray | None = None,
    io: TileIO | None = None,
) -> tuple[np.ndarray, dict[str, Any]]:
    """Compute factor tile ``(i, j)`` from finished tiles; returns (tile, marker info)."""
    dtype = np.dtype(L.dtype)
    t0 = time.perf_counter()
    if k_tile is None and io is None and j < i:  # a task reading its own tiles: the
        prefetch_gram_tile(gram, i, j + 1)  # next one of its row, read ahead by the kernel
    if k_tile is None:  # read once: no need to keep it in the page cache
        k_tile = io.read(("K", i, j)) if io is not None else read_gram_tile(gram, i, j)
    # jitter scale: the tile's own diagonal of K + shift*I (not that of the Schur
    # complement, which is ~0 exactly when jitter is needed)
    scale = float(np.mean(np.abs(np.diag(k_tile)))) + shift if i == j else 0.0
    a = _updated_tile(gram, L, i, j, shift, dtype, k_tile, io)
    info: dict[str, Any] = {}
    if i == j:
        # a float32 factor still factors its diagonal tiles in float64: in a reused
        # scratch tile (a new one is fresh memory, which costs more than the copies)
        _check_finite_diagonal(a, i, "before")
        d = a if a.dtype == np.float64 else _float64_scratch(a)
        keep = d.copy() if jitter is not None else None
        lt, piv = _potrf_lower(d, overwrite=keep is None)
        if piv == 0:
            _check_finite_diagonal(lt, i, "after")
        tried: list[float] = []
        if piv != 0 and jitter is not None:
            scale = scale or 1.0
            for t in range(jitter.max_tries):
                eps = jitter.initial * jitter.growth**t * scale
                tried.append(eps)
                aj = keep.copy()
                aj[np.diag_indices_from(aj)] += eps
                lt, piv = _potrf_lower(aj)
                if piv == 0:
                    info["jitter"] = eps
                    info["jitter_tries"] = t + 1
                    break
        if piv != 0:
            row = L.grid.row_slice(j).start + piv - 1
            raise NotPositiveDefiniteError(
                (i, j), piv, row, lam, convention, shift, tuple(tried), dtype.name
            )
        if lt.dtype == dtype:
            out = lt
        else:  # back into the float32 tile (the same rounding as astype)
            np.copyto(a, lt, casting="same_kind")
            out = a
        if d is not a:
            tile_buffers.give(d, C.TILE_BUFFER_POOL_BYTES)
    else:
        out = _trsm_right_lower_t(_read_factor_tile(L, j, j, io), a)
    info["seconds"] = round(time.perf_counter() - t0, 4)
    return out, info
