"""A worker's own factor tiles, once written through the page cache, are mapped from it.

On a distributed client a task writes its factor tile through the page cache so that
the other workers of the host can map it (HOST_SHARED_FACTOR_TILES). It used to keep
its private copy in its tile cache too, so every Gram tile it read next went into new
memory (about 2 s of CPU per GB of page faults on the VMs measured). Now its cache
maps the file's pages, and the private copy's memory takes the next read
(SHARE_WRITTEN_TILES, :func:`pipeline.linalg.cholesky_cache.share_written_tile`).
"""

from __future__ import annotations

import mmap
import sys

import numpy as np
import pytest
from _tiles import rbf_matrix, write_gram

import pipeline.constants as policy_constants
from pipeline.linalg.cholesky import tile_cholesky
from pipeline.linalg.cholesky_cache import (
    _CACHE,
    DEFAULT_CACHE_BYTES,
    _cache_key,
    release_tile_cache,
    set_tile_cache_budget,
    share_written_tile,
)
from pipeline.storage import buffers


def _is_mapped(a: np.ndarray) -> bool:
    """Whether ``a``'s memory is a file mapping (its chain of bases ends in an mmap)."""
    while a is not None:
        if isinstance(a, mmap.mmap):
            return True
        a = getattr(a, "base", None)
    return False


@pytest.fixture(autouse=True)
def _clean_cache():
    set_tile_cache_budget(DEFAULT_CACHE_BYTES)  # whatever an earlier test left
    release_tile_cache()
    yield
    set_tile_cache_budget(DEFAULT_CACHE_BYTES)
    release_tile_cache()


def _written(tmp_path, i=1, j=0):
    """A Gram-shaped store with tile (i, j) written through the page cache and cached,
    as a worker's task leaves it; returns (array, the task's private tile)."""
    K = rbf_matrix(130, seed=4)
    g = write_gram(tmp_path / "g", K, 50)  # 3 x 3 tiles, the last 30 wide
    return g, _cached_private_tile(g, K, i, j)


def _cached_private_tile(g, K, i, j):
    # not in _written's frame: creating a Zarr array can leave its caller's frame (and
    # so its locals) referenced for a while, which would count as a second holder
    tile = np.array(K[g.grid.row_slice(i), g.grid.col_slice(j)], order="C")
    g.write_tile(i, j, tile, direct=False)
    tile.flags.writeable = False
    _CACHE.put(_cache_key(g, i, j), tile)
    return tile


def test_the_cache_maps_the_written_tile_and_the_copy_serves_the_next_read(tmp_path):
    g, tile = _written(tmp_path)
    want = tile.copy()
    addr = tile.__array_interface__["data"][0]
    before = buffers.waiting_bytes()
    shared = share_written_tile(g, 1, 0, tile)  # (inside an assert, pytest holds the args)
    assert shared
    cached = _CACHE.get(_cache_key(g, 1, 0))
    assert cached is not tile and _is_mapped(cached) and not _is_mapped(tile)
    assert not cached.flags.writeable
    np.testing.assert_array_equal(cached, want)
    assert buffers.waiting_bytes() == before + tile.nbytes
    del tile
    # the next read of a tile of that shape fills the same memory
    got = g.read_tile(0, 0)
    assert got.__array_interface__["data"][0] == addr
    np.testing.assert_array_equal(got, g.map_tile(0, 0))
    np.testing.assert_array_equal(_CACHE.get(_cache_key(g, 1, 0)), want)


def test_a_copy_someone_else_holds_is_not_reused(tmp_path):
    g, tile = _written(tmp_path)
    other = [tile]  # a second holder (e.g. a reader of the cache)
    before = buffers.waiting_bytes()
    assert sys.getrefcount(tile) > 2
    assert share_written_tile(g, 1, 0, tile)
    assert buffers.waiting_bytes() == before  # not given: it would be overwritten
    assert other[0] is tile and tile.flags.owndata


def test_switched_off_or_unmappable_keeps_the_private_copy(tmp_path, monkeypatch):
    g, tile = _written(tmp_path)
    monkeypatch.setattr(policy_constants, "SHARE_WRITTEN_TILES", False)
    assert not share_written_tile(g, 1, 0, tile)
    assert _CACHE.get(_cache_key(g, 1, 0)) is tile
    monkeypatch.setattr(policy_constants, "SHARE_WRITTEN_TILES", True)
    g2, edge = _written(tmp_path / "edge", 2, 2)  # cut in its columns: never mapped
    assert not share_written_tile(g2, 2, 2, edge)
    assert _CACHE.get(_cache_key(g2, 2, 2)) is edge


def _threads_and_client_factors(tmp_path, K):
    """The factor of ``K`` in tiles of 50 by the threads executor (the reference) and by
    the Dask executor on a LocalCluster of 2 in-process workers: (gram, ref, got)."""
    pytest.importorskip("distributed")
    from distributed import Client, LocalCluster

    g = write_gram(tmp_path / "g", K, 50)
    ref = tile_cholesky(g, 1e-3, store=str(tmp_path / "ref"), name="chol",
                        scheduler="threads", progress=False)  # fmt: skip
    release_tile_cache()
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                     dashboard_address=":0", memory_limit=0) as cluster,
        Client(cluster),
    ):  # fmt: skip
        got = tile_cholesky(g, 1e-3, store=str(tmp_path / "got"), name="chol",
                            scheduler="dask", progress=False)  # fmt: skip
    return g, ref, got


@pytest.mark.parametrize("share", [True, False], ids=["mapped", "private"])
def test_client_factor_caches_its_own_tiles_mapped_with_the_same_bits(tmp_path, monkeypatch, share):
    monkeypatch.setenv("KRR_CHOL_BLAS_THREADS", "1")
    monkeypatch.setattr(policy_constants, "SHARE_WRITTEN_TILES", share)
    # the workers' caches as the tasks left them (in-process workers: this cache)
    monkeypatch.setattr(policy_constants, "RELEASE_WORKER_TILES", False)
    # 5 x 5 tiles of 50, the last 30 wide
    g, ref, got = _threads_and_client_factors(tmp_path, rbf_matrix(230, seed=8))
    lower = list(g.grid.lower_tiles())
    whole = [t for t in lower if t != (4, 4)]  # the last diagonal tile is read
    cached = {t: _CACHE.get(_cache_key(got.L, *t)) for t in lower}
    mapped = {t for t, a in cached.items() if a is not None and _is_mapped(a)}
    # in-process workers share this cache: every tile but the last diagonal one is the
    # file's pages, or none is
    assert mapped == (set(whole) if share else set())
    for t in lower:
        np.testing.assert_array_equal(got.L.read_tile(*t), ref.L.read_tile(*t))
        if cached[t] is not None:
            np.testing.assert_array_equal(cached[t], ref.L.read_tile(*t))


def test_solve_after_a_client_factor_maps_the_tiles_written_through_the_page_cache(
    tmp_path, monkeypatch
):
    """The solve runs in the client's process, whose tile cache is empty: it maps the
    tiles the workers wrote through the page cache (their markers say so) instead of
    reading them into new memory, and gets the same alpha bit for bit."""
    from pipeline.linalg.triangular import cholesky_solve
    from pipeline.storage import TiledArray

    monkeypatch.setenv("KRR_CHOL_BLAS_THREADS", "1")
    K = rbf_matrix(230, seed=9)
    y = np.random.default_rng(2).standard_normal(230)
    g, ref, got = _threads_and_client_factors(tmp_path, K)
    maps: list[tuple[str, int, int]] = []
    real_map = TiledArray.map_tile

    def map_tile(self, i, j=0, *a, **kw):
        out = real_map(self, i, j, *a, **kw)
        if out is not None:
            maps.append((self.store, i, j))
        return out

    monkeypatch.setattr(TiledArray, "map_tile", map_tile)
    lower = list(g.grid.lower_tiles())
    whole = {t for t in lower if t != (4, 4)}  # the last diagonal tile is read
    assert all((got.L.markers.record(t) or {}).get("page_cache") for t in lower)
    assert not any((ref.L.markers.record(t) or {}).get("page_cache") for t in lower)
    release_tile_cache()  # as in a process other than the workers'
    a_ref = cholesky_solve(ref, y)
    assert maps == []  # written past the page cache: read, not mapped
    release_tile_cache()
    a_got = cholesky_solve(got, y)
    assert {(i, j) for _, i, j in maps} == whole
    np.testing.assert_array_equal(a_got, a_ref)
    np.testing.assert_allclose((K + 1e-3 * np.eye(230)) @ a_got, y, rtol=0, atol=1e-8)
