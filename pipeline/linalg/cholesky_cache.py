"""Per-process cache of finished (immutable) factor tiles of the tile Cholesky.

A factor tile's key includes the factor's fingerprint, so a cached tile is never
stale; an LRU under a byte budget (``KRR_TILE_CACHE_BYTES``, 1 GiB by default)
keeps the recently used ones, and the solves right after a factorisation reuse them.
An evicted tile that nothing else holds gives its memory to the next tile read
(:mod:`pipeline.storage.buffers`, at most ``TILE_BUFFER_POOL_BYTES`` waiting).
"""

from __future__ import annotations

import collections
import contextlib
import os
import sys
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

import pipeline.constants as C
from pipeline.constants import TILE_BUFFER_POOL_BYTES
from pipeline.engine import blas as gil_free_blas
from pipeline.engine.tile_io import TileIO
from pipeline.storage import TiledArray
from pipeline.storage import buffers as tile_buffers
from pipeline.storage.rawchunks import chunk_layout, release_direct_buffers


class _TileCache:
    """Thread-safe LRU of finished (immutable) tiles under a byte budget."""

    def __init__(self, budget: int) -> None:
        self.budget = int(budget)
        self.nbytes = 0
        self._d: collections.OrderedDict[Any, np.ndarray] = collections.OrderedDict()
        self._lock = threading.Lock()
        # evicted tiles a task still held: their buffers go to the next reads once freed
        self._held: list[np.ndarray] = []

    def get(self, key: Any) -> np.ndarray | None:
        with self._lock:
            arr = self._d.get(key)
            if arr is not None:
                self._d.move_to_end(key)
            return arr

    def put(self, key: Any, arr: np.ndarray) -> None:
        if arr.nbytes > self.budget:
            return
        spare: list[np.ndarray] = []
        with self._lock:
            old = self._d.pop(key, None)
            if old is not None:
                self.nbytes -= old.nbytes
            self._d[key] = arr
            self.nbytes += arr.nbytes
            while self.nbytes > self.budget and self._d:
                _, ev = self._d.popitem(last=False)
                self.nbytes -= ev.nbytes
                # held by nothing else (``ev`` and getrefcount's argument: 2), so no task
                # reads it: its memory goes to the next tile read instead of fresh pages
                if sys.getrefcount(ev) == 2:
                    spare.append(ev)
                elif C.RECYCLE_HELD_EVICTIONS:  # a task reads it: once it is done
                    self._held.append(ev)
            ev = None
            if self._held:
                spare += self._released_held()
        for ev in spare:
            tile_buffers.give(ev, TILE_BUFFER_POOL_BYTES)

    def _released_held(self) -> list[np.ndarray]:
        """The evicted tiles that no task holds any more, taken out of ``_held`` (see
        :data:`~pipeline.constants.RECYCLE_HELD_EVICTIONS`); those still held
        stay, up to the buffer pool's budget (beyond it they are forgotten, and freed
        with their last reader). Under the lock."""
        spare: list[np.ndarray] = []
        kept: list[np.ndarray] = []
        kept_bytes = 0
        while self._held:
            h = self._held.pop()
            if sys.getrefcount(h) == 2:  # ``h`` and getrefcount's argument
                spare.append(h)
            elif kept_bytes + h.nbytes <= TILE_BUFFER_POOL_BYTES:
                kept.append(h)
                kept_bytes += h.nbytes
            h = None
        kept.reverse()
        self._held = kept
        return spare

    def drop(self, prefix: tuple) -> None:
        """Forget every entry whose key starts with ``prefix``, and the evicted tiles
        waiting for their last reader (``_held``: none is a cache entry any more)."""
        n = len(prefix)
        with self._lock:
            self._held = []
            for key in [k for k in self._d if k[:n] == prefix]:
                self.nbytes -= self._d.pop(key).nbytes

    def clear(self) -> None:
        with self._lock:
            self._d.clear()
            self._held = []
            self.nbytes = 0


DEFAULT_CACHE_BYTES = int(os.environ.get("KRR_TILE_CACHE_BYTES", 1 << 30))
_CACHE = _TileCache(DEFAULT_CACHE_BYTES)


def set_tile_cache_budget(nbytes: int) -> None:
    """Set this process's factor-tile cache budget in bytes (0 disables it)."""
    _CACHE.budget = int(nbytes)
    if nbytes <= 0:
        _CACHE.clear()


def release_tile_cache(factor: Any = None) -> None:
    """Free this process's cached factor tiles: those of ``factor``, or all (None), and
    the evicted tiles' buffers kept for reuse (:mod:`pipeline.storage.buffers`)."""
    tile_buffers.release()
    if factor is None:
        _CACHE.clear()
        return
    L = getattr(factor, "L", factor)
    _CACHE.drop((L.store, L.name, L.fingerprint))


def release_worker_tiles(L: TiledArray) -> int:
    """In a worker process, after factorisation ``L``: :func:`release_tile_cache` for it
    (its cached tiles and the spare tile buffers) and the aligned write buffer
    (:data:`~pipeline.constants.RELEASE_WORKER_TILES`). Returns the cached bytes
    left (other factors' tiles)."""

    release_tile_cache(L)
    release_direct_buffers()
    return _CACHE.nbytes


def _cache_key(arr: TiledArray, i: int, j: int) -> tuple:
    return (arr.store, arr.name, arr.fingerprint, i, j)


_MAPPED = threading.local()


@contextlib.contextmanager
def mapped_factor_reads(on: bool = True) -> Iterator[None]:
    """Inside (this thread): a factor tile missing from the cache is mapped from its
    file (:meth:`TiledArray.map_tile`: the page cache's pages, which the processes of a
    host share) instead of copied into new memory. For tasks in worker processes, whose
    factor tiles are written through the page cache by other processes
    (:data:`~pipeline.constants.HOST_SHARED_FACTOR_TILES`)."""
    prev = getattr(_MAPPED, "on", False)
    _MAPPED.on = bool(on)
    try:
        yield
    finally:
        _MAPPED.on = prev


def _in_page_cache(L: TiledArray, i: int, j: int) -> bool:
    """Whether factor tile ``(i, j)`` was written through the page cache (by a task in a
    worker process: its marker says ``page_cache``). A reader in another process, such
    as the solve after a factorisation on a client, then maps it rather than copying
    it into new memory."""
    if chunk_layout(L.store, L.name) is None:  # nothing to map (an object store, or not
        return False  # raw chunks): the storage layer decides; spare the marker a read
    return bool((L.markers.record((i, j)) or {}).get("page_cache"))


def _read_factor_tile(L: TiledArray, i: int, j: int, io: TileIO | None = None) -> np.ndarray:
    key = _cache_key(L, i, j)
    tile = _CACHE.get(key)
    if tile is None and io is not None:
        tile = io.pending(("L", i, j))  # finished, queued for writing, evicted from the cache
    if tile is None and (getattr(_MAPPED, "on", False) or _in_page_cache(L, i, j)):
        tile = L.map_tile(i, j)  # None: cut in its columns, not a local raw chunk: read
        if tile is not None:
            _CACHE.put(key, tile)
    if tile is None:
        # a task's own read (a cache miss): a new buffer is faulted in between its
        # wide BLAS calls, on every core
        touch = gil_free_blas.first_touch_between_calls()
        tile = np.ascontiguousarray(L.read_tile(i, j, first_touch=touch))
        tile.flags.writeable = False
        _CACHE.put(key, tile)
    return tile


def share_written_tile(L: TiledArray, i: int, j: int, tile: np.ndarray) -> bool:
    """After factor tile ``(i, j)`` was written through the page cache (a task in a
    worker process, :data:`~pipeline.constants.HOST_SHARED_FACTOR_TILES`): the
    cache holds the file's mapped pages instead of the task's private copy, which goes
    to the next tile read (:mod:`pipeline.storage.buffers`) rather than new memory.
    The caller must not use ``tile`` afterwards. False where the tile cannot be mapped
    (it stays cached as it is)."""

    if not C.SHARE_WRITTEN_TILES:
        return False
    mapped = L.map_tile(i, j, verify=False)  # the bytes just written and checked
    if mapped is None:
        return False
    _CACHE.put(_cache_key(L, i, j), mapped)
    # held by the caller's name and this argument (and getrefcount's): nobody reads it
    if sys.getrefcount(tile) <= 3:
        tile_buffers.give(tile, TILE_BUFFER_POOL_BYTES)
    return True
