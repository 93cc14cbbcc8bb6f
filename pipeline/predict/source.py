"""New points for prediction: any supported source as aligned row blocks, and its fingerprint.

Prediction needs ``X_new`` as a Dask array whose row chunks are exactly the
output row blocks (``block_size`` rows, the last one ragged) with one column
chunk. :func:`pipeline.io.as_row_blocks` reads every supported source (numpy,
Dask, Zarr, ``.npy``, Parquet, CSV, DataFrames); this module only adds the
alignment check and the input fingerprint used by resumable batch prediction.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import dask.array as da

from pipeline.io import as_row_blocks, fingerprint_row_blocks


def as_input_blocks(X: Any, block_size: int, columns: Sequence[str] | None = None) -> da.Array:
    """``X`` as a 2-D Dask array with row chunks of ``block_size`` and one column chunk.

    Parameters
    ----------
    X : array-like, dask.array.Array, zarr.Array, DataFrame or str
        New points, shape ``(M, D)``: anything :func:`pipeline.io.as_row_blocks`
        reads.
    block_size : int
        Rows per output block.
    columns : sequence of str, optional
        Columns to read from a table source (Parquet, CSV, DataFrame).
    """
    X = as_row_blocks(X, block_size, columns=columns)
    n = X.shape[0]
    want = (tuple(min(block_size, n - s) for s in range(0, n, block_size)) or (0,), (X.shape[1],))
    if X.chunks != want:  # as_row_blocks promises this layout; enforce it, tasks rely on it
        X = X.rechunk(want)
    return X


def input_fingerprint(X: da.Array) -> str:
    """Content hash of the new points (one streaming pass; same as the io layer's).

    Depends on values, dtype and shape, not on the block split, so a caller
    holding the io fingerprint of the same data may pass it instead.
    """
    return fingerprint_row_blocks(X, batch=8)
