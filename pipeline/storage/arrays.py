"""Tiled Zarr v3 arrays that carry the fingerprint of what they hold.

``open_tiled_array`` is the only way the rest of the package creates or reopens
a stored matrix. It writes the array metadata (shape, square chunks of
``block_size``, dtype, fingerprint) first; data arrives later as idempotent
region writes, each followed by a marker (see :mod:`pipeline.storage.markers`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import zarr

from pipeline.storage.markers import TileMarkers
from pipeline.storage.tiles import TileGrid


class StoreMismatchError(ValueError):
    """An existing store holds results computed from other inputs or config."""


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
        return zarr.open_array(store=self.store, path=self.name, mode=mode)

    def read_tile(self, i: int, j: int = 0) -> np.ndarray:
        g = self.grid
        arr = self.zarr("r")
        if len(self.shape) == 1:
            return arr[g.row_slice(i)]
        return arr[g.row_slice(i), g.col_slice(j)]

    def write_tile(self, i: int, j: int, tile: np.ndarray, **marker_info: Any) -> None:
        """Region-write one tile, then mark it complete (data first, marker last)."""
        g = self.grid
        arr = self.zarr("r+")
        if len(self.shape) == 1:
            arr[g.row_slice(i)] = tile
        else:
            arr[g.row_slice(i), g.col_slice(j)] = tile
        self.markers.mark((i, j), **marker_info)


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
        If the store holds an array with another fingerprint, shape or layout,
        delete it (and its markers) instead of raising.
    compressors : optional
        Zarr v3 compressors; None (uncompressed) is the measured fastest here.
    attributes : dict, optional
        Extra JSON metadata stored with the array.

    Raises
    ------
    StoreMismatchError
        The store already holds ``name`` computed under another fingerprint or
        layout, and ``overwrite`` is False. Nothing is modified.
    """
    shape = tuple(int(s) for s in shape)
    dtype = np.dtype(dtype)
    chunks = _chunks(shape, block_size, chunk_cols)
    handle = TiledArray(str(store), name, shape, int(block_size), dtype.str, fingerprint)
    try:
        existing = zarr.open_array(store=str(store), path=name, mode="r")
    except (
        FileNotFoundError,
        zarr.errors.ArrayNotFoundError,
        KeyError,
        zarr.errors.NodeTypeValidationError,
    ):
        existing = None
    if existing is not None:
        old_fp = existing.attrs.get("fingerprint")
        same = (
            old_fp == fingerprint
            and tuple(existing.shape) == shape
            and tuple(existing.chunks) == chunks
            and np.dtype(existing.dtype) == dtype
        )
        if same:
            return handle
        if not overwrite:
            raise StoreMismatchError(
                f"store {store!r} already holds {name!r} computed from other inputs or config "
                f"(fingerprint {old_fp}, shape {tuple(existing.shape)}, chunks "
                f"{tuple(existing.chunks)}, dtype {existing.dtype}); this run needs fingerprint "
                f"{fingerprint}, shape {shape}, chunks {chunks}, dtype {dtype}. "
                "Use another store path, or pass overwrite=True to replace it."
            )
        # stale markers first: after this point nothing in the old array counts as done
        TileMarkers(str(store), name, fingerprint).clear()
    attrs = {"fingerprint": fingerprint, "block_size": int(block_size), **(attributes or {})}
    zarr.create_array(
        store=str(store),
        name=name,
        shape=shape,
        chunks=chunks,
        dtype=dtype,
        compressors=compressors,
        fill_value=0,
        attributes=attrs,
        overwrite=True,
    )
    return handle
