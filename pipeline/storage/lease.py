"""The lease: an exclusive lock on a directory of an object store, where no ``flock``
exists (moved here from :mod:`pipeline.stages.lock`, which re-exports every name, so the
fit layer can lock an object-store fit directory too: :func:`pipeline.fit`'s
``.fit-lock``).

The lease object (``{dir}/.lock`` for a run directory) is a JSON record of the owner
(host, PID, process start time, a random token) and of an expiry time, renewed by a
background thread every ``ttl / 3`` seconds while the owner lives. The protocol and its
honest limits are described in :mod:`pipeline.stages.lock` and ``docs/STORAGE.md``.
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

from pipeline.errors import LockHeldError
from pipeline.storage.location import Location, StoreUnreachable
from pipeline.storage.tempfiles import process_namespace

log = logging.getLogger("pipeline.stages")

#: the lock object of a run directory
LOCK_NAME = ".lock"


def _proc_start(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


# -- the lease on an object store --------------------------------------------------------
#: seconds a lease lives without renewal
DEFAULT_TTL = 60.0
#: seconds a lease release (in cleanup) waits for the store before it gives up
RELEASE_WAIT = 3.0


def _read(loc: Location, name: str = LOCK_NAME) -> dict[str, Any] | None:
    """The lock record: None when there is none, ``{}`` when unreadable."""
    try:
        loc.fs.invalidate_cache()
        data = loc.read_bytes(name)
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
    name : str
        The lock object's name in that directory (``.fit-lock`` for a fit directory).
    """

    def __init__(self, run_dir: str, ttl: float = DEFAULT_TTL, name: str = LOCK_NAME) -> None:
        self.run_dir = str(run_dir).rstrip("/")
        self.loc = Location(self.run_dir)
        self.name = name
        self.path = self.loc.child(name)
        self.ttl = float(ttl)
        self.token = uuid.uuid4().hex
        self.took_over: dict[str, Any] | None = None
        self.lost = False
        self._held = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def read_owner(self) -> dict[str, Any] | None:
        return _read(self.loc, self.name)

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
        for _ in range(5):
            if self.loc.create_exclusive(self.name, self._record()):
                rec = _read(self.loc, self.name)
                if rec and rec.get("token") == self.token:
                    self._held = True
                    self._start_renewal()
                    return self
                continue  # replaced under us: look again
            rec = _read(self.loc, self.name)
            if rec is None:
                continue  # released meanwhile
            if not _dead(rec, time.time()):
                raise LockHeldError(
                    self.run_dir,  # type: ignore[arg-type]
                    rec,
                    remote=rec.get("host") != socket.gethostname(),
                )
            self.took_over = rec
            self.loc.rm(self.name)
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
                path = self.loc.path(self.name)
                etag = _etag(self.loc.fs, path)  # before the read: a newer owner changes it
                rec = _read(self.loc, self.name)
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
        """Stop renewing; delete the lock object if it still holds this lease's token.

        Never raises, and waits at most :data:`RELEASE_WAIT` seconds: it runs in cleanup
        (a ``finally``, Ctrl-C), where a store that fails or does not answer must neither
        replace the real error nor hold the process. A lease not deleted is logged; it
        expires by itself after its ``ttl``.
        """
        if not self._held:
            return
        self._held = False
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=RELEASE_WAIT)
        done = threading.Event()

        def drop() -> None:
            try:
                rec = _read(self.loc, self.name)
                if rec and rec.get("token") == self.token:
                    self.loc.rm(self.name)
            except Exception as e:
                log.warning(
                    "could not release the lease %s (%s: %s); it expires by itself within %g s",
                    self.path,
                    type(e).__name__,
                    e,
                    self.ttl,
                )
            finally:
                done.set()

        threading.Thread(target=drop, daemon=True, name="krr-lease-release").start()
        if not done.wait(RELEASE_WAIT):
            log.warning(
                "could not release the lease %s: the object store did not answer within "
                "%g s; it expires by itself within %g s",
                self.path,
                RELEASE_WAIT,
                self.ttl,
            )

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
    loc = Location(run_dir)
    rec = _read(loc)
    if rec is None:
        return None
    if not _dead(rec, time.time()):
        raise LockHeldError(run_dir, rec, remote=rec.get("host") != socket.gethostname())  # type: ignore[arg-type]
    loc.rm(LOCK_NAME)
    return rec
