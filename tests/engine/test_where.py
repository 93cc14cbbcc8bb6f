"""``pipeline.engine.where``: the one home of the where-does-it-run decisions (issue #43).

History: these rules were spread over ten functions in six modules, and some answered
one question by different rules: the cores of a tile pass were the CPU affinity mask's
here and ``os.cpu_count()`` there (the sweeps, the factor's threads), and the
synchronous scheduler was recognised by its name only when sizing a fused call's
threads but by its function too when deciding where the Cholesky's tiles read.
"""

from __future__ import annotations

import os

import dask
import dask.local
import dask.threaded
import pytest

import pipeline.engine.where as where
from pipeline import constants as C
from pipeline.engine.placement import Resources, tiles_on_workers


@pytest.mark.parametrize(
    "setting, kind",
    [
        (None, None),
        ("sync", "sync"),
        ("single-threaded", "sync"),
        (dask.local.get_sync, "sync"),
        ("threading", "threads"),
        (dask.threaded.get, "threads"),
        ("processes", "processes"),
        ("dask.distributed", "distributed"),
        (lambda dsk, keys, **kw: None, "other"),
    ],
)
def test_the_configured_scheduler_by_kind(setting, kind):
    with dask.config.set(scheduler=setting):
        assert where.scheduler_kind() == kind
        assert where.scheduler_in_this_process() is (kind in (None, "threads", "sync"))
        want = dask.local.get_sync if kind == "sync" else dask.threaded.get
        assert where.local_scheduler_function() is want


def test_a_synchronous_scheduler_given_as_its_function_runs_one_task_at_a_time(monkeypatch):
    """``task_threads`` gives a fused call every core under the synchronous scheduler,
    named or given as its function (the function was taken for a threaded scheduler
    with a thread per core, so each call got one thread of eight)."""
    from pipeline.engine import task_threads

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    with dask.config.set(scheduler="sync"):
        assert task_threads(10_000) == 8
    with dask.config.set(scheduler=dask.local.get_sync):
        assert task_threads(10_000) == 8
    with dask.config.set(scheduler="threads", num_workers=None):
        assert task_threads(10_000) == 1


def test_one_rule_for_the_cores_of_every_thread_count(monkeypatch):
    """Every thread count follows the cores this process may run on (its affinity
    mask, e.g. under taskset), not the machine's: the sweeps' and the factor's tile
    threads counted ``os.cpu_count()``."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2})
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.delenv("KRR_CHOL_BLAS_THREADS", raising=False)
    assert where.available_cores() == 3
    assert where.sweep_threads() == 3
    assert where.factor_threads(None) == 3 and where.factor_threads(5) == 5
    assert where.factor_threads(None, "dask") == 1
    assert where.tile_blas_threads(True) == 3 and where.tile_blas_threads(False) == 1


class _Client:
    """Enough of a distributed client for the rules: two workers."""

    def scheduler_info(self):
        return {"workers": {"tcp://10.0.0.1:1": {}, "tcp://10.0.0.2:1": {}}}


@pytest.mark.parametrize("factor_scheduler", ["auto", "threads", "dask"])
@pytest.mark.parametrize("workers_here", [True, False])
@pytest.mark.parametrize("from_x", [True, False])
@pytest.mark.parametrize("threads_on_this_host", [True, False])
def test_the_plan_and_the_fit_place_the_factor_alike(
    monkeypatch, factor_scheduler, workers_here, from_x, threads_on_this_host
):
    """The plan sizes the tile for the workers (``tiles_on_workers``, on the measured
    resources) exactly when the fit then factors on them (``factor_executor``, on the
    live client): one rule, ``factor_threads_here``."""
    monkeypatch.setattr(C, "FACTOR_THREADS_ON_THIS_HOST", threads_on_this_host)
    monkeypatch.setattr(where, "active_client", lambda: _Client())
    monkeypatch.setattr(where, "workers_on_this_host", lambda client: workers_here)
    assert where.cluster_workers() == (2, workers_here)
    executor = where.factor_executor("cholesky", factor_scheduler, from_x)
    res = Resources(memory_bytes=1e12, disk_bytes=1e12, workers=2, workers_here=workers_here)
    planned = tiles_on_workers(
        "cholesky", res, factor_scheduler=factor_scheduler, keep_gram=not from_x, x_in_memory=True
    )
    if not C.GRAM_ON_DEMAND_IN_PLACE and from_x:
        pytest.skip("an in-place factor never computes its Gram from X")
    assert (executor == "threads") is (planned == 1)
    assert executor == (
        "threads" if where.factor_threads_here(factor_scheduler, workers_here, from_x) else "dask"
    )
    assert where.factor_executor("cg", factor_scheduler, from_x) is None
