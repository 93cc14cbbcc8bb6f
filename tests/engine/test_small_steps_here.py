"""Small stage steps beside a cluster on this machine run in this process.

A computation sent to a distributed client costs a round trip (0.3-0.5 s each on
the embedded LocalCluster), so the ingest stage of a small source and the
evaluate stage's reads run here (:func:`pipeline.engine.parallel.in_this_process`),
with the same stored rows and fingerprints; a large source, or a client whose
workers run on other machines, keeps the cluster.
"""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest

import pipeline.engine.parallel as par
from pipeline import constants as C
from pipeline.engine import where
from pipeline.stages import ingest, typed_params
from pipeline.stages.ingest import open_rows

N, D, BLOCK = 300, 4, 50


@pytest.fixture
def client():
    pytest.importorskip("distributed")
    from distributed import Client, LocalCluster

    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0",
                     memory_limit=0) as cluster,
        Client(cluster) as c,
    ):  # fmt: skip
        par._LOCAL.clear()
        yield c
    par._LOCAL.clear()


def _spy(client, monkeypatch) -> list[str]:
    """Every computation the client is asked to run: ``compute`` (pipeline.engine.parallel)
    and ``get`` (a plain ``dask.compute`` under the client)."""
    sent: list[str] = []
    for name in ("compute", "get"):
        real = getattr(client, name)
        monkeypatch.setattr(
            client, name, lambda *a, _n=name, _r=real, **k: sent.append(_n) or _r(*a, **k)
        )
    return sent


def _ingest(tmp_path, name):
    rng = np.random.default_rng(0)
    x, y = tmp_path / "X.npy", tmp_path / "y.npy"
    if not x.exists():
        np.save(x, rng.normal(size=(N, D)))
        np.save(y, rng.normal(size=N))
    params = dict(
        data={"source": "npy", "path": str(x), "y_path": str(y)},
        split={"test_fraction": 0.2, "seed": 0},
        preprocess={"standardize": True, "standardize_y": True},
        block_size=BLOCK,
    )
    out = ingest.run(tmp_path / name, {}, **typed_params("ingest", params))
    rows = {
        k: np.asarray(open_rows(out, k).compute(scheduler="sync"))
        for k in ("X_train", "y_train", "X_test")
    }
    return out, rows


def test_a_small_ingest_runs_here_beside_a_client_on_this_machine(tmp_path, client, monkeypatch):
    sent = _spy(client, monkeypatch)
    here, rows_here = _ingest(tmp_path, "here")
    assert sent == [], sent  # moments, validation, writes and fingerprint: all here
    monkeypatch.setattr(C, "SMALL_INGEST_VALUES", N * D + N - 1)  # one value too many
    there, rows_there = _ingest(tmp_path, "there")
    assert "compute" in sent and "get" not in sent  # validation reads its blocks here anyway
    n_sent = len(sent)
    monkeypatch.setattr(C, "SMALL_INGEST_VALUES", 10**9)
    par._LOCAL.clear()
    monkeypatch.setattr(par, "workers_on_this_host", lambda c: False)
    _ingest(tmp_path, "elsewhere")
    assert "get" in sent[n_sent:]  # workers on other machines: always on them
    a, b = here.to_json(), there.to_json()
    for k in ("store",):
        a.pop(k), b.pop(k)
    assert a == b  # the scalers, the counts and the content fingerprint
    for k in rows_here:
        np.testing.assert_array_equal(rows_here[k], rows_there[k])


def test_in_this_process_sets_the_client_aside_and_keeps_a_users_scheduler(client, monkeypatch):
    sent = _spy(client, monkeypatch)
    x = da.arange(12, chunks=4)
    with par.in_this_process():
        assert par._active_client() is None
        assert par.compute(x.sum(), progress=False)[0] == 66
        assert x.sum().compute(**par.local_scheduler()) == 66
        assert dask.config.get("scheduler") == "dask.distributed"  # the global stays
    assert sent == []
    assert par._active_client() is client  # only inside the block
    assert par.local_scheduler() == {}
    assert x.sum().compute() == 66 and sent == ["get"]
    with par.in_this_process(enabled=False):
        assert par._active_client() is client
        assert par.local_scheduler() == {}
    with dask.config.set(scheduler="sync"), par.in_this_process():
        assert dask.config.get("scheduler") == "sync"  # the user's own choice stays
        assert par.local_scheduler() == {}


def test_a_block_on_one_thread_neither_reaches_nor_ends_another_threads(client, monkeypatch):
    """Two threads: one stays inside in_this_process while the other enters and leaves
    its own block. The first still runs here after the second's block ended, and a
    thread outside any block keeps the client all along (session 23 set Dask's global
    config inside the block: both failed)."""
    import threading

    sent = _spy(client, monkeypatch)
    x = da.arange(12, chunks=4)
    inside, left, done = threading.Event(), threading.Event(), threading.Event()
    seen: dict[str, object] = {}

    def long_block():
        with par.in_this_process():
            inside.set()
            left.wait(30)  # the other thread's block has ended
            seen["long"] = par.compute(x.sum(), progress=False)[0]
            seen["long_plain"] = x.sum().compute(**par.local_scheduler())
        done.set()

    t = threading.Thread(target=long_block, daemon=True)
    t.start()
    try:
        assert inside.wait(30)
        with par.in_this_process():
            assert par.compute(x.sum(), progress=False)[0] == 66
        assert sent == []
        # outside any block, beside a thread inside one: the client runs it
        assert par.compute(x.sum(), progress=False)[0] == 66 and sent == ["compute"]
        assert x.sum().compute() == 66 and sent == ["compute", "get"]
    finally:
        left.set()
    assert done.wait(30)
    t.join(30)
    assert seen == {"long": 66, "long_plain": 66}
    assert sent == ["compute", "get"]  # the long block ran both here


def test_evaluate_reads_the_stored_rows_here(tmp_path, client, monkeypatch):
    from pipeline.stages.evaluate import _rows_here

    out, rows = _ingest(tmp_path, "ing")
    sent = _spy(client, monkeypatch)
    np.testing.assert_array_equal(_rows_here(out, "X_test"), rows["X_test"])
    assert sent == []


def test_a_small_gram_builds_here_and_a_costly_one_on_the_workers(tmp_path, client, monkeypatch):
    """build_gram beside a client on this machine: a build of at most SMALL_PASS_ENTRIES
    entries (weighed by D) runs here, with the bits the workers give."""
    from pipeline.linalg.gram import build_gram
    from pipeline.storage import read_all

    X = np.random.default_rng(1).normal(size=(120, 8))
    sent = _spy(client, monkeypatch)
    here = read_all(str(build_gram(X, "rbf", tmp_path / "here.zarr", 50).store), "gram")
    assert sent == []
    entries = where.lower_entries([50, 50, 20])
    monkeypatch.setattr(C, "SMALL_PASS_ENTRIES", entries - 1)
    there = read_all(str(build_gram(X, "rbf", tmp_path / "there.zarr", 50).store), "gram")
    assert sent == ["compute"]
    np.testing.assert_array_equal(here, there)
    # the same entries at D = 500 cost about 20 times more each: not a small build
    monkeypatch.setattr(C, "SMALL_PASS_ENTRIES", 4 * entries)
    assert where.runs_here(entries, None)
    assert not where.runs_here(where.weigh(entries, 500), None)
    wide = np.random.default_rng(2).normal(size=(120, 500))
    build_gram(wide, "laplacian", tmp_path / "wide.zarr", 50)
    assert sent == ["compute", "compute"]
