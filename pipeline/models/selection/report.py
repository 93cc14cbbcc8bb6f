"""Run-config glue: build a search from a ``cv`` config section, save its report.

A ``cv`` section (YAML) looks like::

    cv:
      alphas: [1.0e-4, 1.0e-3, 1.0e-2, 1.0e-1, 1.0]   # or {logspace: [-4, 0, 5]}
      param_grid: {gamma: [0.01, 0.1, 1.0]}
      folds: 5            # int, "loo", or a float held-out fraction
      shuffle: false      # shuffle rows before K-fold (random_state seeds it)
      scoring: null       # any scikit-learn scorer name; null = R²
      solver: auto        # auto | band | eigen | dense | cholesky | cg

:func:`search_from_config` turns it into a :class:`KernelRidgeCV`;
:func:`save_search_report` writes ``cv_results.csv``, ``cv_search.json`` (best
parameters, score, work counters) and the PNG plots into a run directory.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.models.selection.plots import plot_cv_results
from pipeline.models.selection.search import KernelRidgeCV

__all__ = ["CV_SECTION_KEYS", "save_search_report", "search_from_config"]

CV_SECTION_KEYS = {"alphas", "param_grid", "folds", "shuffle", "scoring", "solver", "random_state"}


def _alphas(value: Any) -> Any:
    if isinstance(value, Mapping) and "logspace" in value:
        lo, hi, num = value["logspace"]
        return np.logspace(float(lo), float(hi), int(num)).tolist()
    return value


def search_from_config(
    section: Mapping[str, Any],
    *,
    kernel: Any = "rbf",
    lam_convention: str = "sklearn",
    block_size: int | None = None,
    store: Any = None,
    **kwargs: Any,
) -> KernelRidgeCV:
    """A :class:`KernelRidgeCV` from a run config's ``cv`` section (see module docstring)."""
    unknown = set(section) - CV_SECTION_KEYS
    if unknown:
        raise ValueError(
            f"unknown keys {sorted(unknown)} in the cv section; valid keys: {sorted(CV_SECTION_KEYS)}"
        )
    if "alphas" not in section:
        raise ValueError("the cv section needs alphas: [...] (the ridge penalties to search)")
    folds = section.get("folds", 5)
    rs = section.get("random_state", 0)
    if section.get("shuffle", False) and isinstance(folds, int) and not isinstance(folds, bool):
        from sklearn.model_selection import KFold

        folds = KFold(n_splits=folds, shuffle=True, random_state=rs)
    return KernelRidgeCV(
        _alphas(section["alphas"]),
        kernel=kernel,
        param_grid=section.get("param_grid"),
        cv=folds,
        scoring=section.get("scoring"),
        solver=section.get("solver", "auto"),
        lambda_convention=lam_convention,
        block_size=block_size,
        store=store,
        random_state=rs,
        **kwargs,
    )


def _jsonable(v: Any) -> Any:
    """``v`` as standard JSON takes it: NumPy scalars as Python ones, a float that is not
    finite (a NaN score, an unbounded estimate) as None."""
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and not np.isfinite(v):
        return None
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_jsonable(x) for x in v]
    return v


def save_search_report(search: KernelRidgeCV, run_dir: str | os.PathLike) -> dict[str, Path]:
    """Write ``cv_results.csv``, ``cv_search.json`` and the plots into ``run_dir``."""
    import pandas as pd

    d = Path(run_dir)
    d.mkdir(parents=True, exist_ok=True)
    res = search.cv_results_
    table = pd.DataFrame(
        {
            **{k: np.asarray(v, dtype=object) for k, v in res.items() if k.startswith("param_")},
            **{k: v for k, v in res.items() if k.endswith("_score") or k.endswith("_time")},
            **({"screened": res["screened"]} if "screened" in res else {}),
        }
    )
    paths = {"table": d / "cv_results.csv", "summary": d / "cv_search.json"}
    table.to_csv(paths["table"], index=False)
    summary = {
        "best_params": search.best_params_,
        "best_score": search.best_score_,
        "best_index": search.best_index_,
        "n_splits": search.n_splits_,
        "cv_kind": search.cv_kind_,
        "solver": search.solver_,
        "search_stats": getattr(search, "search_stats_", {}),
    }
    paths["summary"].write_text(
        json.dumps(_jsonable(summary), indent=1, default=str, allow_nan=False)
    )
    try:
        plots = plot_cv_results(search, d)
    except ImportError as e:  # matplotlib (the [plots] extra) is not installed
        logging.getLogger(__name__).warning("CV plots not written: %s", e)
        plots = []
    except Exception as e:  # a figure must never fail a finished search
        logging.getLogger(__name__).warning(
            "CV plots not written (%s: %s); the results are in cv_results.csv", type(e).__name__, e
        )
        plots = []
    for p in plots:
        paths[p.stem] = p
    return paths
