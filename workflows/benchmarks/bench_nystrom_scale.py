"""Benchmark: Nyström KRR past the exact solve's reach (issue #45), with its baseline.

``KernelRidge(solver="nystrom", n_centers=M)`` on N synthetic rows (D = 8, standard
normal features, a smooth target plus noise; flights is not on this machine), M = 4,000
uniform centres, RBF γ = 0.25, λ = 1e-2: wall time, peak resident memory of the process
(sampled every 20 ms) and the relative residual of the M x M system it solved
(``fit_info_["rel_residual"]``; the issue's target is 1e-6). Targets (issue #45) at the
issue's size (N = 3,000,000, M = 4,000, γ = 0.25, λ = 1e-2): <= 20 minutes and peak RSS
<= 4 GB; the residual <= 1e-6 at any size (``TARGET`` lines; exit 1 if one is missed).
The plan's
:func:`~pipeline.plan.cg_cost.nystrom_method` picks the direct method (one pass over X,
SYRK, one M x M factorisation) or FALKON's PCG; the method is printed.

The baseline, in the same run: scikit-learn's ``Nystroem(n_components=M)`` + ``Ridge``
at the largest N whose N x M float64 feature matrix and Ridge's copy fit
``--sklearn-max-gb`` (it cannot hold 3,000,000 x 4,000 = 96 GB), and ours at that same N.

It imports internals (``pipeline.diagnostics``) because it samples the process's
resident memory with the same ``/proc`` reading the package's own diagnostics use.

    python workflows/benchmarks/bench_nystrom_scale.py --n 3000000      # the issue's size
    python workflows/benchmarks/bench_nystrom_scale.py --n 400000 --sklearn-n 100000  # minutes
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from memory_sampler import PeakSampler  # noqa: E402
from targets import Targets  # noqa: E402

from pipeline import KernelRidge  # noqa: E402
from pipeline.diagnostics import current_rss_bytes  # noqa: E402


def data(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, 8))
    y = np.sin(X[:, 0]) + 0.5 * np.cos(X[:, 1] * X[:, 2]) + 0.1 * rng.standard_normal(n)
    return X, y


def ours(X, y, M, gamma, lam) -> dict:
    t = time.perf_counter()
    with PeakSampler(current_rss_bytes) as peak:
        m = KernelRidge(kernel="rbf", gamma=gamma, alpha=lam, solver="nystrom", n_centers=M)
        m.fit(X, y)
    info = m.fit_info_
    return {
        "who": "ours",
        "n": len(y),
        "M": M,
        "seconds": time.perf_counter() - t,
        "peak_rss_gb": peak.peak / 2**30,
        "method": info.get("method"),
        "basis": info.get("basis"),  # the direct pass's: "centres", or "mapped" by T⁻¹
        "rel_residual": max(np.atleast_1d(info.get("rel_residual", [np.nan]))),
        "n_iter": info.get("n_iter"),
    }


def sklearn(X, y, M, gamma, lam) -> dict:
    from sklearn.kernel_approximation import Nystroem
    from sklearn.linear_model import Ridge

    t = time.perf_counter()
    with PeakSampler(current_rss_bytes) as peak:
        ny = Nystroem(kernel="rbf", gamma=gamma, n_components=M, random_state=0)
        Ridge(alpha=lam, fit_intercept=False).fit(ny.fit_transform(X), y)
    return {"who": "scikit-learn", "n": len(y), "M": M, "seconds": time.perf_counter() - t,
            "peak_rss_gb": peak.peak / 2**30}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=3_000_000)
    p.add_argument("--M", type=int, default=4000)
    p.add_argument("--gamma", type=float, default=0.25)
    p.add_argument("--alpha", type=float, default=1e-2)
    p.add_argument("--sklearn-max-gb", type=float, default=8.0)
    p.add_argument("--sklearn-n", type=int, default=None, help="default: the largest that fits")
    p.add_argument("--out", default="bench_nystrom_scale.jsonl")
    a = p.parse_args(argv)
    M = a.M
    fit_n = int(a.sklearn_max_gb * 2**30 / (2.5 * 8 * M))
    sk_n = min(a.sklearn_n or fit_n, a.n)
    print(f"N = {a.n:,}, M = {M:,}; scikit-learn's {a.n:,} x {M:,} feature matrix would be "
          f"{a.n * M * 8 / 1e9:.0f} GB: it runs at N = {sk_n:,} (largest that fits "
          f"--sklearn-max-gb = {a.sklearn_max_gb} GB: {fit_n:,}); {os.cpu_count()} cores",
          flush=True)  # fmt: skip
    rows = []
    X, y = data(sk_n)
    rows.append(sklearn(X, y, M, a.gamma, a.alpha))
    rows.append(ours(X, y, M, a.gamma, a.alpha))
    if a.n > sk_n:
        X, y = data(a.n)
        rows.append(ours(X, y, M, a.gamma, a.alpha))
    for r in rows:
        print(json.dumps(r), flush=True)
        with open(a.out, "a") as f:
            f.write(json.dumps(r) + "\n")
    s, o = rows[0], rows[1]
    print(f"at N = {sk_n:,}: ours {s['seconds'] / o['seconds']:.2f}x faster than scikit-learn, "
          f"peak RSS {o['peak_rss_gb']:.2f} vs {s['peak_rss_gb']:.2f} GB")  # fmt: skip
    targets = Targets()
    big = rows[-1]  # ours at N = --n
    targets.check(f"N = {a.n:,}: relative residual", big["rel_residual"], "<=", 1e-6)
    if (a.n, M, a.gamma, a.alpha) == (3_000_000, 4000, 0.25, 1e-2):  # the size
        targets.check("N = 3,000,000: seconds", big["seconds"], "<=", 20 * 60, " s")
        targets.check("N = 3,000,000: peak RSS", big["peak_rss_gb"], "<=", 4, " GB")
    else:
        targets.skip("seconds and peak RSS", "at N = 3,000,000, M = 4,000, γ = 0.25, λ = 1e-2")
    return targets.finish()


if __name__ == "__main__":
    raise SystemExit(main())
