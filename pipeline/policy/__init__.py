"""The one policy package: every calibrated constant and cost model lives here.

Solvers, stages and estimators never hard-code a threshold, a default rank or a
machine rate; they ask this package. Modules:

- ``constants``: the defaults and calibrated constants, each with where it was measured.
- ``plan``: ``FitPlan`` and ``plan_fit`` (one fit plan and its reason).
- ``cholesky_cost``: predicted time, memory and disk of the out-of-core Cholesky.
- ``cg_cost``: predicted iterations and time of preconditioned CG.
- ``calibrated``: the calibrated cost model of ``plan_fit`` (``cost_model="calibrated"``).
- ``cv_routing``: ``KernelRidgeCV``'s routing and cost models.

Everything here is a pure function of sizes, user choices and measured machine
rates: no I/O, no Dask.
"""
