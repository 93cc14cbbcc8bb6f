"""The CG cost model's pieces (:mod:`pipeline.plan.cg_cost`) that no other plan test covers."""

from __future__ import annotations

import pytest

from pipeline.plan.cg_cost import nystrom_method


@pytest.mark.parametrize(
    ("n", "m", "cached", "expected"),
    [
        (36_000, 1_000, True, "direct"),  # kin40k: measured 5 s direct vs 9 s PCG
        (36_000, 4_000, False, "direct"),  # measured 47 s vs 141 s
        (3_000_000, 4_000, False, "direct"),  # one pass instead of ~60 kernel passes
        (36_000, 30_000, False, "pcg"),  # N·M² of SYRK past 60 passes of N·M
    ],
)
def test_nystrom_method_picks_the_cheaper_estimate(n, m, cached, expected):
    method, why = nystrom_method(n, m, 8, cached=cached)
    assert method == expected
    assert f"M={m}" in why and "PCG iterations" in why


def test_nystrom_method_follows_the_iteration_count_and_gemm_rate():
    # few iterations make the passes cheap; a slow GEMM makes the one pass dear
    assert nystrom_method(36_000, 4_000, 8, cached=False, iterations=2)[0] == "pcg"
    assert nystrom_method(36_000, 4_000, 8, cached=False, gemm_gflops=1.0)[0] == "pcg"
