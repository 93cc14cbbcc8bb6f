"""Benchmark: blockwise batch prediction against a bare numpy loop and scikit-learn.

Full size (the issue's target): N = 50,000 training points, M = 1,000,000 new
points, D = 16, RBF kernel. In one run it measures

1. the pipeline: ``pipeline.linalg.blockwise.predict`` from a Zarr input to a Zarr
   output with completion markers (threaded scheduler, ``--threads`` threads,
   BLAS at one thread per task), including the input-fingerprint pass;
2. the bare loop: the same kernel tiles and GEMVs (``tile_product``, same
   block sizes, same cache blocking) in a plain ``ThreadPoolExecutor`` with the
   same number of threads, on X_new already in memory;
3. scikit-learn's ``KernelRidge.predict`` (it materialises the M x N kernel)
   at the largest M with M x N x 8 bytes <= ``--sklearn-bytes``, and the
   pipeline's in-memory predict on the same rows.

Peak RSS is the process's ``VmHWM`` right after the pipeline runs (before
the bare loop and scikit-learn, which hold more in memory).

Targets at full size: pipeline / bare loop <= 1.2 and peak RSS through the pipeline
<= 2 GB (``TARGET`` lines; exit 1 if one is missed).

Run ``python workflows/benchmarks/bench_predict.py --quick`` for small sizes.

It imports internals (``pipeline.linalg.blockwise``, the kernels and the diagnostics) because it
times the blockwise prediction engine itself, from a Zarr input to a Zarr output,
without an estimator around it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import dask
import numpy as np
import zarr
from threadpoolctl import threadpool_limits

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from targets import Targets  # noqa: E402

from pipeline.diagnostics import peak_rss_bytes  # noqa: E402
from pipeline.kernels import RBF  # noqa: E402
from pipeline.linalg.blockwise import CACHE_BLOCK, predict, tile_product  # noqa: E402


def _rss_peak() -> int:
    return peak_rss_bytes()


def _make_input(path: str, M: int, D: int, seed: int, chunk: int = 65536) -> zarr.Array:
    z = zarr.create_array(store=path, shape=(M, D), chunks=(chunk, D), dtype="f8", compressors=None)
    rng = np.random.default_rng(seed)
    for s in range(0, M, chunk):
        z[s : s + chunk] = rng.standard_normal((min(chunk, M - s), D))
    return z


def _bare_loop(kernel, X, Xt, a, b, bt, cache, threads):
    """The same tiles and GEMVs as the pipeline, in a plain thread pool."""
    A = a[:, None]
    train = [(Xt[s : s + bt], A[s : s + bt]) for s in range(0, Xt.shape[0], bt)]
    out = np.empty(X.shape[0])

    def row_block(s):
        xb = X[s : s + b]
        acc = None
        for xt, aj in train:
            part = tile_product(kernel, xb, xt, aj, cache)
            acc = part if acc is None else acc + part
        out[s : s + b] = acc[:, 0]

    with threadpool_limits(1, "blas"), ThreadPoolExecutor(threads) as pool:
        list(pool.map(row_block, range(0, X.shape[0], b)))
    return out


def _sklearn_predict(X_fit, dual_coef, gamma, X):
    from sklearn.kernel_ridge import KernelRidge

    kr = KernelRidge(kernel="rbf", gamma=gamma)
    kr.X_fit_ = X_fit
    kr.dual_coef_ = dual_coef
    kr.n_features_in_ = X_fit.shape[1]
    return kr.predict(X)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes (N=5k, M=100k)")
    p.add_argument("--n-train", type=int, default=50_000)
    p.add_argument("--n-new", type=int, default=1_000_000)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--block-size", type=int, default=4096)
    p.add_argument("--train-block-size", type=int, default=4096)
    p.add_argument("--cache-block", type=int, default=CACHE_BLOCK)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--repeat", type=int, default=1, help="repeats; the minimum is reported")
    p.add_argument("--sklearn-bytes", type=float, default=4e9,
                   help="largest M x N x 8 scikit-learn may materialise")  # fmt: skip
    p.add_argument("--workdir", default=None, help="where the Zarr input/output go (temp dir)")
    p.add_argument("--json", default=None, help="also write the figures to this JSON file")
    args = p.parse_args(argv)
    if args.quick:
        args.n_train, args.n_new, args.sklearn_bytes = 5_000, 100_000, 4e8
        args.repeat = max(args.repeat, 2)
    N, M, D = args.n_train, args.n_new, args.dim
    b, bt, cache, T = args.block_size, args.train_block_size, args.cache_block, args.threads
    gamma = 1.0 / D
    kernel = RBF(gamma=gamma)

    work = args.workdir or tempfile.mkdtemp(prefix="bench_predict_")
    os.makedirs(work, exist_ok=True)
    rng = np.random.default_rng(0)
    Xt = rng.standard_normal((N, D))
    a = rng.standard_normal(N)
    _make_input(f"{work}/x_new.zarr", M, D, seed=1)
    print(f"N={N:,} M={M:,} D={D} RBF(gamma={gamma:g}); tiles {b}x{bt} in {cache}-square "
          f"pieces; {T} threads; work dir {work}", flush=True)  # fmt: skip

    # 1. the pipeline, Zarr -> Zarr with markers
    rss_before = _rss_peak()
    t_pipe = []
    for r in range(args.repeat):
        out = f"{work}/out{r}"
        shutil.rmtree(out, ignore_errors=True)
        t0 = time.perf_counter()
        with dask.config.set(num_workers=T):
            res = predict(f"{work}/x_new.zarr", Xt, a, kernel, out=out, block_size=b,
                          train_block_size=bt, cache_block=cache, progress=False)  # fmt: skip
        t_pipe.append(time.perf_counter() - t0)
        assert res.n_computed == res.n_blocks
    rss_pipe = _rss_peak()
    y_pipe = res.to_numpy()

    # 2. bare loop, same tiles and GEMVs, same threads
    X_new = zarr.open_array(store=f"{work}/x_new.zarr", mode="r")[...]
    t_bare = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        y_bare = _bare_loop(kernel, X_new, Xt, a, b, bt, cache, T)
        t_bare.append(time.perf_counter() - t0)
    diff = float(np.max(np.abs(y_pipe - y_bare)))

    # 3. scikit-learn at the largest M it can materialise, and the pipeline on the same rows
    m_sk = int(min(M, args.sklearn_bytes // (N * 8)))
    Xs = X_new[:m_sk]
    with dask.config.set(num_workers=T):
        t0 = time.perf_counter()
        y_small = predict(Xs, Xt, a, kernel, block_size=b, train_block_size=bt,
                          cache_block=cache, progress=False)  # fmt: skip
        t_pipe_small = time.perf_counter() - t0
    t0 = time.perf_counter()
    with threadpool_limits(T, "blas"):
        y_sk = _sklearn_predict(Xt, a, gamma, Xs)
    t_sk = time.perf_counter() - t0
    rss_sk = _rss_peak()
    diff_sk = float(np.max(np.abs(y_sk - y_small)))

    tp, tb = min(t_pipe), min(t_bare)
    fig = {
        "n_train": N, "n_new": M, "dim": D, "threads": T, "block_size": b,
        "train_block_size": bt, "cache_block": cache, "repeat": args.repeat,
        "pipeline_s": tp, "pipeline_all_s": t_pipe, "pipeline_pred_per_s": M / tp,
        "bare_s": tb, "bare_all_s": t_bare, "bare_pred_per_s": M / tb,
        "ratio_pipeline_over_bare": tp / tb,
        "kernel_values_per_s": M * N / tp,
        "rss_before_pipeline_bytes": rss_before, "peak_rss_pipeline_bytes": rss_pipe,
        "max_abs_diff_pipeline_vs_bare": diff,
        "sklearn_m": m_sk, "sklearn_s": t_sk, "sklearn_pred_per_s": m_sk / t_sk,
        "pipeline_same_m_s": t_pipe_small, "pipeline_same_m_pred_per_s": m_sk / t_pipe_small,
        "peak_rss_after_sklearn_bytes": rss_sk, "max_abs_diff_sklearn": diff_sk,
    }  # fmt: skip
    gib = 2**30
    print()
    print(f"{'':34s}{'time (s)':>10s}{'pred/s':>14s}")
    print(f"{'pipeline (Zarr -> Zarr, markers)':34s}{tp:10.2f}{M / tp:14,.0f}")
    print(f"{'bare numpy loop, same tiles':34s}{tb:10.2f}{M / tb:14,.0f}")
    print(f"  ratio pipeline / bare: {tp / tb:.3f} (target <= 1.2); max |diff| {diff:.1e}")
    print(f"  peak RSS through the pipeline: {rss_pipe / gib:.2f} GiB (target <= 2 GB; "
          f"{rss_before / gib:.2f} GiB before it)")  # fmt: skip
    print(f"scikit-learn KernelRidge.predict at M={m_sk:,} (M x N x 8 = "
          f"{m_sk * N * 8 / 1e9:.2f} GB):")  # fmt: skip
    print(f"{'  sklearn predict':34s}{t_sk:10.2f}{m_sk / t_sk:14,.0f}")
    print(f"{'  pipeline predict (numpy out)':34s}{t_pipe_small:10.2f}{m_sk / t_pipe_small:14,.0f}")
    print(f"  max |diff| vs sklearn {diff_sk:.1e}; peak RSS after sklearn {rss_sk / gib:.2f} GiB")
    targets = Targets()
    if (N, M, D) == (50_000, 1_000_000, 16):  # full size, the target
        targets.check("pipeline / bare loop", tp / tb, "<=", 1.2)
        targets.check("peak RSS through the pipeline", rss_pipe / 1e9, "<=", 2, " GB")
    else:
        targets.skip(
            "pipeline / bare loop and peak RSS", "at N = 50,000, M = 1,000,000, D = 16 only"
        )
    fig["targets"] = targets.as_json()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(fig, f, indent=1)
    if args.workdir is None:
        shutil.rmtree(work, ignore_errors=True)
    return targets.finish()


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
