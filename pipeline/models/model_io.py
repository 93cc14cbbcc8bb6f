"""``KernelRidge.save`` and :func:`load`: a fitted estimator as a portable artifact.

The artifact (see :mod:`pipeline.models.artifact`) is a Zarr group with JSON metadata:
training inputs, dual coefficients, the kernel spec, λ and its convention, the
package version and checksums. The estimator's parameters ride along as JSON,
so :func:`pipeline.load` returns an equivalent fitted :class:`~pipeline.KernelRidge`
(built from :func:`estimator_state`). A model written by ``krr run`` is the same
format and loads the same way. This module does not import the estimator (no
import cycle): ``pipeline.models.estimator`` imports it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from pipeline.kernels import Kernel, kernel_from_spec
from pipeline.models.artifact import ArtifactError, ModelArtifact, save_artifact
from pipeline.options import diagonal_shift, public_convention, solver_convention

#: the one fitted-model value: what ``KernelRidge.save``, ``krr run``'s model stage
#: and :func:`pipeline.load` write and read (kernel spec, X_train or its reference,
#: dual coefficients, preprocessing, feature names, fingerprints; Zarr + JSON)
FittedModel = ModelArtifact


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
    conv = solver_convention(est.alpha_convention)
    shift = np.asarray(est.effective_alpha_, dtype=np.float64)
    alphas = np.atleast_1d(np.asarray(est.alpha, dtype=np.float64))
    lam = float(alphas[0]) if np.unique(alphas).size == 1 else alphas.tolist()
    extra = {
        "estimator": "pipeline.KernelRidge",
        "params": params,
        "solver_": est.solver_,
        "n_iter_": int(est.n_iter_),
        "effective_alpha_": shift.tolist(),
    }
    primal = getattr(est, "primal_coef_", None)
    if primal is not None:  # predict(X) = X @ primal_coef_ (JSON floats round-trip exactly)
        extra["primal_coef_"] = np.asarray(primal, dtype=np.float64).tolist()
    # a model loaded from krr run keeps its scaler (its X_train is the standardised rows)
    pre = getattr(est, "preprocessing_", None) or None
    return save_artifact(
        str(path),
        dual_coef=est.dual_coef_,
        kernel=est.kernel_,
        regularization=lam,
        regularization_convention=conv,
        X_train=np.asarray(X),
        preprocessing=None if pre is None else {k: np.asarray(v).tolist() for k, v in pre.items()},
        extra=extra,
        overwrite=overwrite,
        feature_names=_feature_names(est),
    )


def _feature_names(est: Any) -> list[str] | None:
    """``feature_names_in_`` (set by fit on a DataFrame with string columns), else None."""
    names = getattr(est, "feature_names_in_", None)
    return None if names is None else [str(n) for n in names]


def estimator_state(art: ModelArtifact, path: Any = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(params, fitted_attributes)`` of the :class:`pipeline.KernelRidge` an artifact holds.

    Reads models saved by ``KernelRidge.save`` (their parameters ride along) and
    models written by ``krr run``'s model stage (parameters rebuilt from λ, its
    convention and the kernel; the scaler becomes ``preprocessing_``, applied by
    ``predict``).

    Raises
    ------
    pipeline.models.artifact.ArtifactError
        The artifact was written by another estimator, or references its training
        rows without holding them.
    """
    extra = art.extra or {}
    writer = extra.get("estimator")
    if writer is not None and writer != "pipeline.KernelRidge":
        raise ArtifactError(
            f"{path!s} holds a model artifact but not a saved pipeline.KernelRidge "
            f"(estimator={writer!r}); use pipeline.models.artifact.load_artifact"
        )
    if writer is not None:
        params = dict(extra["params"])
        if isinstance(params["kernel"], dict) and "spec" in params["kernel"]:
            params["kernel"] = kernel_from_spec(params["kernel"]["spec"])
    else:  # written by krr run's model stage
        reg = np.atleast_1d(np.asarray(art.regularization, dtype=np.float64))
        solver = extra.get("solver") or "cholesky"
        params = {
            "alpha": float(reg[0]) if np.unique(reg).size == 1 else reg.tolist(),
            "kernel": art.kernel,
            "alpha_convention": public_convention(art.regularization_convention),
            "solver": solver if solver in ("dense", "primal", "cholesky", "cg") else "auto",
        }
    X = np.asarray(art.X_train)
    reg = np.atleast_1d(np.asarray(art.regularization, dtype=np.float64))
    reg = diagonal_shift(reg, X.shape[0], solver_convention(art.regularization_convention))
    attrs: dict[str, Any] = {
        "kernel_": art.kernel,
        "dual_coef_": np.asarray(art.dual_coef),
        "X_fit_": X,
        "n_features_in_": X.shape[1],
        "solver_": extra.get("solver_", extra.get("solver") or "dense"),
        "n_iter_": extra.get("n_iter_", 1),
        "effective_alpha_": np.asarray(extra.get("effective_alpha_", reg)),
    }
    if extra.get("primal_coef_") is not None:  # a primal fit predicts X @ primal_coef_
        attrs["primal_coef_"] = np.asarray(extra["primal_coef_"], dtype=np.float64)
    if art.feature_names is not None:  # predict then checks DataFrame columns like scikit-learn
        attrs["feature_names_in_"] = np.asarray(art.feature_names, dtype=object)
    if art.preprocessing:
        attrs["preprocessing_"] = {k: np.asarray(v) for k, v in art.preprocessing.items()}
    return params, attrs
