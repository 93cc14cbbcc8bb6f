"""The loop over kernel settings of a :class:`~pipeline.models.selection.KernelRidgeCV`
search: :func:`run_search`.

For each kernel setting it asks the search's strategy
(:func:`~pipeline.models.selection.strategies.make_strategy`) for the held-out
predictions of every λ and fold, resuming finished settings from the checkpoint
(:mod:`pipeline.models.selection.checkpoint`) and recording newly finished ones,
with one progress step per setting. The band strategy does every setting in one
call; the in-memory strategies run settings concurrently on ``n_jobs`` threads
(BLAS at one thread each). Each setting counts into its own
:class:`~pipeline.models.selection.stats.SearchStats`, merged at the end.
"""

from __future__ import annotations

import copy
import logging
import time
from typing import Any

import numpy as np

from pipeline.engine.parallel import blas_threads
from pipeline.engine.progress import open_progress
from pipeline.models.selection.checkpoint import SettingCheckpoint
from pipeline.models.selection.guard import screen_refiner
from pipeline.models.selection.stats import SearchStats, new_stats
from pipeline.models.selection.strategies import make_strategy

__all__ = ["run_search", "setting_alphas"]

log = logging.getLogger("pipeline.models.selection")


def setting_indices(candidates: list, setting: dict) -> list[int]:
    """The indices of ``setting``'s candidates among ``candidates``, in grid order."""
    return [i for i, c in enumerate(candidates) if c.kernel_params == setting]


def setting_alphas(candidates: list, setting: dict) -> list[float]:
    """The distinct λ of ``setting`` among ``candidates``, in grid order."""
    return list(dict.fromkeys(c["alpha"] for c in candidates if c.kernel_params == setting))


def run_search(
    cv: Any,
    choice: Any,
    X: np.ndarray,
    y: np.ndarray,
    y2: np.ndarray,
    base: Any,
    settings: list[dict],
    candidates: list,
    splits: list,
    kind: str,
    scorer: Any,
) -> tuple[list[dict[float, list[np.ndarray]]], SearchStats]:
    """Held-out predictions of every kernel setting, and the search's counters.

    Parameters
    ----------
    cv : KernelRidgeCV
        The search (its options).
    choice : SearchChoice
        Its solver, band workers and predicted seconds
        (:func:`~pipeline.models.selection.choice.choose_search`).
    X, y, y2 : ndarray
        The data; ``y2`` is ``y`` as a 2-D array.
    base : Kernel
        The kernel that each setting's parameters are set on.
    settings, candidates : list
        The kernel settings and the (λ, setting) candidates of the grid.
    splits, kind : list of (train, test), str
        The folds and their kind (``make_splits``).
    scorer : callable
        The scorer (for CG's screening of λ).

    Returns
    -------
    results : list of dict
        Per setting, ``{alpha: [predictions per fold]}`` (one pooled array for LOO).
    stats : SearchStats
    """
    solver = choice.solver
    stats = new_stats()
    stats.update(kernel_settings=len(settings), candidates=len(candidates), folds=len(splits))
    stats["predicted_search_seconds"] = round(choice.predicted_seconds, 3)
    screen = None
    if solver == "cg" and cv.screen_tol is not None:
        screen = screen_refiner(X, y, splits, scorer, int(cv.screen_top))
    ckpt = None
    if cv.checkpoint is not None:
        ckpt = SettingCheckpoint.for_search(cv, solver, kind, X, y2, splits)

    def run_setting(si: int) -> tuple[dict[float, list[np.ndarray]], SearchStats]:
        # counters per setting (merged afterwards: settings may run in threads)
        st = new_stats()
        kern = copy.deepcopy(base).set_params(**settings[si])
        alphas_s = setting_alphas(candidates, settings[si])
        if ckpt is not None:
            done = ckpt.load(si, kern, settings[si], alphas_s)
            if done is not None:
                st["settings_resumed"] = 1
                log.info("kernel setting %d/%d %s: resumed from its checkpoint", si + 1,
                         len(settings), settings[si])  # fmt: skip
                return done, st
        t0 = time.perf_counter()
        preds = strategy.predictions(si, X, y2, kern, splits, kind, alphas_s, st)
        dt = time.perf_counter() - t0
        st["seconds"][f"setting_{si}"] = round(dt, 4)
        log.info("kernel setting %d/%d %s: %.2f s", si + 1, len(settings), settings[si], dt)
        out = {a: p for a, p in zip(alphas_s, preds)}
        if ckpt is not None:
            ckpt.save(si, kern, settings[si], alphas_s, out, dt)
        shown.update()
        return out, st

    shown = open_progress(f"cv ({solver})", len(settings), "kernel setting")
    strategy = make_strategy(solver, cv, settings=settings, screen=screen)
    if strategy.all_settings:
        outputs = strategy.run(
            X, y2, base, settings, candidates, splits, choice.band_workers, cv.solver == "auto"
        )
    elif cv.n_jobs and int(cv.n_jobs) > 1 and strategy.threads:
        from concurrent.futures import ThreadPoolExecutor

        with blas_threads(1):
            with ThreadPoolExecutor(max_workers=int(cv.n_jobs)) as pool:
                outputs = list(pool.map(run_setting, range(len(settings))))
    else:
        outputs = [run_setting(si) for si in range(len(settings))]
    shown.update_to(len(settings))
    shown.close()
    for _, st in outputs:
        stats.merge(st)
    return [r for r, _ in outputs], stats
