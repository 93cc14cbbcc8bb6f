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
- ``cv_routing``: ``KernelRidgeCV``'s routing and cost models.

Everything here is a pure function of sizes, user choices and measured machine
rates; nothing here imports a solver. What the plan measures on the training rows (the
preconditioner's residual, the float32 factor's risk: :mod:`pipeline.linalg.spectrum`)
comes in as data, ``placement.Probes``, built by :func:`pipeline.fit.row_probes`.
"""
