"""The run lock: refused while the owner lives, taken over when it is dead."""

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
