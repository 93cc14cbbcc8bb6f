"""Every tile task runs its BLAS with one fixed thread count, whatever the executor.

OpenBLAS rounds differently with 1 and 2 threads (GEMM, TRSM and POTRF of a
400-tile differ in the last bits), so the factor's bits are defined by that one
width (``KRR_CHOL_BLAS_THREADS``, default all cores; ``wide=False``: 1): the
"threads" executor with any number of tile threads and the "dask" executor give
the same factor bit for bit, with every width.
"""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.linalg.cholesky import tile_cholesky
from pipeline.storage import fingerprint_obj, open_tiled_array

N, B, LAM = 1200, 400, 1e-3


@pytest.fixture(scope="module")
def gram(tmp_path_factory):
    store = tmp_path_factory.mktemp("width") / "g"
    X = np.random.default_rng(7).standard_normal((N, 5))
    d = (X**2).sum(1)[:, None] + (X**2).sum(1)[None, :] - 2 * X @ X.T
    K = np.exp(-0.3 * np.maximum(d, 0))
    g = open_tiled_array(str(store), "gram", (N, N), B, np.float64, fingerprint_obj(["width"]))
    for i, j in g.grid.lower_tiles():
        g.write_tile(i, j, K[g.grid.row_slice(i), g.grid.col_slice(j)])
    return g


def _dense(f):
    g = f.L.grid
    L = np.zeros(f.L.shape)
    for i, j in g.lower_tiles():
        L[g.row_slice(i), g.col_slice(j)] = f.L.read_tile(i, j)
    return L


@pytest.mark.parametrize("width", ["1", "2"])
def test_same_bits_for_every_executor_and_thread_count(gram, tmp_path, monkeypatch, width):
    monkeypatch.setenv("KRR_CHOL_BLAS_THREADS", width)
    runs = {
        f"t{n}": tile_cholesky(
            gram,
            LAM,
            store=str(tmp_path),
            name=f"t{n}",
            scheduler="threads",
            n_threads=n,
            progress=False,
        )
        for n in (1, 2, 3)
    }
    runs["dask"] = tile_cholesky(
        gram, LAM, store=str(tmp_path), name="d", scheduler="dask", progress=False
    )
    ref = _dense(runs["t1"])
    for name, f in runs.items():
        np.testing.assert_array_equal(_dense(f), ref, err_msg=name)


def test_widths_differ_in_rounding_only(gram, tmp_path, monkeypatch):
    monkeypatch.setenv("KRR_CHOL_BLAS_THREADS", "1")
    one = _dense(tile_cholesky(gram, LAM, store=str(tmp_path), name="a", progress=False))
    monkeypatch.setenv("KRR_CHOL_BLAS_THREADS", "2")
    two = _dense(tile_cholesky(gram, LAM, store=str(tmp_path), name="b", progress=False))
    np.testing.assert_allclose(one, two, rtol=0, atol=1e-10)
    # the width matters, so the test above is not vacuous at this tile size
    assert not np.array_equal(one, two)


def test_bad_width_is_a_clear_error(gram, tmp_path, monkeypatch):
    monkeypatch.setenv("KRR_CHOL_BLAS_THREADS", "two")
    with pytest.raises(ValueError, match="KRR_CHOL_BLAS_THREADS must be an integer"):
        tile_cholesky(gram, LAM, store=str(tmp_path), name="x", progress=False)


@pytest.mark.slow
def test_distributed_workers_give_the_same_bits(gram, tmp_path, monkeypatch):
    """Worker processes (which start with one BLAS thread) still run each call at the
    fixed width, queued on the host-wide lock: the same factor as the threads executor."""
    from pipeline.engine.parallel import dask_client

    monkeypatch.setenv("KRR_CHOL_BLAS_THREADS", "2")
    ref = _dense(tile_cholesky(gram, LAM, store=str(tmp_path), name="t", progress=False))
    with dask_client(n_workers=2, memory_limit="1GiB"):
        f = tile_cholesky(
            gram, LAM, store=str(tmp_path), name="w", scheduler="dask", progress=False
        )
    np.testing.assert_array_equal(_dense(f), ref)


def test_gil_free_potrf_matches_scipy_bit_for_bit():
    from scipy.linalg import lapack

    from pipeline.engine import blas
    from pipeline.linalg.cholesky_tile import _potrf_lower

    rng = np.random.default_rng(2)
    X = rng.standard_normal((300, 300))
    A = X @ X.T / 300 + np.eye(300)
    A[np.triu_indices(300, 1)] = 7.0  # only the lower triangle is read
    with blas.fixed_width(1):
        new, info = _potrf_lower(A.copy())
        c, info2 = lapack.dpotrf(A.copy().T, lower=0, clean=1)
    assert info == info2 == 0
    np.testing.assert_array_equal(new, np.ascontiguousarray(c.T))
    assert _potrf_lower(-np.eye(20))[1] == 1  # not PD: LAPACK's info


def test_niced_io_threads_same_bits(gram, tmp_path, monkeypatch):
    """KRR_CHOL_IO_NICE lowers only TileIO's read-ahead/write-behind threads."""
    import os
    import threading

    from pipeline.linalg import cholesky_exec

    ref = _dense(tile_cholesky(gram, LAM, store=str(tmp_path), name="a", progress=False))
    calls = []
    monkeypatch.setattr(
        os, "setpriority", lambda *a: calls.append((threading.current_thread().name, a[-1]))
    )
    monkeypatch.setenv("KRR_CHOL_IO_NICE", "10")
    niced = _dense(tile_cholesky(gram, LAM, store=str(tmp_path), name="b", progress=False))
    np.testing.assert_array_equal(niced, ref)
    names = {n for n, _ in calls}
    assert calls and all(v == 10 for _, v in calls)
    assert any(n.startswith("tile-read") for n in names)
    assert any(n.startswith("tile-write") for n in names)
    assert not any(n.startswith("chol-") for n in names)  # tile threads keep priority
    monkeypatch.setenv("KRR_CHOL_IO_NICE", "-5")
    with pytest.raises(ValueError, match="KRR_CHOL_IO_NICE"):
        cholesky_exec.io_niceness()
