"""``KernelRidge.save`` and :func:`load`: a fitted estimator as a portable artifact.

The artifact (see :mod:`pipeline.artifact`) is a Zarr group with JSON metadata:
training inputs, dual coefficients, the kernel spec, λ and its convention, the
package version and checksums. The estimator's parameters ride along as JSON,
so :func:`load` returns an equivalent fitted :class:`~pipeline.KernelRidge`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from pipeline.artifact import ArtifactError, ModelArtifact, load_artifact, save_artifact
from pipeline.kernels import Kernel, kernel_from_spec


def _json_params(est: Any) -> dict[str, Any]:
    params = est.get_params(deep=False)
    kernel = params["kernel"]
    if isinstance(kernel, Kernel):
        params["kernel"] = {"spec": kernel.to_spec()}
    elif not isinstance(kernel, str | dict) or kernel == "precomputed":
        raise ValueError(
            f"a model with kernel={kernel!r} cannot be saved: the artifact stores a kernel spec; "
            "use a kernel name or a pipeline.kernels.Kernel"
        )
    if "storage_options" in params:
        params["storage_options"] = None  # credentials are never saved with a model
    if isinstance(params.get("store"), Path):
        params["store"] = str(params["store"])
    if not isinstance(params.get("random_state"), int | type(None)):
        params["random_state"] = None
    alpha = params["alpha"]
    params["alpha"] = np.asarray(alpha).tolist() if not np.isscalar(alpha) else float(alpha)
    return params


def save_model(est: Any, path: Any, *, overwrite: bool = False) -> ModelArtifact:
    """Save a fitted :class:`pipeline.KernelRidge` to ``path`` (directory or fsspec URL)."""
    from sklearn.utils.validation import check_is_fitted

    check_is_fitted(est, "dual_coef_")
    params = _json_params(est)
    if est.kernel_ is None:
        raise ValueError(f"a model with kernel={est.kernel!r} cannot be saved (no kernel spec)")
    X = est.X_fit_
    if hasattr(X, "toarray"):
        X = X.toarray()
    conv = "n" if est.alpha_convention == "n_samples" else "sklearn"
    shift = np.asarray(est.effective_alpha_, dtype=np.float64)
    lam = float(np.atleast_1d(np.asarray(est.alpha, dtype=np.float64))[0])
    return save_artifact(
        str(path),
        dual_coef=est.dual_coef_,
        kernel=est.kernel_,
        regularization=lam,
        regularization_convention=conv,
        X_train=np.asarray(X),
        extra={
            "estimator": "pipeline.KernelRidge",
            "params": params,
            "solver_": est.solver_,
            "n_iter_": int(est.n_iter_),
            "effective_alpha_": shift.tolist(),
        },
        overwrite=overwrite,
        feature_names=_feature_names(est),
    )


def _feature_names(est: Any) -> list[str] | None:
    """``feature_names_in_`` (set by fit on a DataFrame with string columns), else None."""
    names = getattr(est, "feature_names_in_", None)
    return None if names is None else [str(n) for n in names]


def load(path: Any) -> Any:
    """Load a model saved with ``KernelRidge.save`` as a fitted :class:`pipeline.KernelRidge`.

    Raises
    ------
    FileNotFoundError
        Nothing at ``path``.
    pipeline.artifact.ArtifactError
        Not an artifact, an unknown format version, or a broken checksum.
    """
    from pipeline.estimator import KernelRidge

    art = load_artifact(str(path))
    extra = art.extra or {}
    if extra.get("estimator") != "pipeline.KernelRidge":
        raise ArtifactError(
            f"{path!s} holds a model artifact but not a saved pipeline.KernelRidge "
            f"(estimator={extra.get('estimator')!r}); use pipeline.artifact.load_artifact"
        )
    params = dict(extra["params"])
    if isinstance(params["kernel"], dict) and "spec" in params["kernel"]:
        params["kernel"] = kernel_from_spec(params["kernel"]["spec"])
    est = KernelRidge(**params)
    X = np.asarray(art.X_train)
    est.kernel_ = art.kernel
    est.dual_coef_ = np.asarray(art.dual_coef)
    est.X_fit_ = X
    est.n_features_in_ = X.shape[1]
    if art.feature_names is not None:  # predict then checks DataFrame columns like scikit-learn
        est.feature_names_in_ = np.asarray(art.feature_names, dtype=object)
    est.solver_ = extra.get("solver_", "dense")
    est.n_iter_ = extra.get("n_iter_", 1)
    est.effective_alpha_ = np.asarray(extra.get("effective_alpha_", [art.regularization]))
    return est
