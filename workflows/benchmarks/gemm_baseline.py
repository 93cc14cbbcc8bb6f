"""The machine's GEMM peak, measured in the benchmark's own run (issue #15's baseline).

The Cholesky targets are stated against float64 GEMM ("120 GFLOP/s, 75 % of GEMM
peak"), and the machine under the benchmarks changes from session to session, so
the fit benchmarks measure the peak themselves, beside the factorisation: the tile
kernel the factor spends most of its time in (``C -= A @ B.T`` through
:func:`pipeline.engine.blas.gemm_nt_sub`) on square ``block`` tiles, with every
core in one call, as the executors' wide tasks run it. Best of ``repeats``.

It imports internals (the GIL-free BLAS wrapper) because the baseline must be the
very call the factor makes, at the width the factor makes it.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from targets import Targets

#: issue #15's factor targets: this absolute rate, and this share of the GEMM peak
FACTOR_GFLOPS_TARGET, FACTOR_SHARE_TARGET = 120.0, 0.75


def best_seconds(fn, setup=lambda: None, repeats: int = 3) -> float:
    """Best wall time of ``fn(setup())`` over ``repeats`` runs, after one warm-up run
    (thread start, first touch); ``setup`` is not timed."""
    times = []
    for _ in range(1 + max(1, int(repeats))):
        arg = setup()
        t = time.perf_counter()
        fn(arg)
        times.append(time.perf_counter() - t)
    return min(times[1:])


def gemm_peak_gflops(block: int = 4000, repeats: int = 3, dtype=np.float64) -> float:
    """Best GFLOP/s of ``block``³ tile GEMMs (2·b³ flops each) on all cores."""
    from pipeline.engine import blas
    from pipeline.engine.where import tile_blas_threads

    rng = np.random.default_rng(0)
    a = rng.standard_normal((block, block)).astype(dtype)
    b = rng.standard_normal((block, block)).astype(dtype)
    c = np.zeros((block, block), dtype=dtype)
    with blas.fixed_width(tile_blas_threads(True)):  # the executors' width (wide tasks)
        best = best_seconds(lambda _: blas.gemm_nt_sub(c, a, b), repeats=repeats)
    return 2 * block**3 / best / 1e9


def peak_line(
    gflops: float,
    peak: float,
    target: float = FACTOR_GFLOPS_TARGET,
    share: float = FACTOR_SHARE_TARGET,
) -> str:
    """One line: the factor's rate against the absolute and the relative target."""
    return (
        f"  factor {gflops:.1f} GFLOP/s = {gflops / peak:.0%} of the GEMM peak measured in "
        f"this run ({peak:.1f} GFLOP/s); issue #15: >= {target:.0f} GFLOP/s, "
        f">= {share:.0%} of GEMM peak"
    )


def check_factor(targets: Targets, gflops: float, peak: float) -> bool:
    """Check issue #15's two factor targets (:data:`FACTOR_GFLOPS_TARGET` GFLOP/s and
    :data:`FACTOR_SHARE_TARGET` of the GEMM ``peak``) on ``targets``; True if both held."""
    ok = targets.check("factor GFLOP/s (issue #15)", gflops, ">=", FACTOR_GFLOPS_TARGET)
    share = gflops / peak if peak > 0 else float("nan")
    return targets.check("factor / GEMM peak (issue #15)", share, ">=", FACTOR_SHARE_TARGET) and ok
