"""In-memory kernel matrices and predictions through the fused evaluators.

The in-memory fit (the dense Gram ``K(X, X)``) and prediction
(``K(X_new, X_fit) @ dual_coef``, the kernel matrix never formed) take the
cache-blocked path of the out-of-core passes (:mod:`pipeline.engine.fused`).
Kernels the evaluators do not know fall back to the kernel object's own evaluation
(:func:`pipeline.engine.evaluators.is_fused`).

Precision: kernel values are evaluated in float64 whatever the input dtype (float32
rows are the user's values, not a precision). :func:`kernel_matrix` returns the
dtype the kernel object would (float32 iff every input is), each value rounded once
from float64; the values equal the kernel object's to ~1e-15 relative.

A kernel whose values overflow float64 is refused with
:class:`~pipeline.errors.NonFiniteKernelError` (a ValueError), as out of core:
never NaN predictions from finite inputs (:func:`check_finite_kernel`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pipeline.engine import device
from pipeline.engine.backend import get_backend
from pipeline.engine.evaluators import is_fused
from pipeline.engine.fused import kernel_tile, predict_accumulate
from pipeline.engine.where import available_cores
from pipeline.errors import NonFiniteKernelError
from pipeline.kernels import Kernel
from pipeline.kernels.base import result_dtype

__all__ = ["check_finite_kernel", "check_finite_predictions", "kernel_matrix", "kernel_predict"]

#: rows of X_new per fused prediction call: the per-call preparation of those
#: rows (feature-major, (D + 2) x rows float64) stays in the reused per-thread
#: buffers (64 MiB) and the strips of one call keep both threads busy
PREDICT_CHUNK_ROWS = 1 << 16


def _is_sparse(X: Any) -> bool:
    return hasattr(X, "toarray") and hasattr(X, "nnz")


def _fusable(kernel: Any, *arrays: Any) -> bool:
    """Whether the fused evaluators take ``kernel`` on these inputs (dense, 2-D, real)."""
    if not isinstance(kernel, Kernel) or not is_fused(kernel):
        return False
    for a in arrays:
        if a is None:
            continue
        if _is_sparse(a):
            return True  # densified per block below
        arr = np.asarray(a)
        if arr.ndim != 2 or arr.dtype.kind not in "fiub":
            return False
    return True


def check_finite_kernel(K: np.ndarray, what: str = "the kernel matrix K(X, X)") -> None:
    """Raise :class:`~pipeline.errors.NonFiniteKernelError` if ``K`` holds inf or NaN.

    The message names the first non-finite entry and the fix, in the words of the
    out-of-core Cholesky's check (:mod:`pipeline.linalg.cholesky_tile`).
    """
    K = np.asarray(K)
    if K.dtype.kind not in "fc" or np.isfinite(K).all():
        return
    bad = np.argwhere(~np.isfinite(K))[0]
    where = ", ".join(str(int(i)) for i in bad)
    raise NonFiniteKernelError(
        f"{what} holds a non-finite value (inf or NaN): entry ({where}) is "
        f"{K[tuple(bad)]}. The kernel's values overflow {K.dtype} (e.g. a high "
        "polynomial degree on large features): standardise X, or lower the degree or gamma"
    )


def _device_backend(backend: Any) -> Any:
    """The non-NumPy :class:`~pipeline.engine.backend.Backend` ``backend`` names, else None
    (None or ``"numpy"``: the CPU path, unchanged)."""
    if backend is None:
        return None
    be = get_backend(backend) if isinstance(backend, str) else backend
    return None if be.name == "numpy" else be


def kernel_matrix(
    kernel: Any,
    X: Any,
    Y: Any = None,
    *,
    n_threads: int | None = None,
    check: bool = True,
    backend: Any = None,
) -> np.ndarray:
    """``kernel(X, Y)`` (``Y=None``: ``kernel(X)``, exactly symmetric), fused when possible.

    Same shape and dtype as the kernel object's result (float32 iff every input
    is float32); values evaluated in float64 by the fused evaluators for the
    kernels they know, by the kernel object otherwise. ``check``: refuse
    non-finite values (:func:`check_finite_kernel`). ``backend``: a non-NumPy
    :class:`~pipeline.engine.backend.Backend` (or its name) evaluates the fused
    kernels there (:func:`pipeline.engine.device.kernel_block`); the result comes
    back to the host.
    """
    be = _device_backend(backend)
    if not _fusable(kernel, X, Y):
        K = np.asarray(kernel(X, Y))
    elif be is not None:
        Xd = X.toarray() if _is_sparse(X) else X
        Yd = None if Y is None else (Y.toarray() if _is_sparse(Y) else Y)
        K = be.to_numpy(device.kernel_block(be, kernel, Xd, Yd)).astype(
            result_dtype(X, Y), copy=False
        )
    else:
        dt = result_dtype(X, Y)
        Xd = X.toarray() if _is_sparse(X) else np.asarray(X)
        Yd = None if Y is None else (Y.toarray() if _is_sparse(Y) else np.asarray(Y))
        if Yd is not None and Yd.shape[1] != Xd.shape[1]:
            raise ValueError(
                f"X has {Xd.shape[1]} features but Y has {Yd.shape[1]}; they must match"
            )
        K = np.empty((Xd.shape[0], Xd.shape[0] if Yd is None else Yd.shape[0]), dtype=dt)
        kernel_tile(kernel, Xd, Yd, K, kernel_dtype="float64", n_threads=n_threads)
    if check:
        check_finite_kernel(K, "the kernel matrix K(X, X)" if Y is None else "the kernel K(X, Y)")
    return K


def kernel_predict(
    kernel: Any,
    X: Any,
    X_fit: Any,
    dual_coef: Any,
    *,
    n_threads: int | None = None,
    chunk_rows: int = PREDICT_CHUNK_ROWS,
    backend: Any = None,
) -> np.ndarray | None:
    """``K(X, X_fit) @ dual_coef`` (float64) by the fused evaluators, never forming K.

    Returns None when the evaluators do not know ``kernel`` (the caller keeps
    its own evaluation: the kernel object's generic path). ``X`` may be a
    scipy sparse matrix (densified ``chunk_rows`` rows at a time). Non-finite
    predictions from finite inputs mean the kernel overflowed: refused with
    :class:`~pipeline.errors.NonFiniteKernelError`. ``backend``: a non-NumPy
    :class:`~pipeline.engine.backend.Backend` (or its name) runs the products there
    (:func:`pipeline.engine.device.predict`).
    """
    if not _fusable(kernel, X, X_fit):
        return None
    be = _device_backend(backend)
    if be is not None:
        Xf = X_fit.toarray() if _is_sparse(X_fit) else X_fit
        Xn = X.toarray() if _is_sparse(X) else X
        out = device.predict(be, kernel, Xf, dual_coef, Xn)
        check_finite_predictions(out)
        return out
    coef = np.asarray(dual_coef, dtype=np.float64)
    A = coef[:, None] if coef.ndim == 1 else coef
    Xf = X_fit.toarray() if _is_sparse(X_fit) else np.asarray(X_fit)
    n = X.shape[0]
    out = np.zeros((n, A.shape[1]))
    nt = available_cores() if n_threads is None else int(n_threads)
    step = max(1, int(chunk_rows))
    for s in range(0, n, step):
        xb = X[s : s + step]
        xb = xb.toarray() if _is_sparse(xb) else np.asarray(xb)
        predict_accumulate(kernel, xb, Xf, A, out[s : s + step], kernel_dtype="float64",
                           n_threads=nt)  # fmt: skip
    check_finite_predictions(out)
    return out[:, 0] if coef.ndim == 1 else out


def check_finite_predictions(pred: np.ndarray) -> None:
    """Refuse predictions that are inf or NaN (finite inputs and coefficients: the
    kernel values or their sums overflowed float64)."""
    pred = np.asarray(pred)
    if pred.dtype.kind not in "fc" or np.isfinite(pred).all():
        return
    bad = np.argwhere(~np.isfinite(pred))[0]
    raise NonFiniteKernelError(
        f"the kernel K(X, X_fit) holds a non-finite value (inf or NaN): the prediction of "
        f"row {int(bad[0])} is {pred[tuple(bad)]}. The kernel's values overflow "
        "float64 (e.g. a high polynomial degree on large features): standardise X, or "
        "lower the degree or gamma"
    )
