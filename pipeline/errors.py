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
                                  in ``config`` and the out-of-core fit raised
                                  ValueError)
a solve did not converge          :class:`SolveNotConverged`
                                  (``solvers.cg.CGConvergenceError``,
                                  ``model_selection.direct.UnconvergedSolveError``)
tiles of a stored array are not   :class:`IncompleteArrayError`
there to be read                  (``MissingTileError``, its block form)
K + shift I is not positive       :class:`NotPositiveDefiniteError` (the band
definite                          reduction's and the eigendecomposition's CV checks
                                  raised ValueError)
================================  ===================================================

This module imports nothing from :mod:`pipeline` (it is the bottom layer, beside
:mod:`pipeline.options`), nor anything heavy, so that ``import pipeline.errors`` costs
no numpy, SciPy or scikit-learn: :class:`CGConvergenceWarning`, a scikit-learn
``ConvergenceWarning``, is made on first use. (``pipeline.cli`` loads them all anyway: its
stages import the estimators at module level, issue #43.) Every message is the one its
class's old home built, byte for byte; the old homes (``pipeline.cli.errors.CliError``,
``pipeline.stages.lock.LockHeldError``, ...) import the class back under the old name.
"""

from __future__ import annotations

import errno as _errno
import os
import shutil
import stat
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import argparse

__all__ = [
    "ArtifactError",
    "CGConvergenceWarning",  # noqa: F822 (made on first use: see __getattr__)
    "CGDivergenceError",
    "CGStagnationError",
    "CliError",
    "ConfigError",
    "CorruptFileError",
    "CorruptTileError",
    "DamagedOutput",
    "DeviceUnavailableError",
    "DiskFullError",
    "ForeignPathError",
    "GramReplacedError",
    "IncompleteArrayError",
    "IndefiniteKernelError",
    "InputError",
    "InsufficientDiskError",
    "InsufficientMemoryError",
    "LockHeldError",
    "ManifestError",
    "MissingExtraError",
    "NonFiniteKernelError",
    "NotPositiveDefiniteError",
    "RunDirConflict",
    "RunDirUnusable",
    "SingularKernelWarning",
    "SolveNotConverged",
    "SourceChanged",
    "StageFailed",
    "StoreMismatchError",
    "StoreNotWritableError",
    "StoreUnreachable",
    "Terminated",
    "TileRewriteError",
    "UsageError",
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


class DeviceUnavailableError(ValueError):
    """``device='cuda'`` asked for a GPU that this process cannot use (no CuPy, no CUDA
    device, or too little device memory for one tile); the message names what is
    missing and the fix. Raised before any work starts."""


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


class IncompleteArrayError(CorruptTileError):
    """Tiles a stored array must hold are not there to be read: they have no completion
    record, one without a checksum, or a chunk that cannot be decoded.

    One condition, found two ways (two classes before; ``MissingTileError`` is this
    class, its old name):

    - the array form, ``IncompleteArrayError(store, name, missing, n_tiles=None,
      message=None)``: a consumer found tiles it needs without completion records
      (the Gram in ``tile_cholesky``, the stored-Gram CG operator, ``load_factor``, a
      missing array in ``open_stored``). ``krr run`` reruns the stage that owns the
      store, which computes them.
    - the block form, ``MissingTileError(store, name, tile, reason)``: a verified read
      (:meth:`~pipeline.storage.TiledArray.read_block`) of one block; ``reason`` says
      which of the three it is. ``krr run`` removes the block's record (if any) and
      reruns the stage that owns the store, as for a corrupt tile: the block is
      recomputed instead of read as zeros.

    A :class:`CorruptTileError` (as ``MissingTileError`` was) and so a ValueError (as
    ``IncompleteArrayError`` was): no ``except`` stops catching it.

    Attributes
    ----------
    store, name : str
        The store root and the array name.
    missing : tuple of tuple of int
        The tiles without a (verifiable) completion record: the one block of the
        block form.
    n_tiles : int or None
        How many tiles the array should have (array form), else None.
    tile : tuple of int or None
        The block (block form); None for the array form.
    reason : str or None
        Why the block cannot be verified (block form); None for the array form.
    message : str or None
        The array form's own message, when its raiser gave one.
    """

    def __init__(
        self,
        store: str,
        name: str,
        missing: Iterable[Any],
        n_tiles: int | str | None = None,
        message: str | None = None,
        *,
        reason: str | None = None,
    ) -> None:
        if isinstance(n_tiles, str):  # the block form: (store, name, tile, reason)
            reason, n_tiles = n_tiles, None
        self.name = name
        self.reason = reason
        self.expected = self.found = None
        self.n_tiles = None if n_tiles is None else int(n_tiles)
        self.message = message
        if reason is not None:
            self.store = store
            self.tile = tuple(int(t) for t in missing)
            self.missing = (self.tile,)
            self.expected = self.found = 0
            ValueError.__init__(
                self,
                f"block {self.tile} of array {name!r} in store {store!r} cannot be verified: "
                f"{reason}. Recompute it (remove its marker, if any, and rerun the step that "
                "wrote the array); `krr run` does this by itself when the store belongs to "
                "one of its stages.",
            )
            return
        self.store = str(store)
        self.tile = None
        self.missing = tuple(tuple(int(t) for t in m) for m in sorted(missing))
        ValueError.__init__(self, message or self._incomplete())

    def _incomplete(self) -> str:
        of = "" if self.n_tiles is None else f" of {self.n_tiles}"
        return (
            f"array {self.name!r} in store {self.store!r} is incomplete: {len(self.missing)}{of} "
            f"tiles have no completion record (first: {list(self.missing[:5])}); rerun the "
            "step that builds it (`krr run` does this by itself when the store belongs to "
            "one of its stages)"
        )

    @property
    def problem(self) -> str:
        """One phrase: why the block cannot be verified, or how many tiles lack a record."""
        if self.reason is not None:
            return self.reason
        return f"{len(self.missing)} tiles have no completion record"

    def __reduce__(self):  # picklable across Dask workers despite the custom __init__
        if self.reason is not None:
            return (type(self), (self.store, self.name, self.tile, self.reason))
        return (type(self), (self.store, self.name, self.missing, self.n_tiles, self.message))


#: the block form's old name (``MissingTileError(store, name, tile, reason)``): the same class
MissingTileError = IncompleteArrayError


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


class LockHeldError(RuntimeError):
    """Another live process holds the run directory's lock."""

    def __init__(self, run_dir: Any, owner: dict[str, Any], remote: bool = False) -> None:
        self.run_dir = run_dir
        self.owner = owner
        self.remote = remote
        started = owner.get("started")
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)) if started else "?"
        if remote:
            hint = (
                "This host cannot tell whether that run is alive. Wait for it to finish, "
                "stop it, or use another --run-dir; if it is dead (e.g. its host went down), "
                f"`krr unlock {run_dir}` removes the lock."
            )
        else:
            hint = (
                "Wait for it to finish, stop it, or use another --run-dir "
                f"(`krr unlock {run_dir}` removes a lock left by a dead run)."
            )
        super().__init__(
            f"run directory {str(run_dir)!r} is locked by pid {owner.get('pid')} on "
            f"{owner.get('host')} (running since {when}). {hint}"
        )


class StoreUnreachable(OSError):
    """An object store cannot be used: no filesystem for its scheme, the endpoint
    does not answer, the credentials are refused, or the bucket does not exist."""


class StoreNotWritableError(ValueError, PermissionError):
    """The store location cannot be created or written."""


def file_kind(mode: int) -> str:
    """What a file that is not a regular file is, for messages ("a FIFO (named pipe)"),
    from its ``st_mode``: the one wording of the refusals of special files (run
    directory, ``krr status``, input paths)."""
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


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
    """CG made no progress for ``stagnation_window`` iterations (raised whatever ``strict``).

    ``centre_indices``: a Nyström PCG's centres (row indices), set where
    :func:`~pipeline.linalg.nystrom_solve.nystrom_solve` raised it, so that a direct
    pass can solve on the same centres without choosing them again; None elsewhere."""

    centre_indices: Any = None


class CGDivergenceError(SolveNotConverged):
    """A product, the preconditioner or the residual produced NaN or inf: the solve is
    abandoned at once, so a diverged solve is never scored."""


class SingularKernelWarning(UserWarning):
    """K + lam I was not positive definite; a jittered or least-squares solution was used."""


class InsufficientMemoryError(MemoryError):
    """The in-memory path would need more memory than this machine has available."""


class NonFiniteKernelError(ValueError):
    """The kernel's values are inf or NaN where they are stored (they overflow float64,
    or a float32 Gram): no factor can be computed, whatever lambda or jitter. The
    message names the block and the fix."""


class NotPositiveDefiniteError(ValueError):
    """``K + shift * I`` is not positive definite: a diagonal tile of it (after the
    left-looking update) failed its POTRF, or a solver that serves many shifts from
    one reduction found it for one shift.

    The one type of this condition: the tile Cholesky raises it with the tile, the
    pivot and the regularisation (the message is built from them); the band
    reduction's band Cholesky and the eigendecomposition's smallest eigenvalue (CV)
    raise it through :meth:`of_shift` with their own message (both a plain
    ``ValueError`` before, so ``except ValueError`` still catches it).

    Attributes
    ----------
    tile : tuple of int or None
        The diagonal tile ``(j, j)`` whose POTRF failed (None from :meth:`of_shift`).
    pivot : int or None
        LAPACK's ``info``: the 1-based leading minor of the tile that failed.
    row : int or None
        The 0-based global row of that pivot.
    lam, convention, shift : float, str, float
        The regularisation in use (only ``shift`` from :meth:`of_shift`).
    factor_dtype : str
        The factor's dtype. A float32 factor's updates round at about 6e-8 of
        K's scale, so a shift below that can fail where float64 succeeds (the
        message says so first; docs/PERFORMANCE.md#known-traps).
    """

    def __init__(
        self,
        tile: tuple[int, int] | None,
        pivot: int | None,
        row: int | None,
        lam: float | None,
        convention: str | None,
        shift: float,
        jitter_tried: tuple[float, ...] = (),
        factor_dtype: str = "float64",
        message: str | None = None,
    ) -> None:
        self.tile, self.pivot, self.row = tile, pivot, row
        self.lam, self.convention, self.shift = lam, convention, shift
        self.jitter_tried = jitter_tried
        self.factor_dtype = factor_dtype
        self.message = message
        if message is not None:
            super().__init__(message)
            return
        single = (
            " The factor is float32: its updates round at about 6e-8 of K's scale, and "
            "this shift is too small for that, although K + shift*I may well be positive "
            "definite in float64. Use factor_dtype='float64' (with keep_gram=False, also "
            "dtype float64 in krr run), or a larger lambda."
            if factor_dtype == "float32"
            else ""
        )
        tried = (
            f" Jitter was tried up to {max(jitter_tried):.3g} on that tile's diagonal "
            f"({len(jitter_tried)} tries)."
            if jitter_tried
            else ""
        )
        super().__init__(
            f"K + shift*I is not positive definite: POTRF of diagonal tile {tile} failed at "
            f"pivot {pivot} of the tile (global row {row}), with lambda={lam!r} "
            f"(convention={convention!r}, shift added to the diagonal={shift!r}).{single}{tried} "
            "Options: use a larger alpha/lambda (a PSD kernel with lambda <= 0 is singular); "
            "pass jitter=<relative jitter, e.g. 1e-10> to retry the tile with a recorded "
            "diagonal jitter; or use solver='cg', which needs no factorisation."
        )

    @classmethod
    def of_shift(cls, shift: float, message: str) -> NotPositiveDefiniteError:
        """The whole ``K + shift * I`` found not positive definite (no tile): ``message``
        says how it was found and what to do."""
        return cls(None, None, None, None, None, shift, message=message)

    def __reduce__(self):  # picklable across Dask workers
        return (
            type(self),
            (
                self.tile,
                self.pivot,
                self.row,
                self.lam,
                self.convention,
                self.shift,
                self.jitter_tried,
                self.factor_dtype,
                self.message,
            ),
        )


class InsufficientDiskError(OSError):
    """Too little free disk for the factorisation; raised before any work."""

    def __init__(self, path: str, needed: int, free: int, what: str) -> None:
        self.path, self.needed, self.free, self.what = path, int(needed), int(free), what
        super().__init__(
            f"not enough disk space under {path!r} for {what}: it needs {needed:,} bytes "
            f"({needed / 1e9:.2f} GB) and {free:,} bytes ({free / 1e9:.2f} GB) are free. "
            "Free some space, point the store at a larger disk, or factor in place with "
            "keep_gram=False (the factor then replaces the Gram tile by tile)."
        )

    def __reduce__(self):
        return (type(self), (self.path, self.needed, self.free, self.what))


class GramReplacedError(ValueError):
    """A Gram tile was replaced by an in-place factor and cannot be recomputed here."""


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


class StageFailed(RuntimeError):
    """A stage raised; the original exception is ``__cause__``."""

    def __init__(self, stage: str, cause: BaseException) -> None:
        self.stage = stage
        super().__init__(f"stage {stage!r} failed: {type(cause).__name__}: {cause}")


class RunDirConflict(ValueError):
    """The run directory belongs to another data source (see ``force_new``)."""


class RunDirUnusable(OSError):
    """The run directory cannot be used: it is a file, read-only, or not creatable."""


# ---------------------------------------------------------------------------
# the command line


class CliError(Exception):
    """An error reported as one message and an exit code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class UsageError(Exception):
    """A command line argparse refuses (exit 2); carries the (sub)parser for its usage line."""

    def __init__(self, message: str, parser: argparse.ArgumentParser) -> None:
        super().__init__(message)
        self.parser = parser


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


def caused_by(
    e: BaseException | None,
    kind: type[BaseException],
    where: Callable[[Any], bool] | None = None,
) -> BaseException | None:
    """The first exception of type ``kind`` in ``e``'s chain (``e`` itself, then its
    ``__cause__`` or ``__context__``, and so on), else None. With ``where``, the first
    such one for which ``where(exception)`` is true. A chain that loops is walked once."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, kind) and (where is None or where(e)):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


# ---------------------------------------------------------------------------
# the one class made on first use: CGConvergenceWarning subclasses scikit-learn's
# ConvergenceWarning, and importing sklearn loads numpy and SciPy, which this module
# does not

_LAZY_LOCK = threading.Lock()


def _make_cg_convergence_warning() -> type[Warning]:
    from sklearn.exceptions import ConvergenceWarning

    class CGConvergenceWarning(ConvergenceWarning):
        """CG stopped at ``max_iter`` before reaching ``tol`` (a scikit-learn
        ``ConvergenceWarning``, so ``warnings.simplefilter("error", ConvergenceWarning)``
        catches it)."""

    CGConvergenceWarning.__qualname__ = "CGConvergenceWarning"  # pickles as errors.<name>
    return CGConvergenceWarning


def __getattr__(name: str) -> Any:
    if name == "CGConvergenceWarning":
        with _LAZY_LOCK:  # one class, whichever thread asks first
            cls = globals().get(name)
            if cls is None:
                cls = globals()[name] = _make_cg_convergence_warning()
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
