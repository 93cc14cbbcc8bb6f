"""Where predictions go: the output format follows the output path's extension.

- ``.zarr``: a Zarr store written row block by row block with completion
  records (resumable; see :func:`pipeline.predict.predict`).
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


def check_output_file(path: str | os.PathLike, overwrite: bool) -> None:
    """Refuse, before any work, a file output path that holds something to keep.

    Nothing there: fine. Predictions the pipeline wrote (the record beside the
    file says so): replaced only with ``overwrite``, and a file changed since
    (its CRC-32C is not the recorded one: damaged, as a run's verified read
    finds it) is logged before it is replaced. Anything else (a user's file, a
    directory) is refused even with ``overwrite``.

    Raises
    ------
    ForeignPathError
        The path holds something the pipeline did not write.
    FileExistsError
        The path holds the pipeline's own predictions and ``overwrite`` is False.
    """
    import json

    from pipeline.storage.errors import ForeignPathError

    path = os.fspath(path)
    if not os.path.lexists(path):
        return
    fix = "Choose another output path, or move or remove it yourself if you no longer need it"
    if os.path.isdir(path) or not os.path.isfile(path):
        raise ForeignPathError(path, "a directory" if os.path.isdir(path) else "not a file", fix)
    try:
        with open(owner_record_path(path)) as f:
            record = json.load(f)
        recorded = int(record["crc32c"]) if record.get("written_by") == "krr-pipeline" else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        recorded = None
    if recorded is None:
        raise ForeignPathError(path, "a file the pipeline did not write", fix)
    if not overwrite:
        raise FileExistsError(
            f"output {path!r} already holds predictions this pipeline wrote; pass --overwrite "
            "(overwrite=True) to replace them, or choose another output path"
        )
    if file_crc32c(path) != recorded:
        import logging

        logging.getLogger(__name__).warning(
            "output %r changed since the pipeline wrote it (CRC-32C differs from %s); "
            "replacing it with the new predictions",
            path,
            owner_record_path(path),
        )


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

    from pipeline.storage.errors import ForeignPathError

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
    format, :func:`check_zarr_output_root` for ``.zarr``); returns its format."""
    fmt = output_format(path)
    if fmt == "zarr":
        check_zarr_output_root(path)
    else:
        check_output_file(path, overwrite)
    if fmt == "parquet":  # a missing extra is said before any work, not after it
        from pipeline._optional import require

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

    The file is written under a temporary name in the same directory and
    renamed into place, so an interrupted write never leaves a partial file
    under the final name; then a record beside it (:func:`owner_record_path`)
    notes its CRC-32C, so that a later write replaces only a file the pipeline
    wrote (:func:`check_output_file`, called here again; callers call it before
    any work too). Returns the CRC-32C of the file's bytes, computed from the
    written file before the rename (see :func:`file_crc32c`), for the caller to
    record and check on a later read.
    """
    import json

    import numpy as np

    path = os.fspath(path)
    check_output_file(path, overwrite)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)  # as a .zarr output's
    y = np.asarray(y)
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        if fmt == "npy":
            with open(tmp, "wb") as f:
                np.save(f, y)
        elif fmt in ("csv", "parquet"):
            import pandas as pd

            y2 = y.reshape(len(y), -1)
            df = pd.DataFrame(y2, columns=output_columns(target_names, y2.shape[1]))
            if fmt == "csv":
                df.to_csv(tmp, index=False, float_format="%.17g")
            else:
                from pipeline._optional import require

                require("pyarrow", "a .parquet output")
                df.to_parquet(tmp, index=False)
        else:
            raise ValueError(f"write_predictions writes npy, csv or parquet, got format {fmt!r}")
        crc = file_crc32c(tmp)
        os.replace(tmp, path)
        record = {"written_by": "krr-pipeline", "crc32c": crc, "shape": list(y.shape)}
        with open(tmp, "w") as f:
            json.dump(record, f)
        os.replace(tmp, owner_record_path(path))
        return crc
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def file_crc32c(path: str | os.PathLike) -> int:
    """CRC-32C of a whole file's bytes, read in 8 MiB pieces."""
    import google_crc32c

    h = google_crc32c.Checksum()
    with open(os.fspath(path), "rb") as f:
        for piece in iter(lambda: f.read(8 << 20), b""):
            h.update(piece)
    return int.from_bytes(h.digest(), "big")
