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


@contextlib.contextmanager
def moto_server() -> Iterator[dict[str, str]]:
    """Start a moto S3 server; yield the environment that points s3fs at it."""
    pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
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
        SERVER_PIDS[url] = proc.pid
        yield {
            "AWS_ENDPOINT_URL": url,
            "AWS_ACCESS_KEY_ID": "test",
            "AWS_SECRET_ACCESS_KEY": "test",
            "AWS_DEFAULT_REGION": "us-east-1",
        }
    finally:
        SERVER_PIDS.pop(url, None)
        os.kill(proc.pid, signal.SIGCONT)  # a test that paused it and failed
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


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
