"""The search strategies of :class:`~pipeline.model_selection.KernelRidgeCV`.

Each strategy turns one kernel setting (or, for band reductions, all of them)
into held-out predictions per (λ, fold), counting its work into a stats dict
(:mod:`pipeline.model_selection.stats`):

- :class:`BandStrategy`: band reductions, with CG where routing predicts it cheaper;
- :class:`InMemoryStrategy`: eigen (LOO, leave-group-out, per fold) and dense;
- :class:`CholeskyStrategy`: out of core, one tile Cholesky per λ, LOO/LGO residuals;
- :class:`CGPathStrategy`: out of core, CG over every fold with warm starts.

They read the search's parameters from the :class:`KernelRidgeCV` they serve
(``self.cv``); the routing and cost models are in :mod:`pipeline.policy`.
"""

from __future__ import annotations

import copy
import logging
import os
import time
from typing import Any

import numpy as np

from pipeline.model_selection.band import band_search
from pipeline.model_selection.cgpath import cg_fold_predictions
from pipeline.model_selection.eigen import (
    eigendecompose,
    fold_eigen_predictions,
    lgo_predictions,
    loo_predictions,
)
from pipeline.model_selection.route import DenseKernelOperator, route_setting
from pipeline.model_selection.stats import new_stats
from pipeline.policy.constants import DEFAULT_BLOCK_SIZE, ROUTE_RANK, ROUTED_CG_TOL

__all__ = [
    "BandStrategy",
    "CGPathStrategy",
    "CholeskyStrategy",
    "InMemoryStrategy",
    "OutOfCoreStore",
]

log = logging.getLogger("pipeline.model_selection")


class _Strategy:
    def __init__(self, cv: Any) -> None:
        self.cv = cv


class BandStrategy(_Strategy):
    """Every kernel setting by band reductions, or by routed CG (``solver="auto"``)."""

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
            K = np.asarray(kerns[s](X), dtype=np.float64)
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
                    rank=int(cv.rank or min(ROUTE_RANK, max(1, n // 8))),
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
                    pf = cg_fold_predictions(
                        DenseKernelOperator(K),
                        y2,
                        [tr for tr, _ in splits],
                        [te for _, te in splits],
                        np.array(shifts[s]).T,
                        tol=ROUTED_CG_TOL,
                        max_iter=cv.max_iter,
                        factor=r.factor,
                        stats=per[s],
                    )
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
    """``eigen`` (LOO, LGO or per fold, by :func:`~pipeline.policy.cv_routing.eigen_mode`) and ``dense``."""

    def setting(self, solver, X, y2, kern, splits, kind, alphas_s, stats):
        cv = self.cv
        n = X.shape[0]
        t0 = time.perf_counter()
        K = np.asarray(kern(X), dtype=np.float64)
        stats["kernel_matrices"] += 1
        stats["seconds"]["kernel"] = stats["seconds"].get("kernel", 0) + time.perf_counter() - t0
        L = len(alphas_s)
        if solver == "dense":
            from pipeline.reference import solve_dual

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
        mode = cv._eigen_mode(n, kind, L, splits)
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
        from pipeline.gram import build_gram

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
        from pipeline.solvers import tile_cholesky

        fac = tile_cholesky(
            gram, shift, store=os.fspath(cv.store), name="cv_chol", overwrite=True, progress=False
        )
        stats["factorizations"] += 1
        stats["factor_tiles"] += len(fac.computed)
        return fac


class CholeskyStrategy(_Strategy):
    """Out of core: a tile Cholesky of the full Gram per λ; fold and LOO residuals from it."""

    def setting(self, si, X, y2, kern, splits, kind, alphas_s, stats):
        cv = self.cv
        from pipeline.model_selection.loo import lgo_residuals, loo_residuals
        from pipeline.solvers import cholesky_solve

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


class CGPathStrategy(_Strategy):
    """Out of core: every fold by CG with products by the full K, warm starts across λ."""

    def setting(self, si, X, y2, kern, splits, alphas_s, stats):
        cv = self.cv
        from pipeline.solvers.matvec import make_operator

        if cv.store is not None:
            op = make_operator("stored", 1.0, gram=OutOfCoreStore(cv).gram(si, X, kern, stats))
        else:
            op = make_operator(
                "matrix-free",
                1.0,
                X=X,
                kernel=kern,
                block_size=OutOfCoreStore(cv).block_size(X.shape[0]),
            )
        shifts = np.array([[cv._shift(a, len(tr)) for tr, _ in splits] for a in alphas_s])
        pf = cg_fold_predictions(
            op,
            y2,
            [tr for tr, _ in splits],
            [te for _, te in splits],
            shifts,
            preconditioner=cv.preconditioner,
            rank=cv.rank,
            tol=cv.tol,
            max_iter=cv.max_iter,
            random_state=cv.random_state if cv.random_state is not None else 0,
            stats=stats,
        )
        return [[pf[f][li] for f in range(len(splits))] for li in range(len(alphas_s))]
