"""The run manifest: round trip, atomic writes, version check."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from pipeline.stages.manifest import Manifest, StageRecord, write_json_atomic


def test_round_trip(tmp_path):
    m = Manifest(run_dir=tmp_path, identity="abc", config={"lam": 1.0})
    m.stage("ingest").status = "done"
    m.stage("ingest").fingerprint = "f1"
    m.stage("ingest").outputs = {"n": np.int64(3), "v": np.arange(2)}
    m.stage("gram").status = "running"
    m.save()
    back = Manifest.load(tmp_path)
    assert back.identity == "abc"
    assert back.config == {"lam": 1.0}
    assert back.stages["ingest"].status == "done"
    assert back.stages["ingest"].outputs == {"n": 3, "v": [0, 1]}
    assert back.stages["gram"].status == "running"
    assert list(back.stages) == ["ingest", "gram"]


def test_missing_manifest_is_empty(tmp_path):
    m = Manifest.load(tmp_path / "nothing")
    assert m.stages == {} and m.identity is None


def test_atomic_write_leaves_no_temporaries_and_replaces(tmp_path):
    p = tmp_path / "x.json"
    write_json_atomic(p, {"a": 1})
    write_json_atomic(p, {"a": 2})
    assert json.loads(p.read_text()) == {"a": 2}
    assert os.listdir(tmp_path) == ["x.json"]


def test_failed_write_keeps_the_old_file(tmp_path):
    p = tmp_path / "x.json"
    write_json_atomic(p, {"a": 1})
    with pytest.raises(TypeError, match="not JSON-able"):
        write_json_atomic(p, {"a": object()})
    assert json.loads(p.read_text()) == {"a": 1}
    assert os.listdir(tmp_path) == ["x.json"]


def test_version_and_corruption_are_refused(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps({"version": 99, "stages": {}}))
    with pytest.raises(ValueError, match="version 99"):
        Manifest.load(tmp_path)
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        Manifest.load(tmp_path)


def test_unknown_status_is_refused():
    with pytest.raises(ValueError, match="unknown stage status"):
        StageRecord.from_json({"status": "weird"})
