"""Stages as plain typed functions (issue #16, item 4): the gram, solve and model stages
return dataclasses; the manifest stores the same JSON as before; no importlib lookup."""

from __future__ import annotations

import inspect
from pathlib import Path

import pipeline.stages as stages_pkg
from pipeline.stages import gram, model, solve
from pipeline.stages.outputs import GramOutput, ModelOutput, SolveOutput
from pipeline.stages.runner import outputs_json


def test_stage_functions_are_typed_and_import_normally():
    assert inspect.signature(gram.run).return_annotation in (GramOutput, "GramOutput")
    assert inspect.signature(solve.run).return_annotation in (SolveOutput, "SolveOutput")
    assert inspect.signature(model.run).return_annotation in (ModelOutput, "ModelOutput")
    src = Path(stages_pkg.__file__).parent
    assert not (src / "_deps.py").exists()
    for p in src.glob("*.py"):
        assert "require(" not in p.read_text(), p.name


def test_typed_outputs_keep_the_manifest_json():
    g = GramOutput("@run/gram/gram.zarr", "gram", "abc", [10, 10], 4, "float64", 6)
    assert outputs_json(g) == {
        "store": "@run/gram/gram.zarr",
        "name": "gram",
        "fingerprint": "abc",
        "shape": [10, 10],
        "block_size": 4,
        "dtype": "float64",
        "tiles": 6,
    }
    assert GramOutput.from_json({**outputs_json(g), "_fingerprint": "x"}) == g
    s = SolveOutput("cg", "a.npy", 7, 0.5, "sklearn", {"solver": "cg"}, "why", {"n_iter": 3})
    js = outputs_json(s)
    assert js["n_iter"] == 3 and js["method"] == "cg" and "details" not in js
    assert SolveOutput.from_json(js) == s
    # an output written before the plan was recorded still reads
    old = {k: v for k, v in js.items() if k not in ("plan", "plan_reason")}
    assert SolveOutput.from_json(old).details == {"n_iter": 3}
    assert outputs_json({"a": 1}) == {"a": 1} and outputs_json(None) == {}
