"""Content fingerprints: stable hashes of inputs and configs.

A fingerprint names *what* a stored result was computed from. Results whose
fingerprint differs from the one requested are never reused.
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
