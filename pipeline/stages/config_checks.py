"""Checks of the config's paths, run directory, run name and shipped data sets, shared by
the config models, the stages and the CLI."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipeline.storage.atomic import local_file_path

__all__ = [
    "PATH_KEYS",
    "check_run_dir",
    "check_run_name",
    "local_file_url",
    "resolve_config_paths",
    "sklearn_loader",
]

#: the data paths of a config; relative ones in a config file are taken relative to the
#: file's directory (``run_dir`` stays relative to the current directory)
PATH_KEYS = (
    ("data", "path"),
    ("data", "y_path"),
    ("split", "test_path"),
    ("split", "test_y_path"),
    ("predict", "input"),
    ("predict", "output"),
)


def resolve_config_paths(raw: dict, config_dir: Path) -> dict:
    """A copy of the raw config with each relative path of :data:`PATH_KEYS` joined to
    ``config_dir`` (the config file's directory), so a config means the same files from
    any working directory. Absolute paths, ``~`` paths and URLs (``s3://``, ``file://``)
    are left as they are; ``key=value`` overrides (applied later) stay relative to the
    current directory, where they were typed."""
    out = dict(raw)
    for section, key in PATH_KEYS:
        sec = out.get(section)
        if not isinstance(sec, dict):
            continue
        v = sec.get(key)
        if not isinstance(v, str) or not v or "://" in v or v.startswith("~"):
            continue
        if not Path(v).is_absolute():
            out[section] = {**sec, key: str(config_dir.absolute() / v)}
    return out


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


def local_file_url(v: Any) -> Any:
    """A ``file://`` URL in a path field is the local path it names (as fsspec reads it);
    a ``~`` path is expanded (it was checked as the home directory's, then written to a
    directory named ``~`` in the current one)."""
    if isinstance(v, str):
        import os

        v = local_file_path(v)
        return os.path.expanduser(v) if v.startswith("~") else v
    return v


def sklearn_loader(name: str | None) -> Any:
    """scikit-learn's ``load_{name}`` (a data set shipped with it); ValueError otherwise."""
    import sklearn.datasets as skd

    loader = getattr(skd, f"load_{name}", None)
    if not callable(loader):
        shipped = sorted(n[5:] for n in dir(skd) if n.startswith("load_"))
        raise ValueError(
            f"scikit-learn has no shipped data set {name!r} (fetch_* loaders download and "
            f"are not supported); shipped ones: {shipped}"
        )
    return loader


def combination_problem(cfg: Any) -> str | None:
    """Why settings that are each valid cannot run together (naming the keys and the
    fix), or None: checked by ``krr validate`` and before ``krr run`` does any work
    (they failed in a stage, after the ingest, as "rerun to resume")."""
    cv = getattr(cfg, "cv", None)
    if cv is not None and cv.folds == "loo" and cv.solver in ("band", "cg", "dense"):
        return (
            f"cv.folds: loo needs cv.solver eigen, cholesky or auto (exact leave-one-out), "
            f"got cv.solver: {cv.solver}, which solves one system per left-out row"
        )
    solver = cfg.solver
    if solver.cg_precision == "mixed" and solver.matvec == "stored":
        return (
            "solver.cg_precision: mixed recomputes the kernel in float32, so it cannot use "
            "solver.matvec: stored; set solver.matvec: recompute (or auto), or "
            "solver.cg_precision: float64"
        )
    split, data = cfg.split, cfg.data
    if split.test_path and not split.test_y_path and data.source in ("npy", "zarr"):
        return (
            f"split.test_path of a {data.source} source needs split.test_y_path (the test "
            "targets), as data.path needs data.y_path"
        )
    try:  # as the embedded LocalCluster reads it ("auto", "0", a fraction, "4GiB")
        import logging

        from distributed.worker_memory import parse_memory_limit

        lim = parse_memory_limit(cfg.cluster.memory_limit, 1, logger=logging.getLogger(__name__))
        if lim is not None and lim <= 0:  # ("-1" parses, as a negative size)
            raise ValueError
    except (ValueError, TypeError, KeyError):
        return (
            f"cluster.memory_limit: {cfg.cluster.memory_limit!r} is not a positive size; "
            "write e.g. 4GiB, 4000MB, 0.5 (of the memory) or auto"
        )
    return None


def _leaves(annotation: Any) -> list[Any]:
    from typing import get_args

    args = get_args(annotation)
    return [annotation] if not args else [x for a in args for x in _leaves(a)]


def bool_for_number(model: Any, data: Any) -> str | None:
    """The first numeric field of ``model`` given a boolean (YAML's ``yes``/``true``),
    as an error naming it, or None: pydantic's lax mode read ``lambda: yes`` as 1."""
    if not isinstance(data, Mapping):
        return None
    for name, field in model.model_fields.items():
        leaves = _leaves(field.annotation)
        if bool in leaves or not any(t in (int, float) for t in leaves):
            continue
        v = data.get(field.alias or name, data.get(name))
        if isinstance(v, bool) or (isinstance(v, list) and any(isinstance(x, bool) for x in v)):
            return f"{field.alias or name}: expected a number, got {v!r} (true/yes/on are booleans)"
    return None


def load_yaml(text: str) -> Any:
    """``yaml.safe_load`` that refuses a key given twice in one mapping (a config with
    ``lambda:`` twice silently took the last one): a ``yaml.YAMLError`` naming it."""
    import yaml

    class _Unique(yaml.SafeLoader):
        pass

    def mapping(loader: Any, node: Any, deep: bool = False) -> Any:
        seen = set()
        for key_node, _ in node.value:
            key = loader.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is given twice", key_node.start_mark
                )
            seen.add(key)
        return loader.construct_mapping(node, deep)

    _Unique.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    return yaml.load(text, Loader=_Unique)  # noqa: S506 (a SafeLoader subclass)
