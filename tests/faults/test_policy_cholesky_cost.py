"""The out-of-core Cholesky's cost model (pipeline.policy.cholesky_cost): pure functions."""

from __future__ import annotations

import pytest

from pipeline.policy import cholesky_cost as cc
from pipeline.solvers.cholesky_inplace import factor_disk_bytes

RATES = dict(gemm_gflops=159.0, disk_read_gbps=1.0, disk_write_gbps=0.8)


def test_disk_formula_matches_the_solver_check():
    for n, b in [(15_000, 2500), (80_000, 4000), (1000, 300)]:
        assert cc.cholesky_disk_bytes(n, b) == factor_disk_bytes(n, b)
        assert cc.cholesky_disk_bytes(n, b, itemsize=4) == factor_disk_bytes(n, b, "float32")
        assert cc.cholesky_disk_bytes(n, b, keep_gram=False, writers=2) == factor_disk_bytes(
            n, b, keep_gram=False, writers=2
        )
    assert cc.lower_tile_bytes(80_000, 4000) == 210 * 4000**2 * 8  # 26.9 GB: T = 20
    assert cc.cholesky_disk_bytes(80_000, 4000, keep_gram=False) < 0.5e9


def test_prediction_at_the_measured_point_and_scaling():
    c = cc.predict_cholesky(15_000, 2500, **RATES)
    # measured 10.40 s on a quiet machine (108.2 GFLOP/s, bench_cholesky.py, session 5;
    # 12.96 s before the tile engine); the model is within 25 %
    assert 7.8 < c.seconds < 13.0
    assert c.gflop == pytest.approx(1125.0)
    assert c.compute_seconds > c.io_seconds  # at this size the factorisation is compute bound
    big = cc.predict_cholesky(40_000, 4096, **RATES)
    assert big.seconds / c.seconds == pytest.approx((40_000 / 15_000) ** 3, rel=0.2)
    f32 = cc.predict_cholesky(15_000, 2500, dtype="float32", **RATES)
    assert f32.seconds < c.seconds / 1.5 and f32.disk_bytes == c.disk_bytes // 2
    assert big.peak_memory_bytes <= 3e9  # the 3 GB target at N=40k, block 4096


def test_slow_disk_makes_it_io_bound():
    c = cc.predict_cholesky(
        40_000, 4096, gemm_gflops=159.0, disk_read_gbps=0.01, disk_write_gbps=0.01
    )
    assert c.io_seconds > c.compute_seconds and c.seconds >= c.io_seconds


def test_block_size_choice_and_bad_input():
    assert cc.best_block_size(40_000, memory_bytes=3 << 30) == 4096
    assert cc.best_block_size(40_000, memory_bytes=1 << 30) < 4096
    with pytest.raises(ValueError, match="gemm_gflops=0"):
        cc.predict_cholesky(1000, 100, gemm_gflops=0, disk_read_gbps=1, disk_write_gbps=1)
    with pytest.raises(ValueError, match="dtype"):
        cc.predict_cholesky(1000, 100, dtype="float16", **RATES)
    with pytest.raises(ValueError, match="block_size=0"):
        cc.n_tiles(1000, 0)
