"""Benchmark: the fused evaluators per kernel: RBF, ARD RBF and Matérn ν = 1/2, 3/2, 5/2.

In one run, on the same synthetic standard-normal rows (N rows, D features) and the
same tiles, it times three operations of the fused tile engine for each kernel and
prints kernel entries per second (G/s) and the ratio to the isotropic RBF:

- ``matvec``: ``K v`` over the lower tiles of the symmetric K(X, X) (tiles of
  ``--tile`` rows; an off-diagonal tile used twice, ``symmetric_pair``); every stored
  lower entry is counted once, diagonal tiles in full;
- ``predict``: ``K(X_new, X) a`` over ``--tile`` x ``--tile`` tiles, M = N / 2 new rows;
- ``gram``: every lower tile of K(X, X) evaluated into memory (``kernel_tile``).

Kernels: ``rbf`` (``RBF(length_scale=ℓ)``), ``rbf-ard`` (one length scale per
feature), ``matern-0.5``, ``matern-1.5``, ``matern-2.5`` (isotropic) and
``matern-2.5-ard``. The ARD rows pay one extra pass over the rows per call (the
scaling by 1/ℓ); Matérn pays, per entry, a clip, a square root and (ν > 1/2) a
few multiply-adds beside the RBF's ``exp`` (:mod:`pipeline.engine.evaluators`).

Timing: the kernels of one operation alternate within each of ``--repeat`` rounds
and the minimum wall time of each is kept (also CPU seconds of the process); the
tile driver runs the tiles one after another, each on ``--threads`` threads of the
engine (BLAS at one thread inside), so every kernel sees the same decomposition.

    python workflows/benchmarks/bench_kernels.py --quick     # N = 4,000, D = 8: seconds
    python workflows/benchmarks/bench_kernels.py             # N = 20,000, D = 8
    python workflows/benchmarks/bench_kernels.py --d 64 --kernel-dtype float32

It imports internals (the tile engine's ``kernel_matvec``, ``kernel_tile`` and
``predict_accumulate``) because it times the evaluators tile by tile, apart from the
Dask passes and stores around them, which no public function exposes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections.abc import Callable

import numpy as np

from pipeline.engine import kernel_matvec, kernel_tile, predict_accumulate
from pipeline.kernels import RBF, Kernel, Matern


def kernels(d: int, ell: float) -> dict[str, Kernel]:
    """The kernels compared, with comparable length scales (ARD: spread around ``ell``)."""
    ard = ell * np.geomspace(0.5, 2.0, d)
    return {
        "rbf": RBF(length_scale=ell),
        "rbf-ard": RBF(length_scale=ard),
        "matern-0.5": Matern(nu=0.5, length_scale=ell),
        "matern-1.5": Matern(nu=1.5, length_scale=ell),
        "matern-2.5": Matern(nu=2.5, length_scale=ell),
        "matern-2.5-ard": Matern(nu=2.5, length_scale=ard),
    }


def _tiles(n: int, t: int) -> list[tuple[int, int]]:
    return [(s, min(s + t, n)) for s in range(0, n, t)]


def op_matvec(kernel, X, v, tile, kd, threads) -> int:
    n = X.shape[0]
    out = np.zeros(n)
    entries = 0
    for i, (a, b) in enumerate(_tiles(n, tile)):
        for c, e in _tiles(n, tile)[: i + 1]:
            if c == a:
                kernel_matvec(kernel, X[a:b], None, v[a:b], out[a:b], kernel_dtype=kd,
                              n_threads=threads)  # fmt: skip
                entries += (b - a) ** 2
            else:
                kernel_matvec(kernel, X[a:b], X[c:e], v[c:e], out[a:b], True, Vi=v[a:b],
                              out_t=out[c:e], kernel_dtype=kd, n_threads=threads)  # fmt: skip
                entries += (b - a) * (e - c)
    return entries


def op_predict(kernel, X, v, tile, kd, threads, X_new) -> int:
    out = np.zeros(X_new.shape[0])
    for a, b in _tiles(X_new.shape[0], tile):
        for c, e in _tiles(X.shape[0], tile):
            predict_accumulate(kernel, X_new[a:b], X[c:e], v[c:e], out[a:b], kernel_dtype=kd,
                               n_threads=threads)  # fmt: skip
    return X_new.shape[0] * X.shape[0]


def op_gram(kernel, X, v, tile, kd, threads) -> int:
    n = X.shape[0]
    dt = np.float32 if kd == "float32" else np.float64
    buf = np.empty((tile, tile), dtype=dt)
    entries = 0
    for i, (a, b) in enumerate(_tiles(n, tile)):
        for c, e in _tiles(n, tile)[: i + 1]:
            out = buf[: b - a, : e - c]
            if not out.flags.c_contiguous:
                out = np.empty((b - a, e - c), dtype=dt)
            kernel_tile(kernel, X[a:b], None if c == a else X[c:e], out, kernel_dtype=kd,
                        n_threads=threads)  # fmt: skip
            entries += (b - a) * (e - c)
    return entries


def _time(fn: Callable[[], int]) -> tuple[float, float, int]:
    c0, t0 = time.process_time(), time.perf_counter()
    entries = fn()
    return time.perf_counter() - t0, time.process_time() - c0, entries


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="N = 4,000 (seconds)")
    p.add_argument("--n", type=int, default=None, help="rows (default 20,000; --quick 4,000)")
    p.add_argument("--d", type=int, default=8, help="features (default 8)")
    p.add_argument("--tile", type=int, default=2048, help="tile rows (default 2,048)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--kernel-dtype", default="float64", choices=("float64", "float32"))
    p.add_argument("--ops", default="matvec,predict,gram")
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args(argv)
    n = args.n or (4000 if args.quick else 20000)
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n, args.d))
    X_new = rng.normal(size=(n // 2, args.d))
    v = rng.normal(size=n)
    ks = kernels(args.d, ell=float(np.sqrt(args.d)))
    ops = {
        "matvec": lambda k: op_matvec(k, X, v, args.tile, args.kernel_dtype, args.threads),
        "predict": lambda k: op_predict(k, X, v, args.tile, args.kernel_dtype, args.threads, X_new),
        "gram": lambda k: op_gram(k, X, v, args.tile, args.kernel_dtype, args.threads),
    }
    chosen = [o.strip() for o in args.ops.split(",") if o.strip()]
    print(
        f"# bench_kernels: N={n}, D={args.d}, tile={args.tile}, threads={args.threads}, "
        f"kernel_dtype={args.kernel_dtype}, best of {args.repeat}; {platform.processor() or platform.machine()}"
    )
    results: dict = {"n": n, "d": args.d, "tile": args.tile, "threads": args.threads,
                     "kernel_dtype": args.kernel_dtype, "ops": {}}  # fmt: skip
    for op in chosen:
        best: dict[str, tuple[float, float, int]] = {}
        for _ in range(max(1, args.repeat)):
            for name, k in ks.items():  # alternate the kernels within a round
                wall, cpu, entries = _time(lambda k=k, run=ops[op]: run(k))
                if name not in best or wall < best[name][0]:
                    best[name] = (wall, cpu, entries)
        base = best["rbf"][2] / best["rbf"][0]
        print(f"\n{op:8s} {'kernel':16s} {'G/s':>7s} {'vs rbf':>7s} {'G/CPU-s':>8s} {'wall s':>8s}")
        rows = {}
        for name, (wall, cpu, entries) in best.items():
            rate = entries / wall
            rows[name] = {"G_per_s": rate / 1e9, "vs_rbf": rate / base, "wall_s": wall,
                          "G_per_cpu_s": entries / max(cpu, 1e-9) / 1e9}  # fmt: skip
            print(f"{'':8s} {name:16s} {rate / 1e9:7.3f} {rate / base:6.2f}x "
                  f"{rows[name]['G_per_cpu_s']:8.3f} {wall:8.3f}")  # fmt: skip
        results["ops"][op] = rows
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return results


if __name__ == "__main__":
    main()
