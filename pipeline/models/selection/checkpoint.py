"""Per-setting checkpoints of a :class:`~pipeline.models.selection.KernelRidgeCV` search.

A killed search restarts from its finished kernel settings: each finished
setting's held-out predictions (every λ and fold) are written to
``{directory}/setting_{i:03d}.npz`` (atomic: temporary file, then rename), and
THEN a marker ``setting_{i:03d}.json`` records the fingerprint of everything that
determines them (the data's content, the folds, the kernel and its setting, the
λ grid, the solver and its options) and the CRC-32C of the ``.npz`` bytes. On
restart a setting is reused only when its marker's fingerprint matches and the
file's checksum verifies; otherwise (another grid, a damaged file) it is
recomputed, with a log line saying why.
"""

from __future__ import annotations

import io
import json
import logging
from typing import Any

import google_crc32c
import numpy as np

from pipeline.blas_guard import gram_t_identity
from pipeline.engine.evaluators import evaluation_identity
from pipeline.kernels import kernel_fingerprint
from pipeline.linalg.nystrom_solve import NYSTROM_RECIPE
from pipeline.models.selection.nystrom_cv import LAMBDA_PATH
from pipeline.storage import fingerprint_blocks, fingerprint_obj
from pipeline.storage.atomic import atomic_write
from pipeline.storage.fingerprint import same_work
from pipeline.storage.location import join_path, read_bytes

__all__ = ["PREDICTIONS_RECIPE", "SettingCheckpoint"]

log = logging.getLogger("pipeline.models.selection")

#: the version of a solver's held-out predictions where their arithmetic moved, entered
#: in its settings' fingerprints (``recipe``): a setting stored by the older arithmetic is
#: recomputed, never mixed with new ones. ``band`` 2: its routed CG preconditions each
#: fold with the one fold form (``FoldNystromBlock``), whose rounding differs from the
#: per-fold form of version 1; predictions agree to the CG tolerance. ``nystrom``: the
#: Nyström arithmetic's version number (``NYSTROM_RECIPE``; at 2 the
#: held-out residuals are summed from predictions of the test rows, where version 1 took
#: them from the moment formula, which cancelled: its stored scores could be wrong) and
#: the search's λ path (``nystrom_cv.LAMBDA_PATH``; at 2 every λ of a fold comes from one
#: eigendecomposition, whose rounding differs from the λ-by-λ factorisations of 1).
PREDICTIONS_RECIPE: dict[str, Any] = {"band": 2, "nystrom": [NYSTROM_RECIPE, LAMBDA_PATH]}


class SettingCheckpoint:
    """Finished settings of one search in ``directory`` (a local path or URL).

    Parameters
    ----------
    directory : str or path
    base : dict
        What every setting's result depends on besides its own parameters (the
        search's options); combined with the data, folds and kernel per setting.
    X, y : ndarray
    splits : list of (train, test)
    """

    def __init__(self, directory: Any, base: dict, X: np.ndarray, y: np.ndarray, splits) -> None:
        self.directory = directory
        self.base = {
            **base,
            "X": fingerprint_blocks([np.ascontiguousarray(X)]),
            "y": fingerprint_blocks([np.ascontiguousarray(y)]),
            "splits": fingerprint_blocks(
                [np.concatenate([np.asarray(tr), [-1], np.asarray(te), [-2]]) for tr, te in splits]
            ),
        }
        # leave-one-out keeps one pooled prediction array per lambda, not one per split
        self.n_folds = 1 if base.get("kind") == "loo" else len(splits)
        self.resumed: list[int] = []

    @classmethod
    def for_search(cls, cv: Any, solver: str, kind: str, X, y, splits) -> SettingCheckpoint:
        """The checkpoint of search ``cv`` (a KernelRidgeCV) in ``cv.checkpoint``."""
        opts = ("lambda_convention", "tol", "max_iter", "preconditioner", "rank",
                "kernel_dtype", "eigen_mode", "block_size", "random_state")  # fmt: skip
        base = {"solver": solver, "kind": kind, **{k: repr(getattr(cv, k, None)) for k in opts}}
        if solver in PREDICTIONS_RECIPE:
            base["recipe"] = PREDICTIONS_RECIPE[solver]
        if getattr(cv, "screen_tol", None) is not None:
            # screening keeps rough solves for the lambdas the scorer does not pick for
            # refining: the stored predictions then depend on these too
            base["screen"] = [repr(cv.screen_tol), repr(cv.screen_top), repr(cv.scoring)]
        if solver == "nystrom":  # the stored held-out statistics depend on the centres
            base["nystrom"] = [repr(cv.n_centers), repr(cv.centers)]
            if getattr(cv, "screen_nested", ()):  # the CV screen's: pivot order, fidelities
                base["nested"] = [int(m) for m in cv.screen_nested]
            base.update(gram_t_identity(int(cv.n_centers)))  # its sums in SYRK panels
        return cls(cv.checkpoint, base, X, y, splits)

    def _paths(self, si: int) -> tuple[Any, Any]:
        stem = f"setting_{si:03d}"
        return join_path(self.directory, stem + ".npz"), join_path(self.directory, stem + ".json")

    def fingerprint(self, kern: Any, setting: dict, alphas: list[float]) -> str:
        # the block CG's inner solves take float32 kernel values: its float32 exp too
        ident32 = evaluation_identity(kern, "float32") if self.base.get("solver") == "cg" else {}
        return fingerprint_obj(
            {
                **self.base,
                "kernel": kernel_fingerprint(kern),
                **evaluation_identity(kern, "float64"),  # the engine's float64 exp
                **({"exp32": ident32["exp"]} if ident32 else {}),
                "setting": {k: repr(v) for k, v in setting.items()},
                "alphas": [float(a) for a in alphas],
            }
        )

    def load(self, si: int, kern: Any, setting: dict, alphas: list[float]) -> dict | None:
        """``{alpha: [pred per fold]}`` of a finished setting, or None to compute it."""
        data_path, marker_path = self._paths(si)
        try:
            marker = json.loads(read_bytes(marker_path))
        except (FileNotFoundError, OSError, ValueError):
            return None
        if not same_work(marker.get("fingerprint"), self.fingerprint(kern, setting, alphas)):
            log.info("setting %d: checkpoint from another search; recomputing", si)
            return None
        try:
            raw = read_bytes(data_path)
        except (FileNotFoundError, OSError):
            log.warning("setting %d: checkpoint data missing; recomputing", si)
            return None
        if google_crc32c.value(raw) != marker.get("crc32c"):
            log.warning("setting %d: checkpoint data fails its checksum; recomputing", si)
            return None
        with np.load(io.BytesIO(raw)) as z:
            out = {
                float(a): [z[f"p_{li}_{f}"] for f in range(self.n_folds)]
                for li, a in enumerate(alphas)
            }
        self.resumed.append(si)
        return out

    def save(self, si: int, kern: Any, setting: dict, alphas: list[float], preds: dict,
             seconds: float) -> None:  # fmt: skip
        """Record a finished setting: the data file, then its marker."""
        buf = io.BytesIO()
        np.savez(
            buf,
            **{
                f"p_{li}_{f}": np.asarray(preds[a][f])
                for li, a in enumerate(alphas)
                for f in range(self.n_folds)
            },
        )
        raw = buf.getvalue()
        data_path, marker_path = self._paths(si)
        atomic_write(str(data_path), raw)
        marker = {
            "fingerprint": self.fingerprint(kern, setting, alphas),
            "crc32c": google_crc32c.value(raw),
            "setting": {k: repr(v) for k, v in setting.items()},
            "alphas": [float(a) for a in alphas],
            "seconds": round(float(seconds), 4),
        }
        atomic_write(str(marker_path), json.dumps(marker).encode())
