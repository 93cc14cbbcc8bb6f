"""Streaming validation and content fingerprints of row-blocked inputs.

:func:`check_meta` (no data), :func:`iter_row_blocks` (one batch of blocks in memory
at a time), :func:`validate_row_blocks` (raises naming the first non-finite value's
row block, row and column), :func:`fingerprint_row_blocks` (depends on values, dtype
and shape, not on the block split) and :func:`validate_and_fingerprint` (both in one
pass, for the Gram builder). X is never loaded whole.
"""

from __future__ import annotations

from collections.abc import Iterator

import dask
import dask.array as da
import numpy as np

import pipeline.constants as C
from pipeline.engine.where import beside_local_workers, in_this_process, local_scheduler
from pipeline.storage import fingerprint_blocks

__all__ = [
    "check_meta",
    "fingerprint_row_blocks",
    "iter_row_blocks",
    "validate_and_fingerprint",
    "validate_row_blocks",
]


def check_meta(X: da.Array, name: str = "X") -> None:
    """Raise ValueError unless ``X`` is a 2-D numeric Dask array with known chunks."""
    if not isinstance(X, da.Array):
        raise ValueError(
            f"{name} must be a dask array here, got {type(X).__name__}; "
            "convert it with pipeline.storage.inputs.as_row_blocks"
        )
    if X.ndim != 2:
        raise ValueError(f"{name} must be 2-D (n_samples, n_features), got shape {X.shape}")
    if np.dtype(X.dtype).kind not in "biuf":
        raise ValueError(f"{name} must be numeric, got dtype {X.dtype}")
    if any(np.isnan(c) for c in X.chunks[0]):
        raise ValueError(
            f"{name} has unknown chunk sizes; build it with pipeline.storage.inputs.as_row_blocks "
            "(or call X.compute_chunk_sizes())"
        )
    if len(X.chunks[1]) != 1:
        raise ValueError(
            f"{name} must have one column chunk (row blocks), got column chunks {X.chunks[1]}; "
            "rechunk with X.rechunk({1: -1})"
        )


def iter_row_blocks(X: da.Array, batch: int | None = None) -> Iterator[tuple[int, int, np.ndarray]]:
    """Yield ``(i, row_offset, block)`` for each row block of ``X``, in order.

    The blocks are computed in batches of consecutive blocks, and only one batch
    is held in memory at a time: ``batch`` blocks each, or by default as many as
    fit in :data:`~pipeline.constants.ROW_BATCH_BYTES` (at least one).
    Each computation costs time in proportion to ``X``'s whole graph, so a
    batch of a fixed two blocks made the passes over a source quadratic in its
    blocks (measured: docs/PERFORMANCE.md#the-main-job-and-the-ingest).
    """
    check_meta(X)
    sizes = [int(c) for c in X.chunks[0]]
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
    # every block comes to this process anyway: beside workers on this machine it is
    # read here, without a round trip each (unless it lives on the workers, futures)
    here = beside_local_workers(X.__dask_graph__())
    for idx in _batches(sizes, int(X.shape[1]) * X.dtype.itemsize, batch):
        with in_this_process(here):
            arrays = dask.compute(*[X.blocks[i] for i in idx], **local_scheduler())
        for i, b in zip(idx, arrays):
            yield i, int(offsets[i]), np.asarray(b)


def _batches(rows: list[int], row_bytes: int, batch: int | None) -> Iterator[range]:
    """Consecutive block indices: ``batch`` at a time, or up to ``ROW_BATCH_BYTES``."""
    if batch is not None:
        step = max(1, int(batch))
        for start in range(0, len(rows), step):
            yield range(start, min(start + step, len(rows)))
        return
    start = held = 0
    for i, r in enumerate(rows):
        if i > start and held + r * row_bytes > C.ROW_BATCH_BYTES:
            yield range(start, i)
            start, held = i, 0
        held += r * row_bytes
    if start < len(rows):
        yield range(start, len(rows))


def _check_finite_block(block: np.ndarray, i: int, offset: int, name: str) -> None:
    if block.dtype.kind != "f" or block.size == 0:
        return
    if np.isfinite(block).all():
        return
    bad = ~np.isfinite(block)
    r, c = (int(v[0]) for v in np.nonzero(bad))
    n_bad = int(bad.sum())
    raise ValueError(
        f"{name} has a non-finite value ({float(block[r, c])}) at row {offset + r}, column {c} "
        f"(row block {i}, rows {offset}..{offset + block.shape[0] - 1}; {n_bad} non-finite "
        f"value(s) in this block). Remove or impute NaN/inf values before building the Gram."
    )


def validate_and_fingerprint(X: da.Array, name: str = "X", batch: int | None = None) -> str:
    """Check ``X`` block by block (finite values) and return its content fingerprint.

    Raises
    ------
    ValueError
        ``X`` is not 2-D numeric, or holds NaN/inf (the message names the row
        block, the global row and the column of the first one).
    """
    check_meta(X, name)

    def blocks() -> Iterator[np.ndarray]:
        for i, off, b in iter_row_blocks(X, batch=batch):
            _check_finite_block(b, i, off, name)
            yield b

    return fingerprint_blocks(blocks())


def validate_row_blocks(X: da.Array, name: str = "X", batch: int | None = None) -> None:
    """Raise ValueError if ``X`` is not 2-D, numeric and finite (streaming)."""
    check_meta(X, name)
    for i, off, b in iter_row_blocks(X, batch=batch):
        _check_finite_block(b, i, off, name)


def fingerprint_row_blocks(X: da.Array, batch: int | None = None) -> str:
    """Content fingerprint of ``X`` computed block by block (no validation)."""
    check_meta(X)
    return fingerprint_blocks(b for _, _, b in iter_row_blocks(X, batch=batch))
