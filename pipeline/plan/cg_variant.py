"""How CG multiplies by K: stored or recomputed tiles, float64 or mixed precision.

:func:`choose_cg_variant` is the one rule, used by :func:`pipeline.plan.fit_plan.plan_fit`
for every CG fit (named or chosen by ``solver="auto"``). The candidates:

===============  ==========  ===============================================
matvec           precision   one product costs
===============  ==========  ===============================================
``recompute``    float64     N² kernel entries (fused, each lower entry once)
``recompute``    mixed       float32 entries inside, a float64 product per
                             refinement step (:mod:`pipeline.linalg.cg_mixed_fit`)
``stored``       float64     reading the N²/2 stored lower entries, after the
                             Gram is built once (and it must fit on disk)
===============  ==========  ===============================================

With a cost model that prices them (``cg_seconds`` accepting ``matvec`` and
``precision``, as :class:`~pipeline.plan.calibrated.CalibratedCostModel` does),
the cheapest allowed candidate wins and the reason names the predicted seconds of
each; a candidate other than float64 recomputing products must be predicted to save
:data:`~pipeline.constants.CG_VARIANT_MIN_SAVING` of its time and
:data:`~pipeline.constants.CG_VARIANT_MIN_SECONDS`. Another cost model falls back to the fixed rule of :func:`matvec_choice`
(stored from :data:`~pipeline.constants.STORED_MATVEC_MIN_FEATURES` features)
and float64. Pure: no I/O.
"""

from __future__ import annotations

import inspect
from typing import Any

import pipeline.constants as C
from pipeline.options import CG_PRECISIONS
from pipeline.plan.cg_cost import gram_disk_bytes

__all__ = [
    "CG_PRECISIONS",
    "choose_cg_variant",
    "matvec_choice",
    "normalize_precision",
    "variant_candidates",
]


def _gb(x: float) -> str:
    return f"{x / 1e9:.1f} GB"


def normalize_precision(value: Any) -> str:
    """``"auto"``, ``"float64"`` or ``"mixed"``; None is ``"auto"``."""
    if value is None:
        return "auto"
    if value not in CG_PRECISIONS:
        raise ValueError(
            f"cg_precision={value!r} is not valid; choose one of {CG_PRECISIONS} "
            "('mixed': float32 kernel products refined to the float64 answer)"
        )
    return str(value)


def matvec_choice(n: int, n_features: int, disk_free: float) -> tuple[str, str]:
    """``"stored"`` or ``"recompute"`` by the fixed rule, with the reason.

    Reading a stored float64 entry (8 bytes at about 1 GB/s) costs about as much
    as recomputing a low-dimensional RBF entry, so a store pays off only when the
    kernel is costly to evaluate (many features) and the Gram fits on disk.
    """
    need = gram_disk_bytes(n)
    if need > C.DISK_MARGIN * disk_free:
        return "recompute", f"the Gram ({_gb(need)}) does not fit in the free disk"
    if n_features >= C.STORED_MATVEC_MIN_FEATURES:
        return (
            "stored",
            f"D={n_features}: an entry costs O(D) to recompute but 8 bytes to read, and the "
            f"Gram ({_gb(need)}) fits on disk",
        )
    return (
        "recompute",
        f"D={n_features} is small: recomputing a kernel entry costs about as much as reading "
        "it back, and no store is needed",
    )


def _prices_variants(cm: Any) -> bool:
    fn = getattr(cm, "cg_seconds", None)
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return "matvec" in params and "precision" in params


def variant_candidates(
    n: int,
    kernel: Any,
    disk_free: float,
    *,
    matvec: str = "auto",
    precision: str = "auto",
    n_targets: int = 1,
    kernel_dtype: str = "float64",
) -> list[tuple[str, str]]:
    """The ``(matvec, precision)`` variants a CG fit may run, as
    :func:`choose_cg_variant` weighs them: the named ones, else every one that applies
    (``stored`` when the Gram fits on disk; ``mixed`` for one target, float64 kernel
    products and a Mercer kernel; never both).

    Raises
    ------
    ValueError
        ``precision="mixed"`` with ``matvec="stored"``.
    """
    precision = normalize_precision(precision)
    if precision == "mixed" and matvec == "stored":
        raise ValueError(
            "cg_precision='mixed' recomputes the kernel in float32, so it cannot use "
            "matvec='stored'; use matvec='recompute' (or 'auto'), or cg_precision='float64'"
        )
    gram_fits = gram_disk_bytes(n) <= C.DISK_MARGIN * disk_free
    mixed_ok = n_targets == 1 and kernel_dtype == "float64" and getattr(kernel, "is_mercer", True)
    matvecs = [matvec] if matvec != "auto" else ["recompute", *(["stored"] if gram_fits else [])]
    if precision == "mixed":
        matvecs = ["recompute"]
    precisions = (
        [precision] if precision != "auto" else ["float64", *(["mixed"] if mixed_ok else [])]
    )
    return [(m, p) for m in matvecs for p in precisions if not (m == "stored" and p == "mixed")]


def choose_cg_variant(
    n: int,
    n_features: int,
    kernel: Any,
    disk_free: float,
    *,
    matvec: str = "auto",
    precision: str = "auto",
    cost_model: Any = None,
    shift: float | None = None,
    tol: float | None = None,
    rho: float | None = None,
    n_targets: int = 1,
    kernel_dtype: str = "float64",
) -> tuple[str, str, str]:
    """``(matvec, precision, reason)`` of a CG fit.

    ``matvec`` and ``precision`` the user named are kept (a named ``mixed`` with
    ``matvec="auto"`` recomputes: mixed precision needs the kernel in float32).
    ``auto`` ones are chosen by ``cost_model``'s predicted seconds. Mixed precision
    is a candidate only for one target, float64 kernel products (``kernel_dtype``)
    and a Mercer kernel.

    Raises
    ------
    ValueError
        ``precision="mixed"`` with ``matvec="stored"``.
    """
    precision = normalize_precision(precision)
    candidates = variant_candidates(
        n, kernel, disk_free, matvec=matvec, precision=precision, n_targets=n_targets,
        kernel_dtype=kernel_dtype,
    )  # fmt: skip
    if len(candidates) == 1:
        m, p = candidates[0]
        return m, p, f"CG products: matvec {m}, {p} (as asked)"
    if cost_model is None or not _prices_variants(cost_model):
        m = matvec
        why = "as asked"
        if m == "auto":
            m, why = matvec_choice(n, n_features, disk_free)
        p = "float64" if precision == "auto" else precision
        return m, p, f"CG products: matvec {m} ({why}), {p}"
    secs = {
        (m, p): float(
            cost_model.cg_seconds(
                n, n_features, kernel, shift=shift, tol=tol, rho=rho, matvec=m, precision=p
            )
        )
        for m, p in candidates
    }
    best = min(secs, key=secs.get)
    base = ("recompute", "float64")
    if base in secs and best != base:
        saving = secs[base] - secs[best]
        if saving < C.CG_VARIANT_MIN_SAVING * secs[base] or saving < C.CG_VARIANT_MIN_SECONDS:
            best = base  # a saving within the timing noise does not pay for the change
    others = ", ".join(f"{m} {p} {s:.3g} s" for (m, p), s in secs.items() if (m, p) != best)
    m, p = best
    return (
        m,
        p,
        (
            f"CG products: matvec {m}, {p}, predicted {secs[best]:.3g} s "
            f"(against {others}; {getattr(cost_model, 'name', 'cost')} model)"
        ),
    )
