"""The engine's in-process executor for tile DAGs: a list scheduler, critical path first.

Passes whose tiles depend on one another (the tile Cholesky: tile ``(i, j)`` needs
``(i, k)``, ``(j, k)`` for ``k < j`` and ``(j, j)``) cannot be a fixed-order
reduction like the kernel passes of :mod:`pipeline.engine.passes`. Run in this
process, they go through :func:`run_dag`; on a Dask client they are a Dask graph
run by :func:`pipeline.engine.parallel.compute`, the same executor as the kernel passes.

:func:`run_dag` runs ``run(key)`` for every key on ``n_threads`` threads. A task
becomes ready when all of its dependencies have finished; an idle thread takes
the ready task with the highest ``rank`` (the cost of its longest path to the
end, :func:`upward_ranks`). It stops at the first error and raises it. Results do
not depend on the order the tasks ran in as long as each task is a pure function
of its finished inputs, which is what the passes guarantee.

The same DAG as a Dask graph on Dask's threaded scheduler follows ``dask.order``
(its order minimises memory, tile row by tile row) and ignores priorities;
:class:`RankOrder` is a Dask callback that makes that scheduler take the ready task
of highest rank first too, as :func:`run_dag` does. On a distributed client the
same ranks go in as ``priority`` annotations.
"""

from __future__ import annotations

import heapq
import threading
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any

from dask.callbacks import Callback

__all__ = ["RankOrder", "run_dag", "serial_order", "upward_ranks"]


def _edges(
    keys: Sequence[Hashable], deps: Callable[[Hashable], Iterable[Hashable]]
) -> tuple[dict[Hashable, int], dict[Hashable, list[Hashable]]]:
    """Each key's count of unfinished dependencies within ``keys``, and its successors."""
    inside = set(keys)
    waiting: dict[Hashable, int] = {}
    succ: dict[Hashable, list[Hashable]] = {k: [] for k in keys}
    for k in keys:
        mine = [d for d in set(deps(k)) if d in inside]
        waiting[k] = len(mine)
        for d in mine:
            succ[d].append(k)
    return waiting, succ


def upward_ranks(
    keys: Sequence[Hashable],
    deps: Callable[[Hashable], Iterable[Hashable]],
    cost: Callable[[Hashable], float],
) -> dict[Hashable, float]:
    """Each key's upward rank: its cost plus the largest rank among its successors.

    ``keys`` must be in a topological order (dependencies first); dependencies
    outside ``keys`` (already finished) are ignored.
    """
    _, succ = _edges(keys, deps)
    rank: dict[Hashable, float] = {}
    for k in reversed(keys):
        rank[k] = float(cost(k)) + max((rank[s] for s in succ[k]), default=0.0)
    return rank


def serial_order(
    keys: Sequence[Hashable],
    deps: Callable[[Hashable], Iterable[Hashable]],
    rank: Mapping[Hashable, float],
) -> list[Hashable]:
    """The order :func:`run_dag` on one thread runs ``keys`` in (highest ready rank first).

    With more threads the order differs a little; passes announce this one to their
    read-ahead (:class:`pipeline.engine.tile_io.TileIO`), which reads a tile asked for
    out of turn at once.
    """
    waiting, succ = _edges(keys, deps)
    order = {k: n for n, k in enumerate(keys)}
    ready = [(-rank[k], order[k], k) for k in keys if waiting[k] == 0]
    heapq.heapify(ready)
    out: list[Hashable] = []
    while ready:
        _, _, k = heapq.heappop(ready)
        out.append(k)
        for s in succ[k]:
            waiting[s] -= 1
            if waiting[s] == 0:
                heapq.heappush(ready, (-rank[s], order[s], s))
    return out


class RankOrder(Callback):
    """Dask callback: the threaded scheduler starts the ready task of highest rank first.

    Dask's local scheduler pops its ready tasks from the end of a list that
    ``dask.order`` sorted; after every finished task (and at the start) this sorts
    that list by ``rank`` (a mapping from Dask key to priority, higher first; keys
    not in it go last, ties keep Dask's own order). Pass its ``_callback`` tuple in
    ``callbacks=`` of ``dask.compute`` (:func:`pipeline.engine.parallel.compute`), or use it
    as a context manager. Only the order changes, so the results of pure tasks do not.
    """

    def __init__(self, rank: Mapping[Hashable, float]) -> None:
        super().__init__()
        self.rank = rank

    def _sort(self, state: dict) -> None:
        get = self.rank.get
        state["ready"].sort(key=lambda k: get(k, float("-inf")))

    def _start_state(self, dsk: Any, state: dict) -> None:
        self._sort(state)

    def _posttask(self, key: Any, result: Any, dsk: Any, state: dict, worker_id: Any) -> None:
        self._sort(state)


def run_dag(
    keys: Sequence[Hashable],
    deps: Callable[[Hashable], Iterable[Hashable]],
    run: Callable[[Hashable], Any],
    *,
    rank: Mapping[Hashable, float] | None = None,
    n_threads: int = 1,
    on_done: Callable[[Hashable, Any], Any] | None = None,
    name: str = "dag",
) -> list[Any]:
    """Run ``run(key)`` for every key of a DAG on ``n_threads`` threads; return the
    results in completion order.

    Parameters
    ----------
    keys : sequence
        The tasks, in a topological order.
    deps : callable
        ``deps(key)``: the keys it needs; those not in ``keys`` count as finished.
    run : callable
        ``run(key) -> result``, called once per key, on one of the threads.
    rank : mapping, optional
        Priority of each key (higher first); default: the order of ``keys``.
    on_done : callable, optional
        ``on_done(key, result)``, called under the scheduler's lock after each task
        (e.g. a progress bar's update).
    name : str
        Prefix of the threads' names.

    Raises
    ------
    BaseException
        The first error of any task (the other threads stop taking tasks).
    RuntimeError
        Tasks left that can never become ready (a cycle in ``deps``).
    """
    if not keys:
        return []
    if rank is None:
        rank = {k: -float(n) for n, k in enumerate(keys)}
    waiting, succ = _edges(keys, deps)
    order = {k: n for n, k in enumerate(keys)}  # ties: the topological order
    ready = [(-rank[k], order[k], k) for k in keys if waiting[k] == 0]
    heapq.heapify(ready)
    cond = threading.Condition()
    results: list[Any] = []
    errors: list[BaseException] = []
    state = {"running": 0}

    def worker() -> None:
        while True:
            with cond:
                while not ready and state["running"] and not errors:
                    cond.wait()
                if errors or not ready:
                    cond.notify_all()
                    return
                _, _, k = heapq.heappop(ready)
                state["running"] += 1
            try:
                out = run(k)
            except BaseException as e:
                with cond:
                    errors.append(e)
                    state["running"] -= 1
                    cond.notify_all()
                return
            with cond:
                results.append(out)
                if on_done is not None:
                    on_done(k, out)
                state["running"] -= 1
                for s in succ[k]:
                    waiting[s] -= 1
                    if waiting[s] == 0:
                        heapq.heappush(ready, (-rank[s], order[s], s))
                cond.notify_all()

    n = max(1, min(int(n_threads), len(keys)))
    threads = [threading.Thread(target=worker, name=f"{name}-{k}", daemon=True) for k in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise errors[0]
    if len(results) != len(keys):
        raise RuntimeError(
            f"{name}: {len(keys) - len(results)} of {len(keys)} tasks never became ready "
            "(their dependencies form a cycle or name a task that failed)"
        )
    return results
