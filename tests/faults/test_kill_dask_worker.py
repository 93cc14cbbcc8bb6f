"""SIGKILL one ``dask worker`` of a real external cluster mid-gram; the run completes.

The test starts a ``dask scheduler`` and two ``dask worker`` processes (no nanny,
so a killed worker stays dead) on 127.0.0.1, runs ``krr run CONFIG --scheduler``
in a subprocess, waits until some but not all Gram tiles carry a completion
record, kills one worker, and checks that the run finishes with every Gram tile
stored and α bitwise equal to a reference computed in this process with the
same library calls on the threaded scheduler.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zarr
from _dask_cluster import external_cluster, stop

from pipeline.linalg.cholesky import tile_cholesky
from pipeline.linalg.gram import build_gram
from pipeline.linalg.triangular import cholesky_solve
from pipeline.stages.manifest import resolve_outputs

pytestmark = pytest.mark.slow

N, D, BLOCK = 3000, 500, 150
N_TILES = (N // BLOCK) * (N // BLOCK + 1) // 2  # 20 row blocks: 210 lower tiles

CONFIG = """
name: worker-kill
data: {{source: npy, path: {x}, y_path: {y}}}
split: {{test_fraction: 0.0, seed: 0}}
preprocess: {{standardize: true}}
kernel: {{name: laplacian, params: {{gamma: 0.002}}}}
lambda: 0.01
solver: {{method: cholesky, factor_scheduler: threads}}
block_size: {block}
cluster: {{connect_timeout: 20}}
"""


def _n_markers(d: Path) -> int:
    try:
        return sum(1 for f in os.listdir(d) if not f.endswith(".tmp"))
    except FileNotFoundError:
        return 0


def test_kill_one_worker_mid_gram(tmp_path):
    rng = np.random.default_rng(5)
    X = rng.normal(size=(N, D))
    y = np.sin(X[:, :3].sum(axis=1)) + 0.1 * rng.normal(size=N)
    np.save(tmp_path / "X.npy", X)
    np.save(tmp_path / "y.npy", y)
    conf = tmp_path / "conf.yaml"
    conf.write_text(CONFIG.format(x=tmp_path / "X.npy", y=tmp_path / "y.npy", block=BLOCK))
    run_dir = tmp_path / "run"
    logs = tmp_path / "logs"
    logs.mkdir()

    cli = None
    try:
        with external_cluster(logs, 2, nanny=False, timeout=60) as cluster:
            workers = cluster.workers
            cli = subprocess.Popen(
                [sys.executable, "-m", "pipeline.cli", "run", str(conf), "--run-dir",
                 str(run_dir), "--scheduler", cluster.address, "--json"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                start_new_session=True,
            )  # fmt: skip
            markers = run_dir / "gram" / "gram.zarr" / "_markers" / "gram"
            deadline = time.monotonic() + 120
            seen = 0
            while cli.poll() is None and time.monotonic() < deadline:
                seen = _n_markers(markers)
                if seen >= N_TILES // 10:
                    break
                time.sleep(0.02)
            assert cli.poll() is None, f"run ended before the kill: {cli.communicate()[1][-3000:]}"
            assert 0 < seen < N_TILES, seen
            os.kill(workers[0].pid, signal.SIGKILL)
            workers[0].wait(timeout=10)
            at_kill = _n_markers(markers)
            out, err = cli.communicate(timeout=240)
            assert cli.returncode == 0, err[-4000:]
            assert at_kill < N_TILES, "the Gram was already complete when the worker died"
            assert workers[1].poll() is None  # the survivor finished the work
    finally:
        if cli is not None:
            stop(cli)

    report = json.loads(out)
    assert {"ingest", "gram", "solve"} <= set(report["ran"])
    # stage outputs inside the run dir are stored as "@run/..." paths: resolve them
    manifest = resolve_outputs(json.loads((run_dir / "manifest.json").read_text()), run_dir)
    gram_out = manifest["stages"]["gram"]["outputs"]
    assert _n_markers(markers) == gram_out["tiles"] == N_TILES
    from pipeline.stages.manifest import Manifest

    alpha = np.load(Manifest.load(run_dir).stage_dir("solve") / "alpha.npy")

    # reference: the same library calls on the stored training rows, threaded, here
    ing = manifest["stages"]["ingest"]["outputs"]
    Xt = zarr.open_array(ing["store"], path=ing["X_train"], mode="r")[...]
    yt = zarr.open_array(ing["store"], path=ing["y_train"], mode="r")[...]
    sol = manifest["stages"]["solve"]["outputs"]
    kernel = {"name": "laplacian", "params": {"gamma": 0.002}}
    g = build_gram(Xt, kernel, tmp_path / "ref.zarr", BLOCK, progress=False)
    f = tile_cholesky(
        g, sol["lam"], convention=sol["lam_convention"], store=str(tmp_path / "reff.zarr"),
        scheduler="threads",
    )  # fmt: skip
    assert f.shift == sol["shift"]
    ref = np.asarray(cholesky_solve(f, yt), dtype=np.float64).reshape(alpha.shape)
    np.testing.assert_array_equal(alpha, ref)
