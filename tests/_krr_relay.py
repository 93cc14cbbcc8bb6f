"""A ``krr`` executable for a shell script under test whose commands run in this process.

A script such as ``workflows/scheduled/refit_and_predict.sh`` calls ``$KRR`` several
times; each call of the installed ``krr`` pays a new interpreter's start and imports
(3-4 s) for a second of work. :func:`run_relayed` runs the script with ``KRR`` set to a
small relay (a Python client without ``site``): it sends its command line and working
directory over a Unix socket to this process, which runs it with
:class:`conftest.KrrInProcess` (``pipeline.cli.main``, in the main thread, the process
state put back after) and sends back the exit code, stdout and stderr; the relay prints
them and exits with that code. The script itself, its files, hashes, ``set -e`` on a
failing exit code and its output run as they would with the real ``krr``
(``tests/cli/test_cli.py::test_entry_point_runs`` runs the installed script itself).
"""

from __future__ import annotations

import json
import os
import selectors
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

CLIENT = """\
#!{python} -IS
import json, os, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect({sock!r})
s.sendall(json.dumps({{"argv": sys.argv[1:], "cwd": os.getcwd()}}).encode() + b"\\n")
data = b""
while chunk := s.recv(65536):
    data += chunk
res = json.loads(data)
sys.stdout.write(res["stdout"])
sys.stdout.flush()
sys.stderr.write(res["stderr"])
sys.exit(res["code"])
"""


def _recv_line(conn: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def run_relayed(
    cmd: Sequence[str], env: Mapping[str, str], krr_main: Any, timeout: float = 600
) -> subprocess.CompletedProcess:
    """Run ``cmd`` (``env`` its environment, ``KRR`` set to the relay) to its end, serving
    each relayed ``krr`` command in this process with ``krr_main``; its CompletedProcess
    (text stdout and stderr). Fails past ``timeout`` seconds."""
    with tempfile.TemporaryDirectory(prefix="krr-relay-") as d:
        sock_path = os.path.join(d, "s")
        client = Path(d) / "krr"
        client.write_text(CLIENT.format(python=sys.executable, sock=sock_path))
        client.chmod(0o755)
        server = socket.socket(socket.AF_UNIX)
        server.bind(sock_path)
        server.listen()
        out_path, err_path = Path(d) / "out", Path(d) / "err"
        with open(out_path, "w") as out, open(err_path, "w") as err, server:
            proc = subprocess.Popen(
                list(cmd), env={**env, "KRR": str(client)}, stdout=out, stderr=err
            )
            sel = selectors.DefaultSelector()
            sel.register(server, selectors.EVENT_READ)
            deadline = time.monotonic() + timeout
            try:
                while proc.poll() is None:
                    if time.monotonic() > deadline:
                        raise subprocess.TimeoutExpired(list(cmd), timeout)
                    if not sel.select(timeout=0.05):
                        continue
                    conn, _ = server.accept()
                    with conn:
                        req = json.loads(_recv_line(conn))
                        res = krr_main(*req["argv"], cwd=req["cwd"])
                        reply = {"code": res.returncode, "stdout": res.stdout, "stderr": res.stderr}
                        conn.sendall(json.dumps(reply).encode())
            finally:
                sel.close()
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
        return subprocess.CompletedProcess(
            list(cmd), proc.returncode, out_path.read_text(), err_path.read_text()
        )
