"""The tile engine: fused, cache-blocked kernel evaluation (numpy and BLAS only).

- :func:`kernel_matvec`: ``out += K(Xi, Xj) @ V`` (and ``K(Xi, Xj)ᵀ @ Vi`` for
  a symmetric pair of tiles), never forming the tile;
- :func:`predict_accumulate`: the same for prediction (rectangular);
- :func:`kernel_tile`: write a tile (Gram build);
- :func:`task_threads`: inner threads for a fused call inside a Dask task;
- :mod:`pipeline.engine.where`: every where-does-it-run decision (this process or
  the client, which worker, how many threads and BLAS threads, small steps here);
- :mod:`pipeline.engine.dense`: the in-memory kernel matrix (fit) and prediction
  of the estimators on the same evaluators (the kernel object only for kernels
  they do not know), refusing a kernel that overflows;
- :mod:`pipeline.engine.backend`: the backend seam (NumPy, CuPy, array-api-strict);
  :mod:`pipeline.engine.device`: kernel tiles, matvec, prediction and the pieces
  of K for preconditioners on a backend (the GPU path; device-generic code);
- :mod:`pipeline.engine.passes`: the tile engine every kernel pass is specified
  on (tile set x source x consumer, fixed-order reduction, resume);
- :mod:`pipeline.engine.dag`: its in-process executor for passes whose tiles depend
  on one another (the tile Cholesky), critical path first;
- :mod:`pipeline.engine.tile_io`: read-ahead and ordered write-behind of tiles
  (the Cholesky and the forward/back sweeps).

See :mod:`pipeline.engine.fused` for the design and precision.
"""

from pipeline.engine.evaluators import is_fused
from pipeline.engine.fused import kernel_matvec, kernel_tile, predict_accumulate
from pipeline.engine.where import available_cores, task_threads

__all__ = [
    "available_cores",
    "is_fused",
    "kernel_matvec",
    "kernel_tile",
    "predict_accumulate",
    "task_threads",
]
