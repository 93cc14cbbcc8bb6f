"""Reused tile buffers: reads fill memory this process already touched.

On a virtual machine a fresh page costs far more than a copy (measured on an AMD
EPYC VM: about 2 ms of CPU per MB to fault in and zero, against 0.1 ms per MB to
copy). glibc hands every freed block above 32 MB straight back to the system, so a
tile read after another was freed lands in fresh pages again. :func:`take` gives a
read a buffer that an owner returned with :func:`give` (the factor-tile cache of
:mod:`pipeline.solvers.cholesky_cache` returns the tiles it evicts and no one else
holds), else a new one. At most ``max_bytes`` wait here; :func:`release` frees them.
"""

from __future__ import annotations

import threading

import numpy as np

__all__ = ["give", "release", "take", "waiting_bytes"]

_LOCK = threading.Lock()
_FREE: dict[tuple[tuple[int, ...], str], list[np.ndarray]] = {}
_BYTES = 0


def take(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A writable C-contiguous array of ``shape`` and ``dtype``; its contents are
    undefined (as ``np.empty``'s)."""
    global _BYTES
    key = (tuple(int(s) for s in shape), np.dtype(dtype).str)
    with _LOCK:
        free = _FREE.get(key)
        if free:
            arr = free.pop()
            _BYTES -= arr.nbytes
            return arr
    return np.empty(shape, dtype=dtype)


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
