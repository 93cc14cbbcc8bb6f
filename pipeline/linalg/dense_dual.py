"""Exact dual solve of kernel ridge regression by Cholesky (the in-memory ground truth).

Solves ``(K + lam I) a = y`` (with sample weights scikit-learn's
``(S K S + lam I) b = S y``, ``a = S b``, ``S = diag(sqrt(w))``), where
``alpha_convention="sklearn"`` (default) gives ``lam = alpha`` and ``"n_samples"``
gives ``lam = n * alpha`` (``n`` the sum of the weights when given: the mean-loss
objective ``(1/n) sum (y - f)^2 + alpha ||f||^2``).

Jitter policy
-------------
For ``lam > 0`` and a PSD kernel no jitter is ever added: the result is exact. Only
when the Cholesky fails (``lam = 0`` with a singular K, an indefinite kernel) does
``jitter`` apply:

- ``None`` (default, scikit-learn's behaviour): warn ``SingularKernelWarning("Singular
  matrix in solving dual problem. Using least-squares solution instead.")`` and
  return the least-squares solution;
- ``"auto"``: retry with ``lam + eps * mean(diag K)`` for eps in 1e-12, 1e-10, 1e-8,
  1e-6 (the first that succeeds, with a warning naming it), then least squares;
- a float ``j >= 0``: always factor ``K + (lam + j) I``; least squares if that fails.

Threads: scipy 1.17's bundled OpenBLAS segfaults in a multi-threaded float64
``potrf`` at n >= about 15,500. So from ``n >= constants.ONE_BLAS_THREAD_FROM`` the
factor is the package's tile Cholesky
(:func:`~pipeline.linalg.cholesky_device.device_cholesky` on the NumPy backend, the matrix
itself its storage): ``potrf`` on ``constants.DENSE_POTRF_TILE`` diagonal tiles only,
the updates
multi-threaded GEMMs (measured against the one-thread ``potrf``: docs/PERFORMANCE.md).
Below it, one ``potrf``. Both constants are read when a factor is made, by this module
and by the memory figure (:func:`~pipeline.linalg.dense_memory.dense_dual_bytes`) alike.
:func:`cho_factor` is the one in-memory dense Cholesky of the package: every caller
that factors a dense matrix in memory (the reference solve, the refinement of λ, a
dense fold, the Nyström systems) goes through it, so none can meet the crash.

Memory: the factor overwrites the working matrix's lower triangle; the upper
triangle and a saved diagonal restore K for another penalty or the least-squares
fallback without a second N x N copy (the blocked factor holds
``constants.DENSE_POTRF_TILES_HELD`` tiles besides it).
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any

import numpy as np
from scipy import linalg
from scipy.linalg import lapack

import pipeline.constants as C
from pipeline.engine.backend import get_backend
from pipeline.engine.blas import first_touch_between_calls
from pipeline.engine.parallel import blas_threads
from pipeline.engine.passes import CallableSource, accumulate
from pipeline.engine.where import available_cores
from pipeline.errors import NonFiniteKernelError, NotPositiveDefiniteError, SingularKernelWarning
from pipeline.linalg.cholesky_device import device_cholesky
from pipeline.options import ALPHA_CONVENTIONS, diagonal_shift
from pipeline.storage import buffers as tile_buffers
from pipeline.storage.tiles import TileGrid, copy_tile
from pipeline.validation import check_alpha

_AUTO_JITTER = (1e-12, 1e-10, 1e-8, 1e-6)
_SINGULAR_MSG = "Singular matrix in solving dual problem. Using least-squares solution instead."
#: rows per block when predicting, so K(X_test, X_fit) stays below ~256 MiB
PREDICT_BLOCK_BYTES = 256 * 1024**2


def effective_alpha(
    alpha: Any,
    n_samples: int,
    *,
    n_targets: int = 1,
    sample_weight: np.ndarray | None = None,
    alpha_convention: str = "sklearn",
) -> np.ndarray:
    """The diagonal shift lam actually added to K, one value or one per target.

    ``"sklearn"``: lam = alpha. ``"n_samples"``: lam = n * alpha with
    n = ``n_samples``, or ``sum(sample_weight)`` when weights are given (so
    integer weights act exactly like repeated rows).
    """
    a = check_alpha(alpha, n_targets)
    if alpha_convention not in ALPHA_CONVENTIONS:
        raise ValueError(
            f"alpha_convention={alpha_convention!r} is not valid; choose 'sklearn' (K + alpha I) "
            "or 'n_samples' (K + n alpha I)"
        )
    if alpha_convention == "sklearn":  # (no pass over the weights)
        return diagonal_shift(a, n_samples, alpha_convention)
    n = float(n_samples) if sample_weight is None else float(np.sum(sample_weight))
    return diagonal_shift(a, n, alpha_convention)


@contextlib.contextmanager
def potrf_threads(n: int):
    """Bound BLAS to one thread for a Cholesky of order ``n >= ONE_BLAS_THREAD_FROM``."""
    with blas_threads(1 if n >= C.ONE_BLAS_THREAD_FROM else None):
        yield


def _potrf_dense(A: np.ndarray) -> int:
    """LAPACK lower Cholesky of the F-ordered float64 ``A`` in place; returns info."""
    with potrf_threads(A.shape[0]):
        c, info = lapack.dpotrf(A, lower=1, clean=0, overwrite_a=1)
    if not np.shares_memory(c, A):  # f2py copied (non-contiguous input): write back
        A[...] = c
    return int(info)


def _potrf_blocked(A: np.ndarray, tile: int | None = None) -> int:
    """Lower Cholesky of ``A`` in place by the package's one tile Cholesky driver
    (:func:`~pipeline.linalg.cholesky_device.device_cholesky` on the NumPy backend, with
    ``A`` as its storage target and ``DENSE_POTRF_TILES_HELD`` factor tiles in memory
    besides it); returns LAPACK-style info.

    Only the lower triangle (diagonal included) is read and written; the strict
    upper triangle is left untouched, as with LAPACK, so K can be restored.
    """
    n = A.shape[0]
    tile = min(tile or C.DENSE_POTRF_TILE, n)
    grid = TileGrid(n, n, tile)

    # a new tile buffer's pages are faulted in on every core before the copy: on a VM a
    # fresh page costs more than the copy (docs/PERFORMANCE.md#known-traps)
    first_touch = first_touch_between_calls(available_cores())

    def gram_tile(i: int, j: int) -> np.ndarray:  # a copy: the driver takes it over
        src = A[grid.row_slice(i), grid.row_slice(j)]
        return copy_tile(tile_buffers.take(src.shape, src.dtype, first_touch), src)

    try:
        device_cholesky(
            get_backend("numpy"), gram_tile, n, tile, shift=0.0, target=A,
            memory_limit=C.DENSE_POTRF_TILES_HELD * tile * tile * 8,
        )  # fmt: skip
    except NotPositiveDefiniteError as e:
        return int(e.row) + 1
    except NonFiniteKernelError:  # inf or NaN: not positive definite, as LAPACK says too
        return 1  # (LAPACK names the first non-finite pivot; the callers only test info > 0)
    return 0


def _potrf_inplace(A: np.ndarray) -> int:
    """Lower Cholesky of the F-ordered float64 ``A`` in place (blocked when large)."""
    if A.shape[0] >= C.ONE_BLAS_THREAD_FROM:  # (potrf never sees more than one tile)
        return _potrf_blocked(A)
    return _potrf_dense(A)


def cho_factor(a: np.ndarray, *, overwrite_a: bool = False) -> tuple[np.ndarray, bool]:
    """``scipy.linalg.cho_factor(a, lower=True)`` for a symmetric ``a``, safe at any order.

    The lower factor, for :func:`scipy.linalg.cho_solve`: ``(c, True)`` with ``c``
    F-ordered; only its lower triangle is the factor, the strict upper one is ``a``'s
    (untouched). With ``overwrite_a`` and a contiguous float64 ``a``, ``c`` is ``a``'s own
    memory (for a C-ordered ``a``, its transpose, which is ``a``: so the factor lies in
    ``a``'s upper triangle and ``a``'s strict lower one is still ``a``); else a copy.

    Raises
    ------
    numpy.linalg.LinAlgError
        ``a`` is not positive definite (scipy's message).
    """
    a = np.asarray(a)
    if overwrite_a and a.dtype == np.float64 and a.flags.writeable and a.flags.f_contiguous:
        c = a
    elif overwrite_a and a.dtype == np.float64 and a.flags.writeable and a.flags.c_contiguous:
        c = a.T
    else:
        c = np.array(a, dtype=np.float64, order="F")
    info = _potrf_inplace(c)
    if info > 0:
        raise linalg.LinAlgError(f"{info}-th leading minor of the array is not positive definite")
    return c, True


def cholesky(a: np.ndarray, *, lower: bool = True, overwrite_a: bool = False) -> np.ndarray:
    """``scipy.linalg.cholesky(a, lower=lower)`` for a symmetric ``a`` by :func:`cho_factor`
    (safe at any order): the clean triangular factor, a new array (``overwrite_a``: ``a``
    is a temporary whose memory the factorisation may use, one M x M copy fewer)."""
    c, _ = cho_factor(a, overwrite_a=overwrite_a)
    return np.tril(c) if lower else np.triu(c.T)


def _restore_lower(A: np.ndarray, diag: np.ndarray, block: int = 1024) -> None:
    """Rebuild the lower triangle of symmetric ``A`` from its untouched upper one."""
    n = A.shape[0]
    for b in range(0, n, block):
        e = min(b + block, n)
        # rows below the diagonal block: A[e:, b:e] = A[b:e, e:].T
        A[e:, b:e] = A[b:e, e:].T
        sq = A[b:e, b:e]
        low = np.tril_indices(e - b, -1)
        sq[low] = sq.T[low]
    A[np.diag_indices(n)] = diag


def _solve_one_alpha(
    A: np.ndarray,
    d0: np.ndarray,
    Y: np.ndarray,
    lam: float,
    jitter: Any,
    restore_after: bool,
) -> tuple[np.ndarray, dict[str, Any]]:
    n = A.shape[0]
    scale = float(np.mean(np.abs(d0))) if n else 1.0
    scale = scale if scale > 0 else 1.0
    if jitter is None:
        tries = [0.0]
    elif isinstance(jitter, str) and jitter == "auto":
        tries = [0.0] + [eps * scale for eps in _AUTO_JITTER]
    else:
        tries = [float(jitter)]
    for j in tries:
        A[np.diag_indices(n)] = d0 + (lam + j)
        info = _potrf_inplace(A)
        if info == 0:
            X = lapack.dpotrs(A, Y, lower=1)[0]
            if j > 0 and jitter == "auto":
                warnings.warn(
                    f"K + {lam:g} I is not positive definite; added jitter {j:.3g} "
                    f"(= {j / scale:.0e} x mean diagonal) to the diagonal",
                    SingularKernelWarning,
                    stacklevel=4,
                )
            if restore_after:
                _restore_lower(A, d0)
            return X, {"method": "cholesky", "jitter": j}
        _restore_lower(A, d0)
    warnings.warn(_SINGULAR_MSG, SingularKernelWarning, stacklevel=4)
    A[np.diag_indices(n)] = d0 + lam
    X = linalg.lstsq(A, Y, check_finite=False)[0]
    A[np.diag_indices(n)] = d0
    return X, {"method": "lstsq", "jitter": None}


def solve_dual(
    K: np.ndarray,
    y: np.ndarray,
    alpha: Any = 1.0,
    *,
    sample_weight: np.ndarray | None = None,
    alpha_convention: str = "sklearn",
    jitter: float | str | None = None,
    overwrite_k: bool = False,
    return_info: bool = False,
) -> np.ndarray | tuple[np.ndarray, dict[str, Any]]:
    """Dual coefficients of kernel ridge regression by an exact Cholesky solve.

    Parameters
    ----------
    K : ndarray of shape (n, n)
        Symmetric kernel matrix K(X, X). Solved in float64 whatever its dtype.
    y : ndarray of shape (n,) or (n, n_targets)
    alpha : float or array of shape (n_targets,)
        Ridge penalty (>= 0), one value or one per target.
    sample_weight : ndarray of shape (n,), optional
        Non-negative weights, applied exactly as scikit-learn does (rows and
        columns of K scaled by sqrt(w)).
    alpha_convention : {"sklearn", "n_samples"}
        Penalty ``K + alpha I`` or ``K + n alpha I`` (see module docstring).
    jitter : None, "auto" or float
        Policy when ``K + lam I`` is not positive definite (module docstring).
    overwrite_k : bool
        Allow using ``K``'s memory as workspace (float64, contiguous input
        only); saves an N x N copy. K's contents are undefined afterwards.
    return_info : bool
        Also return ``{"method": "cholesky"|"lstsq", "jitter": ...}`` per penalty.

    Returns
    -------
    dual_coef : ndarray shaped like ``y``
    """
    K = np.asarray(K)
    if K.ndim != 2 or K.shape[0] != K.shape[1]:
        raise ValueError(f"K must be a square (n, n) kernel matrix, got shape {K.shape}")
    y = np.asarray(y, dtype=np.float64)
    ravel = y.ndim == 1
    Y = y.reshape(-1, 1) if ravel else y
    if Y.ndim != 2 or Y.shape[0] != K.shape[0]:
        raise ValueError(
            f"y has {Y.shape[0]} rows but K is {K.shape[0]} x {K.shape[0]}; they must match"
        )
    n, t = Y.shape
    lam = effective_alpha(
        alpha, n, n_targets=t, sample_weight=sample_weight, alpha_convention=alpha_convention
    )
    if jitter is not None and not (isinstance(jitter, str) and jitter == "auto"):
        if not np.isfinite(float(jitter)) or float(jitter) < 0:
            raise ValueError(f"jitter must be None, 'auto' or a float >= 0, got {jitter!r}")

    # float64, Fortran-ordered working matrix (K is symmetric, so K.T is K)
    if overwrite_k and K.dtype == np.float64 and K.flags.c_contiguous and K.flags.writeable:
        A = K.T
    elif overwrite_k and K.dtype == np.float64 and K.flags.f_contiguous and K.flags.writeable:
        A = K
    else:
        A = np.array(K, dtype=np.float64, order="F")

    sw = None
    if sample_weight is not None:
        sw = np.sqrt(np.asarray(sample_weight, dtype=np.float64))
        A *= sw[:, None]
        A *= sw[None, :]
        Y = Y * sw[:, None]
    d0 = np.diag(A).copy()

    if lam.size == 1:
        groups = [(float(lam[0]), np.arange(t))]
    else:
        uniq = np.unique(lam)
        groups = [(float(u), np.flatnonzero(lam == u)) for u in uniq]
    out = np.empty((n, t), dtype=np.float64)
    infos = []
    for gi, (lam_g, cols) in enumerate(groups):
        last = gi == len(groups) - 1
        Xg, info = _solve_one_alpha(
            A, d0, np.asfortranarray(Y[:, cols]), lam_g, jitter, restore_after=not last
        )
        out[:, cols] = Xg
        infos.append({"alpha": lam_g, **info})
    if sw is not None:
        out *= sw[:, None]
    result = out.ravel() if ravel else out
    return (result, {"solves": infos}) if return_info else result


def predict_block_rows(n_fit: int, n_targets: int = 1) -> int:
    """Rows per prediction block so a K(X_block, X_fit) block stays near 256 MiB."""
    return max(1, PREDICT_BLOCK_BYTES // (8 * max(n_fit, 1)))


def predict_dual(
    kernel_fn: Any, X: Any, dual_coef: np.ndarray, *, block_rows: int | None = None
) -> np.ndarray:
    """``K(X, X_fit) @ dual_coef`` in row blocks, on the tile engine.

    ``kernel_fn(X_block)`` must return K(X_block, X_fit); X is indexable by row slices
    (ndarray or CSR matrix). The row blocks are the tasks of a local engine
    pass (:func:`pipeline.engine.passes.accumulate` with a
    :class:`~pipeline.engine.passes.CallableSource`), run in this process.
    """
    n = X.shape[0]
    n_fit = dual_coef.shape[0]
    rows = block_rows or predict_block_rows(n_fit)
    if n == 0:
        return np.empty((0,) + dual_coef.shape[1:], dtype=np.float64)
    chunks = [min(rows, n - s) for s in range(0, n, rows)]
    out = accumulate(CallableSource(kernel_fn), X, dual_coef, row_chunks=chunks, local=True)
    return np.asarray(out, dtype=np.float64)
