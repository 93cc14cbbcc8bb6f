"""Typed stage parameters and outputs (issue #16, item 4) keep every stage fingerprint.

The fingerprints below were computed on the code before the stages took typed config
sections: a run directory made by it stays valid (nothing is recomputed) after it.

One deliberate change since: the solve stage's fingerprint leaves out
``solver.cost_model`` unless ``method`` is ``auto``, the only method it can change (the
default cost model went from ``simple`` to ``calibrated``). A solve stage made before
that is recomputed once. With ``cost_model: simple`` put back into the solver section,
the old pins below are reproduced exactly (checked when the pins were changed), so
nothing else in the fingerprinted parameters moved.

A second one, in session 24: the ingest stage computes the training rows' moments over
row blocks of ``block_size`` (before, over the chunks Dask's row selection happened to
make), so the standardised ``X_train`` can differ in its last bits from what the older
code stored, and with it the content fingerprint inside the Gram's (``GRAM_PIN``). The
stage fingerprints (``RUN_PINS``) did not move, so a run directory made before keeps its
ingest, and with it its Gram; only new ingests store the new bits.
"""

from __future__ import annotations

import numpy as np
import zarr

from pipeline.stages import Manifest, default_stages, run_stages
from pipeline.stages.config import load_config
from pipeline.stages.stage import stage_fingerprint

CONFIG = {
    "name": "pin",
    "data": {"source": "npy", "path": "X.npy", "y_path": "y.npy"},
    "split": {"test_fraction": 0.25, "seed": 3},
    "kernel": {"name": "rbf", "params": {"gamma": 0.3}},
    "lambda": 0.01,
    "solver": {"method": "cholesky"},
    "evaluate": {"baseline": "none"},
    "block_size": 16,
}

#: computed on the base commit (before typed stage parameters)
PARAM_PINS = {
    "ingest": "8ff5db94fdc584c33842ecc1af9f0d68",
    "select": "91c024552b523ae296eaa44a36257df8",
    "gram": "bdbca5c099fde48c474f2ce87f69db2a",
    "solve": "2ef3fbc9fe7ed223d8d3b353c95f8af9",
    "model": "f9cb922f72fe207a87705545cfed35c8",
    "predict": "2e01bd4b1595ab5285e35ba2d636657e",
    "evaluate": "e25afc9a5926fd85f0aaad405e56b138",
}
RUN_PINS = {
    "ingest": "6e000fd0e3732c83e0167c8c585c457b",
    "gram": "61186e3da9940214fe79b6886ef56766",
    "solve": "334788693f9e30c40f14f888dab17604",
    "model": "a8395890dad99d660751ad636b09f105",
    "predict": "7293cd7c3f9810f97c369360a72d2378",
    "evaluate": "b0af79b4e685b8e0b028d8f9221a726f",
}
X_TRAIN_PIN = "f3b1a1f5f490d36511aca153c60395a4"
#: moved 2026-11-28 (issue #43 item 3): Gram tiles are fused by default, so the stored
#: bits and the Gram fingerprint moved (was e00f24a51f164e21fd25984a33cfff47, session 24)
#: moved again 2026-11-29: the fused evaluators' float64 exp is the engine's own
#: (pipeline.engine.vexp; its EXP_ID enters the Gram's fingerprint); was 0807ee443598f6ee03191cdc259ce017
GRAM_PIN = "318faa1f021f729c3006f12bbeddf708"


def _config(tmp_path):
    rng = np.random.default_rng(0)
    np.save(tmp_path / "X.npy", rng.standard_normal((48, 3)))
    np.save(tmp_path / "y.npy", rng.standard_normal(48))
    return load_config(CONFIG)  # paths relative to the working directory: tmp_path


def _param_fingerprints():
    cfg = load_config({**CONFIG, "data": {"source": "sklearn", "name": "diabetes"}})
    params = cfg.stage_params()
    up = {"ingest": "i" * 16, "gram": "g" * 16, "solve": "s" * 16, "predict": "p" * 16}
    return {
        s.name: stage_fingerprint(s, params[s.name], {u: up[u] for u in s.after})
        for s in default_stages()
    }


def test_stage_params_fingerprints_unchanged():
    assert _param_fingerprints() == PARAM_PINS


def test_run_fingerprints_unchanged(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = _config(tmp_path)
    rep = run_stages(
        tmp_path / "run", default_stages(), cfg.stage_params(), identity=cfg.identity()
    )
    assert rep.ran == ["ingest", "gram", "solve", "model", "predict", "evaluate"]
    man = Manifest.load(tmp_path / "run")
    got = {n: man.stage(n).fingerprint for n in rep.ran}
    assert got == RUN_PINS
    # the fingerprints inside the stored arrays (ingest's blocks, the Gram's tiles)
    stored = zarr.open_array(store=str(tmp_path / "run/ingest/data.zarr"), path="X_train", mode="r")
    assert stored.attrs["fingerprint"] == X_TRAIN_PIN
    assert man.stage("gram").outputs["fingerprint"] == GRAM_PIN


def test_every_stage_output_is_typed_and_keeps_its_json(tmp_path, monkeypatch):
    import inspect

    from pipeline.stages import evaluate, ingest, predict, solve
    from pipeline.stages.config import DataConfig, EvaluateConfig, PredictConfig, SolverConfig
    from pipeline.stages.outputs import (
        EvaluateOutput,
        GramOutput,
        IngestOutput,
        ModelOutput,
        PredictOutput,
        SolveOutput,
    )

    types = {
        "ingest": IngestOutput,
        "gram": GramOutput,
        "solve": SolveOutput,
        "model": ModelOutput,
        "predict": PredictOutput,
        "evaluate": EvaluateOutput,
    }
    for mod, out, section, typ in (
        (ingest, IngestOutput, "data", DataConfig),
        (solve, SolveOutput, "solver", SolverConfig),
        (predict, PredictOutput, "predict", PredictConfig),
        (evaluate, EvaluateOutput, "evaluate", EvaluateConfig),
    ):
        sig = inspect.signature(mod.run)
        assert sig.return_annotation in (out, out.__name__), mod.__name__
        assert sig.parameters[section].annotation in (typ, typ.__name__), mod.__name__
    monkeypatch.chdir(tmp_path)
    cfg = _config(tmp_path)
    rep = run_stages(
        tmp_path / "run", default_stages(), cfg.stage_params(), identity=cfg.identity()
    )
    for name, js in Manifest.load(tmp_path / "run").stages.items():
        if name in types:  # the manifest's JSON reads back and writes the same keys and values
            assert types[name].from_json(js.outputs).to_json() == js.outputs, name
    assert set(rep.outputs["predict"]) == {"test"}
    assert "baseline" not in rep.outputs["evaluate"]  # baseline: none, as before
    # the other shapes of the JSON: a batch file, a skipped baseline, no test set
    batch = {"path": "p.npy", "format": "npy", "shape": [3, 1], "crc32c": 5}
    assert PredictOutput.from_json({"batch": batch}).to_json() == {"batch": batch}
    skipped = {"n_test": 2, "metrics": {"rmse": 1.0}, "baseline": None, "baseline_note": "why"}
    assert EvaluateOutput.from_json(skipped).to_json() == skipped
    empty = {"metrics": {}, "note": "no test set: nothing to evaluate"}
    assert EvaluateOutput.from_json(empty).to_json() == empty


def test_typed_params_validate_the_fingerprinted_json():
    from pipeline.stages import typed_params
    from pipeline.stages.config import EvaluateConfig, PredictConfig, SolverConfig

    params = load_config(CONFIG).stage_params()
    solve = typed_params("solve", params["solve"])
    assert isinstance(solve["solver"], SolverConfig) and solve["solver"].method == "cholesky"
    assert solve["lam"] == params["solve"]["lam"]
    pred = typed_params("predict", params["predict"])
    assert pred["predict"] == PredictConfig() and set(pred) == {"predict", "kernel", "block_size"}
    ev = typed_params("evaluate", params["evaluate"])
    assert ev["evaluate"] == EvaluateConfig(baseline="none")
    assert typed_params("solve", solve) == solve  # typed sections are kept
    assert params == load_config(CONFIG).stage_params()  # the JSON itself is not changed
