"""The run lock: one live ``krr run`` per run directory.

``{run_dir}/.lock`` carries an OS-level exclusive lock (``fcntl.flock``) for as
long as the run lives. The kernel drops it when the process dies, however it
dies, so liveness is never guessed from a PID (a PID can be reused, or belong to
another PID namespace on the same host). The file also holds the owner's host,
PID and start time, for messages only.

- A held lock refuses a second run (:class:`LockHeldError`), whatever PID the
  file names.
- A lock file whose lock is free was left by a run on this host that died: it is
  taken over (``RunLock.took_over`` is the dead owner).
- A lock file whose lock is free but that names another host is refused: on a
  shared filesystem that does not forward locks between hosts, a free lock says
  nothing about a process on another machine. If that run is gone,
  ``krr unlock RUN_DIR`` (:func:`unlock`) removes the file after printing its owner.

A lock file is unlinked only while its lock is held, and a lock taken on a file
that has meanwhile been unlinked or replaced is dropped and taken again, so two
runs cannot both hold the lock of one run directory.

A run directory at a URL (``s3://bucket/run``) has no ``flock``: ``RunLock``
there is a :class:`LeaseLock`, a lease object renewed while the run lives (see
below and ``docs/STORAGE.md`` for its guarantees).

The lease. Object stores have no ``flock``. A run directory at a URL (``s3://bucket/run``)
is locked by the object ``{run_dir}/.lock``, a JSON record of the owner (host,
PID, process start time, a random token) and of an expiry time, renewed by a
background thread every ``ttl / 3`` seconds while the run lives.

Protocol (see ``docs/STORAGE.md``):

1. Create the lock object with a conditional PUT (``If-None-Match: *``, s3fs's
   ``pipe_file(mode="create")``): the store decides atomically, so of two runs
   that race for a free lock exactly one succeeds.
2. If it exists, read it. It is held (:class:`LockHeldError`)
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

import errno
import fcntl
import json
import logging
import os
import socket
import stat
import time
import uuid
from pathlib import Path
from typing import Any

from pipeline.errors import LockHeldError, RunDirUnusable, file_kind
from pipeline.storage.lease import LOCK_NAME, LeaseLock, _proc_start, lease_owner, lease_unlock
from pipeline.storage.location import is_url

log = logging.getLogger("pipeline.stages")


def _read_owner(path: Path) -> dict[str, Any] | None:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        return {}
    try:
        owner = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return owner if isinstance(owner, dict) else {}


def _same_file(fd: int, path: Path) -> bool:
    """Whether ``path`` still names the file open as ``fd`` (not unlinked or replaced)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    fst = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (fst.st_dev, fst.st_ino)


def _try_flock(path: Path, create: bool) -> int | None:
    """An fd of ``path`` holding its exclusive flock, or None when another holds it.

    With ``create=False`` a missing file raises FileNotFoundError.
    """
    for _ in range(100):
        flags = (os.O_RDWR | os.O_CREAT) if create else os.O_RDONLY
        try:  # never through a symbolic link: it could name any file of the user's
            fd = os.open(path, flags | getattr(os, "O_NOFOLLOW", 0), 0o644)
        except OSError as e:
            if e.errno != errno.ELOOP:
                raise
            raise RunDirUnusable(
                f"{str(path)!r} is a symbolic link, not the lock file krr-pipeline writes; "
                "it never writes or removes a file through a link. Remove the link, or use "
                "another run directory."
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return None
            raise
        if _same_file(fd, path):
            return fd
        os.close(fd)  # unlinked by its previous owner after we opened it: again
        if not create and not path.exists():
            raise FileNotFoundError(errno.ENOENT, "lock file removed", str(path))
    raise RuntimeError(f"could not lock {str(path)!r}: it is replaced again and again")


def _check_dir(run_dir: Path) -> None:
    if run_dir.exists() and not run_dir.is_dir():
        raise RunDirUnusable(
            f"run directory {str(run_dir)!r} is a file, not a directory. Use another "
            "--run-dir (or set run_dir in the config)."
        )
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RunDirUnusable(
            f"cannot create run directory {str(run_dir)!r}: {e.strerror or e}. Use another "
            "--run-dir, or fix its parent's permissions."
        ) from None
    if not os.access(run_dir, os.W_OK | os.X_OK):
        raise RunDirUnusable(
            f"run directory {str(run_dir)!r} is not writable (read-only filesystem or "
            "permissions). Make it writable, or use another --run-dir."
        )


def check_run_dir_files(run_dir: Path) -> None:
    """Raise :class:`RunDirUnusable` if the run directory holds anything but directories
    and regular files where the pipeline opens files: a FIFO (opening it blocks the run
    for ever), a socket, a device, or a symbolic link to a file (``run.log``, the
    manifest or a chunk would be read or written through it, wherever it leads).

    A symbolic link to a directory (a stage directory moved to another disk) is allowed
    and not entered; the runner refuses to empty it when its stage must be recomputed.
    """
    todo = [run_dir]
    while todo:
        d = todo.pop()
        try:
            entries = os.scandir(d)
        except (FileNotFoundError, NotADirectoryError):
            continue
        with entries:
            for e in entries:
                if e.is_dir(follow_symlinks=False):
                    todo.append(Path(e.path))
                    continue
                if e.is_file(follow_symlinks=False):
                    continue
                try:
                    mode = e.stat(follow_symlinks=False).st_mode
                except FileNotFoundError:  # (a temporary file renamed meanwhile)
                    continue
                if stat.S_ISLNK(mode) and os.path.isdir(e.path):
                    continue
                raise RunDirUnusable(
                    f"{e.path!r} in run directory {str(run_dir)!r} is {file_kind(mode)}, not a "
                    "regular file; krr-pipeline opens only regular files in a run directory "
                    "(a FIFO or device would block or feed the run, a link would be written "
                    "through to its target) and never removes what it did not create. Remove "
                    "or move it, or use another --run-dir."
                )


class RunLock:
    """Exclusive lock on a run directory; use as a context manager.

    Parameters
    ----------
    run_dir : path
        The run directory (created if missing).
    """

    def __new__(cls, run_dir: str | Path) -> Any:
        if is_url(run_dir):  # an object store: a lease object instead of flock
            return LeaseLock(str(run_dir))
        return super().__new__(cls)

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_NAME
        self.token = uuid.uuid4().hex
        self.took_over: dict[str, Any] | None = None
        self._held = False
        self._fd: int | None = None

    def read_owner(self) -> dict[str, Any] | None:
        """The owner recorded in the lock file: None without one, ``{}`` if unreadable."""
        return _read_owner(self.path)

    def acquire(self) -> RunLock:
        """Take the lock, taking over one left by a dead run on this host.

        Raises
        ------
        LockHeldError
            A live process holds the lock, or the file names another host.
        RunDirUnusable
            The run directory is a file, cannot be created, or is not writable; or it
            holds a FIFO, socket, device or symbolic link to a file
            (:func:`check_run_dir_files`).
        """
        _check_dir(self.run_dir)
        fd = None
        for _ in range(10):  # a short retry: `krr status` may be probing the lock
            try:
                fd = _try_flock(self.path, create=True)
            except PermissionError as e:
                raise RunDirUnusable(
                    f"cannot open the lock file {str(self.path)!r}: {e.strerror or e}. Make the "
                    "run directory writable, or use another --run-dir."
                ) from None
            except OSError as e:  # e.g. ENOLCK: a filesystem without locks
                raise RunDirUnusable(
                    f"cannot lock {str(self.path)!r}: {e.strerror or e}. The run directory "
                    "must be on a filesystem that supports file locks (flock); use another "
                    "--run-dir."
                ) from None
            if fd is not None:
                break
            time.sleep(0.05)
        if fd is None:
            owner = {}
            for _ in range(20):  # the holder may be writing its record right now
                owner = self.read_owner() or {}
                if owner:
                    break
                time.sleep(0.05)
            raise LockHeldError(self.run_dir, owner)
        try:
            _refuse_foreign(fd, self.path)
            previous = _read_fd(fd)
            host = socket.gethostname()
            if previous and previous.get("host") not in (None, host):
                raise LockHeldError(self.run_dir, previous, remote=True)
            me = {
                "pid": os.getpid(),
                "host": host,
                "proc_start": _proc_start(os.getpid()),
                "started": time.time(),
                "token": self.token,
            }
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(me).encode(), 0)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            raise
        if previous:
            self.took_over = previous  # a run on this host that died without releasing
        self._fd = fd
        self._held = True
        try:  # with the lock held: no run of ours is writing there now
            check_run_dir_files(self.run_dir)
        except BaseException:
            self.release()
            raise
        return self

    def release(self) -> None:
        """Remove the lock file (if it still holds this lock's record) and drop the lock."""
        if not self._held or self._fd is None:
            return
        try:
            owner = self.read_owner()
            if owner and owner.get("token") == self.token and _same_file(self._fd, self.path):
                self.path.unlink(missing_ok=True)
        finally:
            os.close(self._fd)  # closing drops the flock
            self._fd = None
            self._held = False

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _refuse_foreign(fd: int, path: Path) -> None:
    """Raise :class:`RunDirUnusable` if the lock file holds something other than a
    lock record (empty is fine: a run killed before it wrote its record)."""
    if os.fstat(fd).st_size and not {"pid", "host"} <= _read_fd(fd).keys():
        raise RunDirUnusable(
            f"{str(path)!r} exists and is not a krr-pipeline lock record; krr-pipeline "
            "never overwrites or removes what it did not create. Move or rename it, or "
            "use another run directory."
        )


def _read_fd(fd: int) -> dict[str, Any]:
    size = os.fstat(fd).st_size
    data = os.pread(fd, size, 0) if size else b""
    if not data.strip():
        return {}
    try:
        owner = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return owner if isinstance(owner, dict) else {}


def lock_owner(run_dir: str | Path) -> dict[str, Any] | None:
    """The owner of ``run_dir``'s lock while a live run holds it, else None.

    A lock file that names another host counts as held (this host cannot check).
    """
    if is_url(run_dir):
        return lease_owner(str(run_dir))
    path = Path(run_dir) / LOCK_NAME
    owner = _read_owner(path)
    if owner is None:
        return None
    try:
        fd = _try_flock(path, create=False)
    except (FileNotFoundError, PermissionError):
        return None
    if fd is None:
        return owner or _read_owner(path) or {}
    os.close(fd)
    if owner and owner.get("host") not in (None, socket.gethostname()):
        return owner
    return None


def unlock(run_dir: str | Path) -> dict[str, Any] | None:
    """Remove a lock file that no live process holds; return the owner it named.

    Returns None when there is no lock file.

    Raises
    ------
    LockHeldError
        A live process (on this host, or on one whose locks reach this
        filesystem) holds the lock: it is left alone.
    """
    if is_url(run_dir):
        return lease_unlock(str(run_dir))
    run_dir = Path(run_dir)
    path = run_dir / LOCK_NAME
    try:
        fd = _try_flock(path, create=False)
    except FileNotFoundError:
        return None
    if fd is None:
        raise LockHeldError(run_dir, _read_owner(path) or {})
    try:
        _refuse_foreign(fd, path)
        owner = _read_fd(fd)
        if not owner and not (run_dir / "manifest.json").exists():
            raise RunDirUnusable(
                f"{str(path)!r} is empty and {str(run_dir)!r} is not a run directory (no "
                "manifest.json): not removed"
            )
        path.unlink(missing_ok=True)
    finally:
        os.close(fd)
    return owner
