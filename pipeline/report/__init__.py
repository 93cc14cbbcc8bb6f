"""``krr report``: one self-contained HTML page about a run directory.

:func:`write_report` reads the run through its manifest
(:func:`~pipeline.report.gather.gather`), draws the figures with matplotlib
(:mod:`pipeline.report.figures`, the ``[plots]`` extra) and writes the page
(:func:`~pipeline.report.html.render_html`): the fit plan and its reason, each
stage's wall time and peak memory, the CG convergence curve, the CV curve and
heatmap, residual and parity plots on the held-out rows, and the metrics next to
the scikit-learn and mean-predictor baselines. A section the run does not have
is replaced by a short note.
"""

from __future__ import annotations

from pathlib import Path

# the module, not its function: tests replace figures.require_matplotlib
from pipeline.report import figures
from pipeline.report.gather import gather
from pipeline.report.html import GENERATOR, render_html
from pipeline.storage.atomic import atomic_write
from pipeline.storage.errors import ForeignPathError
from pipeline.storage.location import is_url, join_path

__all__ = ["REPORT_NAME", "write_report"]

#: the report's file name in the run directory when no ``out`` is given
REPORT_NAME = "report.html"


def write_report(run_dir: str | Path, out: str | Path | None = None) -> Path | str:
    """Write the HTML report of ``run_dir``; return its path.

    Parameters
    ----------
    run_dir : path or URL
        A run directory of ``krr run`` (it holds ``manifest.json``).
    out : path, optional
        Where to write the page (default: ``run_dir/report.html``). It is
        written atomically (a temporary file renamed over it).

    Returns
    -------
    Path or str
        ``out`` (a URL stays a string).

    Raises
    ------
    FileNotFoundError
        ``run_dir`` is not a run directory.
    ImportError
        matplotlib is missing: ``pip install 'krr-pipeline[plots]'``.
    """
    figures.require_matplotlib()  # before reading anything: say what to install first
    data = gather(run_dir)
    page = render_html(data).encode("utf-8")
    if out is None:
        out = join_path(str(run_dir).rstrip("/") if is_url(run_dir) else Path(run_dir), REPORT_NAME)
    target = str(out)
    if not is_url(out):
        out = Path(out)
        _check_ours(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        target = str(out.absolute())  # a bare file name has no directory part to write beside
    atomic_write(target, page, fsync=True)
    return out


def _check_ours(out: Path) -> None:
    """Refuse to replace a file that is not a report this package wrote (a user's page)."""
    if not out.exists():
        return
    if out.is_file():
        with open(out, "rb") as f:
            head = f.read(4096)
        # newer pages name their generator; older ones start with this title
        if f'content="{GENERATOR}"'.encode() in head or b"<title>krr report" in head:
            return
    raise ForeignPathError(
        str(out),
        "a directory" if out.is_dir() else "a file that is not a krr-pipeline report",
        "Write the report elsewhere (-o PATH), or move that file yourself",
    )
