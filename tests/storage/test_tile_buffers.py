"""Reused tile buffers (pipeline.storage.buffers) and the factor-tile cache's recycling."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.storage import buffers, rawchunks


@pytest.fixture(autouse=True)
def _empty_pool():
    buffers.release()
    yield
    buffers.release()


def test_take_reuses_what_was_given_within_the_cap():
    a = np.ones((4, 5))
    assert buffers.give(a, max_bytes=a.nbytes)
    assert buffers.waiting_bytes() == a.nbytes
    assert not buffers.give(np.ones((4, 5)), max_bytes=a.nbytes)  # over the cap
    b = buffers.take((4, 5), np.float64)
    assert b is a and b.flags.writeable and buffers.waiting_bytes() == 0
    c = buffers.take((4, 5), np.float64)  # nothing waits: a new array
    assert c is not a and c.shape == (4, 5)
    assert buffers.take((5, 4), np.float64) is not a  # shape and dtype must match


def test_views_and_borrowed_memory_are_never_kept():
    base = np.zeros((8, 8))
    assert not buffers.give(base[:4], max_bytes=1 << 20)
    assert not buffers.give(np.asfortranarray(np.zeros((3, 4))), max_bytes=1 << 20)
    assert buffers.waiting_bytes() == 0


def test_factor_with_a_small_cache_recycles_and_keeps_its_bits(tmp_path, monkeypatch):
    """A tile cache of two tiles evicts during the factorisation: evicted tiles nothing
    holds go to the next reads. The factor is the same bit for bit as without reuse."""
    from test_triangular import rbf_matrix, write_gram

    from pipeline.linalg import cholesky_cache
    from pipeline.linalg.cholesky import tile_cholesky

    n, b = 300, 50
    g = write_gram(tmp_path / "g", rbf_matrix(n, seed=11), b)
    old_budget = cholesky_cache._CACHE.budget
    try:
        cholesky_cache.set_tile_cache_budget(2 * b * b * 8)
        monkeypatch.setattr(cholesky_cache, "TILE_BUFFER_POOL_BYTES", 0)  # no reuse
        ref = tile_cholesky(g, 1e-2, store=str(tmp_path / "a"), progress=False)
        ref_tiles = {t: ref.L.read_tile(*t) for t in ref.L.grid.lower_tiles()}
        cholesky_cache.release_tile_cache()
        monkeypatch.setattr(cholesky_cache, "TILE_BUFFER_POOL_BYTES", 4 * b * b * 8)
        taken = []
        real_take = rawchunks.tile_buffers.take

        def counting_take(shape, dtype, first_touch=None):
            had = buffers.waiting_bytes()
            arr = real_take(shape, dtype, first_touch)
            taken.append(buffers.waiting_bytes() < had)  # True: a reused buffer
            return arr

        monkeypatch.setattr(rawchunks.tile_buffers, "take", counting_take)
        for sched in ("threads", "dask"):
            got = tile_cholesky(g, 1e-2, store=str(tmp_path / sched), progress=False,
                                scheduler=sched)  # fmt: skip
            for t, tile in ref_tiles.items():
                np.testing.assert_array_equal(got.L.read_tile(*t), tile)
            cholesky_cache.release_tile_cache()
        assert any(taken), "no tile read reused an evicted tile's memory"
        assert buffers.waiting_bytes() == 0  # released with the cache
    finally:
        cholesky_cache.set_tile_cache_budget(old_budget)


def test_evicted_tiles_that_a_task_still_read_are_recycled_once_it_is_done(tmp_path, monkeypatch):
    """A factor tile evicted while a task still reads it gives its buffer to the pool
    once the task lets it go (RECYCLE_HELD_EVICTIONS), not back to the system: fewer
    reads land in new memory, and the factor keeps its bits."""
    from test_triangular import rbf_matrix, write_gram

    import pipeline.constants as policy_constants
    from pipeline.linalg import cholesky_cache
    from pipeline.linalg.cholesky import tile_cholesky

    n, b = 600, 50  # 12 x 12 tiles, a cache of 4 tiles and a pool of 3
    g = write_gram(tmp_path / "g", rbf_matrix(n, seed=12), b)
    old_budget = cholesky_cache._CACHE.budget
    real_take = rawchunks.tile_buffers.take
    counts = {}

    def run(recycle):
        monkeypatch.setattr(policy_constants, "RECYCLE_HELD_EVICTIONS", recycle)
        new = []

        def counting_take(shape, dtype, first_touch=None):
            had = buffers.waiting_bytes()
            arr = real_take(shape, dtype, first_touch)
            new.append(buffers.waiting_bytes() >= had)  # True: nothing reused
            return arr

        monkeypatch.setattr(rawchunks.tile_buffers, "take", counting_take)
        f = tile_cholesky(g, 1e-2, store=str(tmp_path / str(recycle)), progress=False,
                          n_threads=2)  # fmt: skip
        counts[recycle] = sum(new)
        tiles = {t: f.L.read_tile(*t) for t in f.L.grid.lower_tiles()}
        cholesky_cache.release_tile_cache(f)  # this factor's tiles only
        assert cholesky_cache._CACHE._held == []  # released with them: no memory kept
        cholesky_cache.release_tile_cache()
        return tiles

    try:
        cholesky_cache.set_tile_cache_budget(4 * b * b * 8)
        monkeypatch.setattr(cholesky_cache, "TILE_BUFFER_POOL_BYTES", 3 * b * b * 8)
        before, after = run(False), run(True)
    finally:
        cholesky_cache.set_tile_cache_budget(old_budget)
        cholesky_cache.release_tile_cache()
    for t, tile in before.items():
        np.testing.assert_array_equal(after[t], tile)
    assert counts[True] < counts[False], counts
