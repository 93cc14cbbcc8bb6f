"""Gram stage: K(X_train, X_train) as lower tiles in ``{stage_dir}/gram.zarr``.

Runs only when the solver reads a stored Gram (Cholesky, or CG with the stored
matvec). For an in-place Cholesky (``keep_gram: false``) it only creates the array:
the factor computes each Gram tile from X when it needs it. It calls
:func:`pipeline.linalg.gram.build_gram`, which checkpoints per tile,
so a rerun after a kill computes only the tiles without a completion record.
"""

from __future__ import annotations

import functools
import logging
import shutil
from pathlib import Path
from typing import Any

import pipeline.constants as C
from pipeline.linalg.gram import build_gram
from pipeline.stages.catalog import stage_catalog
from pipeline.stages.ingest import open_rows
from pipeline.stages.outputs import GramOutput, IngestOutput
from pipeline.storage import ForeignPathError
from pipeline.storage.location import is_url

log = logging.getLogger(__name__)


def run(
    stage_dir: Path,
    inputs: dict[str, dict[str, Any]],
    *,
    kernel: dict[str, Any],
    block_size: int,
    dtype: str,
    on_demand: bool = False,
) -> GramOutput:
    """Build (or finish building) the Gram of the ingested training rows.

    ``on_demand``: only create the Gram's array (``build_gram(defer=True)``); the
    in-place factor of the solve stage computes each tile from X when it needs it.
    """
    ing = IngestOutput.from_json(inputs["ingest"])
    store, name = stage_catalog("gram", stage_dir).store("gram")
    build = functools.partial(
        build_gram,
        open_rows(ing, "X_train"),
        kernel,
        store,
        block_size,
        dtype,
        name=name,
        overwrite=True,
        x_fingerprint=ing.x_fingerprint,
        kernel_dtype=C.GRAM_ON_DEMAND_KERNEL_DTYPE if on_demand else None,
        defer=on_demand,
    )
    try:
        gram = build()
    except ForeignPathError as e:
        if is_url(store) or not Path(e.path).resolve().is_relative_to(Path(store).resolve()):
            raise
        # an unreadable array in this stage's own directory (which holds only what the
        # pipeline wrote, runner.py): e.g. a damaged zarr.json, which no rerun could
        # get past. The store (array and completion records) is removed and built again
        log.warning("the Gram's array in %s is unreadable (%s): building it again", store, e)
        shutil.rmtree(store)
        gram = build()
    return GramOutput(
        store=gram.store,
        name=gram.name,
        fingerprint=gram.fingerprint,
        shape=list(gram.shape),
        block_size=gram.block_size,
        dtype=dtype,
        tiles=gram.grid.n_lower_tiles(),
    )
