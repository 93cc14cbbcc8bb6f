"""One factor tile's arithmetic, on any backend: the tile kernels of the left-looking
tile Cholesky, which every executor runs (the host's threads and Dask tasks,
:mod:`pipeline.linalg.cholesky`, and the device's schedules,
:mod:`pipeline.linalg.cholesky_device`):

    A    = K_ij + shift * delta_ij * I - sum_{k<j} L_ik @ L_jk.T
    L_jj = potrf(A)                 (i == j; in float64 for a float32 factor too)
    L_ij = A @ inv(L_jj).T          (i > j, a TRSM)

:func:`shifted_tile`, :func:`update` and :func:`finish_tile` take a
:class:`~pipeline.engine.backend.Backend`; on the NumPy backend its calls are the tile
engine's GIL-free BLAS (:mod:`pipeline.engine.blas`), so the host's tile threads
overlap. Every call is a BLAS-3 or LAPACK call, in a fixed k order, so the result is
bitwise reproducible whatever the executor. :func:`_factor_tile` is the host
executors' task body: it reads the Gram and factor tiles from their stores."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

import pipeline.constants as C
from pipeline.engine import blas as gil_free_blas
from pipeline.engine.backend import Backend, get_backend
from pipeline.engine.tile_io import TileIO
from pipeline.errors import NonFiniteKernelError, NotPositiveDefiniteError
from pipeline.linalg.cholesky_cache import _read_factor_tile
from pipeline.linalg.cholesky_exec import prefetch_gram_tile, read_gram_tile
from pipeline.linalg.cholesky_options import JitterPolicy
from pipeline.storage import TiledArray
from pipeline.storage import buffers as tile_buffers

#: the host's backend: the CPU tile Cholesky's calls
_HOST = get_backend("numpy")


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


def _host_diagonal(be: Backend, a: Any) -> np.ndarray:
    """The diagonal of a square tile of ``be``, on the host (``b`` values)."""
    if be.name == "numpy":
        return np.diagonal(a)
    return be.to_numpy(be.xp.linalg.diagonal(a))


def _check_finite(be: Backend, a: Any, j: int, when: str) -> None:
    """:func:`_check_finite_diagonal` (its message) on a tile of ``be``, reading only its
    diagonal from the device: a read-only 2-D view whose diagonal it is (stride 0 along
    the columns), no tile-sized copy."""
    if be.name == "numpy":
        return _check_finite_diagonal(a, j, when)
    d = _host_diagonal(be, a)
    if np.isfinite(d).all():
        return
    view = np.lib.stride_tricks.as_strided(d, (d.size, d.size), (d.strides[0], 0), writeable=False)
    _check_finite_diagonal(view, j, when)


#: lower Cholesky factor of the tile whose *lower* triangle ``a`` holds (C order), in
#: float64, GIL-free (the same LAPACK call as SciPy's ``potrf(a.T, lower=0)``, so the same
#: bits): the NumPy backend's :meth:`~pipeline.engine.backend.Backend.cholesky_lower`
_potrf_lower = gil_free_blas.potrf_lower_float64


def _float64_scratch(a: np.ndarray) -> np.ndarray:
    """``a``'s values in a float64 tile from :mod:`pipeline.storage.buffers` (one that
    an earlier diagonal tile gave back, when there is one)."""
    d = tile_buffers.take(a.shape, np.dtype(np.float64))
    np.copyto(d, a)
    return d


def _owned_tile(be: Backend, k_tile: Any, dtype: Any) -> Any:
    """The Gram tile as a C-contiguous array of ``be`` in ``dtype`` that the
    factorisation may overwrite: a fresh array of that kind is taken as it is (its
    buffer becomes the factor tile; zarr returns a fresh one), anything else is
    uploaded or copied."""
    if be.name == "numpy":
        a = np.require(k_tile, dtype=dtype, requirements=["C", "W"])
        if a is k_tile and not k_tile.flags.owndata:  # a view of the caller's matrix
            a = k_tile.copy()
        return a
    if be.name == "cupy":  # pragma: no cover - GPU only
        import cupy

        if isinstance(k_tile, cupy.ndarray):
            return cupy.ascontiguousarray(k_tile, dtype=dtype)
        return cupy.asarray(np.ascontiguousarray(k_tile), dtype=dtype)
    if isinstance(k_tile, np.ndarray | np.generic):
        k_tile = np.ascontiguousarray(k_tile)
    return be.asarray(k_tile, dtype)


def _add_to_diagonal(be: Backend, a: Any, value: float) -> Any:
    """``a + value * I`` (in place on NumPy and CuPy): the same bits either way, the
    off-diagonal entries gain an exact zero."""
    if be.name in ("numpy", "cupy"):
        a.reshape(-1)[:: a.shape[0] + 1] += value
        return a
    xp = be.xp
    return a + value * xp.eye(a.shape[0], dtype=a.dtype)


def _contiguous(be: Backend, x: Any) -> Any:
    """``x`` as a C-contiguous array (a tile is one contiguous buffer)."""
    if be.name == "numpy":
        return np.ascontiguousarray(x)
    if be.name == "cupy":  # pragma: no cover - GPU only
        import cupy

        return cupy.ascontiguousarray(x)
    # array-api-strict (host memory, tests): the array API has no memory order, and a
    # transposed tile would take other BLAS paths (other bits) than a reloaded one
    return be.asarray(np.ascontiguousarray(be.to_numpy(x)))


def shifted_tile(
    be: Backend, k_tile: Any, i: int, j: int, shift: float, dtype: Any
) -> tuple[Any, float]:
    """The Gram tile ``K_ij`` to update, owned by the factorisation, in ``dtype`` (a
    diagonal one shifted), and the jitter's scale: ``K_jj``'s own mean diagonal plus the
    shift (not that of the Schur complement, which is ~0 exactly when jitter is needed);
    0 off the diagonal."""
    scale = 0.0
    if i == j:
        diag = np.diagonal(k_tile) if isinstance(k_tile, np.ndarray) else _host_diagonal(be, k_tile)
        scale = float(np.mean(np.abs(diag))) + shift
    a = _owned_tile(be, k_tile, dtype)
    if i == j:
        a = _add_to_diagonal(be, a, shift)
    return a, scale


def update(be: Backend, a: Any, i: int, j: int, lik: Any, ljk: Any) -> Any:
    """``A_ij -= L_ik L_jkᵀ`` (a diagonal tile: SYRK on its lower triangle, half the
    flops on the host)."""
    return be.syrk_lower_sub(a, ljk) if i == j else be.gemm_nt_sub(a, lik, ljk)


def _factor_diagonal(
    be: Backend, a: Any, j: int, row0: int, shift: float, scale: float,
    policy: JitterPolicy | None, dtype: np.dtype, lam: float, convention: str,
) -> tuple[Any, dict[str, Any]]:  # fmt: skip
    """POTRF of the updated diagonal tile ``a`` (in the factor's ``dtype``; in float64,
    in place), with the non-finite checks and jitter retries; returns (L_jj in
    ``dtype``, marker info). ``row0``: the tile's first row (for the message)."""
    xp = be.xp
    _check_finite(be, a, j, "before")
    dtype = np.dtype(dtype)
    host32 = be.name == "numpy" and dtype != np.float64
    if dtype == np.float64:
        d = a
    elif host32:  # a reused scratch tile: a new one is fresh memory, which costs more
        d = _float64_scratch(a)
    else:
        d = xp.astype(a, be.dtype("float64"))
    keep = xp.asarray(d, copy=True) if policy is not None else None
    lt, piv = be.cholesky_lower(d, overwrite=True)
    if piv == 0:
        _check_finite(be, lt, j, "after")
    info: dict[str, Any] = {}
    tried: list[float] = []
    if piv != 0 and policy is not None:
        scale = scale or 1.0
        for t in range(policy.max_tries):
            eps = policy.initial * policy.growth**t * scale
            tried.append(eps)
            aj = _add_to_diagonal(be, xp.asarray(keep, copy=True), eps)
            lt, piv = be.cholesky_lower(aj, overwrite=True)
            if piv == 0:
                info["jitter"] = eps
                info["jitter_tries"] = t + 1
                break
    if piv != 0:
        raise NotPositiveDefiniteError(
            (j, j), piv, row0 + piv - 1, lam, convention, shift, tuple(tried), dtype.name
        )
    if host32:  # back into the float32 tile (the same rounding as astype)
        np.copyto(a, lt, casting="same_kind")
        tile_buffers.give(d, C.TILE_BUFFER_POOL_BYTES)
        lt = a
    elif dtype != np.float64:
        lt = xp.astype(lt, be.dtype(dtype))
    return _contiguous(be, lt), info


def finish_tile(
    be: Backend, a: Any, i: int, j: int, ljj: Any, *, row0: int, shift: float,
    scale: float, policy: JitterPolicy | None, dtype: np.dtype, lam: float,
    convention: str,
) -> tuple[Any, dict[str, Any]]:  # fmt: skip
    """The updated tile's factor tile, POTRF on the diagonal (``ljj`` unused), else a
    TRSM by ``ljj``, and the marker's info (a diagonal tile's jitter)."""
    if i == j:
        return _factor_diagonal(be, a, j, row0, shift, scale, policy, dtype, lam, convention)
    return _contiguous(be, be.trsm_right_lower_t(ljj, a)), {}


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
    """The host executors' task body: factor tile ``(i, j)`` from the stored Gram tile
    and finished factor tiles (through ``io`` when given); returns (tile, marker info)."""
    dtype = np.dtype(L.dtype)
    t0 = time.perf_counter()
    if k_tile is None and io is None and j < i:  # a task reading its own tiles: the
        prefetch_gram_tile(gram, i, j + 1)  # next one of its row, read ahead by the kernel
    if k_tile is None:  # read once: no need to keep it in the page cache
        k_tile = io.read(("K", i, j)) if io is not None else read_gram_tile(gram, i, j)
    a, scale = shifted_tile(_HOST, k_tile, i, j, shift, dtype)
    for k in range(j):  # the fixed k order
        ljk = _read_factor_tile(L, j, k, io)
        a = update(_HOST, a, i, j, None if i == j else _read_factor_tile(L, i, k, io), ljk)
    ljj = None if i == j else _read_factor_tile(L, j, j, io)
    out, info = finish_tile(
        _HOST, a, i, j, ljj, row0=L.grid.row_slice(j).start, shift=shift, scale=scale,
        policy=jitter, dtype=dtype, lam=lam, convention=convention,
    )  # fmt: skip
    info["seconds"] = round(time.perf_counter() - t0, 4)
    return out, info
