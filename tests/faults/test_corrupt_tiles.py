"""A corrupted stored tile is detected by its checksum and recomputed, never silently used.

Every completion record written by ``TiledArray.write_tile`` carries the
CRC-32C of the tile's bytes. Here bytes of one Gram chunk file are overwritten
on disk; reading that tile must raise ``CorruptTileError`` (also through the
tile Cholesky and the stored-Gram CG operator), and a ``krr run`` whose solve
meets the damaged tile must recompute it and finish with the α of a clean run.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest

from pipeline.engine import kernel_tile
from pipeline.kernels import RBF
from pipeline.linalg.cholesky import tile_cholesky
from pipeline.linalg.gram import build_gram, read_sym_tile
from pipeline.linalg.matvec import make_operator
from pipeline.storage import CorruptTileError, TileMarkers, tile_checksum

BLOCK = 100


def _corrupt(path: Path, offset: int = 808, n: int = 16) -> bytes:
    """Overwrite ``n`` bytes in place (same file size); return the original bytes."""
    original = path.read_bytes()
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(bytes(255 - b for b in original[offset : offset + n]))
    assert path.read_bytes() != original
    return original


@pytest.fixture
def gram(tmp_path):
    X = np.random.default_rng(0).standard_normal((350, 4))
    g = build_gram(X, RBF(gamma=0.3), tmp_path / "g.zarr", BLOCK, progress=False)
    return X, g


def test_write_tile_records_checksum_of_stored_bytes(gram):
    _, g = gram
    for i, j in g.grid.lower_tiles():  # includes the ragged last row of tiles
        rec = g.markers.record((i, j))
        tile = g.read_tile(i, j, verify=False)
        assert rec["crc32c"] == tile_checksum(tile), (i, j)
    # the checksum sees a single flipped bit
    t = g.read_tile(3, 1)
    t2 = t.copy()
    t2.view(np.uint8)[5] ^= 1
    assert tile_checksum(t2) != tile_checksum(t)


def test_corrupt_chunk_detected_on_read(gram, chunk_file):
    X, g = gram
    clean = g.read_tile(2, 1)
    original = _corrupt(chunk_file(Path(g.store), g.name, 2, 1))
    with pytest.raises(CorruptTileError, match=r"tile \(2, 1\) of array 'gram'") as e:
        g.read_tile(2, 1)
    err = e.value
    assert isinstance(err, ValueError)
    assert (err.store, err.name, err.tile) == (g.store, "gram", (2, 1))
    assert err.expected == g.markers.record((2, 1))["crc32c"] != err.found
    assert "unmark" in str(err) and g.store in str(err)
    # survives pickling (it crosses Dask worker boundaries)
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is CorruptTileError and back.tile == (2, 1) and str(back) == str(err)
    # the symmetric read of the upper tile goes through the same check
    with pytest.raises(CorruptTileError):
        read_sym_tile(g, 1, 2)
    # unverified reads see the damaged bytes; other tiles are unaffected
    assert not np.array_equal(g.read_tile(2, 1, verify=False), clean)
    # (the fused evaluation's tile: its bits, pipeline.engine.kernel_tile)
    tile = kernel_tile(RBF(gamma=0.3), X[200:300], X[:100], np.empty((100, 100)), n_threads=1)
    np.testing.assert_array_equal(g.read_tile(2, 0), tile)
    # the chunk restored: verified again
    chunk_file(Path(g.store), g.name, 2, 1).write_bytes(original)
    np.testing.assert_array_equal(g.read_tile(2, 1), clean)


def test_solvers_refuse_a_corrupt_gram_tile(gram, chunk_file, tmp_path):
    _, g = gram
    _corrupt(chunk_file(Path(g.store), g.name, 3, 2))
    with pytest.raises(CorruptTileError, match=r"tile \(3, 2\)"):
        tile_cholesky(g, 0.1, store=str(tmp_path / "f.zarr"), scheduler="threads", n_threads=1)
    op = make_operator("stored", 0.1, gram=g, block_size=BLOCK)
    with pytest.raises(CorruptTileError, match=r"tile \(3, 2\)"):
        op.matvec(np.ones((g.shape[0], 1)))


def test_corrupt_factor_tile_detected(gram, chunk_file, tmp_path):
    _, g = gram
    store = tmp_path / "f.zarr"
    factor = tile_cholesky(g, 0.1, store=str(store), scheduler="threads", n_threads=1)
    from pipeline.linalg.cholesky_cache import release_tile_cache

    release_tile_cache()  # the in-process cache would serve the good copy
    _corrupt(chunk_file(store, factor.L.name, 1, 1))
    with pytest.raises(CorruptTileError, match=r"tile \(1, 1\) of array 'chol'"):
        factor.L.read_tile(1, 1)


def test_unmark_then_rebuild_recomputes_only_that_tile(gram, chunk_file):
    X, g = gram
    clean = g.read_tile(2, 1)
    _corrupt(chunk_file(Path(g.store), g.name, 2, 1))
    m = TileMarkers(g.store, g.name, "any fingerprint: unmark ignores it")
    assert m.unmark((2, 1)) is True
    assert m.unmark((2, 1)) is False
    g2, stats = build_gram(X, RBF(gamma=0.3), g.store, BLOCK, progress=False, return_stats=True)
    assert stats.computed == [(2, 1)]
    np.testing.assert_array_equal(g2.read_tile(2, 1), clean)


# ---------------------------------------------------------------------------
# the whole pipeline: `krr run` meets the corrupt tile and recovers


@pytest.mark.slow
def test_krr_run_recomputes_corrupt_gram_tile(tmp_path, krr_main, fault_run, chunk_file):
    conf = fault_run(tmp_path, "corrupt", n=600, d=5, seed=1)
    run, clean = tmp_path / "run", tmp_path / "clean"

    first = krr_main.run(conf, run, json=True)
    assert first.returncode == 0, first.stderr[-3000:]
    store = run / "gram" / "gram.zarr"
    markers = store / "_markers" / "gram"
    before = {p.name: json.loads(p.read_text()) for p in markers.iterdir()}
    assert len(before) == 15  # 450 training rows: 5 row blocks, 15 lower tiles
    chunk = chunk_file(store, "gram", 3, 1)
    good = _corrupt(chunk)

    # a new lambda keeps the Gram, so the solve reads the damaged tile
    second = krr_main.run(conf, run, "lambda=0.02", json=True)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "corrupt tile (3, 1) of array 'gram'" in second.stderr, second.stderr[-3000:]
    assert "rerunning from stage 'gram'" in second.stderr
    assert "[recovery 1 of at most 3" in second.stderr and "[recovery 2" not in second.stderr
    report = json.loads(second.stdout)
    assert "gram" in report["ran"] and "solve" in report["ran"]
    after = {p.name: json.loads(p.read_text()) for p in markers.iterdir()}
    assert after.keys() == before.keys()
    changed = sorted(k for k in after if after[k]["time"] != before[k]["time"])
    assert changed == ["3.1"]  # only the damaged tile was recomputed
    assert chunk.read_bytes() == good

    ref = krr_main.run(conf, clean, "lambda=0.02", json=True)
    assert ref.returncode == 0, ref.stderr[-3000:]
    assert "corrupt" not in ref.stderr
    from pipeline.stages.manifest import Manifest

    got = np.load(Manifest.load(run).stage_dir("solve") / "alpha.npy")  # results/<key>/solve
    want = np.load(Manifest.load(clean).stage_dir("solve") / "alpha.npy")
    np.testing.assert_array_equal(got, want)
