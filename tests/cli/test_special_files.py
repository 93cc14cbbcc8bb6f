"""Special files and ordinary I/O errors at the command line (issue #44, class 8).

Before: a FIFO in the run directory hung ``krr run`` for ever (``run.log`` opened for
append blocks until a reader comes); ``run.log`` was written through a symbolic link
to wherever it led; an empty ``.npy`` input was an internal error (exit 1,
``EOFError: No data left in file``) or a failed ingest stage (exit 4, "rerun the same
command to resume", which cannot help); ``krr predict`` into a directory that cannot
take a file computed every prediction first, then failed.

Now every file the pipeline opens in a run directory must be a regular file (a link to
a directory, e.g. a stage directory moved to another disk, is allowed), or the run is
refused with exit 7 before any work, as for ``.lock`` and ``latest.json``; an empty
``.npy`` is bad input (exit 3) naming the file; the prediction output's directory is
checked before any work (exit 7).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline import cli
from pipeline.cli.errors import EXIT_BAD_INPUT, EXIT_CODES, EXIT_RUN_DIR
from pipeline.errors import InputError
from pipeline.storage.inputs import as_row_blocks

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs POSIX FIFOs")

#: a hang is a failure, not a stuck test run
HANG = 120


@contextlib.contextmanager
def _no_wait_on(fifo: Path, after: float = HANG) -> Iterator[None]:
    """The timeout guard of an in-process command that must not wait on ``fifo``.

    If the body has not finished after ``after`` seconds, a thread opens the FIFO from
    both ends (non-blocking, then closes it), again every 0.1 s: whoever waits in an
    ``open`` of it, for reading or writing, is released (EOF, or a broken pipe), so a
    command that waits on it ends, and the test fails here, naming the FIFO. The
    commands run in this process (:func:`krr_main`), which saves a 3 s interpreter start
    per call; ``krr_run``'s ``timeout`` did this in a child process.
    """
    done, fired = threading.Event(), []

    def release() -> None:
        if done.wait(after):
            return
        fired.append(True)
        while not done.wait(0.1):
            for flags in (os.O_RDONLY | os.O_NONBLOCK, os.O_WRONLY | os.O_NONBLOCK):
                with contextlib.suppress(OSError):  # ENXIO: no reader waits
                    os.close(os.open(fifo, flags))

    guard = threading.Thread(target=release, daemon=True)
    guard.start()
    try:
        yield
    finally:
        done.set()
        guard.join()
    assert not fired, f"the command waited on the FIFO {fifo} for {after} s"


def _run_once(krr_main, conf: Path, run_dir: Path) -> None:
    r = krr_main.run(conf, run_dir, "--until", "ingest")
    assert r.returncode == 0, r.stderr[-3000:]


@pytest.mark.parametrize("where", ["run.log", "ingest/extra"])
def test_a_fifo_in_the_run_dir_is_refused_not_waited_on(
    small_data, write_config, tmp_path, krr_main, where
):
    conf = write_config(small_data)
    run_dir = tmp_path / "run"
    _run_once(krr_main, conf, run_dir)
    fifo = run_dir / where
    fifo.unlink(missing_ok=True)
    os.mkfifo(fifo)
    with _no_wait_on(fifo):
        r = krr_main.run(conf, run_dir)  # the old code blocked here for ever
    assert r.returncode == EXIT_RUN_DIR, r.stderr[-3000:]
    assert str(fifo) in r.stderr and "FIFO" in r.stderr, r.stderr[-3000:]
    assert "rerun" not in r.stderr.split("error:", 1)[1]
    assert fifo.exists() and not (run_dir / ".lock").exists()
    # krr validate refuses it too (it makes the checks krr run makes before work)
    with _no_wait_on(fifo):
        assert krr_main("validate", conf, f"run_dir={run_dir}").returncode == 7
    fifo.unlink()
    r = krr_main.run(conf, run_dir)
    assert r.returncode == 0, r.stderr[-3000:]


def test_run_log_through_a_symbolic_link_is_refused(small_data, write_config, tmp_path, capsys):
    conf = write_config(small_data)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    elsewhere = tmp_path / "someone_elses.log"
    elsewhere.write_text("keep me\n")
    (run_dir / "run.log").symlink_to(elsewhere)
    assert cli.main(["run", str(conf), "--run-dir", str(run_dir), "-q"]) == EXIT_RUN_DIR
    err = capsys.readouterr().err
    assert "run.log" in err and "symbolic link" in err, err
    assert elsewhere.read_text() == "keep me\n"
    assert not (run_dir / ".lock").exists() and not (run_dir / "manifest.json").exists()


def test_a_linked_stage_directory_is_still_allowed(small_data, write_config, tmp_path, krr_main):
    conf = write_config(small_data)
    run_dir = tmp_path / "run"
    _run_once(krr_main, conf, run_dir)
    moved = tmp_path / "bigdisk_ingest"
    (run_dir / "ingest").rename(moved)
    (run_dir / "ingest").symlink_to(moved)
    r = krr_main.run(conf, run_dir)
    assert r.returncode == 0, r.stderr[-3000:]


@pytest.mark.parametrize("key", ["data.path", "data.y_path"])
def test_an_empty_npy_input_is_bad_input_naming_the_file(
    small_data, write_config, tmp_path, key, capsys
):
    empty = tmp_path / "empty.npy"
    empty.write_bytes(b"")
    conf = write_config(small_data)
    for command in (
        ["run", str(conf), "--run-dir", str(tmp_path / "run")],
        ["validate", str(conf)],
    ):
        assert cli.main([*command, f"{key}={empty}", "-q"]) == EXIT_BAD_INPUT
        err = capsys.readouterr().err
        assert str(empty) in err and "empty (0 bytes)" in err and key in err, err
        assert "rerun" not in err and "internal error" not in err
    assert not (tmp_path / "run").exists()  # refused before any work


def test_predict_refuses_an_empty_input_and_an_unwritable_output_before_any_work(
    small_data, write_config, tmp_path, krr_main, capsys
):
    conf = write_config(small_data)
    run_dir = tmp_path / "run"
    r = krr_main.run(conf, run_dir)
    assert r.returncode == 0, r.stderr[-3000:]
    empty = tmp_path / "empty.npy"
    empty.write_bytes(b"")
    out = tmp_path / "p.npy"
    assert cli.main(["predict", str(run_dir), str(empty), str(out)]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert str(empty) in err and "empty (0 bytes)" in err and "internal error" not in err, err
    # a directory that cannot take a file (root ignores permission bits, so the parent
    # is a regular file here; the check creates a file there, as the write would)
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("a file")
    for bad in (blocker / "p.npy", blocker / "p.zarr"):
        code = cli.main(["predict", str(run_dir), str(small_data.x_new_path), str(bad)])
        cap = capsys.readouterr()
        assert code == EXIT_RUN_DIR, cap.err
        assert str(bad) in cap.err and str(blocker) in cap.err and "cannot be written" in cap.err
        assert "predicted" not in cap.out and "tile" not in cap.err  # no prediction computed
    # so does the predict stage of krr run, and krr validate, before any work
    bad = f"predict.output={blocker / 'p.npy'}"
    inp = f"predict.input={small_data.x_new_path}"
    for command in (["run", str(conf), "--run-dir", str(tmp_path / "r2")], ["validate", str(conf)]):
        assert cli.main([*command, inp, bad, "-q"]) == EXIT_RUN_DIR
        assert "cannot be written" in capsys.readouterr().err
    assert not (tmp_path / "r2").exists()
    assert EXIT_RUN_DIR in EXIT_CODES


@pytest.mark.parametrize("what", ["manifest.json", ".lock"])
@pytest.mark.parametrize("command", ["status", "report"])
def test_status_and_report_refuse_a_fifo_they_would_read(
    small_data, write_config, tmp_path, krr_main, what, command
):
    """``krr status`` read ``manifest.json`` (and the ``.lock``) of a run directory
    without checking what it is: a FIFO there held it for ever (a reader of a FIFO waits
    for a writer). Now both refuse it at once, with exit 7, as ``krr run`` does."""
    conf = write_config(small_data)
    run_dir = tmp_path / "run"
    _run_once(krr_main, conf, run_dir)
    fifo = run_dir / what
    fifo.unlink(missing_ok=True)
    os.mkfifo(fifo)
    extra = ["-o", str(tmp_path / "r.html")] if command == "report" else []
    with _no_wait_on(fifo, after=60):
        r = krr_main(command, run_dir, *extra)  # the old status blocked here
    assert r.returncode == EXIT_RUN_DIR, r.stderr[-3000:]
    assert str(fifo) in r.stderr and "FIFO" in r.stderr and "not a regular file" in r.stderr
    assert "rerun" not in r.stderr
    assert fifo.exists()  # never removed: not ours


@pytest.mark.parametrize("key", ["data.path", "data.y_path", "predict.input"])
def test_a_fifo_input_is_bad_input_before_any_work(
    small_data, write_config, tmp_path, krr_main, key
):
    """A data path that is a FIFO (``data.path: /dev/stdin``, a named pipe) passed the
    checks before work (it exists) and the ingest then waited on it for ever. Now
    ``krr run``, ``krr validate`` and ``krr predict`` refuse it at once, naming the key,
    the path and what it is (exit 3), and the Python readers raise InputError."""
    conf = write_config(small_data)
    fifo = tmp_path / "X.npy"
    os.mkfifo(fifo)
    run_dir = tmp_path / "run"
    extra = [f"predict.output={tmp_path / 'p.npy'}"] if key == "predict.input" else []
    for command in (
        ["run", conf, f"{key}={fifo}", *extra, "--run-dir", run_dir],
        ["validate", conf, f"{key}={fifo}", *extra],
    ):
        with _no_wait_on(fifo):
            r = krr_main(*command)  # the old run blocked in the ingest
        assert r.returncode == EXIT_BAD_INPUT, r.stderr[-3000:]
        assert key in r.stderr and str(fifo) in r.stderr and "FIFO" in r.stderr, r.stderr
        assert "rerun" not in r.stderr
    assert not run_dir.exists()  # refused before any work
    if key == "predict.input":
        krr_main.run(conf, run_dir, check=True)
        with _no_wait_on(fifo):
            r = krr_main("predict", run_dir, fifo, tmp_path / "p.npy")
        assert r.returncode == EXIT_BAD_INPUT, r.stderr[-3000:]
        assert str(fifo) in r.stderr and "FIFO" in r.stderr
        with pytest.raises(InputError, match="FIFO"):
            as_row_blocks(str(fifo), 64)
