"""Prediction on the threaded scheduler, a LocalCluster with processes, and an external scheduler.

The external scheduler is a real ``dask scheduler`` process with two ``dask
worker`` processes on 127.0.0.1. Results must be bit-identical across the three.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
from distributed import Client

from pipeline.kernels import RBF
from pipeline.parallel import dask_client
from pipeline.predict import predict
from pipeline.storage import TileMarkers

DASK = shutil.which("dask", path=os.path.dirname(sys.executable)) or "dask"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def external_scheduler(tmp_path_factory):
    """A `dask scheduler` and two `dask worker` processes; all stopped at teardown."""
    port = _free_port()
    address = f"tcp://127.0.0.1:{port}"
    logs = tmp_path_factory.mktemp("dask-logs")
    procs: list[subprocess.Popen] = []
    common = {"stdin": subprocess.DEVNULL, "start_new_session": True}
    try:
        with open(logs / "scheduler.log", "w") as log:
            procs.append(
                subprocess.Popen(
                    [
                        DASK,
                        "scheduler",
                        "--host",
                        "127.0.0.1",
                        "--port",
                        str(port),
                        "--no-dashboard",
                        "--no-show",
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    **common,
                )  # fmt: skip
            )
        for w in range(2):
            with open(logs / f"worker{w}.log", "w") as log:
                procs.append(
                    subprocess.Popen(
                        [
                            DASK,
                            "worker",
                            address,
                            "--nthreads",
                            "1",
                            "--memory-limit",
                            "1GiB",
                            "--no-dashboard",
                            "--local-directory",
                            str(logs / f"w{w}"),
                        ],
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        **common,
                    )  # fmt: skip
                )
        deadline = time.monotonic() + 90
        while True:
            try:
                with Client(address, timeout=5) as c:
                    c.wait_for_workers(2, timeout=max(1, deadline - time.monotonic()))
                break
            except OSError:
                for p in procs:
                    if p.poll() is not None:
                        pytest.fail(f"dask process exited early; logs in {logs}")
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        yield address
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.terminate()
        for p in reversed(procs):
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


@pytest.fixture(scope="module")
def problem():
    rng = np.random.default_rng(3)
    X = rng.standard_normal((700, 5))
    Xt = rng.standard_normal((450, 5))
    A = rng.standard_normal((450, 2))
    return X, Xt, A


def _run(problem, store):
    X, Xt, A = problem
    k = RBF(gamma=0.3)
    kw = {"block_size": 128, "train_block_size": 100, "progress": False}
    y = predict(X, Xt, A, k, **kw)
    res = predict(X, Xt, A, k, out=str(store), **kw)
    return y, res.to_numpy(), res


def res_local_marker_pid(res, i):
    return TileMarkers(res.store, res.name, res.fingerprint).record((i,))["pid"]


@pytest.mark.slow
def test_identical_across_schedulers(problem, external_scheduler, tmp_path):
    X, Xt, A = problem
    y_threads, z_threads, _ = _run(problem, tmp_path / "threads")
    np.testing.assert_allclose(y_threads, RBF(gamma=0.3)(X, Xt) @ A, rtol=1e-10, atol=1e-10)
    np.testing.assert_array_equal(y_threads, z_threads)

    with dask_client(n_workers=2, threads_per_worker=1, memory_limit="1GiB", processes=True) as c:
        assert len(c.scheduler_info()["workers"]) == 2
        y_local, z_local, res_local = _run(problem, tmp_path / "local")

    with dask_client(external_scheduler) as c:
        assert len(c.scheduler_info()["workers"]) == 2
        y_ext, z_ext, res_ext = _run(problem, tmp_path / "external")
        assert res_ext.n_computed == 6
    # the batch predictions were written by the worker processes, not by this one
    for res in (res_local, res_ext):
        pids = {res_local_marker_pid(res, i) for i in range(res.n_blocks)}
        assert os.getpid() not in pids and len(pids) >= 1

    for y in (y_local, z_local, y_ext, z_ext):
        np.testing.assert_array_equal(y, y_threads)
