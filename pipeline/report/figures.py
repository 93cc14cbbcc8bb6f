"""The report's figures, drawn with matplotlib (Agg backend) as PNG bytes.

matplotlib is imported only when a figure is drawn; without it,
:func:`require_matplotlib` raises an :class:`ImportError` that names the extra
to install. The CV figures are those of :mod:`pipeline.models.selection.plots`,
drawn again from the select stage's ``cv_results.csv``.
"""

from __future__ import annotations

import io
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.models.selection.plots import plot_heatmap, plot_refine, plot_score_vs_alpha

__all__ = [
    "PLOTS_HINT",
    "cg_convergence",
    "cv_curve",
    "cv_heatmap",
    "cv_refine",
    "exactness_gap",
    "parity",
    "require_matplotlib",
    "residuals",
    "stage_times",
]

PLOTS_HINT = "pip install 'krr-pipeline[plots]'"

#: at most this many points per scatter plot (a fixed, evenly spaced subset beyond it)
MAX_POINTS = 20_000


def require_matplotlib() -> Any:
    """``matplotlib.pyplot`` on the Agg backend.

    Raises
    ------
    ImportError
        matplotlib is not installed; the message names the extra that installs it.
    """
    try:
        import matplotlib
    except ImportError as e:
        raise ImportError(
            f"krr report draws its figures with matplotlib, which is not installed: {PLOTS_HINT}"
        ) from e
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def _png(fig: Any) -> bytes:
    plt = require_matplotlib()
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()


def _gib(b: float | None) -> float:
    return 0.0 if b is None else b / 2**30


def stage_times(stages: list[Any]) -> bytes:
    """Horizontal bars: each stage's wall time (left) and peak memory (right)."""
    plt = require_matplotlib()
    ran = [s for s in stages if s.seconds is not None]
    names = [s.name for s in ran][::-1]
    secs = [s.seconds for s in ran][::-1]
    own = [_gib(s.peak_rss_bytes) for s in ran][::-1]
    kids = [_gib(s.peak_children_rss_bytes) for s in ran][::-1]
    fig, (a, b) = plt.subplots(1, 2, figsize=(8, max(2.0, 0.8 + 0.32 * len(names))), sharey=True)
    a.barh(names, secs, color="#4c72b0")
    a.set_xlabel("wall time (s)")
    a.grid(True, axis="x", alpha=0.3)
    b.barh(names, own, color="#dd8452", label="this process")
    b.barh(names, kids, left=own, color="#55a868", label="local workers")
    b.set_xlabel("peak resident memory (GiB)")
    b.grid(True, axis="x", alpha=0.3)
    if any(kids):
        b.legend(fontsize=8, loc="lower right")
    return _png(fig)


def cg_convergence(history: np.ndarray, tol: float | None = None) -> bytes:
    """Relative residual per CG iteration (log scale), one curve per right-hand side."""
    plt = require_matplotlib()
    h = np.asarray(history, dtype=float).reshape(len(history), -1)
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    it = np.arange(h.shape[0])
    for j in range(min(h.shape[1], 8)):
        ax.semilogy(
            it, np.maximum(h[:, j], 1e-300), label=f"output {j}" if h.shape[1] > 1 else None
        )
    if tol:
        ax.axhline(float(tol), color="k", ls="--", lw=1, label=f"tol = {float(tol):.1e}")
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("CG iteration")
    ax.set_ylabel("relative residual ‖r‖ / ‖y‖")
    ax.grid(True, which="both", alpha=0.3)
    if tol or h.shape[1] > 1:
        ax.legend(fontsize=8)
    return _png(fig)


def _cv_png(draw: Any, cv_results: dict[str, Any], **kw: Any) -> bytes:
    require_matplotlib()
    with tempfile.TemporaryDirectory() as tmp:
        path = draw(cv_results, Path(tmp) / "fig.png", **kw)
        return Path(path).read_bytes()


def cv_curve(cv_results: dict[str, Any]) -> bytes:
    """CV score against λ (:func:`pipeline.models.selection.plots.plot_score_vs_alpha`)."""

    return _cv_png(plot_score_vs_alpha, cv_results)


def cv_heatmap(cv_results: dict[str, Any], param: str) -> bytes:
    """(λ, ``param``) heatmap (:func:`pipeline.models.selection.plots.plot_heatmap`)."""

    return _cv_png(plot_heatmap, cv_results, param=param)


def cv_refine(refine: dict[str, Any]) -> bytes:
    """The λ refinement's curve (:func:`pipeline.models.selection.plots.plot_refine`)."""

    return _cv_png(plot_refine, refine)


def _subset(y_true: np.ndarray, y_pred: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    n = len(y_true)
    if n <= MAX_POINTS:
        return y_true, y_pred
    idx = np.linspace(0, n - 1, MAX_POINTS).astype(int)
    return y_true[idx], y_pred[idx]


def _labels(k: int) -> list[str | None]:
    return [f"output {j}" for j in range(k)] if k > 1 else [None]


def parity(y_true: np.ndarray, y_pred: np.ndarray) -> bytes:
    """Predicted against true values on the held-out rows, with the line y = x."""
    plt = require_matplotlib()
    t, p = _subset(y_true, y_pred)
    fig, ax = plt.subplots(figsize=(4.4, 4.0))
    for j, lab in enumerate(_labels(t.shape[1])[:8]):
        ax.scatter(t[:, j], p[:, j], s=8, alpha=0.5, label=lab)
    lo = float(np.nanmin([t.min(), p.min()])) if t.size else 0.0
    hi = float(np.nanmax([t.max(), p.max()])) if t.size else 1.0
    ax.plot([lo, hi], [lo, hi], "k--", lw=1, label="y = x")
    ax.set_xlabel("true y")
    ax.set_ylabel("predicted y")
    ax.set_aspect("equal", adjustable="datalim")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return _png(fig)


def residuals(y_true: np.ndarray, y_pred: np.ndarray) -> bytes:
    """Residuals (predicted − true) against the prediction, and their histogram."""
    plt = require_matplotlib()
    t, p = _subset(y_true, y_pred)
    r = p - t
    fig, (a, b) = plt.subplots(1, 2, figsize=(6.8, 4.0), gridspec_kw={"width_ratios": [2, 1]})
    for j, lab in enumerate(_labels(t.shape[1])[:8]):
        a.scatter(p[:, j], r[:, j], s=8, alpha=0.5, label=lab)
        b.hist(r[:, j], bins=min(40, max(5, len(r) // 10)), alpha=0.6, orientation="horizontal")
    a.axhline(0.0, color="k", ls="--", lw=1)
    a.set_xlabel("predicted y")
    a.set_ylabel("residual (predicted − true)")
    a.grid(True, alpha=0.3)
    if t.shape[1] > 1:
        a.legend(fontsize=8)
    b.axhline(0.0, color="k", ls="--", lw=1)
    b.set_xlabel("rows")
    b.grid(True, alpha=0.3)
    return _png(fig)


def exactness_gap(rows: list[dict[str, Any]], metric: str) -> bytes:
    """Held-out ``metric`` against the training rows of the exact fits (left, the full fit
    last) and against the Nyström models' M (right, each on every training row); the
    full exact fit is the dashed line on the right and each Nyström model a dotted one on
    the left (``evaluate.compare``)."""
    plt = require_matplotlib()
    exact = sorted((r for r in rows if r["kind"] == "exact"), key=lambda r: r["n_train"])
    nys = sorted((r for r in rows if r["kind"] == "nystrom"), key=lambda r: r["n_centers"])
    fig, (a, b) = plt.subplots(1, 2, figsize=(8.4, 3.8), sharey=True)
    if exact:
        a.plot([r["n_train"] for r in exact], [r["metrics"][metric] for r in exact], "o-",
               color="#4c72b0", label="exact")  # fmt: skip
        b.axhline(exact[-1]["metrics"][metric], color="#4c72b0", ls="--", lw=1,
                  label=f"exact, n = {exact[-1]['n_train']:,}")  # fmt: skip
    for i, r in enumerate(nys):
        a.axhline(r["metrics"][metric], color=f"C{(i + 1) % 10}", ls=":", lw=1,
                  label=f"Nyström({r['n_centers']:,})")  # fmt: skip
    if nys:
        b.plot([r["n_centers"] for r in nys], [r["metrics"][metric] for r in nys], "s-",
               color="#dd8452", label=f"Nyström, n = {nys[0]['n_train']:,}")  # fmt: skip
    from matplotlib.ticker import FuncFormatter

    ticks = ([r["n_train"] for r in exact], [r["n_centers"] for r in nys])
    for ax, xlabel, at in zip((a, b), ("training rows N (exact fit)", "Nyström centres M"), ticks):
        ax.set_xscale("log", base=2)
        if at:  # at the sizes fitted, not at powers of 2
            ax.set_xticks(at)
            ax.minorticks_off()
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
        ax.set_xlabel(xlabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    a.set_ylabel(f"held-out {metric}")
    return _png(fig)
