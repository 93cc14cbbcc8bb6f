"""Choosing dual or primal by the cost model, and a one-call reference fit.

The dual forms K (n^2 D) and factors it (n^3 / 3); the primal forms
Phi^T Phi (n D^2) and factors it (D^3 / 3). Only the linear kernel (or
explicit features) has a primal, so only there is there a choice:

    dual   ~ n^2 D + n^3 / 3        primal ~ n D^2 + D^3 / 3

``auto`` picks the cheaper one. With alpha = 0 it always picks the dual, whose
least-squares fallback is scikit-learn's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp

from pipeline.fit import execute
from pipeline.kernels import Kernel, Linear, make_kernel
from pipeline.policy.plan import Resources, plan_fit
from pipeline.reference.dual import effective_alpha, predict_dual
from pipeline.reference.memory import check_dense_memory, dense_dual_bytes, primal_bytes
from pipeline.tiles.dense import check_finite_predictions, kernel_matrix, kernel_predict


def dual_flops(n_samples: int, n_features: int) -> float:
    """Approximate flops of the dense dual: forming K plus its Cholesky."""
    n, d = float(n_samples), float(n_features)
    return n * n * d + n**3 / 3.0


def primal_flops(n_samples: int, n_features: int) -> float:
    """Approximate flops of the primal: forming Phi^T Phi plus its Cholesky."""
    n, d = float(n_samples), float(n_features)
    return n * d * d + d**3 / 3.0


def choose_solver(n_samples: int, n_features: int, *, has_primal: bool, alpha: Any = 1.0) -> str:
    """``"primal"`` when the kernel has an explicit primal, alpha > 0 and it is cheaper,
    else ``"dense"`` (the dual): the in-memory rule of
    :func:`pipeline.policy.plan.plan_fit`."""
    from pipeline.policy.plan import in_memory_choice

    return in_memory_choice(n_samples, n_features, has_primal=has_primal, alpha=alpha)


def _dense(X: Any) -> np.ndarray:
    return X.toarray() if sp.issparse(X) else np.asarray(X)


@dataclass
class ReferenceModel:
    """A fitted exact kernel ridge model (see :func:`fit_reference`)."""

    kernel: Kernel
    X_fit: Any
    dual_coef: np.ndarray
    solver: str
    coef: np.ndarray | None = None
    info: dict = field(default_factory=dict)

    def predict(self, X: Any) -> np.ndarray:
        if self.coef is not None:
            return np.asarray(X @ self.coef, dtype=np.float64)
        Xf = self.X_fit
        fused = kernel_predict(self.kernel, X, Xf, self.dual_coef)
        if fused is not None:  # the fused evaluators, K(X, X_fit) never formed
            return fused

        def kfn(Xb: Any) -> np.ndarray:
            return self.kernel(_dense(Xb), Xf)

        pred = predict_dual(kfn, X, self.dual_coef)
        check_finite_predictions(pred)
        return pred


def fit_reference(
    X: Any,
    y: Any,
    kernel: str | Kernel | dict = "rbf",
    alpha: Any = 1.0,
    *,
    sample_weight: Any = None,
    alpha_convention: str = "sklearn",
    solver: str = "auto",
    jitter: float | str | None = None,
    available_memory: int | None = None,
    **kernel_params: Any,
) -> ReferenceModel:
    """Fit exact kernel ridge in memory; the ground truth for every other solver.

    Parameters
    ----------
    X : ndarray or sparse matrix of shape (n, D)
    y : ndarray of shape (n,) or (n, n_targets)
    kernel : name, spec dict or Kernel
        Built with :func:`pipeline.kernels.make_kernel` (``kernel_params`` forwarded).
    alpha, sample_weight, alpha_convention, jitter
        As in :func:`pipeline.reference.dual.solve_dual`.
    solver : {"auto", "dense", "primal"}
        ``primal`` needs the linear kernel.
    available_memory : int, optional
        Bytes the fit may use (default: measured); more raises
        :class:`~pipeline.reference.memory.InsufficientMemoryError`.
    """
    k = make_kernel(kernel, **kernel_params)
    X = X if sp.issparse(X) else np.asarray(X)
    y = np.asarray(y, dtype=np.float64)
    n, d = X.shape
    t = 1 if y.ndim == 1 else y.shape[1]
    sw = None if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
    lam = effective_alpha(
        alpha, n, n_targets=t, sample_weight=sw, alpha_convention=alpha_convention
    )
    linear = isinstance(k, Linear)
    if solver not in ("auto", "dense", "primal"):
        raise ValueError(f"solver={solver!r} is not valid here; choose 'auto', 'dense' or 'primal'")
    if solver == "primal" and not linear:
        raise ValueError(f"solver='primal' needs the linear kernel, got {k!r}; use 'dense'")
    # the one fit plan; the reference is in memory by definition (its memory check raises)
    plan, _ = plan_fit(
        n,
        d,
        k,
        Resources(float("inf"), 0.0, in_memory=True),
        {"solver": solver, "alpha": lam, "alpha_convention": alpha_convention},
        n_targets=t,
    )
    if plan.solver == "primal":
        check_dense_memory(
            primal_bytes(n, d, t), what=f"the primal solve with D={d}", available=available_memory
        )
        fit = execute(plan, X, y, k, alpha=alpha, sample_weight=sw)
        return ReferenceModel(k, X, fit.dual_coef, "primal", coef=fit.primal_coef)
    check_dense_memory(
        dense_dual_bytes(n, d, t),
        what=f"the dense dual solve with N={n}",
        available=available_memory,
    )
    fit = execute(
        plan,
        X,
        y,
        k,
        alpha=alpha,
        sample_weight=sw,
        K=kernel_matrix(k, _dense(X), check=False),  # checked by execute
        overwrite_k=True,
        jitter=jitter,
    )
    return ReferenceModel(k, _dense(X), fit.dual_coef, "dense", info=fit.info)
