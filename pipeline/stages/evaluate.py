"""Evaluate stage: metrics on the held-out rows, next to scikit-learn's on the same split.

The metrics are computed in the original units of y. When the training split is
small enough for scikit-learn's in-memory ``KernelRidge`` (``baseline_max_rows``),
the same data, kernel and ridge are fitted with it as a baseline. The trivial
baseline, predicting the training mean of y for every row, is always scored
(``mean_baseline``). The held-out targets and predictions are saved as
``y_true.npy`` and ``y_pred.npy`` with their CRC-32C (``heldout``), so ``krr
report`` draws the residual and parity plots without recomputing anything.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.engine.where import in_this_process, local_scheduler
from pipeline.float_range import pow2_exponents
from pipeline.kernels import make_kernel
from pipeline.linalg.cholesky import regularisation_shift
from pipeline.linalg.dense_dual import potrf_threads
from pipeline.linalg.dense_memory import SAFETY_FRACTION, available_memory
from pipeline.stages.catalog import Catalog, stage_catalog
from pipeline.stages.compare import compare_rows, compare_summary
from pipeline.stages.config import EvaluateConfig
from pipeline.stages.ingest import open_rows
from pipeline.stages.outputs import EvaluateOutput, IngestOutput, PredictOutput
from pipeline.storage import read_all


def regression_metrics(
    y_true: np.ndarray, y_pred: np.ndarray, names: list[str]
) -> dict[str, float]:
    """RMSE, MAE and R² (averaged over outputs) of ``y_pred`` against ``y_true``.

    The squares are taken on ``2**k`` times the errors (RMSE) or each output (R²)
    when those lie far from 1 (:func:`pipeline.float_range.pow2_exponents`; k = 0
    otherwise): on a y of order 1e-200 they underflowed to 0, an RMSE of 0 and an
    R² of 1 whatever the predictions; on 1e200 they overflowed (inf, NaN).
    """
    y_true = np.asarray(y_true, dtype=np.float64).reshape(len(y_true), -1)
    y_pred = np.asarray(y_pred, dtype=np.float64).reshape(y_true.shape)
    err = y_pred - y_true
    out: dict[str, float] = {}
    if "rmse" in names:
        k = int(pow2_exponents(np.max(np.abs(err), initial=0.0)))
        rmse = np.sqrt(np.mean(np.ldexp(err, k) ** 2)) if k else np.sqrt(np.mean(err**2))
        out["rmse"] = float(np.ldexp(rmse, -k) if k else rmse)
    if "mae" in names:
        out["mae"] = float(np.mean(np.abs(err)))
    if "r2" in names:  # a ratio per output: the same on 2**k times the output
        k = pow2_exponents(np.max(np.abs(y_true), axis=0, initial=0.0))
        y_t, e = (np.ldexp(y_true, k), np.ldexp(err, k)) if np.any(k) else (y_true, err)
        ss_res = np.sum(e**2, axis=0)
        ss_tot = np.sum((y_t - y_t.mean(axis=0)) ** 2, axis=0)
        out["r2"] = float(np.mean(1.0 - ss_res / np.where(ss_tot > 0, ss_tot, 1.0)))
    return out


def _sklearn_kernel(spec: dict[str, Any], n_features: int) -> tuple[Any, dict[str, Any]]:
    """scikit-learn's own kernel for a spec when it has one, else a precomputed kernel."""
    name, p = spec["name"], spec.get("params", {})
    if name == "rbf" and not isinstance(p.get("length_scale"), list):  # ARD: precomputed
        return "rbf", {"gamma": make_kernel(spec).effective_gamma(n_features)}
    if name == "laplacian":
        return "laplacian", {"gamma": p.get("gamma") or 1.0 / n_features}
    if name == "linear":
        return "linear", {}
    if name == "polynomial":
        return "polynomial", {
            "degree": p.get("degree", 3),
            "gamma": p.get("gamma") or 1.0 / n_features,
            "coef0": p.get("coef0", 1.0),
        }
    return "precomputed", {}


def sklearn_baseline(
    X_train: np.ndarray,
    y_train: np.ndarray,
    X_test: np.ndarray,
    kernel: dict[str, Any],
    shift: float,
) -> tuple[np.ndarray, float, str]:
    """Fit scikit-learn's KernelRidge with ``alpha=shift``; return predictions, fit seconds, kernel."""
    from sklearn.kernel_ridge import KernelRidge

    kname, kparams = _sklearn_kernel(kernel, X_train.shape[1])
    model = KernelRidge(alpha=shift, kernel=kname, **kparams)
    # one BLAS thread: OpenBLAS' 2-thread potrf crashes at n >= ~15.5k (docs/PERFORMANCE.md)
    with potrf_threads(X_train.shape[0]):
        t0 = time.perf_counter()
        if kname == "precomputed":
            k = make_kernel(kernel)
            model.fit(k(X_train), y_train)
            pred = model.predict(k(X_test, X_train))
        else:
            model.fit(X_train, y_train)
            pred = model.predict(X_test)
    return np.asarray(pred), time.perf_counter() - t0, kname


def _rows_here(ing: IngestOutput, name: str) -> np.ndarray:
    """A stored ingest array read whole in this process, which needs it here (as it
    reads the predictions): a client would read it on a worker and send it back, one
    round trip of 0.3-0.4 s each on the embedded LocalCluster."""
    with in_this_process():
        return np.asarray(open_rows(ing, name).compute(**local_scheduler()))


def _mean_baseline(ing: IngestOutput, y_test: np.ndarray, names: list[str]) -> dict[str, Any]:
    """The metrics of predicting the training mean of y for every held-out row."""
    y_train = np.asarray(_rows_here(ing, "y_train"), dtype=np.float64)
    y_train = y_train.reshape(len(y_train), -1)
    if ing.y_scaler:  # stored standardised: back to the original units
        y_train = y_train * np.asarray(ing.y_scaler["scale"]) + np.asarray(ing.y_scaler["mean"])
    y_test = np.asarray(y_test, dtype=np.float64).reshape(len(y_test), -1)
    pred = np.broadcast_to(y_train.mean(axis=0), y_test.shape)
    return {"name": "mean of y_train", "metrics": regression_metrics(y_test, pred, names)}


def _save_heldout(catalog: Catalog, y_test: np.ndarray, y_hat: np.ndarray) -> dict[str, Any]:
    """``y_true.npy`` and ``y_pred.npy`` (float64, rows x outputs) and their CRC-32C."""

    y_true = np.asarray(y_test, dtype=np.float64).reshape(len(y_test), -1)
    y_pred = np.asarray(y_hat, dtype=np.float64).reshape(y_true.shape)
    out: dict[str, Any] = {}
    for key, arr in (("y_true", y_true), ("y_pred", y_pred)):
        out[f"{key}_crc32c"] = catalog.save(key, arr)
        out[key] = str(catalog.path(key))
    return out


def run(
    stage_dir: Path,
    inputs: dict[str, dict[str, Any]],
    *,
    evaluate: EvaluateConfig,
    kernel: dict[str, Any],
    lam: float,
    lam_convention: str,
    run_n_centers: int | None = None,
) -> EvaluateOutput:
    """Score the test predictions; fit the scikit-learn baseline when it fits.

    ``evaluate`` is the config's frozen evaluate section (metrics, baseline and
    compare). ``run_n_centers``: the run solved Nyström with this many centres
    (given with ``evaluate.compare`` only; an M >= n_train solved exactly).
    """
    catalog = stage_catalog("evaluate", stage_dir)
    ing = IngestOutput.from_json(inputs["ingest"])
    t = PredictOutput.from_json(inputs["predict"]).test
    if t is None:
        return EvaluateOutput(metrics={}, note="no test set: nothing to evaluate")
    names = list(evaluate.metrics)
    baseline, baseline_max_rows = evaluate.baseline, evaluate.baseline_max_rows
    y_test = _rows_here(ing, "y_test")
    # every prediction block checked against its crc32c: a damaged or deleted block
    # raises CorruptTileError, and `krr run` recomputes it in the predict stage
    y_hat = read_all(t.store, t.name, row_keys=True)
    out: dict[str, Any] = {
        "n_test": int(y_test.shape[0]),
        "metrics": regression_metrics(y_test, y_hat, names),
    }
    out["mean_baseline"] = _mean_baseline(ing, y_test, names)
    out["heldout"] = _save_heldout(catalog, y_test, y_hat)
    n = ing.n_train
    want = baseline == "sklearn" or (baseline == "auto" and n <= baseline_max_rows)
    # scikit-learn holds ~3 copies of the n x n kernel: never start it past the memory
    need = 3 * n * n * 8
    fits = need <= SAFETY_FRACTION * available_memory()
    if want and not fits:
        out["baseline"] = None
        out["baseline_note"] = (
            f"scikit-learn baseline skipped: its KernelRidge needs about 3·n²·8 = "
            f"{need / 1e9:.1f} GB for n_train={n}, more than the memory available"
        )
    elif want:
        X_train = _rows_here(ing, "X_train")
        y_train = _rows_here(ing, "y_train")
        X_test = _rows_here(ing, "X_test")
        if ing.scaler:
            X_test = (X_test - np.asarray(ing.scaler["mean"])) / np.asarray(ing.scaler["scale"])
        shift = regularisation_shift(lam, n, lam_convention)
        sk_pred, secs, kname = sklearn_baseline(X_train, y_train, X_test, kernel, shift)
        if ing.y_scaler:
            sk_pred = sk_pred * np.asarray(ing.y_scaler["scale"]) + np.asarray(ing.y_scaler["mean"])
        diff = np.abs(sk_pred.reshape(y_hat.shape) - y_hat)
        out["baseline"] = {
            "name": f"sklearn.kernel_ridge.KernelRidge(kernel={kname!r}, alpha={shift:g})",
            "metrics": regression_metrics(y_test, sk_pred, names),
            "fit_predict_seconds": secs,
            "max_abs_prediction_difference": float(diff.max()) if diff.size else 0.0,
            "max_rel_prediction_difference": float(diff.max() / max(np.abs(sk_pred).max(), 1e-300))
            if diff.size
            else 0.0,
        }
    elif baseline != "none" and "baseline_note" not in out:
        out["baseline"] = None
        out["baseline_note"] = (
            f"scikit-learn baseline skipped: n_train={n} > baseline_max_rows={baseline_max_rows} "
            "(its KernelRidge needs about 3·n²·8 bytes)"
        )
    if evaluate.compare is not None:
        own_m = run_n_centers if run_n_centers and run_n_centers < n else None
        out.update(_compare(catalog, ing, y_test, names, out["metrics"], evaluate, kernel, lam,
                            lam_convention, own_m))  # fmt: skip
    # metrics.json holds the metrics only: the held-out arrays are referenced (with
    # their checksums) by the stage outputs in the manifest, whose paths are run-relative
    result = EvaluateOutput.from_json(out)
    catalog.save("metrics", metrics_file_view(result))
    return result


def _compare(
    catalog: Catalog,
    ing: IngestOutput,
    y_test: np.ndarray,
    names: list[str],
    full_metrics: dict[str, float],
    evaluate: EvaluateConfig,
    kernel: dict[str, Any],
    lam: float,
    lam_convention: str,
    own_centers: int | None,
) -> dict[str, Any]:
    """``compare`` (the rows of :func:`pipeline.stages.compare.compare_rows`) and
    ``compare_summary`` (its sentence), scored on the held-out rows in y's units."""
    X_train = np.asarray(_rows_here(ing, "X_train"), dtype=np.float64)
    y_train = np.asarray(_rows_here(ing, "y_train"), dtype=np.float64)
    X_test = np.asarray(_rows_here(ing, "X_test"), dtype=np.float64)
    if ing.scaler:
        X_test = (X_test - np.asarray(ing.scaler["mean"])) / np.asarray(ing.scaler["scale"])

    def score(pred: np.ndarray) -> dict[str, float]:
        pred = np.asarray(pred, dtype=np.float64).reshape(len(pred), -1)
        if ing.y_scaler:  # fitted on the stored standardised y: back to y's units
            pred = pred * np.asarray(ing.y_scaler["scale"]) + np.asarray(ing.y_scaler["mean"])
        return regression_metrics(y_test, pred, names)

    c = evaluate.compare
    rows = compare_rows(
        X_train,
        y_train,
        X_test,
        score,
        kernel=kernel,
        lam=lam,
        lam_convention=lam_convention,
        nystrom=c.nystrom,
        subsample=c.subsample,
        seed=c.seed,
        store=str(catalog.path("compare_store")),
        full_metrics=full_metrics,
        full_n_centers=own_centers,
    )
    return {"compare": rows, "compare_summary": compare_summary(rows)}


def metrics_file_view(outputs: EvaluateOutput | Mapping[str, Any]) -> dict[str, Any]:
    """What ``metrics.json`` holds of the stage's outputs: all but the ``heldout`` paths."""
    if isinstance(outputs, EvaluateOutput):
        outputs = outputs.to_json()
    return {k: v for k, v in outputs.items() if k != "heldout"}
