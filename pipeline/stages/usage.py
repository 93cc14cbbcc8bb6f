"""Wall time and peak memory of one stage, recorded in its manifest entry.

:class:`StageUsage` is started before a stage function runs and stopped when it
returns or raises. While it runs, a daemon thread samples the resident memory
of this process and of its local child processes (the workers of a
``LocalCluster``) every ``interval`` seconds, so the recorded peak is the
stage's own, not the process's lifetime high-water mark. The latter
(``getrusage``'s ``ru_maxrss``) is recorded too, as ``process_max_rss_bytes``.

Workers of a remote scheduler (``--scheduler``) are not local processes: their
memory is not counted. Without :mod:`psutil` (installed with ``distributed``)
only the wall time and ``process_max_rss_bytes`` are recorded.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

__all__ = ["StageUsage"]


def _max_rss_bytes() -> int | None:
    """This process's lifetime peak resident memory (``ru_maxrss``), in bytes."""
    try:
        import resource
    except ImportError:  # Windows
        return None
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss) if sys.platform == "darwin" else int(rss) * 1024  # Linux reports KiB


class StageUsage:
    """Measure one stage: ``u = StageUsage.start()``, then ``u.stop()`` -> JSON dict.

    Parameters
    ----------
    interval : float
        Seconds between memory samples.
    """

    def __init__(self, interval: float = 0.2) -> None:
        self.interval = float(interval)
        self._t0 = 0.0
        self._peak_self = 0
        self._peak_children = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        try:
            import psutil

            self._proc = psutil.Process()
        except Exception:  # no psutil, or a platform it cannot inspect
            self._proc = None

    @classmethod
    def start(cls, interval: float = 0.2) -> StageUsage:
        """A started measurement."""
        u = cls(interval)
        u._t0 = time.perf_counter()
        if u._proc is not None:
            u._sample()
            u._thread = threading.Thread(target=u._loop, name="krr-stage-usage", daemon=True)
            u._thread.start()
        return u

    def _sample(self) -> None:
        try:
            self._peak_self = max(self._peak_self, int(self._proc.memory_info().rss))
            kids = 0
            for c in self._proc.children(recursive=True):
                try:
                    kids += int(c.memory_info().rss)
                except Exception:  # the child exited between listing and reading
                    pass
            self._peak_children = max(self._peak_children, kids)
        except Exception:  # never let a measurement fail a stage
            pass

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def stop(self) -> dict[str, Any]:
        """Stop sampling; the stage's ``seconds`` and memory peaks (bytes) as a JSON dict."""
        seconds = time.perf_counter() - self._t0
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * self.interval + 1.0)
            self._sample()
        out: dict[str, Any] = {"seconds": seconds}
        if self._proc is not None:
            out["peak_rss_bytes"] = self._peak_self
            out["peak_children_rss_bytes"] = self._peak_children
        maxrss = _max_rss_bytes()
        if maxrss is not None:
            out["process_max_rss_bytes"] = maxrss
        return out
