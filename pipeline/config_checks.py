"""Checks of the run directory and run name, shared by the config models and the CLI."""

from __future__ import annotations

from pathlib import Path

__all__ = ["check_run_dir", "check_run_name"]


def check_run_dir(path: str | Path, key: str = "run_dir") -> None:
    """Refuse a run directory that is a filesystem root, the home directory or the
    current directory (a run directory is where the pipeline creates and removes
    its own files; see :mod:`pipeline.stages.runner`).

    Raises
    ------
    ValueError
        Naming ``key``, the value and the fix.
    """
    if "://" in str(path) and not str(path).startswith("file://"):  # object store URL
        _scheme, rest = str(path).split("://", 1)
        if "/" not in rest.strip("/"):
            raise ValueError(
                f"{key} {str(path)!r} is a whole bucket; a run directory must be a prefix of "
                f"its own. Use e.g. {str(path).rstrip('/')}/runs/<name>"
            )
        return
    p = Path(path).expanduser()
    try:
        full = p.resolve()
    except (OSError, RuntimeError):
        full = p.absolute()
    checks = [
        (full.parent == full, "a filesystem root"),
        (full == Path.home().resolve(), "your home directory"),
        (full == Path.cwd().resolve(), "the current directory"),
    ]
    for hit, what in checks:
        if hit:
            raise ValueError(
                f"{key} {str(path)!r} is {what}; a run directory must be a directory of its "
                "own. Use a new subdirectory, e.g. runs/<name>"
            )


def check_run_name(name: str) -> None:
    """Refuse a run name that would leave ``runs/`` (path separators, ``.``, ``..``).

    Raises
    ------
    ValueError
        Naming the value and the fix.
    """
    seps = {"/", "\\"}
    if not name.strip() or name in (".", "..") or any(c in name for c in seps) or "\0" in name:
        raise ValueError(
            f"name {name!r} must be a plain directory name (the run goes to runs/<name>): no "
            "'/' or '\\', and not '.' or '..'. Use e.g. name: my-experiment, or set run_dir for "
            "another location"
        )
