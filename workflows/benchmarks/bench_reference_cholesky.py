"""Reference dual Cholesky: blocked (multi-threaded gemm, potrf on tiles only) against
LAPACK potrf with BLAS held to one thread (the other OpenBLAS-safe option), same run.

    python workflows/benchmarks/bench_reference_cholesky.py --quick   # n = 4096
    python workflows/benchmarks/bench_reference_cholesky.py           # n = 8192, 12288

The faster one should be the default from ``constants.ONE_BLAS_THREAD_FROM`` rows.

It imports internals (``pipeline.linalg.dense_dual``) because it times the in-memory reference
solver, which is a test oracle and not public API.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from threadpoolctl import threadpool_limits

from pipeline.linalg import dense_dual as dual


def _spd(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    B = rng.standard_normal((n, 64))
    return np.asfortranarray(B @ B.T / 64 + np.eye(n))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="small size only")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    sizes = [4096] if args.quick else [8192, 12288]
    print(f"{'n':>6} {'potrf 1 thread (s)':>20} {'GF/s':>6} {'blocked (s)':>12} {'GF/s':>6}")
    for n in sizes:
        A = _spd(n)
        t1, t2 = [], []
        for _ in range(args.repeat):
            W = A.copy(order="F")
            t = time.perf_counter()
            with threadpool_limits(limits=1, user_api="blas"):
                assert dual._potrf_dense(W) == 0
            t1.append(time.perf_counter() - t)
            W = A.copy(order="F")
            t = time.perf_counter()
            assert dual._potrf_blocked(W) == 0
            t2.append(time.perf_counter() - t)
        f = n**3 / 3 / 1e9
        a, b = min(t1), min(t2)
        print(f"{n:>6} {a:>20.2f} {f / a:>6.0f} {b:>12.2f} {f / b:>6.0f}")


if __name__ == "__main__":
    main()
