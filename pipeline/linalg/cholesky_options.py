"""Errors, options and result of the tile Cholesky: not-PD error, jitter policy, the shift,
the factor (:class:`CholeskyFactor`) and its fingerprint."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipeline.errors import (  # noqa: F401 (their old home)
    NonFiniteKernelError,
    NotPositiveDefiniteError,
)
from pipeline.options import SOLVER_CONVENTIONS, diagonal_shift
from pipeline.storage import TiledArray, fingerprint_obj

CONVENTIONS = SOLVER_CONVENTIONS  # its old name (pinned: tests/test_options.py)


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
    if convention not in SOLVER_CONVENTIONS:
        raise ValueError(f"convention must be one of {SOLVER_CONVENTIONS}, got {convention!r}")
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


def factor_fingerprint(
    gram: TiledArray, lam: float, convention: str, jitter: JitterPolicy | None, dtype: Any
) -> str:
    """Fingerprint of the factor: chained to the Gram's, lambda, convention, jitter policy."""
    return fingerprint_obj(
        {
            "what": "tile-cholesky-lower",
            "gram": gram.fingerprint,
            "lambda": float(lam),
            "convention": convention,
            "jitter": None if jitter is None else jitter.to_dict(),
            "dtype": np.dtype(dtype).str,
        }
    )
