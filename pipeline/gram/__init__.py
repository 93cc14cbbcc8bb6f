"""Out-of-core Gram matrices in tiled Zarr, checkpointed per tile.

Stable public names: ``build_gram``, ``gram_fingerprint``, ``open_gram``,
``read_sym_tile``, ``GramBuildStats``, ``StoreNotWritableError``. Layout: array
``"gram"`` holds K(X, X) as lower tiles (``j <= i``); ``"cross"`` holds K(X, Z).
"""

from pipeline.gram.build import (
    GramBuildStats,
    StoreNotWritableError,
    build_gram,
    gram_fingerprint,
    open_gram,
    read_sym_tile,
    tile_graph,
)

__all__ = [
    "GramBuildStats",
    "StoreNotWritableError",
    "build_gram",
    "gram_fingerprint",
    "open_gram",
    "read_sym_tile",
    "tile_graph",
]
