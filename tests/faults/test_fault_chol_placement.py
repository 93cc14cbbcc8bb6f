"""The Dask executor of the tile Cholesky deals tile rows to the workers.

Without it, Dask put every tile task on the worker holding its dependencies'
(tiny) records, i.e. all of them on one worker. The factor's bits do not change.
"""

import numpy as np
import pytest

from pipeline.gram import build_gram
from pipeline.kernels import RBF
from pipeline.solvers import tile_cholesky


def test_tile_tasks_spread_over_workers_bitwise(tmp_path, monkeypatch):
    pytest.importorskip("distributed")
    from distributed import Client, LocalCluster, get_task_stream

    monkeypatch.setenv("KRR_CHOL_BLAS_THREADS", "1")
    X = np.random.default_rng(0).normal(size=(320, 4))
    g = build_gram(X, RBF(gamma=0.2), str(tmp_path / "g"), 40, progress=False)
    ref = tile_cholesky(g, 1e-2, store=str(tmp_path / "a"), scheduler="threads", progress=False)
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0",
                     memory_limit=0) as cluster,
        Client(cluster) as client,
    ):  # fmt: skip
        with get_task_stream(client) as ts:
            got = tile_cholesky(
                g, 1e-2, store=str(tmp_path / "b"), scheduler="dask", progress=False
            )
        used = {t["worker"] for t in ts.data if "chol-tile" in str(t["key"])}
    assert len(used) == 2, used
    for i, j in g.grid.lower_tiles():
        np.testing.assert_array_equal(got.L.read_tile(i, j), ref.L.read_tile(i, j))
