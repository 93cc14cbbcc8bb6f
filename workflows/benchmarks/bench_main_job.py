"""Benchmark: the README's main job (``krr run conf/demo.yaml``), stage by stage.

Runs the main job on the embedded LocalCluster twice per repeat, each in a fresh
process and a fresh run directory:

- ``ours``: as shipped; small steps beside a cluster on this machine run in this
  process (``pipeline.engine.where.in_this_process``: a small source's ingest, the
  row-block validation, small Gram builds and tile passes);
- ``cluster`` (the baseline, the earlier placement): every step on the cluster's
  workers (``pipeline.engine.where.beside_local_workers`` answers False).

It prints each stage's seconds from the run's manifest, the whole run's wall time
and the held-out R², and checks that both modes stored the same training rows
(the ingest fingerprint) and predicted the same values.

    python workflows/benchmarks/bench_main_job.py --repeats 2

It imports internals (``pipeline.engine.parallel``, ``pipeline.cli``) because the baseline
patches the placement rule itself (``beside_local_workers``) in the child process that
runs ``krr run``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STAGES = ("ingest", "gram", "solve", "model", "predict", "evaluate")

_CHILD = """
import sys
import pipeline.engine.where as where
if sys.argv[1] == "cluster":
    where.beside_local_workers = lambda graph=None: False
from pipeline.cli import main
if __name__ == "__main__":
    sys.exit(main(["run", sys.argv[2], "--run-dir", sys.argv[3], "--json", "-q"]))
"""


def run_child(child: str, mode: str, conf: Path, workdir: Path) -> tuple[Path, float]:
    """Run the script ``child`` (``krr run`` in a fresh process: argv mode, config, run
    dir) in ``workdir``; its new run directory and wall seconds. Exits on a failure."""
    run_dir = workdir / f"run-{mode}-{time.monotonic_ns()}"
    script = workdir / "child.py"
    script.write_text(child)
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, str(script), mode, str(conf), str(run_dir)],
        capture_output=True,
        text=True,
        cwd=workdir,
    )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{mode}: krr run failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return run_dir, wall


def run_once(mode: str, workdir: Path) -> dict:
    run_dir, wall = run_child(_CHILD, mode, ROOT / "conf" / "demo.yaml", workdir)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    stages = manifest["stages"]
    secs = {s: stages[s]["resources"]["seconds"] for s in STAGES if s in stages}
    ev = stages["evaluate"]["outputs"]
    return {
        "mode": mode,
        "wall_s": wall,
        "stages_s": secs,
        "r2": ev["metrics"].get("r2"),
        "x_fingerprint": stages["ingest"]["outputs"]["x_fingerprint"],
        "max_abs_prediction_difference": (ev.get("baseline") or {}).get(
            "max_abs_prediction_difference"
        ),
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="one repeat")
    p.add_argument("--json", help="also write the results here")
    a = p.parse_args(argv)
    if a.quick:
        a.repeats = 1
    results = []
    with tempfile.TemporaryDirectory(prefix="bench_main_job_") as tmp:
        for rep in range(a.repeats):
            for mode in ("cluster", "ours"):
                r = run_once(mode, Path(tmp))
                results.append(r)
                st = "  ".join(f"{s} {r['stages_s'].get(s, 0):.1f}" for s in STAGES)
                print(f"rep {rep} {mode:8s} wall {r['wall_s']:5.1f} s | {st} | R² {r['r2']:.6f}")
    by = {m: [r for r in results if r["mode"] == m] for m in ("cluster", "ours")}
    print("\nbest of each stage (s)        cluster-only (before)   ours")
    for s in (*STAGES, "wall"):

        def best(rs, s=s):
            return min(r["wall_s"] if s == "wall" else r["stages_s"].get(s, 0.0) for r in rs)

        print(
            f"  {s:10s}                  {best(by['cluster']):8.2f}           {best(by['ours']):8.2f}"
        )
    same_rows = len({r["x_fingerprint"] for r in results}) == 1
    same_r2 = len({round(r["r2"], 12) for r in results}) == 1
    print(f"same stored training rows: {same_rows}; same R²: {same_r2}")
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    if not (same_rows and same_r2):
        raise SystemExit("the two placements disagree")


if __name__ == "__main__":
    main()
