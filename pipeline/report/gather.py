"""Read a run directory into a :class:`RunData`, through its manifest.

Every location comes from the manifest's stage outputs, never from a path
assumed here, so the report follows the run directory's layout. Arrays are read
through their recorded checksums (:func:`pipeline.stages.catalog.load_npy_verified`,
:func:`pipeline.storage.read_all`). A section the run does not have (no ``cv``
section, a Cholesky solve without a CG curve, no test split) or whose data cannot
be read is left empty, with a short note saying why: gathering never fails on a
missing section, only on a directory that holds no run at all.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.stages import recorded_fit_plan
from pipeline.stages.catalog import load_npy_verified
from pipeline.stages.ingest import open_rows
from pipeline.stages.lock import check_run_dir_files
from pipeline.stages.manifest import MANIFEST_NAME, Manifest
from pipeline.stages.outputs import SolveOutput
from pipeline.storage import read_all
from pipeline.storage.location import is_url, read_bytes

__all__ = ["RunData", "StageInfo", "gather"]


@dataclass
class StageInfo:
    """One stage's manifest record, as the report shows it."""

    name: str
    status: str
    seconds: float | None = None
    peak_rss_bytes: int | None = None
    peak_children_rss_bytes: int | None = None
    process_max_rss_bytes: int | None = None
    fingerprint: str | None = None
    error: str | None = None


@dataclass
class RunData:
    """What the report needs from one run directory (``None`` where the run has none).

    ``notes[section]`` says why a section is empty (``plan``, ``stages``, ``cg``,
    ``cv``, ``cv_heatmap``, ``heldout``, ``metrics``, ``compare``).
    """

    run_dir: str
    name: str | None = None
    created: float | None = None
    config: dict[str, Any] = field(default_factory=dict)
    stages: list[StageInfo] = field(default_factory=list)
    method: str | None = None
    plan: dict[str, Any] | None = None
    plan_reason: str | None = None
    solve: dict[str, Any] = field(default_factory=dict)
    cg_history: np.ndarray | None = None
    cv_results: dict[str, Any] | None = None
    select: dict[str, Any] | None = None
    metrics: dict[str, float] | None = None
    n_test: int | None = None
    baseline: dict[str, Any] | None = None
    baseline_note: str | None = None
    mean_baseline: dict[str, Any] | None = None
    #: ``evaluate.compare``'s rows and sentence (:mod:`pipeline.stages.compare`)
    compare: list[dict[str, Any]] | None = None
    compare_summary: str | None = None
    y_true: np.ndarray | None = None
    y_pred: np.ndarray | None = None
    notes: dict[str, str] = field(default_factory=dict)


def _done(manifest: Any, name: str) -> dict[str, Any] | None:
    rec = manifest.stages.get(name)
    return rec.outputs if rec is not None and rec.status == "done" else None


def _why_absent(manifest: Any, name: str, what: str) -> str:
    rec = manifest.stages.get(name)
    if rec is None or rec.status == "pending":
        return f"no {what}: the {name} stage has not run"
    if rec.status == "skipped":
        return f"no {what}: the {name} stage is disabled for this configuration"
    return f"no {what}: the {name} stage is {rec.status}"


def _stages(manifest: Any) -> list[StageInfo]:
    out = []
    for name, rec in manifest.stages.items():
        r = rec.resources or {}
        seconds = r.get("seconds")
        if seconds is None and rec.started is not None and rec.finished is not None:
            seconds = rec.finished - rec.started
        out.append(
            StageInfo(
                name=name,
                status=rec.status,
                seconds=None if seconds is None else float(seconds),
                peak_rss_bytes=r.get("peak_rss_bytes"),
                peak_children_rss_bytes=r.get("peak_children_rss_bytes"),
                process_max_rss_bytes=r.get("process_max_rss_bytes"),
                fingerprint=rec.fingerprint,
                error=rec.error,
            )
        )
    return out


def _solve(data: RunData, manifest: Any) -> None:

    sol = _done(manifest, "solve")
    if sol is None:
        data.notes["plan"] = _why_absent(manifest, "solve", "fit plan")
        data.notes["cg"] = _why_absent(manifest, "solve", "CG convergence curve")
        recorded = recorded_fit_plan(data.run_dir, manifest)
        if recorded is not None:  # the plan the unfinished solve runs (RUN_DIR/plan.json)
            data.plan, data.plan_reason = recorded["plan"], recorded["reason"]
            data.method = recorded["plan"].get("solver")
        return
    s = SolveOutput.from_json(sol)
    data.method, data.plan, data.plan_reason = s.method, s.plan or None, s.plan_reason or None
    data.solve = dict(s.details)
    if not data.plan:
        data.notes["plan"] = "the solve stage recorded no fit plan (a run from an older version)"
    if s.method != "cg":
        data.notes["cg"] = f"no CG convergence curve: this run solved with {s.method}"
        return
    path = s.details.get("history")
    if not path:
        data.notes["cg"] = "no CG convergence curve: the solve stage recorded no history file"
        return
    try:
        h = np.asarray(load_npy_verified(path, s.details.get("history_crc32c")), dtype=float)
    except (OSError, ValueError) as e:  # CorruptFileError is a ValueError
        data.notes["cg"] = f"no CG convergence curve: {e}"
        return
    data.cg_history = h.reshape(len(h), -1)


def _cell(v: str) -> Any:
    if v == "":
        return None
    try:
        f = float(v)
    except ValueError:
        return v
    return int(f) if f.is_integer() and "." not in v and "e" not in v.lower() else f


def read_cv_results(text: str) -> dict[str, Any]:
    """``cv_results.csv`` (written by the select stage) back as a ``cv_results_`` dict."""
    rows = list(csv.DictReader(io.StringIO(text)))
    if not rows:
        raise ValueError("cv_results.csv has no rows")
    pcols = [c for c in rows[0] if c.startswith("param_")]
    res: dict[str, Any] = {"params": []}
    for r in rows:
        p = {c[len("param_") :]: _cell(r[c]) for c in pcols}
        p = {k: (float(v) if k == "alpha" else v) for k, v in p.items() if v is not None}
        if any(isinstance(v, float) and math.isnan(v) for v in p.values()):
            p = {k: v for k, v in p.items() if not (isinstance(v, float) and math.isnan(v))}
        res["params"].append(p)
    for c in rows[0]:
        if c.endswith("_score") or c.endswith("_time"):
            res[c] = np.array([float(r[c]) if r[c] != "" else np.nan for r in rows])
    for need in ("mean_test_score", "std_test_score", "rank_test_score"):
        if need not in res:
            raise ValueError(f"cv_results.csv has no {need!r} column")
    return res


def _select(data: RunData, manifest: Any) -> None:

    sel = _done(manifest, "select")
    if sel is None:
        data.notes["cv"] = _why_absent(manifest, "select", "cross-validation")
        if "cv" in data.notes and "disabled" in data.notes["cv"]:
            data.notes["cv"] = "no cross-validation: the config has no cv section"
        return
    data.select = dict(sel)
    table = (sel.get("report") or {}).get("table")
    if not table:
        data.notes["cv"] = "the select stage recorded no cv_results.csv"
        return
    try:
        data.cv_results = read_cv_results(bytes(read_bytes(table)).decode())
    except (OSError, ValueError) as e:
        data.notes["cv"] = f"cannot read the CV results {table!r}: {e}"


def _evaluate(data: RunData, manifest: Any) -> None:
    ev = _done(manifest, "evaluate")
    if ev is None:
        why = _why_absent(manifest, "evaluate", "held-out metrics")
        if "disabled" in why:
            why = "no held-out metrics: the run has no test split"
        data.notes["metrics"] = why
        data.notes["heldout"] = why.replace("held-out metrics", "residual or parity plots")
        data.notes["compare"] = why.replace("held-out metrics", "exactness comparison")
        return
    data.metrics = dict(ev.get("metrics") or {}) or None
    if data.metrics is None:
        data.notes["metrics"] = ev.get("note") or "the evaluate stage recorded no metrics"
    data.n_test = ev.get("n_test")
    data.baseline = ev.get("baseline")
    data.baseline_note = ev.get("baseline_note")
    data.mean_baseline = ev.get("mean_baseline")
    data.compare, data.compare_summary = ev.get("compare"), ev.get("compare_summary")
    if not data.compare:
        data.notes["compare"] = (
            "no exactness comparison: the config has no evaluate.compare (true, or "
            "{nystrom: [...], subsample: [...]})"
        )
    try:
        data.y_true, data.y_pred = _heldout(ev, manifest)
    except (OSError, ValueError, KeyError) as e:
        data.notes["heldout"] = f"no residual or parity plots: {e}"


def _heldout(ev: dict[str, Any], manifest: Any) -> tuple[np.ndarray, np.ndarray]:
    """The held-out targets and predictions: the evaluate stage's checked copies, or
    (a run from before they were saved) the ingest and predict stages' stored arrays."""

    h = ev.get("heldout")
    if h:
        y_true = load_npy_verified(h["y_true"], h.get("y_true_crc32c"))
        y_pred = load_npy_verified(h["y_pred"], h.get("y_pred_crc32c"))
    else:
        ing, pred = _done(manifest, "ingest"), _done(manifest, "predict")
        if not ing or not pred or "test" not in pred or not ing.get("y_test"):
            raise ValueError("the run recorded no held-out predictions")
        y_true = np.asarray(open_rows(ing, "y_test").compute())
        y_pred = read_all(pred["test"]["store"], pred["test"]["name"], row_keys=True)
    y_true = np.asarray(y_true, dtype=float)
    y_true = y_true.reshape(len(y_true), -1)
    return y_true, np.asarray(y_pred, dtype=float).reshape(y_true.shape)


def gather(run_dir: str | Path) -> RunData:
    """Everything the report shows about ``run_dir`` (see :class:`RunData`).

    Raises
    ------
    FileNotFoundError
        ``run_dir`` holds no ``manifest.json`` (it is not a run directory).
    pipeline.stages.manifest.ManifestError
        The manifest exists but cannot be read.
    pipeline.stages.lock.RunDirUnusable
        The run directory holds a FIFO, socket, device or symbolic link to a file.
    """
    if not is_url(run_dir):  # a FIFO there would hold the report for ever: refused
        check_run_dir_files(Path(run_dir))
    if not is_url(run_dir) and not (Path(run_dir) / MANIFEST_NAME).is_file():
        raise FileNotFoundError(
            f"{str(run_dir)!r} is not a run directory (it has no {MANIFEST_NAME}); pass the "
            "run directory of a `krr run` (the config's run_dir, or its --run-dir)."
        )
    manifest = Manifest.load(run_dir)
    if not manifest.stages:
        raise FileNotFoundError(
            f"{str(run_dir)!r} holds no run (its {MANIFEST_NAME} records no stage); run "
            "`krr run CONFIG` first."
        )
    data = RunData(run_dir=str(run_dir), created=manifest.created, config=manifest.config)
    data.name = (manifest.config or {}).get("name")
    data.stages = _stages(manifest)
    if not any(s.seconds is not None for s in data.stages):
        data.notes["stages"] = "no stage has run yet"
    _solve(data, manifest)
    _select(data, manifest)
    _evaluate(data, manifest)
    return data
