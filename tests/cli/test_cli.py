"""The ``krr`` command line: commands, exit codes, status, predict."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zarr

from pipeline import cli
from pipeline.stages.lock import RunLock

CONF = Path(__file__).resolve().parents[2] / "conf"


@pytest.fixture
def small(diabetes_config):
    return diabetes_config()


def run_cli(*argv):
    return cli.main([str(a) for a in argv])


def test_exit_codes_are_distinct_and_documented(capsys):
    codes = [
        cli.EXIT_OK,
        cli.EXIT_BAD_CONFIG,
        cli.EXIT_BAD_INPUT,
        cli.EXIT_STAGE_FAILED,
        cli.EXIT_LOCKED,
    ]
    assert len(set(codes)) == len(codes)
    assert set(codes) <= set(cli.EXIT_CODES)
    with pytest.raises(SystemExit):
        run_cli("run", "--help")
    out = capsys.readouterr().out
    for c in codes:
        assert f"{c:>3}  " in out


def test_validate(small, tmp_path, capsys):
    assert run_cli("validate", CONF / "demo.yaml") == 0
    assert run_cli("validate", small, "lambda=0.1") == 0
    capsys.readouterr()
    assert run_cli("validate", small, "kernel.parms.gamma=1") == cli.EXIT_BAD_CONFIG
    err = capsys.readouterr().err
    assert "unknown key" in err and "did you mean 'kernel.params'" in err
    assert run_cli("validate", small, "block_size=big") == cli.EXIT_BAD_CONFIG
    assert "block_size" in capsys.readouterr().err
    assert run_cli("validate", tmp_path / "missing.yaml") == cli.EXIT_BAD_CONFIG
    assert "does not exist" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("data: [unclosed\n")
    assert run_cli("validate", bad) == cli.EXIT_BAD_CONFIG
    assert "not valid YAML" in capsys.readouterr().err


def test_missing_data_file_is_bad_input(tmp_path, capsys):
    p = tmp_path / "f.yaml"
    p.write_text(f"data: {{source: npy, path: {tmp_path}/X.npy, y_path: {tmp_path}/y.npy}}\n")
    assert run_cli("validate", p) == cli.EXIT_BAD_INPUT
    assert run_cli("run", p, "--run-dir", tmp_path / "r") == cli.EXIT_BAD_INPUT
    assert "X.npy' does not exist" in capsys.readouterr().err


def test_invalid_data_is_bad_input(tmp_path, capsys):
    X = np.ones((20, 2))
    X[13, 1] = np.nan
    np.save(tmp_path / "X.npy", X)
    np.save(tmp_path / "y.npy", np.ones(20))
    p = tmp_path / "f.yaml"
    p.write_text(
        f"data: {{source: npy, path: {tmp_path}/X.npy, y_path: {tmp_path}/y.npy}}\n"
        "block_size: 8\ncluster: {processes: false, n_workers: 1}\n"
    )
    assert run_cli("run", p, "--run-dir", tmp_path / "r") == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "ingest" in err and "row block 1" in err


def test_lock_held_is_refused(small, tmp_path, capsys):
    run_dir = tmp_path / "r"
    with RunLock(run_dir):
        assert run_cli("run", small, "--run-dir", run_dir) == cli.EXIT_LOCKED
    assert "is locked by pid" in capsys.readouterr().err


def test_krr_run_goes_through_the_runner_of_pipeline_run(small, tmp_path, monkeypatch, capsys):
    """``krr run`` calls :func:`pipeline.stages.run_config` (``pipeline.run``), adding only
    its session (run.log, Dask client, exit codes); it re-implemented the runner before
    (issue #43). A resume of a partial solve reads the fit plan back: plan_fit runs once
    in the two runs (twice per run before: the gram stage's check and the solve)."""
    import pipeline.stages as stages
    import pipeline.stages.solve as solve_mod  # where the stages name plan_fit

    runs, plans = [], []
    real_run, real_plan = stages.run_config, solve_mod.plan_fit

    def run_config(config, run_dir=None, **kw):
        runs.append((run_dir, kw.get("session") is not None))
        return real_run(config, run_dir, **kw)

    monkeypatch.setattr(stages, "run_config", run_config)
    monkeypatch.setattr(
        solve_mod, "plan_fit", lambda *a, **k: plans.append(1) or real_plan(*a, **k)
    )
    run_dir = tmp_path / "r"
    assert run_cli("run", small, "--run-dir", run_dir, "--until", "gram", "--json") == 0
    assert json.loads(capsys.readouterr().out)["remaining"] == [
        "solve",
        "model",
        "predict",
        "evaluate",
    ]
    assert runs == [(run_dir, True)] and len(plans) == 1
    assert run_cli("run", small, "--run-dir", run_dir, "--json") == 0
    res = json.loads(capsys.readouterr().out)
    assert res["ran"] == ["solve", "model", "predict", "evaluate"] and res["solver"] == "cholesky"
    assert len(runs) == 2 and len(plans) == 1
    log_text = (run_dir / "run.log").read_text()
    assert "stopped after stage gram (--until): ran ingest, gram;" in log_text
    assert "run complete: ran solve, model, predict, evaluate;" in log_text


def test_unreachable_scheduler_fails_fast(small, tmp_path, capsys):
    t0 = time.perf_counter()
    code = run_cli(
        "run",
        small,
        "cluster.connect_timeout=0.5",
        "--scheduler",
        "tcp://127.0.0.1:9",
        "--run-dir",
        tmp_path / "r",
    )
    assert code == cli.EXIT_NO_SCHEDULER
    assert time.perf_counter() - t0 < 60
    assert "does not answer" in capsys.readouterr().err


def test_status_of_a_non_run_dir(tmp_path, capsys):
    assert run_cli("status", tmp_path) == cli.EXIT_BAD_INPUT
    assert "not a run directory" in capsys.readouterr().err


def test_run_status_rerun_predict_end_to_end(small, tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert run_cli("run", small, "--run-dir", run_dir) == 0
    out = capsys.readouterr().out
    assert "held-out metrics" in out and "scikit-learn" in out

    assert run_cli("status", run_dir, "--json") == 0
    st = json.loads(capsys.readouterr().out)
    assert st["complete"] and not st["running"]
    by = {s["stage"]: s for s in st["stages"]}
    assert by.pop("select")["state"] == "skipped"  # no cv section
    assert all(s["state"] == "done" for s in by.values())
    gram = {t["array"]: t for t in by["gram"]["tiles"]}["gram"]
    assert gram["done"] == gram["total"] == 6  # 332 rows in blocks of 128: 3 x 3 lower tiles

    # partial: remove a factor tile record and mark the stage as killed mid-run
    from pipeline.stages.manifest import Manifest

    m = Manifest.load(run_dir)
    m.stages["solve"].status = "running"
    m.save()
    solve_dir = m.stage_dir("solve")  # results/<configuration>/solve
    marker = sorted((solve_dir / "factor.zarr" / "_markers" / "chol").iterdir())[-1]
    marker.unlink()
    assert run_cli("status", run_dir) == 0
    text = capsys.readouterr().out
    assert "solve     partial" in text and "chol 5/6" in text and "incomplete" in text

    # resume: only the partial stage runs (its fingerprint is unchanged, so the
    # stages after it, complete under the same chain, stay valid)
    assert run_cli("run", small, "--run-dir", run_dir, "--json") == 0
    res = json.loads(capsys.readouterr().out)
    assert res["ran"] == ["solve"]
    assert res["skipped"] == ["ingest", "gram", "model", "predict", "evaluate"]
    ev = res["evaluate"]
    assert ev["baseline"]["max_rel_prediction_difference"] < 1e-8

    # a run dir owned by other data is refused
    assert run_cli("run", small, "data.name=linnerud", "--run-dir", run_dir) == cli.EXIT_BAD_CONFIG
    assert "--force-new" in capsys.readouterr().err

    # krr predict with the saved model reproduces the run's test predictions
    ing = Manifest.load(run_dir).stages["ingest"].outputs
    X_test = zarr.open_array(store=ing["store"], path="X_test", mode="r")[...]
    np.save(tmp_path / "new.npy", X_test)
    model = res["model"]
    assert run_cli("predict", model, tmp_path / "new.npy", tmp_path / "pred.npy") == 0
    assert run_cli("predict", model, tmp_path / "new.npy", tmp_path / "pred.zarr") == 0
    pred = np.load(tmp_path / "pred.npy")
    pred_dir = Manifest.load(run_dir).stage_dir("predict")
    run_pred = zarr.open_array(store=str(pred_dir / "predictions.zarr"), path="test")[...]
    np.testing.assert_allclose(pred, run_pred.reshape(pred.shape), rtol=1e-12)
    batch = zarr.open_array(store=str(tmp_path / "pred.zarr"), path="predictions", mode="r")[...]
    np.testing.assert_allclose(batch, pred, rtol=1e-12)
    assert (
        run_cli("predict", tmp_path / "nomodel", tmp_path / "new.npy", tmp_path / "p.npy")
        == cli.EXIT_BAD_INPUT
    )
    assert (
        run_cli("predict", model, tmp_path / "nothing.npy", tmp_path / "p.npy")
        == cli.EXIT_BAD_INPUT
    )
    np.save(tmp_path / "wrong.npy", X_test[:, :3])
    assert (
        run_cli("predict", model, tmp_path / "wrong.npy", tmp_path / "p.npy") == cli.EXIT_BAD_INPUT
    )


def test_entry_point_runs(tmp_path):
    """The installed ``krr`` script (plain logs, no TTY)."""
    exe = Path(sys.executable).with_name("krr")
    # the two commands side by side (each a new interpreter's imports, seconds)
    procs = [
        subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for argv in ([str(exe), "validate", str(CONF / "diabetes.yaml")], [str(exe)])
    ]
    out = [p.communicate(timeout=300) for p in procs]
    p = subprocess.CompletedProcess(procs[0].args, procs[0].returncode, *out[0])
    assert p.returncode == 0, p.stderr
    assert "is valid" in p.stdout
    p = subprocess.CompletedProcess(procs[1].args, procs[1].returncode, *out[1])
    assert p.returncode == cli.EXIT_BAD_CONFIG and "usage" in p.stdout


@pytest.mark.slow
def test_scheduled_refit_workflow_is_idempotent(tmp_path, krr_main):
    """workflows/scheduled/refit_and_predict.sh: fit + predict, then a rerun does no work.

    The script runs in bash as a job would; its ``$KRR`` commands run in this process
    (:func:`_krr_relay.run_relayed`: a relay prints what ``krr`` printed and exits with its
    code), not four new interpreters' imports; ``test_entry_point_runs`` runs the
    installed ``krr``."""
    from _krr_relay import run_relayed
    from sklearn.datasets import load_diabetes

    X, y = load_diabetes(return_X_y=True)
    np.save(tmp_path / "X.npy", X[:300])
    np.save(tmp_path / "y.npy", y[:300])
    np.save(tmp_path / "score.npy", X[300:])
    root = Path(__file__).resolve().parents[2]
    env = {
        **__import__("os").environ,
        "RUNS": str(tmp_path / "runs"),
        "KRR_OVERRIDES": "cluster.processes=false cluster.n_workers=1 block_size=128 "
        "evaluate.baseline=none preprocess.standardize_y=true lambda=0.5 kernel.params.gamma=0.05",
    }
    cmd = [
        "bash", str(root / "workflows/scheduled/refit_and_predict.sh"), str(root / "conf/files.yaml"),
        str(tmp_path / "X.npy"), str(tmp_path / "y.npy"), str(tmp_path / "score.npy"), str(tmp_path / "out"),
    ]  # fmt: skip
    first = run_relayed(cmd, env, krr_main)
    assert first.returncode == 0, first.stderr
    latest = tmp_path / "out" / "latest.zarr"
    pred = zarr.open_array(store=str(latest), path="predictions", mode="r")[...]
    assert pred.shape == (X.shape[0] - 300,) and np.all(np.isfinite(pred))
    second = run_relayed(cmd, env, krr_main)
    assert second.returncode == 0, second.stderr
    assert "ran: -;" in second.stdout  # every stage already complete
    assert "0 of 1 row blocks computed (1 already complete)" in second.stderr
    again = zarr.open_array(store=str(latest), path="predictions", mode="r")[...]
    np.testing.assert_array_equal(again, pred)


def test_sklearn_baseline_is_skipped_when_its_kernel_would_not_fit(
    small, tmp_path, monkeypatch, capsys
):
    import pipeline.stages.evaluate as evaluate

    monkeypatch.setattr(evaluate, "available_memory", lambda: 1_000)
    run_dir = tmp_path / "run"
    assert run_cli("run", small, "evaluate.baseline=sklearn", "--run-dir", run_dir, "--json") == 0
    ev = json.loads(capsys.readouterr().out)["evaluate"]
    assert ev["baseline"] is None
    assert "more than the memory available" in ev["baseline_note"]
    assert set(ev["metrics"]) >= {"rmse"}


def test_non_finite_given_test_targets_are_bad_input(tmp_path, capsys):
    rng = np.random.default_rng(0)
    np.save(tmp_path / "X.npy", rng.normal(size=(20, 2)))
    np.save(tmp_path / "y.npy", rng.normal(size=20))
    np.save(tmp_path / "Xt.npy", rng.normal(size=(6, 2)))
    yt = rng.normal(size=6)
    yt[4] = np.inf
    np.save(tmp_path / "yt.npy", yt)
    p = tmp_path / "f.yaml"
    p.write_text(
        f"data: {{source: npy, path: {tmp_path}/X.npy, y_path: {tmp_path}/y.npy}}\n"
        f"split: {{test_path: {tmp_path}/Xt.npy, test_y_path: {tmp_path}/yt.npy}}\n"
        "block_size: 8\ncluster: {processes: false, n_workers: 1}\n"
    )
    assert run_cli("run", p, "--run-dir", tmp_path / "r") == cli.EXIT_BAD_INPUT
    assert "y_test" in capsys.readouterr().err


def _test_set_conf(tmp_path, data: str, split: str):
    p = tmp_path / "t.yaml"
    p.write_text(
        f"data: {data}\nsplit: {split}\n"
        "kernel: {name: rbf, params: {gamma: 0.5}}\nlambda: 0.01\nblock_size: 16\n"
        "evaluate: {baseline: none}\ncluster: {processes: false, n_workers: 1}\n"
    )
    return p


def test_a_csv_test_set_is_read_by_the_training_columns_names(tmp_path, capsys):
    # its features were taken in the test file's own order: columns b,a read as a,b gave
    # r2 -1.2 instead of 0.999 with exit 0 (session 25)
    import json

    import pandas as pd

    rng = np.random.default_rng(0)
    tr, te = rng.normal(size=(60, 2)), rng.normal(size=(20, 2))
    f = lambda A: 2 * A[:, 0] - A[:, 1] ** 2  # noqa: E731
    pd.DataFrame({"a": tr[:, 0], "b": tr[:, 1], "y": f(tr)}).to_csv(
        tmp_path / "tr.csv", index=False
    )
    r2 = {}
    for name, cols in (("same", ["a", "b", "y"]), ("swapped", ["b", "y", "a"])):
        df = pd.DataFrame({"a": te[:, 0], "b": te[:, 1], "y": f(te)})[cols]
        df.to_csv(tmp_path / f"{name}.csv", index=False)
        p = _test_set_conf(
            tmp_path,
            f"{{source: csv, path: {tmp_path}/tr.csv, target: y}}",
            f"{{test_path: {tmp_path}/{name}.csv}}",
        )
        assert run_cli("run", p, "--run-dir", tmp_path / name, "--json") == 0
        r2[name] = json.loads(capsys.readouterr().out)["evaluate"]["metrics"]["r2"]
    assert r2["same"] > 0.5 and r2["swapped"] == r2["same"]
    # a test file without a training column is refused, naming it
    pd.DataFrame({"a": te[:, 0], "c": te[:, 1], "y": f(te)}).to_csv(tmp_path / "c.csv", index=False)
    p = _test_set_conf(
        tmp_path,
        f"{{source: csv, path: {tmp_path}/tr.csv, target: y}}",
        f"{{test_path: {tmp_path}/c.csv}}",
    )
    assert run_cli("run", p, "--run-dir", tmp_path / "c") == cli.EXIT_BAD_INPUT
    assert "'b'" in capsys.readouterr().err


def test_a_test_sets_y_with_other_outputs_is_refused_before_any_work(tmp_path, capsys):
    rng = np.random.default_rng(0)
    np.save(tmp_path / "X.npy", rng.normal(size=(40, 2)))
    np.save(tmp_path / "y.npy", rng.normal(size=40))
    np.save(tmp_path / "Xt.npy", rng.normal(size=(10, 2)))
    np.save(tmp_path / "yt.npy", rng.normal(size=(10, 2)))
    data = f"{{source: npy, path: {tmp_path}/X.npy, y_path: {tmp_path}/y.npy}}"
    p = _test_set_conf(
        tmp_path, data, f"{{test_path: {tmp_path}/Xt.npy, test_y_path: {tmp_path}/yt.npy}}"
    )
    assert run_cli("run", p, "--run-dir", tmp_path / "r") == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "2 output column(s) but the training y has 1" in err and "[gram]" not in err
    # and a npy test set without its targets names split.test_y_path (a config error
    # since session 26: `krr validate` says so too)
    p = _test_set_conf(tmp_path, data, f"{{test_path: {tmp_path}/Xt.npy}}")
    assert run_cli("run", p, "--run-dir", tmp_path / "r2") == cli.EXIT_BAD_CONFIG
    assert "split.test_y_path" in capsys.readouterr().err


def test_file_urls_name_local_paths(tmp_path, monkeypatch, capsys):
    # --run-dir file:///abs/run wrote under ./file:/abs/run in the working directory, and
    # data.path file:///abs/X.npy was "not found" (session 25)
    rng = np.random.default_rng(0)
    np.save(tmp_path / "X.npy", rng.normal(size=(40, 2)))
    np.save(tmp_path / "y.npy", rng.normal(size=40))
    data = f"{{source: npy, path: 'file://{tmp_path}/X.npy', y_path: 'file://{tmp_path}/y.npy'}}"
    p = _test_set_conf(tmp_path, data, "{test_fraction: 0.25}")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    assert run_cli("run", p, "--run-dir", f"file://{tmp_path}/run") == 0
    assert (tmp_path / "run" / "manifest.json").is_file()
    assert list(cwd.iterdir()) == []


def test_a_tsv_source_and_an_empty_source(tmp_path, capsys):
    import pandas as pd

    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 2))
    df = pd.DataFrame({"a": X[:, 0], "b": X[:, 1], "y": X[:, 0] - X[:, 1]})
    df.to_csv(tmp_path / "d.tsv", sep="\t", index=False)
    # the column names of a .tsv were read with sep="," (one column "a\tb\ty")
    p = _test_set_conf(tmp_path, f"{{source: csv, path: {tmp_path}/d.tsv, target: y}}", "{}")
    assert run_cli("run", p, "--run-dir", tmp_path / "tsv") == 0
    # no rows: refused by the ingest as bad input, not a gram-stage failure with a rerun hint
    np.save(tmp_path / "X0.npy", np.zeros((0, 2)))
    np.save(tmp_path / "y0.npy", np.zeros(0))
    data = f"{{source: npy, path: {tmp_path}/X0.npy, y_path: {tmp_path}/y0.npy}}"
    p = _test_set_conf(tmp_path, data, "{test_fraction: 0.0}")
    capsys.readouterr()
    assert run_cli("run", p, "--run-dir", tmp_path / "empty") == cli.EXIT_BAD_INPUT
    assert "has no rows" in capsys.readouterr().err
