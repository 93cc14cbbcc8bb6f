"""Benchmark: where the ingest stage runs, by the source's size (``SMALL_INGEST_VALUES``).

``krr run`` ingests a source of at most
:data:`~pipeline.constants.SMALL_INGEST_VALUES` values (rows x (features +
targets)) in this process when the embedded cluster's workers run on this machine,
and larger ones on the workers (measured on the main job's 0.1 million
values only). This benchmark checks that threshold at several sizes: for each, it
runs ``krr run --until ingest`` on synthetic ``.npy`` data (standard normal features,
a target that is a noisy function of them) in a fresh process and run directory,
with the ingest

- ``here``: in this process, whatever its size (the threshold raised past it);
- ``workers``: on the workers, whatever its size (the threshold set to 0; the
  row-block validation still reads here, as shipped). The shipped rule runs
  ``here`` up to the threshold and ``workers`` above it;
- ``cluster`` (the baseline, the earlier placement): every step on the workers
  (``pipeline.engine.where.beside_local_workers`` answers False).

It prints the ingest stage's seconds from the run's manifest for each, and whether
the shipped rule picks the faster of ``here`` and ``workers``; all must store the
same rows (the ingest fingerprint).

    python workflows/benchmarks/bench_ingest_placement.py --quick

It imports internals (``pipeline.engine.parallel``, ``pipeline.constants``,
``pipeline.cli``) because it patches the placement rule itself in the child process
that runs ``krr run``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

CONFIG = """
name: ingest-placement
data: {{source: npy, path: {x}, y_path: {y}}}
split: {{test_fraction: 0.2, seed: 0}}
preprocess: {{standardize: true, standardize_y: true}}
kernel: {{name: rbf, params: {{gamma: 0.1}}}}
lambda: 0.1
solver: {{method: cholesky}}
block_size: {block}
"""

_CHILD = """
import sys
import pipeline.engine.where as where
import pipeline.constants as C
if sys.argv[1] == "cluster":
    where.beside_local_workers = lambda graph=None: False
elif sys.argv[1] == "here":
    C.SMALL_INGEST_VALUES = 10**15
elif sys.argv[1] == "workers":
    C.SMALL_INGEST_VALUES = 0
from pipeline.cli import main
if __name__ == "__main__":
    sys.exit(main(["run", sys.argv[2], "--run-dir", sys.argv[3], "--until", "ingest",
                   "--json", "-q"]))
"""


def make_source(d: Path, rows: int, features: int, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((rows, features))
    y = np.sin(X[:, 0]) + 0.5 * X[:, 1] * X[:, 2] + 0.1 * rng.standard_normal(rows)
    np.save(d / "X.npy", X)
    np.save(d / "y.npy", y)
    del X, y
    return d


def run_once(mode: str, conf: Path, workdir: Path) -> dict:
    from bench_main_job import run_child  # this script's directory

    run_dir, wall = run_child(_CHILD, mode, conf, workdir)
    stage = json.loads((run_dir / "manifest.json").read_text())["stages"]["ingest"]
    import shutil

    shutil.rmtree(run_dir, ignore_errors=True)
    return {
        "mode": mode,
        "wall_s": wall,
        "ingest_s": stage["resources"]["seconds"],
        # sampled during the stage: this process, and the cluster's workers together
        "peak_gb": stage["resources"].get("peak_rss_bytes", 0) / 1e9,
        "workers_peak_gb": stage["resources"].get("peak_children_rss_bytes", 0) / 1e9,
        "x_fingerprint": stage["outputs"]["x_fingerprint"],
    }


def main(argv: list[str] | None = None) -> None:
    from pipeline.constants import SMALL_INGEST_VALUES

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--millions", default="0.5,2,8,24", help="source sizes, in millions of values")
    p.add_argument("--features", type=int, default=9)
    p.add_argument("--block", type=int, default=4096, help="the config's block_size")
    p.add_argument(
        "--cluster-max",
        type=float,
        default=8.0,
        help="run the every-step-on-the-workers baseline up to this size (millions of "
        "values; it took 44 s at 8 million on 2 cores)",
    )
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="0.5 and 2 million values, one repeat")
    p.add_argument("--json", help="also write the results here")
    a = p.parse_args(argv)
    if a.quick:
        a.millions, a.repeats = "0.5,2", 1
    sizes = [float(s) for s in a.millions.split(",")]
    print(
        f"# bench_ingest_placement: D={a.features} (+1 target), block {a.block}, "
        f"best of {a.repeats}; SMALL_INGEST_VALUES = {SMALL_INGEST_VALUES:,}"
    )
    print(
        f"{'values':>12s} {'rows':>10s} {'here s':>8s} {'workers s':>10s} {'cluster s':>10s}"
        "  faster   rule picks   peak GB here (+workers) / workers (+workers)"
    )
    out = []
    for m in sizes:
        rows = int(m * 1e6 / (a.features + 1))
        values = rows * (a.features + 1)
        with tempfile.TemporaryDirectory(prefix="bench_ingest_") as tmp:
            work = make_source(Path(tmp), rows, a.features)
            conf = work / "conf.yaml"
            conf.write_text(CONFIG.format(x=work / "X.npy", y=work / "y.npy", block=a.block))
            res = [
                run_once(mode, conf, work)
                for _ in range(a.repeats)
                for mode in ("cluster", "workers", "here")
                if mode != "cluster" or m <= a.cluster_max
            ]
        if len({r["x_fingerprint"] for r in res}) != 1:
            raise SystemExit(f"{values} values: the two placements stored different rows")
        best = {
            mode: min((r["ingest_s"] for r in res if r["mode"] == mode), default=float("nan"))
            for mode in ("here", "workers", "cluster")
        }
        faster = "here" if best["here"] <= best["workers"] else "workers"

        def peaks(mode: str, res: list[dict] = res) -> str:
            rs = [r for r in res if r["mode"] == mode]
            return f"{max(r['peak_gb'] for r in rs):.2f} (+{max(r['workers_peak_gb'] for r in rs):.2f})"

        picks = "here" if values <= SMALL_INGEST_VALUES else "workers"
        print(
            f"{values:12,d} {rows:10,d} {best['here']:8.2f} {best['workers']:10.2f} "
            f"{best['cluster']:10.2f}  {faster:8s} {picks}"
            f"{'' if picks == faster else ' (differs)'}   {peaks('here')} / {peaks('workers')}"
        )
        out.append({"values": values, "rows": rows, "best_s": best, "runs": res})
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
