"""Command-line overrides and config error messages.

``key.sub=value`` overrides are parsed (values read as YAML) and set into the raw
config before validation; a pydantic ``ValidationError`` is turned into one
:class:`ConfigError` message that names each key and, for an unknown key,
suggests the nearest valid one. :mod:`pipeline.stages.config` re-exports these names.
"""

from __future__ import annotations

import copy
import difflib
from collections.abc import Iterable
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from pipeline.errors import ConfigError

__all__ = ["ConfigError", "apply_overrides", "parse_overrides"]


def _model_at(model: type[BaseModel], loc: Iterable[Any]) -> type[BaseModel] | None:
    """The pydantic model class found by following ``loc`` from ``model``, if any."""
    cur: Any = model
    for part in loc:
        if not (isinstance(cur, type) and issubclass(cur, BaseModel)):
            return None
        field = _field_by_name(cur, str(part))
        if field is None:
            return None
        cur = field.annotation
        if not (isinstance(cur, type) and issubclass(cur, BaseModel)):
            # unwrap Optional[Model]
            args = getattr(cur, "__args__", ())
            cur = next((a for a in args if isinstance(a, type) and issubclass(a, BaseModel)), cur)
    return cur if isinstance(cur, type) and issubclass(cur, BaseModel) else None


def _field_by_name(model: type[BaseModel], name: str):
    for fname, f in model.model_fields.items():
        if name in (fname, f.alias):
            return f
    return None


def _valid_keys(model: type[BaseModel]) -> list[str]:
    return [f.alias or n for n, f in model.model_fields.items()]


def _format_errors(err: ValidationError, source: str, root: type[BaseModel]) -> str:
    """The errors of ``err`` as one message; an unknown key gets the nearest valid key of ``root``."""
    lines = []
    for e in err.errors():
        loc = list(e["loc"])
        key = ".".join(str(p) for p in loc) or "(top level)"
        if e["type"] == "extra_forbidden":
            parent = _model_at(root, loc[:-1])
            valid = _valid_keys(parent) if parent else []
            close = difflib.get_close_matches(str(loc[-1]), valid, n=1, cutoff=0.5)
            prefix = ".".join(str(p) for p in loc[:-1])
            hint = f"; did you mean '{prefix + '.' if prefix else ''}{close[0]}'?" if close else ""
            lines.append(f"  {key}: unknown key{hint} (valid keys here: {', '.join(valid)})")
        elif e["type"] == "missing":
            lines.append(f"  {key}: required key is missing")
        else:
            got = e.get("input")
            got_s = "" if isinstance(got, dict) else f" (got {got!r})"
            msg = e["msg"].removeprefix("Value error, ")
            lines.append(f"  {key}: {msg}{got_s}")
    return f"invalid config {source}:\n" + "\n".join(lines)


def parse_overrides(items: Iterable[str]) -> list[tuple[list[str], Any]]:
    """Parse ``key.sub=value`` strings; values are read as YAML (``1e-3``, ``true``, ``[a, b]``)."""
    out = []
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {item!r} is not of the form key.sub=value")
        try:
            value = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError as e:
            raise ConfigError(f"override {item!r}: value is not valid YAML ({e})") from None
        if isinstance(value, str):
            value = _maybe_number(value)
        out.append((key.strip().split("."), value))
    return out


def _maybe_number(s: str) -> Any:
    # YAML 1.1 reads "1e-3" as a string; accept it as a number
    try:
        return int(s)
    except ValueError:
        pass
    try:
        return float(s)
    except ValueError:
        return s


def apply_overrides(raw: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Return a copy of ``raw`` with ``key.sub=value`` overrides set (validated later)."""
    raw = copy.deepcopy(raw)
    for path, value in parse_overrides(overrides):
        node = raw
        for i, part in enumerate(path[:-1]):
            nxt = node.get(part)
            if nxt is None:
                nxt = node[part] = {}
            if not isinstance(nxt, dict):
                where = ".".join(path[: i + 1])
                raise ConfigError(f"override {'.'.join(path)}: {where!r} is not a section")
            node = nxt
        node[path[-1]] = value
    return raw
