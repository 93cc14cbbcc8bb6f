"""A real cluster sharing nothing but the object store, under faults.

A ``dask scheduler`` and three ``dask worker`` processes on 127.0.0.1, each with
its own ``--local-directory`` (no nanny: a killed worker stays dead). The data,
the run directory and so every store (ingest, Gram, factor, model, predictions,
manifest, markers, lease) live on an S3-compatible server (moto) on loopback.
``krr run --scheduler`` fits and predicts a batch; one worker is SIGKILLed in
the middle of the factorisation and a fourth worker joins mid-run. α and every
prediction must be bitwise equal to a run on the local disk.

The kill is injected (``tests/faultinject``, armed in the three first workers with
``KRR_KILL_ONCE``): the first worker to reach its third factor tile dies just before
recording it as complete, whatever the speed of the machine and of the store. After the
kill the two survivors wait ``THEN_DELAY`` before each factor tile's record
(``KRR_KILL_THEN_DELAY``), so the factorisation is certainly unfinished when the test looks:
at the lowest versions the survivors once finished all 15 tiles before it did.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent))
from _dask_cluster import DASK, _start, external_cluster  # noqa: E402
from _forkserver import KrrProcess, krr_forked, prestart  # noqa: E402
from _s3server import make_bucket, moto_server, s3_env  # noqa: E402

pytestmark = pytest.mark.slow

N, D, BLOCK, NB = 1000, 8, 200, 200  # 5 row blocks: 15 factor tiles
KILL_AT = 3  # a worker dies at its 3rd factor tile's completion record
THEN_DELAY = 0.2  # seconds the survivors wait before each factor tile's record after it
BUCKET = "krr-cluster"
FAULTINJECT = Path(__file__).resolve().parents[1] / "faultinject"

CONFIG = """
name: s3-cluster
data: {{source: zarr, path: {x}, y_path: {y}}}
split: {{test_fraction: 0.0, seed: 0}}
preprocess: {{standardize: true, standardize_y: true}}
kernel: {{name: rbf, params: {{gamma: 0.1}}}}
lambda: 0.01
solver: {{method: cholesky, factor_scheduler: {sched}}}
block_size: {block}
predict: {{input: {xn}}}
evaluate: {{baseline: none}}
cluster: {{connect_timeout: 20, n_workers: 1, processes: false, memory_limit: 2GiB}}
"""


def _put_zarr(url: str, a: np.ndarray) -> None:
    import zarr

    z = zarr.create_array(url, shape=a.shape, chunks=(BLOCK,) + a.shape[1:], dtype=a.dtype)
    z[...] = a


def _results(run_dir: str) -> dict[str, np.ndarray]:
    import zarr

    from pipeline.models.artifact import load_artifact
    from pipeline.stages.manifest import Manifest
    from pipeline.storage.location import Location

    m = Manifest.load(run_dir)  # the latest configuration's results/<key>/{model,predict}
    out = {"alpha": np.asarray(load_artifact(f"{m.stage_dir('model')}/model").dual_coef)}
    for name in Location(str(m.stage_dir("predict"))).list():
        if name.endswith(".zarr"):
            group = zarr.open_group(f"{m.stage_dir('predict')}/{name}", mode="r")
            for arr_name, arr in group.arrays():
                out[f"{name}/{arr_name}"] = arr[...]
    return out


def _n_keys(fs, prefix: str) -> int:
    fs.invalidate_cache()
    try:
        if "*" in prefix:
            return len(fs.glob(prefix))
        return len(fs.ls(prefix, detail=False, refresh=True))
    except FileNotFoundError:
        return 0


def test_cluster_on_object_store_survives_kill_and_join(tmp_path, monkeypatch):
    import s3fs

    # one BLAS thread in every process, as a nanny gives its worker (these run without
    # one, so that a killed worker stays dead): bitwise equality assumes the same
    # BLAS threading for the same tile operation
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.setenv(var, "1")
    # the two krr processes are forked from an interpreter that imported the pipeline once
    # with this environment (tests/_forkserver.py): its imports overlap the setup below
    prestart()

    rng = np.random.default_rng(7)
    X = rng.normal(size=(N, D))
    y = np.sin(X[:, :2].sum(axis=1)) + 0.1 * rng.normal(size=N)
    Xn = rng.normal(size=(NB, D))
    with contextlib.ExitStack() as stack:
        env = stack.enter_context(moto_server())
        stack.enter_context(s3_env(env))
        make_bucket(BUCKET)
        data = f"s3://{BUCKET}/data"
        for name, a in (("X", X), ("y", y), ("Xn", Xn)):
            _put_zarr(f"{data}/{name}.zarr", a)
        text = CONFIG.format(
            x=f"{data}/X.zarr", y=f"{data}/y.zarr", xn=f"{data}/Xn.zarr", block=BLOCK,
            sched="SCHED",
        )  # fmt: skip
        # the reference: the same config, run dir on the local disk, in-process threads;
        # its own process, run beside the cluster's (it shares nothing with it but the
        # input data): the test waits for it at the end, not before starting the cluster
        ref_conf = tmp_path / "ref.yaml"
        ref_conf.write_text(text.replace("SCHED", "threads"))
        pool = stack.enter_context(ThreadPoolExecutor(1))
        ref_run = pool.submit(krr_forked.run, ref_conf, tmp_path / "ref")

        conf = tmp_path / "conf.yaml"
        conf.write_text(text.replace("SCHED", "dask"))
        run_dir = f"s3://{BUCKET}/run"
        work = tmp_path / "cwd"
        work.mkdir()
        logs = tmp_path / "logs"
        fs = s3fs.S3FileSystem()
        markers = f"{BUCKET}/run/results/*/solve/factor.zarr/_markers/chol/*"
        n_tiles = (N // BLOCK) * (N // BLOCK + 1) // 2
        cli = None
        inject = {
            "PYTHONPATH": os.pathsep.join([str(FAULTINJECT), os.environ.get("PYTHONPATH", "")]),
            "KRR_KILL_MATCH": "chol/", "KRR_KILL_AT": str(KILL_AT),
            "KRR_KILL_ONCE": str(tmp_path / "killed"), "KRR_KILL_THEN_DELAY": str(THEN_DELAY),
        }  # fmt: skip
        with external_cluster(logs, 3, nanny=False, timeout=60, worker_env=inject) as cluster:
            workers = cluster.workers
            try:
                t0 = time.monotonic()
                cli = KrrProcess(
                    ["run", str(conf), "--run-dir", run_dir, "--scheduler", cluster.address,
                     "--json"],
                    dict(os.environ), cwd=work, start_new_session=True,
                )  # fmt: skip
                # until a worker's injected SIGKILL in the middle of the factorisation
                while all(w.poll() is None for w in workers) and time.monotonic() - t0 < 150:
                    assert cli.poll() is None, cli.communicate()[1][-3000:]
                    time.sleep(0.05)
                assert cli.poll() is None, cli.communicate()[1][-3000:]
                seen = _n_keys(fs, markers)
                assert [w.returncode for w in workers].count(-signal.SIGKILL) == 1, workers
                # the dead worker had recorded KILL_AT - 1 tiles, not the one it was storing
                assert KILL_AT - 1 <= seen < n_tiles, seen
                extra = _start(
                    [DASK, "worker", cluster.address, "--nthreads", "1", "--memory-limit",
                     "1GiB", "--no-dashboard", "--no-nanny", "--local-directory",
                     str(logs / "w3")],
                    logs / "worker3.log",
                )  # fmt: skip
                workers.append(extra)  # stopped with the others
                out, err = cli.communicate(timeout=170 - (time.monotonic() - t0))
                assert cli.returncode == 0, err[-3000:]
                seen_after = _n_keys(fs, markers)
            finally:
                if cli is not None and cli.poll() is None:
                    cli.kill()
                    cli.wait()
        ref = ref_run.result()
        assert ref.returncode == 0, ref.stderr[-3000:]
        want = _results(str(tmp_path / "ref"))
        assert seen_after == n_tiles
        assert json.loads(out)["run_dir"] == run_dir
        assert list(work.iterdir()) == [], "the run wrote to the local disk"
        got = _results(run_dir)
        assert got.keys() == want.keys() and len(got) == 2, (got.keys(), want.keys())
        for key in want:
            np.testing.assert_array_equal(got[key], want[key], err_msg=key)
        # the worker that joined mid-run did work
        assert "Starting established connection" in (logs / "worker3.log").read_text()
