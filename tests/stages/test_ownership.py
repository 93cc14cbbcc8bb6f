"""The pipeline never deletes or overwrites what it did not create (issue #13).

* a prediction output whose target holds a user's files is refused, through
  ``krr predict`` without ``--overwrite`` and through the Python API even with
  ``overwrite=True``; only arrays carrying the pipeline's fingerprint are replaced;
* ``--force-new`` removes the manifest and the stage directories it records,
  and keeps every other file in the run directory;
* a run directory that is a filesystem root, the home directory or the current
  directory, and a run name that leaves ``runs/``, are config errors (exit 2).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import pytest
import zarr

from pipeline import cli
from pipeline.linalg.blockwise import predict
from pipeline.models.artifact import save_artifact
from pipeline.stages.config import ConfigError, load_config
from pipeline.stages.runner import RunDirConflict, Stage, run_stages
from pipeline.storage import ForeignPathError, open_tiled_array

THESIS = b"\\documentclass{article} years of work"


@pytest.fixture
def model_and_input(tmp_path):
    rng = np.random.default_rng(3)
    X = rng.standard_normal((60, 3))
    art = tmp_path / "model"
    save_artifact(art, X_train=X, dual_coef=rng.standard_normal(60), kernel="rbf",
                  regularization=0.1)  # fmt: skip
    np.save(tmp_path / "Xn.npy", rng.standard_normal((40, 3)))
    return art, X, tmp_path / "Xn.npy"


def _user_dir(out: Path) -> Path:
    """``out/predictions/thesis.tex``: a user's file where predictions would go."""
    (out / "predictions").mkdir(parents=True)
    thesis = out / "predictions" / "thesis.tex"
    thesis.write_bytes(THESIS)
    return thesis


@pytest.mark.slow
def test_krr_predict_keeps_a_user_file_in_the_output(model_and_input, tmp_path, krr_main):
    art, _, xn = model_and_input
    out = tmp_path / "out.zarr"
    thesis = _user_dir(out)
    for extra in ([], ["--overwrite"]):
        r = krr_main("predict", art, xn, out, *extra)
        assert r.returncode == cli.EXIT_BAD_INPUT, (r.returncode, r.stderr[-2000:])
        # refused at the store's root, which holds the user's directory (session 25)
        assert str(out) in r.stderr and "did not create" in r.stderr
        assert thesis.read_bytes() == THESIS


def test_predict_api_never_replaces_what_it_did_not_create(model_and_input, tmp_path):
    _, X, xn = model_and_input
    Xn, alpha = np.load(xn), np.ones(len(X))
    out = tmp_path / "out"
    thesis = _user_dir(out)
    for overwrite in (False, True):
        with pytest.raises(ForeignPathError, match="non-empty directory") as e:
            predict(Xn, X, alpha, "rbf", out=str(out), overwrite=overwrite, progress=False)
        assert str(out) in str(e.value) and "remove" in str(e.value)
        assert thesis.read_bytes() == THESIS
    # a plain file, a Zarr group, a Zarr array someone else wrote: all left alone
    (tmp_path / "f").mkdir()
    (tmp_path / "f" / "predictions").write_bytes(b"notes")
    zarr.create_group(store=str(tmp_path / "g"), path="predictions")
    zarr.create_array(store=str(tmp_path / "z"), name="predictions", shape=(4,), dtype="f8")
    for where, what in (
        ("f", "not a Zarr store"),
        ("g", "a Zarr group"),
        ("z", "without krr-pipeline"),
    ):
        with pytest.raises(ForeignPathError, match=what):
            predict(Xn, X, alpha, "rbf", out=str(tmp_path / where), overwrite=True, progress=False)
    assert (tmp_path / "f" / "predictions").read_bytes() == b"notes"
    assert zarr.open_array(store=str(tmp_path / "z"), path="predictions").shape == (4,)
    # what the pipeline wrote itself it may replace (overwrite=True), and an empty dir is free
    (tmp_path / "e" / "predictions").mkdir(parents=True)
    first = predict(Xn, X, alpha, "rbf", out=str(tmp_path / "e"), progress=False).to_numpy()
    again = predict(Xn, X, 2 * alpha, "rbf", out=str(tmp_path / "e"), overwrite=True,
                    progress=False)  # fmt: skip
    np.testing.assert_allclose(again.to_numpy(), 2 * first)
    # and open_tiled_array itself: the same rule for every stored array
    with pytest.raises(ForeignPathError):
        open_tiled_array(str(out), "predictions", (4, 4), 2, "f8", "fp", overwrite=True)
    assert thesis.read_bytes() == THESIS


def _stages():
    def work(stage_dir: Path, inputs, **params):
        (stage_dir / "result.txt").write_text(str(params))
        return {"p": params.get("p")}

    return [Stage("a", work), Stage("b", work, after=("a",))]


def test_force_new_keeps_files_the_pipeline_did_not_write(tmp_path, caplog):
    run = tmp_path / "run"
    run_stages(run, _stages(), {"a": {"p": 1}, "b": {"p": 2}}, identity={"data": 1})
    (run / "notes.md").write_text("mine")
    (run / "plots").mkdir()
    (run / "plots" / "fig.png").write_bytes(b"png")
    (run / ".lock").write_text("{}")
    with caplog.at_level(logging.WARNING, logger="pipeline.stages"):
        rep = run_stages(run, _stages(), {"a": {"p": 1}, "b": {"p": 3}}, identity={"data": 2},
                         force_new=True)  # fmt: skip
    assert rep.ran == ["a", "b"]
    assert (run / "notes.md").read_text() == "mine"
    assert (run / "plots" / "fig.png").read_bytes() == b"png"
    assert (run / ".lock").exists()
    assert (run / "b" / "result.txt").read_text() == "{'p': 3}"
    assert "notes.md" in caplog.text and "plots" in caplog.text and "did not create" in caplog.text
    # a stage directory the manifest does not record is not adopted (nor ever emptied)
    other = tmp_path / "other"
    (other / "b").mkdir(parents=True)
    (other / "b" / "draft.txt").write_text("mine too")
    with pytest.raises(RunDirConflict, match="draft|never ran here"):
        run_stages(other, _stages(), {"a": {"p": 1}, "b": {"p": 2}}, identity={"data": 1})
    assert (other / "b" / "draft.txt").read_text() == "mine too"


@pytest.mark.parametrize("value", ["/", "~", "HOME", "."])
def test_run_dir_root_home_or_cwd_refused(value, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    monkeypatch.chdir(tmp_path)
    run_dir = str(tmp_path / "home") if value == "HOME" else value
    base = {"data": {"source": "sklearn", "name": "diabetes"}}
    shown = str(tmp_path / "home") if value == "~" else run_dir  # "~" is expanded first
    with pytest.raises(ConfigError, match=f"run_dir {shown!r} is"):
        load_config({**base, "run_dir": run_dir})
    conf = tmp_path / "c.yaml"
    conf.write_text("data: {source: sklearn, name: diabetes}\n")
    assert cli.main(["run", str(conf), f"run_dir='{run_dir}'"]) == cli.EXIT_BAD_CONFIG
    assert cli.main(["run", str(conf), "--run-dir", run_dir]) == cli.EXIT_BAD_CONFIG
    assert sorted(os.listdir(tmp_path)) == ["c.yaml", "home"]  # nothing was created


@pytest.mark.parametrize("name", ["../../x", "a/b", "..", "a\\b"])
def test_run_name_must_stay_inside_runs(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="plain directory name"):
        load_config({"data": {"source": "sklearn", "name": "diabetes"}, "name": name})
    conf = tmp_path / "c.yaml"
    conf.write_text("data: {source: sklearn, name: diabetes}\n")
    assert cli.main(["run", str(conf), f"name={name}"]) == cli.EXIT_BAD_CONFIG
    assert not (tmp_path / "x").exists() and not (tmp_path.parent / "x").exists()


@pytest.mark.parametrize("ext", ["npy", "csv"])
def test_krr_predict_never_replaces_a_users_file_output(model_and_input, tmp_path, capsys, ext):
    # a .npy/.csv output was renamed over whatever was there, --overwrite or not (session 25)
    art, _, xn = model_and_input
    precious = tmp_path / f"precious.{ext}"
    precious.write_bytes(THESIS)
    for extra in ([], ["--overwrite"]):
        code = cli.main(["predict", str(art), str(xn), str(precious), *extra])
        assert code == cli.EXIT_BAD_INPUT
        err = capsys.readouterr().err
        assert str(precious) in err and "did not write" in err and "another output path" in err
        assert precious.read_bytes() == THESIS
    # our own predictions: written with a record beside them, replaced only with --overwrite
    out = tmp_path / f"pred.{ext}"
    assert cli.main(["predict", str(art), str(xn), str(out)]) == 0
    first = out.read_bytes()
    assert Path(f"{out}.krr-pipeline.json").is_file()
    assert cli.main(["predict", str(art), str(xn), str(out)]) == cli.EXIT_BAD_INPUT
    assert "--overwrite" in capsys.readouterr().err
    assert cli.main(["predict", str(art), str(xn), str(out), "--overwrite"]) == 0
    assert out.read_bytes() == first
    # a directory at a file output's path is refused too
    (tmp_path / f"d.{ext}").mkdir()
    assert (
        cli.main(["predict", str(art), str(xn), str(tmp_path / f"d.{ext}")]) == cli.EXIT_BAD_INPUT
    )


def test_krr_run_refuses_a_users_file_as_predict_output_before_any_stage(tmp_path, capsys):
    import yaml

    np.save(tmp_path / "new.npy", np.zeros((5, 10)))
    precious = tmp_path / "precious.csv"
    precious.write_bytes(THESIS)
    conf = tmp_path / "conf.yaml"
    conf.write_text(yaml.safe_dump({
        "data": {"source": "sklearn", "name": "diabetes"},
        "kernel": {"name": "rbf"}, "lambda": 0.5, "evaluate": {"baseline": "none"},
        "predict": {"input": str(tmp_path / "new.npy"), "output": str(precious)},
    }))  # fmt: skip
    code = cli.main(["run", str(conf), "--run-dir", str(tmp_path / "run")])
    assert code == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "predict.output" in err and str(precious) in err and "[ingest]" not in err
    assert precious.read_bytes() == THESIS
    assert not (tmp_path / "run" / "ingest").exists()


def test_a_zarr_output_is_not_written_among_a_users_files(model_and_input, tmp_path):
    _, X, xn = model_and_input
    out = tmp_path / "mine.zarr"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ForeignPathError, match="not a Zarr store"):
        predict(np.load(xn), X, np.ones(len(X)), "rbf", out=str(out), progress=False)
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_a_run_sweeps_only_its_own_temporary_files_in_the_run_directory(tmp_path):
    # every run removed any top-level "*.<32 hex>.tmp" or ".partial" file older than it,
    # a user's export.<hex>.tmp included (session 25)
    import time

    run = tmp_path / "run"
    run.mkdir()
    hexa = "0123456789abcdef" * 2
    users = [run / f"export.{hexa}.tmp", run / f"download.{hexa}.partial", run / "notes.txt"]
    for p in users:
        p.write_text("mine")
    dead = 2**22 + 12345  # above Linux's default pid_max: no live process has it
    stale = run / f"manifest.json.{dead}-{hexa}.tmp"
    stale.write_text("{}")
    old = time.time() - 3600
    for p in [*users, stale]:
        os.utime(p, (old, old))
    run_stages(run, _stages(), {"a": {"p": 1}, "b": {"p": 2}}, identity={"data": 1})
    assert all(p.read_text() == "mine" for p in users)
    assert not stale.exists()


def test_a_users_lock_file_or_link_is_neither_written_nor_removed(tmp_path):
    # a user's ".lock" was truncated, rewritten and deleted by a run, one that was a
    # symbolic link overwrote its target, and `krr unlock` removed any ".lock"
    # (session 26)
    from pipeline.stages.lock import RunDirUnusable, RunLock, unlock

    mine = tmp_path / "proj"
    mine.mkdir()
    (mine / ".lock").write_text("my lock notes")
    with pytest.raises(RunDirUnusable, match="not a krr-pipeline lock record"):
        RunLock(mine).acquire()
    with pytest.raises(RunDirUnusable, match="not a krr-pipeline lock record"):
        unlock(mine)
    assert (mine / ".lock").read_text() == "my lock notes"
    (mine / ".lock").write_text("")  # empty, and no manifest: not a run directory
    with pytest.raises(RunDirUnusable, match="not a run directory"):
        unlock(mine)
    assert (mine / ".lock").exists()
    linked = tmp_path / "linked"
    linked.mkdir()
    (tmp_path / "secret.txt").write_text("secret")
    (linked / ".lock").symlink_to(tmp_path / "secret.txt")
    for call in (lambda: RunLock(linked).acquire(), lambda: unlock(linked)):
        with pytest.raises(RunDirUnusable, match="symbolic link"):
            call()
    assert (tmp_path / "secret.txt").read_text() == "secret"
    with RunLock(tmp_path / "run") as lock:  # a run directory of ours still locks/unlocks
        assert lock.read_owner()["pid"] == os.getpid()
    assert not (tmp_path / "run" / ".lock").exists()


def test_a_users_latest_json_and_a_linked_stage_directory_are_left_alone(tmp_path):
    # a user's latest.json was replaced at the end of a run; a stage directory replaced
    # by a link was emptied through it when its stage had to run again (session 26)
    run = tmp_path / "run"
    run.mkdir()
    (run / "latest.json").write_text('{"my": "release notes"}')
    with pytest.raises(RunDirConflict, match="latest.json"):
        run_stages(run, _stages(), {"a": {"p": 1}, "b": {"p": 2}}, identity={"data": 1})
    assert (run / "latest.json").read_text() == '{"my": "release notes"}'
    (run / "latest.json").unlink()
    run_stages(run, _stages(), {"a": {"p": 1}, "b": {"p": 2}}, identity={"data": 1})
    big = tmp_path / "bigdisk"
    (run / "b").rename(big)
    (big / "other_project.csv").write_text("mine")
    (run / "b").symlink_to(big)
    with pytest.raises(RunDirConflict, match="symbolic link"):
        run_stages(run, _stages(), {"a": {"p": 1}, "b": {"p": 3}}, identity={"data": 1})
    assert (big / "other_project.csv").read_text() == "mine"
