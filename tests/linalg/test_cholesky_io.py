"""Both executors of the tile Cholesky read the Gram ahead and write the factor behind.

The threads executor and the Dask executor on the threaded scheduler share one
TileIO (:func:`pipeline.linalg.cholesky_exec._tile_io`): Gram tiles are read on its
``tile-read`` threads in the order the tasks will probably run (the one-thread list
schedule, critical path first), and factor tiles are written on its ``tile-write``
thread. The factor's bits do not depend on it.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
from _tiles import rbf_matrix, write_gram

from pipeline.linalg.cholesky import tile_cholesky
from pipeline.linalg.cholesky_cache import release_tile_cache
from pipeline.storage import TiledArray


@pytest.fixture
def io_threads(monkeypatch):
    """Record the thread of every Gram read and factor write."""
    seen: dict[str, list[tuple[str, tuple[int, int]]]] = {"read": [], "write": []}
    real_read, real_write = TiledArray.read_tile, TiledArray.write_tile

    def read_tile(self, i, j, *a, **kw):
        if self.name == "gram":
            seen["read"].append((threading.current_thread().name, (i, j)))
        return real_read(self, i, j, *a, **kw)

    def write_tile(self, i, j, *a, **kw):
        if self.name != "gram":
            seen["write"].append((threading.current_thread().name, (i, j)))
        return real_write(self, i, j, *a, **kw)

    monkeypatch.setattr(TiledArray, "read_tile", read_tile)
    monkeypatch.setattr(TiledArray, "write_tile", write_tile)
    yield seen
    release_tile_cache()


def _gram(tmp_path):
    return write_gram(tmp_path / "g", rbf_matrix(300, seed=3), 50)  # 6 x 6 tiles, 21 lower


def test_one_thread_reads_every_gram_tile_ahead(tmp_path, io_threads):
    """On one tile thread the tasks run exactly in the announced order, so no task reads
    its Gram tile itself (it did while the read-ahead followed the left-looking order:
    the diagonal tile (1, 1) outranks (2, 0) and was then read out of turn)."""
    g = _gram(tmp_path)
    f = tile_cholesky(g, 1e-2, store=str(tmp_path / "f"), scheduler="threads", n_threads=1,
                      progress=False)  # fmt: skip
    reads = io_threads["read"]
    assert sorted(t for _, t in reads) == sorted(g.grid.lower_tiles())
    assert all(name.startswith("tile-read") for name, _ in reads), reads
    assert {name for name, _ in io_threads["write"]} == {"tile-write"}
    assert f.L.markers.done() == set(g.grid.lower_tiles())


def test_dask_executor_shares_the_read_ahead_and_keeps_the_bits(tmp_path, io_threads):
    g = _gram(tmp_path)
    ref = tile_cholesky(g, 1e-2, store=str(tmp_path / "t"), scheduler="threads", progress=False)
    io_threads["read"].clear()
    io_threads["write"].clear()
    got = tile_cholesky(g, 1e-2, store=str(tmp_path / "d"), scheduler="dask", progress=False)
    reads = io_threads["read"]
    ahead = sum(name.startswith("tile-read") for name, _ in reads)
    assert sorted(t for _, t in reads) == sorted(g.grid.lower_tiles())
    # (before, every task read its own tile; three scheduler threads on tiny tiles may
    # run ahead of a read-ahead of two tiles, and then read one themselves)
    assert ahead >= len(reads) // 2, reads
    assert {name for name, _ in io_threads["write"]} == {"tile-write"}
    for t in g.grid.lower_tiles():
        np.testing.assert_array_equal(got.L.read_tile(*t), ref.L.read_tile(*t))


def test_processes_scheduler_reads_its_own_tiles(tmp_path):
    """Dask's processes scheduler cannot share the TileIO (its threads and locks do not
    pickle): there each task reads and writes its own tiles, with the same bits."""
    import dask

    g = _gram(tmp_path)
    ref = tile_cholesky(g, 1e-2, store=str(tmp_path / "t"), scheduler="threads", progress=False)
    with dask.config.set(scheduler="processes", num_workers=2):
        got = tile_cholesky(g, 1e-2, store=str(tmp_path / "p"), scheduler="dask", progress=False)
    for t in g.grid.lower_tiles():
        np.testing.assert_array_equal(got.L.read_tile(*t), ref.L.read_tile(*t))


def test_dask_executor_ends_its_io_threads_when_the_graph_build_fails(tmp_path, monkeypatch):
    import pipeline.linalg.cholesky_exec as exec_mod

    g = _gram(tmp_path)

    def broken(*a, **kw):
        raise RuntimeError("graph build failed")

    monkeypatch.setattr(exec_mod, "submitted_deps", broken)
    with pytest.raises(RuntimeError, match="graph build failed"):
        tile_cholesky(g, 1e-2, store=str(tmp_path / "d"), scheduler="dask", progress=False)
    alive = [
        t.name for t in threading.enumerate() if t.name.startswith(("tile-read", "tile-write"))
    ]
    assert alive == []
