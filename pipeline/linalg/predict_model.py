"""What a prediction is computed from: training points, dual coefficients, kernel, preprocessing.

:func:`model_fingerprint` names a fitted model by content, so a batch prediction
store written for one model is never resumed (or silently mixed) with another.
:func:`predict_in_memory` is the in-memory prediction of a model fitted in memory
(:meth:`pipeline.models.artifact.Model.predict` takes it for such a model, and the
estimators for the kernels that no model holds: callables); the blockwise one, for
every other model and for batches into a store, is :func:`pipeline.linalg.blockwise.predict`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import scipy.sparse as sp

from pipeline.engine.dense import check_finite_predictions, kernel_matrix, kernel_predict
from pipeline.kernels import Kernel, kernel_fingerprint
from pipeline.linalg.dense_dual import predict_dual
from pipeline.storage import fingerprint_blocks, fingerprint_obj

#: preprocessing parameters prediction knows how to apply (all optional):
#: X' = (X - x_mean) / x_scale before the kernel, y = (K α) * y_scale + y_mean after it.
PREPROCESSING_KEYS = ("x_mean", "x_scale", "y_mean", "y_scale")


def check_preprocessing(
    preprocessing: Mapping[str, Any] | None, n_features: int, n_outputs: int | None
) -> dict[str, np.ndarray]:
    """Validate preprocessing parameters and return them as float64 arrays.

    ``x_mean``/``x_scale`` are scalars or length ``n_features``; ``y_mean``/
    ``y_scale`` are scalars or length ``n_outputs`` (1 for a 1-D ``dual_coef``).
    """
    out: dict[str, np.ndarray] = {}
    for key, value in (preprocessing or {}).items():
        if key not in PREPROCESSING_KEYS:
            raise ValueError(
                f"unknown preprocessing parameter {key!r}; prediction applies only "
                f"{list(PREPROCESSING_KEYS)} (X' = (X - x_mean) / x_scale, "
                "y = K(X', X_train) @ dual_coef * y_scale + y_mean)"
            )
        if value is None:
            continue
        arr = np.asarray(value, dtype=np.float64)
        width = n_features if key.startswith("x") else (n_outputs or 1)
        if arr.ndim > 1 or (arr.ndim == 1 and arr.shape[0] != width):
            raise ValueError(
                f"preprocessing {key!r} must be a scalar or have length {width}, "
                f"got shape {arr.shape}"
            )
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"preprocessing {key!r} has non-finite values: {arr}")
        if key.endswith("scale") and np.any(arr == 0):
            raise ValueError(f"preprocessing {key!r} has zeros; a scale must be non-zero")
        out[key] = arr
    return out


def model_fingerprint(
    X_train: np.ndarray,
    dual_coef: np.ndarray,
    kernel: Kernel,
    preprocessing: Mapping[str, Any] | None = None,
) -> str:
    """Content hash of a fitted model (everything its predictions depend on)."""
    pre = {k: np.asarray(v, dtype=np.float64).tolist() for k, v in (preprocessing or {}).items()}
    return fingerprint_obj(
        {
            "x_train": fingerprint_blocks([np.asarray(X_train)]),
            "dual_coef": fingerprint_blocks([np.asarray(dual_coef)]),
            "kernel": kernel_fingerprint(kernel),
            "preprocessing": pre,
        }
    )


def predict_in_memory(
    X: Any,
    X_fit: Any,
    dual_coef: np.ndarray,
    kernel: Kernel | None,
    *,
    kernel_fn: Any = None,
    primal_coef: np.ndarray | None = None,
    preprocessing: Mapping[str, np.ndarray] | None = None,
) -> np.ndarray:
    """``K(X, X_fit) @ dual_coef`` in memory: the prediction of a model fitted in memory.

    ``X @ primal_coef`` for a primal fit; else the fused evaluators
    (:func:`pipeline.engine.dense.kernel_predict`, K(X, X_fit) never formed), or, for
    kernels they do not know, kernel rows in blocks (:func:`predict_dual`) from
    ``kernel_fn(X_block)`` (default: :func:`pipeline.engine.dense.kernel_matrix` of
    ``kernel``). Non-finite predictions from finite inputs (an overflowing kernel) are
    refused. ``preprocessing`` may hold ``y_scale`` and ``y_mean`` only (applied as
    ``y * y_scale + y_mean``, as the blockwise prediction applies them): an input
    scaling is the blockwise prediction's.

    Parameters
    ----------
    X : ndarray or sparse matrix of shape (m, D)
        Validated, finite rows.
    X_fit : ndarray of shape (n, D)
        The training rows (a sparse matrix for a callable ``kernel_fn`` only).
    dual_coef : ndarray of shape (n,) or (n, n_outputs)
    kernel : Kernel or None
        None with ``kernel_fn`` (a callable kernel, evaluated by the caller).
    kernel_fn : callable, optional
    primal_coef : ndarray of shape (D,) or (D, n_outputs), optional
    preprocessing : dict, optional

    Returns
    -------
    ndarray of shape (m,) or (m, n_outputs), float64
    """
    pre = dict(preprocessing or {})
    if "x_mean" in pre or "x_scale" in pre:
        raise ValueError(
            "predict_in_memory applies no input scaling (x_mean, x_scale); predict such a "
            "model blockwise (pipeline.linalg.blockwise.predict)"
        )
    if primal_coef is not None:
        pred = np.asarray(X @ primal_coef, dtype=np.float64)
    else:
        if sp.issparse(X):
            X = X.tocsr()
        fused = kernel_predict(kernel, X, X_fit, dual_coef)
        if fused is not None:  # the fused evaluators: K(X, X_fit) is never formed
            pred = fused
        else:
            if kernel_fn is None:

                def kernel_fn(Xb: Any) -> np.ndarray:
                    return kernel_matrix(kernel, Xb, X_fit)

            pred = predict_dual(kernel_fn, X, dual_coef)
            check_finite_predictions(pred)
    if pre.get("y_scale") is not None:
        pred = pred * pre["y_scale"]
    if pre.get("y_mean") is not None:
        pred = pred + pre["y_mean"]
    return pred
