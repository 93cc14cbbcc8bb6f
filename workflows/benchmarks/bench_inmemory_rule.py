"""The in-memory ``solver="auto"`` rule against both of its choices, measured in one run.

In memory, ``KernelRidge(solver="auto")`` takes matrix-free CG instead of the dense dual
only when its cost model predicts CG ``IN_MEMORY_CG_MARGIN`` times faster
(``pipeline.plan.fit_plan``). This benchmark fits each case three ways, in turn, on
kin40k (split 0, leak-free standardisation: ``bench_exactness.load``): ``auto``, then
``solver="dense"`` and ``solver="cg"`` as the same-run baselines. It prints what ``auto``
chose, the three times and the regret (``auto``'s time over the faster baseline's).

The default cases are the 12,000-row ones where the plan's choice depends on the GEMM
rate it assumes (docs/PERFORMANCE.md, "The in-memory rule against this machine's GEMM").
No target: the figures are for the rule's calibration::

    python workflows/benchmarks/bench_inmemory_rule.py                 # about 3 minutes
    python workflows/benchmarks/bench_inmemory_rule.py --rows 15000 --gammas 0.25 --lams 0.1
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_exactness import load  # noqa: E402

from pipeline import KernelRidge  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=12_000)
    ap.add_argument("--gammas", type=float, nargs="+", default=[0.05, 0.25, 1.0])
    ap.add_argument("--lams", type=float, nargs="+", default=[1e-2, 1.0])
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()

    Xtr, _, ytr, _ = load(0)
    X, y = Xtr[: args.rows], ytr[: args.rows]
    KernelRidge(kernel="rbf", solver="dense").fit(X[:500], y[:500])  # warm-up
    print(f"kin40k split 0: {len(X):,} rows, D = {X.shape[1]}, RBF; medians of {args.repeat}")
    print(f"{'gamma':>6} {'lambda':>7} {'auto chose':>10} {'auto s':>7} {'dense s':>8} "
          f"{'cg s':>6} {'cg iters':>8} {'regret':>7}")  # fmt: skip
    for gamma, lam in itertools.product(args.gammas, args.lams):
        seconds: dict[str, list[float]] = {}
        for _ in range(args.repeat):
            for solver in ("auto", "dense", "cg"):
                t = time.perf_counter()
                model = KernelRidge(kernel="rbf", gamma=gamma, alpha=lam, solver=solver).fit(X, y)
                seconds.setdefault(solver, []).append(time.perf_counter() - t)
                if solver == "auto":
                    chose = model.solver_
                if solver == "cg":
                    iters = model.n_iter_
        med = {k: statistics.median(v) for k, v in seconds.items()}
        regret = med["auto"] / min(med["dense"], med["cg"])
        print(f"{gamma:6g} {lam:7g} {chose:>10} {med['auto']:7.2f} {med['dense']:8.2f} "
              f"{med['cg']:6.2f} {iters!s:>8} {regret:7.2f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
