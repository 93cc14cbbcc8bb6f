"""``pipeline.KernelRidge``: a drop-in for ``sklearn.kernel_ridge.KernelRidge``.

On the in-memory path (``solver="auto"``, ``"dense"`` or ``"primal"``) it
accepts what scikit-learn's KernelRidge accepts (kernel names, callables,
``"precomputed"``, sparse CSR/CSC X, multi-output y, ``sample_weight``,
per-target alpha, alpha = 0 with the least-squares fallback and its warning)
and returns the same predictions, plus kernel objects from
:mod:`pipeline.kernels`, the ``K + n alpha I`` penalty convention, a primal
solve for the linear kernel and a memory guard. The out-of-core solvers
(``"cholesky"``, ``"cg"``) plug in through :meth:`KernelRidge._fit_out_of_core`
without changing the public signature.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator, MultiOutputMixin, RegressorMixin
from sklearn.metrics.pairwise import pairwise_kernels
from sklearn.utils.validation import check_is_fitted

from pipeline.engine.backend import cuda_available, get_backend, resolve_device
from pipeline.engine.dense import kernel_matrix, kernel_predict
from pipeline.engine.evaluators import evaluation_identity
from pipeline.engine.progress import with_progress
from pipeline.fit import (
    execute,
    fit_nystrom,
    fit_out_of_core,
    fit_store_path,
    log_plan,
    measure_resources,
    row_probes,
    weighted_problem,
)
from pipeline.kernels import Linear, kernel_fingerprint, spec_round_trips
from pipeline.linalg.dense_dual import effective_alpha
from pipeline.linalg.dense_memory import check_dense_memory, dense_dual_bytes, primal_bytes
from pipeline.linalg.predict_model import predict_in_memory
from pipeline.models.artifact import load_artifact
from pipeline.models.kernel_estimator import KernelParamsMixin
from pipeline.models.model_io import estimator_state, fitted_model, save_model
from pipeline.options import (
    ALPHA_CONVENTIONS,
    OUT_OF_CORE_SOLVERS,
    SolverOptions,
    knobs,
    named_knobs,
    solver_choices,
    spelt_as_before,
)
from pipeline.plan.fit_plan import plan_fit
from pipeline.storage import fingerprint_blocks
from pipeline.storage.location import set_storage_options, url_scheme
from pipeline.validation import (
    check_alpha,
    check_choice,
    check_option,
    check_positive_int,
    check_random_seed,
    check_sample_weight,
    validate_X_predict,
    validate_X_y,
)

log = logging.getLogger(__name__)

#: the solver knobs of the option tree that KernelRidge takes (pipeline.options.SolverOptions):
#: their defaults and checks are the tree's (None for a knob the estimators leave unset)
SOLVER_PARAMS = knobs(spelt_by="estimator")
_DEFAULT = SolverOptions()
_dense = lambda X: X.toarray() if sp.issparse(X) else X  # noqa: E731


class KernelRidge(KernelParamsMixin, MultiOutputMixin, RegressorMixin, BaseEstimator):
    """Exact kernel ridge regression, scikit-learn compatible.

    Solves ``(K + lam I) dual_coef = y`` and predicts ``K(X, X_fit) dual_coef``.

    Parameters
    ----------
    alpha : float or array-like of shape (n_targets,), default=1.0
        Ridge penalty (>= 0), one value or one per target. 0 follows
        scikit-learn: Cholesky if K is positive definite, else a least-squares
        solution with the warning "Singular matrix in solving dual problem".
    kernel : str, Kernel, dict or callable, default="linear"
        A scikit-learn kernel name (``"linear"``, ``"poly"``/``"polynomial"``,
        ``"rbf"``, ``"laplacian"``, ``"sigmoid"``, ``"cosine"``, ``"chi2"``,
        ``"additive_chi2"``) or any name registered in :mod:`pipeline.kernels`;
        a :class:`pipeline.kernels.Kernel` object or its spec dict;
        ``"precomputed"`` (X is the kernel matrix); or a callable on two rows
        (evaluated through scikit-learn's ``pairwise_kernels``, as scikit-learn does).
    gamma, degree, coef0 : as in scikit-learn
        Forwarded to named kernels that take them; for a spec dict, they fill
        only the parameters the spec leaves out (its own values win); ignored
        otherwise.
    kernel_params : dict, default=None
        Keyword arguments for a callable kernel, ``set_params`` values for a
        Kernel object (applied to a copy), or the parameters of a named kernel
        or spec beyond gamma, degree and coef0 (e.g. ``kernel="matern",
        kernel_params={"nu": 2.5, "length_scale": [1.0, 2.0]}``).
    solver : {"auto", "dense", "primal", "cholesky", "cg", "nystrom"}, default="auto"
        ``"dense"``: exact in-memory dual by Cholesky. ``"primal"``: exact
        in-memory primal ridge (linear kernel only). ``"cholesky"`` and ``"cg"``:
        the out-of-core solvers on a tiled Gram matrix in ``store``. ``"nystrom"``:
        Nyström kernel ridge regression with ``n_centers`` centres, solved by FALKON's
        preconditioned CG (:mod:`pipeline.linalg.nystrom_solve`), an approximation
        used only when named; ``dual_coef_`` and ``X_fit_`` are then the centres'
        coefficients and the centres (n_centers >= n_samples: the exact solver,
        logged). ``"auto"``:
        the fit plan of :func:`pipeline.plan.fit_plan.plan_fit`, logged with its
        reason: without ``store``, the cheaper of primal and dual by the cost model
        n^2 D + n^3/3 vs n D^2 + D^3/3 while the dense dual fits in memory, else
        out of core; with ``store``, out of core by the same rule as ``krr run``.
    alpha_convention : {"sklearn", "n_samples"}, default="sklearn"
        ``"sklearn"`` solves with ``K + alpha I``; ``"n_samples"`` with
        ``K + n alpha I`` (n = number of samples, or the sum of
        ``sample_weight``): the mean-loss objective
        ``(1/n) sum (y - f(x))^2 + alpha ||f||^2``.
    block_size : int, default=None
        Tile size of the out-of-core Gram matrix (None: chosen automatically).
    store : str or path, default=None
        Directory or fsspec URL of the out-of-core Zarr store. Each distinct fit
        writes into its own subdirectory ``store/fit-<fingerprint>``, named by the
        parameters that change the result, the kernel and the content of X, y and
        ``sample_weight`` (``fit_info_["store"]`` names it): clones (GridSearchCV,
        ``cross_val_score``) share one ``store`` without clashing, and fitting the
        same model on the same data again (e.g. after a kill) resumes from its
        completed tiles. Nothing else in ``store`` is read, replaced or deleted.
    storage_options : dict, default=None
        fsspec options for a ``store`` URL (e.g. ``{"client_kwargs": {"endpoint_url":
        ...}, "key": ..., "secret": ...}`` for ``s3://``), registered for this process
        (see ``docs/STORAGE.md``); None: the standard ``AWS_*`` environment variables.
        Never saved with the model.
    tol : float in (0, 1), default=1e-6
        Relative residual tolerance of ``solver="cg"``.
    max_iter : int, default=None
        Iteration limit of ``solver="cg"`` (None: 1000). A solve that stops there
        unconverged warns (``CGConvergenceWarning``, a scikit-learn
        ``ConvergenceWarning``) and keeps its α, as scikit-learn's iterative
        solvers do; ``fit_info_["converged"]`` says so (``krr run`` fails instead).
    preconditioner : {"adaptive", "nystrom", "jacobi", "none"}, default="adaptive"
        Preconditioner of ``solver="cg"``: ``"adaptive"`` grows a randomly pivoted
        Cholesky (Nyström) factor until it resolves K at the shift (CG then needs a
        handful of iterations), ``"nystrom"`` is a fixed rank.
    rank : int, default=None
        Rank of the Nyström preconditioner; for ``"adaptive"`` its cap (None: 500 for
        ``"nystrom"``; for ``"adaptive"`` a cap that grows like N^(2/3), at most 2 GiB
        and a quarter of the free memory).
    matvec : {"auto", "stored", "recompute"}, default="auto"
        How ``solver="cg"`` multiplies by K: from the stored tiles or by
        recomputing kernel tiles on the fly.
    cg_precision : {"auto", "float64", "mixed"}, default="auto"
        Precision of ``solver="cg"``'s products. "mixed" recomputes kernel tiles in
        float32 inside an iterative refinement whose residuals are float64, so the
        answer still meets ``tol`` in float64 (if the float32 products stall, float64
        products take over). "auto": the fit plan's cost model chooses it and
        ``matvec``, and logs why.
    random_state : int, RandomState or None, default=None
        Seed of the Nyström landmarks (out-of-core solvers); None: seed 0.
    factor_dtype : {"float64", "float32", "auto"}, default="float64"
        Precision of the stored factor of ``solver="cholesky"``. "float32"
        halves its bytes and runs the tile updates at float32 speed (diagonal
        tiles are still factored in float64); ``dual_coef_`` is then refined to
        double precision by CG preconditioned with that factor, with matrix-free
        products from X (against the stored float64 Gram when X is not a numpy
        array). "auto": float32 from 10,000 rows when X is a numpy array and a
        subsample says the shift is safe for float32
        (:mod:`pipeline.plan.factor_precision`), else float64; an auto-chosen
        float32 factor that fails is redone in float64.
    keep_gram : bool, default=True
        ``solver="cholesky"``: False factors in place, the factor replacing the
        stored Gram tile by tile: the Gram's disk once instead of twice (each
        alpha is its own fit, in its own subdirectory of ``store``: no Gram is
        shared). With ``factor_dtype="float32"`` the Gram is then float32 (a
        quarter of the disk of a kept float64 Gram and factor), and ``dual_coef_``
        is refined to double precision with matrix-free products from X (a numpy
        array). With X in memory the factor computes each Gram tile from X when
        it needs it (no Gram stage; ``GRAM_ON_DEMAND_IN_PLACE``).
    n_centers : int, default=None
        ``solver="nystrom"``: the number of centres M (None: 1000). Memory O(M² +
        block_size·M), time O(N·M·iterations).
    centers : {"uniform", "rpcholesky"}, default="uniform"
        ``solver="nystrom"``: the centres are rows of X drawn uniformly (FALKON's), or
        the pivots of randomly pivoted Cholesky (seeded by ``random_state``).
    device : {"cpu", "cuda", "auto"}, default="cpu"
        Where the fit runs: the CPU; an NVIDIA GPU through CuPy (``"cuda"``: install
        the extra, ``pip install 'krr-pipeline[gpu]'``; without CuPy or a GPU, fit
        raises :class:`~pipeline.errors.DeviceUnavailableError` before any work); or
        ``"auto"``: the GPU when one is usable, else the CPU (logged). The solvers
        ``dense``, ``cholesky`` and ``cg`` run on the GPU (``primal`` and ``nystrom``
        on the CPU); the plan's reason says where and why. ``predict`` runs on the
        GPU too when one is usable (else on the CPU: a model fitted on a GPU predicts
        anywhere). Results agree with the CPU's to about 1e-10 (relative, float64).
    progress : bool or {"auto", "bars", "lines", "off"}, default=False
        Show the progress of ``fit`` and ``predict`` (Gram tiles, Cholesky
        tiles, CG iteration and relative residual, predicted tiles) on stderr.
        False: silent, as scikit-learn estimators are. True: ``"auto"``, widgets
        in Jupyter, bars on a terminal, timestamped lines otherwise. See
        :mod:`pipeline.engine.progress`.

    Attributes
    ----------
    dual_coef_ : ndarray of shape (n_samples,) or (n_samples, n_targets)
    X_fit_ : ndarray or sparse matrix of shape (n_samples, n_features)
        Training data (the training kernel matrix if ``kernel="precomputed"``).
    n_features_in_ : int
    feature_names_in_ : ndarray of str
        Only when X has string feature names.
    kernel_ : Kernel or None
        The kernel object used (None for callables and ``"precomputed"``).
    solver_ : str
        The solver actually used (``"dense"`` or ``"primal"`` in memory).
    fit_info_ : dict
        Out of core only: solver details, and ``"store"``, the fit's subdirectory
        of ``store`` (None with a temporary store).
    effective_alpha_ : ndarray
        The diagonal shift added to K, per target group (alpha or n * alpha).
    n_iter_ : int
        1 for the direct solvers (one factorisation); CG iterations for ``solver="cg"``.
    primal_coef_ : ndarray of shape (n_features,) or (n_features, n_targets)
        Only when ``solver_ == "primal"``: weights with ``predict(X) = X @ primal_coef_``.
    centers_ : ndarray of int of shape (n_centers,)
        Only when ``solver_ == "nystrom"``: the training rows that are the centres
        (``X_fit_`` holds them; ``dual_coef_`` has one row per centre).
    """

    def __init__(
        self,
        alpha: Any = 1.0,
        *,
        kernel: Any = "linear",
        gamma: float | None = None,
        degree: float = 3,
        coef0: float = 1,
        kernel_params: dict | None = None,
        solver: str = _DEFAULT.solver,
        alpha_convention: str = "sklearn",
        block_size: int | None = None,
        store: Any = None,
        tol: float = _DEFAULT.tol,
        max_iter: int | None = None,
        preconditioner: str = _DEFAULT.preconditioner,
        rank: int | None = None,
        matvec: str = _DEFAULT.matvec,
        cg_precision: str = _DEFAULT.cg_precision,
        random_state: Any = None,
        factor_dtype: str = _DEFAULT.factor_dtype,
        storage_options: dict | None = None,
        keep_gram: bool = _DEFAULT.keep_gram,
        n_centers: int | None = None,
        centers: str = _DEFAULT.centers,
        device: str = _DEFAULT.device,
        progress: bool | str = False,
    ) -> None:
        self.alpha = alpha
        self.kernel = kernel
        self.gamma = gamma
        self.degree = degree
        self.coef0 = coef0
        self.kernel_params = kernel_params
        self.solver = solver
        self.alpha_convention = alpha_convention
        self.block_size = block_size
        self.store = store
        self.tol = tol
        self.max_iter = max_iter
        self.preconditioner = preconditioner
        self.rank = rank
        self.matvec = matvec
        self.cg_precision = cg_precision
        self.random_state = random_state
        self.factor_dtype = factor_dtype
        self.storage_options = storage_options
        self.keep_gram = keep_gram
        self.n_centers = n_centers
        self.centers = centers
        self.device = device
        self.progress = progress

    # -- tags and parameters -------------------------------------------------
    def _check_params(self) -> None:
        for name, knob in SOLVER_PARAMS.items():  # the option tree's checks
            check_option(name, getattr(self, name), knob)
        check_choice("alpha_convention", self.alpha_convention, ALPHA_CONVENTIONS)
        check_positive_int("block_size", self.block_size)
        if self.kernel_params is not None and not isinstance(self.kernel_params, dict):
            raise TypeError(f"kernel_params must be a dict or None, got {self.kernel_params!r}")
        if self._precomputed and self.solver == "primal":
            raise ValueError(
                "solver='primal' needs the features, not kernel='precomputed'; use solver='dense'"
            )
        if self.device == "cuda":  # no CuPy or no GPU: refused here, before any work
            resolve_device(self.device)

    def _kernel_matrix(self, X: Any, Y: Any = None) -> np.ndarray:
        if self._precomputed:  # a sparse K too (np.asarray made it a 0-d object array)
            return _dense(X)
        k = self.kernel_ if hasattr(self, "kernel_") else self._resolve_kernel()
        if k is None:  # a callable on two rows: exactly scikit-learn's evaluation
            return pairwise_kernels(
                X, Y, metric=self.kernel, filter_params=True, **(self.kernel_params or {})
            )
        # the fused, cache-blocked evaluators (the kernel object's own code for kernels
        # they do not know); a kernel that overflows is refused, never a NaN model
        return kernel_matrix(k, X, Y)

    # -- fit -------------------------------------------------------------------
    @with_progress
    def fit(self, X: Any, y: Any, sample_weight: Any = None) -> KernelRidge:
        """Fit kernel ridge regression.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
            Training data, or the (n_samples, n_samples) kernel matrix if
            ``kernel="precomputed"``.
        y : array-like of shape (n_samples,) or (n_samples, n_targets)
        sample_weight : float or array-like of shape (n_samples,), default=None
            Per-sample weights, on every solver, with scikit-learn's semantics:
            ``(W^1/2 K W^1/2 + alpha I) beta = W^1/2 y`` and ``dual_coef_ = W^1/2 beta``
            (rows with weight 0 drop out). Negative, non-finite or all-zero
            weights raise ValueError before any work.

        Returns
        -------
        self
        """
        # every check runs before any kernel evaluation
        self._check_params()
        self._seed = check_random_seed(self.random_state)  # drawn once per fit
        kernel = self._resolve_kernel()
        X, y = validate_X_y(self, X, y, precomputed=self._precomputed)
        n, d = X.shape
        t = 1 if y.ndim == 1 else y.shape[1]
        sw = check_sample_weight(sample_weight, n)
        check_alpha(self.alpha, t)
        lam = effective_alpha(
            self.alpha, n, n_targets=t, sample_weight=sw, alpha_convention=self.alpha_convention
        )
        # an earlier fit's or a loaded krr run model's state (its scaler) must not outlive it,
        # nor a half of it a refused fit: unfitted (NotFittedError), not wrong numbers
        for stale in (
            "dual_coef_",
            "X_fit_",
            "primal_coef_",
            "preprocessing_",
            "fit_info_",
            "centers_",
            "_model",
        ):
            if hasattr(self, stale):
                delattr(self, stale)
        solver = self.solver
        if solver in OUT_OF_CORE_SOLVERS:
            return self._fit_out_of_core(X, y, sw, kernel)
        if solver == "nystrom":
            self._check_nystrom(kernel)
        has_primal = isinstance(kernel, Linear)
        if solver == "primal" and not has_primal:
            raise ValueError(
                f"solver='primal' needs kernel='linear', got kernel={self.kernel!r}; "
                "use solver='dense' or 'auto'"
            )
        if solver == "primal" and np.any(lam <= 0):
            raise ValueError(
                f"solver='primal' needs alpha > 0, got alpha={self.alpha!r}; "
                "use solver='dense' for scikit-learn's alpha=0 behaviour"
            )
        copies = 2 if (self._precomputed or X.dtype == np.float32) else 1
        plan, reason = self._plan(n, d, t, kernel, sw, copies, X=X)
        if solver in ("auto", "nystrom"):
            log_plan(plan, reason, origin="KernelRidge", logger=log)
            if plan.solver == "nystrom":
                return self._fit_nystrom(X, y, sw, kernel, plan)
            if plan.out_of_core:
                return self._fit_out_of_core(X, y, sw, kernel, plan=plan)
            solver = plan.solver
        self.kernel_ = kernel
        self.effective_alpha_ = lam
        if solver == "primal":
            check_dense_memory(primal_bytes(n, d, t), what=f"the in-memory primal solve with D={d}")
            fit = execute(
                replace(plan, solver="primal"), X, y, kernel, alpha=self.alpha, sample_weight=sw
            )
            self.primal_coef_ = fit.primal_coef
            self.dual_coef_ = fit.dual_coef
        else:
            check_dense_memory(
                dense_dual_bytes(n, d, t, kernel_copies=copies),
                what=f"the in-memory dense solve with n_samples={n}",
            )
            fit = execute(
                replace(plan, solver="dense"),
                X,
                y,
                kernel,
                alpha=self.alpha,
                sample_weight=sw,
                # on a GPU (plan.device) the fit evaluates K there, tile by tile
                K=self._kernel_matrix(X) if plan.device == "cpu" or kernel is None else None,
                overwrite_k=not self._precomputed,
            )
            self.dual_coef_ = fit.dual_coef
        self.solver_ = solver
        self.n_iter_ = 1
        self.X_fit_ = _c_order(X)
        self._set_model()
        return self

    def _solver_knobs(self) -> dict:
        """The solver knobs that the plan and the out-of-core fit both take, read once:
        the option tree's (:data:`SOLVER_PARAMS`, less ``solver``) and the drawn seed."""
        knobs = {name: getattr(self, name) for name in SOLVER_PARAMS if name != "solver"}
        return {**knobs, "keep_gram": bool(self.keep_gram), "random_state": self._seed}

    def _plan(self, n: int, d: int, t: int, kernel: Any, sw: Any, copies: int, X: Any = None):
        """The fit plan and its reason (:func:`pipeline.plan.fit_plan.plan_fit`).

        In-memory solvers are planned unless ``store`` is given and the fit can go
        out of core (a Kernel object, one alpha). ``X`` (dense rows) lets the plan
        measure CG's preconditioner on a subsample, as ``krr run`` does.
        """
        one_alpha = np.unique(np.atleast_1d(np.asarray(self.alpha, dtype=np.float64))).size == 1
        ooc_able = kernel is not None and one_alpha and spec_round_trips(kernel)  # (no callables)
        resources = measure_resources(
            self.store, in_memory=self.store is None or not ooc_able, device=self.device
        )
        choices = solver_choices(
            solver=self.solver,
            alpha=self.alpha,
            alpha_convention=self.alpha_convention,
            block_size=self.block_size,
            **self._solver_knobs(),
            store=self.store,
            kernel_copies=copies,
            sample_weight=sw is not None,
        )
        rows = X if isinstance(X, np.ndarray) and X.ndim == 2 else None
        return plan_fit(
            n, d, kernel, resources, choices, n_targets=t, probes=row_probes(rows, kernel)
        )

    def _fit_out_of_core(
        self, X: Any, y: np.ndarray, sample_weight: Any, kernel: Any, plan: Any = None
    ):
        """Fit with an out-of-core solver (``solver="cholesky"``, ``"cg"``, or "auto" past RAM).

        The Gram matrix lives in tiles in a subdirectory of ``store`` named by the
        fingerprint of this fit (:func:`fit_store_path`), or in a temporary directory
        when ``store`` is None; see :func:`pipeline.fit.fit_out_of_core`. Sample weights
        scale the rows and columns of K by sqrt(w), as scikit-learn does
        (:func:`pipeline.fit.weighted_problem`). Rejected before any work:
        kernels that are not :class:`~pipeline.kernels.Kernel` objects, per-target
        alphas that differ, and alpha <= 0.
        """
        lam = self._one_alpha(kernel)
        convention = self.alpha_convention
        if not np.isfinite(lam) or lam <= 0:
            raise ValueError(
                f"the out-of-core solvers need alpha > 0, got {lam!r}; use a positive alpha, "
                "or solver='dense' for scikit-learn's alpha=0 least-squares behaviour"
            )
        if self.storage_options:
            scheme = url_scheme(str(self.store)) if self.store is not None else None
            if scheme is None:
                raise ValueError(
                    f"storage_options need store to be a URL such as s3://bucket/prefix, got "
                    f"store={self.store!r}; drop storage_options or pass such a store"
                )
            set_storage_options(scheme, self.storage_options)
        X = _dense(X)
        # K was evaluated in float64 from float32 rows (fit.execute): so must predict be
        # (float32 rounding at a small lambda: docs/PERFORMANCE.md#known-traps)
        X_fit = _c_order(X.astype(np.float64) if X.dtype == np.float32 else X)
        x_fp = fingerprint_blocks([X])
        if sample_weight is not None:
            # (W^1/2 K W^1/2 + lam I) beta = W^1/2 y, alpha = W^1/2 beta (scikit-learn's form)
            lam = float(
                effective_alpha(lam, X.shape[0], sample_weight=sample_weight,
                                alpha_convention=convention)[0]
            )  # fmt: skip
            convention = "sklearn"
            X, y_solve, kernel_solve, root_w = weighted_problem(X, y, kernel, sample_weight)
            if plan is not None:
                plan = replace(plan, alpha=lam, alpha_convention=convention)
            x_solve_fp = fingerprint_blocks([X])
        else:
            y_solve, kernel_solve, root_w, x_solve_fp = y, kernel, None, x_fp
        store = None
        if self.store is not None:
            store = fit_store_path(
                self.store,
                self._fit_identity(kernel, x_fp, y, sample_weight),
            )
        fit = fit_out_of_core(
            X,
            y_solve,
            kernel_solve,
            lam,
            convention=convention,
            # (a plan of "auto", or "nystrom" whose n_centers >= n fell back to the exact rule)
            solver=self.solver if self.solver in OUT_OF_CORE_SOLVERS else "auto",
            store=store,
            block_size=self.block_size,
            **self._solver_knobs(),
            plan=plan,
            x_fingerprint=x_solve_fp,
        )
        dual = fit.dual_coef.reshape(y.shape)
        if root_w is not None:
            dual = dual * (root_w if y.ndim == 1 else root_w[:, None])
        self.kernel_ = kernel
        self.dual_coef_ = dual
        self.X_fit_ = X_fit
        self.solver_ = fit.solver
        self.n_iter_ = fit.n_iter
        self.effective_alpha_ = np.full(1 if y.ndim == 1 else y.shape[1], fit.shift)
        self.fit_info_ = {**fit.info, "store": None if store is None else str(store)}
        self._set_model()
        return self

    def _one_alpha(self, kernel: Any) -> float:
        """The refusals every solver past the in-memory one shares, before any work: a
        kernel with a spec (no callable, no 'precomputed') and one alpha for every
        target, which it returns."""
        if kernel is None:
            raise ValueError(
                f"solver={self.solver!r} needs a named kernel, a Kernel object or a spec, "
                f"got kernel={self.kernel!r}; callables and 'precomputed' are in-memory only "
                "(use solver='dense')"
            )
        alphas = np.atleast_1d(np.asarray(self.alpha, dtype=np.float64))
        if np.unique(alphas).size != 1:
            raise ValueError(
                f"solver={self.solver!r} takes one alpha for every target, got {self.alpha!r}"
            )
        return float(alphas[0])

    def _check_nystrom(self, kernel: Any) -> None:
        """``solver="nystrom"``'s refusals, before any work: those of :meth:`_one_alpha`,
        and alpha > 0."""
        lam = self._one_alpha(kernel)
        if not np.isfinite(lam) or lam <= 0:
            raise ValueError(
                f"solver='nystrom' needs alpha > 0, got {self.alpha!r}; use a positive alpha"
            )

    def _fit_nystrom(self, X: Any, y: np.ndarray, sw: Any, kernel: Any, plan: Any):
        """Fit Nyström KRR (:func:`pipeline.fit.fit_nystrom`): the fitted model is the
        exact one's type with ``X_fit_`` = the centres and ``dual_coef_`` = their
        coefficients, so predict, save and load are unchanged. With ``store``, the CG
        checkpoints live in ``store/fit-<fingerprint>`` (a killed fit resumes)."""
        X = _dense(X)
        store = None
        if self.store is not None:
            store = fit_store_path(
                self.store, self._fit_identity(kernel, fingerprint_blocks([X]), y, sw)
            )
        fit = fit_nystrom(X, y, kernel, plan, sample_weight=sw, store=store, progress=True)
        info = {k: v for k, v in fit.info.items() if k not in ("centres", "history")}
        self.kernel_ = kernel
        self.dual_coef_ = fit.dual_coef
        self.X_fit_ = _c_order(fit.X_fit)
        self.centers_ = np.asarray(fit.info["centres"], dtype=np.int64)
        self.solver_ = fit.solver
        self.n_iter_ = fit.n_iter
        self.effective_alpha_ = np.full(1 if y.ndim == 1 else y.shape[1], fit.shift)
        self.fit_info_ = {**info, "store": None if store is None else str(store)}
        self._set_model()
        return self

    def _fit_identity(self, kernel: Any, x_fp: str, y: np.ndarray, sw: Any) -> dict:
        """Everything that makes one out-of-core fit differ from another (JSON-able).

        The parameters that change the result, the kernel's identity (spec and
        classes) and the content of X, y and the sample weights; never ``store``
        or ``storage_options`` (credentials).
        """
        params = {
            k: v
            for k, v in self.get_params(deep=False).items()
            if k not in ("store", "storage_options", "kernel", "gamma", "degree", "coef0",
                         "kernel_params", "progress", "verbose")
        }  # fmt: skip
        params["alpha"] = np.atleast_1d(np.asarray(self.alpha, dtype=np.float64)).tolist()
        # knobs that name no choice are left out, and the defaults issue #45 changed are
        # spelt as the old ones: stores of earlier fits keep their names
        params = spelt_as_before("estimator", named_knobs(params, self.solver))
        params["random_state"] = self._seed
        return {
            "estimator": "KernelRidge",
            # the fused evaluation of the Gram's tiles: a store of an earlier
            # evaluation (other Gram bits, another Gram fingerprint) is another fit's
            # directory, recomputed here rather than refused or mixed
            "tiles": "fused",
            # and the engine's float64 exp, which makes those bits (any fit can
            # evaluate in float64)
            **evaluation_identity(kernel, "float64"),
            "params": params,
            "kernel": kernel_fingerprint(kernel),
            "X": x_fp,
            "y": fingerprint_blocks([np.asarray(y, dtype=np.float64)]),
            "sample_weight": None if sw is None else fingerprint_blocks([sw]),
        }

    # -- the fitted model -----------------------------------------------------------
    def _set_model(self) -> None:
        """Build the fitted model from the fitted attributes, once, at the end of a fit
        (:func:`pipeline.models.model_io.fitted_model`; None for a callable or
        ``"precomputed"`` kernel, which no model holds). Whatever sets the fitted
        attributes (``fit``, ``KernelRidgeCV``'s refit) calls it last."""
        self._model = None if self.kernel_ is None else fitted_model(self)

    @property
    def model_(self) -> Any:
        """The fitted model, the one fitted-model type :class:`pipeline.models.artifact.Model`
        (what :meth:`save` writes, :func:`load` reads and ``krr predict`` predicts with),
        made by ``fit`` (by :func:`load`: the loaded model). :meth:`predict` predicts
        with it.

        Raises
        ------
        sklearn.exceptions.NotFittedError
            Before ``fit``.
        ValueError
            A callable or ``"precomputed"`` kernel (no kernel spec: no portable model).
        """
        check_is_fitted(self, "dual_coef_")
        model = getattr(self, "_model", None)
        if model is None:
            return fitted_model(self)  # raises: no model holds this kernel
        return model

    # -- persistence -------------------------------------------------------------
    def save(self, path: Any, *, overwrite: bool = False) -> Any:
        """Write the fitted model as a portable artifact (Zarr group + JSON, no pickle).

        Load it anywhere with :func:`pipeline.load`. Needs a kernel with a spec
        (names, Kernel objects); callables and ``"precomputed"`` cannot be saved.
        """
        return save_model(self, path, overwrite=overwrite)

    # -- predict -----------------------------------------------------------------
    @with_progress
    def predict(self, X: Any) -> np.ndarray:
        """Predict ``K(X, X_fit) @ dual_coef_``.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
            Samples, or K(X, X_fit) of shape (n_samples, n_samples_fit) if
            ``kernel="precomputed"``.

        Returns
        -------
        ndarray of shape (n_samples,) or (n_samples, n_targets)
        """
        check_is_fitted(self, "dual_coef_")
        X = validate_X_predict(self, X, precomputed=self._precomputed)
        model = getattr(self, "_model", None)
        be = predict_backend(self.device)
        if (
            be is not None
            and model is not None
            and not model.preprocessing  # (a krr run model's scaler: the CPU path)
            and getattr(self, "primal_coef_", None) is None
            and isinstance(X, np.ndarray)
        ):
            # on the GPU: X_fit_ and dual_coef_ copied there, K(X, X_fit) never on the host
            pred = kernel_predict(self.kernel_, X, self.X_fit_, self.dual_coef_, backend=be)
            if pred is not None:  # (None: a kernel the device evaluators do not know)
                return pred
        if model is not None:
            # by the fitted model (pipeline.models.artifact.Model.predict): in memory after an
            # in-memory fit, blockwise (as krr predict) after an out-of-core one or with a
            # krr run model's scaler
            bs = int(self.block_size or 2048)
            return model.predict(
                X,
                block_size=bs,
                train_block_size=bs,
                progress=True,  # as self.progress says (with_progress)
            )
        # no model holds a callable or "precomputed" kernel
        if self._precomputed:
            return np.asarray(X @ self.dual_coef_, dtype=np.float64)
        X_fit = self.X_fit_
        return predict_in_memory(
            X, X_fit, self.dual_coef_, None, kernel_fn=lambda Xb: self._kernel_matrix(Xb, X_fit)
        )


def predict_backend(device: str) -> Any:
    """The backend ``predict`` runs on for the estimator's ``device``: CuPy's where
    ``device`` is not ``"cpu"`` and a GPU is usable, else None (the CPU). A model fitted
    on a GPU predicts anywhere: without one it predicts on the CPU."""
    if device == "cpu" or not cuda_available()[0]:
        return None
    return get_backend("cupy")


def load(path: Any) -> KernelRidge:
    """Load a saved model as a fitted :class:`KernelRidge`.

    Reads what ``KernelRidge.save`` writes and what ``krr run`` writes to
    ``RUN_DIR/results/<key>/model/model`` (one format, :mod:`pipeline.models.artifact`); the latter
    predicts on raw inputs, its scaler applied.

    Raises
    ------
    FileNotFoundError
        Nothing at ``path``.
    pipeline.models.artifact.ArtifactError
        Not an artifact, an unknown (newer) format version, a broken checksum, or
        a model of another estimator.
    """
    art = load_artifact(str(path))
    params, attrs = estimator_state(art, path)
    est = KernelRidge(**params)
    for name, value in attrs.items():
        setattr(est, name, value)
    est._model = art  # the loaded model itself: its path and fingerprint kept
    return est


def _c_order(X: Any) -> Any:
    """Dense ``X_fit_`` in C order, as a saved model reloads it (the same bits after)."""
    return np.ascontiguousarray(X) if isinstance(X, np.ndarray) else X
