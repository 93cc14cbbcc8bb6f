"""keep_gram=False (the factor replaces the Gram in place) and the disk check (issue #15)."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import pipeline.linalg.cholesky_inplace as inplace
from pipeline.engine.backend import get_backend
from pipeline.errors import NotPositiveDefiniteError
from pipeline.linalg.cholesky import load_factor, tile_cholesky
from pipeline.storage import IncompleteArrayError, fingerprint_obj, open_tiled_array

INJECT = Path(__file__).resolve().parents[1] / "faultinject"
N, B, LAM = 300, 60, 1e-3  # 5 x 5 tiles: 15 lower tiles


def _kernel(rows=slice(None), cols=slice(None)):
    X = np.random.default_rng(0).standard_normal((N, 3))
    a, b = X[rows], X[cols]
    d = (a**2).sum(1)[:, None] + (b**2).sum(1)[None, :] - 2 * a @ b.T
    return np.exp(-0.5 * np.maximum(d, 0))


def write_gram(store) -> object:
    K = _kernel()
    g = open_tiled_array(str(store), "gram", (N, N), B, np.float64, fingerprint_obj(["inpl"]))
    for i, j in g.grid.lower_tiles():
        g.write_tile(i, j, K[g.grid.row_slice(i), g.grid.col_slice(j)])
    return g


def recompute(gram):
    def tile(i, j):
        return _kernel(gram.grid.row_slice(i), gram.grid.col_slice(j))

    return tile


def dense_lower(f) -> np.ndarray:
    L = np.zeros((N, N))
    g = f.L.grid
    for i, j in g.lower_tiles():
        L[g.row_slice(i), g.col_slice(j)] = f.L.read_tile(i, j)
    return L


@pytest.mark.parametrize("scheduler", ["threads", "dask"])
def test_in_place_equals_separate_factor(tmp_path, scheduler):
    ref = tile_cholesky(write_gram(tmp_path / "a"), LAM, scheduler=scheduler, progress=False)
    gram = write_gram(tmp_path / "b")
    f = tile_cholesky(gram, LAM, scheduler=scheduler, progress=False, keep_gram=False)
    assert f.L.name == "gram" and len(f.computed) == 15
    np.testing.assert_allclose(dense_lower(f), dense_lower(ref), rtol=0, atol=1e-12)
    np.testing.assert_array_equal(dense_lower(f), dense_lower(ref))  # same tile function
    assert gram.markers.done() == set()  # every tile's marker now says "factor"
    assert not (tmp_path / "b" / "chol").exists()  # no second array
    again = load_factor(gram.store, "gram")
    np.testing.assert_array_equal(dense_lower(again), dense_lower(f))
    # a rerun computes nothing
    assert (
        tile_cholesky(gram, LAM, scheduler=scheduler, progress=False, keep_gram=False).computed
        == ()
    )


def test_new_lambda_after_in_place_rebuilds_gram_tiles(tmp_path, caplog):
    gram = write_gram(tmp_path / "g")
    tile_cholesky(gram, LAM, progress=False, keep_gram=False)
    with pytest.raises(IncompleteArrayError, match="recompute_tile"):
        tile_cholesky(gram, 1e-2, progress=False, keep_gram=False)
    with caplog.at_level(logging.INFO, logger=inplace.__name__):
        f = tile_cholesky(
            gram, 1e-2, progress=False, keep_gram=False, recompute_tile=recompute(gram)
        )
    assert (
        "replaced by an in-place factor" in caplog.text and "recomputing it from X" in caplog.text
    )
    ref = tile_cholesky(write_gram(tmp_path / "r"), 1e-2, progress=False)
    np.testing.assert_allclose(dense_lower(f), dense_lower(ref), rtol=0, atol=1e-12)


def test_failed_jitter_in_place_then_recovered(tmp_path):
    """The last diagonal tile is indefinite: the jitter policy gives up on it after
    the earlier columns' tiles were replaced; the Gram is recomputed from X (here:
    the same function) for the retry with a larger lambda."""
    K = _kernel()
    K[np.diag_indices(N)] -= np.r_[np.zeros(N - B), np.full(B, 2.0)]  # last tile indefinite
    g = open_tiled_array(str(tmp_path / "s"), "gram", (N, N), B, np.float64, "fp-indef")
    for i, j in g.grid.lower_tiles():
        g.write_tile(i, j, K[g.grid.row_slice(i), g.grid.col_slice(j)])
    with pytest.raises(NotPositiveDefiniteError, match=r"\(4, 4\)"):
        tile_cholesky(g, LAM, progress=False, keep_gram=False, jitter={"max_tries": 2})
    assert len(g.markers.done()) == 1  # every Gram tile but (4, 4) was replaced
    with pytest.raises(IncompleteArrayError):  # without X: a clear error, nothing lost
        tile_cholesky(g, 3.0, progress=False, keep_gram=False)
    f = tile_cholesky(
        g,
        3.0,
        progress=False,
        keep_gram=False,
        recompute_tile=lambda i, j: K[g.grid.row_slice(i), g.grid.col_slice(j)],
    )
    Ld = dense_lower(f)
    np.testing.assert_allclose(Ld @ Ld.T, K + 3.0 * np.eye(N), atol=1e-10)


def test_crash_between_chunk_and_marker_is_adopted(tmp_path, monkeypatch):
    """Killed after a factor tile replaced the chunk but before its marker: the
    chunk no longer matches the Gram marker; the intent record lets the rerun
    adopt it (no X needed)."""
    gram = write_gram(tmp_path / "g")
    ref = tile_cholesky(write_gram(tmp_path / "r"), LAM, progress=False)
    orig = inplace.TileMarkers.mark
    count = [0]

    class Killed(BaseException):
        pass

    def mark(self, tile, **info):
        if self.name == "gram":
            count[0] += 1
            if count[0] == 4:
                raise Killed
        return orig(self, tile, **info)

    monkeypatch.setattr(inplace.TileMarkers, "mark", mark)
    with pytest.raises(Killed):
        tile_cholesky(gram, LAM, progress=False, keep_gram=False, n_threads=1)
    monkeypatch.setattr(inplace.TileMarkers, "mark", orig)
    intents = list((tmp_path / "g" / "_markers" / "gram~inplace").iterdir())
    assert len(intents) == 1
    f = tile_cholesky(gram, LAM, progress=False, keep_gram=False)
    assert len(f.computed) == 15 - 4  # 3 marked + 1 adopted
    np.testing.assert_allclose(dense_lower(f), dense_lower(ref), rtol=0, atol=1e-12)


CHILD = textwrap.dedent(
    """
    import sys, zarr, numpy as np
    from pipeline.linalg.cholesky import tile_cholesky
    from pipeline.storage import TiledArray
    a = zarr.open_array(store=sys.argv[1], path="gram", mode="r")
    g = TiledArray(sys.argv[1], "gram", tuple(a.shape), int(a.attrs["block_size"]),
                   np.dtype(a.dtype).str, a.attrs["fingerprint"])
    tile_cholesky(g, LAMBDA, scheduler=sys.argv[2], progress=False, keep_gram=False)
    """
).replace("LAMBDA", repr(LAM))


@pytest.mark.slow
@pytest.mark.parametrize("scheduler", ["threads", "dask"])
def test_sigkill_in_place_then_resume(tmp_path, scheduler):
    gram = write_gram(tmp_path / "g")
    ref = tile_cholesky(write_gram(tmp_path / "r"), LAM, progress=False)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KRR_KILL")}
    env["PYTHONPATH"] = os.pathsep.join([str(INJECT), env.get("PYTHONPATH", "")])
    env["KRR_KILL_MATCH"], env["KRR_KILL_AT"] = "gram/", "6"  # factor markers, not intents
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, gram.store, scheduler],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    f = tile_cholesky(gram, LAM, scheduler=scheduler, progress=False, keep_gram=False)
    assert 0 < len(f.computed) < 15
    np.testing.assert_allclose(dense_lower(f), dense_lower(ref), rtol=0, atol=1e-12)


def test_disk_check_before_any_work(tmp_path, monkeypatch):
    gram = write_gram(tmp_path / "g")
    free = 10_000
    monkeypatch.setattr(
        inplace.shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10**9, 10**9 - free, free)
    )
    need = 15 * B * B * 8
    with pytest.raises(inplace.InsufficientDiskError, match=f"{need:,} bytes") as ei:
        tile_cholesky(gram, LAM, progress=False)
    assert ei.value.needed == need and ei.value.free == free and "10,000 bytes" in str(ei.value)
    assert not (tmp_path / "g" / "_markers" / "chol").exists() or not any(
        (tmp_path / "g" / "_markers" / "chol").iterdir()
    )
    with pytest.raises(inplace.InsufficientDiskError, match="in-place"):
        tile_cholesky(gram, LAM, progress=False, keep_gram=False)
    assert len(gram.markers.done()) == 15  # the Gram untouched
    assert inplace.factor_disk_bytes(N, B, np.float32) == 15 * B * B * 4
    # the resident schedule on a backend: the same check, before a tile is computed
    with pytest.raises(inplace.InsufficientDiskError, match=f"{need:,} bytes"):
        tile_cholesky(gram, LAM, progress=False, backend=get_backend("numpy"), name="dev")
    assert not (tmp_path / "g" / "_markers" / "dev").exists() or not any(
        (tmp_path / "g" / "_markers" / "dev").iterdir()
    )
    assert inplace.factor_disk_bytes(N, B, keep_gram=False, writers=2) == 3 * B * B * 8


def test_disk_check_finds_the_local_disk_of_a_file_url(tmp_path):
    # the free space of a "FILE://" or "local://" store is checked on its local disk
    # (it was skipped as an object store's)
    missing = tmp_path / "not" / "yet.zarr"
    for url in (f"file://{missing}", f"FILE://{missing}", f"local://{missing}", str(missing)):
        assert inplace._local_dir(url) == str(tmp_path), url
    assert inplace._local_dir("s3://bucket/run") is None


def test_in_place_refuses_other_dtype_or_store(tmp_path):
    gram = write_gram(tmp_path / "g")
    with pytest.raises(ValueError, match="dtype must be the Gram's"):
        tile_cholesky(gram, LAM, progress=False, keep_gram=False, dtype=np.float32)
    with pytest.raises(ValueError, match="store must be the Gram's"):
        tile_cholesky(gram, LAM, progress=False, keep_gram=False, store=str(tmp_path / "x"))


def test_in_place_threads_and_dask_bitwise_equal(tmp_path):
    a = tile_cholesky(
        write_gram(tmp_path / "t"), LAM, scheduler="threads", progress=False, keep_gram=False
    )
    b = tile_cholesky(
        write_gram(tmp_path / "d"), LAM, scheduler="dask", progress=False, keep_gram=False
    )
    np.testing.assert_array_equal(dense_lower(a), dense_lower(b))
