"""An S3-compatible server on loopback for tests (moto's server mode), the way s3fs
tests itself: ``python -m moto.server -p PORT``, dummy keys, ``AWS_ENDPOINT_URL``."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator

import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


S3_ENV_KEYS = (
    "AWS_ENDPOINT_URL",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_DEFAULT_REGION",
)


#: the server process of each running server's endpoint URL (to pause it with SIGSTOP)
SERVER_PIDS: dict[str, int] = {}

#: this process's one server (each pytest-xdist worker starts its own, on first use)
_SHARED: dict[str, subprocess.Popen] = {}


def _start_server() -> str:
    """Start a moto S3 server on a free loopback port; its URL once it answers."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(url + "/moto-api/", timeout=1)
                break
            except OSError:
                if proc.poll() is not None:
                    raise RuntimeError("moto server exited") from None
                time.sleep(0.05)
    except BaseException:
        _stop(proc)
        raise
    _SHARED[url] = proc
    SERVER_PIDS[url] = proc.pid
    return url


def _stop(proc: subprocess.Popen) -> None:
    os.kill(proc.pid, signal.SIGCONT)  # a test that paused it and failed
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def stop_servers() -> None:
    """Stop this process's server (``conftest.pytest_sessionfinish``)."""
    while _SHARED:
        url, proc = _SHARED.popitem()
        SERVER_PIDS.pop(url, None)
        _stop(proc)


@contextlib.contextmanager
def moto_server() -> Iterator[dict[str, str]]:
    """A moto S3 server: yield the environment that points s3fs at it.

    One server per test process, started on first use and stopped at the session's end:
    each test file keeps to its own bucket, and a start costs about 3 s of CPU (moto's
    imports), six times over a run before. A server a test paused (SIGSTOP) is resumed on
    the way out; one that died is replaced."""
    pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    url = next((u for u, p in _SHARED.items() if p.poll() is None), None)
    if url is None:
        stop_servers()
        url = _start_server()
    try:
        yield {
            "AWS_ENDPOINT_URL": url,
            "AWS_ACCESS_KEY_ID": "test",
            "AWS_SECRET_ACCESS_KEY": "test",
            "AWS_DEFAULT_REGION": "us-east-1",
        }
    finally:
        if url in _SHARED:  # a test that paused it and failed
            os.kill(_SHARED[url].pid, signal.SIGCONT)


@contextlib.contextmanager
def s3_env(env: dict[str, str]) -> Iterator[None]:
    """Set ``env`` in this process (and drop cached s3fs instances), restore afterwards."""
    import s3fs

    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    s3fs.S3FileSystem.clear_instance_cache()
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        s3fs.S3FileSystem.clear_instance_cache()


def make_bucket(name: str) -> None:
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    if not fs.exists(name):
        fs.mkdir(name)
