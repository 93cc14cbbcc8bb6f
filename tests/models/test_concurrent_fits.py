"""Fits that share one store, started together, in separate processes.

Issue #44: two ``KernelRidge(store=same)`` fits with the same data and alpha, started
together, failed about one time in four: the array creation was check-then-create,
and the error's hint told the user to delete a directory a live fit was writing. The
fit's directory is now held under an OS lock while the fit runs: the second identical
fit waits, then finds the first one's completed tiles. Different fits have different
directories and never wait for each other.

On an object store (``KernelRidge(store="s3://...")``) there is no ``flock``: the fit
directory is held under a lease (``.fit-lock``, the run lock's lease protocol,
:mod:`pipeline.storage.lease`), tested against moto's S3 server on loopback. Before,
object-store fits were not locked at all: a fit whose directory another live fit held
ran straight into it.

The two fitting processes are started once for the module and given one fit after
another (:class:`Fitter`): each pair of fits begins at the same instant once both
processes have said they are ready, not after a fixed head start for their imports.
"""

from __future__ import annotations

import json
import os
import queue
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from _s3server import make_bucket, moto_server, s3_env  # noqa: E402

#: a fitting process: imports the pipeline once, says "ready", then fits each job read
#: from stdin (a JSON line: store, alpha, block, out, start) once the clock reaches ``start``, and
#: answers one JSON line: the fit's store directory, or the traceback
SCRIPT = textwrap.dedent(
    """
    import json, logging, os, sys, time, traceback
    import numpy as np
    from pipeline import KernelRidge

    logging.basicConfig(level=logging.INFO)  # on stderr (a log file): "waiting for it"
    rng = np.random.default_rng(0)
    X = rng.normal(size=(256, 4))
    y = np.sin(X[:, 0]) + 0.1 * rng.normal(size=256)
    print("ready", flush=True)
    for line in sys.stdin:
        job = json.loads(line)
        os.environ.update(job["env"])
        while time.time() < job["start"]:  # both processes begin the fit at the same instant
            time.sleep(0.001)
        try:
            est = KernelRidge(alpha=job["alpha"], kernel="rbf", gamma=0.3,
                              block_size=job["block"], solver="cholesky",
                              store=job["store"]).fit(X, y)
            np.save(job["out"], est.dual_coef_)
            answer = {"store": est.fit_info_["store"]}
        except BaseException:
            answer = {"error": traceback.format_exc()}
        print(json.dumps(answer), flush=True)
    """
)


class Fitter:
    """A fitting process (:data:`SCRIPT`) kept for many fits: a fit pays for its own
    process's imports once, not per fit, and two fitters told the same ``start`` begin
    together without a fixed head start for the imports (each has said "ready")."""

    def __init__(self, script: Path, log: Path) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        self.log = log
        with open(log, "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=err, text=True, env=env,
            )  # fmt: skip
        self.answers: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def ready(self) -> Fitter:
        """Wait for the process's "ready" (its imports done); started without waiting,
        the two fitters import side by side."""
        assert self._answer(300) == "ready", self.log_tail()
        return self

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.answers.put(line.strip())
        self.answers.put("")  # the process ended

    def _answer(self, timeout: float) -> str:
        try:
            return self.answers.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no answer in {timeout} s:\n{self.log_tail()}") from None

    def log_tail(self) -> str:
        return self.log.read_text()[-3000:]

    def log_size(self) -> int:
        return self.log.stat().st_size

    def log_text(self, start: int = 0) -> str:
        """The log from byte ``start`` on."""
        with open(self.log, "rb") as f:
            f.seek(start)
            return f.read().decode(errors="replace")

    def send(
        self, store: Path | str, out: Path, alpha: float, start: float = 0.0, block: int = 32
    ) -> None:
        """Start a fit of ``alpha`` with tiles of ``block`` rows on ``store``
        (``dual_coef_`` saved to ``out``) at ``start`` (``time.time()``; 0: now)."""
        job = {"store": str(store), "out": str(out), "alpha": alpha, "start": start}
        job["block"] = block
        job["env"] = {k: v for k, v in os.environ.items() if k.startswith("AWS_")}
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()

    def pending(self) -> bool:
        """The fit sent last has not answered yet (nor has the process ended)."""
        return self.answers.empty()

    def wait(self, timeout: float = 300) -> str:
        """The fit directory of the fit sent last (its fit failing fails the test)."""
        line = self._answer(timeout)
        assert line, f"the fitting process ended:\n{self.log_tail()}"
        answer = json.loads(line)
        assert "store" in answer, answer["error"][-3000:]
        return answer["store"]

    def close(self) -> None:
        if not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _together(a: Fitter, b: Fitter, store, out_a: Path, out_b: Path, alpha_a, alpha_b, block=32):
    """Start a fit in each process at the same instant; their fit directories."""
    start = time.time() + 0.25  # both have read their job by then, even on a busy machine
    a.send(store, out_a, alpha_a, start, block)
    b.send(store, out_b, alpha_b, start, block)
    return a.wait(), b.wait()


@pytest.fixture(scope="module")
def fitters(tmp_path_factory):
    """Two fitting processes, shared by this module's tests (each test its own stores)."""
    d = tmp_path_factory.mktemp("fitters")
    script = d / "fit.py"
    script.write_text(SCRIPT)
    pair = []
    try:
        for name in "ab":
            pair.append(Fitter(script, d / f"{name}.log"))
        for f in pair:
            f.ready()
        yield pair
    finally:
        for f in pair:  # both told to end, then each waited for
            f.proc.stdin.close()
        for f in pair:
            f.close()


@pytest.mark.parametrize("repeat", range(8))
def test_two_identical_fits_started_together_both_succeed(tmp_path, repeat, fitters):
    a, b = fitters
    store = tmp_path / "store"
    dir_a, dir_b = _together(a, b, store, tmp_path / "a.npy", tmp_path / "b.npy", 0.1, 0.1)
    assert dir_a == dir_b  # the same fit: the same directory, shared
    np.testing.assert_array_equal(np.load(tmp_path / "a.npy"), np.load(tmp_path / "b.npy"))


def test_two_different_fits_on_one_store_do_not_interfere(tmp_path, fitters):
    a, b = fitters
    store = tmp_path / "store"
    dir_a, dir_b = _together(a, b, store, tmp_path / "a.npy", tmp_path / "b.npy", 0.1, 1.0)
    assert dir_a != dir_b
    # each equals the same fit run alone
    for alpha, got in ((0.1, "a.npy"), (1.0, "b.npy")):
        a.send(tmp_path / f"alone-{alpha}", tmp_path / "alone.npy", alpha)
        a.wait()
        np.testing.assert_allclose(
            np.load(tmp_path / got), np.load(tmp_path / "alone.npy"), rtol=1e-12, atol=1e-14
        )


BUCKET = "krr-fit-lease"
#: the S3 fits' tiles: 2 row blocks (3 Gram tiles), each a few requests to moto
S3_BLOCK = 128


@pytest.fixture(scope="module")
def s3():
    pytest.importorskip("s3fs")
    with moto_server() as env, s3_env(env):
        make_bucket(BUCKET)
        yield env


def test_an_s3_fit_waits_for_the_fit_holding_its_directory(tmp_path, s3, fitters):
    """A fit on ``s3://`` whose fit directory another live fit holds waits for it (its
    lease ``.fit-lock``), then reuses its tiles: the same α. The holder here is a lease
    record of a live process on another host, written as another fit's would be;
    old code ignored it and fitted at once."""
    import s3fs

    first, second = fitters
    store = f"s3://{BUCKET}/est"
    first.send(store, tmp_path / "a.npy", 0.1, block=S3_BLOCK)
    fit_dir = first.wait()
    assert fit_dir.startswith(store + "/fit-")
    fs = s3fs.S3FileSystem()
    lease_key = fit_dir[len("s3://") :] + "/.fit-lock"
    assert not fs.exists(lease_key)  # released when the fit ended
    holder = {
        "pid": 1, "host": socket.gethostname() + "-elsewhere", "started": time.time(),
        "expires": time.time() + 600, "token": "another-fit", "kind": "lease",
    }  # fmt: skip
    fs.pipe_file(lease_key, json.dumps(holder).encode())
    logged = second.log_size()  # its log lines of this fit come after
    second.send(store, tmp_path / "b.npy", 0.1, block=S3_BLOCK)
    deadline = time.time() + 240
    while "waiting for it" not in second.log_text(logged):
        assert second.pending(), "the fit ran without waiting:\n" + second.log_tail()
        assert time.time() < deadline, second.log_tail()
        time.sleep(0.2)
    time.sleep(1.5)  # past the next poll of the lease (FIT_LEASE_POLL, 1 s)
    assert second.pending()  # still waiting for the holder
    fs.rm(lease_key)  # the holder ends
    assert second.wait(300) == fit_dir
    np.testing.assert_array_equal(np.load(tmp_path / "a.npy"), np.load(tmp_path / "b.npy"))
    fs.invalidate_cache()
    assert not fs.exists(lease_key)


def test_two_identical_s3_fits_started_together_both_succeed(tmp_path, s3, fitters):
    a, b = fitters
    store = f"s3://{BUCKET}/together"
    dir_a, dir_b = _together(
        a, b, store, tmp_path / "a.npy", tmp_path / "b.npy", 0.1, 0.1, block=S3_BLOCK
    )
    assert dir_a == dir_b
    np.testing.assert_array_equal(np.load(tmp_path / "a.npy"), np.load(tmp_path / "b.npy"))
