"""Is a kernel a Mercer kernel on a sample? Symmetry and the smallest eigenvalue.

A kernel is valid (Mercer) when every Gram matrix it makes is symmetric
positive semi-definite. :func:`check_mercer` tests that on one sample: it
cannot prove PSD, but a clearly negative eigenvalue disproves it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class MercerReport:
    """What :func:`check_mercer` found on one sample.

    Attributes
    ----------
    symmetric : bool
        ``max_asymmetry <= tol · max|K|``.
    psd : bool
        ``min_eigenvalue >= -tol · |max_eigenvalue|`` (at least n·eps·max|K|).
    min_eigenvalue, max_eigenvalue : float
        Extreme eigenvalues of the symmetric part ``(K + Kᵀ)/2``.
    max_asymmetry : float
        ``max |K - Kᵀ|``.
    n_samples : int
        Rows used (after subsampling).
    tol : float
        The relative tolerance used.
    """

    symmetric: bool
    psd: bool
    min_eigenvalue: float
    max_eigenvalue: float
    max_asymmetry: float
    n_samples: int
    tol: float

    @property
    def is_mercer(self) -> bool:
        """Symmetric and PSD on this sample."""
        return self.symmetric and self.psd


def check_mercer(
    kernel: Callable[..., Any],
    X: Any,
    tol: float = 1e-8,
    *,
    max_samples: int = 2000,
    random_state: int | None = 0,
) -> MercerReport:
    """Check symmetry and positive semi-definiteness of ``kernel`` on a sample of ``X``.

    Parameters
    ----------
    kernel : Kernel or callable
        Called as ``kernel(Xs, Xs)`` (both arguments given, so no symmetric
        shortcut hides an asymmetric kernel).
    X : array-like of shape (n_samples, n_features)
        Data; at most ``max_samples`` rows are drawn without replacement.
    tol : float, default=1e-8
        Relative tolerance for both tests, scaled by the largest entry
        (symmetry) or the largest eigenvalue (PSD). Rounding in a float64
        eigen-solve is about ``n · 1e-16`` relative, far below the default.
    max_samples : int, default=2000
        Row cap for the O(n³) eigen-solve (2000 rows take well under a second).
    random_state : int or None, default=0
        Seed for the subsample.

    Returns
    -------
    MercerReport
    """
    from scipy.linalg import eigvalsh

    if not (isinstance(tol, int | float) and np.isfinite(tol) and tol >= 0):
        raise ValueError(f"tol must be a finite number >= 0, got {tol!r}")
    if not isinstance(max_samples, int | np.integer) or max_samples < 1:
        raise ValueError(f"max_samples must be an int >= 1, got {max_samples!r}")
    if hasattr(X, "toarray") and hasattr(X, "nnz"):
        X = X.toarray()
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[0] == 0:
        raise ValueError(f"X must be 2-D with at least one row, got shape {X.shape}")
    if X.shape[0] > max_samples:
        rng = np.random.default_rng(random_state)
        X = X[np.sort(rng.choice(X.shape[0], size=max_samples, replace=False))]
    K = np.asarray(kernel(X, X), dtype=np.float64)
    n = X.shape[0]
    if K.shape != (n, n):
        raise ValueError(f"kernel returned shape {K.shape} for {n} rows; expected {(n, n)}")
    if not np.all(np.isfinite(K)):
        raise ValueError("kernel returned NaN or inf on the sample; cannot check it")
    asym = float(np.max(np.abs(K - K.T)))
    # relative to the matrix's own size (a positive factor changes no verdict), with a
    # floor of float64's rounding: a max(1, .) floor made tiny kernels pass as PSD
    top = float(np.max(np.abs(K)))
    scale = top if top > 0 else 1.0
    eig = eigvalsh((K + K.T) / 2.0, check_finite=False)
    lo, hi = float(eig[0]), float(eig[-1])
    return MercerReport(
        symmetric=asym <= tol * scale,
        psd=lo >= -tol * max(abs(hi), n * np.finfo(np.float64).eps * scale),
        min_eigenvalue=lo,
        max_eigenvalue=hi,
        max_asymmetry=asym,
        n_samples=n,
        tol=float(tol),
    )
