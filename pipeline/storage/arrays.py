"""Tiled Zarr v3 arrays that carry the fingerprint of what they hold.

``open_tiled_array`` is the only way the rest of the package creates or reopens
a stored matrix. It writes the array metadata (shape, square chunks of
``block_size``, dtype, fingerprint) first; data arrives later as idempotent
region writes, each followed by a marker (see :mod:`pipeline.storage.markers`).

Each marker written by :meth:`TiledArray.write_tile` carries the CRC-32C of the
tile's stored bytes (key ``crc32c``); :meth:`TiledArray.read_tile` checks it and
raises :class:`CorruptTileError` on a mismatch, so a damaged chunk file is
detected instead of silently used.

Uncompressed arrays on a local disk (the default for Gram and factor arrays) are
read and written a whole chunk at a time as raw bytes, in Zarr's own layout
(:mod:`pipeline.storage.rawchunks`); everything else goes through Zarr.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import google_crc32c
import numpy as np
import zarr

from pipeline.errors import (  # noqa: F401  (re-exported: their old home)
    CorruptFileError,
    CorruptTileError,
    MissingTileError,
    StoreMismatchError,
)
from pipeline.storage.atomic import local_file_path
from pipeline.storage.errors import ForeignPathError, TileRewriteError, disk_full_at
from pipeline.storage.fingerprint import same_work
from pipeline.storage.location import filesystem_for, is_url
from pipeline.storage.markers import TileMarkers, _parse_key
from pipeline.storage.rawchunks import (
    chunk_layout,
    chunk_problem,
    map_chunk,
    read_chunk,
    write_chunk,
)
from pipeline.storage.tempfiles import sweep_tmp_files
from pipeline.storage.tiles import TileGrid

log = logging.getLogger("pipeline.storage")


def bytes_checksum(data: bytes) -> int:
    """CRC-32C of a byte string (a whole small file, e.g. an ``.npy``)."""
    return int(google_crc32c.value(bytes(data)))


def tile_checksum(tile: np.ndarray) -> int:
    """CRC-32C of a tile's bytes in C order (its own dtype)."""
    a = np.ascontiguousarray(tile)
    return int(google_crc32c.value(a.reshape(-1).view(np.uint8)))


#: arrays on object stores opened for tile reads and writes, by (handle, mode, thread):
#: the handle names the fingerprint, shape, tiling and dtype, so an entry stands for one
#: array's metadata; :func:`open_tiled_array` drops a path's entries when it creates the
#: array anew
_OPENED: dict[tuple, tuple[Any, zarr.Array]] = {}
_OPENED_LOCK = threading.Lock()


def _forget_opened(store: str, name: str) -> None:
    with _OPENED_LOCK:
        for key in [k for k in _OPENED if (k[0].store, k[0].name) == (store, name)]:
            del _OPENED[key]


@dataclass(frozen=True)
class TiledArray:
    """Handle to a stored tiled matrix: picklable, cheap to send to workers.

    Tasks call :meth:`zarr` to open the array where they run.
    """

    store: str
    name: str
    shape: tuple[int, ...]
    block_size: int
    dtype: str
    fingerprint: str

    @property
    def grid(self) -> TileGrid:
        n_cols = self.shape[1] if len(self.shape) > 1 else 1
        return TileGrid(self.shape[0], n_cols, self.block_size)

    @property
    def markers(self) -> TileMarkers:
        return TileMarkers(self.store, self.name, self.fingerprint)

    def zarr(self, mode: str = "r+") -> zarr.Array:
        return zarr.open_array(store=self.store, path=self.name, mode=mode, zarr_format=3)

    def _tile_zarr(self, mode: str) -> zarr.Array:
        """:meth:`zarr` for a tile's read or write. On an object store each open is a
        metadata request, so the opened array is kept (:data:`_OPENED`) and reused while
        this thread's filesystem instance for the store is the one it was opened with
        (fsspec gives each thread its own; new options or a new endpoint give a new one)."""
        if not is_url(self.store):
            return self.zarr(mode)
        fs = filesystem_for(self.store)[0]
        key = (self, mode, threading.get_ident())
        with _OPENED_LOCK:
            hit = _OPENED.get(key)
        if hit is not None and hit[0] is fs:
            return hit[1]
        arr = self.zarr(mode)
        with _OPENED_LOCK:
            if len(_OPENED) >= 256:
                _OPENED.clear()
            _OPENED[key] = (fs, arr)
        return arr

    def _coords(self, i: int, j: int) -> tuple[int, ...]:
        return (int(i),) if len(self.shape) == 1 else (int(i), int(j))

    def _region(self, arr: zarr.Array, i: int, j: int) -> tuple[slice, ...]:
        """Tile (i, j) is Zarr chunk (i, j): its columns follow the array's chunk width
        (``chunk_cols``, e.g. a whole row block of X), not ``block_size``."""
        g = self.grid
        if len(self.shape) == 1:
            return (g.row_slice(i),)
        c = int(arr.chunks[1])
        return (g.row_slice(i), slice(j * c, min((j + 1) * c, self.shape[1])))

    def read_tile(
        self,
        i: int,
        j: int = 0,
        verify: bool = True,
        *,
        first_touch: Callable[[np.ndarray], None] | None = None,
        drop_cache: bool = False,
    ) -> np.ndarray:
        """Read tile ``(i, j)``; with ``verify``, check it against its marker's checksum.

        ``first_touch(buf)`` is called on a newly allocated read buffer before the raw
        read fills it (:func:`pipeline.storage.buffers.take`); ``drop_cache``: the
        chunk file leaves the page cache once read (for a tile read once, e.g. by the
        tile Cholesky: :func:`~pipeline.storage.rawchunks.read_chunk`). Reads through
        Zarr ignore both.

        Raises
        ------
        CorruptTileError
            The tile has a completion record and its stored bytes cannot be read
            as a tile (a truncated, oversized or unreadable chunk: whatever
            ``verify`` says), or ``verify`` is True, the record carries a
            checksum, and the bytes read do not match it.
        """
        coords = self._coords(i, j)
        layout = chunk_layout(self.store, self.name)
        tile = None
        if layout is not None:
            try:
                tile = read_chunk(layout, coords, first_touch, drop_cache)
            except PermissionError:  # not damage: recomputing would not help
                raise
            except OSError as exc:  # e.g. EIO, a directory: unreadable, not merely absent
                self._raise_if_marked(i, j, f"its chunk cannot be read ({exc})", exc)
                raise
            if tile is None:  # absent (Zarr gives the fill value) or the wrong size
                problem = chunk_problem(layout, coords)
                if problem is not None:
                    self._raise_if_marked(i, j, problem)
        if tile is None:  # not raw bytes on a local disk (or not written): through Zarr
            arr = self._tile_zarr("r")
            try:
                tile = arr[self._region(arr, i, j)]
            except (ValueError, RuntimeError) as exc:  # a chunk Zarr cannot decode (torn,
                # wrong size: ValueError; a damaged zstd frame: RuntimeError)
                self._raise_if_marked(i, j, f"Zarr cannot decode its chunk ({exc})", exc)
                raise
        if verify:
            self.verify_tile(i, j, tile)
        return tile

    def map_tile(self, i: int, j: int = 0, verify: bool = True) -> np.ndarray | None:
        """Tile ``(i, j)`` mapped read-only from its chunk file (no copy, no new memory:
        the page cache's pages, shared by the processes of a host that map it), checked
        like :meth:`read_tile`; None where it cannot be mapped (not a raw chunk on a
        local disk, an edge tile cut in its columns, a missing file): read it instead.
        A tile of the last tile row maps as the first rows of its padded chunk file.

        Raises
        ------
        CorruptTileError
            ``verify`` is True, the tile's record carries a checksum, and the mapped
            bytes do not match it.
        """
        layout = chunk_layout(self.store, self.name)
        if layout is None:
            return None
        tile = map_chunk(layout, self._coords(i, j))
        if tile is not None and verify:
            self.verify_tile(i, j, tile)
        return tile

    def _raise_if_marked(
        self, i: int, j: int, reason: str, cause: BaseException | None = None
    ) -> None:
        """Raise CorruptTileError for tile (i, j) if it is marked complete (its bytes are bad)."""
        rec = self.markers.record((i, j))
        if rec is None:
            return
        crc = rec.get("crc32c")
        err = CorruptTileError(self.store, self.name, (i, j), crc, None, reason)
        raise err from cause

    def verify_tile(self, i: int, j: int, tile: np.ndarray) -> None:
        """Check ``tile`` (as read, stored dtype) against the checksum in its marker.

        A tile without a marker, or with a marker written without a checksum,
        passes unchecked.

        Raises
        ------
        CorruptTileError
            The checksums differ.
        """
        rec = self.markers.record((i, j))
        if rec is None or "crc32c" not in rec:
            return
        found = tile_checksum(np.asarray(tile, dtype=self.dtype))
        if found != int(rec["crc32c"]):
            raise CorruptTileError(self.store, self.name, (i, j), int(rec["crc32c"]), found)

    def read_block(self, i: int, j: int = 0, *, key: tuple[int, ...] | None = None) -> np.ndarray:
        """Read tile ``(i, j)`` that must be complete, verified against its marker.

        Unlike :meth:`read_tile`, a tile without a completion record (or with
        one written without a checksum) is an error, never zeros or unchecked
        bytes. ``key`` is the marker key when it is not ``(i, j)`` (prediction
        row blocks are marked ``(i,)``).

        Raises
        ------
        MissingTileError
            No completion record, one without a checksum, or a chunk that
            cannot be decoded (e.g. a truncated file).
        CorruptTileError
            The bytes read do not match the recorded checksum (also when the
            chunk file was deleted: it then reads as the fill value).
        """
        key = (int(i), int(j)) if key is None else tuple(int(k) for k in key)
        rec = self.markers.record(key)
        if rec is None:
            raise MissingTileError(self.store, self.name, key, "it has no completion record")
        if "crc32c" not in rec:
            raise MissingTileError(
                self.store, self.name, key, "its completion record carries no checksum"
            )
        try:
            tile = self.read_tile(i, j, verify=False)
        except CorruptTileError:
            raise
        except (ValueError, TypeError, RuntimeError) as exc:  # e.g. a truncated chunk file
            raise MissingTileError(
                self.store,
                self.name,
                key,
                f"its stored chunk cannot be decoded ({type(exc).__name__}: {exc})",
            ) from exc
        found = tile_checksum(np.asarray(tile, dtype=self.dtype))
        if found != int(rec["crc32c"]):
            raise CorruptTileError(self.store, self.name, key, int(rec["crc32c"]), found)
        return tile

    def store_tile(self, i: int, j: int, tile: np.ndarray) -> int:
        """Region-write tile ``(i, j)`` without marking it; return the CRC-32C of the
        bytes stored (the tile cast to the stored dtype, C order). Mark it after."""
        layout = chunk_layout(self.store, self.name)
        if layout is not None:
            shape = layout.region_shape(self._coords(i, j))
            data = np.ascontiguousarray(np.broadcast_to(np.asarray(tile, dtype=self.dtype), shape))
            write_chunk(layout, self._coords(i, j), data)
        else:
            arr = self._tile_zarr("r+")
            region = self._region(arr, i, j)
            shape = tuple(s.stop - s.start for s in region)
            data = np.ascontiguousarray(np.broadcast_to(np.asarray(tile, dtype=self.dtype), shape))
            with disk_full_at(self._array_path(), data.nbytes):
                arr[region] = data
        return tile_checksum(data)

    def _array_path(self) -> str:
        """Where the array's chunks go, for messages (a full disk names it)."""
        return f"{str(self.store).rstrip('/')}/{self.name}"

    def to_dask(self, *, row_keys: bool = False) -> Any:
        """The stored row-blocked array as a Dask array whose tasks verify every block.

        Each chunk task calls :meth:`read_block`, so a damaged block raises
        :class:`CorruptTileError` and a block without a completion record raises
        :class:`MissingTileError`, naming the array and the block. The array
        must have one chunk column (row blocks, e.g. ingest's ``X_train``).
        ``row_keys``: blocks are marked ``(i,)`` instead of ``(i, 0)``.
        """
        import dask.array as da
        from dask.base import tokenize

        z = self.zarr("r")
        if len(self.shape) == 2 and int(z.chunks[1]) < self.shape[1]:
            raise ValueError(
                f"array {self.name!r} in {self.store!r} has {self.shape[1]} columns in chunks of "
                f"{z.chunks[1]}; a verified row-block read needs one chunk column (row blocks)"
            )
        grid = self.grid
        if self.shape[0] == 0:  # nothing stored, nothing to verify
            return da.zeros(self.shape, dtype=np.dtype(self.dtype))
        n_blocks = grid.n_row_blocks
        rows = tuple(grid.row_slice(i).stop - grid.row_slice(i).start for i in range(n_blocks))
        name = "krr-verified-read-" + tokenize(self, row_keys)
        ndim = len(self.shape)
        dsk: dict[Any, Any] = {}
        for i in range(n_blocks):
            key = (i,) if row_keys else (i, 0)
            dsk[(name, i) if ndim == 1 else (name, i, 0)] = (_read_row_block, self, i, key, ndim)
        chunks = (rows,) if ndim == 1 else (rows, (self.shape[1],))
        return da.Array(dsk, name, chunks, dtype=np.dtype(self.dtype))

    def write_tile(
        self, i: int, j: int, tile: np.ndarray, *, direct: bool = False, **marker_info: Any
    ) -> None:
        """Region-write one tile, then mark it complete (data first, marker last).

        ``direct``: a raw local chunk is written past the page cache (no reader needs
        it from there soon). The marker records the CRC-32C of the bytes written as
        ``crc32c``; the chunk is replaced atomically (an object store's put is whole
        or absent).

        A tile marked complete under this fingerprint is final: the same bytes again
        (a re-executed task) do nothing, other bytes raise :class:`TileRewriteError`;
        to recompute a tile, unmark it first (:meth:`TileMarkers.unmark`).
        """
        layout = chunk_layout(self.store, self.name)
        if layout is not None:
            shape = layout.region_shape(self._coords(i, j))
        else:
            arr = self._tile_zarr("r+")
            region = self._region(arr, i, j)
            shape = tuple(s.stop - s.start for s in region)
        data = np.ascontiguousarray(np.broadcast_to(np.asarray(tile, dtype=self.dtype), shape))
        crc = tile_checksum(data)
        rec = self.markers.record((i, j))
        if rec is not None:
            if rec.get("crc32c") is not None and int(rec["crc32c"]) == crc:
                return  # the same tile again: already stored and recorded
            raise TileRewriteError(self.store, self.name, (i, j))
        if layout is not None:
            write_chunk(layout, self._coords(i, j), data, direct=direct)
        else:
            with disk_full_at(self._array_path(), data.nbytes):
                arr[region] = data
        self.markers.mark((i, j), **marker_info, crc32c=crc)


def _read_row_block(arr: TiledArray, i: int, key: tuple[int, ...], ndim: int) -> np.ndarray:
    block = arr.read_block(i, 0, key=key)
    return block.reshape(block.shape[0], *([] if ndim == 1 else [-1]))


def normalize_store(store: Any) -> str:
    """A store location as a string; local URLs (``file://``, ``local://``) become plain
    paths (Zarr's LocalStore creates directories as it writes; its fsspec store does
    not). Other URLs go to fsspec."""

    return local_file_path(str(store))  # file://, FILE://, local://, file:/


def _chunks(shape: tuple[int, ...], block_size: int, chunk_cols: int | None) -> tuple[int, ...]:
    if len(shape) == 1:
        return (max(1, min(block_size, shape[0])),)
    cols = chunk_cols if chunk_cols is not None else block_size
    return (max(1, min(block_size, shape[0])), max(1, min(cols, shape[1])))


def open_tiled_array(
    store: str,
    name: str,
    shape: tuple[int, ...],
    block_size: int,
    dtype: Any,
    fingerprint: str,
    *,
    overwrite: bool = False,
    compressors: Any = None,
    chunk_cols: int | None = None,
    attributes: dict[str, Any] | None = None,
    fill_value: Any = 0,
) -> TiledArray:
    """Create, or reopen for resuming, a chunked array under a fingerprint.

    Parameters
    ----------
    store, name : str
        Store root (path or fsspec URL) and array path inside it.
    shape : tuple of int
        Array shape, 1-D or 2-D.
    block_size : int
        Tile edge; Zarr chunks are ``block_size`` square (columns may be set
        separately with ``chunk_cols``, e.g. for an N x outputs array).
    dtype : dtype-like
    fingerprint : str
        Hash of the inputs and config the content will be computed from.
    overwrite : bool
        If the store holds an array of ours (one this function created: it
        carries a ``fingerprint`` attribute) with another fingerprint, shape or
        layout, delete it (and its markers) instead of raising. Anything else
        at that path is never touched (see Raises).
    compressors : optional
        Zarr v3 compressors; None (uncompressed) is the fastest (docs/PERFORMANCE.md).
    attributes : dict, optional
        Extra JSON metadata stored with the array.
    fill_value : scalar
        What a chunk not written yet reads as, to a plain Zarr reader (NaN for
        predictions, so that rows not computed yet never read as plausible zeros).

    Reopening an array for resume first removes the temporary files that killed
    writers left (:mod:`pipeline.storage.tempfiles`) and unmarks lost tiles.

    Raises
    ------
    StoreMismatchError
        The store already holds ``name`` computed under another fingerprint or
        layout, and ``overwrite`` is False. Nothing is modified.
    ForeignPathError
        ``{store}/{name}`` exists and is not an array this function created (a
        file, a non-empty directory, a Zarr group, a Zarr array without our
        fingerprint attribute), whatever ``overwrite`` says. Nothing is modified.
    """
    store = normalize_store(store)
    shape = tuple(int(s) for s in shape)
    dtype = np.dtype(dtype)
    chunks = _chunks(shape, block_size, chunk_cols)
    handle = TiledArray(str(store), name, shape, int(block_size), dtype.str, fingerprint)
    existing = _existing_array(str(store), name)
    if existing is not None:
        old_fp = existing.attrs.get("fingerprint")
        same = (
            same_work(old_fp, fingerprint)
            and tuple(existing.shape) == shape
            and tuple(existing.chunks) == chunks
            and np.dtype(existing.dtype) == dtype
            and existing.attrs.get("block_size") == int(block_size)  # (its readers use it)
        )
        if same:
            # reopened for resume: before any work, drop what killed writers left
            sweep_tmp_files(_local_path(str(store), name))
            handle.markers.sweep_tmp()
            unmark_lost_tiles(handle)
            return handle
        if not overwrite:
            raise StoreMismatchError(
                f"store {store!r} already holds {name!r} computed from other inputs or config "
                f"(fingerprint {old_fp}, shape {tuple(existing.shape)}, chunks "
                f"{tuple(existing.chunks)}, dtype {existing.dtype}); this run needs fingerprint "
                f"{fingerprint}, shape {shape}, chunks {chunks}, dtype {dtype}. "
                "Use another store path, or remove that array if you no longer need it. "
                "Calling a function that takes overwrite= (build_gram, predict, "
                "open_tiled_array)? pass overwrite=True to replace the array. "
                "KernelRidge(store=...) gives each distinct fit its own subdirectory of the "
                "store and has no such parameter."
            )
    # stale markers first: after this point nothing in an old array counts as done (also
    # when the array itself was deleted and its markers were left: they describe nothing)
    TileMarkers(str(store), name, fingerprint).clear()
    attrs = {"fingerprint": fingerprint, "block_size": int(block_size), **(attributes or {})}
    _forget_opened(str(store), name)
    zarr.create_array(
        store=str(store),
        name=name,
        shape=shape,
        chunks=chunks,
        dtype=dtype,
        compressors=compressors,
        fill_value=fill_value,
        attributes=attrs,
        # only ever replaces an array of ours (checked above) or an empty directory
        overwrite=True,
    )
    return handle


def _marker_coords(key: Any, ndim: int) -> tuple[int, ...] | None:
    """The chunk coordinates a marker key names (row blocks of predictions are marked
    ``(i,)``), or None for a key that names no chunk."""
    if not isinstance(key, tuple):
        return None
    if len(key) == ndim:
        return key
    if ndim == 2 and len(key) == 1:  # row blocks marked (i,) (predictions)
        return (key[0], 0)
    if ndim == 1 and len(key) == 2 and key[1] == 0:
        return key[:1]
    return None


def unmark_lost_tiles(handle: TiledArray) -> list[tuple[int, ...]]:
    """Unmark, in one pass, every marked tile whose chunk file is missing or has the
    wrong size; return their marker keys.

    Called when an array is reopened for resume, so a damaged run directory is
    repaired in one run. Raw chunk files on a local disk are checked by size; arrays
    on an object store by :func:`_unmark_lost_objects`; other local Zarr arrays
    (codecs) by the checksum on read.
    """
    layout = chunk_layout(handle.store, handle.name)
    if layout is None:
        if "://" in str(handle.store):
            return _unmark_lost_objects(handle)
        return []
    markers = handle.markers
    ndim = len(handle.shape)
    lost = []
    for key in markers.done():
        coords = _marker_coords(key, ndim)
        if coords is None:
            continue
        try:
            ok = layout.path(coords).stat().st_size == layout.nbytes
        except FileNotFoundError:
            ok = False
        except OSError:  # unreadable for another reason: the read reports it
            continue
        if not ok:
            markers.unmark(key)
            lost.append(key)
    if lost:
        log.warning(
            "array %r in %s: %d marked tile(s) have no chunk file (or one of the wrong size), "
            "first %s: unmarked, to be recomputed",
            handle.name,
            handle.store,
            len(lost),
            sorted(lost)[:5],
        )
    return lost


def _unmark_lost_objects(handle: TiledArray) -> list[tuple[int, ...]]:
    """:func:`unmark_lost_tiles` for an array on an object store: unmark every marked
    tile whose chunk object is missing, in one pass.

    Two listings (the chunk objects, the markers) and one read per marker whose chunk
    is missing. A missing chunk is lost unless the tile its marker records is all fill
    value (Zarr leaves such a chunk unwritten): its recorded CRC-32C says which.
    """
    markers = handle.markers
    fs, root = filesystem_for(str(handle.store))
    base = f"{root.rstrip('/')}/{handle.name}"
    fs.invalidate_cache()
    try:
        present = {str(k)[len(base) + 1 :] for k in fs.find(base)}
        names = markers.fs.ls(markers.root, detail=False)
    except FileNotFoundError:
        return []
    arr = handle.zarr("r")
    ndim = len(handle.shape)
    fill = arr.metadata.fill_value
    lost = []
    for p in names:
        name = str(p).rstrip("/").rsplit("/", 1)[-1]
        key = _parse_key(name)
        coords = _marker_coords(key, ndim)
        if name.endswith(".tmp") or coords is None:
            continue
        if arr.metadata.encode_chunk_key(coords) in present:
            continue
        rec = markers.record(key)
        if rec is None:  # another fingerprint's marker: counts for nothing already
            continue
        region = handle._region(arr, *coords, *([0] if ndim == 1 else []))
        shape = tuple(r.stop - r.start for r in region)
        blank = np.full(shape, fill, dtype=handle.dtype)
        if rec.get("crc32c") is not None and int(rec["crc32c"]) == tile_checksum(blank):
            continue  # an all-fill tile: Zarr wrote no chunk for it
        markers.unmark(key)
        lost.append(key)
    if lost:
        log.warning(
            "array %r in %s: %d marked tile(s) have no chunk object, first %s: unmarked, "
            "to be recomputed",
            handle.name,
            handle.store,
            len(lost),
            sorted(lost)[:5],
        )
    return lost


def _local_path(store: str, name: str) -> str:
    return store if "://" in store else str(Path(store) / name)


def _existing_array(store: str, name: str) -> zarr.Array | None:
    """The array ``name`` in ``store`` if it is one of ours, None if nothing is there.

    "Ours" means a Zarr array whose attributes carry the ``fingerprint`` and
    ``block_size`` that :func:`open_tiled_array` writes. An empty directory
    counts as nothing.

    Raises
    ------
    ForeignPathError
        Something else is at that path: a file, a non-empty directory that is not
        a Zarr array, a Zarr group, or a Zarr array without our attributes.
    """
    fs, root = filesystem_for(store)
    path = f"{root.rstrip('/')}/{name}"
    shown = path if "://" not in store else f"{store.rstrip('/')}/{name}"
    try:
        existing = zarr.open_array(store=store, path=name, mode="r", zarr_format=3)
    except zarr.errors.NodeTypeValidationError:
        raise ForeignPathError(shown, "a Zarr group") from None
    except (FileNotFoundError, zarr.errors.ArrayNotFoundError, KeyError):
        existing = None
    except ValueError as exc:  # e.g. an unreadable zarr.json
        raise ForeignPathError(shown, f"not a readable Zarr array ({exc})") from None
    if existing is not None:
        attrs = existing.attrs
        if "fingerprint" not in attrs or "block_size" not in attrs:
            raise ForeignPathError(shown, "a Zarr array without krr-pipeline's fingerprint")
        return existing
    if not fs.exists(path):
        return None
    if not fs.isdir(path):
        raise ForeignPathError(shown, "a file")
    if fs.ls(path, detail=False):
        raise ForeignPathError(shown, "a non-empty directory that is not a Zarr array")
    return None
