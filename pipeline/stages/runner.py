"""Run the stages in order, skipping complete ones, resuming partial ones.

A stage's fingerprint hashes its own arguments and its upstream stages'
fingerprints. A stage whose manifest record is ``done`` under the same
fingerprint is skipped. A stage whose fingerprint changed is rerun from scratch
(its directory is cleared), and so, through the chain, is everything
downstream of it, and nothing upstream. Stages marked ``per_config`` are the
exception: each distinct configuration of them has its own directory
``{run_dir}/results/<key>/{stage}``, so a changed configuration adds results
instead of replacing them, and a configuration run before is found complete
and skipped (see :mod:`pipeline.stages.results`). A stage recorded as ``running`` or
``failed`` under the same fingerprint keeps its directory, so the modules it
calls resume from their per-tile completion records.

A stage that raises :class:`~pipeline.storage.CorruptTileError` (a stored tile
whose bytes no longer match the checksum in its completion record) does not fail
the run when the tile's store lies inside a stage directory of this run: the
tile's record is removed, the stage that owns the store and every stage
downstream of it are marked partial, a warning is logged, and the run goes on
from the owning stage, which recomputes just that tile (at most
``max_recoveries`` times per run). A chunk that cannot be read as a tile at all
(truncated, oversized) is a corrupt tile too. An
:class:`~pipeline.storage.IncompleteArrayError` (a consumer found tiles of an
array it needs without completion records, e.g. a deleted Gram marker) is
recovered the same way: the owning stage and everything downstream rerun, and
the owner computes the missing tiles. A store outside the run directory cannot
be recomputed by any stage: the run fails with the error, which names the array
and the tiles.

What the runner owns, and so may delete
---------------------------------------
The runner never deletes what it did not create. In a run directory it owns

* ``manifest.json`` (and the temporary files of its atomic writes), and
* the directory ``{run_dir}/{stage}`` of every stage the manifest records as
  started (its record has a ``started`` time), and likewise
  ``{run_dir}/results/<key>/{stage}`` of every configuration it records: the
  runner records the start *before* it creates the directory, and a stage
  writes only inside its own directory, so everything in it is the
  pipeline's. Do not put your own files in a stage directory;
* ``latest.json``, the pointer to the latest configuration, and the
  ``results`` directories it created, once they are empty;
* ``{node}.json`` of each node the stages read (:class:`~pipeline.stages.stage.Node`;
  in the default pipeline ``plan.json``, the fit plan of each configuration), a
  JSON record this package writes atomically; a file of that name that is not
  such a record is refused before any work, as a foreign ``latest.json`` is.

A stage directory that already exists, is not empty, and that the manifest
does not record as started is not adopted: the run stops with
:class:`RunDirConflict` naming it. ``force_new`` removes exactly the owned paths
above (never ``.lock``, never anything else: other files in the run directory
survive, and are logged; a symbolic link in place of a stage directory is left
alone); a stage whose fingerprint changed has its own directory emptied,
nothing else. Stale temporary files of atomic writes (see
:mod:`pipeline.storage.tempfiles`) are swept from the run directory when a run
starts, and from each store when it is reopened.

A run directory may be a URL (``s3://bucket/prefix``): the same rules hold, with
"directory" meaning "every object under the prefix" (object stores have no
directories, renames or symbolic links; see ``docs/STORAGE.md``).
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pipeline.errors import RunDirConflict, StageFailed, StoreUnreachable, caused_by
from pipeline.stages.catalog import Catalog, use_catalog
from pipeline.stages.manifest import (
    LATEST_NAME,
    MANIFEST_NAME,
    RESULTS_DIR,
    Manifest,
)
from pipeline.stages.recovery import (
    find_damage,
    names_tiles_without_records,
    outputs_damaged,
    owner_stage,
    recover_corrupt_tile,
    recover_incomplete,
)
from pipeline.stages.results import (
    Planned,
    adopt_result,
    config_dirs,
    enter_configuration,
    plan_configuration,
    plan_stage,
    write_latest,
)
from pipeline.stages.stage import Node, RunReport, Stage
from pipeline.stages.usage import StageUsage
from pipeline.storage import fingerprint_obj
from pipeline.storage.fingerprint import same_work
from pipeline.storage.location import Location, is_url
from pipeline.storage.tempfiles import sweep_tmp_files
from pipeline.storage.waits import cap_store_waits, cap_store_waits_if_interrupted

log = logging.getLogger("pipeline.stages")

#: the files the runner writes atomically at a run directory's top level: only their
#: temporary files are swept there (the directory may hold the user's own files)
RUN_DIR_FILES = frozenset({MANIFEST_NAME, LATEST_NAME})


def _check_latest_file(catalog: Catalog) -> None:
    """Refuse, before any work, a ``latest.json`` that is not this package's pointer
    (a user's file of that name would be replaced when the run ends)."""
    try:
        rec = catalog.load("latest")
    except FileNotFoundError:
        return
    except (OSError, ValueError):
        rec = None
    if not (isinstance(rec, dict) and {"configuration", "dir"} <= rec.keys()):
        where = str(catalog.path("latest"))
        raise RunDirConflict(
            f"{where!r} exists and is not the pointer krr-pipeline writes there (the latest "
            "configuration); krr-pipeline never overwrites what it did not create. Move or "
            "rename it, or use another run directory."
        )


def _nodes(stages: Sequence[Stage]) -> list[Node]:
    """The nodes the stages read, each once, in the order they are first read."""
    found: dict[str, Node] = {}
    for stage in stages:
        for node in stage.reads:
            if found.setdefault(node.name, node) is not node:
                raise ValueError(f"two different nodes are named {node.name!r}")
    return list(found.values())


def _catalog(run_dir: Path | str | Catalog) -> Catalog:
    return run_dir if isinstance(run_dir, Catalog) else Catalog(run_dir)


def _check_node_files(catalog: Catalog, nodes: Sequence[Node]) -> None:
    """Refuse, before any work, a ``{node}.json`` that is not this package's record
    (a user's file of that name would be replaced)."""
    for node in nodes:
        if catalog.node_records(node.name) is None:
            where = str(catalog.node_path(node.name))
            raise RunDirConflict(
                f"{where!r} exists and is not the record krr-pipeline writes there (its "
                f"{node.name!r} node); krr-pipeline never overwrites what it did not create. "
                "Move or rename it, or use another run directory."
            )


def _node_key(node: Node, inputs: Mapping[str, Any]) -> str:
    """A node's record key: the fingerprint of its name and inputs."""
    return fingerprint_obj({"node": node.name, "inputs": dict(inputs)})


def recorded_node_output(
    run_dir: Path | str | Catalog,
    node: Node,
    params: Mapping[str, Mapping[str, Any]],
    outputs: Mapping[str, dict[str, Any]],
) -> dict[str, Any] | None:
    """What :func:`node_output` reads back for these arguments, computing nothing:
    None when ``{run_dir}/{node}.json`` records no output for the node's inputs.
    ``run_dir``: the run directory, or its :class:`~pipeline.stages.catalog.Catalog`."""
    records = _catalog(run_dir).node_records(node.name) or {}
    rec = records.get(_node_key(node, node.inputs(params, outputs)))
    return rec["output"] if isinstance(rec, dict) and isinstance(rec.get("output"), dict) else None


def node_output(
    run_dir: Path | str | Catalog,
    node: Node,
    params: Mapping[str, Mapping[str, Any]],
    outputs: Mapping[str, dict[str, Any]],
) -> dict[str, Any]:
    """The output of ``node`` for these arguments and upstream outputs: read back from
    ``{run_dir}/{node}.json`` when it records one under the fingerprint of the node's
    inputs, else computed once and recorded there (atomically, beside the records of
    other inputs, e.g. other configurations' plans).

    The output returned is the recorded JSON (what a later run reads back), so a run
    that computes it and one that reads it see the same values. ``run_dir``: the run
    directory, or its :class:`~pipeline.stages.catalog.Catalog`.
    """
    import json

    catalog = _catalog(run_dir)
    inputs = node.inputs(params, outputs)
    fp = _node_key(node, inputs)
    records = catalog.node_records(node.name)
    if records is None:  # (refused when the run started: replaced since)
        _check_node_files(catalog, [node])
    rec = records.get(fp)
    if isinstance(rec, dict) and isinstance(rec.get("output"), dict):
        log.debug("node %r: read back from %s", node.name, catalog.node_file(node.name))
        return rec["output"]
    out = json.loads(json.dumps(dict(node.func(params, outputs))))
    records[fp] = {"inputs": inputs, "output": out, "created": time.time()}
    catalog.save_node_records(node.name, records)
    log.debug("node %r: computed and recorded in %s", node.name, catalog.node_file(node.name))
    return out


def _clear_dir(path: Path | str, keep: Sequence[str] = ()) -> None:
    if not is_url(path) and path.is_symlink():  # iterdir() would follow it to its target
        raise RunDirConflict(
            f"{str(path)!r} is a symbolic link; its stage must be recomputed, and "
            "krr-pipeline does not empty a directory through a link (its target may hold "
            "files it did not create). Replace the link with a directory (move the "
            "pipeline's files into it), or remove it."
        )
    if is_url(path):
        loc = Location(path)
        for name in loc.list():
            if name not in keep:
                loc.rm(name, recursive=True)
        return
    if not path.exists():
        return
    for child in path.iterdir():
        if child.name in keep:
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


def _owned_stage_dirs(run_dir: Path, manifest: Manifest) -> list[Path]:
    """The stage directories the manifest records as created by the runner (shared stages'
    ``{run_dir}/{stage}`` and every configuration's ``{run_dir}/results/<key>/{stage}``)."""
    return [run_dir.joinpath(*rel.split("/")) for rel in manifest.owned_dirs()]


def _warn_kept(where: Any, others: Sequence[str]) -> None:
    if others:
        log.warning(
            "--force-new: kept %d entr%s in %s that krr-pipeline did not create: %s",
            len(others),
            "y" if len(others) == 1 else "ies",
            where,
            ", ".join(others[:20]) + (" ..." if len(others) > 20 else ""),
        )


def _discard_run(
    run_dir: Path | str,
    manifest: Manifest,
    keep: Sequence[str] = (".lock",),
    nodes: Sequence[Node] = (),
) -> None:
    """Remove what the runner owns in ``run_dir`` (see the module docstring), nothing else."""
    # the nodes' records (the runner's own format: a file of that name that is not is kept)
    catalog = Catalog(run_dir)
    recorded = [n.name for n in nodes if catalog.node_records(n.name)]
    ours = [catalog.node_file(n) for n in recorded]
    if is_url(run_dir):
        _discard_run_url(Location(run_dir), manifest, keep, ours)
        return
    owned = _owned_stage_dirs(run_dir, manifest)
    results = run_dir / RESULTS_DIR
    for d in owned:
        if d.is_symlink() or (d.parent != run_dir and results.is_symlink()):
            # the runner makes real directories: someone else made this link
            log.warning("--force-new: %s is a symbolic link; left alone (remove it yourself)", d)
        elif d.is_dir():
            shutil.rmtree(d)
    for rel in config_dirs(manifest):  # results/<key>, then results/, when left empty
        _rmdir_if_empty(run_dir.joinpath(*rel.split("/")))
    if manifest.results:
        _rmdir_if_empty(results)
    sweep_tmp_files(run_dir, recursive=False, targets=RUN_DIR_FILES)
    Path(catalog.path("manifest")).unlink(missing_ok=True)
    if manifest.latest is not None:
        Path(catalog.path("latest")).unlink(missing_ok=True)
    for name in recorded:
        Path(catalog.node_path(name)).unlink(missing_ok=True)
    names = {d.name for d in owned if d.parent == run_dir} | {MANIFEST_NAME, *keep, *ours}
    if manifest.latest is not None:
        names.add(LATEST_NAME)
    others = sorted(p.name for p in run_dir.iterdir() if p.name not in names)
    _warn_kept(run_dir, others)


def _rmdir_if_empty(d: Path) -> None:
    if d.is_dir() and not d.is_symlink() and not any(d.iterdir()):
        d.rmdir()


def _discard_run_url(
    loc: Location, manifest: Manifest, keep: Sequence[str], ours: Sequence[str] = ()
) -> None:
    """:func:`_discard_run` on an object store: the owned prefixes and the manifest."""
    owned = manifest.owned_dirs()
    for rel in owned:
        loc.rm(*rel.split("/"), recursive=True)
    loc.rm(MANIFEST_NAME)
    for name in ours:
        loc.rm(name)
    names = {*(r for r in owned if "/" not in r), MANIFEST_NAME, *keep, *ours}
    if manifest.latest is not None:
        loc.rm(LATEST_NAME)
        names.add(LATEST_NAME)
    others = [n for n in loc.list() if n not in names]
    if manifest.results and RESULTS_DIR in others and not loc.list(RESULTS_DIR):
        others.remove(RESULTS_DIR)  # an object store has no empty "directories" to remove
    _warn_kept(loc.url, others)


def _check_adoptable(stage_dir: Path | str, rec: Any) -> None:
    """Refuse to write into a non-empty stage directory the runner did not create."""
    if rec.started is not None:
        return
    if is_url(stage_dir):
        if not Location(stage_dir).list():
            return
        stage_name = str(stage_dir).rstrip("/").rsplit("/", 1)[-1]
    else:
        if not stage_dir.exists():
            return
        if stage_dir.is_dir() and not any(stage_dir.iterdir()):
            return
        stage_name = stage_dir.name
    raise RunDirConflict(
        f"{str(stage_dir)!r} already exists and holds files this run directory's manifest "
        f"does not record (stage {stage_name!r} never ran here); krr-pipeline never "
        f"deletes or overwrites what it did not create. Move or remove {str(stage_dir)!r}, "
        "or use another run directory."
    )


def _store_gone(e: BaseException) -> bool:
    """Whether ``e`` is, or was raised from, an object store that does not answer."""
    return caused_by(e, StoreUnreachable) is not None


def _recover_from(
    e: BaseException,
    catalog: Catalog,
    stages: Sequence[Stage],
    manifest: Manifest,
    report: RunReport,
    stage: Stage,
    max_recoveries: int,
    emit: Callable[[str, str, dict[str, Any]], None],
) -> bool:
    """When ``e`` comes from damaged stored data of a stage of this run (a corrupt tile,
    an incomplete or missing array), mark that stage and everything downstream partial
    and return True (a new pass recomputes them); else False."""
    damage = find_damage(e)
    owner = None if damage is None else owner_stage(catalog, stages, damage.store)
    if owner is None or len(report.recovered) >= max_recoveries:
        return False
    if names_tiles_without_records(damage):
        recover_incomplete(stages, manifest, report, stage, owner, damage, max_recoveries)
        emit(stage.name, "incomplete", dict(report.recovered[-1]))
    else:
        recover_corrupt_tile(stages, manifest, report, stage, owner, damage, max_recoveries)
        emit(stage.name, "corrupt", dict(report.recovered[-1]))
    return True


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
    max_recoveries: int = 3,
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
        Start over in a run directory that belongs to another identity: remove
        what the runner owns there (the manifest and the stage directories it
        records, see the module docstring); other files are kept and logged.
    until : str, optional
        Stop after this stage.
    on_event : callable, optional
        ``on_event(stage, event, info)`` with events ``start``, ``done``,
        ``skip``, ``disabled``, ``invalidate``, ``failed``, ``interrupted``
        (Ctrl-C or SIGTERM; the stage is recorded ``interrupted``), ``corrupt`` (a
        corrupt stored tile was found and will be recomputed), ``incomplete``
        (tiles without completion records were found and will be computed).
    max_recoveries : int
        How many corrupt tiles or incomplete arrays one call recovers from
        (each: unmark the tile if corrupt, rerun from the stage that owns its
        store) before such an error fails the stage like any other error.

    Raises
    ------
    RunDirConflict
        The directory belongs to another identity and ``force_new`` is False.
    StageFailed
        A stage raised; its record is ``failed`` and later stages did not run.
        A :class:`~pipeline.storage.CorruptTileError` or
        :class:`~pipeline.storage.IncompleteArrayError` is recovered from
        instead (see the module docstring) unless its store is outside the run
        directory or ``max_recoveries`` is spent.
    RunDirConflict
        Also: a non-empty stage directory the manifest does not record.
    """
    cap_store_waits(None)  # a new run: an earlier interrupted one capped the store waits
    remote = is_url(run_dir)
    if remote:  # an object store: no directories to create, no temporary files to sweep
        run_dir = str(run_dir).rstrip("/")
    else:
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        # stage functions get absolute directories, so the paths in their outputs are
        # absolute and the manifest stores them relative to the run directory ("@run/...")
        run_dir = run_dir.absolute()
    emit = on_event or (lambda s, e, i: None)
    catalog = Catalog(run_dir)
    manifest = catalog.load("manifest")
    ident = fingerprint_obj(identity) if identity is not None else None
    # the run directory is reused only for the same data (the one rule: same_work)
    if (
        manifest.identity is not None
        and ident is not None
        and not same_work(manifest.identity, ident)
    ):
        if not force_new:
            raise RunDirConflict(
                f"run directory {str(run_dir)!r} holds a run on other data (identity "
                f"{manifest.identity}, this config has {ident}). Use another --run-dir, or "
                "pass --force-new to discard its contents and start over."
            )
    nodes = _nodes(stages)
    if force_new and manifest.identity is not None and not same_work(manifest.identity, ident):
        _discard_run(run_dir, manifest, keep=(".lock", "run.log"), nodes=nodes)
        manifest = Manifest(run_dir=run_dir)
    if not remote:
        sweep_tmp_files(
            run_dir,
            recursive=False,
            targets=RUN_DIR_FILES | {catalog.node_file(n.name) for n in nodes},
        )  # e.g. a manifest write a kill interrupted
    _check_latest_file(catalog)
    _check_node_files(catalog, nodes)
    manifest.identity = ident
    if config is not None:
        manifest.config = dict(config)
    manifest.save()

    report = RunReport(manifest=manifest)
    names = [s.name for s in stages]
    unknown = sorted(set(params) - set(names))
    if unknown:
        raise ValueError(f"params given for unknown stages {unknown}; stages are {names}")
    clash = sorted({n.name for n in nodes} & set(names))
    if clash:
        raise ValueError(f"nodes {clash} are named like stages; stages are {names}")
    while True:  # one pass, plus one more per corrupt tile recovered
        if not _run_pass(run_dir, stages, params, manifest, report, until, emit, max_recoveries):
            return report


def _note(names: list[str], name: str) -> None:
    if name not in names:
        names.append(name)


def _run_pass(
    run_dir: Path | str,
    stages: Sequence[Stage],
    params: Mapping[str, Mapping[str, Any]],
    manifest: Manifest,
    report: RunReport,
    until: str | None,
    emit: Callable[[str, str, dict[str, Any]], None],
    max_recoveries: int,
) -> bool:
    """Run the stages once; True when a corrupt tile was recovered and a new pass is due."""
    fps: dict[str, str | None] = {}
    outputs: dict[str, dict[str, Any]] = {}
    # where each stage's data lives: the shared stages at {run_dir}/{stage}, this
    # configuration's in its directory once it is entered
    catalog = Catalog(run_dir)
    planned: dict[str, Planned] | None = None

    def read_nodes(readers: Sequence[Stage]) -> dict[str, dict[str, Any]]:
        """The stages' outputs so far, with the output of each node ``readers`` read
        (evaluated once a pass, from its record when it has one)."""
        for node in (n for s in readers for n in s.reads):
            if node.name not in report.nodes:
                report.nodes[node.name] = node_output(catalog, node, params, outputs)
        return {**outputs, **report.nodes}

    report.nodes.clear()  # a new pass: read again (a recovery may have rerun their inputs)
    for stage in stages:
        try:  # planning reads upstream outputs (the ingest arrays): damage there is recovered
            if stage.per_config and planned is None:
                # the shared stages are done: this configuration's results get their own
                # directory
                seen = read_nodes([s for s in stages if s.per_config])
                planned = plan_configuration(stages, params, seen, fps)
                report.configuration = enter_configuration(run_dir, manifest, planned, emit, stages)
                cfg_dir = manifest.results[report.configuration].dir
                catalog.set_stage_dirs({n: catalog.config_stage_dir(cfg_dir, n) for n in planned})
            if planned is not None and stage.name in planned:
                enabled, stage_params, fp = planned[stage.name]
            else:
                enabled, stage_params, fp = plan_stage(stage, params, read_nodes([stage]), fps)
        except Exception as e:
            if _recover_from(e, catalog, stages, manifest, report, stage, max_recoveries, emit):
                return True
            raise
        rec = manifest.stage(stage.name)
        stage_dir = catalog.stage_dir(stage.name)
        if not enabled:
            fps[stage.name] = None
            if rec.status != "skipped":
                rec.status, rec.fingerprint, rec.outputs, rec.error = "skipped", None, {}, None
                manifest.save()
            _note(report.disabled, stage.name)
            emit(stage.name, "disabled", {})
            if until == stage.name:
                break
            continue
        fps[stage.name] = fp
        if (
            rec.status == "done"
            and same_work(rec.fingerprint, fp)
            and outputs_damaged(stage, stage_dir, rec, emit)
        ):
            rec.status = "failed"  # rerun it below, resuming from its intact records
            manifest.save()
        if rec.status == "done" and same_work(rec.fingerprint, fp):
            outputs[stage.name] = rec.outputs
            _note(report.skipped_done, stage.name)
            emit(stage.name, "skip", {"fingerprint": fp})
            if until == stage.name:
                break
            continue
        if stage.reusable and stage.per_config and rec.started is None:
            _check_adoptable(stage_dir, rec)  # a directory of the user's: refused first
            rec.started = time.time()  # (recorded before the directory is made: ours)
            manifest.save()
            adopted = adopt_result(run_dir, manifest, stage, fp, stage_dir)
            if adopted is not None:
                rec.status, rec.fingerprint, rec.outputs, rec.error = "done", fp, adopted, None
                rec.finished = time.time()
                manifest.save()
                outputs[stage.name] = adopted
                _note(report.skipped_done, stage.name)
                emit(stage.name, "skip", {"fingerprint": fp, "copied": True})
                if until == stage.name:
                    break
                continue
            rec.started = None  # (nothing made: the record says so again)
            manifest.save()
        _check_adoptable(stage_dir, rec)  # from here on, stage_dir is ours
        if rec.fingerprint is not None and not same_work(rec.fingerprint, fp):
            # another config computed what is there: never resume from it
            _clear_dir(stage_dir)
            _note(report.invalidated, stage.name)
            emit(stage.name, "invalidate", {"old": rec.fingerprint, "new": fp})
        resumed = rec.status in ("running", "failed", "interrupted") and same_work(
            rec.fingerprint, fp
        )
        rec.status, rec.fingerprint, rec.outputs, rec.error = "running", fp, {}, None
        rec.started, rec.finished = time.time(), None
        manifest.save()
        emit(stage.name, "start", {"fingerprint": fp, "resumed": resumed})
        if not is_url(stage_dir):
            stage_dir.mkdir(parents=True, exist_ok=True)
        # upstream outputs, each with its stage fingerprint under "_fingerprint"
        inputs = {u: {**outputs[u], "_fingerprint": fps[u]} for u in stage.after if u in outputs}
        inputs.update({n.name: report.nodes[n.name] for n in stage.reads})  # (not fingerprinted)
        t0 = time.perf_counter()
        usage = StageUsage.start()  # wall time and peak memory, kept in the manifest
        try:
            with use_catalog(catalog):  # the stage's datasets: stage_catalog(name, stage_dir)
                out = stage.func(stage_dir, inputs, **stage_params)
        except BaseException as e:
            # the cleanup, in seconds even on a store that does not answer
            cap_store_waits_if_interrupted(e)
            if _store_gone(e):
                cap_store_waits()
            rec.resources = usage.stop()
            # Ctrl-C or SIGTERM (pipeline.errors.Terminated): stopped, not broken
            stopped = isinstance(e, KeyboardInterrupt)
            rec.status = "interrupted" if stopped else "failed"
            rec.error = "".join(traceback.format_exception_only(type(e), e)).strip()
            rec.finished = time.time()
            try:
                manifest.save()
            except Exception as save_error:  # e.g. the store stopped answering
                if not isinstance(e, KeyboardInterrupt | SystemExit):
                    raise
                log.warning("the manifest was not saved after the interrupt: %s", save_error)
            if isinstance(e, KeyboardInterrupt | SystemExit):
                emit(stage.name, "interrupted" if stopped else "failed", {"error": rec.error})
                raise
            if _recover_from(e, catalog, stages, manifest, report, stage, max_recoveries, emit):
                return True
            emit(stage.name, "failed", {"error": rec.error})
            raise StageFailed(stage.name, e) from e
        dt = time.perf_counter() - t0
        rec.resources = usage.stop()
        rec.status, rec.outputs, rec.finished = "done", outputs_json(out), time.time()
        manifest.save()
        outputs[stage.name] = rec.outputs
        _note(report.ran, stage.name)
        if stage.name in report.skipped_done:  # complete at first, rerun after a recovery
            report.skipped_done.remove(stage.name)
        report.timings[stage.name] = report.timings.get(stage.name, 0.0) + dt
        if stage.per_config:
            write_latest(run_dir, manifest)
        emit(stage.name, "done", {"seconds": dt, "outputs": rec.outputs})
        if until == stage.name:
            break
    return False


def outputs_json(out: Any) -> dict[str, Any]:
    """A stage's return value as the manifest's JSON dict: a dataclass (its ``to_json()``,
    else its fields) or a mapping."""
    if out is None:
        return {}
    if hasattr(out, "to_json"):
        return dict(out.to_json())
    if dataclasses.is_dataclass(out) and not isinstance(out, type):
        return dataclasses.asdict(out)
    return dict(out)
