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
from pipeline.models.artifact import ArtifactError, Model
from pipeline.options import diagonal_shift, public_convention, solver_convention

#: the one fitted-model type (:class:`pipeline.models.artifact.Model`): what ``KernelRidge.save``,
#: ``krr run``'s model stage and :func:`pipeline.load` write and read (kernel spec,
#: X_train or its reference, dual coefficients, preprocessing, feature names,
#: fingerprints; Zarr + JSON). ``ModelArtifact`` is another name of it.
FittedModel = Model


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
    if params.get("solver") != "nystrom":
        # the Nyström solver's knobs at their defaults are not recorded (the artifacts of
        # other solvers keep their pinned parameters; a load takes the defaults)
        for name, default in (("n_centers", None), ("centers", "uniform")):
            if name in params and params[name] == default:
                params.pop(name)
    if params.get("device", "cpu") == "cpu":
        # a model fitted on the CPU records no device (its pinned parameters kept)
        params.pop("device", None)
    if "storage_options" in params:
        params["storage_options"] = None  # credentials are never saved with a model
    if isinstance(params.get("store"), Path):
        params["store"] = str(params["store"])
    if not isinstance(params.get("random_state"), int | type(None)):
        params["random_state"] = None
    if "alpha" in params:  # (KernelPerceptron has none)
        alpha = params["alpha"]
        params["alpha"] = np.asarray(alpha).tolist() if not np.isscalar(alpha) else float(alpha)
    return params


def fitted_model(est: Any) -> Model:
    """The :class:`~pipeline.models.artifact.Model` of a fitted :class:`pipeline.KernelRidge`,
    built once at the end of its fit (``KernelRidge.model_``): its training rows,
    ``dual_coef_``, kernel, λ and its convention, scaler, feature names, and its
    parameters and fitted attributes as ``extra``. Not saved yet: ``path`` is None and
    ``model_fingerprint`` empty.

    A kernel object without a JSON spec (a parameter that is a function) gives a model
    without ``extra["params"]``: it predicts, and saving it raises the kernel's
    ``TypeError`` (as saving the estimator did).

    Raises
    ------
    ValueError
        A kernel without a spec (a callable, ``"precomputed"``): such a fit is no
        :class:`~pipeline.models.artifact.Model` (it predicts in memory only, and cannot be saved).
    """
    from sklearn.utils.validation import check_is_fitted

    check_is_fitted(est, "dual_coef_")
    if est.kernel_ is None:
        _json_params(est)  # names the kernel that has no spec
        raise ValueError(f"a model with kernel={est.kernel!r} cannot be saved (no kernel spec)")
    try:
        params = _json_params(est)
    except TypeError:  # a Kernel whose spec cannot be written: saving it raises this again
        params = None
    X = est.X_fit_
    if hasattr(X, "toarray"):
        X = X.toarray()
    conv = solver_convention(est.alpha_convention)
    shift = np.asarray(est.effective_alpha_, dtype=np.float64)
    alphas = np.atleast_1d(np.asarray(est.alpha, dtype=np.float64))
    lam = float(alphas[0]) if np.unique(alphas).size == 1 else alphas.tolist()
    extra: dict[str, Any] = {
        "estimator": "pipeline.KernelRidge",
        "params": params,
        "solver_": est.solver_,
        "n_iter_": int(est.n_iter_),
        "effective_alpha_": shift.tolist(),
    }
    primal = getattr(est, "primal_coef_", None)
    if primal is not None:  # predict(X) = X @ primal_coef_ (JSON floats round-trip exactly)
        extra["primal_coef_"] = np.asarray(primal, dtype=np.float64).tolist()
    if params is None:
        del extra["params"]
    # a model loaded from krr run keeps its scaler (its X_train is the standardised rows)
    pre = getattr(est, "preprocessing_", None) or None
    return Model(
        X_train=np.asarray(X),
        dual_coef=est.dual_coef_,
        kernel=est.kernel_,
        regularization=lam,
        regularization_convention=conv,
        preprocessing={} if pre is None else {k: np.asarray(v) for k, v in pre.items()},
        extra=extra,
        feature_names=_feature_names(est),
    )


def perceptron_model(est: Any) -> Model | None:
    """The :class:`~pipeline.models.artifact.Model` of a fitted :class:`pipeline.KernelPerceptron`
    (``KernelPerceptron.model_``), built once at the end of its fit: its training rows,
    ``dual_coef_`` (a_i y_i), kernel and, as the output offset ``y_mean``, ``intercept_``
    (theta0), so that :meth:`~pipeline.models.artifact.Model.predict` is its
    ``decision_function``. No ridge: ``regularization`` is 0. Its parameters and
    fitted attributes ride along in ``extra`` (``"solver_": "perceptron"``: it predicts
    in memory, as the perceptron did). A kernel without a spec gives no model (None).
    """
    if est.kernel_ is None:
        return None
    try:
        params = _json_params(est)
    except TypeError:  # a Kernel whose spec cannot be written: saving it raises this again
        params = None
    X = est.X_fit_
    if hasattr(X, "toarray"):
        X = X.toarray()
    extra: dict[str, Any] = {
        "estimator": "pipeline.KernelPerceptron",
        "solver_": "perceptron",
        "n_iter_": int(est.n_iter_),
        "converged_": bool(est.converged_),
        "classes_": np.asarray(est.classes_).tolist(),
    }
    if params is not None:
        extra["params"] = params
    return Model(
        X_train=np.asarray(X),
        dual_coef=est.dual_coef_,
        kernel=est.kernel_,
        regularization=0.0,
        regularization_convention="sklearn",
        preprocessing={"y_mean": np.asarray(est.intercept_, dtype=np.float64)},
        extra=extra,
        feature_names=_feature_names(est),
    )


def save_model(est: Any, path: Any, *, overwrite: bool = False) -> Model:
    """Save a fitted :class:`pipeline.KernelRidge` to ``path`` (directory or fsspec URL):
    its model (``KernelRidge.model_``), written by :meth:`pipeline.models.artifact.Model.save`."""
    return est.model_.save(str(path), overwrite=overwrite)


def _feature_names(est: Any) -> list[str] | None:
    """``feature_names_in_`` (set by fit on a DataFrame with string columns), else None."""
    names = getattr(est, "feature_names_in_", None)
    return None if names is None else [str(n) for n in names]


def estimator_state(art: Model, path: Any = None) -> tuple[dict[str, Any], dict[str, Any]]:
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
