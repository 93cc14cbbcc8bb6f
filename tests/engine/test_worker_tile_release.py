"""After a factorisation on a distributed client, the workers let go of its tiles.

Each worker's tile cache held up to 1 GiB of the factor's tiles (some of them mapped
files, which keep a deleted store's disk space) and up to TILE_BUFFER_POOL_BYTES of
buffers kept for reuse, for as long as the worker lived: unmanaged memory that Dask's
memory monitor counts against the worker's limit (RELEASE_WORKER_TILES).
"""

from __future__ import annotations

import numpy as np
import pytest
from _tiles import rbf_matrix, write_gram

import pipeline.constants as policy_constants
from pipeline.linalg.cholesky import tile_cholesky
from pipeline.linalg.cholesky_cache import release_tile_cache
from pipeline.linalg.triangular import cholesky_solve


def _held() -> tuple[int, int]:
    """(cached factor-tile bytes, kept buffer bytes) of this worker."""
    from pipeline.linalg.cholesky_cache import _CACHE
    from pipeline.storage import buffers

    return _CACHE.nbytes, buffers.waiting_bytes()


def test_worker_processes_release_the_factor_tiles_and_the_alpha_is_unchanged(
    tmp_path, monkeypatch
):
    pytest.importorskip("distributed")
    from distributed import Client, LocalCluster

    monkeypatch.setenv("KRR_CHOL_BLAS_THREADS", "1")  # inherited by the worker processes
    K = rbf_matrix(230, seed=11)
    y = np.random.default_rng(3).standard_normal(230)
    g = write_gram(tmp_path / "g", K, 50)  # 5 x 5 tiles, the last 30 wide
    ref = tile_cholesky(g, 1e-3, store=str(tmp_path / "ref"), scheduler="threads",
                        progress=False)  # fmt: skip
    want = cholesky_solve(ref, y)
    release_tile_cache()
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                     dashboard_address=":0", memory_limit="1GiB") as cluster,
        Client(cluster) as client,
    ):  # fmt: skip
        monkeypatch.setattr(policy_constants, "RELEASE_WORKER_TILES", False)
        kept = tile_cholesky(g, 1e-3, store=str(tmp_path / "kept"), scheduler="dask",
                             progress=False)  # fmt: skip
        held = client.run(_held)
        assert all(c > 0 for c, _ in held.values())  # without the release: tiles held
        monkeypatch.setattr(policy_constants, "RELEASE_WORKER_TILES", True)
        got = tile_cholesky(g, 1e-3, store=str(tmp_path / "got"), scheduler="dask",
                            progress=False)  # fmt: skip
        after = client.run(_held)
        # this factor's tiles and every kept buffer are gone; only the other factor's
        # tiles (not released: it ran with the switch off) remain
        for w, (c, b) in after.items():
            assert b == 0
            assert c == held[w][0]
        client.run(release_tile_cache)
        assert all(c == 0 for c, _ in client.run(_held).values())
    for f in (kept, got):
        np.testing.assert_array_equal(f.L.zarr("r")[:], ref.L.zarr("r")[:])
    np.testing.assert_array_equal(cholesky_solve(got, y), want)


def test_tasks_reading_their_own_tiles_prefetch_the_next_tile_of_their_row(tmp_path, monkeypatch):
    """On a client (tasks read their own Gram tiles, with no read-ahead threads), task
    (i, j) asks the kernel to read Gram tile (i, j + 1) ahead (POSIX_FADV_WILLNEED);
    the factor's bits do not change (PREFETCH_NEXT_GRAM_TILE)."""
    import os

    pytest.importorskip("distributed")
    if not hasattr(os, "posix_fadvise"):
        pytest.skip("no posix_fadvise here")
    from distributed import Client, LocalCluster

    monkeypatch.setenv("KRR_CHOL_BLAS_THREADS", "1")
    g = write_gram(tmp_path / "g", rbf_matrix(230, seed=12), 50)  # 5 x 5 tiles
    ref = tile_cholesky(g, 1e-3, store=str(tmp_path / "ref"), scheduler="threads",
                        progress=False)  # fmt: skip
    release_tile_cache()
    advised: list[str] = []
    real = os.posix_fadvise

    def spy(fd, offset, length, advice):
        if advice == os.POSIX_FADV_WILLNEED:
            advised.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real(fd, offset, length, advice)

    monkeypatch.setattr(os, "posix_fadvise", spy)
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                     dashboard_address=":0", memory_limit=0) as cluster,
        Client(cluster),
    ):  # fmt: skip
        got = tile_cholesky(g, 1e-3, store=str(tmp_path / "got"), scheduler="dask",
                            progress=False)  # fmt: skip
    gram_dir = os.path.realpath(tmp_path / "g" / "gram")
    coords = sorted(tuple(int(c) for c in p.split("/")[-2:]) for p in advised)
    assert all(os.path.realpath(p).startswith(gram_dir) for p in advised)
    assert coords == sorted((i, j + 1) for i, j in g.grid.lower_tiles() if j < i)
    np.testing.assert_array_equal(got.L.zarr("r")[:], ref.L.zarr("r")[:])
