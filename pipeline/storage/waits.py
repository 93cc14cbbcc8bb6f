"""A cap on every object-store wait in this process, for the cleanup after an interrupt.

Its own module so that :mod:`pipeline.storage.s3` (which reads it) and
:mod:`pipeline.storage.location` (which registers that filesystem, and re-exports
these names) do not import each other.
"""

from __future__ import annotations

import time

#: (since, seconds): every object-store operation gives up ``seconds`` after ``since``
#: or its own start, whichever is later (cleanup after Ctrl-C or SIGTERM); None: no cap
_WAIT_CAP: list[tuple[float, float]] = []
#: seconds a cap lasts: the cleanup after an interrupt takes a few capped operations (the
#: queued tile writes, the manifest, run.log, the lease); an operation started later (the
#: next fit in a notebook where Ctrl-C stopped one) has the store's own waits again
CAP_WINDOW = 60.0


def cap_store_waits(seconds: float | None = 2.0) -> None:
    """From now on in this process, every object-store operation (those under way too)
    gives up after ``seconds`` (``None``: lift the cap), for :data:`CAP_WINDOW` seconds.
    The runner sets it when a run is interrupted, so the cleanup (manifest, lease,
    run.log) cannot hold the process on a store that does not answer; a new run lifts
    it."""
    _WAIT_CAP.clear()
    if seconds is not None:
        _WAIT_CAP.append((time.monotonic(), float(seconds)))


def store_wait_cap() -> tuple[float, float] | None:
    """``(since, seconds)`` set by :func:`cap_store_waits` within the last
    :data:`CAP_WINDOW` seconds, or None."""
    if not _WAIT_CAP or time.monotonic() - _WAIT_CAP[0][0] > CAP_WINDOW:
        return None
    return _WAIT_CAP[0]


def cap_store_waits_if_interrupted(error: BaseException | None) -> None:
    """:func:`cap_store_waits` when ``error`` is an interrupt (Ctrl-C's KeyboardInterrupt,
    SIGTERM's :class:`~pipeline.errors.Terminated`, SystemExit). For the ``__exit__`` or
    ``finally`` of whatever still waits on the store while an interrupt unwinds through
    it (a tile writer finishing its queued writes): capped at once, it gives up in
    seconds, not after the store's own timeouts (minutes), before the runner's cleanup
    is reached."""
    if isinstance(error, KeyboardInterrupt | SystemExit):
        cap_store_waits()
