"""The raw whole-chunk path reads what Zarr wrote and writes what Zarr reads."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from pipeline.storage import open_tiled_array
from pipeline.storage.rawchunks import chunk_layout, read_chunk, write_chunk


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape,block", [((10, 10), 4), ((9, 7), 3), ((11,), 4)])
def test_tiles_round_trip_through_zarr(tmp_path, dtype, shape, block):
    rng = np.random.default_rng(0)
    full = rng.standard_normal(shape).astype(dtype)
    t = open_tiled_array(str(tmp_path / "s"), "a", shape, block, dtype, "fp")
    assert chunk_layout(t.store, t.name) is not None
    g = t.grid
    tiles = g.lower_tiles() if len(shape) == 2 and shape[0] == shape[1] else None
    if len(shape) == 1:
        tiles = [(i, 0) for i in range(g.n_row_blocks)]
    elif tiles is None:
        tiles = [(i, j) for i in range(g.n_row_blocks) for j in range(g.n_col_blocks)]
    for i, j in tiles:  # written by the raw path
        reg = (g.row_slice(i),) if len(shape) == 1 else (g.row_slice(i), g.col_slice(j))
        t.write_tile(i, j, full[reg])
    z = zarr.open_array(store=t.store, path="a", mode="r")[...]
    for i, j in tiles:  # Zarr reads them back
        reg = (g.row_slice(i),) if len(shape) == 1 else (g.row_slice(i), g.col_slice(j))
        np.testing.assert_array_equal(z[reg], full[reg])
        np.testing.assert_array_equal(t.read_tile(i, j), full[reg])


def test_reads_chunks_zarr_wrote_and_padding_matches(tmp_path):
    rng = np.random.default_rng(1)
    full = rng.standard_normal((10, 10))
    t = open_tiled_array(str(tmp_path / "s"), "a", (10, 10), 4, np.float64, "fp")
    z = zarr.open_array(store=t.store, path="a", mode="r+")
    z[...] = full  # written by Zarr, edge chunks padded by Zarr
    lay = chunk_layout(t.store, "a")
    raw_edge = (tmp_path / "s" / "a" / "c" / "2" / "2").read_bytes()
    write_chunk(lay, (2, 2), full[8:, 8:])
    assert (tmp_path / "s" / "a" / "c" / "2" / "2").read_bytes() == raw_edge  # same bytes
    for i in range(3):
        for j in range(3):
            np.testing.assert_array_equal(
                read_chunk(lay, (i, j)), full[4 * i : 4 * i + 4, 4 * j : 4 * j + 4]
            )


def test_missing_or_torn_chunk_falls_back(tmp_path):
    t = open_tiled_array(str(tmp_path / "s"), "a", (8, 8), 4, np.float64, "fp")
    lay = chunk_layout(t.store, "a")
    assert read_chunk(lay, (1, 0)) is None  # never written: Zarr gives the fill value
    np.testing.assert_array_equal(t.read_tile(1, 0, verify=False), np.zeros((4, 4)))
    p = tmp_path / "s" / "a" / "c" / "1" / "0"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(b"\0" * 10)  # torn: wrong size
    assert read_chunk(lay, (1, 0)) is None


def test_compressed_arrays_and_urls_use_zarr(tmp_path):
    from zarr.codecs import ZstdCodec

    t = open_tiled_array(
        str(tmp_path / "s"), "z", (8, 8), 4, np.float64, "fp", compressors=ZstdCodec()
    )
    assert chunk_layout(t.store, "z") is None
    x = np.arange(16.0).reshape(4, 4)
    t.write_tile(1, 1, x)
    np.testing.assert_array_equal(t.read_tile(1, 1), x)
    assert chunk_layout("memory://x", "z") is None


def test_recreated_array_is_seen(tmp_path):
    """The layout cache follows zarr.json: a recreated array with other chunks is re-read."""
    store = str(tmp_path / "s")
    open_tiled_array(store, "a", (8, 8), 4, np.float64, "fp1")
    assert chunk_layout(store, "a").chunk_shape == (4, 4)
    open_tiled_array(store, "a", (8, 8), 2, np.float64, "fp2", overwrite=True)
    assert chunk_layout(store, "a").chunk_shape == (2, 2)


def test_atomic_write_takes_a_file_url(tmp_path):
    # the local filesystem was picked but the path kept its file:// prefix (session 25)
    from pipeline.storage.atomic import atomic_write

    atomic_write(f"file://{tmp_path}/d/x.json", b"1")
    assert (tmp_path / "d" / "x.json").read_bytes() == b"1"
