"""Temporary files and stores the pipeline creates, and sweeping what a killed run left.

Every write that must be atomic goes through a temporary file next to its
target, named by :func:`tmp_path_for` (``{target}.{pid}-{hex}.tmp``), then
``os.replace``. A process killed between the two (SIGKILL, power loss) leaves
that file behind. Zarr's own local store does the same with
``{target}.{hex}.partial`` files. Nothing ever reads them, but they take disk
space, so :func:`sweep_tmp_files` removes the stale ones when a store is
reopened (:func:`pipeline.storage.open_tiled_array`), *before* any work on it
starts. A temporary file is stale when

* its name matches one of the two patterns above (never any other file), and
* the process id in its name is not a live process on this host (nor this one:
  every thread of this process writes under its id), or, for a name without a
  process id, it was last modified before this process started.

The process id, not the file's age, decides for our own files (a retry a few
milliseconds after a kill must sweep what the killed writer left). A writer on
another host of a shared filesystem is not seen as live here; deleting its file only
fails that write's rename, in a killed run.

Temporary stores (the Gram and factor of an estimator fitted out of core
without an explicit ``store``) live under one directory, :func:`temp_root`:
``$KRR_TMPDIR`` if set, else ``{tempfile.gettempdir()}/krr-pipeline``. Each is
named ``krr-store-{pid}@{host}-{random}``; it is removed when its fit ends, and
one left by a killed process (same host, pid no longer alive) is removed by the
next :func:`make_temp_store`. Deleting the whole directory while no fit runs is
always safe.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import socket
import tempfile
import time
import uuid
from collections.abc import Collection
from pathlib import Path

log = logging.getLogger(__name__)

__all__ = [
    "PROCESS_START",
    "make_temp_store",
    "sweep_temp_stores",
    "sweep_tmp_files",
    "temp_root",
    "tmp_path_for",
]


def _process_start() -> float:
    """When this process started, in seconds since the epoch, to the clock tick.

    Linux: the start time in ``/proc/self/stat`` (clock ticks since boot) against
    ``CLOCK_BOOTTIME`` (``psutil``'s ``create_time`` adds the ticks to a boot time
    in whole seconds, so it is up to a second early). Elsewhere ``psutil``;
    without it, this module's import time. Never later than the import: no writer
    of this process can have made a temporary file before it
    (:func:`tmp_path_for` is here).
    """
    imported = time.time()
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        since_boot = int(fields[19]) / os.sysconf("SC_CLK_TCK")
        return min(imported, imported - (time.clock_gettime(time.CLOCK_BOOTTIME) - since_boot))
    except (OSError, ValueError, IndexError, AttributeError):
        pass
    try:
        import psutil

        return min(imported, float(psutil.Process().create_time()))
    except Exception:  # psutil missing or unsupported: this module's import time
        return imported


#: when this process started (seconds since the epoch); files older than this
#: cannot belong to a writer of this process
PROCESS_START: float = _process_start()

# {target}.{pid}-{32 hex}.tmp (ours), {target}.{32 hex}.tmp (ours, before pids were
# recorded), {target}.{32 hex}.partial (Zarr's LocalStore)
_TMP_RE = re.compile(r"\.(?:(?P<pid>\d+)-)?[0-9a-f]{32}\.tmp$|\.[0-9a-f]{32}\.partial$")
_STORE_RE = re.compile(r"^krr-store-(?P<pid>\d+)@(?P<host>.+)-[a-z0-9_]+$")


def tmp_path_for(path: str) -> str:
    """The temporary file an atomic write of ``path`` goes through (same directory)."""
    return f"{path}.{os.getpid()}-{uuid.uuid4().hex}.tmp"


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    except OSError:
        return False
    return True


def process_namespace() -> str:
    """This kernel boot and PID namespace (``boot_id:pidns inode``; "" where unknown).

    A PID names a process only inside one namespace: two containers that share a
    hostname (``--network host``) and a volume each have their own PID 7. A record
    that names a PID is judged by it only when this matches ours."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        return f"{boot}:{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return ""


#: the record inside a temporary store naming the namespace of its process
STORE_OWNER = ".krr-store-owner"


def _is_stale(name: str, mtime: float, before: float) -> bool:
    m = _TMP_RE.search(name)
    if m is None:
        return False  # not a temporary file of ours or Zarr's: never touched
    pid = m.group("pid")
    if pid is None:  # no writer named (Zarr's, or ours before pids): its age decides
        return mtime < before
    if int(pid) == os.getpid():
        # ours, unless an earlier process that had our pid left it: a clear second
        # older than this process (file times and the start are coarse)
        return mtime < before - 1.0
    return not _pid_alive(int(pid))


def sweep_tmp_files(
    directory: str | os.PathLike,
    *,
    recursive: bool = True,
    targets: Collection[str] | None = None,
) -> list[str]:
    """Remove stale temporary files of atomic writes under a local ``directory``.

    Only files named like the pipeline's (or Zarr's) temporary files, older than
    this process and not owned by a live process, are removed (see the module
    docstring). Call it when a store is opened, before work on it starts.
    fsspec URLs are skipped: object stores write whole objects, no temporaries.
    ``targets``: only temporary files of these names (``manifest.json`` for
    ``manifest.json.{pid}-{hex}.tmp``), for a directory that also holds the
    user's files (a run directory): a user's ``export.{32 hex}.tmp`` is not ours.

    Returns
    -------
    list of str
        The paths removed.
    """
    text = os.fspath(directory)
    if "://" in text:
        return []
    removed: list[str] = []
    stack = [text]
    while stack:
        d = stack.pop()
        try:
            entries = list(os.scandir(d))
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            continue
        for e in entries:
            try:
                if e.is_dir(follow_symlinks=False):
                    if recursive:
                        stack.append(e.path)
                    continue
                if not e.is_file(follow_symlinks=False):
                    continue
                if targets is not None and _TMP_RE.sub("", e.name) not in targets:
                    continue
                if _is_stale(e.name, e.stat(follow_symlinks=False).st_mtime, PROCESS_START):
                    os.unlink(e.path)
                    removed.append(e.path)
            except FileNotFoundError:  # removed meanwhile
                continue
    if removed:
        log.info(
            "removed %d temporary file(s) left by an interrupted write under %s",
            len(removed),
            text,
        )
    return removed


def temp_root() -> Path:
    """The directory that holds every temporary store: ``$KRR_TMPDIR`` or
    ``{tempfile.gettempdir()}/krr-pipeline`` (created if missing)."""
    env = os.environ.get("KRR_TMPDIR")
    root = Path(env) if env else Path(tempfile.gettempdir()) / "krr-pipeline"
    root.mkdir(parents=True, exist_ok=True)
    return root


def sweep_temp_stores(root: str | os.PathLike | None = None) -> list[str]:
    """Remove temporary stores under ``root`` (default :func:`temp_root`) whose
    process, on this host, is gone. Returns the paths removed."""
    root = Path(root) if root is not None else temp_root()
    host = socket.gethostname()
    removed: list[str] = []
    try:
        entries = list(os.scandir(root))
    except FileNotFoundError:
        return removed
    for e in entries:
        m = _STORE_RE.match(e.name)
        if m is None or m.group("host") != host or not e.is_dir(follow_symlinks=False):
            continue
        pid = int(m.group("pid"))
        if pid == os.getpid() or _pid_alive(pid):
            continue
        try:  # a process of another PID namespace (a container on this host) is not
            with open(os.path.join(e.path, STORE_OWNER)) as f:  # seen by _pid_alive
                if f.read().strip() != process_namespace():
                    continue
        except FileNotFoundError:
            pass  # a store of an earlier version, or one not yet recorded: by its pid
        except OSError:
            continue
        shutil.rmtree(e.path, ignore_errors=True)
        removed.append(e.path)
    if removed:
        log.info("removed %d temporary store(s) of killed processes: %s", len(removed), removed)
    return removed


def make_temp_store() -> str:
    """Create a new temporary store directory under :func:`temp_root` (after
    sweeping those of killed processes) and return its path; the caller removes it."""
    root = temp_root()
    sweep_temp_stores(root)
    prefix = f"krr-store-{os.getpid()}@{socket.gethostname()}-"
    store = tempfile.mkdtemp(prefix=prefix, dir=root)
    with open(os.path.join(store, STORE_OWNER), "w") as f:
        f.write(process_namespace())
    return store
