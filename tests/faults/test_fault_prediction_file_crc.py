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


def test_a_shared_zarr_output_rewritten_by_another_configuration_is_predicted_again(tmp_path):
    # two configurations (lambda) wrote the same predict.output; switching back found its
    # results complete and kept the other's predictions in p.zarr, exit 0 (session 25)
    import zarr
    from sklearn.datasets import load_diabetes

    new_rows = tmp_path / "new.npy"
    np.save(new_rows, load_diabetes().data[:37])  # rows like the training rows
    out = tmp_path / "p.zarr"

    def go(lam):
        cfg = load_config(
            {**BASE, "lambda": lam, "predict": {"input": str(new_rows), "output": str(out)}}, []
        )
        rep = run_stages(tmp_path / "run", default_stages(), cfg.stage_params(),
                         identity=cfg.identity())  # fmt: skip
        return rep, np.asarray(zarr.open_array(store=str(out), path="predictions")[...])

    _, first = go(0.5)
    _, other = go(5.0)
    assert not np.allclose(first, other)
    rep, back = go(0.5)
    assert "predict" in rep.ran  # its store held lambda=5's predictions: predicted again
    np.testing.assert_array_equal(back, first)
