"""Inputs as Dask arrays of row blocks.

:func:`as_row_blocks` turns a numpy array, a ``.npy``, Zarr, Parquet or CSV path, a
``zarr.Array``, a pandas or Dask DataFrame, or a Dask array into a lazy 2-D Dask
array of ``block_size``-row chunks (a ``.npy`` is memory-mapped per block, never
embedded in the graph). float32 and float64 inputs keep their dtype; other numeric
inputs become float64 unless ``dtype`` is given; non-numeric columns are refused
naming them. Finiteness is checked by :mod:`pipeline.engine.input_checks`.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping, Sequence
from typing import Any

import dask
import dask.array as da
import numpy as np

from pipeline._optional import require
from pipeline.errors import InputError, file_kind

__all__ = ["as_row_blocks", "check_block_size", "open_npy", "open_table"]

_PARQUET_SUFFIXES = (".parquet", ".pq", ".parq")
_CSV_SUFFIXES = (".csv", ".csv.gz", ".csv.bz2", ".csv.xz", ".csv.zst", ".tsv", ".txt")


def check_block_size(block_size: Any) -> int:
    """Return ``block_size`` as an int, or raise ValueError if it is not an int >= 1."""
    if isinstance(block_size, bool) or not isinstance(block_size, int | np.integer):
        raise ValueError(f"block_size must be a positive integer, got {block_size!r}")
    if block_size < 1:
        raise ValueError(
            f"block_size must be >= 1, got {block_size}; a typical value is 2048-4096 rows"
        )
    return int(block_size)


def _target_dtype(src: np.dtype, dtype: Any, what: str) -> np.dtype:
    src = np.dtype(src)
    if src.kind not in "biuf":
        raise ValueError(
            f"{what} has non-numeric dtype {src}; X must be numeric (int, bool or float). "
            "Select numeric columns with columns=[...] or encode categories first"
        )
    if dtype is not None:
        out = np.dtype(dtype)
        if out.kind != "f":
            raise ValueError(f"dtype must be a floating dtype (float32/float64), got {out}")
        return out
    return src if src in (np.dtype(np.float32), np.dtype(np.float64)) else np.dtype(np.float64)


def _finish(X: da.Array, block_size: int, dtype: Any, what: str) -> da.Array:
    if X.ndim != 2:
        raise ValueError(
            f"{what} must be 2-D (n_samples, n_features), got {X.ndim}-D with shape {X.shape}; "
            "reshape a single feature with x.reshape(-1, 1)"
        )
    if any(np.isnan(c) for c in X.chunks[0]):
        X = X.compute_chunk_sizes()
    target = _target_dtype(X.dtype, dtype, what)
    if X.dtype != target:
        X = X.astype(target)
    n, d = X.shape
    want = ((block_size,) * (n // block_size) + ((n % block_size,) if n % block_size else ()), (d,))
    if n == 0:
        want = ((0,), (d,))
    if X.chunks != want:
        X = X.rechunk({0: block_size, 1: -1})
    return X


def check_regular_input(path: str | os.PathLike, what: str = "input") -> None:
    """An :class:`~pipeline.errors.InputError` naming ``path`` when it is a local FIFO,
    socket or device (through a link too): reading a FIFO waits for a writer for ever,
    so it is refused before any work. Regular files, directories (Parquet, Zarr),
    paths that do not exist, globs and URLs pass (their own checks follow)."""
    path = os.fspath(path)
    if "://" in path:
        return
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return
    raise InputError(
        f"{what} {path!r} is {file_kind(mode)}, not a regular file; krr-pipeline reads "
        "inputs only from regular files and directories (a FIFO or device would block or "
        "feed the run). Write the data to a file (e.g. np.save(path, X)) and point to it."
    )


def open_npy(path: str | os.PathLike, what: str = ".npy file") -> np.ndarray:
    """``np.load(path, mmap_mode="r")``, with an :class:`~pipeline.errors.InputError`
    (a ValueError) naming the file when it is
    empty (0 bytes) or ends before its header does (numpy says only ``No data left in
    file``: an EOFError, reported as an internal error or a failed stage before)."""
    path = os.fspath(path)
    check_regular_input(path, what)
    if os.path.isfile(path) and os.path.getsize(path) == 0:
        raise InputError(
            f"{what} {path!r} is empty (0 bytes), not a .npy array: write it again "
            "(np.save(path, X)), or point to the right file"
        )
    try:
        return np.load(path, mmap_mode="r")
    except (EOFError, ValueError) as e:
        if not isinstance(e, EOFError) and not str(e).startswith("EOF"):
            raise  # (e.g. an object dtype: the caller says why)
        raise InputError(
            f"{what} {path!r} is truncated or not a .npy array ({e}): write it again "
            "(np.save(path, X)), or point to the right file"
        ) from None


def _read_npy_rows(
    path: str, start: int, stop: int, layout: tuple[Any, tuple[int, ...], int, str]
) -> np.ndarray:
    """Rows ``start:stop`` of the .npy file ``path`` whose header ``_from_npy`` read once:
    ``layout`` is (dtype, shape, data offset, order). No header is parsed here: ``np.load``
    parses it with ``ast.literal_eval``, which CPython 3.11.7 failed when two threads of
    an ingest parsed at once ("SystemError: AST constructor recursion depth mismatch")."""
    dtype, shape, offset, order = layout
    if stop <= start:
        return np.empty((0, *shape[1:]), dtype=dtype)
    mm = np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape, order=order)
    return np.array(mm[start:stop])


def _from_npy(path: str, block_size: int) -> da.Array:
    try:
        mm = open_npy(path)
    except InputError:  # empty or truncated: its own message
        raise
    except ValueError as e:  # e.g. Python objects in its dtype: no memory map
        raise ValueError(
            f".npy file {path!r} cannot be read as a numeric array ({e}); save X as a "
            "float array (np.save(path, X.astype(np.float64)))"
        ) from None
    if mm.ndim != 2:
        raise ValueError(
            f".npy file {path!r} holds a {mm.ndim}-D array of shape {mm.shape}; X must be 2-D"
        )
    n, d = mm.shape
    dt = mm.dtype
    # the header's layout, for the row-block tasks (an empty array has no memory map)
    layout = (
        dt,
        (n, d),
        int(getattr(mm, "offset", 0)),
        "F" if mm.flags.f_contiguous and not mm.flags.c_contiguous else "C",
    )
    del mm
    blocks = []
    for start in range(0, max(n, 1), block_size):
        stop = min(start + block_size, n)
        part = dask.delayed(_read_npy_rows, pure=True)(path, start, stop, layout)
        blocks.append(da.from_delayed(part, shape=(stop - start, d), dtype=dt))
    return da.concatenate(blocks, axis=0) if len(blocks) > 1 else blocks[0]


def _from_dataframe(df: Any, columns: Sequence[str] | None, what: str) -> da.Array:

    dd = require("dask.dataframe", "reading a Parquet/CSV table or a DataFrame")
    import pandas as pd

    if isinstance(df, pd.DataFrame):
        df = dd.from_pandas(df, npartitions=max(1, min(len(df) // 100_000, 64)))
    if columns is not None:
        missing = [c for c in columns if c not in df.columns]
        if missing:
            raise ValueError(
                f"{what}: columns {missing} not found; available columns: {list(df.columns)}"
            )
        df = df[list(columns)]
    bad = [
        str(c)
        for c, t in df.dtypes.items()
        if not (pd.api.types.is_numeric_dtype(t) or pd.api.types.is_bool_dtype(t))
    ]
    if bad and len(df.head(1, npartitions=-1)) == 0:
        # a header without rows: pandas types its columns "object", which is not a
        # sign of text; no rows is no rows (0 predictions; a training source is refused)
        return da.zeros((0, len(df.columns)), dtype=np.float64, chunks=(1, len(df.columns)))
    if bad:
        raise ValueError(
            f"{what}: columns {bad} are not numeric; pass columns=[...] with numeric columns only"
        )
    if any(not isinstance(t, np.dtype) for t in df.dtypes):
        # pandas extension dtypes (nullable Int64, Float64...): NA becomes NaN, caught later
        df = df.astype("float64")
    return df.to_dask_array(lengths=True)


def encode_ordinal(df: Any, codes: Mapping[Any, list[str]], what: str) -> Any:
    """``df`` (pandas or Dask) with each column of ``codes`` replaced by its categories'
    codes as float64 (a value outside them raises ValueError naming it; in a Dask
    DataFrame when its partition is read)."""

    def encode(part: Any) -> Any:
        import pandas as pd

        part = part.copy()
        for col, cats in codes.items():
            c = pd.Categorical(_as_text(part[col]), categories=cats, ordered=True).codes
            if (c < 0).any():
                bad = sorted(set(part[col][c < 0].astype(str)))[:5]
                raise ValueError(
                    f"{what}: ordinal column {col!r} has values {bad} outside its categories "
                    f"{cats} (data.ordinal; a fitted model's categories are its training "
                    "run's: train again with them added), or drop those rows"
                )
            part[col] = c.astype(np.float64)
        return part

    def _as_text(s: Any) -> Any:
        """The values as the config's category strings: a CSV reader parses "1" as 1,
        "1" beside an empty cell as 1.0, "True" as True (they matched no category)."""
        import pandas as pd

        if isinstance(s.dtype, pd.CategoricalDtype) or s.dtype == object:
            return s
        if pd.api.types.is_float_dtype(s.dtype) and (s.dropna() % 1 == 0).all():
            return s.astype("Int64").astype("string").astype(object)
        return s.astype("string").astype(object)

    if hasattr(df, "map_partitions"):  # a Dask DataFrame
        meta = df._meta.copy()
        for col in codes:
            meta[col] = meta[col].astype("float64")
        return df.map_partitions(encode, meta=meta)
    return encode(df)


def is_zarr_path(path: str) -> bool:
    """Whether ``path`` names a Zarr store (v3 ``zarr.json`` or v2 ``.zarray``, or a .zarr URL)."""
    p = path.rstrip("/")
    if p.endswith(".zarr") or ".zarr/" in p:
        return True
    if "://" not in p and os.path.isdir(p):
        return os.path.exists(os.path.join(p, "zarr.json")) or os.path.exists(
            os.path.join(p, ".zarray")
        )
    return False


def _from_path(path: str, block_size: int, columns: Sequence[str] | None) -> da.Array:
    check_regular_input(path)
    low = path.lower().rstrip("/")
    if low.endswith(".npy"):
        if columns is not None:
            raise ValueError(f"columns= applies to tables (Parquet/CSV), not to .npy file {path!r}")
        return _from_npy(path, block_size)
    if is_zarr_path(path):
        import zarr

        try:
            arr = zarr.open_array(store=path, mode="r")
        except Exception as exc:  # a group, or not Zarr at all
            raise ValueError(
                f"could not open {path!r} as a Zarr array ({exc}); give the path of the array "
                "itself, e.g. 'data.zarr/X', not of its group"
            ) from exc
        if arr.ndim != 2:  # ((block_size, -1),) failed with "chunks do not add up"
            return da.from_zarr(arr)  # _finish names the shape and the fix
        return da.from_zarr(arr, chunks=(block_size, arr.shape[1]))

    dd = require("dask.dataframe", f"reading the table {path!r}")
    if low.endswith(_PARQUET_SUFFIXES) or (
        "://" not in path and os.path.isdir(path) and not is_zarr_path(path)
    ):
        # lazy (schema only); the column selection is projected into the reader
        df = dd.read_parquet(path)
        return _from_dataframe(df, columns, f"Parquet {path!r}")
    if low.endswith(_CSV_SUFFIXES) or "*" in low:
        sep = "\t" if low.endswith(".tsv") else ","
        df = read_csv(dd, path, sep=sep)
        return _from_dataframe(df, columns, f"CSV {path!r}")
    raise ValueError(
        f"cannot tell the format of {path!r}: use a .npy, .zarr, .parquet or .csv path, "
        "or pass an array"
    )


def open_table(source: Any) -> Any:
    """The table behind ``source`` as a lazy DataFrame, or None if it is not a table.

    Tables are CSV and Parquet paths (read lazily: the schema, and for CSV a
    sample of rows for the dtypes) and pandas / Dask DataFrames (returned as
    they are). Use its ``columns`` and ``dtypes`` to select features by name.
    """
    import pandas as pd

    if isinstance(source, pd.DataFrame):
        return source
    mod = type(source).__module__
    if mod.startswith("dask") and hasattr(source, "to_dask_array") and hasattr(source, "columns"):
        return source
    if not isinstance(source, str | os.PathLike):
        return None
    path = os.fspath(source)
    low = path.lower().rstrip("/")
    if low.endswith(".npy") or is_zarr_path(path):
        return None

    dd = require("dask.dataframe", f"reading the table {path!r}")
    if low.endswith(_PARQUET_SUFFIXES) or ("://" not in path and os.path.isdir(path)):
        return dd.read_parquet(path)
    if low.endswith(_CSV_SUFFIXES) or "*" in low:
        return read_csv(dd, path, sep="\t" if low.endswith(".tsv") else ",")
    return None


def read_csv(dd: Any, path: str, **kwargs: Any) -> Any:
    """``dd.read_csv(path)`` that parses every float exactly, as written.

    pandas before 3.0 parses with its fast converter by default, which misreads about
    a third of printed float64 values by up to 2e-13 relative (pandas 2.2.3: the same
    file then gives other rows, fingerprints and fits than pandas 3 does). Its
    ``round_trip`` converter is exact; pandas 3 made exact parsing the default and
    deprecates the option, so it is passed only before 3.0."""
    import pandas as pd

    if int(pd.__version__.split(".")[0]) < 3:
        kwargs.setdefault("float_precision", "round_trip")
    return dd.read_csv(path, **kwargs)


def as_row_blocks(
    source: Any,
    block_size: int,
    columns: Sequence[str] | None = None,
    dtype: Any = None,
) -> da.Array:
    """Return ``source`` as a lazy 2-D Dask array chunked in row blocks.

    Parameters
    ----------
    source : array-like, str, os.PathLike, zarr.Array, DataFrame or dask.array.Array
        numpy array (or anything ``np.asarray`` accepts); path to a ``.npy``
        file, a Zarr array (``*.zarr`` or a directory holding ``zarr.json``),
        Parquet file(s)/directory or CSV file(s) (glob allowed); a
        ``zarr.Array``; a pandas or Dask DataFrame; or a Dask array.
    block_size : int
        Rows per block (>= 1). Chunks are ``(block_size, n_features)``; the
        last block may be ragged.
    columns : sequence of str, optional
        Columns to read from a table source (Parquet, CSV, DataFrame). Default:
        every column, which then must all be numeric.
    dtype : float dtype, optional
        Cast to this dtype. Default: keep float32/float64, else float64.

    Returns
    -------
    dask.array.Array
        Shape ``(n_samples, n_features)``, known chunk sizes, one chunk per row block.

    Raises
    ------
    ValueError
        ``block_size`` < 1, an unknown path format, a non-2-D source, missing
        or non-numeric columns.
    """
    block_size = check_block_size(block_size)
    if isinstance(columns, str):  # one name, not its characters
        columns = [columns]
    if isinstance(source, da.Array):
        if columns is not None:
            raise ValueError("columns= applies to tables (Parquet/CSV/DataFrame), not to arrays")
        return _finish(source, block_size, dtype, "X")
    if isinstance(source, str | os.PathLike):
        path = os.fspath(source)
        return _finish(_from_path(path, block_size, columns), block_size, dtype, repr(path))
    try:
        import zarr

        if isinstance(source, zarr.Array):
            arr = da.from_zarr(source, chunks=(block_size, -1) if source.ndim == 2 else -1)
            return _finish(arr, block_size, dtype, "Zarr array")
    except ImportError:  # pragma: no cover - zarr is a dependency
        pass
    import pandas as pd

    mod = type(source).__module__
    if isinstance(source, pd.DataFrame) or (
        mod.startswith("dask") and hasattr(source, "to_dask_array")
    ):
        return _finish(_from_dataframe(source, columns, "DataFrame"), block_size, dtype, "X")
    if columns is not None:
        raise ValueError("columns= applies to tables (Parquet/CSV/DataFrame), not to arrays")
    arr = np.asarray(source)
    if arr.ndim != 2:
        raise ValueError(
            f"X must be 2-D (n_samples, n_features), got shape {arr.shape}; "
            "reshape a single feature with x.reshape(-1, 1)"
        )
    _target_dtype(arr.dtype, dtype, "X")  # refuse object/str arrays before chunking
    chunks = (min(block_size, max(arr.shape[0], 1)), max(arr.shape[1], 1))
    return _finish(da.from_array(arr, chunks=chunks), block_size, dtype, "X")
