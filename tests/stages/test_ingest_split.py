"""The ingest stage's row selection (train/test split, ``data.n_rows``): one task per
source block, the rows numpy's indexing gives, whatever the chunking."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest

from pipeline.stages import ingest, typed_params
from pipeline.stages.ingest import _split_indices, open_rows, take_rows


@pytest.mark.parametrize("chunks", [7, 50, 64, 300])
@pytest.mark.parametrize("fraction", [0.0, 0.03, 0.5, 1.0])
def test_take_rows_is_numpy_indexing(chunks, fraction):
    rng = np.random.default_rng(chunks)
    X = rng.normal(size=(300, 3))
    rows = np.sort(rng.choice(300, int(300 * fraction), replace=False))
    for A in (X, X[:, 0]):  # rows of a 2-D array, and a 1-D target
        got = take_rows(da.from_array(A, chunks=(chunks,) + A.shape[1:]), rows)
        assert got.shape == A[rows].shape
        assert sum(got.chunks[0]) == len(rows)
        np.testing.assert_array_equal(got.compute(scheduler="sync"), A[rows])


def test_take_rows_of_a_selection_with_empty_blocks():
    """A first selection leaves blocks of no rows; a second one (the split after
    data.n_rows) must still count each block's rows right."""
    A = np.arange(80.0).reshape(40, 2)
    first = take_rows(da.from_array(A, chunks=(10, 2)), np.array([1, 2, 35]))
    assert first.chunks[0] == (2, 0, 0, 1)
    second = take_rows(first, np.array([0, 2]))
    assert second.chunks[0] == (1, 0, 0, 1)
    np.testing.assert_array_equal(second.compute(scheduler="sync"), A[[1, 35]])
    assert take_rows(first, np.array([], dtype=int)).chunks[0] == (0, 0, 0, 0)


@pytest.mark.parametrize("chunks", [(0, 1, 0), (1, 0), (0, 2, 0), (0, 1, 1)])
def test_take_rows_of_one_or_two_rows_among_empty_blocks(chunks):
    # one row among empty blocks: blockwise broadcast its length-1 mask, 3 rows for 1
    A = np.arange(sum(chunks) * 2.0).reshape(-1, 2)
    for rows in (np.arange(len(A)), np.array([len(A) - 1])):
        got = take_rows(da.from_array(A, chunks=(chunks, (2,))), rows)
        np.testing.assert_array_equal(got.compute(scheduler="sync"), A[rows])


def test_take_rows_falls_back_for_unsorted_rows_and_keeps_their_order():
    X = np.arange(40.0).reshape(20, 2)
    rows = np.array([5, 1, 1, 17])
    got = take_rows(da.from_array(X, chunks=(6, 2)), rows)
    np.testing.assert_array_equal(got.compute(scheduler="sync"), X[rows])


def test_take_rows_graph_grows_with_blocks_not_rows():
    """Two tasks per block (the block's mask and its pick) on top of the source's."""
    n, block = 200_000, 1_000
    A = da.zeros((n, 4), chunks=(block, 4))
    rows = np.sort(np.random.default_rng(0).choice(n, n // 2, replace=False))
    got = take_rows(A, rows)
    assert len(dict(got.__dask_graph__())) == 3 * (n // block)
    many = take_rows(A, np.arange(0, n, 2))
    assert len(dict(many.__dask_graph__())) == 3 * (n // block)


@pytest.mark.parametrize("n_rows", [300, 12])
def test_the_stage_stores_the_split_numpy_gives(tmp_path, n_rows):
    """n_rows subsetting then the split, through the stage: the stored raw test rows are
    the source's rows at the sorted indices, the standardised training rows are the
    source's training rows scaled."""
    rng = np.random.default_rng(3)
    X, y = rng.normal(size=(333, 5)), rng.normal(size=333)
    np.save(tmp_path / "X.npy", X)
    np.save(tmp_path / "y.npy", y)
    params = dict(
        data={"source": "npy", "path": str(tmp_path / "X.npy"),
              "y_path": str(tmp_path / "y.npy"), "n_rows": n_rows, "seed": 4},
        split={"test_fraction": 0.25, "seed": 9},
        preprocess={"standardize": True, "standardize_y": False},
        block_size=40,
    )  # fmt: skip
    out = ingest.run(tmp_path / "ing", {}, **typed_params("ingest", params))
    keep = np.sort(np.random.default_rng(4).choice(333, n_rows, False))
    tr, te = _split_indices(n_rows, 0.25, 9)
    Xk, yk = X[keep], y[keep]

    def rows(name):
        return np.asarray(open_rows(out, name).compute(scheduler="sync"))

    np.testing.assert_array_equal(rows("X_test"), Xk[te])
    np.testing.assert_array_equal(rows("y_test").ravel(), yk[te])
    np.testing.assert_array_equal(rows("y_train").ravel(), yk[tr])
    mean, std = Xk[tr].mean(0), Xk[tr].std(0)
    np.testing.assert_allclose(rows("X_train"), (Xk[tr] - mean) / std, rtol=1e-12, atol=1e-12)


def test_the_stored_rows_do_not_depend_on_the_sources_chunks(tmp_path, monkeypatch):
    """The same rows loaded in other chunks (a dask array source, or the selection's own
    chunks) give the same standardised rows and scalers, bit for bit: the moments sum
    over row blocks of block_size."""
    rng = np.random.default_rng(5)
    X, y = rng.normal(size=(500, 4)) * 1e3 + 7.0, rng.normal(size=500)
    np.save(tmp_path / "X.npy", X)
    np.save(tmp_path / "y.npy", y)
    params = dict(
        data={"source": "npy", "path": str(tmp_path / "X.npy"), "y_path": str(tmp_path / "y.npy")},
        split={"test_fraction": 0.3, "seed": 1},
        preprocess={"standardize": True, "standardize_y": True},
        block_size=64,
    )
    real = ingest.load_source
    runs = {}
    for name, chunk in (("as_stored", None), ("small", 7), ("large", 333)):
        if chunk is not None:

            def load(data, block_size, _c=chunk):
                Xd, yd, feats, target = real(data, block_size)
                return Xd.rechunk({0: _c}), yd.rechunk({0: _c}), feats, target

            monkeypatch.setattr(ingest, "load_source", load)
        out = ingest.run(tmp_path / name, {}, **typed_params("ingest", params))
        runs[name] = (
            out.to_json()["scaler"],
            out.to_json()["y_scaler"],
            np.asarray(open_rows(out, "X_train").compute(scheduler="sync")),
            np.asarray(open_rows(out, "y_train").compute(scheduler="sync")),
        )
    for name in ("small", "large"):
        assert runs[name][:2] == runs["as_stored"][:2]
        np.testing.assert_array_equal(runs[name][2], runs["as_stored"][2])
        np.testing.assert_array_equal(runs[name][3], runs["as_stored"][3])
