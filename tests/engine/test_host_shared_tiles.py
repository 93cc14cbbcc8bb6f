"""Factor tiles shared by the worker processes of one host (HOST_SHARED_FACTOR_TILES).

On a distributed client (or the processes scheduler) each worker process used to read
every factor tile another worker wrote into new memory of its own, past a page cache
the tile had never been in. Tasks there now write their factor tiles through the page
cache and map the others' tiles from it, read-only (``TiledArray.map_tile``): one copy
of a tile per host. The in-process executors keep writing past the page cache. The
bits are the same either way.
"""

from __future__ import annotations

import numpy as np
import pytest
from _tiles import rbf_matrix, write_gram

import pipeline.constants as policy_constants
from pipeline.linalg.cholesky import tile_cholesky
from pipeline.linalg.cholesky_cache import (
    DEFAULT_CACHE_BYTES,
    release_tile_cache,
    set_tile_cache_budget,
)
from pipeline.storage import CorruptTileError, TiledArray
from pipeline.storage.rawchunks import chunk_layout, map_chunk


def test_map_tile_is_the_stored_tile_read_only_and_checked(tmp_path):
    K = rbf_matrix(130, seed=3)
    g = write_gram(tmp_path / "g", K, 50)  # 3 x 3 tiles, the last 30 wide
    t = g.map_tile(1, 0)
    np.testing.assert_array_equal(t, K[50:100, :50])
    assert not t.flags.writeable and type(t) is np.ndarray
    # the last tile row (30 of 50 rows): the first rows of its padded file, C-contiguous
    edge = g.map_tile(2, 1)
    np.testing.assert_array_equal(edge, K[100:, 50:100])
    assert edge.flags.c_contiguous and not edge.flags.writeable
    assert g.map_tile(2, 2) is None  # cut in its columns too: the caller reads it instead
    lay = chunk_layout(g.store, g.name)
    assert map_chunk(lay, (0, 1)) is None  # never written (upper triangle)
    # one flipped byte in the file: the checksum says so
    path = lay.path((1, 1))
    raw = bytearray(path.read_bytes())
    raw[100] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(CorruptTileError):
        g.map_tile(1, 1)
    assert g.map_tile(1, 1, verify=False) is not None


def test_map_tile_needs_a_raw_local_chunk(tmp_path, monkeypatch):
    g = write_gram(tmp_path / "g", rbf_matrix(100, seed=1), 50)
    monkeypatch.setattr("pipeline.storage.arrays.chunk_layout", lambda *a: None)
    assert g.map_tile(1, 0) is None


def _client_factor(g, store, scheduler):
    from distributed import Client, LocalCluster

    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                     dashboard_address=":0", memory_limit=0) as cluster,
        Client(cluster),
    ):  # fmt: skip
        return tile_cholesky(g, 1e-3, store=store, name="chol", scheduler=scheduler,
                             progress=False)  # fmt: skip


@pytest.mark.parametrize("shared", [True, False], ids=["host-shared", "copies"])
def test_client_tasks_write_through_the_page_cache_and_map_each_others_tiles(
    tmp_path, monkeypatch, shared
):
    pytest.importorskip("distributed")
    monkeypatch.setenv("KRR_CHOL_BLAS_THREADS", "1")
    monkeypatch.setattr(policy_constants, "HOST_SHARED_FACTOR_TILES", shared)
    # 5 x 5 tiles of 50, the last 30 wide (its diagonal tile read, not mapped)
    K = rbf_matrix(230, seed=6)
    g = write_gram(tmp_path / "g", K, 50)
    ref = tile_cholesky(g, 1e-3, store=str(tmp_path / "ref"), name="chol",
                        scheduler="threads", progress=False)  # fmt: skip
    release_tile_cache()
    writes: list[bool] = []
    maps: list[tuple[int, int]] = []
    real_write, real_map = TiledArray.write_tile, TiledArray.map_tile

    def write_tile(self, i, j, tile, *a, **kw):
        if self.name == "chol":
            writes.append(bool(kw.get("direct", False)))
        return real_write(self, i, j, tile, *a, **kw)

    def map_tile(self, i, j=0, *a, **kw):
        out = real_map(self, i, j, *a, **kw)
        if out is not None:
            maps.append((i, j))
        return out

    monkeypatch.setattr(TiledArray, "write_tile", write_tile)
    monkeypatch.setattr(TiledArray, "map_tile", map_tile)
    # in-process workers share one tile cache: with none, every factor read misses, as
    # a worker's does for the tiles another process wrote
    set_tile_cache_budget(0)
    try:
        got = _client_factor(g, str(tmp_path / "got"), "dask")
    finally:
        set_tile_cache_budget(DEFAULT_CACHE_BYTES)
        release_tile_cache()
    lower = list(g.grid.lower_tiles())
    assert len(writes) == len(lower)
    if shared:
        assert not any(writes)  # through the page cache
        # whole tiles and the last row's, not the last diagonal tile (cut in columns)
        assert maps and (4, 4) not in maps
    else:
        assert set(writes) == {policy_constants.DIRECT_FACTOR_WRITES} and maps == []
    for t in lower:
        np.testing.assert_array_equal(got.L.read_tile(*t), ref.L.read_tile(*t))


def test_in_process_executors_neither_map_nor_write_through(tmp_path, monkeypatch):
    monkeypatch.setenv("KRR_CHOL_BLAS_THREADS", "1")
    g = write_gram(tmp_path / "g", rbf_matrix(200, seed=2), 50)
    called: list = []
    monkeypatch.setattr(TiledArray, "map_tile", lambda *a, **kw: called.append(a))
    set_tile_cache_budget(0)
    try:
        for sched in ("threads", "dask"):
            tile_cholesky(g, 1e-3, store=str(tmp_path / sched), name="chol", scheduler=sched,
                          progress=False)  # fmt: skip
    finally:
        set_tile_cache_budget(DEFAULT_CACHE_BYTES)
        release_tile_cache()
    assert called == []
