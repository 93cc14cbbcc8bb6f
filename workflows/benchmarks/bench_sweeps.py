"""Benchmark: the stored factor's sweeps (solve and exact leave-one-out) against scipy.

Factors an RBF Gram (standardised Gaussian data, D = 16, gamma = 1/D) out of core,
then times, on the same factor:

- the solve ``alpha = (K + lam I)^-1 y`` (forward and back sweeps), 1 and 64
  right-hand sides;
- the exact leave-one-out diagonal ``diag((K + lam I)^-1)``
  (:func:`pipeline.models.selection.loo.inverse_diagonal`: ``L^-1`` panel by panel,
  about ``n^3/3`` flops);

three ways:

- ``dag``: the sweeps as tile DAGs on the engine's executor (every core, one BLAS
  thread per tile task), as the pipeline runs them;
- ``serial``: the serial tile loop the sweeps were before (a copy kept here as the
  baseline: row by row, one BLAS thread), reading the same tiles;
- ``scipy``: in memory, the dense factor: ``scipy.linalg.cho_solve`` and
  ``scipy.linalg.lapack.dpotri`` (the inverse, then its diagonal), BLAS on every core.

Every result is checked against scipy's. Run ``--quick`` for N = 4,000.

It imports internals (the sweeps, the tile reader and the LOO panel) because it times
the sweeps alone on a factor it builds itself, against the serial loop they replaced.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time

import numpy as np
import scipy.linalg

import pipeline.models.selection.loo as loo_mod
from pipeline.engine.blas import process_threads
from pipeline.kernels import RBF
from pipeline.linalg import triangular as tri
from pipeline.linalg.cholesky import tile_cholesky
from pipeline.linalg.cholesky_cache import _read_factor_tile
from pipeline.linalg.gram import build_gram
from pipeline.linalg.triangular import cholesky_solve
from pipeline.models.selection.loo import inverse_diagonal


# -- baseline: the earlier serial tile loops (one BLAS thread, row by row) ------------
def serial_forward(L, z: np.ndarray, start: int = 0, first_row=None, stats=None) -> np.ndarray:
    g = L.grid
    r0 = g.row_slice(start).start
    with process_threads(1):
        for i in range(start, g.n_row_blocks):
            si = g.row_slice(i)
            acc = z[si.start - r0 : si.stop - r0].copy()
            for k in range(start, i):
                sk = g.row_slice(k)
                acc -= _read_factor_tile(L, i, k) @ z[sk.start - r0 : sk.stop - r0]
            lii = _read_factor_tile(L, i, i)
            z[si.start - r0 : si.stop - r0] = tri._trsm_lower(lii, acc, trans=False)
    return z


def serial_back(L, a: np.ndarray) -> np.ndarray:
    g = L.grid
    with process_threads(1):
        for i in reversed(range(g.n_row_blocks)):
            si = g.row_slice(i)
            a[si] = tri._trsm_lower(_read_factor_tile(L, i, i), a[si], trans=True)
            for k in range(i):
                a[g.row_slice(k)] -= _read_factor_tile(L, i, k).T @ a[si]
    return a


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--n", type=int, default=12000)
    p.add_argument("--block", type=int, default=2000)
    p.add_argument("--lam", type=float, default=1e-3)
    p.add_argument("--workdir", default=None)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    n, b = (4000, 1000) if a.quick else (a.n, a.block)
    work = tempfile.mkdtemp(prefix="bench_sweeps_", dir=a.workdir)
    try:
        rng = np.random.default_rng(0)
        X = rng.standard_normal((n, 16))
        X = (X - X.mean(0)) / X.std(0)
        gram = build_gram(X, RBF(gamma=1 / 16), os.path.join(work, "g"), b, progress=False)
        f = tile_cholesky(gram, a.lam, store=os.path.join(work, "f"), progress=False)
        Ld = np.zeros((n, n))
        for i, j in f.L.grid.lower_tiles():
            Ld[f.L.grid.row_slice(i), f.L.grid.col_slice(j)] = _read_factor_tile(f.L, i, j)
        rows: list[dict] = []
        scipy.linalg.cho_solve((Ld, True), rng.standard_normal((n, 1)), check_finite=False)
        for m in (1, 64):  # (scipy warmed up above: its first call also paged Ld in)
            y = rng.standard_normal((n, m))
            ref, t_sp = _timed(
                lambda y=y: scipy.linalg.cho_solve((Ld, True), y, check_finite=False)
            )
            got, t_dag = _timed(lambda y=y: cholesky_solve(f, y, release_cache=False))
            ser, t_ser = _timed(
                lambda y=y: serial_back(f.L, serial_forward(f.L, np.array(y, order="C")))
            )
            err = max(np.abs(got - ref).max(), np.abs(ser - ref).max()) / np.abs(ref).max()
            rows.append(
                {
                    "what": f"solve, {m} RHS",
                    "dag": t_dag,
                    "serial": t_ser,
                    "scipy": t_sp,
                    "err": err,
                }
            )

        def scipy_loo():
            inv, _info = scipy.linalg.lapack.dpotri(Ld, lower=1)
            return np.diag(inv).copy()

        ref, t_sp = _timed(scipy_loo)
        got, t_dag = _timed(lambda: inverse_diagonal(f))
        loo_mod.forward_sweep = serial_forward  # the same LOO panels on the serial loop
        try:
            ser, t_ser = _timed(lambda: inverse_diagonal(f))
        finally:
            loo_mod.forward_sweep = tri.forward_sweep
        err = max(np.abs(got - ref).max(), np.abs(ser - ref).max()) / np.abs(ref).max()
        rows.append(
            {"what": "LOO diagonal", "dag": t_dag, "serial": t_ser, "scipy": t_sp, "err": err}
        )
        print(f"N={n} block={b} lam={a.lam}: {os.cpu_count()} cores; seconds (lower is better)")
        print(
            f"{'pass':<16}{'dag':>9}{'serial':>9}{'scipy':>9}  dag/serial  scipy/dag  max rel err"
        )
        for r in rows:
            print(
                f"{r['what']:<16}{r['dag']:9.2f}{r['serial']:9.2f}{r['scipy']:9.2f}"
                f"  {r['serial'] / r['dag']:9.2f}x {r['scipy'] / r['dag']:9.2f}x  {r['err']:.1e}"
            )
        if a.json:
            with open(a.json, "w") as fh:
                json.dump({"n": n, "block": b, "rows": rows}, fh, indent=1)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    bad = [r["what"] for r in rows if not r["err"] <= 1e-10]
    if bad:  # a fast wrong answer is no result
        print(f"FAILED: {', '.join(bad)} disagree with scipy beyond 1e-10")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
