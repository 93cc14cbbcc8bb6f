"""Cost model of preconditioned CG: iterations, time per product, build time, memory.

Pure functions of N, D, λ (the shift μ), the preconditioner's residual
``ρ = ‖K - F Fᵀ‖₂`` and measured machine rates; no I/O. The plan
compares these figures with :mod:`pipeline.plan.cholesky_cost`.

Iterations. With ``P = F Fᵀ + μ I`` the preconditioned condition number is at
most ``κ = 1 + ρ/μ`` and CG needs at most the Chebyshev bound
``k = ⌈log(2/tol) / log((√κ+1)/(√κ-1))⌉`` iterations
(:func:`chebyshev_iterations`). CG does better because the spectrum of the
preconditioned matrix clusters at 1: :func:`predicted_iterations` scales the
bound by :data:`~pipeline.constants.CG_BOUND_FRACTION` (measured:
docs/PERFORMANCE.md#the-solver-policy-against-measured-times). The bound is a total
function of μ > 0 (:func:`chebyshev_bound`): past √κ = 1e4 its step is
``2 atanh(1/√κ)``, as ``(√κ+1)/(√κ-1)`` rounds to 1 near √κ = 1e16 (λ = 1e-31
divided by zero), and it is capped at :data:`MAX_PREDICTED_ITERATIONS`.

Products. A matrix-free product multiplies by all N² entries of K; the fused
engine evaluates each lower-triangle entry once and uses it twice, so its time is
``N² / rate`` with ``rate`` = :data:`~pipeline.constants.CG_PRODUCT_ENTRY_RATE`
N² entries per second at D = 14, fitted to whole CG solves (measured:
docs/PERFORMANCE.md#the-solver-policy-against-measured-times), plus
:data:`~pipeline.constants.CG_PRODUCT_ROW_BLOCK_SECONDS` per row block. That is
more than the engine's one-sided figure (``ENTRY_RATE_FLOAT64``, 0.53 G/s, each
entry counted once), which :func:`entry_rate` still gives by default. The rate
falls with D as ``(D₀ + 14) / (D₀ + D)``, D₀ = :data:`~pipeline.constants.ENTRY_COST_D0` (the exp and
the bookkeeping cost as much as this many feature terms).
"""

from __future__ import annotations

import math

import pipeline.constants as C

__all__ = [
    "MAX_PREDICTED_ITERATIONS",
    "chebyshev_bound",
    "chebyshev_iterations",
    "entry_rate",
    "mixed_precision_products",
    "nystrom_build_seconds",
    "nystrom_memory_bytes",
    "nystrom_method",
    "predicted_iterations",
    "product_seconds",
    "gram_disk_bytes",
    "stored_product_seconds",
]

# the calibrated figures live in pipeline.constants (measured: docs/PERFORMANCE.md)
_REF_D = 14

#: the most iterations a bound reports: a solve no budget affords (an int64, so every
#: consumer of the figure can hold it), reached as μ tends to 0 or ρ/μ overflows
MAX_PREDICTED_ITERATIONS = 2**62


def chebyshev_bound(kappa: float, tol: float) -> int:
    """``⌈log(2/tol) / log((√κ+1)/(√κ-1))⌉``, the iterations that reduce CG's error by
    ``tol`` at condition number ``kappa``, for any ``kappa`` (1 or less: 1; inf: the cap
    :data:`MAX_PREDICTED_ITERATIONS`)."""
    kappa = float(kappa)
    if not kappa > 1.0 + 1e-12:
        return 1
    s = math.sqrt(kappa)
    if s < 1e4:
        step = math.log((s + 1.0) / (s - 1.0))
    else:  # the quotient rounds towards 1 (to 1 itself near s = 1e16): its exact form
        step = 2.0 * math.atanh(1.0 / s)
    if not step > 0:  # s = inf: rho / shift overflowed
        return MAX_PREDICTED_ITERATIONS
    return max(1, min(MAX_PREDICTED_ITERATIONS, math.ceil(math.log(2.0 / tol) / step)))


def chebyshev_iterations(rho: float, shift: float, tol: float) -> int:
    """Upper bound on PCG iterations for ``κ = 1 + rho/shift`` and relative tolerance ``tol``
    (any ``shift > 0``: a tiny one gives a large, finite bound)."""
    if not (shift > 0):
        raise ValueError(f"shift must be > 0, got {shift!r}")
    if not (0 < tol < 1):
        raise ValueError(f"tol must lie in (0, 1), got {tol!r}")
    return chebyshev_bound(1.0 + max(float(rho), 0.0) / float(shift), tol)


def predicted_iterations(rho: float, shift: float, tol: float) -> int:
    """Expected PCG iterations: the Chebyshev bound times
    :data:`~pipeline.constants.CG_BOUND_FRACTION`."""
    return max(1, math.ceil(C.CG_BOUND_FRACTION * chebyshev_iterations(rho, shift, tol)))


def entry_rate(
    n_features: int, kernel_dtype: str = "float64", base_rate: float | None = None
) -> float:
    """Kernel entries per second at ``n_features``, from a rate measured at D = 14."""
    if kernel_dtype not in ("float64", "float32"):
        raise ValueError(f"kernel_dtype must be 'float64' or 'float32', got {kernel_dtype!r}")
    if base_rate is None:
        base_rate = C.ENTRY_RATE_FLOAT32 if kernel_dtype == "float32" else C.ENTRY_RATE_FLOAT64
    return (
        float(base_rate) * (C.ENTRY_COST_D0 + _REF_D) / (C.ENTRY_COST_D0 + max(1, int(n_features)))
    )


def product_seconds(
    n: int, n_features: int, kernel_dtype: str = "float64", base_rate: float | None = None
) -> float:
    """Seconds of one matrix-free product ``(K + μI) v``: a fixed cost per row block
    (:data:`~pipeline.constants.CG_PRODUCT_ROW_BLOCK_SECONDS`) plus N² kernel
    entries at :data:`~pipeline.constants.CG_PRODUCT_ENTRY_RATE` at D = 14 unless
    ``base_rate``."""
    if kernel_dtype == "float32":  # the whole product, row-block costs included (measured)
        return product_seconds(n, n_features, "float64", base_rate) / C.CG_PRODUCT_FLOAT32_SPEEDUP
    if base_rate is None:
        base_rate = C.CG_PRODUCT_ENTRY_RATE
    row_blocks = math.ceil(int(n) / C.DEFAULT_BLOCK_SIZE)
    return row_blocks * C.CG_PRODUCT_ROW_BLOCK_SECONDS + float(n) ** 2 / entry_rate(
        n_features, "float64", base_rate
    )


def gram_disk_bytes(n: int, itemsize: int = 8) -> int:
    """Bytes of the lower-tiled Gram's N(N+1)/2 entries (what a stored-matvec CG reads)."""
    return (int(n) * (int(n) + 1) // 2) * itemsize


def stored_product_seconds(n: int, block_size: int = C.DEFAULT_BLOCK_SIZE) -> float:
    """Seconds of one product with the stored Gram: a fixed cost per lower tile (its
    read, checksum and task) plus the N²/2 stored float64 entries at
    :data:`~pipeline.constants.CG_STORED_BYTES_PER_SECOND` (page cache or disk)."""
    t = math.ceil(int(n) / max(1, int(block_size)))
    return (
        t * (t + 1) / 2 * C.CG_STORED_TILE_SECONDS
        + gram_disk_bytes(n) / C.CG_STORED_BYTES_PER_SECOND
    )


def nystrom_memory_bytes(n: int, rank: int, dtype: str = "float32") -> int:
    """Bytes of the factor F (N x r) plus one N x 250 float64 block of columns."""
    item = 4 if dtype == "float32" else 8
    return int(n) * int(rank) * item + int(n) * 250 * 8


def nystrom_build_seconds(
    n: int,
    rank: int,
    n_features: int,
    *,
    gemm_flops: float = C.DEFAULT_GEMM_GFLOPS * 1e9,
    base_rate: float | None = None,
) -> float:
    """Seconds to build a rank-r RPCholesky preconditioner: N·r kernel entries (the
    columns, at a third of the engine's rate: they are not fused), the Schur updates
    (about N r² flops) and the r x r eigendecomposition (about 10 r³ flops)."""
    rate = entry_rate(n_features, "float64", base_rate) * C.NYSTROM_COLUMN_RATE_FRACTION
    cols = float(n) * rank / rate
    return cols + (2.0 * n * rank**2 + C.NYSTROM_EIG_FLOPS_PER_R3 * rank**3) / gemm_flops


def mixed_precision_products(
    iterations_float64: int, tol: float = 1e-10, n_over_shift: float | None = None
) -> tuple[int, int]:
    """``(float32 products, float64 products)`` of the mixed solve for a float64 CG of
    ``iterations_float64`` iterations: each refinement step gains about
    :data:`~pipeline.constants.MIXED_DIGITS_PER_STEP` digits, and the inner
    solves' restarts cost :data:`~pipeline.constants.MIXED_INNER_OVERHEAD` times
    the float64 iterations while ``N / μ`` (a bound on the condition number of a
    unit-diagonal kernel) is at most :data:`~pipeline.constants.MIXED_MAX_N_OVER_SHIFT`,
    :data:`~pipeline.constants.MIXED_INNER_OVERHEAD_ILL` beyond (the float32
    products' error then limits each step)."""
    outer = max(1, math.ceil(-math.log10(tol) / C.MIXED_DIGITS_PER_STEP))
    ill = n_over_shift is not None and n_over_shift > C.MIXED_MAX_N_OVER_SHIFT
    overhead = C.MIXED_INNER_OVERHEAD_ILL if ill else C.MIXED_INNER_OVERHEAD
    return math.ceil(overhead * iterations_float64), outer


def nystrom_method(
    n: int, m: int, n_features: int, *, cached: bool | None = None,
    iterations: int | None = None, gemm_gflops: float | None = None,
) -> tuple[str, str]:  # fmt: skip
    """How ``solver="nystrom"`` solves its M x M system: ``("direct" | "pcg", reason)``.

    ``"direct"``: one pass over X evaluates ``K_nM`` (N·M entries) and accumulates
    ``K_nMᵀ W K_nM`` (a SYRK, N·M² flops at GEMM speed), then forms the preconditioned
    M x M system (4·M³) and factors it.
    ``"pcg"``: FALKON's CG, ``iterations`` passes (default
    :data:`~pipeline.constants.NYSTROM_PCG_TYPICAL_ITERATIONS`), each two GEMVs over
    the N x M blocks at :data:`~pipeline.constants.GEMV_FRACTION_OF_GEMM` of GEMM speed
    and, unless the blocks are ``cached`` (default: when the N x M float64 blocks fit in
    :data:`~pipeline.constants.NYSTROM_CACHE_BYTES`, as the solver keeps them), their N·M
    kernel entries again. The cheaper
    estimate wins (kin40k, N = 36,000: direct at M = 1,000 and 4,000, 2-3x faster than
    the PCG; bench_exactness.py).
    """
    n, m = int(n), int(m)
    if cached is None:
        cached = n * m * 8 <= C.NYSTROM_CACHE_BYTES
    gemm = float(gemm_gflops or C.DEFAULT_GEMM_GFLOPS) * 1e9
    its = int(iterations or C.NYSTROM_PCG_TYPICAL_ITERATIONS)
    kernel = n * m / entry_rate(n_features)
    # the one pass's SYRK, then Bᵀ H B (four triangular solves with M right-hand sides)
    direct = kernel + (n * float(m) ** 2 + 4.0 * float(m) ** 3) / gemm
    per_pass = 4.0 * n * m / (gemm * C.GEMV_FRACTION_OF_GEMM) + (0.0 if cached else kernel)
    pcg = kernel + its * per_pass
    method = "direct" if direct <= pcg else "pcg"
    return method, (
        f"Nyström M={m}: one pass and an M x M factorisation ~{direct:.3g} s against "
        f"~{pcg:.3g} s for {its} PCG iterations{' (blocks kept)' if cached else ''}"
    )


def adaptive_rank_and_residual(
    rho_r: float, r: int, shift: float, cap: int, factor: float = C.ADAPTIVE_FACTOR
) -> tuple[int, float]:
    """The adaptive preconditioner's predicted ``(rank, ρ)`` from ``ρ_r = ‖K - F Fᵀ‖₂`` of
    a rank-``r`` factor: it grows until ρ <= ``factor`` · μ or its ``cap``, with ρ taken
    to fall like 1/r past r. That is not conservative for the rank: diamonds (N = 40,000,
    RBF γ = 0.1, λ = 1e-2, ρ at rank 1,000 from the plan's subsample) predicts rank 2,503
    at factor 5 and 1,252 at factor 10, and the builds needed 3,594 and 2,512:
    there ρ falls more slowly than 1/r between ranks 1,000 and 3,600. ``(rank, ρ)`` is
    ``(the rank that reaches the target, factor · μ)``, or ``(cap, the residual left at
    the cap)`` when the cap binds."""
    target = float(factor) * float(shift)
    r, cap = max(1, int(r)), max(1, int(cap))
    if not rho_r > target:
        return min(r, cap), target
    need = r * float(rho_r) / target
    if need <= cap:
        return int(math.ceil(need)), target
    return cap, float(rho_r) * r / cap
