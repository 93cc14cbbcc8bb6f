"""Resume keys on the data's content, and a run directory's paths are its own.

Each test reproduces a case of issue #13 that gave a silently wrong model:
a data file changed after a finished run (every stage was skipped), a data file
changed between a killed ingest and its resume (the stored training set mixed
both files), and a relative ``--run-dir`` resumed from another working
directory (the manifest's relative paths led to another run's data).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import zarr

from pipeline.models.artifact import load_artifact

pytestmark = pytest.mark.slow


CONFIG = """
name: ident
data: {{source: npy, path: {x}, y_path: {y}}}
split: {{test_fraction: 0.0}}
preprocess: {{standardize: false, standardize_y: false}}
kernel: {{name: rbf, params: {{gamma: 0.3}}}}
lambda: 0.1
solver: {{method: cholesky}}
block_size: 40
evaluate: {{baseline: none}}
cluster: {{n_workers: 1, processes: false, memory_limit: 2GiB}}
"""


def _data(d: Path, seed: int, n: int = 200) -> tuple[Path, Path]:
    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 4))
    np.save(d / "X.npy", X)
    np.save(d / "y.npy", np.sin(X[:, 0]) + 0.1 * rng.normal(size=n))
    return d / "X.npy", d / "y.npy"


def _conf(dest: Path, x: Path, y: Path) -> Path:
    p = dest / "conf.yaml"
    p.write_text(CONFIG.format(x=x, y=y))
    return p


def _reference_predict(X: np.ndarray, y: np.ndarray, Xq: np.ndarray) -> np.ndarray:
    from sklearn.kernel_ridge import KernelRidge

    return KernelRidge(alpha=0.1, kernel="rbf", gamma=0.3).fit(X, y).predict(Xq)


def test_changed_file_after_finished_run_reruns_ingest(tmp_path, krr_main):
    x, y = _data(tmp_path / "data", seed=0)
    conf, run = _conf(tmp_path, x, y), tmp_path / "run"
    first = krr_main("run", conf, "--run-dir", run)
    assert first.returncode == 0, first.stderr[-3000:]
    x_new, _ = _data(tmp_path / "data", seed=1)  # same shape, other rows
    second = krr_main("run", conf, "--run-dir", run)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "ran: ingest, gram, solve, model" in second.stdout, second.stdout
    Xn, yn = np.load(x_new), np.load(y)
    from pipeline.stages.status import latest_model

    model = load_artifact(latest_model(run))  # results/<configuration>/model/model
    np.testing.assert_array_equal(np.asarray(model.X_train), Xn)
    Xq = np.random.default_rng(5).normal(size=(30, 4))
    np.testing.assert_allclose(model.predict(Xq), _reference_predict(Xn, yn, Xq), atol=1e-8)


def test_changed_file_between_killed_ingest_and_resume_is_not_mixed(tmp_path, krr_run, krr_main):
    x, y = _data(tmp_path / "data", seed=0)
    conf, run = _conf(tmp_path, x, y), tmp_path / "run"
    killed = krr_run("run", conf, "--run-dir", run, kill=("X_train/", 3))
    assert killed.returncode == -9, killed.stderr[-3000:]
    # blocks 0 and 1 of the old file are stored and recorded
    assert len(list((run / "ingest" / "data.zarr" / "_markers" / "X_train").iterdir())) >= 2
    _data(tmp_path / "data", seed=1)
    resumed = krr_main("run", conf, "--run-dir", run)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    stored = zarr.open_array(str(run / "ingest" / "data.zarr"), path="X_train", mode="r")[...]
    np.testing.assert_array_equal(stored, np.load(x))


def test_moved_run_dir_resumed_by_relative_path_from_another_cwd(tmp_path, krr_main):
    # two projects, each with a run directory called "run" (relative --run-dir)
    a, b = tmp_path / "a", tmp_path / "b"
    xa, ya = _data(a / "data", seed=0)
    xb, yb = _data(b / "data", seed=1)
    conf_a, conf_b = _conf(a, xa, ya), _conf(b, xb, yb)
    for cwd, conf in ((a, conf_a), (b, conf_b)):
        r = krr_main("run", conf, "--run-dir", "run", "--until", "ingest", cwd=cwd)
        assert r.returncode == 0, r.stderr[-3000:]
    # a's run directory is moved, then resumed from b's directory by a relative path
    shutil.move(str(a / "run"), str(tmp_path / "moved"))
    r = krr_main("run", conf_a, "--run-dir", "../moved", cwd=b)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "already complete: ingest" in r.stdout, r.stdout
    from pipeline.stages.status import latest_model

    model = load_artifact(latest_model(tmp_path / "moved"))
    Xq = np.random.default_rng(5).normal(size=(30, 4))
    expected = _reference_predict(np.load(xa), np.load(ya), Xq)
    np.testing.assert_allclose(model.predict(Xq), expected, atol=1e-8)


def test_source_identity_follows_content_not_path(tmp_path, monkeypatch):
    from pipeline.stages import source_identity as si

    a = tmp_path / "a.npy"
    np.save(a, np.arange(300.0).reshape(100, 3))
    ident = si.path_identity(str(a))
    moved = tmp_path / "sub" / "b.npy"
    moved.parent.mkdir()
    shutil.copy2(a, moved)
    assert si.path_identity(str(moved)) == ident  # same bytes elsewhere: same data
    raw = bytearray(a.read_bytes())
    raw[len(raw) // 2] ^= 1  # one bit in the middle, same size
    a.write_bytes(bytes(raw))
    assert si.path_identity(str(a)) != ident
    # above the full-hash limit: path, size, mtime and sampled blocks
    monkeypatch.setattr(si, "FULL_HASH_MAX_BYTES", 10)
    big = si.path_identity(str(a))
    assert "blake2b_sampled" in big and big != si.path_identity(str(moved))
    assert si.path_identity(str(tmp_path / "none.npy"))["missing"] is True
    pkg = si.source_identity({"source": "sklearn", "name": "diabetes"})
    assert pkg["package"]["package"] == "scikit-learn" and pkg["package"]["version"]


def test_a_file_named_like_a_pattern_is_identified_by_its_content(tmp_path):
    # "X[1].npy" was globbed as a pattern that matched nothing: its identity was the
    # constant "missing" record, so a changed file reused every stage (session 25)
    from pipeline.stages import source_identity as si

    odd = tmp_path / "X[1].npy"
    np.save(odd, np.arange(300.0).reshape(100, 3))
    ident = si.path_identity(str(odd))
    assert "missing" not in ident and "blake2b" in ident
    np.save(odd, np.arange(300.0).reshape(100, 3)[::-1])
    assert si.path_identity(str(odd)) != ident
    # a pattern that names no file as such still matches its files
    assert si.path_identity(str(tmp_path / "*.npy"))["files"] == 1


def test_a_file_url_in_any_case_is_identified_as_its_local_file(tmp_path):
    # "FILE://" and "local://" were taken for object-store URLs: fsspec's ukey of the
    # file, not its content, so the identity changed with the spelling (session 26)
    from pipeline.stages import source_identity as si

    f = tmp_path / "X.npy"
    np.save(f, np.arange(30.0).reshape(10, 3))
    plain = si.path_identity(str(f))
    assert "blake2b" in plain
    for url in (f"file://{f}", f"FILE://{f}", f"local://{f}"):
        assert si.path_identity(url) == plain, url


def test_data_changed_during_ingest_fails_the_stage(tmp_path):
    from pipeline.stages import ingest, typed_params
    from pipeline.stages.source_identity import source_identity

    x, y = _data(tmp_path / "data", seed=0, n=60)
    data = {"source": "npy", "path": str(x), "y_path": str(y)}
    split = {"test_fraction": 0.0}
    at_start = source_identity(data, split)
    _data(tmp_path / "data", seed=1, n=60)  # rewritten after the runner identified it
    with pytest.raises(ingest.SourceChanged, match="changed while the ingest stage"):
        ingest.run(
            tmp_path / "ingest",
            {},
            **typed_params(
                "ingest",
                dict(
                    data=data,
                    split=split,
                    preprocess={"standardize": False},
                    block_size=20,
                    source_identity=at_start,
                ),
            ),
        )


def test_a_pattern_is_identified_by_the_files_the_reader_reads(tmp_path):
    # "**" did not recurse and dot-files were skipped (glob.glob), while the CSV reader
    # (fsspec) reads both: a changed file kept the identity and every stage was reused,
    # the old model and metrics with exit 0 (session 26)
    from pipeline.stages import source_identity as si

    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "part1.csv").write_text("a,y\n1,2\n")
    (tmp_path / ".hidden.csv").write_text("a,y\n3,4\n")
    for pattern in ("**/*.csv", "*.csv"):
        before = si.path_identity(str(tmp_path / pattern))
        assert "blake2b" in before, before
        target = tmp_path / ("sub/part1.csv" if pattern.startswith("**") else ".hidden.csv")
        old = target.read_text()
        target.write_text(old.replace("2", "7").replace("4", "9"))
        assert si.path_identity(str(tmp_path / pattern)) != before, pattern
        target.write_text(old)
