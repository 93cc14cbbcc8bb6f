"""Typed storage errors that callers (the stage runner, the CLI) act on.

They are defined in :mod:`pipeline.errors` (one class per condition) and
importable from here as before, as the same classes. :func:`disk_full_at` is the
one place a full disk (ENOSPC, EDQUOT) met while writing becomes a
:class:`~pipeline.errors.DiskFullError` naming the path and the bytes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from pipeline.errors import (
    DISK_FULL_ERRNOS,
    DiskFullError,
    ForeignPathError,
    IncompleteArrayError,
    TileRewriteError,
)

__all__ = ["ForeignPathError", "IncompleteArrayError", "TileRewriteError", "disk_full_at"]


@contextlib.contextmanager
def disk_full_at(path: str, needed: int | None) -> Iterator[None]:
    """Turn a full disk (an OSError with errno ENOSPC or EDQUOT) raised inside the block
    into a :class:`~pipeline.errors.DiskFullError` that names ``path``, the ``needed``
    bytes and the bytes free on its filesystem (the system's error is its cause).

    Every local write site uses it (raw chunks, Zarr chunks, markers, the manifest,
    ``.npy`` results and prediction files). A DiskFullError raised inside (by a nested
    writer) passes unchanged.
    """
    try:
        yield
    except DiskFullError:
        raise
    except OSError as exc:
        if exc.errno in DISK_FULL_ERRNOS:
            raise DiskFullError.from_os_error(exc, str(path), needed) from exc
        raise
