"""Object storage as a store: every store on an S3-compatible server (moto) on loopback.

A fit and ``krr run`` with every store on ``s3://``, bitwise equal to a local run;
nothing written locally; a kill and resume; a corrupted object found and
recomputed; save/load of a model; clear errors for bad stores; the lease lock.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from _s3server import make_bucket, moto_server, s3_env

BUCKET = "krr-test"

CONFIG = """
name: s3
data: {{source: npy, path: {x}, y_path: {y}}}
split: {{test_fraction: 0.25, seed: 0}}
preprocess: {{standardize: true, standardize_y: true}}
kernel: {{name: rbf, params: {{gamma: 0.2}}}}
lambda: 0.01
solver: {{method: cholesky}}
block_size: 64
predict: {{input: {xn}}}
evaluate: {{baseline: none}}
cluster: {{n_workers: 1, processes: false, memory_limit: 2GiB}}
{extra}
"""


@pytest.fixture(scope="module")
def s3():
    with moto_server() as env, s3_env(env):
        make_bucket(BUCKET)
        yield env


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("s3data")
    # 225 training rows in tiles of 64: a 4x4 tile grid, 10 Gram tiles (the fewest the
    # lost-chunks test needs), each tile a few objects on the store; 100 new rows: two row
    # blocks to predict, the last one ragged (each predicted tile costs requests too)
    X, y = _data(300, 5)
    np.save(d / "X.npy", X)
    np.save(d / "y.npy", y)
    np.save(d / "Xn.npy", np.random.default_rng(1).normal(size=(100, 5)))
    return d


def _data(n=300, d=4, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    y = np.sin(X[:, 0]) + 0.1 * rng.normal(size=n)
    return X, y


def _config(data: Path, dest: Path, extra: str = "") -> Path:
    p = dest / "conf.yaml"
    p.write_text(CONFIG.format(x=data / "X.npy", y=data / "y.npy", xn=data / "Xn.npy", extra=extra))
    return p


def _results(run_dir: str) -> dict[str, np.ndarray]:
    """α from the model artifact and every prediction array (local path or URL)."""
    import zarr

    from pipeline.models.artifact import load_artifact
    from pipeline.stages.manifest import Manifest
    from pipeline.storage.location import Location

    m = Manifest.load(run_dir)  # the latest configuration's results/<key>/{model,predict}
    art = load_artifact(f"{m.stage_dir('model')}/model")
    out = {"alpha": np.asarray(art.dual_coef)}
    loc = Location(str(m.stage_dir("predict")))
    for name in loc.list():
        if name.endswith(".zarr"):
            group = zarr.open_group(f"{m.stage_dir('predict')}/{name}", mode="r")
            for arr_name, arr in group.arrays():
                out[f"{name}/{arr_name}"] = arr[...]
    return out


def _assert_same(got, want):
    assert got.keys() == want.keys()
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)


@pytest.fixture(scope="module")
def local_reference(data, tmp_path_factory, krr_main):
    d = tmp_path_factory.mktemp("s3ref")
    r = krr_main("run", str(_config(data, d)), "--run-dir", str(d / "run"), cwd=d)
    assert r.returncode == 0, r.stderr[-3000:]
    return _results(str(d / "run"))


@pytest.fixture(scope="module")
def gram_done(s3, data, tmp_path_factory, krr_main):
    """A run directory on the store with ingest and the Gram stored and recorded complete
    (``--until gram``), made once: a test that starts from there copies it to its own
    prefix (:func:`_copy_of_gram_done`) instead of recomputing both stages on the store."""
    d = tmp_path_factory.mktemp("s3gram")
    url = f"s3://{BUCKET}/gram-done"
    r = krr_main("run", str(_config(data, d)), "--run-dir", url, "--until", "gram", cwd=d)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "ran: ingest, gram;" in r.stdout, r.stdout
    return url


def _copy_of_gram_done(gram_done: str, name: str) -> str:
    """``s3://BUCKET/name``: a copy, object by object on the store, of :func:`gram_done`'s
    run directory (its manifest names its outputs relative to the run, ``@run/...``)."""
    fs = _fs()
    src = gram_done.removeprefix("s3://")
    fs.copy(f"{src}/", f"{BUCKET}/{name}/", recursive=True)
    fs.invalidate_cache()
    assert len(fs.find(f"{BUCKET}/{name}")) == len(fs.find(src))
    assert not fs.exists(f"{BUCKET}/{name}/.lock")
    return f"s3://{BUCKET}/{name}"


@contextlib.contextmanager
def _own_s3_clients():
    """New S3 clients inside, made from this call's environment and options only: s3fs's
    cached instances are dropped on the way in and out, and the ``s3`` defaults a run
    registers in fsspec (``storage.options``) are cleared inside and put back after. So a
    command run in this process with another ``AWS_ENDPOINT_URL`` (or none) reaches the
    store it names, as a new process would, and leaves no client to later tests."""
    import fsspec.config
    import s3fs

    saved = fsspec.config.conf.pop("s3", None)
    s3fs.S3FileSystem.clear_instance_cache()
    try:
        yield
    finally:
        fsspec.config.conf.pop("s3", None)
        if saved is not None:
            fsspec.config.conf["s3"] = saved
        s3fs.S3FileSystem.clear_instance_cache()


def _fs():
    import s3fs

    fs = s3fs.S3FileSystem()
    fs.invalidate_cache()
    return fs


def test_estimator_fit_on_s3_equals_local_fit_bitwise_and_saves_to_s3(s3, tmp_path):
    import pipeline
    from pipeline import KernelRidge

    X, y = _data(150)  # tiles of 64: a 3x3 grid, the last row and column ragged
    kw = dict(kernel="rbf", gamma=0.3, alpha=0.1, solver="cholesky", block_size=64)
    local = KernelRidge(**kw, store=str(tmp_path / "local")).fit(X, y)
    remote = KernelRidge(**kw, store=f"s3://{BUCKET}/est").fit(X, y)
    np.testing.assert_array_equal(np.asarray(remote.dual_coef_), np.asarray(local.dual_coef_))
    np.testing.assert_array_equal(remote.predict(X[:50]), local.predict(X[:50]))
    assert _fs().find(f"{BUCKET}/est"), "nothing was written to the object store"
    # save/load of the model on the object store
    remote.save(f"s3://{BUCKET}/models/m1")
    assert _fs().find(f"{BUCKET}/models/m1")
    back = pipeline.load(f"s3://{BUCKET}/models/m1")
    np.testing.assert_array_equal(back.predict(X[:50]), local.predict(X[:50]))
    assert not (Path.cwd() / "s3:").exists()


@pytest.mark.slow
def test_krr_run_on_s3_writes_nothing_locally_and_equals_local_run(
    s3, data, tmp_path, local_reference, krr_main
):
    conf = _config(data, tmp_path)
    work = tmp_path / "cwd"
    work.mkdir()
    url = f"s3://{BUCKET}/cli"
    r = krr_main("run", str(conf), "--run-dir", url, "--json", cwd=work)
    assert r.returncode == 0, r.stderr[-3000:]
    assert list(work.iterdir()) == [], "krr run wrote to the local disk"
    out = json.loads(r.stdout)
    assert out["run_dir"] == url and out["model"].startswith(url + "/")
    keys = _fs().find(f"{BUCKET}/cli")
    for part in ("manifest.json", "latest.json", "ingest/", "gram/", "solve/factor.zarr/",
                 "model/model/"):  # fmt: skip
        assert any(part in k for k in keys), part
    assert not any(k.endswith(".lock") for k in keys), "the lease was not released"
    manifest = json.loads(_fs().cat_file(f"{BUCKET}/cli/manifest.json"))
    key = manifest["latest"]
    assert manifest["stages"]["model"]["outputs"]["path"] == f"@run/results/{key}/model/model"
    _assert_same(_results(url), local_reference)
    # a second run finds every stage complete
    again = krr_main("run", str(conf), "--run-dir", url, "--json", cwd=work)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads(again.stdout)["ran"] == []
    st = krr_main("status", url, cwd=work)
    assert st.returncode == 0 and "done" in st.stdout, st.stdout + st.stderr
    assert list(work.iterdir()) == []


@pytest.mark.slow
def test_kill_mid_factor_on_s3_then_resume_is_bitwise_identical(
    s3, data, tmp_path, local_reference, gram_done, krr_run, krr_main
):
    conf = _config(data, tmp_path)
    url = _copy_of_gram_done(gram_done, "killed")  # the factor is what the kill stops
    killed = krr_run("run", str(conf), "--run-dir", url, cwd=tmp_path, kill=("chol/", 5))
    assert killed.returncode == -signal.SIGKILL, (killed.returncode, killed.stderr[-3000:])
    # the dead run's lease is still there; the rerun on this host takes it over
    assert _fs().exists(f"{BUCKET}/killed/.lock")
    resumed = krr_main("run", str(conf), "--run-dir", url, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "took over" in resumed.stderr
    assert "[solve] resuming" in resumed.stderr
    _assert_same(_results(url), local_reference)


@pytest.mark.slow
def test_corrupted_object_is_detected_and_recomputed(
    s3, data, tmp_path, local_reference, gram_done, krr_main
):
    conf = _config(data, tmp_path)
    # the Gram stored and recorded complete (`--until gram`, copied); the solve that reads
    # it comes after the damage (a finished run at another λ, then λ back, did the same
    # with two more solves)
    url = _copy_of_gram_done(gram_done, "corrupt")
    fs = _fs()
    key = f"{BUCKET}/corrupt/gram/gram.zarr/gram/c/1/0"
    raw = bytearray(fs.cat_file(key))
    raw[100] ^= 0xFF  # one flipped byte in a stored Gram tile
    fs.pipe_file(key, bytes(raw))
    # the solve stage reads the corrupt tile
    r = krr_main("run", str(conf), "--run-dir", url, "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "corrupt tile (1, 0)" in r.stderr, r.stderr[-3000:]
    assert "gram" in json.loads(r.stdout)["ran"]
    _assert_same(_results(url), local_reference)


def test_many_lost_chunk_objects_recover_in_one_run(
    s3, data, tmp_path, local_reference, gram_done, krr_main
):
    """Issue #44: on an object store a lost chunk was found only by a read, one recovery
    at a time (at most three a run, then exit 4 "rerun to resume"), so a run directory
    missing many chunk objects (a partial copy of a bucket) took many runs. Now a
    resumed array lists its chunk objects and unmarks every lost tile in one pass, as
    on a local disk: one `krr run` recovers them all."""
    conf = _config(data, tmp_path)
    url = _copy_of_gram_done(gram_done, "lost")  # `--until gram`, copied
    fs = _fs()
    chunks = sorted(fs.find(f"{BUCKET}/lost/gram/gram.zarr/gram/c"))
    assert len(chunks) >= 10
    for key in chunks[::2]:  # more lost tiles than the three recoveries a run allows
        fs.rm(key)
    r = krr_main("run", str(conf), "--run-dir", url, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    # the first read finds one; the gram stage, resumed, unmarks all the others at once
    assert r.stderr.count("[recovery ") == 1, r.stderr[-3000:]
    n = len(chunks[::2]) - 1
    assert f"{n} marked tile(s) have no chunk object" in r.stderr, r.stderr[-3000:]
    _assert_same(_results(url), local_reference)


@pytest.mark.slow
def test_missing_bucket_is_refused_unless_config_creates_it(s3, data, tmp_path, krr_main):
    url = "s3://no-such-bucket-xyz/run"
    r = krr_main("run", str(_config(data, tmp_path)), "--run-dir", url, cwd=tmp_path)
    assert r.returncode == 7, r.stderr
    assert "bucket 'no-such-bucket-xyz' does not exist" in r.stderr
    assert "storage.create_bucket: true" in r.stderr
    assert not _fs().exists("no-such-bucket-xyz")
    conf = _config(data, tmp_path, extra="storage: {create_bucket: true}")
    r = krr_main("run", str(conf), "--run-dir", url, "--until", "ingest", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert _fs().exists("no-such-bucket-xyz/run/manifest.json")


def test_unreachable_endpoint_fails_before_work_starts(s3, data, tmp_path, krr_main):
    env = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_MAX_ATTEMPTS": "1"}
    t0 = time.perf_counter()
    with _own_s3_clients():  # in this process, clients of the endpoint that does not answer
        r = krr_main(
            "run",
            str(_config(data, tmp_path)),
            "--run-dir",
            f"s3://{BUCKET}/x",
            cwd=tmp_path,
            env=env,
        )
    assert r.returncode == 7, r.stderr
    assert "does not answer" in r.stderr and "AWS_ENDPOINT_URL" in r.stderr
    assert "[ingest]" not in r.stderr
    assert time.perf_counter() - t0 < 60


def _error(stderr: str) -> str:
    """The message after ``error:``, without the Python warnings :func:`krr_main` appends
    (an S3 client dropped from s3fs's cache may warn of its unclosed session whenever it is
    collected; a new process ignores ResourceWarning)."""
    return re.split(r"\n\S+\.py:\d+: \w*Warning: ", stderr.split("error:", 1)[1])[0].strip()


def test_validate_contacts_the_store_as_run_does(s3, data, tmp_path, krr_main):
    """``krr validate`` said "valid" for a config whose ``s3://`` run directory `krr run`
    refuses at once (issue #44: validate makes every check run makes before work). Now
    it makes the same bounded check: the same exit code (7) and message as ``krr run``
    for a store that does not answer and for a missing bucket, and creates nothing (a
    bucket ``storage.create_bucket`` would create passes)."""
    conf = str(_config(data, tmp_path))
    down = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_MAX_ATTEMPTS": "1"}
    for run_dir, env, want in (
        (f"s3://{BUCKET}/x", down, "does not answer"),
        ("s3://no-such-bucket-validate/x", None, "bucket 'no-such-bucket-validate' does not"),
    ):
        # another endpoint in the environment needs S3 clients of its own (s3fs caches
        # them); the missing bucket is checked with this process's clients
        own = _own_s3_clients() if env else contextlib.nullcontext()
        with own:
            t0 = time.perf_counter()
            v = krr_main("validate", conf, f"run_dir={run_dir}", cwd=tmp_path, env=env)
            assert time.perf_counter() - t0 < 60
            r = krr_main("run", conf, "--run-dir", run_dir, cwd=tmp_path, env=env)
        assert v.returncode == r.returncode == 7, (v.stdout, v.stderr)
        assert want in v.stderr and "valid" not in v.stdout
        msg = _error(v.stderr)
        assert msg == _error(r.stderr)
    v = krr_main(
        "validate", conf, "run_dir=s3://no-such-bucket-validate/x", "storage.create_bucket=true",
        cwd=tmp_path,
    )  # fmt: skip
    assert v.returncode == 0 and "is valid" in v.stdout, v.stderr
    assert not _fs().exists("no-such-bucket-validate")
    v = krr_main("validate", conf, f"run_dir=s3://{BUCKET}/x", cwd=tmp_path)
    assert v.returncode == 0 and "is valid" in v.stdout, v.stderr


@pytest.mark.slow
def test_storage_options_from_config_reach_the_store(s3, data, tmp_path, krr_main):
    # the endpoint only in the config's storage.options, not in the environment (nor in
    # a client or fsspec default left by an earlier run in this process)
    opts = json.dumps({"client_kwargs": {"endpoint_url": s3["AWS_ENDPOINT_URL"]}})
    conf = _config(data, tmp_path, extra=f"storage: {{options: {opts}}}")
    with _own_s3_clients():
        r = krr_main("run", conf, "--run-dir", f"s3://{BUCKET}/opts", "--until", "ingest",
                     cwd=tmp_path, env={"AWS_ENDPOINT_URL": None})  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    manifest = json.loads(_fs().cat_file(f"{BUCKET}/opts/manifest.json"))
    assert manifest["config"]["storage"]["options"] == "<not recorded>"


def test_scheme_without_filesystem_names_the_package(tmp_path):
    from pipeline.storage.location import Location, StoreUnreachable

    pytest.importorskip("fsspec")
    try:
        import gcsfs  # noqa: F401

        pytest.skip("gcsfs is installed")
    except ImportError:
        pass
    with pytest.raises(StoreUnreachable, match="pip install gcsfs"):
        Location("gs://bucket/run")


def test_whole_bucket_is_not_a_run_directory():
    from pipeline.stages.config import check_run_dir

    with pytest.raises(ValueError, match="whole bucket"):
        check_run_dir("s3://bucket")
    check_run_dir("s3://bucket/run")


def test_lease_lock_excludes_and_takes_over_dead_or_expired(s3):
    from pipeline.stages import LockHeldError, RunLock
    from pipeline.stages.lock import LeaseLock, lock_owner, unlock

    url = f"s3://{BUCKET}/leased"
    a = RunLock(url)
    assert isinstance(a, LeaseLock)
    a.acquire()
    try:
        with pytest.raises(LockHeldError):
            RunLock(url).acquire()
        assert lock_owner(url)["token"] == a.token
        with pytest.raises(LockHeldError):
            unlock(url)
    finally:
        a.release()
    assert lock_owner(url) is None and not _fs().exists(f"{BUCKET}/leased/.lock")
    # a lease of a process that no longer runs on this host is taken over
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()  # fmt: skip
    from pipeline.storage.tempfiles import process_namespace

    rec = {"pid": int(dead), "host": os.uname().nodename, "proc_start": 1.0,
           "pidns": "another-container:1", "expires": time.time() + 3600, "token": "dead"}  # fmt: skip
    # the same hostname in another PID namespace (a container with --network host): its
    # PID says nothing here, so its unexpired lease holds (session 25)
    _fs().pipe_file(f"{BUCKET}/leased/.lock", json.dumps(rec).encode())
    with pytest.raises(LockHeldError):
        RunLock(url).acquire()
    rec["pidns"] = process_namespace()
    _fs().pipe_file(f"{BUCKET}/leased/.lock", json.dumps(rec).encode())
    b = RunLock(url).acquire()
    assert b.took_over["token"] == "dead"
    b.release()
    # an expired lease of another host is taken over; a live one is not
    rec = {"pid": 1, "host": "elsewhere", "expires": time.time() + 3600, "token": "live"}
    _fs().pipe_file(f"{BUCKET}/leased/.lock", json.dumps(rec).encode())
    with pytest.raises(LockHeldError, match="elsewhere"):
        RunLock(url).acquire()
    rec["expires"] = time.time() - 1
    _fs().pipe_file(f"{BUCKET}/leased/.lock", json.dumps(rec).encode())
    c = RunLock(url).acquire()
    assert c.took_over["token"] == "live"
    c.release()


@pytest.mark.slow
def test_select_stage_report_goes_to_the_object_store(s3, data, tmp_path, gram_done, krr_main):
    conf = _config(data, tmp_path, extra="cv: {alphas: [0.01, 0.1], folds: 3}")
    work = tmp_path / "cwd"
    work.mkdir()
    url = _copy_of_gram_done(gram_done, "select")  # its ingest is the one select reads
    r = krr_main("run", str(conf), "--run-dir", url, "--until", "select", "--json", cwd=work)
    assert r.returncode == 0, r.stderr[-3000:]
    assert list(work.iterdir()) == [], "the select report was written to the local disk"
    keys = _fs().find(f"{BUCKET}/select/select")
    assert any(k.endswith("cv_results.csv") for k in keys), keys
    manifest = json.loads(_fs().cat_file(f"{BUCKET}/select/manifest.json"))
    report = manifest["stages"]["select"]["outputs"]["report"]
    assert report["table"] == "@run/select/cv_results.csv"


def test_estimator_storage_options_reach_the_store_and_are_not_saved(s3, monkeypatch):
    import fsspec.config
    import s3fs

    import pipeline
    from pipeline import KernelRidge

    saved = dict(fsspec.config.conf.get("s3", {}))
    # the endpoint only in storage_options: without them s3fs would go to AWS itself
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    s3fs.S3FileSystem.clear_instance_cache()
    try:
        X, y = _data(100, 3)  # tiles of 64: two row blocks, the last ragged
        opts = {"client_kwargs": {"endpoint_url": s3["AWS_ENDPOINT_URL"]}}
        est = KernelRidge(
            kernel="rbf", alpha=0.1, solver="cholesky", block_size=64,
            store=f"s3://{BUCKET}/opts-est", storage_options=opts,
        ).fit(X, y)  # fmt: skip
        est.save(f"s3://{BUCKET}/models/opts")
        back = pipeline.load(f"s3://{BUCKET}/models/opts")
        assert back.storage_options is None  # credentials are never saved
        np.testing.assert_array_equal(back.predict(X[:20]), est.predict(X[:20]))
        with pytest.raises(ValueError, match="storage_options need store to be a URL"):
            KernelRidge(solver="cholesky", storage_options=opts).fit(X, y)
    finally:
        fsspec.config.conf.pop("s3", None)
        if saved:
            fsspec.config.conf["s3"] = saved
        s3fs.S3FileSystem.clear_instance_cache()
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3["AWS_ENDPOINT_URL"])
    assert _fs().find(f"{BUCKET}/opts-est")


def _put(url: str, data: bytes = b"x") -> None:
    from pipeline.storage.location import filesystem_for

    fs, p = filesystem_for(url)
    fs.pipe_file(p, data)


def test_runner_ownership_rules_hold_on_an_object_store(s3):
    from pipeline.stages import RunDirConflict, Stage, run_stages

    def writer(stage_dir, inputs, value):
        assert isinstance(stage_dir, str) and stage_dir.startswith("s3://")
        _put(f"{stage_dir}/out-{value}.txt", str(value).encode())
        return {"file": f"{stage_dir}/out-{value}.txt"}

    stages = [Stage("a", writer), Stage("b", writer, after=("a",))]
    url = f"s3://{BUCKET}/owned"
    _put(f"{url}/b/foreign.txt")  # a stage prefix the manifest does not record
    with pytest.raises(RunDirConflict, match="never ran here"):
        run_stages(url, stages, {"a": {"value": 1}, "b": {"value": 1}}, identity="d1")
    _fs().rm(f"{BUCKET}/owned/b/foreign.txt")
    rep = run_stages(url, stages, {"a": {"value": 1}, "b": {"value": 1}}, identity="d1")
    assert rep.ran == ["b"] and rep.skipped_done == ["a"]  # "a" ran before the refusal
    assert rep.outputs["a"]["file"] == f"{url}/a/out-1.txt"
    manifest = json.loads(_fs().cat_file(f"{BUCKET}/owned/manifest.json"))
    assert manifest["stages"]["a"]["outputs"]["file"] == "@run/a/out-1.txt"
    # a changed parameter empties that stage's prefix (and reruns what follows)
    rep = run_stages(url, stages, {"a": {"value": 1}, "b": {"value": 2}}, identity="d1")
    assert rep.ran == ["b"] and rep.invalidated == ["b"]
    assert not _fs().exists(f"{BUCKET}/owned/b/out-1.txt")
    # other data: refused, then --force-new removes only what the runner owns
    _put(f"{url}/notes.txt")
    with pytest.raises(RunDirConflict, match="other data"):
        run_stages(url, stages, {"a": {"value": 1}, "b": {"value": 2}}, identity="d2")
    rep = run_stages(
        url, stages, {"a": {"value": 3}, "b": {"value": 3}}, identity="d2", force_new=True
    )
    assert rep.ran == ["a", "b"]
    fs = _fs()
    assert fs.exists(f"{BUCKET}/owned/notes.txt")  # not ours: kept
    assert not fs.exists(f"{BUCKET}/owned/a/out-1.txt")
    assert fs.exists(f"{BUCKET}/owned/a/out-3.txt")


def test_a_stalled_renewal_never_takes_back_a_lease_another_run_took_over(s3):
    # the renewal re-read the lease, then wrote it with a plain PUT: a run stalled between
    # the two took back the lease a newer run held, and the newer run was flagged lost
    from pipeline.stages.lock import LeaseLock
    from pipeline.storage.location import Location

    url = f"s3://{BUCKET}/stalled"
    a = LeaseLock(url, ttl=1.5).acquire()

    class Stalls:  # the second renewal's write (at ~1 s) waits until b took the lease over
        n = 0
        wrote = False  # the stalled write was sent (and refused, or not)

        def __init__(self, fs):
            self._fs = fs

        def __getattr__(self, k):
            return getattr(self._fs, k)

        def pipe_file(self, *args, **kw):
            Stalls.n += 1
            if Stalls.n == 2:
                took_over.wait(10.0)
                time.sleep(0.3)
                try:
                    return self._fs.pipe_file(*args, **kw)
                finally:
                    Stalls.wrote = True
            return self._fs.pipe_file(*args, **kw)

    took_over = threading.Event()
    a.loc.fs = Stalls(a.loc.fs)
    b = None
    try:
        time.sleep(2.6)  # a's lease has expired
        b = LeaseLock(url, ttl=3.0).acquire()
        took_over.set()
        assert b.took_over["token"] == a.token
        t_b = time.monotonic()
        # a's stalled write goes to the store 0.3 s after b took over; a's next renewal
        # (ttl/3 later) reads the lease; b's first renewal comes 1 s after b took over:
        # the check comes after all three
        while not (Stalls.wrote and a.lost) and time.monotonic() < t_b + 10.0:
            time.sleep(0.05)
        time.sleep(max(0.0, t_b + 1.5 - time.monotonic()))
        assert Stalls.wrote
        holder = json.loads(Location(url).read_bytes(".lock"))["token"]
        assert holder == b.token and a.lost and not b.lost
    finally:
        a._stop.set()
        if b is not None:
            b.release()


def test_a_whole_object_read_is_one_request_and_writes_ask_for_the_bucket_once(s3, monkeypatch):
    """pipeline.storage.s3: no size request (HEAD) before a whole-object read, and no
    bucket request before each write once the bucket is known; ranged and missing
    reads behave as s3fs's."""
    import s3fs

    from pipeline.storage.atomic import atomic_write
    from pipeline.storage.s3 import BoundedS3FileSystem

    fs = BoundedS3FileSystem(skip_instance_cache=True)
    base = f"{BUCKET}/requests"
    fs.pipe_file(f"{base}/a", b"0123456789" * 100)
    calls = []
    real = s3fs.S3FileSystem._call_s3

    async def counted(self, method, *args, **kwargs):
        calls.append(method if isinstance(method, str) else method.__name__)
        return await real(self, method, *args, **kwargs)

    monkeypatch.setattr(s3fs.S3FileSystem, "_call_s3", counted)
    assert fs.cat_file(f"{base}/a") == b"0123456789" * 100
    assert calls == ["get_object"]
    assert fs.cat_file(f"{base}/a", start=10, end=15) == b"01234"
    with pytest.raises(FileNotFoundError):
        fs.cat_file(f"{base}/missing")
    calls.clear()
    for k in range(3):
        atomic_write(f"{base}/m{k}", b"marker", fs=fs)
    assert calls.count("put_object") == 3 and len(calls) <= 4, calls  # one bucket check
    calls.clear()
    atomic_write(f"{base}/m3", b"marker", fs=fs)
    assert calls == ["put_object"]
    assert fs.cat_file(f"{base}/m3") == b"marker"


def test_new_instances_parse_botocores_data_files_once(s3, monkeypatch):
    """Every instance's session (one per thread, fsspec's cache) shares this process's
    botocore data loader: a second instance reads no endpoint or model file again, and
    still reaches the store."""
    from botocore.loaders import JSONFileLoader

    from pipeline.storage.s3 import BoundedS3FileSystem

    first = BoundedS3FileSystem(skip_instance_cache=True)
    first.pipe_file(f"{BUCKET}/loader/a", b"x")
    read = []
    real = JSONFileLoader.load_file

    def counted(self, file_path):
        read.append(file_path)
        return real(self, file_path)

    monkeypatch.setattr(JSONFileLoader, "load_file", counted)
    second = BoundedS3FileSystem(skip_instance_cache=True)
    assert second.cat_file(f"{BUCKET}/loader/a") == b"x"
    assert second.session is not first.session
    assert second.session.get_component("data_loader") is first.session.get_component("data_loader")
    assert read == [], read
    # a refresh makes the instance's own session anew, with the same loader
    old = second.session
    second.connect(refresh=True)
    assert second.session is not old
    assert second.session.get_component("data_loader") is first.session.get_component("data_loader")
    assert second.cat_file(f"{BUCKET}/loader/a") == b"x"
    assert read == [], read
    # a session given by the caller is theirs, untouched
    from aiobotocore.session import AioSession

    own = AioSession()
    third = BoundedS3FileSystem(skip_instance_cache=True, session=own)
    assert third.cat_file(f"{BUCKET}/loader/a") == b"x"
    assert third.session is own
    third.connect(refresh=True)
    assert third.session is own


def test_a_read_whose_body_stops_arriving_gives_up_within_the_cap(s3, monkeypatch):
    """The whole read (request and body) is one bounded operation: a body that never
    arrives ends within seconds once an interrupt capped the store's waits."""
    import asyncio

    import s3fs

    from pipeline.errors import StoreUnreachable
    from pipeline.storage.s3 import BoundedS3FileSystem
    from pipeline.storage.waits import cap_store_waits

    async def body_never_arrives(self, path, *args, **kwargs):
        await asyncio.sleep(3600)

    monkeypatch.setattr(s3fs.S3FileSystem, "_cat_file", body_never_arrives)
    fs = BoundedS3FileSystem(skip_instance_cache=True, operation_timeout=600)
    cap_store_waits(0.5)
    try:
        t0 = time.monotonic()
        with pytest.raises(StoreUnreachable, match="get_object") as e:
            fs.cat_file(f"{BUCKET}/requests/a")
        assert time.monotonic() - t0 < 5
        assert "within 0.5 s, the wait left after an interrupt" in str(e.value)
    finally:
        cap_store_waits(None)


def test_tile_reads_and_writes_reuse_the_opened_array_until_it_is_made_anew(s3, monkeypatch):
    """A tile's read or write on an object store asks for the array's metadata once per
    thread and filesystem instance; an array created anew at the same path (here with
    another codec) is opened anew, and a new s3fs instance opens it again."""
    import s3fs
    from zarr.codecs import ZstdCodec

    from pipeline.storage.arrays import open_tiled_array

    store = f"s3://{BUCKET}/opened"
    X = np.arange(48.0).reshape(12, 4)
    calls = []
    real = s3fs.S3FileSystem._call_s3

    async def counted(self, method, *args, **kwargs):
        if kwargs.get("Key", "").endswith("zarr.json"):
            calls.append(method if isinstance(method, str) else method.__name__)
        return await real(self, method, *args, **kwargs)

    monkeypatch.setattr(s3fs.S3FileSystem, "_call_s3", counted)
    for codec in (None, [ZstdCodec()]):
        a = open_tiled_array(store, "x", X.shape, 4, "float64", "fp", compressors=codec,
                             overwrite=True)  # fmt: skip
        for i in range(3):
            a.write_tile(i, 0, X[4 * i : 4 * i + 4])
        np.testing.assert_array_equal(a.zarr("r")[:], X)  # written in the array's codec
        calls.clear()
        for i in range(3):
            np.testing.assert_array_equal(a.read_tile(i, 0), X[4 * i : 4 * i + 4])
        assert calls.count("get_object") == 1, calls  # the first read opens; the rest reuse
        a.markers.clear()  # so that the next array is created anew (not reopened)
        s3fs.S3FileSystem.clear_instance_cache()  # a new instance: opened again
        calls.clear()
        np.testing.assert_array_equal(a.read_tile(0, 0, verify=False), X[:4])
        assert calls.count("get_object") == 1, calls
        _fs().rm(f"{BUCKET}/opened/x", recursive=True)


def test_done_lists_the_markers_afresh(s3):
    """``TileMarkers.done`` never answers from a listing s3fs cached: a marker written
    since through another filesystem instance (another thread's) counts."""
    import s3fs

    from pipeline.storage.markers import TileMarkers

    store = f"s3://{BUCKET}/fresh-listing"
    markers = TileMarkers(store, "x", "fp")
    markers.mark((0, 0))
    assert markers.done() == {(0, 0)}  # listed (and cached by this instance)
    other = TileMarkers(store, "x", "fp")
    other.fs = s3fs.S3FileSystem(skip_instance_cache=True)  # as a tile thread's instance
    other.mark((1, 0))
    assert markers.done() == {(0, 0), (1, 0)}
    other.fs.rm_file(other._path((0, 0)))
    assert markers.done() == {(1, 0)}
