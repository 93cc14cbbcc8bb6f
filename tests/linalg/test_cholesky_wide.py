"""The "wide" threads executor (every BLAS call on all cores, one at a time).

Multi-threaded OpenBLAS rounds differently from single-threaded (measured here:
differences of 1e-13 on 49% of the entries), so wide equals narrow to rounding,
and wide equals wide bit for bit (a rerun, or the Dask executor, with the same
BLAS thread count reproduces it).
"""

from __future__ import annotations

import threading

import numpy as np

from pipeline.engine import blas
from pipeline.linalg.cholesky import tile_cholesky
from pipeline.storage import fingerprint_obj, open_tiled_array

N, B, LAM = 800, 200, 1e-3


def _gram(store):
    X = np.random.default_rng(5).standard_normal((N, 4))
    d = (X**2).sum(1)[:, None] + (X**2).sum(1)[None, :] - 2 * X @ X.T
    K = np.exp(-0.4 * np.maximum(d, 0))
    g = open_tiled_array(str(store), "gram", (N, N), B, np.float64, fingerprint_obj(["wide"]))
    for i, j in g.grid.lower_tiles():
        g.write_tile(i, j, K[g.grid.row_slice(i), g.grid.col_slice(j)])
    return g


def _dense(f):
    g = f.L.grid
    L = np.zeros((N, N))
    for i, j in g.lower_tiles():
        L[g.row_slice(i), g.col_slice(j)] = f.L.read_tile(i, j)
    return L


def test_wide_reproducible_and_equal_to_narrow(tmp_path, monkeypatch):
    gram = _gram(tmp_path / "g")
    narrow = tile_cholesky(gram, LAM, name="n", scheduler="threads", progress=False)
    dsk = tile_cholesky(gram, LAM, name="d", scheduler="dask", progress=False)
    seen = []
    orig = blas.serialized

    def spy():
        seen.append(True)
        return orig()

    monkeypatch.setattr(blas, "serialized", spy)
    wide = tile_cholesky(
        gram, LAM, name="w", scheduler="threads", n_threads=2, wide=True, progress=False
    )
    assert seen, "wide=True did not serialise the BLAS calls"
    np.testing.assert_allclose(_dense(wide), _dense(narrow), rtol=0, atol=1e-11)
    np.testing.assert_array_equal(_dense(narrow), _dense(dsk))
    again = tile_cholesky(
        gram, LAM, name="w2", scheduler="threads", n_threads=2, wide=True, progress=False
    )
    np.testing.assert_array_equal(_dense(wide), _dense(again))


def test_serialized_runs_one_blas_call_at_a_time(monkeypatch):
    active, peak = [0], [0]
    lock = threading.Lock()
    real = blas._routine

    def routine(name):
        fn = real(name)

        def call(*args):
            with lock:
                active[0] += 1
                peak[0] = max(peak[0], active[0])
            try:
                fn(*args)
            finally:
                with lock:
                    active[0] -= 1

        return call

    monkeypatch.setattr(blas, "_routine", routine)
    a = np.random.default_rng(0).standard_normal((300, 300))

    def work():
        for _ in range(5):
            blas.gemm_nt_sub(np.zeros((300, 300)), a, a)

    with blas.serialized():
        ts = [threading.Thread(target=work) for _ in range(3)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    assert peak[0] == 1
    assert blas._SERIAL is None
