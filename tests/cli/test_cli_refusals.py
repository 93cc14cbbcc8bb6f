"""The command line refuses bad input before any work, with the documented exit code,
and never replaces a file it did not write (defects found by session 25's review)."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from pipeline import cli

BASE = {
    "data": {"source": "sklearn", "name": "diabetes"},
    "kernel": {"name": "rbf", "params": {"gamma": 0.1}},
    "lambda": 0.5,
    "block_size": 128,
    "evaluate": {"baseline": "none"},
}


#: the embedded cluster in threads: no worker processes to start (about 2 s a run on 2
#: cores); the refusals are made in this process, before or between the stages' tasks
THREADS = {"processes": False, "n_workers": 1}


def _conf(path, **extra):
    path.write_text(yaml.safe_dump({**BASE, **extra}))
    return str(path)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished run to report on and predict with (in threads: no worker processes
    to start; how it was computed is not what the tests that use it check)."""
    d = tmp_path_factory.mktemp("refusals")
    conf = _conf(d / "c.yaml", cluster=THREADS)
    assert cli.main(["run", conf, "--run-dir", str(d / "run")]) == 0
    return d


def test_config_values_that_would_fail_later_are_config_errors(tmp_path, capsys):
    conf = _conf(tmp_path / "c.yaml")
    cases = [
        (["predict.output=" + str(tmp_path / "p.npy")], "needs predict.input"),  # exit 0, no file
        (["lambda=.inf"], "finite number"),  # failed in the solve stage, exit 4
        (["data.name=nope"], "no shipped data set 'nope'"),  # failed in the ingest, exit 3
    ]
    for overrides, said in cases:
        for cmd in (["validate", conf], ["run", conf, "--run-dir", str(tmp_path / "r")]):
            assert cli.main([*cmd, *overrides]) == cli.EXIT_BAD_CONFIG, (cmd, overrides)
            assert said in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_a_bad_predict_input_in_a_run_is_bad_input_not_a_rerun(finished, tmp_path, capsys):
    np.save(tmp_path / "nine.npy", np.zeros((5, 9)))  # diabetes has 10 features
    conf = _conf(tmp_path / "c.yaml", predict={"input": str(tmp_path / "nine.npy")},
                 cluster=THREADS)  # fmt: skip
    code = cli.main(["run", conf, "--run-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == cli.EXIT_BAD_INPUT and "a rerun cannot help" in err, err[-500:]


def test_krr_report_never_replaces_a_users_file(finished, tmp_path, capsys, monkeypatch):
    pytest.importorskip("matplotlib")
    notes = tmp_path / "notes.html"
    notes.write_text("<html>my notes</html>")
    run = str(finished / "run")
    assert cli.main(["report", run, "-o", str(notes)]) == cli.EXIT_BAD_INPUT
    assert "not a krr-pipeline report" in capsys.readouterr().err
    assert notes.read_text() == "<html>my notes</html>"
    ours = tmp_path / "r.html"
    for _ in range(2):  # its own page it replaces
        assert cli.main(["report", run, "-o", str(ours)]) == 0
    import pipeline.report.figures as figures

    def missing():
        raise ImportError("matplotlib is missing: pip install 'krr-pipeline[plots]'")

    monkeypatch.setattr(figures, "require_matplotlib", missing)
    assert cli.main(["report", run, "-o", str(tmp_path / "x.html")]) == cli.EXIT_BAD_CONFIG


def test_krr_predict_option_and_model_errors(finished, tmp_path, capsys):
    run = str(finished / "run")
    np.save(tmp_path / "new.npy", np.zeros((4, 10)))
    new = str(tmp_path / "new.npy")
    # an output in a directory that does not exist yet: made, as for a .zarr output
    assert cli.main(["predict", run, new, str(tmp_path / "sub" / "dir" / "p.npy")]) == 0
    assert (tmp_path / "sub" / "dir" / "p.npy").is_file()
    code = cli.main(["predict", run, new, str(tmp_path / "q.npy"), "--block-size", "0"])
    assert code == cli.EXIT_BAD_CONFIG and "must be >= 1" in capsys.readouterr().err
    code = cli.main(["predict", run, new, str(tmp_path / "r.npy"), "--x-train", new])
    assert code == cli.EXIT_BAD_CONFIG and "--x-train" in capsys.readouterr().err


def test_small_cli_messages(tmp_path, capsys, caplog):
    import logging

    afile = tmp_path / "afile"
    afile.write_text("x")
    assert cli.main(["unlock", str(afile)]) == cli.EXIT_BAD_INPUT
    assert "is a file, not a run directory" in capsys.readouterr().err
    with caplog.at_level(logging.WARNING, logger="pipeline.stages"):
        conf = _conf(tmp_path / "c.yaml", data={**BASE["data"], "n_rows": 100000}, cluster=THREADS)
        assert cli.main(["run", conf, "--run-dir", str(tmp_path / "r"), "--until", "ingest"]) == 0
    assert "data.n_rows=100000 is more than the data's 442 rows" in caplog.text


@pytest.mark.parametrize("value", ["1.0", "2", ".inf"])
def test_a_tolerance_of_one_or_more_is_refused_by_the_config_and_the_estimator(value):
    # tol >= 1 passed: CG stopped at x = 0 and krr run exited 0 with an all-zero model,
    # or ".inf" failed as an internal error after the ingest (session 26)
    from pipeline import KernelRidge
    from pipeline.stages.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="solver.tol"):
        load_config({"data": {"source": "sklearn", "name": "diabetes"}}, [f"solver.tol={value}"])
    X = np.random.default_rng(0).normal(size=(30, 2))
    with pytest.raises(ValueError, match=r"tol must be a float in \(0, 1\)"):
        KernelRidge(solver="cg", tol=float(value.lstrip("."))).fit(X, X[:, 0])


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (["cv.alphas=[0.1]", "cv.folds=loo", "cv.solver=band"], "cv.folds: loo needs"),
        (["cv.alphas=[0.1]", "cv.folds=loo", "cv.solver=dense"], "cv.folds: loo needs"),
        (["solver.cg_precision=mixed", "solver.matvec=stored"], "cannot use solver.matvec"),
        (["cluster.memory_limit=abc"], "cluster.memory_limit"),
        (["cluster.memory_limit=AUTO"], "cluster.memory_limit"),  # dask takes only "auto"
        (["cluster.connect_timeout=.inf"], "cluster.connect_timeout"),
        (["cv.alphas=[0.1]", "cv.tol=2"], "cv.tol"),
        (["lambda=yes"], "lambda: expected a number"),  # read as 1 before
        (["cv.alphas=[true, 0.1]"], "alphas: expected a number"),
        (["cv.alphas={logspace: [true, 1, 3]}"], "logspace bounds must be numbers"),
    ],
)
def test_settings_refused_together_fail_validation_not_a_stage(overrides, match):
    # each passed `krr validate`, then failed in a stage after the ingest: exit 1
    # ("internal error") or exit 4 ("rerun the same command to resume") (session 26)
    from pipeline.stages.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=match):
        load_config({"data": {"source": "sklearn", "name": "diabetes"}}, overrides)


def test_a_config_file_that_is_not_yaml_text_is_a_config_error(tmp_path):
    from pipeline.stages.config import ConfigError, load_config

    np.save(tmp_path / "X.npy", np.arange(5.0))  # e.g. `krr run X.npy` (exit 1 before)
    with pytest.raises(ConfigError, match="not valid YAML text"):
        load_config(tmp_path / "X.npy")
    with pytest.raises(ConfigError, match="is a directory"):
        load_config(tmp_path)


def test_a_port_that_is_not_a_dask_scheduler_fails_fast_with_exit_6(tmp_path, capsys):
    # an HTTP-like server hung `krr run --scheduler` forever; one answering other bytes
    # crashed it with a MemoryError of exabytes, exit 1 (session 26)
    import socket
    import threading
    import time

    def serve(sock, reply):
        while True:
            try:
                c, _ = sock.accept()
            except OSError:
                return
            if reply:
                c.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n" * 4)
            threading.Timer(30, c.close).start()  # silent, or answered, then held open

    conf = _conf(tmp_path / "c.yaml")
    for reply in (False, True):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(4)
        threading.Thread(target=serve, args=(sock, reply), daemon=True).start()
        addr = f"tcp://127.0.0.1:{sock.getsockname()[1]}"
        t0 = time.monotonic()
        code = cli.main(["-q", "run", conf, "--run-dir", str(tmp_path / f"r{reply}"),
                         "--scheduler", addr, "cluster.connect_timeout=0.5"])  # fmt: skip
        sock.close()
        assert code == cli.EXIT_NO_SCHEDULER and time.monotonic() - t0 < 20
        assert "does not answer as a Dask scheduler" in capsys.readouterr().err


def test_empty_option_values_and_too_many_folds_are_config_errors(tmp_path, capsys):
    conf = _conf(tmp_path / "c.yaml", cluster=THREADS)
    for opt in ("--run-dir", "--scheduler"):  # "$VAR" unset: ignored, exit 0 before
        assert cli.main(["run", conf, opt, ""]) == 2
        assert "must not be empty" in capsys.readouterr().err
    # more folds than rows: exit 4 and "rerun the same command to resume" before
    code = cli.main(["-q", "run", conf, "--run-dir", str(tmp_path / "f"), "cv.alphas=[0.1]",
                     "cv.folds=100000"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == cli.EXIT_BAD_CONFIG and "a rerun cannot help" in err


def test_validate_refuses_what_run_refuses_before_any_work(tmp_path, capsys):
    # `krr validate` said "valid" for a malformed cluster.address and for a
    # predict.output holding a user's file, which `krr run` then refused (session 26)
    conf = _conf(tmp_path / "c.yaml")
    assert cli.main(["validate", conf, "cluster.address=foo:bar"]) == cli.EXIT_BAD_CONFIG
    np.save(tmp_path / "new.npy", np.zeros((3, 10)))
    (tmp_path / "mine.npy").write_bytes(b"user data")
    code = cli.main(["validate", conf, f"predict.input={tmp_path}/new.npy",
                     f"predict.output={tmp_path}/mine.npy"])  # fmt: skip
    assert code == cli.EXIT_BAD_INPUT and "did not write" in capsys.readouterr().err
    assert (tmp_path / "mine.npy").read_bytes() == b"user data"


def test_krr_predict_nan_policy_option(finished, tmp_path, capsys):
    # the NaN refusal told a CLI user to "pass nan_policy='propagate'", which krr predict
    # could not do (session 26)
    rows = np.random.default_rng(0).normal(size=(5, 10)) * 0.05
    rows[2, 3] = np.nan
    np.save(tmp_path / "new.npy", rows)
    out = tmp_path / "p.npy"
    run = str(finished / "run")
    assert cli.main(["predict", run, str(tmp_path / "new.npy"), str(out)]) == 3
    assert "--nan-policy propagate" in capsys.readouterr().err
    assert cli.main(["predict", run, str(tmp_path / "new.npy"), str(out),
                     "--nan-policy", "propagate"]) == 0  # fmt: skip
    got = np.load(out)
    assert np.isnan(got[2]).all() and np.isfinite(np.delete(got, 2, axis=0)).all()


def test_a_key_given_twice_in_a_config_file_is_refused(tmp_path):
    from pipeline.stages.config import ConfigError, load_config

    p = tmp_path / "c.yaml"
    p.write_text("data: {source: sklearn, name: diabetes}\nlambda: 0.1\nlambda: 5\n")
    with pytest.raises(ConfigError, match="key 'lambda' is given twice"):
        load_config(p)  # the last one was taken silently (session 26)


@pytest.mark.parametrize("limit", ["auto", "0", "0.5", "4GiB"])
def test_memory_limits_the_local_cluster_takes_are_valid(limit):
    from pipeline.stages.config import load_config

    cfg = load_config({"data": {"source": "sklearn", "name": "diabetes"}},
                      [f"cluster.memory_limit={limit}"])  # fmt: skip
    assert str(cfg.cluster.memory_limit) == limit  # accepted and kept as given
