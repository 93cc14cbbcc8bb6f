"""No slowdown from a refactor: the same public-API workloads on two commits, one run.

Issue #16 rewired every fit through one plan and one execute, and split
``KernelRidgeCV`` into strategies. This benchmark checks that it cost nothing: it
checks out ``--before`` (default: the commit before the first fit-plan commit) into a
temporary ``git worktree``, then runs each workload below in a fresh Python process
per commit, the two commits interleaved, ``--repeat`` times, and prints each one's
minimum side by side with the ratio (after / before; ≤ 1.05 counts as no slowdown,
inside this VM's run-to-run noise; ``TARGET`` lines, exit 1 if a workload is slower).
Each time includes ``import pipeline``: the package root imports lazily since the
refactor, so a first fit there pays imports that the earlier root paid at import
(timing after the import made HEAD look 2-7x slower).

Workloads, all through the public API (``pipeline.KernelRidge``,
``pipeline.KernelRidgeCV``), synthetic data, RBF:

* ``cholesky``: out-of-core ``solver="cholesky"``, N = 6,000, block 1,000, a store in
  a temporary directory, then ``predict`` on 20,000 rows;
* ``cg``: out-of-core ``solver="cg"``, N = 8,000, λ = 1e-2, tol 1e-6;
* ``dense``: in-memory ``KernelRidge`` fit and predict, N = 3,000;
* ``cv``: ``KernelRidgeCV``, 10 λ x 3 γ, 5 folds, N = 3,000.

::

    python workflows/benchmarks/bench_no_slowdown.py                 # a few minutes
    python workflows/benchmarks/bench_no_slowdown.py --before HEAD~5 --repeat 5
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from targets import Targets  # noqa: E402

BEFORE = "7796f5c^"  # the commit before "policy: one fit plan (FitPlan, plan_fit) ..."

WORKLOAD = r"""
import json, sys, tempfile, time
import numpy as np
t0 = time.perf_counter()  # the import counts: HEAD's package root imports lazily
import pipeline

name = sys.argv[1]
rng = np.random.default_rng(0)
def data(n, d=8):
    X = rng.standard_normal((n, d))
    w = rng.standard_normal(d) / np.sqrt(d)
    return X, np.sin(X @ w) + 0.1 * rng.standard_normal(n)

with tempfile.TemporaryDirectory() as tmp:
    if name == "cholesky":
        X, y = data(6000)
        m = pipeline.KernelRidge(alpha=1e-2, kernel="rbf", gamma=0.1, solver="cholesky",
                                 block_size=1000, store=tmp).fit(X, y)
        m.predict(data(20000)[0])
    elif name == "cg":
        X, y = data(8000)
        pipeline.KernelRidge(alpha=1e-2, kernel="rbf", gamma=0.1, solver="cg",
                             tol=1e-6, store=tmp).fit(X, y)
    elif name == "dense":
        X, y = data(3000)
        pipeline.KernelRidge(alpha=1e-2, kernel="rbf", gamma=0.1).fit(X, y).predict(X)
    elif name == "cv":
        X, y = data(3000)
        pipeline.KernelRidgeCV(alphas=np.logspace(-4, 1, 10), kernel="rbf",
                               param_grid={"gamma": [0.05, 0.1, 0.3]}, cv=5).fit(X, y)
print(json.dumps({"seconds": time.perf_counter() - t0, "file": pipeline.__file__}))
"""

NAMES = ("cholesky", "cg", "dense", "cv")


def run(tree: Path, name: str) -> float:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run(
        [sys.executable, "-c", WORKLOAD, name],
        cwd=tree, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if out.returncode != 0:
        raise SystemExit(f"{name} failed in {tree}:\n{out.stderr[-3000:]}")
    row = json.loads(out.stdout.strip().splitlines()[-1])
    if not Path(row["file"]).resolve().is_relative_to(tree.resolve()):
        raise SystemExit(f"{name} imported pipeline from {row['file']}, not from {tree}")
    return float(row["seconds"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", default=BEFORE, help=f"the earlier commit (default {BEFORE})")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workloads", nargs="+", default=list(NAMES), choices=NAMES)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    repo = Path(__file__).resolve().parents[2]
    rev = subprocess.run(["git", "rev-parse", "--short", a.before], cwd=repo, check=True,
                         capture_output=True, text=True).stdout.strip()  # fmt: skip
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, check=True,
                          capture_output=True, text=True).stdout.strip()  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="no-slowdown-") as tmp:
        old = Path(tmp) / "before"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(old), rev], cwd=repo,
                       check=True)  # fmt: skip
        try:
            print(f"before {rev}, after {head} (working tree), load {os.getloadavg()}", flush=True)
            rows = []
            targets = Targets()
            for name in a.workloads:
                t = {"before": [], "after": []}
                for _ in range(a.repeat):
                    t["before"].append(run(old, name))
                    t["after"].append(run(repo, name))
                b, f = min(t["before"]), min(t["after"])
                rows.append({"workload": name, "before_s": round(b, 2), "after_s": round(f, 2),
                             "ratio": round(f / b, 3), "runs": t})  # fmt: skip
                print(f"{name:>9}: before {b:7.2f} s  after {f:7.2f} s  ratio {f / b:.2f}",
                      flush=True)  # fmt: skip
                targets.check(f"{name}: after / before", f / b, "<=", 1.05)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=repo,
                           check=False)  # fmt: skip
    print(f"load after {os.getloadavg()}")
    if a.json:
        Path(a.json).write_text(json.dumps({"before": rev, "after": head, "rows": rows,
                                            "targets": targets.as_json()}, indent=1))  # fmt: skip
    return targets.finish()


if __name__ == "__main__":
    sys.exit(main())
