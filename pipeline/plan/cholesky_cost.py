"""Predicted time, memory and disk of the out-of-core tile Cholesky.

Pure functions of ``n``, the block size ``b`` and measured machine rates (a GEMM
GFLOP/s probe, disk bandwidth); no I/O. ``T = ceil(n / b)`` tiles per side.

Model (left-looking tile Cholesky, :mod:`pipeline.linalg.cholesky`):

- flops ``n^3 / 3``, run at ``cholesky_efficiency(T) * gemm_gflops`` (tile
  GEMM/SYRK/TRSM; POTRF, the TRSMs and the I/O nothing overlaps are a ``1 / T`` share):
  the measured ratio of the factorisation's rate to the 2-thread GEMM probe, fitted as
  ``CHOLESKY_EFFICIENCY_MAX * T / (T + CHOLESKY_EFFICIENCY_T0)``.
- the critical path: the ``T`` diagonal POTRFs and the last column's updates run
  with little parallelism; modelled as ``T`` tiles of ``b^3 / 3`` flops at the
  1-thread rate ``gemm_gflops / cores`` (it matters only for small ``T``).
- I/O: every Gram tile is read once and every factor tile written once
  (``2 * T(T+1)/2 * b^2 * s`` bytes); factor tiles are reread for the updates
  when the tile cache (``cache_bytes``) cannot hold a column panel. I/O overlaps
  compute (read-ahead / write-behind), so time is the max of compute and I/O.
- memory: a few tiles per thread (the tile, two operands) plus the read-ahead
  and write-behind queues plus the tile cache, plus the interpreter's base.
- disk: see :func:`cholesky_disk_bytes`.
"""

from __future__ import annotations

from dataclasses import dataclass

import pipeline.constants as C

# the calibrated figures live in pipeline.constants (measured: docs/PERFORMANCE.md)


@dataclass(frozen=True)
class CholeskyCost:
    """Predicted cost of one out-of-core factorisation."""

    seconds: float
    compute_seconds: float
    io_seconds: float
    peak_memory_bytes: int
    disk_bytes: int
    gflop: float


def n_tiles(n: int, block_size: int) -> int:
    """Tiles per side, ``ceil(n / b)``."""
    if n <= 0 or block_size <= 0:
        raise ValueError(f"n and block_size must be positive, got n={n}, block_size={block_size}")
    return -(-int(n) // int(block_size))


def cholesky_efficiency(t: int) -> float:
    """Factorisation rate / GEMM rate with ``t`` tiles per side (0.79 at 6, 0.87 at 20).

    >>> round(cholesky_efficiency(20), 2)
    0.87
    """
    if t < 1:
        raise ValueError(f"tiles per side must be >= 1, got {t}")
    return C.CHOLESKY_EFFICIENCY_MAX * t / (t + C.CHOLESKY_EFFICIENCY_T0)


def lower_tile_bytes(n: int, block_size: int, itemsize: int = 8) -> int:
    """Bytes of the ``T(T+1)/2`` lower tiles (edge tiles counted full, as stored)."""
    t = n_tiles(n, block_size)
    return t * (t + 1) // 2 * int(block_size) ** 2 * int(itemsize)


def cholesky_disk_bytes(
    n: int, block_size: int, *, keep_gram: bool = True, itemsize: int = 8, writers: int = 2
) -> int:
    """Extra disk the factor needs beyond the Gram.

    ``keep_gram=True``: ``T(T+1)/2 * b^2 * itemsize`` (a separate factor);
    ``keep_gram=False`` (in place): ``(writers + 1) * b^2 * 8`` of temporary chunks.
    """
    if keep_gram:
        return lower_tile_bytes(n, block_size, itemsize)
    n_tiles(n, block_size)
    return (int(writers) + 1) * int(block_size) ** 2 * 8


def cholesky_flops(n: int) -> float:
    """Flops of a Cholesky factorisation, ``n^3 / 3`` (``n^3`` exact, then one rounding)."""
    return int(n) ** 3 / 3.0


def cholesky_peak_memory(
    n: int,
    block_size: int,
    *,
    threads: int = 2,
    itemsize: int = 8,
    cache_bytes: int = C.CHOLESKY_CACHE_BYTES,
) -> int:
    """Peak resident bytes: per-thread working tiles, I/O queues, tile cache, base."""
    tile = min(int(block_size), int(n)) ** 2 * 8  # updates run in the factor's dtype, POTRF f64
    io = min(2 * C.IO_BUDGET_BYTES, 4 * tile)
    # the cache holds what the updates reuse: at most one factor column panel and row
    panel = 2 * n_tiles(n, block_size) * min(int(block_size), int(n)) ** 2 * int(itemsize)
    return int(C.BASE_RSS_BYTES + 3 * threads * tile + io + min(int(cache_bytes), panel))


def predict_cholesky(
    n: int,
    block_size: int,
    *,
    gemm_gflops: float,
    disk_read_gbps: float,
    disk_write_gbps: float,
    cores: int = 2,
    threads: int = 2,
    dtype: str = "float64",
    keep_gram: bool = True,
    cache_bytes: int = C.CHOLESKY_CACHE_BYTES,
) -> CholeskyCost:
    """Predicted seconds, peak memory and disk of :func:`pipeline.linalg.cholesky.tile_cholesky`.

    Parameters
    ----------
    n, block_size : int
        Matrix size and tile size.
    gemm_gflops : float
        Measured float64 GEMM rate with every core (e.g. a 4096^2 matmul probe).
    disk_read_gbps, disk_write_gbps : float
        Measured disk bandwidth, GB/s.
    cores, threads : int
        Cores and tile threads.
    dtype : {"float64", "float32"}
        The factor's precision (float32 runs the updates about 1.86x faster).
    keep_gram : bool
        Separate factor (True) or in place (False): changes the disk only.
    cache_bytes : int
        Factor-tile cache budget of the process.
    """
    if gemm_gflops <= 0 or disk_read_gbps <= 0 or disk_write_gbps <= 0:
        raise ValueError(
            f"rates must be positive, got gemm_gflops={gemm_gflops}, "
            f"disk_read_gbps={disk_read_gbps}, disk_write_gbps={disk_write_gbps}"
        )
    if dtype not in ("float64", "float32"):
        raise ValueError(f"dtype must be 'float64' or 'float32', got {dtype!r}")
    itemsize = 8 if dtype == "float64" else 4
    t = n_tiles(n, block_size)
    b = min(int(block_size), int(n))
    speed = cholesky_efficiency(t) * gemm_gflops * (C.FLOAT32_SPEEDUP if itemsize == 4 else 1.0)
    flops = cholesky_flops(n)
    # critical path: the diagonal chain, about a tile POTRF + TRSM per column at one core
    chain = t * (b**3 / 3.0) / (gemm_gflops / max(cores, 1) * C.POTRF_CHAIN_EFFICIENCY) / 1e9
    compute = max(flops / speed / 1e9, chain)
    read = lower_tile_bytes(n, block_size, 8)
    write = lower_tile_bytes(n, block_size, itemsize)
    # rereads of factor tiles when a column panel does not fit the cache
    panel = t * b * b * itemsize
    if panel > cache_bytes:
        read += int(write * (t / 3.0))
    io = read / (disk_read_gbps * 1e9) + write / (disk_write_gbps * 1e9)
    seconds = max(compute, io) + min(compute, io) / max(t, 1)  # overlap, less a pipeline fill
    return CholeskyCost(
        seconds=float(seconds),
        compute_seconds=float(compute),
        io_seconds=float(io),
        peak_memory_bytes=cholesky_peak_memory(
            n, block_size, threads=threads, itemsize=itemsize, cache_bytes=cache_bytes
        ),
        disk_bytes=cholesky_disk_bytes(
            n, block_size, keep_gram=keep_gram, itemsize=itemsize, writers=threads
        ),
        gflop=flops / 1e9,
    )


def best_block_size(
    n: int,
    *,
    memory_bytes: int,
    candidates: tuple[int, ...] = (1024, 1536, 2048, 2500, 3072, 4096),
    threads: int = 2,
) -> int:
    """The largest candidate tile (fewer, bigger GEMMs) whose peak memory fits ``memory_bytes``
    while keeping at least 2 tiles per side (else the factorisation is one POTRF)."""
    fits = [
        b
        for b in candidates
        if cholesky_peak_memory(n, b, threads=threads) <= memory_bytes
        and (n_tiles(n, b) >= 2 or b >= n)
    ]
    if not fits:
        return min(candidates)
    return max(fits)
