"""Whole-file prediction outputs (.npy / .csv) carry a CRC-32C, checked before a skip.

A batch prediction written as ``.npy`` or ``.csv`` used to be recorded with no
checksum, so a file changed after the run was trusted on the next run. Now the
predict stage records the file's CRC-32C, and a changed file is recomputed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipeline.config import load_config
from pipeline.predict.output import file_crc32c, write_predictions
from pipeline.stages import default_stages, run_stages

BASE = {
    "data": {"source": "sklearn", "name": "diabetes"},
    "split": {"test_fraction": 0.25},
    "kernel": {"name": "rbf", "params": {"gamma": 0.05}},
    "lambda": 0.5,
    "solver": {"method": "cholesky"},
    "block_size": 128,
    "evaluate": {"baseline": "none"},
}


def _go(run: Path, new_rows: Path, out: Path):
    cfg = load_config(
        {**BASE, "predict": {"input": str(new_rows), "output": str(out)}},
        [],
    )
    return run_stages(run, default_stages(), cfg.stage_params(), identity=cfg.identity())


def test_write_predictions_returns_the_files_crc(tmp_path):
    y = np.arange(10.0)
    for ext in ("npy", "csv"):
        p = tmp_path / f"y.{ext}"
        assert write_predictions(p, y, ext) == file_crc32c(p)


@pytest.mark.parametrize("ext", ["npy", "csv"])
def test_changed_prediction_file_is_recomputed_not_trusted(tmp_path, ext):
    rng = np.random.default_rng(0)
    new_rows = tmp_path / "new.npy"
    np.save(new_rows, rng.standard_normal((37, 10)))
    out = tmp_path / f"pred.{ext}"
    first = _go(tmp_path / "run", new_rows, out)
    assert "predict" in first.ran
    good = out.read_bytes()
    assert first.outputs["predict"]["batch"]["crc32c"] == file_crc32c(out)

    again = _go(tmp_path / "run", new_rows, out)  # untouched: skipped after verification
    assert "predict" in again.skipped_done and "predict" not in again.ran

    data = bytearray(good)
    data[-3] ^= 0x01  # one changed digit / byte, same size
    out.write_bytes(bytes(data))
    third = _go(tmp_path / "run", new_rows, out)
    assert "predict" in third.ran  # recomputed, not trusted
    assert out.read_bytes() == good
