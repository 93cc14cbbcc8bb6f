"""Exact primal ridge for the linear kernel and explicit feature maps.

With features Phi (n x D), weights W = diag(w) and penalty lam (same
conventions as :mod:`pipeline.linalg.dense_dual`), the weights solve

    (Phi^T W Phi + lam I) coef = Phi^T W y,

which costs O(n D^2 + D^3) instead of the dual's O(n^2 D + n^3). The dual
coefficients of the same model are ``a = W (y - Phi coef) / lam`` (for
lam > 0), so ``Phi^T a = coef`` and K(X, X_fit) a = Phi(X) coef.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import scipy.sparse as sp
from scipy import linalg

from pipeline.errors import NonFiniteKernelError
from pipeline.linalg.dense_dual import _SINGULAR_MSG, SingularKernelWarning, effective_alpha


def _gram_primal(Phi: Any, sw: np.ndarray | None) -> np.ndarray:
    """Phi^T W Phi as a dense float64 D x D matrix."""
    if sp.issparse(Phi):
        WPhi = Phi if sw is None else sp.diags(sw) @ Phi
        G = (Phi.T @ WPhi).toarray()
    else:
        Phi = np.asarray(Phi, dtype=np.float64)
        G = Phi.T @ (Phi if sw is None else Phi * sw[:, None])
    return np.asarray(G, dtype=np.float64)


def solve_primal(
    Phi: Any,
    y: np.ndarray,
    alpha: Any = 1.0,
    *,
    sample_weight: np.ndarray | None = None,
    alpha_convention: str = "sklearn",
) -> np.ndarray:
    """Primal ridge weights ``coef`` (no intercept, as kernel ridge has none).

    Parameters
    ----------
    Phi : ndarray or sparse matrix of shape (n, D)
        Explicit features (X itself for the linear kernel).
    y : ndarray of shape (n,) or (n, n_targets)
    alpha : float or array of shape (n_targets,)
        Penalty >= 0. With lam = 0 and a singular Phi^T W Phi the minimum-norm
        least-squares solution is returned with a :class:`SingularKernelWarning`.
    sample_weight : ndarray of shape (n,), optional
    alpha_convention : {"sklearn", "n_samples"}

    Returns
    -------
    coef : ndarray of shape (D,) or (D, n_targets)
    """
    y = np.asarray(y, dtype=np.float64)
    ravel = y.ndim == 1
    Y = y.reshape(-1, 1) if ravel else y
    n, t = Y.shape
    if Phi.shape[0] != n:
        raise ValueError(f"Phi has {Phi.shape[0]} rows but y has {n}; they must match")
    lam = effective_alpha(
        alpha, n, n_targets=t, sample_weight=sample_weight, alpha_convention=alpha_convention
    )
    sw = None if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
    G = _gram_primal(Phi, sw)
    if not np.isfinite(G).all():  # finite features: Phi^T Phi overflowed (it solved to 0)
        raise NonFiniteKernelError(
            "the primal matrix Phi^T Phi of the linear kernel holds a non-finite value (inf "
            "or NaN): the kernel's values overflow float64 (e.g. very large features): "
            "standardise X"
        )
    WY = Y if sw is None else Y * sw[:, None]
    B = np.asarray(Phi.T @ WY, dtype=np.float64)
    d = G.shape[0]
    coef = np.empty((d, t))
    groups = (
        [(float(lam[0]), np.arange(t))]
        if lam.size == 1
        else [(float(u), np.flatnonzero(lam == u)) for u in np.unique(lam)]
    )
    for lam_g, cols in groups:
        A = G.copy()
        A[np.diag_indices(d)] += lam_g
        try:
            c = linalg.cho_factor(A, lower=True, overwrite_a=True, check_finite=False)
            coef[:, cols] = linalg.cho_solve(c, B[:, cols], check_finite=False)
        except linalg.LinAlgError:
            warnings.warn(_SINGULAR_MSG, SingularKernelWarning, stacklevel=2)
            A = G.copy()
            A[np.diag_indices(d)] += lam_g
            coef[:, cols] = linalg.lstsq(A, B[:, cols], check_finite=False)[0]
    return coef.ravel() if ravel else coef


def primal_to_dual(
    Phi: Any,
    y: np.ndarray,
    coef: np.ndarray,
    lam: np.ndarray,
    sample_weight: np.ndarray | None = None,
) -> np.ndarray:
    """Dual coefficients ``W (y - Phi coef) / lam`` of a primal solution (lam > 0).

    ``lam`` is the effective penalty (see :func:`effective_alpha`), one value or
    one per target.
    """
    lam = np.atleast_1d(np.asarray(lam, dtype=np.float64))
    if np.any(lam <= 0):
        raise ValueError(
            f"dual coefficients of a primal solution need alpha > 0, got {lam.tolist()}"
        )
    resid = np.asarray(y, dtype=np.float64) - np.asarray(Phi @ coef)
    if sample_weight is not None:
        w = np.asarray(sample_weight, dtype=np.float64)
        resid = resid * (w if resid.ndim == 1 else w[:, None])
    return resid / (lam[0] if resid.ndim == 1 else lam[None, :])
