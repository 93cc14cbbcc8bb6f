"""OpenBLAS's spin after each call, shortened before the library is loaded.

OpenBLAS's worker threads spin for ``2 ** OPENBLAS_THREAD_TIMEOUT`` cycles after a
call ends (2**28 by default: about 0.1 s here) before they sleep. Between two
all-core tile calls the tile threads fault in read buffers, copy and checksum
tiles; a spinning BLAS thread takes a core from them. OpenBLAS reads the variable
once, when it loads (SciPy's copy: at the first import of ``scipy.linalg``), so the
package root sets it, unless the user did, before anything imports SciPy
(:data:`~pipeline.constants.OPENBLAS_THREAD_TIMEOUT`; 0 leaves it alone).
Results do not depend on it: only how long idle BLAS threads spin.
"""

from __future__ import annotations

import os
import sys

from pipeline.constants import OPENBLAS_THREAD_TIMEOUT

__all__ = ["apply", "state"]

_VAR = "OPENBLAS_THREAD_TIMEOUT"
_STATE: dict[str, object] = {}


def apply() -> None:
    """Set ``OPENBLAS_THREAD_TIMEOUT`` unless it is set (once per process)."""
    if _STATE:
        return
    user = os.environ.get(_VAR)
    _STATE["user_value"] = user
    # SciPy's OpenBLAS already loaded: the variable can no longer change its spin
    _STATE["scipy_blas_loaded_before"] = "scipy.linalg" in sys.modules
    if user is None and OPENBLAS_THREAD_TIMEOUT > 0:
        os.environ[_VAR] = str(int(OPENBLAS_THREAD_TIMEOUT))
    _STATE["value"] = os.environ.get(_VAR)


def state() -> dict[str, object]:
    """What :func:`apply` found and set: ``value`` (the variable now), ``user_value``
    (the user's, or None) and ``scipy_blas_loaded_before`` (True: SciPy's OpenBLAS was
    loaded before this package, so it kept the spin it loaded with)."""
    return dict(_STATE)
