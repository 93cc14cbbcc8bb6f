"""The run manifest: per-stage status, fingerprints and outputs, written atomically.

``{run_dir}/manifest.json`` is the single record of what a run directory holds.
Every update writes a temporary file, fsyncs it and renames it over the old one,
so a reader (``krr status``, a resumed run) sees either the old or the new
manifest, never a torn one, even if the writer is SIGKILLed.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pipeline.storage.atomic import atomic_write

MANIFEST_NAME = "manifest.json"
MANIFEST_VERSION = 1

Status = Literal["pending", "running", "done", "failed", "skipped"]
STATUSES: tuple[str, ...] = ("pending", "running", "done", "failed", "skipped")


@dataclass
class StageRecord:
    """What the manifest knows about one stage."""

    status: Status = "pending"
    fingerprint: str | None = None
    outputs: dict[str, Any] = field(default_factory=dict)
    started: float | None = None
    finished: float | None = None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "fingerprint": self.fingerprint,
            "outputs": self.outputs,
            "started": self.started,
            "finished": self.finished,
            "error": self.error,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> StageRecord:
        status = d.get("status", "pending")
        if status not in STATUSES:
            raise ValueError(f"unknown stage status {status!r} in manifest")
        return cls(
            status=status,
            fingerprint=d.get("fingerprint"),
            outputs=dict(d.get("outputs") or {}),
            started=d.get("started"),
            finished=d.get("finished"),
            error=d.get("error"),
        )


@dataclass
class Manifest:
    """In-memory manifest; :meth:`save` writes it atomically to ``run_dir``."""

    run_dir: Path
    identity: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    stages: dict[str, StageRecord] = field(default_factory=dict)
    created: float = field(default_factory=time.time)

    @property
    def path(self) -> Path:
        return self.run_dir / MANIFEST_NAME

    def stage(self, name: str) -> StageRecord:
        return self.stages.setdefault(name, StageRecord())

    def to_json(self) -> dict[str, Any]:
        return {
            "version": MANIFEST_VERSION,
            "identity": self.identity,
            "created": self.created,
            "updated": time.time(),
            "config": self.config,
            "stages": {n: r.to_json() for n, r in self.stages.items()},
        }

    def save(self) -> None:
        write_json_atomic(self.path, self.to_json())

    @classmethod
    def load(cls, run_dir: str | Path) -> Manifest:
        """Read ``run_dir/manifest.json``; a missing file gives an empty manifest.

        Raises
        ------
        ValueError
            The file exists but is not a manifest this version can read.
        """
        run_dir = Path(run_dir)
        path = run_dir / MANIFEST_NAME
        if not path.exists():
            return cls(run_dir=run_dir)
        try:
            d = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"manifest {str(path)!r} is not valid JSON: {e}") from None
        version = d.get("version")
        if version != MANIFEST_VERSION:
            raise ValueError(
                f"manifest {str(path)!r} has version {version!r}; this krr-pipeline reads "
                f"version {MANIFEST_VERSION}. Use a new run directory."
            )
        return cls(
            run_dir=run_dir,
            identity=d.get("identity"),
            config=d.get("config") or {},
            stages={n: StageRecord.from_json(r) for n, r in (d.get("stages") or {}).items()},
            created=d.get("created", time.time()),
        )


def write_json_atomic(path: str | Path, obj: Any) -> None:
    """Write JSON to ``path`` via a fsynced temporary file and an atomic rename."""
    data = json.dumps(obj, indent=2, sort_keys=False, default=_json_default).encode()
    atomic_write(str(path), data, fsync=True)


def _json_default(o: Any) -> Any:
    import numpy as np

    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"cannot store {type(o).__name__} {o!r} in the manifest (not JSON-able)")
