"""Per-task costs of the tile Cholesky measured inside the real run, on each Dask worker.

:func:`install` (run on every worker with ``client.run``) wraps the calls a tile task
makes, in that worker process only: the four BLAS tile kernels of
:mod:`pipeline.engine.blas`, ``TiledArray.read_tile`` / ``write_tile`` and the tile
task itself (:func:`pipeline.linalg.cholesky._tile_task`). Each call appends
``(kind, start, end)`` (``time.perf_counter``, one clock for all the processes of a
host) to a list in the worker; :func:`collect` returns and clears it. The wrappers
cost about a microsecond per call and change no result.

:func:`inrun_costs` turns the records of one run into the cost constants of the
host model (:class:`scaling_host.Hardware` and ``scaling_model.TileCosts``): the mean
seconds per GEMM, SYRK, TRSM, POTRF, tile read and tile write, the Python work of a
task beyond those (``task_fixed``), and the gap between one task's end and the next
one's start on the same worker (the Dask round trip). Means, not medians: a wall
time is a sum of costs, heavy tails included. Nothing is fitted to a wall time.

It imports internals (the BLAS tile kernels, the tile task and the tiled store)
because it times the very calls a tile task makes, inside the real run.
"""

from __future__ import annotations

import time

import numpy as np

_LOG: list = []
_ORIG: dict = {}


def _timed(kind, fn, tag=None):
    def wrapped(*args, **kw):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kw)
        finally:
            k = kind if tag is None else tag(args)
            _LOG.append((k, t0, time.perf_counter()))

    wrapped.__wrapped__ = fn
    return wrapped


def install() -> bool:
    """Wrap the tile task's calls in this process (idempotent)."""
    from pipeline.engine import blas
    from pipeline.linalg import cholesky as chol
    from pipeline.storage.arrays import TiledArray

    if _ORIG:
        return False
    for name in ("gemm_nt_sub", "syrk_lower_sub", "trsm_right_lower_t", "potrf_lower"):
        _ORIG[(blas, name)] = getattr(blas, name)
        setattr(blas, name, _timed(name.split("_")[0], getattr(blas, name)))
    _ORIG[(TiledArray, "read_tile")] = TiledArray.read_tile
    TiledArray.read_tile = _timed(
        "read", TiledArray.read_tile, lambda a: "read_L" if a[0].name == "chol" else "read_K"
    )
    _ORIG[(TiledArray, "write_tile")] = TiledArray.write_tile
    TiledArray.write_tile = _timed("write", TiledArray.write_tile)
    # a Dask task names the tile task by reference: the worker resolves the wrapper
    _ORIG[(chol, "_tile_task")] = chol._tile_task
    chol._tile_task = _timed("task", chol._tile_task, lambda a: ("task", a[2], a[3]))
    return True


def collect() -> list:
    """This worker's records since the last call (and clear them)."""
    out = list(_LOG)
    _LOG.clear()
    return out


def uninstall() -> None:
    for (obj, name), fn in _ORIG.items():
        setattr(obj, name, fn)
    _ORIG.clear()


def _tasks(recs: list) -> list:
    return sorted((r for r in recs if isinstance(r[0], tuple)), key=lambda r: r[1])


def inrun_costs(logs: dict, serial: float = 0.0) -> dict:
    """Cost constants from one run's records (``{worker: records}``), in seconds.

    ``latency``: the mean gap between a task's end and the next task's start on the
    same worker, less the scheduler's serial dispatch ``serial`` (the host model
    charges both). Meaningful as a round-trip cost only in a 1-worker run, where the
    next task is always ready when the previous one ends.
    """
    by: dict = {}
    fixed, gaps = [], []
    for recs in logs.values():
        calls = sorted((r for r in recs if not isinstance(r[0], tuple)), key=lambda r: r[1])
        for k, t0, t1 in calls:
            by.setdefault(k, []).append(t1 - t0)
        tasks = _tasks(recs)
        for a, b in zip(tasks, tasks[1:]):
            gaps.append(b[1] - a[2])
        # the calls inside each task (one thread per worker: nested in time)
        ci = 0
        for _, t0, t1 in tasks:
            inside = 0.0
            while ci < len(calls) and calls[ci][1] < t0:
                ci += 1
            while ci < len(calls) and calls[ci][2] <= t1:
                inside += calls[ci][2] - calls[ci][1]
                ci += 1
            fixed.append(t1 - t0 - inside)
    mean = {k: float(np.mean(v)) for k, v in by.items()}
    reads = by.get("read_K", []) + by.get("read_L", [])
    out = {k: mean.get(k, 0.0) for k in ("gemm", "syrk", "trsm", "potrf", "write")}
    out["read"] = float(np.mean(reads)) if reads else 0.0
    out["read_K"] = mean.get("read_K", 0.0)
    out["read_L"] = mean.get("read_L", 0.0)
    out["n_read_L"] = len(by.get("read_L", []))
    out["task_fixed"] = float(np.mean(fixed)) if fixed else 0.0
    out["gap"] = float(np.mean(gaps)) if gaps else 0.0
    out["latency"] = max(0.0, out["gap"] - serial)
    out["tasks"] = len(fixed)
    out["task_seconds"] = float(
        sum(t1 - t0 for recs in logs.values() for _, t0, t1 in _tasks(recs))
    )
    return out
