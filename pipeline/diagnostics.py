"""Process diagnostics used by tests, benchmarks and logs."""

from __future__ import annotations

import resource


def peak_rss_bytes() -> int:
    """Peak resident set size of this process since it started (``VmHWM``).

    Prefer this to ``getrusage().ru_maxrss``: on Linux ``ru_maxrss`` survives
    ``execve``, so a subprocess started from a large parent (pytest after many
    tests) reports the parent's peak. ``VmHWM`` belongs to the new address space.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # not Linux


def _status_bytes(field: str) -> int:
    """A ``kB`` field of ``/proc/self/status`` in bytes (Linux)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise OSError(f"{field} not found in /proc/self/status")


def current_rss_bytes() -> int:
    """Current resident set size (``VmRSS``)."""
    return _status_bytes("VmRSS")


def private_rss_bytes() -> int:
    """Current private (anonymous) resident memory (``RssAnon``): not the file pages a
    process maps, which RSS and VmHWM count again in every process that maps them."""
    return _status_bytes("RssAnon")
