"""The pipeline's exceptions and warnings: one class per condition, in one place.

Every condition the pipeline reports with its own type has exactly one class here;
the modules that raised it before keep the old name importable as the same object
(``from pipeline.linalg.cg import CGConvergenceError`` is
:class:`SolveNotConverged`), so ``except`` clauses, pickles of instances and
public names keep working. Where two or more types (or a plain ``ValueError``)
reported one condition, they are one class now, subclassing every base the
merged ones had, so no existing ``except`` stops catching it:

================================  ===================================================
condition                         class (old names, now aliases)
================================  ===================================================
CG asked for with an indefinite   :class:`IndefiniteKernelError`
kernel                            (``solvers.cg.CGIndefiniteKernelError``,
                                  ``stages.solve.IndefiniteKernelError``; the checks
                                  in ``config`` and ``out_of_core`` raised ValueError)
a solve did not converge          :class:`SolveNotConverged`
                                  (``solvers.cg.CGConvergenceError``,
                                  ``model_selection.direct.UnconvergedSolveError``)
================================  ===================================================

This module imports nothing from :mod:`pipeline` (it is the bottom layer, beside
:mod:`pipeline.options`); the messages are built where they were before, byte for byte.

Still defined in their modules (moved here after the merges of those modules):
``CliError`` (:mod:`pipeline.cli.errors`), ``UsageError`` (:mod:`pipeline.cli.args`),
``LockHeldError`` and ``RunDirUnusable`` (:mod:`pipeline.stages.lock`), ``StageFailed``
and ``RunDirConflict`` (:mod:`pipeline.stages.runner`), ``InsufficientDiskError`` and
``GramReplacedError`` (:mod:`pipeline.linalg.cholesky_inplace`),
``NotPositiveDefiniteError`` (:mod:`pipeline.linalg.cholesky_options`) and
``NonFiniteKernelError`` (:mod:`pipeline.kernels.base`).
"""

from __future__ import annotations

import errno as _errno
import os
import shutil
from collections.abc import Iterable
from typing import Any

from sklearn.exceptions import ConvergenceWarning

__all__ = [
    "ArtifactError",
    "CGConvergenceWarning",
    "CGDivergenceError",
    "CGStagnationError",
    "ConfigError",
    "CorruptFileError",
    "CorruptTileError",
    "DamagedOutput",
    "DiskFullError",
    "ForeignPathError",
    "IncompleteArrayError",
    "IndefiniteKernelError",
    "InputError",
    "InsufficientMemoryError",
    "ManifestError",
    "MissingExtraError",
    "MissingTileError",
    "SingularKernelWarning",
    "SolveNotConverged",
    "SourceChanged",
    "StoreMismatchError",
    "StoreNotWritableError",
    "StoreUnreachable",
    "Terminated",
    "TileRewriteError",
]


# ---------------------------------------------------------------------------
# configuration and optional packages


class ConfigError(ValueError):
    """A config file is missing, is not valid YAML, or does not validate."""


class MissingExtraError(ImportError):
    """An optional package is not installed; the message names the extra that installs it."""

    def __init__(self, message: str, extra: str) -> None:
        super().__init__(message)
        self.extra = extra


# ---------------------------------------------------------------------------
# storage


class ForeignPathError(ValueError):
    """A path the pipeline would write holds something it did not create.

    The pipeline never deletes or overwrites such a path, whatever ``overwrite``
    says. ``path`` names it.
    """

    def __init__(self, path: str, what: str, fix: str | None = None) -> None:
        self.path = str(path)
        self.what = what
        fix = fix or (
            f"Choose another path, or move or remove {self.path!r} yourself if you "
            "no longer need it"
        )
        super().__init__(
            f"{self.path!r} exists and is {what}, not an array krr-pipeline created; it never "
            f"deletes or overwrites what it did not create (not even with overwrite=True). {fix}."
        )

    def __reduce__(self):
        return (type(self), (self.path, self.what))


class IncompleteArrayError(ValueError):
    """A stored array that should be complete lacks completion records for some tiles.

    Attributes
    ----------
    store, name : str
        The store root and the array name.
    missing : tuple of tuple of int
        The tiles without a completion record (under the array's fingerprint).
    n_tiles : int or None
        How many tiles the array should have.
    """

    def __init__(
        self,
        store: str,
        name: str,
        missing: Iterable[Any],
        n_tiles: int | None = None,
        message: str | None = None,
    ) -> None:
        self.store = str(store)
        self.name = name
        self.missing = tuple(tuple(int(t) for t in m) for m in sorted(missing))
        self.n_tiles = None if n_tiles is None else int(n_tiles)
        self.message = message
        of = "" if self.n_tiles is None else f" of {self.n_tiles}"
        super().__init__(
            message
            or (
                f"array {name!r} in store {self.store!r} is incomplete: {len(self.missing)}{of} "
                f"tiles have no completion record (first: {list(self.missing[:5])}); rerun the "
                "step that builds it (`krr run` does this by itself when the store belongs to "
                "one of its stages)"
            )
        )

    def __reduce__(self):  # picklable across Dask workers despite the custom __init__
        return (type(self), (self.store, self.name, self.missing, self.n_tiles, self.message))


class TileRewriteError(RuntimeError):
    """A caller tried to rewrite a tile that is already marked complete with other bytes.

    A completed tile is final: it is never rewritten in place. To recompute one
    (e.g. a corrupt tile), remove its marker first
    (:meth:`~pipeline.storage.TileMarkers.unmark`). This error means a caller
    broke that rule (a bug), or a tile task is not deterministic.
    """

    def __init__(self, store: str, name: str, tile: tuple[int, ...]) -> None:
        self.store = str(store)
        self.name = name
        self.tile = tuple(int(t) for t in tile)
        super().__init__(
            f"tile {self.tile} of array {name!r} in store {self.store!r} is already marked "
            "complete with other bytes; a completed tile is never rewritten in place. Unmark it "
            f"first (TileMarkers(store, {name!r}, fingerprint).unmark({self.tile})) to recompute it"
        )

    def __reduce__(self):
        return (type(self), (self.store, self.name, self.tile))


class StoreMismatchError(ValueError):
    """An existing store holds results computed from other inputs or config."""


class CorruptTileError(ValueError):
    """A stored tile's bytes do not match its completion record, or cannot be read.

    Attributes
    ----------
    store, name : str
        The store root and the array name.
    tile : tuple of int
        The tile index ``(i, j)``.
    expected, found : int or None
        The CRC-32C recorded when the tile was written, and that of the bytes
        read; ``found`` is None when the bytes could not be read as a tile at
        all (a truncated, oversized or unreadable chunk), and ``expected`` is
        None for a record written without a checksum.
    reason : str or None
        What is wrong when it is not a checksum mismatch (e.g. the chunk file's size).
    """

    def __init__(
        self,
        store: str,
        name: str,
        tile: tuple[int, ...],
        expected: int | None,
        found: int | None,
        reason: str | None = None,
    ) -> None:
        self.store = store
        self.name = name
        self.tile = tuple(int(t) for t in tile)
        self.expected = None if expected is None else int(expected)
        self.found = None if found is None else int(found)
        self.reason = reason
        super().__init__(
            f"tile {self.tile} of array {name!r} in store {store!r} is corrupt: "
            f"{self.problem}. Remove its marker (TileMarkers(store, {name!r}, fingerprint)"
            f".unmark({self.tile})) and recompute it; `krr run` does this by itself when the "
            "store belongs to one of its stages."
        )

    @property
    def problem(self) -> str:
        """One phrase: the checksums that differ, or why the bytes cannot be read."""
        if self.found is None or self.expected is None:
            return f"it has a completion record, but {self.reason or 'its bytes cannot be read'}"
        return (
            f"its completion record has crc32c {self.expected:#010x} but the stored bytes "
            f"hash to {self.found:#010x}"
        )

    def __reduce__(self):  # picklable across Dask workers despite the custom __init__
        args = (self.store, self.name, self.tile, self.expected, self.found, self.reason)
        return (type(self), args)


class MissingTileError(CorruptTileError):
    """A block that must be stored cannot be verified: it has no completion record,
    one without a checksum, or a chunk that cannot be decoded (``reason`` says which).

    A subclass of :class:`CorruptTileError`, so whatever recovers from a corrupt
    tile (``krr run`` unmarks it and reruns the stage that owns the store)
    recovers from this too: the block is recomputed instead of read as zeros.
    """

    def __init__(self, store: str, name: str, tile: tuple[int, ...], reason: str) -> None:
        super().__init__(store, name, tile, 0, 0)
        self.reason = reason
        ValueError.__init__(
            self,
            f"block {self.tile} of array {name!r} in store {store!r} cannot be verified: "
            f"{reason}. Recompute it (remove its marker, if any, and rerun the step that wrote "
            "the array); `krr run` does this by itself when the store belongs to one of its "
            "stages.",
        )

    @property
    def problem(self) -> str:
        """One phrase: why the block cannot be verified."""
        return self.reason

    def __reduce__(self):
        return (type(self), (self.store, self.name, self.tile, self.reason))


class CorruptFileError(CorruptTileError):
    """A single stored file (e.g. ``alpha.npy``) does not match its recorded CRC-32C.

    ``store`` is the file's directory, ``name`` its file name and ``tile`` is
    ``(0,)``, so the runner's corrupt-tile recovery reruns the stage whose
    directory holds the file. ``expected`` is -1 when no checksum was recorded.
    """

    def __init__(self, path: str, expected: int, found: int) -> None:
        path = str(path)
        store, name = os.path.split(path)
        super().__init__(store or ".", name, (0,), expected, found)
        self.path = path
        self.reason = self._why(expected, found)
        ValueError.__init__(
            self,
            f"stored file {path!r} cannot be used: {self.reason}. Recompute it; `krr run` "
            "reruns the stage that wrote it by itself.",
        )

    @staticmethod
    def _why(expected: int, found: int) -> str:
        if expected < 0:
            return "no CRC-32C was recorded for it (written by an older version?)"
        if found < 0:
            return f"it is missing or unreadable (recorded crc32c {expected:#010x})"
        return f"its recorded crc32c is {expected:#010x} but its bytes hash to {found:#010x}"

    @property
    def problem(self) -> str:
        """One phrase: why the file cannot be used."""
        return self.reason

    def __reduce__(self):
        return (type(self), (self.path, self.expected, self.found))


class StoreUnreachable(OSError):
    """An object store cannot be used: no filesystem for its scheme, the endpoint
    does not answer, the credentials are refused, or the bucket does not exist."""


class StoreNotWritableError(ValueError, PermissionError):
    """The store location cannot be created or written."""


#: errno values of a full disk: no space left, and a disk quota exceeded
DISK_FULL_ERRNOS = frozenset({_errno.ENOSPC, getattr(_errno, "EDQUOT", _errno.ENOSPC)})


def _bytes(n: int | None) -> str:
    if n is None:
        return "an unknown number of bytes"
    if n < 1 << 20:
        return f"{n} bytes"
    return f"{n} bytes ({n / (1 << 20):.1f} MiB)"


class DiskFullError(OSError):
    """No space is left (ENOSPC, or a quota: EDQUOT) where a file is written.

    An OSError with the original ``errno``; the message names the path, the bytes
    the write needed and the bytes free on its filesystem, and what to do: free space
    (a rerun before that fails the same way). ``krr`` exits 7.
    """

    def __init__(
        self,
        path: str,
        needed: int | None,
        free: int | None,
        code: int = _errno.ENOSPC,
        strerror: str | None = None,
    ) -> None:
        self.path = str(path)
        self.needed = None if needed is None else int(needed)
        self.free = None if free is None else int(free)
        self.os_message = strerror or os.strerror(code)  # the system's words, kept
        self.message = (
            f"{self.os_message}: no room on the filesystem of {self.path!r}: writing it needs "
            f"{_bytes(self.needed)}, and {_bytes(self.free)} are free there. Free space on "
            "that filesystem (or move the run directory to a larger one); until then "
            "running again fails the same way, after that it resumes from the tiles "
            "already stored"
        )
        super().__init__(code, self.message)

    def __str__(self) -> str:
        return self.message

    @classmethod
    def from_os_error(cls, exc: OSError, path: str, needed: int | None = None) -> DiskFullError:
        """The error for ``exc`` (an ENOSPC or EDQUOT) raised writing ``path``."""
        free = None
        where = os.path.dirname(os.path.abspath(path))
        while where and not os.path.isdir(where) and os.path.dirname(where) != where:
            where = os.path.dirname(where)
        try:
            free = shutil.disk_usage(where).free
        except OSError:
            pass
        return cls(path, needed, free, exc.errno or _errno.ENOSPC, exc.strerror)

    def __reduce__(self):  # picklable across Dask workers despite the custom __init__
        return (type(self), (self.path, self.needed, self.free, self.errno, self.os_message))


# ---------------------------------------------------------------------------
# solving


class IndefiniteKernelError(ValueError):
    """CG was asked for with a kernel that is not known to be positive semi-definite.

    The one type of this condition, wherever it is found: a CG operator's kernel
    (:func:`pipeline.linalg.cg.check_operator_kernel`, formerly
    ``CGIndefiniteKernelError``), the solve stage's kernel
    (:func:`pipeline.stages.solve.check_cg_kernel`), a config with
    ``solver.method: cg`` and the out-of-core fit with ``solver='cg'`` (both a
    plain ``ValueError`` before, so ``except ValueError`` still catches it).
    """


class SolveNotConverged(RuntimeError):
    """A solve did not reach its tolerance, and an unconverged answer was not accepted.

    The one type of this condition: CG stopped at ``max_iter`` or broke down with
    ``strict=True`` or ``solver.allow_unconverged`` false (formerly
    ``CGConvergenceError`` and this class), an iterative refinement that stops
    short, and a CV solve that could not be redone exactly (formerly
    ``UnconvergedSolveError``). :class:`CGStagnationError` and
    :class:`CGDivergenceError` name two ways CG stops.
    """


class CGStagnationError(SolveNotConverged):
    """CG made no progress for ``stagnation_window`` iterations (raised whatever ``strict``)."""


class CGDivergenceError(SolveNotConverged):
    """A product, the preconditioner or the residual produced NaN or inf: the solve is
    abandoned at once, so a diverged solve is never scored."""


class CGConvergenceWarning(ConvergenceWarning):
    """CG stopped at ``max_iter`` before reaching ``tol`` (a scikit-learn
    ``ConvergenceWarning``, so ``warnings.simplefilter("error", ConvergenceWarning)``
    catches it)."""


class SingularKernelWarning(UserWarning):
    """K + lam I was not positive definite; a jittered or least-squares solution was used."""


class InsufficientMemoryError(MemoryError):
    """The in-memory path would need more memory than this machine has available."""


# ---------------------------------------------------------------------------
# artifacts and runs


class ArtifactError(ValueError):
    """An artifact that cannot be loaded: not one, incomplete, unknown version, or corrupt."""


class InputError(ValueError):
    """The configured data cannot be read or is not valid input."""


class SourceChanged(RuntimeError):
    """The data's content identity at the end of ingest differs from the one at its start."""


class ManifestError(ValueError):
    """``manifest.json`` exists but cannot be read (not JSON, another version)."""


class DamagedOutput(ValueError):
    """A complete stage's output no longer verifies (see :mod:`pipeline.stages.verify`)."""


class Terminated(KeyboardInterrupt):
    """The process was asked to stop by a signal other than SIGINT (SIGTERM: the stop
    signal of systemd, Slurm and Kubernetes).

    A :class:`KeyboardInterrupt`, so every path that stops cleanly on Ctrl-C (the stage
    is recorded ``interrupted``, the lock released, ``run.log`` told) does the same for
    it. ``signum`` is the signal's number; ``krr`` exits ``128 + signum`` (143).
    """

    def __init__(self, signum: int = 15) -> None:
        self.signum = int(signum)
        super().__init__(f"stopped by signal {self.signum}")

    def __reduce__(self):
        return (type(self), (self.signum,))


def caused_by(e: BaseException | None, kind: type[BaseException]) -> BaseException | None:
    """The first exception of type ``kind`` in ``e``'s chain (``e`` itself, then its
    ``__cause__`` or ``__context__``, and so on), else None."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, kind):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None
