"""The linear algebra on tiles: the Gram, the Cholesky driver, triangular solves,
the one PCG loop, the one Nyström builder, band and dense solvers, prediction.

Import from the defining modules (``pipeline.linalg.cg``, ``pipeline.linalg.gram``,
...); this package re-exports nothing.

gram: Out-of-core Gram matrices in tiled Zarr, checkpointed per tile.
solvers: Solvers for (K + shift*I) alpha = y over the stored Gram.
predict: Blockwise prediction ŷ = K(X_new, X_train) α without forming the M x N kernel.
reference: Exact in-memory reference solvers: the ground truth every later solver is tested against.
"""
