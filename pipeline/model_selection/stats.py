"""Typed work counters of a :class:`~pipeline.model_selection.KernelRidgeCV` search.

The strategies count into a plain dict (:func:`new_stats`, merged across threads
by :func:`merge_stats`); the search then exposes it as ``search_stats_`` (the same
dict, for JSON reports and code that reads keys) and as the typed
:class:`SearchStats` in ``search_statistics_``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

__all__ = ["SearchStats", "merge_stats", "new_stats"]


@dataclass(frozen=True)
class SearchStats:
    """What a search did.

    Attributes
    ----------
    kernel_settings, candidates, folds : int
        Grid size.
    kernel_matrices : int
        Kernel matrices evaluated in memory, or Grams stored out of core.
    gram_tiles_built, gram_tiles_reused : int
        Out of core: Gram tiles computed, and found complete in the store.
    eigendecompositions, band_reductions, factorizations : int
        Work of the eigen, band and Cholesky strategies.
    factor_tiles, factor_tile_reads : int
        Out-of-core Cholesky tiles computed and read.
    cg_iterations, cg_matvecs, cg_solves, preconditioner_builds : int
        Work of the CG strategies.
    fold_fits_equivalent : int
        Fold fits a plain grid search would have done.
    seconds : dict of str to float
        Wall time per phase.
    routes : list of dict
        ``solver="auto"``: per kernel setting, the routing decision and its predictions.
    eigen_modes : list of str
        The eigen strategy's mode per kernel setting.
    band_workers : int or None
        Concurrent band reductions.
    """

    kernel_settings: int = 0
    candidates: int = 0
    folds: int = 0
    kernel_matrices: int = 0
    gram_tiles_built: int = 0
    gram_tiles_reused: int = 0
    eigendecompositions: int = 0
    band_reductions: int = 0
    factorizations: int = 0
    factor_tiles: int = 0
    factor_tile_reads: int = 0
    cg_iterations: int = 0
    cg_matvecs: int = 0
    cg_solves: int = 0
    preconditioner_builds: int = 0
    fold_fits_equivalent: int = 0
    seconds: dict[str, float] = field(default_factory=dict)
    routes: list[dict[str, Any]] = field(default_factory=list)
    eigen_modes: list[str] = field(default_factory=list)
    band_workers: int | None = None
    other: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SearchStats:
        """The typed form of a counters dict; unknown keys go to ``other``."""
        names = {f.name for f in fields(cls)} - {"other"}
        known = {k: v for k, v in d.items() if k in names}
        return cls(**known, other={k: v for k, v in d.items() if k not in names})

    def __getitem__(self, key: str) -> Any:
        """Dict-style read, as ``search_stats_[key]``."""
        if key in {f.name for f in fields(self)} - {"other"}:
            return getattr(self, key)
        return self.other[key]


def new_stats() -> dict[str, Any]:
    """Zeroed counters (the keys of :class:`SearchStats` that every search reports)."""
    return {
        "kernel_settings": 0,
        "candidates": 0,
        "folds": 0,
        "kernel_matrices": 0,
        "gram_tiles_built": 0,
        "gram_tiles_reused": 0,
        "eigendecompositions": 0,
        "band_reductions": 0,
        "factorizations": 0,
        "factor_tiles": 0,
        "factor_tile_reads": 0,
        "cg_iterations": 0,
        "cg_matvecs": 0,
        "cg_solves": 0,
        "preconditioner_builds": 0,
        "fold_fits_equivalent": 0,
        "seconds": {},
    }


def merge_stats(into: dict[str, Any], part: dict[str, Any]) -> None:
    """Add the counters of ``part`` (one kernel setting) into ``into``."""
    for k, v in part.items():
        if k in ("kernel_settings", "candidates", "folds"):
            continue
        if isinstance(v, dict):
            for kk, vv in v.items():
                into[k][kk] = round(into[k].get(kk, 0) + vv, 4)
        elif isinstance(v, list):
            into.setdefault(k, []).extend(v)
        else:
            into[k] = into.get(k, 0) + v
