"""The tile Cholesky's Gram reads leave the page cache once read (DROP_READ_PAGE_CACHE).

Each Gram tile is read once per factorisation, so its chunk file's cached pages are
dropped (``POSIX_FADV_DONTNEED``) and the next new read buffer can reuse them: on a
VM whose host reclaims free guest memory, that is cheaper than fresh pages. The
factor's own tiles, which a factorisation may read several times, keep theirs; the
bits do not depend on any of it.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from _tiles import rbf_matrix, write_gram

import pipeline.constants as policy_constants
from pipeline.linalg.cholesky import tile_cholesky
from pipeline.linalg.cholesky_cache import release_tile_cache
from pipeline.storage import TiledArray, rawchunks
from pipeline.storage.rawchunks import chunk_layout, read_chunk

needs_fadvise = pytest.mark.skipif(
    not hasattr(os, "posix_fadvise"), reason="no posix_fadvise on this platform"
)


@pytest.fixture
def advice(monkeypatch):
    """Record every posix_fadvise call as (path of the fd, advice)."""
    calls: list[tuple[str, int]] = []
    real = os.posix_fadvise

    def recording(fd, offset, length, adv):
        calls.append((os.readlink(f"/proc/self/fd/{fd}"), adv))
        return real(fd, offset, length, adv)

    monkeypatch.setattr(os, "posix_fadvise", recording)
    return calls


@needs_fadvise
@pytest.mark.parametrize("drop", [True, False])
def test_read_chunk_drops_the_files_pages_only_when_asked(tmp_path, advice, drop):
    K = rbf_matrix(120, seed=1)
    g = write_gram(tmp_path / "g", K, 50)  # ragged last tiles (120 = 2 * 50 + 20)
    lay = chunk_layout(g.store, g.name)
    assert lay is not None
    for i, j in g.grid.lower_tiles():
        got = read_chunk(lay, (i, j), drop_cache=drop)
        np.testing.assert_array_equal(got, K[g.grid.row_slice(i), g.grid.col_slice(j)])
    n_tiles = len(list(g.grid.lower_tiles()))
    if drop:
        assert len(advice) == n_tiles
        assert all(a == os.POSIX_FADV_DONTNEED for _, a in advice)
        assert {os.path.realpath(p) for p, _ in advice} == {
            os.path.realpath(lay.path(t)) for t in g.grid.lower_tiles()
        }
    else:
        assert advice == []


@needs_fadvise
def test_failed_advice_leaves_the_read_alone(tmp_path, monkeypatch):
    K = rbf_matrix(60, seed=2)
    g = write_gram(tmp_path / "g", K, 30)

    def refuse(*a):
        raise OSError(22, "advice refused")

    monkeypatch.setattr(os, "posix_fadvise", refuse)
    np.testing.assert_array_equal(g.read_tile(1, 0, drop_cache=True), K[30:, :30])


def test_no_fadvise_on_the_platform_is_fine(tmp_path, monkeypatch):
    K = rbf_matrix(60, seed=2)
    g = write_gram(tmp_path / "g", K, 30)
    monkeypatch.delattr(os, "posix_fadvise", raising=False)
    rawchunks._drop_page_cache(0)  # nothing to call: no error
    np.testing.assert_array_equal(g.read_tile(1, 1, drop_cache=True), K[30:, 30:])


@pytest.mark.parametrize("scheduler", ["threads", "dask"])
@pytest.mark.parametrize("keep_gram", [True, False])
def test_factor_drops_each_gram_tile_once_and_keeps_its_bits(
    tmp_path, monkeypatch, scheduler, keep_gram
):
    K = rbf_matrix(260, seed=4)
    reads: list[tuple[str, tuple[int, int], bool]] = []
    real_read = TiledArray.read_tile

    def read_tile(self, i, j=0, *a, **kw):
        reads.append((self.name, (i, j), bool(kw.get("drop_cache", False))))
        return real_read(self, i, j, *a, **kw)

    monkeypatch.setattr(TiledArray, "read_tile", read_tile)
    factors = {}
    for drop in (False, True):
        monkeypatch.setattr(policy_constants, "DROP_READ_PAGE_CACHE", drop)
        g = write_gram(tmp_path / f"g{drop}", K, 60)  # 5 x 5 tiles, the last 20 wide
        reads.clear()
        store = str(tmp_path / f"f{drop}") if keep_gram else None  # in place: the Gram's
        f = tile_cholesky(g, 1e-3, store=store, scheduler=scheduler, keep_gram=keep_gram,
                          progress=False)  # fmt: skip
        lower = sorted(g.grid.lower_tiles())
        dropped = sorted(t for _, t, d in reads if d)
        # each Gram tile is read once for the factor, and only those reads drop pages
        # (in place, the factor's own tiles are read from the same array, keeping theirs)
        assert dropped == (lower if drop else []), reads
        if keep_gram:
            assert sorted(t for name, t, _ in reads if name == "gram") == lower
        factors[drop] = {t: np.array(f.L.read_tile(*t)) for t in lower}
        release_tile_cache()
    for t, tile in factors[True].items():
        np.testing.assert_array_equal(tile, factors[False][t])
    L = np.zeros_like(K)
    for (i, j), tile in factors[True].items():
        L[i * 60 : i * 60 + tile.shape[0], j * 60 : j * 60 + tile.shape[1]] = tile
    L = np.tril(L)
    np.testing.assert_allclose(L @ L.T, K + 1e-3 * np.eye(len(K)), atol=1e-10)
