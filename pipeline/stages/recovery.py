"""Recovery from damaged stored data found while a run is going on.

A stage that raises :class:`~pipeline.storage.CorruptTileError` (a stored tile
whose bytes no longer match its completion record, or a torn chunk) or
:class:`~pipeline.storage.IncompleteArrayError` (tiles without completion
records) does not fail the run when the array's store lies inside a stage
directory of this run: the damaged tile's record is removed, the stage that owns
the store and every stage downstream of it are marked partial, and the runner
(:mod:`pipeline.stages.runner`) goes on from the owning stage. A complete
stage whose final outputs fail its ``verify`` check is rerun the same way.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.errors import CorruptTileError, IncompleteArrayError, caused_by
from pipeline.stages.catalog import Catalog
from pipeline.stages.manifest import Manifest
from pipeline.storage import TileMarkers
from pipeline.storage.location import is_url

if TYPE_CHECKING:
    from pipeline.stages.stage import RunReport, Stage

log = logging.getLogger("pipeline.stages")


def find_damage(exc: BaseException) -> CorruptTileError | None:
    """The CorruptTileError (an IncompleteArrayError is one) ``exc`` is or was raised
    from (its cause/context chain)."""
    return caused_by(exc, CorruptTileError)


def names_tiles_without_records(err: CorruptTileError) -> bool:
    """Whether ``err`` is an :class:`IncompleteArrayError` of the array form: tiles
    without completion records, which the owner stage computes (nothing to unmark).
    Every other form names one tile whose record is removed before it is recomputed."""
    return isinstance(err, IncompleteArrayError) and err.tile is None


def owner_stage(catalog: Catalog, stages: Sequence[Stage], store: str) -> Stage | None:
    """The stage whose directory holds ``store`` (a local path, or a URL under a URL
    run directory), or None. Each stage's directory is the one ``catalog`` places it in
    (``{run_dir}/{name}``, or a configuration's ``results/<key>/{name}``)."""
    if is_url(catalog.run_dir):
        for s in stages:
            d = str(catalog.stage_dir(s.name)).rstrip("/")
            if store.rstrip("/") == d or store.startswith(d + "/"):
                return s
        return None
    path = store[len("file://") :] if store.startswith("file://") else store
    if "://" in path:
        return None
    p = Path(path).resolve()
    for s in stages:
        d = Path(catalog.stage_dir(s.name)).resolve()
        if p == d or p.is_relative_to(d):
            return s
    return None


def downstream(stages: Sequence[Stage], name: str) -> list[str]:
    """``name`` and every stage that depends on it, directly or transitively, in order."""
    out = {name}
    for s in stages:  # dependency order: upstream stages come first
        if any(u in out for u in s.after):
            out.add(s.name)
    return [s.name for s in stages if s.name in out]


def mark_partial(stages: Sequence[Stage], manifest: Manifest, owner: Stage, note: str) -> list[str]:
    """Mark ``owner`` and every stage downstream of it partial; return their names."""
    affected = downstream(stages, owner.name)
    for name in affected:
        rec = manifest.stage(name)
        if rec.status in ("done", "running"):
            rec.status, rec.error = "failed", note
    manifest.save()
    return affected


def outputs_damaged(
    stage: Stage, stage_dir: Path, rec: Any, emit: Callable[[str, str, dict[str, Any]], None]
) -> bool:
    """Whether a complete stage's outputs fail its ``verify`` check (then rerun it)."""
    if stage.verify is None:
        return False
    try:
        stage.verify(stage_dir, rec.outputs)
    except CorruptTileError as e:
        if not names_tiles_without_records(e):
            TileMarkers(e.store, e.name, "").unmark(e.tile)
        problem = str(e)
    except ValueError as e:
        problem = str(e)
    else:
        return False
    rec.error = f"outputs failed verification, recomputing: {problem}"
    log.warning("stage %r is complete but %s", stage.name, rec.error)
    emit(stage.name, "corrupt", {"problem": problem})
    return True


def recover_corrupt_tile(
    stages: Sequence[Stage],
    manifest: Manifest,
    report: RunReport,
    failed: Stage,
    owner: Stage,
    err: CorruptTileError,
    max_recoveries: int,
) -> None:
    """Unmark the corrupt tile; mark its owner stage and everything downstream partial."""
    TileMarkers(err.store, err.name, "").unmark(err.tile)
    note = f"recomputing corrupt tile {err.tile} of {err.name!r} (found by stage {failed.name!r})"
    affected = mark_partial(stages, manifest, owner, note)
    entry = {
        "kind": "corrupt",
        "stage": failed.name,
        "owner": owner.name,
        "store": err.store,
        "array": err.name,
        "tile": list(err.tile),
        "expected_crc32c": err.expected,
        "found_crc32c": err.found,
        "reason": err.problem,
    }
    report.recovered.append(entry)
    log.warning(
        "corrupt tile %s of array %r in %s (%s), found by stage %r: its completion record is "
        "removed; rerunning from stage %r (partial: %s) to recompute it [recovery %d of at "
        "most %d in this run]",
        err.tile,
        err.name,
        err.store,
        err.problem,
        failed.name,
        owner.name,
        ", ".join(affected),
        len(report.recovered),
        max_recoveries,
    )


def recover_incomplete(
    stages: Sequence[Stage],
    manifest: Manifest,
    report: RunReport,
    failed: Stage,
    owner: Stage,
    err: IncompleteArrayError,
    max_recoveries: int,
) -> None:
    """Mark the owner of an incomplete array and everything downstream partial."""
    tiles = [list(t) for t in err.missing]
    note = (
        f"computing {len(tiles)} tile(s) of {err.name!r} without a completion record "
        f"(found by stage {failed.name!r})"
    )
    affected = mark_partial(stages, manifest, owner, note)
    report.recovered.append(
        {
            "kind": "incomplete",
            "stage": failed.name,
            "owner": owner.name,
            "store": err.store,
            "array": err.name,
            "tiles": tiles,
        }
    )
    log.warning(
        "array %r in %s is incomplete: %d tile(s) have no completion record (first: %s), found "
        "by stage %r; rerunning from stage %r (partial: %s) to compute them [recovery %d of at "
        "most %d in this run]",
        err.name,
        err.store,
        len(tiles),
        tiles[:5],
        failed.name,
        owner.name,
        ", ".join(affected),
        len(report.recovered),
        max_recoveries,
    )
