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

Results are kept per configuration
----------------------------------
The stages that depend on the model's configuration (λ, the kernel, the solver,
the prediction and metric settings: ``solve``, ``model``, ``predict`` and
``evaluate`` in the default pipeline) are not replaced when that configuration
changes. Each distinct configuration gets its own directory
``{run_dir}/results/<key>/<stage>`` and its own :class:`ConfigRecord` under
``"results"`` (``<key>`` is the first 12 hex digits of a hash of those stages'
fingerprints). ``"latest"`` names the configuration of the most recent run; its
stage records are also the ``"stages"`` records of those stages, so a reader of
``stages[...]`` sees the latest configuration. The shared upstream stages
(``ingest``, ``select``, ``gram``) keep one directory each, ``{run_dir}/<stage>``.
A run directory written before this layout keeps its top-level stage
directories: they are adopted as a configuration whose ``dir`` is ``""``.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pipeline.errors import ManifestError
from pipeline.storage.atomic import atomic_write
from pipeline.storage.location import filesystem_for, is_url, join_path

MANIFEST_NAME = "manifest.json"
MANIFEST_VERSION = 1

#: prefix of a stage output stored relative to the run directory
RUN_PREFIX = "@run/"

#: ``interrupted``: stopped by Ctrl-C or SIGTERM (a rerun resumes it, as a failed stage)
Status = Literal["pending", "running", "done", "failed", "interrupted", "skipped"]
STATUSES: tuple[str, ...] = ("pending", "running", "done", "failed", "interrupted", "skipped")

#: directory under the run directory holding one subdirectory per configuration
RESULTS_DIR = "results"
#: the pointer to the latest configuration: ``{run_dir}/latest.json``
LATEST_NAME = "latest.json"
_CONFIG_DIR = re.compile(r"^(results/[0-9a-f]{6,64})?$")


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
class ConfigRecord:
    """One configuration's results: its stage records, directory and resolved arguments.

    ``dir`` is relative to the run directory (``"results/<key>"``; ``""`` for the
    stage directories of a run directory written before results were kept).
    """

    fingerprint: str
    dir: str
    params: dict[str, Any] = field(default_factory=dict)
    stages: dict[str, StageRecord] = field(default_factory=dict)
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)

    def stage(self, name: str) -> StageRecord:
        return self.stages.setdefault(name, StageRecord())

    def to_json(self, run_dir: Path | str) -> dict[str, Any]:
        return {
            "fingerprint": self.fingerprint,
            "dir": self.dir,
            "params": self.params,
            "created": self.created,
            "updated": self.updated,
            "stages": {
                n: {**r.to_json(), "outputs": relativize_outputs(r.outputs, run_dir)}
                for n, r in self.stages.items()
            },
        }


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
    #: configuration key -> its results (see the module docstring)
    results: dict[str, ConfigRecord] = field(default_factory=dict)
    #: key of the configuration of the most recent run, or None
    latest: str | None = None

    @property
    def path(self) -> Path | str:
        return join_path(self.run_dir, MANIFEST_NAME)

    def linked(self) -> set[str]:
        """Names of the ``stages`` records that are the latest configuration's records."""
        cfg = self.results.get(self.latest) if self.latest else None
        if cfg is None:
            return set()
        return {n for n, r in self.stages.items() if cfg.stages.get(n) is r}

    def link_latest(self, key: str) -> None:
        """Make ``key`` the latest configuration: its records become ``stages[...]``."""
        cfg = self.results[key]
        for name in self.linked():
            del self.stages[name]
        self.latest = key
        for name, rec in cfg.stages.items():
            self.stages[name] = rec

    def stage_dir_rel(self, name: str) -> str:
        """Directory of stage ``name``'s latest record, relative to the run directory."""
        if name in self.linked():
            d = self.results[self.latest].dir  # type: ignore[index]
            return f"{d}/{name}" if d else name
        return name

    def stage_dir(self, name: str) -> Path | str:
        """Directory of stage ``name``'s latest record (under the run directory)."""
        return join_path(self.run_dir, *self.stage_dir_rel(name).split("/"))

    def owned_dirs(self) -> list[str]:
        """Every stage directory the manifest records as started, relative to the run dir."""
        linked = self.linked()
        out = [
            n
            for n, r in self.stages.items()
            if n not in linked and r.started is not None and _is_plain_name(n)
        ]
        for cfg in self.results.values():
            for n, r in cfg.stages.items():
                if r.started is not None and _is_plain_name(n):
                    rel = f"{cfg.dir}/{n}" if cfg.dir else n
                    if rel not in out:
                        out.append(rel)
        return out

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
            **(
                {
                    "results": {k: c.to_json(self.run_dir) for k, c in self.results.items()},
                    "latest": self.latest,
                }
                if self.results
                else {}
            ),
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
        m = cls(
            run_dir=run_dir,
            identity=d.get("identity"),
            config=d.get("config") or {},
            stages={
                n: _loaded_record(r, run_dir, path) for n, r in (d.get("stages") or {}).items()
            },
            created=d.get("created", time.time()),
            results={
                k: _loaded_config(k, c, run_dir, path) for k, c in (d.get("results") or {}).items()
            },
        )
        latest = d.get("latest")
        if latest is not None:
            if latest not in m.results:
                raise ManifestError(
                    f"manifest {str(path)!r} names latest configuration {latest!r}, which it "
                    "does not record; restore it from a backup, or use another --run-dir."
                )
            m.link_latest(latest)
        return m


def _read_text(path: Path | str) -> str:
    """The text of a local file or of an object (FileNotFoundError when absent)."""
    if isinstance(path, Path):
        if not path.exists():
            raise FileNotFoundError(str(path))
        return path.read_text()
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


def _is_plain_name(name: str) -> bool:
    """A plain directory name (a manifest is data: never follow ``..`` or ``/`` in it)."""
    return bool(name) and name not in (".", "..") and "/" not in name and "\\" not in name


def _loaded_config(key: str, c: Any, run_dir: Path | str, path: Path | str) -> ConfigRecord:
    try:
        d = str(c.get("dir", ""))
        if not _CONFIG_DIR.match(d) or not re.fullmatch(r"[0-9a-f]{6,64}", key):
            raise ValueError(f"configuration {key!r} has directory {d!r}")
        return ConfigRecord(
            fingerprint=str(c["fingerprint"]),
            dir=d,
            params=dict(c.get("params") or {}),
            stages={
                n: _loaded_record(r, run_dir, path) for n, r in (c.get("stages") or {}).items()
            },
            created=c.get("created", time.time()),
            updated=c.get("updated", time.time()),
        )
    except ManifestError:
        raise
    except (ValueError, TypeError, AttributeError, KeyError) as e:
        raise ManifestError(
            f"manifest {str(path)!r} has an unreadable configuration record ({e}); restore it "
            "from a backup, or use another --run-dir."
        ) from None


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
