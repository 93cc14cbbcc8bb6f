"""Errors, options and result of the tile Cholesky: not-PD error, jitter policy, the shift,
the factor (:class:`CholeskyFactor`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipeline.kernels.base import NonFiniteKernelError  # noqa: F401 (re-exported)
from pipeline.options import SOLVER_CONVENTIONS, diagonal_shift
from pipeline.storage import TiledArray

CONVENTIONS = SOLVER_CONVENTIONS


class NotPositiveDefiniteError(ValueError):
    """A diagonal tile of ``K + shift * I`` (after the left-looking update) is not PD.

    Attributes
    ----------
    tile : tuple of int
        The diagonal tile ``(j, j)`` whose POTRF failed.
    pivot : int
        LAPACK's ``info``: the 1-based leading minor of the tile that failed.
    row : int
        The 0-based global row of that pivot.
    lam, convention, shift : float, str, float
        The regularisation in use.
    factor_dtype : str
        The factor's dtype. A float32 factor's updates round at about 6e-8 of
        K's scale, so a shift below that can fail where float64 succeeds (the
        message says so first): on 10,000 diamonds rows (RBF, gamma = 1/9)
        lambda = 1e-5 and 1e-6 failed in float32 and factored in float64.
    """

    def __init__(
        self,
        tile: tuple[int, int],
        pivot: int,
        row: int,
        lam: float,
        convention: str,
        shift: float,
        jitter_tried: tuple[float, ...] = (),
        factor_dtype: str = "float64",
    ) -> None:
        self.tile, self.pivot, self.row = tile, pivot, row
        self.lam, self.convention, self.shift = lam, convention, shift
        self.jitter_tried = jitter_tried
        self.factor_dtype = factor_dtype
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
            ),
        )


@dataclass(frozen=True)
class JitterPolicy:
    """Opt-in retry of a failed diagonal POTRF with jitter on that tile's diagonal.

    Try ``k`` (0-based) adds ``initial * growth**k * (mean(|diag(K_jj)|) + shift)``
    to the diagonal of the updated tile ``A``. The jitter used is recorded in the
    tile's marker and in the factor's attributes; the factor is then that of
    ``K + shift*I + D`` with ``D`` the recorded block-diagonal jitter.
    """

    initial: float = 1e-10
    growth: float = 10.0
    max_tries: int = 8

    def __post_init__(self) -> None:
        if not (self.initial > 0 and self.growth > 1 and self.max_tries >= 1):
            raise ValueError(
                f"jitter policy needs initial > 0, growth > 1, max_tries >= 1; got {self}"
            )

    def to_dict(self) -> dict[str, float]:
        return {"initial": self.initial, "growth": self.growth, "max_tries": self.max_tries}


def make_jitter_policy(jitter: Any) -> JitterPolicy | None:
    """None/False: off; True: defaults; float: initial relative jitter; dict/policy."""
    if jitter is None or jitter is False:
        return None
    if jitter is True:
        return JitterPolicy()
    if isinstance(jitter, JitterPolicy):
        return jitter
    if isinstance(jitter, Mapping):
        return JitterPolicy(**jitter)
    if isinstance(jitter, int | float) and not isinstance(jitter, bool):
        return JitterPolicy(initial=float(jitter))
    raise ValueError(
        f"jitter must be None, True, a positive float or a dict of JitterPolicy fields, "
        f"got {jitter!r}"
    )


def regularisation_shift(lam: float, n: int, convention: str = "sklearn") -> float:
    """The diagonal shift for ``lam``: ``lam`` ("sklearn") or ``n * lam`` ("n")."""
    if convention not in CONVENTIONS:
        raise ValueError(f"convention must be one of {CONVENTIONS}, got {convention!r}")
    lam = float(lam)
    if not np.isfinite(lam) or lam < 0:
        raise ValueError(
            f"lambda must be a finite number >= 0, got {lam!r}; use e.g. alpha=1e-3 "
            "(kernel ridge needs lambda > 0 unless the kernel is strictly positive definite)"
        )
    return diagonal_shift(lam, n, convention)


@dataclass(frozen=True)
class CholeskyFactor:
    """The stored factor ``L`` of ``K + shift * I`` and how it was made.

    Attributes
    ----------
    L : TiledArray
        Lower tiles of the factor (tiles with ``j > i`` are never written).
    lam, convention, shift : float, str, float
        ``shift = lam`` ("sklearn") or ``n * lam`` ("n").
    jitter : dict
        ``{"i.j": jitter}`` for diagonal tiles that needed jitter (empty if none).
    computed : tuple of (int, int)
        Tiles computed by this call (empty when everything was already stored).
    seconds : float
        Wall time of this call.
    """

    L: TiledArray
    lam: float
    convention: str
    shift: float
    jitter: dict[str, float] = field(default_factory=dict)
    computed: tuple[tuple[int, int], ...] = ()
    seconds: float = 0.0

    @property
    def n(self) -> int:
        return int(self.L.shape[0])
