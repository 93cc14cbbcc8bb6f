"""Benchmark: a complete out-of-core fit (Gram + tile Cholesky + solve) at N = 40,000.

Usage::

    python workflows/benchmarks/bench_fit_40k.py            # N=40,000, D=16, block 4096
    python workflows/benchmarks/bench_fit_40k.py --quick    # N=8,000, block 2048
    python workflows/benchmarks/bench_fit_40k.py --scheduler dask   # the Dask executor
    python workflows/benchmarks/bench_fit_40k.py --scheduler client # ... on krr run's cluster
    python workflows/benchmarks/bench_fit_40k.py --keep-gram false --gram on-demand
        # in place, no Gram stage: the factor computes each Gram tile from X

The full Gram at N = 40,000 is 12.8 GB in float64, more than half this machine's
memory; scikit-learn's KernelRidge needs about 3·N²·8 bytes (38 GB) and cannot
run at all. Target: the whole fit with peak RSS <= 3 GB (checked at N = 40,000; with
``--scheduler client``, the processes' private memory), and for a float64 factor
issue #15's rate (``gemm_baseline.py``); ``TARGET`` lines, exit 1 if one is missed.
Reports the wall time of each phase, GFLOP/s of the factorisation (n³/3 flops), and
the process peak RSS (VmHWM). A spot check computes the residual of the solved system on the first
row block, (K + λI) α - y, from kernel rows (nothing N x N is formed).

It imports internals (the Gram, the solvers and the diagnostics) because it times each
phase of the fit (Gram, factor, solve) on its own and records memory per phase.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from pipeline.constants import GRAM_ON_DEMAND_KERNEL_DTYPE
from pipeline.diagnostics import peak_rss_bytes
from pipeline.kernels import RBF
from pipeline.linalg.cholesky import tile_cholesky
from pipeline.linalg.cholesky_cache import release_tile_cache
from pipeline.linalg.cholesky_inplace import GramTileRecomputer
from pipeline.linalg.gram import build_gram
from pipeline.linalg.triangular import cholesky_solve

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gemm_baseline import check_factor, gemm_peak_gflops, peak_line  # noqa: E402
from memory_sampler import private_peak, start_private  # noqa: E402
from targets import Targets  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--n", type=int, default=None)
    p.add_argument("--d", type=int, default=16)
    p.add_argument("--block", type=int, default=None)
    p.add_argument("--lam", type=float, default=1e-3)
    p.add_argument(
        "--factor-dtype",
        default="float64",
        choices=["float64", "float32"],
        help="float32: single-precision factor, alpha refined against the stored Gram",
    )
    p.add_argument(
        "--refine",
        default="stored",
        choices=["stored", "matrix_free"],
        help="products of the float32 factor's refinement: stored Gram or recomputed from X",
    )
    p.add_argument(
        "--keep-gram",
        default="true",
        choices=["true", "false"],
        help="false: factor in place; the Gram is then stored in the factor's dtype "
        "(float32: half the disk and half the bytes written and read)",
    )
    p.add_argument(
        "--scheduler",
        default="threads",
        choices=["threads", "dask", "client"],
        help="executor of the tile Cholesky (dask: its Dask graph, on the threaded "
        "scheduler; client: the whole fit on the LocalCluster that krr run starts, 2 "
        "worker processes here, peak RSS summed over them and this process; the same bits)",
    )
    p.add_argument(
        "--gram",
        default="stored",
        choices=["stored", "on-demand"],
        help="on-demand (needs --keep-gram false): no Gram stage; the in-place factor "
        "computes each Gram tile from X when it needs it (KernelRidge(keep_gram=False))",
    )
    p.add_argument(
        "--gram-dtype",
        default=None,
        choices=["float64", "float32"],
        help="stored Gram dtype (default: the factor's in place, else float64)",
    )
    p.add_argument("--dir", default=None, help="scratch directory for the store")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    if a.gram == "on-demand" and a.keep_gram != "false":
        p.error(
            "--gram on-demand computes the Gram inside an in-place factor: add --keep-gram false"
        )
    n = a.n or (8_000 if a.quick else 40_000)
    block = a.block or (2048 if a.quick else 4096)
    rng = np.random.default_rng(0)
    X = rng.standard_normal((n, a.d))
    y = np.sin(X[:, 0]) + 0.1 * rng.standard_normal(n)
    kernel = RBF(gamma=1.0 / a.d)
    if a.dir:  # a scratch directory that does not exist yet is made
        Path(a.dir).mkdir(parents=True, exist_ok=True)
    store = Path(tempfile.mkdtemp(prefix="bench_fit_", dir=a.dir))
    print(
        f"N={n} D={a.d} block={block} RBF lambda={a.lam} factor {a.factor_dtype}; store {store}",
        flush=True,
    )
    out: dict = {"n": n, "block": block, "factor_dtype": a.factor_dtype, "scheduler": a.scheduler}
    # the baseline, same run: the factor's main tile call at its width (GEMM peak)
    out["gemm_peak_gflops"] = gemm_peak_gflops(block)
    print(
        f"  GEMM peak (tile {block}, all cores) {out['gemm_peak_gflops']:.1f} GFLOP/s", flush=True
    )
    stack = contextlib.ExitStack()
    client = None
    if a.scheduler == "client":  # started before the clock, as krr run starts it
        from pipeline.engine.parallel import dask_client

        client = stack.enter_context(dask_client())
        client.run(start_private)
        start_private()
    own = " (this process)" if client is not None else ""
    targets = Targets()
    try:
        t0 = time.perf_counter()
        # in place (keep_gram=False) the factor replaces the Gram tile by tile, so the
        # Gram is stored in the factor's dtype, as the fit builds it (plan.gram_dtype)
        gram_dtype = a.gram_dtype or (a.factor_dtype if a.keep_gram == "false" else "float64")
        # on demand (in place only, as KernelRidge(keep_gram=False) does): the Gram's
        # array is only created, and the factor computes each tile from X when it needs it
        on_demand = a.gram == "on-demand"
        gram = build_gram(
            X,
            kernel,
            str(store),
            block,
            gram_dtype,
            progress=False,
            kernel_dtype=GRAM_ON_DEMAND_KERNEL_DTYPE if on_demand else None,
            defer=on_demand,
        )
        recompute = GramTileRecomputer.for_gram(gram, X, kernel) if on_demand else None
        out["gram_s"] = time.perf_counter() - t0
        if client is not None:  # private memory of the Gram stage, then a new peak
            anon = [*client.run(private_peak, reset=True).values(), private_peak(reset=True)]
            out["gram_private_peak_gb"] = [round(m / 1e9, 2) for m in anon]
            print(
                f"  gram stage private memory peaks (workers, this process): {out['gram_private_peak_gb']} GB"
            )
        print(
            f"  gram   {out['gram_s']:8.1f} s  peak RSS {peak_rss_bytes() / 1e9:.2f} GB{own}",
            flush=True,
        )
        t1 = time.perf_counter()
        factor = tile_cholesky(
            gram,
            a.lam,
            store=str(store),
            progress=False,
            dtype=a.factor_dtype,
            keep_gram=a.keep_gram == "true",
            recompute_tile=recompute,
            scheduler="dask" if client is not None else a.scheduler,
        )
        out["factor_s"] = time.perf_counter() - t1
        out["gflops"] = n**3 / 3 / out["factor_s"] / 1e9
        print(
            f"  factor {out['factor_s']:8.1f} s  {out['gflops']:.1f} GFLOP/s  "
            f"peak RSS {peak_rss_bytes() / 1e9:.2f} GB{own}",
            flush=True,
        )
        if a.factor_dtype == "float64":
            print(peak_line(out["gflops"], out["gemm_peak_gflops"]), flush=True)
            check_factor(targets, out["gflops"], out["gemm_peak_gflops"])
        t2 = time.perf_counter()
        refine: dict = {}
        if a.refine == "matrix_free" or a.keep_gram == "false":
            from pipeline.linalg.triangular import solve_refined

            alpha = solve_refined(factor, y, X=X, kernel=kernel, stats=refine)
            refine.pop("refine_operator", None)
        else:
            alpha = cholesky_solve(factor, y, gram=gram, stats=refine)
        out["solve_s"] = time.perf_counter() - t2
        # the stats' own "solve_s" is the triangular solves alone: keep the whole solve's
        refine["triangular_s"] = refine.pop("solve_s", None)
        out.update(refine)
        release_tile_cache()
        out["total_s"] = time.perf_counter() - t0
        out["peak_rss_gb"] = peak_rss_bytes() / 1e9
        if client is not None:  # the workers' peaks too (their sum bounds the host's)
            workers = client.run(peak_rss_bytes)
            out["worker_peak_rss_gb"] = [round(m / 1e9, 2) for m in workers.values()]
            out["peak_rss_gb"] += sum(workers.values()) / 1e9
            print(f"  workers' peak RSS {out['worker_peak_rss_gb']} GB (summed below)")
            # private memory alone (sampled): mapped factor tiles are the host's page
            # cache, counted above in every process that maps them
            anon = [*client.run(private_peak).values(), private_peak()]
            out["private_peak_gb"] = [round(m / 1e9, 2) for m in anon]
            print(
                f"  private memory since the Gram stage (RssAnon, sampled every 0.25 s): workers "
                f"{out['private_peak_gb'][:-1]} GB, this process {out['private_peak_gb'][-1]} GB;"
                f" sum {sum(anon) / 1e9:.2f} GB"
            )
        # residual check on the first row block, from kernel rows (no N x N anywhere)
        rows = slice(0, min(block, n))
        r = kernel(X[rows], X) @ alpha + a.lam * alpha[rows] - y[rows]
        out["rel_residual_block0"] = float(np.linalg.norm(r) / np.linalg.norm(y[rows]))
        sk_gb = 3 * n * n * 8 / 1e9
        its = refine.get("refine_iterations")
        its = f" ({its} refinement iterations)" if its is not None else ""
        print(
            f"  solve  {out['solve_s']:8.1f} s{its}\n"
            f"total {out['total_s']:.1f} s; peak RSS {out['peak_rss_gb']:.2f} GB (target <= 3 GB); "
            f"scikit-learn would need ~{sk_gb:.0f} GB (3·N²·8 bytes), "
            f"{sk_gb / out['peak_rss_gb']:.0f}x more; "
            f"relative residual on row block 0: {out['rel_residual_block0']:.1e}",
            flush=True,
        )
        if client is None:
            rss, what = out["peak_rss_gb"], "peak RSS"
        else:  # VmHWM counts the mapped factor tiles (page cache) in every process
            rss, what = sum(out["private_peak_gb"]), "private memory, all processes"
            print(
                f"private memory of the {len(out['private_peak_gb'])} processes {rss:.2f} GB"
                f"; their VmHWM sum {out['peak_rss_gb']:.2f} GB counts the page-cache pages "
                "of the mapped factor tiles once in every process that maps them"
            )
        if n == 40_000:
            targets.check(what, rss, "<=", 3, " GB")
        else:
            targets.skip(what, "target <= 3 GB at N = 40,000 only")
    finally:
        stack.close()
        shutil.rmtree(store, ignore_errors=True)
    out["targets"] = targets.as_json()
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2))
    return targets.finish()


if __name__ == "__main__":
    sys.exit(main())
