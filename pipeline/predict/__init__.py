"""Blockwise prediction ŷ = K(X_new, X_train) α without forming the M x N kernel.

- :func:`predict`: numpy result, or a resumable batch prediction into a Zarr store.
- :func:`predict_blockwise`: the same computation as a lazy Dask array.
- :func:`model_fingerprint`: content hash naming a fitted model.
- :func:`output_format` / :func:`write_predictions`: the output format follows
  the extension (``.zarr``, ``.npy``, ``.csv``, ``.parquet``).
- :func:`select_features`: a table's columns read by the model's feature names.
"""

from pipeline.predict.blockwise import (
    CACHE_BLOCK,
    NAN_POLICIES,
    BatchPrediction,
    predict,
    predict_blockwise,
    tile_product,
)
from pipeline.predict.model import PREPROCESSING_KEYS, check_preprocessing, model_fingerprint
from pipeline.predict.output import (
    OUTPUT_FORMATS,
    output_columns,
    output_format,
    write_predictions,
)
from pipeline.predict.source import as_input_blocks, input_fingerprint, select_features

__all__ = [
    "CACHE_BLOCK",
    "NAN_POLICIES",
    "OUTPUT_FORMATS",
    "PREPROCESSING_KEYS",
    "BatchPrediction",
    "as_input_blocks",
    "check_preprocessing",
    "input_fingerprint",
    "model_fingerprint",
    "output_columns",
    "output_format",
    "predict",
    "predict_blockwise",
    "select_features",
    "tile_product",
    "write_predictions",
]
