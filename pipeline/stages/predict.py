"""Predict stage: ŷ for the test rows (and an optional extra batch input).

Predicts with the run's fitted model, the one fitted-model type
(:class:`pipeline.models.artifact.Model`, its training rows read block by block from the
ingest store), into a Zarr output, so predictions are written by row blocks with
completion records and a killed prediction resumes. The test rows are stored raw
by the ingest stage, so prediction applies the training scaler exactly as it does
for new data.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.kernels import make_kernel
from pipeline.linalg.predict_source import select_features
from pipeline.models.artifact import Model
from pipeline.stages.catalog import stage_catalog
from pipeline.stages.config import PredictConfig
from pipeline.stages.ingest import open_rows, preprocessing_params
from pipeline.stages.outputs import (
    IngestOutput,
    PredictedFile,
    PredictedRows,
    PredictOutput,
    SolveOutput,
)
from pipeline.stages.solve import load_alpha, model_rows
from pipeline.storage.predictions import check_prediction_output, write_predictions


def run(
    stage_dir: Path,
    inputs: dict[str, dict[str, Any]],
    *,
    predict: PredictConfig,
    kernel: dict[str, Any],
    block_size: int,
    input_identity: dict[str, Any] | None = None,
) -> PredictOutput:
    """Predict the test split and, if configured, ``predict.input`` into ``predict.output``.

    ``predict`` is the config's frozen predict section. ``input_identity`` (the
    content identity of its input, computed by the runner) only enters the stage
    fingerprint: a changed input is predicted again.
    """
    del input_identity
    catalog = stage_catalog("predict", stage_dir)
    ing = IngestOutput.from_json(inputs["ingest"])
    sol = SolveOutput.from_json(inputs["solve"])
    X_train = model_rows(ing, sol)  # (the centres of a Nyström solve)
    # the model the model stage saves, but with the stored rows read lazily and alpha as
    # solved ((n, 1) for one target: the predictions' shape and fingerprint stay as they were)
    model = Model(
        X_train=X_train,
        dual_coef=load_alpha(sol),
        kernel=make_kernel(kernel),
        regularization=sol.lam,
        regularization_convention=sol.lam_convention,
        preprocessing=preprocessing_params(ing),
        feature_names=ing.feature_names,
        target_names=ing.target_names,
    )
    common = dict(block_size=block_size, train_block_size=block_size, overwrite=True)
    test = batch = None
    X_test = open_rows(ing, "X_test")
    if X_test is not None:
        store, name = catalog.store("predictions")
        res = model.predict(X_test, out=store, out_name=name, **common)
        test = PredictedRows(res.store, res.name, list(res.shape), res.n_blocks, res.fingerprint)
    if predict.input:
        src = select_features(
            predict.input,
            block_size,
            feature_names=ing.feature_names,
            n_features=int(X_train.shape[1]),
            columns=predict.columns,
            ordinal=ing.ordinal,
        )
        store, name = catalog.store("batch")
        store = predict.output or store
        fmt = check_prediction_output(store, overwrite=True)  # before predicting
        if fmt != "zarr":  # .npy / .csv / .parquet: computed in memory, written in one piece
            common.pop("overwrite")
            y = model.predict(src, progress=False, **common)
            # a run replaces the predictions it wrote, never a file of the user's
            crc = write_predictions(store, y, fmt, ing.target_names, overwrite=True)
            batch = PredictedFile(path=store, format=fmt, shape=list(y.shape), crc32c=crc)
        else:
            res = model.predict(src, out=store, out_name=name, **common)
            batch = PredictedRows(
                res.store, res.name, list(res.shape), res.n_blocks, res.fingerprint
            )
    return PredictOutput(test=test, batch=batch)
