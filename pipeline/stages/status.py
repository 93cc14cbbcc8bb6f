"""What a run directory holds: each stage done, partial or pending, with tile counts.

Stage states come from the manifest; tile counts come from the completion
records (markers) in the stage's stores, checked against each array's
fingerprint, so a tile counts only when it is complete for the current inputs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.stages.catalog import Catalog
from pipeline.stages.lock import check_run_dir_files, lock_owner
from pipeline.stages.manifest import Manifest
from pipeline.stages.stage import STAGE_NAMES
from pipeline.storage import TileMarkers
from pipeline.storage.location import Location, is_url


def _marker_dirs(stage_dir: Path) -> list[tuple[Path, str]]:
    """(store root, array name) for every marker directory under ``stage_dir``."""
    found = []
    for mdir in sorted(stage_dir.rglob("_markers")):
        if not mdir.is_dir():
            continue
        store = mdir.parent
        for leaf in sorted(p for p in mdir.rglob("*") if p.is_dir()):
            if any(f.is_file() and not f.name.endswith(".tmp") for f in leaf.iterdir()):
                found.append((store, str(leaf.relative_to(mdir))))
    return found


def _array_progress(store: Path, name: str) -> dict[str, Any]:
    import zarr

    try:
        arr = zarr.open_array(store=str(store), path=name, mode="r", zarr_format=3)
    except Exception:
        # markers without an array (e.g. a CG checkpoint): report the latest record
        recs = []
        for f in (store / "_markers" / name).iterdir():
            if f.is_file() and not f.name.endswith(".tmp"):
                try:
                    recs.append(json.loads(f.read_text()))
                except (OSError, json.JSONDecodeError):
                    pass
        info: dict[str, Any] = {"array": name, "done": len(recs), "total": None}
        iters = [r["iteration"] for r in recs if "iteration" in r]
        if iters:
            info["iteration"] = max(iters)
        return info
    attrs = dict(arr.attrs)
    fp = attrs.get("fingerprint")
    done = len(TileMarkers(str(store), name, fp).done()) if fp else 0
    grid = [-(-s // c) for s, c in zip(arr.shape, arr.chunks)]
    if str(attrs.get("layout", "")).startswith("lower") and len(grid) == 2:
        total = grid[0] * (grid[0] + 1) // 2
    else:
        total = 1
        for g in grid:
            total *= g
    return {"array": name, "done": done, "total": total}


def stage_tiles(stage_dir: Path) -> list[dict[str, Any]]:
    """Tile progress of every tiled array a stage has written (possibly partially)."""
    if not stage_dir.is_dir():
        return []
    out = []
    for store, name in _marker_dirs(stage_dir):
        info = _array_progress(store, name)
        info["store"] = str(store.relative_to(stage_dir.parent))
        out.append(info)
    return out


def _stage_tiles_url(stage_url: str) -> list[dict[str, Any]]:
    """:func:`stage_tiles` for a stage directory on an object store (a URL)."""
    import zarr

    loc = Location(stage_url)
    try:
        keys = loc.fs.find(loc.root)
    except FileNotFoundError:
        return []
    groups: dict[tuple[str, str], int] = {}
    for k in keys:
        rel = str(k)[len(loc.root) + 1 :]
        if "/_markers/" not in "/" + rel or rel.endswith(".tmp"):
            continue
        store_rel, _, rest = ("/" + rel).partition("/_markers/")
        name = rest.rsplit("/", 1)[0]
        key = (store_rel.strip("/"), name)
        groups[key] = groups.get(key, 0) + 1
    out = []
    stage = stage_url.rstrip("/").rsplit("/", 1)[-1]
    for (store_rel, name), count in sorted(groups.items()):
        store = loc.child(store_rel)
        info: dict[str, Any] = {"array": name, "done": count, "total": None}
        try:
            arr = zarr.open_array(store=store, path=name, mode="r", zarr_format=3)
        except Exception:
            pass
        else:
            fp = arr.attrs.get("fingerprint")
            info["done"] = len(TileMarkers(store, name, fp).done()) if fp else 0
            grid = [-(-s // c) for s, c in zip(arr.shape, arr.chunks)]
            if str(arr.attrs.get("layout", "")).startswith("lower") and len(grid) == 2:
                info["total"] = grid[0] * (grid[0] + 1) // 2
            else:
                info["total"] = int(np.prod(grid))
        info["store"] = f"{stage}/{store_rel}"
        out.append(info)
    return out


def run_status(run_dir: str | Path, stage_names: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Status of ``run_dir`` as a JSON-able dict.

    Each stage's ``state`` is ``done`` (complete under its recorded fingerprint),
    ``partial`` (started, not finished: killed, failed or running now),
    ``pending`` (not started) or ``skipped`` (not needed for this config).

    Raises
    ------
    FileNotFoundError
        ``run_dir`` does not exist or holds no manifest.
    pipeline.stages.lock.RunDirUnusable
        A file it would read (the manifest, the lock, a marker) is a FIFO, socket,
        device or symbolic link to a file: refused at once, as ``krr run`` refuses it
        (reading a FIFO waited for a writer for ever).
    """

    remote = is_url(run_dir)
    run_dir = str(run_dir).rstrip("/") if remote else Path(run_dir)
    if not remote:
        check_run_dir_files(run_dir)
    manifest = Manifest.load(run_dir)
    if not Catalog(run_dir).exists("manifest"):
        raise FileNotFoundError(f"{str(run_dir)!r} is not a run directory (no manifest.json)")
    if stage_names is None:
        stage_names = STAGE_NAMES
    names = list(stage_names) + [n for n in manifest.stages if n not in stage_names]
    owner = lock_owner(run_dir)
    stages = []
    for name in names:
        rec = manifest.stages.get(name)
        status = rec.status if rec else "pending"
        sdir = manifest.stage_dir(name)
        if status == "skipped":
            tiles = []
        else:
            tiles = _stage_tiles_url(str(sdir)) if remote else stage_tiles(sdir)
        if status == "done":
            state = "done"
        elif status == "skipped":
            state = "skipped"
        elif status in ("running", "failed", "interrupted") or any(t["done"] for t in tiles):
            state = "partial"
        else:
            state = "pending"
        entry: dict[str, Any] = {"stage": name, "state": state, "status": status, "tiles": tiles}
        if name in manifest.linked():
            entry["dir"] = manifest.stage_dir_rel(name)
        if rec is not None:
            entry["fingerprint"] = rec.fingerprint
            if rec.started and rec.finished and status == "done":
                entry["seconds"] = round(rec.finished - rec.started, 3)
            if rec.error:
                entry["error"] = rec.error
            if status == "running":
                entry["active"] = owner is not None
        stages.append(entry)
    all_done = all(s["state"] in ("done", "skipped") for s in stages)
    return {
        "run_dir": str(run_dir),
        "complete": all_done,
        "running": owner is not None,
        "lock_owner": owner,
        "stages": stages,
        "latest": manifest.latest,
        "configurations": configurations(manifest),
    }


def _kernel_text(spec: Any) -> str | None:
    if not isinstance(spec, dict) or "name" not in spec:
        return None if spec is None else str(spec)
    p = spec.get("params") or {}
    inner = ", ".join(
        f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in p.items() if v is not None
    )
    return f"{spec['name']}({inner})"


def configurations(manifest: Manifest) -> list[dict[str, Any]]:
    """Every configuration a run directory keeps, oldest first, with its key parameters
    (kernel, λ, solver), its state, metrics and model path (see :mod:`pipeline.stages.results`).

    Parameters
    ----------
    manifest : Manifest
        The run directory's manifest (:meth:`Manifest.load`).

    Returns
    -------
    list of dict
        ``configuration`` (the key), ``latest``, ``dir`` (relative to the run
        directory), ``state`` (``done``, ``partial`` or ``pending``), ``stages``
        (name to status), ``kernel``, ``lam``, ``lam_convention``, ``solver``
        (as configured) and ``method`` (as solved), ``metrics`` and
        ``baseline_metrics`` (held-out, from the evaluate stage; ``{}`` when not
        evaluated), ``model`` (the artifact's path once written), ``created``,
        ``updated``; with ``evaluate.compare``, ``compare`` (one row per comparison
        model) and ``compare_summary`` (its sentence).
    """
    out = []
    for key, cfg in sorted(manifest.results.items(), key=lambda kv: kv[1].created):
        recs = cfg.stages
        statuses = {n: r.status for n, r in recs.items()}
        if statuses and all(s in ("done", "skipped") for s in statuses.values()):
            state = "done"
        elif any(r.started is not None for r in recs.values()):
            state = "partial"
        else:
            state = "pending"
        sp = cfg.params.get("solve") or cfg.params.get("model") or {}
        sol = recs["solve"].outputs if "solve" in recs and recs["solve"].status == "done" else {}
        ev = recs.get("evaluate")
        ev_out = ev.outputs if ev is not None and ev.status == "done" else {}
        model = recs.get("model")
        out.append(
            {
                "configuration": key,
                "latest": key == manifest.latest,
                "dir": cfg.dir,
                "state": state,
                "stages": statuses,
                "kernel": sp.get("kernel"),
                "lam": sp.get("lam", sol.get("lam")),
                "lam_convention": sp.get("lam_convention", sol.get("lam_convention")),
                "solver": (sp.get("solver") or {}).get("method"),
                "method": sol.get("method"),
                "metrics": dict(ev_out.get("metrics") or {}),
                "baseline_metrics": dict((ev_out.get("baseline") or {}).get("metrics") or {}),
                "model": model.outputs.get("path")
                if model is not None and model.status == "done"
                else None,
                "created": cfg.created,
                "updated": cfg.updated,
                # evaluate.compare's rows and sentence (only when the config asks for them)
                **{k: ev_out[k] for k in ("compare", "compare_summary") if k in ev_out},
            }
        )
    return out


def format_configurations(status: dict[str, Any]) -> list[str]:
    """Lines for ``krr status``: one per kept configuration, its parameters and metrics."""
    cfgs = status.get("configurations") or []
    if not cfgs:
        return []
    lines = [f"configurations ({len(cfgs)} kept; * = latest):"]
    for c in cfgs:
        lam = c.get("lam")
        parts = [
            "*" if c["latest"] else " ",
            c["configuration"],
            _kernel_text(c.get("kernel")) or "kernel ?",
            f"lambda={lam:g}" if isinstance(lam, float | int) else "lambda=?",
            c.get("method") or c.get("solver") or "?",
            c["state"],
        ]
        metrics = "  ".join(f"{k} {v:.6g}" for k, v in c["metrics"].items())
        line = "  " + " ".join(parts) + (f"  {metrics}" if metrics else "")
        lines.append(line)
        lines.append(f"      {c['dir'] or '.'}" + (f"  model: {c['model']}" if c["model"] else ""))
        if c.get("compare_summary"):
            lines.append(f"      compare: {c['compare_summary']}")
    return lines


def latest_model(run_dir: str | Path) -> str:
    """Path of the model artifact of ``run_dir``'s latest configuration.

    Raises
    ------
    FileNotFoundError
        ``run_dir`` holds no manifest.
    ValueError
        The latest configuration has no complete model stage.
    """

    remote = is_url(run_dir)
    run_dir = str(run_dir).rstrip("/") if remote else Path(run_dir)
    manifest = Manifest.load(run_dir)
    if not Catalog(run_dir).exists("manifest"):
        raise FileNotFoundError(f"{str(run_dir)!r} is not a run directory (no manifest.json)")
    rec = manifest.stages.get("model")
    if rec is None or rec.status != "done" or not rec.outputs.get("path"):
        which = f" (configuration {manifest.latest})" if manifest.latest else ""
        raise ValueError(
            f"run directory {str(run_dir)!r}: its latest configuration{which} has no complete "
            "model; finish it with `krr run` and the same config, or pass the model of another "
            "configuration (`krr status RUN_DIR` lists them, with their model paths)"
        )
    return str(rec.outputs["path"])
