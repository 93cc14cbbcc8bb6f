"""Cheap checks of a complete stage's outputs before the runner skips it.

A stage recorded as done is normally skipped. Its small, final outputs (the
model artifact, the prediction blocks) are what a user reads after ``krr run``
exits 0, so the runner re-reads them through their checksums first. A damaged
output is not an error for the run: the stage is rerun (its completion records
for the damaged blocks are removed first) and the run still exits 0 with the
right numbers. Large intermediate arrays (the Gram, the factor) are not
re-read here; their consumers verify every tile they read.

Each check returns None when the outputs verify, or raises
:class:`~pipeline.storage.CorruptTileError` (a damaged tile: the runner unmarks
it) or :class:`DamagedOutput` (anything else: the stage is rerun as a whole).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from pipeline.errors import DamagedOutput
from pipeline.linalg.gram import open_gram
from pipeline.models.artifact import ArtifactError, load_artifact
from pipeline.stages.catalog import stage_catalog
from pipeline.stages.evaluate import metrics_file_view
from pipeline.stages.manifest import _json_default
from pipeline.storage import read_all
from pipeline.storage.fingerprint import same_work
from pipeline.storage.predictions import file_crc32c


def verify_gram(stage_dir: Path, outputs: dict[str, Any]) -> None:
    """The Gram's array metadata still says what the stage recorded (shape, tile,
    dtype, fingerprint): a damaged ``zarr.json`` failed every later stage, and every
    rerun, with the same error (the tiles themselves are checked when read)."""

    if not outputs.get("store"):
        return
    try:
        g = open_gram(outputs["store"], outputs.get("name", "gram"))
        found = [list(g.shape), g.block_size, np.dtype(g.dtype).name, g.fingerprint]
    except (OSError, ValueError) as e:
        raise DamagedOutput(f"Gram {outputs['store']!r}: {e}") from e
    want = [outputs.get(k) for k in ("shape", "block_size", "dtype", "fingerprint")]
    want[2] = np.dtype(want[2]).name if want[2] else want[2]
    if found != want:
        raise DamagedOutput(
            f"Gram {outputs['store']!r}: its metadata says shape, tile, dtype, fingerprint "
            f"{found}, the stage recorded {want}"
        )


def verify_model(stage_dir: Path, outputs: dict[str, Any]) -> None:
    """The model artifact loads with every array matching its checksum."""

    path = outputs.get("path")
    if not path:
        return
    try:
        load_artifact(path)
    except (ArtifactError, FileNotFoundError) as e:
        raise DamagedOutput(f"model artifact {path!r}: {e}") from e


def verify_predictions(stage_dir: Path, outputs: dict[str, Any]) -> None:
    """Every stored prediction block (Zarr outputs) and every whole-file output
    (.npy / .csv / .parquet, recorded with the CRC-32C of its bytes) matches its checksum."""
    for entry in outputs.values():
        if not isinstance(entry, dict):
            continue
        if entry.get("path") and entry.get("crc32c") is not None:
            try:
                found = file_crc32c(entry["path"])
            except OSError as e:
                raise DamagedOutput(f"prediction file {entry['path']!r}: {e}") from e
            if found != int(entry["crc32c"]):
                raise DamagedOutput(
                    f"prediction file {entry['path']!r} does not match its recorded CRC-32C "
                    f"(found {found}, recorded {entry['crc32c']}): it changed after it was written"
                )
            continue
        if not entry.get("store") or not entry.get("name"):
            continue  # whole-file outputs of runs from before checksums were recorded
        if entry.get("fingerprint"):  # another configuration may have written it since
            import zarr

            try:
                found = zarr.open_array(
                    store=entry["store"], path=entry["name"], mode="r", zarr_format=3
                )
                fp = found.attrs.get("fingerprint")
            except Exception as e:  # missing or unreadable: recomputed like a damaged one
                raise DamagedOutput(f"predictions {entry['store']!r}: {e}") from e
            if not same_work(fp, entry["fingerprint"]):
                raise DamagedOutput(
                    f"predictions {entry['store']!r} (array {entry['name']!r}) now hold another "
                    f"model's or input's predictions (fingerprint {fp}, this stage wrote "
                    f"{entry['fingerprint']}): written by another configuration since"
                )
        read_all(entry["store"], entry["name"], row_keys=True)


def verify_metrics(stage_dir: Path, outputs: dict[str, Any]) -> None:
    """``metrics.json`` holds what the evaluate stage recorded in the manifest."""
    import json

    if not outputs.get("metrics"):
        return  # nothing was evaluated (no test rows): no file was written
    catalog = stage_catalog("evaluate", stage_dir)
    path = catalog.path("metrics")
    try:
        found = catalog.load("metrics")
    except (FileNotFoundError, ValueError) as e:
        raise DamagedOutput(f"metrics {str(path)!r} cannot be read: {e}") from e

    want = json.loads(json.dumps(metrics_file_view(outputs), default=_json_default))
    if found != want:
        raise DamagedOutput(f"metrics {str(path)!r} differ from the run's recorded metrics")
