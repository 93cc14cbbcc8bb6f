"""An object store that stops answering: bounded waits, exit 7, and a cleanup that
neither hangs nor replaces the real error.

Issue #44: an S3-compatible server paused mid-run (it accepts TCP, never replies) left
``krr run`` silent for more than 7 minutes; Ctrl-C did not end it (the lease release
and the run.log upload waited on the store too); ``krr status`` hung the same way; and
a store lost mid-run was reported as "internal error", exit 1, because the lease release
in a ``finally`` raised again. Here the loopback moto server is paused with SIGSTOP and
the timeouts are made small (``storage.options`` / ``FSSPEC_S3``) so each case takes
seconds.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import yaml
from _forkserver import FAULTINJECT, KrrProcess, prestart
from _s3server import SERVER_PIDS, make_bucket, moto_server, s3_env

BUCKET = "krr-timeouts"
#: small bounded waits: every store operation gives up within 3 s (a paused command waits
#: on a few operations in turn; each second here is seconds of every test below; 2 s left
#: too little slack for a slow but answering store on a loaded 2-core CI machine)
FAST = {"connect_timeout": 1, "read_timeout": 1, "retries": 2, "operation_timeout": 3}


@pytest.fixture(scope="module")
def s3():
    prestart()  # the krr children's zygote imports the pipeline beside this setup
    with moto_server() as env, s3_env(env):
        make_bucket(BUCKET)
        yield env


@pytest.fixture(scope="module")
def conf(tmp_path_factory, fault_run) -> Path:
    d = tmp_path_factory.mktemp("timeouts")
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 4))
    np.save(d / "X.npy", X)
    np.save(d / "y.npy", np.sin(X[:, 0]))
    # no split, no preprocessing, tiles of 32, the bounded waits
    return fault_run.config(d, "timeouts", d / "X.npy", d / "y.npy", split=None,
                            preprocess=None, block_size=32, storage={"options": FAST})  # fmt: skip


class paused:
    """SIGSTOP the moto server while inside; SIGCONT on the way out."""

    def __init__(self, env: dict[str, str]) -> None:
        self.pid = SERVER_PIDS[env["AWS_ENDPOINT_URL"]]

    def __enter__(self) -> paused:
        os.kill(self.pid, signal.SIGSTOP)
        return self

    def __exit__(self, *exc: object) -> None:
        os.kill(self.pid, signal.SIGCONT)


def _krr(*args: str, env: dict[str, str] | None = None) -> KrrProcess:
    """``krr ARGS`` in a process of its own (a hang to bound, a SIGINT, an exit code),
    forked from an interpreter that imported the pipeline once (``tests/_forkserver.py``):
    six commands start at once below, and six interpreters' imports on 2 cores took
    longer than the waits they measure. Its SIGINT is Python's KeyboardInterrupt, as in a
    terminal (the zygote is started with SIGINT's default action)."""
    full = {**os.environ, "FSSPEC_S3": json.dumps(FAST), **(env or {})}
    return KrrProcess(list(args), full)


def _finish(p: KrrProcess, limit: float) -> tuple[int, str, float]:
    t0 = time.perf_counter()
    try:
        _, err = p.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        p.kill()
        _, err = p.communicate()
        pytest.fail(f"no exit within {limit} s: {err[-2000:]}")
    return p.returncode, err, time.perf_counter() - t0


def _assert_no_answer(rc: int, err: str) -> None:
    assert rc == 7, err[-3000:]
    assert "the object store does not answer" in err, err[-3000:]
    assert "internal error" not in err, err[-3000:]


def _objects(prefix: str) -> list[str]:
    import s3fs

    # one client per server: fsspec's instance cache, keyed by the endpoint (a new client
    # per listing cost about 0.1 s of CPU: polled, a core while the setup waited)
    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": os.environ["AWS_ENDPOINT_URL"]})
    fs.invalidate_cache()  # what is on the server now
    try:
        return fs.find(f"{BUCKET}/{prefix}")
    except FileNotFoundError:
        return []


def test_run_against_a_paused_store_fails_before_work_with_exit_7(paused_commands):
    rc, err, took = paused_commands["run"]  # a new run directory: paused from the start
    _assert_no_answer(rc, err)
    assert "[ingest]" not in err
    assert took < 60, took


def test_run_paused_mid_work_exits_7_within_a_bounded_time(paused_commands):
    rc, err, took = paused_commands["mid"]  # at work (its gram written) when the store paused
    _assert_no_answer(rc, err)
    assert took < 60, took  # from the pause


@pytest.fixture(scope="module")
def done_url(s3, conf, krr_main) -> str:
    """A run directory with the ingest stage done, made in this process (the store answers:
    no hang to bound, so no child process to start); the ``s3`` defaults the run registers
    in fsspec (FAST) are put back so they do not reach later tests here or elsewhere."""
    import fsspec.config

    url = f"s3://{BUCKET}/done"
    before = fsspec.config.conf.get("s3")
    try:
        r = krr_main("run", str(conf), "--run-dir", url, "--until", "ingest")
    finally:
        fsspec.config.conf.pop("s3", None)
        if before is not None:
            fsspec.config.conf["s3"] = before
        fsspec.get_filesystem_class("s3").clear_instance_cache()
    assert r.returncode == 0, r.stderr[-3000:]
    assert _objects("done"), "the setup run wrote nothing"
    return url


def _run_to_exit(argv: list[str], limit: float) -> tuple[int, str, float]:
    """Start ``krr ARGV`` and wait for it (within ``limit`` s): (exit code, stderr, seconds
    from its start to its exit)."""
    t0 = time.perf_counter()
    rc, err, _ = _finish(_krr(*argv), limit)
    return rc, err, time.perf_counter() - t0


def _wait_for(p: KrrProcess, prefix: str, part: str, deadline: float) -> None:
    """Poll the store until the running ``p`` has written an object under ``prefix`` whose
    key holds ``part`` (``/ingest/``: that stage is writing)."""
    while not any(part in o for o in _objects(prefix)):
        assert p.poll() is None, p.communicate()[1][-3000:]
        assert time.time() < deadline, f"the run never reached {part.strip('/')}"
        time.sleep(0.2)  # (each stage lasts seconds: MARK_DELAY)


def _exit(p: KrrProcess, limit: float, since: float) -> tuple[int, str, float]:
    """Wait for ``p`` (within ``limit`` s): (exit code, stderr, seconds from ``since``)."""
    rc, err, _ = _finish(p, limit)
    return rc, err, time.perf_counter() - since


#: the keys of the factor's tiles (the solve stage's ``factor.zarr``, array ``chol``)
FACTOR_TILES = "/factor.zarr/chol/c/"

#: the Ctrl-C test's long waits: only Ctrl-C can end its run quickly
SLOW = {**FAST, "read_timeout": 600, "operation_timeout": 600}


#: rows of the two runs that work while the store pauses (``mid``, ``ctrl_c``): 6 tiles of
#: 32 a side, 21 Gram tiles and 21 factor tiles
SLOW_ROWS = 192

#: seconds those two runs wait before each tile's completion marker (``KRR_MARK_DELAY``,
#: ``tests/faultinject``): each of their Gram and factor stages lasts seconds, so the pause
#: finds both at work. (Without it, 480 rows' 120 tiles of each stage took about 10 s of
#: writes, most of this file's CPU in the store's requests; the 36 tiles of 300 rows were
#: written within 3 s, sometimes before the pause came.)
MARK_DELAY = 0.25


def _rows_conf(conf: Path, dest: Path, name: str, options: dict) -> Path:
    """``conf`` with the store ``options``, on :data:`SLOW_ROWS` rows of its own."""
    out = dest / f"{name}.yaml"
    cfg = yaml.safe_load(conf.read_text())
    assert cfg["storage"]["options"] == FAST  # (a text replace of FAST's JSON matched nothing)
    cfg["storage"]["options"] = options
    if not (dest / "X_slow.npy").exists():
        rng = np.random.default_rng(1)
        X = rng.normal(size=(SLOW_ROWS, 4))
        np.save(dest / "X_slow.npy", X)
        np.save(dest / "y_slow.npy", np.sin(X[:, 0]))
    cfg["data"].update(path=str(dest / "X_slow.npy"), y_path=str(dest / "y_slow.npy"))
    out.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return out


def _ctrl_c(p: KrrProcess) -> tuple[int, str, float]:
    """A second into the pause, Ctrl-C ``p``: (exit code, stderr, seconds from SIGINT)."""
    time.sleep(1.0)
    p.send_signal(signal.SIGINT)
    return _finish(p, 60)


@pytest.fixture(scope="module")
def paused_commands(s3, conf, done_url, tmp_path_factory) -> dict[str, tuple[int, str, float]]:
    """The commands of this file that wait out the store's bounded waits, under one pause:
    their waits overlap instead of adding up (one after the other, the file spent a minute
    more waiting). ``{name: (exit code, stderr, seconds)}``.

    Before the pause, ``krr run`` (``mid``) starts against the answering store and runs
    until its gram stage is writing; beside it, ``krr run`` with the long :data:`SLOW`
    waits (``ctrl_c``) runs until its factor is writing tiles (:data:`FACTOR_TILES`: the
    threads executor's writer thread then has writes under way, which the unwinding
    Ctrl-C waits for). Both work on the same :data:`SLOW_ROWS` rows, so ``mid`` is still
    at work when ``ctrl_c`` reaches its factor (on 300 rows of its own, under load it once
    finished every stage first and exited 0). Then the store is paused,
    and ``krr status``, ``unlock`` and ``report`` of the finished run, ``krr predict`` from
    a model on the store and ``krr run`` into a new run directory (``run``) start, and a
    second into the pause ``ctrl_c`` gets SIGINT. Each figure is measured as its test was
    alone: ``mid``'s from the pause, ``ctrl_c``'s from the SIGINT, the others' from their
    start. (The commands are forked from a zygote that imported the pipeline: no starting
    interpreters beside the Ctrl-C, whose bound is the run's own time.)
    """
    from pipeline import KernelRidge

    d = tmp_path_factory.mktemp("predict")
    mid_conf = _rows_conf(conf, d, "mid", FAST)
    slow_conf = _rows_conf(conf, d, "slow", SLOW)
    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 3))
    model = f"s3://{BUCKET}/models/m"
    KernelRidge(alpha=0.1, kernel="rbf", gamma=0.5).fit(X, np.sin(X[:, 0])).save(model)
    np.save(d / "new.npy", X[:5])
    argvs = {c: [c, done_url] for c in ("status", "unlock", "report")}
    argvs["predict"] = ["predict", model, str(d / "new.npy"), str(d / "out.npy")]
    argvs["run"] = ["run", str(conf), "--run-dir", f"s3://{BUCKET}/before"]

    slowed = {  # the tiles' markers come MARK_DELAY apart
        "PYTHONPATH": os.pathsep.join([str(FAULTINJECT), os.environ.get("PYTHONPATH", "")]),
        "KRR_MARK_DELAY": str(MARK_DELAY),
    }
    mid = _krr("run", str(mid_conf), "--run-dir", f"s3://{BUCKET}/mid", env=slowed)
    # long waits here: only Ctrl-C can end this run quickly
    ctrl_c = _krr("run", str(slow_conf), "--run-dir", f"s3://{BUCKET}/interrupted",
                  env={**slowed, "FSSPEC_S3": json.dumps(SLOW)})  # fmt: skip
    try:
        _wait_for(mid, "mid", "/gram/", time.time() + 120)  # the gram stage is writing
        # the factor's tiles are being written: its writer thread waits on the store
        _wait_for(ctrl_c, "interrupted", FACTOR_TILES, time.time() + 120)
        assert mid.poll() is None, "the mid run finished before the pause"
        with paused(s3), ThreadPoolExecutor(len(argvs) + 2) as pool:
            mid_f = pool.submit(_exit, mid, 120, time.perf_counter())
            ctrl_c_f = pool.submit(_ctrl_c, ctrl_c)
            futures = {name: pool.submit(_run_to_exit, argv, 120) for name, argv in argvs.items()}
            out = {name: f.result() for name, f in futures.items()}
            out["mid"] = mid_f.result()
            out["ctrl_c"] = ctrl_c_f.result()
    finally:
        for p in (mid, ctrl_c):
            if p.poll() is None:
                p.kill()
                p.communicate()
    return out


@pytest.mark.parametrize("command", ["status", "unlock", "report"])
def test_read_commands_against_a_paused_store_exit_7(paused_commands, command):
    rc, err, took = paused_commands[command]
    _assert_no_answer(rc, err)
    assert took < 60, took


def test_ctrl_c_ends_a_run_waiting_on_a_paused_store_within_seconds(paused_commands):
    # Ctrl-C as from a terminal: the run has Python's KeyboardInterrupt handler, whatever
    # this test process inherited (an ignored SIGINT is inherited across exec, and Python
    # then installs none: the run would never see the signal); see _krr
    rc, err, took = paused_commands["ctrl_c"]  # a second into the pause (_ctrl_c)
    assert rc == 130, err[-3000:]
    assert took < 20, took
    # stopped in the factor, whose queued tile writes gave up once interrupted (they had
    # waited out the 600 s, the run's own waits, under the unwinding Ctrl-C)
    assert "[solve] interrupted" in err, err[-3000:]
    assert "the wait left after an interrupt" in err, err[-3000:]


def test_estimator_fit_against_a_paused_store_raises_store_unreachable(s3):
    from pipeline import KernelRidge
    from pipeline.errors import StoreUnreachable

    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 3))
    est = KernelRidge(
        alpha=0.1, kernel="rbf", gamma=0.5, block_size=32, store=f"s3://{BUCKET}/est",
        storage_options=FAST,
    )  # fmt: skip
    with paused(s3):
        t0 = time.perf_counter()
        with pytest.raises(StoreUnreachable, match="the object store does not answer"):
            est.fit(X, np.sin(X[:, 0]))
    assert time.perf_counter() - t0 < 60


def test_a_failing_lease_release_does_not_replace_the_real_error(s3, monkeypatch):
    import pipeline.stages.lock as lock
    from pipeline.errors import StoreUnreachable

    lease = lock.LeaseLock(f"s3://{BUCKET}/lease-release", ttl=30).acquire()

    import pipeline.storage.lease as lease_module

    def dead(_loc, *_name):
        raise StoreUnreachable("the object store does not answer (test)")

    monkeypatch.setattr(lease_module, "_read", dead)  # (the lease's home)
    with pytest.raises(KeyError, match="the real error"):
        try:
            raise KeyError("the real error")
        finally:
            lease.release()


def test_lease_release_against_a_paused_store_returns_within_seconds(s3):
    from pipeline.stages.lock import LeaseLock
    from pipeline.storage.lease import RELEASE_WAIT
    from pipeline.storage.location import set_storage_options

    set_storage_options("s3", {**FAST, "operation_timeout": 600, "read_timeout": 600})
    try:
        lease = LeaseLock(f"s3://{BUCKET}/lease-paused", ttl=30).acquire()
        with paused(s3):
            t0 = time.perf_counter()
            lease.release()
            took = time.perf_counter() - t0
    finally:
        import fsspec.config

        fsspec.config.conf.pop("s3", None)
    assert took < RELEASE_WAIT * 2 + 1, took


def test_timeout_options_are_validated():
    pytest.importorskip("s3fs")
    from pipeline.storage.location import filesystem_for

    with pytest.raises(ValueError, match="read_timeout"):
        filesystem_for("s3://b/x", {"read_timeout": -1, "skip_instance_cache": True})


def test_predict_from_a_model_on_a_paused_store_exits_7(paused_commands):
    rc, err, took = paused_commands["predict"]  # the model saved on the store, then paused
    _assert_no_answer(rc, err)
    assert took < 60, took
