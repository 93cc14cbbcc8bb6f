"""Benchmark: out-of-core tile Cholesky against scipy and dask.array, same matrix, one run.

Builds an RBF Gram of standardised random data tile by tile into a Zarr store
(lower tiles only, as the pipeline stores it), then factors ``K + lam*I`` with

- ours, Zarr -> Zarr: ``pipeline.solvers.tile_cholesky`` (scheduler "threads" and "dask"),
- in-memory ``scipy.linalg.cho_factor`` (the matrix read from the same store; only the
  factorisation is timed),
- ``dask.array.linalg.cholesky`` Zarr -> Zarr (both triangles assembled lazily from the
  stored lower tiles, threaded scheduler with one BLAS thread per Dask thread).

and ours with a float32 factor (``dtype=np.float32``: float32 tiles and updates,
float64 POTRF of the diagonal tiles); its solve is refined against the float64
Gram, and every mode's alpha is checked by its residual against the stored Gram.

Each measurement runs in a fresh subprocess, so its peak RSS is its own. GFLOP/s use
``n**3 / 3`` flops. Run ``--quick`` (N=4000) on a shared machine; the full size is N=12000.

    python workflows/benchmarks/bench_cholesky.py --quick

It imports internals (the tile Cholesky, the storage layer and the diagnostics) because
it times the factorisation alone, on a Gram it builds itself, against scipy and
dask.array.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from pipeline.diagnostics import peak_rss_bytes

LAM = 1e-3


def _peak_rss_gb() -> float:
    return peak_rss_bytes() / 1024**3


def build_gram(store: str, n: int, block: int, d: int = 16, seed: int = 0) -> None:
    """RBF Gram (gamma = 1/d) of standardised Gaussian data, lower tiles only."""
    from pipeline.storage import fingerprint_obj, open_tiled_array

    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    X = (X - X.mean(0)) / X.std(0)
    gamma = 1.0 / d
    g = open_tiled_array(
        store, "gram", (n, n), block, np.float64, fingerprint_obj({"bench": n, "b": block})
    )
    sq = (X**2).sum(1)
    for i, j in g.grid.lower_tiles():
        ri, cj = g.grid.row_slice(i), g.grid.col_slice(j)
        t = sq[ri, None] + sq[None, cj] - 2.0 * X[ri] @ X[cj].T
        np.maximum(t, 0, out=t)
        g.write_tile(i, j, np.exp(-gamma * t))


def _open_gram(store: str):
    import zarr

    from pipeline.storage import TiledArray

    arr = zarr.open_array(store=store, path="gram", mode="r")
    return TiledArray(
        store,
        "gram",
        tuple(arr.shape),
        int(arr.attrs["block_size"]),
        np.dtype(arr.dtype).str,
        arr.attrs["fingerprint"],
    )


def _dense_from_store(gram) -> np.ndarray:
    n = gram.shape[0]
    K = np.empty((n, n), order="F")
    g = gram.grid
    for i, j in g.lower_tiles():
        t = gram.read_tile(i, j)
        K[g.row_slice(i), g.col_slice(j)] = t
        if i != j:
            K[g.col_slice(j), g.row_slice(i)] = t.T
    return K


def run_mode(mode: str, store: str, out: str) -> dict:
    """Run one measurement in this process; returns seconds and peak RSS."""
    gram = _open_gram(store)
    n = gram.shape[0]
    res: dict = {"mode": mode}
    if mode.startswith("ours"):
        from pipeline.solvers import tile_cholesky

        kind = mode.split("-", 1)[1]
        single = kind == "f32"
        # "threads1": one tile thread whose BLAS uses every core (no tile parallelism)
        # "wide": tile threads whose BLAS calls use every core, one call at a time
        n_threads = 1 if kind == "threads1" else None
        sched = "threads" if single or kind in ("threads1", "wide") else kind
        dtype = np.float32 if single else np.float64
        c0, t0 = time.process_time(), time.perf_counter()
        f = tile_cholesky(
            gram,
            LAM,
            store=out,
            name="chol",
            scheduler=sched,
            progress=False,
            dtype=dtype,
            n_threads=n_threads,
            wide=kind == "wide",
        )
        res["seconds"] = time.perf_counter() - t0
        res["cpu_seconds"] = time.process_time() - c0
        last = gram.grid.n_row_blocks - 1
        res["check_tile"] = f.L.read_tile(last, last)[-1, -3:].astype(float).tolist()
        from pipeline.solvers import cholesky_solve

        y = np.random.default_rng(1).standard_normal((n, 2))
        t1 = time.perf_counter()
        stats: dict = {}
        alpha = cholesky_solve(f, y, gram=gram if single else None, stats=stats)
        res["solve_seconds"] = time.perf_counter() - t1
        # residual of the final alpha against the stored float64 Gram, for every mode
        from pipeline.solvers.matvec import StoredKernelOperator

        r = y - StoredKernelOperator(gram, LAM).matvec(alpha)
        res["rel_residual"] = float(np.max(np.linalg.norm(r, axis=0) / np.linalg.norm(y, axis=0)))
        res["refine_iterations"] = stats.get("refine_iterations", 0)
    elif mode == "scipy":
        import scipy.linalg

        K = _dense_from_store(gram)
        K[np.diag_indices(n)] += LAM
        c0, t0 = time.process_time(), time.perf_counter()
        c, _ = scipy.linalg.cho_factor(K, lower=True, overwrite_a=True, check_finite=False)
        res["seconds"] = time.perf_counter() - t0
        res["cpu_seconds"] = time.process_time() - c0
        res["check_tile"] = c[-1, -3:].tolist()
    elif mode == "dask":
        import dask.array as da
        import zarr

        from pipeline.parallel import compute

        b = gram.block_size
        if n % b:
            raise SystemExit(f"dask.array.linalg.cholesky needs n % block == 0 (n={n}, b={b})")
        c0, t0 = time.process_time(), time.perf_counter()
        Z = da.from_zarr(zarr.open_array(store=store, path="gram", mode="r"), chunks=(b, b))
        T = n // b
        rows = [
            [
                Z[i * b : (i + 1) * b, j * b : (j + 1) * b]
                if j <= i
                else Z[j * b : (j + 1) * b, i * b : (i + 1) * b].T
                for j in range(T)
            ]
            for i in range(T)
        ]
        A = da.block(rows) + LAM * da.eye(n, chunks=b)
        L = da.linalg.cholesky(A, lower=True)
        target = zarr.create_array(
            store=out, name="L", shape=(n, n), chunks=(b, b), dtype="f8", compressors=None
        )
        compute(L.store(target, lock=False, compute=False), progress=False)
        res["seconds"] = time.perf_counter() - t0
        res["cpu_seconds"] = time.process_time() - c0
        res["check_tile"] = target[n - 1, n - 3 :].tolist()
    else:
        raise SystemExit(f"unknown mode {mode}")
    res["gflops"] = n**3 / 3 / res["seconds"] / 1e9
    res["peak_rss_gb"] = _peak_rss_gb()
    return res


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="N=4000, block 1000")
    p.add_argument("--n", type=int, default=12000)
    p.add_argument("--block-size", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument(
        "--modes",
        default="ours-threads,ours-dask,ours-f32,scipy,dask",
        help="comma-separated list; ours-f32: float32 factor (float64 diagonal tiles), "
        "alpha refined against the float64 Gram",
    )
    p.add_argument("--workdir", default=None, help="where the stores go (default: a tmp dir)")
    p.add_argument("--json", default=None, help="also write the results here")
    p.add_argument("--_worker", nargs=3, metavar=("MODE", "STORE", "OUT"), help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a._worker:
        print("RESULT " + json.dumps(run_mode(*a._worker)), flush=True)
        return
    if a.quick:
        a.n, a.block_size = 4000, 1000
    work = tempfile.mkdtemp(prefix="bench_chol_", dir=a.workdir)
    try:
        store = os.path.join(work, "gram.zarr")
        t0 = time.perf_counter()
        build_gram(store, a.n, a.block_size)
        print(
            f"N={a.n} block={a.block_size} lam={LAM}: Gram (lower tiles) built in "
            f"{time.perf_counter() - t0:.1f} s; {os.cpu_count()} cores; flops n^3/3 = "
            f"{a.n**3 / 3e9:.0f} GFLOP"
        )
        results: dict[str, list[dict]] = {}
        modes = a.modes.split(",")
        for rep in range(a.repeats):
            for mode in modes:
                out = os.path.join(work, f"out-{mode}-{rep}.zarr")
                proc = subprocess.run(
                    [sys.executable, __file__, "--_worker", mode, store, out],
                    capture_output=True,
                    text=True,
                )
                line = [s for s in proc.stdout.splitlines() if s.startswith("RESULT ")]
                if proc.returncode or not line:
                    print(f"{mode}: failed (rc {proc.returncode})\n{proc.stderr[-2000:]}")
                    continue
                r = json.loads(line[0][7:])
                results.setdefault(mode, []).append(r)
                shutil.rmtree(out, ignore_errors=True)
                solve = (
                    f" (+ solve, 2 RHS: {r['solve_seconds']:.2f} s, "
                    f"{r['refine_iterations']} refinement its, rel. residual "
                    f"{r['rel_residual']:.1e})"
                    if "solve_seconds" in r
                    else ""
                )
                print(
                    f"  rep {rep} {mode:12s} {r['seconds']:7.2f} s {r['gflops']:6.1f} GFLOP/s "
                    f"(CPU {r['cpu_seconds']:6.2f} s) peak RSS {r['peak_rss_gb']:.2f} GB{solve}",
                    flush=True,
                )
        # same matrix: the float64 factors agree (last row of the last tile)
        checks = {m: np.array(rs[0]["check_tile"]) for m, rs in results.items() if m != "ours-f32"}
        if checks:
            ref = next(iter(checks.values()))
            dev = max(float(np.max(np.abs(c - ref))) for c in checks.values())
            print(f"max deviation between methods on L[-1, -3:]: {dev:.2e}")
        print(
            f"\n{'method':12s} {'best s':>8s} {'median s':>9s} {'GFLOP/s':>8s} "
            f"{'GFLOP/CPU-s':>12s} {'peak RSS':>9s}"
        )
        summary = {}
        for mode, rs in results.items():
            secs = [r["seconds"] for r in rs]
            best = min(secs)
            gf = a.n**3 / 3 / best / 1e9
            rss = max(r["peak_rss_gb"] for r in rs)
            cpu = min(r["cpu_seconds"] for r in rs)
            summary[mode] = {"best_s": best, "median_s": statistics.median(secs), "gflops": gf}
            summary[mode].update(peak_rss_gb=rss, gflop_per_cpu_s=a.n**3 / 3 / cpu / 1e9)
            print(
                f"{mode:12s} {best:8.2f} {statistics.median(secs):9.2f} {gf:8.1f} "
                f"{summary[mode]['gflop_per_cpu_s']:12.1f} {rss:8.2f} GB"
            )
        base = [summary[m]["gflops"] for m in ("scipy", "dask") if m in summary]
        for label, sel in (
            ("float64 factor", lambda m: m in ("ours-threads", "ours-dask")),
            ("float32 factor + refined solve", lambda m: m == "ours-f32"),
        ):
            ours = [summary[m]["gflops"] for m in summary if sel(m)]
            if base and ours:
                ratio = max(ours) / max(base)
                print(
                    f"ours ({label}) / best float64 baseline = {ratio:.2f}x (target >= 0.9x, issue #15): "
                    f"{'MET' if ratio >= 0.9 else 'NOT MET'}"
                )
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"n": a.n, "block_size": a.block_size, "results": summary}, f, indent=1)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
