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


def test_the_adaptive_factor_is_predicted_from_rho_at_one_rank():
    from pipeline.plan.cg_cost import adaptive_rank_and_residual

    mu = 1e-2
    # already resolved at rank 500: it stops there, at the target
    assert adaptive_rank_and_residual(0.01, 500, mu, 4000) == (500, 5 * mu)
    # rho falls like 1/r: 0.5 at rank 500 reaches 5 mu = 0.05 at rank 5,000
    assert adaptive_rank_and_residual(0.5, 500, mu, 8000) == (5000, 5 * mu)
    # the cap binds: what is left there, rho_r * r / cap
    rank, rho = adaptive_rank_and_residual(0.5, 500, mu, 2500)
    assert rank == 2500 and rho == pytest.approx(0.1) and rho > 5 * mu
    # the factor is the target multiple of the shift
    assert adaptive_rank_and_residual(0.5, 500, mu, 8000, factor=10.0) == (2500, 10 * mu)


def test_nystrom_method_counts_the_blocks_as_kept_while_they_fit_the_solvers_cache():
    # the default of ``cached`` is the solver's own rule: N x M float64 blocks within
    # NYSTROM_CACHE_BYTES are kept between PCG products (no kernel pass per iteration)
    import pipeline.constants as C

    fits = C.NYSTROM_CACHE_BYTES // (8 * 1_000)  # rows whose N x 1,000 blocks just fit
    for n in (fits, fits + 1):
        kept = n * 1_000 * 8 <= C.NYSTROM_CACHE_BYTES
        assert nystrom_method(n, 1_000, 8) == nystrom_method(n, 1_000, 8, cached=kept)
    assert "(blocks kept)" in nystrom_method(fits, 1_000, 8, iterations=2)[1]
    assert "(blocks kept)" not in nystrom_method(fits + 1, 1_000, 8, iterations=2)[1]
