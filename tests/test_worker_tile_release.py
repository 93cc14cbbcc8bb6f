"""After a factorisation on a distributed client, the workers let go of its tiles.

Each worker's tile cache held up to 1 GiB of the factor's tiles (some of them mapped
files, which keep a deleted store's disk space) and up to TILE_BUFFER_POOL_BYTES of
buffers kept for reuse, for as long as the worker lived: unmanaged memory that Dask's
memory monitor counts against the worker's limit (RELEASE_WORKER_TILES).
"""

from __future__ import annotations

import numpy as np
import pytest
from test_triangular import rbf_matrix, write_gram

import pipeline.policy.constants as policy_constants
from pipeline.solvers import cholesky_solve, release_tile_cache, tile_cholesky


def _held() -> tuple[int, int]:
    """(cached factor-tile bytes, kept buffer bytes) of this worker."""
    from pipeline.solvers.cholesky_cache import _CACHE
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
