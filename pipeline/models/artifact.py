"""The fitted-model artifact: a Zarr group with JSON metadata, no pickle.

Layout of an artifact at ``path`` (a local directory or an fsspec URL)::

    path/zarr.json        group; attributes["krr_model"] holds the metadata below
    path/X_train          (N, D) training points as the kernel sees them
                          (absent when the artifact references X_train elsewhere)
    path/dual_coef        (N,) or (N, n_outputs): α

Metadata (JSON): format name and version, the package version that wrote it,
the kernel spec (:meth:`pipeline.kernels.Kernel.to_spec`), the regularization
λ and its convention, the preprocessing parameters (see
:data:`pipeline.linalg.predict_model.PREPROCESSING_KEYS`), the fingerprint chain (the
model's content fingerprint plus whatever the fitting stages recorded), a
content checksum of every array, a checksum of the metadata itself, and a
``complete`` flag written last. Everything is numbers, strings and plain
arrays: loading never executes code, and a model fitted on one machine
predicts on another from the artifact alone.

:func:`load_artifact` fails with a clear :class:`ArtifactError` on a missing
path, something that is not an artifact, an interrupted save, an unknown
format version, or a checksum that does not match.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import fsspec
import numpy as np
import scipy.sparse as sp
import zarr

from pipeline._version import __version__
from pipeline.errors import ArtifactError, StoreUnreachable
from pipeline.kernels import Kernel, kernel_from_spec, make_kernel, spec_round_trips
from pipeline.linalg.blockwise import predict
from pipeline.linalg.predict_model import check_preprocessing, model_fingerprint, predict_in_memory
from pipeline.linalg.predict_source import select_features
from pipeline.models.artifact_refs import (
    check_names,
    escape_message,
    foreign_entries,
    loaded_names,
    normalise_path,
    read_ref,
    ref_to_store,
    resolve_stored_ref,
)
from pipeline.options import solver_convention
from pipeline.storage import fingerprint_blocks, fingerprint_obj

FORMAT = "krr-pipeline.model"
FORMAT_VERSION = 1
SUPPORTED_VERSIONS = (1,)
META_KEY = "krr_model"
_CHUNK_BYTES = 64 * 2**20
#: the fits whose models predict in memory as their estimator does (``extra["solver_"]``):
#: KernelRidge's in-memory solvers and the kernel perceptron
IN_MEMORY_FITS = ("dense", "primal", "perceptron")
#: the options of :meth:`Model.predict` that the in-memory path takes (and ignores)
_IN_MEMORY_KWARGS = frozenset({"block_size", "train_block_size", "progress"})


@dataclass
class Model:
    """A fitted kernel ridge model: the one fitted-model type, which is the saved artifact.

    What :func:`save_artifact` writes and :func:`load_artifact` reads, what every fit
    makes (``KernelRidge.model_``, ``KernelPerceptron.model_``, ``KernelRidgeCV``'s
    refit; :meth:`from_fit` of an in-memory fit's result) and its estimator predicts
    by, what ``KernelRidge.save`` writes and :func:`pipeline.load` reads, what
    ``krr run``'s model stage writes and what ``krr predict`` predicts with
    (:meth:`predict`). ``ModelArtifact`` and
    :data:`pipeline.models.model_io.FittedModel` are other names of this class.

    Attributes
    ----------
    X_train : ndarray of shape (N, D)
        Training points as the kernel sees them (after preprocessing). In memory
        once saved or loaded; ``krr run``'s predict stage holds its stored rows as a
        Dask array, read block by block.
    dual_coef : ndarray of shape (N,) or (N, n_outputs)
        α.
    kernel : Kernel
        The fitted kernel, rebuilt from its spec.
    regularization : float or ndarray
        λ (per output if an array).
    regularization_convention : str
        How λ enters the system, e.g. ``"sklearn"``: (K + λI) α = y.
    preprocessing : dict of str to ndarray
        ``x_mean``, ``x_scale``, ``y_mean``, ``y_scale`` when used.
    fingerprint_chain : dict of str to str
        Fingerprints recorded by the fitting stages (input, gram, solve, ...).
    extra : dict
        JSON metadata of the writer, e.g. the estimator's parameters.
    model_fingerprint : str
        Content hash of what predictions depend on (X_train, α, kernel, preprocessing).
    package_version, format_version
        Who wrote the artifact, in which format.
    x_train_ref : str, optional
        Where X_train was read from, when the artifact references it.
    path : str, optional
        Where the artifact was loaded from or saved to.
    feature_names : list of str, optional
        Names of the input columns, in the order of X_train's columns (None
        for a model fitted on an unnamed array). Table inputs are selected and
        ordered by these names when predicting.
    target_names : list of str, optional
        Names of the predicted columns (used as output column names).
    """

    X_train: np.ndarray
    dual_coef: np.ndarray
    kernel: Kernel
    regularization: float | np.ndarray
    regularization_convention: str
    preprocessing: dict[str, np.ndarray] = field(default_factory=dict)
    fingerprint_chain: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    model_fingerprint: str = ""
    package_version: str = ""
    format_version: int = FORMAT_VERSION
    x_train_ref: str | None = None
    path: str | None = None
    feature_names: list[str] | None = None
    target_names: list[str] | None = None

    @property
    def n_features(self) -> int:
        return int(self.X_train.shape[1])

    @property
    def n_outputs(self) -> int | None:
        """None for a 1-D ``dual_coef`` (single target), else its column count."""
        return None if self.dual_coef.ndim == 1 else int(self.dual_coef.shape[1])

    @property
    def primal_coef(self) -> np.ndarray | None:
        """The primal weights of a primal fit (``extra["primal_coef_"]``), else None."""
        primal = (self.extra or {}).get("primal_coef_")
        return None if primal is None else np.asarray(primal, dtype=np.float64)

    @property
    def fitted_in_memory(self) -> bool:
        """Whether an estimator fitted this model in memory (``extra["solver_"]`` one of
        :data:`IN_MEMORY_FITS`): its in-memory predictions are those of the fit."""
        return (self.extra or {}).get("solver_") in IN_MEMORY_FITS

    def _predicts_in_memory(self, X_new: Any, kwargs: Mapping[str, Any]) -> bool:
        """The in-memory path takes a model fitted in memory, finite rows in memory of
        the right width and no option of the blockwise path but its block sizes and
        progress; everything else (an error included) is the blockwise path's."""
        if not self.fitted_in_memory or set(kwargs) - _IN_MEMORY_KWARGS:
            return False
        if "x_mean" in self.preprocessing or "x_scale" in self.preprocessing:
            return False
        sparse = sp.issparse(X_new)
        if not (sparse or isinstance(X_new, np.ndarray)) or X_new.ndim != 2:
            return False
        if X_new.shape[1] != self.n_features or X_new.dtype.kind not in "fiu":
            return False
        return bool(np.isfinite(X_new.data if sparse else X_new).all())

    def predict(self, X_new: Any, **kwargs: Any) -> Any:
        """Predict ``K(X_new, X_train) @ dual_coef`` (with the preprocessing applied).

        A model an estimator fitted in memory (:attr:`fitted_in_memory`: a dense,
        primal or perceptron fit) predicts rows in memory (numpy or sparse, finite)
        as its estimator does, by :func:`pipeline.linalg.predict_model.predict_in_memory`
        (``X_new @ primal_coef`` for a primal fit; ``block_size``, ``train_block_size``
        and ``progress`` are then ignored). Everything else goes blockwise, by
        :func:`pipeline.linalg.blockwise.predict` (numpy, or a batch into ``out=``).

        A table ``X_new`` (CSV or Parquet path, DataFrame) is read by column
        name, in the order of :attr:`feature_names` (see
        :func:`pipeline.linalg.predict_source.select_features`); ``columns=[...]`` selects
        columns explicitly.
        """
        if self._predicts_in_memory(X_new, kwargs):
            return predict_in_memory(
                X_new,
                self.X_train,
                self.dual_coef,
                self.kernel,
                primal_coef=self.primal_coef,
                preprocessing=self.preprocessing,
            )
        if sp.issparse(X_new):
            X_new = X_new.toarray()
        X_new = select_features(
            X_new,
            int(kwargs.get("block_size", 4096)),
            feature_names=self.feature_names,
            n_features=self.n_features,
            columns=kwargs.pop("columns", None),
            ordinal=(self.extra or {}).get("ordinal"),  # a krr run model's data.ordinal
        )
        # a model not saved yet has no fingerprint: the prediction store then hashes it
        kwargs.setdefault("model_fingerprint", self.model_fingerprint or None)
        X_train = self.X_train
        if (self.extra or {}).get("primal_coef_") is not None and X_train.dtype != np.float64:
            # a primal fit on float32 rows: its alpha is large and cancels, so the kernel is
            # evaluated in float64 (docs/PERFORMANCE.md#known-traps)
            X_train = np.asarray(X_train, dtype=np.float64)
        return predict(
            X_new,
            X_train,
            self.dual_coef,
            self.kernel,
            preprocessing=self.preprocessing,
            **kwargs,
        )

    @classmethod
    def from_fit(
        cls,
        fit: Any,
        X_train: Any,
        kernel: Kernel | str | dict,
        alpha: Any,
        *,
        alpha_convention: str = "sklearn",
        extra: Mapping[str, Any] | None = None,
        **fields: Any,
    ) -> Model:
        """The model of an in-memory fit's result (:class:`pipeline.fit.FitResult`, e.g.
        :func:`pipeline.fit.fit_reference`'s): the fit returns coefficients, the model
        that predicts with them is built here, from the training rows and kernel the
        fit was given and its ``alpha`` (one or per target) in ``alpha_convention``
        (``"sklearn"`` or ``"n_samples"``). ``extra`` and ``fields`` (any other
        :class:`Model` field) are added. Not saved: ``path`` None.

        Raises
        ------
        ValueError
            A fit without dual coefficients (a primal fit with alpha <= 0).
        """
        if fit.dual_coef is None:
            raise ValueError(
                f"a {fit.solver} fit without dual coefficients (alpha <= 0) cannot be a Model; "
                "fit with alpha > 0 or solver='dense'"
            )
        X = X_train.toarray() if sp.issparse(X_train) else np.asarray(X_train)
        alphas = np.atleast_1d(np.asarray(alpha, dtype=np.float64))
        info: dict[str, Any] = {"solver_": fit.solver, "n_iter_": int(fit.n_iter)}
        if fit.primal_coef is not None:  # predict(X) = X @ primal_coef_
            info["primal_coef_"] = np.asarray(fit.primal_coef, dtype=np.float64).tolist()
        return cls(
            X_train=X,
            dual_coef=np.asarray(fit.dual_coef),
            kernel=make_kernel(kernel),
            regularization=float(alphas[0]) if np.unique(alphas).size == 1 else alphas,
            regularization_convention=solver_convention(alpha_convention),
            extra={**info, **dict(extra or {})},
            **fields,
        )

    def save(self, path_or_url: str, *, overwrite: bool = False) -> Model:
        """Write this model to ``path_or_url`` (see :func:`save_artifact`)."""
        return save_artifact(
            path_or_url,
            X_train=None if self.x_train_ref else self.X_train,
            x_train_ref=self.x_train_ref,
            dual_coef=self.dual_coef,
            kernel=self.kernel,
            regularization=self.regularization,
            regularization_convention=self.regularization_convention,
            preprocessing=self.preprocessing,
            fingerprint_chain=self.fingerprint_chain,
            extra=self.extra,
            feature_names=self.feature_names,
            target_names=self.target_names,
            overwrite=overwrite,
        )


#: the name this class had before it was the one fitted-model type (public, kept)
ModelArtifact = Model


# -- helpers ----------------------------------------------------------------------
def _package_version() -> str:

    return __version__


def _fs(path: str) -> tuple[Any, str]:
    return fsspec.core.url_to_fs(str(path))


def _json_checked(obj: Any, what: str) -> Any:
    try:
        return json.loads(json.dumps(obj, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"{what} must be JSON-serialisable (numbers, strings, lists, dicts; no NaN), "
            f"got {obj!r}: {exc}. Artifacts never pickle objects."
        ) from exc


def _row_chunk(shape: tuple[int, ...], itemsize: int) -> int:
    row_bytes = max(1, int(np.prod(shape[1:], dtype=np.int64)) * itemsize)
    return max(1, min(max(shape[0], 1), _CHUNK_BYTES // row_bytes))


def _checksum_zarr(arr: Any) -> str:
    """Content checksum of a (possibly large) array read in row chunks."""
    step = _row_chunk(tuple(arr.shape), np.dtype(arr.dtype).itemsize)
    n = arr.shape[0]
    return fingerprint_blocks(np.asarray(arr[s : s + step]) for s in range(0, max(n, 1), step))


def _array_record(a: np.ndarray) -> dict[str, Any]:
    return {"shape": list(a.shape), "dtype": a.dtype.str, "checksum": fingerprint_blocks([a])}


def _check_real(a: np.ndarray, name: str) -> np.ndarray:
    a = np.asarray(a)
    if a.dtype.kind not in "fiu":
        raise ValueError(f"{name} must be a real numeric array, got dtype {a.dtype}")
    if a.dtype.kind == "f" and not np.all(np.isfinite(a)):
        raise ValueError(f"{name} has NaN or inf values; a fitted model must be finite")
    return np.ascontiguousarray(a)


def _regularization(value: Any) -> float | list[float]:
    arr = np.asarray(value, dtype=np.float64)
    if arr.ndim > 1 or not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise ValueError(
            f"regularization (λ) must be a finite number >= 0 or a 1-D array of them, got {value!r}"
        )
    return float(arr) if arr.ndim == 0 else arr.tolist()


# -- save -------------------------------------------------------------------------
def save_artifact(
    path_or_url: str | os.PathLike,
    *,
    dual_coef: Any,
    kernel: Kernel | str | dict,
    regularization: float | Any,
    regularization_convention: str = "sklearn",
    X_train: Any = None,
    x_train_ref: str | None = None,
    preprocessing: Mapping[str, Any] | None = None,
    fingerprint_chain: Mapping[str, str] | None = None,
    extra: Mapping[str, Any] | None = None,
    overwrite: bool = False,
    feature_names: Any = None,
    target_names: Any = None,
) -> Model:
    """Write a fitted model as a Zarr group with JSON metadata.

    Parameters
    ----------
    path_or_url : str or path
        Directory or fsspec URL of the artifact (created).
    dual_coef : array-like of shape (N,) or (N, n_outputs)
        α.
    kernel : Kernel, str or spec dict
        The fitted kernel; stored as its spec.
    regularization : float or array-like
        λ (one per output allowed).
    regularization_convention : str
        How λ enters the system: ``"sklearn"`` for (K + λI) α = y, or any
        other label the fitting code documents (e.g. ``"n_scaled"`` for
        (K + NλI) α = y).
    X_train : array-like of shape (N, D), optional
        Training points as the kernel sees them; copied into the artifact.
    x_train_ref : str, optional
        Instead of ``X_train``: path or URL of a Zarr array or ``.npy`` file
        holding it. Only the reference and its content checksum are stored,
        and loading verifies the checksum. A reference inside the artifact
        directory is stored relative to it and found on load; any other one
        must be passed to :func:`load_artifact` as ``x_train=`` (loading never
        follows a path out of the artifact or fetches a URL on its own).
    preprocessing : dict, optional
        ``x_mean``, ``x_scale``, ``y_mean``, ``y_scale`` (scalars or vectors).
    fingerprint_chain : dict of str to str, optional
        Fingerprints of the fitting stages (input, gram, factor, ...).
    extra : dict, optional
        More JSON metadata, e.g. ``{"estimator": "KernelRidge", "params": {...}}``.
    overwrite : bool
        Replace an existing artifact at the path. A non-empty path that is not
        an artifact is never replaced.
    feature_names : sequence of str, optional
        Names of X_train's columns, in order. Predicting on a table (CSV,
        Parquet, DataFrame) then selects and orders its columns by these names.
    target_names : sequence of str, optional
        Names of the outputs (one per column of ``dual_coef``; one for 1-D).

    Returns
    -------
    Model
        The model as saved (``path`` set).
    """
    path = normalise_path(path_or_url)
    if (X_train is None) == (x_train_ref is None):
        raise ValueError("give exactly one of X_train (stored in the artifact) or x_train_ref")
    kernel = make_kernel(kernel)
    spec = kernel.to_spec()  # TypeError naming a parameter that has no spec (a callable)
    if not spec_round_trips(kernel):
        raise ValueError(
            f"kernel {kernel!r} (class {type(kernel).__module__}.{type(kernel).__qualname__}) "
            f"cannot be saved: its spec {spec} loads back as another kernel class "
            "(a subclass that keeps its parent's registered name). Give the subclass its own "
            "`name` and decorate it with pipeline.kernels.base.register."
        )
    dual_coef = _check_real(dual_coef, "dual_coef")
    ref_arr = None
    if x_train_ref is not None:
        x_train_ref = normalise_path(x_train_ref)
        ref_arr = read_ref(x_train_ref)
        X_shape, X_dtype = tuple(ref_arr.shape), np.dtype(ref_arr.dtype)
    else:
        X_train = _check_real(X_train, "X_train")
        X_shape, X_dtype = X_train.shape, X_train.dtype
    if len(X_shape) != 2:
        raise ValueError(f"X_train must be 2-D (n_train, n_features), got shape {X_shape}")
    if dual_coef.ndim not in (1, 2) or dual_coef.shape[0] != X_shape[0]:
        raise ValueError(
            f"dual_coef must have shape ({X_shape[0]},) or ({X_shape[0]}, n_outputs) to match "
            f"X_train {X_shape}, got {dual_coef.shape}"
        )
    n_out = None if dual_coef.ndim == 1 else dual_coef.shape[1]
    pre = check_preprocessing(preprocessing, X_shape[1], n_out)
    feature_names = check_names(feature_names, "feature_names", int(X_shape[1]))
    target_names = check_names(target_names, "target_names", n_out or 1)
    if not isinstance(regularization_convention, str) or not regularization_convention:
        raise ValueError(
            "regularization_convention must be a non-empty string such as 'sklearn' "
            f"((K + λI) α = y), got {regularization_convention!r}"
        )
    chain = _json_checked(dict(fingerprint_chain or {}), "fingerprint_chain")
    extra_j = _json_checked(dict(extra or {}), "extra")
    lam = _regularization(regularization)

    fs, root = _fs(path)
    if fs.exists(root) and (fs.isfile(root) or fs.ls(root)):
        if _read_meta_or_none(path) is None:
            raise FileExistsError(
                f"{path!r} exists and is not a krr-pipeline model artifact; refusing to "
                "replace it. Choose an empty or new path."
            )
        if not overwrite:
            raise FileExistsError(
                f"a model artifact already exists at {path!r}; pass overwrite=True to replace it"
            )
        inside = x_train_ref is not None and ref_to_store(x_train_ref, path) != x_train_ref
        if inside:  # it would be deleted below and then read back as fill zeros
            raise FileExistsError(
                f"x_train_ref {x_train_ref!r} lies inside the artifact {path!r} that "
                "overwrite=True would replace (and so delete it); save to another path, or "
                "move the training rows out of it first"
            )
        others = foreign_entries(fs, root)
        if others:  # opening the group with mode="w" below removes everything under it
            raise FileExistsError(
                f"the model artifact at {path!r} also holds {others}, which it did not write; "
                "refusing to replace it (that would delete them). Move them out, or save "
                "to another path"
            )

    group = zarr.open_group(store=path, mode="w")
    group.attrs[META_KEY] = {"format": FORMAT, "format_version": FORMAT_VERSION, "complete": False}
    arrays: dict[str, Any] = {}
    _write_array(group, "dual_coef", dual_coef)
    arrays["dual_coef"] = _array_record(dual_coef)
    if X_train is not None:
        _write_array(group, "X_train", X_train)
        arrays["X_train"] = _array_record(X_train)
        x_checksum = arrays["X_train"]["checksum"]
        X_loaded = X_train
    else:
        x_checksum = _checksum_zarr(ref_arr)
        X_loaded = np.asarray(ref_arr[...])
    mfp = model_fingerprint(X_loaded, dual_coef, kernel, pre)
    meta = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "package": "krr-pipeline",
        "package_version": _package_version(),
        "created": _dt.datetime.now(_dt.UTC).isoformat(),
        "n_train": int(X_shape[0]),
        "n_features": int(X_shape[1]),
        "n_outputs": n_out,
        "kernel": kernel.to_spec(),
        "regularization": lam,
        "regularization_convention": regularization_convention,
        "preprocessing": {k: v.tolist() for k, v in pre.items()},
        "arrays": arrays,
        "x_train_ref": None
        if x_train_ref is None
        else {
            "url": ref_to_store(x_train_ref, path),
            "shape": list(X_shape),
            "dtype": X_dtype.str,
            "checksum": x_checksum,
        },
        "fingerprints": {"model": mfp, "chain": chain},
        "extra": extra_j,
    }
    if feature_names is not None:  # absent (not null) when unnamed: older readers never see it
        meta["feature_names"] = feature_names
    if target_names is not None:
        meta["target_names"] = target_names
    meta["meta_checksum"] = fingerprint_obj(meta)
    meta["complete"] = True  # written last: an interrupted save is detected on load
    group.attrs[META_KEY] = _json_checked(meta, "artifact metadata")
    return Model(
        X_train=np.asarray(X_loaded),
        dual_coef=dual_coef,
        kernel=kernel_from_spec(kernel.to_spec()),
        regularization=np.asarray(lam) if isinstance(lam, list) else lam,
        regularization_convention=regularization_convention,
        preprocessing=pre,
        fingerprint_chain=chain,
        extra=extra_j,
        model_fingerprint=mfp,
        package_version=meta["package_version"],
        format_version=FORMAT_VERSION,
        x_train_ref=x_train_ref,
        path=path,
        feature_names=feature_names,
        target_names=target_names,
    )


def _write_array(group: zarr.Group, name: str, a: np.ndarray) -> None:
    chunks = (_row_chunk(a.shape, a.dtype.itemsize), *a.shape[1:])
    arr = group.create_array(
        name, shape=a.shape, dtype=a.dtype, chunks=chunks, compressors=None, fill_value=0
    )
    arr[...] = a


# -- load -------------------------------------------------------------------------
def _read_meta_or_none(path: str) -> dict[str, Any] | None:
    try:
        group = zarr.open_group(store=path, mode="r")
        meta = group.attrs.get(META_KEY)
    except Exception:
        return None
    return meta if isinstance(meta, dict) else None


def _open_meta(path: str) -> tuple[zarr.Group, dict[str, Any]]:
    fs, root = _fs(path)
    if not fs.exists(root):
        raise FileNotFoundError(f"no model artifact at {path!r}: the path does not exist")
    try:
        group = zarr.open_group(store=path, mode="r")
    except StoreUnreachable:  # a store that stops answering: not a damaged artifact
        raise
    except Exception as exc:
        raise ArtifactError(
            f"{path!r} is not a readable model artifact: its Zarr group metadata is missing or "
            f"corrupt ({type(exc).__name__}: {exc})"
        ) from exc
    meta = group.attrs.get(META_KEY)
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ArtifactError(
            f"{path!r} is a Zarr group but not a krr-pipeline model artifact (no "
            f"{META_KEY!r} metadata of format {FORMAT!r})"
        )
    version = meta.get("format_version")
    if version not in SUPPORTED_VERSIONS:
        raise ArtifactError(
            f"model artifact {path!r} has format version {version!r} (written by krr-pipeline "
            f"{meta.get('package_version', '?')}); this krr-pipeline {_package_version()} reads "
            f"versions {list(SUPPORTED_VERSIONS)}. Load it with a matching krr-pipeline version."
        )
    if meta.get("complete") is not True:
        raise ArtifactError(
            f"model artifact {path!r} is incomplete: its save was interrupted. Save the model again."
        )
    body = {k: v for k, v in meta.items() if k not in ("meta_checksum", "complete")}
    if fingerprint_obj(body) != meta.get("meta_checksum"):
        raise ArtifactError(
            f"model artifact {path!r}: the metadata checksum does not match; its zarr.json was "
            "edited or corrupted. Save the model again."
        )
    return group, meta


def _load_array(group: zarr.Group, name: str, record: dict[str, Any], path: str) -> np.ndarray:
    try:
        arr = group[name]
        data = np.asarray(arr[...])
    except StoreUnreachable:  # a store that stops answering: not a damaged artifact
        raise
    except Exception as exc:
        raise ArtifactError(
            f"model artifact {path!r}: array {name!r} is missing or unreadable "
            f"({type(exc).__name__}: {exc})"
        ) from exc
    if list(data.shape) != record["shape"] or data.dtype.str != record["dtype"]:
        raise ArtifactError(
            f"model artifact {path!r}: array {name!r} has shape {data.shape} and dtype "
            f"{data.dtype}, the metadata says {tuple(record['shape'])} and {record['dtype']}"
        )
    got = fingerprint_blocks([data])
    if got != record["checksum"]:
        raise ArtifactError(
            f"model artifact {path!r}: array {name!r} fails its checksum (stored "
            f"{record['checksum']}, content {got}); the artifact is corrupt. Save the model again."
        )
    return data


def load_artifact(
    path_or_url: str | os.PathLike, *, verify: bool = True, x_train: Any = None
) -> Model:
    """Load a model saved by :func:`save_artifact`.

    Parameters
    ----------
    path_or_url : str or path
        Directory or fsspec URL of the artifact.
    verify : bool
        Check the checksum of a referenced X_train (stored arrays are always
        checked; they are read whole anyway).
    x_train : str, path or array, optional
        Where the referenced X_train is, for an artifact saved with
        ``x_train_ref`` outside its own directory: a ``.npy`` path, a Zarr
        path or URL, or an array. Without it, a reference is followed only
        when it resolves inside the artifact directory (never ``..``, an
        outside absolute path or a URL). Its shape, dtype and checksum are
        checked against the artifact's record either way.

    Returns
    -------
    Model

    Raises
    ------
    FileNotFoundError
        Nothing at the path, or a referenced X_train is gone.
    ArtifactError
        Not an artifact, an interrupted save, an unknown format version, a
        checksum that does not match (array or metadata), or an X_train
        reference that leads out of the artifact without ``x_train=``.
    """
    path = normalise_path(path_or_url)
    group, meta = _open_meta(path)
    arrays = meta["arrays"]
    dual_coef = _load_array(group, "dual_coef", arrays["dual_coef"], path)
    ref = meta.get("x_train_ref")
    if ref is None:
        if x_train is not None:
            raise ValueError(
                f"x_train= was given, but model artifact {path!r} stores X_train itself; "
                "leave x_train out"
            )
        X_train = _load_array(group, "X_train", arrays["X_train"], path)
        ref_url = None
    else:
        if x_train is None:
            ref_url = resolve_stored_ref(ref["url"], path)
            if ref_url is None:
                raise ArtifactError(escape_message(ref["url"], path))
            src = read_ref(ref_url)
        elif isinstance(x_train, str | os.PathLike):
            ref_url = normalise_path(x_train)
            src = read_ref(ref_url)
        else:
            ref_url, src = None, x_train
        if list(src.shape) != ref["shape"] or np.dtype(src.dtype).str != ref["dtype"]:
            raise ArtifactError(
                f"model artifact {path!r}: referenced X_train {ref_url or ref['url']!r} has shape "
                f"{tuple(src.shape)} and dtype {src.dtype}, expected {tuple(ref['shape'])} and "
                f"{ref['dtype']}"
            )
        if verify and _checksum_zarr(src) != ref["checksum"]:
            raise ArtifactError(
                f"model artifact {path!r}: referenced X_train {ref_url or ref['url']!r} changed since the "
                "model was saved (content checksum differs). Restore it or refit."
            )
        X_train = np.asarray(src[...])
    try:
        kernel = kernel_from_spec(meta["kernel"])
    except (ValueError, TypeError) as exc:
        raise ArtifactError(f"model artifact {path!r}: bad kernel spec ({exc})") from exc
    n_out = None if dual_coef.ndim == 1 else dual_coef.shape[1]
    pre = check_preprocessing(meta.get("preprocessing"), X_train.shape[1], n_out)
    lam = meta["regularization"]
    return Model(
        X_train=X_train,
        dual_coef=dual_coef,
        kernel=kernel,
        regularization=np.asarray(lam) if isinstance(lam, list) else float(lam),
        regularization_convention=meta["regularization_convention"],
        preprocessing=pre,
        fingerprint_chain=dict(meta["fingerprints"].get("chain", {})),
        extra=dict(meta.get("extra", {})),
        model_fingerprint=meta["fingerprints"]["model"],
        package_version=meta.get("package_version", ""),
        format_version=int(meta["format_version"]),
        x_train_ref=ref_url,
        path=path,
        feature_names=loaded_names(meta, "feature_names", X_train.shape[1]),
        target_names=loaded_names(meta, "target_names", n_out or 1),
    )
