"""Benchmark: a complete exact fit at N = 80,000, twice this machine's memory (issue #15).

Usage::

    python workflows/benchmarks/bench_fit_80k.py               # N=80,000, D=12, block 4000
    python workflows/benchmarks/bench_fit_80k.py --quick       # N=8,000, block 2000
    python workflows/benchmarks/bench_fit_80k.py --factor-dtype float32 --keep-gram
    python workflows/benchmarks/bench_fit_80k.py --gram-dtype float32 --factor-dtype float32 \
        --gram on-demand    # in place, no Gram stage: the factor computes the Gram's tiles

The full float64 Gram at N = 80,000 is 51 GB (25.6 GB of lower tiles), twice the
RAM. Stages: Gram build (lower tiles), tile Cholesky (in place by default,
``keep_gram=False``: the factor replaces the Gram tile by tile, so the disk holds
one N²/2 matrix), the triangular solves (plus, for a float32 factor, refinement
with matrix-free products from X), and an independent check: the relative
residual ``‖(K + λI) α - y‖ / ‖y‖`` computed blockwise from kernel rows of X
(``pipeline.kernels``, not the solver's operators), one row block at a time.

Targets: <= 30 minutes in all, peak RSS <= 3 GB (both at N = 80,000), relative residual
<= 1e-11 (any N), and for a float64 factor issue #15's rate (``gemm_baseline.py``);
``TARGET`` lines, exit 1 if one is missed.
Prints the time of each stage, GFLOP/s of the factorisation, the peak RSS after
each stage, the disk the store used, and the cost model's prediction
(:mod:`pipeline.plan.cholesky_cost`) next to the measured factor time.

It imports internals (the Gram, the solvers, the Cholesky cost model and the
diagnostics) because it times each phase of the fit on its own and checks the cost
model's predictions against them.
"""

from __future__ import annotations

import argparse
import json
import os
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
from pipeline.linalg.triangular import solve_refined
from pipeline.plan.cholesky_cost import predict_cholesky

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gemm_baseline import check_factor, gemm_peak_gflops, peak_line  # noqa: E402
from targets import Targets  # noqa: E402


def _du(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(root, f))
            except OSError:
                pass
    return total


def blockwise_residual(X, kernel, lam, alpha, y, block: int) -> float:
    """``‖(K + λI) α - y‖ / ‖y‖`` from kernel rows, one row block at a time (O(block·N) memory)."""
    n = X.shape[0]
    sq = 0.0
    for s in range(0, n, block):
        rows = slice(s, min(s + block, n))
        r = kernel(X[rows], X) @ alpha + lam * alpha[rows] - y[rows]
        sq += float(r @ r)
    return float(np.sqrt(sq) / np.linalg.norm(y))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--quick", action="store_true", help="N=8,000, block 2000 (a check that it runs)"
    )
    p.add_argument("--n", type=int, default=None)
    p.add_argument("--d", type=int, default=12)
    p.add_argument("--block", type=int, default=None)
    p.add_argument("--lam", type=float, default=1e-3)
    p.add_argument("--factor-dtype", default="float64", choices=["float64", "float32"])
    p.add_argument(
        "--keep-gram",
        action="store_true",
        help="factor to a separate array (doubles the disk); default: in place",
    )
    p.add_argument(
        "--gram-dtype",
        default="float64",
        choices=["float64", "float32"],
        help="float32 with --factor-dtype float32, in place: a quarter of the float64 disk",
    )
    p.add_argument(
        "--gram",
        default="stored",
        choices=["stored", "on-demand"],
        help="on-demand (in place only): no Gram stage; the factor computes each Gram "
        "tile from X when it needs it, as KernelRidge(keep_gram=False) does",
    )
    p.add_argument("--refine", default="auto", choices=["auto", "matrix_free", "stored", "none"])
    p.add_argument(
        "--gemm-gflops",
        type=float,
        default=None,
        help="for the cost model (default: the GEMM peak measured at the start of this run)",
    )
    p.add_argument(
        "--recycle-held",
        default="on",
        choices=["on", "off"],
        help="off: an evicted factor tile that a task still reads is freed, not recycled "
        "(RECYCLE_HELD_EVICTIONS off, the earlier behaviour)",
    )
    p.add_argument("--dir", default=None, help="scratch directory for the store")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    import pipeline.constants as policy_constants

    policy_constants.RECYCLE_HELD_EVICTIONS = a.recycle_held == "on"
    n = a.n or (8_000 if a.quick else 80_000)
    block = a.block or (2000 if a.quick else 4000)
    if not a.keep_gram and a.factor_dtype != a.gram_dtype:
        p.error("in place (no --keep-gram) the factor's dtype must be the Gram's (--gram-dtype)")
    if a.gram == "on-demand" and a.keep_gram:
        p.error("--gram on-demand computes the Gram inside an in-place factor: drop --keep-gram")
    if a.refine == "stored" and not a.keep_gram:
        p.error("--refine stored needs --keep-gram (in place, the Gram is gone after the factor)")
    rng = np.random.default_rng(0)
    X = rng.standard_normal((n, a.d))
    y = np.sin(X[:, 0]) + np.cos(X[:, 1]) + 0.1 * rng.standard_normal(n)
    kernel = RBF(gamma=1.0 / a.d)
    if a.dir:  # a scratch directory that does not exist yet is made
        Path(a.dir).mkdir(parents=True, exist_ok=True)
    store = Path(tempfile.mkdtemp(prefix="bench_fit80k_", dir=a.dir))
    print(
        f"N={n} D={a.d} block={block} RBF lambda={a.lam} factor {a.factor_dtype} "
        f"{'separate' if a.keep_gram else 'in place'}; store {store}; full Gram "
        f"{n * n * 8 / 1e9:.1f} GB",
        flush=True,
    )
    out: dict = {"n": n, "d": a.d, "block": block, "factor_dtype": a.factor_dtype,
                 "recycle_held": a.recycle_held}  # fmt: skip
    out["keep_gram"] = a.keep_gram
    out["gram"] = a.gram
    # the baseline, same run: the factor's main tile call at its width (GEMM peak)
    out["gemm_peak_gflops"] = gemm_peak_gflops(block)
    print(
        f"  GEMM peak (tile {block}, all cores) {out['gemm_peak_gflops']:.1f} GFLOP/s", flush=True
    )
    a.gemm_gflops = a.gemm_gflops or out["gemm_peak_gflops"]
    pred = predict_cholesky(
        n,
        block,
        gemm_gflops=a.gemm_gflops,
        disk_read_gbps=1.0,
        disk_write_gbps=0.8,
        dtype=a.factor_dtype,
        keep_gram=a.keep_gram,
    )
    out["predicted_factor_s"] = pred.seconds
    targets = Targets()
    try:
        t0 = time.perf_counter()
        on_demand = a.gram == "on-demand"  # only the Gram's array; no tile computed yet
        gram = build_gram(
            X,
            kernel,
            str(store),
            block,
            dtype=a.gram_dtype,
            progress=False,
            kernel_dtype=GRAM_ON_DEMAND_KERNEL_DTYPE if on_demand else None,
            defer=on_demand,
        )
        recompute = GramTileRecomputer.for_gram(gram, X, kernel) if on_demand else None
        out["gram_s"] = time.perf_counter() - t0
        out["rss_after_gram_gb"] = peak_rss_bytes() / 1e9
        out["disk_gram_gb"] = _du(store) / 1e9
        print(
            f"  gram   {out['gram_s']:8.1f} s  peak RSS {out['rss_after_gram_gb']:.2f} GB  "
            f"disk {out['disk_gram_gb']:.2f} GB",
            flush=True,
        )
        t1 = time.perf_counter()
        factor = tile_cholesky(
            gram,
            a.lam,
            progress=False,
            dtype=a.factor_dtype,
            keep_gram=a.keep_gram,
            recompute_tile=recompute,
        )
        out["factor_s"] = time.perf_counter() - t1
        out["gflops"] = n**3 / 3 / out["factor_s"] / 1e9
        out["rss_after_factor_gb"] = peak_rss_bytes() / 1e9
        out["disk_total_gb"] = _du(store) / 1e9
        print(
            f"  factor {out['factor_s']:8.1f} s  {out['gflops']:.1f} GFLOP/s (model predicted "
            f"{pred.seconds:.1f} s)  peak RSS {out['rss_after_factor_gb']:.2f} GB  "
            f"disk {out['disk_total_gb']:.2f} GB",
            flush=True,
        )
        if a.factor_dtype == "float64":
            print(peak_line(out["gflops"], out["gemm_peak_gflops"]), flush=True)
            check_factor(targets, out["gflops"], out["gemm_peak_gflops"])
        t2 = time.perf_counter()
        stats: dict = {}
        kw: dict = {}
        refine = a.refine
        if refine == "auto":
            refine = (
                "matrix_free"
                if a.factor_dtype == "float32" or a.gram_dtype == "float32"
                else "none"
            )
        if refine == "matrix_free":
            kw = {"X": X, "kernel": kernel}
        elif refine == "stored":
            kw = {"gram": gram}
        alpha = solve_refined(factor, y, stats=stats, **kw)
        solve_s = time.perf_counter() - t2
        out.update({k: v for k, v in stats.items() if k != "refine_operator"})
        out["triangular_s"] = out.pop("solve_s", None)
        out["solve_s"] = solve_s
        out["refine"] = refine
        release_tile_cache()
        out["fit_s"] = time.perf_counter() - t0
        out["peak_rss_gb"] = peak_rss_bytes() / 1e9
        its = (
            f" (triangular solves {out['triangular_s']:.1f} s, refinement "
            f"{stats['refine_s']:.1f} s: {stats['refine_iterations']} its, {refine})"
            if "refine_iterations" in stats
            else ""
        )
        print(f"  solve  {out['solve_s']:8.1f} s{its}", flush=True)
        t3 = time.perf_counter()
        out["rel_residual"] = blockwise_residual(X, kernel, a.lam, alpha, y, block)
        out["check_s"] = time.perf_counter() - t3
        print(
            f"fit {out['fit_s']:.1f} s (target <= 1800 s); peak RSS {out['peak_rss_gb']:.2f} GB "
            f"(target <= 3 GB); relative residual {out['rel_residual']:.1e} (target <= 1e-11; "
            f"blockwise from kernel rows, {out['check_s']:.1f} s)",
            flush=True,
        )
        if n == 80_000:
            targets.check("fit seconds", out["fit_s"], "<=", 1800, " s")
            targets.check("peak RSS", out["peak_rss_gb"], "<=", 3, " GB")
        else:
            targets.skip(
                "fit seconds and peak RSS", "targets <= 1800 s, <= 3 GB at N = 80,000 only"
            )
        targets.check("relative residual", out["rel_residual"], "<=", 1e-11)
    finally:
        shutil.rmtree(store, ignore_errors=True)
    out["targets"] = targets.as_json()
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2))
    return targets.finish()


if __name__ == "__main__":
    sys.exit(main())
