"""Scores, the results table and the summary line of a
:class:`~pipeline.models.selection.KernelRidgeCV` search.

- :func:`score_candidates`: every (λ, kernel setting) candidate scored on every
  fold from the held-out predictions of :func:`~pipeline.models.selection.runner.run_search`
  (one pooled score for leave-one-out);
- :func:`cv_results`: scikit-learn's ``cv_results_`` layout;
- :func:`target_exponent`: the power of two that brings a y far from 1 near 1 for the
  search (its scorer's squares underflow or overflow otherwise), and how the scores
  convert back to y's units;
- :func:`log_summary`: the one log line of a finished search.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
from scipy.stats import rankdata

from pipeline.float_range import SAFE_EXPONENT, pow2_exponents
from pipeline.models.selection.guard import FixedPredictions

__all__ = [
    "PER_COLUMN_SCORERS",
    "SCORE_DEGREE",
    "cv_results",
    "log_summary",
    "score_candidates",
    "target_exponent",
]

log = logging.getLogger("pipeline.models.selection")


#: scorers whose value on ``c * y`` and ``c * predictions`` is ``c**degree`` times their
#: value on ``y`` and the predictions (``None`` is the default R²)
SCORE_DEGREE: dict[Any, int] = {
    None: 0,
    "r2": 0,
    "explained_variance": 0,
    "neg_mean_squared_error": 2,
    "neg_root_mean_squared_error": 1,
    "neg_mean_absolute_error": 1,
    "neg_median_absolute_error": 1,
    "max_error": 1,
}


#: scorers that score each column of a multi-output y on its own and average the
#: columns' scores with equal weights (scikit-learn's ``multioutput="uniform_average"``),
#: each invariant under a scaling of its column: a y whose columns differ by many orders
#: of magnitude is searched with one power of two per column
PER_COLUMN_SCORERS = (None, "r2", "explained_variance")


def target_exponent(y: np.ndarray, scoring: Any) -> tuple[Any, int]:
    """``(k, back)``: search on ``2**k y`` and multiply its scores by ``2**back``.

    ``k`` is :func:`~pipeline.float_range.pow2_exponents` of y's largest magnitude: 0 for
    ordinary y (the search and its scores keep their bits), else the exponent that brings
    that magnitude into ``[0.5, 1)``. Every solve is linear in y and exact under a power
    of two, so the held-out predictions on ``2**k y`` are ``2**k`` times those on y, and
    a scorer of known degree (:data:`SCORE_DEGREE`) converts back exactly:
    ``back = -degree k``. On y itself the scorer's squares underflow or overflow (every
    R² 1.0 at 1e-200, NaN at 1e200). Another scorer (a callable, an unlisted
    name) on such a y is refused before any work. A scorer object with a
    ``score_back`` attribute scores in ``2**-score_back`` times y's units itself
    (:class:`pipeline.stages.select.OriginalUnits`): that is added to ``back``.

    A 2-D y scored by R² or explained variance (:data:`PER_COLUMN_SCORERS`) gets one
    exponent per column (``k`` an int array of y's width, when they differ): those
    average per-column scores that do not change when a column is scaled, so each
    column is brought near 1 on its own. With one ``k`` for all columns, a column many
    orders of magnitude below the largest had squares that underflowed (issue #44: two
    columns at 1 and 1e-200 scored a cross-validated R² of 0.685 where scikit-learn's
    ``r2_score(multioutput="uniform_average")`` gives 0.658).
    """
    own = int(getattr(scoring, "score_back", 0))
    y = np.asarray(y)
    if y.ndim == 2 and y.shape[1] > 1 and y.shape[0] and scoring in PER_COLUMN_SCORERS:
        ks = pow2_exponents(np.max(np.abs(y), axis=0))
        return (int(ks[0]) if np.all(ks == ks[0]) else ks), own
    amax = float(np.max(np.abs(y))) if np.size(y) else 0.0
    k = int(pow2_exponents(amax))
    if k == 0:
        return 0, own
    key = scoring if scoring is None or isinstance(scoring, str) else None
    if (scoring is not None and key is None) or key not in SCORE_DEGREE:
        known = ", ".join(repr(s) for s in SCORE_DEGREE if s is not None)
        raise ValueError(
            f"KernelRidgeCV: y's largest magnitude is {amax:.6g}, outside "
            f"[2**-{SAFE_EXPONENT}, 2**{SAFE_EXPONENT}), where the squares of "
            f"scoring={scoring!r} underflow or overflow and the search cannot convert its "
            f"scores back to y's units (it can for {known}); rescale y (e.g. divide it by "
            f"{amax:.3g}) before the search, or pass one of those scorers"
        )
    return k, -SCORE_DEGREE[key] * k


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


def cv_results(
    candidates: list, scores: np.ndarray, seconds: float, back: int = 0,
    screened: np.ndarray | None = None,
) -> dict[str, Any]:  # fmt: skip
    """scikit-learn's ``cv_results_`` from the candidates and their scores per fold;
    the search's ``seconds`` are spread evenly over the candidates.

    ``screened``: True where a score is the Nyström screen's
    (:mod:`~pipeline.models.selection.finalists`); kept as ``cv_results_["screened"]``,
    and those candidates rank after every exactly scored one.

    ``back``: the scores were taken on ``2**k y`` (:func:`target_exponent`); they are
    ranked as they are (in y's units a mean squared error of order 1e-400 is 0 for
    every candidate) and reported times ``2**back``."""
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
    if screened is not None:
        screened = np.asarray(screened, dtype=bool)
        exact = ~screened
        rank = np.empty(len(candidates), dtype=np.int32)
        rank[exact] = rankdata(-filled[exact], method="min")
        rank[screened] = exact.sum() + rankdata(-filled[screened], method="min")
        res["rank_test_score"] = rank
        res["screened"] = screened
    if back:  # -0.0 / -inf where y's units cannot hold the score (an MSE of 1e-400 or 1e400)
        with np.errstate(over="ignore", under="ignore"):
            for key in [f"split{f}_test_score" for f in range(scores.shape[1])] + [
                "mean_test_score",
                "std_test_score",
            ]:
                res[key] = np.ldexp(res[key], back)
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
