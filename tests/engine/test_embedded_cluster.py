"""The embedded LocalCluster's Dask settings (policy.constants.EMBEDDED_CLUSTER_DASK_CONFIG).

On 2 cores every wake-up of a worker's profiler or an event loop's tick preempts one
thread of an all-core BLAS call. The cluster ``dask_client`` starts runs without the
worker profiler and with slower ticks; a cluster given by address is left alone, and
a value the user set in their Dask config wins.
"""

from __future__ import annotations

import dask
import pytest

from pipeline.constants import EMBEDDED_CLUSTER_DASK_CONFIG
from pipeline.engine.parallel import dask_client, embedded_cluster_config

TICK = "distributed.admin.tick.interval"
PROFILE = "distributed.worker.profile.enabled"
MONITOR = "distributed.admin.system-monitor.interval"
MEMORY = "distributed.worker.memory.monitor-interval"


def _worker_settings(dask_worker):
    return (
        dask.config.get(PROFILE),
        dask_worker._tick_interval,
        "profile" in dask_worker.periodic_callbacks,
        dask_worker.periodic_callbacks["monitor"].callback_time,
        getattr(dask_worker.periodic_callbacks.get("memory_monitor"), "callback_time", None),
    )


def _dask_defaults() -> dict:
    import distributed  # noqa: F401  (registers the distributed.* defaults)

    merged = dask.config.merge(*dask.config.defaults)
    return {k: dask.config.get(k, config=merged) for k in EMBEDDED_CLUSTER_DASK_CONFIG}


def test_config_applies_only_where_the_user_left_dasks_default():
    with dask.config.set(_dask_defaults()):  # whatever this machine's Dask config says
        assert embedded_cluster_config() == EMBEDDED_CLUSTER_DASK_CONFIG
    with dask.config.set({**_dask_defaults(), TICK: "50ms", PROFILE: False}):
        got = embedded_cluster_config()
    assert TICK not in got  # the user's 50 ms wins
    assert got[MONITOR] == EMBEDDED_CLUSTER_DASK_CONFIG[MONITOR]
    # the user's False equals ours; it is applied either way
    assert got.get(PROFILE, False) is False


@pytest.mark.slow
def test_embedded_cluster_runs_without_profiler_and_with_slow_ticks(caplog):
    import logging

    with caplog.at_level(logging.INFO, logger="pipeline"), dask.config.set(_dask_defaults()):
        before = dask.config.get(TICK)
        with dask_client(n_workers=1, memory_limit="1GiB", processes=True) as client:
            settings = list(client.run(_worker_settings).values())
            scheduler = client.cluster.scheduler
            sched_tick = scheduler._tick_interval
            sched_monitor = scheduler.periodic_callbacks["monitor"].callback_time
            # the settings are the cluster's, not this process's
            assert dask.config.get(TICK) == before
    assert settings == [(False, 1.0, False, 2000, 1000)]  # a worker process, through its nanny
    assert sched_tick == 1.0 and sched_monitor == 2000
    # the start-up line names the keys, so a user can find and override them
    assert "distributed.worker.profile.enabled=False" in caplog.text
    assert "distributed.admin.tick.interval=1s" in caplog.text


def test_user_setting_reaches_the_embedded_cluster():
    with (
        dask.config.set({**_dask_defaults(), TICK: "50ms"}),
        dask_client(n_workers=1, memory_limit=0, processes=False) as client,
    ):
        settings = [s[1:] for s in client.run(_worker_settings).values()]
    # (in process: no config of its own to read, and no memory limit to watch)
    assert settings == [(0.05, False, 2000, None)]


def test_the_embedded_cluster_runs_nothing_on_its_workers_beside_the_first_tasks(monkeypatch):
    """Session 22 had each new worker import the tile modules on a thread, not waited
    for. Beside the first task (which imports dask.array as it is unpickled) the two
    imports raced: dask.array half-initialised, "No dispatch for numpy.ndarray", and
    the stage failed (seen once in the full suite, session 23). Nothing is run on the
    workers as the cluster starts, and the first computation on them succeeds."""
    import dask.array as da
    from distributed import Client

    ran = []
    real = Client.run

    def run(self, function, *args, **kwargs):
        ran.append(getattr(function, "__name__", repr(function)))
        return real(self, function, *args, **kwargs)

    monkeypatch.setattr(Client, "run", run)
    with dask_client(n_workers=1, memory_limit="1GiB") as client:
        assert ran == []
        x = da.ones((40, 40), chunks=10)
        assert float(client.compute((x @ x.T).sum()).result()) == 40.0**3


@pytest.mark.slow
def test_the_embedded_cluster_leaves_the_callers_environment_as_it_was(monkeypatch):
    """A nanny sets its pre-spawn environment (OMP/OPENBLAS/MKL_NUM_THREADS=1) in the
    process that starts it and never undoes it: a child started afterwards (a subprocess,
    another ``krr run``) ran BLAS on one thread and got other last bits (a resumed CV
    search selected differently from an uninterrupted one)."""
    import os

    keys = sorted(dask.config.get("distributed.nanny.pre-spawn-environ"))
    assert "OMP_NUM_THREADS" in keys
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    for key in keys[1:]:
        monkeypatch.delenv(key, raising=False)
    before = {k: os.environ.get(k) for k in keys}
    with dask_client(n_workers=1, memory_limit="1GiB", processes=True) as client:
        inside = {k: os.environ.get(k) for k in keys}
        # the worker itself still runs with the nanny's settings
        worker_env = list(client.run(lambda: os.environ.get("OMP_NUM_THREADS")).values())
    assert inside == before
    assert {k: os.environ.get(k) for k in keys} == before
    assert worker_env == ["1"]
