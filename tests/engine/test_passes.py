"""pipeline.engine.passes: tile set x source x consumer against dense references,
resume from markers, and bitwise-identical results on every scheduler."""

from __future__ import annotations

import threading

import dask
import numpy as np
import pytest

from pipeline.engine import passes as engine
from pipeline.engine.passes import CallableSource, KernelSource, StoredSource
from pipeline.kernels import RBF, Laplacian, Polynomial
from pipeline.storage import open_tiled_array

RNG = np.random.default_rng(7)
X = RNG.standard_normal((203, 4))
Z = RNG.standard_normal((75, 4))
V = RNG.standard_normal((203, 3))
KERNELS = [RBF(gamma=0.3), Laplacian(gamma=0.2), Polynomial(degree=2, gamma=0.1, coef0=1.0)]


def chunks_of(n: int, b: int) -> list[int]:
    return [min(b, n - s) for s in range(0, n, b)]


def stored(tmp_path, K: np.ndarray, b: int, *, lower: bool, name: str = "gram"):
    """K written through the engine's store-and-mark consumer from a kernel source
    (lower tiles for a symmetric K, else every tile)."""
    h = open_tiled_array(str(tmp_path), name, K.shape, b, "float64", f"fp-{name}-{b}")
    return h


# -- store and mark ---------------------------------------------------------------------
@pytest.mark.parametrize("b", [64, 50, 203, 300])  # ragged last tiles, one tile, tile > n
@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: type(k).__name__)
def test_store_lower_and_rect_tiles_match_dense(tmp_path, b, kernel):
    K = kernel(X)
    h = stored(tmp_path, K, b, lower=True)
    tiles = engine.pending(h.markers, h.grid.lower_tiles())
    src = KernelSource(kernel)
    out = engine.store_tiles(src, h, tiles, X=np.asarray(X), Z=None, run_id="t")
    assert sorted((i, j) for i, j, _ in out) == sorted(tiles)
    for i, j in h.grid.lower_tiles():
        np.testing.assert_allclose(
            h.read_tile(i, j), K[h.grid.row_slice(i), h.grid.col_slice(j)], rtol=0, atol=1e-12
        )
        if i == j:  # a symmetric diagonal tile stays exactly symmetric
            t = h.read_tile(i, i)
            np.testing.assert_array_equal(t, t.T)
    # rectangular: every tile of K(X, Z), X and Z as Dask arrays of row blocks
    KZ = kernel(X, Z)
    hz = open_tiled_array(str(tmp_path), "cross", KZ.shape, b, "float64", "fp-cross")
    srcz = KernelSource(kernel, symmetric=False)
    import dask.array as da

    Xd, Zd = da.from_array(X, chunks=(b, -1)), da.from_array(Z, chunks=(b, -1))
    engine.store_tiles(srcz, hz, list(hz.grid.tiles()), X=Xd, Z=Zd, run_id="t")
    assert engine.pending(hz.markers, hz.grid.tiles()) == []
    np.testing.assert_allclose(hz.zarr("r")[:], KZ, rtol=0, atol=1e-12)


def test_resume_computes_only_unmarked_tiles(tmp_path, monkeypatch):
    kernel = RBF(gamma=0.3)
    h = stored(tmp_path, kernel(X), 64, lower=True)
    src = KernelSource(kernel)
    first = [(0, 0), (2, 1), (3, 3)]
    engine.store_tiles(src, h, first, X=X, run_id="a")
    calls: list[tuple[int, int]] = []
    lock = threading.Lock()
    real = KernelSource.tile

    def counting(self, i, j, *a, **k):
        with lock:
            calls.append((i, j))
        return real(self, i, j, *a, **k)

    monkeypatch.setattr(KernelSource, "tile", counting)
    todo = engine.pending(h.markers, h.grid.lower_tiles())
    assert todo == [t for t in h.grid.lower_tiles() if t not in first]
    engine.store_tiles(src, h, todo, X=X, run_id="b")
    assert sorted(calls) == sorted(todo)
    assert engine.pending(h.markers, h.grid.lower_tiles()) == []
    calls.clear()
    assert engine.store_tiles(src, h, engine.pending(h.markers, h.grid.lower_tiles())) == []
    assert calls == []
    # accept= rejects a marker that exists (e.g. one without a checksum)
    assert engine.pending(h.markers, [(2, 1), (1, 0)], accept=lambda k: k != (2, 1)) == [(2, 1)]


# -- products -----------------------------------------------------------------------------
@pytest.mark.parametrize("b", [64, 50, 203])
@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: type(k).__name__)
def test_matvec_kernel_and_stored_sources(tmp_path, b, kernel):
    K = kernel(X)
    ref = K @ V + 0.5 * V
    ch = chunks_of(X.shape[0], b)
    got = engine.matvec(KernelSource(kernel), ch, V, X, shift=0.5)
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)
    h = stored(tmp_path, K, b, lower=True)
    engine.store_tiles(KernelSource(kernel), h, list(h.grid.lower_tiles()), X=X)
    got_s = engine.matvec(StoredSource(h), ch, V, shift=0.5)
    np.testing.assert_allclose(got_s, ref, rtol=1e-12, atol=1e-12)


def test_matvec_symmetric_lower_tile_used_twice(monkeypatch):
    """Each lower tile is produced once (one products() call) for both row blocks."""
    calls: list[tuple[int, int]] = []
    real = KernelSource.products

    def counting(self, i, j, *a, **k):
        calls.append((i, j))
        return real(self, i, j, *a, **k)

    monkeypatch.setattr(KernelSource, "products", counting)
    with dask.config.set(scheduler="sync"):
        engine.matvec(KernelSource(RBF(gamma=0.3)), chunks_of(203, 64), V, X)
    assert sorted(calls) == engine.tile_set("lower", 4)


@pytest.mark.parametrize(("bi", "bj"), [(64, 32), (50, 75), (203, 80)])
def test_accumulate_kernel_stored_and_callable_sources(tmp_path, bi, bj):
    kernel = Laplacian(gamma=0.2)
    A = RNG.standard_normal((Z.shape[0], 2))
    ref = kernel(X, Z) @ A
    rc, cc = chunks_of(X.shape[0], bi), chunks_of(Z.shape[0], bj)
    got = engine.accumulate(
        KernelSource(kernel, symmetric=False), X, A, Z, row_chunks=rc, col_chunks=cc
    )
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)
    # stored rectangular K(X, Z) (square tiles)
    h = open_tiled_array(str(tmp_path), "cross", (203, 75), bj, "float64", "fp")
    engine.store_tiles(KernelSource(kernel, symmetric=False), h, list(h.grid.tiles()), X=X, Z=Z)
    g = h.grid
    got_s = engine.accumulate(
        StoredSource(h, symmetric=False), None, A, row_chunks=g.row_chunks(),
        col_chunks=g.col_chunks(),
    )  # fmt: skip
    np.testing.assert_allclose(got_s, ref, rtol=1e-12, atol=1e-12)
    # a callable (any kernel function, one column block), 1-D coefficients
    a1 = A[:, 0]
    got_c = engine.accumulate(CallableSource(lambda B: kernel(B, Z)), X, a1, row_chunks=rc)
    np.testing.assert_allclose(got_c, ref[:, 0], rtol=1e-12, atol=1e-12)


# -- columns and diagonal ------------------------------------------------------------------
@pytest.mark.parametrize("b", [64, 50, 203])
def test_gather_and_diagonal_both_sources(tmp_path, b):
    kernel = RBF(gamma=0.3)
    K = kernel(X)
    ch = chunks_of(X.shape[0], b)
    h = stored(tmp_path, K, b, lower=True)
    engine.store_tiles(KernelSource(kernel), h, list(h.grid.lower_tiles()), X=X)
    idx = np.array([202, 0, 70, 70, 5, 150, 51])
    for src, xin in ((KernelSource(kernel), X), (StoredSource(h), None)):
        cols = engine.gather(src, ch, np.arange(203), idx, xin)
        np.testing.assert_allclose(cols, K[:, idx], rtol=1e-13, atol=1e-14)
        sub = engine.gather(src, ch, idx, idx, xin)
        np.testing.assert_allclose(sub, K[np.ix_(idx, idx)], rtol=1e-13, atol=1e-14)
        np.testing.assert_allclose(engine.diagonal(src, ch, xin), np.diag(K), atol=1e-15)


def test_tile_set_kinds():
    assert engine.tile_set("lower", 3) == [(0, 0), (1, 0), (1, 1), (2, 0), (2, 1), (2, 2)]
    assert engine.tile_set("rect", 2, 3) == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert engine.tile_set("full", 2) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert engine.tile_set("diagonal", 3) == [(0, 0), (1, 1), (2, 2)]
    with pytest.raises(ValueError, match="tile set must be"):
        engine.tile_set("upper", 2)


# -- reproducibility --------------------------------------------------------------------------
def _passes(h):
    kernel = RBF(gamma=0.3)
    ch = chunks_of(203, 20)  # 11 row blocks: 66 lower tiles, reductions of up to 11 parts
    A = V[:, :2]
    return (
        engine.matvec(KernelSource(kernel), ch, V, X, shift=0.1),
        engine.matvec(StoredSource(h), h.grid.row_chunks(), V, shift=0.1),
        engine.accumulate(KernelSource(kernel, symmetric=False), X, A, X, row_chunks=ch,
                          col_chunks=chunks_of(203, 7)),  # 29 parts: a 2-level tree
    )  # fmt: skip


def test_bitwise_identical_threads_and_sync(tmp_path, monkeypatch):
    from pipeline import constants as C

    kernel = RBF(gamma=0.3)
    h = stored(tmp_path, kernel(X), 20, lower=True)
    engine.store_tiles(KernelSource(kernel), h, list(h.grid.lower_tiles()), X=X)
    with monkeypatch.context() as m, dask.config.set(scheduler="threads", num_workers=4):
        m.setattr(C, "INLINE_PASS_ENTRIES", 0)  # these tiny passes on the threads themselves
        a = _passes(h)
    with dask.config.set(scheduler="sync"):
        b = _passes(h)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("b", [20, 64, 203])  # 11 row blocks (ragged), 4, one
def test_tiny_passes_run_in_the_calling_thread_with_the_threaded_schedulers_bits(
    tmp_path, monkeypatch, b
):
    """A pass of at most INLINE_PASS_ENTRIES weighed entries without a progress display
    runs in this thread on the synchronous scheduler (the threaded scheduler's own work
    cost more than it), with the bits the threaded scheduler gives; a larger one, or one
    with a progress display, runs on the threads."""
    from pipeline import constants as C
    from pipeline.engine import where

    kernel = RBF(gamma=0.3)
    h = stored(tmp_path, kernel(X), b, lower=True)
    engine.store_tiles(KernelSource(kernel), h, list(h.grid.lower_tiles()), X=X)
    ch = chunks_of(203, b)
    threads: set[int] = set()
    real = KernelSource.products

    def seen(self, *a, **k):
        threads.add(threading.get_ident())
        return real(self, *a, **k)

    monkeypatch.setattr(KernelSource, "products", seen)
    assert where.weigh(where.lower_entries(ch), X) <= C.INLINE_PASS_ENTRIES
    inline = engine.matvec(KernelSource(kernel), ch, V, X, shift=0.1)
    assert threads == {threading.get_ident()}
    with monkeypatch.context() as m:
        m.setattr(C, "INLINE_PASS_ENTRIES", 0)
        threads.clear()
        on_threads = engine.matvec(KernelSource(kernel), ch, V, X, shift=0.1)
        assert threading.get_ident() not in threads
    np.testing.assert_array_equal(inline, on_threads)
    np.testing.assert_allclose(inline, kernel(X) @ V + 0.1 * V, rtol=1e-12, atol=1e-12)
    threads.clear()
    engine.matvec(KernelSource(kernel), ch, V, X, shift=0.1, progress=True)
    assert threading.get_ident() not in threads  # a display: the threaded scheduler's
    # the configured processes scheduler is the user's choice: never replaced
    with dask.config.set(scheduler="processes"):
        assert not where.runs_inline(1.0, False)
    assert where.runs_inline(1.0, False) and not where.runs_inline(None, False)
    assert not where.runs_inline(C.INLINE_PASS_ENTRIES + 1, False)


def test_bitwise_identical_on_distributed(tmp_path, monkeypatch):
    pytest.importorskip("distributed")
    from distributed import Client, LocalCluster

    from pipeline import constants as C

    monkeypatch.setattr(C, "SMALL_PASS_ENTRIES", 0)  # every pass on the workers
    kernel = RBF(gamma=0.3)
    h = stored(tmp_path, kernel(X), 20, lower=True)
    engine.store_tiles(KernelSource(kernel), h, list(h.grid.lower_tiles()), X=X)
    with dask.config.set(scheduler="sync"):
        ref = _passes(h)
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0",
                     memory_limit=0) as cluster,
        Client(cluster),
    ):  # fmt: skip
        got = _passes(h)
    for x, y in zip(ref, got, strict=True):
        np.testing.assert_array_equal(x, y)


def test_build_gram_is_fused_by_default_under_its_own_fingerprint(tmp_path):
    """Issue #43: every Gram tile goes through the fused evaluators (before, the
    default was the kernel object's whole-tile code). Its bits differ, so its
    fingerprint does: a store of the old evaluation is never resumed with new tiles."""
    from pipeline.engine import kernel_tile
    from pipeline.engine.input_checks import fingerprint_row_blocks
    from pipeline.linalg.gram import build_gram, gram_fingerprint
    from pipeline.storage import fingerprint_obj
    from pipeline.storage.inputs import as_row_blocks

    kernel = RBF(gamma=0.3)
    fx = fingerprint_row_blocks(as_row_blocks(X, 64))
    g = build_gram(X, kernel, tmp_path / "a", 64, progress=False)
    assert g.fingerprint == gram_fingerprint(fx, kernel, 64, "float64")
    # the same evaluation (and fingerprint) as the explicit float64 one
    assert g.fingerprint == gram_fingerprint(fx, kernel, 64, "float64", kernel_dtype="float64")
    assert g.zarr("r").attrs["kernel_dtype"] == "float64"
    tile = kernel_tile(kernel, X[128:192], X[:64], np.empty((64, 64)), n_threads=1)
    np.testing.assert_array_equal(g.read_tile(2, 0), tile)
    # not the old recipe (no kernel_dtype): an old store is another array
    from pipeline.kernels import kernel_fingerprint

    old = fingerprint_obj({"what": "gram", "x": fx, "kernel": kernel_fingerprint(kernel),
                           "block_size": 64, "dtype": "float64"})  # fmt: skip
    assert g.fingerprint != old
    gf = build_gram(X, kernel, tmp_path / "b", 64, progress=False, kernel_dtype="float32")
    assert gf.fingerprint != g.fingerprint
    for i, j in g.grid.lower_tiles():
        np.testing.assert_allclose(g.read_tile(i, j), kernel(X[64 * i : 64 * i + 64],
                                   X[64 * j : 64 * j + 64]), rtol=0, atol=1e-12)  # fmt: skip
    with pytest.raises(ValueError, match="kernel_dtype"):
        build_gram(X, kernel, tmp_path / "c", 64, progress=False, kernel_dtype="float16")


def test_small_passes_run_here_beside_a_client_on_this_machine(tmp_path, monkeypatch):
    """A pass of at most SMALL_PASS_ENTRIES kernel entries runs in this process (a
    cluster round trip costs more than the pass) when the client's workers run on this
    machine, with the bits the workers give; a larger one, or one beside a client on
    other machines, goes to the workers (tiles.where)."""
    pytest.importorskip("distributed")
    from distributed import Client, LocalCluster

    from pipeline import constants as C
    from pipeline.engine import where

    kernel = RBF(gamma=0.3)
    h = stored(tmp_path, kernel(X), 20, lower=True)
    engine.store_tiles(KernelSource(kernel), h, list(h.grid.lower_tiles()), X=X)
    with dask.config.set(scheduler="sync"):
        ref = _passes(h)
    ch = chunks_of(203, 20)
    lower = where.lower_entries(ch)  # the matvecs' (the smallest passes: 203² for accumulate)
    assert lower == sum(a * b for i, a in enumerate(ch) for b in ch[: i + 1]) < 203 * 203
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0",
                     memory_limit=0) as cluster,
        Client(cluster) as client,
    ):  # fmt: skip
        sent = []
        real = client.compute
        monkeypatch.setattr(client, "compute", lambda *a, **k: sent.append(1) or real(*a, **k))
        with monkeypatch.context() as m:
            m.setattr(C, "INLINE_PASS_ENTRIES", 0)  # here on the threaded scheduler
            got = _passes(h)
        assert sent == []  # all three ran here
        got_inline = _passes(h)  # tiny: here, in this thread (where.runs_inline)
        assert sent == []
        # the kernel matvec's entries weigh (16 + 4) / (16 + 8) of D = 8's, the stored
        # matvec's (no kernel) and the accumulation's (203² entries) more
        assert where.weigh(lower, X) < lower < where.weigh(203 * 203, X)
        monkeypatch.setattr(C, "SMALL_PASS_ENTRIES", int(where.weigh(lower, X)) - 1)
        got_big = _passes(h)
        assert len(sent) == 3  # the smallest is one entry over the budget: on the workers
        monkeypatch.setattr(C, "SMALL_PASS_ENTRIES", 10**9)
        where._LOCAL.clear()
        monkeypatch.setattr(where, "workers_on_this_host", lambda c: False)
        _passes(h)
        assert len(sent) == 6  # workers on other machines: always on them
    for x, y, z, w in zip(ref, got, got_big, got_inline, strict=True):
        np.testing.assert_array_equal(x, y)
        np.testing.assert_array_equal(x, z)
        np.testing.assert_array_equal(x, w)
