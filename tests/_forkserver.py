"""``krr`` in a child process without paying the interpreter's imports each time.

A ``python -m pipeline.cli`` process spends most of a small fault test's run on its
imports (3-4 s of CPU on a 2-core machine: NumPy, SciPy, scikit-learn, Dask, zarr,
s3fs). Here one *zygote* interpreter imports ``pipeline.cli`` once, then forks a child
per command: the child is a process of its own (a pid to SIGKILL, SIGINT or SIGTERM; its
own exit status, -9 when killed; its own stdout and stderr), in the state of a fresh
interpreter that imported ``pipeline.cli`` and ran nothing (no Dask cluster, no store
opened, no BLAS call) but the load of the fused evaluators' compiled ``exp`` from numba's
cache (0.25 s of CPU that every child evaluating a kernel tile would spend again; no
thread, the same bits), and it ends through the interpreter's normal exit (``sys.exit``
of ``main``'s code: atexit handlers, thread joins), as ``python -m pipeline.cli`` does.

What a fresh process reads from its environment only when it starts is made the same:
a variable that only changes at import (BLAS widths, ``PYTHONPATH`` other than
``tests/faultinject``, ...) gets a zygote of its own started with it; the child sets the
rest (``KRR_KILL*``, ``KRR_ENOSPC*``, ``KRR_MARK_DELAY``, ``FSSPEC_*``, ``AWS_*``,
``DASK_*``, ``PYTEST_*``) and re-reads fsspec's and Dask's configuration from it, and runs
``tests/faultinject/sitecustomize.py`` when that directory is put first on
``PYTHONPATH`` (``kill``/``inject``), as a new interpreter would at its start.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
FAULTINJECT = TESTS / "faultinject"

#: variables the child sets itself (read when used, or re-read by the child)
_PER_CHILD = ("KRR_KILL", "KRR_ENOSPC", "KRR_MARK_DELAY", "FSSPEC_", "AWS_", "DASK_", "PYTEST_")

_ZYGOTE = r"""
import json, os, select, signal, sys

START_ENV = dict(os.environ)  # (before the imports: what they add to it stays)
import pipeline.cli
import numpy
from pipeline.engine.vexp import exp_inplace
for dtype in (numpy.float64, numpy.float32):  # numba's cached exp, loaded once for all
    exp_inplace(numpy.zeros(1, dtype))

ADDS = {k: v for k, v in os.environ.items() if START_ENV.get(k) != v}
os.write(1, ("E %s\n" % json.dumps(ADDS)).encode())


def serve():
    buf = b""
    while True:
        r, _, _ = select.select([0], [], [], 0.02)
        if r:
            chunk = os.read(0, 1 << 16)
            if not chunk:
                os._exit(0)
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                req = json.loads(line)
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    return req
                os.write(1, ("S %d %d\n" % (req["id"], pid)).encode())
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            os.write(1, ("X %d %d\n" % (pid, os.waitstatus_to_exitcode(status))).encode())


req = serve()
if req["new_session"]:
    os.setsid()
for k in set(START_ENV) - set(req["env"]):
    os.environ.pop(k, None)
os.environ.update(req["env"])
os.chdir(req["cwd"])
null = os.open(os.devnull, os.O_RDONLY)
os.dup2(null, 0)
for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
    f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(f, fd)
    os.close(f)
os.close(null)
import dask.config
import fsspec.config
fsspec.config.conf.clear()
fsspec.config.set_conf_files(fsspec.config.conf_dir, fsspec.config.conf)
fsspec.config.set_conf_env(fsspec.config.conf)
dask.config.refresh()
if req["inject"]:
    import runpy
    runpy.run_path(req["inject"], run_name="sitecustomize")
del req["env"]
sys.argv = [pipeline.cli.__file__.replace("__init__", "__main__"), *req["argv"]]
sys.exit(pipeline.cli.main(req["argv"]))
"""


class _Zygote:
    """One zygote interpreter (started with ``env``) and the children it forked."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _ZYGOTE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            cwd=ROOT,
            # Ctrl-C as from a terminal: Python installs its KeyboardInterrupt handler only
            # where SIGINT is not ignored, and the children inherit the zygote's
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        self.cond = threading.Condition()
        self.started: dict[int, int] = {}  # request id -> pid
        self.exited: dict[int, int] = {}  # pid -> exit code (Popen's: -N for signal N)
        self.dead = False
        self.adds: dict[str, str] | None = None  # what its import set in its environment
        self.next_id = 0
        threading.Thread(target=self._read, daemon=True, name="krr-zygote").start()

    def _read(self) -> None:
        import json

        for line in self.proc.stdout:
            kind, *rest = line.split(b" ", 1)
            with self.cond:
                if kind == b"E":
                    self.adds = json.loads(rest[0])
                    self.cond.notify_all()
                    continue
                a, b = rest[0].split()
                if kind == b"S":
                    self.started[int(a)] = int(b)
                else:
                    self.exited[int(a)] = int(b)
                self.cond.notify_all()
        with self.cond:
            self.dead = True
            self.cond.notify_all()

    def import_env(self) -> frozenset | None:
        """What a child forked from here reads only at start (see :func:`_import_env`),
        counting what the zygote's import of ``pipeline.cli`` set where it was unset (a new
        interpreter's import sets it too: the same whether or not the caller had imported
        the pipeline when it took its environment); None once the zygote is gone."""
        with self.cond:
            while self.adds is None and not self.dead:
                self.cond.wait(1)
            return None if self.dead else _import_env({**self.adds, **self.env})

    def spawn(self, req: dict[str, Any]) -> int:
        import json

        with self.cond:
            rid = req["id"] = self.next_id
            self.next_id += 1
            self.proc.stdin.write((json.dumps(req) + "\n").encode())
            self.proc.stdin.flush()
            while rid not in self.started:
                if self.dead or not self.cond.wait(60):
                    raise RuntimeError("the krr zygote process did not fork")
            return self.started[rid]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


_ZYGOTES: list[_Zygote] = []
_LOCK = threading.Lock()


def _import_env(env: Mapping[str, str]) -> frozenset:
    """The part of ``env`` a process reads only when it starts (PYTHONPATH without the
    fault injection directory in front)."""
    out = {k: v for k, v in env.items() if not k.startswith(_PER_CHILD)}
    pp = out.get("PYTHONPATH")
    if pp is not None and pp.split(os.pathsep)[0] == str(FAULTINJECT):
        out["PYTHONPATH"] = pp.split(os.pathsep, 1)[1] if os.pathsep in pp else ""
        if not out["PYTHONPATH"]:
            del out["PYTHONPATH"]
    return frozenset(out.items())


def _zygote(env: Mapping[str, str]) -> _Zygote:
    with _LOCK:
        for z in _ZYGOTES:
            mine = z.import_env()
            if mine is not None and _import_env({**z.adds, **env}) == mine:
                return z
        z = _Zygote(dict(_import_env(env)))
        _ZYGOTES.append(z)
        return z


def prestart(env: Mapping[str, str] | None = None) -> None:
    """Start (in the background) the zygote a ``krr`` child with ``env`` (default: this
    process's environment, as :func:`child_env` gives it) will be forked from: its
    imports overlap the caller's work."""
    _zygote(child_env() if env is None else dict(env))


@atexit.register
def _close_all() -> None:
    for z in list(_ZYGOTES):
        z.close()


class KrrProcess:
    """A forked ``krr`` child, with the part of :class:`subprocess.Popen`'s interface the
    tests use (``pid``, ``returncode``, ``poll``, ``wait``, ``communicate``,
    ``send_signal``, ``kill``, ``terminate``). Its stdout and stderr go to files, read by
    :meth:`communicate` (text)."""

    def __init__(
        self,
        argv: list[str],
        env: Mapping[str, str],
        cwd: str | os.PathLike | None = None,
        start_new_session: bool = False,
    ) -> None:
        self.args = ["krr", *argv]
        self._tmp = tempfile.TemporaryDirectory(prefix="krr-child-")
        self._out = Path(self._tmp.name) / "stdout"
        self._err = Path(self._tmp.name) / "stderr"
        pp = env.get("PYTHONPATH", "")
        inject = pp.split(os.pathsep)[0] == str(FAULTINJECT)
        self._z = _zygote(env)
        self.pid = self._z.spawn(
            {
                "argv": list(argv),
                "env": dict(env),
                "cwd": str(cwd if cwd is not None else os.getcwd()),
                "stdout": str(self._out),
                "stderr": str(self._err),
                "inject": str(FAULTINJECT / "sitecustomize.py") if inject else "",
                "new_session": bool(start_new_session),
            }
        )

    @property
    def returncode(self) -> int | None:
        with self._z.cond:
            return self._z.exited.get(self.pid)

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._z.cond:
            while self.pid not in self._z.exited:
                if self._z.dead:
                    raise RuntimeError("the krr zygote process exited")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise subprocess.TimeoutExpired(self.args, timeout)
                self._z.cond.wait(0.5 if left is None else min(left, 0.5))
            return self._z.exited[self.pid]

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        self.wait(timeout)
        return (
            self._out.read_text(errors="replace"),
            self._err.read_text(errors="replace"),
        )

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:  # (not reaped: the pid is still this child's)
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


def child_env(
    env: Mapping[str, str | None] | None = None,
    kill: tuple[str, int] | None = None,
    inject: bool = False,
) -> dict[str, str]:
    """This process's environment as :class:`conftest.KrrRunner` gives its child: no
    ``KRR_KILL*`` variable unless asked for, ``env`` added (None: removed), and
    ``tests/faultinject`` first on PYTHONPATH for ``kill``/``inject``."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("KRR_KILL")}
    for k, v in (env or {}).items():
        if v is None:
            full.pop(k, None)
        else:
            full[k] = v
    if kill is not None or inject:
        full["PYTHONPATH"] = os.pathsep.join([str(FAULTINJECT), full.get("PYTHONPATH", "")])
    if kill is not None:
        full["KRR_KILL_MATCH"], full["KRR_KILL_AT"] = kill[0], str(kill[1])
    return full


class KrrForked:
    """:class:`conftest.KrrRunner`'s calls (``krr(*args, cwd, kill, env, inject, timeout,
    check)`` and ``.run(conf, run_dir, *overrides, json=False, **kw)``), each command in a
    child forked from a zygote (see the module docstring) instead of a new interpreter."""

    def __call__(
        self,
        *args: Any,
        cwd: str | os.PathLike | None = None,
        kill: tuple[str, int] | None = None,
        env: Mapping[str, str | None] | None = None,
        inject: bool = False,
        timeout: float = 300,
        check: bool = False,
    ) -> subprocess.CompletedProcess:
        argv = [str(a) for a in args]
        p = KrrProcess(argv, child_env(env, kill, inject), cwd)
        try:
            out, err = p.communicate(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            raise
        res = subprocess.CompletedProcess(p.args, p.returncode, out, err)
        if check:
            assert res.returncode == 0, res.stderr[-3000:]
        return res

    def run(
        self,
        conf: str | os.PathLike,
        run_dir: str | os.PathLike,
        *overrides: Any,
        json: bool = False,
        **kw: Any,
    ) -> subprocess.CompletedProcess:
        extra = ("--json",) if json else ()
        return self("run", conf, *overrides, "--run-dir", run_dir, *extra, **kw)


krr_forked = KrrForked()
