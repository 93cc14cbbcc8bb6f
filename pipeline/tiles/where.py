"""Where a small tile pass runs: here, rather than on a cluster on this machine.

A pass sent to a distributed client costs a scheduler round trip and two
serialisations, about 27-29 ms on the embedded LocalCluster whatever its size
(measured below), while a kernel product over 1,000 rows takes 4-5 ms in this
process. So a pass of at most
:data:`~pipeline.policy.constants.SMALL_PASS_ENTRIES` kernel entries runs on
Dask's threaded scheduler here when the client's workers all run on this
machine (their stores are this machine's too), with one BLAS thread per task as
the workers use, so its bits are those the workers would give. A pass whose
graph holds futures (data that lives on the workers) always goes to them, and
so does every pass of a client on other machines.
"""

from __future__ import annotations

import time
from typing import Any

from pipeline.policy import constants as C

__all__ = ["compute_here", "lower_entries", "n_rows", "runs_here", "tile_entries"]

_LOCAL: dict[tuple[int, str], tuple[bool, float]] = {}
_TTL_S = 10.0  # ask the scheduler again after this long (a worker may join)


def _workers_here(client: Any) -> bool:
    from pipeline.parallel import workers_on_this_host

    key = (id(client), str(getattr(getattr(client, "scheduler", None), "address", "")))
    now = time.monotonic()
    hit = _LOCAL.get(key)
    if hit is not None and now - hit[1] < _TTL_S:
        return hit[0]
    here = bool(workers_on_this_host(client))
    _LOCAL[key] = (here, now)
    return here


def _holds_futures(graph: Any) -> bool:
    try:
        from distributed import Future
    except ImportError:  # pragma: no cover - distributed is a dependency
        return False
    return any(isinstance(v, Future) for v in dict(graph).values())


def runs_here(entries: float | None, graph: Any, limit: int | None = None) -> bool:
    """Whether a pass over ``entries`` kernel entries (None: unknown) with Dask
    ``graph`` (None: none to check for futures) runs in this process although a
    distributed client is active (see the module docstring); ``limit``: the largest
    such pass (default :data:`~pipeline.policy.constants.SMALL_PASS_ENTRIES`). False
    without a client: the caller's default path already runs here."""
    limit = C.SMALL_PASS_ENTRIES if limit is None else int(limit)
    if entries is None or entries > limit:
        return False
    from pipeline.parallel import _active_client

    client = _active_client()
    if client is None or not _workers_here(client):
        return False
    return graph is None or not _holds_futures(graph)


def compute_here(d: Any) -> Any:
    """Compute Dask object ``d`` on the threaded scheduler in this process, one BLAS
    thread per task (as a worker runs it)."""
    import dask
    import dask.threaded

    from pipeline.parallel import blas_threads

    with blas_threads(1):
        (res,) = dask.compute(d, scheduler=dask.threaded.get, optimize_graph=False)
    return res


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
