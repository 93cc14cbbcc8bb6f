"""A damaged run directory recovers in one ``krr run``.

Issue #44: a run directory copied while it ran (a backup) had 74 marked tiles
without chunk files; each ``krr run`` recovered 3 tiles (one per read that found
one), then exited 4, "rerun to resume": about 25 reruns. A deleted ingest array
failed every rerun with exit 1 ("internal error"), because it was read while the
stages were planned, outside recovery. Now a resumed stage unmarks every marked
tile whose chunk file is missing or has the wrong size in one pass, and planning
is inside recovery.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest


@pytest.fixture(scope="module")
def conf(tmp_path_factory, fault_run) -> Path:
    d = tmp_path_factory.mktemp("one_pass")
    # no split, no preprocessing, tiles of 32
    return fault_run(d, "one-pass", n=300, d=4, seed=0, split=None, preprocess=None, block_size=32)


def _alpha(run_dir: Path) -> np.ndarray:
    from pipeline.models.artifact import load_artifact
    from pipeline.stages.manifest import Manifest

    m = Manifest.load(run_dir)
    return np.asarray(load_artifact(f"{m.stage_dir('model')}/model").dual_coef)


@pytest.fixture(scope="module")
def reference(conf, tmp_path_factory, krr_main) -> np.ndarray:
    d = tmp_path_factory.mktemp("one_pass_ref")
    r = krr_main("run", str(conf), "--run-dir", str(d / "run"), cwd=d)
    assert r.returncode == 0, r.stderr[-3000:]
    return _alpha(d / "run")


def test_many_marked_tiles_without_chunks_recover_in_one_run(conf, reference, tmp_path, krr_main):
    run = tmp_path / "run"
    r = krr_main("run", str(conf), "--run-dir", str(run), "--until", "gram", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    chunks = sorted(p for p in (run / "gram" / "gram.zarr" / "gram").rglob("*") if p.is_file())
    chunks = [p for p in chunks if p.name != "zarr.json"]
    assert len(chunks) >= 20
    for p in chunks[::2]:  # half the marked tiles lose their chunk file (a torn backup)
        p.unlink()
    chunks[1].write_bytes(chunks[1].read_bytes()[:-8])  # and one is truncated
    r = krr_main("run", str(conf), "--run-dir", str(run), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "have no chunk file" in r.stderr
    np.testing.assert_allclose(_alpha(run), reference, rtol=1e-10, atol=1e-12)


def test_a_deleted_ingest_array_is_rebuilt_in_one_run(conf, reference, tmp_path, krr_main):
    run = tmp_path / "run"
    r = krr_main("run", str(conf), "--run-dir", str(run), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    shutil.rmtree(run / "ingest" / "data.zarr" / "X_train")
    r = krr_main("run", str(conf), "--run-dir", str(run), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "internal error" not in r.stderr
    np.testing.assert_allclose(_alpha(run), reference, rtol=1e-10, atol=1e-12)
    # and the run is whole again: a further run has nothing to do
    r = krr_main("run", str(conf), "--run-dir", str(run), "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert '"ran": []' in r.stdout
