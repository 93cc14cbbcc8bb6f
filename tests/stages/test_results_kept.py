"""Results are kept, not replaced (issue #20, item 3).

A run directory keeps each distinct configuration's solve, model, predictions and
metrics in ``results/<key>/``, with a ``latest`` pointer; ``ingest`` and ``gram``
are shared and computed once; rerunning an earlier configuration skips it (after
verifying its outputs); ``krr status`` and ``run_status`` list the
configurations with their metrics; ``krr predict RUN_DIR`` uses the latest model.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest

from pipeline import cli
from pipeline.models.artifact import load_artifact
from pipeline.stages import default_stages, run_stages
from pipeline.stages.config import load_config
from pipeline.stages.evaluate import metrics_file_view
from pipeline.stages.manifest import Manifest, ManifestError
from pipeline.stages.status import latest_model, run_status

BASE = {
    "data": {"source": "sklearn", "name": "diabetes"},
    "split": {"test_fraction": 0.25},
    "preprocess": {"standardize_y": True},
    "kernel": {"name": "rbf", "params": {"gamma": 0.05}},
    "lambda": 0.5,
    "solver": {"method": "cholesky"},
    "block_size": 128,
    "evaluate": {"baseline": "none"},
}
PER_CONFIG = ("solve", "model", "predict", "evaluate")


def _go(run: Path, *overrides: str, stages=None, **kw):
    cfg = load_config(BASE, list(overrides))
    return run_stages(
        run, stages or default_stages(), cfg.stage_params(), identity=cfg.identity(), **kw
    )


def _mtimes(d: Path) -> dict[str, int]:
    return {str(p.relative_to(d)): p.stat().st_mtime_ns for p in sorted(d.rglob("*"))}


@pytest.fixture(scope="module")
def kept(tmp_path_factory):
    """λ = 0.5, then λ = 1e-3, in one run directory (not modified by the tests: copy it)."""
    run = tmp_path_factory.mktemp("kept") / "run"
    first = _go(run)
    gram = _mtimes(run / "gram")
    second = _go(run, "lambda=1e-3")
    return run, first, second, gram


def _copy(kept, tmp_path: Path) -> Path:
    dest = tmp_path / "run"
    shutil.copytree(kept[0], dest)  # manifest paths are relative (@run/): a copy is a run dir
    return dest


def test_two_lambdas_keep_both_results_and_share_ingest_and_gram(kept):
    run, first, second, gram = kept
    assert first.ran == ["ingest", "gram", *PER_CONFIG]
    assert second.skipped_done == ["ingest", "gram"] and second.ran == list(PER_CONFIG)
    assert _mtimes(run / "gram") == gram  # the shared Gram was computed once
    a, b = first.configuration, second.configuration
    assert a and b and a != b
    m = Manifest.load(run)
    assert set(m.results) == {a, b} and m.latest == b
    for key in (a, b):
        d = run / "results" / key
        assert all((d / s).is_dir() for s in PER_CONFIG)
        assert (d / "evaluate" / "metrics.json").is_file()
        assert m.results[key].params["solve"]["lam"] in (0.5, 1e-3)
    # both models, both sets of metrics, each matching its own run
    ma = load_artifact(run / "results" / a / "model" / "model")
    mb = load_artifact(run / "results" / b / "model" / "model")
    assert ma.regularization == 0.5 and mb.regularization == 1e-3
    assert not np.allclose(ma.dual_coef, mb.dual_coef)
    ev = {
        k: json.loads((run / "results" / k / "evaluate" / "metrics.json").read_text())
        for k in (a, b)
    }
    assert ev[a]["metrics"] == first.outputs["evaluate"]["metrics"]
    assert ev[b]["metrics"] == second.outputs["evaluate"]["metrics"]
    assert ev[a]["metrics"]["r2"] != ev[b]["metrics"]["r2"]
    # the old layout's top-level per-configuration directories are not written any more
    assert not any((run / s).exists() for s in PER_CONFIG)
    latest = json.loads((run / "latest.json").read_text())
    assert latest["configuration"] == b and latest["dir"] == f"results/{b}"
    assert latest["model"] == f"results/{b}/model/model"
    assert latest["metrics"] == second.outputs["evaluate"]["metrics"]


def test_rerunning_an_earlier_lambda_skips_it_and_moves_latest(kept, tmp_path):
    run = _copy(kept, tmp_path)
    a = kept[1].configuration
    before = _mtimes(run / "results" / a)
    again = _go(run)  # lambda = 0.5 again
    assert again.ran == [] and again.skipped_done == ["ingest", "gram", *PER_CONFIG]
    assert again.configuration == a
    assert _mtimes(run / "results" / a) == before  # nothing recomputed or rewritten
    assert json.loads((run / "latest.json").read_text())["configuration"] == a
    assert Manifest.load(run).latest == a
    assert latest_model(run) == str(run / "results" / a / "model" / "model")
    # the manifest's "stages" records are the latest configuration's
    m = json.loads((run / "manifest.json").read_text())
    assert m["stages"]["model"]["outputs"]["path"] == f"@run/results/{a}/model/model"
    # the same metrics (the held-out arrays' paths name this copy of the run directory)
    assert metrics_file_view(again.outputs["evaluate"]) == metrics_file_view(
        kept[1].outputs["evaluate"]
    )


def test_leaving_a_configuration_frees_its_factor_not_its_results(kept):
    run, first, second, _ = kept
    old = run / "results" / first.configuration / "solve"
    new = run / "results" / second.configuration / "solve"
    assert not (old / "factor.zarr").exists() and (old / "alpha.npy").is_file()
    assert (new / "factor.zarr").is_dir()  # the latest keeps it (to resume a solve)


def test_status_lists_configurations_with_metrics(kept, capsys):
    run, first, second, _ = kept
    st = run_status(run)
    assert st["latest"] == second.configuration
    by = {c["configuration"]: c for c in st["configurations"]}
    assert list(by) == [first.configuration, second.configuration]  # oldest first
    for rep, lam in ((first, 0.5), (second, 1e-3)):
        c = by[rep.configuration]
        assert c["lam"] == lam and c["method"] == "cholesky" and c["state"] == "done"
        assert c["kernel"]["name"] == "rbf" and c["metrics"] == rep.outputs["evaluate"]["metrics"]
        assert c["latest"] == (rep is second)
    solve = {s["stage"]: s for s in st["stages"]}["solve"]
    assert solve["dir"] == f"results/{second.configuration}/solve"
    assert cli.main(["status", str(run)]) == 0
    out = capsys.readouterr().out
    assert "configurations (2 kept; * = latest)" in out
    rmse_a = first.outputs["evaluate"]["metrics"]["rmse"]
    lines = [ln for ln in out.splitlines() if first.configuration in ln and "lambda=0.5" in ln]
    assert lines and f"rmse {rmse_a:.6g}" in lines[0] and not lines[0].lstrip().startswith("*")
    assert any(ln.lstrip().startswith(f"* {second.configuration}") for ln in out.splitlines())
    assert cli.main(["status", str(run), "--json"]) == 0
    js = json.loads(capsys.readouterr().out)
    assert [c["configuration"] for c in js["configurations"]] == list(by)


def test_corrupt_model_of_an_old_configuration_is_detected_on_reuse(kept, tmp_path, caplog, flip):
    run = _copy(kept, tmp_path)
    a = kept[1].configuration
    want = np.asarray(load_artifact(run / "results" / a / "model" / "model").dual_coef)
    chunk = next(p for p in (run / "results" / a / "model" / "model" / "dual_coef").rglob("*")
                 if p.is_file() and p.parent.name != "dual_coef")  # fmt: skip
    flip(chunk)
    with caplog.at_level(logging.WARNING, logger="pipeline.stages"):
        again = _go(run)
    assert "failed verification" in caplog.text
    assert "model" in again.ran and "solve" in again.skipped_done
    got = np.asarray(load_artifact(latest_model(run)).dual_coef)
    np.testing.assert_array_equal(got, want)


def test_corrupt_metrics_of_an_old_configuration_are_recomputed(kept, tmp_path):
    run = _copy(kept, tmp_path)
    a = kept[1].configuration
    path = run / "results" / a / "evaluate" / "metrics.json"
    path.write_text(json.dumps({"metrics": {"r2": 0.99}}))
    again = _go(run)
    assert again.ran == ["evaluate"]
    assert json.loads(path.read_text())["metrics"] == kept[1].outputs["evaluate"]["metrics"]


def test_damaged_alpha_of_a_configuration_is_recovered_by_its_solve(kept, tmp_path, flip):
    run = _copy(kept, tmp_path)
    b = kept[2].configuration
    alpha = run / "results" / b / "solve" / "alpha.npy"
    good = alpha.read_bytes()
    flip(alpha, offset=200)
    m = Manifest.load(run)
    m.stages["model"].status = "failed"  # so the model stage reads alpha again
    m.save()
    rep = _go(run, "lambda=1e-3")
    # the store results/<key>/solve is mapped to the solve stage, which recomputes alpha
    assert [r["owner"] for r in rep.recovered] == ["solve"]
    assert alpha.read_bytes() == good
    assert rep.outputs["evaluate"]["metrics"] == kept[2].outputs["evaluate"]["metrics"]


def test_krr_predict_run_dir_uses_the_latest_model(kept, tmp_path, capsys):
    run, first, second, _ = kept
    X = np.random.default_rng(0).normal(size=(7, 10))
    np.save(tmp_path / "new.npy", X)
    assert cli.main(["predict", str(run), str(tmp_path / "new.npy"), str(tmp_path / "p.npy")]) == 0
    want = load_artifact(run / "results" / second.configuration / "model" / "model").predict(X)
    np.testing.assert_allclose(np.load(tmp_path / "p.npy").reshape(want.shape), want, rtol=1e-12)


def test_latest_without_a_model_is_a_clear_error(kept, tmp_path, capsys):
    run = _copy(kept, tmp_path)
    rep = _go(run, "lambda=0.2", until="solve")
    with pytest.raises(ValueError, match=f"configuration {rep.configuration}.*krr status"):
        latest_model(run)
    np.save(tmp_path / "new.npy", np.zeros((2, 10)))
    code = cli.main(["predict", str(run), str(tmp_path / "new.npy"), str(tmp_path / "p.npy")])
    assert code == cli.EXIT_BAD_INPUT and "has no complete model" in capsys.readouterr().err
    assert [c["state"] for c in run_status(run)["configurations"]] == ["done", "done", "partial"]


def test_force_new_removes_every_configuration_and_keeps_user_files(kept, tmp_path, caplog):
    run = _copy(kept, tmp_path)
    (run / "results" / "notes.txt").write_text("mine")
    with caplog.at_level(logging.WARNING, logger="pipeline.stages"):
        rep = _go(run, "data.name=linnerud", "data.target=Weight", until="ingest", force_new=True)
    assert rep.ran == ["ingest"]
    assert (run / "results" / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in (run / "results").iterdir()) == ["notes.txt"]
    assert not (run / "latest.json").exists() and not (run / "gram").exists()
    assert "results" in caplog.text and "did not create" in caplog.text
    assert Manifest.load(run).results == {}


def test_old_layout_is_adopted_as_a_configuration(tmp_path):
    """A run directory written before results were kept: its top-level solve/... stay owned."""
    run = tmp_path / "run"
    legacy = [dataclasses.replace(s, per_config=False) for s in default_stages()]
    _go(run, stages=legacy)
    assert (run / "model" / "model").is_dir()
    rep = _go(run)  # the same configuration, new layout: found complete where it is
    assert rep.ran == [] and rep.configuration
    m = Manifest.load(run)
    assert m.results[rep.configuration].dir == ""
    assert latest_model(run) == str(run / "model" / "model")
    rep2 = _go(run, "lambda=0.1")
    assert rep2.ran == list(PER_CONFIG) and (run / "results" / rep2.configuration).is_dir()
    assert (run / "model" / "model").is_dir()  # the old configuration's results are kept
    assert [c["dir"] for c in run_status(run)["configurations"]] == [
        "",
        f"results/{rep2.configuration}",
    ]
    _go(run, "data.name=linnerud", "data.target=Weight", until="ingest", force_new=True)
    assert not (run / "model").exists() and not (run / "results").exists()


def test_manifest_refuses_a_configuration_directory_outside_results(kept, tmp_path):
    run = _copy(kept, tmp_path)
    d = json.loads((run / "manifest.json").read_text())
    key = d["latest"]
    d["results"][key]["dir"] = "../elsewhere"
    (run / "manifest.json").write_text(json.dumps(d))
    with pytest.raises(ManifestError, match="configuration record"):
        Manifest.load(run)


def test_an_unconverged_solve_is_resumed_by_the_configuration_its_message_advises(tmp_path):
    # "set solver.allow_unconverged=true" / "raise solver.max_iter" made a new
    # configuration that recomputed every CG iteration from zero (session 26)
    from pipeline.stages import StageFailed, run_config

    rng = np.random.default_rng(0)
    np.save(tmp_path / "X.npy", rng.normal(size=(600, 4)))
    np.save(tmp_path / "y.npy", rng.normal(size=600))
    cfg = {"data": {"source": "npy", "path": str(tmp_path / "X.npy"),
                    "y_path": str(tmp_path / "y.npy")},
           "split": {"test_fraction": 0.1, "seed": 0},
           "kernel": {"name": "rbf", "params": {"gamma": 0.5}}, "lambda": 1e-3,
           "block_size": 200, "evaluate": {"baseline": "none"},
           "solver": {"method": "cg", "matvec": "recompute", "preconditioner": "jacobi",
                      "tol": 1e-12, "max_iter": 30, "checkpoint_every": 10,
                      "cg_precision": "float64"}}  # fmt: skip
    with pytest.raises(StageFailed, match="did not converge"):
        run_config(cfg, tmp_path / "run")

    def solve_details(rep):
        out = rep.outputs["solve"]
        return out.get("details", out)

    more = {**cfg, "solver": {**cfg["solver"], "max_iter": 40}}
    with pytest.raises(StageFailed, match="after 40 iterations"):
        run_config(more, tmp_path / "run")
    fewer = {**cfg, "solver": {**cfg["solver"], "allow_unconverged": True, "max_iter": 10}}
    rep = run_config(fewer, tmp_path / "run")  # a state past its max_iter is not its answer
    assert solve_details(rep)["resumed_from"] == 0 and solve_details(rep)["n_iter"] == 10
    fresh = run_config(fewer, tmp_path / "fresh")
    assert rep.outputs["evaluate"]["metrics"] == fresh.outputs["evaluate"]["metrics"]
    accept = {**cfg, "solver": {**cfg["solver"], "allow_unconverged": True, "max_iter": 40}}
    rep = run_config(accept, tmp_path / "run")
    assert solve_details(rep)["resumed_from"] == 40  # the state of the max_iter=40 run


def test_a_new_prediction_input_reuses_the_equal_solve_of_another_configuration(tmp_path):
    # a predict.* or evaluate.* change made a new configuration that solved again (a
    # 25-minute factor at 80k) for the same alpha (session 26)
    from pipeline.stages import run_config

    rng = np.random.default_rng(0)
    for name, m in (("new1", 7), ("new2", 9)):
        np.save(tmp_path / f"{name}.npy", rng.normal(size=(m, 10)) * 0.05)
    cfg = {"data": {"source": "sklearn", "name": "diabetes"},
           "kernel": {"name": "rbf", "params": {"gamma": 0.05}}, "lambda": 0.5,
           "solver": {"method": "cholesky"}, "block_size": 128,
           "evaluate": {"baseline": "none"},
           "predict": {"input": str(tmp_path / "new1.npy")}}  # fmt: skip
    first = run_config(cfg, tmp_path / "run")
    other = {**cfg, "predict": {"input": str(tmp_path / "new2.npy")}}
    second = run_config(other, tmp_path / "run")
    assert second.configuration != first.configuration
    assert "solve" in second.skipped_done and "predict" in second.ran
    fresh = run_config(other, tmp_path / "fresh")
    np.testing.assert_array_equal(np.load(second.outputs["solve"]["alpha"]),
                                  np.load(fresh.outputs["solve"]["alpha"]))  # fmt: skip
    assert second.outputs["solve"]["alpha"] != first.outputs["solve"]["alpha"]  # its own copy
    assert not (Path(second.outputs["solve"]["alpha"]).parent / "factor.zarr").exists()
    back = run_config(cfg, tmp_path / "run")
    assert back.ran == []


def test_reuse_never_takes_a_users_directory_nor_another_tilings_cg_state(tmp_path):
    # the copy marked every new configuration's stage as started before checking its
    # directory: a refused user directory was written into on the next run, and
    # deleted by --force-new; a CG state of another block_size (the matrix-free
    # product's fingerprint leaves its tiling out) gave another alpha (session 26)
    from pipeline.stages import RunDirConflict, StageFailed, run_config

    cfg = {"data": {"source": "sklearn", "name": "diabetes"},
           "kernel": {"name": "rbf", "params": {"gamma": 0.05}}, "lambda": 0.5,
           "solver": {"method": "cholesky"}, "block_size": 128,
           "evaluate": {"baseline": "none"}}  # fmt: skip
    run_config(cfg, tmp_path / "run")
    other = {**cfg, "evaluate": {"baseline": "none", "metrics": ["rmse"]}}
    key = run_config(other, tmp_path / "probe").configuration
    mine = tmp_path / "run" / "results" / key / "solve"
    mine.mkdir(parents=True)
    (mine / "notes.txt").write_text("mine")
    for _ in range(2):
        with pytest.raises(RunDirConflict, match="does not record"):
            run_config(other, tmp_path / "run")
    assert (mine / "notes.txt").read_text() == "mine"

    rng = np.random.default_rng(0)
    np.save(tmp_path / "X.npy", rng.normal(size=(500, 4)) * 3)
    np.save(tmp_path / "y.npy", rng.normal(size=500))
    cg = {"data": {"source": "npy", "path": str(tmp_path / "X.npy"),
                   "y_path": str(tmp_path / "y.npy")},
          "split": {"test_fraction": 0.1, "seed": 0}, "preprocess": {"standardize": False},
          "kernel": {"name": "rbf", "params": {"gamma": 0.2}}, "lambda": 1e-6,
          "block_size": 128, "evaluate": {"baseline": "none"},
          "solver": {"method": "cg", "matvec": "recompute", "preconditioner": "jacobi",
                     "tol": 1e-13, "max_iter": 30, "cg_precision": "float64"}}  # fmt: skip
    with pytest.raises(StageFailed, match="did not converge"):
        run_config(cg, tmp_path / "cgrun")
    b = {**cg, "block_size": 100,
         "solver": {**cg["solver"], "max_iter": 40, "allow_unconverged": True}}  # fmt: skip
    got = run_config(b, tmp_path / "cgrun")
    fresh = run_config(b, tmp_path / "cgfresh")
    assert got.outputs["solve"].get("resumed_from", 0) == 0
    np.testing.assert_array_equal(np.load(got.outputs["solve"]["alpha"]),
                                  np.load(fresh.outputs["solve"]["alpha"]))  # fmt: skip
