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


def write_predictions(
    path: str | os.PathLike, y: Any, fmt: str, target_names: Sequence[str] | None = None
) -> int:
    """Write in-memory predictions ``y`` (shape (M,) or (M, k)) as ``.npy``, ``.csv`` or ``.parquet``.

    The file is written under a temporary name in the same directory and
    renamed into place, so an interrupted write never leaves a partial file
    under the final name. Returns the CRC-32C of the file's bytes, computed from
    the written file before the rename (see :func:`file_crc32c`), for the caller
    to record and check on a later read.
    """
    import numpy as np

    path = os.fspath(path)
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
