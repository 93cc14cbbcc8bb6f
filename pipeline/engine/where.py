"""Where a small tile pass runs: here, rather than on a cluster on this machine.

A pass sent to a distributed client costs a scheduler round trip and two
serialisations, about 27-29 ms on the embedded LocalCluster whatever its size
(measured below), while a kernel product over 1,000 rows takes 4-5 ms in this
process. So a pass of at most
:data:`~pipeline.constants.SMALL_PASS_ENTRIES` kernel entries runs on
Dask's threaded scheduler here when the client's workers all run on this
machine (their stores are this machine's too), with one BLAS thread per task as
the workers use, so its bits are those the workers would give. Entries are
weighed by their cost at the pass's D (:func:`weigh`: ``D + ENTRY_COST_D0``
against D = 8's, the measurement's), so a costly kernel's pass of the same size
stays on the workers. A pass whose
graph holds futures (data that lives on the workers) always goes to them, and
so does every pass of a client on other machines.
"""

from __future__ import annotations

from typing import Any

from pipeline import constants as C

__all__ = ["lower_entries", "n_features", "n_rows", "runs_here", "tile_entries", "weigh"]

#: the D at which SMALL_PASS_ENTRIES was measured (RBF, session 21)
SMALL_PASS_FEATURES = 8


def runs_here(entries: float | None, graph: Any, limit: int | None = None) -> bool:
    """Whether a pass over ``entries`` kernel entries (None: unknown) with Dask
    ``graph`` (None: none to check for futures) runs in this process although a
    distributed client is active (see the module docstring); ``limit``: the largest
    such pass (default :data:`~pipeline.constants.SMALL_PASS_ENTRIES`, entries
    at D = 8: pass kernel entries through :func:`weigh`, so a pass is small by its
    time). False without a client: the caller's default path already runs here; the
    caller runs it under :func:`pipeline.engine.parallel.in_this_process`."""
    limit = C.SMALL_PASS_ENTRIES if limit is None else int(limit)
    if entries is None or entries > limit:
        return False
    from pipeline.engine.parallel import beside_local_workers

    return beside_local_workers(graph)


def weigh(entries: float | None, features: Any) -> float | None:
    """``entries`` weighed by their cost at D features (``features``: D, or the pass's
    X as an array or a list of row blocks) against D = 8's, the measurement's; as given
    when D is not known (a pass over stored tiles: no kernel to evaluate)."""
    d = features if isinstance(features, int) else n_features(features)
    if entries is None or d is None:
        return entries
    d0 = C.ENTRY_COST_D0
    return entries * (d0 + max(1, int(d))) / (d0 + SMALL_PASS_FEATURES)


def n_features(X: Any) -> int | None:
    """Columns of a pass input (an array, a Dask array or a list of row blocks), or None."""
    if X is None:
        return None
    shape = getattr(X, "shape", None)
    if shape is None and isinstance(X, list | tuple) and X:
        shape = getattr(X[0], "shape", None)
    return int(shape[1]) if shape is not None and len(shape) == 2 else None


def tile_entries(row_chunks: Any, col_chunks: Any, tiles: Any) -> int:
    """Kernel entries of ``tiles`` ((i, j) pairs) on a grid of these chunk sizes."""
    rc, cc = list(row_chunks), list(col_chunks)
    return int(sum(int(rc[i]) * int(cc[j]) for i, j in tiles))


def lower_entries(chunks: Any) -> int:
    """Kernel entries of the lower tiles (the diagonal included) of a symmetric grid."""
    c = [int(x) for x in chunks]
    total = sum(c)
    return (total * total + sum(x * x for x in c)) // 2


def n_rows(data: Any, chunks: Any = None) -> int | None:
    """Rows of a pass input (an array, a Dask array or a list of row blocks), or None
    when they are not known without computing."""
    if chunks is not None:
        return int(sum(int(x) for x in chunks))
    shape = getattr(data, "shape", None)
    if shape is not None:
        n = shape[0]
        return None if n != n else int(n)  # NaN: Dask chunks not known yet
    if isinstance(data, list | tuple):
        return sum(len(b) for b in data)
    return None
