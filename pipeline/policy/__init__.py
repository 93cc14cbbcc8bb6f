"""The one policy package: every calibrated constant and cost model lives here.

Solvers, stages and estimators never hard-code a threshold, a default rank or a
machine rate; they ask this package. Modules:

- ``constants``: the defaults and calibrated constants, each with where it was measured.
- ``plan``: ``FitPlan`` and ``plan_fit`` (one fit plan and its reason).
- ``placement``: the measured ``Resources``, where a fit's tiles run, and the tile
  size that follows.
- ``cholesky_cost``: predicted time, memory and disk of the out-of-core Cholesky.
- ``cg_cost``: predicted iterations and time of preconditioned CG.
- ``cg_variant``: CG's product, stored or recomputed, float64 or mixed precision, by
  predicted seconds.
- ``calibrated``: the cost models of ``plan_fit`` (the default ``"calibrated"``, and
  ``"simple"``) and how it calls a plugged-in one.
- ``spectrum``: the preconditioner's residual measured on a subsample of the rows at plan time.
- ``cv_routing``: ``KernelRidgeCV``'s routing and cost models.

Everything here is a pure function of sizes, user choices and measured machine
rates, apart from ``spectrum``, which reads a few thousand sampled rows of X (a Dask
array is only indexed and read) and forms their kernel matrix.
"""
