"""A real external Dask cluster on 127.0.0.1 for tests: `dask scheduler` + `dask worker`s."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from distributed import Client

DASK = shutil.which("dask", path=os.path.dirname(sys.executable)) or "dask"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(cmd: list[str], log: Path, env: Mapping[str, str] | None = None) -> subprocess.Popen:
    with open(log, "w") as f:
        return subprocess.Popen(
            cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, env=None if env is None else {**os.environ, **env},
        )  # fmt: skip


def stop(p: subprocess.Popen) -> None:
    """Terminate ``p``, killing it if it does not exit within 15 s."""
    stop_all([p])


def stop_all(procs: list[subprocess.Popen]) -> None:
    """Terminate every process of ``procs`` at once, then wait for each, killing one that
    does not exit within 15 s (their shutdowns overlap instead of adding up)."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


@dataclass
class Cluster:
    address: str
    scheduler: subprocess.Popen
    workers: list[subprocess.Popen] = field(default_factory=list)


@contextlib.contextmanager
def external_cluster(
    logs: Path,
    n_workers: int = 2,
    *,
    nanny: bool = True,
    timeout: float = 90,
    worker_env: Mapping[str, str] | None = None,
) -> Iterator[Cluster]:
    """Start a scheduler and ``n_workers`` single-thread workers; stop them all on exit.

    ``nanny=False`` makes a SIGKILLed worker stay dead (no restart), for fault tests;
    ``worker_env`` is added to the workers' environment (a fault to inject).
    """
    logs.mkdir(parents=True, exist_ok=True)
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    sched = _start(
        [DASK, "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard",
         "--no-show"],
        logs / "scheduler.log",
    )  # fmt: skip
    cluster = Cluster(address, sched)
    try:
        for w in range(n_workers):
            cmd = [DASK, "worker", address, "--nthreads", "1", "--memory-limit", "1GiB",
                   "--no-dashboard", "--local-directory", str(logs / f"w{w}")]  # fmt: skip
            if not nanny:
                cmd.append("--no-nanny")
            cluster.workers.append(_start(cmd, logs / f"worker{w}.log", worker_env))
        deadline = time.monotonic() + timeout
        while True:
            try:
                with Client(address, timeout=5) as c:
                    c.wait_for_workers(n_workers, timeout=max(1, deadline - time.monotonic()))
                break
            except OSError:
                procs = [sched, *cluster.workers]
                if any(p.poll() is not None for p in procs):
                    raise RuntimeError(f"a dask process exited early; logs in {logs}") from None
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        yield cluster
    finally:
        stop_all(cluster.workers[::-1])  # the workers together, then the scheduler
        stop(sched)
