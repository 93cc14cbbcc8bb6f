"""The run's data catalog: where each dataset of a run directory lives, and how it is read
and written (kedro's ``DataCatalog`` idea, kept small).

A :class:`Catalog` is the one place that knows the layout of one run directory: the
directory of each stage (``{run_dir}/{stage}`` for the shared stages,
``{run_dir}/results/<key>/{stage}`` for a configuration's, see
:mod:`pipeline.stages.results`), the name of each dataset in it (:data:`DATASETS`), and
the run directory's own records (``manifest.json``, ``latest.json``, each node's
``{node}.json``). The stages and the runner ask it for a dataset by name
(:meth:`Catalog.path`, :meth:`Catalog.store`) and read and write the small ones
through it (:meth:`Catalog.save`, :meth:`Catalog.load`), so none of them composes a
path. It reads and writes with the storage layer's functions (atomic writes, reads
verified against a recorded CRC-32C); the tiled datasets (the ingest rows, the Gram,
the factor, the predictions, the model artifact) are written by the functions that
tile them, into the store the catalog names.

The names and layout are those of every run directory written so far (pinned by
``tests/contracts/test_store_layout_pins.py``): a run directory written before this
module resumes unchanged.

A dataset a downstream stage reads is read where its producer *recorded* it (the
producer's outputs in the manifest: ``SolveOutput.alpha``, ``IngestOutput.store``...),
not where the catalog would put it today: a configuration adopted from an older layout
(``dir: ""``), or a result copied from another configuration, keeps its recorded paths.

The runner enters its catalog around each stage it calls (:func:`use_catalog`); a stage
gets it with :func:`stage_catalog`, which, for a stage function called on its own (as
the tests do), gives a catalog that knows only that stage's directory.
"""

from __future__ import annotations

import contextlib
import contextvars
import io
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from pipeline.stages.manifest import (
    LATEST_NAME,
    MANIFEST_NAME,
    RESULTS_DIR,
    Manifest,
    write_json_atomic,
)
from pipeline.storage import CorruptFileError, bytes_checksum
from pipeline.storage.atomic import atomic_write
from pipeline.storage.location import Location, is_url, join_path, read_bytes

__all__ = [
    "DATASETS",
    "Catalog",
    "Dataset",
    "load_npy_verified",
    "save_npy_atomic",
    "stage_catalog",
    "use_catalog",
]

Kind = Literal["npy", "json", "zarr", "dir", "model", "manifest"]


@dataclass(frozen=True)
class Dataset:
    """Where one dataset lives and how it is read and written.

    Parameters
    ----------
    stage : str or None
        The stage whose directory holds it; None: the run directory's top level.
    path : str
        Its name in that directory.
    kind : str
        ``npy`` (one array, written atomically, read against its CRC-32C), ``json``
        (written atomically), ``manifest`` (:class:`~pipeline.stages.manifest.Manifest`),
        ``zarr`` (a Zarr store written tile by tile with completion records, by the
        function that tiles it), ``model`` (a model artifact,
        :meth:`pipeline.models.artifact.Model.save`), ``dir`` (a directory of records,
        e.g. CG checkpoints).
    array : str, optional
        The array's name in a ``zarr`` store holding one array.
    """

    stage: str | None
    path: str
    kind: Kind
    array: str | None = None


#: every dataset of a run directory, by name. The ingest store holds the arrays
#: ``X_train``, ``y_train``, ``X_test`` and ``y_test`` (:class:`~pipeline.stages.outputs.IngestOutput`).
DATASETS: dict[str, Dataset] = {
    "manifest": Dataset(None, MANIFEST_NAME, "manifest"),
    "latest": Dataset(None, LATEST_NAME, "json"),
    "rows": Dataset("ingest", "data.zarr", "zarr"),
    "cv": Dataset("select", "cv.zarr", "zarr"),
    "cv_settings": Dataset("select", "settings", "dir"),
    "gram": Dataset("gram", "gram.zarr", "zarr", array="gram"),
    "factor": Dataset("solve", "factor.zarr", "zarr", array="chol"),
    "cg": Dataset("solve", "cg", "dir"),
    "cg_history": Dataset("solve", "cg_history.npy", "npy"),
    "alpha": Dataset("solve", "alpha.npy", "npy"),
    "model": Dataset("model", "model", "model"),
    "predictions": Dataset("predict", "predictions.zarr", "zarr", array="test"),
    "batch": Dataset("predict", "batch.zarr", "zarr", array="predictions"),
    "y_true": Dataset("evaluate", "y_true.npy", "npy"),
    "y_pred": Dataset("evaluate", "y_pred.npy", "npy"),
    "metrics": Dataset("evaluate", "metrics.json", "json"),
    # evaluate.compare's exact fits that the plan sends out of core (one fit-<fp> each)
    "compare_store": Dataset("evaluate", "compare_store", "dir"),
}


def save_npy_atomic(path: Path | str, arr: np.ndarray) -> int:
    """Write ``arr`` as ``.npy`` atomically; return the CRC-32C of the file's bytes."""
    buf = io.BytesIO()
    np.save(buf, arr)
    data = buf.getvalue()
    atomic_write(str(path), data, fsync=True)
    return bytes_checksum(data)


def load_npy_verified(path: str, crc32c: int | None) -> np.ndarray:
    """Load an ``.npy`` written by :func:`save_npy_atomic`, checking its CRC-32C.

    Raises
    ------
    CorruptFileError
        The file is missing, or its bytes do not match ``crc32c`` (or no
        checksum was recorded). It is a :class:`~pipeline.storage.CorruptTileError`,
        so ``krr run`` reruns the stage whose directory holds the file.
    """
    expected = -1 if crc32c is None else int(crc32c)
    try:
        data = read_bytes(path)
    except FileNotFoundError as exc:
        raise CorruptFileError(str(path), expected, -1) from exc
    found = bytes_checksum(data)
    if found != expected:
        raise CorruptFileError(str(path), expected, found)
    return np.load(io.BytesIO(data))


def _dataset(name: str) -> Dataset:
    try:
        return DATASETS[name]
    except KeyError:
        raise KeyError(f"no dataset {name!r} in the catalog; it has {sorted(DATASETS)}") from None


class Catalog:
    """The datasets of one run directory: where each lives, how it is read and written.

    Parameters
    ----------
    run_dir : path or URL, optional
        The run directory. None: a catalog of the stage directories in ``dirs`` only
        (:meth:`for_stage`).
    dirs : mapping, optional
        Stage name -> its directory, where it is not ``{run_dir}/{stage}`` (a
        configuration's stages, ``{run_dir}/results/<key>/{stage}``: the runner
        adds them with :meth:`set_stage_dirs` once it enters the configuration).
    """

    def __init__(
        self, run_dir: Path | str | None = None, dirs: Mapping[str, Path | str] | None = None
    ) -> None:
        self.run_dir = run_dir
        self._dirs: dict[str, Path | str] = dict(dirs or {})

    @classmethod
    def for_stage(cls, stage: str, stage_dir: Path | str) -> Catalog:
        """A catalog that knows one stage's directory (a stage function called on its own)."""
        return cls(None, {stage: stage_dir})

    def __repr__(self) -> str:
        return (
            f"Catalog({str(self.run_dir)!r}, dirs={ {k: str(v) for k, v in self._dirs.items()} })"
        )

    # -- where ------------------------------------------------------------------------

    def set_stage_dirs(self, dirs: Mapping[str, Path | str]) -> None:
        """Place these stages in these directories (a configuration's, once entered)."""
        self._dirs.update(dirs)

    def stage_dir(self, stage: str) -> Path | str:
        """The directory of ``stage``: where the runner placed it, else ``{run_dir}/{stage}``."""
        if stage in self._dirs:
            return self._dirs[stage]
        if self.run_dir is None:
            raise KeyError(
                f"this catalog knows the directories of {sorted(self._dirs)}, not {stage!r}"
            )
        return join_path(self.run_dir, stage)

    def config_dir(self, key: str) -> str:
        """The directory of configuration ``key``, relative to the run directory."""
        return f"{RESULTS_DIR}/{key}"

    def config_stage_dir(self, config_dir: str, stage: str) -> Path | str:
        """The directory of ``stage`` in the configuration whose directory is ``config_dir``
        (relative, as the manifest records it; ``""``: a run directory from before results
        were kept, whose stages lie at its top level)."""
        return join_path(self._root(), *[p for p in (*config_dir.split("/"), stage) if p])

    def path(self, name: str) -> Path | str:
        """Where dataset ``name`` lives (in its stage's directory, or the run directory's)."""
        ds = _dataset(name)
        base = self._root() if ds.stage is None else self.stage_dir(ds.stage)
        return join_path(base, ds.path)

    def store(self, name: str) -> tuple[str, str | None]:
        """A Zarr dataset's store (as a string) and the name of its array (None: the store
        holds several, e.g. the ingest rows)."""
        ds = _dataset(name)
        if ds.kind != "zarr":
            raise ValueError(f"dataset {name!r} is {ds.kind}, not a Zarr store")
        return str(self.path(name)), ds.array

    def exists(self, name: str) -> bool:
        """Whether dataset ``name`` exists where :meth:`path` puts it."""
        where = self.path(name)
        if is_url(where):
            base, _, leaf = str(where).rpartition("/")
            return Location(base).exists(leaf)
        return Path(where).exists()

    def node_file(self, node: str) -> str:
        """The name of node ``node``'s record file at the run directory's top level."""
        return f"{node}.json"

    def node_path(self, node: str) -> Path | str:
        """Where node ``node``'s records live (see :class:`pipeline.stages.stage.Node`)."""
        return join_path(self._root(), self.node_file(node))

    def in_other_configurations(self, name: str) -> tuple[str, ...]:
        """Dataset ``name`` of this run directory's other configurations, where it exists
        (``results/*/<stage>/<path>``, and an older layout's ``<stage>/<path>``), newest
        first; its own (this catalog's) excluded. Local run directories only: () on an
        object store, or for a stage directory that is not a configuration's."""
        ds = _dataset(name)
        if ds.stage is None:
            return ()
        own_dir = self.stage_dir(ds.stage)
        if is_url(own_dir):
            return ()
        results = Path(own_dir).resolve().parent.parent
        if results.name != RESULTS_DIR:  # (never another run directory)
            return ()
        own = Path(own_dir).resolve() / ds.path
        found = [p for p in [*results.glob(f"*/{ds.stage}/{ds.path}"),
                             results.parent / ds.stage / ds.path]
                 if p.is_dir() and p != own]  # fmt: skip
        return tuple(str(p) for p in sorted(found, key=lambda p: p.stat().st_mtime, reverse=True))

    def _root(self) -> Path | str:
        if self.run_dir is None:
            raise KeyError("this catalog knows stage directories only, not the run directory")
        return self.run_dir

    # -- read and write ---------------------------------------------------------------

    def save(self, name: str, value: Any) -> int | None:
        """Write dataset ``name`` atomically: an array as ``.npy`` (returns the CRC-32C of
        its bytes, to record in the stage's outputs), a JSON document, or the manifest.

        The tiled datasets (``zarr``, ``model``, ``dir``) are written by the functions that
        tile them, into :meth:`store` / :meth:`path`.
        """
        ds = _dataset(name)
        if ds.kind == "npy":
            return save_npy_atomic(self.path(name), value)
        if ds.kind == "json":
            write_json_atomic(self.path(name), value)
            return None
        if ds.kind == "manifest":
            value.save()
            return None
        raise ValueError(f"dataset {name!r} is {ds.kind}: written by the function that tiles it")

    def load(self, name: str, *, path: Path | str | None = None, crc32c: int | None = None) -> Any:
        """Read dataset ``name``: an ``.npy`` verified against ``crc32c`` (the checksum its
        producer recorded), a JSON document, or the manifest.

        ``path``: where its producer recorded it (a downstream stage reads it there);
        default :meth:`path`.

        Raises
        ------
        CorruptFileError
            An ``.npy`` is missing, or its bytes do not match ``crc32c``.
        FileNotFoundError, ValueError
            A JSON document is missing, or is not JSON.
        """
        ds = _dataset(name)
        where = self.path(name) if path is None else path
        if ds.kind == "npy":
            return load_npy_verified(str(where), crc32c)
        if ds.kind == "json":
            return json.loads(read_bytes(where))
        if ds.kind == "manifest":
            return Manifest.load(self._root())
        raise ValueError(f"dataset {name!r} is {ds.kind}: read it with the function that tiles it")

    def node_records(self, node: str) -> dict[str, Any] | None:
        """The records of node ``node`` (fingerprint of its inputs -> record): {} when it has
        no file; None when the file there is not the record this package writes."""
        try:
            doc = json.loads(read_bytes(self.node_path(node)))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError):
            return None
        if not (
            isinstance(doc, dict)
            and doc.get("node") == node
            and isinstance(doc.get("records"), dict)
        ):
            return None
        return doc["records"]

    def save_node_records(self, node: str, records: Mapping[str, Any]) -> None:
        """Write node ``node``'s records, atomically."""
        write_json_atomic(self.node_path(node), {"node": node, "records": dict(records)})


_ACTIVE: contextvars.ContextVar[Catalog | None] = contextvars.ContextVar(
    "pipeline_stages_catalog", default=None
)


@contextlib.contextmanager
def use_catalog(catalog: Catalog) -> Iterator[Catalog]:
    """Make ``catalog`` the one :func:`stage_catalog` gives, while the block runs (the
    runner, around each stage it calls)."""
    token = _ACTIVE.set(catalog)
    try:
        yield catalog
    finally:
        _ACTIVE.reset(token)


def _same_dir(a: Path | str, b: Path | str) -> bool:
    if is_url(a) or is_url(b):
        return str(a).rstrip("/") == str(b).rstrip("/")
    return Path(a).absolute() == Path(b).absolute()


def stage_catalog(stage: str, stage_dir: Path | str) -> Catalog:
    """The catalog of the run that called stage ``stage`` in ``stage_dir``.

    The runner's (:func:`use_catalog`) when it placed ``stage`` there; else (the stage
    function called on its own) a catalog that knows only that stage's directory.
    """
    active = _ACTIVE.get()
    if active is not None:
        try:
            if _same_dir(active.stage_dir(stage), stage_dir):
                return active
        except KeyError:
            pass
    return Catalog.for_stage(stage, stage_dir)
