"""User-facing messages and exit codes of the ``krr`` command line, pinned (issue #43).

Scripts branch on the exit codes and users search for the messages: a refactor moves
these strings, it never rewrites them. The table of exit codes is pinned literally; each
bad input below is pinned by its exit code and the stable part of its message (the
project's own words; what pydantic or argparse add may change with their versions).

In process (``pipeline.cli.main``, which returns the code) except the last test, which
checks that the process's exit status is that code.
"""

from __future__ import annotations

import numpy as np
import pytest

from pipeline import cli
from pipeline.cli.errors import EXIT_CODES

#: recorded from pipeline/cli/errors.py of 2026-11-28 (commit f280298)
EXIT_CODE_TABLE = {
    0: "done",
    1: "internal error (a bug: please report it with the traceback from -v)",
    2: "bad config or usage (also: run dir belongs to other data without --force-new; "
    "an optional extra the config needs is not installed)",
    3: "bad input: missing or invalid data file, model artifact or prediction input",
    4: "a stage failed (its error is in the manifest): rerun to resume, or "
    "change the config as the message says (e.g. a CG solve that did not converge)",
    5: "the run directory is locked by another live run",
    6: "the scheduler address does not answer",
    7: "the run directory is unusable: a file, not writable, or a damaged manifest; "
    "or its object store does not answer, refuses the credentials, or lacks the bucket",
    130: "interrupted (rerun to resume)",
    # added by issue #44 (SIGTERM, what a shell reported for it before: 128 + 15)
    143: "stopped by SIGTERM (systemd, Slurm and Kubernetes stop a job with it): "
    "the lock is released and the stage recorded as interrupted (rerun to resume)",
}


def test_the_exit_code_table_is_unchanged():
    assert EXIT_CODES == EXIT_CODE_TABLE
    names = {
        "EXIT_OK": 0, "EXIT_INTERNAL": 1, "EXIT_BAD_CONFIG": 2, "EXIT_BAD_INPUT": 3,
        "EXIT_STAGE_FAILED": 4, "EXIT_LOCKED": 5, "EXIT_NO_SCHEDULER": 6, "EXIT_RUN_DIR": 7,
        "EXIT_INTERRUPTED": 130, "EXIT_TERMINATED": 143,
    }  # fmt: skip
    assert {n: getattr(cli, n) for n in names} == names


def test_the_exit_code_table_is_in_the_help(capsys):
    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    out = capsys.readouterr().out
    for code in EXIT_CODE_TABLE:
        assert f"{code:>3}  " in out


@pytest.fixture
def here(tmp_path, monkeypatch, small_data, write_config):
    """The working directory: small.yaml (tiles of 16) on ``small_data``, a data set
    with a NaN, a file and a config that is not YAML."""
    write_config(small_data, name="small.yaml", block_size=16)
    bad = np.ones((20, 2))
    bad[13, 1] = np.nan
    np.save(tmp_path / "Xbad.npy", bad)
    np.save(tmp_path / "ybad.npy", np.ones(20))
    (tmp_path / "bad.yaml").write_text("data: [unclosed\n")
    (tmp_path / "afile").write_text("x")
    monkeypatch.chdir(tmp_path)
    return tmp_path


#: (command line, exit code, substrings of stderr), one per kind of refusal
CASES = {
    "unknown config key": (
        ["validate", "small.yaml", "kernel.parms.gamma=1"], 2,
        ["krr validate: error: invalid config small.yaml:",
         "kernel.parms: unknown key; did you mean 'kernel.params'? "
         "(valid keys here: name, params, spec)"],
    ),
    "bad lambda": (
        ["validate", "small.yaml", "lambda=-1"], 2,
        ["krr validate: error: invalid config small.yaml:\n  lambda: ", "(got -1)"],
    ),
    "lambda not a number": (
        ["validate", "small.yaml", "lambda=big"], 2, ["  lambda: ", "(got 'big')"],
    ),
    "unknown solver": (
        ["validate", "small.yaml", "solver.method=lu"], 2,
        # (issue #45 item 1 added the method nystrom to the vocabulary this lists)
        ["  solver.method: ", "'cholesky', 'cg', 'auto' or 'nystrom' (got 'lu')"],
    ),
    "unknown kernel": (
        ["validate", "small.yaml", "kernel.name=gauss"], 2,
        ["  kernel: unknown kernel 'gauss'; known kernels: ['additive_chi2', "],
    ),
    "tolerance of one": (
        ["validate", "small.yaml", "solver.tol=1"], 2, ["  solver.tol: ", "(got 1)"],
    ),
    "too few folds": (
        ["validate", "small.yaml", "cv.folds=1"], 2,
        ["  cv.alphas: required key is missing",
         "  cv.folds: folds=1: K-fold needs at least 2 folds (or 'loo') (got 1)"],
    ),
    "missing config file": (
        ["validate", "missing.yaml"], 2,
        ["krr validate: error: config file 'missing.yaml' does not exist"],
    ),
    "config not YAML": (
        ["validate", "bad.yaml"], 2,
        ["krr validate: error: config file 'bad.yaml' is not valid YAML text: "],
    ),
    "missing data file": (
        ["run", "small.yaml", "data.path=nothere.npy", "--run-dir", "r"], 3,
        ["krr run: error: data.path: file 'nothere.npy' does not exist"],
    ),
    "non-finite data": (
        ["run", "small.yaml", "data.path=Xbad.npy", "data.y_path=ybad.npy", "--run-dir", "r"], 3,
        ["krr run: error: stage 'ingest' failed: ValueError: X has a non-finite value (nan) "
         "at row 13, column 1 (row block 0, rows 0..15; 1 non-finite value(s) in this "
         "block). Remove or impute NaN/inf values before building the Gram.",
         "fix the input data (a rerun cannot help), then rerun the same command"],
    ),
    "status of a non-run directory": (
        ["status", "nowhere"], 3,
        ["krr status: error: 'nowhere' is not a run directory (no manifest.json)"],
    ),
    "report of a non-run directory": (
        ["report", "nowhere"], 3,
        ["krr report: error: 'nowhere' is not a run directory (it has no manifest.json); "
         "pass the run directory of a `krr run` (the config's run_dir, or its --run-dir)."],
    ),
    "unlock of a missing directory": (
        ["unlock", "nowhere"], 3, ["krr unlock: error: run directory 'nowhere' does not exist"],
    ),
    "predict with a missing model": (
        ["predict", "nomodel", "X.npy", "out.npy"], 3,
        ["krr predict: error: model 'nomodel' does not exist"],
    ),
    "run directory is a file": (
        ["run", "small.yaml", "--run-dir", "afile"], 7,
        ["krr run: error: run directory 'afile' is a file, not a directory. Use another "
         "--run-dir (or set run_dir in the config)."],
    ),
    "malformed scheduler address": (
        ["run", "small.yaml", "--scheduler", "not an address", "--run-dir", "r"], 2,
        ["krr run: error: --scheduler 'not an address' is not a Dask scheduler address: "
         "expected tcp://host:port (e.g. tcp://127.0.0.1:8786, or tls://host:port), as "
         "printed by `dask scheduler`"],
    ),
    "unknown stage for --until": (
        ["run", "small.yaml", "--until", "nope", "--run-dir", "r"], 2,
        ["krr run: error: --until 'nope': not a stage; stages are ['ingest', 'select', "
         "'gram', 'solve', 'model', 'predict', 'evaluate']"],
    ),
    "misspelt option": (
        ["run", "small.yaml", "--run-dri", "r"], 2,
        ["krr run: error: unrecognized option '--run-dri'; did you mean --run-dir?"],
    ),
    "unknown command": (
        ["frobnicate"], 2, ["krr: error: argument COMMAND: invalid choice: 'frobnicate'"],
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_refusal_exit_code_and_message(case, here, capsys):
    argv, code, parts = CASES[case]
    capsys.readouterr()
    assert cli.main(argv) == code
    err = capsys.readouterr().err
    for part in parts:
        assert part in err, f"{case}: {part!r} not in {err[-2000:]!r}"


def test_a_locked_run_directory(here, capsys):
    from pipeline.stages.lock import RunLock

    with RunLock(here / "r"):
        assert cli.main(["run", "small.yaml", "--run-dir", "r"]) == 5
    err = capsys.readouterr().err
    assert "krr run: error: run directory 'r' is locked by pid " in err
    assert (
        "Wait for it to finish, stop it, or use another --run-dir (`krr unlock r` removes a "
        "lock left by a dead run)."
    ) in err


#: Runs in one child interpreter: imports ``pipeline.cli`` once, then for each argv forks
#: a process that runs ``python -m pipeline.cli`` (its ``__main__`` module, as ``-m``
#: does) and reports that process's exit status and stderr. One interpreter start
#: instead of one per code (each start is the 3 s import of the pipeline).
_FORK_EACH = r"""
import json, os, runpy, sys, tempfile
import pipeline.cli
out = []
for argv in json.loads(sys.argv[1]):
    with tempfile.TemporaryFile() as err:
        pid = os.fork()
        if pid == 0:
            os.dup2(err.fileno(), 2)
            sys.argv = ["krr", *argv]
            try:
                runpy.run_module("pipeline.cli", run_name="__main__", alter_sys=True)
            except SystemExit as e:
                sys.stderr.flush()
                os._exit(e.code if isinstance(e.code, int) else 1)
            os._exit(0)  # __main__ always exits: never a silent success
        _, status = os.waitpid(pid, 0)
        err.seek(0)
        out.append([os.waitstatus_to_exitcode(status), err.read().decode()])
print(json.dumps(out))
"""


def test_the_process_exits_with_the_code(here):
    # the code main() returns is the process's exit status (python -m pipeline.cli)
    import json
    import subprocess
    import sys

    from pipeline.stages.lock import RunLock

    cases = [
        (["validate", "missing.yaml"], 2),
        (["run", "small.yaml", "data.path=nothere.npy", "--run-dir", "r"], 3),
        (["status", "nowhere"], 3),
        (["run", "small.yaml", "--run-dir", "afile"], 7),
        (["frobnicate"], 2),
        (["run", "small.yaml", "--run-dir", "held"], 5),
    ]
    with RunLock(here / "held"):  # an flock of this process: the children find it held
        child = subprocess.run(
            [sys.executable, "-c", _FORK_EACH, json.dumps([argv for argv, _ in cases])],
            cwd=here,
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert child.returncode == 0, child.stderr[-3000:]
    results = json.loads(child.stdout)
    assert len(results) == len(cases)
    for (argv, code), (got, stderr) in zip(cases, results):
        assert got == code, (argv, stderr[-2000:])
        assert "Traceback" not in stderr
    assert "is locked by pid" in results[-1][1]
