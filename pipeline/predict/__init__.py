"""Blockwise prediction ŷ = K(X_new, X_train) α without forming the M x N kernel.

- :func:`predict`: numpy result, or a resumable batch prediction into a Zarr store.
- :func:`predict_blockwise`: the same computation as a lazy Dask array.
- :func:`model_fingerprint`: content hash naming a fitted model.
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
from pipeline.predict.source import as_input_blocks, input_fingerprint

__all__ = [
    "CACHE_BLOCK",
    "NAN_POLICIES",
    "PREPROCESSING_KEYS",
    "BatchPrediction",
    "as_input_blocks",
    "check_preprocessing",
    "input_fingerprint",
    "model_fingerprint",
    "predict",
    "predict_blockwise",
    "tile_product",
]
