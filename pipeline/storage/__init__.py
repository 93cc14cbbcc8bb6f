"""Storage layer: the Zarr tile layout, completion markers and fingerprints.

Everything above this layer (gram, solvers, predict, stages) addresses data as
``(store_url, array_name)`` plus tile indices, and decides whether work is done
only through :class:`TileMarkers`. Nothing here imports dask.
"""

from pipeline.storage.arrays import (
    CorruptTileError,
    StoreMismatchError,
    TiledArray,
    normalize_store,
    open_tiled_array,
    tile_checksum,
)
from pipeline.storage.errors import ForeignPathError, IncompleteArrayError, TileRewriteError
from pipeline.storage.fingerprint import fingerprint_blocks, fingerprint_obj
from pipeline.storage.markers import TileMarkers
from pipeline.storage.tiles import TileGrid

__all__ = [
    "CorruptTileError",
    "ForeignPathError",
    "IncompleteArrayError",
    "StoreMismatchError",
    "TileRewriteError",
    "atomic_write",
    "TileGrid",
    "TileMarkers",
    "TiledArray",
    "fingerprint_blocks",
    "fingerprint_obj",
    "normalize_store",
    "open_tiled_array",
    "tile_checksum",
]
