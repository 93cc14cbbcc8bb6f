"""Overlap tile I/O with tile compute: read-ahead of input tiles, write-behind of results.

A tile thread that reads or writes its own tiles leaves its core idle while it
waits on the disk. :class:`TileIO` moves both sides to background threads:

- ``read(key)`` returns a tile that a small pool read ahead, following the
  order the caller announced; at most ``depth`` tiles are read ahead, so the
  extra memory is bounded whatever the matrix size;
- ``write(key, tile, fn)`` queues ``fn(tile)`` (a region write followed by its
  completion marker) on **one** writer thread, so writes finish in the order
  they were queued, and returns a future that is done when that write is. A
  queued tile stays readable through ``pending(key)`` until it is written. At
  most ``max_pending`` writes wait; a producer blocks beyond that, which bounds
  memory.

``close()`` waits for every queued write and re-raises the first error of the
writer. Only completed writes have markers, so a killed process loses queued
tiles, never marks an unwritten one.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Hashable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from pipeline.storage.waits import cap_store_waits_if_interrupted

__all__ = ["TileIO"]


class TileIO:
    """Read-ahead and ordered write-behind for tile tasks (see module docstring).

    Parameters
    ----------
    reader : callable, optional
        ``reader(key) -> ndarray``: reads one input tile (None: writes only).
    order : iterable of keys
        The order in which input tiles will probably be asked for.
    depth : int
        How many tiles to read ahead (0 disables read-ahead).
    max_pending : int
        How many finished tiles may wait for the writer (0: write synchronously).
    """

    def __init__(
        self,
        reader: Callable[[Hashable], np.ndarray] | None = None,
        order: Iterable[Hashable] = (),
        *,
        depth: int = 2,
        max_pending: int = 2,
        read_threads: int = 2,
    ) -> None:
        self._reader = reader
        self._order = collections.deque(order)
        self._depth = max(0, int(depth))
        self._ahead: dict[Hashable, Future] = {}
        self._lock = threading.Lock()
        self._pool = (
            ThreadPoolExecutor(max(1, read_threads), thread_name_prefix="tile-read")
            if self._depth and reader is not None
            else None
        )
        self._max_pending = max(0, int(max_pending))
        self._pending: dict[Hashable, np.ndarray] = {}
        self._queue: collections.deque[tuple[Hashable, Any, Callable, Future]] = collections.deque()
        self._cv = threading.Condition()
        self._closing = False
        self._error: BaseException | None = None
        self._writer = None
        if self._max_pending:
            self._writer = threading.Thread(target=self._write_loop, name="tile-write", daemon=True)
            self._writer.start()
        self._fill()

    # ----------------------------------------------------------------- reads
    def _fill(self) -> None:
        if self._pool is None:
            return
        with self._lock:
            while self._order and len(self._ahead) < self._depth:
                key = self._order.popleft()
                if key not in self._ahead:
                    self._ahead[key] = self._pool.submit(self._reader, key)

    def read(self, key: Hashable) -> np.ndarray:
        """The input tile ``key``: read ahead if it was, else read now."""
        with self._lock:
            fut = self._ahead.pop(key, None)
            if fut is None:
                try:  # asked for out of order: no need to read it ahead later
                    self._order.remove(key)
                except ValueError:
                    pass
        self._fill()
        tile = fut.result() if fut is not None else self._reader(key)
        self._fill()
        return tile

    # ---------------------------------------------------------------- writes
    def write(self, key: Hashable, tile: Any, fn: Callable[[Any], Any]) -> Future:
        """Queue ``fn(tile)``; ``pending(key)`` returns ``tile`` until it has run. The
        future is done when it has (it holds the write's error, or the earlier write's
        error that cancelled it)."""
        self.raise_error()
        done: Future = Future()
        if not self._max_pending:
            fn(tile)
            done.set_result(None)
            return done
        with self._cv:
            while len(self._queue) >= self._max_pending and self._error is None:
                self._cv.wait()
            self.raise_error()
            self._pending[key] = tile
            self._queue.append((key, tile, fn, done))
            self._cv.notify_all()
        return done

    def pending(self, key: Hashable) -> np.ndarray | None:
        """A queued tile not yet written, or None."""
        with self._cv:
            return self._pending.get(key)

    def _write_loop(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._closing:
                    self._cv.wait()
                if not self._queue:
                    return
                key, tile, fn, done = self._queue[0]
            try:
                fn(tile)
            except BaseException as e:  # handed to the producer and every queued write
                with self._cv:
                    self._error = e
                    for *_, queued in self._queue:
                        queued.set_exception(e)
                    self._queue.clear()
                    self._pending.clear()
                    self._cv.notify_all()
                return
            with self._cv:
                self._queue.popleft()
                self._pending.pop(key, None)
                self._cv.notify_all()
            done.set_result(None)

    def raise_error(self) -> None:
        """Re-raise the writer's error, if it had one."""
        if self._error is not None:
            raise self._error

    def close(self, raise_error: bool = True) -> None:
        """Stop reading ahead, finish the queued writes (finished tiles are kept), and
        re-raise the writer's error unless ``raise_error`` is False."""
        with self._cv:
            self._closing = True
            self._cv.notify_all()
        if self._writer is not None:
            self._writer.join()
        if self._pool is not None:
            with self._lock:
                for fut in self._ahead.values():
                    fut.cancel()
                self._ahead.clear()
            self._pool.shutdown(wait=True)
        if raise_error:
            self.raise_error()

    def __enter__(self) -> TileIO:
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        # an error in the caller: still write what was finished, keep the caller's error;
        # an interrupt: the queued writes give up in seconds on a store that does not answer
        cap_store_waits_if_interrupted(exc)
        self.close(raise_error=exc_type is None)
