"""A scaling model of the tile Cholesky: replay its task graph on P simulated workers.

The graph is the one :func:`pipeline.linalg.cholesky.tile_cholesky` submits with
``scheduler="dask"``: one task per lower tile ``(i, j)`` of L, in left-looking
order, depending on ``(i, k)`` and ``(j, k)`` for ``k < j`` (and ``(j, j)``).
Task ``(i, j)`` reads ``2 j + 1`` tiles (``j`` for a diagonal tile) from the store,
runs ``j`` GEMM updates (SYRK on the diagonal) and one TRSM (POTRF on the
diagonal), and writes one tile plus its marker.

Per-tile costs are measured on this machine (one BLAS thread, as on a Dask
worker): GEMM, SYRK, TRSM and POTRF times for a ``b x b`` tile, and a tile read
and write through Zarr. Network bandwidth per worker and the scheduler's per-task
overhead are parameters. The simulator is a discrete-event list scheduler of
its own: the scheduler dispatches one task at a time (``overhead`` seconds
each, serially), an idle worker takes the ready task with the longest remaining
path (critical path first, as Dask's ordering approximates), and a task's time is
``reads / bandwidth + compute + write / bandwidth``.

Usage::

    python workflows/benchmarks/scaling_model.py --validate --repeat 3  # real 1/2/3 workers
    python workflows/benchmarks/scaling_model.py --placement   # item 4: where tasks run
    python workflows/benchmarks/scaling_model.py --predict     # one core per worker, ideal
    python workflows/benchmarks/scaling_predict.py             # the host model, item 4
    python workflows/benchmarks/scaling_model.py --quick       # both, small

``--validate`` and ``--placement`` use the host model of ``scaling_host.py`` (workers
sharing a host's cores, BLAS width, host lock, Dask's per-task costs), with costs
measured by ``scaling_calibrate.py`` inside a worker in the same run.

It imports internals (the tile Cholesky's graph, the Gram and the kernels) because it
replays the task graph that ``pipeline.linalg.cholesky.tile_cholesky`` submits, which only the
solver module describes.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
DOCS = HERE.parent.parent / "docs"


@dataclass
class TileCosts:
    """Seconds per tile operation for tile size ``b`` (one BLAS thread)."""

    b: int
    gemm: float
    syrk: float
    trsm: float
    potrf: float
    read: float  # one tile read from the store (local disk here)
    write: float  # one tile write + marker

    def scaled(self, b: int) -> TileCosts:
        """Costs for another tile size: flops scale as b^3, bytes as b^2."""
        f, m = (b / self.b) ** 3, (b / self.b) ** 2
        return TileCosts(
            b, self.gemm * f, self.syrk * f, self.trsm * f, self.potrf * f,
            self.read * m, self.write * m,
        )  # fmt: skip


def measure_costs(b: int = 512, repeat: int = 5) -> TileCosts:
    """Measure per-tile costs on this machine with one BLAS thread."""
    import scipy.linalg as sla
    import zarr
    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(0)
    A = rng.normal(size=(b, b))
    B = rng.normal(size=(b, b))
    S = A @ A.T + b * np.eye(b)
    Lf = np.linalg.cholesky(S)

    def best(f):
        ts = []
        for _ in range(repeat):
            t = time.perf_counter()
            f()
            ts.append(time.perf_counter() - t)
        return min(ts)

    with threadpool_limits(1):
        gemm = best(lambda: A @ B.T)
        syrk = best(lambda: sla.blas.dsyrk(1.0, A, lower=1))
        trsm = best(lambda: sla.solve_triangular(Lf, B.T, lower=True))
        potrf = best(lambda: sla.cho_factor(S, lower=True))
    with tempfile.TemporaryDirectory() as d:
        z = zarr.create_array(f"{d}/t.zarr", shape=(4 * b, b), chunks=(b, b), dtype="f8",
                              compressors=None)  # fmt: skip
        writes, reads = [], []
        for r in range(repeat):
            k = r % 4
            t = time.perf_counter()
            z[k * b : (k + 1) * b] = A
            Path(d, f"marker{r}").write_text("{}")
            writes.append(time.perf_counter() - t)
            t = time.perf_counter()
            _ = z[k * b : (k + 1) * b]
            reads.append(time.perf_counter() - t)
    return TileCosts(b, gemm, syrk, trsm, potrf, min(reads), min(writes))


def rate_costs(b: int, gemm_gflops: float) -> TileCosts:
    """Tile costs from one GEMM rate (1 BLAS thread): SYRK and TRSM at 90% of it,
    POTRF at 50% (docs/PERFORMANCE.md), flop counts 2b^3, b^3, b^3, b^3/3. More robust on a
    loaded machine than timing each kernel; tile I/O comes from the bandwidth."""
    r = gemm_gflops * 1e9
    b3 = float(b) ** 3
    return TileCosts(b, 2 * b3 / r, b3 / (0.9 * r), b3 / (0.9 * r), b3 / 3 / (0.5 * r), 0.0, 0.0)


def _deps(i: int, j: int) -> list[tuple[int, int]]:
    d = [(i, k) for k in range(j)]
    if i != j:
        d += [(j, k) for k in range(j)] + [(j, j)]
    return d


def task_graph(nb: int) -> list[tuple[int, int]]:
    """The tile tasks in left-looking order (topological)."""
    return [(i, j) for j in range(nb) for i in range(j, nb)]


def task_seconds(
    i: int, j: int, c: TileCosts, bandwidth: float | None, slowdown: float = 1.0
) -> tuple[float, float]:
    """(compute, io) seconds of task (i, j); ``bandwidth`` in bytes/s (None: measured)."""
    diag = i == j
    compute = j * (c.syrk if diag else c.gemm) + (c.potrf if diag else c.trsm)
    n_read = (j if diag else 2 * j + 1) + 1  # L tiles of earlier columns + the Gram tile
    tile_bytes = 8.0 * c.b * c.b
    if bandwidth is None:
        io = n_read * c.read + c.write
    else:
        io = (n_read + 1) * tile_bytes / bandwidth
    return compute * slowdown, io


def right_looking_graph(
    nb: int, c: TileCosts, bandwidth: float | None, slow: float
) -> tuple[list, dict, dict]:
    """The right-looking variant: POTRF(k), TRSM(i, k) and one task per update
    ``A[i, j] -= L[i, k] L[j, k]^T``; a critical path of about ``nb`` (POTRF + TRSM
    + GEMM) instead of ``nb^2 / 2`` GEMMs, for ``nb^3 / 6`` tasks."""
    tile_bytes = 8.0 * c.b * c.b

    def io(n_read: int) -> float:
        if bandwidth is None:
            return n_read * c.read + c.write
        return (n_read + 1) * tile_bytes / bandwidth

    tasks, dur, deps = [], {}, {}
    for k in range(nb):
        t = ("potrf", k)
        tasks.append(t)
        dur[t] = c.potrf * slow + io(1)
        deps[t] = [("upd", k, k, k - 1)] if k else []
        for i in range(k + 1, nb):
            t = ("trsm", i, k)
            tasks.append(t)
            dur[t] = c.trsm * slow + io(2)
            deps[t] = [("potrf", k)] + ([("upd", i, k, k - 1)] if k else [])
        for j in range(k + 1, nb):
            for i in range(j, nb):
                t = ("upd", i, j, k)
                tasks.append(t)
                dur[t] = (c.syrk if i == j else c.gemm) * slow + io(3 if i != j else 2)
                deps[t] = [("trsm", i, k)] + ([("trsm", j, k)] if i != j else [])
                if k:
                    deps[t].append(("upd", i, j, k - 1))
    return tasks, dur, deps


def simulate(
    nb: int,
    costs: TileCosts,
    workers: int,
    *,
    overhead: float = 1e-3,
    bandwidth: float | None = None,
    cores: int | None = None,
    batch: int = 1,
    graph: str = "left",
    task_fixed: float = 0.0,
) -> dict[str, float]:
    """Simulated wall time of the tile Cholesky on ``workers`` single-thread workers.

    ``cores``: physical cores available (compute slows by ``workers / cores`` when
    the workers oversubscribe them; None: one core per worker). ``overhead``: the
    scheduler's serial per-task cost. ``batch``: tasks fused per scheduler task
    (the trailing GEMM updates of a column grouped), dividing the overhead.
    ``task_fixed``: seconds every task spends on a worker besides BLAS and tile I/O
    (opening arrays, reading and writing its marker, Python), run in parallel.
    """
    slow = max(1.0, workers / cores) if cores else 1.0
    if graph == "right":
        tasks, dur, deps = right_looking_graph(nb, costs, bandwidth, slow)
    else:
        tasks = task_graph(nb)
        dur, deps = {}, {}
        for t in tasks:
            comp, io = task_seconds(*t, costs, bandwidth, slow)
            dur[t] = comp + io
            deps[t] = _deps(*t)
    if task_fixed:
        dur = {t: d + task_fixed * slow for t, d in dur.items()}
    succ: dict = {t: [] for t in tasks}
    n_dep = {}
    for t in tasks:
        ds = deps[t]
        n_dep[t] = len(ds)
        for d in ds:
            succ[d].append(t)
    rank: dict = {}
    for t in reversed(tasks):
        rank[t] = dur[t] + max((rank[s] for s in succ[t]), default=0.0)
    per_task_overhead = overhead / batch
    ready: list = [(-rank[t], t) for t in tasks if n_dep[t] == 0]
    heapq.heapify(ready)
    free = [(0.0, w) for w in range(workers)]  # (time the worker is free, id)
    heapq.heapify(free)
    running: list = []
    sched_free = 0.0
    now = 0.0
    done = 0
    busy = 0.0
    while done < len(tasks):
        # start as many ready tasks as there are idle workers
        while ready and free and free[0][0] <= now:
            _, t = heapq.heappop(ready)
            wt, w = heapq.heappop(free)
            start = max(now, wt, sched_free) + per_task_overhead
            sched_free = start
            end = start + dur[t]
            busy += dur[t]
            heapq.heappush(running, (end, t, w))
        end, t, w = heapq.heappop(running)
        now = end
        heapq.heappush(free, (end, w))
        done += 1
        for s in succ[t]:
            n_dep[s] -= 1
            if n_dep[s] == 0:
                heapq.heappush(ready, (-rank[s], s))
    total_work = sum(dur.values())
    critical = max(rank.values())
    return {
        "wall": now,
        "work": total_work,
        "critical_path": critical,
        "overhead_total": per_task_overhead * len(tasks),
        "tasks": len(tasks),
        "efficiency": total_work / (now * workers) if now > 0 else 0.0,
    }


def cg_iteration(
    n: int,
    b: int,
    workers: int,
    *,
    entries_per_s: float = 0.27e9,
    overhead: float = 1e-3,
    sync: float = 0.05,
    stored: bool = False,
    bandwidth: float = 1.25e9,
) -> dict[str, float]:
    """Seconds of one matrix-free (or stored-Gram) CG product ``K v`` on P workers.

    One task per row block of ``b`` rows (as the matvec submits them): a task
    evaluates (or, ``stored``, reads) ``b x n`` kernel entries. Tasks are
    independent; the iteration ends at a barrier (the dot products) costing
    ``sync``. The scheduler dispatches the ``n / b`` tasks serially.
    ``entries_per_s``: kernel entries per second per worker (docs/PERFORMANCE.md: 0.53 G/s
    on 2 cores for RBF float64, cache-blocked).
    """  # fmt: skip
    nb = math.ceil(n / b)
    if stored:
        task = b * n * 8.0 / bandwidth
    else:
        task = b * n / entries_per_s
    waves = math.ceil(nb / workers)
    wall = max(waves * task, nb * overhead) + sync
    work = nb * task
    return {"wall": wall, "efficiency": work / (wall * workers), "tasks": nb, "waves": waves}


# ---------------------------------------------------------------------------
# validation against real runs: scaling_validate.py


def validate(*args, **kw) -> dict:
    """Real runs on 1, 2, 3 workers against the host model (:mod:`scaling_validate`)."""
    try:
        from scaling_validate import validate as _validate
    except ImportError:
        from workflows.benchmarks.scaling_validate import validate as _validate
    return _validate(*args, **kw)


def predict(
    costs: TileCosts, b: int, overhead: float, bandwidth: float, graph: str = "left",
    sizes: tuple[int, ...] = (100_000, 200_000, 500_000, 1_000_000),
) -> list:  # fmt: skip
    c = costs.scaled(b)
    rows = []
    for n in sizes:
        nb = math.ceil(n / b)
        base = None
        for p in (8, 16, 32, 64, 128):
            sim = simulate(nb, c, p, overhead=overhead, bandwidth=bandwidth, graph=graph)
            if base is None:
                base = sim["wall"] * p
            rows.append({"n": n, "workers": p, "tasks": sim["tasks"],
                         "wall_h": sim["wall"] / 3600, "efficiency": sim["efficiency"],
                         "critical_path_h": sim["critical_path"] / 3600,
                         "overhead_h": sim["overhead_total"] / 3600})  # fmt: skip
    return rows


def plot(rows: list, rows_batched: list, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for n in sorted({r["n"] for r in rows}):
        rs = [r for r in rows if r["n"] == n]
        rb = [r for r in rows_batched if r["n"] == n]
        ps = [r["workers"] for r in rs]
        (line,) = axes[0].loglog(ps, [r["wall_h"] for r in rs], "o-", label=f"N={n:,}")
        axes[1].semilogx(ps, [r["efficiency"] for r in rs], "o-", color=line.get_color(),
                         label=f"N={n:,}")  # fmt: skip
        if rb:
            pb = [r["workers"] for r in rb]
            axes[0].loglog(pb, [r["wall_h"] for r in rb], "x--", color=line.get_color())
            axes[1].semilogx(pb, [r["efficiency"] for r in rb], "x--", color=line.get_color())
    axes[0].set_xlabel("workers")
    axes[0].set_ylabel("predicted factor time (h)")
    axes[1].set_xlabel("workers")
    axes[1].set_ylabel("parallel efficiency")
    axes[0].legend()
    axes[0].set_title("solid: left-looking (today); dashed: right-looking", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _summary(v: dict) -> dict:
    """One validation run's table and conditions (for the JSON's history)."""
    keep = ("when", "n", "b", "cores", "blas_threads", "load_average_before",
            "load_average_after", "background", "rows")  # fmt: skip
    return {k: v[k] for k in keep if k in v}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--validate", action="store_true")
    ap.add_argument("--predict", action="store_true")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument(
        "--placement",
        action="store_true",
        help="item 4: Dask's default placement against row-cyclic, by worker count",
    )
    ap.add_argument("--cores", type=int, default=16, help="cores per host (--placement)")
    ap.add_argument("--n", type=int, default=12000)
    ap.add_argument("--b", type=int, default=1000)
    ap.add_argument("--overhead", type=float, default=1e-3, help="scheduler s per task")
    ap.add_argument("--bandwidth", type=float, default=1.25e9, help="bytes/s per worker")
    ap.add_argument("--gemm-gflops", type=float, default=None,
                    help="1-thread GEMM rate for predictions (default: measured)")  # fmt: skip
    ap.add_argument("--blas-threads", type=int, default=1,
                    help="BLAS threads per tile task in the validation (0: the default, all cores)")  # fmt: skip
    ap.add_argument("--background", type=float, default=None,
                    help="other jobs' busy cores during --validate (default: measured, /proc/stat)")  # fmt: skip
    ap.add_argument("--repeat", type=int, default=1, help="real runs per worker count (median)")
    ap.add_argument("--tile", type=int, default=4096, help="tile size for predictions")
    ap.add_argument("--out", default=None,
                    help="JSON written (default: scaling_validation.json or scaling_predict.json)")  # fmt: skip
    args = ap.parse_args()
    if args.quick:
        args.n, args.b, args.validate, args.predict = 2000, 250, True, True
    result = {}
    if args.validate:
        v = validate(args.n, args.b, None, args.repeat, args.blas_threads or None,
                     args.background)  # fmt: skip
        v["when"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        result["validation"] = v
        print(f"n={v['n']} b={v['b']} cores={v['cores']} BLAS threads/task={v['blas_threads']} "
              f"load before/after={v['load_average_before'][0]:.2f}/"
              f"{v['load_average_after'][0]:.2f}")  # fmt: skip
        cal, ir = v["calibration"], v["inrun_costs_1_worker"]
        keys = ("gemm", "syrk", "trsm", "potrf", "read", "write", "task_fixed", "latency")
        print("isolated: " + ", ".join(f"{k}={cal[k]:.4g}" for k in keys)
              + f", serial={cal['serial']:.4g}, remote_dep={cal.get('remote_dep', 0):.4g}")  # fmt: skip
        print("in-run (1 worker): " + ", ".join(f"{k}={ir[k]:.4g}" for k in
              keys + ("setup", "teardown")) + f"; corun_penalty={cal.get('corun_penalty')}")  # fmt: skip
        print(f"{'workers':>7} {'real s':>8} {'own run':>8} {'error':>7} {'from 1 w':>8} {'error':>7} "
              f"{'isolated':>9} {'error':>7} {'other jobs (cores)':>19}")  # fmt: skip
        for r in v["rows"]:
            print(f"{r['workers']:>7} {r['real_s']:>8.2f} {r['model_own_s']:>8.2f} "
                  f"{r['error_own']:>+7.0%} {r['model_s']:>8.2f} {r['error']:>+7.0%} "
                  f"{r['model_isolated_s']:>9.2f} {r['error_isolated']:>+7.0%} "
                  f"{r['other_jobs_cores']:>19.2f}")  # fmt: skip
        for key, what in (("error_own", "own-run costs"), ("error", "from the 1-worker run")):
            ok = all(abs(r[key]) <= 0.25 for r in v["rows"])
            print(f"within 25 % ({what}): " + ("yes" if ok else "NO"))
    if args.placement:
        gflops = args.gemm_gflops or 2 * 1024**3 / measure_costs(1024, repeat=9).gemm / 1e9
        # all the host's cores per task, at 85 % parallel efficiency
        costs = rate_costs(1024, gflops * args.cores * 0.85)
        try:
            from scaling_host import placement_study, plot_placement
        except ImportError:
            from workflows.benchmarks.scaling_host import placement_study, plot_placement
        rows = predict_rows = placement_study(costs, args.tile, args.cores, args.bandwidth,
                                              args.overhead, 3e-3)  # fmt: skip
        result["placement"] = {"gemm_gflops_1thread": gflops, "cores": args.cores,
                               "tile": args.tile, "rows": rows}  # fmt: skip
        plot_placement(predict_rows, DOCS / "scaling_placement.png")
    if args.predict:
        gflops = args.gemm_gflops or 2 * 1024**3 / measure_costs(1024, repeat=9).gemm / 1e9
        costs = rate_costs(1024, gflops)
        result["predict_gemm_gflops_1thread"] = gflops
        rows = predict(costs, args.tile, args.overhead, args.bandwidth)
        # the right-looking graph has nb^3/6 tasks: simulated up to N=500k
        big = predict(costs, args.tile, args.overhead, args.bandwidth, graph="right",
                      sizes=(100_000, 200_000, 500_000))  # fmt: skip
        result["predict"] = {"tile": args.tile, "overhead_s": args.overhead,
                             "bandwidth": args.bandwidth, "rows": rows, "right_looking_rows": big}  # fmt: skip
        for r in rows:
            print(f"N={r['n']:>9,} P={r['workers']:>4} tasks={r['tasks']:>9,} "
                  f"wall={r['wall_h']:8.2f} h eff={r['efficiency']:.2f} "
                  f"cp={r['critical_path_h']:.2f} h ovh={r['overhead_h']:.2f} h")  # fmt: skip
        for r in big:
            print(f"right-looking N={r['n']:>9,} P={r['workers']:>4} tasks={r['tasks']:>9,} "
                  f"wall={r['wall_h']:8.2f} h eff={r['efficiency']:.2f} "
                  f"cp={r['critical_path_h']:.2f} h ovh={r['overhead_h']:.2f} h")  # fmt: skip
        cg = []
        for n in (100_000, 1_000_000):
            for b in (args.tile, 1024):
                for p in (8, 32, 128):
                    r = cg_iteration(n, b, p, overhead=args.overhead)
                    cg.append({"n": n, "b": b, "workers": p, **r})
                    print(f"CG product N={n:>9,} b={b:>5} P={p:>4} tasks={r['tasks']:>5} "
                          f"{r['wall']:9.2f} s/iteration eff={r['efficiency']:.2f}")  # fmt: skip
        result["cg_product"] = cg
        if not args.quick:
            plot(rows, big, DOCS / "scaling_simple.png")
    # the host model's predictions (scaling_predict.py) own scaling_predict.json
    default = "scaling_predict_simple.json" if args.predict else "scaling_validation.json"
    if args.placement and not (args.predict or args.validate):
        default = "scaling_placement.json"
    out = args.out or str(HERE / default)
    if args.quick and args.out is None:
        out = str(HERE / "scaling_model_quick.json")
    if args.validate and Path(out).exists():  # keep every earlier validation run's table
        try:
            prev = json.loads(Path(out).read_text())
        except ValueError:
            prev = {}
        hist = prev.get("history", [])
        if "validation" in prev:
            hist.append(_summary(prev["validation"]))
        result["history"] = hist
    Path(out).write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
