"""Output helpers of the ``krr`` command line: logging setup and the run summary lines.

Kept apart from :mod:`pipeline.cli` (the commands and exit codes) so each stays short.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

__all__ = ["_fmt", "_isatty", "_print_metrics", "_setup_logging", "_unconverged_note"]


def _isatty() -> bool:
    return sys.stderr.isatty()


_VERBOSITY = 0


class _Stderr(logging.StreamHandler):
    """A handler on whatever ``sys.stderr`` is when a line is logged (not the stream of
    the time it was made, which a test harness or a notebook may have closed since)."""

    @property  # type: ignore[override]
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def _verbosity() -> int:
    """The ``-v`` count of the command line (0 without ``-v``)."""
    return _VERBOSITY


def _setup_logging(verbose: int | bool = 0, quiet: bool = False) -> None:
    """Logs on stderr: ``-q`` warnings and errors only; default the stage lines (INFO);
    ``-v`` also distributed's INFO lines (and tracebacks on errors); ``-vv`` DEBUG.

    The loggers stay at INFO under ``-q``, so that ``run.log`` gets the stage lines.
    """
    global _VERBOSITY
    verbose = _VERBOSITY = int(verbose)
    fmt = "%(message)s" if _isatty() else "%(asctime)s %(levelname)s %(name)s: %(message)s"
    root = logging.getLogger()
    for h in list(root.handlers):
        if getattr(h, "_krr", False):
            root.removeHandler(h)
    level = logging.DEBUG if verbose >= 2 else logging.INFO
    h = _Stderr()
    h.setFormatter(logging.Formatter(fmt, datefmt="%Y-%m-%dT%H:%M:%S"))
    h.setLevel(logging.WARNING if quiet else level)
    h._krr = True  # type: ignore[attr-defined]
    root.addHandler(h)
    root.setLevel(logging.WARNING)
    for name in ("krr", "pipeline"):
        logging.getLogger(name).setLevel(level)
    # distributed is chatty at INFO: its warnings only, unless -v
    logging.getLogger("distributed").setLevel(logging.INFO if verbose >= 1 else logging.WARNING)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    return "-" if v is None else str(v)


def _print_metrics(ev: dict[str, Any], out: Any = None) -> None:
    out = out or sys.stdout
    ours = ev.get("metrics") or {}
    if not ours:
        return
    base = ev.get("baseline") or {}
    bm = base.get("metrics") or {}
    print(f"\nheld-out metrics ({ev.get('n_test')} rows):", file=out)
    header = f"  {'metric':<8} {'krr-pipeline':>14}"
    if bm:
        header += f" {'scikit-learn':>14}"
    print(header, file=out)
    for k, v in ours.items():
        line = f"  {k:<8} {_fmt(v):>14}"
        if bm:
            line += f" {_fmt(bm.get(k)):>14}"
        print(line, file=out)
    if bm:
        print(f"  baseline: {base.get('name')}", file=out)
        print(
            "  max |prediction difference| vs scikit-learn: "
            f"{base.get('max_abs_prediction_difference', float('nan')):.3g} "
            f"(relative {base.get('max_rel_prediction_difference', float('nan')):.3g})",
            file=out,
        )
    elif ev.get("baseline_note"):
        print(f"  {ev['baseline_note']}", file=out)
    if ev.get("compare_summary"):  # evaluate.compare: the rows are in metrics.json
        print(f"  exactness gap: {ev['compare_summary']}", file=out)


def _unconverged_note(sol: dict[str, Any] | None) -> str | None:
    """A line for a CG solve that did not converge (kept only with solver.allow_unconverged)."""
    if not sol or sol.get("converged", True):
        return None
    res = sol.get("rel_residual")
    worst = max(res) if isinstance(res, list) and res else res
    worst_s = f"{worst:.3e}" if isinstance(worst, float | int) else "?"
    return (
        f"CG stopped after {sol.get('n_iter')} iterations with relative residual {worst_s}, "
        "above solver.tol; alpha, the model and the predictions are approximate "
        "(solver.allow_unconverged is true)"
    )
