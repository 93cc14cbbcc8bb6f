"""The refit of :class:`~pipeline.models.selection.KernelRidgeCV`'s best setting.

In memory it is a plain :class:`~pipeline.KernelRidge` fit. Out of core it
reuses the best setting's stored Gram (its tiles are not rebuilt) and runs one
factorisation or one preconditioned CG solve, as planned by
:func:`pipeline.plan.fit_plan.plan_fit` and run by :func:`pipeline.fit.execute`.
A CG refit that does not converge raises instead of returning a wrong model.
"""

from __future__ import annotations

import copy
import logging
import os

import numpy as np

from pipeline.fit import execute, log_plan
from pipeline.models.estimator import KernelRidge
from pipeline.models.selection import nystrom_cv
from pipeline.models.selection.choice import IN_MEMORY
from pipeline.models.selection.direct import UnconvergedSolveError
from pipeline.models.selection.strategies import OutOfCoreStore
from pipeline.options import normalize_alpha_convention, solver_choices
from pipeline.plan.fit_plan import Resources, plan_fit

__all__ = ["IN_MEMORY", "refit_best"]

log = logging.getLogger("pipeline.models.selection")


def refit_best(self, X, y, base, stats, settings) -> KernelRidge:
    """Refit the best setting of the fitted search ``self`` (a :class:`KernelRidgeCV`) on
    all of ``X``, ``y``: in memory by :class:`~pipeline.KernelRidge`, out of core on the
    best setting's stored Gram by the one fit plan, counting its work into ``stats``.
    ``settings`` are the kernel settings searched (the stored Grams are named by index)."""

    kern = copy.deepcopy(base).set_params(
        **{k: v for k, v in self.best_params_.items() if k != "alpha"}
    )
    conv = normalize_alpha_convention(self.lambda_convention)
    est = KernelRidge(
        alpha=self.best_alpha_, kernel=kern, alpha_convention=conv, progress=self.progress
    )
    if self.solver_ in IN_MEMORY:
        return est.fit(X, y)
    if self.solver_ == "nystrom":  # the same M, centres recipe and seed as the search
        est.set_params(
            solver="nystrom", n_centers=nystrom_cv.n_centres(self, X.shape[0]),
            centers=self.centers, random_state=nystrom_cv.seed(self),
        )  # fmt: skip
        return est.fit(X, y)
    # out of core: refit on the best setting's stored Gram (its tiles are reused, not
    # rebuilt), one factorisation (cholesky) or one preconditioned CG solve (cg), as
    # planned by the one fit plan (pipeline.plan.fit_plan) and run by pipeline.fit.execute
    n = X.shape[0]
    si = settings.index({k: v for k, v in self.best_params_.items() if k != "alpha"})
    Y = y.reshape(n, -1)
    store = None if self.store is None else os.fspath(self.store)
    seed = self.random_state if isinstance(self.random_state, int) else 0
    choices = solver_choices(
        solver=self.solver_,
        alpha=self.best_alpha_,
        alpha_convention=conv,
        block_size=OutOfCoreStore(self).block_size(n),
        tol=self.tol,
        max_iter=self.max_iter,
        preconditioner=self.preconditioner,
        rank=self.rank,
        matvec="stored" if store is not None else "recompute",
        random_state=seed,
        store=store,
    )
    resources = Resources(float("inf"), float("inf"), in_memory=False)
    plan, reason = plan_fit(n, X.shape[1], kern, resources, choices, n_targets=Y.shape[1])
    log_plan(plan, reason, origin="KernelRidgeCV refit", logger=log)
    gram = OutOfCoreStore(self).gram(si, X, kern, stats) if plan.needs_gram else None
    fit = execute(
        plan, X, Y, kern, gram=gram, factor_store=store, factor_name="cv_chol", progress=True
    )
    shift = fit.shift
    if fit.cg is not None and not fit.cg.converged:  # never return an unconverged model
        raise UnconvergedSolveError(
            f"the refit of {self.best_params_} stopped at relative residual "
            f"{float(np.max(fit.cg.rel_residual)):.2e} > tol={self.tol:g}; raise max_iter, "
            "use preconditioner='adaptive', or refit=False"
        )
    if fit.factor is not None:
        stats["factorizations"] += 1
        stats["factor_tiles"] += len(fit.factor.computed)
    else:
        stats["cg_iterations"] += int(fit.cg.n_iter)
        stats["cg_matvecs"] += int(fit.cg.n_matvec)
        stats["cg_solves"] += 1
    coef = np.asarray(fit.dual_coef).reshape(n, -1)
    est.kernel_ = kern
    est.dual_coef_ = coef[:, 0] if y.ndim == 1 else coef
    est.X_fit_ = X
    est.n_features_in_ = X.shape[1]
    est.solver_ = self.solver_
    est.effective_alpha_ = np.full(Y.shape[1], shift)
    est.n_iter_ = int(fit.n_iter)
    est.fit_info_ = {
        "refit_by": "KernelRidgeCV",
        "store": None if self.store is None else os.fspath(self.store),
    }
    est._set_model()  # its model_, as KernelRidge.fit makes it
    return est
