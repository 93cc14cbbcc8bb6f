"""One vocabulary (issue #16, item 3): config keys and Python parameters share names
and values; old spellings are read, mixed spellings refused naming both; the config key
table (docs/CONFIG.md, moved there from the README) matches the config models."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest

from pipeline import KernelRidge
from pipeline.stages.config import KEY_ALIASES, ConfigError, RunConfig, load_config

BASE = {"data": {"source": "sklearn", "name": "diabetes"}}
KEY_TABLE = Path(__file__).resolve().parents[2] / "docs" / "CONFIG.md"


def test_new_and_old_spellings_read_the_same():
    new = load_config({**BASE, "alpha": 0.1, "alpha_convention": "n_samples"})
    old = load_config({**BASE, "lambda": 0.1, "lam_convention": "n"})
    assert new.lam == old.lam == 0.1
    assert new.lam_convention == old.lam_convention == "n_samples"
    assert new.stage_params() == old.stage_params()
    for old_spelling in ("matrix_free", "matrix-free", "free"):
        cfg = load_config({**BASE, "solver": {"method": "cg", "matvec": old_spelling}})
        assert cfg.solver.matvec == "recompute"
    # the config and the estimator share values
    assert RunConfig.model_fields["solver"].default.matvec == KernelRidge().matvec == "auto"
    assert typing.get_args(RunConfig.model_fields["lam_convention"].annotation) == (
        "sklearn",
        "n_samples",
    )


@pytest.mark.parametrize(
    "mixed, names",
    [
        ({"lambda": 0.1, "alpha": 0.2}, ("lambda", "alpha")),
        (
            {"alpha_convention": "sklearn", "lam_convention": "n"},
            ("alpha_convention", "lam_convention"),
        ),
    ],
)
def test_mixed_spellings_are_refused_naming_both(mixed, names):
    with pytest.raises(ConfigError) as exc:
        load_config({**BASE, **mixed})
    assert all(f"'{n}'" in str(exc.value) for n in names)


def _key_table_rows() -> dict[str, str]:
    rows = {}
    for line in KEY_TABLE.read_text().splitlines():
        m = re.match(r"^\| (`[^|]*`)(?: \(optional\))? \| (.*) \|$", line)
        if m:
            rows[m.group(1)] = m.group(2)
    return rows


def _literal_values(annotation) -> list[str]:
    out = []
    for a in typing.get_args(annotation) or ():
        out += _literal_values(a)
    if typing.get_origin(annotation) is typing.Literal:
        out += [str(v) for v in typing.get_args(annotation)]
    return out


def test_config_key_table_matches_the_config_models():
    rows = _key_table_rows()
    assert rows, "the config key table of docs/CONFIG.md was not found"
    top: dict[str, str] = {}
    for head, body in rows.items():
        for key in re.findall(r"`([^`]+)`", head):
            top[key] = body
    for name, field in RunConfig.model_fields.items():
        key = field.alias or name
        assert key in top, f"docs/CONFIG.md's key table has no row for the config key {key!r}"
        for alias in KEY_ALIASES.get(key, ()):
            assert f"`{alias}`" in top[key], (
                f"docs/CONFIG.md does not document {alias!r} for {key!r}"
            )
        sub = field.annotation
        sub = next(
            (
                a
                for a in (sub, *typing.get_args(sub))
                if isinstance(a, type) and hasattr(a, "model_fields")
            ),
            None,
        )
        if sub is None:
            values = _literal_values(field.annotation)
            for v in values:
                assert f"`{v}`" in top[key], f"docs/CONFIG.md does not list {key}: {v!r}"
            continue
        for sname, sfield in sub.model_fields.items():
            skey = sfield.alias or sname
            assert f"`{skey}`" in top[key], f"docs/CONFIG.md's `{key}` row does not name {skey!r}"
            if key == "solver":
                for v in _literal_values(sfield.annotation):
                    assert f"`{v}`" in top[key], f"docs/CONFIG.md does not list {key}.{skey}: {v!r}"
