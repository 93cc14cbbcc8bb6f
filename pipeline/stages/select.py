"""Select stage: λ and kernel parameters by cross-validation, before the final solve.

Runs only when the config has a ``cv`` section. It fits a
:class:`pipeline.KernelRidgeCV` (built by
:func:`pipeline.models.selection.search_from_config`) on the ingested training
rows, without its refit (the solve stage does the final fit), and writes the
search report into its directory: ``cv_results.csv``, ``cv_search.json``,
``cv_score_vs_alpha.png`` and, with one kernel parameter, ``cv_heatmap.png``.
Each finished kernel setting is recorded in ``settings/`` (atomic, checksummed,
fingerprinted): a killed search restarts from its finished settings. Its outputs
carry the score of every grid point (``grid``), the chosen point and the search's
cost in seconds, for the run report.

Scores are in the units of the data's y: with ``standardize_y`` the stored
``y_train`` is standardised, and :class:`OriginalUnits` maps predictions and
targets back before the scorer sees them. The folds are cut from the rows as the
ingest standardised them (the scalers' moments are those of all training rows,
not refitted per fold as a scikit-learn ``Pipeline`` would).

Its outputs ``kernel`` (the kernel spec with the selected parameters) and
``lam`` replace the configured ones in the downstream stages' arguments, so
their fingerprints are those of the selected model: a new grid that selects
the same kernel keeps the Gram, one that selects another kernel does not.
"""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.kernels import make_kernel
from pipeline.models.estimator import KernelRidge
from pipeline.models.selection import save_search_report, search_from_config
from pipeline.models.selection.guard import FixedPredictions
from pipeline.models.selection.report import CV_SECTION_KEYS
from pipeline.models.selection.scoring import target_exponent
from pipeline.stages.catalog import stage_catalog
from pipeline.stages.ingest import open_rows
from pipeline.storage.location import is_url, join_path, upload_file

log = logging.getLogger("pipeline.stages")


def _save_report(save: Any, search: Any, stage_dir: Any) -> dict[str, Any]:
    """``save(search, dir)``; for an object-store stage directory, written to a local
    temporary directory and uploaded (the report writers use local paths)."""
    if not is_url(stage_dir):
        return save(search, stage_dir)
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        local = save(search, tmp)
        return {k: upload_file(p, join_path(stage_dir, Path(p).name)) for k, p in local.items()}


class OriginalUnits:
    """A scorer that scores predictions and targets mapped back from the standardised y.

    With ``preprocess.standardize_y`` the stored ``y_train`` is ``(y - mean) / scale``,
    so a scale-dependent scorer (``neg_mean_squared_error``) scored on it was divided by
    ``scale**2`` while the evaluate stage reports the data's units (1,100 times too
    small in the review's example). R² is the same either way.

    Data whose y lies far from 1 (``|mean| + scale`` outside ``[2**-100, 2**100)``) is
    mapped back to ``2**k`` times its units, where the scorer's squares neither
    underflow nor overflow, and ``score_back`` tells the search to multiply the
    scores by ``2**score_back`` after ranking them
    (:func:`pipeline.models.selection.scoring.target_exponent`; issue #44: at 1e-200 every
    R² was 1.0). Ordinary y: ``k = score_back = 0``, the same bits as before.
    """

    def __init__(self, scoring: Any, mean: Any, scale: Any) -> None:
        from sklearn.metrics import check_scoring

        self.scoring = scoring
        self.mean = np.asarray(mean, dtype=np.float64)
        self.scale = np.asarray(scale, dtype=np.float64)
        self._scorer = check_scoring(KernelRidge(), scoring="r2" if scoring is None else scoring)
        size = (np.abs(self.mean) + np.abs(self.scale)).reshape(1, -1)  # a row: per column
        self._k, self.score_back = target_exponent(size, scoring)

    def _back(self, y: Any) -> np.ndarray:
        y = np.asarray(y, dtype=np.float64)
        mean, scale = np.ldexp(self.mean, self._k), np.ldexp(self.scale, self._k)
        m, s = (mean, scale) if y.ndim == 2 else (mean[0], scale[0])
        return y * s + m

    def __call__(self, estimator: Any, X: Any, y: Any) -> float:

        return self._scorer(FixedPredictions(self._back(estimator.predict(X))), X, self._back(y))

    def __repr__(self) -> str:  # deterministic: part of a screened search's checkpoint key
        return (
            f"OriginalUnits({self.scoring!r}, mean={self.mean.tolist()!r}, "
            f"scale={self.scale.tolist()!r})"
        )


def run(
    stage_dir: Path,
    inputs: dict[str, dict[str, Any]],
    *,
    cv: dict[str, Any],
    kernel: dict[str, Any],
    lam_convention: str,
    block_size: int,
) -> dict[str, Any]:
    """Search the ``cv`` grid on the training rows; return the selected kernel and λ."""
    keys = CV_SECTION_KEYS
    catalog = stage_catalog("select", stage_dir)

    ing = inputs["ingest"]
    X = np.asarray(open_rows(ing, "X_train").compute(), dtype=np.float64)
    y = np.asarray(open_rows(ing, "y_train").compute(), dtype=np.float64)
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    section = {k: v for k, v in cv.items() if k in keys}
    options = {k: v for k, v in cv.items() if k not in keys}
    y_scaler = ing.get("y_scaler")
    if y_scaler:  # y_train is stored standardised: score in the units of the data's y
        section["scoring"] = OriginalUnits(section.get("scoring"), **y_scaler)
    search = search_from_config(
        section,
        kernel=kernel,
        lam_convention=lam_convention,
        block_size=min(block_size, X.shape[0]),
        store=catalog.store("cv")[0],
        refit=False,
        progress=True,  # one step per kernel setting, as pipeline.engine.progress's mode says
        checkpoint=str(catalog.path("cv_settings")),
        **options,
    )
    search.fit(X, y)
    paths = _save_report(save_search_report, search, stage_dir)
    best = dict(search.best_params_)
    lam = float(best.pop("alpha"))
    selected = copy.deepcopy(make_kernel(kernel)).set_params(**best).to_spec()
    stats = search.search_stats_
    log.info(
        "select: %s (lambda=%g) by %d-split CV (%s), score %.6g",
        best or selected,
        lam,
        search.n_splits_,
        search.solver_,
        search.best_score_,
    )
    return {
        "kernel": selected,
        "lam": lam,
        "best_params": {"alpha": lam, **{k: _plain(v) for k, v in best.items()}},
        "best_score": float(search.best_score_),
        "scoring": cv.get("scoring") or "r2",
        "n_candidates": len(search.cv_results_["params"]),
        "n_splits": int(search.n_splits_),
        "solver": search.solver_,
        "work": {
            k: stats[k]
            for k in (
                "kernel_matrices",
                "gram_tiles_built",
                "gram_tiles_reused",
                "eigendecompositions",
                "band_reductions",
                "factorizations",
                "cg_iterations",
                "cg_passes_float32",
                "cg_passes_float64",
                "preconditioner_ranks",
                "verified_score",
            )
            if k in stats
        },
        "report": {k: str(p) for k, p in paths.items()},
        # for the run report: the score of every grid point, the chosen one, the cost
        "grid": _grid(search),
        "seconds": {
            k: float(v) for k, v in stats["seconds"].items() if not k.startswith("setting_")
        },
        "settings_resumed": int(stats.get("settings_resumed", 0)),
        # λ for the full N: the grid's rows, and the refinement's curve (None: none)
        "subsample": None
        if search.subsample_indices_ is None
        else int(len(search.subsample_indices_)),
        "refine": search.refine_results_,
        "redone_direct": int(stats.get("redone_direct", 0)),
    }


def _grid(search: Any) -> dict[str, Any]:
    """The score per grid point (``params`` with ``alpha`` and kernel parameters)."""
    res = search.cv_results_
    return {
        "params": [{k: _plain(v) for k, v in p.items()} for p in res["params"]],
        "mean_test_score": [float(v) for v in res["mean_test_score"]],
        "std_test_score": [float(v) for v in res["std_test_score"]],
        "best_index": int(search.best_index_),
    }


def _plain(v: Any) -> Any:
    return v.item() if isinstance(v, np.generic) else v
