"""Per-feature length scales (ARD) by maximum marginal likelihood, and their use as the
ingest stage's feature scaling (``preprocess.ard_rows``)."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.models.selection.relevance import relevance_scales
from pipeline.stages import ingest, typed_params
from pipeline.stages.config import PreprocessConfig, load_config
from pipeline.stages.ingest import open_rows


def _data(n=400, seed=0):
    """y depends smoothly on feature 0, fast on feature 1, and not at all on feature 2."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, 3))
    y = np.sin(0.5 * X[:, 0]) + np.sin(2.0 * X[:, 1]) + 0.01 * rng.standard_normal(n)
    return X, y


def test_the_scales_rank_the_features_by_relevance():
    X, y = _data()
    rel = relevance_scales(X, y)
    assert rel.shape == (3,) and np.all(np.isfinite(rel)) and np.all(rel > 0)
    assert np.median(rel) == pytest.approx(1.0)
    # the fastest-varying feature has the shortest length scale, the irrelevant one the longest
    assert rel[1] < rel[0] < rel[2]
    assert rel[2] > 10 * rel[1]
    np.testing.assert_array_equal(rel, relevance_scales(X, y))  # seeded: the same bits


def test_ingest_divides_each_feature_by_its_relevance(tmp_path):
    X, y = _data(500, seed=1)
    np.save(tmp_path / "X.npy", X)
    np.save(tmp_path / "y.npy", y)
    base = dict(
        data={"source": "npy", "path": str(tmp_path / "X.npy"), "y_path": str(tmp_path / "y.npy")},
        split={"test_fraction": 0.2, "seed": 1},
        block_size=64,
    )
    plain = ingest.run(tmp_path / "a", {}, **typed_params("ingest", {**base, "preprocess": {}}))
    ard = ingest.run(
        tmp_path / "b", {}, **typed_params("ingest", {**base, "preprocess": {"ard_rows": 300}})
    )
    s0, s1 = (np.asarray(o.to_json()["scaler"]["scale"]) for o in (plain, ard))
    assert ard.to_json()["scaler"]["mean"] == plain.to_json()["scaler"]["mean"]
    rel = s1 / s0
    assert np.median(rel) == pytest.approx(1.0) and rel[1] < rel[0] < rel[2]
    # the stored rows are the standardised ones divided by the relevance
    X0 = np.asarray(open_rows(plain, "X_train").compute(scheduler="sync"))
    X1 = np.asarray(open_rows(ard, "X_train").compute(scheduler="sync"))
    np.testing.assert_allclose(X1, X0 / rel, rtol=1e-12, atol=1e-12)


def test_ard_rows_is_checked_and_named_only_when_set():
    with pytest.raises(ValueError, match="ard_rows=100 needs preprocess.standardize: true"):
        PreprocessConfig(standardize=False, ard_rows=100)
    with pytest.raises(ValueError, match="ard_rows"):
        PreprocessConfig(ard_rows=1)
    with pytest.raises(ValueError, match=r"ard_rows=20000 is more than 5,000: .*1,000-3,000"):
        PreprocessConfig(ard_rows=20_000)  # refused before any work: the GP is rows³
    assert PreprocessConfig(ard_rows=5000).ard_rows == 5000
    base = {"data": {"source": "sklearn", "name": "diabetes"}, "lambda": 0.1}
    plain = load_config(base).stage_params()["ingest"]["preprocess"]
    assert "ard_rows" not in plain  # every run without it keeps its ingest identity
    ard = load_config({**base, "preprocess": {"ard_rows": 50}}).stage_params()["ingest"]
    assert ard["preprocess"]["ard_rows"] == 50


def test_rows_of_unknown_count_are_counted_first():
    """A table source's rows have no known count until read: the relevance rows are the
    same seeded ones as for the counted array."""
    import dask.array as da

    from pipeline.stages.ingest import _relevance

    X, y = _data(300, seed=2)
    keep = np.ones(300, bool)
    known = _relevance(da.from_array(X, chunks=64), da.from_array(y, chunks=64),
                       np.zeros(3), np.ones(3), 200)  # fmt: skip
    Xu, yu = da.from_array(X, chunks=64)[da.from_array(keep, chunks=64)], da.from_array(y, 64)
    yu = yu[da.from_array(keep, chunks=64)]
    assert np.isnan(Xu.shape[0])
    np.testing.assert_array_equal(_relevance(Xu, yu, np.zeros(3), np.ones(3), 200), known)
