"""Benchmark: our Nyström KRR (FALKON's preconditioned CG) against scikit-learn's
``Nystroem`` + ``Ridge`` at the same M and λ, on kin40k (split 0).

Usage::

    python workflows/benchmarks/bench_nystrom.py                     # M = 1000
    python workflows/benchmarks/bench_nystrom.py --n-centers 4000 --product-dtype float32
    python workflows/benchmarks/bench_nystrom.py --n-centers 4000 --method pcg   # FALKON's CG

Both solve the same problem: ``Ridge(alpha=λ, fit_intercept=False)`` on the features
``Φ = K_nM K_MM^{-1/2}`` minimises ``‖y - Φ w‖² + λ ‖w‖²``, which is ``‖y - K_nM β‖² + λ βᵀ
K_MM β`` with ``β = K_MM^{-1/2} w``. Three rows are printed: scikit-learn; ours on
scikit-learn's centres (``Nystroem.component_indices_``: the same problem, so the test
RMSEs agree to CG's tolerance); ours on its own uniform centres. Ours solves its M x M
system the way ``KernelRidge(solver="nystrom")`` does (``--method plan``, the default: the
plan's :func:`~pipeline.plan.cg_cost.nystrom_method`, the direct pass at these sizes), or
by FALKON's preconditioned CG (``--method pcg``) or the direct pass (``--method direct``). X and y are standardised
with the training split's statistics. Seconds are wall time of fit + predict on the test
split; the test RMSE is in standardised units of y.

It imports internals (``pipeline.linalg.nystrom_solve``) because it solves on
scikit-learn's own centres (``centre_indices=``), which the estimator does not take, so
that both sides solve the same problem.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np

from pipeline.kernels import make_kernel
from pipeline.linalg.nystrom_solve import nystrom_solve
from pipeline.plan.cg_cost import nystrom_method

DATA = Path(os.environ.get("KIN40K_DIR", Path(__file__).resolve().parents[1] / "data" / "kin40k"))


def load(split: int) -> tuple[np.ndarray, ...]:
    import pandas as pd

    data = DATA if DATA.is_dir() else Path("/work/shared/data/kin40k")
    D = pd.read_csv(data / "data.csv.gz", header=None).to_numpy(float)
    test = pd.read_csv(data / "test_mask.csv.gz", header=None).to_numpy()[:, split].astype(bool)
    X, y = D[:, :-1], D[:, -1]
    Xtr, Xte, ytr, yte = X[~test], X[test], y[~test], y[test]
    mu, sd = Xtr.mean(0), Xtr.std(0)
    ym, ys = ytr.mean(), ytr.std()
    return (Xtr - mu) / sd, (Xte - mu) / sd, (ytr - ym) / ys, (yte - ym) / ys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n-centers", type=int, default=1000)
    p.add_argument("--gamma", type=float, default=0.1, help="RBF exp(-gamma |x - x'|^2)")
    p.add_argument("--alpha", type=float, default=1e-2, help="λ (scikit-learn's convention)")
    p.add_argument("--tol", type=float, default=1e-6)
    p.add_argument("--max-iter", type=int, default=200)
    p.add_argument("--product-dtype", default="float64", choices=["float64", "float32"])
    p.add_argument(
        "--method",
        default="plan",
        choices=["plan", "pcg", "direct"],
        help="how ours solves the M x M system (plan: as the estimator does)",
    )
    p.add_argument("--block-size", type=int, default=None)
    p.add_argument("--split", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)

    from sklearn.kernel_approximation import Nystroem
    from sklearn.linear_model import Ridge

    Xtr, Xte, ytr, yte = load(a.split)
    M = a.n_centers
    method = a.method
    if method == "plan":
        method, why = nystrom_method(Xtr.shape[0], M, Xtr.shape[1])
        print(f"the plan's method: {method} ({why})")
    print(f"kin40k split {a.split}: train {Xtr.shape}, test {Xte.shape}; RBF gamma={a.gamma}, "
          f"alpha={a.alpha}, M={M}, tol={a.tol}, products {a.product_dtype}, "
          f"method {method}")  # fmt: skip
    rmse = lambda pred: float(np.sqrt(np.mean((pred - yte) ** 2)))  # noqa: E731
    rows = []

    t0 = time.perf_counter()
    ny = Nystroem(kernel="rbf", gamma=a.gamma, n_components=M, random_state=a.seed)
    Phi = ny.fit_transform(Xtr)
    ridge = Ridge(alpha=a.alpha, fit_intercept=False).fit(Phi, ytr)
    pred = ridge.predict(ny.transform(Xte))
    rows.append(("scikit-learn Nystroem + Ridge", time.perf_counter() - t0, rmse(pred), "-"))
    del Phi

    k = make_kernel("rbf", gamma=a.gamma)
    for label, centres in (
        ("ours (FALKON), scikit-learn's centres", ny.component_indices_),
        ("ours (FALKON), uniform centres", None),
    ):
        t0 = time.perf_counter()
        sol = nystrom_solve(
            Xtr, ytr, k, a.alpha, n_centers=M, tol=a.tol, max_iter=a.max_iter,
            random_state=a.seed, product_dtype=a.product_dtype, block_size=a.block_size,
            centre_indices=None if centres is None else np.sort(centres), method=method,
        )  # fmt: skip
        pred = k(Xte, sol.X_centres) @ sol.coef
        its = sol.info["n_iter"] if method == "pcg" else "(direct)"
        rows.append((label, time.perf_counter() - t0, rmse(pred), its))

    print(f"{'fit':<40} {'seconds':>8} {'test RMSE':>10} {'CG iters':>9}")
    for label, sec, err, it in rows:
        print(f"{label:<40} {sec:8.2f} {err:10.4f} {it!s:>9}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
