"""Solvers for (K + shift*I) alpha = y over the stored Gram."""

from pipeline.solvers.cholesky import (
    CholeskyFactor,
    JitterPolicy,
    NotPositiveDefiniteError,
    factor_fingerprint,
    load_factor,
    regularisation_shift,
    release_tile_cache,
    tile_cholesky,
)
from pipeline.solvers.triangular import (
    back_substitution,
    cholesky_solve,
    forward_substitution,
)

__all__ = [
    "CholeskyFactor",
    "JitterPolicy",
    "NotPositiveDefiniteError",
    "back_substitution",
    "cholesky_solve",
    "factor_fingerprint",
    "forward_substitution",
    "load_factor",
    "regularisation_shift",
    "release_tile_cache",
    "tile_cholesky",
]
