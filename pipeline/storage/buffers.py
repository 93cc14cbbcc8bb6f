"""Reused tile buffers: reads fill memory this process already touched.

On a virtual machine a fresh page costs far more than a copy
(docs/PERFORMANCE.md#known-traps). glibc hands every freed block above 32 MB straight back to the system, so a
tile read after another was freed lands in fresh pages again. :func:`take` gives a
read a buffer that an owner returned with :func:`give` (the factor-tile cache of
:mod:`pipeline.linalg.cholesky_cache` returns the tiles it evicts and no one else
holds), else a new one. At most ``max_bytes`` wait here; :func:`release` frees them.

A new buffer's first touch is the expensive part of a read, and it spreads over cores:
:func:`touch` faults a buffer's pages in on several threads, and ``take``'s
``first_touch`` lets a caller decide when and how (e.g. between two all-core BLAS
calls, on every core, rather than preempting one of their threads).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np

__all__ = ["give", "release", "take", "touch", "waiting_bytes"]

_LOCK = threading.Lock()
_FREE: dict[tuple[tuple[int, ...], str], list[np.ndarray]] = {}
_BYTES = 0


def take(
    shape: tuple[int, ...],
    dtype: np.dtype,
    first_touch: Callable[[np.ndarray], None] | None = None,
) -> np.ndarray:
    """A writable C-contiguous array of ``shape`` and ``dtype``; its contents are
    undefined (as ``np.empty``'s). ``first_touch(arr)`` is called on a new array
    (not on a reused one) before it is returned."""
    global _BYTES
    key = (tuple(int(s) for s in shape), np.dtype(dtype).str)
    with _LOCK:
        free = _FREE.get(key)
        if free:
            arr = free.pop()
            _BYTES -= arr.nbytes
            return arr
    arr = np.empty(shape, dtype=dtype)
    if first_touch is not None:
        first_touch(arr)
    return arr


def touch(arr: np.ndarray, threads: int = 1) -> None:
    """Fault ``arr``'s pages in by writing zeros over it, in ``threads`` equal parts on
    as many threads (NumPy releases the GIL for the writes). Contents become zero."""
    flat = arr.reshape(-1)  # a view: arr is C-contiguous
    n, k = flat.size, max(1, min(int(threads), flat.size or 1))
    parts = [slice(s * n // k, (s + 1) * n // k) for s in range(k)]

    def zero(part: slice) -> None:
        flat[part] = 0

    helpers = [threading.Thread(target=zero, args=(p,), name="tile-touch") for p in parts[1:]]
    for t in helpers:
        t.start()
    try:
        zero(parts[0])
    finally:
        for t in helpers:
            t.join()


def give(arr: np.ndarray, max_bytes: int) -> bool:
    """Keep ``arr`` for a later :func:`take` if at most ``max_bytes`` would then wait.

    The caller must be its only holder (no view, no other reference: it will be
    overwritten). Only arrays that own their C-contiguous memory are kept.
    """
    global _BYTES
    if arr.base is not None or not arr.flags.owndata or not arr.flags.c_contiguous:
        return False
    with _LOCK:
        if _BYTES + arr.nbytes > max_bytes:
            return False
        arr.flags.writeable = True
        _FREE.setdefault((arr.shape, arr.dtype.str), []).append(arr)
        _BYTES += arr.nbytes
    return True


def release() -> None:
    """Free every waiting buffer."""
    global _BYTES
    with _LOCK:
        _FREE.clear()
        _BYTES = 0


def waiting_bytes() -> int:
    """Bytes of the buffers waiting for a :func:`take`."""
    return _BYTES
