"""pipeline.linalg.gram: tiled Gram matrices equal the dense kernel; fingerprints; bad input."""

from __future__ import annotations

import errno
import os

import numpy as np
import pytest
import zarr

from pipeline.engine.input_checks import fingerprint_row_blocks
from pipeline.kernels import RBF, Laplacian, Linear, Polynomial
from pipeline.linalg.gram import (
    StoreNotWritableError,
    build_gram,
    gram_fingerprint,
    open_gram,
    read_sym_tile,
    tile_graph,
)
from pipeline.storage import StoreMismatchError, TiledArray
from pipeline.storage.inputs import as_row_blocks


@pytest.fixture
def X():
    return np.random.default_rng(0).standard_normal((300, 5))


def assemble(g: TiledArray) -> np.ndarray:
    """The full symmetric matrix from lower-tile storage (reads tiles only)."""
    grid = g.grid
    out = np.empty(g.shape, dtype=g.dtype)
    for i in range(grid.n_row_blocks):
        for j in range(grid.n_col_blocks):
            out[grid.row_slice(i), grid.col_slice(j)] = read_sym_tile(g, i, j)
    return out


def n_stored_chunks(g: TiledArray) -> int:
    return g.zarr("r").nchunks_initialized


@pytest.mark.parametrize("block", [100, 64, 37, 1000])
def test_gram_equals_dense_kernel(tmp_path, X, block):
    k = RBF(gamma=0.2)
    g, stats = build_gram(X, k, tmp_path / "s", block, return_stats=True, progress=False)
    nb = -(-300 // block)
    assert g.shape == (300, 300) and g.name == "gram"
    assert stats.n_tiles == stats.n_computed == nb * (nb + 1) // 2 and stats.n_skipped == 0
    assert sorted(stats.computed) == sorted(g.grid.lower_tiles())
    # only the lower triangle is stored
    assert n_stored_chunks(g) == nb * (nb + 1) // 2
    assert g.markers.done() == set(g.grid.lower_tiles())
    np.testing.assert_allclose(assemble(g), k(X), rtol=0, atol=1e-12)
    assert g.zarr("r").attrs["layout"] == "lower"


@pytest.mark.parametrize("kernel", [Laplacian(gamma=0.3), Polynomial(degree=2), Linear()])
def test_other_kernels(tmp_path, X, kernel):
    g = build_gram(X, kernel, tmp_path / "s", 128, progress=False)
    K = kernel(X)
    np.testing.assert_allclose(assemble(g), K, rtol=0, atol=1e-12 * max(1.0, np.abs(K).max()))


def test_float32(tmp_path, X):
    k = RBF(gamma=0.2)
    g = build_gram(X, k, tmp_path / "a", 64, dtype="float32", progress=False)
    assert g.zarr("r").dtype == np.float32
    K = assemble(g)
    assert K.dtype == np.float32
    np.testing.assert_allclose(K, k(X).astype(np.float32), rtol=1e-6, atol=1e-7)
    # float32 inputs: evaluated in float32 (kernel's own rule), still close to float64
    X32 = X.astype(np.float32)
    g32 = build_gram(X32, k, tmp_path / "b", 64, dtype="float32", progress=False)
    np.testing.assert_allclose(assemble(g32), k(X32), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(assemble(g32), k(X), rtol=0, atol=1e-5)


def test_cross_kernel_rectangular(tmp_path, X):
    Z = np.random.default_rng(1).standard_normal((130, 5))
    k = RBF(gamma=0.2)
    c, stats = build_gram(X, k, tmp_path / "s", 64, Z=Z, return_stats=True, progress=False)
    assert c.name == "cross" and c.shape == (300, 130)
    assert stats.n_tiles == 5 * 3 == n_stored_chunks(c)
    np.testing.assert_allclose(c.zarr("r")[:], k(X, Z), rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="features"):
        build_gram(X, k, tmp_path / "t", 64, Z=Z[:, :3], progress=False)
    # the Gram and the cross kernel live side by side in one store
    g = build_gram(X, k, tmp_path / "s", 64, progress=False)
    np.testing.assert_allclose(assemble(g), k(X), rtol=0, atol=1e-12)


def test_sources_with_same_content_share_the_store(tmp_path, X):
    k = RBF(gamma=0.2)
    build_gram(X, k, tmp_path / "s", 64, progress=False)
    np.save(tmp_path / "x.npy", X)
    g, stats = build_gram(tmp_path / "x.npy", k, tmp_path / "s", 64, return_stats=True)
    assert stats.n_computed == 0 and stats.n_skipped == stats.n_tiles == 15
    assert open_gram(tmp_path / "s") == g
    fp = gram_fingerprint(fingerprint_row_blocks(as_row_blocks(X, 7)), k, 64, "float64")
    assert g.fingerprint == fp


def test_fingerprint_mismatch_refused_unless_overwrite(tmp_path, X):
    store = tmp_path / "s"
    build_gram(X, RBF(gamma=0.2), store, 64, progress=False)
    for kwargs in (
        {"kernel": RBF(gamma=0.3), "block_size": 64},
        {"kernel": RBF(gamma=0.2), "block_size": 100},
        {"kernel": RBF(gamma=0.2), "block_size": 64, "dtype": "float32"},
    ):
        with pytest.raises(StoreMismatchError, match="overwrite=True"):
            build_gram(X, store=store, progress=False, **kwargs)
    X2 = X.copy()
    X2[5, 0] += 1.0
    with pytest.raises(StoreMismatchError, match="fingerprint"):
        build_gram(X2, RBF(gamma=0.2), store, 64, progress=False)
    # nothing was touched by the refusals
    g = open_gram(store)
    np.testing.assert_allclose(assemble(g), RBF(gamma=0.2)(X), rtol=0, atol=1e-12)
    g, stats = build_gram(
        X, RBF(gamma=0.3), store, 64, overwrite=True, return_stats=True, progress=False
    )
    assert stats.n_computed == stats.n_tiles
    np.testing.assert_allclose(assemble(g), RBF(gamma=0.3)(X), rtol=0, atol=1e-12)


def test_tile_without_marker_is_recomputed(tmp_path, X):
    k = RBF(gamma=0.2)
    g = build_gram(X, k, tmp_path / "s", 64, progress=False)
    before = {t: g.markers.record(t) for t in g.grid.lower_tiles()}
    # a torn write: the chunk holds garbage and its marker is gone
    g.zarr("r+")[64:128, 0:64] = -7.0
    os.remove(os.path.join(g.store, "_markers", "gram", "1.0"))
    g2, stats = build_gram(X, k, tmp_path / "s", 64, return_stats=True, progress=False)
    assert stats.computed == [(1, 0)] and stats.n_skipped == stats.n_tiles - 1
    after = {t: g2.markers.record(t) for t in g2.grid.lower_tiles()}
    assert all(after[t] == before[t] for t in before if t != (1, 0))
    np.testing.assert_allclose(assemble(g2), k(X), rtol=0, atol=1e-12)


def test_graph_has_one_task_per_missing_tile(tmp_path, X):
    k = RBF(gamma=0.2)
    g = build_gram(X, k, tmp_path / "s", 64, progress=False)
    Xd = as_row_blocks(X, 64)
    todo = [(2, 1), (4, 4)]
    graph = dict(tile_graph(g, k, Xd, None, todo, "r").__dask_graph__())
    tile_keys = [key for key in graph if isinstance(key, tuple) and "gram-tile" in key[0]]
    assert sorted(key[1:] for key in tile_keys) == todo
    # X enters once per row block, not once per tile
    assert len(graph) <= len(dict(Xd.__dask_graph__())) + len(todo) + 3


def test_bad_inputs(tmp_path, X):
    k = RBF(gamma=0.2)
    for bad in (0, -1):
        with pytest.raises(ValueError, match="block_size"):
            build_gram(X, k, tmp_path / "s", bad)
    with pytest.raises(ValueError, match="dtype"):
        build_gram(X, k, tmp_path / "s", 64, dtype="int32")
    Xn = X.copy()
    Xn[200, 2] = np.nan
    with pytest.raises(ValueError, match=r"row 200, column 2 \(row block 3"):
        build_gram(Xn, k, tmp_path / "n", 64)
    assert not (tmp_path / "n").exists()  # validated before anything is written


def test_store_under_a_file_is_not_writable(tmp_path, X):
    (tmp_path / "file").write_text("x")
    with pytest.raises(StoreNotWritableError, match="not writable"):
        build_gram(X, RBF(), tmp_path / "file" / "store", 64, progress=False)


def test_one_writability_check_for_stores_and_prediction_outputs(tmp_path, X, monkeypatch):
    """The Gram builder's store check and the prediction output's were two functions
    (``gram.build._check_writable``, ``predict.output.check_output_writable``); both call
    :func:`pipeline.storage.location.check_writable` now, each message unchanged."""
    from pipeline.storage import location, predictions
    from pipeline.storage.predictions import check_prediction_output

    (tmp_path / "file").write_text("x")
    under = str(tmp_path / "file" / "store")
    with pytest.raises(StoreNotWritableError) as e:
        location.check_writable(under)
    assert str(e.value).startswith(f"store {under!r} is not writable (")
    assert str(e.value).endswith("); pass a directory (or fsspec URL) you can write to")
    out = str(tmp_path / "file" / "p.npy")
    with pytest.raises(StoreNotWritableError) as e:
        location.check_writable(out, output=True, file=True)
    assert str(e.value) == (
        f"prediction output {out!r} cannot be written: {str(tmp_path / 'file')!r} is not a "
        "directory. Make it writable, or choose another output path."
    )
    location.check_writable(str(tmp_path / "new" / "p.zarr"), output=True)
    assert not (tmp_path / "new").exists()  # a prediction output's check creates nothing
    location.check_writable(str(tmp_path / "new"))
    assert (tmp_path / "new").is_dir() and not list((tmp_path / "new").iterdir())

    import pipeline.linalg.gram as build

    assert build.check_writable is location.check_writable  # build_gram's check
    assert predictions.check_writable is location.check_writable  # the output's
    calls = []
    real = location.check_writable
    monkeypatch.setattr(  # where check_prediction_output names it
        predictions, "check_writable", lambda *a, **k: calls.append(k) or real(*a, **k)
    )
    check_prediction_output(tmp_path / "p.zarr", overwrite=False)
    check_prediction_output(tmp_path / "p.npy", overwrite=False)
    assert calls == [{"output": True, "file": False}, {"output": True, "file": True}]


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere")
def test_store_not_writable(tmp_path, X):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(StoreNotWritableError, match="not writable"):
            build_gram(X, RBF(), ro / "store", 64, progress=False)
        with pytest.raises(PermissionError):
            build_gram(X, RBF(), ro, 64, progress=False)
    finally:
        ro.chmod(0o700)


def test_disk_full_is_clear_and_resumable(tmp_path, X, monkeypatch):
    k = RBF(gamma=0.2)
    real_write = TiledArray.write_tile

    def full_disk(self, i, j, tile, **info):
        if (i, j) == (3, 2):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(self, i, j, tile, **info)

    monkeypatch.setattr(TiledArray, "write_tile", full_disk)
    with pytest.raises(OSError, match=r"disk full while writing tile \(3, 2\).*rerun") as exc:
        build_gram(X, k, tmp_path / "s", 64, progress=False)
    assert exc.value.errno == errno.ENOSPC
    monkeypatch.setattr(TiledArray, "write_tile", real_write)
    g = open_gram(tmp_path / "s")
    done = g.markers.done()
    assert (3, 2) not in done
    g, stats = build_gram(X, k, tmp_path / "s", 64, return_stats=True, progress=False)
    # a tile already running on the other thread when the error surfaced may finish (and be
    # marked) after the snapshot above, so the rerun skips at least, not exactly, `done`
    assert stats.n_skipped >= len(done) and stats.n_skipped + stats.n_computed == stats.n_tiles
    assert (3, 2) in stats.computed and done.isdisjoint(stats.computed)
    np.testing.assert_allclose(assemble(g), k(X), rtol=0, atol=1e-12)


def test_zarr_layout(tmp_path, X):
    g = build_gram(X, RBF(gamma=0.2), tmp_path / "s", 128, progress=False)
    arr = zarr.open_array(store=str(tmp_path / "s"), path="gram", mode="r")
    assert arr.chunks == (128, 128) and arr.compressors == ()
    assert arr.attrs["kernel"] == RBF(gamma=0.2).to_spec()
    assert arr.attrs["fingerprint"] == g.fingerprint
    with pytest.raises(ValueError, match="no Gram array"):
        open_gram(tmp_path / "s", name="nothing")


@pytest.mark.slow
def test_distributed_local_cluster(tmp_path, X, monkeypatch):
    from pipeline import constants as C
    from pipeline.engine.parallel import dask_client

    monkeypatch.setattr(C, "SMALL_PASS_ENTRIES", 0)  # the workers' path, not a small build here
    k = RBF(gamma=0.2)
    with dask_client(n_workers=2, threads_per_worker=1, memory_limit="1GiB", processes=True):
        g, stats = build_gram(X, k, tmp_path / "s", 64, return_stats=True, progress=False)
        c = build_gram(X, k, tmp_path / "s", 128, Z=X[:90], progress=False)
    assert stats.n_computed == 15
    np.testing.assert_allclose(assemble(g), k(X), rtol=0, atol=1e-12)
    np.testing.assert_allclose(c.zarr("r")[:], k(X, X[:90]), rtol=0, atol=1e-12)
    # the marker records name the workers' processes, not this one
    pids = {g.markers.record(t).get("pid") for t in g.grid.lower_tiles()}
    assert os.getpid() not in pids


def test_in_process_cluster_does_not_pause_on_the_whole_process_memory(caplog):
    """In-process workers would check the whole process's memory against their limit,
    pause above 80 % of it and never resume (a hang seen in CI once pytest's process
    had grown past 0.8 GiB): the limit is not applied to them, and the log says so."""
    import logging

    from pipeline.engine.parallel import dask_client

    with (
        caplog.at_level(logging.INFO, logger="pipeline"),
        dask_client(n_workers=1, memory_limit="1MiB", processes=False) as client,
    ):
        limits = {w["memory_limit"] for w in client.scheduler_info()["workers"].values()}
        assert client.submit(sum, [1, 2, 3]).result(timeout=60) == 6
    assert limits == {0}
    assert "memory_limit 1MiB not applied" in caplog.text
