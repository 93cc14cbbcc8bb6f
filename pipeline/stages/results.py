"""Results kept per configuration: one directory per distinct configuration, a ``latest`` pointer.

A run directory holds the results of every configuration run in it, not only
the last one. The stages marked ``per_config`` (in the default pipeline
``solve``, ``model``, ``predict`` and ``evaluate``: everything that depends on
λ, the kernel, the solver or the prediction and metric settings) write into

``{run_dir}/results/<key>/<stage>``

where ``<key>`` is the first 12 hex digits of :func:`configuration_key`, a hash
of those stages' fingerprints. So ``krr run conf.yaml lambda=1e-3`` after a run
with λ = 0.5 adds a second configuration beside the first; running λ = 0.5 again
finds its stages complete (their outputs verified, as for any complete stage)
and skips them. The shared upstream stages (``ingest``, ``select``, ``gram``)
keep one directory each, ``{run_dir}/<stage>``, and are computed once for all
configurations that share their fingerprint.

Why the Gram is not kept per configuration: it is the largest thing a run
stores (``n²/2`` entries, e.g. 40 GB at n = 100,000 in float64), and a new
kernel needs a new one anyway. One Gram per kernel would multiply that disk
cost silently. So a kernel change replaces the shared Gram (the results of the
old kernel's configurations are kept; rerunning one of them rebuilds its Gram
only if one of its stages has to run again).

``{run_dir}/latest.json`` names the configuration of the most recent run
(``configuration``, ``dir``, ``model``: paths relative to the run directory).
It is a small JSON file written atomically, so it works on object stores too
(no symbolic links). The manifest records the same (``latest``) and is the
authority; ``krr predict RUN_DIR`` and :func:`latest_model` resolve the latest
configuration's model from it.

A run directory written before results were kept has its configuration-
dependent stages at ``{run_dir}/<stage>``: they are adopted as a configuration
whose ``dir`` is ``""`` (the run directory itself), so nothing is orphaned.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pipeline.stages.catalog import Catalog
from pipeline.stages.manifest import (
    RUN_PREFIX,
    ConfigRecord,
    Manifest,
    relativize_outputs,
)
from pipeline.stages.stage import Stage, stage_fingerprint
from pipeline.storage import fingerprint_obj
from pipeline.storage.fingerprint import same_work
from pipeline.storage.location import Location, is_url

log = logging.getLogger("pipeline.stages")

#: ``(enabled, resolved stage params, fingerprint or None)`` of one stage
Planned = tuple[bool, dict[str, Any], "str | None"]

#: hex digits of the configuration key used as its directory name
KEY_LENGTH = 12


def plan_stage(
    stage: Stage,
    params: Mapping[str, Mapping[str, Any]],
    outputs: Mapping[str, dict[str, Any]],
    fps: Mapping[str, str | None],
) -> Planned:
    """Whether ``stage`` runs, its resolved arguments and its fingerprint."""
    stage_params = dict(params.get(stage.name, {}))
    if stage.enabled is not None and not stage.enabled(params, outputs):
        return False, stage_params, None
    if stage.resolve is not None:
        stage_params = dict(stage.resolve(stage_params, outputs))
    upstream = {u: fps.get(u) for u in stage.after}
    return True, stage_params, stage_fingerprint(stage, stage_params, upstream)


def plan_configuration(
    stages: Sequence[Stage],
    params: Mapping[str, Mapping[str, Any]],
    outputs: Mapping[str, dict[str, Any]],
    fps: Mapping[str, str | None],
) -> dict[str, Planned]:
    """:func:`plan_stage` of every ``per_config`` stage, in order, chaining their fingerprints.

    Called when the first ``per_config`` stage is reached, so the shared stages
    they read are done and ``outputs`` holds theirs.
    """
    chain = dict(fps)
    out: dict[str, Planned] = {}
    for stage in stages:
        if not stage.per_config:
            continue
        out[stage.name] = plan_stage(stage, params, outputs, chain)
        chain[stage.name] = out[stage.name][2]
    return out


def configuration_key(fingerprints: Mapping[str, str | None]) -> str:
    """Hash of the ``per_config`` stages' fingerprints (None for a disabled stage)."""
    return fingerprint_obj({"configuration": dict(fingerprints)})


def _adopt_legacy(manifest: Manifest, names: Sequence[str]) -> None:
    """Top-level records of ``per_config`` stages (a run directory from before results were
    kept) become a configuration whose directory is the run directory itself."""
    if manifest.latest is not None or manifest.results:
        return
    recs = {n: manifest.stages[n] for n in names if n in manifest.stages}
    if not any(r.started is not None for r in recs.values()):
        return
    full = configuration_key({n: (recs[n].fingerprint if n in recs else None) for n in names})
    manifest.results[full[:KEY_LENGTH]] = ConfigRecord(fingerprint=full, dir="", stages=recs)
    manifest.latest = full[:KEY_LENGTH]


def enter_configuration(
    run_dir: Path | str,
    manifest: Manifest,
    planned: Mapping[str, Planned],
    emit: Callable[[str, str, dict[str, Any]], None] | None = None,
    stages: Sequence[Stage] = (),
) -> str:
    """Make the planned configuration the latest one; return its key.

    Its stage records (new ones are pending) become the manifest's ``stages``
    records of the ``per_config`` stages, the manifest is saved and
    ``latest.json`` written. When the latest configuration changes, the
    ``scratch`` entries of the previous one's complete stages are removed
    (:func:`free_scratch`); nothing else is deleted.
    """
    names = list(planned)
    full = configuration_key({n: planned[n][2] for n in names})
    key = full[:KEY_LENGTH]
    _adopt_legacy(manifest, names)
    cfg = manifest.results.get(key)
    new = cfg is None
    if cfg is None:
        cfg = ConfigRecord(
            fingerprint=full,
            dir=Catalog(run_dir).config_dir(key),
            params={n: p for n, (on, p, _) in planned.items() if on},
        )
        manifest.results[key] = cfg
    elif not cfg.params:  # adopted from an old layout: its arguments are known now
        cfg.params = {n: p for n, (on, p, _) in planned.items() if on}
    for n in names:
        cfg.stage(n)
    previous = manifest.latest
    cfg.updated = time.time()
    manifest.link_latest(key)
    manifest.save()
    write_latest(run_dir, manifest)
    if emit is not None and names:
        emit(
            names[0],
            "configuration",
            {"key": key, "dir": cfg.dir, "new": new, "previous": previous},
        )
    if previous is not None and previous != key and previous in manifest.results:
        free_scratch(run_dir, manifest.results[previous], stages, previous)
    return key


def free_scratch(run_dir: Path | str, cfg: ConfigRecord, stages: Sequence[Stage], key: str) -> None:
    """Remove the ``scratch`` entries of ``cfg``'s complete stages (its results stay).

    Only entries of stage directories the manifest records as started (so created by
    the runner) are removed; a symbolic link is left alone.
    """
    import shutil

    catalog = Catalog(run_dir)
    for stage in stages:
        rec = cfg.stages.get(stage.name)
        if not stage.scratch or rec is None or rec.status != "done" or rec.started is None:
            continue
        stage_dir = catalog.config_stage_dir(cfg.dir, stage.name)
        freed = []
        for entry in stage.scratch:
            if is_url(run_dir):
                loc = Location(str(stage_dir))
                if loc.exists(entry):
                    loc.rm(entry, recursive=True)
                    freed.append(entry)
                continue
            p = Path(stage_dir, entry)
            if p.is_symlink() or not p.exists():
                continue
            if p.is_dir():
                shutil.rmtree(p)
            else:
                p.unlink()
            freed.append(entry)
        if freed:
            log.info(
                "configuration %s: removed %s of its complete %s stage (only needed to resume "
                "it; its results are kept)",
                key,
                ", ".join(freed),
                stage.name,
            )


def _rel(path: Any, run_dir: Path | str) -> str | None:
    if not path:
        return None
    r = relativize_outputs(str(path), run_dir)
    return r[len(RUN_PREFIX) :] if isinstance(r, str) and r.startswith(RUN_PREFIX) else str(path)


def write_latest(run_dir: Path | str, manifest: Manifest) -> None:
    """Write ``{run_dir}/latest.json`` (atomically) from the manifest's latest configuration."""
    if manifest.latest is None or manifest.latest not in manifest.results:
        return
    cfg = manifest.results[manifest.latest]
    model = cfg.stages.get("model")
    evaluate = cfg.stages.get("evaluate")
    Catalog(run_dir).save(
        "latest",
        {
            "configuration": manifest.latest,
            "fingerprint": cfg.fingerprint,
            "dir": cfg.dir,
            "model": _rel(model.outputs.get("path"), run_dir)
            if model is not None and model.status == "done"
            else None,
            "metrics": (evaluate.outputs.get("metrics") or None)
            if evaluate is not None and evaluate.status == "done"
            else None,
            "updated": time.time(),
        },
    )


def config_dirs(manifest: Manifest) -> list[str]:
    """The configuration directories (relative, non-empty) the manifest records."""
    return sorted({c.dir for c in manifest.results.values() if c.dir})


def _moved(obj: Any, old: str, new: str) -> Any:
    """``obj`` with every string path under ``old`` moved under ``new``."""
    if isinstance(obj, str):
        return new + obj[len(old) :] if obj == old or obj.startswith(old + "/") else obj
    if isinstance(obj, list):
        return [_moved(v, old, new) for v in obj]
    if isinstance(obj, dict):
        return {k: _moved(v, old, new) for k, v in obj.items()}
    return obj


def adopt_result(
    run_dir: Path | str, manifest: Manifest, stage: Stage, fp: str, stage_dir: Path | str
) -> dict[str, Any] | None:
    """The outputs of another configuration's complete ``stage`` with the same
    fingerprint (the same arguments and upstream: the same result), copied into this
    configuration's new ``stage_dir`` without its ``scratch`` entries; None if there is
    none. A ``predict``/``evaluate`` change made a new configuration, which solved
    again (a 25-minute factor at 80k) for the same alpha. Local run directories only;
    the copied files keep their checksums, checked when read."""
    import shutil

    if isinstance(run_dir, str) or not stage.reusable:
        return None
    for key, cfg in manifest.results.items():
        rec = cfg.stages.get(stage.name)
        if (
            key == manifest.latest
            or rec is None
            or rec.status != "done"
            or not same_work(rec.fingerprint, fp)
        ):
            continue
        src = Path(Catalog(run_dir).config_stage_dir(cfg.dir, stage.name))
        if not src.is_dir() or Path(stage_dir).exists():
            continue
        ignore = shutil.ignore_patterns(*stage.scratch) if stage.scratch else None
        shutil.copytree(src, stage_dir, ignore=ignore, symlinks=True)
        log.info("stage %r: the same result as configuration %s, copied from %s",
                 stage.name, key, src)  # fmt: skip
        return _moved(dict(rec.outputs), str(src), str(stage_dir))
    return None
