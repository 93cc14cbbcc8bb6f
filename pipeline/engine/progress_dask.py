"""The progress of Dask computations: the tile tasks done, on any scheduler.

:func:`dask_progress` gives :func:`pipeline.engine.parallel.compute` what it needs to
show one computation in the display :mod:`pipeline.engine.progress` chose: callbacks
for a local scheduler (a :class:`tqdm.dask.TqdmCallback` that counts only the
tasks of one kind, the engine's tile tasks by default) and, for a distributed
client, a wait that follows the scheduler's per-group progress (the plugin
behind :func:`distributed.progress`), ended cleanly by the scheduler so that
nothing is left running when the cluster closes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from pipeline.engine.progress import Progress, _group, log, open_progress, resolved_mode

__all__ = ["DaskProgress", "count_keys", "dask_progress", "key_matches"]


def key_matches(key: Any, match: str | None) -> bool:
    """Whether a Dask key (or a key-split group name) names a task of kind ``match``:
    one of its ``-``-separated words is ``match`` (``("gram-tile-3f2a", 0, 1)``,
    ``"chol-tile-ab12-5-3"`` and the group ``"gram-tile"`` match ``"tile"``)."""
    if match is None:
        return True
    name = key[0] if isinstance(key, tuple) and key else key
    if isinstance(name, bytes):
        name = name.decode(errors="replace")
    return any(w.lstrip("_") == match for w in str(name).split("-"))


def count_keys(collections: Any, match: str | None) -> int:
    """How many keys of the collections' graphs are of kind ``match`` (0 if none)."""
    if match is None:
        return 0
    n = 0
    for c in collections:
        graph = getattr(c, "__dask_graph__", None)
        if graph is None:
            continue
        n += sum(1 for k in graph() if key_matches(k, match))
    return n


class DaskProgress:
    """What :func:`dask_progress` yields: ``callbacks`` for a local Dask scheduler
    and :meth:`wait` for the futures of a distributed client."""

    def __init__(self, label, unit, match, initial, enabled):
        self.label, self.unit, self.match = label, unit, match
        self.initial = initial
        self.enabled = enabled
        self.bar: Progress | None = None
        self.used: str | None = None  # "callback" or "distributed", for tests and logs

    def _open(self, total: int) -> Progress:
        group = _group.get()
        total = total + self.initial if total else None
        if self.bar is None:
            if group is not None:
                self.bar = group.phase(self.label, total, self.unit, self.initial)
                self._owned = False
            else:
                self.bar = open_progress(self.label, total, self.unit, initial=self.initial)
                self._owned = True
        else:
            self.bar.set_total(total)
        return self.bar

    @property
    def callbacks(self) -> list[Any]:
        """The callback tuples to pass as ``dask.compute(..., callbacks=...)`` (with
        the callbacks registered globally, which an explicit list would bypass)."""
        if not self.enabled or resolved_mode()[0] == "off":
            return []
        from dask.callbacks import Callback

        if self._callback is None:
            self._callback = _TileCallback(self)._callback
        return [*Callback.active, self._callback]

    def wait(self, futures: Any) -> None:
        """Block until ``futures`` finish, updating the display from the scheduler's
        progress feed (the tasks of kind ``match`` of the graph, else all tasks)."""
        from distributed import wait

        if not self.enabled or resolved_mode()[0] == "off":
            wait(futures)
            return
        self.used = "distributed"
        bar = self._open(self._expected) if self._expected else None
        try:
            _watch_futures(self, futures)
        except Exception as e:  # a scheduler that refuses the progress feed: just wait
            log.debug("no progress feed from the scheduler (%s); waiting", e)
        wait(futures)
        del bar

    _expected = 0
    _owned = False
    _callback: tuple | None = None

    def close(self, failed: bool) -> None:
        if self.bar is not None and self._owned:
            self.bar.close(failed=failed)


def _tile_callback_class() -> type:
    from tqdm.dask import TqdmCallback

    class TileCallback(TqdmCallback):
        """``tqdm.dask.TqdmCallback`` counting only the tasks of one kind (the tiles)."""

        def __init__(self, tracker: DaskProgress) -> None:
            super().__init__(tqdm_class=tracker._open)
            self.tracker = tracker
            self.counted: set | None = None

        def _start_state(self, dsk: Any, state: dict) -> None:
            keys = [k for s in ("ready", "waiting", "running", "finished") for k in state[s]]
            match = self.tracker.match
            sel = {k for k in keys if key_matches(k, match)} if match else set()
            self.counted = sel or None
            self.tracker.used = "callback"
            self.pbar = self.tqdm_class(total=len(sel) if sel else len(keys))

        def _posttask(self, key: Any, *args: Any, **kwargs: Any) -> None:
            if self.counted is None or key in self.counted:
                self.pbar.update()

        def _finish(self, *args: Any, **kwargs: Any) -> None:
            pass  # the display closes with the dask_progress block (or its group)

    return TileCallback


def _TileCallback(tracker: DaskProgress) -> Any:  # noqa: N802 - a class, built lazily
    global _TILE_CALLBACK
    if _TILE_CALLBACK is None:
        _TILE_CALLBACK = _tile_callback_class()
    return _TILE_CALLBACK(tracker)


_TILE_CALLBACK: type | None = None


#: how often the scheduler sends the progress of a computation (seconds)
FEED_INTERVAL = 0.1


def _watch_futures(tracker: DaskProgress, futures: list) -> None:
    """Follow the scheduler's per-group progress of ``futures`` (the plugin behind
    :func:`distributed.progress`), until the scheduler ends the feed."""
    match = tracker.match

    def draw(response: dict) -> None:
        all_, remaining = response["all"], response["remaining"]
        groups = [g for g in all_ if key_matches(g, match)] or list(all_)
        total = sum(all_[g] for g in groups)
        left = sum(remaining.get(g, 0) for g in groups)
        expected = tracker._expected
        if expected and total < expected:  # parts finished before the feed started
            total, left = expected, min(left, expected)
        done = total if response["status"] == "finished" else total - left
        tracker._open(total).update_to(tracker.initial + done)

    client = futures[0].client
    client.sync(_listen, client, [f.key for f in futures], draw)


async def _listen(client: Any, keys: list, draw: Callable[[dict], None]) -> None:
    from dask.utils import key_split
    from distributed.core import CommClosedError, connect
    from distributed.diagnostics.progress import MultiProgress
    from distributed.protocol.pickle import dumps

    async def setup(scheduler: Any) -> Any:
        p = MultiProgress(keys, scheduler, complete=True, group_by=key_split)
        await p.setup()
        return p

    sent_last: list[bool] = []

    def function(scheduler: Any, p: Any) -> dict:
        # after the last state went out, end the scheduler's feed loop cleanly (it
        # stops on OSError): it must not be left sleeping when the cluster closes
        if sent_last:
            raise OSError("progress feed complete")
        if p.status in ("finished", "error"):
            sent_last.append(True)
        return {
            "all": {k: len(v) for k, v in p.all_keys.items()},
            "remaining": {k: len(v) for k, v in p.keys.items()},
            "status": p.status,
        }

    comm = await connect(client.scheduler.address, **client.connection_args)
    try:
        await comm.write(
            {
                "op": "feed",
                "setup": dumps(setup),
                "function": dumps(function),
                "interval": FEED_INTERVAL,
            },
            serializers=client._serializers,
        )
        while True:
            try:
                response = await comm.read(deserializers=client._deserializers)
            except CommClosedError:
                break
            if not (isinstance(response, dict) and "all" in response):
                break  # the feed's end (the server's reply to the op) or an error
            draw(response)
    finally:
        await comm.close()


@contextlib.contextmanager
def dask_progress(
    label: str,
    unit: str = "tile",
    *,
    enabled: bool = True,
    match: str | None = None,
    initial: float = 0,
    collections: Any = (),
) -> Iterator[DaskProgress]:
    """Show the progress of one Dask computation.

    ``with dask_progress("gram", collections=[graph]) as p:`` then either
    ``dask.compute(graph, callbacks=p.callbacks)`` (threaded or synchronous
    scheduler: a :class:`tqdm.dask.TqdmCallback` counting the tasks of kind
    ``match``) or ``futures = client.compute(graph); p.wait(futures)`` (a
    distributed client: the scheduler's progress feed, grouped by task name).
    :func:`pipeline.engine.parallel.compute` does this.

    Parameters
    ----------
    label : str
        Names the stage (``"gram"``, ``"predict"``).
    unit : str
        What is counted. ``"tile"`` counts the tile tasks of the engine
        (keys with the word ``tile``); other units count the tasks of kind
        ``match``, or every task when ``match`` is None or matches none.
    enabled : bool
        False: no display whatever the mode.
    match : str, optional
        Task kind to count (default ``"tile"`` for ``unit="tile"``).
    initial : float
        Units done before (a resumed build): part of the total, not of the rate.
    collections : sequence, optional
        The collections to compute: their matching keys give the total up
        front on a cluster (whose feed may start after fast tasks finished).
    """
    if match is None and unit == "tile":
        match = "tile"
    tracker = DaskProgress(label, unit, match, initial, enabled)
    if enabled and collections:
        tracker._expected = count_keys(collections, match)
    failed = True
    try:
        yield tracker
        failed = False
    finally:
        tracker.close(failed)
