"""The in-memory ``solver="auto"`` rule against both of its choices, measured in one run.

In memory, ``KernelRidge(solver="auto")`` takes matrix-free CG instead of the dense dual
only when its cost model predicts CG ``IN_MEMORY_CG_MARGIN`` times faster
(``pipeline.plan.fit_plan``). This benchmark fits each case three ways, in turn, on
kin40k (split 0, leak-free standardisation: ``bench_exactness.load``): ``auto``, then
``solver="dense"`` and ``solver="cg"`` as the same-run baselines. It prints what ``auto``
chose, the plan's two predictions (CG priced with ρ measured on the rows, as the plan
prices it when it measures), the three times and the regret (``auto``'s time over the
faster baseline's). Its last table replays the plan with other margins on the measured
times (:func:`replay`, which ``tests/plan/test_inmemory_grid.py`` runs on the recorded
grid): how many cases take CG, their total time and the worst regret.

It imports internals (``pipeline.plan.fit_plan``, ``pipeline.fit.row_probes``, the
plan's ``Resources`` and ``make_kernel``) because it asks the plan for both predictions
of every case, measuring ρ even where today's margin skips that measurement.

The default cases are the 12,000-row ones where the plan's choice depends on the margin
and on the GEMM rate it assumes (docs/PERFORMANCE.md, "The in-memory rule against this
machine's GEMM"). No target: the figures are for the rule's calibration::

    python workflows/benchmarks/bench_inmemory_rule.py                 # about 2-3 minutes
    python workflows/benchmarks/bench_inmemory_rule.py --rows 6000 9000 12000 15000 \\
        --lams 1e-3 1e-2 0.1 1 --json workflows/benchmarks/bench_inmemory_rule.json  # 16 min

``tests/plan/test_inmemory_grid.py`` replays the rule on that JSON.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import statistics
import sys
import time
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_exactness import load  # noqa: E402

from pipeline import KernelRidge  # noqa: E402
from pipeline import constants as C  # noqa: E402
from pipeline.engine.placement import Probes, Resources  # noqa: E402
from pipeline.fit import row_probes  # noqa: E402
from pipeline.kernels import make_kernel  # noqa: E402
from pipeline.plan import fit_plan  # noqa: E402

MARGINS = (1.25, 1.5, 2.0, 2.5)
#: what the plan is told of the machine: in memory, room for every case's dense dual
RESOURCES = Resources(memory_bytes=16 << 30, disk_bytes=100 << 30, in_memory=True)


def replay(records: list[dict], d: int = 8) -> list[tuple[dict, str, dict[str, float]]]:
    """Each recorded case (``--json``), the solver the plan chooses for it now (from the
    code, with the ρ recorded for it) and its two measured times. The dense dual's work
    depends on N and D only, so each size's fastest dense fit stands for all its cases:
    in this benchmark's order a dense fit right after a CG fit ran 2-5 s slower, which
    would favour CG exactly where the rule took it."""
    dense: dict[int, float] = {}
    for c in records:
        dense[c["rows"]] = min(c["dense_s"], dense.get(c["rows"], c["dense_s"]))
    out = []
    for c in records:

        def residual(rank: int, c: dict = c) -> float:
            got = c["rho_by_rank"].get(str(int(rank)))
            if got is None:
                raise KeyError(
                    f"the plan asks for ρ at rank {rank} on {c['rows']} rows, which the "
                    "record does not hold: run bench_inmemory_rule.py --json again"
                )
            return got

        kernel = make_kernel("rbf", gamma=c["gamma"])
        probes = Probes(True, residual, lambda shift: 0.0)
        plan, _ = fit_plan.plan_fit(
            c["rows"], d, kernel, RESOURCES, {"alpha": c["lambda"]}, probes=probes
        )
        out.append((c, plan.solver, {"dense": dense[c["rows"]], "cg": c["cg_s"]}))
    return out


def predictions(X, gamma: float, lam: float) -> tuple[float, float, dict[int, float]]:
    """The plan's predicted seconds of CG and of the dense dual for these rows, CG priced
    with ρ measured on them (the plan skips that measurement when CG at its floor cannot
    win under today's margin; here it is always made, so that other margins can be
    replayed), and the ρ it measured, by rank (what ``--json`` records)."""
    kernel = make_kernel("rbf", gamma=gamma)
    real, asked = row_probes(X, kernel), {}
    probes = Probes(True, lambda r: asked.setdefault(int(r), real.residual(r)), real.float32_risk)
    with mock.patch.object(fit_plan, "_cg_may_beat_dense", lambda *a: (True, "", {})):
        plan, _ = fit_plan.plan_fit(
            len(X), X.shape[1], kernel, RESOURCES, {"alpha": lam}, probes=probes
        )
    return plan.predicted_seconds["cg"], plan.predicted_seconds["dense"], asked


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[12_000])
    ap.add_argument("--gammas", type=float, nargs="+", default=[0.05, 0.25, 1.0])
    ap.add_argument("--lams", type=float, nargs="+", default=[1e-2, 1.0])
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--json", type=Path, help="write the cases (times, ρ by rank) here")
    args = ap.parse_args()
    logging.getLogger("pipeline").setLevel(logging.WARNING)

    Xtr, _, ytr, _ = load(0)
    KernelRidge(kernel="rbf", solver="dense").fit(Xtr[:500], ytr[:500])  # warm-up
    print(f"kin40k split 0, D = {Xtr.shape[1]}, RBF; medians of {args.repeat}; "
          f"IN_MEMORY_CG_MARGIN = {C.IN_MEMORY_CG_MARGIN:g}")  # fmt: skip
    print(f"{'rows':>6} {'gamma':>6} {'lambda':>7} {'auto chose':>10} {'pred dense':>10} "
          f"{'pred cg':>8} {'auto s':>7} {'dense s':>8} {'cg s':>6} {'cg iters':>8} "
          f"{'regret':>7}")  # fmt: skip
    records = []
    for rows, gamma, lam in itertools.product(args.rows, args.gammas, args.lams):
        X, y = Xtr[:rows], ytr[:rows]
        pred_cg, pred_dense, rho = predictions(X, gamma, lam)
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
        records.append({"rows": rows, "gamma": gamma, "lambda": lam, "dense_s": med["dense"],
                        "cg_s": med["cg"], "cg_iterations": iters, "auto_chose": chose,
                        "rho_by_rank": {str(k): v for k, v in rho.items()}})  # fmt: skip
        print(f"{rows:6d} {gamma:6g} {lam:7g} {chose:>10} {pred_dense:10.2f} {pred_cg:8.2f} "
              f"{med['auto']:7.2f} {med['dense']:8.2f} {med['cg']:6.2f} {iters!s:>8} "
              f"{regret:7.2f}")  # fmt: skip

    replayed = replay(records, int(Xtr.shape[1]))
    best = sum(min(t.values()) for _, _, t in replayed)
    print(f"\nthe plan replayed on these {len(records)} cases with other margins, on their "
          f"measured times (each size's fastest dense fit for all its cases; best possible "
          f"{best:.1f} s in all)")  # fmt: skip
    print(f"{'margin':>7} {'cases to CG':>11} {'total s':>8} {'worst regret':>12}")
    for m in sorted({*MARGINS, C.IN_MEMORY_CG_MARGIN}):
        with mock.patch.object(C, "IN_MEMORY_CG_MARGIN", m):
            replayed = replay(records, int(Xtr.shape[1]))
        n_cg = sum(s == "cg" for _, s, _ in replayed)
        total = sum(t[s] for _, s, t in replayed)
        worst = max(t[s] / min(t.values()) for _, s, t in replayed)
        print(f"{m:7g} {n_cg:11d} {total:8.1f} {worst:12.2f}")
    if args.json:
        meta = {"data": "kin40k split 0, first rows", "d": int(Xtr.shape[1]), "kernel": "rbf",
                "repeat": args.repeat, "margin": C.IN_MEMORY_CG_MARGIN}  # fmt: skip
        args.json.write_text(json.dumps({"meta": meta, "cases": records}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
