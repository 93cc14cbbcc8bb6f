"""KernelRidgeCV as a front over strategies (issue #16, item 5): typed search
statistics, and its routing and cost model as pure functions in pipeline.plan."""

from __future__ import annotations

import numpy as np

from pipeline import KernelRidgeCV
from pipeline import constants as C
from pipeline.models.selection.stats import SearchStats
from pipeline.plan.cv_routing import choose_cv_solver, eigen_mode, memory_need


def _splits(n: int, k: int = 5):
    idx = np.arange(n)
    return [(np.setdiff1d(idx, te), te) for te in np.array_split(idx, k)]


def test_cv_routing_is_a_pure_policy_function():
    sp = _splits(1000)
    kw = dict(fits=lambda b: True, band_ok=True, has_store=False)
    assert choose_cv_solver(1000, "complement", 5, sp, **kw) in ("band", "eigen", "dense")
    # past the in-memory limit, or when nothing fits: out of core
    big = C.IN_MEMORY_MAX_N + 1
    assert choose_cv_solver(big, "complement", 5, _splits(big), **kw) == "cg"
    assert choose_cv_solver(1000, "complement", 5, sp, **{**kw, "fits": lambda b: False}) == "cg"
    assert (
        choose_cv_solver(
            1000, "complement", 5, sp, **{**kw, "fits": lambda b: False, "has_store": True}
        )
        == "cholesky"
    )
    assert eigen_mode(1000, "loo", 5, sp) == "loo"
    assert memory_need("band", 100, band_workers=3) == 5 * 100 * 100 * 8


def test_search_statistics_are_typed_and_match_the_dict():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(120, 3))
    y = np.sin(X[:, 0])
    m = KernelRidgeCV(alphas=[0.1, 1.0], kernel="rbf", cv=3, solver="eigen").fit(X, y)
    st = m.search_statistics_
    assert isinstance(st, SearchStats)
    for key, value in m.search_stats_.items():
        assert st[key] == value
    assert st.eigendecompositions == m.search_stats_["eigendecompositions"] >= 1
