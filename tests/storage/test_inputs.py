"""pipeline.storage.inputs: sources -> row-blocked Dask arrays; streaming validation and fingerprints."""

from __future__ import annotations

import pickle

import dask
import dask.array as da
import numpy as np
import pandas as pd
import pytest
import zarr

from pipeline.engine.input_checks import (
    fingerprint_row_blocks,
    iter_row_blocks,
    validate_and_fingerprint,
    validate_row_blocks,
)
from pipeline.storage.inputs import as_row_blocks, check_block_size


@pytest.fixture
def X():
    return np.random.default_rng(0).standard_normal((250, 4))


def _expected_chunks(n, b):
    return tuple([b] * (n // b) + ([n % b] if n % b else []))


@pytest.mark.parametrize("block", [1, 64, 100, 250, 1000])
def test_numpy_row_blocks(X, block):
    A = as_row_blocks(X, block)
    assert A.chunks == (_expected_chunks(250, block) if block <= 250 else (250,), (4,))
    np.testing.assert_array_equal(A.compute(), X)


def test_npy_path_is_read_per_block_not_embedded(tmp_path):
    X = np.random.default_rng(1).standard_normal((5000, 8))
    path = tmp_path / "x.npy"
    np.save(path, X)
    A = as_row_blocks(path, 1024)
    assert A.chunks[0] == (1024, 1024, 1024, 1024, 904)
    graph_bytes = len(pickle.dumps(dict(A.__dask_graph__())))
    assert graph_bytes < X.nbytes / 20, graph_bytes
    np.testing.assert_array_equal(A.compute(), X)
    np.testing.assert_array_equal(A.blocks[4].compute(), X[4096:])


@pytest.mark.parametrize("order", ["C", "F"])
def test_npy_row_blocks_parse_no_header(tmp_path, monkeypatch, order):
    """The header is read once, when the array is opened; the row-block tasks map the
    rows by its layout and parse nothing (np.load's header parse raced in two threads
    of an ingest on CPython 3.11.7), in either memory order, ragged last block included."""
    Z = np.asarray(np.arange(7 * 5, dtype=np.float32).reshape(7, 5), order=order)
    np.save(tmp_path / "z.npy", Z)
    arr = as_row_blocks(str(tmp_path / "z.npy"), block_size=3)

    def no_parse(*a, **k):
        raise AssertionError("a row-block task parsed the .npy header")

    monkeypatch.setattr(np, "load", no_parse)
    out = arr.compute(scheduler="threads")
    assert out.dtype == np.float32 and np.array_equal(out, Z)


def test_zarr_path_and_array(tmp_path, X):
    path = str(tmp_path / "x.zarr")
    z = zarr.create_array(store=path, shape=X.shape, chunks=(30, 4), dtype="f8")
    z[:] = X
    for src in (path, z):
        A = as_row_blocks(src, 64)
        assert A.chunks[0] == _expected_chunks(250, 64)
        np.testing.assert_array_equal(A.compute(), X)


def test_zarr_group_path_is_refused_clearly(tmp_path):
    path = str(tmp_path / "g.zarr")
    zarr.open_group(path, mode="w")
    with pytest.raises(ValueError, match="path of the array"):
        as_row_blocks(path, 10)


def _frame(X):
    df = pd.DataFrame(X, columns=[f"f{i}" for i in range(X.shape[1])])
    df["label"] = ["a", "b"] * (len(df) // 2) + ["a"] * (len(df) % 2)
    return df


def test_parquet_columns(tmp_path, X):
    df = _frame(X)
    path = str(tmp_path / "x.parquet")
    df.to_parquet(path)
    A = as_row_blocks(path, 64, columns=["f0", "f2"])
    assert A.chunks == (_expected_chunks(250, 64), (2,))
    np.testing.assert_array_equal(A.compute(), X[:, [0, 2]])
    with pytest.raises(ValueError, match="label"):
        as_row_blocks(path, 64)  # every column, one of them text
    with pytest.raises(ValueError, match="nope"):
        as_row_blocks(path, 64, columns=["f0", "nope"])


def test_csv_columns_and_dataframes(tmp_path, X):
    df = _frame(X)
    path = str(tmp_path / "x.csv")
    df.to_csv(path, index=False)
    A = as_row_blocks(path, 100, columns=["f1", "f3"])
    assert A.chunks == ((100, 100, 50), (2,))
    np.testing.assert_array_equal(A.compute(), X[:, [1, 3]])  # every float exactly (pandas < 3 too)
    B = as_row_blocks(df, 100, columns=["f0", "f1", "f2", "f3"])
    np.testing.assert_array_equal(B.compute(), X)
    import dask.dataframe as dd

    C = as_row_blocks(dd.from_pandas(df, npartitions=3), 70, columns=["f0"])
    assert C.chunks == ((70, 70, 70, 40), (1,))
    np.testing.assert_array_equal(C.compute(), X[:, :1])


def test_dask_array_is_rechunked_and_dtypes(X):
    A = as_row_blocks(da.from_array(X, chunks=(33, 2)), 64)
    assert A.chunks == (_expected_chunks(250, 64), (4,))
    np.testing.assert_array_equal(A.compute(), X)
    ints = np.arange(20).reshape(10, 2)
    assert as_row_blocks(ints, 4).dtype == np.float64
    assert as_row_blocks(X, 4, dtype="float32").dtype == np.float32
    assert as_row_blocks(X.astype(np.float32), 4).dtype == np.float32


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "8", None])
def test_bad_block_size(X, bad):
    with pytest.raises(ValueError, match="block_size"):
        as_row_blocks(X, bad)
    with pytest.raises(ValueError, match="block_size"):
        check_block_size(bad)


def test_bad_shapes_and_dtypes(tmp_path):
    with pytest.raises(ValueError, match="2-D"):
        as_row_blocks(np.ones(5), 2)
    with pytest.raises(ValueError, match="2-D"):
        as_row_blocks(np.ones((2, 2, 2)), 2)
    with pytest.raises(ValueError, match="non-numeric"):
        as_row_blocks(np.array([["a", "b"]]), 2)
    with pytest.raises(ValueError, match="format"):
        as_row_blocks(str(tmp_path / "x.unknown"), 2)


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_validation_names_block_and_row(X, value):
    X = X.copy()
    X[131, 3] = value
    with pytest.raises(ValueError, match=r"row 131, column 3 \(row block 2, rows 128\.\.191"):
        validate_row_blocks(as_row_blocks(X, 64))
    with pytest.raises(ValueError, match="row block 2"):
        validate_and_fingerprint(as_row_blocks(X, 64))


def test_validation_streams_one_block_at_a_time():
    loaded = []

    def load(i, n):
        loaded.append(n)
        return np.full((n, 3), float(i))

    sizes = [40, 40, 40, 17]
    parts = [
        da.from_delayed(dask.delayed(load, pure=False)(i, n), shape=(n, 3), dtype="f8")
        for i, n in enumerate(sizes)
    ]
    A = da.concatenate(parts)
    validate_and_fingerprint(A, batch=1)
    assert loaded == sizes  # each block loaded once, never more than one block at a time
    blocks = [(i, off, b.shape) for i, off, b in iter_row_blocks(A, batch=3)]
    assert blocks == [(0, 0, (40, 3)), (1, 40, (40, 3)), (2, 80, (40, 3)), (3, 120, (17, 3))]


def test_default_batches_hold_at_most_row_batch_bytes(monkeypatch):
    """Blocks are computed in batches of consecutive blocks up to ROW_BATCH_BYTES (one
    block alone when it is larger), one batch in memory at a time, in order."""
    import pipeline.constants as C
    import pipeline.engine.input_checks as V

    held: list[int] = []  # blocks loaded and not yet yielded
    peak = [0]

    def load(i, n):
        held.append(i)
        peak[0] = max(peak[0], len(held))
        return np.full((n, 3), float(i))

    sizes = [40, 40, 40, 90, 17, 40]  # 24 bytes a row
    parts = [
        da.from_delayed(dask.delayed(load, pure=False)(i, n), shape=(n, 3), dtype="f8")
        for i, n in enumerate(sizes)
    ]
    A = da.concatenate(parts)
    monkeypatch.setattr(C, "ROW_BATCH_BYTES", 2 * 40 * 24)  # two 40-row blocks
    assert [list(r) for r in V._batches(sizes, 24, None)] == [[0, 1], [2], [3], [4, 5]]
    got = []
    for i, off, b in iter_row_blocks(A):
        assert b[0, 0] == i
        got.append((i, off))
        held.remove(i)
    assert got == [(0, 0), (1, 40), (2, 80), (3, 120), (4, 210), (5, 227)]
    assert peak[0] == 2
    # a fixed batch still works, and the fingerprint does not depend on the batches
    assert [list(r) for r in V._batches(sizes, 24, 4)] == [[0, 1, 2, 3], [4, 5]]
    held.clear()
    assert fingerprint_row_blocks(A) == fingerprint_row_blocks(A, batch=1)


def test_a_pass_over_many_blocks_makes_few_computations(monkeypatch):
    """Each computation costs time in proportion to the whole graph: 300 small blocks
    are read in one computation, not 150 (the ingest of 6.4 million rows took 179 s)."""
    import pipeline.engine.input_checks as V

    calls = []
    real = V.dask.compute

    def counted(*args, **kwargs):
        calls.append(len(args))
        return real(*args, **kwargs)

    monkeypatch.setattr(V.dask, "compute", counted)
    A = da.ones((3000, 4), chunks=(10, 4))
    assert sum(1 for _ in iter_row_blocks(A)) == 300
    assert calls == [300]


def test_fingerprint_depends_on_content_not_split_or_source(tmp_path, X):
    fp = fingerprint_row_blocks(as_row_blocks(X, 64))
    assert validate_and_fingerprint(as_row_blocks(X, 17)) == fp
    np.save(tmp_path / "x.npy", X)
    assert fingerprint_row_blocks(as_row_blocks(tmp_path / "x.npy", 1000)) == fp
    Y = X.copy()
    Y[200, 1] += 1e-12
    assert fingerprint_row_blocks(as_row_blocks(Y, 64)) != fp
    assert fingerprint_row_blocks(as_row_blocks(X[:-1], 64)) != fp
    assert fingerprint_row_blocks(as_row_blocks(X, 64, dtype="float32")) != fp
