"""The cost models of :func:`pipeline.plan.fit_plan.plan_fit` (``solver="auto"``), and how it calls them.

``"calibrated"`` (the default) is :class:`CalibratedCostModel`; ``"simple"`` is
:class:`SimpleCostModel`, the λ-blind constants kept for comparison. Any object with
``cholesky_seconds(n, d, kernel)`` and ``cg_seconds(n, d, kernel)`` methods plugs in
(:func:`make_cost_model`); :func:`_seconds` passes it only the keywords (``shift``,
``tol``, ``rho``, ``matvec``, ``precision``) its methods accept.

:class:`CalibratedCostModel` predicts the seconds of the two out-of-core solvers as
the public estimator runs them:

- Cholesky: a fixed set-up cost, the Gram (its kernel entries and its Zarr write),
  the tile factorisation (:func:`pipeline.plan.cholesky_cost.predict_cholesky`:
  flops at the measured fraction of a GEMM rate, the diagonal chain, disk I/O) and
  the two triangular solves (each reads the factor once).
- CG: a fixed set-up cost, the Nyström build, and (iterations + 1) matrix-free
  products (:func:`pipeline.plan.cg_cost.product_seconds`) plus the
  preconditioner's applications. The iterations are
  :data:`~pipeline.constants.CG_BOUND_FRACTION` of the Chebyshev bound of
  ``κ = 1 + ρ/μ`` (:func:`pipeline.plan.cg_cost.predicted_iterations`), where μ is
  the shift (λ, or nλ) and ρ = ‖K - F Fᵀ‖₂ the residual of the rank-r preconditioner.

ρ depends on the data. When the plan has the training rows, ρ is measured on a
subsample (:func:`pipeline.linalg.spectrum.estimate_residual`); without them it is
:data:`~pipeline.constants.RHO_AT_DEFAULT_RANK` at
:data:`~pipeline.constants.RHO_REFERENCE_N` rows, scaled linearly with N
(the eigenvalues of an N x N Gram grow as N times those of the kernel's integral
operator). Every constant lives in :mod:`pipeline.constants`, with where it
was measured; ``workflows/benchmarks/bench_policy_grid.py`` checks the predictions
against measured times. Pure functions of sizes and rates, apart from the optional
subsample estimate: no I/O.
"""

from __future__ import annotations

import inspect
from typing import Any

import pipeline.constants as C
from pipeline.options import COST_MODELS
from pipeline.plan import cg_cost, cholesky_cost

__all__ = ["CalibratedCostModel", "SimpleCostModel", "make_cost_model"]


class CalibratedCostModel:
    """Seconds of the out-of-core Cholesky and of Nyström-preconditioned CG.

    Parameters
    ----------
    gemm_gflops : float
        Measured float64 GEMM rate with every core.
    disk_read_gbps, disk_write_gbps : float
        Measured disk bandwidth, GB/s.
    block_size : int
        Tile edge of the Gram and factor.
    rank : int
        Nyström rank of CG's preconditioner.
    tol : float
        CG's relative tolerance when ``cg_seconds`` is not given one.
    rho : float
        Assumed preconditioner residual ``‖K - F Fᵀ‖₂`` at N = :data:`~pipeline.constants.RHO_REFERENCE_N`,
        scaled linearly with N, when no measured ρ is given (see the module notes).
    factor_dtype, kernel_dtype : str
        Precision of the stored factor and of CG's products.
    """

    name = "calibrated"

    def __init__(
        self,
        *,
        gemm_gflops: float = C.DEFAULT_GEMM_GFLOPS,
        disk_read_gbps: float = C.DEFAULT_DISK_READ_GBPS,
        disk_write_gbps: float = C.DEFAULT_DISK_WRITE_GBPS,
        block_size: int = C.DEFAULT_BLOCK_SIZE,
        rank: int = C.DEFAULT_RANK,
        tol: float = C.DEFAULT_TOL,
        rho: float = C.RHO_AT_DEFAULT_RANK,
        factor_dtype: str = "float64",
        kernel_dtype: str = "float64",
    ) -> None:
        for key, v in (
            ("gemm_gflops", gemm_gflops),
            ("disk_read_gbps", disk_read_gbps),
            ("disk_write_gbps", disk_write_gbps),
            ("rho", rho),
        ):
            if not v > 0:
                raise ValueError(f"{key} must be > 0, got {v!r}")
        self.gemm_gflops = float(gemm_gflops)
        self.disk_read_gbps = float(disk_read_gbps)
        self.disk_write_gbps = float(disk_write_gbps)
        self.block_size = int(block_size)
        self.rank = int(rank)
        self.tol = float(tol)
        self.rho = float(rho)
        self.factor_dtype = factor_dtype
        self.kernel_dtype = kernel_dtype

    def __repr__(self) -> str:
        return (
            f"CalibratedCostModel(gemm_gflops={self.gemm_gflops:g}, "
            f"block_size={self.block_size}, rank={self.rank}, rho={self.rho:g})"
        )

    # -- Cholesky ---------------------------------------------------------------

    def gram_seconds(self, n: int, d: int) -> float:
        """Computing and writing the lower-tiled Gram the Cholesky reads."""
        entries = float(n) * (n + 1) / 2.0
        compute = entries / cg_cost.entry_rate(d, "float64", C.GRAM_ENTRY_RATE)
        write = cholesky_cost.lower_tile_bytes(n, min(self.block_size, n)) / (
            self.disk_write_gbps * 1e9
        )
        return max(compute, write)

    def solve_seconds(self, n: int) -> float:
        """The forward and back substitutions: each reads the stored factor once."""
        item = 4 if self.factor_dtype == "float32" else 8
        factor = cholesky_cost.lower_tile_bytes(n, min(self.block_size, n), item)
        return 2.0 * factor / (self.disk_read_gbps * 1e9)

    def cholesky_seconds(self, n: int, d: int, kernel: Any = None, **_: Any) -> float:
        """Set-up, the Gram, the tile factorisation and the two solves."""
        n = int(n)
        cost = cholesky_cost.predict_cholesky(
            n,
            min(self.block_size, n),
            gemm_gflops=self.gemm_gflops,
            disk_read_gbps=self.disk_read_gbps,
            disk_write_gbps=self.disk_write_gbps,
            dtype=self.factor_dtype,
        )
        return (
            C.CHOLESKY_FIXED_SECONDS
            + self.gram_seconds(n, d)
            + cost.seconds
            + self.solve_seconds(n)
        )

    def dense_seconds(self, n: int, d: int) -> float:
        """The in-memory dense dual (:func:`pipeline.linalg.dense_dual.cho_factor`): the
        kernel matrix's lower half at the Gram's entry rate, nothing on disk, and the
        Cholesky's N³/3 flops in :data:`~pipeline.constants.DENSE_POTRF_TILE` tiles at the
        GEMM rate times the tiled factorisation's efficiency."""
        n = int(n)
        entries = float(n) * (n + 1) / 2.0
        gram = entries / cg_cost.entry_rate(d, "float64", C.GRAM_ENTRY_RATE)
        tiles = cholesky_cost.n_tiles(n, C.DENSE_POTRF_TILE)
        speed = cholesky_cost.cholesky_efficiency(tiles) * self.gemm_gflops * 1e9
        return gram + cholesky_cost.cholesky_flops(n) / speed

    def probe_seconds(self, n: int, d: int, rank: int) -> float:
        """The plan's measurement of ρ at ``rank``
        (:func:`pipeline.linalg.spectrum.estimate_residual`): the kernel matrix of its
        m-row subsample (:func:`~pipeline.constants.spectrum_sample_rows`), the rank-r
        RPCholesky of it, and :data:`~pipeline.constants.SPECTRUM_POWER_ITERATIONS` + 1
        products of its residual with 4 vectors (8 m (m + 2 r) flops each, at the GEMV
        rate). 0 where nothing is measured (r >= N, or too few rows for r)."""
        m = C.spectrum_sample_rows(n, rank)
        r = int(rank)
        if r >= int(n) or 2 * r > m:
            return 0.0
        gemm = self.gemm_gflops * 1e9
        gram = float(m) * m / cg_cost.entry_rate(d, "float64", C.GRAM_ENTRY_RATE)
        build = cg_cost.nystrom_build_seconds(m, r, d, gemm_flops=gemm)
        products = 8.0 * m * (m + 2.0 * r) / (gemm * C.GEMV_FRACTION_OF_GEMM)
        return gram + build + (C.SPECTRUM_POWER_ITERATIONS + 1) * products

    # -- CG ---------------------------------------------------------------------

    def residual(self, n: int, rho: float | None = None) -> float:
        """``ρ = ‖K - F Fᵀ‖₂`` of the preconditioner for N rows: ``rho`` when measured,
        else the assumed one scaled with N."""
        if rho is not None:
            return float(rho)
        return self.rho * float(n) / C.RHO_REFERENCE_N

    def cg_iterations(
        self,
        n: int,
        shift: float | None,
        tol: float | None = None,
        rho: float | None = None,
    ) -> int:
        """Predicted PCG iterations at shift μ (``shift=None``: μ = 1)."""
        mu = 1.0 if shift is None or not shift > 0 else float(shift)
        tol = self.tol if tol is None else tol
        return cg_cost.predicted_iterations(self.residual(n, rho), mu, tol)

    def cg_seconds(
        self,
        n: int,
        d: int,
        kernel: Any = None,
        *,
        shift: float | None = None,
        tol: float | None = None,
        rho: float | None = None,
        matvec: str = "recompute",
        precision: str | None = None,
        **_: Any,
    ) -> float:
        """Set-up, the Nyström build, the products and the preconditioner's
        applications (4 N r flops each).

        ``matvec="recompute"`` evaluates N² kernel entries per product;
        ``"stored"`` builds the Gram once and reads its lower tiles per product.
        ``precision="mixed"`` (recompute only) does about
        :data:`~pipeline.constants.MIXED_INNER_OVERHEAD` float32 products per
        float64 iteration plus one float64 product per three digits of ``tol``
        (:func:`pipeline.plan.cg_cost.mixed_precision_products`); default: the
        model's ``kernel_dtype``.
        """
        n = int(n)
        rank = min(self.rank, n)
        tol = self.tol if tol is None else tol
        its = self.cg_iterations(n, shift, tol, rho)
        build = cg_cost.nystrom_build_seconds(n, rank, d, gemm_flops=self.gemm_gflops * 1e9)
        apply = 4.0 * n * rank / (self.gemm_gflops * 1e9 * C.GEMV_FRACTION_OF_GEMM)
        base = C.CG_FIXED_SECONDS + build
        if matvec == "stored":
            product = cg_cost.stored_product_seconds(n, min(self.block_size, n))
            setup = cg_cost.gram_disk_bytes(n) / C.CG_STORED_SETUP_BYTES_PER_SECOND
            return base + setup + (its + 1) * product + its * apply
        precision = precision or self.kernel_dtype
        if precision == "mixed":
            mu = 1.0 if shift is None or not shift > 0 else float(shift)
            lo, hi = cg_cost.mixed_precision_products(its, tol, n / mu)
            return (
                base
                + lo * (cg_cost.product_seconds(n, d, "float32") + apply)
                + hi * cg_cost.product_seconds(n, d, "float64")
            )
        product = cg_cost.product_seconds(n, d, precision)
        return base + (its + 1) * product + its * apply

    # -- both -------------------------------------------------------------------

    def predict(
        self,
        n: int,
        d: int,
        kernel: Any = None,
        *,
        shift: float | None = None,
        tol: float | None = None,
        rho: float | None = None,
        probes: Any = None,
    ) -> dict[str, Any]:
        """Both predictions and what they rest on; ρ is measured by ``probes.residual``
        (:class:`~pipeline.engine.placement.Probes`) when given."""
        source = "measured" if rho is not None else "assumed"
        residual = getattr(probes, "residual", None)
        if rho is None and residual is not None and kernel is not None:
            rho = residual(min(self.rank, int(n)))
            source = "subsample" if rho is not None else "assumed"
        return {
            "cholesky_seconds": self.cholesky_seconds(n, d, kernel),
            "cg_seconds": self.cg_seconds(n, d, kernel, shift=shift, tol=tol, rho=rho),
            "cg_iterations": self.cg_iterations(n, shift, tol, rho),
            "rho": self.residual(n, rho),
            "rho_source": source,
        }


class SimpleCostModel:
    """The old λ-blind model (``cost_model="simple"``): a Cholesky's N³/3 flops
    (:func:`pipeline.plan.cholesky_cost.cholesky_flops`) at
    :data:`~pipeline.constants.CHOLESKY_GFLOPS`, and a Nyström-preconditioned
    CG of :data:`~pipeline.constants.CG_TYPICAL_PRODUCTS` products of N² kernel
    entries at :data:`~pipeline.constants.KERNEL_ENTRIES_PER_SECOND`. It ignores
    λ and the data, so it picks the slower solver on much of the measured grid
    (``bench_policy_grid.py``); the default is :class:`CalibratedCostModel`."""

    name = "simple"

    def cholesky_seconds(self, n: int, d: int, kernel: Any = None) -> float:
        return cholesky_cost.cholesky_flops(n) / (C.CHOLESKY_GFLOPS * 1e9)

    def cg_seconds(self, n: int, d: int, kernel: Any = None) -> float:
        return C.CG_TYPICAL_PRODUCTS * float(n) ** 2 / C.KERNEL_ENTRIES_PER_SECOND


# -- how plan_fit calls a cost model ----------------------------------------------


def _accepts(fn: Any, key: str) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == key or p.kind is p.VAR_KEYWORD for p in params)


def _seconds(fn: Any, n: int, d: int, kernel: Any, **kw: Any) -> float:
    """``fn(n, d, kernel)``, with those of ``kw`` (``shift``, ``tol``) that ``fn`` accepts."""
    extra = {k: v for k, v in kw.items() if v is not None and _accepts(fn, k)}
    return float(fn(n, d, kernel, **extra))


def make_cost_model(
    name: Any,
    *,
    block_size: int = C.DEFAULT_BLOCK_SIZE,
    rank: int = C.DEFAULT_RANK,
    tol: float = C.DEFAULT_TOL,
    factor_dtype: str = C.DEFAULT_FACTOR_DTYPE,
) -> Any:
    """The cost model ``name`` (``None`` or ``"calibrated"``, ``"simple"``); an object
    with ``cholesky_seconds`` and ``cg_seconds`` is returned as is."""
    if name == "simple":
        return SimpleCostModel()
    if name is None or name == "calibrated":
        return CalibratedCostModel(
            block_size=block_size,
            rank=rank,
            tol=tol,
            factor_dtype=factor_dtype if factor_dtype in ("float64", "float32") else "float64",
        )
    if hasattr(name, "cholesky_seconds") and hasattr(name, "cg_seconds"):
        return name
    raise ValueError(
        f"cost_model={name!r} is not valid; choose one of {COST_MODELS} or pass an object "
        "with cholesky_seconds(n, d, kernel) and cg_seconds(n, d, kernel) methods"
    )
