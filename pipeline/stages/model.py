"""Model stage: the fitted-model artifact, for ``krr predict MODEL INPUT OUTPUT``.

Writes ``{stage_dir}/model``, the one fitted-model type
(:class:`pipeline.models.artifact.Model`, saved with :meth:`~pipeline.models.artifact.Model.save`):
the training rows (as the kernel sees them), α, the kernel spec, λ and its
convention, the scaler, and the fingerprint chain. No pickle.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.kernels import make_kernel
from pipeline.models.artifact import Model
from pipeline.stages.catalog import stage_catalog
from pipeline.stages.ingest import preprocessing_params
from pipeline.stages.outputs import IngestOutput, ModelOutput, SolveOutput
from pipeline.stages.solve import load_alpha, model_rows


def run(
    stage_dir: Path,
    inputs: dict[str, dict[str, Any]],
    *,
    kernel: dict[str, Any],
    lam: float,
    lam_convention: str,
) -> ModelOutput:
    """Write the model artifact of the solved run (the stage fingerprints are its chain)."""
    ing = IngestOutput.from_json(inputs["ingest"])
    sol = SolveOutput.from_json(inputs["solve"])
    alpha = load_alpha(sol)
    if alpha.ndim == 2 and alpha.shape[1] == 1:
        alpha = alpha[:, 0]  # one target: the model predicts 1-D, like scikit-learn
    path = str(stage_catalog("model", stage_dir).path("model"))
    model = Model(
        X_train=model_rows(ing, sol).compute(),
        dual_coef=alpha,
        kernel=make_kernel(kernel),
        regularization=lam,
        regularization_convention=lam_convention,
        preprocessing=preprocessing_params(ing),
        feature_names=ing.feature_names,
        target_names=ing.target_names,
        fingerprint_chain={
            f"{name}_stage": inputs[name]["_fingerprint"]
            for name in ("ingest", "solve")
            if inputs[name].get("_fingerprint")
        },
        extra={
            "writer": "krr run",
            "solver": sol.method,
            "feature_names": ing.feature_names,
            "target_names": ing.target_names,
            # categories read as codes: krr predict applies them to a table's raw values
            **({"ordinal": ing.ordinal} if ing.ordinal else {}),
        },
    )
    art = model.save(path, overwrite=True)
    return ModelOutput(path=path, model_fingerprint=art.model_fingerprint)
