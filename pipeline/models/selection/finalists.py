"""The Nyström screen of a block-CG search: the grid scored by Nyström KRR, then only its
finalists solved exactly (``KernelRidgeCV(screen_centers=)``, on by default).

Where the search runs the block CG (:func:`pipeline.plan.cv_routing.nystrom_screened`):

1. **The screen.** Every candidate is scored by Nyström KRR on ``screen_centers``
   RPCholesky centres (:mod:`~pipeline.models.selection.nystrom_cv`: one pass of
   statistics per kernel setting, one eigendecomposition per fold for all λ, one pass
   predicting the held-out rows), and on the first M/4 and M/2 of those centres (the
   leading blocks of the same statistics, :data:`NESTED`).
2. **The finalists** (:func:`finalists`), by each candidate's score extrapolated to
   M = ∞ from its three (:func:`extrapolated`, Aitken's Δ²): the ``screen_top`` best,
   plus for each of their kernel settings the next λ of the grid below its smallest
   finalist. Nyström's shortfall grows with the kernel's roughness: on diamonds
   (35,007 rows) M = 1,000 ranked γ = 0.03 above γ = 0.1 (0.978955 against 0.978618)
   where the exact scores rank them the other way (0.979055 against 0.979325); the
   extrapolated scores rank them as the exact ones do. Nyström's model is smaller than
   the exact one, and like a subsample's its best λ tends to be larger (0.0464 where
   the exact search picks 0.0215): hence the λ below.
3. **The exact solves.** The finalists' settings run the block PCG of the search
   (:class:`~pipeline.models.selection.strategies.CGPathStrategy`) on the finalists' λ
   only, float64 kernel values, to :data:`~pipeline.constants.VERIFY_TOL`, without
   tolerance screening: their scores are the verification's, so none is run after.

``cv_results_`` keeps a row per candidate: the finalists' scores are exact, the others
Nyström's (``screened`` True), as scikit-learn's ``HalvingGridSearchCV`` keeps the
scores of its early rounds. ``rank_test_score`` ranks the exact scores first, so
``best_*`` is always an exactly scored candidate.

Checkpoints: the screen's settings in ``CHECKPOINT/screen``, the finalists' in
``CHECKPOINT/exact`` (each stage's own fingerprints, :mod:`~pipeline.models.selection.
checkpoint`).

Measured (the screen's cost and whether its finalists hold the exhaustive search's
pick): docs/CV_AT_SCALE.md.
"""

from __future__ import annotations

import copy
import logging
import time
from dataclasses import replace
from typing import Any

import numpy as np

import pipeline.constants as C
from pipeline.models.selection.nystrom_cv import (
    check_nystrom_search,
    nested_vectors,
    nystrom_scores,
)
from pipeline.models.selection.runner import run_search, setting_alphas, setting_indices
from pipeline.models.selection.scoring import score_candidates
from pipeline.models.selection.stats import SearchStats
from pipeline.plan.cv_routing import nystrom_screened
from pipeline.storage.location import join_path

__all__ = ["descent", "finalists", "screen_applies", "screened_search", "unresolved"]

log = logging.getLogger("pipeline.models.selection")

#: the screen's nested fidelities: the first M/4 and M/2 of its M centres
NESTED = (4, 2)


#: the largest ratio of successive gains that :func:`shortfall` extrapolates with (a
#: sequence that slows down less is not trusted further: its gain is charged at this)
MAX_GAIN_RATIO = 0.5


def shortfall(quarter: float, half: float, full: float) -> float:
    """What a Nyström score at M still lacks, from the scores at M/4, M/2 and M: the gains
    ``d1 = half - quarter`` and ``d2 = full - half`` shrink geometrically (ratio ``ρ =
    d2 / d1``, at most :data:`MAX_GAIN_RATIO`), so the rest is ``d2 ρ / (1 - ρ)``
    (Aitken's Δ²); 0 where the score does not rise or does not slow down."""
    d1, d2 = half - quarter, full - half
    if not (np.isfinite(d1) and np.isfinite(d2) and d2 > 0 and d1 > d2):
        return 0.0
    rho = min(d2 / d1, MAX_GAIN_RATIO)
    return float(d2 * rho / (1.0 - rho))


def setting_bests(candidates: list, settings: list[dict], *scores: np.ndarray) -> np.ndarray:
    """``out[s, j]``: the best of ``scores[j]`` over the candidates of ``settings[s]`` (NaN
    where none is finite): each kernel setting's best score at each fidelity."""
    out = np.full((len(settings), len(scores)), np.nan)
    for k, setting in enumerate(settings):
        idx = setting_indices(candidates, setting)
        for j, sc in enumerate(scores):
            if np.isfinite(sc[idx]).any():
                out[k, j] = np.nanmax(sc[idx])
    return out


def extrapolated(
    candidates: list, settings: list[dict], quarter: np.ndarray, half: np.ndarray,
    full: np.ndarray,
) -> np.ndarray:  # fmt: skip
    """Each candidate's mean score at M plus its kernel setting's :func:`shortfall`,
    taken from the setting's best score at each fidelity (one estimate per setting: a
    candidate's own three scores are too noisy for it)."""
    out = np.array(full, dtype=np.float64)
    bests = setting_bests(candidates, settings, quarter, half, full)
    for setting, best in zip(settings, bests, strict=True):
        idx = setting_indices(candidates, setting)
        out[idx] = out[idx] + shortfall(*best)
    return out


def reach(quarter: float, half: float, full: float, doublings: int) -> float:
    """How far a kernel setting's best Nyström score (at M/4, M/2 and M centres) would
    rise over ``doublings`` more doublings of M (at M = n Nyström KRR is the exact one)
    if its gains went on as they went: each doubling's gain the last one's times its own
    ``ρ = d2 / d1``, and 1 where the first gain was none. Where ρ < 1 it is
    :func:`shortfall`'s estimate cut at the doublings there are (with the setting's own
    ρ, not capped); where the gains do not shrink, which :func:`shortfall` does not
    extrapolate, it grows with the doublings left. A score that fell at the last
    doubling has no direction to follow: its best so far plus the fall's size at each
    doubling left (a saturated score that wobbles reaches little further; one that M
    centres do not resolve at all, far). NaN scores reach nothing (-inf)."""
    seen = [v for v in (quarter, half, full) if np.isfinite(v)]
    if not seen:
        return -np.inf
    d1, d2 = half - quarter, full - half
    steps = max(int(doublings), 0)
    if not np.isfinite(d2) or d2 == 0:
        return float(max(seen))
    if d2 < 0:
        return float(max(seen) - d2 * steps)
    rho = d2 / d1 if np.isfinite(d1) and d1 > 0 else 1.0
    return float(full + d2 * sum(rho**j for j in range(1, steps + 1)))


def unresolved(
    candidates: list, settings: list[dict], bests: np.ndarray, mean: np.ndarray,
    exact: np.ndarray, doublings: int,
) -> list[int]:  # fmt: skip
    """The candidates to solve exactly next (indices, ascending) for the kernel settings
    the screen could not rule out: every candidate of each setting with no exactly
    scored one whose Nyström scores (``bests``, :func:`setting_bests` at M/4, M/2, M)
    could still :func:`reach` the best exact ``mean``. The screen resolved nothing of
    such a setting, its best λ included, so its whole λ path is solved as a search
    without the screen solves it: one block PCG, one preconditioner (a best guess and
    the λ below, followed down by :func:`descent`, took a round and a preconditioner
    per step: 155.6 s against 95.8 s for the exhaustive search on kin40k's 3,000 rows).

    A rough kernel that M centres resolve poorly can score low on the screen, with gains
    that do not slow down (which :func:`shortfall` does not extrapolate) or scores that
    fall as M grows, while its exact score is the grid's best: without this its setting
    was never solved exactly. Where
    the gains shrink, the finalists' extrapolation already ranked the setting, and this
    rarely adds one: on diamonds (35,000 rows, M = 1,000) γ = 0.3's gains shrink by
    ρ = 0.31 and it reaches 0.9741 against the exact best 0.9784 (its exact best is
    0.9754); charging it ρ = 0.5 instead would have solved it exactly for nothing, 3.7x
    the whole search's time."""
    done = np.where(exact & ~np.isnan(mean), mean, -np.inf)
    if not exact.any() or not np.isfinite(done).any():
        return []
    top = float(np.max(done))
    out: list[int] = []
    for setting, best in zip(settings, bests, strict=True):
        mine = setting_indices(candidates, setting)
        if not any(exact[i] for i in mine) and reach(*best, doublings) > top:
            out += mine
    return sorted(out)


def screen_applies(
    cv: Any, solver: str, kind: str, n: int, splits: list, n_candidates: int
) -> bool:
    """Whether the search ``cv`` screens with Nyström: the routing's rule
    (:func:`~pipeline.plan.cv_routing.nystrom_screened`) and the Nyström search's own
    checks (its scorer, its splits, its memory); a check that refuses is logged and the
    search runs every candidate exactly."""
    centres = getattr(cv, "screen_centers", None)
    if not nystrom_screened(solver, kind, n, n_candidates, centres, int(cv.screen_top)):
        return False
    try:
        check_nystrom_search(_screen_search(cv, n), n, kind, splits)
    except ValueError as exc:
        log.info("no Nyström screen (every candidate exactly): %s", exc)
        return False
    return True


def _screen_search(cv: Any, n: int, checkpoint: Any = None) -> Any:
    """The screen's search: ``cv`` as a Nyström search on RPCholesky centres, with the
    nested fidelities of :data:`NESTED` (the first M/4 and M/2 centres)."""
    scr = copy.copy(cv)
    scr.solver = "nystrom"
    scr.n_centers = m = min(int(cv.screen_centers), n)
    scr.screen_nested = tuple(max(1, m // d) for d in NESTED)
    scr.centers = "rpcholesky"
    scr.refine = None
    scr.checkpoint = checkpoint
    return scr


def _exact_search(cv: Any, checkpoint: Any = None) -> Any:
    """The finalists' search: ``cv``'s block CG, float64 to the verification's tolerance,
    without tolerance screening."""
    ex = copy.copy(cv)
    ex.solver = "cg"
    ex.kernel_dtype = "float64"
    ex.tol = C.VERIFY_TOL
    ex.screen_tol = None
    ex.checkpoint = checkpoint
    return ex


def finalists(candidates: list, settings: list[dict], mean: np.ndarray, top: int) -> list[int]:
    """The indices (ascending) of the ``top`` best candidates by ``mean`` (NaN last, ties
    in grid order) and, for each of their kernel settings, of the grid's next λ below the
    setting's smallest finalist."""
    key = np.where(np.isnan(mean), -np.inf, mean)
    best = [int(i) for i in np.argsort(-key, kind="stable")[:top]]
    chosen = set(best)
    for setting in settings:
        mine = [i for i in best if candidates[i].kernel_params == setting]
        if mine:
            chosen.update(_below(candidates, setting, mine, 1))
    return sorted(chosen)


def _below(candidates: list, setting: dict, mine: list[int], steps: int) -> list[int]:
    """The candidates of ``setting`` at the grid's next ``steps`` λ below the smallest λ of
    the candidates ``mine`` (those there are)."""
    low = min(candidates[i]["alpha"] for i in mine)
    below = sorted((a for a in setting_alphas(candidates, setting) if a < low), reverse=True)
    take = set(below[:steps])
    return [
        i for i, c in enumerate(candidates) if c.kernel_params == setting and c["alpha"] in take
    ]


def descent(
    candidates: list, settings: list[dict], mean: np.ndarray, exact: np.ndarray, steps: int = 1
) -> list[int]:
    """The candidates to solve exactly next (indices, ascending): for each kernel setting
    with exactly scored candidates (``exact``) whose best exact ``mean`` is at its
    smallest exactly solved λ, the grid's next ``steps`` λ below (those there are).

    Nyström's best λ is larger than the exact one, by more the further M is from what the
    kernel needs: on diamonds by one grid step (the finalists' "λ below" covers it); on
    kin40k (3,000 rows, γ = 0.3, M = 1,000) by three decades, where the finalists alone
    picked a setting 8 % worse in 1 - R² (``workflows/benchmarks/bench_cv_screen.py``).
    A setting's exact scores are followed down the grid until they stop rising; the
    search doubles ``steps`` at each round (one block PCG per round, whose cost its
    smallest λ sets), so a long way down takes few rounds."""
    key = np.where(np.isnan(mean), -np.inf, mean)
    out: list[int] = []
    for setting in settings:
        mine = [i for i in setting_indices(candidates, setting) if exact[i]]
        if not mine or not np.isfinite(key[mine]).any():
            continue
        best = max(mine, key=lambda i: key[i])
        if candidates[best]["alpha"] == min(candidates[i]["alpha"] for i in mine):
            out += _below(candidates, setting, mine, steps)
    return sorted(out)


def screened_search(
    cv: Any, choice: Any, X: np.ndarray, y: np.ndarray, y2: np.ndarray, base: Any,
    settings: list[dict], candidates: list, splits: list, kind: str, scorer: Any,
) -> tuple[np.ndarray, np.ndarray, SearchStats]:  # fmt: skip
    """``(scores, screened, stats)``: ``scores[c, f]`` of every candidate (Nyström's where
    ``screened[c]``, exact elsewhere) and the two stages' counters (``stats["screen_nystrom"]``:
    the centres, the finalists and each stage's seconds)."""
    n = X.shape[0]
    ck = cv.checkpoint
    t0 = time.perf_counter()
    scr = _screen_search(cv, n, None if ck is None else join_path(ck, "screen"))
    results, stats = run_search(
        scr, replace(choice, solver="nystrom"), X, y, y2, base, settings, candidates, splits,
        kind, scorer,
    )  # fmt: skip
    t = y2.shape[1]
    fid = [
        nystrom_scores(
            [{a: [nested_vectors(v, t)[j] for v in vs] for a, vs in r.items()} for r in results],
            candidates,
            settings,
            splits,
            kind,
            cv.scoring,
        )  # fmt: skip
        for j in range(1 + len(NESTED))
    ]
    scores = fid[0]
    with np.errstate(invalid="ignore"):
        nested = [f.mean(axis=1) for f in (fid[1], fid[2], fid[0])]  # M/4, M/2, M
        guess = extrapolated(candidates, settings, *nested)
        bests = setting_bests(candidates, settings, *nested)
    # doublings of M until n, where Nyström KRR is the exact one (:func:`reach`)
    doublings = max(1, int(np.ceil(np.log2(n / max(int(scr.n_centers), 1)))))
    t_screen = time.perf_counter() - t0
    chosen = finalists(candidates, settings, guess, int(cv.screen_top))
    fin_cands = [candidates[i] for i in chosen]
    first = set(chosen)
    log.info(
        "Nyström screen (M=%d): %d candidates in %.1f s; %d finalists solved exactly: %s",
        scr.n_centers, len(candidates), t_screen, len(chosen), [dict(c) for c in fin_cands],
    )  # fmt: skip
    scores = scores.copy()
    screened = np.ones(len(candidates), dtype=bool)
    rounds = 0
    guarded: set[int] = set()
    while chosen:  # the finalists, then each λ step down (:func:`descent`) and the
        # settings the screen could not rule out (:func:`unresolved`)
        name = "exact" if rounds == 0 else f"descent_{rounds}"
        ex = _exact_search(cv, None if ck is None else join_path(ck, name))
        batch = [candidates[i] for i in chosen]
        batch_settings = [s for s in settings if any(c.kernel_params == s for c in batch)]
        exact_results, exact_stats = run_search(
            ex, choice, X, y, y2, base, batch_settings, batch, splits, kind, scorer
        )
        scores[chosen] = score_candidates(
            exact_results, batch, batch_settings, splits, kind, scorer, X, y
        )
        screened[chosen] = False
        part = exact_stats.to_dict()  # (its phases named apart; one prediction, the search's)
        part.pop("predicted_search_seconds", None)
        part["seconds"] = {f"exact_{k}": v for k, v in part.get("seconds", {}).items()}
        stats.merge(part)
        mean = scores.mean(axis=1)
        chosen = descent(candidates, settings, mean, ~screened, 2**rounds)
        if chosen:
            log.info(
                "Nyström screen: the exact best λ of %d kernel setting(s) is the smallest "
                "solved; the next λ below solved exactly: %s", len(chosen),
                [dict(candidates[i]) for i in chosen],
            )  # fmt: skip
        more = unresolved(candidates, settings, bests, mean, ~screened, doublings)
        if more:
            log.info(
                "Nyström screen: kernel setting(s) without an exact score could still beat "
                "the best exact one (%.6g); solved exactly: %s",
                np.nanmax(np.where(screened, np.nan, mean)), [dict(candidates[i]) for i in more],
            )  # fmt: skip
            guarded.update(more)
            chosen = sorted(set(chosen) | set(more))
        rounds += 1
    stats.update(kernel_settings=len(settings), candidates=len(candidates), folds=len(splits))
    stats["screen_nystrom"] = {
        "n_centers": int(scr.n_centers),
        "extrapolated": [float(g) for g in guess],
        "finalists": [dict(c) for c in fin_cands],
        "descended": [
            dict(candidates[i])
            for i in np.flatnonzero(~screened)
            if i not in first and i not in guarded
        ],
        "unresolved": [dict(candidates[i]) for i in sorted(guarded)],
        "settings": [
            {
                "params": dict(setting),
                "nested_best": [float(v) for v in best],
                "reach": reach(*best, doublings),
            }
            for setting, best in zip(settings, bests, strict=True)
        ],  # fmt: skip
        "seconds": round(t_screen, 4),
        "exact_seconds": round(time.perf_counter() - t0 - t_screen, 4),
    }
    return scores, screened, stats
