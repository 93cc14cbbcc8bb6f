"""Whole-chunk reads and writes without Zarr's async pipeline, where the bytes are raw.

For an uncompressed Zarr v3 array whose only codec is ``bytes`` (little endian)
on a local store, a chunk file holds exactly the chunk's C-order bytes (edge
chunks padded to the full chunk shape with the fill value). Reading and writing
such a chunk is one ``readinto``/``write`` of a numpy buffer, several times cheaper
in CPU than Zarr's async pipeline (docs/PERFORMANCE.md#disk-and-zarr).

:func:`chunk_layout` says whether an array qualifies (and caches the answer per
``zarr.json`` version); anything else (compressed arrays, big-endian data,
sharding, fsspec stores) returns None and the caller keeps using Zarr. The
layout is Zarr's own (the chunk key comes from the array's metadata), and
tests check that Zarr reads what these functions write and vice versa.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.errors import DiskFullError  # noqa: F401  (re-exported: its old home)
from pipeline.storage import buffers as tile_buffers
from pipeline.storage.errors import disk_full_at
from pipeline.storage.tempfiles import tmp_path_for

__all__ = [
    "ChunkLayout",
    "chunk_layout",
    "chunk_problem",
    "map_chunk",
    "prefetch_chunk",
    "read_chunk",
    "release_direct_buffers",
    "write_chunk",
]


@dataclass(frozen=True)
class ChunkLayout:
    """Where and how an array's chunks lie as raw bytes on a local disk."""

    root: Path
    chunk_shape: tuple[int, ...]
    shape: tuple[int, ...]
    dtype: np.dtype
    fill_value: Any
    key_of: Any  # metadata.encode_chunk_key

    @property
    def nbytes(self) -> int:
        """Bytes of one chunk file (edge chunks are stored at full size)."""
        return int(np.prod(self.chunk_shape)) * self.dtype.itemsize

    def path(self, coords: tuple[int, ...]) -> Path:
        return self.root / self.key_of(tuple(int(c) for c in coords))

    def region_shape(self, coords: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(
            min(c, s - k * c) for k, c, s in zip(coords, self.chunk_shape, self.shape, strict=True)
        )


_CACHE: dict[tuple, ChunkLayout | None] = {}
_LOCK = threading.Lock()


def _raw_bytes_codec(meta: Any) -> bool:
    from zarr.codecs import BytesCodec
    from zarr.core.metadata.v3 import ArrayV3Metadata

    if not isinstance(meta, ArrayV3Metadata) or len(meta.codecs) != 1:
        return False
    codec = meta.codecs[0]
    if not isinstance(codec, BytesCodec):
        return False
    endian = getattr(codec.endian, "value", codec.endian)
    return endian in (None, "little")


def chunk_layout(store: str, name: str) -> ChunkLayout | None:
    """The raw layout of array ``name`` in a local ``store``, or None if Zarr must be used."""
    if "://" in str(store):
        return None
    meta_file = Path(store) / name / "zarr.json"
    try:
        st = meta_file.stat()
    except OSError:
        return None
    key = (str(store), name, st.st_mtime_ns, st.st_size, st.st_ino)
    with _LOCK:
        if key in _CACHE:
            return _CACHE[key]
    layout = _inspect(store, name)
    with _LOCK:
        if len(_CACHE) > 256:
            _CACHE.clear()
        _CACHE[key] = layout
    return layout


def _inspect(store: str, name: str) -> ChunkLayout | None:
    import zarr
    from zarr.core.chunk_grids import RegularChunkGrid

    try:
        arr = zarr.open_array(store=str(store), path=name, mode="r", zarr_format=3)
    except Exception:
        return None
    meta = arr.metadata
    dtype = np.dtype(arr.dtype)
    if (
        not _raw_bytes_codec(meta)
        or not isinstance(meta.chunk_grid, RegularChunkGrid)
        or dtype.byteorder == ">"
        or dtype.hasobject
    ):
        return None
    return ChunkLayout(
        root=Path(store) / name,
        chunk_shape=tuple(int(c) for c in meta.chunk_grid.chunk_shape),
        shape=tuple(int(s) for s in arr.shape),
        dtype=dtype,
        fill_value=meta.fill_value,
        key_of=meta.encode_chunk_key,
    )


def read_chunk(
    layout: ChunkLayout,
    coords: tuple[int, ...],
    first_touch: Callable[[np.ndarray], None] | None = None,
    drop_cache: bool = False,
) -> np.ndarray | None:
    """Chunk ``coords`` as a writable array that no one else holds (a new one, or a
    buffer given back for reuse, :mod:`pipeline.storage.buffers`; edge chunks cut to
    the array's shape), or None if its file is missing or has an unexpected size.
    ``first_touch``: see :func:`pipeline.storage.buffers.take` (called before the read).

    ``drop_cache``: once read, the file's pages leave the page cache
    (``POSIX_FADV_DONTNEED``), for a chunk its reader will not read again soon. The
    kernel frees them at once, so the next new read buffer is likely to land in those
    pages, which the VM's host already backs, rather than in free memory that the
    host must fault in again (:data:`~pipeline.constants.DROP_READ_PAGE_CACHE`).
    Where the call is missing or fails, the read is the same.
    """
    # reused memory if any waits
    buf = tile_buffers.take(layout.chunk_shape, layout.dtype, first_touch)
    try:
        with open(layout.path(coords), "rb", buffering=0) as f:
            got = f.readinto(memoryview(buf).cast("B"))
            if got != buf.nbytes or f.read(1):
                return None
            if drop_cache:
                _drop_page_cache(f.fileno())
    except FileNotFoundError:
        return None
    region = layout.region_shape(coords)
    if region == layout.chunk_shape:
        return buf
    return np.ascontiguousarray(buf[tuple(slice(0, r) for r in region)])


def map_chunk(layout: ChunkLayout, coords: tuple[int, ...]) -> np.ndarray | None:
    """Chunk ``coords`` mapped read-only from its file (``mmap``): no copy and no new
    memory, the page cache's pages themselves, shared by every process on the host that
    maps the same file. None if the file is missing, has an unexpected size, or is an
    edge chunk whose region would not be C-contiguous (cut in a dimension after the
    first: the caller reads it instead). An edge chunk cut in its first dimension only
    (the last tile row of a matrix) maps as the first rows of its padded file.

    A mapping stays valid if the file is later replaced or removed (it keeps the old
    inode), and chunks are never rewritten once marked complete.
    """
    region = layout.region_shape(coords)
    if tuple(region[1:]) != tuple(layout.chunk_shape[1:]):
        return None
    path = layout.path(coords)
    nbytes = layout.nbytes
    try:
        if os.stat(path).st_size != nbytes:
            return None
        mapped = np.memmap(path, dtype=layout.dtype, mode="r", shape=layout.chunk_shape)
    except FileNotFoundError:
        return None
    arr = mapped.view(np.ndarray)  # a plain read-only array over the mapping
    return arr if region[0] == arr.shape[0] else arr[: region[0]]  # (still C-contiguous)


def prefetch_chunk(layout: ChunkLayout, coords: tuple[int, ...]) -> None:
    """Ask the kernel to start reading chunk ``coords`` into the page cache, in the
    background (``POSIX_FADV_WILLNEED``), for a read that comes later. Advice only:
    nothing happens where the file is missing or the call is unavailable."""
    advise = getattr(os, "posix_fadvise", None)  # not on macOS or Windows
    if advise is None:
        return
    try:
        fd = os.open(layout.path(coords), os.O_RDONLY)
    except OSError:
        return
    try:
        advise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
    except OSError:
        pass
    finally:
        os.close(fd)


def _drop_page_cache(fd: int) -> None:
    """Ask the kernel to drop file ``fd``'s clean cached pages (advice: never an error)."""
    advise = getattr(os, "posix_fadvise", None)  # not on macOS or Windows
    if advise is None:
        return
    try:
        advise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    except OSError:
        pass


def chunk_problem(layout: ChunkLayout, coords: tuple[int, ...]) -> str | None:
    """Why chunk ``coords`` cannot be read as raw bytes, or None if it is absent or fine.

    Says so for a file of the wrong size (torn, truncated or oversized), a path
    that is not a regular file, or one the OS cannot read.
    """
    path = layout.path(coords)
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"its chunk file {str(path)!r} cannot be read ({exc})"
    if not path.is_file():
        return f"its chunk path {str(path)!r} is not a regular file"
    nbytes = layout.nbytes
    if st.st_size != nbytes:
        return f"its chunk file {str(path)!r} holds {st.st_size} bytes, not {nbytes}"
    return None


def write_chunk(
    layout: ChunkLayout, coords: tuple[int, ...], data: np.ndarray, *, direct: bool = False
) -> None:
    """Write ``data`` (the chunk's region of the array) as chunk ``coords``, atomically.

    The bytes go to a temporary file in the chunk's directory, which then
    replaces the chunk file (``os.replace``): a reader, or a process killed
    mid-write, sees the old chunk or the new one, never a torn one. A killed
    writer leaves only the temporary file, which the next
    :func:`~pipeline.storage.open_tiled_array` of the array removes
    (:mod:`pipeline.storage.tempfiles`). No fsync, as for markers: the page
    cache survives a killed process.

    ``direct``: write past the page cache (``O_DIRECT``, :func:`_write_direct`),
    for tiles this process keeps in memory and will not read back soon. Where the
    filesystem refuses ``O_DIRECT`` (tmpfs, some network filesystems), the
    ordinary write is used.
    """
    region = layout.region_shape(coords)
    if tuple(data.shape) != region:
        raise ValueError(f"chunk {coords} covers {region}, got data of shape {data.shape}")
    if region == layout.chunk_shape:
        out = np.ascontiguousarray(data, dtype=layout.dtype)
    else:  # Zarr stores edge chunks at full size, padded with the fill value
        out = np.full(layout.chunk_shape, layout.fill_value, dtype=layout.dtype)
        out[tuple(slice(0, r) for r in region)] = data
    path = layout.path(coords)
    tmp = tmp_path_for(str(path))
    # the views are released on every path (an unreleased one pins ``out``)
    with memoryview(out) as base, base.cast("B") as view:
        # a full disk: the path, the bytes needed and free (measured with the partial
        # file gone: the unlink below runs first)
        with disk_full_at(str(path), len(view)):
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                if not (direct and _write_direct(tmp, view)):
                    with open(tmp, "wb", buffering=0) as f:
                        written = 0
                        while written < len(view):
                            written += f.write(view[written:])
                os.replace(tmp, path)
            except BaseException:
                try:
                    os.unlink(tmp)
                except FileNotFoundError:
                    pass
                raise


# ---------------------------------------------------------------------------
# O_DIRECT writes: no page cache, so no fresh pages to fill (docs/PERFORMANCE.md#known-traps)

_ALIGN = 4096  # O_DIRECT needs the buffer, offset and length aligned to the device block
#: aligned buffers (mmap), reused so that their pages stay warm: at most _POOL_KEEP per
#: process between writes (a tile's bytes). The factorisation and the Gram stage free this
#: process's at their end (release_direct_buffers); a Dask worker keeps its one until it exits
_POOL: list[Any] = []
_POOL_KEEP = 1
_NO_DIRECT: set[int] = set()  # st_dev of filesystems that refused O_DIRECT


def _aligned_buffer(nbytes: int) -> Any:
    import mmap

    with _LOCK:
        for k, buf in enumerate(_POOL):
            if len(buf) >= nbytes:
                return _POOL.pop(k)
    return mmap.mmap(-1, -(-nbytes // _ALIGN) * _ALIGN)  # page-aligned anonymous memory


def _release_buffer(buf: Any) -> None:
    with _LOCK:
        if len(_POOL) < _POOL_KEEP:
            _POOL.append(buf)
            return
    buf.close()


def release_direct_buffers() -> None:
    """Free the aligned buffers kept for direct writes (a pass that wrote calls this at
    its end, so a long-lived process does not hold a tile's worth of memory)."""
    with _LOCK:
        bufs, _POOL[:] = list(_POOL), []
    for buf in bufs:
        buf.close()


def _write_direct(tmp: str, view: memoryview) -> bool:
    """Write ``view`` to the new file ``tmp`` with ``O_DIRECT``; False (nothing written)
    if this filesystem refuses it. The aligned head goes directly from a reused aligned
    buffer; the unaligned tail (under 4 KiB) through the page cache."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return False
    try:
        dev = os.stat(os.path.dirname(tmp) or ".").st_dev
    except OSError:
        return False
    if dev in _NO_DIRECT:
        return False
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | flag, 0o644)
    except OSError as exc:
        if exc.errno in (errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP):
            _NO_DIRECT.add(dev)
            return False
        raise
    n = len(view)
    head = n - n % _ALIGN
    buf = _aligned_buffer(max(head, _ALIGN))
    try:
        try:
            if head:
                # released on every path: a view left behind made buf.close() below raise
                # BufferError ("cannot close exported pointers exist"), which hid the real
                # error (e.g. ENOSPC)
                with memoryview(buf) as mv:
                    mv[:head] = view[:head]
                    written = 0
                    while written < head:
                        written += os.write(fd, mv[written:head])
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            _NO_DIRECT.add(dev)  # opened, but the first aligned write was refused
            os.close(fd)
            fd = -1
            os.unlink(tmp)
            return False
    finally:
        try:
            _release_buffer(buf)
        finally:  # the file is closed whatever happens to the buffer
            if fd >= 0:
                os.close(fd)
    if head < n:
        with open(tmp, "r+b", buffering=0) as f:
            f.seek(head)
            written = head
            while written < n:
                written += f.write(view[written:])
    return True
