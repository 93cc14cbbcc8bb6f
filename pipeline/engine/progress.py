"""Progress display: one place decides how a long computation shows its progress.

Every stage shows one labelled display (``"gram: 40/120 tiles"``,
``"cholesky: tiles"``, ``"predict: tiles"``, ``"cg: iteration 12, residual
3.1e-05"``) with what is counted, the rate and the ETA. How it is drawn
depends on the *mode*:

=========  ===================================================================
``auto``   widgets in Jupyter, a ``tqdm`` bar on a terminal, plain timestamped
           lines (through :mod:`logging`) when stderr is not a terminal
``bars``   ``tqdm`` bars on stderr (widgets in Jupyter) whatever stderr is
``lines``  timestamped lines, at most one per 10% of the work (and one at
           least every 30 s), plus a first and a last line
``off``    nothing
=========  ===================================================================

The mode comes from, most specific first: :func:`progress_scope` (what an
estimator's ``progress`` parameter sets for the duration of ``fit``/``predict``),
:func:`set_progress_mode` (the command line's ``-q``), the ``KRR_PROGRESS``
environment variable, else ``auto``. Bars and lines go to stderr only, never
to stdout (``krr ... --json`` output stays clean). Lines go through the
``pipeline.engine.progress`` logger at INFO, so a program that configures logging (as
``krr`` does, also into ``run.log``) decides where they land; when nothing
configures logging and progress was asked for explicitly, they are written to
stderr with a timestamp.

Entry points: :func:`stage_progress` (a counted loop: the Cholesky threads,
the CV settings), :func:`~pipeline.engine.progress_dask.dask_progress` (a Dask computation, in
:mod:`pipeline.engine.progress_dask`: the tile tasks of the graph on the threaded
scheduler through :class:`tqdm.dask.TqdmCallback`, or on a distributed cluster
through its scheduler's progress feed, as :func:`distributed.progress` does),
:func:`cg_progress` (a CG callback showing
the iteration and the relative residual) and :func:`progress_group` (one
display for several computations of one stage, e.g. ingest).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import math
import numbers
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

__all__ = [
    "ENV_VAR",
    "MODES",
    "Progress",
    "cg_progress",
    "get_progress_mode",
    "open_progress",
    "progress_group",
    "progress_scope",
    "resolved_mode",
    "set_progress_mode",
    "stage_progress",
    "with_progress",
]

log = logging.getLogger("pipeline.engine.progress")

#: the modes (see the module docstring)
MODES = ("auto", "bars", "lines", "off")
#: environment variable that sets the default mode
ENV_VAR = "KRR_PROGRESS"
#: lines mode: a line per this fraction of the work ...
LINE_FRACTION = 0.10
#: ... but not more often than this (seconds), except the first and the last line
LINE_MIN_SECONDS = 2.0
#: ... and at least this often (seconds) while the work goes on
LINE_MAX_SECONDS = 30.0

_mode: str | None = None  # set_progress_mode
_scope: contextvars.ContextVar[tuple[str, bool] | None] = contextvars.ContextVar(
    "krr_progress_scope", default=None
)
_group: contextvars.ContextVar[Any] = contextvars.ContextVar("krr_progress_group", default=None)


# -- the mode ---------------------------------------------------------------------------
def _check_mode(mode: Any, what: str) -> str:
    if not isinstance(mode, str) or mode.strip().lower() not in MODES:
        raise ValueError(f"{what} must be one of {', '.join(repr(m) for m in MODES)}, got {mode!r}")
    return mode.strip().lower()


def set_progress_mode(mode: str | None) -> None:
    """Set the process-wide progress mode (``None``: back to ``KRR_PROGRESS`` / ``auto``).

    The command line calls it: ``-q`` gives ``"off"``.
    """
    global _mode
    _mode = None if mode is None else _check_mode(mode, "progress mode")


def _configured() -> tuple[str, bool]:
    """(mode, explicit) from set_progress_mode, else KRR_PROGRESS, else ("auto", False)."""
    if _mode is not None:
        return _mode, True
    env = os.environ.get(ENV_VAR, "").strip()
    if env:
        return _check_mode(env, f"the environment variable {ENV_VAR}"), True
    return "auto", False


def get_progress_mode() -> str:
    """The mode in force here (one of :data:`MODES`), before ``auto`` is resolved."""
    scoped = _scope.get()
    return scoped[0] if scoped is not None else _configured()[0]


def _in_notebook() -> bool:
    """True inside a Jupyter kernel (where stderr is no TTY, yet bars are wanted)."""
    if "ipykernel" not in sys.modules or "IPython" not in sys.modules:
        return False
    try:
        from IPython import get_ipython

        ip = get_ipython()
        return ip is not None and "IPKernelApp" in getattr(ip, "config", {})
    except Exception:  # pragma: no cover - a broken IPython install
        return False


def _stderr_is_tty() -> bool:
    try:
        return bool(sys.stderr.isatty())
    except (AttributeError, ValueError):  # closed or replaced stderr
        return False


def resolved_mode() -> tuple[str, bool]:
    """``(renderer, explicit)``: ``"notebook"``, ``"bars"``, ``"lines"`` or ``"off"``, and
    whether progress was asked for explicitly (lines then reach stderr even when
    no logging is configured)."""
    scoped = _scope.get()
    mode, explicit = scoped if scoped is not None else _configured()
    if mode == "off":
        return "off", explicit
    if mode == "lines":
        return "lines", explicit
    if _in_notebook():
        return "notebook", explicit
    if mode == "bars" or _stderr_is_tty():
        return "bars", explicit
    return "lines", explicit


def _scope_mode(progress: Any) -> str:
    flag = isinstance(progress, numbers.Integral) or str(getattr(progress, "dtype", "")) == "bool"
    if flag and not isinstance(progress, str) and int(progress) >= 0:
        if not progress:
            return "off"
        mode, explicit = _configured()
        return mode if explicit and mode in ("bars", "lines") else "auto"
    if isinstance(progress, str) and progress.strip().lower() in MODES:
        return progress.strip().lower()
    raise ValueError(
        f"progress must be True, False or one of {', '.join(repr(m) for m in MODES)}, "
        f"got {progress!r}"
    )


@contextlib.contextmanager
def progress_scope(progress: bool | str | None) -> Iterator[None]:
    """Set the mode inside the block (an estimator's ``progress`` parameter).

    ``False`` (or 0): nothing. ``True``: ``auto`` (or the ``bars``/``lines`` mode
    set by :func:`set_progress_mode` or ``KRR_PROGRESS``). A mode name: that
    mode. ``None``: leave the mode as it is. A process-wide ``off`` (``krr -q``,
    ``KRR_PROGRESS=off``) wins over all of these.
    """
    if progress is None:
        yield
        return
    mode = _scope_mode(progress)
    if _configured() == ("off", True):  # krr -q / KRR_PROGRESS=off silence everything
        mode = "off"
    token = _scope.set((mode, True))
    try:
        yield
    finally:
        _scope.reset(token)


def with_progress(method: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator for estimator methods: run under ``progress_scope(self.progress)``."""
    import functools

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        with progress_scope(getattr(self, "progress", False)):
            return method(self, *args, **kwargs)

    return wrapper


# -- displays -------------------------------------------------------------------------
def _fmt_seconds(s: float) -> str:
    if not math.isfinite(s) or s < 0:
        return "?"
    s = int(round(s))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m:02d}:{sec:02d}"


def _plural(unit: str, n: float) -> str:
    return unit if n == 1 or unit.endswith("s") else unit + "s"


class Progress:
    """A progress display: ``update(n)``, ``update_to(n)``, ``set_total``,
    ``set_postfix``, ``reset`` (a new phase) and ``close``. This base shows nothing."""

    def __init__(self, label: str, total: float | None = None, unit: str = "tile", initial=0):
        self.label = label
        self.unit = unit
        self.total = total
        self.n = initial
        self.postfix = ""
        self.closed = False

    def update(self, n: float = 1) -> None:
        self.n += n

    def update_to(self, n: float) -> None:
        self.update(n - self.n)

    def start_at(self, n: float) -> None:
        """Count ``n`` as done before this display started (not part of the rate)."""
        self.n = n

    def set_total(self, total: float | None, estimate: bool = False) -> None:
        self.total = total

    def set_postfix(self, text: str) -> None:
        self.postfix = text

    def reset(self, label: str | None = None, total: float | None = None, unit=None) -> None:
        self.label = label or self.label
        self.unit = unit or self.unit
        self.total, self.n, self.postfix = total, 0, ""

    def close(self, failed: bool = False) -> None:
        self.closed = True


class _LineProgress(Progress):
    """Timestamped lines through the ``pipeline.engine.progress`` logger (rate limited)."""

    def __init__(self, label, total=None, unit="tile", initial=0, *, to_stderr=False):
        super().__init__(label, total, unit, initial)
        self._to_stderr = to_stderr
        self._lock = threading.Lock()
        self._start_phase()

    def _start_phase(self, announce: bool = True) -> None:
        self._t0 = self._last_t = time.monotonic()
        self._n0 = self._last_n = self.n
        self._estimate = False
        if announce:
            self._emit(self._message())

    def _emit(self, msg: str) -> None:
        if log.isEnabledFor(logging.INFO) and log.hasHandlers():
            log.info(msg)  # the program's logging (krr: stderr and run.log) takes it
        elif self._to_stderr:  # asked for, and logging would drop it
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
            print(f"{stamp} {msg}", file=sys.stderr, flush=True)

    def _message(self, final: str = "") -> str:
        n, total = self.n, self.total
        done = f"{n:g}" if total is None else f"{n:g}/{'~' if self._estimate else ''}{total:g}"
        parts = [f"{self.label}: {done} {_plural(self.unit, total if total else n)}"]
        if total:
            parts[0] += f" ({100.0 * n / total:.0f}%)"
        dt = time.monotonic() - self._t0
        rate = (n - self._n0) / dt if dt > 0 else 0.0
        extra = []
        if n > self._n0 and dt > 0:
            extra.append(f"{rate:.0f}" if rate >= 100 else f"{rate:.3g}")
            extra[-1] += f" {_plural(self.unit, 2)}/s"
        if final:
            extra.append(f"{final} in {_fmt_seconds(dt)}")
        elif total and rate > 0 and n < total:
            extra.append(f"ETA {_fmt_seconds((total - n) / rate)}")
        if self.postfix:
            extra.append(self.postfix)
        return ", ".join(parts + extra)

    def update(self, n: float = 1) -> None:
        with self._lock:
            self.n += n
            now = time.monotonic()
            since = now - self._last_t
            step = (self.n - self._last_n) / self.total if self.total else 0.0
            if since >= LINE_MAX_SECONDS or (step >= LINE_FRACTION and since >= LINE_MIN_SECONDS):
                self._last_t, self._last_n = now, self.n
                msg = self._message()
            else:
                return
        self._emit(msg)

    def set_total(self, total: float | None, estimate: bool = False) -> None:
        self.total, self._estimate = total, estimate

    def start_at(self, n: float) -> None:
        with self._lock:
            self.n = self._n0 = self._last_n = n

    def reset(self, label=None, total=None, unit=None) -> None:
        self._finish("done")
        super().reset(label, total, unit)
        self._start_phase(announce=False)  # a phase of a group: its last line is enough

    def _finish(self, how: str) -> None:
        if self.total and self.n >= self.total:
            self._estimate = False
            self.total = self.n
        self._emit(self._message(final=how))

    def close(self, failed: bool = False) -> None:
        if self.closed:
            return
        self.closed = True
        self._finish("stopped" if failed else "done")


class _TqdmProgress(Progress):
    """A ``tqdm`` bar on stderr (``tqdm.notebook`` widgets in Jupyter)."""

    def __init__(self, label, total=None, unit="tile", initial=0, *, notebook=False):
        super().__init__(label, total, unit, initial)
        cls = _tqdm_class(notebook)
        self.bar = cls(
            total=total, initial=initial, desc=label, unit=f" {unit}", file=sys.stderr,
            leave=True, dynamic_ncols=True, mininterval=0.2,
        )  # fmt: skip

    def update(self, n: float = 1) -> None:
        self.n += n
        self.bar.update(n)

    def set_total(self, total: float | None, estimate: bool = False) -> None:
        self.total = total
        self.bar.total = total  # drawn at the next update (tqdm's mininterval holds)

    def set_postfix(self, text: str) -> None:
        self.postfix = text
        self.bar.set_postfix_str(text, refresh=False)

    def start_at(self, n: float) -> None:
        self.n = n
        self.bar.n = self.bar.last_print_n = self.bar.initial = n

    def reset(self, label=None, total=None, unit=None) -> None:
        super().reset(label, total, unit)
        self.bar.reset(total=total)
        self.bar.unit = f" {self.unit}"
        self.bar.set_description_str(self.label, refresh=True)

    def close(self, failed: bool = False) -> None:
        if self.closed:
            return
        self.closed = True
        if self.total is not None and self.n >= self.total > 0 and self.bar.total != self.n:
            self.bar.total = self.n  # an estimated total (CG) ends at the count reached
        self.bar.close()


def _tqdm_class(notebook: bool) -> Any:
    if notebook:
        try:
            import ipywidgets  # noqa: F401
            from tqdm.notebook import tqdm as notebook_tqdm

            return notebook_tqdm
        except ImportError:  # no widgets installed: text bars in the cell output
            pass
    from tqdm.std import tqdm

    return tqdm


def open_progress(
    label: str,
    total: float | None = None,
    unit: str = "tile",
    *,
    enabled: bool = True,
    initial: float = 0,
) -> Progress:
    """A display in the mode in force (the caller closes it); see :func:`stage_progress`."""
    if not enabled:
        return Progress(label, total, unit, initial)
    how, explicit = resolved_mode()
    if how == "off":
        return Progress(label, total, unit, initial)
    if how == "lines":
        return _LineProgress(label, total, unit, initial, to_stderr=explicit)
    return _TqdmProgress(label, total, unit, initial, notebook=how == "notebook")


@contextlib.contextmanager
def _console_logging_through(bar: Progress) -> Iterator[None]:
    """While a terminal bar is drawn, console log records are written above it."""
    if type(bar) is not _TqdmProgress or not _stderr_is_tty():
        yield
        return
    root = logging.getLogger()
    if not any(
        isinstance(h, logging.StreamHandler) and getattr(h, "stream", None) is sys.stderr
        for h in root.handlers
    ):
        yield
        return
    from tqdm.contrib.logging import logging_redirect_tqdm

    with logging_redirect_tqdm([root], tqdm_class=type(bar.bar)):
        yield


@contextlib.contextmanager
def stage_progress(
    label: str,
    total: float | None = None,
    unit: str = "tile",
    *,
    enabled: bool = True,
    initial: float = 0,
) -> Iterator[Progress]:
    """A labelled display for a counted loop: ``with stage_progress("cholesky", 55) as p:
    ... p.update()``.

    Parameters
    ----------
    label : str
        The stage and what it does (``"cholesky"``, ``"cv: kernel settings"``).
    total : float, optional
        The count at the end (None: unknown; the display shows the count and rate).
    unit : str
        What is counted (``"tile"``, ``"row block"``, ``"iteration"``, ``"setting"``).
    enabled : bool
        False shows nothing whatever the mode (a caller's ``progress=False``).
    initial : float
        Already done before (a resumed stage): counted in the fraction, not the rate.
    """
    bar = open_progress(label, total, unit, enabled=enabled, initial=initial)
    failed = True
    try:
        with _console_logging_through(bar):
            yield bar
        failed = False
    finally:
        bar.close(failed=failed)


class _Group:
    """The display shared by the computations of a :func:`progress_group`."""

    def __init__(self, label: str, unit: str, enabled: bool) -> None:
        self.label, self.unit, self.enabled = label, unit, enabled
        self.bar: Progress | None = None

    def phase(self, label: str, total: float | None, unit: str, initial: float) -> Progress:
        if self.bar is None:  # the first phase opens the display
            self.bar = open_progress(label, total, unit, enabled=self.enabled, initial=initial)
        else:
            self.bar.reset(label, total, unit)
            if initial:
                self.bar.start_at(initial)
        return self.bar


@contextlib.contextmanager
def progress_group(label: str, unit: str = "task", *, enabled: bool = True) -> Iterator[Any]:
    """One display for the several Dask computations of a stage (ingest).

    Each :func:`~pipeline.engine.progress_dask.dask_progress` inside (with progress enabled) becomes a phase of
    this display, relabelled and recounted, instead of a display of its own.
    """
    group = _Group(label, unit, enabled)
    token = _group.set(group)
    failed = True
    try:
        yield group
        failed = False
    finally:
        _group.reset(token)
        if group.bar is not None:
            group.bar.close(failed=failed)


# -- conjugate gradients -----------------------------------------------------------------
@contextlib.contextmanager
def cg_progress(
    *, enabled: bool = True, tol: float = 1e-6, max_iter: int | None = None, label: str = "cg"
) -> Iterator[Callable[[Any], None]]:
    """A CG ``callback(state)`` showing the iteration and the relative residual live.

    The total is an estimate from the residual's decrease so far (linear in
    log-residual, capped at ``max_iter``), so the display has an ETA; the
    postfix names the worst column's relative residual and the tolerance.
    """
    with stage_progress(label, None, "iteration", enabled=enabled) as bar:
        r0: list[float] = []
        first = [True]

        def callback(state: Any) -> None:
            rel = [float(v) for v in state.history[-1]]
            worst = max(rel) if rel else 0.0
            if not r0:
                r0.append(max(float(v) for v in state.history[0]) if state.history else worst)
            it = int(state.iteration)
            if first:  # a resumed solve: the iterations before are not part of the rate
                first.clear()
                if it > 1:
                    bar.start_at(it - 1)
            start, now = r0[0], worst
            if 0 < now < start and start > tol > 0 and it > 0:
                est = it * math.log(start / tol) / math.log(start / now)
                cap = float(max_iter) if max_iter else est
                bar.set_total(max(it, min(math.ceil(est), cap)), estimate=True)
            bar.set_postfix(f"residual {worst:.2e} (tol {tol:.0e})")
            bar.update_to(it)

        yield callback
