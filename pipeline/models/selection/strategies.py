"""The search strategies of :class:`~pipeline.models.selection.KernelRidgeCV`.

Each strategy turns one kernel setting (or, for band reductions, all of them)
into held-out predictions per (λ, fold), counting its work into a
:class:`~pipeline.models.selection.stats.SearchStats`. One interface,
``predictions(si, X, y2, kern, splits, kind, alphas, stats) -> out`` with
``out[l][f]`` the predictions of ``alphas[l]`` on fold ``f`` (one pooled array for
leave-one-out); :func:`make_strategy` gives the strategy of a solver:

- :class:`BandStrategy`: band reductions, with CG where routing predicts it cheaper;
- :class:`InMemoryStrategy`: eigen (LOO, leave-group-out, per fold) and dense;
- :class:`CholeskyStrategy`: out of core, one tile Cholesky per λ, LOO/LGO residuals;
- :class:`CGPathStrategy`: out of core, CG over every fold with warm starts.

They read the search's parameters from the :class:`KernelRidgeCV` they serve
(``self.cv``); the routing and cost models are in :mod:`pipeline.plan`. The loop
over kernel settings (checkpoints, threads, progress) is
:func:`pipeline.models.selection.runner.run_search`.
"""

from __future__ import annotations

import copy
import logging
import os
import time
from typing import Any

import numpy as np

from pipeline.constants import (
    DEFAULT_BLOCK_SIZE,
    ROUTE_RANK,
    ROUTE_RANK_DIVISOR,
    ROUTED_CG_TOL,
)
from pipeline.engine.dense import kernel_matrix
from pipeline.linalg.cholesky import tile_cholesky
from pipeline.linalg.dense_dual import solve_dual
from pipeline.linalg.gram import build_gram
from pipeline.linalg.matvec import MatrixFreeKernelOperator
from pipeline.linalg.triangular import cholesky_solve
from pipeline.models.selection.band import band_search
from pipeline.models.selection.cgpath import cg_fold_predictions
from pipeline.models.selection.cvblock import block_cv_predictions
from pipeline.models.selection.direct import direct_fold_predictions, record_redo
from pipeline.models.selection.eigen import (
    eigendecompose,
    fold_eigen_predictions,
    lgo_predictions,
    loo_predictions,
)
from pipeline.models.selection.loo import lgo_residuals, loo_residuals
from pipeline.models.selection.nystrom_cv import n_centres, seed, setting_statistics
from pipeline.models.selection.route import DenseKernelOperator, route_setting
from pipeline.models.selection.stats import new_stats
from pipeline.plan.cv_routing import eigen_mode

__all__ = [
    "BandStrategy",
    "CGPathStrategy",
    "CholeskyStrategy",
    "InMemoryStrategy",
    "NystromStrategy",
    "OutOfCoreStore",
    "make_strategy",
]

log = logging.getLogger("pipeline.models.selection")


def redo_failed(preds, failures, block, y2, trains, tests, shifts, stats, setting, ooc=None):
    """Redo the λ rows in ``failures`` (from :func:`cg_fold_predictions`) exactly, in
    place in ``preds[f][li]``, and record them in ``stats``."""
    if not failures:
        return
    todo = [(fl["lambda_index"], f, float(shifts[fl["lambda_index"], f])) for fl in failures
            for f in range(len(trains))]  # fmt: skip
    exact = direct_fold_predictions(
        block, y2, trains, tests, todo, out_of_core=ooc, what=f"setting {setting}"
    )
    for (li, f), p in exact.items():
        preds[f][li] = p
    record_redo(stats, setting, failures, "cholesky")


class _Strategy:
    """A search strategy over the :class:`KernelRidgeCV` ``cv``.

    ``solver`` names it (``"eigen"`` or ``"dense"`` for :class:`InMemoryStrategy`),
    ``settings`` are the kernel settings searched (named in the records of redone
    solves) and ``screen`` is CG's screening refiner (:func:`~pipeline.models.selection.guard.screen_refiner`).
    """

    #: kernel settings may run concurrently in threads (``n_jobs``)
    threads = False
    #: one call of ``run`` does every kernel setting (no per-setting loop)
    all_settings = False

    def __init__(self, cv: Any, *, solver: str | None = None, settings: Any = None,
                 screen: Any = None) -> None:  # fmt: skip
        self.cv, self.solver, self.settings, self.screen = cv, solver, settings, screen

    def predictions(self, si, X, y2, kern, splits, kind, alphas, stats) -> list:
        """Held-out predictions of kernel setting ``si`` (kernel ``kern``):
        ``out[l][f]`` for ``alphas[l]`` and fold ``f``, counting into ``stats``."""
        raise NotImplementedError


class BandStrategy(_Strategy):
    """Every kernel setting by band reductions, or by routed CG (``solver="auto"``)."""

    all_settings = True

    def run(self, X, y2, base, settings, candidates, splits, workers, route: bool):
        """Every kernel setting by band reductions, or (``route``) by preconditioned CG
        where :func:`route_setting` predicts CG to be cheaper: (predictions by alpha,
        stats) per setting."""
        cv = self.cv
        alphas = [
            list(dict.fromkeys(c["alpha"] for c in candidates if c.kernel_params == st))
            for st in settings
        ]
        shifts = [
            [[cv._shift(a, len(tr)) for a in alphas[s]] for tr, _ in splits]
            for s in range(len(settings))
        ]
        kerns = [copy.deepcopy(base).set_params(**st) for st in settings]
        per = [new_stats() for _ in settings]
        n = X.shape[0]
        preds: dict[int, list] = {}
        kept: dict[int, np.ndarray] = {}

        def kernel(s: int) -> np.ndarray:
            if s in kept:
                return kept.pop(s)
            t0 = time.perf_counter()
            K = np.asarray(kernel_matrix(kerns[s], X), dtype=np.float64)
            per[s]["kernel_matrices"] += 1
            sec = per[s]["seconds"]
            sec["kernel"] = sec.get("kernel", 0) + time.perf_counter() - t0
            return K

        t0 = time.perf_counter()
        # only a kernel known to be PSD is routed: CG on an indefinite K would not fail
        # loudly, while the band Cholesky names the shift that is not positive definite
        routed = [s for s in range(len(settings)) if route and kerns[s].is_mercer]
        if routed:
            for s in routed:
                K = kernel(s)
                t1 = time.perf_counter()
                r = route_setting(
                    K,
                    shifts[s],
                    [len(tr) for tr, _ in splits],
                    n_workers=workers,
                    tol=ROUTED_CG_TOL,
                    rank=int(cv.rank or min(ROUTE_RANK, max(1, n // ROUTE_RANK_DIVISOR))),
                    random_state=cv.random_state if cv.random_state is not None else 0,
                )
                per[s]["seconds"]["route"] = round(time.perf_counter() - t1, 4)
                per[s]["routes"] = [
                    {
                        "setting": settings[s],
                        "solver": r.solver,
                        "rho": r.rho,
                        "predicted_cg_iterations": r.predicted_cg_iterations,
                        "predicted_cg_seconds": round(r.predicted_cg_seconds, 3),
                        "predicted_band_seconds": round(r.predicted_band_seconds, 3),
                    }
                ]
                log.info(
                    "setting %s: %s (||K - F F^T|| %.3g; predicted CG %d iterations %.1f s, "
                    "band %.1f s)",
                    settings[s],
                    r.solver,
                    r.rho,
                    r.predicted_cg_iterations,
                    r.predicted_cg_seconds,
                    r.predicted_band_seconds,
                )
                if r.solver == "cg":
                    t1 = time.perf_counter()
                    failures: list = []
                    trains, tests = [tr for tr, _ in splits], [te for _, te in splits]
                    pf = cg_fold_predictions(
                        DenseKernelOperator(K),
                        y2,
                        trains,
                        tests,
                        np.array(shifts[s]).T,
                        tol=ROUTED_CG_TOL,
                        max_iter=cv.max_iter,
                        factor=r.factor,
                        stats=per[s],
                        failures=failures,
                    )
                    redo_failed(
                        pf, failures, lambda r_, c_, K=K: K[np.ix_(r_, c_)], y2, trains,
                        tests, np.array(shifts[s]).T, per[s], settings[s],
                    )  # fmt: skip
                    per[s]["seconds"]["cg"] = round(time.perf_counter() - t1, 4)
                    preds[s] = pf
                elif len(kept) < max(2, workers):  # the first band settings keep their K
                    kept[s] = K
                del K
        band = [s for s in range(len(settings)) if s not in preds]
        out = band_search(
            lambda i: kernel(band[i]),
            len(band),
            y2,
            splits,
            lambda i, f: shifts[band[i]][f],
            n_workers=workers,
            stats=[per[s] for s in band],
        )
        kept.clear()
        for i, s in enumerate(band):
            preds[s] = out[i]
        log.info(
            "in-memory search: %d settings (%d by band reductions on %d threads) x %d "
            "splits: %.2f s",
            len(settings),
            len(band),
            workers,
            len(splits),
            time.perf_counter() - t0,
        )
        per[0]["band_workers"] = workers
        return [
            (
                {
                    a: [preds[s][f][li] for f in range(len(splits))]
                    for li, a in enumerate(alphas[s])
                },
                per[s],
            )
            for s in range(len(settings))
        ]


class InMemoryStrategy(_Strategy):
    """``eigen`` (LOO, LGO or per fold, by :func:`~pipeline.plan.cv_routing.eigen_mode`) and ``dense``."""

    threads = True

    def predictions(self, si, X, y2, kern, splits, kind, alphas_s, stats):
        cv, solver = self.cv, self.solver
        n = X.shape[0]
        t0 = time.perf_counter()
        K = np.asarray(kernel_matrix(kern, X), dtype=np.float64)
        stats["kernel_matrices"] += 1
        stats["seconds"]["kernel"] = stats["seconds"].get("kernel", 0) + time.perf_counter() - t0
        L = len(alphas_s)
        if solver == "dense":
            out = [[None] * len(splits) for _ in range(L)]
            for f, (tr, te) in enumerate(splits):
                Ktt = K[np.ix_(tr, tr)]
                Kvt = K[np.ix_(te, tr)]
                for li, a in enumerate(alphas_s):
                    coef = solve_dual(Ktt, y2[tr], cv._shift(a, len(tr)))
                    out[li][f] = Kvt @ coef
                    stats["factorizations"] += 1
                    stats["fold_fits_equivalent"] += 1
            return out
        mode = eigen_mode(n, kind, L, splits, cv.eigen_mode)
        stats.setdefault("eigen_modes", []).append(mode)
        if mode == "loo":
            eig = eigendecompose(K, y2, overwrite=True)
            del K
            stats["eigendecompositions"] += 1
            preds = loo_predictions(eig, y2, [cv._shift(a, n - 1) for a in alphas_s])
            return [[p] for p in preds]
        if mode == "lgo":
            eig = eigendecompose(K, y2, overwrite=True)
            del K
            stats["eigendecompositions"] += 1
            tests = [te for _, te in splits]
            shifts = [[cv._shift(a, len(tr)) for a in alphas_s] for tr, _ in splits]
            pf = lgo_predictions(eig, y2, tests, shifts)
            return [[pf[f][li] for f in range(len(splits))] for li in range(L)]
        out = [[None] * len(splits) for _ in range(L)]
        for f, (tr, te) in enumerate(splits):
            ps = fold_eigen_predictions(K, y2, tr, te, [cv._shift(a, len(tr)) for a in alphas_s])
            stats["eigendecompositions"] += 1
            for li in range(L):
                out[li][f] = ps[li]
        return out


class OutOfCoreStore(_Strategy):
    """The search's store: one Gram per kernel setting, factors per shift."""

    def block_size(self, n: int) -> int:
        cv = self.cv
        return int(min(cv.block_size or DEFAULT_BLOCK_SIZE, n))

    def gram(self, si: int, X, kern, stats):
        cv = self.cv
        gram, gs = build_gram(
            X,
            kern,
            os.fspath(cv.store),
            self.block_size(X.shape[0]),
            name=f"cv_gram_{si}",
            overwrite=True,
            progress=False,
            return_stats=True,
        )
        stats["gram_tiles_built"] += gs.n_computed
        stats["gram_tiles_reused"] += gs.n_skipped
        stats["kernel_matrices"] += 1
        return gram

    def factor(self, gram, shift: float, stats):
        cv = self.cv

        fac = tile_cholesky(
            gram, shift, store=os.fspath(cv.store), name="cv_chol", overwrite=True, progress=False
        )
        stats["factorizations"] += 1
        stats["factor_tiles"] += len(fac.computed)
        return fac


class CholeskyStrategy(_Strategy):
    """Out of core: a tile Cholesky of the full Gram per λ; fold and LOO residuals from it."""

    def predictions(self, si, X, y2, kern, splits, kind, alphas_s, stats):
        cv = self.cv

        n = X.shape[0]
        gram = OutOfCoreStore(cv).gram(si, X, kern, stats)
        out = []
        for a in alphas_s:
            if kind == "loo":
                fac = OutOfCoreStore(cv).factor(gram, cv._shift(a, n - 1), stats)
                e, _ = loo_residuals(fac, y2, stats=stats)
                out.append([y2 - e])
                continue
            by_shift: dict[float, list[int]] = {}
            for f, (tr, _) in enumerate(splits):
                by_shift.setdefault(cv._shift(a, len(tr)), []).append(f)
            preds: list[Any] = [None] * len(splits)
            for shift, folds in by_shift.items():
                fac = OutOfCoreStore(cv).factor(gram, shift, stats)
                coef = cholesky_solve(fac, y2)
                for f in folds:
                    te = splits[f][1]
                    preds[f] = y2[te] - lgo_residuals(fac, coef, te, stats)
            out.append(preds)
        return out


class NystromStrategy(_Strategy):
    """``solver="nystrom"``: per kernel setting, the held-out vectors of
    :func:`~pipeline.models.selection.nystrom_cv.setting_statistics` in place of
    predictions (:func:`~pipeline.models.selection.nystrom_cv.nystrom_scores` scores them)."""

    def predictions(self, si, X, y2, kern, splits, kind, alphas_s, stats):
        cv = self.cv
        return setting_statistics(
            X, y2, kern, splits, alphas_s, cv._shift, m=n_centres(cv, X.shape[0]),
            centers=cv.centers, random_state=seed(cv), stats=stats,
            nested=getattr(cv, "screen_nested", ()),
        )  # fmt: skip


class CGPathStrategy(_Strategy):
    """Out of core: every (λ, fold) system of a kernel setting as a column of one block
    PCG (:mod:`pipeline.models.selection.cvblock`): one matrix-free pass of the fused
    engine per iteration for all of them, one Nyström factor per setting, float32
    kernel values with float64 residuals; unconverged systems redone exactly."""

    def predictions(self, si, X, y2, kern, splits, kind, alphas_s, stats):
        cv = self.cv

        n = X.shape[0]
        bs = OutOfCoreStore(cv).block_size(n)
        trains, tests = [tr for tr, _ in splits], [te for _, te in splits]
        shifts = np.array([[cv._shift(a, len(tr)) for tr in trains] for a in alphas_s])
        op64 = MatrixFreeKernelOperator(X, kern, 1.0, block_size=bs, kernel_dtype="float64")
        kd = getattr(cv, "kernel_dtype", "auto")
        use32 = kd in ("auto", "float32")
        kw = dict(
            screen_tol=getattr(cv, "screen_tol", None),
            refine=self.screen,
            preconditioner=cv.preconditioner,
            rank=cv.rank,
            tol=cv.tol,
            max_iter=cv.max_iter,
            random_state=cv.random_state if cv.random_state is not None else 0,
            stats=stats,
        )
        failures: list = []
        try:
            op32 = (
                MatrixFreeKernelOperator(X, kern, 1.0, block_size=bs, kernel_dtype="float32")
                if use32
                else None
            )
            pf = block_cv_predictions(op64, y2, trains, tests, shifts, op32=op32,
                                      failures=failures, **kw)  # fmt: skip
        except ValueError as exc:
            if not use32 or "float32" not in str(exc):
                raise
            log.info("float32 kernel values refused (%s); float64 products", exc)
            failures.clear()
            pf = block_cv_predictions(op64, y2, trains, tests, shifts, failures=failures, **kw)
        stats.setdefault("kernel_dtypes", []).append("float32" if use32 else "float64")
        if failures:
            todo = [(fl["lambda_index"], fl["fold"], fl["shift"]) for fl in failures]

            def block(r, c):
                return np.asarray(kernel_matrix(kern, X[r], X[c]), dtype=np.float64)

            ooc = None
            if cv.store is not None and all(len(tr) + len(te) == n for tr, te in splits):
                ooc = lambda todo_: self._out_of_core(si, X, y2, kern, splits, todo_, stats)  # noqa: E731
            exact = direct_fold_predictions(
                block, y2, trains, tests, todo, out_of_core=ooc, what=f"setting {si}"
            )
            for (li, f), p in exact.items():
                pf[f][li] = p
            record_redo(stats, si if self.settings is None else self.settings[si], failures,
                        "cholesky")  # fmt: skip
        return [[pf[f][li] for f in range(len(splits))] for li in range(len(alphas_s))]

    def _out_of_core(self, si, X, y2, kern, splits, todo, stats):
        """Exact K-fold predictions from a tile Cholesky of the stored Gram, per shift."""

        store = OutOfCoreStore(self.cv)
        gram = store.gram(si, X, kern, stats)
        out = {}
        by_shift: dict[float, list] = {}
        for li, f, s in todo:
            by_shift.setdefault(float(s), []).append((li, f))
        for shift, items in by_shift.items():
            fac = store.factor(gram, shift, stats)
            coef = cholesky_solve(fac, y2)
            for li, f in items:
                te = splits[f][1]
                out[(li, f)] = y2[te] - lgo_residuals(fac, coef, te, stats)
        return out


#: the strategy class of each solver
STRATEGIES: dict[str, type[_Strategy]] = {
    "band": BandStrategy,
    "eigen": InMemoryStrategy,
    "dense": InMemoryStrategy,
    "cholesky": CholeskyStrategy,
    "cg": CGPathStrategy,
    "nystrom": NystromStrategy,
}


def make_strategy(solver: str, cv: Any, *, settings: Any = None, screen: Any = None) -> _Strategy:
    """The strategy of ``solver`` for the search ``cv``."""
    return STRATEGIES[solver](cv, solver=solver, settings=settings, screen=screen)
