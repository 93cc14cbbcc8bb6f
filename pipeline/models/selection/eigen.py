"""In-memory CV from one eigendecomposition per kernel setting, serving every λ.

With ``K = Q diag(w) Qᵀ`` and ``A = K + s I``:

- dual coefficients ``α = Q diag(1 / (w + s)) Qᵀ y`` cost O(n²) per shift;
- exact leave-one-out residuals ``e_i = α_i / (A⁻¹)_ii`` with
  ``diag(A⁻¹) = (Q ∘ Q) (1 / (w + s))`` cost O(n²) per shift;
- exact held-out residuals of a group V trained on all other rows (K-fold,
  held-out split) are ``e_V = [(A⁻¹)_VV]⁻¹ α_V`` with
  ``(A⁻¹)_VV = Q_V diag(1 / (w + s)) Q_Vᵀ`` (a SYRK of n_V x n, then an n_V
  Cholesky), the Schur-complement identity
  ``y_V - K_VT (K_TT + s I)⁻¹ y_T = [(A⁻¹)_VV]⁻¹ (A⁻¹ y)_V``.

The alternative, one eigendecomposition of each fold's training Gram
(:func:`fold_eigen_predictions`), also serves all λ, and is the only choice
when a training set is not the complement of its test set.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import linalg
from scipy.linalg import blas

__all__ = [
    "KernelEigen",
    "eigendecompose",
    "fold_eigen_predictions",
    "lgo_predictions",
    "loo_predictions",
]


@dataclass
class KernelEigen:
    """``K = Q diag(w) Qᵀ`` and ``Qᵀ y`` (targets as columns)."""

    w: np.ndarray
    Q: np.ndarray
    Qty: np.ndarray

    @property
    def n(self) -> int:
        return int(self.w.shape[0])

    def check_shift(self, shift: float) -> None:
        lo = float(self.w[0] + shift)
        if not lo > 0:
            raise ValueError(
                f"K + {shift:g} I is not positive definite (smallest eigenvalue of K is "
                f"{self.w[0]:.3g}); use a larger alpha or a positive definite kernel"
            )

    def dual_coef(self, shift: float, rows: np.ndarray | None = None) -> np.ndarray:
        """``α = (K + s I)⁻¹ y`` (only ``rows`` of it if given), shape (n or n_rows, t)."""
        self.check_shift(shift)
        Q = self.Q if rows is None else self.Q[rows]
        return Q @ (self.Qty / (self.w + shift)[:, None])


def eigendecompose(K: np.ndarray, y: np.ndarray, *, overwrite: bool = False) -> KernelEigen:
    """Symmetric eigendecomposition of K (LAPACK syevd), with ``Qᵀ y`` for 2-D ``y``."""
    w, Q = linalg.eigh(K, overwrite_a=overwrite, check_finite=False, driver="evd")
    return KernelEigen(w=w, Q=Q, Qty=Q.T @ y)


def loo_predictions(eig: KernelEigen, y: np.ndarray, shifts: list[float]) -> list[np.ndarray]:
    """Exact leave-one-out predictions ``y - α / diag(A⁻¹)`` for each shift."""
    Q2 = eig.Q * eig.Q
    out = []
    for s in shifts:
        alpha = eig.dual_coef(s)
        dinv = Q2 @ (1.0 / (eig.w + s))
        out.append(y - alpha / dinv[:, None])
    return out


def _inverse_block(QV: np.ndarray, w: np.ndarray, shift: float) -> np.ndarray:
    """``Q_V diag(1/(w+s)) Q_Vᵀ`` by one SYRK (lower triangle filled)."""
    B = QV * np.sqrt(1.0 / (w + shift))[None, :]  # C-ordered (n_V, n): B.T is F-ordered
    syrk = blas.get_blas_funcs("syrk", (B,))
    return syrk(1.0, B.T, trans=1, lower=1)


def lgo_predictions(
    eig: KernelEigen,
    y: np.ndarray,
    tests: list[np.ndarray],
    shifts_per_fold: list[list[float]],
) -> list[list[np.ndarray]]:
    """Exact held-out predictions of each test group, trained on all other rows.

    Parameters
    ----------
    eig : KernelEigen of the full K
    y : ndarray (n, t)
    tests : list of index arrays (the test group of each split)
    shifts_per_fold : list (per fold) of lists (per λ) of diagonal shifts

    Returns
    -------
    preds[f][l] : ndarray (n_test_f, t)
    """
    out = []
    scaled = eig.Qty
    for te, shifts in zip(tests, shifts_per_fold):
        QV = np.ascontiguousarray(eig.Q[te])
        per = []
        for s in shifts:
            eig.check_shift(s)
            alpha_v = QV @ (scaled / (eig.w + s)[:, None])
            C = _inverse_block(QV, eig.w, s)
            e = linalg.cho_solve(linalg.cho_factor(C, lower=True, check_finite=False), alpha_v)
            per.append(y[te] - e)
        out.append(per)
    return out


def fold_eigen_predictions(
    K: np.ndarray,
    y: np.ndarray,
    train: np.ndarray,
    test: np.ndarray,
    shifts: list[float],
) -> list[np.ndarray]:
    """Predictions on ``test`` of the model trained on ``train``, for every shift,
    from one eigendecomposition of the training Gram."""
    eig = eigendecompose(K[np.ix_(train, train)], y[train], overwrite=True)
    KV = K[np.ix_(test, train)] @ eig.Q
    out = []
    for s in shifts:
        eig.check_shift(s)
        out.append(KV @ (eig.Qty / (eig.w + s)[:, None]))
    return out
