"""Resume of the tile Cholesky after a SIGKILL: no finished tile recomputed, identical L."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import pipeline.solvers.cholesky as chol
from pipeline.solvers import tile_cholesky
from pipeline.storage import fingerprint_obj, open_tiled_array

N, B, LAM = 480, 60, 1e-3  # 8 x 8 tiles: 36 factor tiles


def write_gram(store):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((N, 4))
    sq = (X**2).sum(1)
    K = np.exp(-0.3 * np.maximum(sq[:, None] + sq[None, :] - 2 * X @ X.T, 0))
    g = open_tiled_array(str(store), "gram", (N, N), B, np.float64, fingerprint_obj(["resume"]))
    for i, j in g.grid.lower_tiles():
        g.write_tile(i, j, K[g.grid.row_slice(i), g.grid.col_slice(j)])
    return g


CHILD = textwrap.dedent(
    """
    import sys, time, zarr, numpy as np
    import pipeline.solvers.cholesky as chol
    from pipeline.storage import TiledArray
    store, scheduler = sys.argv[1], sys.argv[2]
    a = zarr.open_array(store=store, path="gram", mode="r")
    gram = TiledArray(store, "gram", tuple(a.shape), int(a.attrs["block_size"]),
                      np.dtype(a.dtype).str, a.attrs["fingerprint"])
    slow = chol._factor_tile
    def slowed(*args, **kw):  # give the parent time to kill us mid-run
        time.sleep(0.15)
        return slow(*args, **kw)
    chol._factor_tile = slowed
    print("started", flush=True)
    chol.tile_cholesky(gram, LAMBDA, scheduler=scheduler, progress=False)
    print("finished", flush=True)
    """
).replace("LAMBDA", repr(LAM))


@pytest.mark.slow
@pytest.mark.parametrize("scheduler", ["threads", "dask"])
def test_sigkill_then_resume(tmp_path, scheduler, monkeypatch):
    gram = write_gram(tmp_path / "run")
    total = gram.grid.n_lower_tiles()
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, gram.store, scheduler],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    fp = chol.factor_fingerprint(gram, LAM, "sklearn", None, np.float64)
    markers = open_tiled_array(gram.store, "chol", (N, N), B, np.float64, fp).markers
    deadline = time.monotonic() + 120
    try:
        while len(markers.done()) < 8:
            assert proc.poll() is None, f"child ended early: {proc.communicate()}"
            assert time.monotonic() < deadline, "child made no progress"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    done_before = markers.done()
    assert 8 <= len(done_before) < total

    calls: list[tuple[int, int]] = []
    real = chol._factor_tile

    def counting(gram_, L_, i, j, *args, **kw):
        calls.append((i, j))
        return real(gram_, L_, i, j, *args, **kw)

    monkeypatch.setattr(chol, "_factor_tile", counting)
    chol._CACHE.clear()
    f = tile_cholesky(gram, LAM, scheduler=scheduler, progress=False)
    assert not set(calls) & done_before, "a completed tile was recomputed"
    assert len(calls) == total - len(done_before) == len(f.computed)
    assert f.L.markers.done() == set(gram.grid.lower_tiles())

    # identical to an uninterrupted run from scratch
    monkeypatch.setattr(chol, "_factor_tile", real)
    chol._CACHE.clear()
    ref = tile_cholesky(write_gram(tmp_path / "ref"), LAM, scheduler=scheduler, progress=False)
    np.testing.assert_array_equal(f.L.zarr("r")[:], ref.L.zarr("r")[:])

    # a third call recomputes nothing
    again = tile_cholesky(gram, LAM, scheduler=scheduler, progress=False)
    assert again.computed == ()
