"""Item 4 of issue #19: the Dask tile Cholesky's tile size by worker count, and the
dependency lists it submits (the transitive reduction: 2 edges per task, not 2 j + 1).

The scaling model (docs/SCALING.md) shows the left-looking graph's critical path
(~1.5 n^2 b flops) limiting first; tiles sized by worker count shorten it. Smaller
tiles mean ~T^3 / 3 dependency edges with the full lists, hence the reduction.
"""

import itertools

import numpy as np
import pytest

from pipeline.engine.placement import dask_block_size
from pipeline.kernels import RBF
from pipeline.linalg.cholesky import tile_cholesky
from pipeline.linalg.cholesky_exec import _deps, submitted_deps
from pipeline.linalg.gram import build_gram


def test_block_size_policy_values():
    # one worker (or none): the plan's default tile, at most n
    assert dask_block_size(1_000_000, 1) == 2048
    assert dask_block_size(1500, 0) == 1500
    # the documented values (n / (6 P), step 256, within [1024, 4096])
    assert dask_block_size(1_000_000, 8) == 4096
    assert dask_block_size(1_000_000, 128) == 1280
    assert dask_block_size(1_000_000, 64) == 2560
    assert dask_block_size(100_000, 8) == 2048
    assert dask_block_size(100_000, 32) == 1024
    assert dask_block_size(1_000_000, 64, path_factor=4.5) == 3328
    for n in (5_000, 100_000, 200_000, 500_000, 1_000_000):
        sizes = [dask_block_size(n, p) for p in (2, 3, 8, 16, 32, 64, 128)]
        assert sizes == sorted(sizes, reverse=True), (n, sizes)  # more workers: smaller
        assert all(b == n or (1024 <= b <= 4096 and b % 256 == 0) for b in sizes), sizes
    assert dask_block_size(5_000, 64, min_block=128, step=128) == 128
    assert dask_block_size(900, 64) == 900


@pytest.mark.parametrize(
    "kw",
    [{"n": 0, "workers": 2}, {"n": 10, "workers": -1}, {"n": 10, "workers": 2, "min_block": 0},
     {"n": 10, "workers": 2, "min_block": 64, "max_block": 32},
     {"n": 10, "workers": 2, "path_factor": 0.0}],
)  # fmt: skip
def test_block_size_policy_rejects_bad_input(kw):
    with pytest.raises(ValueError, match="dask_block_size"):
        dask_block_size(**kw)


def _ancestors(todo, deps):
    anc = {}
    for t in todo:  # left-looking order is topological
        a = set()
        for d in deps[t]:
            a |= {d} | anc[d]
        anc[t] = a
    return anc


@pytest.mark.parametrize("holes", [0, 1, 2, 3])
def test_submitted_deps_order_every_input_before_its_user(holes):
    """Every full dependency still to compute is an ancestor of its user in the
    submitted graph, also when a resumed run already holds some tiles (holes)."""
    nb = 7
    order = [(i, j) for j in range(nb) for i in range(j, nb)]
    rng = np.random.default_rng(holes)
    done = {order[k] for k in rng.choice(len(order), size=4 * holes, replace=False)}
    todo = [t for t in order if t not in done]
    todo_set = set(todo)
    deps = {t: submitted_deps(*t, todo_set) for t in todo}
    anc = _ancestors(todo, deps)
    for t in todo:
        assert set(deps[t]) <= todo_set
        need = {d for d in _deps(*t) if d in todo_set}
        assert need <= anc[t], (t, need - anc[t])
    if not holes:  # the whole graph: at most 2 edges per task, T^2 - T in all
        assert all(len(d) <= 2 for d in deps.values())
        assert sum(len(d) for d in deps.values()) == nb * nb - nb
        full = sum(len([d for d in _deps(*t) if d in todo_set]) for t in todo)
        assert full > 2 * sum(len(d) for d in deps.values())


def test_policy_tiles_dask_factor_matches_dense_and_threads(tmp_path, monkeypatch):
    """A real factorisation on 2 Dask workers with the policy's tile (scaled-down
    constants so a small problem has several tiles) matches the dense Cholesky and,
    bit for bit, the threads executor."""
    pytest.importorskip("distributed")
    from distributed import Client, LocalCluster

    monkeypatch.setenv("KRR_CHOL_BLAS_THREADS", "1")
    n = 600
    b = dask_block_size(n, 2, min_block=128, step=64)
    assert b == 128 and -(-n // b) == 5
    X = np.random.default_rng(1).normal(size=(n, 5))
    g = build_gram(X, RBF(gamma=0.2), str(tmp_path / "g"), b, progress=False)
    ref = tile_cholesky(g, 1e-2, store=str(tmp_path / "a"), scheduler="threads", progress=False)
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0",
                     memory_limit=0) as cluster,
        Client(cluster),
    ):  # fmt: skip
        got = tile_cholesky(g, 1e-2, store=str(tmp_path / "b"), scheduler="dask", progress=False)
    K = RBF(gamma=0.2)(X, X) + 1e-2 * np.eye(n)
    dense = np.linalg.cholesky(K)
    for i, j in itertools.product(range(5), range(5)):
        if j > i:
            continue
        t = got.L.read_tile(i, j)
        np.testing.assert_array_equal(t, ref.L.read_tile(i, j))
        blk = dense[i * b : (i + 1) * b, j * b : (j + 1) * b]
        np.testing.assert_allclose(np.tril(t) if i == j else t, blk, rtol=0, atol=1e-10)


@pytest.mark.parametrize(
    "here, keep_gram",
    [(False, True), (True, True), (False, False)],
    ids=["workers-elsewhere", "workers-here", "workers-elsewhere-in-place"],
)
def test_estimator_without_block_size_uses_policy_on_a_client(
    tmp_path, monkeypatch, here, keep_gram
):
    """KernelRidge(solver="cholesky") with no block_size on a 2-worker client builds
    its Gram with the policy's tile for 2 workers when they run on other machines (the
    factor's tiles run on them), and with the default tile when they run on this one
    (the factor runs on the threads executor here: FACTOR_THREADS_ON_THIS_HOST), or
    when the factor is in place and computes its Gram from X here (keep_gram=False,
    whatever the cluster); it predicts as scikit-learn does either way."""
    pytest.importorskip("distributed")
    from distributed import Client, LocalCluster
    from sklearn.kernel_ridge import KernelRidge as SkKRR

    import pipeline
    import pipeline.engine.where as where
    import pipeline.fit as fit_mod

    if not here:  # as a cluster on other machines looks
        monkeypatch.setattr(where, "workers_on_this_host", lambda client: False)

    seen = []
    real_build = fit_mod.build_gram  # where the estimator's fit names it

    def spy(X, kernel, root, block_size, *a, **kw):
        seen.append(int(block_size))
        return real_build(X, kernel, root, block_size, *a, **kw)

    monkeypatch.setattr(fit_mod, "build_gram", spy)
    rng = np.random.default_rng(2)
    X = rng.normal(size=(1500, 4))
    y = np.sin(X[:, 0]) + 0.1 * rng.normal(size=1500)
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0",
                     memory_limit=0) as cluster,
        Client(cluster),
    ):  # fmt: skip
        est = pipeline.KernelRidge(alpha=1e-2, kernel="rbf", gamma=0.3, solver="cholesky",
                                   keep_gram=keep_gram, store=str(tmp_path / "s")).fit(X, y)  # fmt: skip
        pred = est.predict(X[:50])
    assert dask_block_size(1500, 2) == 1024
    assert seen == ([1500] if here or not keep_gram else [1024])
    want = SkKRR(alpha=1e-2, kernel="rbf", gamma=0.3).fit(X, y).predict(X[:50])
    np.testing.assert_allclose(pred, want, rtol=1e-7, atol=1e-8)


def test_dask_executor_submits_two_edges_per_task(tmp_path, monkeypatch):
    """The graph the Dask executor hands to compute() has the reduced lists."""
    from dask.core import get_dependencies

    import pipeline.engine.parallel as par

    seen = {}
    real_compute = par.compute

    def spy(nodes, **kw):
        seen["nodes"] = list(nodes)
        return real_compute(nodes, **kw)

    monkeypatch.setattr(par, "compute", spy)
    X = np.random.default_rng(3).normal(size=(200, 3))
    g = build_gram(X, RBF(gamma=0.2), str(tmp_path / "g"), 40, progress=False)
    tile_cholesky(g, 1e-2, store=str(tmp_path / "f"), scheduler="dask", progress=False)
    nodes = seen["nodes"]
    dsk = {}
    for d in nodes:
        dsk.update(dict(d.__dask_graph__()))
    tiles = [k for k in dsk if "chol-tile" in str(k)]
    assert len(tiles) == 15  # 5 row blocks
    n_edges = [len([d for d in get_dependencies(dsk, k) if "chol-tile" in str(d)]) for k in tiles]
    assert max(n_edges) <= 2 and sum(n_edges) == 5 * 5 - 5, n_edges
