"""Products of a matrix with its own transpose, safe from OpenBLAS's SYRK crash.

NumPy computes ``g.T @ g`` (and ``x @ x.T``) by OpenBLAS's SYRK. numpy 2.4.6's bundled
OpenBLAS 0.3.31 (SkylakeX kernels, an AVX-512 Intel Xeon) segfaults in a 2-thread SYRK
past an order that falls as the inner dimension grows (docs/PERFORMANCE.md#known-traps,
:data:`~pipeline.constants.SYRK_PANEL`). Every such product of the package whose order
can be large goes through :func:`gram_t`: the Nyström sums and FALKON's ``T Tᵀ``, the
preconditioners' ``FᵀF``, and the kernels' own whole-matrix ``x·y`` and squared
distances. Up to the panel it is exactly NumPy's call (the same bits); past it, panels,
whose other bits :func:`gram_t_identity` enters in the fingerprints of stored results.
"""

from __future__ import annotations

import numpy as np

import pipeline.constants as C

__all__ = ["gram_t", "gram_t_identity"]


def gram_t(g: np.ndarray, panel: int | None = None) -> np.ndarray:
    """``g.T @ g`` (``m x m`` for ``g`` of shape ``(k, m)``), by NumPy; past ``panel``
    columns (:data:`~pipeline.constants.SYRK_PANEL`) in column panels, so that OpenBLAS's
    SYRK never has an order at which it crashes: each diagonal block is the SYRK of its
    panel, the others GEMMs, mirrored. Up to ``panel`` it is exactly ``g.T @ g`` (the
    same call, the same bits)."""
    panel = int(panel or C.SYRK_PANEL)
    m = g.shape[1]
    if m <= panel:
        return g.T @ g
    out = np.empty((m, m), dtype=g.dtype)
    panels = [np.ascontiguousarray(g[:, s : s + panel]) for s in range(0, m, panel)]
    for p, a in enumerate(panels):
        s = p * panel
        out[s : s + panel, s : s + panel] = a.T @ a
        for q in range(p + 1, len(panels)):
            t = q * panel
            blk = panels[q].T @ a
            out[t : t + panel, s : s + panel] = blk
            out[s : s + panel, t : t + panel] = blk.T
    return out


def gram_t_identity(m: int) -> dict[str, int]:
    """What enters the fingerprint of a result summed by :func:`gram_t` of ``m`` columns:
    nothing up to the panel (the bits of one SYRK, as before the panels), the panel
    beyond it (other bits: a result stored before is recomputed, never mixed)."""
    return {"syrk_panel": int(C.SYRK_PANEL)} if int(m) > C.SYRK_PANEL else {}
