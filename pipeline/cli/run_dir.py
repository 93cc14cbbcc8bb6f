"""``krr status``, ``krr unlock`` and ``krr report``: the commands that read or
release a run directory (see :mod:`pipeline.cli`)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from pipeline.cli.errors import (
    EXIT_BAD_CONFIG,
    EXIT_BAD_INPUT,
    EXIT_LOCKED,
    EXIT_OK,
    EXIT_RUN_DIR,
    CliError,
)
from pipeline.errors import LockHeldError, ManifestError, RunDirUnusable
from pipeline.report import write_report
from pipeline.stages.lock import unlock
from pipeline.stages.status import format_configurations, run_status
from pipeline.storage.atomic import local_file_path
from pipeline.storage.location import is_url


def _run_dir_arg(run_dir: str) -> Path | str:
    """``--run-dir`` as a local Path, or as the URL string of an object store."""
    return run_dir.rstrip("/") if is_url(run_dir) else Path(local_file_path(run_dir))


def cmd_status(args) -> int:
    try:
        st = run_status(args.run_dir)
    except (ManifestError, RunDirUnusable) as e:
        raise CliError(str(e), EXIT_RUN_DIR) from None
    except FileNotFoundError as e:
        raise CliError(str(e), EXIT_BAD_INPUT) from None
    except ValueError as e:
        raise CliError(str(e), EXIT_BAD_INPUT) from None
    if args.json:
        print(json.dumps(st, indent=2, default=str))
        return EXIT_OK
    owner = st["lock_owner"]
    print(f"run dir: {st['run_dir']}" + (f"  (running: pid {owner.get('pid')})" if owner else ""))
    for s in st["stages"]:
        tiles = ", ".join(
            f"{t['array']} {t['done']}/{t['total'] if t['total'] is not None else '?'}"
            + (f" (iteration {t['iteration']})" if "iteration" in t else "")
            for t in s["tiles"]
        )
        line = f"  {s['stage']:<9} {s['state']:<8}"
        if "seconds" in s:
            line += f" {s['seconds']:8.1f} s"
        if tiles:
            line += f"  tiles: {tiles}"
        if s.get("error"):
            line += f"  error: {s['error'].splitlines()[-1]}"
        print(line)
    for line in format_configurations(st):
        print(line)
    print("complete" if st["complete"] else "incomplete: `krr run` with the same config resumes it")
    return EXIT_OK


def cmd_unlock(args) -> int:
    """Remove a lock left by a dead run; refuse while a live run holds it."""
    run_dir = _run_dir_arg(args.run_dir)
    if isinstance(run_dir, Path) and not run_dir.is_dir():
        what = "is a file, not a run directory" if run_dir.exists() else "does not exist"
        raise CliError(f"run directory {str(run_dir)!r} {what}", EXIT_BAD_INPUT)
    try:
        owner = unlock(run_dir)
    except LockHeldError as e:
        raise CliError(
            f"run directory {str(run_dir)!r} is locked by pid {e.owner.get('pid')} on "
            f"{e.owner.get('host')}, and a live process holds that lock: not unlocked. Wait "
            "for that run to finish, or stop it.",
            EXIT_LOCKED,
        ) from None
    except PermissionError as e:
        raise CliError(f"cannot remove the lock in {str(run_dir)!r}: {e}", EXIT_RUN_DIR) from None
    except RunDirUnusable as e:  # not a lock of ours: left alone
        raise CliError(str(e), EXIT_RUN_DIR) from None
    if owner is None:
        print(f"{run_dir}: not locked")
        return EXIT_OK
    started = owner.get("started")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)) if started else "?"
    print(
        f"{run_dir}: removed the lock of pid {owner.get('pid')} on {owner.get('host')} "
        f"(started {when}); no live process held it"
    )
    return EXIT_OK


def cmd_report(args) -> int:
    """Write the HTML report of a run directory (:func:`pipeline.report.write_report`)."""
    try:
        path = write_report(_run_dir_arg(args.run_dir), args.output)
    except (ManifestError, RunDirUnusable) as e:
        raise CliError(str(e), EXIT_RUN_DIR) from None
    except ImportError as e:  # matplotlib: a missing extra is a config error (exit 2)
        raise CliError(str(e), EXIT_BAD_CONFIG) from None
    except (FileNotFoundError, ValueError) as e:  # not a run dir; a file not ours at -o
        raise CliError(str(e), EXIT_BAD_INPUT) from None
    print(path)
    return EXIT_OK
