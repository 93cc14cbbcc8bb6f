"""Whole-file prediction outputs (.npy / .csv) carry a CRC-32C, checked before a skip.

A batch prediction written as ``.npy`` or ``.csv`` used to be recorded with no
checksum, so a file changed after the run was trusted on the next run. Now the
predict stage records the file's CRC-32C, and a changed file is recomputed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipeline.stages import default_stages, run_stages
from pipeline.stages.config import load_config
from pipeline.storage.predictions import file_crc32c, write_predictions

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
    # not trusted, and not replaced either: nothing says the changed file is still ours
    # (a user's file saved there after the pipeline's was removed looks the same;
    # session 26: it was replaced with a warning)
    from pipeline.stages.runner import StageFailed
    from pipeline.storage.errors import ForeignPathError

    with pytest.raises(StageFailed, match="changed since the pipeline wrote it") as ei:
        _go(tmp_path / "run", new_rows, out)
    assert isinstance(ei.value.__cause__, ForeignPathError)
    assert out.read_bytes() == bytes(data)
    out.unlink()  # the user removes it: predicted again
    third = _go(tmp_path / "run", new_rows, out)
    assert "predict" in third.ran
    assert out.read_bytes() == good


def test_a_users_file_where_the_pipeline_wrote_is_not_replaced(tmp_path):
    # the pipeline's out.npy removed (its record stays), the user's own saved there:
    # --overwrite replaced it with a warning (session 26)
    from pipeline.storage.errors import ForeignPathError

    out = tmp_path / "out.npy"
    write_predictions(out, np.arange(10.0), "npy")
    out.unlink()
    np.save(out, np.arange(5))
    mine = out.read_bytes()
    with pytest.raises(ForeignPathError, match="changed since the pipeline wrote it"):
        write_predictions(out, np.arange(10.0), "npy", overwrite=True)
    assert out.read_bytes() == mine


@pytest.mark.parametrize("ext", ["npy", "csv", "parquet"])
def test_a_write_killed_between_its_renames_is_replaced_and_zero_rows_write(
    tmp_path, ext, monkeypatch
):
    # the data was renamed in before its record: a kill between the two left a file that
    # --overwrite refused as a user's; a 0-row csv/parquet failed to reshape; the temp
    # name f"{path}.tmp-{pid}" truncated and removed a file of that name (session 26)
    import os

    import pipeline.storage.predictions as output

    pytest.importorskip("pyarrow") if ext == "parquet" else None
    out = tmp_path / f"y.{ext}"
    decoy = tmp_path / f"y.{ext}.tmp-{os.getpid()}"
    decoy.write_text("mine")
    write_predictions(out, np.arange(4.0), ext)
    first = out.read_bytes()
    real, calls = os.replace, []

    def killed(src, dst):
        calls.append(dst)
        if str(dst) == str(out):
            raise KeyboardInterrupt  # the record is in place, the data not yet
        return real(src, dst)

    monkeypatch.setattr(output.os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        write_predictions(out, np.arange(6.0), ext, overwrite=True)
    monkeypatch.setattr(output.os, "replace", real)
    assert out.read_bytes() == first and len(calls) == 2
    assert write_predictions(out, np.zeros(0), ext, overwrite=True) == file_crc32c(out)
    assert decoy.read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [out.name, out.name + ".krr-pipeline.json", decoy.name]
    )


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
