"""New tile-read buffers are faulted in between wide BLAS calls, on every core.

On a VM a new buffer's first touch is most of a tile read's CPU. A reader thread that
faults its pages in while an all-core BLAS call runs preempts one of the call's
threads, and the others spin. :func:`pipeline.engine.blas.first_touch_between_calls`
waits for the lock the wide calls hold and faults the buffer in on every core
(:func:`pipeline.storage.buffers.touch`); the factor's bits do not depend on it.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
from _tiles import rbf_matrix, write_gram

import pipeline.constants as policy_constants
from pipeline.engine import blas
from pipeline.linalg.cholesky import tile_cholesky
from pipeline.linalg.cholesky_cache import release_tile_cache
from pipeline.storage import buffers


@pytest.mark.parametrize("shape, threads", [((0,), 3), ((1,), 4), ((10,), 3), ((33, 31), 2)])
def test_touch_zeroes_every_part(shape, threads):
    a = np.full(shape, 7.0)
    buffers.touch(a, threads)
    assert a.shape == shape and not a.any()


def test_take_touches_new_buffers_only():
    buffers.release()
    seen: list[np.ndarray] = []
    a = buffers.take((4, 5), np.float64, seen.append)
    assert len(seen) == 1 and seen[0] is a
    assert buffers.give(a, 1 << 20)
    b = buffers.take((4, 5), np.float64, seen.append)  # reused: its pages are in already
    assert b is a and len(seen) == 1
    buffers.release()


def test_no_hook_where_it_cannot_help(monkeypatch):
    assert blas.first_touch_between_calls(1) is None  # one-thread calls run side by side
    assert blas.first_touch_between_calls() is None  # this thread fixed no width
    with blas.fixed_width(1):
        assert blas.first_touch_between_calls() is None
    with blas.fixed_width(2, host_lock=True):  # other processes' calls would run meanwhile
        assert blas.first_touch_between_calls() is None
    with blas.fixed_width(2):
        assert blas.first_touch_between_calls() is not None
    monkeypatch.setattr(policy_constants, "FIRST_TOUCH_MIN_BYTES", 0)  # switched off
    assert blas.first_touch_between_calls(2) is None


@pytest.mark.parametrize("serial", [True, False], ids=["serialized", "process-wide"])
def test_hook_waits_for_the_wide_call_in_progress(monkeypatch, serial):
    """The threads executor's calls hold :func:`blas.serialized`'s lock, the Dask
    executor's the process-wide one: the hook waits for whichever is in use."""
    monkeypatch.setattr(policy_constants, "FIRST_TOUCH_MIN_BYTES", 64)
    hook = blas.first_touch_between_calls(2)
    big, small = np.full(1000, 5.0), np.full(4, 5.0)
    with blas.serialized() if serial else blas.fixed_width(None):
        lock = blas._SERIAL if serial else blas._WIDE_LOCK
        assert lock is not None
        with lock:  # a wide call in progress
            t = threading.Thread(target=hook, args=(big,))
            t.start()
            t.join(0.3)
            assert t.is_alive() and (big == 5.0).all()  # waits, untouched
            hook(small)  # under the least size: left to the read, no wait
            assert (small == 5.0).all()
        t.join(10)
        assert not t.is_alive() and not big.any()


@pytest.mark.parametrize("scheduler", ["threads", "dask"])
def test_factor_touches_new_read_buffers_between_calls_with_the_same_bits(
    tmp_path, monkeypatch, scheduler
):
    monkeypatch.setenv("KRR_CHOL_BLAS_THREADS", "2")  # wide calls whatever the cores
    g = write_gram(tmp_path / "g", rbf_matrix(300, seed=5), 50)
    monkeypatch.setattr(policy_constants, "FIRST_TOUCH_MIN_BYTES", 0)
    ref = tile_cholesky(g, 1e-2, store=str(tmp_path / "ref"), scheduler=scheduler,
                        progress=False)  # fmt: skip
    release_tile_cache()
    touched: list[tuple[str, bool, int]] = []
    real_touch = buffers.touch

    def recording_touch(arr, threads=1):
        lock = blas._SERIAL if blas._SERIAL is not None else blas._WIDE_LOCK
        touched.append((threading.current_thread().name, lock.locked(), threads))
        real_touch(arr, threads)

    monkeypatch.setattr(buffers, "touch", recording_touch)
    monkeypatch.setattr(policy_constants, "FIRST_TOUCH_MIN_BYTES", 1)
    got = tile_cholesky(g, 1e-2, store=str(tmp_path / "got"), scheduler=scheduler,
                        progress=False)  # fmt: skip
    release_tile_cache()
    # every Gram tile's read buffer at least (the read-ahead's, in tile-read threads)
    assert len(touched) >= len(list(g.grid.lower_tiles())), touched
    assert any(name.startswith("tile-read") for name, _, _ in touched), touched
    assert all(held and threads == 2 for _, held, threads in touched), touched
    for t in g.grid.lower_tiles():
        np.testing.assert_array_equal(got.L.read_tile(*t), ref.L.read_tile(*t))
