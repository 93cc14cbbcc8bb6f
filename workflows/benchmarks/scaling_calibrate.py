"""Per-tile costs measured inside a Dask worker process, the way the tile tasks run them.

:func:`calibrate` runs on a worker (``client.submit``) of the cluster the real runs use:
BLAS tile operations through :mod:`pipeline.engine.blas` at the tasks' fixed BLAS
width (with the host lock, as the Dask executor sets it), a Gram tile read, a factor
tile write with its marker, the wide-GEMM slowdown with 1, 2, ... busy cores beside
it, and the Python cost of a whole tile task beyond those (``task_fixed``, from real
``_tile_task`` calls on the first column). :func:`scheduler_overhead` times a chain of
trivial tasks. Nothing here is fitted to the validated wall times.

It imports internals (the BLAS tile kernels, the Cholesky's tile task and the tiled
store) because it times the very operations a tile task runs, one by one, below the
public estimator.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time

import numpy as np


def _median(f, repeat: int) -> float:
    ts = []
    for _ in range(repeat):
        t = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t)
    return float(np.median(ts))


def _cores() -> int:
    import os

    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


_GEMM_LOOP = """
import numpy as np
from threadpoolctl import threadpool_limits
b = {b}
A, B, C = np.ones((b, b)), np.ones((b, b)), np.empty((b, b))
with threadpool_limits(1):
    while True:
        np.matmul(A, B.T, out=C)
"""


def _gemm_loop(b: int) -> subprocess.Popen:
    """A process running one-thread b x b GEMMs until killed."""
    return subprocess.Popen([sys.executable, "-c", _GEMM_LOOP.format(b=b)])


def calibrate(gram, width: int, host_lock: bool, max_busy: int = 2, repeat: int = 15) -> dict:
    """Costs of one tile task's parts at BLAS width ``width`` (seconds, medians)."""
    from pipeline.engine import blas
    from pipeline.linalg import cholesky as chol
    from pipeline.storage import open_tiled_array

    b = gram.block_size
    rng = np.random.default_rng(0)
    A, B = rng.normal(size=(b, b)), rng.normal(size=(b, b))
    S = A @ A.T + b * np.eye(b)
    Lf = np.linalg.cholesky(S)
    C = np.zeros((b, b))
    out: dict = {"b": b, "width": width}
    with blas.fixed_width(width, host_lock=host_lock):
        out["gemm"] = _median(lambda: blas.gemm_nt_sub(C, A, B), repeat)
        out["syrk"] = _median(lambda: blas.syrk_lower_sub(C, A), repeat)
        out["trsm"] = _median(lambda: blas.trsm_right_lower_t(Lf, B.copy()), repeat)
        out["potrf"] = _median(lambda: blas.potrf_lower(S.copy()), repeat)
        pen = [1.0]
        for k in range(1, max_busy + 1) if width > 1 else ():
            busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(k)]
            try:
                time.sleep(0.2)
                pen.append(_median(lambda: blas.gemm_nt_sub(C, A, B), repeat) / out["gemm"])
            finally:
                for p in busy:
                    p.kill()
                    p.wait()
        out["wide_penalty"] = pen
        # one-thread BLAS calls of other workers at the same time share the memory
        # system (and, on a VM, perhaps a physical core): the GEMM's slowdown with
        # 1, 2, ... other processes running the same one-thread GEMM beside it
        co = [1.0]
        for k in range(1, min(max_busy, _cores() - 1) + 1) if width == 1 else ():
            busy = [_gemm_loop(b) for _ in range(k)]
            try:
                time.sleep(0.3)
                co.append(_median(lambda: blas.gemm_nt_sub(C, A, B), repeat) / out["gemm"])
            finally:
                for p in busy:
                    p.kill()
                    p.wait()
        out["corun_penalty"] = co
    nb = gram.grid.n_row_blocks
    # distinct tiles, each read once (a tile read again comes from the page cache hot)
    rs = []
    for i, j in list(gram.grid.lower_tiles())[: 3 * repeat]:
        t = time.perf_counter()
        gram.read_tile(i, j)
        rs.append(time.perf_counter() - t)
    out["read"] = float(np.median(rs))
    with tempfile.TemporaryDirectory() as d:
        W = open_tiled_array(d, "w", (b * repeat, b), b, np.float64, "calib", overwrite=True)
        ws = []
        for r in range(repeat):
            t = time.perf_counter()
            W.write_tile(r, 0, A)
            ws.append(time.perf_counter() - t)
        out["write"] = float(np.median(ws))
        # whole first-column tasks: the Python cost beyond BLAS, the Gram read and the write
        L = open_tiled_array(d, "chol", gram.shape, b, np.float64, "calib-L", overwrite=True)
        fixed = []
        for i in range(nb):
            t = time.perf_counter()
            chol._tile_task(gram, L, i, 0, 1e-2, 1e-2, "sklearn", None,
                            blas_threads=width, host_lock=host_lock)  # fmt: skip
            op = out["potrf"] if i == 0 else out["trsm"]
            fixed.append(time.perf_counter() - t - op - out["read"] - out["write"])
        out["task_fixed"] = max(0.0, float(np.median(fixed[1:])))
    return out


def _step(x, *deps):
    return x + 1


def scheduler_costs(client, n: int = 60) -> dict:
    """Dask's per-task costs on ``client``, from trivial tasks: ``serial`` (the
    scheduler's throughput, many independent tasks), ``latency`` (a chain, one task
    after the other on one worker, minus ``serial``) and, with two workers or more,
    ``remote_dep`` (a chain alternating between two workers: the extra seconds of
    fetching a dependency's result from another worker)."""
    from dask import delayed

    workers = sorted(client.scheduler_info()["workers"])

    def chain(pin):
        node = 0
        futs = None
        for _k in range(n):
            node = delayed(_step, pure=False)(node)
        t = time.perf_counter()
        if pin is None:
            client.compute(node).result()
        else:  # submit one by one, alternating workers
            fut = client.submit(_step, 0, pure=False, workers=[pin[0]])
            for k in range(1, n):
                fut = client.submit(_step, fut, pure=False, workers=[pin[k % len(pin)]])
            futs = fut.result()
        del futs
        return (time.perf_counter() - t) / n

    t = time.perf_counter()
    futs = [client.submit(_step, k, pure=False) for k in range(4 * n)]
    client.gather(futs)
    serial = (time.perf_counter() - t) / (4 * n)
    out = {"serial": serial, "latency": max(0.0, chain(None) - serial)}
    if len(workers) > 1:
        one = chain(workers[:1])
        two = chain(workers[:2])
        out["remote_dep"] = max(0.0, two - one)
    return out


def scheduler_overhead(client, n: int = 60) -> float:
    """Seconds per task of a chain of trivial tasks on ``client`` (scheduler, comms, worker)."""
    from dask import delayed

    def step(x):
        return x + 1

    node = 0
    for _ in range(n):
        node = delayed(step, pure=False)(node)
    t = time.perf_counter()
    client.compute(node).result()
    return (time.perf_counter() - t) / n


def _rec(*deps):
    return 0


def edge_cost(client, nb: int = 40, repeat: int = 3) -> dict:
    """Dask's cost per dependency edge: the left-looking tile graph of ``nb`` row
    blocks with trivial tasks, submitted with every edge (``2 j + 1`` a task) and
    with the 2-edge reduction, rows dealt to the workers as the executor does; the
    difference in wall time over the difference in edges (medians of ``repeat``)."""
    from dask import delayed

    from pipeline.engine.where import owner_annotation, tile_owners
    from pipeline.linalg.cholesky_exec import _deps, submitted_deps

    owners = tile_owners(client)
    order = [(i, j) for j in range(nb) for i in range(j, nb)]
    todo = set(order)
    out = {}
    for name, deps_of in (("full", _deps), ("reduced", lambda i, j: submitted_deps(i, j, todo))):
        ts = []
        for r in range(repeat):
            nodes = {}
            for i, j in order:
                with owner_annotation(owners, i):
                    nodes[(i, j)] = delayed(_rec, pure=False)(
                        *[nodes[d] for d in deps_of(i, j)], dask_key_name=f"e{name}{r}-{i}-{j}"
                    )
            t = time.perf_counter()
            client.compute(list(nodes.values()), sync=True)
            ts.append(time.perf_counter() - t)
        out[name] = float(np.median(ts))
        out[f"{name}_edges"] = sum(len(deps_of(i, j)) for i, j in order)
    out["tasks"] = len(order)
    out["per_edge"] = max(
        0.0, (out["full"] - out["reduced"]) / (out["full_edges"] - out["reduced_edges"])
    )
    out["per_task"] = out["reduced"] / len(order)
    return out
