"""A full disk (ENOSPC) where the pipeline writes tiles (issue #44, class 3).

Before: a full disk during a direct (``O_DIRECT``) chunk write was reported as
``BufferError: cannot close exported pointers exist``: the aligned buffer's memoryview
was never released when ``os.write`` failed, so closing the buffer in the cleanup
raised and hid the ENOSPC. And ``krr run`` said "rerun the same command to resume"
(exit 4), which fails the same way until space is freed.

Now the error is :class:`~pipeline.errors.DiskFullError` (an OSError, errno ENOSPC)
naming the path, the bytes needed and the bytes free; the buffers are released (the
pool's buffer closes cleanly); no temporary file is left; ``krr run`` exits 7 (the
environment) and says to free space first.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from pipeline.errors import DiskFullError
from pipeline.storage import rawchunks
from pipeline.storage.arrays import open_tiled_array


def _layout(tmp_path: Path, n: int = 128, block: int = 64):
    arr = open_tiled_array(str(tmp_path / "s.zarr"), "K", (n, n), block, "float64", "fp")
    layout = rawchunks.chunk_layout(arr.store, "K")
    assert layout is not None
    return layout


@pytest.fixture
def full_disk(monkeypatch):
    """``os.write`` fails with ENOSPC for the chunk writer's temporary files; O_DIRECT is
    dropped from their open (so the direct path runs on any filesystem, tmpfs too)."""
    real_open, real_write = os.open, os.write
    fds: set[int] = set()

    def fake_open(path, flags, *a, **k):
        if str(path).endswith(".tmp"):
            fd = real_open(path, flags & ~getattr(os, "O_DIRECT", 0), *a, **k)
            fds.add(fd)
            return fd
        return real_open(path, flags, *a, **k)

    def fake_write(fd, data):
        if fd in fds:
            del data  # (as os.write, keep no view of the buffer in the traceback)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(os, "open", fake_open)
    monkeypatch.setattr(os, "write", fake_write)
    monkeypatch.setattr(rawchunks, "_NO_DIRECT", set())
    yield


@pytest.mark.skipif(not hasattr(os, "O_DIRECT"), reason="the direct writer needs O_DIRECT")
def test_enospc_in_the_direct_writer_names_path_needed_and_free(tmp_path, full_disk):
    layout = _layout(tmp_path)
    rawchunks.release_direct_buffers()
    # a buffer too small for the tile waits in the pool, so the failed write's buffer is
    # closed, not kept (the close that raised BufferError over the ENOSPC before)
    rawchunks._release_buffer(rawchunks._aligned_buffer(4096))
    tile = np.ones((64, 64))
    with pytest.raises(DiskFullError) as info:
        rawchunks.write_chunk(layout, (0, 0), tile, direct=True)
    e = info.value
    assert isinstance(e, OSError) and e.errno == errno.ENOSPC
    path = str(layout.path((0, 0)))
    assert e.path == path and e.needed == tile.nbytes
    free = shutil.disk_usage(os.path.dirname(path)).free
    assert e.free is not None and abs(e.free - free) < 64 << 20
    msg = str(e)
    assert path in msg and str(tile.nbytes) in msg and "free" in msg.lower()
    assert "Free space" in msg and "rerun" not in msg
    assert isinstance(e.__cause__, OSError) and e.__cause__.errno == errno.ENOSPC
    # no temporary file left, and every pooled buffer closes (no exported pointers)
    assert not [p for p in Path(path).parent.iterdir() if p.suffix == ".tmp"]
    rawchunks.release_direct_buffers()
    # the error pickles (a Dask worker process sends it back)
    import pickle

    back = pickle.loads(pickle.dumps(e))
    assert str(back) == msg and back.errno == errno.ENOSPC


def test_enospc_in_the_buffered_writer_is_the_same_error(tmp_path, monkeypatch):
    layout = _layout(tmp_path)

    class Full:
        def __init__(self, *a, **k):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

        def write(self, data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(rawchunks, "open", Full, raising=False)
    with pytest.raises(DiskFullError, match="needs 32768 bytes"):
        rawchunks.write_chunk(layout, (1, 1), np.zeros((64, 64)), direct=False)


@pytest.mark.skipif(not hasattr(os, "O_DIRECT"), reason="the Gram stage writes directly")
def test_krr_run_on_a_full_disk_exits_7_and_says_free_space(tmp_path, krr_run, krr_main, fault_run):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, 3))
    np.save(tmp_path / "X.npy", X)
    np.save(tmp_path / "y.npy", X[:, 0])
    conf = fault_run.config(tmp_path, "diskfull", tmp_path / "X.npy", tmp_path / "y.npy",
                            preprocess=None)  # fmt: skip
    run_dir = tmp_path / "run"
    env = {"KRR_ENOSPC_MATCH": "gram", "KRR_ENOSPC_AT": "2"}
    r = krr_run.run(conf, run_dir, json=True, inject=True, env=env, timeout=300)
    assert r.returncode == 7, (r.returncode, r.stderr[-3000:])
    err = r.stderr.split("krr run: error:", 1)[1]
    assert "no space left" in err and "bytes" in err and "gram" in err, err
    assert "rerun the same command to resume" not in err
    assert "BufferError" not in r.stderr
    obj = json.loads(r.stdout[r.stdout.index("{") :])
    assert obj["exit_code"] == 7 and obj["error"]["type"] == "run_dir_unusable"
    assert not (run_dir / ".lock").exists()
    assert not [p for p in run_dir.rglob("*.tmp")]
    # space freed: the same command resumes and finishes
    again = krr_main.run(conf, run_dir)
    assert again.returncode == 0, again.stderr[-3000:]


def test_a_tmpfs_that_fills_up(tmp_path):
    """A real full filesystem, where mounting one is allowed (root in a VM); else skipped."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root and mount(8)")
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], capture_output=True
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
    try:
        layout = _layout(mnt, n=512, block=256)  # 512 KiB a chunk: more than the disk
        with pytest.raises(DiskFullError) as info:
            rawchunks.write_chunk(layout, (0, 0), np.ones((256, 256)), direct=True)
        assert info.value.needed == 256 * 256 * 8 and info.value.free < 256 << 10
        assert not [p for p in mnt.rglob("*.tmp")]
        rawchunks.release_direct_buffers()
        # no file left open on it (the old cleanup raised before closing its descriptor)
        busy = subprocess.run(["umount", str(mnt)], capture_output=True)
        assert busy.returncode == 0, busy.stderr.decode()
    finally:
        if os.path.ismount(mnt):
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_the_full_disk_in_a_failures_chain_is_found_and_a_looping_chain_ends():
    """``disk_full_in`` (the exit 7 and the free-space hint of ``krr run``) walks the
    cause chain with :func:`pipeline.errors.caused_by`. Its own walk before stopped only
    after 20 full-disk errors, so a chain that loops without one never ended."""
    import threading

    from pipeline.cli.errors import disk_full_in

    plain = OSError(errno.ENOSPC, "No space left on device")
    named = DiskFullError("/x/K/c/0/0", 1 << 20, 10)
    middle = ValueError("while writing")
    top = RuntimeError("stage 'gram' failed")
    top.__cause__, plain.__cause__, middle.__cause__ = plain, middle, named
    assert disk_full_in(top) is named  # the one that names the path and the bytes, first
    middle.__cause__ = OSError(errno.EACCES, "Permission denied")
    assert disk_full_in(top) is plain
    assert disk_full_in(RuntimeError("x")) is None and disk_full_in(None) is None
    a, b = ValueError("a"), OSError(errno.EACCES, "denied")  # each the other's context
    a.__context__, b.__context__ = b, a
    found: list = []
    walk = threading.Thread(target=lambda: found.append(disk_full_in(a)), daemon=True)
    walk.start()
    walk.join(10)
    assert found == [None], "the walk of a looping chain did not end"


class _FullFile:
    """A file object whose every write fails as a full disk does (ENOSPC)."""

    def __init__(self, *a, **k):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False

    def write(self, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _assert_names_path_and_bytes(e: DiskFullError, path: str, needed: int | None) -> None:
    assert isinstance(e, OSError) and e.errno == errno.ENOSPC
    assert e.path == path and e.needed == needed
    assert e.free is not None  # measured on the filesystem of the path
    msg = str(e)
    assert path in msg and "free" in msg and "Free space" in msg and "rerun" not in msg
    if needed is not None:
        assert f"needs {needed} bytes" in msg
    assert isinstance(e.__cause__, OSError) and e.__cause__.errno == errno.ENOSPC
    assert not [p for p in Path(path).parent.rglob("*.tmp")]  # no temporary file left


def test_enospc_writing_a_marker_the_manifest_or_a_npy_result_names_path_and_bytes(
    tmp_path, monkeypatch
):
    """Before, only the raw chunk writer named the path and the bytes: a full disk met
    writing a completion marker, the manifest or a ``.npy`` result (all through
    ``atomic_write``) gave the bare ``[Errno 28] No space left on device``."""
    from pipeline.stages.catalog import save_npy_atomic
    from pipeline.stages.manifest import Manifest
    from pipeline.storage import TileMarkers, atomic

    markers = TileMarkers(str(tmp_path / "s.zarr"), "K", "fp")
    (tmp_path / "run").mkdir()
    manifest = Manifest(run_dir=tmp_path / "run")
    monkeypatch.setattr(atomic, "open", _FullFile, raising=False)

    with pytest.raises(DiskFullError) as info:
        markers.mark((0, 1), crc32c=7)
    _assert_names_path_and_bytes(info.value, markers._path((0, 1)), info.value.needed)
    assert info.value.needed > 0
    with pytest.raises(DiskFullError) as info:
        manifest.save()
    _assert_names_path_and_bytes(info.value, str(manifest.path), info.value.needed)
    arr = np.arange(100.0)
    with pytest.raises(DiskFullError) as info:
        save_npy_atomic(tmp_path / "alpha.npy", arr)
    _assert_names_path_and_bytes(info.value, str(tmp_path / "alpha.npy"), arr.nbytes + 128)


def test_enospc_in_a_zarr_chunk_write_names_the_array_and_bytes(tmp_path, monkeypatch):
    """Arrays the raw chunk writer does not handle (compressed ones, or when its layout
    is not recognised) are written by Zarr; its ENOSPC now names the array and bytes."""
    from zarr.storage import _local

    from pipeline.storage import arrays

    arr = open_tiled_array(str(tmp_path / "s.zarr"), "K", (128, 128), 64, "float64", "fp")
    monkeypatch.setattr(arrays, "chunk_layout", lambda *a, **k: None)

    def full(*a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(_local, "_put", full)
    tile = np.ones((64, 64))
    for write in (arr.write_tile, arr.store_tile):
        with pytest.raises(DiskFullError) as info:
            write(1, 0, tile)
        _assert_names_path_and_bytes(info.value, f"{tmp_path / 's.zarr'}/K", tile.nbytes)
    assert arr.markers.record((1, 0)) is None  # never marked


def test_enospc_writing_predictions_names_the_file_and_bytes(tmp_path, monkeypatch):
    from pipeline.storage.predictions import write_predictions

    def full(f, y, *a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(np, "save", full)
    y = np.zeros(1000)
    out = tmp_path / "p.npy"
    with pytest.raises(DiskFullError) as info:
        write_predictions(out, y, "npy")
    _assert_names_path_and_bytes(info.value, str(out), y.nbytes + 128)
    assert not out.exists()
