"""Running tile graphs: the embedded LocalCluster, BLAS threads, progress displays.

Every layer that builds a Dask graph calls :func:`compute` to run it, so the
scheduler (threads, a LocalCluster, or an external ``tcp://`` scheduler) is
chosen once, by whoever opened :func:`dask_client` (cli, workflows, user code).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

import dask
import dask.threaded
from threadpoolctl import threadpool_limits

from pipeline.engine.progress import resolved_mode
from pipeline.engine.progress_dask import dask_progress

log = logging.getLogger(__name__)

#: set inside :func:`in_this_process`: computations ignore the active client
_HERE: contextvars.ContextVar[bool] = contextvars.ContextVar("krr_in_this_process", default=False)


@contextlib.contextmanager
def in_this_process(enabled: bool = True) -> Iterator[None]:
    """Inside the block, this thread's computations run in this process, as if no
    distributed client were active: :func:`compute` on Dask's threaded scheduler (one
    BLAS thread per task, as on a worker), unless the user's Dask config names a local
    scheduler of its own. A plain ``dask.compute`` inside the block passes
    ``**local_scheduler()`` to do the same. For steps so small that a cluster round
    trip costs more than the work (``enabled=False``: a no-op, so callers can pass
    their rule).

    Only a context variable is set, never Dask's global config: another thread's
    computations, and a user's own ``dask.compute`` in another thread, keep the
    client, and a block that ends on one thread does not end another's."""
    if not enabled:
        yield
        return
    token = _HERE.set(True)
    try:
        yield
    finally:
        _HERE.reset(token)


def local_scheduler() -> dict[str, Any]:
    """``dask.compute`` keywords that keep a computation in this process inside
    :func:`in_this_process`: ``{"scheduler": "threads"}`` when Dask's config holds a
    client's scheduler (or none); ``{}`` outside the block, or when the user's config
    names a local scheduler (synchronous, threads, processes), which stays."""
    if not _HERE.get():
        return {}
    # a Client sets "dask.distributed" as the default scheduler
    if dask.config.get("scheduler", None) in (None, "dask.distributed", "distributed"):
        return {"scheduler": "threads"}
    return {}


def _active_client() -> Any | None:
    if _HERE.get():
        return None
    # no client can exist before distributed is imported; importing it only to ask
    # costs 0.2-0.4 s in a process's first fit (bench_no_slowdown.py caught it)
    if "distributed" not in sys.modules:
        return None
    try:
        from distributed import default_client

        return default_client()
    except (ImportError, ValueError):
        return None


def workers_on_this_host(client: Any) -> bool:
    """Whether every worker of ``client`` runs on this machine: in this process
    (``inproc://``), or at one of this machine's addresses (the embedded LocalCluster, or
    a scheduler and workers started here). False for no workers, or when the scheduler
    does not answer."""
    try:
        workers = client.scheduler_info()["workers"]
    except Exception:
        return False
    if not workers:
        return False
    local = _this_host_addresses()
    for addr, info in workers.items():
        if str(addr).startswith("inproc://"):
            continue
        host = info.get("host") if isinstance(info, dict) else None
        if host is None:
            from urllib.parse import urlsplit

            host = urlsplit(str(addr)).hostname
        if host not in local:
            return False
    return True


def _this_host_addresses() -> set[str]:
    """This machine's names and the addresses of its network interfaces."""
    import socket

    names = {"127.0.0.1", "::1", "localhost"}
    try:
        hostname = socket.gethostname()
        names.add(hostname)
        names.update(socket.gethostbyname_ex(hostname)[2])
    except OSError:
        pass
    try:
        import psutil  # a dependency of distributed, which a client needs

        for addrs in psutil.net_if_addrs().values():
            names.update(
                a.address.split("%")[0]
                for a in addrs
                if a.family in (socket.AF_INET, socket.AF_INET6)
            )
    except Exception:
        pass
    return names


#: (client, scheduler address) -> (workers all on this machine, when asked)
_LOCAL: dict[tuple[int, str], tuple[bool, float]] = {}
_LOCAL_TTL_S = 10.0  # ask the scheduler again after this long (a worker may join)


def _workers_here(client: Any) -> bool:
    key = (id(client), str(getattr(getattr(client, "scheduler", None), "address", "")))
    now = time.monotonic()
    hit = _LOCAL.get(key)
    if hit is not None and now - hit[1] < _LOCAL_TTL_S:
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


def beside_local_workers(graph: Any = None) -> bool:
    """Whether a distributed client is active, its workers all run on this machine
    (asked at most every 10 s) and Dask ``graph`` (None: none to check) holds no
    futures: a computation of the graph may then run in this process
    (:func:`in_this_process`) on the same files, without a round trip."""
    client = _active_client()
    if client is None or not _workers_here(client):
        return False
    return graph is None or not _holds_futures(graph)


@contextlib.contextmanager
def blas_threads(n: int | None) -> Iterator[None]:
    """Limit BLAS threads inside the block (None: leave as is)."""
    if n is None:
        yield
        return
    with threadpool_limits(limits=int(n), user_api="blas"):
        yield


def _in_notebook() -> bool:
    """True inside a Jupyter kernel, where progress is wanted although stderr is no TTY."""
    from pipeline.engine.progress import _in_notebook as in_notebook

    return in_notebook()


def show_progress(progress: bool = True) -> bool:
    """Whether a progress display would be drawn (asked for, and a mode other than off)."""

    return bool(progress) and resolved_mode()[0] != "off"


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

    client = _active_client()
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

    from pipeline.constants import EMBEDDED_CLUSTER_DASK_CONFIG

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
        # No warm-up of the workers' imports here: session 22 ran one on a worker thread
        # beside the first tasks, and two threads importing dask.array at once can leave
        # it half-initialised ("No dispatch for numpy.ndarray", a failed stage; session 23)
        log.info(
            "started local cluster: %d workers x %d threads, %s each (dashboard %s)%s",
            n,
            threads_per_worker,
            memory_limit,
            client.dashboard_link if dashboard else "off",
            f"; {_describe(quiet)}" if quiet else "",
        )
        yield client
