"""Prediction on the threaded scheduler, a LocalCluster with processes, and an external scheduler.

The external scheduler is a real ``dask scheduler`` process with two ``dask
worker`` processes on 127.0.0.1. Results must be bit-identical across the three.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from _dask_cluster import external_cluster

from pipeline.engine.parallel import dask_client
from pipeline.kernels import RBF
from pipeline.linalg.blockwise import predict
from pipeline.storage import TileMarkers


@pytest.fixture(scope="module")
def external_scheduler(tmp_path_factory):
    """A `dask scheduler` and two `dask worker` processes; all stopped at teardown. No
    nannies: nothing here kills a worker, and each nanny is one more interpreter."""
    with external_cluster(tmp_path_factory.mktemp("dask-logs"), 2, nanny=False) as cluster:
        yield cluster.address


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
