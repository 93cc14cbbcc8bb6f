"""Factor tiles read past the page cache (O_DIRECT, DIRECT_FACTOR_READS) are the same
bytes, checked as before, into reused page-aligned buffers; a filesystem that refuses
O_DIRECT gets the ordinary read, and a chunk of the wrong size is still caught."""

from __future__ import annotations

import errno
import os

import numpy as np
import pytest
from test_cholesky import rbf_matrix, write_gram

from pipeline.policy import constants as C
from pipeline.solvers import cholesky_cache, release_tile_cache, tile_cholesky
from pipeline.storage import CorruptTileError, open_tiled_array
from pipeline.storage import buffers as tile_buffers
from pipeline.storage import rawchunks as rc

pytestmark = pytest.mark.skipif(not hasattr(os, "O_DIRECT"), reason="no O_DIRECT here")


def _spy_open(monkeypatch, refuse: bool = False):
    seen = []
    real = os.open

    def spy(path, flags, *a, **k):
        if flags & os.O_DIRECT and not flags & (os.O_WRONLY | os.O_RDWR):
            seen.append(str(path))
            if refuse:
                raise OSError(errno.EINVAL, "O_DIRECT refused (test)")
        return real(path, flags, *a, **k)

    monkeypatch.setattr(os, "open", spy)
    return seen


@pytest.fixture(autouse=True)
def _fresh():
    rc._NO_DIRECT_READ.clear()
    tile_buffers.release()
    yield
    rc._NO_DIRECT_READ.clear()
    tile_buffers.release()


# 4 x 4 float64: 128 bytes, under a page; 100 x 90: 72,000 bytes, a page and a tail;
# 128 x 64: 65,536 bytes, whole pages; (150, 90) in 100-blocks: padded edge chunks
@pytest.mark.parametrize("shape,block", [((10, 10), 4), ((150, 90), 100), ((128, 64), 128)])
def test_direct_reads_give_the_same_bytes(tmp_path, monkeypatch, shape, block):
    full = np.random.default_rng(0).standard_normal(shape)
    a = open_tiled_array(str(tmp_path / "s"), "a", shape, block, np.float64, "fp")
    g = a.grid
    tiles = [(i, j) for i in range(g.n_row_blocks) for j in range(g.n_col_blocks)]
    for i, j in tiles:
        a.write_tile(i, j, full[g.row_slice(i), g.col_slice(j)])
    seen = _spy_open(monkeypatch)
    for i, j in tiles:
        got = a.read_tile(i, j, direct=True)
        np.testing.assert_array_equal(got, full[g.row_slice(i), g.col_slice(j)])
        assert got.flags.writeable and got.flags.c_contiguous
    assert len(seen) == len(tiles)  # every chunk read through O_DIRECT


def test_a_direct_read_lands_in_an_aligned_buffer_that_is_reused(tmp_path):
    full = np.random.default_rng(1).standard_normal((128, 128))
    a = open_tiled_array(str(tmp_path / "s"), "a", (128, 128), 128, np.float64, "fp")
    a.write_tile(0, 0, full)
    t = a.read_tile(0, 0, direct=True)
    assert t.ctypes.data % tile_buffers.ALIGN == 0 and tile_buffers.owns_memory(t)
    addr = t.ctypes.data
    tile_buffers.give(np.zeros((128, 128)), 1 << 30)  # owned, not aligned: not for O_DIRECT
    assert tile_buffers.give(t, 1 << 30)
    del t
    again = a.read_tile(0, 0, direct=True)
    assert again.ctypes.data == addr  # the aligned one, not the other waiting buffer
    np.testing.assert_array_equal(again, full)
    view = again[:64]
    assert not tile_buffers.owns_memory(view)  # a view of it is not a whole buffer


@pytest.mark.parametrize("change", ["longer", "shorter"])
def test_a_chunk_of_the_wrong_size_is_caught_on_a_direct_read(tmp_path, change):
    full = np.random.default_rng(2).standard_normal((100, 90))
    a = open_tiled_array(str(tmp_path / "s"), "a", (100, 90), 100, np.float64, "fp")
    a.write_tile(0, 0, full)
    path = rc.chunk_layout(a.store, "a").path((0, 0))
    data = path.read_bytes()
    path.write_bytes(data + b"\0" * 8 if change == "longer" else data[:-8])
    assert rc.read_chunk(rc.chunk_layout(a.store, "a"), (0, 0), direct=True) is None
    with pytest.raises(CorruptTileError, match="bytes, not 72000"):
        a.read_tile(0, 0, direct=True)


def test_a_filesystem_that_refuses_o_direct_gets_the_ordinary_read(tmp_path, monkeypatch):
    full = np.random.default_rng(3).standard_normal((20, 20))
    a = open_tiled_array(str(tmp_path / "s"), "a", (20, 20), 8, np.float64, "fp")
    for i in range(3):
        for j in range(3):
            a.write_tile(i, j, full[8 * i : 8 * i + 8, 8 * j : 8 * j + 8])
    seen = _spy_open(monkeypatch, refuse=True)
    for i in range(3):
        for j in range(3):
            got = a.read_tile(i, j, direct=True)
            np.testing.assert_array_equal(got, full[8 * i : 8 * i + 8, 8 * j : 8 * j + 8])
    assert len(seen) == 1  # refused once, then remembered for this filesystem


@pytest.mark.parametrize("scheduler", ["threads", "dask"])
def test_the_factor_reads_its_tiles_directly_and_keeps_its_bits(tmp_path, monkeypatch, scheduler):
    """With a tile cache of two tiles the factorisation reads finished factor tiles back:
    through O_DIRECT with DIRECT_FACTOR_READS, through the page cache without, and
    the factor is the same bit for bit."""
    K = rbf_matrix(300, seed=5)  # 6 x 6 tiles of 50
    g = write_gram(tmp_path / "g", K, 50)
    old_budget = cholesky_cache._CACHE.budget
    direct_reads = []
    real = rc._read_direct
    monkeypatch.setattr(rc, "_read_direct", lambda p, b: direct_reads.append(p) or real(p, b))
    try:
        cholesky_cache.set_tile_cache_budget(2 * 50 * 50 * 8)
        monkeypatch.setattr(C, "DIRECT_FACTOR_READS", False)
        ref = tile_cholesky(g, 1e-2, store=str(tmp_path / "a"), scheduler=scheduler,
                            progress=False)  # fmt: skip
        assert direct_reads == []
        release_tile_cache()
        monkeypatch.setattr(C, "DIRECT_FACTOR_READS", True)
        got = tile_cholesky(g, 1e-2, store=str(tmp_path / "b"), scheduler=scheduler,
                            progress=False)  # fmt: skip
        assert len(direct_reads) > 6  # factor tiles read back, each past the page cache
        assert all("/b/" in str(p) for p in direct_reads)  # factor tiles, no Gram tile
        np.testing.assert_array_equal(got.L.zarr("r")[:], ref.L.zarr("r")[:])
    finally:
        cholesky_cache.set_tile_cache_budget(old_budget)
        release_tile_cache()
