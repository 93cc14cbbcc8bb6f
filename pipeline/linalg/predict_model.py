"""What a prediction is computed from: training points, dual coefficients, kernel, preprocessing.

:func:`model_fingerprint` names a fitted model by content, so a batch prediction
store written for one model is never resumed (or silently mixed) with another.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from pipeline.kernels import Kernel, kernel_fingerprint
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
