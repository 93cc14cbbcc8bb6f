"""Executors of the tile Cholesky (:mod:`pipeline.linalg.cholesky`): Dask and threads.

Both run the same tile task, :func:`pipeline.linalg.cholesky._tile_task` (a pure
function of finished tiles, passed in as ``task`` so that this module does not import
the one that imports it), in left-looking dependency order:

- :func:`_run_dask`: one Dask task per factor tile on the active client or the
  threaded scheduler; dependencies through tiny results, never tile payloads. On the
  threaded (or synchronous) scheduler the tasks share the threads executor's TileIO.
- :func:`_run_threads`: the tile engine's in-process DAG executor
  (:func:`pipeline.engine.dag.run_dag`) on a few threads of this process, the ready
  task with the longest remaining path first. Gram reads and factor writes run in
  background threads (the engine's TileIO).

Both give every BLAS/LAPACK call of a tile task the same fixed thread count
(:func:`pipeline.engine.where.tile_blas_threads`), so the factor is the same bit for
bit whatever the executor, its thread count or the order the tasks ran in.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import uuid
from typing import Any

import numpy as np

import pipeline.constants as C
from pipeline.constants import DASK_CRITICAL_PATH_FIRST
from pipeline.engine import blas as gil_free_blas
from pipeline.engine import parallel  # parallel.compute: looked up per call (tests spy on it)
from pipeline.engine.dag import RankOrder, run_dag, serial_order, upward_ranks
from pipeline.engine.parallel import blas_threads as _blas
from pipeline.engine.progress import stage_progress
from pipeline.engine.tile_io import TileIO
from pipeline.engine.where import (
    active_client,
    available_cores,
    owner_annotation,
    scheduler_in_this_process,
    tile_blas_threads,
    tile_owners,
)
from pipeline.linalg.cholesky_cache import release_worker_tiles
from pipeline.storage.rawchunks import chunk_layout, prefetch_chunk

log = logging.getLogger(__name__)


def _deps(i: int, j: int) -> list[tuple[int, int]]:
    d = [(i, k) for k in range(j)]
    if i != j:
        d += [(j, k) for k in range(j)] + [(j, j)]
    return d


def _left_looking_order(n_blocks: int) -> list[tuple[int, int]]:
    return [(i, j) for j in range(n_blocks) for i in range(j, n_blocks)]


def submitted_deps(i: int, j: int, todo_set: set) -> list[tuple[int, int]]:
    """The dependencies the Dask executor submits for tile ``(i, j)``: the transitive
    reduction of :func:`_deps` within ``todo_set``.

    Task ``(i, j)`` reads every ``(i, k)`` and ``(j, k)``, ``k < j``, and ``(j, j)``:
    ``2 j + 1`` edges, ``~T^3 / 3`` for ``T`` row blocks (311 million at N = 1M with
    1024 tiles), which the client must build and the scheduler track. ``(i, j - 1)``
    already waited for every ``(i, k)`` and ``(j - 1, k)``, and ``(j, j)`` for every
    ``(j, k)``, so those two give the same order with 2 edges. A link that is already
    stored (not in ``todo_set``: a resumed run) cannot stand for the tiles before it,
    which may still be missing: then those are listed themselves. The tile task is
    unchanged and reads only finished tiles, so the factor is the same bit for bit.
    """
    out: list[tuple[int, int]] = []
    if j:
        if (i, j - 1) in todo_set:
            out.append((i, j - 1))
        else:
            out += [(i, k) for k in range(j - 1) if (i, k) in todo_set]
    if i != j:
        if (j, j) in todo_set:
            out.append((j, j))
        else:
            out += [(j, k) for k in range(j) if (j, k) in todo_set]
    return out


def _run_dask(
    gram, L, todo, shift, lam, convention, jitter, progress, blas_threads=None, *, task
) -> list[dict]:
    from dask import delayed

    if not todo:
        return []
    # a fresh token per call: a scheduler that still holds an erred key from a failed
    # earlier call (e.g. a corrupt Gram tile since recomputed) must not replay its error
    prefix = f"chol-tile-{L.fingerprint[:10]}-{uuid.uuid4().hex[:8]}"
    nodes: dict[tuple[int, int], Any] = {}
    todo_set = set(todo)
    client = active_client()
    # worker processes of a distributed client share the host's cores: their wide
    # BLAS calls queue on a host-wide lock (the threaded scheduler's on the process's)
    host_lock = client is not None and (blas_threads or 1) > 1
    owners = tile_owners(client)
    block3 = float(L.block_size) ** 3  # ranks in tile flops; priorities in b³ units
    # critical path first, as the threads executor: ranks as priorities on a client,
    # a callback that reorders the threaded scheduler's ready list otherwise
    tile_rank = _critical_path_ranks(todo, L.block_size)
    # tasks in this process (no client, a threaded or synchronous scheduler): the threads
    # executor's read-ahead and write-behind, shared by the tasks; elsewhere (a cluster,
    # the processes scheduler) each task reads and writes its own tiles
    shared = client is None and scheduler_in_this_process()
    io = _tile_io(gram, L, todo, tile_rank, blas_threads or 1) if shared else None
    kw = {}
    if not host_lock and (blas_threads or 1) > 1 and client is None:
        # threaded scheduler, wide BLAS calls one at a time: a thread more than cores,
        # so one task's synchronous read or write overlaps the others' BLAS calls
        kw["num_workers"] = available_cores() + 1
    if client is None and DASK_CRITICAL_PATH_FIRST:
        kw["callbacks"] = [
            RankOrder({f"{prefix}-{i}-{j}": r for (i, j), r in tile_rank.items()})._callback
        ]
    # the TileIO's threads end (its queued writes done) however the graph build or the
    # compute ends
    with io if io is not None else contextlib.nullcontext():
        for i, j in todo:  # todo is in left-looking order: deps come first
            deps = [nodes[d] for d in submitted_deps(i, j, todo_set)]
            with owner_annotation(owners, i, tile_rank[(i, j)] // block3 if client else None):
                nodes[(i, j)] = delayed(task, pure=False)(
                    gram,
                    L,
                    i,
                    j,
                    shift,
                    lam,
                    convention,
                    jitter,
                    deps,
                    io=io,
                    blas_threads=blas_threads,
                    host_lock=host_lock,
                    # tasks in other processes share factor tiles through the page cache
                    host_shared=not shared and C.HOST_SHARED_FACTOR_TILES,
                    dask_key_name=f"{prefix}-{i}-{j}",
                )
        try:
            (records,) = parallel.compute(
                list(nodes.values()), progress=progress, desc="cholesky", unit="tile", **kw
            )
        finally:
            if client is not None and C.RELEASE_WORKER_TILES:
                release_on_workers(client, L)
    return list(records)


def release_on_workers(client: Any, L: Any) -> None:
    """Each worker of ``client`` drops factor ``L``'s cached tiles and its kept buffers
    (:func:`~pipeline.linalg.cholesky_cache.release_worker_tiles`); a worker that
    cannot be reached keeps them (logged, never an error: the factor is complete)."""

    try:
        client.run(release_worker_tiles, L)
    except Exception as exc:  # a worker lost meanwhile, or client.run refused
        log.info("the workers' cached factor tiles were not released (%s)", exc)


def _critical_path_ranks(todo: list[tuple[int, int]], block: int) -> dict[tuple[int, int], float]:
    """Upward rank (cost of the longest path from a tile task to the end), in tile flops."""

    def cost(t: tuple[int, int]) -> float:
        i, j = t
        upd = j * (1.0 if i == j else 2.0)  # SYRK / GEMM per earlier column, in b^3 units
        fin = 2.0 / 3.0 if i == j else 1.0  # POTRF runs at about half GEMM speed; TRSM
        return (upd + fin) * float(block) ** 3

    return upward_ranks(todo, lambda t: _deps(*t), cost)


_IO_NICED = threading.local()


def io_niceness() -> int:
    """``KRR_CHOL_IO_NICE`` (default 0: off): the niceness the threads executor's
    read-ahead and write-behind threads lower themselves to (Linux, per thread).

    An experiment for cores shared by an all-core BLAS call and the tile I/O: a
    BLAS thread preempted by an I/O thread stalls its partner threads too, so the
    I/O may cost the BLAS twice its CPU time; niced I/O runs mostly in the BLAS
    call's gaps (the read-ahead and write-behind queues are bounded). Results do
    not depend on it. Compare with ``bench_cholesky.py --modes ours-threads,ours-ionice``.
    """
    env = os.environ.get("KRR_CHOL_IO_NICE", "").strip()
    try:
        n = int(env or 0)
    except ValueError:
        n = -1
    if not 0 <= n <= 19:
        raise ValueError(f"KRR_CHOL_IO_NICE must be an integer from 0 to 19, got {env!r}")
    return n


def _niced(fn, nice: int):
    """``fn`` run with this TileIO thread's niceness raised to ``nice`` (once per thread)."""
    if nice <= 0:
        return fn

    def run(*args):
        # only TileIO's own threads: a tile thread reading out of order (or writing
        # synchronously) also drives BLAS calls, which must keep the normal priority
        own = threading.current_thread().name.startswith(("tile-read", "tile-write"))
        if own and not getattr(_IO_NICED, "done", False):
            _IO_NICED.done = True
            try:
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
            except (AttributeError, OSError):
                pass  # not Linux, or not allowed: run at the normal priority
        return fn(*args)

    return run


def _run_threads(
    gram,
    L,
    todo,
    shift,
    lam,
    convention,
    jitter,
    n_threads,
    blas_cores=None,
    wide=False,
    blas_threads=None,
    progress=False,
    *,
    task,
) -> list[dict]:
    """Run tile tasks on ``n_threads`` threads, critical path first.

    ``blas_threads`` (default :func:`~pipeline.engine.where.tile_blas_threads` of ``wide``, or
    ``blas_cores`` when ``wide`` and given): every BLAS call of every task uses
    exactly that many threads. Above one, the calls run one at a time
    (:func:`pipeline.engine.blas.serialized`); the tile threads then overlap their
    reads, copies and checksums with the BLAS call in progress.

    The engine's in-process DAG executor (:func:`pipeline.engine.dag.run_dag`): a task
    becomes ready when its dependencies finished (computed; their writes may still be
    queued); idle threads take the ready task with the longest path to the end. Gram
    reads and factor writes run in the engine's TileIO threads.
    """

    if not todo:
        return []
    rank = _critical_path_ranks(todo, L.block_size)
    n_threads = max(1, min(int(n_threads), len(todo)))
    if blas_threads is None:
        blas_threads = int(blas_cores) if (wide and blas_cores) else tile_blas_threads(wide)
    width = max(1, int(blas_threads))
    serial = gil_free_blas.serialized() if width > 1 else contextlib.nullcontext()

    def run(t: tuple[int, int]) -> dict:
        # a fixed BLAS width per task (not "every core when alone"): the bits of a tile
        # must not depend on what else happened to be running
        return task(gram, L, t[0], t[1], shift, lam, convention, jitter, io=io, blas_threads=width)

    shown_cm = stage_progress("cholesky", len(todo), "tile", enabled=progress)
    # the TileIO inside ``serial``: its first reads already wait for the calls' lock;
    # numpy's own BLAS at one thread from before its first read: a Gram tile computed
    # on demand in a read thread then takes the gaps of the tile calls (SciPy's BLAS)
    # instead of preempting them (C.GRAM_ON_DEMAND_IN_PLACE)
    with (
        serial,
        _blas(width),
        gil_free_blas.numpy_blas_single_threaded(),
        _tile_io(gram, L, todo, rank, width) as io,
        shown_cm as shown,
    ):
        # the engine's in-process DAG executor; a task is ready when its inputs are
        # computed (their writes may still be queued: TileIO serves them meanwhile)
        return run_dag(
            todo,
            lambda t: _deps(*t),
            run,
            rank=rank,
            n_threads=n_threads,
            on_done=lambda _t, _rec: shown.update(),
            name="chol",
        )


def read_gram_tile(gram: Any, i: int, j: int, first_touch: Any = None) -> np.ndarray:
    """Gram tile ``(i, j)`` for the factorisation, verified. The factor reads each Gram
    tile once, so with :data:`~pipeline.constants.DROP_READ_PAGE_CACHE` its
    chunk file leaves the page cache once read, and the next new read buffer reuses
    those pages (:func:`pipeline.storage.rawchunks.read_chunk`)."""
    drop = bool(C.DROP_READ_PAGE_CACHE)
    return gram.read_tile(i, j, first_touch=first_touch, drop_cache=drop)


def prefetch_gram_tile(gram: Any, i: int, j: int) -> None:
    """Start reading Gram tile ``(i, j)`` into the page cache in the background, for a
    task that reads its own tiles (in a worker process: no read-ahead threads) and will
    need it later (:data:`~pipeline.constants.PREFETCH_NEXT_GRAM_TILE`). Only raw
    local chunks; anything else is left alone."""
    if not C.PREFETCH_NEXT_GRAM_TILE or not isinstance(getattr(gram, "store", None), str):
        return
    layout = chunk_layout(gram.store, gram.name)
    if layout is not None and len(layout.shape) == 2:
        prefetch_chunk(layout, (int(i), int(j)))


def _tile_io(gram: Any, L: Any, todo: list, rank: dict, width: int = 1) -> TileIO:
    """The executors' TileIO: Gram tiles read ahead in the order the tasks will
    probably run (the one-thread list schedule, critical path first) and factor tiles
    written behind, so the tile threads keep the cores busy with BLAS (a few tiles of
    extra memory). With wide BLAS calls (``width`` > 1) a new read buffer is faulted
    in between two calls on every core
    (:func:`pipeline.engine.blas.first_touch_between_calls`)."""
    depth = _io_depth(gram, L)
    order = serial_order(todo, lambda t: _deps(*t), rank)
    touch = gil_free_blas.first_touch_between_calls(width) if width > 1 else None
    return TileIO(
        _niced(lambda key: read_gram_tile(gram, key[1], key[2], touch), io_niceness()),
        [("K", i, j) for i, j in order],
        depth=depth,
        max_pending=depth,
    )


def _io_depth(gram: Any, L: Any) -> int:
    """Tiles read ahead (and written behind): up to 2, within
    :data:`~pipeline.constants.IO_BUDGET_BYTES`."""
    item = max(np.dtype(gram.dtype).itemsize, np.dtype(L.dtype).itemsize)
    return int(min(2, max(1, C.IO_BUDGET_BYTES // max(L.block_size**2 * item, 1))))
