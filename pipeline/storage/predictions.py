"""Where predictions go: the output format follows the output path's extension.

- ``.zarr``: a Zarr store written row block by row block with completion
  records (resumable; see :func:`pipeline.linalg.blockwise.predict`).
- ``.npy``: one numpy array.
- ``.csv``: a header row (the model's target names, or ``y0, y1, ...``), then
  one row per prediction.
- ``.parquet``: a table with the same column names.

An unknown extension is refused by :func:`output_format` before any work,
naming it and listing the supported ones. This module imports nothing heavy,
so configuration checks can call it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from pipeline._optional import require
from pipeline.storage.errors import ForeignPathError, disk_full_at
from pipeline.storage.location import check_writable
from pipeline.storage.tempfiles import tmp_path_for

#: extension -> format name (lower-case match on the path without a trailing slash)
OUTPUT_FORMATS = {".zarr": "zarr", ".npy": "npy", ".csv": "csv", ".parquet": "parquet"}


def output_format(path: str | os.PathLike) -> str:
    """The format of an output path: ``"zarr"``, ``"npy"``, ``"csv"`` or ``"parquet"``.

    Raises
    ------
    ValueError
        The path's extension is not one of :data:`OUTPUT_FORMATS` (the message
        names it and lists the supported ones).
    """
    p = os.fspath(path).rstrip("/")
    name = p.replace("\\", "/").rsplit("/", 1)[-1]
    ext = os.path.splitext(name)[1].lower()
    if ext in OUTPUT_FORMATS:
        return OUTPUT_FORMATS[ext]
    got = f"extension {ext!r}" if ext else "no extension"
    raise ValueError(
        f"output {os.fspath(path)!r} has {got}; the output format follows the extension, one "
        f"of {sorted(OUTPUT_FORMATS)} ('.zarr': resumable Zarr store; '.npy'; '.csv' and "
        "'.parquet' with named columns). Rename the output"
    )


def output_columns(target_names: Sequence[str] | None, n_outputs: int) -> list[str]:
    """Column names of a table output: the model's target names, else ``y0 .. y{k-1}``."""
    if target_names is not None and len(target_names) == n_outputs:
        return [str(t) for t in target_names]
    return [f"y{i}" for i in range(n_outputs)]


#: suffix of the record written beside a file output: it says the pipeline wrote that
#: file (its CRC-32C), so a later write may replace it and nothing else
OWNER_RECORD_SUFFIX = ".krr-pipeline.json"


def owner_record_path(path: str | os.PathLike) -> str:
    """The record beside a ``.npy``/``.csv``/``.parquet`` output that says we wrote it."""
    return os.fspath(path) + OWNER_RECORD_SUFFIX


def check_output_file(path: str | os.PathLike, overwrite: bool) -> int | None:
    """Refuse, before any work, a file output path that holds something to keep.

    Nothing there: fine. Predictions the pipeline wrote (the record beside the
    file says so, and the file's CRC-32C is the recorded one, or the one of the
    file it was replacing when a write was killed between its two renames):
    replaced only with ``overwrite``. Anything else (a user's file, a
    directory, a file changed since the pipeline wrote it: nothing says it is
    still ours) is refused even with ``overwrite``.

    Raises
    ------
    ForeignPathError
        The path holds something the pipeline did not write.
    FileExistsError
        The path holds the pipeline's own predictions and ``overwrite`` is False.

    Returns the CRC-32C of the pipeline's file found there (None: nothing there).
    """
    import json

    path = os.fspath(path)
    if not os.path.lexists(path):
        return None
    fix = "Choose another output path, or move or remove it yourself if you no longer need it"
    if os.path.isdir(path) or not os.path.isfile(path):
        raise ForeignPathError(path, "a directory" if os.path.isdir(path) else "not a file", fix)
    try:
        with open(owner_record_path(path)) as f:
            record = json.load(f)
        ours = record.get("written_by") == "krr-pipeline"
        known = {int(record["crc32c"])} if ours else set()
        if ours and record.get("replaces_crc32c") is not None:
            known.add(int(record["replaces_crc32c"]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        known = set()
    if not known:
        raise ForeignPathError(path, "a file the pipeline did not write", fix)
    found = file_crc32c(path)
    if found not in known:
        raise ForeignPathError(
            path,
            "a file that changed since the pipeline wrote it (its CRC-32C is not the one "
            f"recorded in {owner_record_path(path)!r}: damaged, or replaced by someone else)",
            fix,
        )
    if not overwrite:
        raise FileExistsError(
            f"output {path!r} already holds predictions this pipeline wrote; pass --overwrite "
            "(overwrite=True) to replace them, or choose another output path"
        )
    return found  # the CRC-32C of the pipeline's file there, read once


def check_zarr_output_root(store: str | os.PathLike) -> None:
    """Refuse a ``.zarr`` output that is a file, or a non-empty directory that is not
    a Zarr store: the predictions' array, markers and ``zarr.json`` would be written
    among its files. (An array of another program at the output's array path is
    refused by :func:`pipeline.storage.open_tiled_array`.)

    Raises
    ------
    ForeignPathError
    """
    import fsspec

    store = os.fspath(store)
    fs, root = fsspec.core.url_to_fs(store)
    root = root.rstrip("/")
    if not fs.exists(root):
        return
    if not fs.isdir(root):
        raise ForeignPathError(store, "a file")
    if fs.exists(f"{root}/zarr.json"):
        return
    if fs.find(root):  # any file, at any depth (empty directories are nobody's work)
        raise ForeignPathError(store, "a non-empty directory that is not a Zarr store")


def check_prediction_output(path: str | os.PathLike, overwrite: bool) -> str:
    """Check an output path before any work (:func:`check_output_file` for a file
    format, :func:`check_zarr_output_root` for ``.zarr``, then that it can be written:
    :func:`pipeline.storage.location.check_writable`, whose StoreNotWritableError makes
    ``krr`` exit 7); returns its format."""
    fmt = output_format(path)
    if fmt == "zarr":
        check_zarr_output_root(path)
    else:
        check_output_file(path, overwrite)
    check_writable(path, output=True, file=fmt != "zarr")
    if fmt == "parquet":  # a missing extra is said before any work, not after it
        require("pyarrow", "a .parquet output")
    return fmt


def write_predictions(
    path: str | os.PathLike,
    y: Any,
    fmt: str,
    target_names: Sequence[str] | None = None,
    *,
    overwrite: bool = False,
) -> int:
    """Write in-memory predictions ``y`` (shape (M,) or (M, k)) as ``.npy``, ``.csv`` or ``.parquet``.

    The file is written under a new temporary name in the same directory
    (:func:`~pipeline.storage.tempfiles.tmp_path_for`, created exclusively: never
    a file that is there already) and renamed into place, so an interrupted write
    never leaves a partial file under the final name. The record beside it
    (:func:`owner_record_path`), which notes its CRC-32C so that a later write
    replaces only a file the pipeline wrote (:func:`check_output_file`, called
    here again; callers call it before any work too), is renamed into place
    *first*: a write killed between the two renames leaves the old file beside a
    record it does not match but its ``replaces_crc32c`` does, which ``overwrite``
    replaces, never a new file without a record, which would be refused as a
    user's. Returns the CRC-32C of the file's bytes, computed from the
    written file before the rename (see :func:`file_crc32c`), for the caller to
    record and check on a later read.
    """
    import json

    import numpy as np

    path = os.fspath(path)
    old = check_output_file(path, overwrite)  # the file replaced (ours), or None
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)  # as a .zarr output's
    y = np.asarray(y)
    tmp, rec_tmp = tmp_path_for(path), tmp_path_for(owner_record_path(path))
    needed = y.nbytes + 128 if fmt == "npy" else None  # (a table's size is not known)
    # a full disk names the path and the bytes (free measured with the partial file gone)
    with disk_full_at(path, needed):
        try:
            if fmt == "npy":
                with open(tmp, "xb") as f:
                    np.save(f, y)
            elif fmt in ("csv", "parquet"):
                import pandas as pd

                # (M,) -> (M, 1); not reshape(M, -1), which fails for 0 rows
                y2 = y[:, None] if y.ndim == 1 else y.reshape(y.shape[0], int(np.prod(y.shape[1:])))
                df = pd.DataFrame(y2, columns=output_columns(target_names, y2.shape[1]))
                if fmt == "csv":
                    with open(tmp, "x", newline="") as f:
                        df.to_csv(f, index=False, float_format="%.17g")
                else:
                    require("pyarrow", "a .parquet output")
                    with open(tmp, "xb") as f:
                        df.to_parquet(f, index=False)
            else:
                raise ValueError(
                    f"write_predictions writes npy, csv or parquet, got format {fmt!r}"
                )
            crc = file_crc32c(tmp)
            # the file replaced (ours: checked above) stays known as ours until the rename
            record = {"written_by": "krr-pipeline", "crc32c": crc, "shape": list(y.shape)}
            record["replaces_crc32c"] = old
            with open(rec_tmp, "x") as f:
                json.dump(record, f)
            os.replace(rec_tmp, owner_record_path(path))
            os.replace(tmp, path)
            return crc
        finally:
            for t in (tmp, rec_tmp):
                if os.path.exists(t):
                    os.unlink(t)


def file_crc32c(path: str | os.PathLike) -> int:
    """CRC-32C of a whole file's bytes, read in 8 MiB pieces."""
    import google_crc32c

    h = google_crc32c.Checksum()
    with open(os.fspath(path), "rb") as f:
        for piece in iter(lambda: f.read(8 << 20), b""):
            h.update(piece)
    return int.from_bytes(h.digest(), "big")
