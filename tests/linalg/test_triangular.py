"""Blockwise forward/back substitution with the stored factor (pipeline.linalg.triangular)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg
from _tiles import rbf_matrix, rel, write_gram

from pipeline.engine import where
from pipeline.linalg.cholesky import tile_cholesky
from pipeline.linalg.triangular import back_substitution, cholesky_solve, forward_substitution


@pytest.mark.parametrize("n, block_size", [(211, 64), (150, 50), (77, 100), (260, 33)])
@pytest.mark.parametrize("convention", ["sklearn", "n"])
@pytest.mark.parametrize("n_outputs", [None, 1, 3])
def test_solve_matches_reference_dual_solve(tmp_path, n, block_size, convention, n_outputs):
    K = rbf_matrix(n, seed=n)
    rng = np.random.default_rng(1)
    y = rng.standard_normal(n if n_outputs is None else (n, n_outputs))
    lam = 1e-3 if convention == "sklearn" else 1e-5
    shift = lam if convention == "sklearn" else n * lam
    f = tile_cholesky(write_gram(tmp_path, K, block_size), lam, convention=convention)
    alpha = cholesky_solve(f, y)
    ref = scipy.linalg.solve(K + shift * np.eye(n), y, assume_a="pos")
    assert alpha.shape == y.shape and alpha.dtype == np.float64
    assert rel(alpha, ref) < 1e-10


def test_forward_and_back_are_the_triangular_solves(tmp_path):
    n, b = 180, 47
    K = rbf_matrix(n)
    f = tile_cholesky(write_gram(tmp_path, K, b), 1e-2)
    L = scipy.linalg.cholesky(K + 1e-2 * np.eye(n), lower=True)
    y = np.random.default_rng(0).standard_normal((n, 2))
    z = forward_substitution(f, y)
    assert rel(z, scipy.linalg.solve_triangular(L, y, lower=True)) < 1e-10
    a = back_substitution(f.L, z)  # a bare TiledArray works too
    assert rel(a, scipy.linalg.solve_triangular(L.T, z, lower=False)) < 1e-10
    np.testing.assert_array_equal(y, np.random.default_rng(0).standard_normal((n, 2)))


def test_alpha_written_to_zarr(tmp_path):
    import zarr

    n, b = 130, 40
    K = rbf_matrix(n)
    f = tile_cholesky(write_gram(tmp_path, K, b), 1e-2)
    y = np.random.default_rng(2).standard_normal((n, 4))
    alpha = cholesky_solve(f, y, name="alpha")
    arr = zarr.open_array(store=str(tmp_path), path="alpha", mode="r")
    assert arr.shape == (n, 4) and arr.chunks == (b, 4)
    np.testing.assert_array_equal(arr[:], alpha)
    fp = arr.attrs["fingerprint"]
    assert fp != f.L.fingerprint
    cholesky_solve(f, 2 * y, name="alpha")  # other targets: other fingerprint, replaced
    arr = zarr.open_array(store=str(tmp_path), path="alpha", mode="r")
    assert arr.attrs["fingerprint"] != fp
    np.testing.assert_allclose(arr[:], 2 * alpha, rtol=1e-12)


def test_one_d_y_stored_as_column(tmp_path):
    import zarr

    n = 90
    f = tile_cholesky(write_gram(tmp_path, rbf_matrix(n), 32), 1e-2)
    y = np.linspace(-1, 1, n)
    alpha = cholesky_solve(f, y, name="alpha")
    arr = zarr.open_array(store=str(tmp_path), path="alpha", mode="r")
    assert alpha.shape == (n,) and arr.shape == (n, 1)
    np.testing.assert_array_equal(arr[:, 0], alpha)


@pytest.mark.parametrize(
    "y, match",
    [
        (np.ones(59), "y has 59 rows but the factor is 60 x 60"),
        (np.ones((60, 2, 2)), "1-D or 2-D"),
        (np.r_[np.ones(59), np.nan], "NaN"),
    ],
)
def test_bad_y(tmp_path, y, match):
    f = tile_cholesky(write_gram(tmp_path, rbf_matrix(60), 25), 1e-2)
    with pytest.raises(ValueError, match=match):
        cholesky_solve(f, y)


def test_solve_releases_the_factor_tile_cache(tmp_path):
    import pipeline.linalg.cholesky as chol

    f = tile_cholesky(write_gram(tmp_path, rbf_matrix(100), 30), 1e-2)
    keys = [k for k in chol._CACHE._d if k[:3] == (f.L.store, f.L.name, f.L.fingerprint)]
    assert keys, "the factorisation leaves its tiles cached for the solve"
    alpha = cholesky_solve(f, np.ones(100))
    assert not [k for k in chol._CACHE._d if k[:3] == (f.L.store, f.L.name, f.L.fingerprint)]
    # without the cache the tiles come from Zarr: same answer
    np.testing.assert_array_equal(cholesky_solve(f, np.ones(100)), alpha)


def test_tile_cache_budget_is_respected():
    from pipeline.linalg.cholesky_cache import _TileCache

    c = _TileCache(budget=3 * 800)
    for k in range(5):
        c.put(("s", k), np.zeros(100))  # 800 bytes each
    assert c.nbytes <= 3 * 800 and c.get(("s", 0)) is None and c.get(("s", 4)) is not None
    c.drop(("s",))
    assert c.nbytes == 0


def _serial_forward(L, z, start=0):
    """The serial tile loop the sweeps replaced (row by row, updates in increasing k)."""
    g = L.grid
    r0 = g.row_slice(start).start
    for i in range(start, g.n_row_blocks):
        si = g.row_slice(i)
        acc = z[si.start - r0 : si.stop - r0].copy()
        for k in range(start, i):
            sk = g.row_slice(k)
            acc -= L.read_tile(i, k) @ z[sk.start - r0 : sk.stop - r0]
        lii = L.read_tile(i, i)
        z[si.start - r0 : si.stop - r0] = scipy.linalg.solve_triangular(lii, acc, lower=True)
    return z


@pytest.mark.parametrize("threads", [1, 2, 5])
@pytest.mark.parametrize("n, b, start", [(230, 40, 0), (230, 40, 2), (97, 97, 0), (301, 64, 4)])
def test_sweeps_on_the_dag_executor_are_bitwise_stable(tmp_path, monkeypatch, threads, n, b, start):
    """The forward and back sweeps run as tile DAGs on the engine's executor: the same
    bits whatever the thread count, the serial tile loop's values."""
    from pipeline.linalg import triangular

    f = tile_cholesky(write_gram(tmp_path, rbf_matrix(n, seed=3), b), 1e-2)
    r0 = f.L.grid.row_slice(start).start
    z0 = np.random.default_rng(4).standard_normal((n - r0, 3))
    monkeypatch.setattr(where, "sweep_threads", lambda: 1)
    z1 = triangular.forward_sweep(f.L, z0.copy(), start)
    a1 = triangular.back_sweep(f.L, np.vstack([np.zeros((r0, 3)), z1]))
    monkeypatch.setattr(where, "sweep_threads", lambda: threads)
    zt = triangular.forward_sweep(f.L, z0.copy(), start)
    at = triangular.back_sweep(f.L, np.vstack([np.zeros((r0, 3)), zt]))
    np.testing.assert_array_equal(zt, z1)
    np.testing.assert_array_equal(at, a1)
    np.testing.assert_allclose(zt, _serial_forward(f.L, z0.copy(), start), rtol=1e-12, atol=1e-12)
    Ld = np.zeros((n, n))
    for i, j in f.L.grid.lower_tiles():
        Ld[f.L.grid.row_slice(i), f.L.grid.col_slice(j)] = f.L.read_tile(i, j)
    ref = scipy.linalg.solve_triangular(Ld.T, np.vstack([np.zeros((r0, 3)), z1]), lower=False)
    assert rel(at, ref) < 1e-10


def test_sweeps_run_tiles_in_parallel(tmp_path, monkeypatch):
    """With two threads, tasks of different tile rows overlap (a DAG, not a loop)."""
    import threading
    import time

    from pipeline.linalg import triangular

    f = tile_cholesky(write_gram(tmp_path, rbf_matrix(240, seed=5), 30), 1e-2)
    monkeypatch.setattr(where, "sweep_threads", lambda: 2)
    real_run_dag = triangular.run_dag
    state = {"now": 0, "most": 0, "tasks": 0}
    lock = threading.Lock()

    def watched_run_dag(keys, deps, run, **kw):
        def slow(t):
            with lock:
                state["now"] += 1
                state["tasks"] += 1
                state["most"] = max(state["most"], state["now"])
            time.sleep(0.005)
            try:
                return run(t)
            finally:
                with lock:
                    state["now"] -= 1

        return real_run_dag(keys, deps, slow, **kw)

    monkeypatch.setattr(triangular, "run_dag", watched_run_dag)
    z = np.random.default_rng(6).standard_normal((240, 2))
    serial = _serial_forward(f.L, z.copy())
    out = triangular.forward_sweep(f.L, z.copy())
    np.testing.assert_allclose(out, serial, rtol=1e-12, atol=1e-12)
    assert state["tasks"] == 8 * 9 // 2  # one task per lower tile
    assert state["most"] == 2  # row updates ran beside the critical path


@pytest.mark.parametrize("lane", [1, 2, 256])
def test_sweep_lanes_share_tile_reads_and_skip_zero_rows(tmp_path, monkeypatch, lane):
    """Wide right-hand sides are cut into lanes (independent DAGs run in parallel): each
    factor tile is still read once per sweep, a lane whose columns are zero above some
    tile row starts there, and the values are those of the dense triangular solve."""
    from pipeline.linalg import triangular

    n, b = 233, 40
    f = tile_cholesky(write_gram(tmp_path, rbf_matrix(n, seed=7), b), 1e-2)
    Ld = np.zeros((n, n))
    for i, j in f.L.grid.lower_tiles():
        Ld[f.L.grid.row_slice(i), f.L.grid.col_slice(j)] = f.L.read_tile(i, j)
    monkeypatch.setattr(triangular, "SWEEP_LANE_COLUMNS", lane)
    reads = []
    real = triangular._read_factor_tile
    monkeypatch.setattr(
        triangular, "_read_factor_tile", lambda L, i, k: (reads.append((i, k)), real(L, i, k))[1]
    )
    cols = np.array([150, 90, 151, 232, 120])  # identity columns, unsorted, none above 80
    E = np.zeros((n, cols.size))
    E[cols, np.arange(cols.size)] = 1.0
    first = np.argmax(E != 0, axis=0)
    stats: dict = {}
    z = triangular.forward_sweep(f.L, E.copy(), 0, first, stats)
    assert rel(z, scipy.linalg.solve_triangular(Ld, E, lower=True)) < 1e-10
    assert sorted(reads) == sorted(set(reads))  # once each
    assert stats["factor_tile_reads"] == len(reads)  # the tiles actually read
    # the sweep started at tile row 0, but no lane needs the tiles left of column 80
    assert reads and all(k >= 80 // b for _, k in reads)
    reads.clear()
    a = triangular.back_sweep(f.L, z.copy())
    assert rel(a, scipy.linalg.solve_triangular(Ld.T, z, lower=False)) < 1e-10
    assert sorted(reads) == sorted(set(reads)) and len(reads) == len(list(f.L.grid.lower_tiles()))
    monkeypatch.setattr(where, "sweep_threads", lambda: 1)
    np.testing.assert_array_equal(triangular.forward_sweep(f.L, E.copy(), 0, first), z)


def test_loo_panels_count_the_tiles_they_read(tmp_path):
    """inverse_diagonal's panels report the factor tiles their sweeps read: each panel
    reads the lower tiles from its first tile row on, once (lanes share them)."""
    from pipeline.linalg import triangular
    from pipeline.models.selection.loo import inverse_diagonal

    n, b = 300, 30
    K = rbf_matrix(n, seed=9)
    f = tile_cholesky(write_gram(tmp_path, K, b), 1e-2)
    stats: dict = {}
    lane = triangular.SWEEP_LANE_COLUMNS
    try:
        triangular.SWEEP_LANE_COLUMNS = b  # one lane per tile column
        d = inverse_diagonal(f, panel_bytes=8 * n * b * 3, stats=stats)  # 3 blocks a panel
    finally:
        triangular.SWEEP_LANE_COLUMNS = lane
    np.testing.assert_allclose(d, np.diag(np.linalg.inv(K + 1e-2 * np.eye(n))), rtol=1e-9)
    T = n // b
    assert stats["factor_tile_reads"] == sum((T - j) * (T - j + 1) // 2 for j in (0, 3, 6, 9))
