"""What a model artifact may point at, and the column names it records.

- An X_train reference is recorded relative to the artifact when it lies
  inside it (:func:`ref_to_store`), and followed on load only when it resolves
  inside the artifact directory (:func:`resolve_stored_ref`): never ``..``, an
  absolute path elsewhere, a symlink leading out, or a URL. Anything else
  needs the caller to name the location (``load_artifact(path, x_train=...)``).
- Feature and target names: ``None`` or one distinct string per column
  (:func:`check_names`).
- What ``overwrite=True`` may replace: an artifact's own entries only
  (:func:`foreign_entries` lists the others, and the save then refuses).
"""

from __future__ import annotations

import os
from typing import Any

import fsspec
import numpy as np
import zarr

from pipeline.storage.atomic import local_file_path

#: the top-level entries an artifact writes (its metadata and its two arrays)
ARTIFACT_ENTRIES = frozenset({"zarr.json", "dual_coef", "X_train"})


def foreign_entries(fs: Any, root: str) -> list[str]:
    """Names directly under the artifact directory ``root`` that an artifact does not
    write (a user's notes, an X_train reference file kept beside it): replacing the
    artifact would delete them with it."""
    names = (str(p).rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(root, detail=False))
    return sorted(n for n in names if n not in ARTIFACT_ENTRIES)


def normalise_path(path_or_url: Any) -> str:
    """A local path made absolute (a ``file://`` URL as its path: zarr's local store makes
    directories); any other URL as is."""
    path = local_file_path(os.fspath(path_or_url))
    return path if "://" in path else os.path.abspath(path)


def read_ref(ref: str) -> Any:
    """Open a referenced X_train: a ``.npy`` file (memory-mapped) or a Zarr array."""
    if ref.endswith(".npy"):
        if "://" in ref:
            with fsspec.open(ref, "rb") as f:
                return np.load(f)
        if not os.path.exists(ref):
            raise FileNotFoundError(f"X_train reference {ref!r} does not exist")
        return np.load(ref, mmap_mode="r")
    try:
        return zarr.open_array(store=ref, mode="r")
    except Exception as exc:
        raise FileNotFoundError(
            f"X_train reference {ref!r} cannot be opened as a Zarr array or .npy file ({exc})"
        ) from exc


def is_url(path: str) -> bool:
    """Whether ``path`` is a remote URL (``file://`` counts as local)."""
    return "://" in path and not path.startswith("file://")


def ref_to_store(ref: str, artifact: str) -> str:
    """How a reference is recorded: relative to the artifact when inside it, else as given."""
    if is_url(ref) or is_url(artifact):
        root = artifact.rstrip("/") + "/"
        return ref[len(root) :] if ref.startswith(root) else ref
    rel = os.path.relpath(os.path.realpath(ref), os.path.realpath(artifact))
    return ref if rel == os.pardir or rel.startswith(os.pardir + os.sep) else rel


def resolve_stored_ref(url: Any, artifact: str) -> str | None:
    """A recorded X_train reference as a location inside the artifact, or None if it escapes.

    ``artifact`` is the artifact's normalised path (absolute) or URL.
    """
    if not isinstance(url, str) or not url:
        return None
    if is_url(artifact):
        root = artifact.rstrip("/")
        rel = url[len(root) + 1 :] if url.startswith(root + "/") else url
        parts = rel.split("/")
        if "://" in rel or rel.startswith("/") or ".." in parts or "\\" in rel or not rel:
            return None
        return root + "/" + rel
    if is_url(url):
        return None
    if url.startswith("file://"):
        url = url[len("file://") :]
    full = url if os.path.isabs(url) else os.path.join(artifact, url)
    root = os.path.realpath(artifact)
    real = os.path.realpath(full)
    if os.path.commonpath([root, real]) != root or real == root:
        return None
    return real


def escape_message(url: Any, artifact: str) -> str:
    """The refusal of a reference that leads out of the artifact, naming it and the fix."""
    return (
        f"model artifact {artifact!r}: its X_train reference {url!r} points outside the "
        "artifact directory; loading does not follow it. Pass its location explicitly if you "
        f"trust it: load_artifact({artifact!r}, x_train=PATH_OR_URL), or `krr predict "
        "--x-train PATH_OR_URL`; its content checksum is still verified."
    )


def check_names(value: Any, what: str, width: int) -> list[str] | None:
    """Validate column names: None, or ``width`` distinct strings (returned as a list)."""
    if value is None:
        return None
    names = [value] if isinstance(value, str) else list(np.asarray(value, dtype=object).ravel())
    if len(names) != width or not all(isinstance(n, str) for n in names):
        raise ValueError(
            f"{what} must be {width} strings (one per column), got {value!r}; pass None for "
            "unnamed columns"
        )
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"{what} must be distinct, got duplicates {dup}")
    return names


def loaded_names(meta: dict[str, Any], key: str, width: int) -> list[str] | None:
    """Column names from artifact metadata; for models written before they were recorded
    at the top level, from ``extra`` (where the ``model`` stage put them). Invalid: None."""
    value = meta.get(key)
    if value is None:
        value = (meta.get("extra") or {}).get(key)
    try:
        return check_names(value, key, width)
    except ValueError:
        return None
