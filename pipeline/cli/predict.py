"""``krr predict``: batch prediction with a saved model (see :mod:`pipeline.cli`).

Kept apart from :mod:`pipeline.cli` so each stays short.
"""

from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path

import numpy as np

from pipeline.cli.errors import (
    EXIT_BAD_CONFIG,
    EXIT_BAD_INPUT,
    EXIT_OK,
    EXIT_RUN_DIR,
    CliError,
    _client,
    check_input_file,
    check_scheduler_address,
    disk_full_hint,
    disk_full_in,
)
from pipeline.errors import ArtifactError, DiskFullError, StoreNotWritableError
from pipeline.linalg.predict_source import select_features
from pipeline.models.artifact import load_artifact
from pipeline.stages.config import ClusterConfig
from pipeline.stages.status import latest_model
from pipeline.storage.inputs import as_row_blocks
from pipeline.storage.predictions import (
    check_prediction_output,
    output_format,
    write_predictions,
)

log = logging.getLogger("krr")

__all__ = ["cmd_predict"]


def cmd_predict(args) -> int:
    if args.scheduler:  # a malformed address is a usage error, before any work
        check_scheduler_address(args.scheduler, "--scheduler")
    try:  # the output format follows the extension: checked before any work
        fmt = output_format(args.output)
    except ValueError as e:
        raise CliError(str(e), EXIT_BAD_CONFIG) from None
    try:  # a user's file (or our own predictions without --overwrite) is kept: before any work
        check_prediction_output(args.output, args.overwrite)
    except ImportError as e:  # a .parquet output without its extra
        raise CliError(str(e), EXIT_BAD_CONFIG) from None
    except StoreNotWritableError as e:  # the environment: before any work (not after it)
        raise CliError(str(e), EXIT_RUN_DIR) from None
    except (ValueError, FileExistsError) as e:
        raise CliError(str(e), EXIT_BAD_INPUT) from None
    if (Path(args.model) / "manifest.json").is_file():  # a run directory: its latest model
        try:
            args.model = latest_model(args.model)
        except ValueError as e:
            raise CliError(str(e), EXIT_BAD_INPUT) from None
    if not Path(args.model).exists() and "://" not in args.model:
        raise CliError(f"model {args.model!r} does not exist", EXIT_BAD_INPUT)
    try:
        model = load_artifact(args.model, x_train=args.x_train)
    except (ArtifactError, FileNotFoundError) as e:
        raise CliError(f"model {args.model!r}: {e}", EXIT_BAD_INPUT) from None
    except ValueError as e:  # e.g. --x-train for a model that stores its rows
        raise CliError(f"model {args.model!r}: {str(e).replace('x_train=', '--x-train')}",
                       EXIT_BAD_CONFIG) from None  # fmt: skip
    inp = args.input
    if "://" not in inp and not any(c in inp for c in "*?[") and not Path(inp).exists():
        raise CliError(f"input {inp!r} does not exist", EXIT_BAD_INPUT)
    check_input_file("input", inp)  # a FIFO, an empty .npy: bad input, before any work
    out = args.output
    ctx = contextlib.nullcontext()
    if args.scheduler:
        ctx = _client(args.scheduler, ClusterConfig(address=args.scheduler), want_dashboard=False)
    t0 = time.perf_counter()
    with ctx:
        try:
            cols = args.columns.split(",") if args.columns else None
            X = select_features(
                inp,
                args.block_size,
                feature_names=model.feature_names,
                n_features=model.n_features,
                columns=cols,
                ordinal=(model.extra or {}).get("ordinal"),
            )
            if X is inp:
                X = as_row_blocks(inp, args.block_size)
            if fmt != "zarr":
                y = np.asarray(
                    model.predict(X, block_size=args.block_size, nan_policy=args.nan_policy)
                )
                write_predictions(out, y, fmt, model.target_names, overwrite=args.overwrite)
                n = len(y)
            else:
                res = model.predict(
                    X, out=out, block_size=args.block_size, overwrite=args.overwrite,
                    nan_policy=args.nan_policy,
                )  # fmt: skip
                n = res.shape[0]
                log.info(
                    "%d of %d row blocks computed (%d already complete)",
                    res.n_computed,
                    res.n_blocks,
                    res.n_skipped,
                )
        except ImportError as e:  # a .parquet or .csv input without its extra
            raise CliError(str(e), EXIT_BAD_CONFIG) from None
        except (ValueError, FileNotFoundError) as e:
            raise CliError(f"cannot predict {inp!r}: {e}", EXIT_BAD_INPUT) from None
        except OSError as e:
            full = disk_full_in(e)
            if full is None:
                raise
            hint = "" if full is e and isinstance(e, DiskFullError) else f"; {disk_full_hint(full)}"
            raise CliError(f"cannot write the predictions to {out!r}: {e}{hint}",
                           EXIT_RUN_DIR) from None  # fmt: skip
    print(f"predicted {n} rows in {time.perf_counter() - t0:.1f} s -> {out}")
    return EXIT_OK
