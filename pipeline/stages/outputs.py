"""Typed outputs of the stages.

A stage returns one of these; the runner stores its ``to_json()`` in the manifest
(the same JSON keys as before, so existing run directories stay valid), and a
downstream stage reads its input back with ``from_json``. Paths inside the run
directory are relativised to ``@run/`` by the manifest, as for any output.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

__all__ = ["GramOutput", "ModelOutput", "SolveOutput"]


def _known(cls: type, d: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in d.items() if k in names}


@dataclass(frozen=True)
class GramOutput:
    """The stored Gram: ``open_gram(store, name)``."""

    store: str
    name: str
    fingerprint: str
    shape: list[int]
    block_size: int
    dtype: str
    tiles: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> GramOutput:
        return cls(**_known(cls, d))


@dataclass(frozen=True)
class SolveOutput:
    """α (in ``alpha.npy``, with its CRC-32C), the fit plan and the solver's details.

    ``details`` holds the solver-specific keys (Cholesky: shift, factor, jitter;
    CG: shift, n_iter, converged, rel_residual, history); they are stored at the top
    level of the JSON, as before.
    """

    method: str
    alpha: str
    alpha_crc32c: int
    lam: float
    lam_convention: str
    plan: dict[str, Any]
    plan_reason: str
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "details"}
        return {**out, **self.details}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> SolveOutput:
        known = _known(cls, d)
        details = {k: v for k, v in d.items() if k not in known and not k.startswith("_")}
        known.setdefault("plan", {})
        known.setdefault("plan_reason", "")
        return cls(**known, details=details)


@dataclass(frozen=True)
class ModelOutput:
    """Where the fitted model was written, and its content fingerprint."""

    path: str
    model_fingerprint: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ModelOutput:
        return cls(**_known(cls, d))
