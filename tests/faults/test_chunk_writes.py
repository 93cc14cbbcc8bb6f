"""Atomic chunk writes, damaged or unrecorded Gram tiles, and leftovers of killed writers.

* a chunk write that fails before its rename leaves the old chunk intact;
* a marked tile is never rewritten in place with other bytes;
* a truncated Gram chunk, and a deleted Gram marker, are recovered by a rerun of
  ``krr run`` (exit 0, the α of a clean run), where both used to fail on every
  rerun;
* temporary files of writes a SIGKILL interrupted, and temporary stores of a
  killed fit, are removed when the store is next opened.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from pipeline.storage import CorruptTileError, TileRewriteError, open_tiled_array, rawchunks
from pipeline.storage import tempfiles as tf

BLOCK = 100


def _tmp_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.name.endswith((".tmp", ".partial")))


def test_chunk_write_is_atomic(tmp_path, monkeypatch):
    a = open_tiled_array(str(tmp_path / "s"), "a", (200, 200), BLOCK, "f8", "fp")
    old = np.full((BLOCK, BLOCK), 1.5)
    a.write_tile(1, 0, old)
    a.markers.unmark((1, 0))  # the recovery path: unmark, then write again

    def fail(src, dst):
        raise OSError(28, "No space left on device (injected before the rename)")

    monkeypatch.setattr(rawchunks.os, "replace", fail)
    with pytest.raises(OSError, match="injected"):
        a.write_tile(1, 0, np.full((BLOCK, BLOCK), -7.0))
    monkeypatch.undo()
    np.testing.assert_array_equal(a.read_tile(1, 0, verify=False), old)  # never half-new
    assert not a.markers.is_done((1, 0))
    assert _tmp_files(tmp_path) == []  # the failed write cleaned up after itself


def test_marked_tile_never_rewritten_and_torn_chunk_is_corrupt(tmp_path, chunk_file):
    a = open_tiled_array(str(tmp_path / "s"), "a", (200, 200), BLOCK, "f8", "fp")
    tile = np.arange(BLOCK * BLOCK, dtype="f8").reshape(BLOCK, BLOCK)
    a.write_tile(1, 1, tile)
    rec = a.markers.record((1, 1))
    a.write_tile(1, 1, tile)  # the same bytes again (a re-executed task): nothing happens
    assert a.markers.record((1, 1)) == rec
    with pytest.raises(TileRewriteError, match=r"tile \(1, 1\).*unmark"):
        a.write_tile(1, 1, tile + 1)
    np.testing.assert_array_equal(a.read_tile(1, 1), tile)
    chunk = chunk_file(a.store, "a", 1, 1)
    for size in (100, chunk.stat().st_size + 8):  # truncated, then oversized
        chunk.write_bytes(b"\0" * size)
        with pytest.raises(CorruptTileError, match=f"holds {size} bytes") as e:
            a.read_tile(1, 1, verify=False)
        assert e.value.tile == (1, 1) and e.value.found is None
        assert e.value.expected == rec["crc32c"]


# ---------------------------------------------------------------------------
# `krr run` recovers a truncated chunk and a deleted marker


@pytest.fixture(scope="module")
def krr(tmp_path_factory, krr_main, fault_run):
    """The config, and the α of a clean run with lambda=0.02."""
    d = tmp_path_factory.mktemp("chunks")
    conf = fault_run(d, "chunks", n=600, d=5, seed=1)
    ref = krr_main.run(conf, d / "clean", "lambda=0.02", json=True)
    assert ref.returncode == 0, ref.stderr[-3000:]
    return conf, np.load(_solve_dir(d / "clean") / "alpha.npy")


def _solve_dir(run_dir: Path) -> Path:
    """The latest configuration's solve directory (``results/<key>/solve``)."""
    from pipeline.stages.manifest import Manifest

    return Manifest.load(run_dir).stage_dir("solve")


def _damage_and_rerun(krr, krr_main, run: Path, damage) -> subprocess.CompletedProcess:
    conf, want = krr
    first = krr_main.run(conf, run, json=True)
    assert first.returncode == 0, first.stderr[-3000:]
    damage(run / "gram" / "gram.zarr")
    # a new lambda keeps the Gram, so the solve reads the damaged Gram
    second = krr_main.run(conf, run, "lambda=0.02", json=True)
    assert second.returncode == 0, second.stderr[-3000:]
    report = json.loads(second.stdout)
    assert "gram" in report["ran"] and "solve" in report["ran"]
    np.testing.assert_array_equal(np.load(_solve_dir(run) / "alpha.npy"), want)
    return second


@pytest.mark.slow
def test_krr_run_recovers_a_truncated_gram_chunk(krr, tmp_path, krr_main, chunk_file):
    def truncate(store: Path) -> None:
        chunk = chunk_file(store, "gram", 3, 1)
        chunk.write_bytes(chunk.read_bytes()[:1000])

    r = _damage_and_rerun(krr, krr_main, tmp_path / "run", truncate)
    assert "corrupt tile (3, 1) of array 'gram'" in r.stderr and "holds 1000 bytes" in r.stderr
    assert "rerunning from stage 'gram'" in r.stderr


@pytest.mark.slow
def test_krr_run_recovers_a_deleted_gram_marker(krr, tmp_path, krr_main):
    def unmark(store: Path) -> None:
        (store / "_markers" / "gram" / "4.2").unlink()

    r = _damage_and_rerun(krr, krr_main, tmp_path / "run", unmark)
    assert "array 'gram'" in r.stderr and "incomplete" in r.stderr, r.stderr[-3000:]
    assert "[4, 2]" in r.stderr and "rerunning from stage 'gram'" in r.stderr
    assert (tmp_path / "run" / "gram" / "gram.zarr" / "_markers" / "gram" / "4.2").is_file()


# ---------------------------------------------------------------------------
# leftovers of a SIGKILL

KILLED = """
import os, signal, sys
import numpy as np
from pipeline.fit import _store_dir
from pipeline.storage import open_tiled_array

a = open_tiled_array(sys.argv[1], "a", (200, 200), 100, "f8", "fp")
a.write_tile(0, 0, np.ones((100, 100)))
ctx = _store_dir(None)
print(ctx.__enter__(), flush=True)  # a temporary store, then killed while it is in use
real_replace, target = os.replace, "/_markers/" if sys.argv[2] == "marker" else "/c/"

def replace(src, dst):  # killed between a temporary file and its rename
    if target in str(dst):
        os.kill(os.getpid(), signal.SIGKILL)
    return real_replace(src, dst)

os.replace = replace
a.write_tile(1, 0, np.ones((100, 100)))
"""


@pytest.mark.slow
def test_leftovers_of_a_killed_writer_are_swept(tmp_path, monkeypatch):
    monkeypatch.setenv("KRR_TMPDIR", str(tmp_path / "krrtmp"))
    stores = []
    for how in ("chunk", "marker"):
        store = tmp_path / how
        p = subprocess.run([sys.executable, "-c", KILLED, str(store), how],
                           capture_output=True, text=True, timeout=120)  # fmt: skip
        assert p.returncode == -9, p.stderr[-2000:]
        stores.append(Path(p.stdout.strip()))
        assert len(_tmp_files(store)) == 1, sorted(store.rglob("*"))
    assert all(s.parent == tmp_path / "krrtmp" for s in stores), stores
    # the second process's temporary store swept the first one's (its process is dead)
    assert not stores[0].exists() and stores[1].is_dir()
    # a live writer's temporary file (another process, still running) is left alone
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        live = tmp_path / "chunk" / "a" / "c" / "0" / f"0.{sleeper.pid}-{'a' * 32}.tmp"
        live.write_bytes(b"half")
        # a later process (this one, started "after" the kill) reopens the stores
        monkeypatch.setattr(tf, "PROCESS_START", time.time() + 1)
        for how in ("chunk", "marker"):
            open_tiled_array(str(tmp_path / how), "a", (200, 200), BLOCK, "f8", "fp")
        assert _tmp_files(tmp_path / "marker") == []
        assert _tmp_files(tmp_path / "chunk") == [live]
        new = tf.make_temp_store()  # sweeps the temporary stores of dead processes
        assert not any(s.exists() for s in stores) and Path(new).is_dir()
        assert sorted(os.listdir(new)) == [tf.STORE_OWNER]  # its namespace, for sweeps
        shutil.rmtree(new)
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_temporary_store_of_another_pid_namespace_is_not_swept(tmp_path):
    # a container sharing this hostname and the temp root has its own PIDs: its live
    # store looked like a dead process's here and was deleted mid-fit (session 25)
    dead = 2**22 + 4321  # above Linux's default pid_max: no process here has it
    host = socket.gethostname()
    theirs = tmp_path / f"krr-store-{dead}@{host}-abc"
    ours = tmp_path / f"krr-store-{dead + 1}@{host}-def"
    legacy = tmp_path / f"krr-store-{dead + 2}@{host}-ghi"  # before the owner record
    for d, ns in ((theirs, "other-boot:1"), (ours, tf.process_namespace()), (legacy, None)):
        d.mkdir()
        if ns is not None:
            (d / tf.STORE_OWNER).write_text(ns)
    removed = tf.sweep_temp_stores(tmp_path)
    assert sorted(removed) == sorted([str(ours), str(legacy)]) and theirs.is_dir()


DIES_WRITING = """
import os, signal, sys
from pipeline.storage.tempfiles import tmp_path_for

open(tmp_path_for(sys.argv[1]), "wb").close()  # a write begun, then the process killed
os.kill(os.getpid(), signal.SIGKILL)
"""

SWEEPS = """
import sys
from pipeline.storage.tempfiles import sweep_tmp_files

print(len(sweep_tmp_files(sys.argv[1])))
"""


def test_a_run_started_right_after_a_kill_sweeps_what_the_killed_writer_left(tmp_path):
    """The dead writer's process id decides, not the file's age.

    ``krr run`` killed and at once started again (a retry loop, the fault tests)
    left an empty ``.tmp`` chunk that the rerun never swept: the file looked no
    older than the new process (file times and start times are coarser than the
    milliseconds between the two). Three kill-then-sweep pairs; each sweep must
    remove the one file.
    """
    chunk_dir = tmp_path / "a" / "c" / "0"
    chunk_dir.mkdir(parents=True)
    for attempt in range(3):
        died = subprocess.run([sys.executable, "-c", DIES_WRITING, str(chunk_dir / "0")],
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert died.returncode == -9, died.stderr[-2000:]
        assert len(_tmp_files(tmp_path)) == 1
        swept = subprocess.run([sys.executable, "-c", SWEEPS, str(tmp_path / "a")],
                               capture_output=True, text=True, timeout=120)  # fmt: skip
        assert swept.stdout.strip() == "1", (attempt, swept.stderr[-2000:])
        assert _tmp_files(tmp_path) == []


def test_this_process_keeps_its_own_temporary_files_and_drops_an_old_namesake(tmp_path):
    """Our pid in the name: ours (a thread's write in progress), unless the file is
    clearly older than this process (an earlier process that had the same pid)."""
    d = tmp_path / "c" / "0"
    d.mkdir(parents=True)
    mine, namesake = Path(tf.tmp_path_for(str(d / "0"))), Path(tf.tmp_path_for(str(d / "1")))
    mine.write_bytes(b"half")
    namesake.write_bytes(b"old")
    os.utime(namesake, (tf.PROCESS_START - 5, tf.PROCESS_START - 5))
    assert tf.sweep_tmp_files(tmp_path) == [str(namesake)]
    assert _tmp_files(tmp_path) == [mine]
