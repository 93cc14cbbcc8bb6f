"""Run the stages in order, skipping complete ones, resuming partial ones.

A stage's fingerprint hashes its own arguments and its upstream stages'
fingerprints. A stage whose manifest record is ``done`` under the same
fingerprint is skipped. A stage whose fingerprint changed is rerun from scratch
(its directory is cleared), and so, through the chain, is everything
downstream of it, and nothing upstream. A stage recorded as ``running`` or
``failed`` under the same fingerprint keeps its directory, so the modules it
calls resume from their per-tile completion records.
"""

from __future__ import annotations

import logging
import shutil
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.stages.manifest import Manifest
from pipeline.storage import fingerprint_obj

log = logging.getLogger("pipeline.stages")

StageFunc = Callable[..., dict[str, Any]]
#: ``enabled(params_by_stage, outputs_so_far) -> bool``
EnabledFunc = Callable[[Mapping[str, dict[str, Any]], Mapping[str, dict[str, Any]]], bool]
#: ``resolve(stage_params, outputs_so_far) -> stage_params``
ResolveFunc = Callable[[dict[str, Any], Mapping[str, dict[str, Any]]], dict[str, Any]]


@dataclass(frozen=True)
class Stage:
    """One named stage.

    Parameters
    ----------
    name : str
        Stage name; also the name of its directory under the run directory.
    func : callable
        ``func(stage_dir, inputs, **params) -> dict``: a pure function of its
        arguments and of upstream outputs (``inputs[name]`` is the outputs dict
        of upstream stage ``name``, plus its fingerprint as ``"_fingerprint"``).
        It returns its own outputs (JSON-able).
    after : tuple of str
        Upstream stages whose outputs it reads and whose fingerprints it chains.
    enabled : callable, optional
        Whether the stage runs at all for this config (e.g. the Gram is only
        built when the solver needs it). A disabled stage is recorded as
        ``skipped`` and its fingerprint is ``None`` for downstream stages.
    resolve : callable, optional
        Completes the stage's arguments from earlier stages' outputs before it is
        fingerprinted and run (e.g. the λ and kernel a model-selection stage
        chose). The fingerprint hashes the resolved arguments.
    """

    name: str
    func: StageFunc
    after: tuple[str, ...] = ()
    enabled: EnabledFunc | None = None
    resolve: ResolveFunc | None = None


class StageFailed(RuntimeError):
    """A stage raised; the original exception is ``__cause__``."""

    def __init__(self, stage: str, cause: BaseException) -> None:
        self.stage = stage
        super().__init__(f"stage {stage!r} failed: {type(cause).__name__}: {cause}")


class RunDirConflict(ValueError):
    """The run directory belongs to another data source (see ``force_new``)."""


@dataclass
class RunReport:
    """What one call of :func:`run_stages` did."""

    manifest: Manifest
    ran: list[str] = field(default_factory=list)
    skipped_done: list[str] = field(default_factory=list)
    disabled: list[str] = field(default_factory=list)
    invalidated: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def outputs(self) -> dict[str, dict[str, Any]]:
        return {n: r.outputs for n, r in self.manifest.stages.items() if r.status == "done"}


def stage_fingerprint(
    stage: Stage, params: Mapping[str, Any], upstream: Mapping[str, str | None]
) -> str:
    """Hash of a stage's name, its arguments, and its upstream stages' fingerprints."""
    return fingerprint_obj(
        {"stage": stage.name, "params": dict(params), "upstream": dict(upstream)}
    )


def _clear_dir(path: Path, keep: Sequence[str] = ()) -> None:
    if not path.exists():
        return
    for child in path.iterdir():
        if child.name in keep:
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


def run_stages(
    run_dir: str | Path,
    stages: Sequence[Stage],
    params: Mapping[str, Mapping[str, Any]],
    *,
    identity: Any = None,
    config: Mapping[str, Any] | None = None,
    force_new: bool = False,
    until: str | None = None,
    on_event: Callable[[str, str, dict[str, Any]], None] | None = None,
) -> RunReport:
    """Run ``stages`` in order in ``run_dir``; skip done ones, resume partial ones.

    Parameters
    ----------
    run_dir : path
        The run directory (created if missing). Hold its :class:`RunLock` while
        calling this.
    stages : sequence of Stage
        In dependency order.
    params : mapping
        ``params[stage.name]``: the stage's keyword arguments (JSON-able).
    identity : JSON-able, optional
        What the run directory belongs to (the data source). A run directory
        created for another identity is refused unless ``force_new``.
    config : mapping, optional
        The full config, recorded in the manifest for reference.
    force_new : bool
        Clear a run directory that belongs to another identity and start over.
    until : str, optional
        Stop after this stage.
    on_event : callable, optional
        ``on_event(stage, event, info)`` with events ``start``, ``done``,
        ``skip``, ``disabled``, ``invalidate``, ``failed``.

    Raises
    ------
    RunDirConflict
        The directory belongs to another identity and ``force_new`` is False.
    StageFailed
        A stage raised; its record is ``failed`` and later stages did not run.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    emit = on_event or (lambda s, e, i: None)
    manifest = Manifest.load(run_dir)
    ident = fingerprint_obj(identity) if identity is not None else None
    if manifest.identity is not None and ident is not None and manifest.identity != ident:
        if not force_new:
            raise RunDirConflict(
                f"run directory {str(run_dir)!r} holds a run on other data (identity "
                f"{manifest.identity}, this config has {ident}). Use another --run-dir, or "
                "pass --force-new to discard its contents and start over."
            )
    if force_new and manifest.identity is not None and manifest.identity != ident:
        _clear_dir(run_dir, keep=(".lock",))
        manifest = Manifest(run_dir=run_dir)
    manifest.identity = ident
    if config is not None:
        manifest.config = dict(config)
    manifest.save()

    report = RunReport(manifest=manifest)
    fps: dict[str, str | None] = {}
    outputs: dict[str, dict[str, Any]] = {}
    names = [s.name for s in stages]
    unknown = sorted(set(params) - set(names))
    if unknown:
        raise ValueError(f"params given for unknown stages {unknown}; stages are {names}")

    for stage in stages:
        stage_params = dict(params.get(stage.name, {}))
        rec = manifest.stage(stage.name)
        stage_dir = run_dir / stage.name
        if stage.enabled is not None and not stage.enabled(params, outputs):
            fps[stage.name] = None
            if rec.status != "skipped":
                rec.status, rec.fingerprint, rec.outputs, rec.error = "skipped", None, {}, None
                manifest.save()
            report.disabled.append(stage.name)
            emit(stage.name, "disabled", {})
            if until == stage.name:
                break
            continue
        if stage.resolve is not None:
            stage_params = dict(stage.resolve(stage_params, outputs))
        upstream = {u: fps.get(u) for u in stage.after}
        fp = stage_fingerprint(stage, stage_params, upstream)
        fps[stage.name] = fp
        if rec.status == "done" and rec.fingerprint == fp:
            outputs[stage.name] = rec.outputs
            report.skipped_done.append(stage.name)
            emit(stage.name, "skip", {"fingerprint": fp})
            if until == stage.name:
                break
            continue
        if rec.fingerprint is not None and rec.fingerprint != fp:
            # another config computed what is there: never resume from it
            _clear_dir(stage_dir)
            report.invalidated.append(stage.name)
            emit(stage.name, "invalidate", {"old": rec.fingerprint, "new": fp})
        resumed = rec.status in ("running", "failed") and rec.fingerprint == fp
        rec.status, rec.fingerprint, rec.outputs, rec.error = "running", fp, {}, None
        rec.started, rec.finished = time.time(), None
        manifest.save()
        emit(stage.name, "start", {"fingerprint": fp, "resumed": resumed})
        stage_dir.mkdir(parents=True, exist_ok=True)
        # upstream outputs, each with its stage fingerprint under "_fingerprint"
        inputs = {u: {**outputs[u], "_fingerprint": fps[u]} for u in stage.after if u in outputs}
        t0 = time.perf_counter()
        try:
            out = stage.func(stage_dir, inputs, **stage_params)
        except BaseException as e:
            rec.status = "failed"
            rec.error = "".join(traceback.format_exception_only(type(e), e)).strip()
            rec.finished = time.time()
            manifest.save()
            emit(stage.name, "failed", {"error": rec.error})
            if isinstance(e, KeyboardInterrupt | SystemExit):
                raise
            raise StageFailed(stage.name, e) from e
        dt = time.perf_counter() - t0
        rec.status, rec.outputs, rec.finished = "done", dict(out or {}), time.time()
        manifest.save()
        outputs[stage.name] = rec.outputs
        report.ran.append(stage.name)
        report.timings[stage.name] = dt
        emit(stage.name, "done", {"seconds": dt, "outputs": rec.outputs})
        if until == stage.name:
            break
    return report
