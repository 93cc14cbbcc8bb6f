"""Exact leave-one-out and leave-group-out residuals from a stored tile Cholesky factor.

With ``L Lᵀ = A = K + s I`` (tiles in Zarr, :func:`pipeline.linalg.cholesky.tile_cholesky`)
and ``α = A⁻¹ y``:

- leave-one-out: ``e_i = α_i / (A⁻¹)_ii`` where ``(A⁻¹)_ii`` is the squared
  norm of column i of ``L⁻¹`` (``A⁻¹ = L⁻ᵀ L⁻¹``);
- leave-group-out (a K-fold test set V trained on all other rows):
  ``e_V = [(A⁻¹)_VV]⁻¹ α_V`` with ``(A⁻¹)_VV = Xᵀ X``, ``X = L⁻¹ E_V``.

``L⁻¹`` is never formed: columns of it are produced a panel at a time by a
blockwise forward substitution that starts at the first tile row the panel
touches (the rows above are zero), reading factor tiles from the store. Memory
is one ``n x panel`` array; the flops are about ``n³/3`` for the whole
diagonal, the cost of the factorisation itself.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy import linalg
from scipy.linalg import blas as sblas

from pipeline.constants import LOO_PANEL_BYTES
from pipeline.linalg.cholesky import CholeskyFactor
from pipeline.linalg.triangular import cholesky_solve, forward_sweep
from pipeline.storage import TiledArray

__all__ = [
    "forward_panel",
    "inverse_diagonal",
    "inverse_principal_block",
    "lgo_residuals",
    "loo_residuals",
]


def _factor_array(factor: CholeskyFactor | TiledArray) -> TiledArray:
    return factor.L if isinstance(factor, CholeskyFactor) else factor


def forward_panel(
    L: CholeskyFactor | TiledArray,
    E: np.ndarray,
    start_block: int,
    stats: dict | None = None,
    first_row: np.ndarray | None = None,
) -> np.ndarray:
    """Solve ``L X = E`` where E (n x m) is zero above tile row ``start_block``.

    ``first_row`` (optional, one per column of E, counted from row 0): the first
    row of each column that may be nonzero (an identity column's own row); the
    sweep's lanes then skip the factor tiles left of it.

    Returns X (rows above ``start_block``'s first row are zero and not stored:
    the result has ``n - start_row`` rows).
    """
    L = _factor_array(L)
    r0 = L.grid.row_slice(start_block).start
    X = np.array(E[r0:], dtype=np.float64, order="C")
    rel = None if first_row is None else np.maximum(np.asarray(first_row) - r0, 0)
    forward_sweep(L, X, start_block, rel, stats)  # the solvers' one forward sweep
    return X


def inverse_diagonal(
    factor: CholeskyFactor | TiledArray,
    *,
    panel_bytes: int = LOO_PANEL_BYTES,
    stats: dict | None = None,
) -> np.ndarray:
    """``diag(A⁻¹)`` as squared column norms of ``L⁻¹``, panel by panel (never dense)."""
    L = _factor_array(factor)
    g = L.grid
    n, b, T = g.n_rows, g.block_size, g.n_row_blocks
    blocks_per_panel = max(1, int(panel_bytes // (8 * max(n, 1) * b)))
    out = np.empty(n)
    for j0 in range(0, T, blocks_per_panel):
        j1 = min(T, j0 + blocks_per_panel)
        c0, c1 = g.row_slice(j0).start, g.row_slice(j1 - 1).stop
        E = np.zeros((n, c1 - c0))
        E[c0:c1] = np.eye(c1 - c0)
        X = forward_panel(L, E, j0, stats, first_row=np.arange(c0, c1))
        out[c0:c1] = np.einsum("ij,ij->j", X, X)
    return out


def inverse_principal_block(
    factor: CholeskyFactor | TiledArray, idx: np.ndarray, stats: dict | None = None
) -> np.ndarray:
    """``(A⁻¹)[idx][:, idx] = Xᵀ X`` with ``X = L⁻¹ E_idx`` (one forward panel)."""
    L = _factor_array(factor)
    g = L.grid
    idx = np.asarray(idx, dtype=np.int64)
    E = np.zeros((g.n_rows, idx.size))
    E[idx, np.arange(idx.size)] = 1.0
    X = forward_panel(L, E, int(idx.min()) // g.block_size, stats, first_row=idx)
    syrk = sblas.get_blas_funcs("syrk", (X,))
    return syrk(1.0, np.asfortranarray(X), trans=1, lower=1)


def loo_residuals(
    factor: CholeskyFactor | TiledArray,
    y: Any,
    *,
    alpha: np.ndarray | None = None,
    stats: dict | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Exact leave-one-out residuals ``e_i = α_i / (A⁻¹)_ii`` and ``α``.

    Parameters
    ----------
    factor : CholeskyFactor or TiledArray
        ``L`` with ``L Lᵀ = K + s I``.
    y : array of shape (n,) or (n, t)
    alpha : ndarray, optional
        ``A⁻¹ y`` if already solved.

    Returns
    -------
    residuals, alpha : ndarrays shaped like ``y``
    """
    if alpha is None:
        alpha = cholesky_solve(factor, y)
    d = inverse_diagonal(factor, stats=stats)
    a2 = alpha.reshape(alpha.shape[0], -1)
    e = a2 / d[:, None]
    return e.reshape(alpha.shape), alpha


def lgo_residuals(
    factor: CholeskyFactor | TiledArray,
    alpha: np.ndarray,
    test: np.ndarray,
    stats: dict | None = None,
) -> np.ndarray:
    """Exact residuals of the rows ``test`` when trained on all other rows: ``[(A⁻¹)_VV]⁻¹ α_V``."""
    C = inverse_principal_block(factor, test, stats)
    a2 = alpha.reshape(alpha.shape[0], -1)[test]
    e = linalg.cho_solve(linalg.cho_factor(C, lower=True, check_finite=False), a2)
    return e.reshape((len(test),) + alpha.shape[1:])
