"""Storage layer: the Zarr tile layout, completion markers and fingerprints.

Everything above this layer (gram, solvers, predict, stages) addresses data as
``(store_url, array_name)`` plus tile indices, and decides whether work is done
only through :class:`TileMarkers`. Nothing here imports dask at import time
(:mod:`pipeline.storage.blocks` builds verified Dask reads, importing it lazily).
"""

from pipeline.errors import CorruptFileError
from pipeline.storage.arrays import (
    CorruptTileError,
    MissingTileError,
    StoreMismatchError,
    TiledArray,
    bytes_checksum,
    normalize_store,
    open_tiled_array,
    tile_checksum,
)
from pipeline.storage.blocks import open_stored, read_all, read_blocks
from pipeline.storage.errors import ForeignPathError, IncompleteArrayError, TileRewriteError
from pipeline.storage.fingerprint import fingerprint_blocks, fingerprint_obj, same_work
from pipeline.storage.markers import TileMarkers
from pipeline.storage.tiles import TileGrid

__all__ = [
    "CorruptFileError",
    "CorruptTileError",
    "MissingTileError",
    "ForeignPathError",
    "IncompleteArrayError",
    "StoreMismatchError",
    "TileRewriteError",
    "atomic_write",
    "TileGrid",
    "TileMarkers",
    "TiledArray",
    "bytes_checksum",
    "fingerprint_blocks",
    "fingerprint_obj",
    "same_work",
    "normalize_store",
    "open_stored",
    "open_tiled_array",
    "read_all",
    "read_blocks",
    "tile_checksum",
]
