"""pipeline.engine.parallel: the BLAS controller's library scan never meets a native load.

threadpoolctl's scan (``dl_iterate_phdr`` with a Python callback) and an extension
module's import in another thread (``dlopen`` holding the GIL) deadlock a process; the
rules that keep them apart are tested here, with a counting stand-in for the scan.
"""

from __future__ import annotations

import sys
import threading
import types

import numpy as np
import pytest

from pipeline.engine import parallel, vexp


@pytest.fixture
def scans(monkeypatch):
    """Count threadpoolctl controllers made (each one is a scan of the libraries)."""
    made = []

    class Counting:
        def __init__(self):
            made.append(self)

    monkeypatch.setattr(parallel, "ThreadpoolController", Counting)
    monkeypatch.setattr(parallel, "_controller", [None, -1])
    return made


def _in_thread(fn):
    out = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join(10)
    assert not t.is_alive()
    return out[0]


def test_a_tile_thread_reuses_the_controller_and_only_the_main_thread_rescans(scans, monkeypatch):
    first = parallel._blas_controller()
    assert len(scans) == 1 and parallel._blas_controller() is first  # nothing imported since
    monkeypatch.setitem(sys.modules, "_krr_new_module", types.ModuleType("_krr_new_module"))
    assert _in_thread(parallel._blas_controller) is first and len(scans) == 1
    second = parallel._blas_controller()  # as compute() does before its tasks run
    assert second is not first and len(scans) == 2


def test_a_thread_with_no_controller_yet_makes_the_first(scans):
    assert _in_thread(parallel._blas_controller) is scans[0]


def test_a_scan_waits_while_a_native_library_loads(scans):
    loading, release, scanned = threading.Event(), threading.Event(), threading.Event()

    def load():  # as vexp's first kernel build imports numba
        with parallel.native_lock:
            loading.set()
            release.wait(10)

    loader = threading.Thread(target=load)
    loader.start()
    loading.wait(10)
    scanner = threading.Thread(target=lambda: (parallel._blas_controller(), scanned.set()))
    scanner.start()
    try:
        assert not scanned.wait(0.3) and scans == []
    finally:
        release.set()  # (the lock is never left held for the tests after this one)
    assert scanned.wait(10) and len(scans) == 1
    loader.join(10)
    scanner.join(10)


def test_the_exp_kernel_is_built_under_the_native_lock(monkeypatch):
    held = []

    def try_lock():
        got = parallel.native_lock.acquire(timeout=0)
        if got:
            parallel.native_lock.release()
        return not got

    def build():
        held.append(_in_thread(try_lock))
        return {np.dtype(np.float64): lambda a: None, np.dtype(np.float32): lambda a: None}

    monkeypatch.setattr(vexp, "_compiled", None)
    monkeypatch.setattr(vexp, "_build", build)
    vexp._kernel(np.float64)
    assert held == [True]
