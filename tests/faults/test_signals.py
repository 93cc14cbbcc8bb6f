"""SIGTERM, the stop signal of systemd, Slurm and Kubernetes, stops ``krr run`` like Ctrl-C.

Issue #44 (class 4): SIGTERM was not handled. ``krr run`` died of it (exit 143 from the
signal itself) with no line in ``run.log``, the manifest left ``running`` and the lock
file behind. Now the stage stops, the manifest records ``interrupted``, the lock is
released, ``run.log`` says so, ``krr`` exits 143, and the rerun resumes to the same
bits as an uninterrupted run.

The shipped unit ``workflows/scheduled/krr-refit.service`` is stopped the systemd way:
its KillSignal (SIGTERM unless it sets another), then SIGKILL after TimeoutStopSec
(90 s unless set). The test sends that signal from inside a tile write (through
``tests/faultinject``) and checks the run is gone well inside that time.
"""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "workflows" / "scheduled" / "krr-refit.service"


def _unit_stop_semantics() -> tuple[int, float]:
    """The shipped unit's stop signal and stop timeout (systemd's defaults where unset)."""
    text = UNIT.read_text()
    sig, timeout = signal.SIGTERM, 90.0
    m = re.search(r"^\s*KillSignal\s*=\s*(\S+)", text, re.M)
    if m:
        name = m.group(1).upper()
        sig = getattr(signal, name if name.startswith("SIG") else "SIG" + name)
    m = re.search(r"^\s*TimeoutStopSec\s*=\s*(\d+)\s*s?\s*$", text, re.M)
    if m:
        timeout = float(m.group(1))
    return int(sig), timeout


@pytest.fixture(scope="module")
def setup(tmp_path_factory, krr_main, run_results, fault_run):
    d = tmp_path_factory.mktemp("sigterm")
    conf = fault_run(d, "sigterm", n=500, d=4, seed=3, target=np.cos, n_new=300)
    ref = d / "ref"
    r = krr_main.run(conf, ref)
    assert r.returncode == 0, r.stderr[-3000:]
    return conf, run_results(ref)


@pytest.mark.parametrize("match", ["gram/", "chol/"])
def test_sigterm_mid_stage_stops_cleanly_and_the_rerun_resumes_bitwise(
    setup,
    tmp_path,
    krr_run,
    krr_main,
    match,
    run_results,
):
    conf, want = setup
    sig, stop_timeout = _unit_stop_semantics()
    assert sig == signal.SIGTERM  # the unit stops krr with SIGTERM (systemd's default)
    run_dir = tmp_path / "run"
    stamp = tmp_path / "signalled"
    env = {"KRR_KILL_SIGNAL": signal.Signals(sig).name[3:], "KRR_KILL_STAMP": str(stamp)}
    r = krr_run.run(conf, run_dir, kill=(match, 2), env=env, json=True, timeout=600)
    ended = time.time()
    assert r.returncode == 143, (r.returncode, r.stderr[-3000:])
    assert "SIGTERM" in r.stderr and "rerun the same command to resume" in r.stderr
    # with --json the error object carries exit code 143 and its meaning (this was a
    # test of its own, a third killed run: the same kill at the first Gram tile)
    obj = json.loads(r.stdout[r.stdout.index("{") :])
    assert obj["exit_code"] == 143 and obj["error"]["type"] == "terminated"
    assert "SIGTERM" in obj["meaning"]
    # stopped long before systemd's SIGKILL would come
    assert ended - float(stamp.read_text()) < stop_timeout / 3
    log = (run_dir / "run.log").read_text()
    assert "stopped by signal 15 (SIGTERM) (exit 143)" in log, log[-2000:]
    stages = json.loads((run_dir / "manifest.json").read_text())["stages"]
    states = {k: v["status"] for k, v in stages.items()}
    assert "running" not in states.values(), states
    assert "interrupted" in states.values(), states
    assert not (run_dir / ".lock").exists()
    again = krr_main.run(conf, run_dir)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resuming" in again.stderr
    got = run_results(run_dir)
    assert got.keys() == want.keys()
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def test_sigterm_handler_is_restored_after_main(tmp_path, capsys):
    """``pipeline.cli.main`` run in process leaves the caller's SIGTERM handler as it was."""
    from pipeline.cli import main

    before = signal.getsignal(signal.SIGTERM)
    main(["status", str(tmp_path / "nothing")])
    assert signal.getsignal(signal.SIGTERM) is before
