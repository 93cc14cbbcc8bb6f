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
"""

from __future__ import annotations

import json
import os
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

SCRIPT = textwrap.dedent(
    """
    import sys
    import numpy as np
    from pipeline import KernelRidge

    store, out, alpha, hold = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
    rng = np.random.default_rng(0)
    X = rng.normal(size=(256, 4))
    y = np.sin(X[:, 0]) + 0.1 * rng.normal(size=256)
    start = float(sys.argv[5])
    import time
    while time.time() < start:  # both processes begin the fit at the same instant
        time.sleep(0.001)
    est = KernelRidge(alpha=alpha, kernel="rbf", gamma=0.3, block_size=32, solver="cholesky",
                      store=store).fit(X, y)
    np.save(out, est.dual_coef_)
    print(est.fit_info_["store"])
    """
)


def _start(script: Path, store: Path, out: Path, alpha: float, start: float) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.Popen(
        [sys.executable, str(script), str(store), str(out), str(alpha), "0", str(start)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _wait(p: subprocess.Popen) -> str:
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err[-3000:]
    return out.strip()


@pytest.mark.parametrize("repeat", range(8))
def test_two_identical_fits_started_together_both_succeed(tmp_path, repeat):
    script = tmp_path / "fit.py"
    script.write_text(SCRIPT)
    store = tmp_path / "store"
    start = time.time() + 4.0  # time for both interpreters to import the pipeline
    a = _start(script, store, tmp_path / "a.npy", 0.1, start)
    b = _start(script, store, tmp_path / "b.npy", 0.1, start)
    dir_a, dir_b = _wait(a), _wait(b)
    assert dir_a == dir_b  # the same fit: the same directory, shared
    np.testing.assert_array_equal(np.load(tmp_path / "a.npy"), np.load(tmp_path / "b.npy"))


def test_two_different_fits_on_one_store_do_not_interfere(tmp_path):
    script = tmp_path / "fit.py"
    script.write_text(SCRIPT)
    store = tmp_path / "store"
    start = time.time() + 4.0
    a = _start(script, store, tmp_path / "a.npy", 0.1, start)
    b = _start(script, store, tmp_path / "b.npy", 1.0, start)
    dir_a, dir_b = _wait(a), _wait(b)
    assert dir_a != dir_b
    # each equals the same fit run alone
    for alpha, got in ((0.1, "a.npy"), (1.0, "b.npy")):
        alone = tmp_path / f"alone-{alpha}"
        p = _start(script, alone, tmp_path / "alone.npy", alpha, 0.0)
        _wait(p)
        np.testing.assert_allclose(
            np.load(tmp_path / got), np.load(tmp_path / "alone.npy"), rtol=1e-12, atol=1e-14
        )


BUCKET = "krr-fit-lease"


@pytest.fixture(scope="module")
def s3():
    pytest.importorskip("s3fs")
    with moto_server() as env, s3_env(env):
        make_bucket(BUCKET)
        yield env


def test_an_s3_fit_waits_for_the_fit_holding_its_directory(tmp_path, s3):
    """A fit on ``s3://`` whose fit directory another live fit holds waits for it (its
    lease ``.fit-lock``), then reuses its tiles: the same α. The holder here is a lease
    record of a live process on another host, written as another fit's would be;
    old code ignored it and fitted at once."""
    import s3fs

    script = tmp_path / "fit.py"
    script.write_text("import logging\nlogging.basicConfig(level=logging.INFO)\n" + SCRIPT)
    store = f"s3://{BUCKET}/est"
    first = _start(script, store, tmp_path / "a.npy", 0.1, 0.0)  # type: ignore[arg-type]
    fit_dir = _wait(first).splitlines()[-1]
    assert fit_dir.startswith(store + "/fit-")
    fs = s3fs.S3FileSystem()
    lease_key = fit_dir[len("s3://") :] + "/.fit-lock"
    assert not fs.exists(lease_key)  # released when the fit ended
    holder = {
        "pid": 1, "host": socket.gethostname() + "-elsewhere", "started": time.time(),
        "expires": time.time() + 600, "token": "another-fit", "kind": "lease",
    }  # fmt: skip
    fs.pipe_file(lease_key, json.dumps(holder).encode())
    second = _start(script, store, tmp_path / "b.npy", 0.1, 0.0)  # type: ignore[arg-type]
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.extend(second.stderr), daemon=True)
    reader.start()
    deadline = time.time() + 240
    while not any("waiting for it" in line for line in err):
        assert second.poll() is None, "the fit ran without waiting:\n" + "".join(err)[-3000:]
        assert time.time() < deadline, "".join(err)[-3000:]
        time.sleep(0.2)
    time.sleep(3)
    assert second.poll() is None  # still waiting for the holder
    fs.rm(lease_key)  # the holder ends
    assert second.wait(300) == 0, "".join(err)[-3000:]
    reader.join(10)
    assert second.stdout.read().strip().splitlines()[-1] == fit_dir
    np.testing.assert_array_equal(np.load(tmp_path / "a.npy"), np.load(tmp_path / "b.npy"))
    fs.invalidate_cache()
    assert not fs.exists(lease_key)


def test_two_identical_s3_fits_started_together_both_succeed(tmp_path, s3):
    script = tmp_path / "fit.py"
    script.write_text(SCRIPT)
    store = f"s3://{BUCKET}/together"
    start = time.time() + 4.0
    a = _start(script, store, tmp_path / "a.npy", 0.1, start)  # type: ignore[arg-type]
    b = _start(script, store, tmp_path / "b.npy", 0.1, start)  # type: ignore[arg-type]
    assert _wait(a) == _wait(b)
    np.testing.assert_array_equal(np.load(tmp_path / "a.npy"), np.load(tmp_path / "b.npy"))
