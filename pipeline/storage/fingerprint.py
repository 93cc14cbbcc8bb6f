"""Content fingerprints: stable hashes of inputs and configs, and the one reuse rule.

A fingerprint names *what* a stored result was computed from. Results whose
fingerprint differs from the one requested are never reused: every mechanism that
reuses work decides "same work?" with :func:`same_work`, and nothing else (the
stored arrays: Gram, Cholesky factor, prediction and ingest stores, in
:func:`pipeline.storage.open_tiled_array`; their tile and block markers; CG
checkpoints; the CV search's per-setting checkpoints; ``krr run``'s stages, which
skip, resume, adopt another configuration's result or invalidate by it; the check
that a finished stage's prediction store still holds its own predictions). What
the work depends on goes into the fingerprint (an ingest's source identity, a
fit's parameters, a model's content), never into a rule of its own.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

import numpy as np


def _canonical(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _canonical(v) for k, v in sorted(obj.items(), key=lambda kv: str(kv[0]))}
    if isinstance(obj, list | tuple):
        return [_canonical(v) for v in obj]
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, float) and obj.is_integer():
        # 1 and 1.0 describe the same parameter value
        return int(obj)
    return obj


def same_work(recorded: Any, wanted: Any) -> bool:
    """The one reuse rule: whether a result recorded under fingerprint ``recorded`` is
    the work that fingerprint ``wanted`` names, so that it may be reused (skipped,
    resumed, adopted) instead of computed again.

    Both must be fingerprints (non-empty strings) and equal: a result that records no
    fingerprint (None, an older writer's) and a request that names none are never the
    same work. Everything else a result depends on belongs in its fingerprint.
    """
    return isinstance(wanted, str) and wanted != "" and recorded == wanted


def fingerprint_obj(obj: Any) -> str:
    """Hash of a JSON-able object (dicts are key-sorted, numpy scalars unwrapped)."""
    text = json.dumps(_canonical(obj), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def fingerprint_blocks(blocks: Iterable[np.ndarray]) -> str:
    """Hash of an array's content streamed block by block (row blocks, in order).

    The result depends on values, dtype and the total shape, not on how the
    rows were split into blocks.
    """
    h = hashlib.blake2b(digest_size=16)
    n_rows = 0
    trailing: tuple[int, ...] | None = None
    dtype = None
    for block in blocks:
        block = np.ascontiguousarray(block)
        if trailing is None:
            trailing, dtype = block.shape[1:], block.dtype.str
        n_rows += block.shape[0] if block.ndim else 1
        h.update(block.tobytes())
    h.update(json.dumps([n_rows, list(trailing or ()), dtype]).encode())
    return h.hexdigest()
