"""Where work runs: every where-does-it-run decision of the package, in one module.

The layers above call these rules and restate none:

- **This process or the client** (:func:`in_this_process`, :func:`local_scheduler`,
  :func:`active_client`, :func:`scheduler_kind`): whether a computation goes to the
  active distributed client or stays here, and on which local Dask scheduler.
- **The client's workers** (:func:`workers_on_this_host`,
  :func:`beside_local_workers`, :func:`cluster_workers`, :func:`tile_owners`,
  :func:`owner_annotation`): whether they run on this machine, how many tiles are
  dealt to, and which worker a tile row prefers.
- **Small steps stay here** (:func:`runs_here`, :func:`weigh`, :func:`runs_inline`): see
  below.
- **The tile Cholesky's executor** (:func:`auto_scheduler`, :func:`factor_executor`,
  :func:`factor_threads_here`, :func:`gram_on_demand`): threads in this process or
  one Dask task per tile on the client's workers.
- **Threads and BLAS width** (:func:`available_cores`, :func:`task_threads`,
  :func:`tile_blas_threads`, :func:`sweep_threads`, :func:`factor_threads`).

:mod:`pipeline.engine.parallel` runs what these rules decide (``compute``, the
embedded cluster, ``blas_threads``); :mod:`pipeline.engine.placement` holds the
plan's measured :class:`~pipeline.engine.placement.Resources` and the tile size.

Small steps
-----------
A pass sent to a distributed client costs a scheduler round trip, more than a small
pass's work (docs/PERFORMANCE.md#model-selection). So a pass of at most
:data:`~pipeline.constants.SMALL_PASS_ENTRIES` kernel entries (weighed by
:func:`weigh` at the pass's D) runs on Dask's threaded scheduler here when the
client's workers all run on this machine, one BLAS thread per task as on the
workers, so its bits are those the workers would give. A pass whose graph holds
futures, and every pass of a client on other machines, goes to the workers.

A pass that runs here and is tinier still, at most
:data:`~pipeline.constants.INLINE_PASS_ENTRIES` weighed entries without a progress
display (an iteration's matvec on a few hundred rows, a few kernel columns), runs in
the calling thread on Dask's synchronous scheduler (:func:`runs_inline`): the threaded
scheduler's own work costs more than such a pass's. Each tile task is a pure function
and each row block adds its parts in the graph's fixed order, so its bits are the
threaded scheduler's.
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
import dask.local
import dask.threaded

import pipeline.constants as C

__all__ = [
    "active_client",
    "auto_scheduler",
    "available_cores",
    "beside_local_workers",
    "cluster_workers",
    "factor_executor",
    "factor_threads",
    "factor_threads_here",
    "gram_on_demand",
    "in_this_process",
    "local_scheduler",
    "local_scheduler_function",
    "lower_entries",
    "n_features",
    "n_rows",
    "owner_annotation",
    "runs_here",
    "runs_inline",
    "scheduler_in_this_process",
    "scheduler_kind",
    "sweep_threads",
    "task_threads",
    "tile_blas_threads",
    "tile_entries",
    "tile_owners",
    "weigh",
    "workers_on_this_host",
]

#: the loggers of the factor executor's lines: their names stay those of the modules the
#: decisions came from, which log formats with ``%(name)s`` (``run.log``) print
_factor_log = logging.getLogger("pipeline.linalg.cholesky_exec")
_fit_log = logging.getLogger("pipeline.fit")


# -- this process or the client -------------------------------------------------------
#: set inside :func:`in_this_process`: computations ignore the active client
_HERE: contextvars.ContextVar[bool] = contextvars.ContextVar("krr_in_this_process", default=False)


@contextlib.contextmanager
def in_this_process(enabled: bool = True) -> Iterator[None]:
    """Inside the block, this thread's computations run in this process, as if no
    distributed client were active: :func:`pipeline.engine.parallel.compute` on Dask's
    threaded scheduler (one BLAS thread per task, as on a worker), unless the user's
    Dask config names a local scheduler of its own. A plain ``dask.compute`` inside the
    block passes ``**local_scheduler()`` to do the same. ``enabled=False``: a no-op,
    so callers can pass their rule.

    Only a context variable is set, never Dask's global config: other threads keep
    the client."""
    if not enabled:
        yield
        return
    token = _HERE.set(True)
    try:
        yield
    finally:
        _HERE.reset(token)


#: Dask's names of its local schedulers, by kind
_SCHEDULER_NAMES = {
    "sync": "sync",
    "synchronous": "sync",
    "single-threaded": "sync",
    "threads": "threads",
    "threading": "threads",
    "processes": "processes",
    "multiprocessing": "processes",
    "dask.distributed": "distributed",
    "distributed": "distributed",
}


def scheduler_kind() -> str | None:
    """The scheduler Dask's config names (``dask.config.get("scheduler")``), by kind:
    None (not set: Dask's default, threads without a client), "sync", "threads",
    "processes", "distributed" (a Client sets it), or "other" (a scheduler function
    of another kind, e.g. a client's ``get``). A local scheduler's function counts
    as its name."""
    s = dask.config.get("scheduler", None)
    if s is None:
        return None
    if isinstance(s, str):
        return _SCHEDULER_NAMES.get(s, "other")
    if s is dask.threaded.get:
        return "threads"
    if s is dask.local.get_sync:
        return "sync"
    return "other"


def scheduler_in_this_process() -> bool:
    """Whether Dask's configured scheduler (no client) runs tasks in this process: the
    threaded one (the default) or the synchronous one, not the processes scheduler."""
    return scheduler_kind() in (None, "threads", "sync")


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


def local_scheduler_function() -> Any:
    """The scheduler function of a pass over in-memory data run here
    (:func:`pipeline.engine.passes.execute` ``local=True``): the configured synchronous
    one, else threads (a processes scheduler would only pickle the data). A function,
    not its name: for a name, dask imports distributed to look for a client."""
    if scheduler_kind() == "sync":
        return dask.local.get_sync
    return dask.threaded.get


def active_client() -> Any | None:
    """The active distributed client, or None: none exists, or inside
    :func:`in_this_process`."""
    if _HERE.get():
        return None
    # no client can exist before distributed is imported (importing it to ask is slow)
    if "distributed" not in sys.modules:
        return None
    try:
        from distributed import default_client

        return default_client()
    except (ImportError, ValueError):
        return None


# -- the client's workers -------------------------------------------------------------
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
    client = active_client()
    if client is None or not _workers_here(client):
        return False
    return graph is None or not _holds_futures(graph)


def tile_owners(client: Any) -> list[str]:
    """The workers of a distributed ``client`` that tile rows are dealt to (sorted
    addresses; empty without a client or with one worker)."""
    if client is None:
        return []
    try:
        workers = sorted(client.scheduler_info()["workers"])
    except Exception:  # no scheduler info (e.g. a closing client): no preference
        return []
    return workers if len(workers) > 1 else []


def cluster_workers() -> tuple[int, bool]:
    """(workers of the active client that tiles are dealt to, 1 without a client or with
    one worker; whether those workers all run on this machine), as a fit measures them
    for its plan (:class:`~pipeline.engine.placement.Resources`)."""
    client = active_client()
    workers = max(1, len(tile_owners(client)))
    return workers, workers >= 2 and workers_on_this_host(client)


def owner_annotation(
    owners: list[str], i: int, priority: float | None = None
) -> contextlib.AbstractContextManager:
    """Prefer worker ``owners[i % len(owners)]`` for the tasks of tile row ``i``, and
    give them ``priority`` (a distributed scheduler runs higher priorities first).

    Without it Dask follows the tiny dependency records and puts every tile task on
    one worker. Rows dealt round-robin (1-D block-cyclic, as in ScaLAPACK) spread each
    column's tasks over the workers, which reuse their own rows' factor tiles.
    ``allow_other_workers``: a lost or busy worker's tasks still run elsewhere.
    Results do not depend on the placement (every task has a fixed BLAS width).
    """
    notes: dict[str, Any] = {}
    if owners:
        notes.update(workers=[owners[i % len(owners)]], allow_other_workers=True)
    if priority is not None:
        notes["priority"] = int(priority)
    if not notes:
        return contextlib.nullcontext()
    return dask.annotate(**notes)


# -- small steps stay here ------------------------------------------------------------
#: the D at which SMALL_PASS_ENTRIES was measured (RBF)
SMALL_PASS_FEATURES = 8


def runs_here(entries: float | None, graph: Any, limit: int | None = None) -> bool:
    """Whether a pass over ``entries`` kernel entries (None: unknown) with Dask
    ``graph`` (None: none to check for futures) runs in this process although a
    distributed client is active (see the module docstring); ``limit``: the largest
    such pass (default :data:`~pipeline.constants.SMALL_PASS_ENTRIES`, entries
    at D = 8: pass kernel entries through :func:`weigh`, so a pass is small by its
    time). False without a client: the caller's default path already runs here; the
    caller runs it under :func:`in_this_process`."""
    limit = C.SMALL_PASS_ENTRIES if limit is None else int(limit)
    if entries is None or entries > limit:
        return False
    return beside_local_workers(graph)


def runs_inline(entries: float | None, here: bool, progress: bool = False) -> bool:
    """Whether a pass over ``entries`` weighed kernel entries (None: unknown) runs in the
    calling thread on Dask's synchronous scheduler: it is at most
    :data:`~pipeline.constants.INLINE_PASS_ENTRIES`, shows no ``progress`` display, and
    runs in this process on a scheduler of this process (``here``: the caller's
    :func:`runs_here`, or no client is active; not when the user's Dask config names
    the processes scheduler or another one). See the module docstring."""
    if progress or entries is None or entries > C.INLINE_PASS_ENTRIES:
        return False
    if here or _HERE.get():
        return scheduler_kind() in (None, "threads", "sync", "distributed")
    return active_client() is None and scheduler_in_this_process()


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


# -- the tile Cholesky's executor -----------------------------------------------------
def factor_threads_here(factor_scheduler: str, workers_here: bool, in_place_from_x: bool) -> bool:
    """Whether the tile Cholesky runs on the threads executor in this process rather
    than as one Dask task per tile on a distributed client's workers (``workers_here``:
    they all run on this machine): ``"threads"`` always, ``"dask"`` never; ``"auto"``
    for an in-place factor that computes its Gram from X in this process
    (``in_place_from_x``, :func:`gram_on_demand`), or when the workers run on this
    machine (:data:`~pipeline.constants.FACTOR_THREADS_ON_THIS_HOST`). The rule of
    :func:`factor_executor` on the live client, and of the plan's
    :func:`~pipeline.engine.placement.tiles_on_workers` on its measured resources."""
    if factor_scheduler != "auto":
        return factor_scheduler != "dask"
    return bool(in_place_from_x or (C.FACTOR_THREADS_ON_THIS_HOST and workers_here))


def auto_scheduler(say: bool = False) -> str:
    """The executor of ``scheduler="auto"``: "threads" (in this process) without a
    distributed client, or with one whose workers all run on this machine
    (:data:`~pipeline.constants.FACTOR_THREADS_ON_THIS_HOST`); "dask" (one task
    per tile on the client's workers) when they run elsewhere. ``say``: log the choice
    when a client is passed over."""
    client = active_client()
    if client is None:
        return "threads"
    if C.FACTOR_THREADS_ON_THIS_HOST and workers_on_this_host(client):
        if say:
            _factor_log.info(
                "factor: the threads executor in this process (the cluster's workers run "
                "on this machine, where it is the faster; factor_scheduler='dask' runs the "
                "tiles on them)"
            )
        return "threads"
    return "dask"


def factor_executor(solver: str, factor_scheduler: str, in_place_from_x: bool) -> str | None:
    """The tile Cholesky's executor of a fit, decided once per fit: "threads" or
    "dask" (None when ``solver`` does not factor). ``factor_scheduler="auto"`` runs an
    in-place factor whose Gram tiles come from X in this process's memory
    (``in_place_from_x``) on threads here, as ``krr run``'s gram stage assumes when it
    stores no Gram (:func:`gram_on_demand`, the one rule: only ``"dask"`` sends it to
    the workers); otherwise "auto" asks the cluster once (:func:`auto_scheduler`)."""
    if solver != "cholesky":
        return None
    if factor_scheduler != "auto":
        return factor_scheduler
    if in_place_from_x:
        if active_client() is not None:
            _fit_log.info(
                "factor: the threads executor in this process, which holds X: the Gram "
                "is not stored, each tile is computed from X as the factor needs it "
                "(factor_scheduler='dask' stores the Gram and factors on the workers)"
            )
        return "threads"
    return auto_scheduler(say=True)


def gram_on_demand(solver: str, keep_gram: bool, x_in_memory: bool, factor_runs_here: bool) -> bool:
    """Whether the Gram is not stored first (``build_gram(defer=True)``): an in-place
    Cholesky (``keep_gram=False``) whose factor runs in this process, with X in memory,
    computes each Gram tile from X when it needs it (``GRAM_ON_DEMAND_IN_PLACE``). The
    one rule ``fit.execute`` and ``krr run``'s gram stage both apply."""
    return bool(
        C.GRAM_ON_DEMAND_IN_PLACE
        and solver == "cholesky"
        and not keep_gram
        and x_in_memory
        and factor_runs_here
    )


# -- threads and BLAS width -----------------------------------------------------------
def available_cores() -> int:
    """CPU cores this process may run on (its CPU affinity mask, e.g. taskset)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def task_threads(n_tasks: int, *, concurrency: int | None = None) -> int:
    """Inner threads for each of ``n_tasks`` Dask tasks that run fused calls:
    ``cores // min(n_tasks, concurrency)``, at least 1.

    ``concurrency`` defaults to dask's ``num_workers`` setting, else the core count
    (also under a distributed client); 1 under the synchronous scheduler.
    """
    cores = available_cores()
    if concurrency is None:
        if scheduler_kind() == "sync":
            concurrency = 1
        else:
            concurrency = int(dask.config.get("num_workers", None) or cores)
    busy = max(1, min(int(n_tasks), int(concurrency)))
    return max(1, cores // busy)


def tile_blas_threads(wide: bool = True) -> int:
    """BLAS threads of every tile task of the tile Cholesky: ``KRR_CHOL_BLAS_THREADS``
    if set, else all cores (``wide``) or 1. It defines the factor's last bits (OpenBLAS
    rounds differently with another thread count), so both executors use it."""
    env = os.environ.get("KRR_CHOL_BLAS_THREADS")
    if env:
        try:
            n = int(env)
        except ValueError:
            n = 0
        if n < 1:
            raise ValueError(f"KRR_CHOL_BLAS_THREADS must be an integer >= 1, got {env!r}")
        return n
    if not wide:
        return 1
    return available_cores()


def factor_threads(n_threads: int | None, scheduler: str = "threads") -> int:
    """Tile threads of the tile Cholesky's ``scheduler`` in this process: ``n_threads``,
    else one per core; 1 under ``"dask"`` (each worker task runs one tile)."""
    if scheduler == "dask":
        return 1
    return int(n_threads or available_cores())


def sweep_threads() -> int:
    """Tile threads of a forward or back sweep: one per core (each task's BLAS on one
    thread)."""
    return available_cores()
