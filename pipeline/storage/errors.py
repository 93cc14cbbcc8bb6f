"""Typed storage errors that callers (the stage runner, the CLI) act on.

:class:`~pipeline.storage.CorruptTileError` (a stored tile fails its
checksum, or its chunk cannot be read) lives in :mod:`pipeline.storage.arrays`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class ForeignPathError(ValueError):
    """A path the pipeline would write holds something it did not create.

    The pipeline never deletes or overwrites such a path, whatever ``overwrite``
    says. ``path`` names it.
    """

    def __init__(self, path: str, what: str, fix: str | None = None) -> None:
        self.path = str(path)
        self.what = what
        fix = fix or (
            f"Choose another path, or move or remove {self.path!r} yourself if you "
            "no longer need it"
        )
        super().__init__(
            f"{self.path!r} exists and is {what}, not an array krr-pipeline created; it never "
            f"deletes or overwrites what it did not create (not even with overwrite=True). {fix}."
        )

    def __reduce__(self):
        return (type(self), (self.path, self.what))


class IncompleteArrayError(ValueError):
    """A stored array that should be complete lacks completion records for some tiles.

    Attributes
    ----------
    store, name : str
        The store root and the array name.
    missing : tuple of tuple of int
        The tiles without a completion record (under the array's fingerprint).
    n_tiles : int or None
        How many tiles the array should have.
    """

    def __init__(
        self,
        store: str,
        name: str,
        missing: Iterable[Any],
        n_tiles: int | None = None,
        message: str | None = None,
    ) -> None:
        self.store = str(store)
        self.name = name
        self.missing = tuple(tuple(int(t) for t in m) for m in sorted(missing))
        self.n_tiles = None if n_tiles is None else int(n_tiles)
        self.message = message
        of = "" if self.n_tiles is None else f" of {self.n_tiles}"
        super().__init__(
            message
            or (
                f"array {name!r} in store {self.store!r} is incomplete: {len(self.missing)}{of} "
                f"tiles have no completion record (first: {list(self.missing[:5])}); rerun the "
                "step that builds it (`krr run` does this by itself when the store belongs to "
                "one of its stages)"
            )
        )

    def __reduce__(self):  # picklable across Dask workers despite the custom __init__
        return (type(self), (self.store, self.name, self.missing, self.n_tiles, self.message))


class TileRewriteError(RuntimeError):
    """A caller tried to rewrite a tile that is already marked complete with other bytes.

    A completed tile is final: it is never rewritten in place. To recompute one
    (e.g. a corrupt tile), remove its marker first
    (:meth:`~pipeline.storage.TileMarkers.unmark`). This error means a caller
    broke that rule (a bug), or a tile task is not deterministic.
    """

    def __init__(self, store: str, name: str, tile: tuple[int, ...]) -> None:
        self.store = str(store)
        self.name = name
        self.tile = tuple(int(t) for t in tile)
        super().__init__(
            f"tile {self.tile} of array {name!r} in store {self.store!r} is already marked "
            "complete with other bytes; a completed tile is never rewritten in place. Unmark it "
            f"first (TileMarkers(store, {name!r}, fingerprint).unmark({self.tile})) to recompute it"
        )

    def __reduce__(self):
        return (type(self), (self.store, self.name, self.tile))
