"""SIGKILL one ``dask worker`` of a real external cluster mid-gram; the run completes.

The test starts a ``dask scheduler`` and two ``dask worker`` processes (no nanny,
so a killed worker stays dead) on 127.0.0.1 and runs ``krr run CONFIG --scheduler``
in a subprocess. The first worker to reach its third Gram tile SIGKILLs itself just
before recording that tile as complete (``tests/faultinject``, ``KRR_KILL_ONCE``): some
but not all Gram tiles carry a completion record, whatever the speed of the machine.
The test checks that the run finishes with every Gram tile stored and α bitwise equal
to a reference computed in this process with the same library calls on the threaded
scheduler.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import zarr
from _dask_cluster import external_cluster, stop
from _forkserver import KrrProcess, prestart

from pipeline.linalg.cholesky import tile_cholesky
from pipeline.linalg.gram import build_gram
from pipeline.linalg.triangular import cholesky_solve
from pipeline.stages.manifest import resolve_outputs

pytestmark = pytest.mark.slow

# D = 256: the Gram's weighed entries (1.2M entries at D = 256) pass SMALL_PASS_ENTRIES
# (a Gram below that is computed in the client's process, not on the workers)
N, D, BLOCK = 1500, 256, 150
N_TILES = (N // BLOCK) * (N // BLOCK + 1) // 2  # 10 row blocks: 55 lower tiles
KILL_AT = 3  # a worker dies at its 3rd Gram tile's completion record
FAULTINJECT = Path(__file__).resolve().parents[1] / "faultinject"

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
    # the run is forked from an interpreter that imported the pipeline once
    # (tests/_forkserver.py): its imports overlap the cluster's start
    prestart()
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

    # every worker is armed; the first to reach its KILL_AT-th Gram marker dies
    inject = {
        "PYTHONPATH": os.pathsep.join([str(FAULTINJECT), os.environ.get("PYTHONPATH", "")]),
        "KRR_KILL_MATCH": "gram/", "KRR_KILL_AT": str(KILL_AT),
        "KRR_KILL_ONCE": str(tmp_path / "killed"),
    }  # fmt: skip
    cli = None
    try:
        with external_cluster(logs, 2, nanny=False, timeout=60, worker_env=inject) as cluster:
            workers = cluster.workers
            cli = KrrProcess(
                ["run", str(conf), "--run-dir", str(run_dir), "--scheduler", cluster.address,
                 "--json"],
                dict(os.environ), start_new_session=True,
            )  # fmt: skip
            markers = run_dir / "gram" / "gram.zarr" / "_markers" / "gram"
            deadline = time.monotonic() + 240
            while all(w.poll() is None for w in workers) and time.monotonic() < deadline:
                assert cli.poll() is None, f"run ended, no worker killed: {cli.communicate()[1]}"
                time.sleep(0.02)  # until the injected kill
            at_kill = _n_markers(markers)
            assert any(w.poll() is not None for w in workers), "no worker died in 240 s"
            (dead,) = [w for w in workers if w.poll() is not None]
            (survivor,) = [w for w in workers if w is not dead]
            assert dead.returncode == -signal.SIGKILL, dead.returncode
            # the dead worker had recorded KILL_AT - 1 tiles, not the one it was storing
            assert KILL_AT - 1 <= at_kill < N_TILES, at_kill
            out, err = cli.communicate(timeout=240)
            assert cli.returncode == 0, err[-4000:]
            assert survivor.poll() is None  # the survivor finished the work
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
