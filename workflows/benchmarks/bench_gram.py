"""Benchmark: out-of-core Gram build against its compute-only and write-only baselines.

Usage::

    python workflows/benchmarks/bench_gram.py            # N=40,000, D=16, block 4096, float64
    python workflows/benchmarks/bench_gram.py --quick    # N=12,000, block 2048 (about 0.6 GB)

In one process and on the same tiles (lower triangle of K(X, X), RBF) it times

* ``compute-only``: every tile evaluated with the kernel and discarded, same
  Dask graph shape and parallelism (threaded scheduler, BLAS at 1 thread);
* ``write-only``: the same bytes (the Gram's own tiles, computed untimed and held
  in RAM for this phase only) region-written into a Zarr v3 array with the same
  chunks, no compression, same parallelism;
* ``build``: :func:`pipeline.linalg.gram.build_gram` into a fresh store (this includes
  the streaming validation and fingerprint pass over X, and the markers).

Each phase starts after the previous store was deleted and ``os.sync()`` ran, so
no phase pays for another's dirty pages, and the write phases end with ``os.sync()``
inside the timing (durable bytes; ``--no-sync`` drops it). Peak RSS per phase is sampled by a
psutil thread every 10 ms (``VmHWM`` gives the process-wide peak). Target:
build wall <= 1.25 x max(compute-only, write-only) and peak RSS <= 2 GB (``TARGET``
lines; exit 1 if one is missed).
Repeats are interleaved; the minimum of each phase is reported. The stores are
removed at the end.

It imports internals (the Gram build, the storage layer and the diagnostics) because its
baselines are the Gram's compute-only and write-only halves, which no public function
runs alone.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import dask
import numpy as np
import psutil
import zarr

sys.path.insert(0, str(Path(__file__).resolve().parent))
from targets import Targets  # noqa: E402

from pipeline.diagnostics import peak_rss_bytes  # noqa: E402
from pipeline.engine.parallel import compute  # noqa: E402
from pipeline.kernels import RBF  # noqa: E402
from pipeline.linalg.gram import build_gram  # noqa: E402
from pipeline.storage import TileGrid  # noqa: E402


class PeakRSS:
    """Sample this process's RSS in a background thread; ``.peak`` in bytes."""

    def __init__(self, interval: float = 0.01) -> None:
        self.interval = interval
        self.proc = psutil.Process()
        self.peak = 0
        self._stop = threading.Event()

    def __enter__(self) -> PeakRSS:
        self.peak = self.proc.memory_info().rss
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(self.interval)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, self.proc.memory_info().rss)


def _compute_tile(kernel, Xi, Xj, diag, dtype):
    K = kernel(Xi) if diag else kernel(Xi, Xj)
    np.asarray(K, dtype=dtype)
    return None


def compute_only(X, kernel, grid, dtype):
    blocks = [dask.delayed(X[grid.row_slice(i)]) for i in range(grid.n_row_blocks)]
    tasks = [
        dask.delayed(_compute_tile, pure=False)(kernel, blocks[i], blocks[j], i == j, dtype)
        for i, j in grid.lower_tiles()
    ]
    compute(*tasks, progress=False)


def _write_tile(path, grid, i, j, tile):
    arr = zarr.open_array(store=path, mode="r+")
    r, c = grid.row_slice(i), grid.col_slice(j)
    arr[r, c] = tile[: r.stop - r.start, : c.stop - c.start]


def gram_tiles(X, kernel, grid, dtype) -> dict:
    """The Gram's own tiles, in memory (untimed): the write-only baseline writes these bytes."""
    return {
        (i, j): np.asarray(kernel(X[grid.row_slice(i)], X[grid.col_slice(j)]), dtype=dtype)
        for i, j in grid.lower_tiles()
    }


def write_only(path, grid, dtype, tiles):
    """Write the given tiles to a fresh uncompressed Zarr array, one task per tile."""
    b = grid.block_size
    zarr.create_array(
        store=path,
        shape=(grid.n_rows, grid.n_cols),
        chunks=(min(b, grid.n_rows), min(b, grid.n_cols)),
        dtype=dtype,
        compressors=None,
        fill_value=0,
        overwrite=True,
    )
    tasks = [
        dask.delayed(_write_tile, pure=False)(path, grid, i, j, tiles[(i, j)])
        for i, j in grid.lower_tiles()
    ]
    compute(*tasks, progress=False)


def _fresh(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
    os.sync()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="N=12000, block 2048")
    p.add_argument("--n", type=int, default=None)
    p.add_argument("--d", type=int, default=16)
    p.add_argument("--block", type=int, default=None)
    p.add_argument("--dtype", default="float64")
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--dir", default=None, help="scratch directory for the stores")
    p.add_argument(
        "--no-sync",
        action="store_true",
        help="time until the write calls return, without the final os.sync() "
        "(the page cache then absorbs several GB and the figures swing 4x between runs)",
    )
    args = p.parse_args(argv)
    n = args.n or (12_000 if args.quick else 40_000)
    block = args.block or (2048 if args.quick else 4096)
    repeats = args.repeats or (2 if args.quick else 1)
    dtype = np.dtype(args.dtype)

    X = np.random.default_rng(0).standard_normal((n, args.d))
    kernel = RBF(gamma=1.0 / args.d)
    grid = TileGrid(n, n, block)
    n_tiles = grid.n_lower_tiles()
    nbytes = (
        sum(
            (grid.row_slice(i).stop - grid.row_slice(i).start)
            * (grid.col_slice(j).stop - grid.col_slice(j).start)
            for i, j in grid.lower_tiles()
        )
        * dtype.itemsize
    )
    if args.dir:  # a scratch directory that does not exist yet is made
        Path(args.dir).mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="bench_gram_", dir=args.dir))
    print(
        f"bench_gram: N={n} D={args.d} block={block} dtype={dtype} RBF; {n_tiles} lower tiles, "
        f"{nbytes / 1e9:.2f} GB; threads={os.cpu_count()}; scratch {scratch}",
        flush=True,
    )
    # the first Zarr write in a process is slow (docs/PERFORMANCE.md): warm up outside the timings
    warm = TileGrid(512, 512, 256)
    write_only(str(scratch / "warm"), warm, dtype, gram_tiles(X[:512], kernel, warm, dtype))
    times: dict[str, list[float]] = {"compute-only": [], "build": [], "write-only": []}
    peaks: dict[str, int] = {k: 0 for k in times}
    try:
        for rep in range(repeats):
            for phase in times:
                path = scratch / phase
                _fresh(path)
                if phase == "write-only":
                    # the bytes the build wrote, computed outside the timing and held in RAM
                    # only for this phase (so they do not count in the build's peak RSS)
                    tiles = gram_tiles(X, kernel, grid, dtype)
                with PeakRSS() as mon:
                    t0 = time.perf_counter()
                    if phase == "compute-only":
                        compute_only(X, kernel, grid, dtype)
                    elif phase == "write-only":
                        write_only(str(path), grid, dtype, tiles)
                    else:
                        build_gram(X, kernel, str(path), block, dtype=dtype, progress=False)
                    dt_returned = time.perf_counter() - t0
                    if phase != "compute-only" and not args.no_sync:
                        os.sync()  # durable: the bytes are on disk, not only in page cache
                    dt = time.perf_counter() - t0
                times[phase].append(dt)
                if phase == "write-only":
                    del tiles
                peaks[phase] = max(peaks[phase], mon.peak)
                print(
                    f"  rep {rep}: {phase:13s} {dt:7.2f} s  {nbytes / dt / 1e9:5.2f} GB/s  "
                    f"peak RSS {mon.peak / 1e9:.2f} GB (calls returned after {dt_returned:.2f} s)",
                    flush=True,
                )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    best = {k: min(v) for k, v in times.items()}
    base = max(best["compute-only"], best["write-only"])
    ratio = best["build"] / base
    maxrss = peak_rss_bytes()
    print("\nphase          best wall   GB/s   peak RSS")
    for k in times:
        print(
            f"{k:13s}  {best[k]:8.2f} s  {nbytes / best[k] / 1e9:5.2f}   {peaks[k] / 1e9:5.2f} GB"
        )
    print(
        f"build / max(compute-only, write-only) = {ratio:.2f} (target <= 1.25); "
        f"build peak RSS {peaks['build'] / 1e9:.2f} GB (target <= 2 GB); "
        f"process peak RSS {maxrss / 1e9:.2f} GB"
    )
    targets = Targets()
    targets.check("build / max(compute-only, write-only)", ratio, "<=", 1.25)
    targets.check("build peak RSS", peaks["build"] / 1e9, "<=", 2, " GB")
    return targets.finish()


if __name__ == "__main__":
    sys.exit(main())
