"""Typed outputs of the stages.

A stage returns one of these; the runner stores its ``to_json()`` in the manifest
(the same JSON keys as before, so existing run directories stay valid), and a
downstream stage reads its input back with ``from_json``. Paths inside the run
directory are relativised to ``@run/`` by the manifest, as for any output.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

__all__ = [
    "EvaluateOutput",
    "GramOutput",
    "IngestOutput",
    "ModelOutput",
    "PredictOutput",
    "PredictedFile",
    "PredictedRows",
    "SolveOutput",
]


def _known(cls: type, d: Mapping[str, Any]) -> dict[str, Any]:
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in d.items() if k in names}


@dataclass(frozen=True)
class GramOutput:
    """The stored Gram: ``open_gram(store, name)``."""

    store: str
    name: str
    fingerprint: str
    shape: list[int]
    block_size: int
    dtype: str
    tiles: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> GramOutput:
        return cls(**_known(cls, d))


@dataclass(frozen=True)
class SolveOutput:
    """α (in ``alpha.npy``, with its CRC-32C), the fit plan and the solver's details.

    ``details`` holds the solver-specific keys (Cholesky: shift, factor, jitter;
    CG: shift, n_iter, converged, rel_residual, history); they are stored at the top
    level of the JSON, as before.
    """

    method: str
    alpha: str
    alpha_crc32c: int
    lam: float
    lam_convention: str
    plan: dict[str, Any]
    plan_reason: str
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "details"}
        return {**out, **self.details}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> SolveOutput:
        known = _known(cls, d)
        details = {k: v for k, v in d.items() if k not in known and not k.startswith("_")}
        known.setdefault("plan", {})
        known.setdefault("plan_reason", "")
        return cls(**known, details=details)


@dataclass(frozen=True)
class ModelOutput:
    """Where the fitted model was written, and its content fingerprint."""

    path: str
    model_fingerprint: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ModelOutput:
        return cls(**_known(cls, d))


@dataclass(frozen=True)
class IngestOutput:
    """The stored, preprocessed data: row-blocked arrays in ``store`` and their shape.

    ``X_train``, ``y_train``, ``X_test`` and ``y_test`` are array names in
    ``store`` (``X_test``/``y_test`` are None without a test set); open them with
    :func:`pipeline.stages.ingest.open_rows`. ``scaler`` and ``y_scaler`` are
    ``{"mean": [...], "scale": [...]}`` or None; ``x_fingerprint`` is the content
    hash of the stored ``X_train``; ``ordinal`` the columns read as category codes
    (``data.ordinal``), which prediction applies to a table's raw values too.
    """

    store: str
    block_size: int
    X_train: str
    y_train: str
    X_test: str | None = None
    y_test: str | None = None
    n_train: int = 0
    n_test: int = 0
    n_features: int = 1
    n_outputs: int = 1
    feature_names: list[str] | None = None
    target_names: list[str] | None = None
    scaler: dict[str, list[float]] | None = None
    y_scaler: dict[str, list[float]] | None = None
    x_fingerprint: str | None = None
    ordinal: dict[str, list[str]] | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | IngestOutput) -> IngestOutput:
        if isinstance(d, IngestOutput):
            return d
        return cls(**_known(cls, d))


@dataclass(frozen=True)
class PredictedRows:
    """Predictions stored as row blocks (with completion records) in a Zarr store."""

    store: str
    name: str
    shape: list[int]
    blocks: int
    #: the stored array's fingerprint (model and input): a store that another
    #: configuration overwrote since is found by it (None: a run of a version that did not record it)
    fingerprint: str | None = None

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        if out["fingerprint"] is None:  # as runs before it wrote (the same JSON)
            del out["fingerprint"]
        return out


@dataclass(frozen=True)
class PredictedFile:
    """Predictions written in one piece (``.npy``, ``.csv``, ``.parquet``) with their CRC-32C."""

    path: str
    format: str
    shape: list[int]
    crc32c: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _predicted(d: Mapping[str, Any] | None) -> PredictedRows | PredictedFile | None:
    if d is None:
        return None
    if "path" in d:
        return PredictedFile(**_known(PredictedFile, d))
    return PredictedRows(**_known(PredictedRows, d))


@dataclass(frozen=True)
class PredictOutput:
    """The test rows' predictions (``test``) and the batch input's (``batch``), each optional.

    Only the ones present are keys of the JSON, as before.
    """

    test: PredictedRows | None = None
    batch: PredictedRows | PredictedFile | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.test is not None:
            out["test"] = self.test.to_json()
        if self.batch is not None:
            out["batch"] = self.batch.to_json()
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> PredictOutput:
        return cls(test=_predicted(d.get("test")), batch=_predicted(d.get("batch")))


@dataclass(frozen=True)
class EvaluateOutput:
    """Metrics on the held-out rows, next to the baselines'.

    ``baseline`` is scikit-learn's (a dict with ``name``, ``metrics``, ...), or None
    with ``baseline_note`` saying why it was skipped; ``heldout`` names
    ``y_true.npy`` and ``y_pred.npy`` with their CRC-32C. Without a test set only
    ``metrics`` (empty) and ``note`` are set. The JSON holds the keys that are set
    (``baseline`` also when it is None with a note), as before. With ``evaluate.compare``,
    ``compare`` holds one row per comparison model and ``compare_summary`` its sentence.
    """

    metrics: dict[str, float] = field(default_factory=dict)
    n_test: int | None = None
    mean_baseline: dict[str, Any] | None = None
    heldout: dict[str, Any] | None = None
    baseline: dict[str, Any] | None = None
    baseline_note: str | None = None
    note: str | None = None
    #: ``evaluate.compare``'s rows (:mod:`pipeline.stages.compare`) and their sentence
    compare: list[dict[str, Any]] | None = None
    compare_summary: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.n_test is not None:
            out["n_test"] = self.n_test
        out["metrics"] = dict(self.metrics)
        for key in ("note", "mean_baseline", "heldout"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.baseline is not None or self.baseline_note is not None:
            out["baseline"] = self.baseline
        if self.baseline_note is not None:
            out["baseline_note"] = self.baseline_note
        for key in ("compare", "compare_summary"):  # only with evaluate.compare
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> EvaluateOutput:
        return cls(**_known(cls, d))
