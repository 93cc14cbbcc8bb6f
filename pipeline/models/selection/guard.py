"""Checks around a :class:`~pipeline.models.selection.KernelRidgeCV` search.

- :func:`check_budget`: before any work, refuse a grid whose predicted cost
  (:func:`pipeline.plan.cv_routing.predicted_search_seconds`) exceeds
  ``max_search_seconds``, naming the prediction and a smaller grid that fits;
- :func:`verify_best`: after a CG search, re-solve the selected (λ, kernel
  setting) on every fold with float64 products to a tight tolerance and score it
  again: the exact held-out score of the choice, and its difference from the
  search's score, go to ``search_stats_``.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, RegressorMixin

import pipeline.constants as C
from pipeline.engine.dense import kernel_matrix
from pipeline.linalg.matvec import MatrixFreeKernelOperator
from pipeline.models.selection.cvblock import block_cv_predictions
from pipeline.models.selection.direct import direct_fold_predictions
from pipeline.models.selection.strategies import OutOfCoreStore
from pipeline.plan.cv_routing import predicted_search_seconds, suggest_smaller_grid

__all__ = [
    "FixedPredictions",
    "check_budget",
    "screen_refiner",
    "verify_best",
    "verify_choice",
]

log = logging.getLogger("pipeline.models.selection")


class FixedPredictions(RegressorMixin, BaseEstimator):
    """Stand-in regressor for scorers: returns precomputed predictions."""

    def __init__(self, pred: Any = None) -> None:
        self.pred = pred

    def predict(self, X: Any) -> np.ndarray:
        return self.pred


class screen_refiner:  # noqa: N801 - used as a function
    """``refine(preds) -> λ indices``: the ``top`` λ by mean held-out score
    (``preds[f][l]``, None for an unsolved system: never chosen by its score)."""

    def __init__(self, X: np.ndarray, y: np.ndarray, splits: list, scorer: Any, top: int) -> None:
        self.X, self.y, self.splits, self.scorer, self.top = X, y, splits, scorer, max(1, top)

    def score(self, preds: list) -> list[float]:
        out = []
        for li in range(len(preds[0])):
            vals = []
            for f, (_, te) in enumerate(self.splits):
                p = preds[f][li]
                if p is None:
                    vals.append(np.nan)
                    continue
                p = p[:, 0] if self.y.ndim == 1 else p
                vals.append(float(self.scorer(FixedPredictions(p), self.X[te], self.y[te])))
            out.append(float(np.mean(vals)))
        return out

    def __call__(self, preds: list) -> list[int]:
        sc = np.array(self.score(preds))
        sc = np.where(np.isnan(sc), np.inf, sc)  # unsolved: refine it (then redone exactly)
        return [int(i) for i in np.argsort(-sc, kind="stable")[: self.top]]


def check_budget(
    max_seconds: Any,
    solver: str,
    n: int,
    n_alpha: int,
    n_settings: int,
    splits: list,
    *,
    n_targets: int = 1,
    kind: str = "complement",
    **options: Any,
) -> float:
    """The predicted seconds of the search; ValueError if above ``max_seconds``.
    ``options``: the search's options its cost model reads (``preconditioner``, ``rank``,
    ``tol``, ``screen_tol``, ``convention``: :func:`predicted_search_seconds`)."""
    predicted = predicted_search_seconds(
        solver, n, n_alpha, n_settings, splits, n_targets=n_targets, kind=kind, **options
    )
    if max_seconds is None:
        return predicted
    try:
        budget = float(max_seconds)
    except (TypeError, ValueError):
        raise ValueError(
            f"max_search_seconds must be a positive number of seconds or None, got {max_seconds!r}"
        ) from None
    if not budget > 0:
        raise ValueError(f"max_search_seconds must be > 0, got {max_seconds!r}")
    if predicted > budget:
        smaller = suggest_smaller_grid(
            solver, n, n_alpha, n_settings, splits, budget, n_targets=n_targets, kind=kind,
            **options,
        )  # fmt: skip
        raise ValueError(
            f"the grid of {n_alpha} lambda(s) x {n_settings} kernel setting(s) x "
            f"{len(splits)} split(s) on {n} rows (solver={solver!r}) is predicted to take "
            f"{predicted:,.0f} s, more than max_search_seconds={budget:g}; search a smaller "
            f"grid, e.g. {smaller}, or raise max_search_seconds"
        )
    return predicted


def verify_best(
    cv: Any, X: np.ndarray, y2: np.ndarray, kern: Any, splits: list, alpha: float, stats: dict
) -> list[np.ndarray]:
    """Held-out predictions of the selected setting on every fold, from float64 block
    PCG to :data:`~pipeline.constants.VERIFY_TOL` (no float32, no loose inner solves); unconverged folds are
    solved directly."""

    trains, tests = [tr for tr, _ in splits], [te for _, te in splits]
    shifts = np.array([[cv._shift(alpha, len(tr)) for tr in trains]])
    op = MatrixFreeKernelOperator(
        X, kern, 1.0, block_size=OutOfCoreStore(cv).block_size(X.shape[0]), kernel_dtype="float64"
    )
    failures: list = []
    vstats: dict = {}
    pf = block_cv_predictions(
        op, y2, trains, tests, shifts, preconditioner=cv.preconditioner, rank=cv.rank,
        tol=C.VERIFY_TOL, max_iter=cv.max_iter,
        random_state=cv.random_state if cv.random_state is not None else 0,
        stats=vstats, failures=failures,
    )  # fmt: skip
    if failures:
        todo = [(f["lambda_index"], f["fold"], f["shift"]) for f in failures]
        exact = direct_fold_predictions(
            lambda r, c: np.asarray(kernel_matrix(kern, X[r], X[c]), dtype=np.float64),
            y2,
            trains,
            tests,
            todo,
        )
        for (li, f), p in exact.items():
            pf[f][li] = p
    stats["verify_passes"] = int(vstats.get("cg_matvecs", 0))
    return [pf[f][0] for f in range(len(splits))]


def verify_choice(cv: Any, X, y, y2, base, splits, scorer, stats: dict, back: int = 0) -> None:
    """Score ``cv``'s selected setting again from :func:`verify_best`'s solves:
    ``verified_score`` and ``verified_score_difference`` in ``stats`` (the score times
    ``2**back``: y in the user's units is ``2**-k y``,
    :func:`~pipeline.models.selection.scoring.target_exponent`)."""
    import copy
    import time

    t0 = time.perf_counter()
    kp = {k: v for k, v in cv.best_params_.items() if k != "alpha"}
    kern = copy.deepcopy(base).set_params(**kp)
    preds = verify_best(cv, X, y2, kern, splits, cv.best_alpha_, stats)
    verified = screen_refiner(X, y, splits, scorer, 1).score([[p] for p in preds])[0]
    if back:
        with np.errstate(over="ignore", under="ignore"):
            verified = float(np.ldexp(verified, back))
    stats["verified_score"] = verified
    stats["verified_score_difference"] = verified - cv.best_score_
    stats["seconds"]["verify"] = round(time.perf_counter() - t0, 4)
    log.info("verified score of %s: %.8g (search: %.8g)", cv.best_params_, verified, cv.best_score_)
