"""Every default and calibrated constant of a fit, in one place, with why it has its value.

The solvers, stages and estimators import these names; none of them restates a
number. Each calibrated one cites the section of ``docs/PERFORMANCE.md`` that holds
its measurements (machine, benchmark, figures). They set *routing* only (which
solver runs), never a result: every solver is exact to its tolerance whatever it is
chosen by.
"""

from __future__ import annotations

# ---------------------------------------------------------------------------
# defaults of a fit plan (one each; FitPlan and the config models use these)

#: tile edge of the out-of-core Gram, factor and matrix-free products: a 2048² float64
#: tile is 32 MiB, cache-friendly and big enough that per-tile overhead stays small; 4,096
#: is barely faster and costs more peak memory (measured: docs/PERFORMANCE.md#n--40000)
DEFAULT_BLOCK_SIZE = 2048
#: rank of the Nyström preconditioner (capped at N): on diabetes-like RBF
#: problems CG converges in tens of iterations at rank 300-500; the factor costs
#: 8·N·rank bytes (0.2 GB at N = 50k)
DEFAULT_RANK = 500
#: centres of ``solver="nystrom"`` when none are named (FALKON's M; capped: M >= N falls
#: back to the exact solver); K_MM and its two factors take 3·8·M² bytes (24 MB at 1000)
DEFAULT_N_CENTERS = 1000
#: relative residual at which CG stops; matches scikit-learn's predictions to ~1e-6
DEFAULT_TOL = 1e-6
#: CG iteration cap (a solve that needs more is reported unconverged, never silently used)
DEFAULT_MAX_ITER = 1000
#: CG preconditioner: RPCholesky Nyström whose rank grows until ‖K - F Fᵀ‖ <=
#: ADAPTIVE_FIT_FACTOR · μ (CG then needs a handful of iterations whatever λ; "nystrom" is
#: the fixed rank DEFAULT_RANK; measured: docs/PERFORMANCE.md#hard-solves-small-λ-by-cg)
DEFAULT_PRECONDITIONER = "adaptive"
#: the adaptive preconditioner stops growing when its estimated ‖K - F Fᵀ‖₂ is at most
#: this multiple of the shift (κ <= 1 + factor): for a factor that serves many solves,
#: a CV search's every λ and fold (pipeline.models.selection)
ADAPTIVE_FACTOR = 5.0
#: and for a factor that serves one fit's solve (pipeline.fit, and the plan that prices
#: it): a weaker factor, because its build (~2 N r² flops with FᵀF) is paid for one solve
#: only; 10 was the fastest of 5, 10, 20 and 40 (measured:
#: docs/PERFORMANCE.md#hard-solves-small-λ-by-cg)
ADAPTIVE_FIT_FACTOR = 10.0
#: its rank cap when ``rank`` is not set: max(ADAPTIVE_RANK_FLOOR, ADAPTIVE_RANK_SCALE ·
#: N^(2/3)) (:func:`adaptive_rank_cap`): the build costs ~N r² flops against ~N² kernel
#: entries per CG product, so a rank worth its build grows slower than N (diamonds N =
#: 40,000, λ = 1e-2: rank 3,594 reached the target; the cap is 4,679)
ADAPTIVE_RANK_FLOOR = 256
ADAPTIVE_RANK_SCALE = 4.0
#: and the bytes its float32 factor may take: at most this, and at most
#: ADAPTIVE_MEMORY_FRACTION of the memory free (the cap scales with N up to these)
ADAPTIVE_MEMORY_BUDGET = 2 << 30
ADAPTIVE_MEMORY_FRACTION = 0.25
#: a float32 Nyström factor whose float64 copy takes at most this many bytes is kept in
#: float64 too, for its preconditioner's applies: they multiply in float64 either way,
#: and upcasting F at every apply was half of each product (kin40k, 3,000 rows, the CV
#: screen: the fold applies were 17 % of the search's samples)
PRECOND_F64_COPY_BYTES = 256 << 20
#: the rank at which the plan measures ρ on a subsample to predict the adaptive factor's
#: rank and residual (a subsample of SPECTRUM_MAX_ROWS rows resolves it)
ADAPTIVE_PROBE_RANK = 1000
#: CG checkpoint interval (iterations) of the resumable solve
DEFAULT_CHECKPOINT_EVERY = 10
#: precision of the stored Cholesky factor and of the Gram
DEFAULT_FACTOR_DTYPE = "float64"
DEFAULT_KERNEL_DTYPE = "float64"
#: λ convention: "sklearn" solves (K + λI), "n_samples" solves (K + nλI)
DEFAULT_ALPHA_CONVENTION = "sklearn"
#: seed of the Nyström landmarks when the user gives none
DEFAULT_RANDOM_STATE = 0

# ---------------------------------------------------------------------------
# routing of solver="auto" for one fit (pipeline.plan.fit_plan.plan_fit)

#: the simple cost model's crossover: above this N an out-of-core fit uses CG, since a
#: Cholesky's N³/3 flops (9 TFLOP at 30k) cost more than the ~100 kernel products of N²
#: entries a Nyström-preconditioned CG needs
#: (measured: docs/PERFORMANCE.md#the-solver-policy-against-measured-times)
CHOLESKY_MAX_N = 30_000
#: leave this fraction of the free disk and memory unused when planning
DISK_MARGIN = 0.8
#: the dense in-memory solve may use this fraction of the available memory
#: (scikit-learn's solve copies K twice: 3·N²·8 bytes peak;
#: measured: docs/PERFORMANCE.md#scikit-learns-kernelridge-the-baseline)
MEMORY_SAFETY_FRACTION = 0.85
#: CG's operator: from this many features on, reading a stored float64 entry (8 bytes
#: at ~1 GB/s) beats recomputing it (O(D) flops at 7 ns per entry per core, measured)
STORED_MATVEC_MIN_FEATURES = 64
#: rates of the simple cost model (pipeline.plan.calibrated.SimpleCostModel): the tile
#: Cholesky's GFLOP/s, the fused matrix-free product's kernel entries per second, and the
#: products of a Nyström-preconditioned CG; with these the model crosses at CHOLESKY_MAX_N
#: (measured: docs/PERFORMANCE.md#the-solver-policy-against-measured-times)
CHOLESKY_GFLOPS = 60.0
KERNEL_ENTRIES_PER_SECOND = 0.6e9
CG_TYPICAL_PRODUCTS = 100
#: rates of the calibrated cost model (pipeline.plan.calibrated.CalibratedCostModel,
#: ``cost_model="calibrated"``), used when the caller measured none:
#: ‖K - F Fᵀ‖₂ of the rank-500 RPCholesky factor on the calibration problem, relative to a
#: unit kernel diagonal (measured: docs/PERFORMANCE.md#the-solver-policy-against-measured-times)
RHO_AT_DEFAULT_RANK = 0.76
#: the N of that measurement; ρ is scaled by N / RHO_REFERENCE_N
RHO_REFERENCE_N = 10_000
#: 2-core float64 GEMM probe (measured: docs/PERFORMANCE.md#compute)
DEFAULT_GEMM_GFLOPS = 150.0
#: Zarr v3 float64 tiles, uncompressed (measured: docs/PERFORMANCE.md#disk-and-zarr)
DEFAULT_DISK_READ_GBPS = 1.0
DEFAULT_DISK_WRITE_GBPS = 0.8

# ---------------------------------------------------------------------------
# the one cost model of solver="auto" (pipeline.plan.calibrated, pipeline.plan.cg_cost,
# pipeline.plan.cholesky_cost, pipeline.linalg.spectrum), fitted to the grid of
# workflows/benchmarks/bench_policy_grid.py and checked against it
# (measured: docs/PERFORMANCE.md#the-solver-policy-against-measured-times)

#: CG iterations / Chebyshev bound of κ = 1 + ρ/μ: the spectrum of the preconditioned
#: matrix clusters, so CG beats the bound
#: (measured: docs/PERFORMANCE.md#the-solver-policy-against-measured-times)
CG_BOUND_FRACTION = 0.6
#: kernel entries per second of the fused engine, 2 cores, D = 14, each entry counted once;
#: cg_cost.entry_rate scales them to other D (measured: docs/PERFORMANCE.md#kernel-times-vector)
ENTRY_RATE_FLOAT64 = 0.53e9
ENTRY_RATE_FLOAT32 = 0.84e9
#: the per-entry cost is proportional to D + ENTRY_COST_D0 (the exp and the bookkeeping
#: cost as much as this many feature terms)
ENTRY_COST_D0 = 16.0
#: mixed precision (pipeline.linalg.cg_mixed_fit, tol 1e-6): inner float32 iterations per
#: float64 iteration, more beyond MIXED_MAX_N_OVER_SHIFT, where the float32 products' error
#: limits each refinement step
#: (measured: docs/PERFORMANCE.md#cgs-product-stored-or-recomputed-float64-or-mixed)
MIXED_INNER_OVERHEAD = 1.15
MIXED_INNER_OVERHEAD_ILL = 1.7
MIXED_MAX_N_OVER_SHIFT = 2e6
#: tile Cholesky factorisation rate / 2-thread GEMM rate of the same run, as a function of
#: the tiles per side T = ceil(N / b): CHOLESKY_EFFICIENCY_MAX * T / (T + CHOLESKY_EFFICIENCY_T0)
#: (the diagonal POTRFs, the TRSMs and the I/O that nothing overlaps are a ~1/T share);
#: least squares over quiet runs on two machines, so it is for a quiet machine
#: (measured: docs/PERFORMANCE.md#sweeps-and-the-cost-model-of-the-factor)
CHOLESKY_EFFICIENCY_MAX = 0.90
CHOLESKY_EFFICIENCY_T0 = 0.8
#: float32 factor (float64 POTRF on the diagonal) / float64 factor speed
#: (measured: docs/PERFORMANCE.md#sweeps-and-the-cost-model-of-the-factor)
FLOAT32_SPEEDUP = 1.86
#: resident memory of the interpreter with numpy/scipy/zarr/dask imported
BASE_RSS_BYTES = 300 << 20
#: the extra memory the tile Cholesky's threads executor may hold in read-ahead and in
#: write-behind, each (:mod:`pipeline.linalg.cholesky_exec` sizes its queues by it)
IO_BUDGET_BYTES = 256 << 20
#: fixed seconds of one out-of-core fit through the public estimator, beyond the work the
#: model counts: store and Zarr array creation, fingerprints, thread pools, the solve's
#: I/O set-up (CG's: also the Nyström build, the checkpoint store and the plan's subsample
#: estimate); from the grid's smallest fits
#: (measured: docs/PERFORMANCE.md#the-solver-policy-against-measured-times)
CHOLESKY_FIXED_SECONDS = 0.05
CG_FIXED_SECONDS = 0.3
#: one matrix-free CG product costs CG_PRODUCT_ROW_BLOCK_SECONDS per row block of
#: DEFAULT_BLOCK_SIZE rows (its Dask tasks and fixed-order reduction) plus N² entries at
#: CG_PRODUCT_ENTRY_RATE per second at D = 14 (the symmetric fused product evaluates each
#: lower-triangle entry once and uses it twice); fitted to whole CG solves
#: (measured: docs/PERFORMANCE.md#the-solver-policy-against-measured-times)
CG_PRODUCT_ROW_BLOCK_SECONDS = 0.0095
CG_PRODUCT_ENTRY_RATE = 1.76e9
#: float64 / float32 time of that whole product (the row-block costs shrink too), fitted
#: from whole solves
#: (measured: docs/PERFORMANCE.md#cgs-product-stored-or-recomputed-float64-or-mixed)
CG_PRODUCT_FLOAT32_SPEEDUP = 1.5
#: mixed precision (pipeline.linalg.cg_mixed_fit): digits of the float64 residual gained
#: per refinement step (its inner float32 solves stop at MIXED_INNER_TOL)
MIXED_DIGITS_PER_STEP = 3.0
MIXED_INNER_TOL = 1e-3
#: an inner float32 solve has reached its floor when its residual has not fallen by 10 % in
#: this many iterations; fewer stop restarted solves at their first plateau and fall back
#: to float64 needlessly
#: (measured: docs/PERFORMANCE.md#cgs-product-stored-or-recomputed-float64-or-mixed)
MIXED_INNER_PATIENCE = 20
#: CG with the stored Gram (matvec="stored"): the set-up (the Gram stage, its Zarr tiles,
#: fsyncs and markers, and the preconditioner's columns read back) costs the lower tiles'
#: bytes at CG_STORED_SETUP_BYTES_PER_SECOND; each product a fixed cost per lower tile
#: (read, CRC-32C check, task) plus the bytes at CG_STORED_BYTES_PER_SECOND (page cache).
#: Fitted at N <= 8,000; a Gram larger than the page cache is read at disk speed, so
#: large-N figures are rough
#: (measured: docs/PERFORMANCE.md#cgs-product-stored-or-recomputed-float64-or-mixed)
CG_STORED_SETUP_BYTES_PER_SECOND = 0.113e9
CG_STORED_TILE_SECONDS = 0.0048
CG_STORED_BYTES_PER_SECOND = 3.06e9
#: the tile Cholesky writes its factor tiles past the page cache (O_DIRECT; the process
#: keeps them in its tile cache for the solves): fresh page-cache pages cost far more CPU
#: than a direct write (measured: docs/PERFORMANCE.md#known-traps)
DIRECT_FACTOR_WRITES = True
#: the Gram stage: N²/2 lower entries per second (float64, D = 14), the fused engine's rate
#: (measured: docs/PERFORMANCE.md#kernel-times-vector; the stage with its Zarr writes:
#: docs/PERFORMANCE.md#the-gram-stage)
GRAM_ENTRY_RATE = 0.53e9
#: the Nyström build: its N x r kernel columns run at this fraction of the fused rate (they
#: are not fused), and its r x r eigendecomposition costs this many r³ flops at GEMM speed
#: (measured: docs/PERFORMANCE.md#the-solver-policy-against-measured-times)
NYSTROM_COLUMN_RATE_FRACTION = 1.0 / 3.0
NYSTROM_EIG_FLOPS_PER_R3 = 45.0
#: FALKON's PCG (solver="nystrom"): iterations to its default tolerance, as the cost
#: model expects them (kin40k, M = 1,000 and 4,000: 53 and 82; bench_exactness.py)
NYSTROM_PCG_TYPICAL_ITERATIONS = 60
#: a preconditioner application (two N x r GEMVs) runs at this fraction of GEMM speed
GEMV_FRACTION_OF_GEMM = 0.1
#: the Cholesky's diagonal chain (one tile POTRF + TRSM per column) runs at this fraction
#: of one core's GEMM rate
POTRF_CHAIN_EFFICIENCY = 0.5
#: the factor-tile cache of the out-of-core Cholesky (bytes)
CHOLESKY_CACHE_BYTES = 1 << 30
#: Nyström's kernel blocks (N x M) are kept between products when they fit in this many
#: bytes: each CG iteration is then two passes of GEMM over them, not N·M kernel
#: evaluations (kin40k, N = 36,000, M = 1000: bench_nystrom.py)
NYSTROM_CACHE_BYTES = 1 << 30
#: the direct Nyström solve forms ``K_nMᵀ W K_nM`` from the kernel blocks mapped by
#: FALKON's ``T⁻¹`` (``K_MM + ε I = TᵀT``; scikit-learn's order: features first) once the
#: relative error that the centres' own basis brings to the solution reaches this: the
#: formed matrix's rounding, ``eps · N · max diag(K_MM)² · ‖T⁻¹‖₂²``, over the smallest
#: diagonal shift λ (:meth:`pipeline.linalg.nystrom_solve.FalkonPreconditioner.maps_rows`).
#: The mapping doubles the pass's flops (a TRSM beside each block's SYRK), so it is kept
#: for the ill-conditioned centres that need it: uniform centres on diamonds gave a fold
#: a held-out R² of -10.6 unmapped (measured: docs/CV_AT_SCALE.md)
NYSTROM_MAPPED_FROM = 1e-3
#: the plan-time estimate of the preconditioner's residual (pipeline.linalg.spectrum):
#: rows of the subsample (at least SPECTRUM_RANK_FACTOR x the rank, at most
#: SPECTRUM_MAX_ROWS) and power iterations on its residual
SPECTRUM_SAMPLE_ROWS = 2000
SPECTRUM_RANK_FACTOR = 4
SPECTRUM_MAX_ROWS = 4000
SPECTRUM_POWER_ITERATIONS = 10
#: a named solver="cg" measures ρ (to choose its product's variant) only when the solve is
#: predicted to take this long: the estimate then costs at most about 10 %
SPECTRUM_WORTH_SECONDS = 5.0
#: CG's product is stored or mixed-precision (pipeline.plan.cg_variant) only when that is
#: predicted to save this fraction and this many seconds of the float64 recomputing solve;
#: below that the grid's timing noise (about 10 %) would decide
CG_VARIANT_MIN_SAVING = 0.1
CG_VARIANT_MIN_SECONDS = 1.0

# ---------------------------------------------------------------------------
# KernelRidgeCV (pipeline.models.selection): search routing and its cost model

#: largest n for which KernelRidgeCV(solver="auto") stays in memory
IN_MEMORY_MAX_N = 20_000
#: relative CG tolerance of the search (tighter than a single fit's so that scores
#: of CG-routed settings compare with those of the exact in-memory solvers)
CV_TOL = 1e-8
#: eigendecomposition cost in units of n³ flops of potrf-speed work: a rough calibration
#: between quiet and loaded measurements (measured: docs/PERFORMANCE.md#model-selection)
EIG_FLOPS_PER_N3 = 4.0
#: band reduction of an m x m training Gram (LAPACK dsytrd_sy2sb, 4/3 m³ BLAS-3 flops) in
#: the same units (measured: docs/PERFORMANCE.md#model-selection)
BAND_FLOPS_PER_M3 = 1.2
#: settings routed to CG in memory solve to this relative residual, with a Nyström
#: preconditioner of rank min(ROUTE_RANK, n // ROUTE_RANK_DIVISOR) (or ``rank``)
ROUTED_CG_TOL = 1e-10
ROUTE_RANK = 1000
ROUTE_RANK_DIVISOR = 8
#: a band reduction (LAPACK dsytrd_sy2sb) runs at about this fraction of the
#: single-thread GEMM rate (measured: docs/PERFORMANCE.md#model-selection)
BAND_GEMM_EFFICIENCY = 0.65
#: CG does a product with K plus, per fold, a preconditioner apply and vector updates
CG_PASS_OVERHEAD = 1.5
#: CG must be predicted cheaper than this fraction of the band reductions
CG_MARGIN = 0.5
#: flops of one band reduction of an m x m Gram, per m³ (dsytrd_sy2sb, BLAS-3)
BAND_REDUCTION_FLOPS_PER_M3 = 4.0 / 3.0
#: routing measures ‖K - F Fᵀ‖ by this many block power iterations, and inflates the
#: estimate by ROUTE_RHO_SAFETY (the power iteration approaches ρ from below)
ROUTE_POWER_ITERATIONS = 8
ROUTE_RHO_SAFETY = 1.1
#: edge of the float64 GEMM that probes the one-thread flop rate (a 30 ms probe)
GEMM_PROBE_SIZE = 768
#: out-of-core CV by block PCG (pipeline.models.selection.cvblock): kernel passes per
#: kernel setting (all folds and λ in one block; float32 inner solves plus float64
#: residual checks) (measured: docs/PERFORMANCE.md#model-selection)
CV_BLOCK_PASSES = 40
#: seconds per kernel entry and per column of one pass (a symmetric pass multiplies
#: each lower-tile entry twice: 4 flops per column at about 60 GFLOP/s on 2 cores)
CV_BLOCK_COLUMN_SECONDS = 6.7e-11
#: one fold's r x r eigendecomposition (LAPACK syevr, one BLAS thread per fold) in
#: units of r³ flops at CHOLESKY_GFLOPS (measured: docs/PERFORMANCE.md#model-selection)
CV_EIGH_FLOPS_PER_R3 = 30.0
#: screening (KernelRidgeCV's default screen_tol, solver cg): every (λ, fold) system to
#: this float64 relative residual, then only the best screen_top λ on to tol
CV_SCREEN_TOL = 1e-3
#: the λ of each kernel setting solved on to tol after screening (KernelRidgeCV's default
#: screen_top); with the Nyström screen, the finalists of the grid
CV_SCREEN_TOP = 3
#: the Nyström screen (KernelRidgeCV's default screen_centers, solver cg): every candidate
#: scored by Nyström KRR on this many RPCholesky centres, then only the finalists solved
#: exactly (pipeline.models.selection.finalists); its finalists held the exhaustive
#: search's pick (measured: docs/CV_AT_SCALE.md)
CV_SCREEN_CENTERS = 1000
#: the search's cost model (pipeline.plan.cv_routing.cg_passes) prices CV_BLOCK_PASSES
#: for its default run (adaptive preconditioner, screening), times these where a search
#: runs otherwise: no screening (every system on to tol); a Nyström factor of fixed rank
#: r below the adaptive cap r_a, (r_a / r)^CV_FIXED_RANK_PASS_EXPONENT; no preconditioner
#: (plain CG: about 1,600 iterations at λ = 1e-2, N = 12,000; docs/CV_AT_SCALE.md), also
#: the most a fixed rank costs (measured at N = 3,000: docs/CV_AT_SCALE.md, "The
#: defaults and the routing")
CV_UNSCREENED_PASS_FACTOR = 1.7
CV_FIXED_RANK_PASS_EXPONENT = 1.25
CV_UNPRECONDITIONED_PASS_FACTOR = 40.0
#: the chosen setting is re-scored by float64 block PCG to VERIFY_TOL: one more
#: preconditioner and about this many float64 passes (one column per fold)
CV_VERIFY_PASSES = 10
#: solver cholesky: the L⁻¹ panels of the leave-one-out / leave-group-out residuals of
#: one factor cost about this many factorisations (n³/3 flops: models.selection.loo)
CV_PANELS_PER_FACTORISATION = 1.0

# ---------------------------------------------------------------------------
# KernelRidgeCV's solvers (pipeline.models.selection): tolerances, ranks, sizes

#: relative residual of the verification solves of the chosen setting (float64 products)
VERIFY_TOL = 1e-10
#: block PCG (cvblock): inner float32 solves reduce the residual by this factor per
#: refinement step
CV_INNER_TOL = 1e-3
#: float64 refinement steps before a column is declared unconverged
CV_MAX_REFINEMENTS = 8
#: the adaptive rank is capped at max(CV_RANK_FLOOR, CV_RANK_SCALE * n^(2/3)) (and by
#: memory): the fold eigendecompositions cost ~r³ while a pass costs ~n², so a rank worth
#: its build grows like n^(2/3) (measured: docs/PERFORMANCE.md#model-selection)
CV_RANK_FLOOR = 256
CV_RANK_SCALE = 3.0
#: bytes the block PCG's preconditioner may use (F in float32 plus one r x r basis per fold)
CV_PRECOND_BUDGET = 1_200_000_000
#: Nyström rank of the CV's CG solves when ``rank`` is not given (capped at n)
CV_DEFAULT_RANK = 200
#: block CG: a column whose best residual has not fallen by 1% in this many iterations
#: stagnates
STAGNATION_WINDOW = 200
#: rows of the n x r Nyström factor multiplied at once (bounds the float64 temporaries)
FACTOR_ROW_STEP = 8192
#: from this order on, an in-memory dense Cholesky (``linalg.dense_dual.cho_factor``) is
#: blocked in tiles of DENSE_POTRF_TILE (and a lone potrf would get one BLAS thread):
#: scipy 1.17's bundled OpenBLAS crashes in a 2-thread potrf at n >= ~15,800
#: (docs/PERFORMANCE.md#known-traps); the memory figure (dense_dual_bytes) counts the
#: blocked factor's tiles from here too
ONE_BLAS_THREAD_FROM = 12_000
#: the package's large ``gᵀ g`` (OpenBLAS's SYRK: the Nyström sums, FALKON's T Tᵀ, FᵀF, a
#: kernel object's X Xᵀ) run in column panels of at most this order
#: (``pipeline.blas_guard.gram_t``): numpy 2.4's bundled OpenBLAS 0.3.31 (SkylakeX
#: kernels, an AVX-512 Intel Xeon) segfaults in a 2-thread SYRK whose order is past a
#: bound that falls as its inner dimension k grows; no order <= 12,000 ever did
#: (measured: docs/PERFORMANCE.md#known-traps)
SYRK_PANEL = 8_192
#: tile order of that blocked in-memory factorisation (well below the crash's order:
#: potrf on a tile keeps every BLAS thread)
DENSE_POTRF_TILE = 4_096
#: factor tiles that blocked factorisation keeps in memory besides the matrix (the rest
#: are read back from it): 6 was as fast as 8 and faster than 4 at n = 16,000
#: (measured: docs/PERFORMANCE.md#scikit-learns-kernelridge-the-baseline)
DENSE_POTRF_TILES_HELD = 6
#: an in-memory ``solver="auto"`` fit takes matrix-free CG instead of the dense dual
#: that fits only when the cost model predicts CG this many times faster: a wrong CG
#: costs iterations where a wrong dense solve costs only its n³/3 flops. 2 kept the dense
#: dual at 12,000 rows of kin40k where the plan predicted CG 1.87-1.95x faster and CG was
#: 1.2-3.4x faster on two kinds of machine; on two runs of a 48-case grid each case that 1.5
#: adds to CG was 1.2-2.5x faster (tests/plan/test_inmemory_grid.py replays the second;
#: measured: docs/PERFORMANCE.md#the-solver-policy-against-measured-times)
IN_MEMORY_CG_MARGIN = 1.5
#: bytes of one L⁻¹ panel held in memory by the exact LOO/LGO residuals
LOO_PANEL_BYTES = 512 * 1024**2

# ---------------------------------------------------------------------------
# the tile Cholesky on a device backend (pipeline.linalg.cholesky_device)

#: the default tile edge on a GPU (a cuBLAS GEMM of 4096^3 runs near peak)
GPU_BLOCK = 4096
#: the default tile edge on a host backend
HOST_BLOCK = 256
#: share of the free device memory the factor's tiles may hold by default (the rest:
#: cuBLAS/cuSOLVER workspace, the Gram tile being made, the solve's vectors)
DEVICE_MEMORY_SHARE = 0.8
#: tiles a tile computation needs on the device at once: A, L_ik, L_jk (or L_jj),
#: and the POTRF's kept copy or the TRSM's result
MIN_RESIDENT_TILES = 4
#: the panel schedule's device tiles besides the panel and its upload slots: a TRSM's
#: result, the POTRF's zeroed upper triangle, the jitter's kept copy
PANEL_SCRATCH_TILES = 3
#: uploads queued ahead of the compute in the panel schedule
PANEL_PREFETCH = 2
#: threads reading a stored Gram's tiles ahead of a device factorisation (each read
#: decompresses and checks a tile on the host while the device works)
STORED_READ_AHEAD = 4


# ---------------------------------------------------------------------------
# tile size of the Dask tile Cholesky by worker count (pipeline.engine.placement
# .dask_block_size; docs/SCALING.md, item 4 of issue #19)
#: the left-looking graph's critical path is ~1.5 n^2 b flops against n^3 / 3 of work,
#: so about n / (4.5 b) workers can be busy; the policy's tile is n / (6 P), a path of
#: 3/4 of one worker's share of the work; 6 is the scaling model's best choice over
#: N = 100k-1M, P = 8-128 and tiles 1024-4096 (docs/SCALING.md, item 4)
CHOL_DASK_PATH_FACTOR = 6.0
#: smallest tile the policy picks: a 1024² one-thread GEMM (31 ms) keeps Dask's ~3 ms
#: round trip per task (measured, scaling_validate.py) near 10 %
CHOL_DASK_MIN_BLOCK = 1024
#: largest tile the policy picks (128 MiB in float64; a task holds about four)
CHOL_DASK_MAX_BLOCK = 4096
#: the Dask executor of the tile Cholesky takes the ready tile with the longest path to
#: the end first, as the threads executor does (a callback on the threaded scheduler,
#: priorities on a client); False leaves Dask's own order (dask.order, row by row)
DASK_CRITICAL_PATH_FIRST = True
#: columns of one lane of the forward/back sweeps: lanes are independent tile DAGs run
#: in parallel (the LOO panels' wide right-hand sides use every core); a fixed width,
#: so the bits do not depend on the core count
SWEEP_LANE_COLUMNS = 256
#: bytes of evicted factor-tile buffers kept for the next tile reads (pipeline.storage.
#: buffers): new memory costs CPU to fault in, and each re-read of an evicted tile would
#: land in fresh pages (measured: docs/PERFORMANCE.md#n--40000)
TILE_BUFFER_POOL_BYTES = 640 << 20
#: a factor tile evicted from the tile cache while a task still reads it gives its buffer
#: to the pool once that task lets it go (checked at each later eviction), instead of
#: back to the system: far fewer new tile buffers at 80k
#: (measured: docs/PERFORMANCE.md#n--80000-a-gram-twice-this-machines-memory-item-4)
RECYCLE_HELD_EVICTIONS = True
#: new tile-read buffers of at least this many bytes are faulted in between two wide
#: (all-core) BLAS calls on every core (pipeline.engine.blas.first_touch_between_calls),
#: not by a reader thread that preempts one of the call's threads while its partners
#: spin; 0 turns it off (measured: docs/PERFORMANCE.md#known-traps)
FIRST_TOUCH_MIN_BYTES = 4 << 20
#: OPENBLAS_THREAD_TIMEOUT the package sets, unless the user did, before SciPy's OpenBLAS
#: loads (pipeline._blas_env): idle BLAS threads spin 2**4 cycles after a call, not 2**28
#: (about 0.1 s), so the tile threads' reads and copies between two all-core calls get the
#: cores; 0 leaves the variable alone
#: (measured: docs/PERFORMANCE.md#the-tile-cholesky-against-scipy-item-1)
OPENBLAS_THREAD_TIMEOUT = 4
#: the tile Cholesky's Gram reads (each Gram tile is read once per factorisation) drop
#: the chunk file from the page cache once read (POSIX_FADV_DONTNEED,
#: pipeline.storage.rawchunks.read_chunk): the guest frees those pages at once, and the
#: next new read buffer lands in them instead of in free memory the VM's host must fault
#: in again (measured: docs/PERFORMANCE.md#the-tile-cholesky-against-scipy-item-1). A later
#: factorisation (a new lambda) reads the Gram from disk instead of the page cache, ahead
#: of its tasks (TileIO). False keeps the Gram cached
DROP_READ_PAGE_CACHE = True
#: the Gram stage writes its tiles past the page cache (O_DIRECT, where the filesystem
#: allows it; pipeline.storage.rawchunks.write_chunk): a tile written through the page
#: cache fills fresh pages, which cost CPU, while its reader, the factorisation, reads
#: each Gram tile once and drops it from the page cache anyway
#: (measured: docs/PERFORMANCE.md#the-gram-stage). False writes through the page cache (a later
#: reader then copies from memory)
GRAM_WRITES_PAST_PAGE_CACHE = True
#: the Dask executor's tasks in worker processes (a distributed client, the processes
#: scheduler) write their factor tiles through the page cache and map the other workers'
#: tiles from it (mmap, read-only: pipeline.linalg.cholesky_cache.mapped_factor_reads)
#: instead of writing past it (O_DIRECT) and reading each into new memory in every
#: worker; False: as the in-process executors
#: (measured: docs/PERFORMANCE.md#the-tile-cholesky-against-scipy-item-1)
HOST_SHARED_FACTOR_TILES = True
#: with HOST_SHARED_FACTOR_TILES: once a worker has written a factor tile through the
#: page cache, its tile cache maps the file's pages and the private copy's memory takes
#: the next Gram tile read (new memory costs CPU to fault in;
#: measured: docs/PERFORMANCE.md#the-tile-cholesky-against-scipy-item-1)
SHARE_WRITTEN_TILES = True
#: after a factorisation on a distributed client, each worker drops that factor's cached
#: tiles (up to its tile cache's 1 GiB, some of them mapped files), the tile buffers
#: kept for reuse (up to TILE_BUFFER_POOL_BYTES) and its aligned write buffer: a worker
#: of a long-lived cluster would otherwise hold them, as unmanaged memory that Dask's
#: memory monitor counts against the worker's limit, and a mapped tile keeps its file's
#: disk space after the store is deleted. The solve that follows runs in the client's
#: process and maps or reads the tiles itself. False keeps them (the next factorisation
#: of the same fingerprint, a resumed one, would reuse them)
RELEASE_WORKER_TILES = True
#: a factor task that reads its own Gram tiles (the Dask executor in worker processes,
#: which has no read-ahead threads) first asks the kernel to read the next Gram tile of
#: its tile row into the page cache in the background (POSIX_FADV_WILLNEED). Since the
#: Gram stage writes past the page cache (GRAM_WRITES_PAST_PAGE_CACHE), these reads
#: come from disk and their latency would stall the task
#: (measured: docs/PERFORMANCE.md#the-embedded-cluster-on-the-factors-machine)
PREFETCH_NEXT_GRAM_TILE = True
#: scheduler="auto" (factor_scheduler: auto) factors on the threads executor in this
#: process when a distributed client's workers all run on this machine (the embedded
#: LocalCluster of krr run, or a scheduler and workers started here), and on the workers
#: (one Dask task per tile) only when they run elsewhere. On one machine the threads
#: executor shares one tile cache and one read-ahead, writes no tile through the page
#: cache, and is faster (measured: docs/PERFORMANCE.md#the-tile-cholesky-against-scipy-item-1).
#: False: always the workers
FACTOR_THREADS_ON_THIS_HOST = True
#: a tile pass over at most this many kernel entries runs on Dask's threaded scheduler in
#: this process, not on a distributed client whose workers all run on this machine
#: (pipeline.engine.where): the cluster's round trip costs more than such a pass
#: (measured at D = 8: docs/PERFORMANCE.md#model-selection)
SMALL_PASS_ENTRIES = 8_000_000
#: a tile pass over at most this many kernel entries (weighed at D = 8) that runs in this
#: process, without a progress display, runs in the calling thread on Dask's synchronous
#: scheduler (pipeline.engine.where.runs_inline): the threaded scheduler's own work
#: (graph conversion, ordering, hand-offs) cost more than such a pass, with the same
#: bits (measured: docs/PERFORMANCE.md#model-selection)
INLINE_PASS_ENTRIES = 1_000_000
#: the ingest stage runs in this process, not on a distributed client whose workers all
#: run on this machine, when its source arrays (X and y, read or in memory) hold at most
#: this many values (512 MB of float64): in this process it was 3-6x faster at every size
#: measured, with the same stored rows and fingerprints; larger sources stay on the
#: workers, not measured (measured: docs/PERFORMANCE.md#the-main-job-and-the-ingest)
SMALL_INGEST_VALUES = 64_000_000
#: bytes of row blocks that io.validate.iter_row_blocks computes together (validation and
#: fingerprints stream a source in batches of consecutive blocks, one batch held at a
#: time). Every computation costs time in proportion to the source's whole graph, so
#: batches of a fixed 2 blocks made the ingest quadratic in its blocks
#: (measured: docs/PERFORMANCE.md#the-main-job-and-the-ingest)
ROW_BATCH_BYTES = 64 * 2**20
#: Dask settings of the embedded LocalCluster (pipeline.engine.parallel.dask_client; never of a
#: cluster given by address), each applied only where the user's Dask config still has
#: Dask's default: no statistical profiler in the workers (it samples every thread's
#: stack every 10 ms); the event loops' tick every 1 s instead of 20 ms, the system
#: monitor every 2 s instead of 0.5 s, and the workers' and nannies' memory checks every
#: 1 s instead of 0.1 s (a worker past its memory limit is paused or restarted up to
#: 1 s later). On 2 cores each wake-up preempts one thread of an all-core BLAS call
#: while its partner spins
#: (measured: docs/PERFORMANCE.md#the-embedded-cluster-on-the-factors-machine)
EMBEDDED_CLUSTER_DASK_CONFIG = {
    "distributed.worker.profile.enabled": False,
    "distributed.admin.tick.interval": "1s",
    "distributed.admin.system-monitor.interval": "2s",
    "distributed.worker.memory.monitor-interval": "1s",
}

#: keep_gram=False with X in memory (KernelRidge, fit.execute): the Gram is not stored
#: first. build_gram(defer=True) only creates its array, and the in-place factor computes
#: each Gram tile from X (GramTileRecomputer, in its read-ahead threads) when it needs it,
#: then stores its factor tile there: no Gram stage, and no Gram bytes written or read
#: (measured: docs/PERFORMANCE.md#the-gram-stage). False: the Gram stage runs first
GRAM_ON_DEMAND_IN_PLACE = True
#: evaluation dtype of an on-demand Gram tile (the tile engine's fused evaluators, then
#: cast to the Gram's dtype): twice as fast as the kernel object's own evaluation, which
#: left the float32 factor waiting (measured: docs/PERFORMANCE.md#the-gram-stage)
GRAM_ON_DEMAND_KERNEL_DTYPE = "float64"

# -- factor_dtype="auto": a float32 tile Cholesky refined to float64, when it pays ------
#: rows below which "auto" keeps the float64 factor: the float32 one pays from 10,000
#: rows up (measured: docs/PERFORMANCE.md#a-float32-factor-refined-to-float64-item-2)
FACTOR_FLOAT32_MIN_ROWS = 10_000
#: rows of the seeded subsample whose kernel eigenvalues judge float32's risk: 1,000 cost
#: far less than 2,000 and gave the same decisions
#: (measured: docs/PERFORMANCE.md#a-float32-factor-refined-to-float64-item-2)
FACTOR_FLOAT32_SAMPLE_ROWS = 1000
#: the largest risk eps32 * lmax(K) / (lmin(K_sub) + shift), eps32 = 1.19e-7, that "auto"
#: factors in float32: below it float32 paid, above it it paid little or lost positive
#: definiteness. A wrong float32 choice costs time, not the answer (execute redoes a
#: failed one in float64) (measured: docs/PERFORMANCE.md#a-float32-factor-refined-to-float64-item-2)
FACTOR_FLOAT32_MAX_RISK = 1.0


def adaptive_rank_cap(
    n: int, *, scale: float = ADAPTIVE_RANK_SCALE, floor: int = ADAPTIVE_RANK_FLOOR
) -> int:
    """The adaptive preconditioner's rank cap for N = ``n`` rows when no rank is named:
    ``min(n, max(floor, scale · n^(2/3)))`` (the fit's scale is
    :data:`ADAPTIVE_RANK_SCALE`; the CV search's, with r³ fold eigendecompositions,
    :data:`CV_RANK_SCALE` and :data:`CV_RANK_FLOOR`)."""
    n = int(n)
    return int(min(n, max(float(floor), scale * n ** (2.0 / 3.0))))


def rank_for_budget(n: int, memory_budget: int, dtype: str = "float32") -> int:
    """The largest rank whose N x rank factor fits in ``memory_budget`` bytes."""
    item = 4 if dtype == "float32" else 8
    return max(0, min(int(n), int(memory_budget) // (int(n) * item)))


def probe_rank(preconditioner: str, rank: int) -> int:
    """The rank at which the plan measures the residual ρ of a fit's Nyström
    preconditioner of rank (or, for ``"adaptive"``, rank cap) ``rank``: that rank, but at
    most :data:`ADAPTIVE_PROBE_RANK` for the adaptive factor, which grows from there."""
    return min(int(rank), ADAPTIVE_PROBE_RANK) if preconditioner == "adaptive" else int(rank)


def spectrum_sample_rows(n: int, rank: int) -> int:
    """Rows of the subsample on which the plan measures the rank-``rank`` residual of
    N = ``n`` rows (:func:`pipeline.linalg.spectrum.estimate_residual`): at least
    :data:`SPECTRUM_RANK_FACTOR` times the rank, at least :data:`SPECTRUM_SAMPLE_ROWS`,
    at most :data:`SPECTRUM_MAX_ROWS` and N."""
    m = max(SPECTRUM_SAMPLE_ROWS, SPECTRUM_RANK_FACTOR * int(rank))
    return int(min(int(n), m, SPECTRUM_MAX_ROWS))


def preconditioner_rank(preconditioner: str, rank: int | None, n: int, memory_bytes: float) -> int:
    """The rank of a fit's Nyström preconditioner, at most N: ``rank`` (default
    :data:`DEFAULT_RANK`) for ``"nystrom"``; for ``"adaptive"`` its cap: ``rank`` if
    named, else :func:`adaptive_rank_cap` (it scales with N), and at most what
    :data:`ADAPTIVE_MEMORY_BUDGET` bytes and :data:`ADAPTIVE_MEMORY_FRACTION` of
    ``memory_bytes`` hold in float32. The one rule: the plan records it, and
    ``linalg.precond.make_preconditioner`` applies it when a caller names no rank."""
    n = max(1, int(n))
    if preconditioner != "adaptive":
        return min(DEFAULT_RANK if rank is None else int(rank), n)
    cap = adaptive_rank_cap(n) if rank is None else int(rank)
    budget = min(ADAPTIVE_MEMORY_BUDGET, ADAPTIVE_MEMORY_FRACTION * float(memory_bytes))
    return max(1, min(n, cap, rank_for_budget(n, int(budget), "float32")))
