"""Issue #18, item 3: `krr run` with a `cv:` section resumes a killed search from its
finished settings, and records what the report needs (grid scores, choice, cost).

The runs stop after the select stage: every assertion is on its outputs, which the
stages after it do not touch."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from pipeline.stages import StageFailed, default_stages, run_stages
from pipeline.stages.config import load_config

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _diabetes_run import CV, RUN  # noqa: E402


def go(run, cv=CV):
    cfg = load_config({**RUN, "cv": cv})
    return run_stages(
        run, default_stages(), cfg.stage_params(), identity=cfg.identity(), until="select"
    )


class Killed(Exception):
    pass


def test_a_killed_search_restarts_from_its_finished_settings(tmp_path, monkeypatch):
    from pipeline.models.selection import checkpoint

    save = checkpoint.SettingCheckpoint.save
    calls = {"n": 0}

    def dying_save(self, *a, **k):
        save(self, *a, **k)
        calls["n"] += 1
        if calls["n"] == 2:
            raise Killed("killed after 2 settings")

    run = tmp_path / "run"
    monkeypatch.setattr(checkpoint.SettingCheckpoint, "save", dying_save)
    with pytest.raises((Killed, StageFailed)):
        go(run)
    monkeypatch.setattr(checkpoint.SettingCheckpoint, "save", save)
    files = sorted(p.name for p in (run / "select" / "settings").iterdir())
    assert files == [
        "setting_000.json",
        "setting_000.npz",
        "setting_001.json",
        "setting_001.npz",
    ]

    computed = []
    orig = checkpoint.SettingCheckpoint.save

    def counting_save(self, si, *a, **k):
        computed.append(si)
        return orig(self, si, *a, **k)

    monkeypatch.setattr(checkpoint.SettingCheckpoint, "save", counting_save)
    rep = go(run)
    sel = rep.outputs["select"]
    assert computed == [2, 3]  # the two finished settings were not redone
    assert sel["settings_resumed"] == 2

    # the same choice and scores as an uninterrupted run
    clean = go(tmp_path / "clean")
    ref = clean.outputs["select"]
    assert sel["best_params"] == ref["best_params"]
    np.testing.assert_allclose(
        sel["grid"]["mean_test_score"], ref["grid"]["mean_test_score"], rtol=1e-12
    )
    # what the report draws: every grid point's score, the chosen one, the cost
    g = sel["grid"]
    assert len(g["params"]) == len(g["mean_test_score"]) == 3 * 4
    assert g["params"][g["best_index"]] == sel["best_params"]
    assert sel["seconds"]["search"] > 0 and "total" in sel["seconds"]


def test_a_damaged_or_foreign_setting_record_is_recomputed(tmp_path):
    from pipeline import KernelRidgeCV

    rng = np.random.default_rng(0)
    X = rng.standard_normal((90, 3))
    y = np.sin(X[:, 0])
    d = tmp_path / "ck"
    kw = dict(param_grid={"gamma": [0.1, 1.0]}, cv=3, solver="cg", refit=False, checkpoint=d)
    a = KernelRidgeCV([0.1, 1.0], **kw).fit(X, y)
    assert a.search_stats_.get("settings_resumed", 0) == 0
    b = KernelRidgeCV([0.1, 1.0], **kw).fit(X, y)
    assert b.search_stats_["settings_resumed"] == 2
    np.testing.assert_array_equal(
        a.cv_results_["mean_test_score"], b.cv_results_["mean_test_score"]
    )
    # flip a byte of one record: its checksum fails, it is recomputed
    p = d / "setting_001.npz"
    raw = bytearray(p.read_bytes())
    raw[-40] ^= 0xFF
    p.write_bytes(bytes(raw))
    c = KernelRidgeCV([0.1, 1.0], **kw).fit(X, y)
    assert c.search_stats_["settings_resumed"] == 1
    np.testing.assert_allclose(a.cv_results_["mean_test_score"], c.cv_results_["mean_test_score"])
    # another lambda grid: the records do not match its fingerprint
    e = KernelRidgeCV([0.1, 3.0], **kw).fit(X, y)
    assert e.search_stats_.get("settings_resumed", 0) == 0
    assert json.loads((d / "setting_000.json").read_text())["alphas"] == [0.1, 3.0]
