"""Typed work counters of a :class:`~pipeline.models.selection.KernelRidgeCV` search.

The strategies count into a :class:`SearchStats` (one per kernel setting, merged
across threads by :meth:`SearchStats.merge`). It is a dataclass: the counters every
search reports are typed fields (``stats.kernel_matrices += 1``); what only some
strategies report (routes, eigen modes, redone solves, screening, verification) is
kept, in the order it was recorded, in ``other``. For the solver modules below the
strategies, which count into plain dicts too, it also reads and writes as a mapping
(``stats["cg_iterations"] += n``, ``stats.get(...)``, ``stats.setdefault(...)``).
The search exposes it as ``search_statistics_`` and its dict view
(:meth:`SearchStats.to_dict`) as ``search_stats_``, for JSON reports and code that
reads keys.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

__all__ = ["SearchStats", "merge_stats", "new_stats"]

#: keys merged by assignment of the whole search, not summed over settings
_GRID_KEYS = ("kernel_settings", "candidates", "folds")


@dataclass
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
    other : dict
        The counters only some searches report, in the order they were recorded
        (``routes``, ``eigen_modes``, ``band_workers``, ``kernel_dtypes``,
        ``unconverged_settings``, ``redone_direct``, ``verified_score``, ...).
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
    other: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def _names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls) if f.name != "other")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SearchStats:
        """The typed form of a counters dict; keys that are not fields go to ``other``."""
        names = cls._names()
        known = {k: v for k, v in d.items() if k in names}
        return cls(**known, other={k: v for k, v in d.items() if k not in names})

    def to_dict(self) -> dict[str, Any]:
        """The dict view (``search_stats_``): the fields, then ``other`` in its order."""
        return {**{k: getattr(self, k) for k in self._names()}, **self.other}

    # typed reads of the counters kept in ``other``
    @property
    def routes(self) -> list[dict[str, Any]]:
        return self.other.get("routes", [])

    @property
    def eigen_modes(self) -> list[str]:
        return self.other.get("eigen_modes", [])

    @property
    def band_workers(self) -> int | None:
        return self.other.get("band_workers")

    # the mapping protocol of the counters dicts the solver modules fill
    def __getitem__(self, key: str) -> Any:
        """Dict-style read, as ``search_stats_[key]``."""
        if key in self._names():
            return getattr(self, key)
        return self.other[key]

    def __setitem__(self, key: str, value: Any) -> None:
        if key in self._names():
            setattr(self, key, value)
        else:
            self.other[key] = value

    def __contains__(self, key: object) -> bool:
        return key in self._names() or key in self.other

    def get(self, key: str, default: Any = None) -> Any:
        return self[key] if key in self else default

    def setdefault(self, key: str, default: Any = None) -> Any:
        if key not in self:
            self[key] = default
        return self[key]

    def update(self, **kw: Any) -> None:
        for k, v in kw.items():
            self[k] = v

    def merge(self, part: SearchStats | dict[str, Any]) -> None:
        """Add the counters of ``part`` (one kernel setting) into these: numbers are
        summed, lists extended, the seconds summed per phase; the grid size is kept."""
        _merge(self, part.to_dict() if isinstance(part, SearchStats) else part)


def _merge(into: Any, part: dict[str, Any]) -> None:
    for k, v in part.items():
        if k in _GRID_KEYS:
            continue
        if isinstance(v, dict):
            for kk, vv in v.items():
                into[k][kk] = round(into[k].get(kk, 0) + vv, 4)
        elif isinstance(v, list):
            into.setdefault(k, []).extend(v)
        else:
            into[k] = into.get(k, 0) + v


def new_stats() -> SearchStats:
    """Zeroed counters (the fields of :class:`SearchStats` that every search reports)."""
    return SearchStats()


def merge_stats(into: SearchStats | dict[str, Any], part: SearchStats | dict[str, Any]) -> None:
    """Add the counters of ``part`` (one kernel setting) into ``into``."""
    _merge(into, part.to_dict() if isinstance(part, SearchStats) else part)
