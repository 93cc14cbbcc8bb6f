"""``KernelRidgeCV``: exact cross-validated search over λ and kernel parameters.

The expensive work is done once and shared:

- one kernel matrix (in memory) or one stored Gram (out of core) per kernel
  setting, shared by every λ and every fold;
- ``solver="eigen"`` (in memory): one eigendecomposition per kernel setting
  serves every λ and every fold, through the exact leave-group-out formula
  (K-fold, held-out splits) or the exact leave-one-out formula
  (:mod:`pipeline.model_selection.eigen`);
- ``solver="band"`` (in memory): one orthogonal band reduction per (kernel
  setting, training set) serves every λ; each λ then costs a band Cholesky
  (:mod:`pipeline.model_selection.band`). Exact, BLAS-3, any splits; the
  reductions of all settings and folds run as tasks on a thread pool. With
  ``solver="auto"`` each kernel setting is first routed
  (:mod:`pipeline.model_selection.route`): where ``‖K - F Fᵀ‖`` of a rank-r
  Nyström factor predicts preconditioned CG to be cheaper (smooth kernels), the
  setting is solved by CG to a relative residual of 1e-10 instead;
- ``solver="dense"`` (in memory): one Cholesky per (λ, fold) on sub-blocks of
  the shared kernel matrix (scikit-learn's work minus the kernel evaluations);
- ``solver="cholesky"`` (out of core): one tile Cholesky of the full Gram per λ;
  K-fold and leave-one-out residuals come from panels of ``L⁻¹``, with no fold
  factorisation (:mod:`pipeline.model_selection.loo`);
- ``solver="cg"`` (out of core, the default above ``IN_MEMORY_MAX_N`` when
  predicted cheaper than one factorisation per λ): every (λ, fold) system of a
  kernel setting is a column of one block PCG, so each iteration is one
  matrix-free pass of the fused engine for all of them; one adaptive Nyström
  factor per setting, restricted to each fold and shifted per λ; float32 kernel
  values with float64 residual checks (:mod:`pipeline.model_selection.cvblock`).
  A solve that does not reach ``tol`` is redone exactly and recorded
  (``unconverged_settings``, ``redone_direct``), never scored; the chosen
  setting is re-scored from float64 solves to 1e-10 (``verified_score``).

Work counters are logged and kept in ``search_stats_``.
"""

from __future__ import annotations

import copy
import logging
import os
import time
from typing import Any

import numpy as np
import scipy.sparse as sp
from scipy.stats import rankdata
from sklearn.base import BaseEstimator, MultiOutputMixin, RegressorMixin
from sklearn.metrics import check_scoring
from sklearn.utils.validation import check_is_fitted

from pipeline.estimator import KernelRidge
from pipeline.model_selection.grid import (
    build_candidates,
    check_alphas,
    make_splits,
    resolve_kernel,
)
from pipeline.model_selection.guard import FixedPredictions as _FixedPredictions
from pipeline.model_selection.guard import check_budget, screen_refiner, verify_choice
from pipeline.model_selection.refit import IN_MEMORY, refit_best
from pipeline.model_selection.stats import SearchStats, merge_stats, new_stats
from pipeline.model_selection.strategies import (
    BandStrategy,
    CGPathStrategy,
    CholeskyStrategy,
    InMemoryStrategy,
    OutOfCoreStore,
)
from pipeline.policy.constants import (
    CV_TOL,
)
from pipeline.policy.cv_routing import choose_cv_solver, eigen_mode, memory_need
from pipeline.progress import open_progress, with_progress
from pipeline.solvers.band import band_available
from pipeline.validation import validate_X_y

__all__ = ["KernelRidgeCV"]

log = logging.getLogger("pipeline.model_selection")

SOLVERS = ("auto", "band", "eigen", "dense", "cholesky", "cg")
CONVENTIONS = ("sklearn", "n_samples", "n")
EIGEN_MODES = ("auto", "lgo", "fold")
# calibrated constants of the search's routing live in pipeline.policy.constants


_new_stats, _merge_stats = new_stats, merge_stats  # the names this module used


class KernelRidgeCV(MultiOutputMixin, RegressorMixin, BaseEstimator):
    """Kernel ridge regression with λ and kernel parameters chosen by cross-validation.

    Parameters
    ----------
    alphas : array-like of float, default=(0.1, 1.0, 10.0)
        Ridge penalties to search (all > 0). Cheap to make long: the expensive
        work of a kernel setting is shared by every λ.
    kernel : str, dict or Kernel, default="rbf"
        A kernel name (scikit-learn's names), a spec dict or a
        :class:`pipeline.kernels.Kernel`.
    param_grid : dict or list of dict, default=None
        Kernel parameters to search, e.g. ``{"gamma": [0.01, 0.1, 1]}``
        (scikit-learn's ``GridSearchCV`` format, without ``alpha``).
    cv : int, float, "loo", splitter or iterable, default=5
        K-fold (int, unshuffled ``KFold`` as scikit-learn), one shuffled
        held-out split (float test fraction), exact leave-one-out (``"loo"``
        or ``LeaveOneOut()``), any scikit-learn splitter, or (train, test) pairs.
    scoring : str or callable, default=None
        A scikit-learn scorer name (e.g. ``"neg_mean_squared_error"``) or a
        scorer; None is R² (``estimator.score``). With leave-one-out the score
        is computed on the pooled held-out predictions.
    lambda_convention : {"sklearn", "n_samples", "n"}, default="sklearn"
        Shift ``K + alpha I``, or ``K + n_train alpha I`` (n_train of each fold;
        ``"n"`` is the run config's name for ``"n_samples"``).
    solver : {"auto", "band", "eigen", "dense", "cholesky", "cg"}, default="auto"
        See the module docstring. "auto": in memory (band, eigen or dense, by a
        cost model) up to ``IN_MEMORY_MAX_N`` rows while the kernel copies fit in
        memory, else "cholesky" with a store, else "cg" (matrix-free).
    gamma, degree, coef0 : optional
        Kernel parameters when ``kernel`` is a name (as scikit-learn).
    block_size : int, default=None
        Tile size for the out-of-core solvers (default 2048, at most n).
    store : str or path, default=None
        Zarr store for the out-of-core solvers (Gram and factor arrays).
    eigen_mode : {"auto", "lgo", "fold"}, default="auto"
        ``"lgo"``: one eigendecomposition of the full K and the exact
        leave-group-out formula; ``"fold"``: one of each fold's training Gram.
    refit : bool, default=True
        Refit ``best_estimator_`` (a :class:`pipeline.KernelRidge`) on all data.
    tol, max_iter, preconditioner, rank : CG options
        Relative tolerance, iteration cap, "nystrom" or "none", Nyström rank.
    n_jobs : int, default=None
        In-memory solvers only. "band": (setting, fold) reductions run
        concurrently (default: one per core, as memory allows); "eigen" and
        "dense": kernel settings processed concurrently (default 1). Threads,
        with BLAS at one thread each.
    random_state : int, default=None
        Seed for a float ``cv`` and the Nyström pivots.
    progress : bool or {"auto", "bars", "lines", "off"}, default=False
        Show the search's progress (one step per kernel setting) and the
        refit's on stderr; see :class:`pipeline.KernelRidge`.
    kernel_dtype : {"auto", "float32", "float64"}, default="auto"
        ``solver="cg"``: dtype of the kernel values in the inner CG solves ("auto":
        float32); residuals are always recomputed with float64 products, so every
        system still reaches ``tol`` in float64.
    max_search_seconds : float, default=None
        Refuse, before any work, a grid whose predicted cost exceeds this many
        seconds (the error gives the prediction and a smaller grid).
    screen_tol, screen_top : float or None, int, default=None, 3
        ``solver="cg"``: solve every (λ, fold) system to the float64 relative
        residual ``screen_tol`` (e.g. 1e-3) first, then only the ``screen_top`` best
        λ of each kernel setting on to ``tol``; the other λ keep their screening
        scores (measured error on diamonds: below 1e-4 in R²; the chosen setting is
        verified from float64 solves to 1e-10 either way).
    checkpoint : str or path, default=None
        A directory where each finished kernel setting's held-out predictions are
        recorded (atomic, checksummed, fingerprinted:
        :mod:`pipeline.model_selection.checkpoint`); a restarted search reuses
        them. Not used by ``solver="band"`` (all settings at once, in memory).

    Attributes
    ----------
    best_params_ : dict
    best_score_ : float
    best_index_ : int
    best_alpha_ : float
    cv_results_ : dict of arrays (scikit-learn's layout)
    best_estimator_ : pipeline.KernelRidge
    n_splits_ : int
    solver_ : str
    n_iter_ : int
        The refit's iterations (1 for a direct solve, CG iterations for ``"cg"``);
        only with ``refit=True``.
    search_stats_ : dict
        Work counters: kernel matrices, Gram tiles built/reused,
        eigendecompositions, factorisations, CG iterations, seconds per phase.
    search_statistics_ : SearchStats
        The same counters, typed (:class:`pipeline.model_selection.stats.SearchStats`).
    """

    def __init__(
        self,
        alphas: Any = (0.1, 1.0, 10.0),
        *,
        kernel: Any = "rbf",
        param_grid: Any = None,
        cv: Any = 5,
        scoring: Any = None,
        lambda_convention: str = "sklearn",
        solver: str = "auto",
        gamma: float | None = None,
        degree: float = 3,
        coef0: float = 1,
        block_size: int | None = None,
        store: Any = None,
        eigen_mode: str = "auto",
        refit: bool = True,
        tol: float = CV_TOL,
        max_iter: int | None = None,
        preconditioner: str = "nystrom",
        rank: int | None = None,
        n_jobs: int | None = None,
        random_state: Any = None,
        progress: bool | str = False,
        kernel_dtype: str = "auto",
        max_search_seconds: float | None = None,
        checkpoint: Any = None,
        screen_tol: float | None = None,
        screen_top: int = 3,
    ) -> None:
        self.alphas = alphas
        self.kernel = kernel
        self.param_grid = param_grid
        self.cv = cv
        self.scoring = scoring
        self.lambda_convention = lambda_convention
        self.solver = solver
        self.gamma = gamma
        self.degree = degree
        self.coef0 = coef0
        self.block_size = block_size
        self.store = store
        self.eigen_mode = eigen_mode
        self.refit = refit
        self.tol = tol
        self.max_iter = max_iter
        self.preconditioner = preconditioner
        self.rank = rank
        self.n_jobs = n_jobs
        self.random_state = random_state
        self.progress = progress
        self.kernel_dtype = kernel_dtype
        self.max_search_seconds = max_search_seconds
        self.checkpoint = checkpoint
        self.screen_tol = screen_tol
        self.screen_top = screen_top

    # ------------------------------------------------------------------ checks
    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True  # sparse X is densified, as KernelRidge's kernels do
        return tags

    def _check_params(self) -> None:
        for name, value, allowed in (
            ("solver", self.solver, SOLVERS),
            ("lambda_convention", self.lambda_convention, CONVENTIONS),
            ("eigen_mode", self.eigen_mode, EIGEN_MODES),
        ):
            if value not in allowed:
                raise ValueError(f"{name}={value!r} is not valid; choose one of {allowed}")
        if self.solver in ("cholesky",) and self.store is None:
            raise ValueError(
                f"solver={self.solver!r} needs store= (a directory or fsspec URL for the Gram "
                "and factor arrays)"
            )

    def _shift(self, alpha: float, n_train: int) -> float:
        return float(alpha) * (n_train if self.lambda_convention in ("n_samples", "n") else 1.0)

    def _band_workers(self, n: int, n_tasks: int) -> int:
        """Concurrent band reductions: ``n_jobs``, else one per core as memory allows
        (each holds one training-set copy; up to two kernel matrices are in flight)."""
        from pipeline.reference.memory import SAFETY_FRACTION, available_memory

        if self.n_jobs:
            return max(1, int(self.n_jobs))
        try:
            cores = len(os.sched_getaffinity(0))
        except AttributeError:  # pragma: no cover - not Linux
            cores = os.cpu_count() or 1
        workers = max(1, min(cores, n_tasks))
        budget = available_memory() * SAFETY_FRACTION
        while workers > 1 and (2 + workers) * n * n * 8 > budget:
            workers -= 1
        return workers

    def _memory_need(self, solver: str, n: int, band_workers: int) -> int:
        return memory_need(solver, n, band_workers, self.n_jobs)

    def _choose_solver(
        self, n: int, kind: str, n_alpha: int, splits: list, band_workers: int = 1
    ) -> str:
        from pipeline.reference.memory import check_dense_memory

        if self.solver == "band":
            if kind == "loo":
                raise ValueError(
                    "solver='band' does one reduction per split; for cv='loo' use "
                    "solver='eigen' (exact leave-one-out from one eigendecomposition)"
                )
            if not band_available():
                raise RuntimeError(
                    "solver='band' needs LAPACK dsytrd_sy2sb from SciPy's bundled OpenBLAS, "
                    "which was not found here; use solver='eigen' or 'dense'"
                )
        if self.solver in IN_MEMORY:
            check_dense_memory(
                self._memory_need(self.solver, n, band_workers),
                what=f"KernelRidgeCV(solver={self.solver!r}) with n={n}",
            )
            return self.solver
        if self.solver != "auto":
            return self.solver

        def fits(nbytes: int) -> bool:
            try:
                check_dense_memory(nbytes, what="")
            except MemoryError:
                return False
            return True

        return choose_cv_solver(
            n,
            kind,
            n_alpha,
            splits,
            fits=fits,
            band_ok=kind != "loo" and band_available(),
            has_store=self.store is not None,
            band_workers=band_workers,
            n_jobs=self.n_jobs,
            eigen_requested=self.eigen_mode,
        )

    def _eigen_mode(self, n: int, kind: str, n_alpha: int, splits: list) -> str:
        return eigen_mode(n, kind, n_alpha, splits, self.eigen_mode)

    # -------------------------------------------------------------------- fit
    @with_progress
    def fit(self, X: Any, y: Any) -> KernelRidgeCV:
        """Run the search, then refit the best model on all of ``X, y``.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        y : array-like of shape (n_samples,) or (n_samples, n_targets)

        Returns
        -------
        self
        """
        t_start = time.perf_counter()
        self._check_params()
        alphas = check_alphas(self.alphas)
        base = resolve_kernel(self.kernel, self.gamma, self.degree, self.coef0)
        candidates, settings = build_candidates(alphas, self.param_grid, base)
        X, y = validate_X_y(self, X, y)
        if sp.issparse(X):
            X = X.toarray()
        n = X.shape[0]
        if n < 2:
            raise ValueError(
                f"KernelRidgeCV needs at least 2 samples to cross-validate, got n_samples={n}; "
                "pass more rows, or fit pipeline.KernelRidge with a fixed alpha"
            )
        y2 = y.reshape(n, -1)
        splits, kind = make_splits(self.cv, X, y, self.random_state)
        scorer = check_scoring(
            KernelRidge(), scoring="r2" if self.scoring is None else self.scoring
        )
        alpha_list = [float(a) for a in alphas]
        band_workers = self._band_workers(n, len(settings) * len(splits))
        solver = self._choose_solver(n, kind, len(alpha_list), splits, band_workers)
        if solver == "cg" and kind == "loo":
            raise ValueError(
                "cv='loo' needs solver='eigen' (in memory) or 'cholesky' (exact LOO from the "
                "factor); CG cannot give diag((K + lambda I)^-1) exactly"
            )
        if solver == "cholesky" and kind == "splits":
            raise ValueError(
                f"solver='cholesky' needs splits whose training set is the complement of the "
                f"test set (K-fold, held-out, LOO); cv={self.cv!r} is not; use solver='cg' or "
                "an in-memory solver"
            )
        predicted = check_budget(
            self.max_search_seconds, solver, n, len(alpha_list), len(settings), splits,
            n_targets=y2.shape[1], kind=kind,
        )  # fmt: skip
        stats = _new_stats()
        stats.update(kernel_settings=len(settings), candidates=len(candidates), folds=len(splits))
        stats["predicted_search_seconds"] = round(predicted, 3)
        self.solver_ = solver
        self._settings = settings

        self._screen_fn = None
        if solver == "cg" and self.screen_tol is not None:
            self._screen_fn = screen_refiner(X, y, splits, scorer, int(self.screen_top))
        ckpt = None
        if self.checkpoint is not None:
            from pipeline.model_selection.checkpoint import SettingCheckpoint

            ckpt = SettingCheckpoint.for_search(self, solver, kind, X, y2, splits)

        # predictions per (setting, alpha): list over folds (or one pooled array for LOO)
        def run_setting(si: int) -> tuple[dict[float, list[np.ndarray]], dict[str, Any]]:
            # counters per setting (merged afterwards: settings may run in threads)
            stats = _new_stats()
            kern = copy.deepcopy(base).set_params(**settings[si])
            alphas_s = [c["alpha"] for c in candidates if c.kernel_params == settings[si]]
            alphas_s = list(dict.fromkeys(alphas_s))
            if ckpt is not None:
                done = ckpt.load(si, kern, settings[si], alphas_s)
                if done is not None:
                    stats["settings_resumed"] = 1
                    log.info("kernel setting %d/%d %s: resumed from its checkpoint", si + 1,
                             len(settings), settings[si])  # fmt: skip
                    return done, stats
            t0 = time.perf_counter()
            if solver in ("eigen", "dense"):
                preds = self._in_memory_setting(solver, X, y2, kern, splits, kind, alphas_s, stats)
            elif solver == "cholesky":
                preds = self._cholesky_setting(si, X, y2, kern, splits, kind, alphas_s, stats)
            else:
                preds = self._cg_setting(si, X, y2, kern, splits, alphas_s, stats)
            dt = time.perf_counter() - t0
            stats["seconds"][f"setting_{si}"] = round(dt, 4)
            log.info("kernel setting %d/%d %s: %.2f s", si + 1, len(settings), settings[si], dt)
            out = {a: p for a, p in zip(alphas_s, preds)}
            if ckpt is not None:
                ckpt.save(si, kern, settings[si], alphas_s, out, dt)
            shown.update()
            return out, stats

        shown = open_progress(f"cv ({solver})", len(settings), "kernel setting")
        if solver == "band":
            outputs = self._band_settings(
                X, y2, base, settings, candidates, splits, band_workers, self.solver == "auto"
            )
        elif self.n_jobs and int(self.n_jobs) > 1 and solver in ("eigen", "dense"):
            from concurrent.futures import ThreadPoolExecutor

            from pipeline.parallel import blas_threads

            with blas_threads(1):
                with ThreadPoolExecutor(max_workers=int(self.n_jobs)) as pool:
                    outputs = list(pool.map(run_setting, range(len(settings))))
        else:
            outputs = [run_setting(si) for si in range(len(settings))]
        shown.update_to(len(settings))
        shown.close()
        results = [r for r, _ in outputs]
        for _, st in outputs:
            _merge_stats(stats, st)
        t_search = time.perf_counter() - t_start

        # ---------------------------------------------------------------- scores
        n_scored = 1 if kind == "loo" else len(splits)
        scores = np.empty((len(candidates), n_scored))
        for ci, c in enumerate(candidates):
            preds = results[settings.index(c.kernel_params)][c["alpha"]]
            for f in range(n_scored):
                te = np.arange(n) if kind == "loo" else splits[f][1]
                p = preds[f]
                p = p[:, 0] if y.ndim == 1 else p
                scores[ci, f] = scorer(_FixedPredictions(p), X[te], y[te])
        self.cv_results_ = self._results(candidates, scores, t_search)
        self.best_index_ = int(self.cv_results_["rank_test_score"].argmin())
        self.best_params_ = dict(candidates[self.best_index_])
        self.best_score_ = float(self.cv_results_["mean_test_score"][self.best_index_])
        self.best_alpha_ = float(self.best_params_["alpha"])
        self.n_splits_ = len(splits)
        self.cv_kind_ = kind
        self.scorer_ = scorer
        stats["seconds"]["search"] = round(t_search, 4)
        if solver == "cg" and kind != "loo":
            self._verify(X, y, y2, base, splits, scorer, stats)
        if self.refit:
            t0 = time.perf_counter()
            self.best_estimator_ = self._refit(X, y, base, stats)
            self.n_iter_ = int(getattr(self.best_estimator_, "n_iter_", 1))
            stats["seconds"]["refit"] = round(time.perf_counter() - t0, 4)
        stats["seconds"]["total"] = round(time.perf_counter() - t_start, 4)
        self.search_stats_ = stats
        self.search_statistics_ = SearchStats.from_dict(stats)
        log.info(
            "KernelRidgeCV(%s): %d candidates x %d folds; kernel matrices %d, Gram tiles built "
            "%d (reused %d), eigendecompositions %d, band reductions %d, factorisations %d, "
            "CG iterations %d; "
            "best %s score %.6g; %.2f s",
            solver,
            len(candidates),
            len(splits),
            stats["kernel_matrices"],
            stats["gram_tiles_built"],
            stats["gram_tiles_reused"],
            stats["eigendecompositions"],
            stats["band_reductions"],
            stats["factorizations"],
            stats["cg_iterations"],
            self.best_params_,
            self.best_score_,
            stats["seconds"]["total"],
        )
        return self

    # --------------------------------------------------------------- results
    def _results(self, candidates: list, scores: np.ndarray, seconds: float) -> dict[str, Any]:
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
        filled = np.where(
            np.isnan(mean), np.nanmin(mean) - 1 if np.isfinite(mean).any() else 0, mean
        )
        res["rank_test_score"] = rankdata(-filled, method="min").astype(np.int32)
        per = seconds / max(1, len(candidates))
        res["mean_fit_time"] = np.full(len(candidates), per)
        res["std_fit_time"] = np.zeros(len(candidates))
        return res

    # ------------------------------------------------------------ strategies
    def _band_settings(self, X, y2, base, settings, candidates, splits, workers, route: bool):
        return BandStrategy(self).run(X, y2, base, settings, candidates, splits, workers, route)

    def _in_memory_setting(self, solver, X, y2, kern, splits, kind, alphas_s, stats):
        return InMemoryStrategy(self).setting(solver, X, y2, kern, splits, kind, alphas_s, stats)

    def _block_size(self, n: int) -> int:
        return OutOfCoreStore(self).block_size(n)

    def _gram(self, si: int, X, kern, stats):
        return OutOfCoreStore(self).gram(si, X, kern, stats)

    def _factor(self, gram, shift: float, stats):
        return OutOfCoreStore(self).factor(gram, shift, stats)

    def _cholesky_setting(self, si, X, y2, kern, splits, kind, alphas_s, stats):
        return CholeskyStrategy(self).setting(si, X, y2, kern, splits, kind, alphas_s, stats)

    def _cg_setting(self, si, X, y2, kern, splits, alphas_s, stats):
        return CGPathStrategy(self).setting(si, X, y2, kern, splits, alphas_s, stats)

    def _verify(self, X, y, y2, base, splits, scorer, stats) -> None:
        verify_choice(self, X, y, y2, base, splits, scorer, stats)

    # ------------------------------------------------------------------ refit
    def _refit(self, X, y, base, stats) -> KernelRidge:
        return refit_best(self, X, y, base, stats)

    # -------------------------------------------------------------- predict
    @with_progress
    def predict(self, X: Any) -> np.ndarray:
        """Predict with ``best_estimator_``."""
        check_is_fitted(self, "best_estimator_")
        return self.best_estimator_.predict(X)
