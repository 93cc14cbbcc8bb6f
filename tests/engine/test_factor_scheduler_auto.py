"""scheduler="auto" factors on the threads executor when the cluster's workers run on
this machine, and on the workers only when they run elsewhere
(FACTOR_THREADS_ON_THIS_HOST). The factor's bits are the same either way."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from _tiles import rbf_matrix, write_gram

import pipeline.constants as policy_constants
import pipeline.engine.where as where
import pipeline.linalg.cholesky as chol
from pipeline.linalg.cholesky import tile_cholesky
from pipeline.linalg.cholesky_cache import release_tile_cache

pytest.importorskip("distributed")


# an address of another machine: TEST-NET ones, the first that is not this host's own
# (a sandbox may use TEST-NET-1 for itself)
_ELSEWHERE = next(
    a for a in ("192.0.2.77", "198.51.100.77", "203.0.113.77")
    if a not in where._this_host_addresses()
)  # fmt: skip


class _FakeClient:
    def __init__(self, workers):
        self._workers = workers

    def scheduler_info(self):
        if isinstance(self._workers, Exception):
            raise self._workers
        return {"workers": self._workers}


@pytest.mark.parametrize(
    "workers,want",
    [
        ({"inproc://10.1.2.3/1/2": {"host": "10.1.2.3"}}, True),  # in this process
        ({"tcp://127.0.0.1:4000": {"host": "127.0.0.1"}}, True),
        ({"tcp://127.0.0.1:4000": {}}, True),  # the host from the address
        (
            {
                "tcp://127.0.0.1:4000": {"host": "127.0.0.1"},
                f"tcp://{_ELSEWHERE}:4000": {"host": _ELSEWHERE},
            },
            False,
        ),
        ({f"tcp://{_ELSEWHERE}:4000": {"host": _ELSEWHERE}}, False),
        ({f"tcp://{_ELSEWHERE}:4000": {}}, False),  # the host from the address
        ({}, False),
        (OSError("scheduler gone"), False),
    ],
)
def test_workers_on_this_host(workers, want):
    assert where.workers_on_this_host(_FakeClient(workers)) is want


def _spy_executors(monkeypatch):
    ran = []
    real_threads, real_dask = chol._run_threads, chol._run_dask

    def threads(*a, **k):
        ran.append("threads")
        return real_threads(*a, **k)

    def dask(*a, **k):
        ran.append("dask")
        return real_dask(*a, **k)

    monkeypatch.setattr(chol, "_run_threads", threads)
    monkeypatch.setattr(chol, "_run_dask", dask)
    return ran


def test_auto_runs_threads_here_and_the_workers_elsewhere(tmp_path, monkeypatch, caplog):
    from distributed import Client, LocalCluster

    monkeypatch.setenv("KRR_CHOL_BLAS_THREADS", "1")
    g = write_gram(tmp_path / "g", rbf_matrix(230, seed=13), 50)
    ref = tile_cholesky(g, 1e-3, store=str(tmp_path / "ref"), scheduler="threads",
                        progress=False)  # fmt: skip
    release_tile_cache()
    ran = _spy_executors(monkeypatch)
    got = {}
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                     dashboard_address=":0", memory_limit=0) as cluster,
        Client(cluster),
    ):  # fmt: skip
        with caplog.at_level(logging.INFO, logger="pipeline.linalg.cholesky_exec"):
            got["here"] = tile_cholesky(g, 1e-3, store=str(tmp_path / "a"), progress=False)
        assert any("threads executor in this process" in r.getMessage() for r in caplog.records)
        monkeypatch.setattr(where, "workers_on_this_host", lambda client: False)
        got["elsewhere"] = tile_cholesky(g, 1e-3, store=str(tmp_path / "b"), progress=False)
        monkeypatch.undo()  # (the spies too)
        ran2 = _spy_executors(monkeypatch)
        monkeypatch.setenv("KRR_CHOL_BLAS_THREADS", "1")
        monkeypatch.setattr(policy_constants, "FACTOR_THREADS_ON_THIS_HOST", False)
        got["switched off"] = tile_cholesky(g, 1e-3, store=str(tmp_path / "c"), progress=False)
    got["no client"] = tile_cholesky(g, 1e-3, store=str(tmp_path / "d"), progress=False)
    assert ran == ["threads", "dask"]  # here, then "elsewhere"
    assert ran2 == ["dask", "threads"]  # switched off, then without a client
    for f in got.values():
        np.testing.assert_array_equal(f.L.zarr("r")[:], ref.L.zarr("r")[:])
