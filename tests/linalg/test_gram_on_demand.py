"""An in-place fit (keep_gram=False) with X in memory computes its Gram on demand.

The Gram is not stored first: ``build_gram(defer=True)`` only creates its array, and
the in-place factor computes each Gram tile from X when it needs it
(``GRAM_ON_DEMAND_IN_PLACE``). These tests check that no Gram tile is written or read
from disk, that the answer is the stored-Gram path's (to rounding: the tiles are
evaluated by the fused engine) and scikit-learn's, that a stopped fit resumes to the
same bits, that the disk check counts the factor's new tiles, and that the log says
what happens once, not once per tile.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections import namedtuple

import numpy as np
import pytest
from sklearn.kernel_ridge import KernelRidge as SkKernelRidge

import pipeline.fit as fit_mod
from pipeline import KernelRidge
from pipeline import constants as C
from pipeline.kernels import RBF
from pipeline.linalg import cholesky_inplace as inplace
from pipeline.linalg.cholesky import tile_cholesky
from pipeline.linalg.cholesky_inplace import GramTileRecomputer, InsufficientDiskError
from pipeline.linalg.gram import build_gram


def _data(n=230, d=4, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    y = np.sin(X[:, 0]) + 0.1 * rng.standard_normal(n)
    return X, y


def _model(tmp_path, block, **kw):
    return KernelRidge(
        alpha=1e-3,
        kernel="rbf",
        gamma=0.25,
        solver="cholesky",
        keep_gram=False,
        block_size=block,
        store=str(tmp_path / "s"),
        **kw,
    )


class _CountingRecomputer(GramTileRecomputer):
    """Counts the tiles computed from X (one instance per fit, patched in)."""

    calls: list = []

    def __call__(self, i, j, out=None):
        _CountingRecomputer.calls.append((i, j))
        return super().__call__(i, j, out=out)


@pytest.fixture
def counted(monkeypatch):
    _CountingRecomputer.calls = []
    # where the estimator's fit (pipeline.fit) names it
    monkeypatch.setattr(fit_mod, "GramTileRecomputer", _CountingRecomputer)
    return _CountingRecomputer.calls


@pytest.mark.parametrize("block", [64, 100, 230])  # ragged last tiles, and one tile
def test_on_demand_fit_matches_stored_gram_and_sklearn(tmp_path, monkeypatch, counted, block):
    X, y = _data()
    writes = []
    real_write = build_gram.__globals__["_write"]

    def spy_write(handle, i, j, tile, **info):
        writes.append((i, j))
        return real_write(handle, i, j, tile, **info)

    monkeypatch.setitem(build_gram.__globals__, "_write", spy_write)
    m = _model(tmp_path, block).fit(X, y)
    t = -(-230 // block)
    assert writes == []  # no Gram stage: not one Gram tile written before the factor
    assert sorted(counted) == sorted((i, j) for i in range(t) for j in range(i + 1))
    monkeypatch.setattr(C, "GRAM_ON_DEMAND_IN_PLACE", False)
    ref = _model(tmp_path / "ref", block).fit(X, y)
    assert len(writes) == t * (t + 1) // 2  # the switch off: the Gram is stored first
    np.testing.assert_allclose(m.dual_coef_, ref.dual_coef_, rtol=1e-9, atol=1e-9)
    sk = SkKernelRidge(alpha=1e-3, kernel="rbf", gamma=0.25).fit(X, y)
    np.testing.assert_allclose(m.dual_coef_, sk.dual_coef_, rtol=1e-7, atol=1e-7)


def test_float32_factor_on_demand_reaches_float64_answer(tmp_path, counted):
    X, y = _data(n=300)
    m = _model(tmp_path, 70, factor_dtype="float32").fit(X, y)
    assert counted  # computed on demand
    ref = SkKernelRidge(alpha=1e-3, kernel="rbf", gamma=0.25).fit(X, y)
    np.testing.assert_allclose(m.dual_coef_, ref.dual_coef_, rtol=1e-8, atol=1e-8)
    K = RBF(gamma=0.25)(X)
    r = y - (K + 1e-3 * np.eye(300)) @ m.dual_coef_
    assert np.linalg.norm(r) / np.linalg.norm(y) <= 1e-11


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_recomputed_tiles_have_the_stored_tiles_bits(tmp_path, dtype):
    X, _ = _data(n=150)
    for kd in (None, "float64"):
        g = build_gram(X, RBF(gamma=0.25), str(tmp_path / f"g{kd}"), 64, dtype, kernel_dtype=kd,
                       progress=False)  # fmt: skip
        rec = GramTileRecomputer.for_gram(g, X, RBF(gamma=0.25))
        assert rec.kernel_dtype == (kd or "float64") and rec.dtype == dtype  # fused by default
        for i, j in g.grid.lower_tiles():
            np.testing.assert_array_equal(rec(i, j), g.read_tile(i, j))
            buf = np.full(g.read_tile(i, j).shape, np.nan, dtype=dtype)  # a reused buffer
            assert rec(i, j, out=buf) is buf
            np.testing.assert_array_equal(buf, g.read_tile(i, j))


def test_deferred_gram_array_has_no_tiles(tmp_path):
    X, _ = _data(n=150)
    g = build_gram(X, RBF(gamma=0.25), str(tmp_path), 64, defer=True, kernel_dtype="float64",
                   progress=False)  # fmt: skip
    assert g.markers.done() == set()
    assert (
        g.fingerprint
        == build_gram(
            X, RBF(gamma=0.25), str(tmp_path / "b"), 64, kernel_dtype="float64", progress=False
        ).fingerprint
    )  # the same array a stored Gram would be, only empty
    with pytest.raises(ValueError, match="defer=True"):
        build_gram(X, RBF(gamma=0.25), str(tmp_path / "c"), 64, Z=X[:10], defer=True,
                   progress=False)  # fmt: skip


def _factor_on_demand(store, X, lam=1e-3, **kw):
    k = RBF(gamma=0.25)
    g = build_gram(X, k, str(store), 50, defer=True, kernel_dtype="float64", progress=False)
    rec = kw.pop("recompute_tile", None) or GramTileRecomputer.for_gram(g, X, k)
    return g, tile_cholesky(g, lam, keep_gram=False, recompute_tile=rec, progress=False, **kw)


def _dense(f):
    n = f.L.shape[0]
    L = np.zeros((n, n))
    gr = f.L.grid
    for i, j in gr.lower_tiles():
        L[gr.row_slice(i), gr.col_slice(j)] = f.L.read_tile(i, j)
    return L


def test_stopped_on_demand_factor_resumes_to_the_same_bits(tmp_path):
    X, _ = _data(n=220)  # 5 x 5 tiles of 50, the last ragged
    _, whole = _factor_on_demand(tmp_path / "whole", X)
    k = RBF(gamma=0.25)

    class Stop(RuntimeError):
        pass

    seen = []

    def stopping(i, j):  # the "process" dies at its 8th Gram tile
        seen.append((i, j))
        if len(seen) == 8:
            raise Stop
        return GramTileRecomputer(X, k, 50, "float64", "float64")(i, j)

    with pytest.raises(Stop):
        _factor_on_demand(tmp_path / "cut", X, recompute_tile=stopping, n_threads=1)
    g, resumed = _factor_on_demand(tmp_path / "cut", X)
    assert 0 < len(resumed.computed) < 15  # only the tiles without a factor marker
    np.testing.assert_array_equal(_dense(resumed), _dense(whole))
    L = _dense(whole)
    K = k(X) + 1e-3 * np.eye(220)
    np.testing.assert_allclose(L @ L.T, K, rtol=0, atol=1e-10)


def test_disk_check_counts_the_factor_tiles_not_on_disk(tmp_path, monkeypatch):
    X, _ = _data(n=220)
    k = RBF(gamma=0.25)
    g = build_gram(X, k, str(tmp_path), 50, defer=True, kernel_dtype="float64", progress=False)
    tile_bytes = 50 * 50 * 8
    # room for the temporary files of the atomic replace, not for 15 new tiles
    Usage = namedtuple("Usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: Usage(10**12, 0, 4 * tile_bytes))
    with pytest.raises(InsufficientDiskError, match="15 tiles not on disk") as err:
        tile_cholesky(g, 1e-3, keep_gram=False, progress=False,
                      recompute_tile=GramTileRecomputer.for_gram(g, X, k))  # fmt: skip
    temp = inplace.factor_disk_bytes(220, 50, np.float64, keep_gram=False,
                                     writers=os.cpu_count() or 1)  # fmt: skip
    assert err.value.needed == temp + 15 * tile_bytes  # the factor's tiles are new bytes
    assert f"{temp + 15 * tile_bytes:,}" in str(err.value)
    assert g.markers.done() == set() and not (tmp_path / "gram" / "c").exists()


def test_one_log_line_not_one_per_tile(tmp_path, caplog):
    X, _ = _data(n=220)
    with caplog.at_level(logging.INFO, logger=inplace.__name__):
        _factor_on_demand(tmp_path, X)
    lines = [r for r in caplog.records if r.levelno >= logging.INFO]
    assert sum("recomputing it from X" in r.getMessage() for r in lines) == 1
    assert "15 never written" in caplog.text and "replaced" not in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=inplace.__name__):  # another lambda, same array
        _factor_on_demand(tmp_path, X, lam=1e-2)
    assert "15 replaced by an in-place factor of another lambda" in caplog.text
    assert "never written" not in caplog.text


def test_tiles_computed_on_demand_use_one_numpy_blas_thread(tmp_path):
    """numpy's own BLAS (not the tile calls' SciPy BLAS) runs one thread while the
    threads executor factors, so a Gram tile evaluated in a read-ahead thread does not
    preempt the tile calls' BLAS threads; the count is restored afterwards."""
    from pipeline.engine import blas

    own = blas._numpy_own_blas()
    if not own:
        pytest.skip("numpy and SciPy share one BLAS library here")
    X, _ = _data(n=220)
    k = RBF(gamma=0.25)
    before = own[0].get()
    seen = []

    def recompute(i, j):
        seen.append(own[0].get())
        return GramTileRecomputer(X, k, 50, "float64", "float64")(i, j)

    _, f = _factor_on_demand(tmp_path, X, recompute_tile=recompute, scheduler="threads")
    assert len(seen) == 15 and set(seen) == {1}
    assert own[0].get() == before
    _, ref = _factor_on_demand(tmp_path / "ref", X)
    np.testing.assert_array_equal(_dense(f), _dense(ref))


def test_tiles_computed_on_demand_fill_reused_buffers(tmp_path, monkeypatch):
    """Each on-demand tile is written into a buffer from the tile-buffer pool (memory
    an evicted factor tile left), not fresh pages, and the factor keeps its bits."""
    from pipeline.storage import buffers as tile_buffers

    X, _ = _data(n=220)
    _, ref = _factor_on_demand(tmp_path / "ref", X)
    taken = []
    real_take = tile_buffers.take

    def take(shape, dtype, first_touch=None):
        taken.append((tuple(shape), np.dtype(dtype).name))
        return real_take(shape, dtype, first_touch)

    monkeypatch.setattr(tile_buffers, "take", take)
    _, f = _factor_on_demand(tmp_path / "pool", X)
    grams = [t for t in taken if t[1] == "float64"]
    assert len(grams) >= 15  # every Gram tile (reads of factor tiles may take some too)
    assert sorted({s for s, _ in grams}) == [(20, 20), (20, 50), (50, 50)]  # last row ragged
    np.testing.assert_array_equal(_dense(f), _dense(ref))


def _reference_and_recomputer(tmp_path):
    """X, its factor computed on demand (the reference), and a recomputer of its Gram."""
    X, _ = _data(n=220)
    _, ref = _factor_on_demand(tmp_path / "ref", X)
    g0 = build_gram(X, RBF(gamma=0.25), str(tmp_path / "g0"), 50, defer=True,
                    kernel_dtype="float64", progress=False)  # fmt: skip
    return X, ref, GramTileRecomputer.for_gram(g0, X, RBF(gamma=0.25))


@pytest.mark.parametrize("takes_out", [True, False])
def test_any_recompute_tile_that_takes_out_gets_a_reused_buffer(tmp_path, monkeypatch, takes_out):
    """The reader offers a pooled buffer to every ``recompute_tile`` with an ``out``
    parameter (not only to GramTileRecomputer); a plain ``(i, j)`` one is called as
    before. Both give the same factor, bit for bit."""
    from pipeline.linalg.cholesky_inplace import _takes_out
    from pipeline.storage import buffers as tile_buffers

    X, ref, inner = _reference_and_recomputer(tmp_path)
    outs = []

    def with_out(i, j, out=None):
        outs.append(out is not None)
        return inner(i, j, out=out)

    def plain(i, j):
        outs.append(False)
        return inner(i, j)

    rec = with_out if takes_out else plain
    assert _takes_out(rec) is takes_out
    assert _takes_out(lambda i, j, **kw: None) and not _takes_out(max)
    monkeypatch.setattr(tile_buffers, "take", lambda *a, **k: np.empty(a[0], a[1]))
    _, f = _factor_on_demand(tmp_path / "f", X, recompute_tile=rec)
    assert len(outs) == 15 and all(outs) is takes_out and any(outs) is takes_out
    np.testing.assert_array_equal(_dense(f), _dense(ref))


def test_a_recompute_tile_with_kwargs_that_ignores_out_still_gives_the_grams_dtype(tmp_path):
    """A ``(i, j, **kw)`` callable is offered the buffer but may return its own array (a
    list of lists here, as a plain callable may): it is taken as the Gram's dtype, as a
    plain callable's is, and the factor is the same bits."""
    X, ref, inner = _reference_and_recomputer(tmp_path)
    offered = []

    def ignores_out(i, j, **kw):
        offered.append("out" in kw)
        return inner(i, j).tolist()

    _, f = _factor_on_demand(tmp_path / "f", X, recompute_tile=ignores_out)
    assert len(offered) == 15 and all(offered)
    np.testing.assert_array_equal(_dense(f), _dense(ref))


def test_one_rule_for_the_estimator_and_krr_run(monkeypatch):
    """``engine.where.gram_on_demand`` decides for both the fit and krr run's gram stage:
    only an in-place Cholesky on threads here defers the Gram; other runs keep their
    gram stage's identity (no ``on_demand`` key)."""
    from pipeline.engine.where import gram_on_demand
    from pipeline.stages.config import load_config

    assert gram_on_demand("cholesky", False, True, True)
    assert not gram_on_demand("cholesky", True, True, True)  # the Gram is kept
    assert not gram_on_demand("cholesky", False, False, True)  # X not in memory
    assert not gram_on_demand("cholesky", False, True, False)  # the factor runs elsewhere
    assert not gram_on_demand("cg", False, True, True)
    base = {
        "data": {"source": "npy", "path": "X.npy", "y_path": "y.npy"},
        "solver": {"method": "cholesky"},
    }

    def gram_params(**solver):
        cfg = load_config({**base, "solver": {**base["solver"], **solver}})
        return cfg.stage_params()["gram"]

    assert gram_params(keep_gram=False).get("on_demand") is True
    assert "on_demand" not in gram_params()
    assert "on_demand" not in gram_params(keep_gram=False, factor_scheduler="dask")
    assert "on_demand" not in gram_params(keep_gram=False, method="auto")
    monkeypatch.setattr(C, "GRAM_ON_DEMAND_IN_PLACE", False)
    assert "on_demand" not in gram_params(keep_gram=False)


def test_auto_factors_in_place_from_x_here_whatever_the_cluster(tmp_path, monkeypatch, caplog):
    """``factor_scheduler="auto"`` with ``keep_gram=False`` and X in memory factors on
    threads in this process, computing the Gram from X, even when the client's workers
    run elsewhere: the one rule ``krr run``'s gram stage applies when it stores no Gram
    (only ``"dask"`` sends the factor to the workers). The cluster is asked once per fit
    at most, not again by the factorisation; a kept Gram still goes to the workers."""
    pytest.importorskip("distributed")
    from distributed import Client, LocalCluster

    import pipeline.engine.where as where
    import pipeline.linalg.cholesky as chol

    X, y = _data(n=220)
    ran, asked = [], []
    real = {"threads": chol._run_threads, "dask": chol._run_dask, "auto": where.auto_scheduler}
    monkeypatch.setattr(
        chol, "_run_threads", lambda *a, **k: ran.append("threads") or real["threads"](*a, **k)
    )
    monkeypatch.setattr(
        chol, "_run_dask", lambda *a, **k: ran.append("dask") or real["dask"](*a, **k)
    )
    monkeypatch.setattr(
        where, "auto_scheduler", lambda *a, **k: asked.append(1) or real["auto"](*a, **k)
    )
    monkeypatch.setattr(chol, "auto_scheduler", where.auto_scheduler)
    monkeypatch.setenv("KRR_CHOL_BLAS_THREADS", "1")
    writes = []
    real_write = build_gram.__globals__["_write"]
    monkeypatch.setitem(build_gram.__globals__, "_write",
                        lambda h, i, j, t, **kw: writes.append((i, j)) or real_write(h, i, j, t, **kw))  # fmt: skip
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                     dashboard_address=":0", memory_limit=0) as cluster,
        Client(cluster),
    ):  # fmt: skip
        monkeypatch.setattr(where, "workers_on_this_host", lambda client: False)
        with caplog.at_level(logging.INFO, logger="pipeline.fit"):
            m = _model(tmp_path / "a", 50).fit(X, y)
        assert ran == ["threads"] and writes == []  # here, from X: no Gram stored
        assert "the threads executor in this process, which holds X" in caplog.text
        n_asked = len(asked)
        kept = KernelRidge(alpha=1e-3, kernel="rbf", gamma=0.25, solver="cholesky",
                           block_size=50, store=str(tmp_path / "b")).fit(X, y)  # fmt: skip
    assert ran == ["threads", "dask"]  # a kept Gram: stored first, factored on the workers
    assert len(asked) - n_asked <= 2  # the plan's tile size and the executor, no more
    np.testing.assert_allclose(m.dual_coef_, kept.dual_coef_, rtol=1e-9, atol=1e-9)
