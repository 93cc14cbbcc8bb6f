"""Predict stage: ŷ for the test rows (and an optional extra batch input).

Calls :func:`pipeline.predict.predict` with a Zarr output, so predictions are
written by row blocks with completion records and a killed prediction
resumes. The test rows are stored raw by the ingest stage, so prediction
applies the training scaler exactly as it does for new data.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.predict import output_format, predict, select_features, write_predictions
from pipeline.stages.ingest import open_rows, preprocessing_params
from pipeline.stages.solve import load_alpha
from pipeline.storage.location import join_path


def run(
    stage_dir: Path,
    inputs: dict[str, dict[str, Any]],
    *,
    kernel: dict[str, Any],
    input: str | None,
    columns: list[str] | None,
    output: str | None,
    block_size: int,
    input_identity: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Predict the test split and, if configured, ``input`` into ``output``.

    ``input_identity`` (the content identity of ``input``, computed by the
    runner) only enters the stage fingerprint: a changed input is predicted again.
    """
    del input_identity
    ing, sol = inputs["ingest"], inputs["solve"]
    X_train = open_rows(ing, "X_train")
    alpha = load_alpha(sol)
    pre = preprocessing_params(ing)
    common = dict(
        block_size=block_size, train_block_size=block_size, preprocessing=pre, overwrite=True
    )
    out: dict[str, Any] = {}
    X_test = open_rows(ing, "X_test")
    if X_test is not None:
        store = str(join_path(stage_dir, "predictions.zarr"))
        res = predict(X_test, X_train, alpha, kernel, out=store, out_name="test", **common)
        out["test"] = {
            "store": res.store,
            "name": res.name,
            "shape": list(res.shape),
            "blocks": res.n_blocks,
        }
    if input:
        feats = ing.get("feature_names")
        src = select_features(
            input,
            block_size,
            feature_names=feats,
            n_features=int(X_train.shape[1]),
            columns=columns,
        )
        store = output or str(join_path(stage_dir, "batch.zarr"))
        fmt = output_format(store)
        if fmt != "zarr":  # .npy / .csv / .parquet: computed in memory, written in one piece
            common.pop("overwrite")
            y = predict(src, X_train, alpha, kernel, progress=False, **common)
            crc = write_predictions(store, y, fmt, ing.get("target_names"))
            out["batch"] = {"path": store, "format": fmt, "shape": list(y.shape), "crc32c": crc}
            return out
        res = predict(src, X_train, alpha, kernel, out=store, out_name="predictions", **common)
        out["batch"] = {
            "store": res.store,
            "name": res.name,
            "shape": list(res.shape),
            "blocks": res.n_blocks,
        }
    return out
