"""Predict stage: ŷ for the test rows (and an optional extra batch input).

Calls :func:`pipeline.predict.predict` with a Zarr output, so predictions are
written by row blocks with completion records and a killed prediction
resumes. The test rows are stored raw by the ingest stage, so prediction
applies the training scaler exactly as it does for new data.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.stages._deps import require
from pipeline.stages.ingest import open_rows, preprocessing_params
from pipeline.stages.solve import load_alpha


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
    predict = require("pipeline.predict", "predict", "the predict stage")
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
        store = str(Path(stage_dir) / "predictions.zarr")
        res = predict(X_test, X_train, alpha, kernel, out=store, out_name="test", **common)
        out["test"] = {
            "store": res.store,
            "name": res.name,
            "shape": list(res.shape),
            "blocks": res.n_blocks,
        }
    if input:
        src: Any = input
        if columns:
            as_row_blocks = require("pipeline.io", "as_row_blocks", "the predict stage")
            src = as_row_blocks(input, block_size, columns=columns)
        store = output or str(Path(stage_dir) / "batch.zarr")
        res = predict(src, X_train, alpha, kernel, out=store, out_name="predictions", **common)
        out["batch"] = {
            "store": res.store,
            "name": res.name,
            "shape": list(res.shape),
            "blocks": res.n_blocks,
        }
    return out
