"""Predictions of the host model: the tile Cholesky at N = 100,000 to 1,000,000 on 8 to 128
Dask workers, before and after item 4 of issue #19 (tiles by worker count, 2-edge
dependency lists).

Each worker is one single-thread Dask worker (``--nthreads 1``, one BLAS thread per
task as in the validation), with its own network link (``--bandwidth`` bytes/s for
tile reads and writes), the default 1 GiB tile cache, Dask's per-task costs
(``--serial`` scheduler seconds per task, ``--edge`` per dependency edge, a
``--latency`` round trip and ``--remote-dep`` per other worker a task gathers records
from) and row-cyclic placement (:func:`pipeline.linalg.cholesky_exec.tile_owners`).
Tile costs come from one GEMM rate (``--gemm-gflops``, 1 thread; SYRK and TRSM at
90 %, POTRF at 50 %). Configurations (``CONFIGS``):

* ``before``: the product before item 4: the plan's default 2048 tile, every
  dependency edge submitted (``2 j + 1`` per task);
* ``tiles``: the tile-size policy (:func:`pipeline.engine.placement.dask_block_size`)
  with every edge, to separate the two changes;
* ``after``: the policy's tile and the 2-edge lists
  (:func:`pipeline.linalg.cholesky_exec.submitted_deps`), as the executor runs now.

Usage::

    python workflows/benchmarks/scaling_predict.py            # all, writes JSON + plot
    python workflows/benchmarks/scaling_predict.py --check    # stack cache model vs LRU

It imports internals (the executor's tile-size policy) because it predicts what that
policy does at sizes no test can run.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DOCS = HERE.parent.parent / "docs"
SIZES = (100_000, 200_000, 500_000, 1_000_000)
WORKERS = (8, 16, 32, 64, 128)
CONFIGS = ("before", "tiles", "after")


def _import(name):
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError:
        return importlib.import_module(f"workflows.benchmarks.{name}")


def critical_path(nb: int, c) -> float:
    """Seconds of the chain (0,0) -> (1,0) -> (1,1) -> (2,1) -> ... (compute only)."""
    diag = sum(j * c.syrk + c.potrf for j in range(nb))
    sub = sum(j * c.gemm + c.trsm for j in range(nb - 1))
    return diag + sub


def predict_one(n: int, p: int, config: str, a, cache_model: str = "stack") -> dict:
    """One simulated factorisation; ``a``: the options (rates and Dask costs)."""
    from pipeline.engine.placement import dask_block_size

    host = _import("scaling_host")
    rate_costs = _import("scaling_model").rate_costs
    if config.startswith("b="):  # a fixed tile with the 2-edge lists (the policy's sweep)
        b, reduced = int(config[2:]), True
    else:
        b = a.tile if config == "before" else dask_block_size(n, p)
        reduced = config == "after"
    nb = math.ceil(n / b)
    c = rate_costs(b, a.gemm_gflops)
    hw = host.Hardware(
        workers=p, workers_per_host=1, cores_per_host=1, blas_threads=1,
        scheduler_overhead=a.serial, task_latency=a.latency, remote_dep=a.remote_dep,
        bandwidth=a.bandwidth, cache_tiles=max(1, a.cache_bytes // (8 * b * b)),
        placement="cyclic", edge_overhead=a.edge, reduced_edges=reduced,
        cache_model=cache_model,
    )  # fmt: skip
    t = time.perf_counter()
    sim = host.simulate_hosts(nb, c, hw)
    wall = sim["wall"]
    flops_s = n**3 / 3 / (a.gemm_gflops * 1e9)  # the whole factor's flops at the GEMM rate
    edges = nb * nb - nb if reduced else sum(
        (j if i == j else 2 * j + 1) for j in range(nb) for i in range(j, nb))  # fmt: skip
    return {
        "n": n, "workers": p, "config": config, "b": b, "tasks": sim["tasks"], "edges": edges,
        "wall_h": wall / 3600, "efficiency": flops_s / (p * wall),
        "critical_path_h": critical_path(nb, c) / 3600,
        "scheduler_h": (sim["tasks"] * a.serial + edges * a.edge) / 3600,
        "sim_seconds": round(time.perf_counter() - t, 2),
    }  # fmt: skip


def plot(rows: list, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for n in sorted({r["n"] for r in rows}):
        line = None
        for config, style in (("before", "x--"), ("after", "o-")):
            rs = [r for r in rows if r["n"] == n and r["config"] == config]
            if not rs:
                continue
            ps = [r["workers"] for r in rs]
            kw = {"color": line.get_color()} if line is not None else {}
            label = f"N={n:,} {'default 2048 tile' if config == 'before' else 'item 4'}"
            (ln,) = axes[0].loglog(ps, [r["wall_h"] for r in rs], style, label=label, **kw)
            axes[1].semilogx(ps, [r["efficiency"] for r in rs], style, color=ln.get_color())
            line = line or ln
    axes[0].set_xlabel("workers (one thread each)")
    axes[0].set_ylabel("predicted factor time (h)")
    axes[1].set_xlabel("workers (one thread each)")
    axes[1].set_ylabel("efficiency (flops at the GEMM rate / (P x wall))")
    axes[1].set_ylim(0, 1.05)
    axes[0].legend(fontsize=7)
    axes[0].set_title("dashed: before item 4; solid: tiles by worker count + 2-edge deps",
                      fontsize=9)  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gemm-gflops", type=float, default=70.0)
    ap.add_argument("--bandwidth", type=float, default=1.25e9, help="bytes/s per worker")
    ap.add_argument("--serial", type=float, default=1e-3, help="scheduler s per task")
    ap.add_argument("--edge", type=float, default=None,
                    help="scheduler s per dependency edge (default: from --edge-json or 5e-5)")  # fmt: skip
    ap.add_argument("--latency", type=float, default=3e-3, help="round trip s per task")
    ap.add_argument("--remote-dep", type=float, default=1e-3)
    ap.add_argument("--cache-bytes", type=int, default=1 << 30)
    ap.add_argument("--tile", type=int, default=2048, help="the 'before' tile (plan default)")
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)))
    ap.add_argument("--workers", default=",".join(map(str, WORKERS)))
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--check", action="store_true", help="stack cache model against exact LRU")
    ap.add_argument("--measure-edge", action="store_true",
                    help="time Dask's cost per dependency edge on a 2-worker LocalCluster")  # fmt: skip
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--out", default=str(HERE / "scaling_predict.json"))
    a = ap.parse_args()
    if a.measure_edge:
        from distributed import Client, LocalCluster

        cal = _import("scaling_calibrate")
        with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None) as cl, \
                Client(cl) as c:  # fmt: skip
            e = cal.edge_cost(c)
        e["load_average"] = list(__import__("os").getloadavg())
        print(json.dumps(e, indent=1))
        (HERE / "scaling_edge_cost.json").write_text(json.dumps(e, indent=1))
        return
    if a.edge is None:  # measured (--measure-edge), else 50 us
        f = HERE / "scaling_edge_cost.json"
        a.edge = json.loads(f.read_text())["per_edge"] if f.exists() else 5e-5
    sizes = [int(x) for x in a.sizes.split(",")]
    workers = [int(x) for x in a.workers.split(",")]
    rows = []
    if a.check:
        for n in sizes:
            for p in workers:
                for config in a.configs.split(","):
                    r1 = predict_one(n, p, config, a, "stack")
                    r2 = predict_one(n, p, config, a, "lru")
                    rows.append({**r1, "lru_wall_h": r2["wall_h"]})
                    print(f"N={n:>9,} P={p:>4} {config:>6} b={r1['b']:>5} stack "
                          f"{r1['wall_h']:8.3f} h  lru {r2['wall_h']:8.3f} h "
                          f"({r1['wall_h'] / r2['wall_h'] - 1:+.1%})", flush=True)  # fmt: skip
        Path(a.out).write_text(json.dumps({"check": rows, "options": vars(a)}, indent=1))
        return
    for n in sizes:
        for p in workers:
            for config in a.configs.split(","):
                r = predict_one(n, p, config, a)
                rows.append(r)
                print(f"N={n:>9,} P={p:>4} {config:>6} b={r['b']:>5} tasks={r['tasks']:>7,} "
                      f"edges={r['edges']:>11,} wall={r['wall_h']:8.2f} h eff={r['efficiency']:.2f} "
                      f"cp={r['critical_path_h']:.2f} h sched={r['scheduler_h']:.2f} h "
                      f"({r['sim_seconds']} s)", flush=True)  # fmt: skip
    Path(a.out).write_text(json.dumps({"options": vars(a), "rows": rows}, indent=1))
    print(f"wrote {a.out}")
    if not a.no_plot:
        plot(rows, DOCS / "scaling.png")


if __name__ == "__main__":
    main()
