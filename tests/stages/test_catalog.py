"""The run's data catalog (pipeline.stages.catalog): the one place that knows where each
dataset of a run directory lives and how it is read and written."""

from __future__ import annotations

import ast
import os
import time
from pathlib import Path

import numpy as np
import pytest

from pipeline.stages.catalog import (
    DATASETS,
    Catalog,
    load_npy_verified,
    stage_catalog,
    use_catalog,
)
from pipeline.stages.runner import Stage, run_stages
from pipeline.storage import CorruptFileError

KEY = "57334a041263"

#: every dataset's place, relative to the run directory, for a configuration in
#: results/KEY: the names of tests/contracts/test_store_layout_pins.py (RUN_FILES) and of
#: the CG and select stages' files; a change here moves the on-disk layout
LAYOUT = {
    "manifest": "manifest.json",
    "latest": "latest.json",
    "rows": "ingest/data.zarr",
    "cv": "select/cv.zarr",
    "cv_settings": "select/settings",
    "gram": "gram/gram.zarr",
    "factor": f"results/{KEY}/solve/factor.zarr",
    "cg": f"results/{KEY}/solve/cg",
    "cg_history": f"results/{KEY}/solve/cg_history.npy",
    "alpha": f"results/{KEY}/solve/alpha.npy",
    "model": f"results/{KEY}/model/model",
    "predictions": f"results/{KEY}/predict/predictions.zarr",
    "batch": f"results/{KEY}/predict/batch.zarr",
    "y_true": f"results/{KEY}/evaluate/y_true.npy",
    "y_pred": f"results/{KEY}/evaluate/y_pred.npy",
    "metrics": f"results/{KEY}/evaluate/metrics.json",
    "compare_store": f"results/{KEY}/evaluate/compare_store",
}
ARRAYS = {"gram": "gram", "factor": "chol", "predictions": "test", "batch": "predictions"}


def _catalog(run_dir: Path) -> Catalog:
    cat = Catalog(run_dir)
    cfg = cat.config_dir(KEY)
    cat.set_stage_dirs(
        {s: cat.config_stage_dir(cfg, s) for s in ("solve", "model", "predict", "evaluate")}
    )
    return cat


def test_every_dataset_lives_where_run_directories_have_it(tmp_path):
    cat = _catalog(tmp_path)
    assert set(DATASETS) == set(LAYOUT)
    for name, rel in LAYOUT.items():
        assert Path(cat.path(name)) == tmp_path.joinpath(*rel.split("/")), name
    for name, ds in DATASETS.items():
        if ds.kind == "zarr":
            assert cat.store(name) == (str(tmp_path / LAYOUT[name]), ARRAYS.get(name)), name
    assert cat.node_path("plan") == tmp_path / "plan.json"
    assert cat.config_dir(KEY) == f"results/{KEY}"
    # a run directory from before results were kept: the configuration's dir is ""
    assert Path(cat.config_stage_dir("", "solve")) == tmp_path / "solve"


def test_a_url_run_directory_is_laid_out_the_same():
    cat = Catalog("s3://bucket/run")
    assert cat.path("alpha") == "s3://bucket/run/solve/alpha.npy"
    assert cat.config_stage_dir(f"results/{KEY}", "model") == f"s3://bucket/run/results/{KEY}/model"
    assert cat.node_path("plan") == "s3://bucket/run/plan.json"


def test_an_unknown_dataset_or_stage_is_named():
    with pytest.raises(KeyError, match="no dataset 'alhpa'"):
        Catalog("run").path("alhpa")
    with pytest.raises(KeyError, match="not 'model'"):
        Catalog.for_stage("solve", "x").path("model")
    with pytest.raises(ValueError, match="not a Zarr store"):
        Catalog("run").store("alpha")
    with pytest.raises(ValueError, match="written by the function that tiles it"):
        Catalog("run").save("gram", np.zeros(2))


def test_an_array_is_written_atomically_and_read_against_its_checksum(tmp_path):
    cat = Catalog.for_stage("solve", tmp_path)
    alpha = np.arange(6, dtype=np.float64).reshape(3, 2)
    crc = cat.save("alpha", alpha)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["alpha.npy"]  # no temporary left
    np.testing.assert_array_equal(cat.load("alpha", crc32c=crc), alpha)
    # where the producer recorded it (another configuration's copy reads its own path)
    np.testing.assert_array_equal(
        Catalog().load("alpha", path=cat.path("alpha"), crc32c=crc), alpha
    )
    with pytest.raises(CorruptFileError):
        cat.load("alpha", crc32c=crc + 1)
    with pytest.raises(CorruptFileError):
        cat.load("alpha", crc32c=None)  # no checksum recorded: never trusted
    data = bytearray(Path(cat.path("alpha")).read_bytes())
    data[-1] ^= 1
    Path(cat.path("alpha")).write_bytes(bytes(data))
    with pytest.raises(CorruptFileError):
        cat.load("alpha", crc32c=crc)
    Path(cat.path("alpha")).unlink()
    with pytest.raises(CorruptFileError):
        load_npy_verified(str(cat.path("alpha")), crc)


def test_json_documents_and_node_records(tmp_path):
    cat = Catalog(tmp_path)
    assert cat.save("latest", {"configuration": KEY, "dir": f"results/{KEY}"}) is None
    assert cat.load("latest") == {"configuration": KEY, "dir": f"results/{KEY}"}
    assert cat.exists("latest") and not cat.exists("manifest")
    assert cat.node_records("plan") == {}  # no file yet
    cat.save_node_records("plan", {"fp": {"output": {"a": 1}}})
    assert cat.node_records("plan") == {"fp": {"output": {"a": 1}}}
    (tmp_path / "plan.json").write_text('{"node": "other", "records": {}}')
    assert cat.node_records("plan") is None  # not this node's record: a user's file
    (tmp_path / "plan.json").write_text("not json")
    assert cat.node_records("plan") is None


def test_a_stage_gets_the_runners_catalog(tmp_path):
    """Inside run_stages a stage's stage_catalog is the runner's (it knows the run
    directory); called on its own, one that knows only the stage's directory."""
    seen = {}

    def work(stage_dir, inputs, **params):
        cat = stage_catalog("solve", stage_dir)
        seen["run_dir"] = cat.run_dir
        crc = cat.save("alpha", np.ones(3))
        return {"alpha": str(cat.path("alpha")), "alpha_crc32c": crc}

    run = tmp_path / "run"
    report = run_stages(run, [Stage("solve", work)], {"solve": {}})
    assert seen["run_dir"] == run.absolute()
    out = report.outputs["solve"]
    assert out["alpha"] == str(run.absolute() / "solve" / "alpha.npy")
    np.testing.assert_array_equal(
        Catalog().load("alpha", path=out["alpha"], crc32c=out["alpha_crc32c"]), np.ones(3)
    )
    alone = stage_catalog("solve", tmp_path / "elsewhere")
    assert alone.run_dir is None and alone.stage_dir("solve") == tmp_path / "elsewhere"
    with use_catalog(Catalog(run)):  # the active catalog places solve elsewhere: not it
        assert stage_catalog("solve", tmp_path / "elsewhere").run_dir is None
        assert stage_catalog("solve", run / "solve").run_dir == run


def test_other_configurations_checkpoints_newest_first(tmp_path):
    results = tmp_path / "results"
    made = []
    for i, rel in enumerate(["results/aaaaaa/solve/cg", "solve/cg", "results/bbbbbb/solve/cg"]):
        p = tmp_path / rel
        p.mkdir(parents=True)
        os.utime(p, (time.time() + i, time.time() + i))
        made.append(p)
    (results / "cccccc" / "solve").mkdir(parents=True)  # no checkpoint there
    cat = Catalog(tmp_path, {"solve": results / "aaaaaa" / "solve"})
    assert cat.in_other_configurations("cg") == (str(made[2]), str(made[1]))
    # a stage directory that is not a configuration's: never another run directory's
    assert Catalog(tmp_path).in_other_configurations("cg") == ()


CATALOG_CALLS = {
    "stage_catalog",
    "path",
    "store",
    "save",
    "load",
    "exists",
    "in_other_configurations",
}
STAGE_MODULES = ["ingest", "select", "gram", "solve", "model", "predict", "evaluate", "verify",
                 "compare"]  # fmt: skip


@pytest.mark.parametrize("module", STAGE_MODULES)
def test_the_stages_compose_no_paths(module):
    """The stage modules ask the catalog for their datasets: no path joined onto a stage
    directory, no dataset file name, no .npy or JSON written by hand."""
    src = (Path(__file__).resolve().parents[2] / "pipeline" / "stages" / f"{module}.py").read_text()
    tree = ast.parse(src)
    names = {ds.path for ds in DATASETS.values()}
    # a dataset's or a stage's name given to the catalog is not a path ("cg", "model")
    asked = {
        id(arg)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and getattr(node.func, "attr", getattr(node.func, "id", "")) in CATALOG_CALLS
        for arg in node.args
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value in names and id(node) not in asked:
            found.append(node.value)
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else getattr(f, "attr", "")
            first = node.args[0] if node.args else None
            if name in ("save_npy_atomic", "write_json_atomic", "atomic_write"):
                found.append(name)
            if name == "join_path" and isinstance(first, ast.Name) and first.id == "stage_dir":
                if module != "select":  # its search report, uploaded under the names it has
                    found.append("join_path(stage_dir, ...)")
    assert found == []
