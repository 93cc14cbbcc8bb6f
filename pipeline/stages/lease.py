"""The run lock on an object store: a lease object.

Object stores have no ``flock``. A run directory at a URL (``s3://bucket/run``)
is locked by the object ``{run_dir}/.lock``, a JSON record of the owner (host,
PID, process start time, a random token) and of an expiry time, renewed by a
background thread every ``ttl / 3`` seconds while the run lives.

Protocol (see ``docs/STORAGE.md``):

1. Create the lock object with a conditional PUT (``If-None-Match: *``, s3fs's
   ``pipe_file(mode="create")``): the store decides atomically, so of two runs
   that race for a free lock exactly one succeeds.
2. If it exists, read it. It is held (:class:`~pipeline.stages.lock.LockHeldError`)
   unless its lease has expired, or it names this host, this kernel boot and this
   PID namespace (a container that shares the hostname has its own PIDs) and a
   process that is no longer running (PID and start time both checked, so a
   reused PID does not count as the owner). A dead owner's lock is deleted and
   step 1 is retried.
3. After creating it, read it back and compare the token.

Honest limits: taking over a dead owner's lock is "delete, then create
exclusively"; two runs that both found the same dead lock may race, and the
delete of the slower can remove the lock the faster one just created. The
renewal thread re-reads the object and logs an error and sets
:attr:`LeaseLock.lost` when it finds another token; its write is conditional on
the object it read (``If-Match`` on S3), so it never takes back a lease another
run has taken over. A run that lost its lease is not stopped at once, but
``krr run`` then fails (exit 5) instead of reporting success. A process that is paused for longer than the lease (``ttl``) loses the
lock without knowing it until its next renewal. S3 has no fencing tokens, so
these cases are documented, not prevented. A lease on a filesystem without
conditional writes degrades to check-then-write. Expiry compares the owner's
clock (``expires``, written by the owner) with the reader's: hosts whose clocks
differ by more than ``ttl / 3`` can see a live lease as expired, so keep them in
sync (NTP).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from typing import Any

import psutil

from pipeline.storage.location import Location, StoreUnreachable
from pipeline.storage.tempfiles import process_namespace

log = logging.getLogger("pipeline.stages")

LOCK_NAME = ".lock"
#: seconds a lease lives without renewal
DEFAULT_TTL = 60.0


def _proc_start(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


def _read(loc: Location) -> dict[str, Any] | None:
    """The lock record: None when there is none, ``{}`` when unreadable."""
    try:
        loc.fs.invalidate_cache()
        data = loc.read_bytes(LOCK_NAME)
    except FileNotFoundError:
        return None
    try:
        rec = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return rec if isinstance(rec, dict) else {}


def _etag(fs: Any, path: str) -> str | None:
    """The object's ETag on an S3 store (for a conditional PUT); None elsewhere."""
    protocol = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
    if not {"s3", "s3a"} & set(protocol):
        return None
    info = fs.info(path, refresh=True)
    return info.get("ETag") or info.get("etag")


def _dead(rec: dict[str, Any], now: float) -> bool:
    """Whether the owner named in ``rec`` certainly no longer holds the lease."""
    expires = rec.get("expires")
    if not isinstance(expires, int | float) or expires < now:
        return True  # expired (or a record without an expiry: not ours to honour)
    if rec.get("host") != socket.gethostname():
        return False
    if rec.get("pidns") != process_namespace() or not rec.get("pidns"):
        return False  # another container with this hostname: its PIDs are not ours to see
    pid = rec.get("pid")
    if not isinstance(pid, int):
        return False
    start = _proc_start(pid)
    return start is None or (
        rec.get("proc_start") is not None and abs(start - rec["proc_start"]) > 1e-3
    )


class LeaseLock:
    """Exclusive lease on a run directory at a URL (the object-store :class:`RunLock`).

    Parameters
    ----------
    run_dir : str
        URL of the run directory.
    ttl : float
        Seconds the lease lives without renewal.
    """

    def __init__(self, run_dir: str, ttl: float = DEFAULT_TTL) -> None:
        self.run_dir = str(run_dir).rstrip("/")
        self.loc = Location(self.run_dir)
        self.path = self.loc.child(LOCK_NAME)
        self.ttl = float(ttl)
        self.token = uuid.uuid4().hex
        self.took_over: dict[str, Any] | None = None
        self.lost = False
        self._held = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def read_owner(self) -> dict[str, Any] | None:
        return _read(self.loc)

    def _record(self) -> bytes:
        pid = os.getpid()
        return json.dumps(
            {
                "pid": pid,
                "host": socket.gethostname(),
                "pidns": process_namespace(),
                "proc_start": _proc_start(pid),
                "started": time.time(),
                "expires": time.time() + self.ttl,
                "token": self.token,
                "kind": "lease",
            }
        ).encode()

    def acquire(self) -> LeaseLock:
        """Take the lease, taking over an expired one or one of a dead process on this host.

        Raises
        ------
        LockHeldError
            A live lease is held by another run.
        StoreUnreachable
            The object store cannot be reached.
        """
        from pipeline.stages.lock import LockHeldError

        for _ in range(5):
            if self.loc.create_exclusive(LOCK_NAME, self._record()):
                rec = _read(self.loc)
                if rec and rec.get("token") == self.token:
                    self._held = True
                    self._start_renewal()
                    return self
                continue  # replaced under us: look again
            rec = _read(self.loc)
            if rec is None:
                continue  # released meanwhile
            if not _dead(rec, time.time()):
                raise LockHeldError(
                    self.run_dir,  # type: ignore[arg-type]
                    rec,
                    remote=rec.get("host") != socket.gethostname(),
                )
            self.took_over = rec
            self.loc.rm(LOCK_NAME)
        raise StoreUnreachable(
            f"could not take the lease {self.path!r}: it was replaced again and again"
        )

    def _start_renewal(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._renew_loop, daemon=True, name="krr-lease")
        self._thread.start()

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            try:
                path = self.loc.path(LOCK_NAME)
                etag = _etag(self.loc.fs, path)  # before the read: a newer owner changes it
                rec = _read(self.loc)
                if rec is None or rec.get("token") != self.token:
                    if not self.lost:
                        log.error("the lease %s was taken by another run: %s", self.path, rec)
                    self.lost = True
                    continue
                # conditional on the object read: a run that took the lease over between
                # the read and this write keeps it (a plain PUT took it back, and the
                # newer run was the one flagged lost)
                extra = {"IfMatch": etag} if etag is not None else {}
                self.loc.fs.pipe_file(path, self._record(), **extra)
            except Exception as e:  # a transient store error: try again next period
                log.warning("could not renew the lease %s: %s", self.path, e)

    def release(self) -> None:
        """Stop renewing; delete the lock object if it still holds this lease's token."""
        if not self._held:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            rec = _read(self.loc)
            if rec and rec.get("token") == self.token:
                self.loc.rm(LOCK_NAME)
        finally:
            self._held = False

    def __enter__(self) -> LeaseLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def lease_owner(run_dir: str) -> dict[str, Any] | None:
    """The owner of a live lease on ``run_dir``, else None."""
    rec = _read(Location(run_dir))
    if rec is None or _dead(rec, time.time()):
        return None
    return rec


def lease_unlock(run_dir: str) -> dict[str, Any] | None:
    """Remove a lease no live run holds; return the owner it named (None: no lease)."""
    from pipeline.stages.lock import LockHeldError

    loc = Location(run_dir)
    rec = _read(loc)
    if rec is None:
        return None
    if not _dead(rec, time.time()):
        raise LockHeldError(run_dir, rec, remote=rec.get("host") != socket.gethostname())  # type: ignore[arg-type]
    loc.rm(LOCK_NAME)
    return rec
