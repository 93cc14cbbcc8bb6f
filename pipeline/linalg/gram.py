"""Out-of-core Gram matrices: one Dask task per tile, written straight into Zarr.

:func:`build_gram` builds K(X, X) (array ``"gram"``, lower tiles ``j <= i`` only;
``K_ij = K_ji.T`` above) or, with ``Z``, the rectangular K(X, Z) (array ``"cross"``),
checkpointed per tile: a rerun after a crash computes only the unmarked tiles. Its
fingerprint (:func:`gram_fingerprint`) leaves λ out: one Gram serves every λ.
:func:`open_gram` reopens a stored Gram for readers; :func:`read_sym_tile` gives any
tile of the symmetric matrix.

Each row block of X (:func:`pipeline.storage.inputs.as_row_blocks`) is one key,
computed once and shared by the tile tasks. Tile ``(i, j)`` is one task that
evaluates the kernel on blocks ``i`` and ``j``, writes its chunk and then its marker
(:meth:`TiledArray.write_tile`), and returns a tiny status tuple, never the tile.
Tiles already marked are not in the graph. It runs through
:func:`pipeline.engine.parallel.compute` (the active client, else threads with BLAS
at one thread).
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

import pipeline.constants as C
from pipeline.blas_guard import gram_t_identity
from pipeline.engine import task_threads
from pipeline.engine.evaluators import evaluation_identity, is_fused
from pipeline.engine.input_checks import validate_and_fingerprint
from pipeline.engine.parallel import compute
from pipeline.engine.passes import KernelSource, pending, store_graph
from pipeline.engine.where import in_this_process, runs_here, tile_entries, weigh
from pipeline.errors import NonFiniteKernelError, StoreNotWritableError
from pipeline.kernels import Kernel, kernel_fingerprint, make_kernel
from pipeline.storage import TiledArray, fingerprint_obj, open_tiled_array
from pipeline.storage.inputs import as_row_blocks, check_block_size
from pipeline.storage.location import check_writable
from pipeline.storage.rawchunks import release_direct_buffers

__all__ = [
    "GramBuildStats",
    "StoreNotWritableError",
    "build_gram",
    "gram_fingerprint",
    "open_gram",
    "read_sym_tile",
]


#: evaluation dtype of a Gram's tiles when the caller names none: float64 values
#: (float32 rows are the user's values, not a precision), cast to the stored dtype
DEFAULT_KERNEL_DTYPE = "float64"


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
    kernel_dtype: str | None = None,
) -> str:
    """Fingerprint of K(X, X) (or K(X, Z)) as stored: X hash, kernel (spec and classes), block,
    dtype, and the evaluation dtype of the fused engine that computed the tiles.

    ``kernel_dtype`` None is :func:`build_gram`'s default, ``"float64"``. A store
    written by the kernel object's own evaluation (other bits) has no ``kernel_dtype``
    in its fingerprint, so it is recomputed or refused, never mixed with fused tiles.
    """
    if kernel_dtype is None:
        kernel_dtype = DEFAULT_KERNEL_DTYPE
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
    obj["kernel_dtype"] = str(kernel_dtype)
    obj.update(evaluation_identity(k, kernel_dtype))  # the engine's exp
    if not is_fused(k):  # the kernel object's own tiles: X Xᵀ in SYRK panels past them
        obj.update(gram_t_identity(block_size))
    return fingerprint_obj(obj)


def open_gram(store: str | os.PathLike, name: str = "gram") -> TiledArray:
    """Reopen a Gram array written by :func:`build_gram` (read its metadata only)."""
    import zarr

    store = os.fspath(store)
    try:
        arr = zarr.open_array(store=store, path=name, mode="r", zarr_format=3)
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


_DISK_FULL = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC), errno.EFBIG}


def _write(handle: TiledArray, i: int, j: int, tile: np.ndarray, **info: Any) -> None:
    """Write and mark tile (i, j), past the page cache where the store allows it
    (:data:`~pipeline.constants.GRAM_WRITES_PAST_PAGE_CACHE`: its reader, the
    factorisation, reads each tile once); a full disk is explained (completed tiles
    stay valid). A float32 diagonal tile whose diagonal overflowed is refused: for a
    Mercer kernel every entry is at most the largest diagonal one, so this O(b) check
    catches the tiles a float32 store turned into inf (build_gram returned normally)."""
    if i == j and tile.dtype == np.float32 and not np.isfinite(np.diagonal(tile)).all():
        raise NonFiniteKernelError(  # (a ValueError)
            f"Gram tile ({i}, {i}) overflows float32 storage: its kernel values exceed "
            f"{np.finfo(np.float32).max:.3g} (e.g. a high polynomial degree on large "
            "features). Store the Gram in float64 (dtype='float64'; KernelRidge: "
            "factor_dtype='float64'), or standardise X, or lower the degree or gamma"
        )
    try:
        handle.write_tile(i, j, tile, direct=bool(C.GRAM_WRITES_PAST_PAGE_CACHE), **info)
    except OSError as exc:
        if exc.errno in _DISK_FULL:
            raise OSError(
                exc.errno,
                f"disk full while writing tile ({i}, {j}) of {handle.name!r} to store "
                f"{handle.store!r} ({exc}). Tiles already marked complete stay valid: free "
                "space (or choose another store) and rerun build_gram to resume.",
            ) from exc
        raise


def tile_graph(
    handle: TiledArray,
    kernel: Kernel,
    X: da.Array,
    Z: da.Array | None,
    tiles: list[tuple[int, int]],
    run_id: str,
    *,
    kernel_dtype: str | None = None,
    tile_eval: str | None = None,
) -> Delayed:
    """The Dask graph that computes and writes ``tiles`` (one engine task each).

    A specification on the tile engine (:func:`pipeline.engine.passes.store_graph`):
    source = the kernel from X's row blocks, evaluated by the fused evaluators
    in ``kernel_dtype`` (default float64; the kernel object's own code only for
    kernels they do not know, or with ``tile_eval="kernel"``), consumer = store
    and mark. Its value is the list of ``(i, j, compute_seconds)`` statuses.
    """
    if tile_eval is None:
        tile_eval = "fused"
    if kernel_dtype is None:
        kernel_dtype = DEFAULT_KERNEL_DTYPE
    source = KernelSource(
        kernel,
        kernel_dtype=kernel_dtype,
        symmetric=Z is None,
        n_threads=task_threads(len(tiles)),
        tile_eval=tile_eval,
    )
    token = tokenize(handle, run_id, tiles)
    dsk, final, deps = store_graph(
        source, handle, tiles, X, Z, run_id=run_id, name="gram", on_write=_write, token=token
    )
    return Delayed(final, HighLevelGraph.from_collections(final, dsk, dependencies=deps))


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
    kernel_dtype: str | None = None,
    defer: bool = False,
) -> TiledArray | tuple[TiledArray, GramBuildStats]:
    """Build K(X, X) (lower tiles) or K(X, Z) into a tiled Zarr v3 array, resumably.

    Parameters
    ----------
    X : array-like, path, zarr.Array, DataFrame or dask.array.Array
        Training inputs; anything :func:`pipeline.storage.inputs.as_row_blocks` accepts.
    kernel : Kernel, str or dict
        A kernel object, a scikit-learn kernel name, or a kernel spec.
    store : str or os.PathLike
        Store root (local directory or fsspec URL).
    block_size : int
        Tile edge (>= 1); X is read in row blocks of this size.
    dtype : {"float64", "float32"}
        Stored dtype. Tiles are evaluated in ``kernel_dtype`` and then cast.
    Z : optional
        Second input set: build the rectangular K(X, Z) (all tiles) instead.
    name : str, optional
        Array name in the store; default ``"gram"`` (or ``"cross"`` with Z).
    overwrite : bool
        Replace an array computed under another fingerprint instead of raising.
    compressors : optional
        Zarr compressors; None (uncompressed) is the fastest (docs/PERFORMANCE.md).
    progress : bool
        Show the progress (tiles done, rate, ETA) as the mode of
        :mod:`pipeline.engine.progress` says (a bar on a terminal, lines otherwise).
    return_stats : bool
        Also return a :class:`GramBuildStats` (tiles skipped and computed).
    x_fingerprint, z_fingerprint : str, optional
        Content fingerprints already computed by
        :func:`pipeline.engine.input_checks.validate_and_fingerprint`; given, the validation
        pass over X (or Z) is skipped.
    kernel_dtype : {"float64", "float32"}, optional
        The dtype the fused evaluators (:mod:`pipeline.engine`) evaluate the tiles
        in, before the cast to ``dtype``; part of the fingerprint. Default (None):
        float64, whatever X's dtype. Kernels the evaluators do not know are
        evaluated by the kernel object, per sub-block.
    defer : bool
        Create the array (its fingerprint and metadata) but compute no tile: for a
        factorisation in place (``keep_gram=False``) that computes each Gram tile
        from X when it needs it and replaces it by its factor tile
        (:data:`~pipeline.constants.GRAM_ON_DEMAND_IN_PLACE`). Tiles
        already stored stay and are read. The array records how its tiles are
        evaluated (``kernel_dtype``), so that
        :meth:`~pipeline.linalg.cholesky_inplace.GramTileRecomputer.for_gram`
        computes the same bits.

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
    if kernel_dtype is not None and str(kernel_dtype) not in ("float64", "float32"):
        raise ValueError(f"kernel_dtype must be 'float64' or 'float32', got {kernel_dtype!r}")
    kd = DEFAULT_KERNEL_DTYPE if kernel_dtype is None else str(kernel_dtype)
    fp = gram_fingerprint(x_fingerprint, k, block_size, dt, z_fingerprint, kd)
    check_writable(store)
    attrs = {
        "kernel": k.to_spec(),
        "x_fingerprint": x_fingerprint,
        "layout": "lower" if Zd is None else "full",
    }
    if z_fingerprint is not None:
        attrs["z_fingerprint"] = z_fingerprint
    attrs["kernel_dtype"] = kd  # how the tiles are evaluated: a recomputed tile has the same bits
    if defer and Zd is not None:
        raise ValueError("defer=True is for the symmetric Gram K(X, X) of an in-place factor")
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
    todo = [] if defer else pending(handle.markers, all_tiles)
    run_id = uuid.uuid4().hex[:12]
    statuses: list[tuple[int, int, float]] = []
    if todo:
        graph = tile_graph(handle, k, Xd, Zd, todo, run_id, kernel_dtype=kd)
        # a small build beside a cluster on this machine runs here (tiles.where)
        entries = weigh(tile_entries(grid.row_chunks(), grid.col_chunks(), todo), Xd)
        here = runs_here(entries, graph.__dask_graph__())
        try:
            with in_this_process(here):
                (statuses,) = compute(
                    graph, progress=progress, desc=name, unit="tile",
                    initial=len(all_tiles) - len(todo),
                )  # fmt: skip
        finally:
            release_direct_buffers()  # this process's aligned write buffers are not kept
        missing = pending(handle.markers, todo)
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
