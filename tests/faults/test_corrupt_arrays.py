"""Every stored array is checked when it is read back; damage is recomputed or refused.

Ingest's X/y row blocks, α (``alpha.npy``), prediction blocks and CG
checkpoints carry a CRC-32C written with them. Here their bytes are damaged on
disk between two ``krr run`` calls (or two calls of the library): the damage
must be detected, and either recomputed (the run's metrics then equal a clean
run's) or refused with an error naming the array and the block; never read as
zeros or used silently, and never exit 0 with a wrong number.
"""

from __future__ import annotations

import json
import logging
import subprocess
from pathlib import Path

import numpy as np
import pytest

from pipeline.kernels import RBF
from pipeline.linalg.blockwise import predict
from pipeline.linalg.cg_checkpoint import resumable_cg
from pipeline.linalg.matvec import make_operator
from pipeline.models.artifact import ArtifactError, load_artifact
from pipeline.storage import (
    CorruptTileError,
    MissingTileError,
    open_tiled_array,
    read_all,
    read_blocks,
)


def _ok(res: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert res.returncode == 0, res.stderr[-3000:]
    return res


def _metrics(run_dir: Path) -> dict:
    return json.loads((_dir(run_dir, "evaluate") / "metrics.json").read_text())["metrics"]


def _dir(run_dir: Path, stage: str) -> Path:
    """The latest configuration's stage directory (``results/<key>/<stage>``)."""
    from pipeline.stages.manifest import Manifest

    return Manifest.load(run_dir).stage_dir(stage)


@pytest.fixture(scope="module")
def data(tmp_path_factory, krr_main, fault_run):
    """Source files, a config, and a clean run at lambda=0.02 to compare with."""
    d = tmp_path_factory.mktemp("verified")
    conf = fault_run(d, "verified-reads", n=400, d=4, seed=3)
    clean = d / "clean"
    _ok(krr_main.run(conf, clean, "lambda=0.02", json=True))
    return d, conf, clean


def _own_conf(data, tmp_path, fault_run) -> Path:
    """A private copy of the source files and config (a test may delete them)."""
    d, _, _ = data
    for f in ("X.npy", "y.npy"):
        (tmp_path / f).write_bytes((d / f).read_bytes())
    return fault_run.config(tmp_path, "verified-reads", tmp_path / "X.npy", tmp_path / "y.npy")


def test_read_blocks_verifies_every_block(tmp_path, flip):
    X = np.random.default_rng(4).normal(size=(250, 3))
    arr = open_tiled_array(str(tmp_path), "X", X.shape, 100, np.float64, "fp", chunk_cols=3)
    for i in range(3):
        arr.write_tile(i, 0, X[arr.grid.row_slice(i)])
    lazy = read_blocks(str(tmp_path), "X")
    assert lazy.chunks == ((100, 100, 50), (3,))
    np.testing.assert_array_equal(lazy.compute(), X)
    flip(tmp_path / "X" / "c" / "2" / "0", offset=16)
    with pytest.raises(CorruptTileError, match=r"tile \(2, 0\) of array 'X'"):
        read_blocks(str(tmp_path), "X").compute()
    np.testing.assert_array_equal(lazy[:200].compute(), X[:200])  # the others still pass
    (tmp_path / "_markers" / "X" / "1.0").unlink()
    with pytest.raises(MissingTileError, match=r"block \(1, 0\) of array 'X'"):
        read_all(str(tmp_path), "X")
    chunk = tmp_path / "X" / "c" / "0" / "0"
    chunk.write_bytes(chunk.read_bytes()[:100])  # truncated: named, not a decoder error
    with pytest.raises(CorruptTileError, match=r"\(0, 0\) of array 'X'"):
        read_all(str(tmp_path), "X")


@pytest.mark.slow
def test_flipped_byte_in_X_train_is_rewritten_from_source(
    data, tmp_path, krr_main, flip, chunk_file
):
    _, conf, clean = data
    run = tmp_path / "run"
    _ok(krr_main.run(conf, run, json=True))
    chunk = chunk_file(run / "ingest" / "data.zarr", "X_train", 1)
    good = chunk.read_bytes()
    flip(chunk)
    # the Gram is kept; predict reads X_train
    res = _ok(krr_main.run(conf, run, "lambda=0.02", json=True))
    assert "tile (1, 0) of array 'X_train'" in res.stderr, res.stderr[-3000:]
    assert "rerunning from stage 'ingest'" in res.stderr
    assert chunk.read_bytes() == good  # rewritten from the source file
    assert _metrics(run) == _metrics(clean)
    # the model artifact sealed the clean X, and its arrays are checked on load
    model = _dir(run, "model") / "model"
    art = load_artifact(model)
    clean_model = load_artifact(_dir(clean, "model") / "model")
    np.testing.assert_array_equal(art.X_train, clean_model.X_train)
    flip(model / "X_train" / "c" / "0" / "0")
    with pytest.raises(ArtifactError, match="array 'X_train' fails its checksum"):
        load_artifact(model)


@pytest.mark.slow
def test_flipped_byte_in_y_train_is_rewritten_from_source(
    data, tmp_path, krr_main, flip, chunk_file
):
    _, conf, clean = data
    run = tmp_path / "run"
    _ok(krr_main.run(conf, run, json=True))
    chunk = chunk_file(run / "ingest" / "data.zarr", "y_train", 2)
    flip(chunk, offset=8)
    res = _ok(krr_main.run(conf, run, "lambda=0.02", json=True))  # the solve reads y_train
    assert "tile (2, 0) of array 'y_train'" in res.stderr, res.stderr[-3000:]
    assert _metrics(run) == _metrics(clean)
    np.testing.assert_array_equal(
        np.load(_dir(run, "solve") / "alpha.npy"), np.load(_dir(clean, "solve") / "alpha.npy")
    )


@pytest.mark.slow
def test_flipped_byte_in_alpha_is_recomputed(data, tmp_path, krr_main, flip):
    _, conf, clean = data
    run = tmp_path / "run"
    _ok(krr_main.run(conf, run, "lambda=0.02", "--until", "solve", json=True))
    flip(_dir(run, "solve") / "alpha.npy", offset=200)
    res = _ok(krr_main.run(conf, run, "lambda=0.02", json=True))  # predict and model read alpha
    assert "alpha.npy" in res.stderr and "rerunning from stage 'solve'" in res.stderr, res.stderr
    assert _metrics(run) == _metrics(clean)
    np.testing.assert_array_equal(
        np.load(_dir(run, "solve") / "alpha.npy"), np.load(_dir(clean, "solve") / "alpha.npy")
    )


@pytest.mark.slow
def test_deleted_prediction_chunk_is_recomputed_by_the_run(data, tmp_path, krr_main):
    _, conf, clean = data
    run = tmp_path / "run"
    _ok(krr_main.run(conf, run, "lambda=0.02", "--until", "predict", json=True))
    chunk = _dir(run, "predict") / "predictions.zarr" / "test" / "c" / "0" / "0"
    chunk.unlink()  # would read as zeros
    res = _ok(krr_main.run(conf, run, "lambda=0.02", json=True))  # evaluate reads the predictions
    assert "tile (0,) of array 'test'" in res.stderr, res.stderr[-3000:]
    assert chunk.is_file()
    assert _metrics(run) == _metrics(clean)


def test_prediction_blocks_are_verified_on_read(tmp_path, flip):
    rng = np.random.default_rng(0)
    X, Xt, a = rng.normal(size=(250, 3)), rng.normal(size=(120, 3)), rng.normal(size=120)
    k = RBF(gamma=0.4)
    out = tmp_path / "pred"
    kw = dict(block_size=100, train_block_size=60, progress=False)
    res = predict(X, Xt, a, k, out=str(out), **kw)
    want = res.to_numpy()
    np.testing.assert_allclose(want, k(X, Xt) @ a, rtol=1e-12, atol=1e-12)
    rec = json.loads((out / "_markers" / "predictions" / "1").read_text())
    assert "crc32c" in rec
    flip(out / "predictions" / "c" / "1")
    with pytest.raises(CorruptTileError, match=r"tile \(1,\) of array 'predictions'"):
        res.to_numpy()
    (out / "predictions" / "c" / "1").unlink()  # a deleted chunk: zeros, not the data
    with pytest.raises(CorruptTileError, match=r"tile \(1,\) of array 'predictions'"):
        res.to_numpy()
    (out / "_markers" / "predictions" / "2").unlink()  # no record: not trusted either
    with pytest.raises(CorruptTileError):
        res.to_numpy()
    # unmark the damaged block: a rerun recomputes exactly the two unmarked ones
    (out / "_markers" / "predictions" / "1").unlink()
    again = predict(X, Xt, a, k, out=str(out), **kw)
    assert (again.n_computed, again.n_skipped) == (2, 1)
    np.testing.assert_array_equal(again.to_numpy(), want)


def test_missing_prediction_marker_is_named(tmp_path):
    rng = np.random.default_rng(1)
    X, Xt, a = rng.normal(size=(150, 2)), rng.normal(size=(50, 2)), rng.normal(size=50)
    out = tmp_path / "pred"
    res = predict(X, Xt, a, RBF(gamma=1.0), out=str(out), block_size=100, progress=False)
    want = res.to_numpy()
    (out / "_markers" / "predictions" / "0").unlink()
    with pytest.raises(
        MissingTileError, match=r"block \(0,\) of array 'predictions'.*no completion"
    ):
        res.to_numpy()
    # a record without a checksum (an older version's) cannot be verified: recomputed
    marker = out / "_markers" / "predictions" / "1"
    rec = json.loads(marker.read_text())
    marker.write_text(json.dumps({k: v for k, v in rec.items() if k != "crc32c"}))
    with pytest.raises(MissingTileError, match=r"block \(0,\)"):
        res.to_numpy()
    again = predict(X, Xt, a, RBF(gamma=1.0), out=str(out), block_size=100, progress=False)
    assert (again.n_computed, again.n_skipped) == (2, 0)
    np.testing.assert_array_equal(again.to_numpy(), want)
    marker.write_text(json.dumps({k: v for k, v in rec.items() if k != "crc32c"}))
    with pytest.raises(MissingTileError, match=r"block \(1,\).*carries no checksum"):
        res.to_numpy()


@pytest.mark.filterwarnings("ignore::pipeline.linalg.cg.CGConvergenceWarning")
def test_corrupt_cg_checkpoint_is_not_resumed(tmp_path, caplog, flip):
    rng = np.random.default_rng(2)
    X = rng.normal(size=(120, 3))
    y = rng.normal(size=(120, 1))
    op = make_operator("matrix-free", 1e-3, X=X, kernel=RBF(gamma=0.5), block_size=50)
    store = str(tmp_path / "cg")
    kw = dict(every=2, tol=1e-10)
    first = resumable_cg(op, y, store, max_iter=6, **kw)
    assert first.n_iter == 6 and not first.converged
    slots = sorted((tmp_path / "cg" / "_cg" / "cg").glob("slot*.npz"))
    latest = max(slots, key=lambda p: p.stat().st_mtime_ns)
    flip(latest, offset=len(latest.read_bytes()) // 2)  # inside the saved vectors
    with caplog.at_level(logging.WARNING, logger="pipeline.linalg.cg_checkpoint"):
        res = resumable_cg(op, y, store, max_iter=60, **kw)
    assert res.start_iter == 0, "resumed from a corrupt checkpoint"
    assert "is corrupt" in caplog.text and latest.name in caplog.text
    clean = resumable_cg(op, y, str(tmp_path / "clean"), max_iter=60, **kw)
    np.testing.assert_array_equal(res.x, clean.x)


@pytest.mark.slow
def test_corrupt_X_train_without_its_source_fails_loudly(
    data, tmp_path, krr_main, flip, chunk_file, fault_run
):
    _, _, clean = data
    conf = _own_conf(data, tmp_path, fault_run)
    run = tmp_path / "run"
    _ok(krr_main.run(conf, run, json=True))
    flip(chunk_file(run / "ingest" / "data.zarr", "X_train", 0))
    # the source is broken: the damaged block cannot be rewritten from it
    src = tmp_path / "X.npy"
    good = src.read_bytes()
    src.write_bytes(good[:200])
    res = krr_main.run(conf, run, "lambda=0.02", json=True)
    assert res.returncode in (3, 4), (res.returncode, res.stderr[-3000:])  # bad input / stage
    # the damaged block is named when a reader meets it; where the source's content is
    # fingerprinted up front, the broken source is found first and ingest reruns from it
    named = "tile (0, 0) of array 'X_train'" in res.stderr
    assert named or "[ingest] config changed" in res.stderr, res.stderr[-3000:]
    assert "stage 'ingest' failed" in res.stderr
    stages = json.loads((run / "manifest.json").read_text())["stages"]
    assert stages["ingest"]["status"] == "failed"
    # the source restored, the run resumes and rewrites the block
    src.write_bytes(good)
    _ok(krr_main.run(conf, run, "lambda=0.02", json=True))
    assert _metrics(run) == _metrics(clean)


@pytest.mark.parametrize("damage", ["invalid json", "block_size attribute", "shape"])
def test_a_damaged_gram_zarr_json_is_rebuilt_not_a_stuck_run(tmp_path, damage):
    # the gram stage trusted its zarr.json: a damaged one failed the solve stage with
    # exit 4 ("rerun to resume"), and every rerun failed the same way (session 26)
    from pipeline.stages import run_config

    cfg = {"data": {"source": "sklearn", "name": "diabetes"}, "split": {"test_fraction": 0.25},
           "kernel": {"name": "rbf", "params": {"gamma": 0.05}}, "lambda": 0.5,
           "solver": {"method": "cholesky"}, "block_size": 128,
           "evaluate": {"baseline": "none"}}  # fmt: skip
    run_config(cfg, tmp_path / "run")
    meta = tmp_path / "run" / "gram" / "gram.zarr" / "gram" / "zarr.json"
    text = meta.read_text()
    doc = json.loads(text)
    if damage == "invalid json":
        text = text.replace(":", ";", 1)
    elif damage == "block_size attribute":
        doc["attributes"]["block_size"] = 129
        text = json.dumps(doc)
    else:
        doc["shape"] = [doc["shape"][0] + 1, doc["shape"][1]]
        text = json.dumps(doc)
    meta.write_text(text)
    again = run_config({**cfg, "lambda": 0.05}, tmp_path / "run")
    fresh = run_config({**cfg, "lambda": 0.05}, tmp_path / "fresh")
    assert "gram" in again.ran
    assert again.outputs["evaluate"]["metrics"] == fresh.outputs["evaluate"]["metrics"]
