"""Run directories and stores that may live on a local disk or on an object store.

A run directory is either a local path (kept as :class:`pathlib.Path`, with
exactly the behaviour it always had: ``flock`` lock, renames, ``@run/``
relative paths in the manifest) or a URL such as ``s3://bucket/prefix`` that
names an fsspec filesystem. :class:`Location` wraps such a URL: an fsspec
filesystem plus a root path, with the few operations the runner, the manifest
and the lock need. See ``docs/STORAGE.md`` for the protocol on object stores.

Credentials and endpoints come from the filesystem's own defaults (for S3: the
standard ``AWS_*`` environment variables, e.g. ``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``) or from ``storage_options``
registered with :func:`set_storage_options` (the config's
``storage.options``, the estimator's ``storage_options``). Registered options
apply in this process (and its threads); processes of a distributed cluster
read the environment variables of their own.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import fsspec
import fsspec.config

from pipeline.errors import (  # noqa: F401  (ConfigError, StoreUnreachable: their old home)
    ConfigError,
    StoreNotWritableError,
    StoreUnreachable,
)
from pipeline.storage.atomic import atomic_write, is_local
from pipeline.storage.tempfiles import tmp_path_for

#: packages that provide the filesystems of common URL schemes
_PACKAGES = {
    "s3": "s3fs",
    "s3a": "s3fs",
    "gs": "gcsfs",
    "gcs": "gcsfs",
    "az": "adlfs",
    "abfs": "adlfs",
    "abfss": "adlfs",
}


#: the pipeline's S3 filesystem: s3fs with bounded waits (pipeline.storage.s3)
_S3_CLASS = "pipeline.storage.s3.BoundedS3FileSystem"


def _register_bounded_s3() -> None:
    """Make ``s3://`` and ``s3a://`` open :class:`pipeline.storage.s3.BoundedS3FileSystem`
    in this process (imported when first used, so s3fs stays optional)."""
    from fsspec.registry import _registry, known_implementations

    for name in ("s3", "s3a"):
        # s3fs was already used here: fsspec forgets its class and imports ours instead
        _registry.pop(name, None)
        known_implementations[name] = {
            "class": _S3_CLASS,
            "err": "Install s3fs to access S3 (pip install 'krr-pipeline[s3]')",
        }


_register_bounded_s3()


def url_scheme(path: str | Path) -> str | None:
    """The scheme of a URL (``"s3"`` for ``s3://b/x``); None for a local path."""
    if isinstance(path, Path):
        return None
    s = str(path)
    if "://" not in s:
        return None
    scheme = s.split("://", 1)[0].lower()
    return None if scheme in ("file", "local") else scheme


def is_url(path: str | Path) -> bool:
    """Whether ``path`` names a non-local fsspec filesystem (``s3://...``, ``memory://...``)."""
    return url_scheme(path) is not None


def join_path(base: str | Path, *names: str) -> str | Path:
    """``base / name / ...``: a :class:`~pathlib.Path` for a local base, a URL string for
    a URL (``Path`` would turn ``s3://b`` into ``s3:/b``, a local directory named ``s3:``)."""
    if is_url(base):
        out = str(base).rstrip("/")
        for n in names:
            out += "/" + str(n).strip("/")
        return out
    return Path(base).joinpath(*names)


def read_bytes(path: str | Path) -> bytes:
    """The bytes of a local file or of an object at a URL (FileNotFoundError if absent)."""
    if not is_url(path):
        return Path(path).read_bytes()
    fs, p = filesystem_for(str(path))
    fs.invalidate_cache(p)
    return bytes(fs.cat_file(p))


def upload_file(local: str | Path, url: str | Path) -> str:
    """Copy a local file to ``url`` as one object (whole or absent); return the URL."""
    fs, p = filesystem_for(str(url))
    fs.put_file(str(local), p)
    return str(url)


def set_storage_options(protocol: str, options: Mapping[str, Any] | None) -> None:
    """Register default ``storage_options`` for ``protocol`` in this process.

    Every fsspec filesystem of that protocol created afterwards (by the stores,
    markers, Zarr) gets them, unless a call passes its own.
    """
    if not options:
        return
    current = dict(fsspec.config.conf.get(protocol, {}))
    if current == dict(options):
        return
    current.update(dict(options))
    fsspec.config.conf[protocol] = current
    try:  # instances cached with the old options must not be reused
        cls = fsspec.get_filesystem_class(protocol)
        cls.clear_instance_cache()
    except (ImportError, ValueError):
        pass


def filesystem_for(url: str, storage_options: Mapping[str, Any] | None = None) -> tuple[Any, str]:
    """``(fs, path)`` for ``url``; a scheme without its filesystem package names the package.

    Raises
    ------
    StoreUnreachable
        No fsspec filesystem is installed (or known) for the URL's scheme.
    """
    scheme = url_scheme(url) or "file"
    try:
        return fsspec.core.url_to_fs(str(url), **dict(storage_options or {}))
    except ImportError as e:
        pkg = _PACKAGES.get(scheme)
        hint = f"pip install {pkg}" if pkg else "install the fsspec filesystem for it"
        if scheme in ("s3", "s3a"):
            hint += " (or pip install 'krr-pipeline[s3]')"
        raise StoreUnreachable(
            f"{str(url)!r}: no filesystem is installed for the URL scheme {scheme!r} ({e}). "
            f"To use it: {hint}."
        ) from None
    except ConfigError:  # e.g. a bad timeout in storage.options (pipeline.storage.s3)
        raise
    except ValueError as e:
        raise StoreUnreachable(
            f"{str(url)!r}: unknown URL scheme {scheme!r} ({e}). Use a local path or a "
            "URL of an installed fsspec filesystem, e.g. s3://bucket/prefix (needs s3fs)."
        ) from None


class Location:
    """A directory on any fsspec filesystem: ``fs`` plus a root path.

    Parameters
    ----------
    url : str
        ``s3://bucket/prefix`` or any fsspec URL (a local path works too).
    storage_options : mapping, optional
        Passed to the filesystem (endpoint, credentials); defaults come from
        the environment and from :func:`set_storage_options`.
    """

    def __init__(self, url: str | Path, storage_options: Mapping[str, Any] | None = None):
        self.url = str(url).rstrip("/")
        self.fs, root = filesystem_for(self.url, storage_options)
        self.root = root.rstrip("/")

    def __repr__(self) -> str:
        return f"Location({self.url!r})"

    def __str__(self) -> str:
        return self.url

    @property
    def local(self) -> bool:
        return is_local(self.fs)

    def path(self, *names: str) -> str:
        """The filesystem path (no scheme) of ``names`` under the root."""
        return "/".join([self.root, *(n.strip("/") for n in names if n)])

    def child(self, *names: str) -> str:
        """The full URL of ``names`` under the root."""
        return "/".join([self.url, *(n.strip("/") for n in names if n)])

    def exists(self, *names: str) -> bool:
        return bool(self.fs.exists(self.path(*names)))

    def isdir(self, *names: str) -> bool:
        return bool(self.fs.isdir(self.path(*names)))

    def read_bytes(self, *names: str) -> bytes:
        """The object's bytes; FileNotFoundError when it does not exist."""
        return bytes(self.fs.cat_file(self.path(*names)))

    def write_atomic(self, name: str, data: bytes) -> None:
        """Write one object whole (object stores: a single PUT, which readers see whole
        or not at all; local: temporary file and rename)."""
        atomic_write(self.path(name), data, fs=self.fs, fsync=True)

    def create_exclusive(self, name: str, data: bytes) -> bool:
        """Create ``name`` only if it does not exist; False when it does.

        On S3 this is a conditional PUT (``If-None-Match: *``), which the store
        decides atomically. A filesystem without conditional writes falls back to
        check-then-write, which has a race (see ``docs/STORAGE.md``).
        """
        path = self.path(name)
        try:
            self.fs.pipe_file(path, data, mode="create")
            return True
        except FileExistsError:
            return False
        except TypeError:  # no ``mode`` parameter: check, then write
            if self.fs.exists(path):
                return False
            self.fs.pipe_file(path, data)
            return True

    def list(self, *names: str) -> list[str]:
        """Names (not paths) of the entries directly under ``names``; [] if none."""
        try:
            entries = self.fs.ls(self.path(*names), detail=False, refresh=True)
        except FileNotFoundError:
            return []
        except TypeError:
            entries = self.fs.ls(self.path(*names), detail=False)
        base = self.path(*names).rstrip("/")
        out = []
        for e in entries:
            e = str(e).rstrip("/")
            if e == base:
                continue
            out.append(e.rsplit("/", 1)[-1])
        return sorted(set(out))

    def rm(self, *names: str, recursive: bool = False) -> None:
        """Remove ``names`` (with ``recursive``, everything under it); missing is fine."""
        path = self.path(*names)
        try:
            if recursive:
                if self.fs.exists(path):
                    self.fs.rm(path, recursive=True)
            else:
                self.fs.rm_file(path)
        except FileNotFoundError:
            pass
        self.fs.invalidate_cache()

    def check_usable(self, create_bucket: bool = False, *, dry_run: bool = False) -> None:
        """Fail early and clearly when the store cannot be used.

        Lists the root (one request). For a bucket store (S3 and the like) a
        bucket that does not exist is created only with ``create_bucket``;
        ``dry_run`` (``krr validate``) creates nothing: a missing bucket that
        ``create_bucket`` would create passes.

        Raises
        ------
        StoreUnreachable
            The endpoint does not answer, the credentials are refused, or the
            bucket does not exist (and ``create_bucket`` is False).
        """
        if self.local:
            return
        bucket = self.root.split("/", 1)[0]
        exists = True
        try:
            self.fs.invalidate_cache()
            self.fs.ls(bucket, detail=False)  # exists() would hide a dead endpoint as False
        except FileNotFoundError:
            exists = False
        except PermissionError as e:
            raise StoreUnreachable(
                f"{self.url!r}: access denied ({e}). Check the credentials "
                "(AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, or storage.options key/secret)."
            ) from None
        except (OSError, Exception) as e:  # botocore's connection errors are not OSErrors
            if isinstance(e, StoreUnreachable):
                raise
            raise StoreUnreachable(
                f"{self.url!r}: the object store does not answer ({type(e).__name__}: {e}). "
                "Check the endpoint (AWS_ENDPOINT_URL, or storage.options "
                "client_kwargs.endpoint_url) and the network."
            ) from None
        if exists or (create_bucket and dry_run):
            return
        if not create_bucket:
            raise StoreUnreachable(
                f"{self.url!r}: bucket {bucket!r} does not exist. Create it, or set "
                "storage.create_bucket: true in the config to let krr create it."
            )
        try:
            self.fs.mkdir(bucket)
        except Exception as e:
            raise StoreUnreachable(
                f"{self.url!r}: cannot create bucket {bucket!r} ({type(e).__name__}: {e})."
            ) from None


def check_writable(path: str | os.PathLike, *, output: bool = False, file: bool = False) -> None:
    """Refuse, before any work, a place the pipeline is about to write that cannot be
    written: :class:`~pipeline.errors.StoreNotWritableError` (a ValueError and a
    PermissionError; ``krr`` exits 7 before a run, 4 in a stage) naming it and why.

    The one writability check of the pipeline: an empty temporary file (named by
    :func:`~pipeline.storage.tempfiles.tmp_path_for`, so a killed check's is swept) is
    created and removed where the writes would go, so a read-only filesystem is found
    even by root.

    - A store (the default; the Gram builder's): ``path`` is its root, a local directory
      or an fsspec URL, created if missing, as its writer would. An object store that
      does not answer raises :class:`~pipeline.errors.StoreUnreachable` (it is not a
      read-only store).
    - A prediction output (``output=True``): a local path (a URL is not checked here),
      and nothing is created: the nearest directory of it that exists (its parent for a
      ``file``, the store itself for ``.zarr``; the missing ones are created by the
      write) must be a directory that takes a new file.
    """

    def probe(fs: Any, directory: str) -> None:
        name = tmp_path_for(f"{directory.rstrip('/')}/.krr-write-check")
        fs.pipe_file(name, b"")
        fs.rm(name)

    path = os.fspath(path)
    if not output:
        try:
            fs, root = fsspec.core.url_to_fs(path)
            fs.makedirs(root, exist_ok=True)
            probe(fs, root)
        except StoreUnreachable:  # an object store that does not answer is not read-only
            raise
        except OSError as exc:
            raise StoreNotWritableError(
                f"store {path!r} is not writable ({exc}); pass a directory (or fsspec URL) "
                "you can write to"
            ) from exc
        return
    if "://" in path:
        return
    target = os.path.abspath(path)
    where = os.path.dirname(target) if file else target
    while not os.path.lexists(where) and os.path.dirname(where) != where:
        where = os.path.dirname(where)
    fix = "Make it writable, or choose another output path"
    if not os.path.isdir(where):
        raise StoreNotWritableError(
            f"prediction output {path!r} cannot be written: {where!r} is not a directory. {fix}."
        )
    try:
        probe(fsspec.filesystem("file"), where)
    except OSError as e:
        raise StoreNotWritableError(
            f"prediction output {path!r} cannot be written: directory {where!r} does not "
            f"take a new file ({e.strerror or e}). {fix}."
        ) from None
