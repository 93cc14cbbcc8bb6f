"""Inputs: sources to row-blocked Dask arrays, streaming validation and fingerprints.

Stable public names (used by gram, predict and stages):
``as_row_blocks``, ``check_block_size``, ``check_meta``, ``iter_row_blocks``,
``validate_row_blocks``, ``fingerprint_row_blocks``, ``validate_and_fingerprint``.
"""

from pipeline.io.inputs import as_row_blocks, check_block_size
from pipeline.io.validate import (
    check_meta,
    fingerprint_row_blocks,
    iter_row_blocks,
    validate_and_fingerprint,
    validate_row_blocks,
)

__all__ = [
    "as_row_blocks",
    "check_block_size",
    "check_meta",
    "fingerprint_row_blocks",
    "iter_row_blocks",
    "validate_and_fingerprint",
    "validate_row_blocks",
]
