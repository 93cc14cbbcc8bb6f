"""New points for prediction: any supported source as aligned row blocks, and its fingerprint.

Prediction needs ``X_new`` as a Dask array whose row chunks are exactly the
output row blocks (``block_size`` rows, the last one ragged) with one column
chunk. :func:`pipeline.storage.inputs.as_row_blocks` reads every supported source (numpy,
Dask, Zarr, ``.npy``, Parquet, CSV, DataFrames); this module only adds the
alignment check, the input fingerprint used by resumable batch prediction, and
:func:`select_features`, which reads a table's columns by the model's feature
names (never by position when the model knows its names).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import dask.array as da
import zarr

from pipeline.engine.input_checks import fingerprint_row_blocks
from pipeline.storage.inputs import as_row_blocks, encode_ordinal, is_zarr_path, open_table

log = logging.getLogger(__name__)


def select_features(
    X: Any,
    block_size: int,
    *,
    feature_names: Sequence[str] | None,
    n_features: int,
    columns: Sequence[str] | None = None,
    ordinal: Mapping[str, Sequence[str]] | None = None,
) -> Any:
    """Read a table's feature columns by name, in the model's order; other inputs unchanged.

    Parameters
    ----------
    X : any source :func:`pipeline.storage.inputs.as_row_blocks` reads
        New points. Only tables (CSV, Parquet, DataFrames) are changed here.
    block_size : int
        Rows per block of the returned Dask array.
    feature_names : sequence of str or None
        The model's feature names in X_train's column order (None: the model
        was fitted on an unnamed array).
    n_features : int
        The model's feature count.
    columns : sequence of str, optional
        Explicit column selection. With ``feature_names`` it must name
        exactly the model's features (in any order); without them it is
        read in the order given.
    ordinal : mapping of str to list of str, optional
        The training run's ordinal encodings (``data.ordinal``): each named column
        of the table holds categories and is read as their codes (0, 1, ... in the
        list's order), as the ingest read it.

    Returns
    -------
    X, or a row-blocked Dask array of the selected columns

    Raises
    ------
    ValueError
        A feature column is missing (naming it), the table has columns the
        model was not fitted on (naming them; select with ``columns``), a
        model without names meets a table whose numeric column count differs, or
        an ordinal column holds a value outside its categories.
    """
    df = None if isinstance(X, da.Array) else open_table(X)
    if df is None:
        return X if columns is None else as_row_blocks(X, block_size, columns=columns)
    what = f"input {os.fspath(X)!r}" if isinstance(X, str | os.PathLike) else "input DataFrame"
    label = {str(c): c for c in df.columns}
    available = list(label)
    if feature_names is not None:
        names = [str(c) for c in feature_names]
        chosen = available if columns is None else [str(c) for c in columns]
        missing = [c for c in names if c not in chosen]
        if missing:
            where = "the table" if columns is None else "columns="
            raise ValueError(
                f"{what}: the model's feature columns {missing} are missing from {where}; the "
                f"model was fitted on {names}, the table has {available}. Add or rename them"
            )
        extra = [c for c in chosen if c not in names]
        if extra:
            hint = (
                f"drop them, or select the features explicitly with columns={names} "
                f"(CLI: --columns {','.join(names)})"
                if columns is None
                else f"select exactly the model's features: columns={names}"
            )
            raise ValueError(
                f"{what}: columns {extra} are not features of the model (fitted on {names}); {hint}"
            )
        absent = [c for c in names if c not in label]
        if absent:  # explicit columns= naming columns the table lacks
            raise ValueError(f"{what}: columns {absent} not found; available: {available}")
        cols = [label[c] for c in names]
        codes = {label[c]: list(v) for c, v in (ordinal or {}).items() if c in names}
        if codes:  # categories -> the training run's codes, then the features as numbers
            return as_row_blocks(encode_ordinal(df[cols], codes, what), block_size)
    elif columns is not None:
        cols = list(columns)
    else:
        import pandas as pd

        numeric = [
            c
            for c, t in df.dtypes.items()
            if pd.api.types.is_numeric_dtype(t) or pd.api.types.is_bool_dtype(t)
        ]
        if len(numeric) != n_features:
            raise ValueError(
                f"{what}: the model has no feature names (it was fitted on an unnamed array) "
                f"and takes {n_features} features, but the table has {len(numeric)} numeric "
                f"columns {[str(c) for c in numeric]}; select {n_features} columns in training "
                "order with columns=[...] (CLI: --columns a,b,...)"
            )
        log.warning(
            "%s: the model has no feature names (fitted on an unnamed array); reading the "
            "numeric columns %s in file order as its %d features. Check that this is the "
            "training order, or select them with columns=[...]",
            what,
            [str(c) for c in numeric],
            n_features,
        )
        cols = numeric
    return as_row_blocks(X, block_size, columns=cols)


def as_input_blocks(X: Any, block_size: int, columns: Sequence[str] | None = None) -> da.Array:
    """``X`` as a 2-D Dask array with row chunks of ``block_size`` and one column chunk.

    Parameters
    ----------
    X : array-like, dask.array.Array, zarr.Array, DataFrame or str
        New points, shape ``(M, D)``: anything :func:`pipeline.storage.inputs.as_row_blocks`
        reads.
    block_size : int
        Rows per output block.
    columns : sequence of str, optional
        Columns to read from a table source (Parquet, CSV, DataFrame).
    """
    X = as_row_blocks(_zarr_native(X), block_size, columns=columns)
    n = X.shape[0]
    want = (tuple(min(block_size, n - s) for s in range(0, n, block_size)) or (0,), (X.shape[1],))
    if X.chunks != want:  # as_row_blocks promises this layout; enforce it, tasks rely on it
        X = X.rechunk(want)
    return X


def _zarr_native(X: Any) -> Any:
    """A Zarr source as a Dask array in its own chunks (rechunked to row blocks later).

    Reading ``block_size`` rows straight from larger Zarr chunks decodes each
    chunk once per block; splitting native chunks reads each chunk once.
    """
    arr = X
    if isinstance(X, str | os.PathLike):
        path = os.fspath(X)
        if not is_zarr_path(path):
            return X
        try:
            arr = zarr.open_array(store=path, mode="r")
        except Exception:
            return X  # as_row_blocks reports what is wrong with the path
    if isinstance(arr, zarr.Array) and arr.ndim == 2:
        return da.from_zarr(arr)
    return X


def input_fingerprint(X: da.Array) -> str:
    """Content hash of the new points (one streaming pass; same as the io layer's).

    Depends on values, dtype and shape, not on the block split, so a caller
    holding the io fingerprint of the same data may pass it instead.
    """
    return fingerprint_row_blocks(X)
