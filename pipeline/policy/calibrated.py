"""The calibrated cost model of :func:`pipeline.policy.plan.plan_fit`.

:class:`CalibratedCostModel` predicts the seconds of the two out-of-core solvers
from the measured models of :mod:`pipeline.policy.cholesky_cost` (tile
Cholesky: flops at the measured factorisation efficiency of a GEMM probe, the
diagonal chain, disk I/O) and :mod:`pipeline.policy.cg_cost` (PCG iterations
from the Chebyshev bound of ``κ = 1 + ρ/μ``, matrix-free products at the fused
engine's kernel-entry rate, the Nyström build). Unlike the simple model it
depends on the shift μ (λ, or nλ) and the tolerance: a small λ makes CG slow,
so the Cholesky is preferred up to a larger N.

ρ, the residual ``‖K - F Fᵀ‖₂`` of the rank-r preconditioner, is not known
before the fit: :data:`RHO_AT_DEFAULT_RANK` is the value measured with the
default rank on the calibration problem (diamonds, RBF, r = 500, N = 10,000:
ρ = 0.76 for a kernel with unit diagonal). It is scaled linearly with N, since the
eigenvalues of an N x N Gram grow as N times those of the kernel's integral
operator (so the (r+1)-th one, which ρ tracks, does too), and the iteration count
is the full Chebyshev bound
(not the 0.45-0.67 fraction CG usually reaches), because a plan should not
bet on an optimistic guess of ρ. Pure functions of sizes and rates: no I/O.
"""

from __future__ import annotations

from typing import Any

from pipeline.policy import cg_cost, cholesky_cost
from pipeline.policy import constants as C

__all__ = ["RHO_AT_DEFAULT_RANK", "CalibratedCostModel"]

# the calibrated figures live in pipeline.policy.constants (with where they were measured)
RHO_AT_DEFAULT_RANK = C.RHO_AT_DEFAULT_RANK
RHO_REFERENCE_N = C.RHO_REFERENCE_N
DEFAULT_GEMM_GFLOPS = C.DEFAULT_GEMM_GFLOPS
DEFAULT_DISK_READ_GBPS = C.DEFAULT_DISK_READ_GBPS
DEFAULT_DISK_WRITE_GBPS = C.DEFAULT_DISK_WRITE_GBPS


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
        Assumed preconditioner residual ``‖K - F Fᵀ‖₂`` at N = :data:`RHO_REFERENCE_N`,
        scaled linearly with N (see the module notes).
    factor_dtype, kernel_dtype : str
        Precision of the stored factor and of CG's products.
    """

    name = "calibrated"

    def __init__(
        self,
        *,
        gemm_gflops: float = DEFAULT_GEMM_GFLOPS,
        disk_read_gbps: float = DEFAULT_DISK_READ_GBPS,
        disk_write_gbps: float = DEFAULT_DISK_WRITE_GBPS,
        block_size: int = C.DEFAULT_BLOCK_SIZE,
        rank: int = C.DEFAULT_RANK,
        tol: float = C.DEFAULT_TOL,
        rho: float = RHO_AT_DEFAULT_RANK,
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

    def gram_seconds(self, n: int, d: int) -> float:
        """Computing and writing the lower-tiled Gram the Cholesky reads."""
        entries = float(n) * (n + 1) / 2.0
        compute = entries / cg_cost.entry_rate(d, "float64")
        write = cholesky_cost.lower_tile_bytes(n, min(self.block_size, n)) / (
            self.disk_write_gbps * 1e9
        )
        return max(compute, write)

    def cholesky_seconds(self, n: int, d: int, kernel: Any = None, **_: Any) -> float:
        """The Gram plus the tile factorisation (:func:`~pipeline.policy.cholesky_cost.predict_cholesky`)."""
        cost = cholesky_cost.predict_cholesky(
            int(n),
            min(self.block_size, int(n)),
            gemm_gflops=self.gemm_gflops,
            disk_read_gbps=self.disk_read_gbps,
            disk_write_gbps=self.disk_write_gbps,
            dtype=self.factor_dtype,
        )
        return self.gram_seconds(n, d) + cost.seconds

    def residual(self, n: int) -> float:
        """Assumed ``ρ = ‖K - F Fᵀ‖₂`` of the preconditioner for N rows."""
        return self.rho * float(n) / RHO_REFERENCE_N

    def cg_iterations(self, n: int, shift: float | None, tol: float | None = None) -> int:
        """Chebyshev bound on PCG iterations at shift μ (``shift=None``: μ = 1)."""
        mu = 1.0 if shift is None or not shift > 0 else float(shift)
        return cg_cost.chebyshev_iterations(self.residual(n), mu, self.tol if tol is None else tol)

    def cg_seconds(
        self,
        n: int,
        d: int,
        kernel: Any = None,
        *,
        shift: float | None = None,
        tol: float | None = None,
        **_: Any,
    ) -> float:
        """Nyström build plus (iterations + 1) matrix-free products plus the
        preconditioner applications (4 N r flops each)."""
        n = int(n)
        rank = min(self.rank, n)
        its = self.cg_iterations(n, shift, tol)
        build = cg_cost.nystrom_build_seconds(n, rank, d, gemm_flops=self.gemm_gflops * 1e9)
        product = cg_cost.product_seconds(n, d, self.kernel_dtype)
        apply = 4.0 * n * rank / (self.gemm_gflops * 1e9 * 0.1)  # GEMV speed, not GEMM
        return build + (its + 1) * product + its * apply
