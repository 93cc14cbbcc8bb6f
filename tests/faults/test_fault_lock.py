"""The run lock is an OS lock: a live holder is never taken over, whatever PID the file names.

Cases of issue #13: liveness was "same host and the PID exists", so a process
in another PID namespace (same hostname) took over a live run's lock; and a lock
from another host was never released, with no hint what to do (``krr unlock``).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.stages.lock import LockHeldError, RunLock, lock_owner

LOCK_PY = str(Path(__file__).resolve().parents[2] / "pipeline" / "stages" / "lock.py")

HOLD = """
import importlib.util, sys, time
spec = importlib.util.spec_from_file_location("krr_lock", sys.argv[2])
lock_mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lock_mod)
lock = lock_mod.RunLock(sys.argv[1]).acquire()
print("locked", flush=True)
sys.stdin.readline()
"""


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


@pytest.fixture
def holder(tmp_path):
    run = tmp_path / "run"
    p = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(run), LOCK_PY],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert p.stdout.readline().strip() == "locked"
    yield run, p
    p.stdin.close()
    p.wait(timeout=30)


def _unlock(run, capsys) -> tuple[int, str, str]:
    from pipeline import cli

    code = cli.main(["unlock", str(run)])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_live_holder_with_an_unknown_pid_in_the_file_is_not_taken_over(holder, capsys):
    run, p = holder
    # what a holder in another PID namespace looks like from here: a pid that is not
    # (or no longer) a process of this namespace, on the same host
    bogus = {"pid": _dead_pid(), "host": socket.gethostname(), "proc_start": 1.0, "token": "ns"}
    (run / ".lock").write_text(json.dumps(bogus))
    with pytest.raises(LockHeldError, match=f"locked by pid {bogus['pid']}"):
        RunLock(run).acquire()
    assert lock_owner(run)["token"] == "ns"
    assert json.loads((run / ".lock").read_text())["token"] == "ns"  # untouched
    code, _, err = _unlock(run, capsys)
    assert code == 5, err
    assert "not unlocked" in err and (run / ".lock").exists()


def test_lock_of_another_host_is_refused_with_a_hint_then_unlocked(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    owner = {"pid": 4242, "host": "gone-host.example", "started": 1.7e9, "token": "remote"}
    (run / ".lock").write_text(json.dumps(owner))
    with pytest.raises(LockHeldError, match="krr unlock") as err:
        RunLock(run).acquire()
    assert "gone-host.example" in str(err.value)
    code, out, err = _unlock(run, capsys)
    assert code == 0, err
    assert "pid 4242 on gone-host.example" in out
    assert not (run / ".lock").exists()
    with RunLock(run) as lock:
        assert lock.took_over is None
    code, out, _ = _unlock(run, capsys)
    assert code == 0 and "not locked" in out
