"""Out-of-core Gram matrices: one Dask task per tile, written straight into Zarr.

Public API
----------
``build_gram(X, kernel, store, block_size, dtype="float64", Z=None, ...) -> TiledArray``
    Build K(X, X) (array ``"gram"``, lower tiles ``j <= i`` only; consumers use
    ``K_ij = K_ji.T`` for ``j > i``) or, with ``Z``, the rectangular K(X, Z)
    (array ``"cross"``, every tile). Checkpointed per tile: rerunning after a
    crash (even SIGKILL) computes only the tiles without a completion marker.
    With ``return_stats=True`` it also returns :class:`GramBuildStats`.
``gram_fingerprint(x_fingerprint, kernel, block_size, dtype, z_fingerprint=None) -> str``
    The fingerprint a Gram array is stored under (λ is not part of it: one
    Gram serves every λ).
``open_gram(store, name="gram") -> TiledArray``
    Reopen a stored Gram (or cross-kernel) array from its metadata, for readers.
``read_sym_tile(gram, i, j) -> ndarray``
    Tile ``(i, j)`` of the full symmetric matrix from its lower-tile storage.
``StoreNotWritableError``
    The store path cannot be written (subclass of ValueError and PermissionError).

How the graph looks
-------------------
X arrives as a Dask array of row blocks (:func:`pipeline.io.as_row_blocks`);
each row block is one key of X's own graph, computed once and shared by every
tile task that needs it (X is never embedded per tile). Tile ``(i, j)`` is one
task that takes blocks ``i`` and ``j``, evaluates ``kernel`` on them, region
writes its Zarr chunk and then its marker (:meth:`TiledArray.write_tile`), and
returns a tiny status tuple, never the tile: the scheduler holds only X blocks
and the tiles being computed (one per thread). Tiles already marked done are not
in the graph at all. The graph runs through :func:`pipeline.parallel.compute`:
on the active distributed client if there is one, else on Dask's threaded
scheduler with BLAS held to one thread, so each thread overlaps its kernel
evaluation with the other thread's Zarr write.
"""

from __future__ import annotations

import errno
import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import dask.array as da
import numpy as np
from dask.base import tokenize
from dask.delayed import Delayed
from dask.highlevelgraph import HighLevelGraph

from pipeline.io import as_row_blocks, check_block_size, validate_and_fingerprint
from pipeline.kernels import Kernel, kernel_fingerprint, make_kernel
from pipeline.parallel import compute
from pipeline.storage import TiledArray, fingerprint_obj, open_tiled_array

__all__ = [
    "GramBuildStats",
    "StoreNotWritableError",
    "build_gram",
    "gram_fingerprint",
    "open_gram",
    "read_sym_tile",
]


class StoreNotWritableError(ValueError, PermissionError):
    """The store location cannot be created or written."""


@dataclass
class GramBuildStats:
    """What one :func:`build_gram` call did."""

    store: str
    name: str
    n_tiles: int
    n_skipped: int
    n_computed: int
    computed: list[tuple[int, int]] = field(default_factory=list)
    seconds: float = 0.0
    compute_seconds: float = 0.0
    run_id: str = ""


def gram_fingerprint(
    x_fingerprint: str,
    kernel: Kernel | str | dict,
    block_size: int,
    dtype: Any,
    z_fingerprint: str | None = None,
) -> str:
    """Fingerprint of K(X, X) (or K(X, Z)) as stored: X hash, kernel (spec and classes), block, dtype."""
    k = make_kernel(kernel)
    obj: dict[str, Any] = {
        "what": "gram" if z_fingerprint is None else "cross",
        "x": x_fingerprint,
        "kernel": kernel_fingerprint(k),
        "block_size": int(block_size),
        "dtype": np.dtype(dtype).name,
    }
    if z_fingerprint is not None:
        obj["z"] = z_fingerprint
    return fingerprint_obj(obj)


def open_gram(store: str | os.PathLike, name: str = "gram") -> TiledArray:
    """Reopen a Gram array written by :func:`build_gram` (read its metadata only)."""
    import zarr

    store = os.fspath(store)
    try:
        arr = zarr.open_array(store=store, path=name, mode="r")
    except Exception as exc:
        raise ValueError(f"no Gram array {name!r} in store {store!r}: {exc}") from exc
    attrs = dict(arr.attrs)
    if "fingerprint" not in attrs or "block_size" not in attrs:
        raise ValueError(f"array {name!r} in {store!r} was not written by build_gram")
    return TiledArray(
        store,
        name,
        tuple(arr.shape),
        int(attrs["block_size"]),
        np.dtype(arr.dtype).str,
        attrs["fingerprint"],
    )


def read_sym_tile(gram: TiledArray, i: int, j: int) -> np.ndarray:
    """Tile ``(i, j)`` of the symmetric matrix stored as lower tiles (``K_ij = K_ji.T``)."""
    return gram.read_tile(i, j) if j <= i else gram.read_tile(j, i).T


def _check_writable(store: str) -> None:
    import fsspec

    try:
        fs, root = fsspec.core.url_to_fs(store)
        fs.makedirs(root, exist_ok=True)
        probe = f"{root.rstrip('/')}/.write-probe-{uuid.uuid4().hex}"
        fs.pipe_file(probe, b"")
        fs.rm(probe)
    except OSError as exc:
        raise StoreNotWritableError(
            f"store {store!r} is not writable ({exc}); pass a directory (or fsspec URL) "
            "you can write to"
        ) from exc


_DISK_FULL = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC), errno.EFBIG}


def _tile_task(
    handle: TiledArray,
    kernel: Kernel,
    i: int,
    j: int,
    Xi: np.ndarray,
    Zj: np.ndarray,
    diag: bool,
    run_id: str,
) -> tuple[int, int, float]:
    """Compute tile (i, j), write it, mark it. Returns a tiny status, never the tile."""
    t0 = time.perf_counter()
    K = kernel(Xi) if diag else kernel(Xi, Zj)
    K = np.asarray(K, dtype=handle.dtype)
    dt = time.perf_counter() - t0
    try:
        handle.write_tile(i, j, K, run=run_id, pid=os.getpid(), compute_s=round(dt, 6))
    except OSError as exc:
        if exc.errno in _DISK_FULL:
            raise OSError(
                exc.errno,
                f"disk full while writing tile ({i}, {j}) of {handle.name!r} to store "
                f"{handle.store!r} ({exc}). Tiles already marked complete stay valid: free "
                "space (or choose another store) and rerun build_gram to resume.",
            ) from exc
        raise
    return (i, j, dt)


def _collect(statuses: list[tuple[int, int, float]]) -> list[tuple[int, int, float]]:
    return list(statuses)


def tile_graph(
    handle: TiledArray,
    kernel: Kernel,
    X: da.Array,
    Z: da.Array | None,
    tiles: list[tuple[int, int]],
    run_id: str,
) -> Delayed:
    """The Dask graph that computes and writes ``tiles`` (one task each).

    Its value is the list of ``(i, j, compute_seconds)`` statuses.
    """
    token = tokenize(handle, run_id, tiles)
    name = f"gram-tile-{token}"
    final = f"gram-done-{token}"
    kkey = f"gram-kernel-{token}"
    hkey = f"gram-handle-{token}"
    xkeys = [k[0] for k in X.__dask_keys__()]
    Y = X if Z is None else Z
    ykeys = [k[0] for k in Y.__dask_keys__()]
    dsk: dict[Any, Any] = {kkey: kernel, hkey: handle}
    for i, j in tiles:
        diag = Z is None and i == j
        dsk[(name, i, j)] = (_tile_task, hkey, kkey, i, j, xkeys[i], ykeys[j], diag, run_id)
    dsk[final] = (_collect, [(name, i, j) for i, j in tiles])
    deps = [X] if Z is None else [X, Z]
    graph = HighLevelGraph.from_collections(final, dsk, dependencies=deps)
    return Delayed(final, graph)


def build_gram(
    X: Any,
    kernel: Kernel | str | dict,
    store: str | os.PathLike,
    block_size: int,
    dtype: Any = "float64",
    Z: Any = None,
    *,
    name: str | None = None,
    overwrite: bool = False,
    compressors: Any = None,
    progress: bool = True,
    return_stats: bool = False,
    x_fingerprint: str | None = None,
    z_fingerprint: str | None = None,
) -> TiledArray | tuple[TiledArray, GramBuildStats]:
    """Build K(X, X) (lower tiles) or K(X, Z) into a tiled Zarr v3 array, resumably.

    Parameters
    ----------
    X : array-like, path, zarr.Array, DataFrame or dask.array.Array
        Training inputs; anything :func:`pipeline.io.as_row_blocks` accepts.
    kernel : Kernel, str or dict
        A kernel object, a scikit-learn kernel name, or a kernel spec.
    store : str or os.PathLike
        Store root (local directory or fsspec URL).
    block_size : int
        Tile edge (>= 1); X is read in row blocks of this size.
    dtype : {"float64", "float32"}
        Stored dtype. Tiles are evaluated in X's dtype and then cast.
    Z : optional
        Second input set: build the rectangular K(X, Z) (all tiles) instead.
    name : str, optional
        Array name in the store; default ``"gram"`` (or ``"cross"`` with Z).
    overwrite : bool
        Replace an array computed under another fingerprint instead of raising.
    compressors : optional
        Zarr compressors; None (uncompressed) is the measured fastest here.
    progress : bool
        Show a progress bar (only on a TTY).
    return_stats : bool
        Also return a :class:`GramBuildStats` (tiles skipped and computed).
    x_fingerprint, z_fingerprint : str, optional
        Content fingerprints already computed by
        :func:`pipeline.io.validate_and_fingerprint`; given, the validation
        pass over X (or Z) is skipped.

    Returns
    -------
    TiledArray or (TiledArray, GramBuildStats)

    Raises
    ------
    ValueError
        Bad ``block_size`` or ``dtype``; X not 2-D, numeric and finite (the
        message names the row block).
    StoreMismatchError
        The store holds this array under another fingerprint (other X, kernel,
        block_size or dtype) and ``overwrite`` is False.
    StoreNotWritableError
        The store cannot be written.
    OSError
        Disk full while writing (completed tiles stay valid; rerun to resume).
    """
    t_start = time.perf_counter()
    block_size = check_block_size(block_size)
    dt = np.dtype(dtype)
    if dt not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise ValueError(f"dtype must be 'float64' or 'float32', got {dtype!r}")
    k = make_kernel(kernel)
    store = os.fspath(store)
    Xd = as_row_blocks(X, block_size)
    if x_fingerprint is None:
        x_fingerprint = validate_and_fingerprint(Xd, "X")
    Zd = None
    if Z is not None:
        Zd = as_row_blocks(Z, block_size)
        if Zd.shape[1] != Xd.shape[1]:
            raise ValueError(
                f"Z has {Zd.shape[1]} features but X has {Xd.shape[1]}; they must match"
            )
        if z_fingerprint is None:
            z_fingerprint = validate_and_fingerprint(Zd, "Z")
    else:
        z_fingerprint = None
    name = name or ("gram" if Zd is None else "cross")
    n = Xd.shape[0]
    m = n if Zd is None else Zd.shape[0]
    if n == 0 or m == 0:
        raise ValueError(f"cannot build a Gram matrix of shape ({n}, {m}): X (or Z) has no rows")
    fp = gram_fingerprint(x_fingerprint, k, block_size, dt, z_fingerprint)
    _check_writable(store)
    attrs = {
        "kernel": k.to_spec(),
        "x_fingerprint": x_fingerprint,
        "layout": "lower" if Zd is None else "full",
    }
    if z_fingerprint is not None:
        attrs["z_fingerprint"] = z_fingerprint
    handle = open_tiled_array(
        store,
        name,
        (n, m),
        block_size,
        dt,
        fp,
        overwrite=overwrite,
        compressors=compressors,
        attributes=attrs,
    )
    grid = handle.grid
    all_tiles = list(grid.lower_tiles() if Zd is None else grid.tiles())
    done = handle.markers.done()
    todo = [t for t in all_tiles if t not in done]
    run_id = uuid.uuid4().hex[:12]
    statuses: list[tuple[int, int, float]] = []
    if todo:
        graph = tile_graph(handle, k, Xd, Zd, todo, run_id)
        (statuses,) = compute(graph, progress=progress, desc=f"building {name} ({len(todo)} tiles)")
        missing = set(todo) - handle.markers.done()
        if missing:
            raise RuntimeError(
                f"{len(missing)} tiles of {name!r} have no completion marker after the build "
                f"(e.g. {sorted(missing)[:3]}); rerun build_gram to complete them"
            )
    if not return_stats:
        return handle
    stats = GramBuildStats(
        store=store,
        name=name,
        n_tiles=len(all_tiles),
        n_skipped=len(all_tiles) - len(todo),
        n_computed=len(statuses),
        computed=[(int(i), int(j)) for i, j, _ in statuses],
        seconds=time.perf_counter() - t_start,
        compute_seconds=float(sum(s[2] for s in statuses)),
        run_id=run_id,
    )
    return handle, stats
