"""The run lock: refused while the owner lives, taken over when it is dead.

The run lock is an OS lock: a live holder is never taken over, whatever PID the file names.

Cases of issue #13: liveness was "same host and the PID exists", so a process
in another PID namespace (same hostname) took over a live run's lock; and a lock
from another host was never released, with no hint what to do (``krr unlock``).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.stages.lock import LockHeldError, RunLock, lock_owner

#: subprocesses load lock.py alone (stdlib + psutil): fast even on a loaded machine. It is
#: loaded by file path, not by putting pipeline/stages on sys.path, where the stage module
#: select.py would shadow the standard library's select.
LOCK_PY = str(Path(__file__).resolve().parents[2] / "pipeline" / "stages" / "lock.py")

HOLD = """
import importlib.util, sys, time
spec = importlib.util.spec_from_file_location("krr_lock", sys.argv[2])
lock_mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lock_mod)
lock = lock_mod.RunLock(sys.argv[1]).acquire()
print("locked", flush=True)
time.sleep(120)
"""


def _holder(run_dir):
    p = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(run_dir), LOCK_PY], stdout=subprocess.PIPE, text=True
    )
    assert p.stdout.readline().strip() == "locked"
    return p


def test_acquire_release(tmp_path):
    lock = RunLock(tmp_path / "run")
    with lock:
        owner = json.loads((tmp_path / "run" / ".lock").read_text())
        assert owner["pid"] == os.getpid()
        # this process is alive: a second lock is refused
        with pytest.raises(LockHeldError, match=f"pid {os.getpid()}"):
            RunLock(tmp_path / "run").acquire()
        assert lock_owner(tmp_path / "run")["pid"] == os.getpid()
    assert not (tmp_path / "run" / ".lock").exists()
    assert lock_owner(tmp_path / "run") is None


def test_live_process_blocks_then_killed_process_is_taken_over(tmp_path):
    run = tmp_path / "run"
    p = _holder(run)
    try:
        with pytest.raises(LockHeldError, match=f"locked by pid {p.pid}"):
            RunLock(run).acquire()
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    lock = RunLock(run).acquire()
    try:
        assert lock.took_over is not None and lock.took_over["pid"] == p.pid
        assert json.loads((run / ".lock").read_text())["pid"] == os.getpid()
    finally:
        lock.release()


def test_recycled_pid_is_stale(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    # a live pid (ours) but another process start time: the owner is gone
    (run / ".lock").write_text(
        json.dumps(
            {"pid": os.getpid(), "host": socket.gethostname(), "proc_start": 1.0, "token": "x"}
        )
    )
    lock = RunLock(run).acquire()
    assert lock.took_over["token"] == "x"
    lock.release()


def test_release_does_not_remove_someone_elses_lock(tmp_path):
    run = tmp_path / "run"
    lock = RunLock(run).acquire()
    (run / ".lock").write_text(json.dumps({"pid": 1, "token": "other"}))
    lock.release()
    assert (run / ".lock").exists()


def test_concurrent_takeover_has_one_winner(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (run / ".lock").write_text(
        json.dumps(
            {"pid": dead.pid, "host": socket.gethostname(), "proc_start": 0, "token": "dead"}
        )
    )
    code = """
import importlib.util, os, sys, time
spec = importlib.util.spec_from_file_location("krr_lock", sys.argv[2])
lock_mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lock_mod)
try:
    lock_mod.RunLock(sys.argv[1]).acquire()
except lock_mod.LockHeldError:
    print("lost", flush=True)
    sys.exit(0)
print("won", flush=True)
stop = os.path.join(sys.argv[1], "..", "stop")
for _ in range(600):
    if os.path.exists(stop):
        break
    time.sleep(0.1)
"""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(run), LOCK_PY], stdout=subprocess.PIPE, text=True
        )
        for _ in range(3)
    ]
    try:
        outs = [p.stdout.readline().strip() for p in procs]
    finally:
        (tmp_path / "stop").touch()
        for p in procs:
            p.wait(timeout=60)
    assert sorted(outs) == ["lost", "lost", "won"]


#: holds the lock until its stdin closes
HOLD_UNTIL_STDIN = """
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
        [sys.executable, "-c", HOLD_UNTIL_STDIN, str(run), LOCK_PY],
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
