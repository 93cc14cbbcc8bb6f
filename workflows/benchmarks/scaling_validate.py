"""Validation of the scaling model against real runs of the tile Cholesky on 1, 2, 3 workers.

:func:`validate` builds a Gram, then on LocalClusters of 1, 2 and 3 single-thread
worker processes on this host times the real call
``tile_cholesky(g, lam, scheduler="dask")`` (the same call as a user's), with every
worker instrumented (:mod:`scaling_inrun`: each BLAS call, tile read and write and
tile task timed inside the run). It replays the graph on this host
(:class:`scaling_host.Hardware`: ``cpu_count`` cores shared by the workers and the
scheduler) twice:

* **in-run costs** (the model this validation is about): the mean cost of every
  operation, the Python work of a task beyond them and the gap between tasks, as
  measured inside the *1-worker* real run; the 2- and 3-worker rows are then
  predictions from the 1-worker run (the 1-worker row is a consistency check of the
  replay, not a prediction);
* **isolated costs** (the earlier calibration, :func:`scaling_calibrate.calibrate`):
  each operation timed alone in a warm worker, medians; kept for comparison.

Dask's per-task costs (``serial``, ``remote_dep``) come from trivial tasks on the
same clusters. Nothing is fitted to the real wall times.

It imports internals (the Gram builder, the kernels and the tile Cholesky's executor
helpers) because it times the very call the scaling model replays.
"""

from __future__ import annotations

import math
import os
import tempfile
import time

import numpy as np


def _import(name):
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError:  # imported as a module of the package
        return importlib.import_module(f"workflows.benchmarks.{name}")


def _busy_cores_total() -> float:
    """CPU seconds all processes of this host have used (``/proc/stat``; 0 elsewhere)."""
    try:
        with open("/proc/stat") as f:
            v = [float(x) for x in f.readline().split()[1:]]
    except OSError:
        return 0.0
    idle = v[3] + (v[4] if len(v) > 4 else 0.0)
    return (sum(v[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _own_cpu() -> float:
    """CPU seconds of this process and its children (the cluster's processes)."""
    import psutil

    me = psutil.Process()
    total = sum(me.cpu_times()[:2])
    for ch in me.children(recursive=True):
        try:
            total += sum(ch.cpu_times()[:2])
        except psutil.Error:
            pass
    return total


def _warm_worker() -> None:
    """Import what a tile task imports (numpy, SciPy's BLAS, Zarr, the solver)."""
    import scipy.linalg.cython_blas  # noqa: F401
    import zarr  # noqa: F401

    from pipeline.engine import blas
    from pipeline.linalg import cholesky  # noqa: F401

    blas._blas_controllers()


def _mean_costs(runs: list) -> dict:
    keys = [k for k, v in runs[0].items() if isinstance(v, float)]
    return {k: float(np.mean([r[k] for r in runs])) for k in keys}


def real_runs(n: int, b: int, worker_counts=(1, 2, 3), repeat: int = 1, lam: float = 1e-2):
    """Wall times of the real tile Cholesky on LocalClusters of ``worker_counts``
    single-thread worker processes (median of ``repeat``), the in-run costs of every
    run, the isolated calibration (in the first cluster's worker) and Dask's per-task
    costs."""
    import shutil

    from distributed import Client, LocalCluster

    from pipeline.engine.where import tile_blas_threads
    from pipeline.kernels import RBF
    from pipeline.linalg.cholesky import tile_cholesky
    from pipeline.linalg.gram import build_gram

    cal_mod, inrun = _import("scaling_calibrate"), _import("scaling_inrun")
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n, 8))
    out: dict = {}
    cal: dict = {}
    runs: dict = {}
    width = tile_blas_threads(True)
    with tempfile.TemporaryDirectory() as d:
        g = build_gram(X, RBF(gamma=0.1), f"{d}/g.zarr", b, progress=False)
        for p in worker_counts:
            with LocalCluster(n_workers=p, threads_per_worker=1, processes=True,
                              memory_limit="3GiB", dashboard_address=None) as cl, Client(cl) as c:  # fmt: skip
                c.run(_warm_worker)  # imports outside the timed run (as in a long-lived cluster)
                if p == min(worker_counts):
                    cal = c.submit(cal_mod.calibrate, g, width, width > 1, max(worker_counts) - 1,
                                   pure=False).result()  # fmt: skip
                    cal.update(cal_mod.scheduler_costs(c))
                if p == 2:
                    cal["remote_dep"] = cal_mod.scheduler_costs(c)["remote_dep"]
                c.run(inrun.install)
                ts, bgs, rs = [], [], []
                for r in range(repeat):
                    c.run(inrun.collect)
                    all0, own0 = _busy_cores_total(), _own_cpu()
                    la = os.getloadavg()[0]
                    store = f"{d}/f{p}-{r}.zarr"
                    t = time.perf_counter()
                    tile_cholesky(g, lam, store=store, scheduler="dask", progress=False)
                    t1 = time.perf_counter()
                    ts.append(t1 - t)
                    others = (_busy_cores_total() - all0) - (_own_cpu() - own0)
                    bgs.append(max(0.0, others / ts[-1]))
                    logs = c.run(inrun.collect)
                    cost = inrun.inrun_costs(logs, cal.get("serial", 0.0))
                    # the call's own work before its first task and after its last
                    # (fingerprints, creating the factor array, graph build, gather)
                    starts = [x[1] for v in logs.values() for x in v if isinstance(x[0], tuple)]
                    ends = [x[2] for v in logs.values() for x in v if isinstance(x[0], tuple)]
                    cost["setup"], cost["teardown"] = min(starts) - t, t1 - max(ends)
                    cost["tasks_per_worker"] = sorted(
                        sum(isinstance(x[0], tuple) for x in v) for v in logs.values()
                    )
                    cost.update(wall=ts[-1], load_before=la, load_after=os.getloadavg()[0],
                                other_jobs_cores=bgs[-1])  # fmt: skip
                    rs.append(cost)
                    shutil.rmtree(store, ignore_errors=True)
                    print(f"  real run: {p} worker(s) {ts[-1]:.2f} s (load {la:.2f} -> "
                          f"{os.getloadavg()[0]:.2f}; tasks per worker {cost['tasks_per_worker']})",
                          flush=True)  # fmt: skip
                out[p] = float(np.median(ts))
                runs[p] = rs
                cal.setdefault("background_by_workers", {})[p] = float(np.median(bgs))
    return out, cal, runs


def _replay(nb, costs, p, cores, width, fixed, sched, latency, remote, bg, pen, cache, co,
            on_host=True):  # fmt: skip
    Hardware = _import("scaling_host").Hardware
    simulate_hosts = _import("scaling_host").simulate_hosts
    hw = Hardware(workers=p, workers_per_host=p, cores_per_host=cores, blas_threads=width,
                  host_lock=width > 1, task_fixed=fixed, scheduler_overhead=sched,
                  scheduler_on_host=on_host, background=bg,
                  placement="cyclic" if p > 1 else "free", task_latency=latency,
                  remote_dep=remote, wide_penalty=tuple(pen), cache_tiles=cache,
                  corun_penalty=tuple(co))  # fmt: skip
    return simulate_hosts(nb, costs, hw)["wall"]


def _replay_own(nb, b, run, cal, latency, cache) -> float:
    """One real run replayed with the costs measured inside it (they already include
    the sharing of the cores, so every worker gets a core of its own in the replay)."""
    TileCosts = _import("scaling_model").TileCosts
    c = TileCosts(b, *(run[k] for k in ("gemm", "syrk", "trsm", "potrf", "read", "write")))
    p = len(run["tasks_per_worker"])
    wall = _replay(nb, c, p, p, cal["width"], run["task_fixed"], cal["serial"], latency,
                   cal.get("remote_dep", 0.0), 0.0, [1.0], cache, [1.0], on_host=False)  # fmt: skip
    return wall + run["setup"] + run["teardown"]


def validate(
    n: int,
    b: int,
    overhead: float | None = None,
    repeat: int = 1,
    blas_threads: int | None = 1,
    background: float | None = None,
) -> dict:
    """Real runs with 1, 2, 3 workers on this host against the host-sharing model,
    with in-run costs (from the 1-worker run) and with isolated costs."""
    load0 = os.getloadavg()
    if blas_threads:  # the tasks' BLAS width (tile_blas_threads reads it; workers inherit it)
        os.environ["KRR_CHOL_BLAS_THREADS"] = str(blas_threads)
    real, cal, runs = real_runs(n, b, repeat=repeat)
    out = model_rows(n, b, real, cal, runs, overhead, background)
    out.update(load_average_before=load0, load_average_after=os.getloadavg())
    return out


def model_rows(n, b, real, cal, runs, overhead=None, background=None, cores=None) -> dict:
    """The model's rows for measured runs (also from a stored JSON: ``real`` and
    ``runs`` keyed by worker count)."""
    TileCosts = _import("scaling_model").TileCosts
    cores = cores or os.cpu_count() or 1
    # other jobs' busy cores during each run (measured: /proc/stat minus this process
    # tree; ``background`` overrides). Costs measured beside them are scaled back to the
    # cores alone, and the replay gives the background its share again
    # other jobs' CPU during each run (measured: /proc/stat minus this process tree):
    # the replay of a run with p workers gets the cores they left, ``cores - used[p]``
    # (``background`` overrides the measured use); costs measured in the 1-worker run
    # beside them are scaled back to a whole core
    used = {int(p): float(x) for p, x in cal.get("background_by_workers", {}).items()}
    if background is not None:
        used = {p: float(background) for p in real}
    left = {p: max(0.25, cores - used.get(p, 0.0)) for p in real}
    bg = used.get(min(real), 0.0)
    alone = min(1.0, left[min(real)] / cal["width"])
    ops = ("gemm", "syrk", "trsm", "potrf", "read", "write")
    iso = TileCosts(b, *(cal[k] * alone for k in ops))
    ir = _mean_costs(runs[min(real)])
    inr = TileCosts(b, *(ir[k] * alone for k in ops))
    nb = math.ceil(n / b)
    sched = cal["serial"] if overhead is None else overhead
    from pipeline.linalg.cholesky_cache import DEFAULT_CACHE_BYTES

    cache = max(1, DEFAULT_CACHE_BYTES // (8 * b * b))
    pen = cal["wide_penalty"]

    # the co-run slowdown was timed on the cores the other jobs left too: take out
    # the part that is only sharing those (the replay adds it back)
    def share(demand):
        return max(1.0, demand / left[min(real)])

    co = [max(1.0, x * share(1) / share(1 + k))
          for k, x in enumerate(cal.get("corun_penalty", [1.0]))]  # fmt: skip
    rows = []
    for p, wall in real.items():
        m_in = _replay(
            nb,
            inr,
            p,
            left[p],
            cal["width"],
            ir["task_fixed"] * alone,
            sched,
            ir["latency"],
            cal.get("remote_dep", 0.0),
            0.0,
            pen,
            cache,
            co,
        )
        m_in += ir["setup"] + ir["teardown"]  # fmt: skip
        m_iso = _replay(nb, iso, p, left[p], cal["width"], cal["task_fixed"] * alone, sched,
                        cal["latency"], cal.get("remote_dep", 0.0), 0.0, pen, cache, co)  # fmt: skip
        own = float(np.median([_replay_own(nb, b, r, cal, ir["latency"], cache) for r in runs[p]]))
        rows.append({"workers": p, "real_s": round(wall, 3),
                     "model_own_s": round(own, 3), "error_own": round(own / wall - 1, 3),
                     "real_runs_s": [round(r["wall"], 3) for r in runs[p]],
                     "model_s": round(m_in, 3), "error": round(m_in / wall - 1, 3),
                     "model_isolated_s": round(m_iso, 3),
                     "error_isolated": round(m_iso / wall - 1, 3),
                     "load_per_run": [(round(r["load_before"], 2), round(r["load_after"], 2))
                                      for r in runs[p]],
                     "other_jobs_cores": round(used.get(p, 0.0), 3),
                     "cores_left": round(left[p], 3)})  # fmt: skip
    return {"n": n, "b": b, "cores": cores, "blas_threads": cal["width"],
            "background": bg, "corun_penalty_alone": co, "calibration": cal,
            "inrun_costs_1_worker": ir,
            "inrun_runs": {str(p): rs for p, rs in runs.items()}, "rows": rows}  # fmt: skip
