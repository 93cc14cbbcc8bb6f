"""Verified reads of stored row-blocked arrays: the one way to read our own stores back.

:func:`read_blocks` (or :meth:`TiledArray.to_dask`) turns a row-blocked array
written with :meth:`TiledArray.write_tile` (ingest's ``X_train``/``y_train``,
prediction blocks) into a Dask array whose chunk tasks call
:meth:`TiledArray.read_block`: every block is checked against the CRC-32C in its
completion record, and a block without one is an error naming the array and the
block, never zeros. ``dask.array.from_zarr`` on these stores checks nothing; do
not use it for them.

:func:`open_stored` reopens such an array from its metadata alone. Dask is
imported lazily: the rest of the storage layer does not need it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import zarr

from pipeline.errors import IncompleteArrayError
from pipeline.storage.arrays import TiledArray, _read_row_block, normalize_store

__all__ = ["as_dask", "open_stored", "read_all", "read_blocks"]


def open_stored(store: str, name: str) -> TiledArray:
    """The handle of an array written through :func:`open_tiled_array` (metadata only).

    Raises
    ------
    IncompleteArrayError
        No such array (a ValueError).
    ValueError
        An array without the ``fingerprint``/``block_size``
        attributes that :func:`open_tiled_array` records.
    """
    store = normalize_store(store)
    try:
        arr = zarr.open_array(store=store, path=name, mode="r", zarr_format=3)
    except Exception as exc:  # a ValueError that recovery sees: the owner stage rebuilds it
        raise IncompleteArrayError(
            store, name, (), message=f"no stored array {name!r} in store {store!r}: {exc}"
        ) from exc
    attrs = dict(arr.attrs)
    if "fingerprint" not in attrs or "block_size" not in attrs:
        raise ValueError(
            f"array {name!r} in store {store!r} was not written through open_tiled_array "
            "(no fingerprint/block_size attributes), so its blocks cannot be verified"
        )
    return TiledArray(
        store,
        name,
        tuple(int(s) for s in arr.shape),
        int(attrs["block_size"]),
        np.dtype(arr.dtype).str,
        attrs["fingerprint"],
    )


def as_dask(arr: TiledArray, *, row_keys: bool = False) -> Any:
    """See :meth:`TiledArray.to_dask`."""
    return arr.to_dask(row_keys=row_keys)


def read_blocks(store: str, name: str, *, row_keys: bool = False) -> Any:
    """Stored row-blocked array ``store/name`` as a Dask array with verified chunk tasks.

    Raises (when computed) :class:`~pipeline.storage.CorruptTileError` for a
    damaged block and :class:`~pipeline.storage.arrays.MissingTileError` for a
    block without a completion record, each naming the array and the block.
    """
    return as_dask(open_stored(store, name), row_keys=row_keys)


def read_all(store: str, name: str, *, row_keys: bool = False) -> np.ndarray:
    """The whole stored row-blocked array in memory, every block verified (no Dask)."""
    arr = open_stored(store, name)
    n_blocks = arr.grid.n_row_blocks if arr.shape[0] else 0
    blocks = [
        _read_row_block(arr, i, (i,) if row_keys else (i, 0), len(arr.shape))
        for i in range(n_blocks)
    ]
    if not blocks:
        return np.zeros(arr.shape, dtype=arr.dtype)
    return np.concatenate(blocks, axis=0)
