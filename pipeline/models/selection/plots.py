"""Plots of a search: CV score against λ (one curve per kernel setting) and a
(λ, kernel parameter) heatmap, saved as PNG (matplotlib's Agg backend)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from pipeline._optional import require

__all__ = ["plot_cv_results", "plot_heatmap", "plot_refine", "plot_score_vs_alpha"]


def _results(search_or_results: Any) -> dict[str, Any]:
    res = getattr(search_or_results, "cv_results_", search_or_results)
    if not isinstance(res, dict) or "params" not in res or "mean_test_score" not in res:
        raise ValueError("pass a fitted KernelRidgeCV (or GridSearchCV) or its cv_results_ dict")
    return res


def _alpha_key(params: dict) -> str:
    for k in ("alpha", "kernelridge__alpha"):
        if k in params:
            return k
    raise ValueError(f"no 'alpha' in the searched parameters {sorted(params)}")


def _figure():

    matplotlib = require("matplotlib", "the CV plots")

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def plot_score_vs_alpha(search: Any, path: str | os.PathLike) -> Path:
    """CV score (mean ± std over folds) against λ, one curve per kernel setting; after a
    Nyström screen (``cv_results_["screened"]``) the exactly scored finalists are marked
    apart from the screen's scores."""
    res = _results(search)
    plt = _figure()
    akey = _alpha_key(res["params"][0])
    mean, std = np.asarray(res["mean_test_score"]), np.asarray(res["std_test_score"])
    curves: dict[str, list[tuple[float, float, float]]] = {}
    for p, m, s in zip(res["params"], mean, std):
        label = (
            ", ".join(
                f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                for k, v in sorted(p.items())
                if k != akey
            )
            or "kernel"
        )
        curves.setdefault(label, []).append((float(p[akey]), float(m), float(s)))
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for label, pts in curves.items():
        pts.sort()
        a, m, s = (np.array(v) for v in zip(*pts))
        ax.plot(a, m, marker="o", label=label)
        ax.fill_between(a, m - s, m + s, alpha=0.15)
    if "screened" in res:  # the finalists' exact scores (the curves: the screen's elsewhere)
        exact = ~np.asarray(res["screened"], dtype=bool)
        ax.scatter(
            [float(p[akey]) for p, e in zip(res["params"], exact) if e],
            mean[exact],
            marker="D",
            s=36,
            color="k",
            zorder=4,
            label="exact (other points: the Nyström screen)",
        )
    best = int(np.argmin(res["rank_test_score"]))
    ax.scatter(
        [res["params"][best][akey]],
        [mean[best]],
        s=120,
        facecolors="none",
        edgecolors="k",
        zorder=5,
        label="best",
    )
    ax.set_xscale("log")
    ax.set_xlabel("λ (alpha)")
    ax.set_ylabel("CV score (mean ± std)")
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    return _save(fig, path)


def _save(fig: Any, path: str | os.PathLike) -> Path:
    """Write ``fig`` as a PNG at ``path`` (parents created) and close it."""
    plt = _figure()
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_heatmap(search: Any, path: str | os.PathLike, param: str | None = None) -> Path:
    """Heatmap of the mean CV score over (λ, ``param``) (default: the one kernel parameter)."""
    res = _results(search)
    plt = _figure()
    akey = _alpha_key(res["params"][0])
    others = sorted({k for p in res["params"] for k in p if k != akey})
    if param is None:
        if len(others) != 1:
            raise ValueError(
                f"the heatmap needs one kernel parameter besides alpha; the search has {others}; "
                "pass param=..."
            )
        param = others[0]
    alphas = sorted({float(p[akey]) for p in res["params"]})
    # None (e.g. gamma=None: 1 / n_features) first, then the numbers, then other values
    values = sorted(
        {p[param] for p in res["params"] if param in p},
        key=lambda v: (
            v is not None,
            not isinstance(v, int | float),
            v if isinstance(v, int | float) else str(v),
        ),
    )
    Z = np.full((len(values), len(alphas)), np.nan)
    for p, m in zip(res["params"], res["mean_test_score"]):
        if param in p:
            Z[values.index(p[param]), alphas.index(float(p[akey]))] = m
    fig, ax = plt.subplots(figsize=(1.0 + 0.6 * len(alphas), 1.4 + 0.45 * len(values)))
    im = ax.imshow(Z, aspect="auto", origin="lower", cmap="viridis")
    ax.set_xticks(range(len(alphas)), [f"{a:.2g}" for a in alphas], rotation=45)
    ax.set_yticks(
        range(len(values)), [f"{v:.3g}" if isinstance(v, float) else str(v) for v in values]
    )
    ax.set_xlabel("λ (alpha)")
    ax.set_ylabel(param)
    if np.isfinite(Z).any():  # the best setting starred (an all-NaN grid has none)
        r, c = np.unravel_index(np.nanargmax(Z), Z.shape)
        ax.scatter([c], [r], marker="*", s=150, c="w", edgecolors="k")
    fig.colorbar(im, ax=ax, label="mean CV score")
    return _save(fig, path)


def plot_refine(search: Any, path: str | os.PathLike) -> Path:
    """The λ refinement's curve at the full N (a fitted search's ``refine_results_`` or
    that dict): score against λ, the subsample's λ and the one kept marked."""
    r = getattr(search, "refine_results_", search)
    if not isinstance(r, dict) or "alphas" not in r or "scores" not in r:
        raise ValueError("pass a KernelRidgeCV fitted with refine, or its refine_results_ dict")
    plt = _figure()
    a, m = np.asarray(r["alphas"], dtype=float), np.asarray(r["scores"], dtype=float)
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    how = "exact LOO" if r.get("method") == "loo-eigen" else "K-fold"
    ax.plot(a, m, marker="o", label=f"all {r.get('n_train', '?')} rows ({how})")
    for lam, mark, label in (
        (r.get("subsample_alpha"), "s", "subsample's λ"),
        (r.get("alpha"), "*", "kept"),
    ):
        if lam is not None and float(lam) in a.tolist():
            ax.scatter([lam], [m[a.tolist().index(float(lam))]], marker=mark, s=130,
                       facecolors="none", edgecolors="k", zorder=5, label=label)  # fmt: skip
    ax.set_xscale("log")
    ax.set_xlabel("λ (alpha)")
    ax.set_ylabel("score at the full N")
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    return _save(fig, path)


def plot_cv_results(search: Any, directory: str | os.PathLike) -> list[Path]:
    """Save ``cv_score_vs_alpha.png``, with one kernel parameter ``cv_heatmap.png``, and
    after a λ refinement ``cv_refine.png``."""
    d = Path(directory)
    paths = [plot_score_vs_alpha(search, d / "cv_score_vs_alpha.png")]
    if getattr(search, "refine_results_", None):
        paths.append(plot_refine(search, d / "cv_refine.png"))
    res = _results(search)
    akey = _alpha_key(res["params"][0])
    others = sorted({k for p in res["params"] for k in p if k != akey})
    if len(others) == 1:
        paths.append(plot_heatmap(search, d / "cv_heatmap.png", others[0]))
    return paths
