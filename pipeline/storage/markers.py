"""Completion records ("markers"): a tile is done only when its marker exists.

A marker is a small JSON file written *after* the tile's bytes are stored, and it
carries the fingerprint the tile was computed under. :meth:`TileMarkers.done`
only reports markers whose fingerprint matches, so stale work from a different
input or config is never counted as complete, even if an overwrite was killed
half way.

Markers live beside the arrays, under ``{store}/_markers/{name}/``, and are
read and written through fsspec, so a store may be a local path or any fsspec
URL.
"""

from __future__ import annotations

import json
import time
from typing import Any

import fsspec

from pipeline.storage.atomic import atomic_write, is_local
from pipeline.storage.fingerprint import same_work
from pipeline.storage.tempfiles import sweep_tmp_files


def _key(tile: tuple[int, ...] | int | str) -> str:
    if isinstance(tile, str):
        return tile
    if isinstance(tile, int):
        return str(tile)
    return ".".join(str(int(t)) for t in tile)


def _parse_key(key: str) -> tuple[int, ...] | str:
    try:
        return tuple(int(p) for p in key.split("."))
    except ValueError:
        return key


class TileMarkers:
    """The set of completed tiles of one stored array.

    Parameters
    ----------
    store : str
        Root of the store (local directory or fsspec URL).
    name : str
        Name of the array (or stage) the markers belong to.
    fingerprint : str
        Fingerprint the work is done under; markers with another are ignored.
    """

    def __init__(self, store: str, name: str, fingerprint: str) -> None:
        self.store = str(store)
        self.name = name
        self.fingerprint = fingerprint
        self.fs, root = fsspec.core.url_to_fs(self.store)
        self.root = f"{root.rstrip('/')}/_markers/{name}"

    def _path(self, tile: Any) -> str:
        return f"{self.root}/{_key(tile)}"

    def mark(self, tile: Any, **info: Any) -> None:
        """Record ``tile`` as complete. Call only after its data is stored."""
        record = {"fingerprint": self.fingerprint, "time": time.time(), **info}
        data = json.dumps(record).encode()
        path = self._path(tile)
        # No fsync: the rename is atomic for a killed process (the page cache
        # survives it), and on ext4 an fsync per marker flushes every dirty tile,
        # serialising compute and I/O (docs/PERFORMANCE.md#disk-and-zarr).
        atomic_write(path, data, fs=self.fs, fsync=False)

    def record(self, tile: Any) -> dict[str, Any] | None:
        """The marker's record if ``tile`` is complete under this fingerprint, else None."""
        try:
            data = self.fs.cat_file(self._path(tile))
        except FileNotFoundError:
            return None
        return self._ours(data)

    def _ours(self, data: bytes) -> dict[str, Any] | None:
        """A marker file's record if it is one under this fingerprint, else None."""
        try:
            rec = json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError):
            return None
        ok = isinstance(rec, dict) and same_work(rec.get("fingerprint"), self.fingerprint)
        return rec if ok else None

    def is_done(self, tile: Any) -> bool:
        return self.record(tile) is not None

    def done(self) -> set[tuple[int, ...] | str]:
        """All tiles complete under this fingerprint: one listing, then the markers' reads
        sent together (s3fs sends them concurrently, in batches: a resume over 800 tiles
        waits for a few batches of round trips, not 800 in a row). A marker that vanished
        since the listing is not done; a store that does not answer raises, as a single read
        does."""
        # (never a cached listing: s3fs keeps one per filesystem instance, and fsspec
        # gives each thread its own instance, so markers written by tile threads are
        # missing from a listing this thread cached before them: with s3fs 2024.12 a
        # rebuild of lost tiles then found its own markers "missing")
        self.fs.invalidate_cache(self.root)
        try:
            paths = self.fs.ls(self.root, detail=False)
        except FileNotFoundError:
            return set()
        keys = {}
        for p in paths:
            key = p.rstrip("/").rsplit("/", 1)[-1]
            if not key.endswith(".tmp"):
                keys[p] = key
        if not keys:
            return set()
        got = self.fs.cat(list(keys), on_error="return")
        out: set[tuple[int, ...] | str] = set()
        for p, key in keys.items():
            if p not in got:  # (a path the filesystem spells otherwise): read it alone
                if self.record(key) is not None:
                    out.add(_parse_key(key))
                continue
            data = got[p]
            if isinstance(data, FileNotFoundError):
                continue
            if isinstance(data, BaseException):
                raise data
            if self._ours(data) is not None:
                out.add(_parse_key(key))
        return out

    def unmark(self, tile: Any) -> bool:
        """Forget ``tile``'s completion record (whatever its fingerprint), e.g. for a
        tile found corrupt, so the next build recomputes it. Returns whether a
        record existed."""
        try:
            self.fs.rm_file(self._path(tile))
        except FileNotFoundError:
            return False
        return True

    def sweep_tmp(self) -> list[str]:
        """Remove temporary files of marker writes that a killed process left here.

        Only stale ones go (see :mod:`pipeline.storage.tempfiles`); call it when the
        array is opened, before work on it starts. Returns the paths removed.
        """
        if not is_local(self.fs):
            return []
        return sweep_tmp_files(self.root, recursive=False)

    def clear(self) -> None:
        """Forget every marker (used when a store is overwritten)."""
        self.fs.invalidate_cache(self.root)
        if self.fs.exists(self.root):
            self.fs.rm(self.root, recursive=True)
