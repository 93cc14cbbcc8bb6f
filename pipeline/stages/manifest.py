"""The run manifest: per-stage status, fingerprints and outputs, written atomically.

``{run_dir}/manifest.json`` is the single record of what a run directory holds.
Every update writes a temporary file, fsyncs it and renames it over the old one,
so a reader (``krr status``, a resumed run) sees either the old or the new
manifest, never a torn one, even if the writer is SIGKILLed.

Stage outputs that are absolute paths inside the run directory are stored
relative to it, as ``"@run/<path>"``, and resolved against the run directory the
manifest is loaded from. So a run directory can be moved, copied, or reached by a
relative ``--run-dir`` from another working directory, and a resumed run reads
its own stored data, never that of whatever lies at the old path.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pipeline.storage.atomic import atomic_write
from pipeline.storage.location import is_url, join_path

MANIFEST_NAME = "manifest.json"
MANIFEST_VERSION = 1

#: prefix of a stage output stored relative to the run directory
RUN_PREFIX = "@run/"

Status = Literal["pending", "running", "done", "failed", "skipped"]
STATUSES: tuple[str, ...] = ("pending", "running", "done", "failed", "skipped")


class ManifestError(ValueError):
    """``manifest.json`` exists but cannot be read (not JSON, another version)."""


def _under(path: str, root: str) -> str | None:
    """``path`` relative to ``root`` if it is an absolute local path inside it, else None."""
    local = path[len("file://") :] if path.startswith("file://") else path
    if not os.path.isabs(local):
        return None
    local = os.path.normpath(local)
    if local == root or not local.startswith(root.rstrip(os.sep) + os.sep):
        return None
    return os.path.relpath(local, root)


def _under_url(path: str, root: str) -> str | None:
    """``path`` relative to the URL ``root`` if it lies under it, else None."""
    root = root.rstrip("/")
    if not path.startswith(root + "/"):
        return None
    rel = path[len(root) + 1 :].strip("/")
    return rel if rel and ".." not in rel.split("/") else None


def relativize_outputs(obj: Any, run_dir: str | Path) -> Any:
    """``obj`` with every absolute path string inside ``run_dir`` as ``"@run/<relative>"``.

    ``run_dir`` may be a URL (``s3://bucket/run``): URLs under it are stored the same way.
    """
    if is_url(run_dir):
        url = str(run_dir)
        return _map_strings(
            obj, lambda s: s if (r := _under_url(s, url)) is None else RUN_PREFIX + r
        )
    root = os.path.normpath(os.path.abspath(run_dir))
    return _map_strings(obj, lambda s: s if (r := _under(s, root)) is None else RUN_PREFIX + r)


def resolve_outputs(obj: Any, run_dir: str | Path) -> Any:
    """Inverse of :func:`relativize_outputs`: ``"@run/<relative>"`` as an absolute path."""
    if is_url(run_dir):
        url = str(run_dir).rstrip("/")
        return _map_strings(
            obj,
            lambda s: url + "/" + s[len(RUN_PREFIX) :] if s.startswith(RUN_PREFIX) else s,
        )
    root = os.path.abspath(run_dir)
    return _map_strings(
        obj,
        lambda s: os.path.join(root, s[len(RUN_PREFIX) :]) if s.startswith(RUN_PREFIX) else s,
    )


def _map_strings(obj: Any, f: Any) -> Any:
    if isinstance(obj, str):
        return f(obj)
    if isinstance(obj, Path):
        return f(str(obj))
    if isinstance(obj, dict):
        return {k: _map_strings(v, f) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_map_strings(v, f) for v in obj]
    return obj


@dataclass
class StageRecord:
    """What the manifest knows about one stage."""

    status: Status = "pending"
    fingerprint: str | None = None
    outputs: dict[str, Any] = field(default_factory=dict)
    started: float | None = None
    finished: float | None = None
    error: str | None = None
    #: wall ``seconds`` and peak memory of its last run (:mod:`pipeline.stages.usage`)
    resources: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "fingerprint": self.fingerprint,
            "outputs": self.outputs,
            "started": self.started,
            "finished": self.finished,
            "error": self.error,
            "resources": self.resources,
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
            resources=dict(d.get("resources") or {}),
        )


@dataclass
class Manifest:
    """In-memory manifest; :meth:`save` writes it atomically to ``run_dir``.

    ``run_dir`` is a local :class:`~pathlib.Path` or a URL string (``s3://...``);
    on an object store the manifest is one object, replaced whole by each save.
    """

    run_dir: Path | str
    identity: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    stages: dict[str, StageRecord] = field(default_factory=dict)
    created: float = field(default_factory=time.time)

    @property
    def path(self) -> Path | str:
        return join_path(self.run_dir, MANIFEST_NAME)

    def stage(self, name: str) -> StageRecord:
        return self.stages.setdefault(name, StageRecord())

    def to_json(self) -> dict[str, Any]:
        return {
            "version": MANIFEST_VERSION,
            "identity": self.identity,
            "created": self.created,
            "updated": time.time(),
            "config": self.config,
            "stages": {
                n: {**r.to_json(), "outputs": relativize_outputs(r.outputs, self.run_dir)}
                for n, r in self.stages.items()
            },
        }

    def save(self) -> None:
        write_json_atomic(self.path, self.to_json())

    @classmethod
    def load(cls, run_dir: str | Path) -> Manifest:
        """Read ``run_dir/manifest.json``; a missing file gives an empty manifest.

        Stage outputs stored as ``"@run/<path>"`` come back as absolute paths
        under ``run_dir``.

        Raises
        ------
        ManifestError
            The file exists but is not a manifest this version can read.
        """
        run_dir = str(run_dir).rstrip("/") if is_url(run_dir) else Path(run_dir)
        path = join_path(run_dir, MANIFEST_NAME)
        try:
            text = _read_text(path)
        except FileNotFoundError:
            return cls(run_dir=run_dir)
        except IsADirectoryError:
            raise ManifestError(
                f"manifest {str(path)!r} is a directory, not a file; use another --run-dir."
            ) from None
        try:
            d = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ManifestError(
                f"manifest {str(path)!r} is not valid JSON ({e}): the run directory is damaged. "
                "Restore the file from a backup, or use another --run-dir."
            ) from None
        except IsADirectoryError:
            raise ManifestError(
                f"manifest {str(path)!r} is a directory, not a file; use another --run-dir."
            ) from None
        if not isinstance(d, dict):
            raise ManifestError(
                f"manifest {str(path)!r} holds a JSON {type(d).__name__}, not a manifest; "
                "restore it from a backup, or use another --run-dir."
            )
        version = d.get("version")
        if version != MANIFEST_VERSION:
            raise ManifestError(
                f"manifest {str(path)!r} has version {version!r}; this krr-pipeline reads "
                f"version {MANIFEST_VERSION}. Use a new run directory."
            )
        return cls(
            run_dir=run_dir,
            identity=d.get("identity"),
            config=d.get("config") or {},
            stages={
                n: _loaded_record(r, run_dir, path) for n, r in (d.get("stages") or {}).items()
            },
            created=d.get("created", time.time()),
        )


def _read_text(path: Path | str) -> str:
    """The text of a local file or of an object (FileNotFoundError when absent)."""
    if isinstance(path, Path):
        if not path.exists():
            raise FileNotFoundError(str(path))
        return path.read_text()
    from pipeline.storage.location import filesystem_for

    fs, p = filesystem_for(path)
    fs.invalidate_cache()
    return bytes(fs.cat_file(p)).decode()


def _loaded_record(r: Any, run_dir: Path | str, path: Path | str) -> StageRecord:
    try:
        rec = StageRecord.from_json(r)
    except (ValueError, TypeError, AttributeError) as e:
        raise ManifestError(
            f"manifest {str(path)!r} has an unreadable stage record ({e}); restore it from a "
            "backup, or use another --run-dir."
        ) from None
    rec.outputs = resolve_outputs(rec.outputs, run_dir)
    return rec


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
