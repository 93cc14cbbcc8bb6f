"""Every default and calibrated constant of a fit, in one place, with where it came from.

The solvers, stages and estimators import these names; none of them restates a
number. Figures marked "measured" come from the 2-core, 24 GiB project machine
(SkylakeX and Sapphire Rapids, see ``docs/PERFORMANCE.md``); they set
*routing* only (which solver runs), never a result: every solver is exact to its
tolerance whatever it is chosen by.
"""

from __future__ import annotations

# ---------------------------------------------------------------------------
# defaults of a fit plan (one each; FitPlan and the config models use these)

#: tile edge of the out-of-core Gram, factor and matrix-free products: a 2048²
#: float64 tile is 32 MiB, small enough for two cores' caches to stream and big
#: enough that per-tile overhead stays under ~2% (measured with bench_cholesky.py)
DEFAULT_BLOCK_SIZE = 2048
#: rank of the Nyström preconditioner (capped at N): on diabetes-like RBF
#: problems CG converges in tens of iterations at rank 300-500; the factor costs
#: 8·N·rank bytes (0.2 GB at N = 50k)
DEFAULT_RANK = 500
#: relative residual at which CG stops; matches scikit-learn's predictions to ~1e-6
DEFAULT_TOL = 1e-6
#: CG iteration cap (a solve that needs more is reported unconverged, never silently used)
DEFAULT_MAX_ITER = 1000
#: CG preconditioner
DEFAULT_PRECONDITIONER = "nystrom"
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

#: above this N an out-of-core fit uses CG: a Cholesky costs N³/3 flops (9 TFLOP at
#: 30k, about 2.5 min at the measured 60 GFLOP/s tile Cholesky), more than the ~100
#: kernel products of N² entries a Nyström-preconditioned CG needs. (Was
#: stages/solve.AUTO_CHOLESKY_MAX_ROWS and solvers/choose.CHOLESKY_MAX_N, both deleted.)
CHOLESKY_MAX_N = 30_000
#: leave this fraction of the free disk and memory unused when planning
DISK_MARGIN = 0.8
#: the dense in-memory solve may use this fraction of the available memory
#: (scikit-learn's solve copies K twice: 3·N²·8 bytes peak, measured)
MEMORY_SAFETY_FRACTION = 0.85
#: CG's operator: from this many features on, reading a stored float64 entry (8 bytes
#: at ~1 GB/s) beats recomputing it (O(D) flops at 7 ns per entry per core, measured)
STORED_MATVEC_MIN_FEATURES = 64
#: rates of the simple cost model (pipeline.plan.calibrated.SimpleCostModel),
#: measured on SkylakeX / Sapphire Rapids with 2 cores: the tile Cholesky at about
#: 60 GFLOP/s; the fused matrix-free product at 0.53-0.6 G kernel entries per second
#: (float64, cache-blocked RBF, D=14); a Nyström-preconditioned CG needing on the
#: order of 100 products. With these, N³/3 / 60e9 = 100·N² / 0.6e9 at N = 30,000:
#: the cost model crosses exactly at CHOLESKY_MAX_N.
CHOLESKY_GFLOPS = 60.0
KERNEL_ENTRIES_PER_SECOND = 0.6e9
CG_TYPICAL_PRODUCTS = 100
#: rates of the calibrated cost model (pipeline.plan.calibrated.CalibratedCostModel,
#: ``cost_model="calibrated"``), used when the caller measured none:
#: ‖K - F Fᵀ‖₂ of the rank-500 RPCholesky factor on the calibration problem
#: (cg_cost's table: ρ/μ = 76 at μ = 1e-2), relative to a unit kernel diagonal
RHO_AT_DEFAULT_RANK = 0.76
#: the N of that measurement; ρ is scaled by N / RHO_REFERENCE_N
RHO_REFERENCE_N = 10_000
#: 2-core float64 GEMM probe (docs/PERFORMANCE.md: 154-159 GFLOP/s on Sapphire Rapids)
DEFAULT_GEMM_GFLOPS = 150.0
#: Zarr v3 float64 tiles, uncompressed (docs/PERFORMANCE.md: 0.74-0.98 write, 0.9-1.5 read)
DEFAULT_DISK_READ_GBPS = 1.0
DEFAULT_DISK_WRITE_GBPS = 0.8

# ---------------------------------------------------------------------------
# the one cost model of solver="auto" (pipeline.plan.calibrated, pipeline.plan.cg_cost,
# pipeline.plan.cholesky_cost, pipeline.linalg.spectrum). Measured on the 2-core
# Intel Xeon (Sapphire Rapids) project machine, 2026-11-23; the grid of
# workflows/benchmarks/bench_policy_grid.py (its JSON) and the 40k points of
# docs/PERFORMANCE.md ("The solver policy against measured times").

#: CG iterations / Chebyshev bound of κ = 1 + ρ/μ. cg_cost's table (diamonds, N = 10k-20k,
#: ρ by power iteration on the full Gram): 0.45-0.67; the grid with ρ from the plan-time
#: subsample estimate (pipeline.linalg.spectrum): see bench_policy_grid.json
CG_BOUND_FRACTION = 0.6
#: kernel entries per second of the fused engine, 2 cores, D = 14, each entry counted once
#: (docs/PERFORMANCE.md "Kernel times vector", bench_engine.py); cg_cost.entry_rate scales
#: them to other D
ENTRY_RATE_FLOAT64 = 0.53e9
ENTRY_RATE_FLOAT32 = 0.84e9
#: the per-entry cost is proportional to D + ENTRY_COST_D0 (the exp and the bookkeeping
#: cost as much as this many feature terms)
ENTRY_COST_D0 = 16.0
#: mixed precision (pipeline.linalg.cg_mixed_fit, tol 1e-6): inner float32 iterations per
#: float64 iteration. bench_policy_grid_variants.json (diamonds, synthetic D = 8 and 64,
#: N = 4,000-8,000): 1.07-1.24 while N/μ <= 8e5, 1.33-2.22 at N/μ = 4e6-8e6, where the
#: float32 products' error (1.5e-7 relative) limits each refinement step
MIXED_INNER_OVERHEAD = 1.15
MIXED_INNER_OVERHEAD_ILL = 1.7
MIXED_MAX_N_OVER_SHIFT = 2e6
#: tile Cholesky factorisation rate / 2-thread GEMM rate of the same run, as a function of
#: the tiles per side T = ceil(N / b): CHOLESKY_EFFICIENCY_MAX * T / (T + CHOLESKY_EFFICIENCY_T0)
#: (the diagonal POTRFs, the TRSMs and the I/O that nothing overlaps are a ~1/T share).
#: Least squares over 13 measurements on two machines (docs/PERFORMANCE.md). Intel Xeon
#: (GEMM 159): T=6 (15k, b 2,500) 0.68; T=10 (40k, b 4,096) 0.755 and 0.79; T=20 (80k,
#: b 4,000) 0.84. AMD EPYC (GEMM 104-125): T=6 0.785, 0.83, 0.90; T=10 0.82, 0.84, 0.85,
#: 0.87; T=20 0.88, 0.90.
#: It gives 0.79 / 0.83 / 0.87 at T = 6 / 10 / 20: within 5 % of every AMD point but one
#: (-12 %, T=6, session 9), and +3 % to +17 % above the Intel points (the largest at T=6),
#: against -17 % to +10 % for a constant 0.75. The constant 0.75 used until session 14
#: predicted the 80k factor 18-21 % too slow on AMD. (91.5 / 159 = 0.58 at 40k under load
#: average 2.5: the model is for a quiet machine.)
CHOLESKY_EFFICIENCY_MAX = 0.90
CHOLESKY_EFFICIENCY_T0 = 0.8
#: float32 factor (float64 POTRF on the diagonal) / float64 factor speed:
#: 161.5 / 86.8 GFLOP/s at N = 15,000 (bench_cholesky.py, Sapphire Rapids)
#: (AMD EPYC, session 14: 157.1 / 84.7 at 15k; 178.1 at 80k against 96.4-97.6 in float64)
FLOAT32_SPEEDUP = 1.86
#: resident memory of the interpreter with numpy/scipy/zarr/dask imported
BASE_RSS_BYTES = 300 << 20
#: the threads executor's read-ahead and write-behind budget, each (mirrors
#: pipeline.linalg.cholesky.IO_BUDGET_BYTES)
IO_BUDGET_BYTES = 256 << 20
#: fixed seconds of one out-of-core fit through the public estimator, beyond the work the
#: model counts: store and Zarr array creation, fingerprints, thread pools, the solve's
#: I/O set-up. The grid's N = 1,000 fits (bench_policy_grid.json, quiet, 2026-11-23):
#: the Cholesky 0.04-0.11 s in all; CG 0.33-0.37 s at 4-8 iterations (the Nyström
#: build, the checkpoint store and the plan's subsample estimate included)
CHOLESKY_FIXED_SECONDS = 0.05
CG_FIXED_SECONDS = 0.3
#: one matrix-free CG product costs CG_PRODUCT_ROW_BLOCK_SECONDS per row block of
#: DEFAULT_BLOCK_SIZE rows (its Dask tasks and fixed-order reduction) plus N² entries at
#: CG_PRODUCT_ENTRY_RATE per second at D = 14 (the symmetric fused product evaluates each
#: lower-triangle entry once and uses it twice). Fitted to whole CG solves, seconds per
#: product (solve - CG_FIXED_SECONDS) / (iterations + 1): 0.068 at N = 8,000 (the grid,
#: D = 8-9, 77-215 iterations), 0.95 at N = 40,000 (diamonds D = 9, bench_hard_auto.py:
#: 63 iterations in 60.6 s); it then predicts 0.022-0.027 at N = 4,000 (measured 0.022)
#: and 42.4 s at N = 294,611 (flights D = 10, bench_flights.py: 44.3 s median)
CG_PRODUCT_ROW_BLOCK_SECONDS = 0.0095
CG_PRODUCT_ENTRY_RATE = 1.76e9
#: float64 / float32 time of that whole product (the row-block costs shrink too): 1.19-1.56,
#: median 1.40, at N = 8,000 on the variants grid (bench_policy_grid_variants.json, fitted
#: from whole solves); 1.6 at 40k (1.05 s / 0.66 s, bench_hard_solves.py). Session 10 made
#: the float32 products 1.4x faster (pipeline.engine.fused); the grid measured again
#: (bench_policy_grid_variants_s10.json, AMD EPYC) gave per-product ratios 8 % higher at
#: N = 8,000 (median 1.40 against 1.29, the same formula on both grids): 1.4 -> 1.5
CG_PRODUCT_FLOAT32_SPEEDUP = 1.5
#: mixed precision (pipeline.linalg.cg_mixed_fit): digits of the float64 residual gained
#: per refinement step (its inner float32 solves stop at MIXED_INNER_TOL)
MIXED_DIGITS_PER_STEP = 3.0
MIXED_INNER_TOL = 1e-3
#: an inner float32 solve has reached its floor when its residual has not fallen by 10 % in
#: this many iterations. 3 stopped restarted solves at their first plateau (synthetic
#: N = 3,000, λ = 1e-3: a 4-iteration step that gained nothing, then a needless fallback
#: to float64); 20 let the same step gain 2.6 digits
MIXED_INNER_PATIENCE = 20
#: CG with the stored Gram (matvec="stored"): the set-up (the Gram stage, its Zarr tiles,
#: fsyncs and markers, and the preconditioner's columns read back) costs the lower tiles'
#: bytes at CG_STORED_SETUP_BYTES_PER_SECOND; each product a fixed cost per lower tile
#: (read, CRC-32C check, task) plus the bytes at CG_STORED_BYTES_PER_SECOND (page cache).
#: Least squares over the 24 stored solves of bench_policy_grid_stored.json (N = 1,000-
#: 8,000, measured iterations): within 0.56-1.33x at N >= 2,000. Not measured beyond:
#: the 80k Gram stage wrote 0.52 GB/s (bench_fit_80k.py), and a Gram larger than the page
#: cache is read at disk speed (DEFAULT_DISK_READ_GBPS), so large-N figures are rough
CG_STORED_SETUP_BYTES_PER_SECOND = 0.113e9
CG_STORED_TILE_SECONDS = 0.0048
CG_STORED_BYTES_PER_SECOND = 3.06e9
#: the tile Cholesky writes its factor tiles past the page cache (O_DIRECT; the process
#: keeps them in its tile cache for the solves). Through the page cache a new 50 MB file
#: cost 110 ms of CPU on this VM (fresh guest pages), directly 4-7 ms (session 9, AMD
#: EPYC; docs/PERFORMANCE.md)
DIRECT_FACTOR_WRITES = True
#: the Gram stage: N²/2 lower entries per second (float64, D = 14) and its Zarr write; the
#: 80k fit wrote 25.6 GB of lower tiles in 49.5 s (bench_fit_80k.py)
GRAM_ENTRY_RATE = 0.53e9
#: the Nyström build: its N x r kernel columns run at this fraction of the fused rate (they
#: are not fused), and its r x r eigendecomposition costs this many r³ flops at GEMM speed
#: (scipy eigh, 2 cores, idle: 36 ms at r = 500, 16 ms at r = 300; 7x slower under load)
NYSTROM_COLUMN_RATE_FRACTION = 1.0 / 3.0
NYSTROM_EIG_FLOPS_PER_R3 = 45.0
#: a preconditioner application (two N x r GEMVs) runs at this fraction of GEMM speed
GEMV_FRACTION_OF_GEMM = 0.1
#: the Cholesky's diagonal chain (one tile POTRF + TRSM per column) runs at this fraction
#: of one core's GEMM rate
POTRF_CHAIN_EFFICIENCY = 0.5
#: the factor-tile cache of the out-of-core Cholesky (bytes)
CHOLESKY_CACHE_BYTES = 1 << 30
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
#: eigendecomposition cost in units of n³ flops of potrf-speed work. Rough calibration on
#: the 2-core box: syevd(4000) ~ 20 x potrf(4000) quiet, while at N=2000 under load the
#: full-eigh LGO search ran 2x faster than one Cholesky per (λ, fold); 4 sits between.
EIG_FLOPS_PER_N3 = 4.0
#: band reduction of an m x m training Gram (LAPACK dsytrd_sy2sb, 4/3 m³ BLAS-3 flops) in
#: the same units: measured 3.3-5.1 s at m=6400 against 1.1 s for potrf(6400) on 2 cores
BAND_FLOPS_PER_M3 = 1.2
#: settings routed to CG in memory solve to this relative residual, with a Nyström
#: preconditioner of rank min(ROUTE_RANK, n // ROUTE_RANK_DIVISOR) (or ``rank``)
ROUTED_CG_TOL = 1e-10
ROUTE_RANK = 1000
ROUTE_RANK_DIVISOR = 8
#: a band reduction (LAPACK dsytrd_sy2sb) runs at about this fraction of the
#: single-thread GEMM rate (measured at m=6400: 0.6-0.75 on 2 cores)
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
#: residual checks), measured on diamonds (RBF, λ down to 1e-3, 5 folds): 25-45
CV_BLOCK_PASSES = 40
#: seconds per kernel entry and per column of one pass (a symmetric pass multiplies
#: each lower-tile entry twice: 4 flops per column at about 60 GFLOP/s on 2 cores)
CV_BLOCK_COLUMN_SECONDS = 6.7e-11
#: one fold's r x r eigendecomposition (LAPACK syevr, one BLAS thread per fold) in
#: units of r³ flops at CHOLESKY_GFLOPS: 1.95 s at r = 1,600 on one busy core
CV_EIGH_FLOPS_PER_R3 = 30.0

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
#: its build grows like n^(2/3). Measured on diamonds (RBF γ = 0.1, λ down to 1e-3):
#: N = 4,000, rank 500: 71 passes, 2.7 s build; rank 1,618: 10 passes, 12 s build
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
#: above this order a dense fold is factored with one BLAS thread (OpenBLAS potrf
#: crashes with 2 threads at n >= ~15,800; docs/PERFORMANCE.md)
ONE_BLAS_THREAD_FROM = 15_000
#: bytes of one L⁻¹ panel held in memory by the exact LOO/LGO residuals
LOO_PANEL_BYTES = 512 * 1024**2

# ---------------------------------------------------------------------------
# tile size of the Dask tile Cholesky by worker count (pipeline.engine.placement
# .dask_block_size; docs/SCALING.md, item 4 of issue #19)
#: the left-looking graph's critical path is ~1.5 n^2 b flops against n^3 / 3 of work,
#: so about n / (4.5 b) workers can be busy; the policy's tile is n / (6 P), a path of
#: 3/4 of one worker's share of the work. 6 is the scaling model's choice: over
#: N = 100k-1M, P = 8-128 and tiles 1024-4096 its tile is 0.5 % slower than the
#: model's best on average, 3.1 % at worst (4.5: 1.3 % / 7.7 %; 9: 0.8 % / 4.7 %;
#: docs/SCALING.md, item 4)
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
#: buffers): a fresh page cost about 2 ms of CPU per MB on the AMD EPYC VM (session 10),
#: and at N = 40,000 each re-read of an evicted 134 MB tile landed in fresh pages.
#: bench_fit_40k.py factor: 210.6 / 211.1 s without reuse, 205.4 s with 256 MiB (reads
#: ahead of the evictions still took fresh pages), 201.2 s with 640 MiB; peak RSS 2.27 GB
#: in all four (glibc told to keep all freed memory: 198.7 s)
TILE_BUFFER_POOL_BYTES = 640 << 20
#: a factor tile evicted from the tile cache while a task still reads it gives its buffer
#: to the pool once that task lets it go (checked at each later eviction), instead of
#: back to the system. At N = 80,000 (16 x 16 tiles, a cache of 5 tiles and a pool of 3),
#: 264 of the factor's 1,472 tile buffers were new memory before, about 53 GB to fault in
#: (perf: clear_page_erms 2.0 % of the fit's CPU samples); at block 4,000, 250 -> 27 of
#: 2,826. bench_fit_80k.py float64, block 4,000, one pair: fit 1,781.1 s, peak 2.44 GB,
#: against 1,807.1 s, 2.57 GB (within the VM's noise; session 20, docs/PERFORMANCE.md)
RECYCLE_HELD_EVICTIONS = True
#: new tile-read buffers of at least this many bytes are faulted in between two wide
#: (all-core) BLAS calls on every core (pipeline.linalg.blas.first_touch_between_calls),
#: not by a reader thread that preempts one of the call's threads while its partners
#: spin; 0 turns it off. Session 12, AMD EPYC VM: first touch 2.1-2.3 s per GB on one
#: thread, 1.2 s on two; the copy from the page cache afterwards 0.09 s per GB
FIRST_TOUCH_MIN_BYTES = 4 << 20
#: OPENBLAS_THREAD_TIMEOUT the package sets, unless the user did, before SciPy's OpenBLAS
#: loads (pipeline._blas_env): idle BLAS threads spin 2**4 cycles after a call, not 2**28
#: (about 0.1 s), so the tile threads' reads and copies between two all-core calls get the
#: cores; 0 leaves the variable alone. Session 12, AMD EPYC VM, N = 15,000, b = 2,500,
#: threads executor, 3 runs each: 10.34-10.50 s with 4, 10.69-11.19 s with 28
OPENBLAS_THREAD_TIMEOUT = 4
#: the tile Cholesky's Gram reads (each Gram tile is read once per factorisation) drop
#: the chunk file from the page cache once read (POSIX_FADV_DONTNEED,
#: pipeline.storage.rawchunks.read_chunk): the guest frees those pages at once, and the
#: next new read buffer lands in them instead of in free memory the VM's host must fault
#: in again. Session 12, AMD EPYC VM, 21 chunks of 50 MB read into kept buffers: 0.34-0.41
#: s of CPU with the drop against 0.85-1.07 s without. A later factorisation (a new
#: lambda) reads the Gram from disk instead of the page cache, ahead of its tasks
#: (TileIO). False keeps the Gram cached
DROP_READ_PAGE_CACHE = True
#: the Gram stage writes its tiles past the page cache (O_DIRECT, where the filesystem
#: allows it; pipeline.storage.rawchunks.write_chunk): a tile written through the page
#: cache fills fresh pages, which cost about 2 ms of CPU per MB on the VM (session 9:
#: 110 ms against 4-7 ms per 50 MB tile), while its reader, the factorisation, reads
#: each Gram tile once and drops it from the page cache anyway. Session 16, AMD EPYC VM,
#: N = 15,000, b = 2,500, D = 16, fresh processes, 4 alternating runs each: the Gram
#: stage 2.35-2.82 s (1.2-1.4 s user, 5.4-6.6 s system over the whole run) through the
#: page cache against 1.77-1.85 s past it, the float64 factor after it unchanged
#: (13.6-14.8 s against 13.4-14.5 s); Gram + factor 16.5-17.6 s against 15.4-16.3 s.
#: False writes through the page cache (a later reader then copies from memory)
GRAM_WRITES_PAST_PAGE_CACHE = True
#: the Dask executor's tasks in worker processes (a distributed client, the processes
#: scheduler) write their factor tiles through the page cache and map the other workers'
#: tiles from it (mmap, read-only: pipeline.linalg.cholesky_cache.mapped_factor_reads)
#: instead of writing past it (O_DIRECT) and reading each into new memory in every
#: worker; False: as the in-process executors (session 12 measurements: docs/PERFORMANCE.md)
HOST_SHARED_FACTOR_TILES = True
#: with HOST_SHARED_FACTOR_TILES: once a worker has written a factor tile through the
#: page cache, its tile cache maps the file's pages and the private copy's memory takes
#: the next Gram tile read (new memory costs ~2 s per GB of faults on the VMs measured)
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
#: come from disk and their latency would stall the task. Session 16, AMD EPYC VM,
#: N = 15,000, b = 2,500, on the embedded LocalCluster: a cold Gram 17.97 / 18.45 s
#: against 16.64 / 16.46 s with the whole Gram in the page cache (see PERFORMANCE.md)
PREFETCH_NEXT_GRAM_TILE = True
#: scheduler="auto" (factor_scheduler: auto) factors on the threads executor in this
#: process when a distributed client's workers all run on this machine (the embedded
#: LocalCluster of krr run, or a scheduler and workers started here), and on the workers
#: (one Dask task per tile) only when they run elsewhere. On one machine the threads
#: executor shares one tile cache and one read-ahead, and writes no tile through the
#: page cache. Session 16, AMD EPYC VM, N = 15,000, b = 2,500 (bench_cholesky.py, same
#: runs): threads 13.5-15.9 s, the Dask executor on the embedded LocalCluster 16.5-18.5 s;
#: session 13, N = 40,000: 236.5 s against 246-260 s. False: always the workers
FACTOR_THREADS_ON_THIS_HOST = True
#: a tile pass over at most this many kernel entries runs on Dask's threaded scheduler in
#: this process, not on a distributed client whose workers all run on this machine
#: (pipeline.engine.where). Session 21, AMD EPYC VM, 2 cores, a kernel product (RBF, D = 8):
#: in this process 3.7 / 5.0 / 8.5 / 22.0 ms at n = 331 / 1,000 / 2,000 / 4,000; on a
#: 2-worker LocalCluster 29.2 / 27.1 / 34.3 / 53.7 ms (114 ms at 8,000). A CV search on
#: diabetes (krr run, cv.solver: cg) made 137 such products at about 66 ms each
SMALL_PASS_ENTRIES = 8_000_000
#: the ingest stage runs in this process, not on a distributed client whose workers all
#: run on this machine, when its source arrays (X and y, read or in memory) hold at most
#: this many values (512 MB of float64). Session 22, AMD EPYC VM, 2 cores, the README's
#: main job (diamonds, 53,940 x 9 read, 10,000 rows kept): its 6 computations and the
#: streamed validation (36 round trips) made the stage 4.1-5.6 s on the embedded 2-worker
#: LocalCluster; in this process 0.7 s, with the same stored rows and fingerprints (then
#: 8 million). Session 23, bench_ingest_placement.py (.npy, D = 9 + 1, block 4,096, same
#: VM kind): in this process / on the workers 1.3 / 3.8 s at 0.5 million values, 1.9 /
#: 7.2 s at 2 million, 5.2 / 23.6 s at 8 million, 14.0 / 74.9 s at 24 million, 43.8 /
#: 266.8 s at 64 million, this process's peak 0.74 GB against 1.44 GB (+ 0.61 GB of
#: workers). Larger sources stay on the workers: not measured
SMALL_INGEST_VALUES = 64_000_000
#: bytes of row blocks that io.validate.iter_row_blocks computes together (validation and
#: fingerprints stream a source in batches of consecutive blocks, one batch held at a
#: time). Every computation costs time in proportion to the source's whole graph, so
#: batches of a fixed 2 blocks made the ingest quadratic in its blocks: 7.8 / 31 / 179 s
#: at 0.8 / 2.4 / 6.4 million rows x 10 (bench_ingest_placement.py, session 23)
ROW_BATCH_BYTES = 64 * 2**20
#: Dask settings of the embedded LocalCluster (pipeline.engine.parallel.dask_client; never of a
#: cluster given by address), each applied only where the user's Dask config still has
#: Dask's default: no statistical profiler in the workers (it samples every thread's
#: stack every 10 ms); the event loops' tick every 1 s instead of 20 ms, the system
#: monitor every 2 s instead of 0.5 s, and the workers' and nannies' memory checks every
#: 1 s instead of 0.1 s (a worker past its memory limit is paused or restarted up to
#: 1 s later). On 2 cores each wake-up preempts one thread of an all-core BLAS call
#: while its partner spins. Session 18, AMD EPYC VM, N = 15,000, b = 2,500
#: (bench_cholesky.py, ours-clientauto: krr run's default, the threads executor in this
#: process beside the cluster; three alternating rounds of 2 repeats, best of each):
#: Dask's defaults 13.86 / 14.35 / 15.64 s (1.06 / 1.07 / 1.10x the threads executor
#: without a cluster, same round); without the profiler and with slow ticks 13.55 /
#: 13.52 / 14.57 s (1.05 / 1.03 / 1.08x); with the memory checks too 13.23 / 13.68 /
#: 13.50 s (1.00 / 1.02 / 0.96x). The Dask executor on the workers (ours-client), two
#: rounds: 16.17 / 15.58 s -> 14.60 / 15.02 s without the profiler and with slow ticks
EMBEDDED_CLUSTER_DASK_CONFIG = {
    "distributed.worker.profile.enabled": False,
    "distributed.admin.tick.interval": "1s",
    "distributed.admin.system-monitor.interval": "2s",
    "distributed.worker.memory.monitor-interval": "1s",
}

#: keep_gram=False with X in memory (KernelRidge, fit.execute): the Gram is not stored
#: first. build_gram(defer=True) only creates its array, and the in-place factor computes
#: each Gram tile from X (GramTileRecomputer, in its read-ahead threads) when it needs it,
#: then stores its factor tile there: no Gram stage, and no Gram bytes written or read.
#: Session 17, AMD EPYC VM, N = 15,000, b = 2,500, D = 16 (bench_fit_40k, fresh
#: processes, complete fits): float32 in place 9.5-10.4 s on demand against 10.6-11.5 s
#: with the Gram stored first; float64 in place 14.3-15.1 s against 16.0-16.7 s for the
#: default float64 fit. N = 80,000 float32: 992.6 s against 1,014.9-1,062.1 s (session
#: 14), the Gram stage's 27-29 s gone. False: the Gram stage runs first, as before
GRAM_ON_DEMAND_IN_PLACE = True
#: evaluation dtype of an on-demand Gram tile (the tile engine's fused evaluators, then
#: cast to the Gram's dtype): 15-18 ms per 2,500 x 2,500 tile on one core, against
#: 32 ms for the kernel object's own evaluation, which left the float32 factor waiting
#: (8.3-8.9 s against 7.6-8.0 s, same runs)
GRAM_ON_DEMAND_KERNEL_DTYPE = "float64"

# -- factor_dtype="auto": a float32 tile Cholesky refined to float64, when it pays ------
#: rows below which "auto" keeps the float64 factor (the float32 one saved 1.4-1.6x of
#: the fit from 10,000 rows up: bench_fit_40k at 15k and 40k, KernelRidge at 10k)
FACTOR_FLOAT32_MIN_ROWS = 10_000
#: rows of the seeded subsample whose kernel eigenvalues judge float32's risk: 1,000
#: cost 0.05 s a fit, 2,000 0.33 s (eigvalsh), and gave the same risks on diamonds
#: (Gaussian rows: lower ones, all far below the threshold)
FACTOR_FLOAT32_SAMPLE_ROWS = 1000
#: the largest risk eps32 * lmax(K) / (lmin(K_sub) + shift), eps32 = 1.19e-7, that "auto"
#: factors in float32. KernelRidge(keep_gram=False), float32 against float64, session 15
#: (AMD EPYC; bench_factor_auto.py): diamonds N = 10,000: risk 0.035 / 0.35: 3 / 5
#: refinement iterations, 1.58x / 1.47x faster; risk 3.5: 18 iterations, no faster;
#: risk 35 and 350: the float32 factor lost positive definiteness. Diamonds N = 15,000:
#: risk 0.51: 7 iterations, 1.27x; risk 1.71: 11 iterations, 1.32x. Gaussian rows
#: (D = 12) N = 10,000: risk 0.02-0.22 (2,000-row subsample), 3-8 iterations,
#: 1.12-1.57x, down to lambda = 1e-6. A wrong float32 choice costs time, not the answer
#: (execute redoes a failed one in float64)
FACTOR_FLOAT32_MAX_RISK = 1.0
