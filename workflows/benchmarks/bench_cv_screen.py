"""The CV's Nyström screen against the exhaustive exact search, on kin40k.

``KernelRidgeCV`` with ``solver="cg"`` (the path ``solver="auto"`` takes above 20,000
rows) screens every candidate by Nyström KRR on ``screen_centers`` RPCholesky centres,
extrapolated to M = ∞ per kernel setting, and solves only the finalists exactly
(:mod:`pipeline.models.selection.finalists`). It was validated on two diamonds row sets
(docs/CV_AT_SCALE.md), where an RBF of D = 9 is smooth. kin40k is the opposite case: the
standard problem on which exact kernel methods beat approximations (Nyström with 1,000
centres misses the exact test RMSE by a factor of about two), so the screen's
extrapolation is stressed hardest here.

What it runs, in one process, on a seeded subsample of ``--n`` of split 0's training
rows (standardised X and y, as ``bench_nystrom.py``), the same 5 shuffled folds:

1. the default search (``screen_centers=1000``): time, pick, CV score;
2. the exhaustive exact search (``screen_centers=None``): the same grid and folds, every
   candidate by the block PCG: time, pick, CV score;
3. for each pick: an exact fit (``KernelRidge(solver="auto")``) on the ``--n`` rows,
   and its RMSE on split 0's 4,000 test rows (standardised units).

The search's baseline is the exhaustive search in the same run; the verdict is that the
screen picks a candidate whose exact CV score is within ``--tolerance`` (relative, of
1 - R²) of the exhaustive pick's.

    python workflows/benchmarks/bench_cv_screen.py              # N = 20,000, ~15 min
    python workflows/benchmarks/bench_cv_screen.py --n 8000     # ~3 min
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_nystrom import load  # noqa: E402
from targets import Targets  # noqa: E402

#: the grid of bench_kin40k_run.py (its CV runs on an 8,000-row subsample)
ALPHAS = np.logspace(-4, -1, 10)
GAMMAS = [0.1, 0.3, 1.0]


def search(X, y, folds, screen_centers):
    from pipeline import KernelRidgeCV

    cv = KernelRidgeCV(
        alphas=ALPHAS, kernel="rbf", param_grid={"gamma": GAMMAS}, cv=folds, solver="cg",
        screen_centers=screen_centers, refit=False,
    )  # fmt: skip
    t0 = time.perf_counter()
    cv.fit(X, y)
    seconds = time.perf_counter() - t0
    res = cv.cv_results_
    screened = np.asarray(res.get("screened", np.zeros(len(res["params"]), bool)), bool)
    exact = {
        (p["alpha"], p["gamma"]): float(s)
        for p, s, sc in zip(res["params"], res["mean_test_score"], screened, strict=True)
        if not sc
    }
    return cv, seconds, exact


def test_rmse(X, y, Xte, yte, params):
    from pipeline import KernelRidge

    m = KernelRidge(kernel="rbf", solver="auto", **params).fit(X, y)
    return float(np.sqrt(np.mean((m.predict(Xte) - yte) ** 2)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=20_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tolerance", type=float, default=0.02, help="of 1 - R², relative")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)

    from sklearn.model_selection import KFold

    Xtr, Xte, ytr, yte = load(0)
    rng = np.random.default_rng(a.seed)
    rows = np.sort(rng.choice(Xtr.shape[0], size=min(a.n, Xtr.shape[0]), replace=False))
    X, y = Xtr[rows], ytr[rows]
    folds = KFold(5, shuffle=True, random_state=0)
    print(f"kin40k split 0: {X.shape[0]} of {Xtr.shape[0]} training rows, D = {X.shape[1]}; "
          f"{len(ALPHAS)} λ x {len(GAMMAS)} γ x 5 folds", flush=True)  # fmt: skip

    screened, t_s, ex_s = search(X, y, folds, 1000)
    print(f"screened search: {t_s:.1f} s, pick {screened.best_params_}, CV R² "
          f"{screened.best_score_:.6f} ({len(ex_s)} candidates solved exactly)", flush=True)  # fmt: skip
    sn = screened.search_stats_["screen_nystrom"]
    for k in ("finalists", "descended", "unresolved"):
        print(f"  {k}: {[(p['alpha'], p['gamma']) for p in sn.get(k, [])]}")
    for st in sn.get("settings", []):
        print(f"  γ = {st['params']['gamma']}: best Nyström R² at M/4, M/2, M "
              f"{st['nested_best']}, reach {st['reach']}")  # fmt: skip
    full, t_f, ex_f = search(X, y, folds, None)
    print(f"exhaustive exact search (baseline): {t_f:.1f} s, pick {full.best_params_}, CV R² "
          f"{full.best_score_:.6f}", flush=True)  # fmt: skip

    key_s = (screened.best_params_["alpha"], screened.best_params_["gamma"])
    exact_of_pick = ex_f[key_s]  # the screen's pick, scored by the exhaustive search
    gap = (full.best_score_ - exact_of_pick) / max(1.0 - full.best_score_, 1e-300)
    # the screen's own score of its pick is exact (finalists are solved exactly)
    same_score = abs(screened.best_score_ - exact_of_pick)
    rmse = {"screened": test_rmse(X, y, Xte, yte, screened.best_params_)}
    same = screened.best_params_ == full.best_params_
    rmse["exhaustive"] = rmse["screened"] if same else test_rmse(X, y, Xte, yte, full.best_params_)
    print(f"the screen's pick scored by the exhaustive search: {exact_of_pick:.6f} "
          f"(|difference from the screen's own exact score| {same_score:.1e}); shortfall "
          f"{gap:.2%} of 1 - R²", flush=True)  # fmt: skip
    print(f"test RMSE (standardised y), exact fit on the {X.shape[0]} rows: screened pick "
          f"{rmse['screened']:.5f}, exhaustive pick {rmse['exhaustive']:.5f}")  # fmt: skip
    print(f"screened search / exhaustive search: {t_s / t_f:.2f}x (same run)")
    targets = Targets()
    targets.check("screened pick's shortfall, of 1 - R²", gap, "<=", a.tolerance)
    if a.json:
        Path(a.json).write_text(json.dumps({
            "n": int(X.shape[0]), "seconds_screened": t_s, "seconds_exhaustive": t_f,
            "pick_screened": screened.best_params_, "pick_exhaustive": full.best_params_,
            "cv_r2_screened": screened.best_score_, "cv_r2_exhaustive": full.best_score_,
            "shortfall": gap, "rmse": rmse, "targets": targets.as_json(),
        }, indent=1))  # fmt: skip
    return targets.finish()


if __name__ == "__main__":
    raise SystemExit(main())
