"""Scores, the results table and the summary line of a
:class:`~pipeline.model_selection.KernelRidgeCV` search.

- :func:`score_candidates`: every (λ, kernel setting) candidate scored on every
  fold from the held-out predictions of :func:`~pipeline.model_selection.runner.run_search`
  (one pooled score for leave-one-out);
- :func:`cv_results`: scikit-learn's ``cv_results_`` layout;
- :func:`log_summary`: the one log line of a finished search.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
from scipy.stats import rankdata

from pipeline.model_selection.guard import FixedPredictions

__all__ = ["cv_results", "log_summary", "score_candidates"]

log = logging.getLogger("pipeline.model_selection")


def score_candidates(
    results: list[dict],
    candidates: list,
    settings: list[dict],
    splits: list,
    kind: str,
    scorer: Any,
    X: np.ndarray,
    y: np.ndarray,
) -> np.ndarray:
    """``scores[c, f]``: candidate ``c`` on fold ``f`` (one column for leave-one-out)."""
    n = X.shape[0]
    n_scored = 1 if kind == "loo" else len(splits)
    scores = np.empty((len(candidates), n_scored))
    for ci, c in enumerate(candidates):
        preds = results[settings.index(c.kernel_params)][c["alpha"]]
        for f in range(n_scored):
            te = np.arange(n) if kind == "loo" else splits[f][1]
            p = preds[f]
            p = p[:, 0] if y.ndim == 1 else p
            scores[ci, f] = scorer(FixedPredictions(p), X[te], y[te])
    return scores


def cv_results(candidates: list, scores: np.ndarray, seconds: float) -> dict[str, Any]:
    """scikit-learn's ``cv_results_`` from the candidates and their scores per fold;
    the search's ``seconds`` are spread evenly over the candidates."""
    res: dict[str, Any] = {}
    keys = sorted({k for c in candidates for k in c})
    for k in keys:
        col = np.ma.MaskedArray(np.empty(len(candidates), dtype=object), mask=True)
        for i, c in enumerate(candidates):
            if k in c:
                col[i] = c[k]
        res[f"param_{k}"] = col
    res["params"] = [dict(c) for c in candidates]
    for f in range(scores.shape[1]):
        res[f"split{f}_test_score"] = scores[:, f]
    mean = scores.mean(axis=1)
    res["mean_test_score"] = mean
    res["std_test_score"] = scores.std(axis=1)
    filled = np.where(np.isnan(mean), np.nanmin(mean) - 1 if np.isfinite(mean).any() else 0, mean)
    res["rank_test_score"] = rankdata(-filled, method="min").astype(np.int32)
    per = seconds / max(1, len(candidates))
    res["mean_fit_time"] = np.full(len(candidates), per)
    res["std_fit_time"] = np.zeros(len(candidates))
    return res


def log_summary(
    solver: str, n_candidates: int, n_splits: int, stats: Any, best_params: dict, best_score: float
) -> None:
    """Log the search's work counters and its best candidate."""
    log.info(
        "KernelRidgeCV(%s): %d candidates x %d folds; kernel matrices %d, Gram tiles built "
        "%d (reused %d), eigendecompositions %d, band reductions %d, factorisations %d, "
        "CG iterations %d; "
        "best %s score %.6g; %.2f s",
        solver,
        n_candidates,
        n_splits,
        stats["kernel_matrices"],
        stats["gram_tiles_built"],
        stats["gram_tiles_reused"],
        stats["eigendecompositions"],
        stats["band_reductions"],
        stats["factorizations"],
        stats["cg_iterations"],
        best_params,
        best_score,
        stats["seconds"]["total"],
    )
