"""Peak memory over a stretch of a benchmark, sampled by a background thread.

``PeakSampler(measure)`` samples ``measure()`` (bytes: ``current_rss_bytes`` or
``private_rss_bytes`` from :mod:`pipeline.diagnostics`) every ``every`` seconds, as a
``with`` block or from ``start()`` on. For Dask worker processes, ``client.run`` the
module functions :func:`start_private` and :func:`private_peak` (state is kept here,
one sampler per process).

It imports internals (``pipeline.diagnostics``) because the benchmarks measure memory
with the same ``/proc`` readings the package's own diagnostics use.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from pipeline.diagnostics import private_rss_bytes


class PeakSampler:
    """The largest value of ``measure()`` seen since ``start()`` (or the last reset)."""

    def __init__(self, measure: Callable[[], int], every: float = 0.02) -> None:
        self.measure, self.every, self.peak = measure, float(every), 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.measure())
            self._stop.wait(self.every)

    def start(self) -> PeakSampler:
        self.peak = self.measure()
        self._thread = threading.Thread(target=self._loop, name="peak-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> int:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.peak = max(self.peak, self.measure())
        return self.peak

    def take(self, reset: bool = False) -> int:
        """The peak so far; with ``reset``, a new peak starts from now."""
        peak = max(self.peak, self.measure())
        if reset:
            self.peak = self.measure()
        return peak

    def __enter__(self) -> PeakSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


_PRIVATE: PeakSampler | None = None


def start_private(every: float = 0.25) -> None:
    """Sample this process's private memory (``RssAnon``) from now until it exits."""
    global _PRIVATE
    if _PRIVATE is None:
        _PRIVATE = PeakSampler(private_rss_bytes, every).start()


def private_peak(reset: bool = False) -> int:
    """This process's sampled private-memory peak (0 if :func:`start_private` was not run)."""
    return 0 if _PRIVATE is None else _PRIVATE.take(reset)
