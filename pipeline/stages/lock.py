"""The run lock: one live ``krr run`` per run directory.

``{run_dir}/.lock`` is created with ``O_CREAT | O_EXCL`` and holds the owner's
pid, host and process start time. A second run finds it and is refused while
the owner is alive. If the owner is dead (killed, crashed), the lock is stale:
it is moved aside atomically and taken over, so two runs racing for a stale
lock cannot both win.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from pathlib import Path
from typing import Any

import psutil

LOCK_NAME = ".lock"


class LockHeldError(RuntimeError):
    """Another live process holds the run directory's lock."""

    def __init__(self, run_dir: Path, owner: dict[str, Any]) -> None:
        self.run_dir = run_dir
        self.owner = owner
        started = owner.get("started")
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)) if started else "?"
        super().__init__(
            f"run directory {str(run_dir)!r} is locked by pid {owner.get('pid')} on "
            f"{owner.get('host')} (running since {when}). Wait for it to finish, stop it, "
            "or use another --run-dir."
        )


def _proc_start(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


def _owner_alive(owner: dict[str, Any]) -> bool:
    if owner.get("host") != socket.gethostname():
        # cannot check a process on another host: treat the lock as held
        return True
    pid = owner.get("pid")
    if not isinstance(pid, int) or not psutil.pid_exists(pid):
        return False
    try:
        if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return False
    except psutil.NoSuchProcess:
        return False
    start = _proc_start(pid)
    recorded = owner.get("proc_start")
    # a recycled pid has another start time
    return start is not None and (recorded is None or abs(start - recorded) < 1.0)


class RunLock:
    """Exclusive lock on a run directory; use as a context manager.

    Parameters
    ----------
    run_dir : path
        The run directory (created if missing).
    """

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_NAME
        self.token = uuid.uuid4().hex
        self.took_over: dict[str, Any] | None = None
        self._held = False

    def read_owner(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.path.read_text())
        except FileNotFoundError:
            return None
        except (json.JSONDecodeError, UnicodeDecodeError):
            return {}

    def acquire(self) -> RunLock:
        """Take the lock, taking over a stale one.

        Raises
        ------
        LockHeldError
            A live process owns the lock.
        """
        self.run_dir.mkdir(parents=True, exist_ok=True)
        me = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "proc_start": _proc_start(os.getpid()),
            "started": time.time(),
            "token": self.token,
        }
        for _ in range(50):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                owner = self.read_owner()
                if owner is None:
                    continue  # released meanwhile: retry
                if owner == {}:
                    # a lock file half written by a process killed while creating it
                    age = time.time() - self.path.stat().st_mtime if self.path.exists() else 0
                    if age < 5:
                        time.sleep(0.2)
                        continue
                elif _owner_alive(owner):
                    raise LockHeldError(self.run_dir, owner) from None
                # stale: remove it under a short-lived takeover mutex, re-checking inside,
                # so two runs racing for the same stale lock cannot both win
                if self._remove_stale(owner):
                    self.took_over = owner
                continue
            with os.fdopen(fd, "w") as f:
                json.dump(me, f)
                f.flush()
                os.fsync(f.fileno())
            self._held = True
            return self
        owner = self.read_owner() or {}
        raise LockHeldError(self.run_dir, owner)

    def _remove_stale(self, owner: dict[str, Any]) -> bool:
        mutex = self.path.with_name(f"{LOCK_NAME}.takeover")
        try:
            fd = os.open(mutex, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                if time.time() - mutex.stat().st_mtime > 10:
                    mutex.unlink(missing_ok=True)  # left by a process killed mid-takeover
            except FileNotFoundError:
                pass
            time.sleep(0.1)
            return False
        os.close(fd)
        try:
            current = self.read_owner()
            if current is not None and current.get("token") == owner.get("token"):
                self.path.unlink(missing_ok=True)
                return True
            return False
        finally:
            mutex.unlink(missing_ok=True)

    def release(self) -> None:
        """Remove the lock if this object still owns it."""
        if not self._held:
            return
        owner = self.read_owner()
        if owner and owner.get("token") == self.token:
            self.path.unlink(missing_ok=True)
        self._held = False

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def lock_owner(run_dir: str | Path) -> dict[str, Any] | None:
    """The live owner of ``run_dir``'s lock, or None if unlocked or stale."""
    owner = RunLock(run_dir).read_owner()
    if not owner or not _owner_alive(owner):
        return None
    return owner
