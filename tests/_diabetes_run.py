"""The small `krr run` configuration that the CV-at-scale fault tests share: diabetes,
standardised target, an out-of-core Cholesky fit, and a 3 x 4 grid searched by CG. The
embedded cluster is one in-process worker (the search runs in the krr process either way):
two worker processes cost each run about 3 s and 6 s of CPU to start and stop."""

RUN = {
    "data": {"source": "sklearn", "name": "diabetes"},
    "split": {"test_fraction": 0.25},
    "preprocess": {"standardize_y": True},
    "kernel": {"name": "rbf", "params": {"gamma": 0.5}},
    "lambda": 0.5,
    "solver": {"method": "cholesky"},
    "block_size": 128,
    "evaluate": {"baseline": "none"},
    "cluster": {"n_workers": 1, "processes": False, "memory_limit": "2GiB", "dashboard": False},
}
CV = {
    "alphas": [0.01, 0.1, 1.0],
    "param_grid": {"gamma": [0.01, 0.03, 0.1, 0.3]},
    "folds": 3,
    "shuffle": True,
    "solver": "cg",
}
