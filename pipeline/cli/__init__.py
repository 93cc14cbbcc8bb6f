"""The ``krr`` command line.

Commands
--------
``krr run CONFIG [key=value ...] [--scheduler ADDRESS] [--run-dir DIR] [--force-new]``
    Run, or resume, the pipeline a config describes.
``krr status RUN_DIR [--json]``
    Each stage done, partial, pending (or skipped), with tile counts.
``krr predict MODEL INPUT OUTPUT``
    Batch prediction with a saved model, or with a run directory's latest model
    (``krr predict RUN_DIR ...``; ``krr status RUN_DIR`` lists every configuration's).
``krr validate CONFIG [key=value ...]``
    Check a config and exit.
``krr unlock RUN_DIR``
    Remove a run directory's lock left by a dead run (refused while a live run holds it).

``key=value`` overrides may stand anywhere on the line; ``-q`` / ``-v`` / ``-vv`` set
how much goes to stderr; ``krr run`` appends timestamped lines to ``RUN_DIR/run.log``;
``--json`` prints an error object on stdout on any failure (``docs/CLI.md``).

Exit codes (see :data:`EXIT_CODES`): 0 done; 1 internal error; 2 bad config or
usage (including a run directory that belongs to other data); 3 bad input (a
missing or invalid data file, model or prediction input); 4 a stage failed;
5 the run directory is locked by a live run; 6 the scheduler does not answer;
7 the run directory is unusable (a file, not writable, or a damaged manifest);
130 interrupted; 143 stopped by SIGTERM (handled like Ctrl-C).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import signal
import sys
import threading
import time
import traceback
from typing import Any

import pipeline.stages as stages
from pipeline._version import __version__
from pipeline.cli.args import (
    KrrArgumentParser,
    UsageError,
    json_error,
    not_empty,
    parse_command_line,
    run_log,
    run_log_header,
    stages_after,
)
from pipeline.cli.errors import (
    EXIT_BAD_CONFIG,
    EXIT_CODES,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_LOCKED,
    EXIT_OK,
    EXIT_RUN_DIR,
    EXIT_TERMINATED,
    CliError,
    _check_before_work,
    _check_store,
    _classify_stage_error,
    _client,
    _load,
    _stage_error_hint,
    check_local_run_dir,
    check_scheduler_address,
    store_unreachable,
)
from pipeline.cli.errors import (
    EXIT_BAD_INPUT as EXIT_BAD_INPUT,  # re-exported: every exit code is pipeline.cli.EXIT_*
)
from pipeline.cli.errors import (
    EXIT_NO_SCHEDULER as EXIT_NO_SCHEDULER,  # re-exported: part of pipeline.cli's API
)
from pipeline.cli.errors import (
    EXIT_STAGE_FAILED as EXIT_STAGE_FAILED,
)
from pipeline.cli.output import (
    _fmt,
    _isatty,
    _print_metrics,
    _setup_logging,
    _unconverged_note,
    _verbosity,
)
from pipeline.cli.predict import cmd_predict
from pipeline.cli.run_dir import _run_dir_arg, cmd_report, cmd_status, cmd_unlock
from pipeline.engine.progress import set_progress_mode
from pipeline.errors import (
    ConfigError,
    LockHeldError,
    ManifestError,
    RunDirConflict,
    RunDirUnusable,
    StageFailed,
    Terminated,
)
from pipeline.stages.config import check_run_dir
from pipeline.stages.manifest import Manifest

log = logging.getLogger("krr")


# ---------------------------------------------------------------------------
# parser


_EPILOG = "exit codes:\n" + "\n".join(f"  {c:>3}  {d}" for c, d in EXIT_CODES.items())


def _positive_int(text: str) -> int:
    """An option value that must be a whole number >= 1 (a usage error otherwise: exit 2)."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


def _command(sub: Any, name: str, help_text: str) -> argparse.ArgumentParser:
    """A ``krr NAME`` sub-command, with the exit codes' epilog under its ``--help``."""
    return sub.add_parser(
        name,
        help=help_text,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def _add_verbosity(cmd: argparse.ArgumentParser) -> None:
    """``-v``/``-q`` after a sub-command (unset unless given: the ones before it hold)."""
    cmd.add_argument(
        "-v", "--verbose", action="count", default=argparse.SUPPRESS, help="-v details, -vv debug"
    )
    cmd.add_argument(
        "-q", "--quiet", action="store_true", default=argparse.SUPPRESS, help="warnings only"
    )


def build_parser() -> argparse.ArgumentParser:
    p = KrrArgumentParser(
        prog="krr",
        description="Exact kernel ridge regression, out of core: checkpointed Dask pipeline.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"krr-pipeline {__version__}")
    p.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="-v: more details (distributed's log lines, tracebacks); -vv: debug logs",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="warnings and errors only on stderr")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    r = _command(sub, "run", "run or resume the pipeline of a config")
    r.add_argument("config", metavar="CONFIG", help="YAML config (see conf/)")
    r.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="config overrides, e.g. lambda=1e-4 (anywhere on the line)",
    )
    r.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        type=not_empty,
        help="tcp://host:port of an existing Dask scheduler",
    )
    r.add_argument("--run-dir", metavar="DIR", type=not_empty,
                   help="run directory (default: the config's run_dir)")  # fmt: skip
    r.add_argument(
        "--force-new", action="store_true", help="discard a run dir that holds a run on other data"
    )
    r.add_argument("--until", metavar="STAGE", help="stop after this stage")
    r.add_argument(
        "--json",
        action="store_true",
        help="print the result as JSON on stdout (on failure: an error object)",
    )
    _add_verbosity(r)

    s = _command(sub, "status", "show each stage of a run dir: done, partial or pending")
    s.add_argument("run_dir", metavar="RUN_DIR")
    s.add_argument(
        "--json", action="store_true", help="machine-readable output (on failure: an error object)"
    )
    _add_verbosity(s)

    pr = _command(sub, "predict", "batch prediction with a saved model")
    pr.add_argument(
        "model", metavar="MODEL", help="model artifact, or a run directory (its latest model)"
    )
    pr.add_argument("input", metavar="INPUT", help=".npy, Zarr, Parquet or CSV file of new points")
    pr.add_argument(
        "output",
        metavar="OUTPUT",
        help="output; its extension sets the format: .zarr (resumable), .npy, .csv, .parquet",
    )
    pr.add_argument(
        "--columns",
        help="comma-separated feature columns of a Parquet/CSV input (default: the model's "
        "feature names; other columns are then refused)",
    )
    pr.add_argument(
        "--block-size", type=_positive_int, default=4096, help="rows per block (default 4096)"
    )
    pr.add_argument("--scheduler", metavar="ADDRESS", type=not_empty,
                    help="tcp://host:port of a Dask scheduler")  # fmt: skip
    pr.add_argument("--nan-policy", choices=("raise", "propagate"), default="raise",
                    help="rows with NaN or inf: refuse the input (default), or predict NaN "
                    "for them")  # fmt: skip
    pr.add_argument(
        "--overwrite",
        action="store_true",
        help="replace predictions the pipeline wrote (of another model or input); a file or "
        "directory it did not write is never replaced",
    )
    pr.add_argument(
        "--x-train",
        metavar="PATH_OR_URL",
        help="where X_train is, for a model saved with a reference outside its directory "
        "(its checksum is verified)",
    )
    _add_verbosity(pr)

    u = _command(sub, "unlock", "remove the lock of a dead run (refused while a live run holds it)")
    u.add_argument("run_dir", metavar="RUN_DIR")
    _add_verbosity(u)

    rp = _command(sub, "report", "write a self-contained HTML report of a run dir")
    rp.add_argument("run_dir", metavar="RUN_DIR")
    rp.add_argument(
        "-o", "--output", metavar="FILE", help="HTML file (default RUN_DIR/report.html)"
    )
    _add_verbosity(rp)

    v = _command(sub, "validate", "check a config and exit")
    v.add_argument("config", metavar="CONFIG")
    v.add_argument("overrides", nargs="*", metavar="key=value", help="anywhere on the line")
    _add_verbosity(v)
    p._krr_subparsers = {
        "run": r,
        "status": s,
        "predict": pr,
        "unlock": u,
        "report": rp,
        "validate": v,
    }
    return p


# ---------------------------------------------------------------------------
# commands


def cmd_validate(args) -> int:
    cfg = _load(args.config, args.overrides)
    _check_before_work(cfg)
    check_local_run_dir(cfg.resolved_run_dir())  # as `krr run` would refuse it (exit 7)
    # an object store that does not answer, refuses the credentials or lacks the bucket:
    # the same bounded check and message as `krr run` (exit 7), creating nothing
    _check_store(cfg.resolved_run_dir(), cfg, dry_run=True)
    print(f"config {args.config!r} is valid")
    print(
        f"  data: {cfg.data.source} {cfg.data.package or ''} {cfg.data.name or cfg.data.path or ''}"
    )
    print(f"  kernel: {cfg.kernel.to_spec()}")
    print(f"  lambda: {cfg.lam:g} ({cfg.lam_convention} convention); solver: {cfg.solver.method}")
    if cfg.cv is not None:
        grid = cfg.cv.param_grid or {}
        print(
            f"  cv: {len(cfg.cv.alphas)} lambdas x {grid or 'no kernel grid'}, folds {cfg.cv.folds}"
            f", scoring {cfg.cv.scoring or 'r2'} (replaces lambda and the searched kernel params)"
        )
    print(f"  block_size: {cfg.block_size}, dtype: {cfg.dtype}")
    print(f"  run_dir: {cfg.resolved_run_dir()}")
    return EXIT_OK


def cmd_run(args) -> int:
    cfg = _load(args.config, args.overrides)
    if args.scheduler:
        check_scheduler_address(args.scheduler, "--scheduler")
        cfg = cfg.model_copy(
            update={"cluster": cfg.cluster.model_copy(update={"address": args.scheduler})}
        )
    if args.until and args.until not in stages.STAGE_NAMES:
        raise CliError(
            f"--until {args.until!r}: not a stage; stages are {list(stages.STAGE_NAMES)}",
            EXIT_BAD_CONFIG,
        )
    run_dir = _run_dir_arg(args.run_dir) if args.run_dir else cfg.resolved_run_dir()
    if args.run_dir:
        try:
            check_run_dir(str(run_dir), "--run-dir")
        except ValueError as e:
            raise CliError(str(e), EXIT_BAD_CONFIG) from None
    _check_before_work(cfg)
    _check_store(run_dir, cfg)
    tty = _isatty()
    stack = contextlib.ExitStack()
    clients: list[Any] = []

    def ensure_client() -> None:
        """Open the Dask client once, when the first stage has work to do: a run whose
        stages are all complete starts no LocalCluster."""
        if clients:
            return
        try:
            client = stack.enter_context(
                _client(
                    cfg.cluster.address,
                    cfg.cluster,
                    want_dashboard=tty and cfg.cluster.dashboard,
                    source="--scheduler" if args.scheduler else "cluster.address",
                )
            )
        except OSError as e:  # the LocalCluster did not start (not the run directory's fault)
            raise CliError(
                f"the local Dask cluster did not start: {type(e).__name__}: {e}", EXIT_INTERNAL
            ) from e
        clients.append(client)
        link = getattr(client, "dashboard_link", None)
        if tty and link and (cfg.cluster.dashboard or cfg.cluster.address):
            print(f"Dask dashboard: {link}", file=sys.stderr)

    def on_event(stage: str, event: str, info: dict[str, Any]) -> None:
        if event == "start":
            ensure_client()
            log.info("[%s] %s", stage, "resuming" if info.get("resumed") else "running")
            if _verbosity() >= 1:
                log.info("[%s] fingerprint %s", stage, info.get("fingerprint"))
        elif event == "done":
            log.info("[%s] done in %.1f s", stage, info["seconds"])
        elif event == "skip":
            log.info("[%s] complete, skipped", stage)
        elif event == "disabled":
            log.info("[%s] not needed for this config", stage)
        elif event == "invalidate":
            log.info("[%s] config changed: recomputing", stage)
        elif event == "configuration":  # results kept per configuration (stages.results)
            log.info(
                "configuration %s: %s", info["key"], info["dir"] + (" (new)" if info["new"] else "")
            )
        elif event == "failed":
            log.error("[%s] failed: %s", stage, info.get("error"))
        elif event == "interrupted":
            log.warning("[%s] interrupted (%s): recorded as interrupted", stage, info.get("error"))

    @contextlib.contextmanager
    def session(run_dir, lock):
        """What ``krr run`` adds around the runner's stages, once the lock is held: its
        run.log, its Dask client, and its exit codes for the runner's errors."""
        level = logging.DEBUG if _verbosity() >= 2 else logging.INFO
        runlog = run_log(run_dir, level, run_log_header(args))

        def finish(report) -> None:
            if getattr(lock, "lost", False):  # an object-store lease another run took over
                raise CliError(
                    f"another run took over the lock of {str(run_dir)!r} while this one ran "
                    "(its lease was not renewed in time): its results may mix with the other "
                    "run's; wait for that run, then rerun the same command to verify and resume",
                    EXIT_LOCKED,
                )
            done = f"stopped after stage {args.until} (--until)" if args.until else "run complete"
            runlog.write(
                logging.INFO,
                f"{done}: ran {', '.join(report.ran) or '-'}; already complete: "
                f"{', '.join(report.skipped_done) or '-'}",
            )

        try:
            runlog.__enter__()
            if lock.took_over:
                log.warning(
                    "took over a stale lock of pid %s (that run was killed); resuming",
                    lock.took_over.get("pid"),
                )
            log.info("run dir: %s", run_dir)
            try:  # a damaged manifest is reported before a cluster is started
                Manifest.load(run_dir)
            except ManifestError as e:
                raise CliError(str(e), EXIT_RUN_DIR) from None
            with stack:
                if cfg.cluster.address:  # an external scheduler: checked before any work
                    ensure_client()
                try:
                    yield finish
                except RunDirConflict as e:
                    raise CliError(str(e), EXIT_BAD_CONFIG) from None
                except ManifestError as e:
                    raise CliError(str(e), EXIT_RUN_DIR) from None
                except ConfigError as e:  # the config against the data (e.g. the kernel's width)
                    raise CliError(str(e), EXIT_BAD_CONFIG) from None
                except StageFailed as e:
                    code = _classify_stage_error(e)
                    if getattr(args, "verbose", False):
                        traceback.print_exception(e.__cause__, file=sys.stderr)
                    raise CliError(f"{e}\n{_stage_error_hint(e, code)}", code) from None
                except OSError as e:  # outside every stage: the manifest or the run directory
                    raise CliError(
                        f"run directory {str(run_dir)!r} is unusable: {type(e).__name__}: {e}",
                        EXIT_RUN_DIR,
                    ) from None
        except CliError as e:
            runlog.write(logging.ERROR, f"failed (exit {e.code}): {e}")
            raise
        except Terminated as e:  # SIGTERM (systemd, Slurm, Kubernetes): stopped like Ctrl-C
            runlog.write(
                logging.WARNING,
                f"stopped by signal {e.signum} (SIGTERM) (exit {EXIT_TERMINATED}); the lock is "
                "released; rerun the same command to resume",
            )
            raise
        except BaseException as e:
            runlog.write(logging.ERROR, f"failed: {type(e).__name__}: {e}")
            raise
        finally:
            runlog.__exit__()

    t0 = time.perf_counter()
    try:  # the runner of pipeline.run: the lock, the stages
        report = stages.run_config(
            cfg,
            run_dir,
            force_new=args.force_new,
            until=args.until,
            on_event=on_event,
            session=session,
        )
    except LockHeldError as e:
        raise CliError(str(e), EXIT_LOCKED) from None
    except RunDirUnusable as e:
        raise CliError(str(e), EXIT_RUN_DIR) from None
    wall = time.perf_counter() - t0
    outputs = report.outputs
    result = {
        "run_dir": str(run_dir),
        "ran": report.ran,
        "skipped": report.skipped_done,
        "not_needed": report.disabled,
        "seconds": round(wall, 3),
        "solver": (outputs.get("solve") or {}).get("method"),
        "selected": (outputs.get("select") or {}).get("best_params"),
        "model": (outputs.get("model") or {}).get("path"),
        "configuration": report.configuration,
        "evaluate": outputs.get("evaluate"),
    }
    result = {"ok": True, "exit_code": EXIT_OK, **result}
    unconverged = _unconverged_note(outputs.get("solve"))
    if unconverged:
        result["unconverged_solve"] = unconverged
    # (the recorded nodes too: whether the gram stage is needed is the fit plan's call)
    remaining = stages_after(args.until, cfg.stage_params(), {**outputs, **report.nodes})
    if args.until:
        result["stopped_after"] = args.until
        result["remaining"] = remaining
    if args.json:
        print(json.dumps(result, indent=2, default=str))
        return EXIT_OK
    if args.until:
        print(
            f"stopped after stage {args.until} (--until {args.until}) in {wall:.1f} s: {run_dir}"
            f"; remaining: {', '.join(remaining) or '-'} (rerun without --until to finish)"
        )
    else:
        print(f"run complete in {wall:.1f} s: {run_dir}")
    print(
        f"  ran: {', '.join(report.ran) or '-'}; already complete: {', '.join(report.skipped_done) or '-'}"
    )
    if result["selected"]:
        sel = outputs["select"]
        chosen = ", ".join(f"{k}={_fmt(v)}" for k, v in sel["best_params"].items())
        print(
            f"  selected by {sel['n_splits']}-split CV ({sel['n_candidates']} candidates, "
            f"{sel['scoring']} {_fmt(sel['best_score'])}): {chosen}"
        )
    if result["solver"]:
        sol = outputs["solve"]
        extra = f", {sol['n_iter']} CG iterations" if "n_iter" in sol else ""
        print(f"  solver: {sol['method']} (shift {sol.get('shift', float('nan')):.4g}{extra})")
    if unconverged:
        print(f"  UNCONVERGED SOLVE ACCEPTED: {unconverged}")
    if result["model"]:
        print(f"  model: {result['model']}")
    if report.configuration:  # `krr status` lists every configuration kept in the run dir
        print(f"  configuration: {report.configuration} (latest; `krr status` lists all)")
    if outputs.get("evaluate"):
        _print_metrics(outputs["evaluate"])
    return EXIT_OK


_COMMANDS = {
    "run": cmd_run,
    "status": cmd_status,
    "predict": cmd_predict,
    "validate": cmd_validate,
    "unlock": cmd_unlock,
    "report": cmd_report,
}


@contextlib.contextmanager
def _sigterm_as_interrupt():
    """While a command runs, SIGTERM (the stop signal of systemd, Slurm and Kubernetes)
    raises :class:`~pipeline.errors.Terminated`, a KeyboardInterrupt, in the main thread:
    it stops like Ctrl-C (the stage recorded ``interrupted``, the lock released, a line
    in ``run.log``) and ``krr`` exits 143. The previous handler comes back afterwards
    (``main`` is also called in-process, e.g. by the tests)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        # a second SIGTERM while this one unwinds: the previous (default) action
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
        raise Terminated(signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: list[str] | None = None) -> int:
    """The ``krr`` command: the exit code (see :data:`EXIT_CODES`); with ``--json`` every
    failure also prints an error object on stdout."""
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    parser = build_parser()
    want_json = "--json" in argv
    try:
        args = parse_command_line(parser, parser._krr_subparsers, argv)
    except UsageError as e:
        e.parser.print_usage(sys.stderr)
        print(f"{e.parser.prog}: error: {e}", file=sys.stderr)
        if want_json:
            json_error(EXIT_BAD_CONFIG, str(e))
        return EXIT_BAD_CONFIG
    if not args.command:
        parser.print_help()
        return EXIT_BAD_CONFIG
    verbose = getattr(args, "verbose", 0)
    _setup_logging(verbose, quiet=getattr(args, "quiet", False))
    if getattr(args, "quiet", False):  # -q: no bars or progress lines either
        set_progress_mode("off")
    want_json = getattr(args, "json", False)
    try:
        with _sigterm_as_interrupt():
            return _COMMANDS[args.command](args)
    except CliError as e:
        print(f"krr {args.command}: error: {e}", file=sys.stderr)
        if want_json:
            json_error(e.code, str(e))
        return e.code
    except Terminated as e:
        msg = f"stopped by signal {e.signum} (SIGTERM); rerun the same command to resume"
        print(f"krr {args.command}: {msg}", file=sys.stderr)
        if want_json:
            json_error(EXIT_TERMINATED, msg)
        return EXIT_TERMINATED
    except KeyboardInterrupt:
        print(f"krr {args.command}: interrupted; rerun to resume", file=sys.stderr)
        if want_json:
            json_error(EXIT_INTERRUPTED, "interrupted; rerun to resume")
        return EXIT_INTERRUPTED
    except Exception as e:  # a bug: say so, with the traceback when asked
        store = store_unreachable(e)
        if store is not None:  # an object store that stopped answering is not a bug
            print(f"krr {args.command}: error: {store}", file=sys.stderr)
            if want_json:
                json_error(EXIT_RUN_DIR, str(store))
            return EXIT_RUN_DIR
        if verbose:
            traceback.print_exc()
        print(
            f"krr {args.command}: internal error: {type(e).__name__}: {e} (rerun with -v for the traceback)",
            file=sys.stderr,
        )
        if want_json:
            json_error(EXIT_INTERNAL, f"{type(e).__name__}: {e}", exception=type(e).__name__)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
