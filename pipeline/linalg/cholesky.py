"""Out-of-core tile Cholesky of ``K + shift * I`` from the stored Gram's lower tiles.

The factor ``L`` (lower, ``L @ L.T = K + shift * I``) goes to its own tiled Zarr
array; the Gram is only read. The algorithm is *left-looking*: tile ``L_ij``
(``i >= j``) is a pure function of the Gram tile ``K_ij`` and finished factor
tiles,

    A    = K_ij + shift * delta_ij * I - sum_{k<j} L_ik @ L_jk.T
    L_jj = potrf(A)                 (i == j)
    L_ij = A @ inv(L_jj).T          (i > j, a TRSM)

so every tile task reads finished tiles, writes its own region, then its
completion marker. A task killed half way leaves no marker and is simply
recomputed; a rerun recomputes no tile whose marker exists (same fingerprint),
and the summation order is fixed, so the rerun's ``L`` is bit-identical.

Two executors run the same tile function:

- ``scheduler="dask"``: a Dask graph of one task per factor tile; tasks depend
  on each other through tiny results (a dict per tile), never tile payloads. It
  runs on the active distributed client or the threaded scheduler
  (:func:`pipeline.engine.parallel.compute`).
- ``scheduler="threads"``: the same tasks on a few threads of this process, the
  ready task with the longest remaining path first (the diagonal chain).

In both, every BLAS/LAPACK call of a tile task runs with one fixed thread count
(:func:`pipeline.engine.where.tile_blas_threads`), because OpenBLAS rounds
differently with another: the factor is the same bit for bit whatever the executor.

``keep_gram=True`` (default) writes the factor to its own array;
``keep_gram=False`` factors in place (:mod:`pipeline.linalg.cholesky_inplace`,
which also gives the disk each needs, checked before any work). Finished factor
tiles are immutable, so a per-process LRU cache keeps recently used ones in memory.
``potrf`` is only ever called on one diagonal tile.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import numpy as np

from pipeline.constants import DIRECT_FACTOR_WRITES, STORED_READ_AHEAD
from pipeline.engine import blas as gil_free_blas
from pipeline.engine.backend import Backend
from pipeline.engine.passes import pending
from pipeline.engine.tile_io import TileIO
from pipeline.engine.where import auto_scheduler, factor_threads, tile_blas_threads
from pipeline.errors import NotPositiveDefiniteError  # noqa: F401 (its old home)

# ---------------------------------------------------------------------------
# per-process cache of finished factor tiles (pipeline.linalg.cholesky_cache)
from pipeline.linalg.cholesky_cache import (
    _CACHE,
    _cache_key,
    mapped_factor_reads,
    share_written_tile,
)

# ---------------------------------------------------------------------------
# the resident-tile schedule on a device backend (pipeline.linalg.cholesky_device)
from pipeline.linalg.cholesky_device import (
    DeviceCholeskyFactor,
    device_cholesky,
    open_device_factor,
    stored_tiles,
)
from pipeline.linalg.cholesky_exec import (
    _left_looking_order,
    _niced,
    _run_dask,
    _run_threads,
    io_niceness,
)

# ---------------------------------------------------------------------------
# the factor that replaces its Gram (keep_gram=False; pipeline.linalg.cholesky_inplace)
from pipeline.linalg.cholesky_inplace import (
    InPlaceFactorArray,
    check_disk_space,
    factor_in_place,
)

# ---------------------------------------------------------------------------
# errors, options and the factor (pipeline.linalg.cholesky_options)
from pipeline.linalg.cholesky_options import (
    CholeskyFactor,
    JitterPolicy,
    factor_fingerprint,
    make_jitter_policy,
    regularisation_shift,
)

# ---------------------------------------------------------------------------
# one tile's arithmetic (pipeline.linalg.cholesky_tile)
from pipeline.linalg.cholesky_tile import _factor_tile
from pipeline.storage import IncompleteArrayError, TiledArray, open_tiled_array
from pipeline.storage.rawchunks import release_direct_buffers


def _store_tile(
    L: TiledArray,
    i: int,
    j: int,
    tile: np.ndarray,
    info: dict[str, Any],
    io: TileIO | None = None,
    shared: bool = False,
) -> None:
    """Cache factor tile ``(i, j)`` and write it: region first, marker last. Past the
    page cache (:data:`DIRECT_FACTOR_WRITES`, read at call time) where only this process
    reads it (it caches it); ``shared`` (tasks in worker processes): through it, marked
    ``page_cache``, for other processes to map."""
    tile.flags.writeable = False
    _CACHE.put(_cache_key(L, i, j), tile)
    direct = DIRECT_FACTOR_WRITES and not shared
    marker = {**info, "page_cache": True} if shared else info

    def write(t: np.ndarray) -> None:
        L.write_tile(i, j, t, direct=direct, **marker)

    if io is None:
        write(tile)
    else:  # one writer thread, in completion order: an input's marker precedes its users'
        io.write(("L", i, j), tile, _niced(write, io_niceness()))


def _tile_task(
    gram: TiledArray,
    L: TiledArray,
    i: int,
    j: int,
    shift: float,
    lam: float,
    convention: str,
    jitter: JitterPolicy | None,
    deps: Iterable[Any] = (),
    io: TileIO | None = None,
    blas_threads: int | None = None,
    host_lock: bool = False,
    host_shared: bool = False,
) -> dict[str, Any]:
    """Dask task: factor tile (i, j) unless its marker exists; return a tiny record.

    ``blas_threads``: every BLAS/LAPACK call of the task runs with exactly this many
    threads (:func:`pipeline.engine.blas.fixed_width`), so the tile's bits do not
    depend on the executor or on what else runs (None: the caller's setting);
    ``host_lock``: wide calls also queue with those of other processes on this host
    (Dask worker processes); ``host_shared``: the factor tiles go through the page
    cache and the task maps other tasks' tiles from it
    (:func:`~pipeline.linalg.cholesky_cache.mapped_factor_reads`), for tasks in worker
    processes.
    """
    rec = L.markers.record((i, j))
    if rec is not None:  # a retried or duplicated task: the tile is already stored
        return {"tile": (i, j), "computed": False, "jitter": rec.get("jitter")}
    with (
        gil_free_blas.fixed_width(blas_threads, host_lock=host_lock),
        mapped_factor_reads(host_shared),
    ):
        tile, info = _factor_tile(gram, L, i, j, shift, lam, convention, jitter, io=io)
    _store_tile(L, i, j, tile, info, io, shared=host_shared)
    if host_shared:  # the cache maps the tile just written; its memory serves a next read
        share_written_tile(L, i, j, tile)
    return {"tile": (i, j), "computed": True, "jitter": info.get("jitter")}


# ---------------------------------------------------------------------------
# public API


def tile_cholesky(
    gram: TiledArray,
    lam: float,
    *,
    convention: str = "sklearn",
    store: str | None = None,
    name: str = "chol",
    jitter: Any = None,
    scheduler: str = "auto",
    n_threads: int | None = None,
    overwrite: bool = True,
    check_gram: bool = True,
    progress: bool = True,
    dtype: Any = np.float64,
    keep_gram: bool = True,
    recompute_tile: Any = None,
    check_disk: bool = True,
    wide: bool = True,
    backend: Backend | None = None,
) -> CholeskyFactor | DeviceCholeskyFactor:
    """Factor ``K + shift * I = L @ L.T`` tile by tile, Zarr to Zarr, resumably.

    Parameters
    ----------
    gram : TiledArray
        The stored Gram (lower tiles ``j <= i`` written and marked), square.
        It is only read.
    lam : float
        Regularisation ``>= 0``.
    convention : {"sklearn", "n"}
        ``shift = lam`` (scikit-learn's ``alpha``) or ``shift = n * lam``.
    store : str, optional
        Where the factor goes; default: the Gram's store.
    name : str
        Array name of the factor in ``store``.
    jitter : None, True, float, dict or JitterPolicy
        Off by default: a non-PD diagonal tile raises
        :class:`NotPositiveDefiniteError`. Otherwise a failed tile POTRF is
        retried with growing jitter on that tile's diagonal (recorded).
    scheduler : {"auto", "threads", "dask"}
        "threads": tile tasks on ``n_threads`` threads of this process, the
        ready task with the longest remaining path first.
        "dask": one Dask task per tile (dependencies through tiny results) run
        by :func:`pipeline.engine.parallel.compute` on the active distributed client or
        the threaded scheduler. Both give the same factor bit for bit (see
        ``wide``).
        "auto" (default): "dask" when a distributed client is active and its
        workers run on other machines, else "threads"
        (:func:`~pipeline.engine.where.auto_scheduler`: on one machine the
        threads executor in this process is the faster).
    n_threads : int, optional
        Threads of the "threads" scheduler (default: all cores).
    overwrite : bool
        Replace a factor stored under ``name`` with another fingerprint (e.g.
        another lambda). If False such a store raises ``StoreMismatchError``.
    check_gram : bool
        Verify that every lower Gram tile has its completion marker.
    dtype : {float64, float32}
        Storage and update precision of ``L``. float32 halves the factor's bytes
        and runs the GEMM/SYRK/TRSM updates at float32 speed;
        diagonal tiles are still factored in float64. Such a factor solves to
        about single precision: pass the Gram to :func:`cholesky_solve`
        (``gram=``), which refines ``alpha`` to double precision.
    wide : bool
        True (default): every BLAS/LAPACK call of a tile task uses all cores
        (``KRR_CHOL_BLAS_THREADS`` if set), one call at a time per process, while
        the other tile threads do their I/O and copies; False: one BLAS thread
        per call, tile tasks in parallel. Both executors use the same fixed BLAS
        width, so "threads" and "dask" give the same factor bit for bit, whatever
        ``n_threads``; ``wide=True`` and ``wide=False`` agree to rounding
        (OpenBLAS rounds differently with another thread count).
    keep_gram : bool
        True (default): the factor goes to its own array and the Gram is kept.
        False: factor in place, each factor tile atomically replacing its Gram
        tile in the Gram's array (half the disk; ``store``/``name`` are then the
        Gram's, ``dtype`` must be the Gram's). Retry-safe and resumable; the
        markers' fingerprints say which tiles hold the factor
        (:mod:`pipeline.linalg.cholesky_inplace`). The Gram is gone afterwards:
        a later factorisation (e.g. another lambda) recomputes its tiles with
        ``recompute_tile``.
    recompute_tile : callable (i, j) -> ndarray, optional
        With ``keep_gram=False``: recomputes a Gram tile from X when it was
        replaced by an earlier in-place factor (or fails its checksum), with a
        log line that says why. Without it such a tile raises a clear error.
        One that also accepts ``out=`` (e.g. ``GramTileRecomputer``) is given a
        reused buffer of the tile's shape and dtype to write the tile into.
    check_disk : bool
        Check free space on the store's disk before any work:
        ``T(T+1)/2 * b^2 * itemsize`` bytes for a separate factor (``T`` tiles
        per side, block ``b``), about two tiles in place. Too little raises
        :class:`~pipeline.linalg.cholesky_inplace.InsufficientDiskError`,
        naming the bytes needed and free.
    backend : Backend, optional
        None (default): the tile tasks above, on this host's cores or the cluster. A
        backend (``get_backend("cupy")``: a GPU; NumPy: that route on the host) runs the
        same tile arithmetic in its resident-tile schedule
        (:func:`~pipeline.linalg.cholesky_device.device_cholesky`): the stored Gram's
        tiles are read ahead and streamed to the device, and the factor's tiles are
        written to ``store`` under the backend's fingerprint
        (:func:`~pipeline.linalg.cholesky_device.device_factor_fingerprint`), so a
        stopped factorisation resumes from them. ``keep_gram`` must then be True, and
        ``scheduler``, ``n_threads`` and ``wide`` do not apply.

    Returns
    -------
    CholeskyFactor
        Or, on a device backend, a
        :class:`~pipeline.linalg.cholesky_device.DeviceCholeskyFactor` (its tiles on the
        device, its ``solve`` there).

    Raises
    ------
    NotPositiveDefiniteError
        A diagonal tile is not positive definite (names tile, pivot, lambda).
    ValueError
        Bad lambda/convention, a non-square or incomplete Gram.
    """
    t0 = time.perf_counter()
    if len(gram.shape) != 2 or gram.shape[0] != gram.shape[1]:
        raise ValueError(f"the Gram must be square, got shape {gram.shape}")
    n = int(gram.shape[0])
    shift = regularisation_shift(lam, n, convention)
    policy = make_jitter_policy(jitter)
    if scheduler not in ("auto", "threads", "dask"):
        raise ValueError(f"scheduler must be 'auto', 'threads' or 'dask', got {scheduler!r}")
    grid = gram.grid
    if check_gram and keep_gram:  # in place: checked against both marker kinds
        missing = pending(gram.markers, grid.lower_tiles())
        if missing:
            raise IncompleteArrayError(
                gram.store,
                gram.name,
                missing,
                grid.n_lower_tiles(),
                message=f"the Gram in {gram.store!r}/{gram.name!r} is incomplete: {len(missing)} of "
                f"{grid.n_lower_tiles()} lower tiles have no completion marker (first: "
                f"{missing[:3]}); finish building the Gram before factorising it",
            )
    dtype = np.dtype(dtype)
    if dtype not in (np.dtype(np.float64), np.dtype(np.float32)):
        raise ValueError(f"dtype must be float64 or float32, got {dtype}")
    if backend is not None:
        if not keep_gram:
            raise ValueError(
                f"keep_gram=False (the factor in place of the Gram) has no {backend.name} "
                "schedule: use keep_gram=True, or the host (backend=None)"
            )
        return _resident_factor(
            gram, lam, backend, convention, store, name, policy, overwrite, progress,
            dtype, check_disk,
        )  # fmt: skip
    if scheduler == "auto":
        scheduler = auto_scheduler(say=True)
    fp = factor_fingerprint(gram, lam, convention, policy, dtype)
    if not keep_gram:
        return factor_in_place(
            gram,
            lam,
            shift,
            convention,
            policy,
            scheduler,
            n_threads,
            progress,
            dtype,
            fp,
            store=store,
            check_gram=check_gram,
            recompute_tile=recompute_tile,
            check_disk=check_disk,
            wide=wide,
            t0=t0,
            run_tasks=run_factor_tasks,
        )
    attrs = {
        "lambda": float(lam),
        "convention": convention,
        "shift": float(shift),
        "gram_fingerprint": gram.fingerprint,
        "jitter_policy": None if policy is None else policy.to_dict(),
        "layout": "lower tiles of L with L @ L.T = K + shift*I; upper tiles unwritten",
    }
    L = open_tiled_array(
        store or gram.store,
        name,
        (n, n),
        gram.block_size,
        dtype,
        fp,
        overwrite=overwrite,
        attributes=attrs,
    )
    todo = pending(L.markers, _left_looking_order(grid.n_row_blocks))  # resume
    if check_disk:
        _check_factor_disk(L, len(todo))
    computed, jit = run_factor_tasks(
        gram, L, todo, shift, lam, convention, policy, scheduler, n_threads, wide, progress
    )
    if policy is not None:
        zarr_arr = L.zarr("r+")
        zarr_arr.attrs["jitter"] = jit
    return CholeskyFactor(
        L=L,
        lam=float(lam),
        convention=convention,
        shift=float(shift),
        jitter=jit,
        computed=computed,
        seconds=time.perf_counter() - t0,
    )


def _check_factor_disk(L: TiledArray, todo: int) -> None:
    """Free disk for the factor ``L``'s ``todo`` remaining tiles, before any work (both
    schedules: the tasks' and the resident one's)."""
    if todo:
        b, dtype = L.block_size, np.dtype(L.dtype)
        check_disk_space(
            L.store,
            todo * b**2 * dtype.itemsize,
            f"the factor's {todo} remaining {b}x{b} {dtype} tiles",
        )


def _resident_factor(
    gram, lam, backend, convention, store, name, policy, overwrite, progress, dtype, check_disk
) -> DeviceCholeskyFactor:
    """:func:`tile_cholesky` on a device backend: the factor's store under the backend's
    fingerprint (reopened to resume), checked for disk like the tasks' factor, then the
    resident-tile schedule over the stored Gram's tiles, read ahead."""
    n, block = int(gram.shape[0]), int(gram.block_size)
    L = open_device_factor(
        store or gram.store, gram, n, block, lam, backend, convention=convention,
        jitter=policy, dtype=dtype, name=name, overwrite=overwrite,
    )  # fmt: skip
    if check_disk:
        _check_factor_disk(L, len(pending(L.markers, gram.grid.lower_tiles())))
    return device_cholesky(
        backend, stored_tiles(gram), n, block, shift=regularisation_shift(lam, n, convention),
        dtype=dtype, jitter=policy, L=L, lam=lam, convention=convention, progress=progress,
        read_ahead=STORED_READ_AHEAD,
    )  # fmt: skip


def run_factor_tasks(
    source, L, todo, shift, lam, convention, policy, scheduler, n_threads, wide, progress
) -> tuple[tuple, dict[str, float]]:
    """Run the factor's ``todo`` tile tasks on ``scheduler`` ("dask" or threads), each
    reading its Gram tiles from ``source``, with the same fixed BLAS width in both
    executors: (the tiles computed now, the jitter of every diagonal tile, read from the
    markers so that earlier runs' tiles count too)."""

    width = tile_blas_threads(wide)
    try:
        if scheduler == "dask":
            records = _run_dask(
                source, L, todo, shift, lam, convention, policy, progress, width, task=_tile_task
            )
        else:
            nthreads = factor_threads(n_threads)
            records = _run_threads(
                source, L, todo, shift, lam, convention, policy, nthreads,
                blas_threads=width, progress=progress, task=_tile_task,
            )  # fmt: skip
    finally:
        release_direct_buffers()  # the aligned write buffers (a tile each) are not kept
    computed = tuple(tuple(r["tile"]) for r in records if r["computed"])
    jit: dict[str, float] = {}
    if policy is not None:
        for j in range(L.grid.n_row_blocks):
            rec = L.markers.record((j, j)) or {}
            if rec.get("jitter"):
                jit[f"{j}.{j}"] = float(rec["jitter"])
    return computed, jit


def load_factor(store: str, name: str = "chol") -> CholeskyFactor:
    """Reopen a finished factor written by :func:`tile_cholesky` (all tiles marked)."""
    import zarr

    arr = zarr.open_array(store=str(store), path=name, mode="r", zarr_format=3)
    a = dict(arr.attrs)
    if "inplace_factor" in a:  # keep_gram=False: the factor replaced the Gram's tiles
        a = {**a, **a["inplace_factor"]}
    cls = InPlaceFactorArray if "inplace_factor" in dict(arr.attrs) else TiledArray
    L = cls(
        str(store),
        name,
        tuple(arr.shape),
        int(a["block_size"]),
        np.dtype(arr.dtype).str,
        a["fingerprint"],
    )
    missing = pending(L.markers, L.grid.lower_tiles())
    if missing:
        raise IncompleteArrayError(
            str(store),
            name,
            missing,
            L.grid.n_lower_tiles(),
            message=f"factor {name!r} in {store!r} is incomplete ({len(missing)} tiles missing, "
            f"first {missing[:3]}); rerun tile_cholesky to finish it",
        )
    return CholeskyFactor(
        L=L,
        lam=float(a["lambda"]),
        convention=a["convention"],
        shift=float(a["shift"]),
        jitter=dict(a.get("jitter") or {}),
    )
