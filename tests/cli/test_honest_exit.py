"""Honest outcomes: no exit 0 with a wrong number, and errors that say what helps.

Cases of issue #13: a CG solve that stops at ``max_iter`` finished with exit 0
(only a warning line); explicit ``solver: cg`` ran an indefinite kernel; data
errors said "rerun the same command to resume"; a damaged manifest or a run
directory that is a file were reported as internal errors (bugs).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.slow

CONFIG = """
name: honest
data: {{source: npy, path: {x}, y_path: {y}}}
split: {{test_fraction: 0.25, seed: 0}}
kernel: {kernel}
lambda: 1.0e-6
solver: {solver}
block_size: 50
evaluate: {{baseline: none}}
cluster: {{n_workers: 1, processes: false, memory_limit: 2GiB}}
"""
RBF = "{name: rbf, params: {gamma: 0.5}}"
CG_MAX_ITER = "{method: cg, preconditioner: none, max_iter: 2, tol: 1.0e-12}"


def _conf(tmp: Path, kernel: str = RBF, solver: str = CG_MAX_ITER, nan: bool = False) -> Path:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(160, 3))
    if nan:
        X[77, 1] = np.nan
    np.save(tmp / "X.npy", X)
    np.save(tmp / "y.npy", np.cos(X[:, 0]))
    p = tmp / "conf.yaml"
    p.write_text(CONFIG.format(x=tmp / "X.npy", y=tmp / "y.npy", kernel=kernel, solver=solver))
    return p


def test_cg_at_max_iter_fails_unless_allowed(tmp_path, krr_main):
    conf, run = _conf(tmp_path), tmp_path / "run"
    r = krr_main("run", conf, "--run-dir", run)
    assert r.returncode == 4, (r.returncode, r.stderr[-3000:])
    assert "CG did not converge" in r.stderr and "allow_unconverged" in r.stderr
    m = json.loads((run / "manifest.json").read_text())
    assert m["stages"]["solve"]["status"] == "failed"
    assert "did not converge" in m["stages"]["solve"]["error"]
    assert not list(run.rglob("alpha.npy"))  # in no configuration's results/<key>/solve
    assert m["stages"].get("model", {}).get("status", "pending") == "pending"

    ok = krr_main("run", conf, "solver.allow_unconverged=true", "--run-dir", run)
    assert ok.returncode == 0, ok.stderr[-3000:]
    lines = [ln for ln in ok.stdout.splitlines() if "UNCONVERGED SOLVE ACCEPTED" in ln]
    assert len(lines) == 1 and "CG stopped after 2 iterations" in lines[0], ok.stdout


def test_explicit_cg_refuses_an_indefinite_kernel_before_solving(tmp_path, krr_main):
    conf, run = _conf(tmp_path, kernel="{name: sigmoid, params: {gamma: 0.5}}"), tmp_path / "run"
    r = krr_main("run", conf, "solver.max_iter=1000", "--run-dir", run)
    assert r.returncode == 2, (r.returncode, r.stderr[-3000:])
    assert "positive semi-definite" in r.stderr and "is_mercer" in r.stderr
    assert not list(run.rglob("solve"))


def test_explicit_cg_estimator_refuses_an_indefinite_kernel(tmp_path):
    import pipeline

    X = np.random.default_rng(0).normal(size=(40, 3))
    est = pipeline.KernelRidge(alpha=1e-3, kernel="sigmoid", solver="cg", store=str(tmp_path))
    with pytest.raises(ValueError, match="positive semi-definite"):
        est.fit(X, X[:, 0])
    assert not any(tmp_path.iterdir())  # refused before any tile was written


def test_nan_input_says_fix_the_input(tmp_path, krr_main):
    conf = _conf(tmp_path, solver="{method: cholesky}", nan=True)
    r = krr_main("run", conf, "--run-dir", tmp_path / "run")
    assert r.returncode == 3, (r.returncode, r.stderr[-3000:])
    assert "fix the input" in r.stderr
    assert "rerun the same command to resume" not in r.stderr


def test_damaged_manifest_and_file_run_dir_are_reported_as_such(tmp_path, krr_main):
    conf = _conf(tmp_path, solver="{method: cholesky}")
    run = tmp_path / "run"
    run.mkdir()
    (run / "manifest.json").write_text('{"version": 1, "stages": {')  # torn by hand
    r = krr_main("run", conf, "--run-dir", run)
    assert r.returncode == 7, (r.returncode, r.stderr[-3000:])
    assert "not valid JSON" in r.stderr and "internal error" not in r.stderr
    s = krr_main("status", run)
    assert s.returncode == 7 and "not valid JSON" in s.stderr

    afile = tmp_path / "afile"
    afile.write_text("not a directory")
    r = krr_main("run", conf, "--run-dir", afile)
    assert r.returncode == 7, (r.returncode, r.stderr[-3000:])
    assert "is a file" in r.stderr and "internal error" not in r.stderr
    assert afile.read_text() == "not a directory"


def test_read_only_run_dir_is_reported_as_such(tmp_path, monkeypatch, capsys):
    from pipeline import cli

    conf = _conf(tmp_path, solver="{method: cholesky}")
    run = tmp_path / "ro"
    run.mkdir()
    real_access = os.access

    def access(path, mode, *a, **kw):  # a read-only mount, as root cannot chmod one here
        if Path(path) == run and mode & os.W_OK:
            return False
        return real_access(path, mode, *a, **kw)

    monkeypatch.setattr(os, "access", access)
    code = cli.main(["run", str(conf), "--run-dir", str(run)])
    err = capsys.readouterr().err
    assert code == 7, err
    assert "not writable" in err and "internal error" not in err
    assert not any(run.iterdir())
