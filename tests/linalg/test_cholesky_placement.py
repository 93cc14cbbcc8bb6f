"""The Dask executor of the tile Cholesky deals tile rows to the workers.

Without it, Dask put every tile task on the worker holding its dependencies'
(tiny) records, i.e. all of them on one worker. The factor's bits do not change.
"""

import numpy as np
import pytest

from pipeline.kernels import RBF
from pipeline.linalg.cholesky import tile_cholesky
from pipeline.linalg.gram import build_gram


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


def test_tile_tasks_go_critical_path_first(tmp_path, monkeypatch):
    """On a client the tile tasks carry their upward ranks as priorities (the threaded
    scheduler gets the same order from a callback, tests/engine/test_dag.py); the
    diagonal tiles, on the critical path, outrank the rows below them."""
    pytest.importorskip("distributed")
    import re

    from distributed import Client, LocalCluster

    import pipeline.engine.parallel as parallel

    seen: dict[tuple[int, int], int] = {}
    real = parallel.compute

    def watch(*collections, **kw):
        for c in collections:
            for obj in c if isinstance(c, list) else [c]:
                for name, layer in obj.__dask_graph__().layers.items():
                    m = re.search(r"chol-tile-\w+-\w+-(\d+)-(\d+)$", str(name))
                    p = (layer.annotations or {}).get("priority")
                    if m and p is not None:
                        # merged layers hold per-key annotations (a partial over a dict)
                        p = p.keywords["dct"][name] if hasattr(p, "keywords") else p
                        seen[(int(m[1]), int(m[2]))] = p
        return real(*collections, **kw)

    monkeypatch.setattr(parallel, "compute", watch)
    X = np.random.default_rng(0).normal(size=(200, 4))
    g = build_gram(X, RBF(gamma=0.2), str(tmp_path / "g"), 40, progress=False)
    with (
        LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=":0",
                     memory_limit=0) as cluster,
        Client(cluster),
    ):  # fmt: skip
        tile_cholesky(g, 1e-2, store=str(tmp_path / "b"), scheduler="dask", progress=False)
    assert set(seen) == set(g.grid.lower_tiles())
    assert seen[(1, 1)] > seen[(4, 1)] > seen[(4, 2)]
    assert seen[(0, 0)] == max(seen.values())
