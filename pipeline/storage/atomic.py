"""One way to write a small file so that readers see the old bytes or the new, never half."""

from __future__ import annotations

import os
from typing import Any

import fsspec

from pipeline.storage.errors import disk_full_at
from pipeline.storage.tempfiles import tmp_path_for


def is_local(fs: Any) -> bool:
    protocol = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
    return "file" in protocol or "local" in protocol


def local_file_path(path: str) -> str:
    """A ``file://`` (or ``local://``) URL as the local path it names; anything else as is.
    (``Path("file:///data/run")`` is the relative path ``file:/data/run``.)"""
    for prefix in ("file://", "local://"):
        if path[: len(prefix)].lower() == prefix:
            return path[len(prefix) :]
    if path[:6].lower() == "file:/":  # "file:/abs": fsspec reads it as /abs, so must we
        return path[5:]
    return path


def atomic_write(path: str, data: bytes, *, fs: Any = None, fsync: bool = False) -> None:
    """Write ``data`` to ``path`` atomically.

    Local filesystems: a temporary file in the same directory
    (:func:`~pipeline.storage.tempfiles.tmp_path_for`; one left by a killed
    process is removed when its store is reopened), then ``os.replace``;
    with ``fsync=True`` the file and its directory are flushed to disk too (for
    manifests and checkpoints that must survive power loss; markers skip it,
    see :mod:`pipeline.storage.markers`). Other fsspec filesystems: one
    ``pipe_file``, which object stores apply atomically.
    """
    if fs is None:
        if "://" in path and not path.startswith("file://"):
            fs, path = fsspec.core.url_to_fs(path)  # e.g. s3://...: one PUT below
        else:
            fs = fsspec.filesystem("file")
            path = local_file_path(path)
    parent = path.rsplit("/", 1)[0]
    if not is_local(fs):
        fs.makedirs(parent, exist_ok=True)
        fs.pipe_file(path, data)
        return
    tmp = tmp_path_for(path)  # {path}.{pid}-{hex}.tmp: see pipeline.storage.tempfiles
    # a full disk names the path and the bytes (free measured with the partial file gone)
    with disk_full_at(path, len(data)):
        try:
            fs.makedirs(parent, exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(data)
                if fsync:
                    f.flush()
                    os.fsync(f.fileno())
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    if fsync:
        try:  # make the rename itself durable
            fd = os.open(parent or ".", os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError:
            pass
