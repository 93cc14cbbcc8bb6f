"""Factor tiles written past the page cache (O_DIRECT) are the same bytes, and a
filesystem that refuses O_DIRECT gets the ordinary write."""

from __future__ import annotations

import errno
import os

import numpy as np
import pytest
import zarr
from test_cholesky import rbf_matrix, write_gram

from pipeline.linalg.cholesky import tile_cholesky
from pipeline.storage import open_tiled_array
from pipeline.storage import rawchunks as rc

pytestmark = pytest.mark.skipif(not hasattr(os, "O_DIRECT"), reason="no O_DIRECT here")


def _spy_open(monkeypatch, refuse: bool = False):
    seen = []
    real = os.open

    def spy(path, flags, *a, **k):
        if flags & os.O_DIRECT:
            seen.append(str(path))
            if refuse:
                raise OSError(errno.EINVAL, "O_DIRECT refused (test)")
        return real(path, flags, *a, **k)

    monkeypatch.setattr(os, "open", spy)
    return seen


@pytest.fixture(autouse=True)
def _forget_refusals():
    rc._NO_DIRECT.clear()
    yield
    rc._NO_DIRECT.clear()


# 4 x 4 float64: 128 bytes, all tail; 100 x 90: 72,000 bytes, aligned head and a tail;
# 128 x 64: 65,536 bytes, aligned, no tail; (150, 90) in 100-blocks: padded edge chunks
@pytest.mark.parametrize("shape,block", [((10, 10), 4), ((150, 90), 100), ((128, 64), 128)])
def test_direct_writes_store_the_same_bytes(tmp_path, monkeypatch, shape, block):
    full = np.random.default_rng(0).standard_normal(shape)
    a = open_tiled_array(str(tmp_path / "s"), "a", shape, block, np.float64, "fp")
    b = open_tiled_array(str(tmp_path / "s"), "b", shape, block, np.float64, "fp")
    g = a.grid
    tiles = [(i, j) for i in range(g.n_row_blocks) for j in range(g.n_col_blocks)]
    seen = _spy_open(monkeypatch)
    for i, j in tiles:
        reg = (g.row_slice(i), g.col_slice(j))
        a.write_tile(i, j, full[reg], direct=True)
        b.write_tile(i, j, full[reg])
    assert len(seen) == len(tiles)  # every chunk of "a" went through O_DIRECT
    for i, j in tiles:
        pa = rc.chunk_layout(a.store, "a").path((i, j))
        pb = rc.chunk_layout(b.store, "b").path((i, j))
        assert pa.read_bytes() == pb.read_bytes()
        np.testing.assert_array_equal(a.read_tile(i, j), full[g.row_slice(i), g.col_slice(j)])
    np.testing.assert_array_equal(zarr.open_array(store=a.store, path="a", mode="r")[...], full)
    assert not list((tmp_path / "s" / "a").rglob("*.tmp*"))  # no temporary file left


def test_a_filesystem_that_refuses_o_direct_gets_the_ordinary_write(tmp_path, monkeypatch):
    full = np.random.default_rng(1).standard_normal((20, 20))
    a = open_tiled_array(str(tmp_path / "s"), "a", (20, 20), 8, np.float64, "fp")
    seen = _spy_open(monkeypatch, refuse=True)
    for i in range(3):
        for j in range(3):
            a.write_tile(i, j, full[8 * i : 8 * i + 8, 8 * j : 8 * j + 8], direct=True)
    assert len(seen) == 1  # refused once, then remembered for this filesystem
    np.testing.assert_array_equal(zarr.open_array(store=a.store, path="a", mode="r")[...], full)


@pytest.mark.parametrize("scheduler", ["threads", "dask"])
def test_the_factor_is_written_directly_and_unchanged(tmp_path, monkeypatch, scheduler):
    import pipeline.linalg.cholesky as chol

    K = rbf_matrix(300, seed=2)  # 300 x 300 in 128-blocks: aligned heads, tails, edges
    monkeypatch.setattr(chol, "DIRECT_FACTOR_WRITES", False)
    ref = tile_cholesky(write_gram(tmp_path / "a", K, 128), 1e-2, scheduler=scheduler)
    monkeypatch.setattr(chol, "DIRECT_FACTOR_WRITES", True)
    seen = _spy_open(monkeypatch)
    f = tile_cholesky(write_gram(tmp_path / "b", K, 128), 1e-2, scheduler=scheduler)
    assert len(seen) == 6  # the 6 lower tiles of the factor, nothing else
    np.testing.assert_array_equal(f.L.zarr("r")[:], ref.L.zarr("r")[:])  # bit for bit


def test_no_aligned_buffer_outlives_the_factorisation(tmp_path):
    K = rbf_matrix(300, seed=4)
    tile_cholesky(write_gram(tmp_path, K, 128), 1e-2, progress=False)
    assert rc._POOL == []


@pytest.mark.parametrize("past", [True, False])
def test_the_gram_stage_writes_past_the_page_cache_and_the_same_bytes(tmp_path, monkeypatch, past):
    """build_gram writes every tile with O_DIRECT (GRAM_WRITES_PAST_PAGE_CACHE), the
    bytes those through the page cache, and keeps no aligned buffer afterwards."""
    from pipeline import constants as C
    from pipeline.linalg.gram import build_gram

    X = np.random.default_rng(5).standard_normal((230, 6))  # 100-blocks: ragged edge tiles
    ref = build_gram(X, "rbf", str(tmp_path / "ref"), 100, progress=False)
    monkeypatch.setattr(C, "GRAM_WRITES_PAST_PAGE_CACHE", past)
    seen = _spy_open(monkeypatch)
    g = build_gram(X, "rbf", str(tmp_path / "g"), 100, progress=False)
    assert len(seen) == (6 if past else 0)  # the 6 lower tiles, and only with the constant
    for i, j in g.grid.lower_tiles():
        pa = rc.chunk_layout(g.store, "gram").path((i, j))
        pb = rc.chunk_layout(ref.store, "gram").path((i, j))
        assert pa.read_bytes() == pb.read_bytes()
    assert rc._POOL == []
