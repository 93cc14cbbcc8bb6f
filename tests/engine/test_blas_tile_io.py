"""GIL-free BLAS tile kernels and the read-ahead / write-behind tile I/O helper."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from pipeline.engine.blas import gemm_nt_sub, syrk_lower_sub, trsm_right_lower_t
from pipeline.engine.tile_io import TileIO

RTOL = {np.float64: 1e-12, np.float32: 2e-5}


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape", [(7, 5, 3), (1, 4, 9), (16, 16, 16)])
def test_gemm_nt_sub_matches_numpy(dtype, shape):
    m, n, k = shape
    rng = np.random.default_rng(0)
    c, a, b = (rng.standard_normal(s).astype(dtype) for s in ((m, n), (m, k), (n, k)))
    want = c - a @ b.T
    assert gemm_nt_sub(c, a, b) is c
    np.testing.assert_allclose(c, want, rtol=RTOL[dtype], atol=RTOL[dtype] * 10)


def test_gemm_accepts_row_strided_views():
    """Views into a wider panel (row stride > columns) are passed as the leading dimension."""
    rng = np.random.default_rng(1)
    panel_a, panel_b = rng.standard_normal((6, 20)), rng.standard_normal((4, 20))
    a, b = panel_a[:, 5:12], panel_b[:, 3:10]
    c = rng.standard_normal((6, 4))
    want = c - a @ b.T
    gemm_nt_sub(c, a, b)
    np.testing.assert_allclose(c, want, rtol=1e-12)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_syrk_updates_only_the_lower_triangle(dtype):
    rng = np.random.default_rng(2)
    c, a = rng.standard_normal((9, 9)).astype(dtype), rng.standard_normal((9, 4)).astype(dtype)
    before = c.copy()
    syrk_lower_sub(c, a)
    np.testing.assert_allclose(
        np.tril(c), np.tril(before - a @ a.T), rtol=RTOL[dtype], atol=RTOL[dtype] * 10
    )
    np.testing.assert_array_equal(np.triu(c, 1), np.triu(before, 1))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_trsm_solves_x_lt_equals_a(dtype):
    rng = np.random.default_rng(3)
    m = rng.standard_normal((8, 8))
    ell = np.linalg.cholesky(m @ m.T + 8 * np.eye(8)).astype(dtype)
    a = rng.standard_normal((11, 8)).astype(dtype)
    x = a.copy()
    trsm_right_lower_t(ell, x)
    np.testing.assert_allclose(x @ ell.T, a, rtol=RTOL[dtype] * 10, atol=RTOL[dtype] * 10)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="gemm shapes"):
        gemm_nt_sub(np.zeros((2, 2)), np.zeros((3, 2)), np.zeros((2, 2)))
    with pytest.raises(TypeError, match="float64 or all float32"):
        gemm_nt_sub(np.zeros((2, 2)), np.zeros((2, 2), np.float32), np.zeros((2, 2)))
    with pytest.raises(ValueError, match="unit stride"):
        gemm_nt_sub(np.zeros((2, 2)), np.zeros((2, 4))[:, ::2], np.zeros((2, 2)))
    ro = np.zeros((2, 2))
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="writable"):
        syrk_lower_sub(ro, np.zeros((2, 2)))


def test_blas_calls_release_the_gil():
    """While a BLAS call runs, a Python thread ticks about as fast as while we sleep.

    SciPy's f2py ``dgemm`` on the same operands lets it tick about 8x less often. The
    best of three measurements counts: another process busy on the same cores (a second
    pytest-xdist worker) can slow the ticking during one call, never a held GIL's ~8x.
    """
    rng = np.random.default_rng(4)
    a = rng.standard_normal((1500, 1500))
    c = np.zeros((1500, 1500))
    ticks = []
    done = threading.Event()

    def spin():
        while not done.is_set():
            ticks.append(1)
            time.sleep(0)

    def rate(fn) -> float:
        n0, t0 = len(ticks), time.perf_counter()
        fn()
        return (len(ticks) - n0) / (time.perf_counter() - t0)

    th = threading.Thread(target=spin)
    th.start()
    tries = []
    try:
        time.sleep(0.02)
        for _ in range(3):
            idle = rate(lambda: time.sleep(0.1))
            busy = min(rate(lambda: gemm_nt_sub(c, a, a)) for _ in range(2))
            tries.append((busy, idle))
            if busy > 0.4 * idle:
                break
    finally:
        done.set()
        th.join()
    busy, idle = max(tries, key=lambda t: t[0] / t[1])
    assert busy > 0.4 * idle, tries


# ------------------------------------------------------------------ TileIO


def test_reads_ahead_in_order_and_out_of_order():
    calls = []

    def reader(key):
        calls.append(key)
        return np.full(2, key)

    with TileIO(reader, [1, 2, 3, 4], depth=2) as io:
        assert io.read(1)[0] == 1
        assert io.read(4)[0] == 4  # out of order: read now, not read again later
        assert io.read(2)[0] == 2 and io.read(3)[0] == 3
        assert io.read(9)[0] == 9  # never announced
    assert sorted(calls) == [1, 2, 3, 4, 9]


def test_writes_keep_their_order_and_stay_readable_until_written():
    written = []
    gate = threading.Event()

    def slow_write(key):
        def fn(tile):
            gate.wait(5)
            written.append(key)

        return fn

    io = TileIO(lambda k: None, depth=0, max_pending=3)
    for k in range(3):
        io.write(k, np.full(1, k), slow_write(k))
    assert io.pending(1)[0] == 1  # queued, not yet written
    gate.set()
    io.close()
    assert written == [0, 1, 2]
    assert io.pending(1) is None


def test_writer_error_reaches_the_producer_and_close():
    def bad(tile):
        raise OSError("disk full")

    io = TileIO(lambda k: None, depth=0, max_pending=1)
    io.write("a", np.zeros(1), bad)
    with pytest.raises(OSError, match="disk full"):
        for _ in range(50):  # the error surfaces on a later write or at close
            time.sleep(0.01)
            io.write("b", np.zeros(1), lambda t: None)
        io.close()


def test_each_write_has_a_future_that_holds_its_outcome():
    """``write`` returns a future done when that write is; a failed write's error is in
    its future and in those of the writes queued behind it (none waits for ever). A
    ``TileIO`` without a reader only writes (the device factor's write-behind)."""
    gate = threading.Event()
    io = TileIO(depth=0, max_pending=4)
    first = io.write("a", np.zeros(1), lambda t: gate.wait(5))
    assert not first.done()
    gate.set()
    assert first.result(timeout=5) is None

    release = threading.Event()

    def failing(tile):
        release.wait(5)
        raise OSError("disk full")

    failed = io.write("b", np.zeros(1), failing)
    queued = io.write("c", np.zeros(1), lambda t: None)  # behind the failing write
    release.set()
    for fut in (failed, queued):
        with pytest.raises(OSError, match="disk full"):
            fut.result(timeout=5)
    io.close(raise_error=False)
    assert TileIO(max_pending=0).write("d", np.zeros(1), lambda t: None).result() is None


def test_caller_error_still_finishes_queued_writes():
    written = []
    with pytest.raises(RuntimeError, match="compute failed"):
        with TileIO(lambda k: None, depth=0, max_pending=4) as io:
            io.write("a", np.zeros(1), lambda t: written.append("a"))
            raise RuntimeError("compute failed")
    assert written == ["a"]


@pytest.mark.parametrize("error", [KeyboardInterrupt, RuntimeError])
def test_an_interrupt_caps_the_store_waits_of_the_queued_writes(error):
    # a write that waits on a store until the waits are capped (what the bounded S3
    # filesystem does): an interrupt unwinding through TileIO caps them, so closing does
    # not wait out the store's own timeout; any other error leaves them as they are
    from pipeline.storage.waits import cap_store_waits, store_wait_cap

    started, caps = threading.Event(), []

    def store_write(tile):
        started.set()
        for _ in range(100):  # (gives up after a second in any case)
            if store_wait_cap() is not None:
                break
            time.sleep(0.01)
        caps.append(store_wait_cap())

    try:
        with pytest.raises(error):
            with TileIO(lambda k: None, depth=0, max_pending=1) as io:
                io.write("a", np.zeros(1), store_write)
                started.wait(5)
                raise error()
    finally:
        cap_store_waits(None)
    assert (caps[0] is not None) == (error is KeyboardInterrupt), caps


def test_a_store_wait_cap_lasts_for_the_cleanup_only(monkeypatch):
    # the next fit in a notebook where Ctrl-C stopped one has the store's own waits again
    from pipeline.storage import waits

    monkeypatch.setattr(waits, "_WAIT_CAP", [])
    waits.cap_store_waits()
    assert waits.store_wait_cap() is not None
    since, seconds = waits._WAIT_CAP[0]
    waits._WAIT_CAP[0] = (since - waits.CAP_WINDOW - 1, seconds)
    assert waits.store_wait_cap() is None


def test_a_new_fit_lifts_the_store_wait_cap(monkeypatch):
    # as a new run does (the runner): the fit after a Ctrl-C'd one waits on the store as usual
    from pipeline import KernelRidge
    from pipeline.storage import waits

    monkeypatch.setattr(waits, "_WAIT_CAP", [])
    waits.cap_store_waits()
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 2))
    KernelRidge(kernel="rbf", alpha=0.1).fit(X, X[:, 0])
    assert waits.store_wait_cap() is None


@pytest.mark.parametrize("venv", ["/opt/venv", "/home/u/numpy-work/venv", "/srv/scipy_numpy"])
def test_numpys_own_blas_is_told_apart_by_where_it_lies(monkeypatch, tmp_path, venv):
    """numpy's own BLAS is the library under numpy's package or its ``numpy.libs``,
    wherever the environment is: a path with "numpy" elsewhere in it (a virtual
    environment named after it) does not make SciPy's library numpy's too."""
    import types

    from pipeline.engine import blas

    site = f"{venv}/lib/python3.11/site-packages"
    fake_numpy = types.SimpleNamespace(__file__=f"{site}/numpy/__init__.py")
    monkeypatch.setattr(blas, "np", fake_numpy)

    def ctl(path):
        return types.SimpleNamespace(filepath=path)

    numpys = ctl(f"{site}/numpy.libs/libscipy_openblas64_-32a4b2a6.so")
    scipys = ctl(f"{site}/scipy.libs/libscipy_openblas-6cdc3b4a.so")
    monkeypatch.setattr(blas, "_blas_controllers", lambda: (numpys, scipys))
    assert blas._numpy_own_blas() == (numpys,)
    assert blas._tile_blas() == (scipys,)
    monkeypatch.setattr(blas, "_blas_controllers", lambda: (scipys,))  # one shared library
    assert blas._numpy_own_blas() == () and blas._tile_blas() == (scipys,)
