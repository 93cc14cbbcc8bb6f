"""Running tile graphs: the embedded LocalCluster, BLAS threads, progress displays.

Every layer that builds a Dask graph calls :func:`compute` to run it, so the
scheduler (threads, a LocalCluster, or an external ``tcp://`` scheduler) is
chosen once, by whoever opened :func:`dask_client` (cli, workflows, user code).
Whether a computation goes to that client or stays in this process is decided in
:mod:`pipeline.engine.where` (:func:`~pipeline.engine.where.in_this_process`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from collections.abc import Iterator
from typing import Any

import dask
import dask.threaded
from threadpoolctl import ThreadpoolController

from pipeline.constants import EMBEDDED_CLUSTER_DASK_CONFIG
from pipeline.engine.progress_dask import dask_progress
from pipeline.engine.where import active_client, local_scheduler

log = logging.getLogger(__name__)


def restore_environ(saved: dict[str, str | None]) -> None:
    """Put the environment variables ``saved`` (name -> value, None: unset) back."""
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


#: held while native libraries are listed (threadpoolctl) or loaded lazily (numba, by
#: :mod:`pipeline.engine.compiled`). threadpoolctl lists them with ``dl_iterate_phdr``, whose
#: callback needs the GIL while it holds the loader's lock; an extension module being
#: imported in another thread holds the GIL while it waits for that lock in ``dlopen``:
#: the two together deadlock the whole process (no signal handler runs, no test timeout
#: fires), as a fresh CI environment's first import of numba in a tile task did.
native_lock = threading.RLock()

_controller: list[Any] = [None, -1]  # threadpoolctl's controller, len(sys.modules) then


def _blas_controller() -> ThreadpoolController:
    """One threadpoolctl controller: its scan of the loaded libraries costs ~6 ms, so it
    is made anew only when modules were imported since (a new extension module may have
    loaded another BLAS), and only in the main thread, where :func:`compute` refreshes it
    before any tile task runs. A tile task (another thread) reuses the one there is: a
    scan there could meet another task's import (see :data:`native_lock`)."""
    loaded = len(sys.modules)
    with native_lock:
        stale = _controller[1] != loaded and threading.current_thread() is threading.main_thread()
        if _controller[0] is None or stale:
            _controller[:] = [ThreadpoolController(), loaded]
        return _controller[0]


@contextlib.contextmanager
def blas_threads(n: int | None) -> Iterator[None]:
    """Limit BLAS threads inside the block (None: leave as is); nothing to do, and no
    library scan, when every BLAS already runs ``n`` threads."""
    if n is None:
        yield
        return
    ctl = _blas_controller()
    if all(c.num_threads == int(n) for c in ctl.select(user_api="blas").lib_controllers):
        yield
        return
    with ctl.limit(limits=int(n), user_api="blas"):
        yield


def compute(
    *collections: Any,
    progress: bool = True,
    desc: str = "",
    unit: str = "task",
    match: str | None = None,
    initial: int = 0,
    **kwargs: Any,
) -> Any:
    """Compute Dask collections on the active scheduler with a labelled progress display.

    Under a distributed client the tasks run on its workers (which use one BLAS
    thread each); otherwise Dask's threaded scheduler runs them with BLAS held
    to one thread per Dask thread, as ``docs/PERFORMANCE.md`` explains.

    The display (:mod:`pipeline.engine.progress`: a bar, timestamped lines or nothing,
    on stderr) is labelled ``desc`` and counts ``unit``: the tasks of kind
    ``match`` (``unit="tile"``: the tile tasks), else every task; ``initial``
    units were done before (a resumed build).
    """

    client = active_client()
    with dask_progress(
        desc or "dask",
        unit,
        enabled=bool(progress),
        match=match,
        initial=initial,
        collections=collections if client is not None else (),
    ) as shown:
        if client is not None:
            futures = client.compute(list(collections), **kwargs)
            if futures:
                shown.wait(futures)
            results = client.gather(futures)
            return tuple(results)
        with blas_threads(1):
            callbacks = shown.callbacks
            if callbacks:
                kwargs["callbacks"] = [*kwargs.get("callbacks", ()), *callbacks]
            for key, value in local_scheduler().items():  # inside in_this_process
                kwargs.setdefault(key, value)
            if "distributed" not in sys.modules and dask.config.get("scheduler", None) is None:
                # what dask would choose, without its import of distributed to look
                # for a client that cannot exist (0.2-0.4 s on a first small fit)
                kwargs.setdefault("scheduler", dask.threaded.get)
            return dask.compute(*collections, **kwargs)


def embedded_cluster_config() -> dict[str, Any]:
    """The Dask settings :func:`dask_client` gives the cluster it starts
    (:data:`~pipeline.constants.EMBEDDED_CLUSTER_DASK_CONFIG`: no worker
    profiler, slower event-loop ticks), each only where the user's Dask config still
    holds Dask's default: a value set in a Dask YAML file or a ``DASK_*`` variable wins."""
    import distributed  # noqa: F401  (registers the distributed.* defaults)

    defaults = dask.config.merge(*dask.config.defaults)
    return {
        key: value
        for key, value in EMBEDDED_CLUSTER_DASK_CONFIG.items()
        if dask.config.get(key, None) == dask.config.get(key, None, config=defaults)
    }


def _describe(settings: dict[str, Any]) -> str:
    """The embedded cluster's settings, for its start-up log line: the Dask keys, so a
    reader can find them (and set them otherwise in their own Dask config)."""
    keys = ", ".join(f"{k}={v}" for k, v in settings.items())
    return f"Dask settings {keys} (EMBEDDED_CLUSTER_DASK_CONFIG)"


@contextlib.contextmanager
def dask_client(
    address: str | None = None,
    *,
    n_workers: int | None = None,
    threads_per_worker: int = 1,
    memory_limit: str | int = "4GiB",
    processes: bool = True,
    dashboard: bool = False,
) -> Iterator[Any]:
    """A distributed client: connect to ``address``, or start the embedded LocalCluster.

    Parameters
    ----------
    address : str, optional
        ``tcp://host:port`` of an existing scheduler. None starts a LocalCluster.
    n_workers : int, optional
        Workers of the local cluster (default: one per core).
    memory_limit : str or int
        Per-worker memory limit of the local cluster. Always explicit: Dask's
        default is the whole machine per worker. Not applied with
        ``processes=False``: in-process workers would measure the whole
        process's memory against it, pause above 80 % of it and never resume
        (a hang, not an error).
    """
    from distributed import Client, LocalCluster

    if address:
        with Client(address) as client:
            log.info("connected to scheduler %s (dashboard %s)", address, client.dashboard_link)
            yield client
        return
    n = n_workers or os.cpu_count() or 1
    if not processes and memory_limit:
        log.info(
            "in-process workers (processes=False): memory_limit %s not applied "
            "(it would be checked against the whole process's memory)",
            memory_limit,
        )
        memory_limit = 0
    saved = {
        k: os.environ.get(k) for k in dask.config.get("distributed.nanny.pre-spawn-environ", {})
    }
    with contextlib.ExitStack() as stack:
        # read by the scheduler, the nannies (which pass it to their worker processes)
        # and the workers as they start: set only while they are created
        quiet = embedded_cluster_config()
        with dask.config.set(quiet):
            cluster = stack.enter_context(
                LocalCluster(
                    n_workers=n,
                    threads_per_worker=threads_per_worker,
                    memory_limit=memory_limit,
                    processes=processes,
                    dashboard_address=":0",  # a free port: never collide with another cluster
                )
            )
            client = stack.enter_context(Client(cluster))
        # a nanny sets its pre-spawn environment (OMP/OPENBLAS/MKL_NUM_THREADS=1, ...) in
        # THIS process's os.environ before it spawns a worker, and never undoes it: every
        # child the caller starts afterwards (a subprocess, a second krr run) would run BLAS
        # on one thread, with other last bits; put the caller's environment back now and
        # when the cluster closes (a restarted worker sets it again)
        restore_environ(saved)
        stack.callback(restore_environ, saved)
        # No warm-up of the workers' imports here: one on a worker thread beside the first
        # tasks lets two threads import dask.array at once, which can leave it
        # half-initialised ("No dispatch for numpy.ndarray", a failed stage)
        log.info(
            "started local cluster: %d workers x %d threads, %s each (dashboard %s)%s",
            n,
            threads_per_worker,
            memory_limit,
            client.dashboard_link if dashboard else "off",
            f"; {_describe(quiet)}" if quiet else "",
        )
        yield client
