"""Benchmark: the prediction target of issue 14, 1,000,000 new rows against 50,000.

Target (2 cores): ``K(X_new, X_train) @ alpha`` for M = 1,000,000 new rows and
N = 50,000 training rows at >= 0.5 G kernel entries/s in float64, with a peak
resident set size <= 1 GB; checked at that size (M x N >= 5e10; ``TARGET`` lines, exit
1 if one is missed).

It imports internals (``pipeline.linalg.blockwise.predict``, ``pipeline.kernels.RBF`` and
``pipeline.diagnostics.peak_rss_bytes``) because it times the blockwise prediction
engine itself on a synthetic alpha, without a fit in front of it.

In one run it measures

1. the public path: :func:`pipeline.linalg.blockwise.predict` from a Zarr input of
   M x D rows (synthetic standard normal, D = 16 by default, written here in
   65,536-row chunks) to a Zarr output with completion markers, on the
   threaded scheduler with ``--threads`` workers; RBF(gamma = 1/D), alpha
   standard normal. Everything the call does counts: the input fingerprint
   (one streaming read of X_new), the model fingerprint, the fused tiles
   (float64) and the checksummed writes. Wall seconds, CPU seconds of the
   process (all threads), G entries/s = M * N / wall;
2. peak RSS of that call: a sampler of VmRSS (every 20 ms) during the call, and
   the process's ``VmHWM`` right after it (setup included; the baselines run
   later and hold more, so they cannot inflate it);
3. baselines in the same process, on a slice of the new rows against every
   training row, each extrapolated to M x N by its measured rate:
   - the plain numpy tile loop: whole 2,048 x 2,048 tile with its distance
     temporary, ``np.exp``, GEMV; a pool of ``--threads`` threads over tiles,
     BLAS at one thread (as ``bench_engine.py``'s baseline (d));
   - scikit-learn: ``pairwise_kernels(X_slice, X_train, metric="rbf") @ alpha``
     (BLAS at ``--threads`` threads), on as many rows as fit in ~200 MB.
   The pipeline's predictions on the slice are checked against the plain
   loop's (relative error <= 1e-10, else exit 1).

Why peak memory stays under 1 GB by construction: the prediction is a grid of
``block_size`` x ``train_block_size`` tiles (4,096 x 4,096); a tile task reads
one X_new row block (4,096 x D x 8 bytes = 0.5 MB at D = 16), evaluates its
tile in 256 x 512 sub-blocks in per-thread scratch (1 MB each, plus the
4,096 x 1 product), and returns a 4,096-vector; the sums per row block are
written to Zarr block by block. X_train and alpha are held once (N x (D + 1)
x 8 = 6.8 MB). So beyond the interpreter and its imports (about 200 MB) the
working set is a few MB per thread; even if the scheduler loaded every X_new
block at once it would be M x D x 8 = 128 MB. The script prints this bound
next to the measurement.

    python workflows/benchmarks/bench_predict_1m.py --quick   # M = 100,000, N = 10,000
    python workflows/benchmarks/bench_predict_1m.py           # the target size (~2 min)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import dask
import numpy as np
import zarr
from threadpoolctl import threadpool_limits

from pipeline.diagnostics import current_rss_bytes, peak_rss_bytes
from pipeline.kernels import RBF
from pipeline.linalg.blockwise import predict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from memory_sampler import PeakSampler  # noqa: E402
from targets import Targets  # noqa: E402

PLAIN_TILE = 2048
TARGET_GS, TARGET_RSS = 0.5, 1e9


def cpu_seconds() -> float:
    """User + system CPU seconds of this process, all threads."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def make_input(path: str, M: int, D: int, seed: int = 1, chunk: int = 65536) -> None:
    """Synthetic X_new as an uncompressed Zarr array, written chunk by chunk (8 MB in memory)."""
    z = zarr.create_array(store=path, shape=(M, D), chunks=(chunk, D), dtype="f8", compressors=None)
    rng = np.random.default_rng(seed)
    for s in range(0, M, chunk):
        z[s : s + chunk] = rng.standard_normal((min(chunk, M - s), D))


def plain_tile(gamma: float, Xi: np.ndarray, Xj: np.ndarray) -> np.ndarray:
    """Baseline (d) of bench_engine.py: the whole tile with its distance temporary."""
    d = (Xi * Xi).sum(1)[:, None] + (Xj * Xj).sum(1)[None, :] - 2.0 * (Xi @ Xj.T)
    return np.exp(-gamma * d)


def plain_loop(gamma: float, Xs: np.ndarray, Xt: np.ndarray, a: np.ndarray, threads: int):
    b = PLAIN_TILE
    rows = [slice(s, min(s + b, Xs.shape[0])) for s in range(0, Xs.shape[0], b)]
    cols = [slice(s, min(s + b, Xt.shape[0])) for s in range(0, Xt.shape[0], b)]

    def row_block(r):
        acc = np.zeros(r.stop - r.start)
        for c in cols:  # fixed order
            acc += plain_tile(gamma, Xs[r], Xt[c]) @ a[c]
        return acc

    with threadpool_limits(1, "blas"), ThreadPoolExecutor(threads) as pool:
        return np.concatenate(list(pool.map(row_block, rows)))


def sklearn_slice(gamma: float, Xs: np.ndarray, Xt: np.ndarray, a: np.ndarray, threads: int):
    from sklearn.metrics.pairwise import pairwise_kernels

    with threadpool_limits(threads, "blas"):
        return pairwise_kernels(Xs, Xt, metric="rbf", gamma=gamma) @ a


def timed(fn, repeat: int):
    """(result, min wall s, CPU s of that run) over ``repeat`` runs."""
    best = (None, float("inf"), 0.0)
    for _ in range(repeat):
        c0, t0 = cpu_seconds(), time.perf_counter()
        res = fn()
        wall, cpu = time.perf_counter() - t0, cpu_seconds() - c0
        if wall < best[1]:
            best = (res, wall, cpu)
    return best


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="M = 100,000, N = 10,000")
    p.add_argument("--n-new", type=int, default=1_000_000)
    p.add_argument("--n-train", type=int, default=50_000)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--block-size", type=int, default=4096)
    p.add_argument("--train-block-size", type=int, default=4096)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--slice-rows", type=int, default=None,
                   help="new rows for the baselines (default 8,192; --quick 4,096)")  # fmt: skip
    p.add_argument("--repeat", type=int, default=None, help="baseline repeats, min (default 2)")
    p.add_argument("--workdir", default=None, help="where the Zarr input/output go (temp dir)")
    p.add_argument("--json", default=None, help="also write the figures to this file")
    args = p.parse_args(argv)
    if args.quick:
        args.n_new, args.n_train = 100_000, 10_000
    M, N, D, T = args.n_new, args.n_train, args.dim, args.threads
    S = args.slice_rows or (4096 if args.quick else 8192)
    S = min(S, M)
    repeat = args.repeat or 2
    gamma = 1.0 / D
    kernel = RBF(gamma=gamma)
    work = args.workdir or tempfile.mkdtemp(prefix="bench_predict_1m_")
    os.makedirs(work, exist_ok=True)
    try:
        rng = np.random.default_rng(0)
        Xt = rng.standard_normal((N, D))
        a = rng.standard_normal(N)
        src = os.path.join(work, "x_new.zarr")
        shutil.rmtree(src, ignore_errors=True)
        make_input(src, M, D)
        ent = float(M) * N
        print(
            f"# bench_predict_1m: M={M:,} new x N={N:,} training rows, D={D}, RBF(gamma={gamma:g}), "
            f"float64; tiles {args.block_size} x {args.train_block_size}; threads={T} "
            f"({os.cpu_count()} cpus); numpy {np.__version__}; work dir {work}",
            flush=True,
        )

        # 1-2. the public path, Zarr -> Zarr with markers, and its memory
        rss0 = peak_rss_bytes()
        out = os.path.join(work, "out")
        shutil.rmtree(out, ignore_errors=True)
        with PeakSampler(current_rss_bytes) as rs, dask.config.set(num_workers=T):
            c0, t0 = cpu_seconds(), time.perf_counter()
            res = predict(src, Xt, a, kernel, out=out, block_size=args.block_size,
                          train_block_size=args.train_block_size, progress=False)  # fmt: skip
            wall, cpu = time.perf_counter() - t0, cpu_seconds() - c0
        hwm = peak_rss_bytes()
        assert res.n_computed == res.n_blocks, res
        y = zarr.open_array(store=out, path="predictions", mode="r")[:S]
        gs = ent / wall
        # the data a prediction can hold at once (see the module docstring); the
        # rest of the RSS is the interpreter, its imports and the scheduler
        bound = (M * D + N * (D + 1) + M) * 8 + T * 4 * 2**20

        # 3. baselines on the first S rows, extrapolated by rate
        Xs = zarr.open_array(store=src, mode="r")[:S]
        y_plain, w_plain, c_plain = timed(lambda: plain_loop(gamma, Xs, Xt, a, T), repeat)
        err = float(np.max(np.abs(y - y_plain)) / np.max(np.abs(y_plain)))
        S_sk = int(max(1, min(S, 2e8 // (N * 8))))
        y_sk, w_sk, c_sk = timed(lambda: sklearn_slice(gamma, Xs[:S_sk], Xt, a, T), repeat)
        err_sk = float(np.max(np.abs(y[:S_sk] - y_sk)) / np.max(np.abs(y_sk)))
        g_plain, g_sk = S * N / w_plain, S_sk * N / w_sk

        def row(name, n_ent, w, c, note=""):
            g = n_ent / w
            print(f"{name:<46} {n_ent / 1e9:8.3f} {w:8.2f} {c:8.2f} {g / 1e9:8.3f} "
                  f"{n_ent / c / 1e9:8.3f} {ent / g:10.1f}  {g / g_plain:6.2f}x"
                  f"  {(n_ent / c) / (S * N / c_plain):6.2f}x{note}")  # fmt: skip

        print(f"\n{'method':<46} {'G ent':>8} {'wall s':>8} {'CPU s':>8} {'G ent/s':>8} "
              f"{'G/CPU-s':>8} {'full M*N s':>10}  {'vs plain':>7}  {'CPU-s':>7}")  # fmt: skip
        row("pipeline.linalg.blockwise (Zarr -> Zarr, markers)", ent, wall, cpu)
        row(f"plain numpy tile loop, {S:,} rows (extrap.)", S * N, w_plain, c_plain)
        row(f"sklearn pairwise_kernels, {S_sk:,} rows (extrap.)", S_sk * N, w_sk, c_sk)
        gib = 2**30
        print(f"\npeak RSS during predict (VmRSS sampled every 20 ms): {rs.peak / gib:.3f} GiB; VmHWM after it: "
              f"{hwm / gib:.3f} GiB ({rss0 / gib:.3f} GiB before it); data a prediction can hold "
              f"at once (all of X_new, X_train, alpha, y, scratch): <= {bound / 2**20:.0f} MiB")  # fmt: skip
        print(f"relative error vs plain loop {err:.1e}, vs sklearn {err_sk:.1e}")
        print(f"G entries/s: {gs / 1e9:.3f}; peak RSS: {max(hwm, rs.peak) / 1e9:.3f} GB")
        targets = Targets()
        if M * N >= 5e10:
            targets.check("G kernel entries/s", gs / 1e9, ">=", TARGET_GS)
            targets.check("peak RSS", max(hwm, rs.peak) / 1e9, "<=", TARGET_RSS / 1e9, " GB")
        else:
            targets.skip(
                "G kernel entries/s and peak RSS", "not the target size: --quick or smaller"
            )
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({
                    "M": M, "N": N, "D": D, "threads": T, "wall_s": wall, "cpu_s": cpu,
                    "g_entries_per_s": gs / 1e9, "peak_rss_sampled": rs.peak, "vmhwm": hwm,
                    "vmhwm_before": rss0, "plain_g_per_s": g_plain / 1e9, "sklearn_g_per_s": g_sk / 1e9,
                    "plain_wall_s": w_plain, "sklearn_wall_s": w_sk, "plain_cpu_s": c_plain, "sklearn_cpu_s": c_sk, "slice_rows": S,
                    "sklearn_rows": S_sk, "rel_err_plain": err, "rel_err_sklearn": err_sk,
                    "targets": targets.as_json(),
                }, fh, indent=1)  # fmt: skip
        code = targets.finish()
        if not (err <= 1e-10 and err_sk <= 1e-10):
            print("ERROR: the predictions disagree with the baselines", file=sys.stderr)
            return 1
        return code
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
