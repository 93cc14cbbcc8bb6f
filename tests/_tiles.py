"""Small tile fixtures shared by the Cholesky, triangular-solve and engine tests: an RBF
matrix, its lower tiles written as a stored "gram", and a relative error."""

from __future__ import annotations

import numpy as np

from pipeline.kernels import RBF
from pipeline.storage import fingerprint_obj, open_tiled_array


def rbf_matrix(n: int, d: int = 4, gamma: float = 0.3, seed: int = 0) -> np.ndarray:
    return RBF(gamma=gamma)(np.random.default_rng(seed).standard_normal((n, d)))


def write_gram(store, K: np.ndarray, block_size: int, tag: str = "test"):
    """Store the lower tiles (j <= i) of K as "gram", each followed by its marker."""
    n = K.shape[0]
    g = open_tiled_array(
        str(store), "gram", (n, n), block_size, K.dtype, fingerprint_obj({"t": tag, "n": n})
    )
    for i, j in g.grid.lower_tiles():
        g.write_tile(i, j, K[g.grid.row_slice(i), g.grid.col_slice(j)])
    return g


def rel(a, b) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def dies_after(count, tile_fn, calls):
    """``tile_fn`` that raises ``RuntimeError("killed")`` when asked for a tile after it
    has made ``count`` (each recorded in ``calls``): a kill injected mid-factorisation."""

    def dying(i, j):
        if len(calls) == count:
            raise RuntimeError("killed")
        calls.append((i, j))
        return tile_fn(i, j)

    return dying
