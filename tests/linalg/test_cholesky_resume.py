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

import pipeline.linalg.cholesky as chol
from pipeline.linalg.cholesky import tile_cholesky
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
    import pipeline.linalg.cholesky as chol
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


def test_an_in_place_factor_killed_between_chunk_and_marker_leaves_no_stale_marker(
    tmp_path, monkeypatch
):
    # lambda 1 factored in place; lambda 2 killed after it replaced a chunk but before its
    # marker: the tile kept lambda 1's marker over lambda 2's bytes, and every later
    # lambda 1 run raised CorruptTileError (session 25)
    from pipeline.kernels import make_kernel
    from pipeline.linalg.cholesky import load_factor
    from pipeline.linalg.cholesky_cache import release_tile_cache
    from pipeline.linalg.cholesky_inplace import GramTileRecomputer
    from pipeline.linalg.gram import build_gram
    from pipeline.linalg.triangular import cholesky_solve
    from pipeline.storage.markers import TileMarkers

    rng = np.random.default_rng(0)
    X, y = rng.standard_normal((300, 3)), rng.standard_normal((300, 2))
    kern = make_kernel("rbf")
    want = np.linalg.solve(kern(X) + 1e-2 * np.eye(300), y)
    g = build_gram(X, kern, str(tmp_path), 64, progress=False)
    kw = dict(keep_gram=False, recompute_tile=GramTileRecomputer.for_gram(g, X, kern),
              progress=False, scheduler="threads", n_threads=1)  # fmt: skip
    first = tile_cholesky(g, 1e-2, **kw)
    mark, calls = TileMarkers.mark, {"n": 0}

    def dying_mark(self, tile, **info):  # lambda 2's second factor marker: killed
        if self.fingerprint not in (g.fingerprint, first.L.fingerprint) and not (
            self.name.endswith("~inplace")
        ):
            calls["n"] += 1
            if calls["n"] > 1:
                raise KeyboardInterrupt("killed")
        return mark(self, tile, **info)

    monkeypatch.setattr(TileMarkers, "mark", dying_mark)
    with pytest.raises(KeyboardInterrupt):
        tile_cholesky(g, 3e-1, **kw)
    monkeypatch.setattr(TileMarkers, "mark", mark)
    release_tile_cache()
    again = tile_cholesky(g, 1e-2, **kw)
    assert again.computed  # the replaced tiles were recomputed, none read as corrupt
    for f in (again, load_factor(str(tmp_path), "gram")):
        alpha = cholesky_solve(f, y)
        assert np.linalg.norm(alpha - want) / np.linalg.norm(want) < 1e-10
