"""Test-only fault injection, loaded by subprocesses through PYTHONPATH.

``KRR_KILL_MATCH=substring`` and ``KRR_KILL_AT=K``: the process SIGKILLs itself
just before writing the K-th completion marker whose ``"{array}/{key}"``
contains the substring, i.e. after that tile's data is stored but before it is
recorded as done: the worst moment for a checkpointing scheme.

``KRR_KILL_SIGNAL=TERM`` (or another signal's name without ``SIG``) sends that signal
instead, once, and lets the writer go on (a stop request from outside, e.g. systemd's
``systemctl stop``); ``KRR_KILL_STAMP=path`` then gets the time it was sent.

``KRR_KILL_ONCE=path``: of the processes given the same path (the workers of a cluster),
only the first to reach its K-th marker dies; it creates ``path`` (exclusively) first.
``KRR_KILL_THEN_DELAY=seconds``: once ``path`` exists, the survivors wait that long before
each matching marker, so the rest of the work outlasts the test's look at it (a kill in the
middle of the work is then certain, not a race with the survivors' speed).
"""

import os
import signal
import threading

_match = os.environ.get("KRR_KILL_MATCH")
_at = int(os.environ.get("KRR_KILL_AT", "0"))

if _match and _at > 0:
    from pipeline.storage import markers as _markers

    _orig = _markers.TileMarkers.mark
    _lock = threading.Lock()
    _count = [0]
    _signal = getattr(signal, "SIG" + os.environ.get("KRR_KILL_SIGNAL", "KILL").upper())
    _stamp = os.environ.get("KRR_KILL_STAMP")
    _once = os.environ.get("KRR_KILL_ONCE")
    _then_delay = float(os.environ.get("KRR_KILL_THEN_DELAY", "0"))

    def _first() -> bool:
        """This process is the first of those sharing ``KRR_KILL_ONCE`` to get here."""
        try:
            os.close(os.open(_once, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return False
        return True

    def _mark(self, tile, **info):
        label = f"{self.name}/{_markers._key(tile)}"
        if _match in label:
            with _lock:
                _count[0] += 1
                hit = _count[0] == _at if _signal != signal.SIGKILL else _count[0] >= _at
            if hit and (not _once or _first()):
                if _stamp:
                    import time

                    with open(_stamp, "w") as f:
                        f.write(repr(time.time()))
                os.kill(os.getpid(), _signal)
            if _then_delay and _once and os.path.exists(_once):
                import time

                time.sleep(_then_delay)
        return _orig(self, tile, **info)

    _markers.TileMarkers.mark = _mark

# ``KRR_KILL_SETTING_AT=K``: SIGKILL just before the K-th finished CV setting's marker is
# written (its data file is already stored): the worst moment for the search's resume
_setting_at = int(os.environ.get("KRR_KILL_SETTING_AT", "0"))

if _setting_at > 0:
    from pipeline.models.selection import checkpoint as _ckpt

    _orig_write = _ckpt.atomic_write
    _settings = [0]

    def _write(path, data, *a, **k):
        if str(path).endswith(".json") and "setting_" in os.path.basename(str(path)):
            _settings[0] += 1
            if _settings[0] >= _setting_at:
                os.kill(os.getpid(), signal.SIGKILL)
        return _orig_write(path, data, *a, **k)

    _ckpt.atomic_write = _write

# ``KRR_ENOSPC_MATCH=substring`` and ``KRR_ENOSPC_AT=K``: from the K-th direct chunk write
# whose temporary file's path contains the substring on, the write fails with ENOSPC (the
# disk is full), as ``os.write`` reports it
_enospc = os.environ.get("KRR_ENOSPC_MATCH")
_enospc_at = int(os.environ.get("KRR_ENOSPC_AT", "0"))

if _enospc and _enospc_at > 0:
    import errno as _errno

    from pipeline.storage import rawchunks as _raw

    _orig_direct = _raw._write_direct
    _writes = [0]

    def _direct(tmp, view):
        if _enospc in tmp:
            _writes[0] += 1
            if _writes[0] >= _enospc_at:
                raise OSError(_errno.ENOSPC, os.strerror(_errno.ENOSPC))
        return _orig_direct(tmp, view)

    _raw._write_direct = _direct

# ``KRR_MARK_DELAY=seconds``: wait that long before every tile's completion marker (its
# data is already stored). A small run then lasts as long as a test needs to act in the
# middle of a stage, without the requests and CPU of a run on more rows
_mark_delay = float(os.environ.get("KRR_MARK_DELAY", "0"))

if _mark_delay > 0:
    import time as _time

    from pipeline.storage import markers as _delayed

    _undelayed = _delayed.TileMarkers.mark

    def _mark_later(self, tile, **info):
        _time.sleep(_mark_delay)
        return _undelayed(self, tile, **info)

    _delayed.TileMarkers.mark = _mark_later
