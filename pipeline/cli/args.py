"""Argument handling of the ``krr`` command line: usage errors, ``key=value`` overrides
anywhere on the line, scheduler addresses, the ``--json`` error object and ``run.log``.

Kept apart from :mod:`pipeline.cli` (the parser and the commands) so each stays short.
"""

from __future__ import annotations

import argparse
import difflib
import json
import logging
import re
import sys
import threading
from pathlib import Path
from typing import Any

import pipeline.stages as stages
from pipeline.cli.errors import EXIT_CODES
from pipeline.errors import UsageError
from pipeline.storage.location import Location

__all__ = [
    "ERROR_TYPES",
    "KrrArgumentParser",
    "UsageError",
    "json_error",
    "parse_command_line",
    "run_log",
    "run_log_header",
    "stages_after",
]

#: the ``error.type`` of the ``--json`` error object, by exit code
ERROR_TYPES = {
    1: "internal_error",
    2: "bad_config",
    3: "bad_input",
    4: "stage_failed",
    5: "locked",
    6: "no_scheduler",
    7: "run_dir_unusable",
    130: "interrupted",
    143: "terminated",
}


class KrrArgumentParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors raise :class:`UsageError` instead of exiting, so
    ``main`` reports them like every other error (and as JSON with ``--json``)."""

    def error(self, message: str):  # type: ignore[override]
        raise UsageError(message, self)


# key or key.sub.sub, then '=': what pipeline.stages.config_overrides.parse_overrides accepts
_OVERRIDE = re.compile(r"^[A-Za-z_][\w-]*(\.[\w-]+)*=")


def _option_hint(parser: argparse.ArgumentParser, token: str) -> str:
    flag = token.split("=", 1)[0]
    options = [o for a in parser._actions for o in a.option_strings]
    close = difflib.get_close_matches(flag, options, n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


def parse_command_line(
    parser: argparse.ArgumentParser,
    subparsers: dict[str, argparse.ArgumentParser],
    argv: list[str] | None,
) -> argparse.Namespace:
    """Parse ``argv``; ``key=value`` overrides of ``run``/``validate`` may stand anywhere
    on the line (before, between or after the flags), in the order given.

    Raises
    ------
    UsageError
        An unknown option or a stray argument, named with the nearest valid option.
    """
    args, extra = parser.parse_known_args(argv)
    command = getattr(args, "command", None)
    sub = subparsers.get(command or "", parser)
    if command in ("run", "validate"):
        options = [t for t in extra if t.startswith("-")]
        if options:
            t = options[0]
            raise UsageError(f"unrecognized option {t!r}{_option_hint(sub, t)}", sub)
        # CONFIG is the first argument that is not key=value; overrides keep their order
        tokens = [args.config, *args.overrides, *extra]
        plain = [t for t in tokens if not _OVERRIDE.match(t)]
        config = plain[0] if plain else args.config
        stray = plain[1:]
        if stray:
            raise UsageError(
                f"unrecognized argument {stray[0]!r}: besides CONFIG ({config!r}), only "
                "key=value overrides (e.g. lambda=0.1 cluster.connect_timeout=3) and the "
                "options below are accepted",
                sub,
            )
        tokens.remove(config)
        args.config, args.overrides = config, tokens
        return args
    if not extra:
        return args
    t = extra[0]
    hint = _option_hint(sub, t) if t.startswith("-") else ""
    raise UsageError(f"unrecognized arguments: {' '.join(extra)}{hint}", sub)


def json_error(code: int, message: str, exception: str | None = None) -> None:
    """Print the ``--json`` error object on stdout."""
    err: dict[str, Any] = {"type": ERROR_TYPES.get(code, "error"), "message": message}
    if exception:
        err["exception"] = exception
    out = {"ok": False, "exit_code": code, "meaning": EXIT_CODES.get(code), "error": err}
    print(json.dumps(out, indent=2), file=sys.stdout)
    sys.stdout.flush()


class _Lines(logging.Handler):
    """Keeps the formatted lines in memory (for an object store, written at the end)."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


class run_log:
    """Context manager: timestamped log lines of a run, appended to ``RUN_DIR/run.log``.

    A local run directory gets each line as it is logged. An object-store run directory
    (``s3://``, where an object cannot be appended to) gets them when the run ends: the
    old ``run.log`` and the new lines are written back as one object through
    :class:`pipeline.storage.location.Location` (a run killed with SIGKILL leaves no lines
    there; its stderr has them).
    """

    #: seconds the upload of an object-store run.log (in cleanup) may take
    UPLOAD_WAIT = 5.0

    def __init__(self, run_dir: Path | str, level: int, header: str) -> None:
        self.run_dir, self.level, self.header = run_dir, level, header
        self.handler: logging.Handler | None = None

    def __enter__(self) -> run_log:
        if isinstance(self.run_dir, Path):
            self.run_dir.mkdir(parents=True, exist_ok=True)
            h: logging.Handler = logging.FileHandler(self.run_dir / "run.log", encoding="utf-8")
        else:
            h = _Lines()
        h.setFormatter(
            logging.Formatter(
                "%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%Y-%m-%dT%H:%M:%S"
            )
        )
        h.setLevel(self.level)
        logging.getLogger().addHandler(h)
        self.handler = h
        self.write(logging.INFO, self.header)
        return self

    def write(self, level: int, msg: str) -> None:
        """A line in run.log only (not on stderr)."""
        if self.handler is None:
            return
        rec = logging.LogRecord("krr", level, __file__, 0, msg, None, None)
        self.handler.handle(rec)

    def __exit__(self, *exc: Any) -> None:
        h, self.handler = self.handler, None
        if h is None:
            return
        logging.getLogger().removeHandler(h)
        h.close()
        if isinstance(h, _Lines) and h.lines:  # at most UPLOAD_WAIT s: cleanup, e.g. Ctrl-C
            data = "".join(line + "\n" for line in h.lines).encode()
            t = threading.Thread(target=self._upload, args=(data,), daemon=True)
            t.start()
            t.join(self.UPLOAD_WAIT)
            if t.is_alive():
                logging.getLogger("krr").warning(
                    "run.log not written to %s: the object store did not answer within %g s",
                    self.run_dir,
                    self.UPLOAD_WAIT,
                )

    def _upload(self, new: bytes) -> None:
        try:
            loc = Location(str(self.run_dir))
            old = loc.read_bytes("run.log") if loc.exists("run.log") else b""
            loc.write_atomic("run.log", old + new)
        except Exception as e:  # the run's outcome stands; only its log is missing
            logging.getLogger("krr").warning(
                "run.log not written to %s: %s: %s", self.run_dir, type(e).__name__, e
            )


def run_log_header(args: argparse.Namespace) -> str:
    """The first line ``krr run`` writes into run.log: the command, overrides and flags."""
    flags = [
        f"--{n.replace('_', '-')} {getattr(args, n)}"
        for n in ("scheduler", "run_dir", "until")
        if getattr(args, n, None)
    ]
    flags += ["--force-new"] if getattr(args, "force_new", False) else []
    return " ".join(["krr run", str(args.config), *args.overrides, *flags])


def stages_after(
    until: str | None, params: dict[str, Any] | None = None, outputs: dict[str, Any] | None = None
) -> list[str]:
    """The stages after ``until``, in order (those a ``--until`` run did not reach),
    less those this config does not need (as far as ``params`` and the ``outputs`` of
    the stages that ran tell; a stage that cannot be told yet is listed)."""
    if not until:
        return []
    names = list(stages.STAGE_NAMES)
    if until not in names:
        return []
    later = names[names.index(until) + 1 :]
    if params is None or outputs is None:
        return later
    out = []
    for stage in stages.default_stages():
        if stage.name not in later:
            continue
        try:
            needed = stage.enabled is None or bool(stage.enabled(params, outputs))
        except Exception:  # depends on outputs of stages that did not run yet
            needed = True
        if needed:
            out.append(stage.name)
    return out


def not_empty(value: str) -> str:
    """An option's value that must name something ("$SCHED" of an unset variable was
    ignored: the embedded cluster and the config's run directory were used)."""
    if not value.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return value
