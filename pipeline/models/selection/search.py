"""``KernelRidgeCV``: exact cross-validated search over λ and kernel parameters.

The expensive work is done once and shared:

- one kernel matrix (in memory) or one stored Gram (out of core) per kernel
  setting, shared by every λ and every fold;
- ``solver="eigen"`` (in memory): one eigendecomposition per kernel setting
  serves every λ and every fold, through the exact leave-group-out formula
  (K-fold, held-out splits) or the exact leave-one-out formula
  (:mod:`pipeline.models.selection.eigen`);
- ``solver="band"`` (in memory): one orthogonal band reduction per (kernel
  setting, training set) serves every λ; each λ then costs a band Cholesky
  (:mod:`pipeline.models.selection.band`). Exact, BLAS-3, any splits; the
  reductions of all settings and folds run as tasks on a thread pool. With
  ``solver="auto"`` each kernel setting is first routed
  (:mod:`pipeline.models.selection.route`): where ``‖K - F Fᵀ‖`` of a rank-r
  Nyström factor predicts preconditioned CG to be cheaper (smooth kernels), the
  setting is solved by CG to a relative residual of 1e-10 instead;
- ``solver="dense"`` (in memory): one Cholesky per (λ, fold) on sub-blocks of
  the shared kernel matrix (scikit-learn's work minus the kernel evaluations);
- ``solver="cholesky"`` (out of core): one tile Cholesky of the full Gram per λ;
  K-fold and leave-one-out residuals come from panels of ``L⁻¹``, with no fold
  factorisation (:mod:`pipeline.models.selection.loo`);
- ``solver="cg"`` (out of core, the default above ``IN_MEMORY_MAX_N`` when
  predicted cheaper than one factorisation per λ): every (λ, fold) system of a
  kernel setting is a column of one block PCG, so each iteration is one
  matrix-free pass of the fused engine for all of them; one Nyström factor
  (``preconditioner="adaptive"``, the default: RPCholesky of adaptive rank) per
  setting, restricted to each fold and shifted per λ; float32 kernel values with
  float64 residual checks (:mod:`pipeline.models.selection.cvblock`); screening
  (``screen_tol``, default 1e-3): every system to 1e-3, then the best λ to ``tol``.
  A solve that does not reach ``tol`` is redone exactly and recorded
  (``unconverged_settings``, ``redone_direct``), never scored; the chosen
  setting is re-scored from float64 solves to 1e-10 (``verified_score``). By default
  (``screen_centers``) the grid is first scored by Nyström KRR and only its finalists
  go through the block CG, in float64 to 1e-10
  (:mod:`~pipeline.models.selection.finalists`).

Work counters are logged and kept in ``search_stats_``.

The class is a front, as scikit-learn's search classes are: it validates the
input and sets the fitted attributes; the work is done by small modules:
:mod:`~pipeline.models.selection.choice` (options, the solver and the checks before
any work), :mod:`~pipeline.models.selection.runner` (the loop over kernel settings:
checkpoints, threads, progress), :mod:`~pipeline.models.selection.strategies` (band,
eigen/dense, Cholesky with LOO, CG path), :mod:`~pipeline.models.selection.scoring`,
:mod:`~pipeline.models.selection.guard` (budget, verification) and
:mod:`~pipeline.models.selection.refit`. Routing and cost models are in
:mod:`pipeline.plan.cv_routing`.
"""

from __future__ import annotations

import copy
import logging
import time
from typing import Any

import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator, MultiOutputMixin, RegressorMixin
from sklearn.metrics import check_scoring
from sklearn.utils.validation import check_is_fitted

from pipeline.engine.progress import with_progress
from pipeline.linalg.band import band_available
from pipeline.models.estimator import KernelRidge
from pipeline.models.selection.choice import (
    CONVENTIONS,
    EIGEN_MODES,
    SOLVERS,
    check_params,
    choose_search,
)
from pipeline.models.selection.finalists import screen_applies, screened_search
from pipeline.models.selection.grid import (
    build_candidates,
    check_alphas,
    check_settings_width,
    make_splits,
    resolve_kernel,
)
from pipeline.models.selection.guard import verify_choice
from pipeline.models.selection.nystrom_cv import nystrom_scores
from pipeline.models.selection.refine import draw_subsample, refine_alpha, refine_wanted
from pipeline.models.selection.refit import refit_best
from pipeline.models.selection.runner import run_search
from pipeline.models.selection.scoring import (
    cv_results,
    log_summary,
    score_candidates,
    target_exponent,
)
from pipeline.options import CvOptions, diagonal_shift
from pipeline.validation import validate_X_y

__all__ = ["CONVENTIONS", "EIGEN_MODES", "SOLVERS", "KernelRidgeCV"]

log = logging.getLogger("pipeline.models.selection")

#: the option tree's defaults of the search knobs (pipeline.options.CvOptions; checked by
#: choice.check_params)
_DEFAULT = CvOptions()


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
        is computed on the pooled held-out predictions. A y far from 1 (largest
        magnitude outside ``[2**-100, 2**100)``, where a scorer's squares underflow
        or overflow) is searched as ``2**k y``, exactly, and the scores are reported
        in y's units (R² unchanged, MSE times ``2**-2k``...; an MSE of order 1e-400
        is then -0.0); with a scorer whose scaling is not known (a callable, names
        outside :data:`pipeline.models.selection.scoring.SCORE_DEGREE`) such a y is
        refused: rescale it.
    lambda_convention : {"sklearn", "n_samples", "n"}, default="sklearn"
        Shift ``K + alpha I``, or ``K + n_train alpha I`` (n_train of each fold;
        ``"n"`` is the run config's name for ``"n_samples"``).
    solver : {"auto", "band", "eigen", "dense", "cholesky", "cg", "nystrom"}, default="auto"
        See the module docstring. "auto": in memory (band, eigen or dense, by a
        cost model) up to ``IN_MEMORY_MAX_N`` rows while the kernel copies fit in
        memory, else "cholesky" with a store, else "cg" (matrix-free). "nystrom":
        Nyström KRR with ``n_centers`` centres (an approximation, never chosen by
        "auto"), every (λ, fold) solved from one pass of sufficient statistics per
        kernel setting and scored by a second pass that predicts the held-out rows
        (:mod:`pipeline.models.selection.nystrom_cv`); scoring None,
        "r2", "neg_mean_squared_error" or "neg_root_mean_squared_error"; the refit is
        ``KernelRidge(solver="nystrom")`` with the same centres.
    gamma, degree, coef0 : optional
        Kernel parameters when ``kernel`` is a name (as scikit-learn).
    block_size : int, default=None
        Tile size for the out-of-core solvers (default 2048, at most n).
    store : str or path, default=None
        Zarr store for the out-of-core solvers (Gram and factor arrays). One
        search at a time per store: its arrays have fixed names, so concurrent
        searches on one store (clones in ``cross_val_score(..., n_jobs=2)``)
        fail; give each its own store (``KernelRidge(store=...)`` keys each fit
        by its content and shares one store safely).
    eigen_mode : {"auto", "lgo", "fold"}, default="auto"
        ``"lgo"``: one eigendecomposition of the full K and the exact
        leave-group-out formula; ``"fold"``: one of each fold's training Gram.
    refit : bool, default=True
        Refit ``best_estimator_`` (a :class:`pipeline.KernelRidge`) on all data.
    tol, max_iter, preconditioner, rank : CG options
        Relative tolerance, iteration cap, "adaptive" (the default: RPCholesky, its rank
        grown until it resolves K at the grid's smallest shift, capped by
        ``max(256, 3 n^(2/3))`` and a memory budget), "nystrom" (a fixed rank, default
        200; the default before issue #45) or "none", and the rank (a cap for "adaptive").
        The search knobs' defaults and checks are those of
        :class:`pipeline.options.CvOptions`.
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
    screen_tol, screen_top : float or None, int, default=1e-3, 3
        ``solver="cg"``: solve every (λ, fold) system to the float64 relative
        residual ``screen_tol`` first, then only the ``screen_top`` best λ of each
        kernel setting on to ``tol``; the other λ keep their screening scores (their
        error: docs/PERFORMANCE.md#model-selection; the chosen setting is verified
        from float64 solves to 1e-10 either way). ``screen_tol=None`` turns screening
        off (every system to ``tol``). The other solvers are exact and ignore both.
    screen_centers : int or None, default=1000
        ``solver="cg"`` (also as ``"auto"`` picks it): first score every candidate by
        Nyström KRR on this many RPCholesky centres (one pass of statistics per kernel
        setting, :mod:`~pipeline.models.selection.nystrom_cv`), then solve exactly, by
        float64 block PCG to 1e-10, only the ``screen_top`` best candidates plus, for
        each of their kernel settings, the next λ below its smallest (Nyström's pick
        tends to a larger λ than the exact one), and further down the grid while a
        setting's best exact λ is its smallest solved; a kernel setting without a
        finalist whose Nyström scores could still rise past the best exact one is
        solved too (:func:`~pipeline.models.selection.finalists.unresolved`).
        ``best_*`` come from the exact scores; ``cv_results_["screened"]`` is True
        where a score is Nyström's.
        scikit-learn's ``HalvingGridSearchCV`` mixes fidelities the same way. None
        scores every candidate exactly. Splits whose training sets are not the
        complement of disjoint test sets, and scorers other than R² and (root) mean
        squared error, are searched without it (logged).
    checkpoint : str or path, default=None
        A directory where each finished kernel setting's held-out predictions are
        recorded (atomic, checksummed, fingerprinted:
        :mod:`pipeline.models.selection.checkpoint`); a restarted search reuses
        them. Not used by ``solver="band"`` (all settings at once, in memory).
    subsample : int, default=None
        Run the grid search on this many training rows, a uniform subsample seeded by
        ``random_state`` (None: 0), at least two per fold; None (or at least n): all
        rows. ``cv`` is cut on the subsample. The refit uses all rows.
    refine : bool, default=None
        Refine λ on all rows after the search (None: when a subsample was drawn): for
        the chosen kernel setting, λ times 1/16, 1/8, 1/4, 1/2, 1, 2 and 4 are scored
        at the full N: by exact leave-one-out from one eigendecomposition up to 1,000 rows,
        else on one held-out split of all rows (``1/folds`` of them; in memory one
        Cholesky and CG preconditioned with it, else the search's block CG)
        (:mod:`pipeline.models.selection.refine`). ``best_alpha_`` and
        ``best_params_["alpha"]`` are then the refined λ (the subsample's is in
        ``refine_results_``); ``cv_results_`` stays the subsample's grid.
        Not with ``solver="nystrom"`` (True is refused, None does not refine).
    n_centers : int, default=None
        ``solver="nystrom"``: the number of centres M (None: 1000, at most the rows
        searched). The search holds (folds + 1) M x M float64 matrices.
    centers : {"uniform", "rpcholesky"}, default="uniform"
        ``solver="nystrom"``: how the centres are chosen (seeded by ``random_state``,
        None: 0), once per kernel setting from all the rows searched.

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
        The same counters, typed (:class:`pipeline.models.selection.stats.SearchStats`).
    subsample_indices_ : ndarray or None
        The rows the grid search ran on (None: all).
    refine_results_ : dict or None
        The λ refinement (None: not refined): ``alphas`` and ``scores`` (the curve at
        the full N), ``alpha`` (kept), ``subsample_alpha``, ``method``, ``n_train``,
        ``seconds``, ``at_edge``; with ``refit=True`` also ``refit_seconds`` and
        ``cost_ratio`` (its seconds over the refit's: one exact fit).
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
        solver: str = _DEFAULT.solver,
        gamma: float | None = None,
        degree: float = 3,
        coef0: float = 1,
        block_size: int | None = None,
        store: Any = None,
        eigen_mode: str = _DEFAULT.eigen_mode,
        refit: bool = True,
        tol: float = _DEFAULT.tol,
        max_iter: int | None = _DEFAULT.max_iter,
        preconditioner: str = _DEFAULT.preconditioner,
        rank: int | None = _DEFAULT.rank,
        n_jobs: int | None = _DEFAULT.n_jobs,
        random_state: Any = None,
        progress: bool | str = False,
        kernel_dtype: str = _DEFAULT.kernel_dtype,
        max_search_seconds: float | None = _DEFAULT.max_search_seconds,
        checkpoint: Any = None,
        screen_tol: float | None = _DEFAULT.screen_tol,
        screen_top: int = _DEFAULT.screen_top,
        screen_centers: int | None = _DEFAULT.screen_centers,
        subsample: int | None = _DEFAULT.subsample,
        refine: bool | None = _DEFAULT.refine,
        n_centers: int | None = _DEFAULT.n_centers,
        centers: str = _DEFAULT.centers,
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
        self.screen_centers = screen_centers
        self.subsample = subsample
        self.refine = refine
        self.n_centers = n_centers
        self.centers = centers

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True  # sparse X is densified, as KernelRidge's kernels do
        return tags

    def _shift(self, alpha: float, n_train: int) -> float:
        """The diagonal shift of ``alpha`` for a training set of ``n_train`` rows."""
        return diagonal_shift(float(alpha), n_train, self.lambda_convention)

    @with_progress
    def fit(self, X: Any, y: Any, groups: Any = None) -> KernelRidgeCV:
        """Run the search, then refit the best model on all of ``X, y``.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        y : array-like of shape (n_samples,) or (n_samples, n_targets)
        groups : array-like of shape (n_samples,), optional
            Group labels for a group splitter ``cv`` (``GroupKFold``...), as in
            scikit-learn's ``GridSearchCV.fit``.

        Returns
        -------
        self
        """
        t_start = time.perf_counter()
        check_params(self)
        alphas = check_alphas(self.alphas)
        base = resolve_kernel(self.kernel, self.gamma, self.degree, self.coef0)
        candidates, settings = build_candidates(alphas, self.param_grid, base)
        X, y = validate_X_y(self, X, y)
        check_settings_width(base, settings, X.shape[1])
        if sp.issparse(X):
            X = X.toarray()
        n = X.shape[0]
        if n < 2:
            raise ValueError(
                f"KernelRidgeCV needs at least 2 samples to cross-validate, got n_samples={n}; "
                "pass more rows, or fit pipeline.KernelRidge with a fixed alpha"
            )
        # a subsample for the grid search (the refinement and the refit use all rows)
        X_all, y_all = X, y
        self.subsample_indices_ = None
        if self.subsample is not None and int(self.subsample) < n:
            idx = draw_subsample(n, int(self.subsample), self.random_state)
            self.subsample_indices_ = idx
            X, y = X[idx], y[idx]
            groups = None if groups is None else np.asarray(groups)[idx]
            n = X.shape[0]
            log.info("grid search on a subsample of %d of %d rows", n, X_all.shape[0])
        # y far from 1: the search runs on 2**k y, exactly (target_exponent)
        k, back = target_exponent(y, self.scoring)
        splits, kind = make_splits(self.cv, X, y, self.random_state, groups)
        if np.any(k):  # (one exponent per column for R² of a multi-output y)
            y = np.ldexp(y, k)
        y2 = y.reshape(n, -1)
        scorer = check_scoring(
            KernelRidge(), scoring="r2" if self.scoring is None else self.scoring
        )
        choice = choose_search(
            self, n, kind, splits, n_alpha=len(alphas), n_settings=len(settings),
            n_targets=y2.shape[1], band_available=band_available,
        )  # fmt: skip
        self.solver_ = solver = choice.solver
        screened = None  # (the Nyström screen's scores and the finalists' exact ones)
        if screen_applies(self, solver, kind, n, splits, len(candidates)):
            scores, screened, stats = screened_search(
                self, choice, X, y, y2, base, settings, candidates, splits, kind, scorer
            )
        else:
            results, stats = run_search(
                self, choice, X, y, y2, base, settings, candidates, splits, kind, scorer
            )
            if solver == "nystrom":  # scored from the statistics, no held-out predictions
                scores = nystrom_scores(results, candidates, settings, splits, kind, self.scoring)
            else:
                scores = score_candidates(results, candidates, settings, splits, kind, scorer, X, y)
        t_search = time.perf_counter() - t_start
        self.cv_results_ = cv_results(candidates, scores, t_search, back=back, screened=screened)
        self.best_index_ = int(self.cv_results_["rank_test_score"].argmin())
        self.best_params_ = dict(candidates[self.best_index_])
        self.best_score_ = float(self.cv_results_["mean_test_score"][self.best_index_])
        self.best_alpha_ = float(self.best_params_["alpha"])
        self.n_splits_ = len(splits)
        self.cv_kind_ = kind
        self.scorer_ = scorer
        stats["seconds"]["search"] = round(t_search, 4)
        if screened is not None:  # the finalists' solves are the verification's
            stats["verified_score"] = self.best_score_
            stats["verified_score_difference"] = 0.0
        elif solver == "cg" and kind != "loo":
            verify_choice(self, X, y, y2, base, splits, scorer, stats, back=back)
        self.refine_results_ = None
        if solver != "nystrom" and refine_wanted(self.refine, self.subsample_indices_ is not None):
            kern = copy.deepcopy(base).set_params(
                **{p: v for p, v in self.best_params_.items() if p != "alpha"}
            )
            self.refine_results_ = refine_alpha(self, X_all, y_all, kern)
            self.best_alpha_ = float(self.refine_results_["alpha"])
            self.best_params_["alpha"] = self.best_alpha_
            stats["seconds"]["refine"] = self.refine_results_["seconds"]
        if self.refit:
            t0 = time.perf_counter()
            self.best_estimator_ = refit_best(self, X_all, y_all, base, stats, settings)
            self.n_iter_ = int(getattr(self.best_estimator_, "n_iter_", 1))
            stats["seconds"]["refit"] = round(time.perf_counter() - t0, 4)
            if self.refine_results_ is not None:  # its cost in exact fits
                r = self.refine_results_
                r["refit_seconds"] = stats["seconds"]["refit"]
                r["cost_ratio"] = round(r["seconds"] / max(r["refit_seconds"], 1e-9), 3)
        if self.refine_results_ is not None:
            stats["refine"] = dict(self.refine_results_)
        stats["seconds"]["total"] = round(time.perf_counter() - t_start, 4)
        self.search_stats_ = stats.to_dict()
        self.search_statistics_ = stats
        log_summary(
            solver, len(candidates), len(splits), stats, self.best_params_, self.best_score_
        )
        return self

    @with_progress
    def predict(self, X: Any) -> np.ndarray:
        """Predict with ``best_estimator_``."""
        check_is_fitted(self, "best_estimator_")
        return self.best_estimator_.predict(X)
