"""The plan-time estimate of the preconditioner's residual (pipeline.linalg.spectrum)."""

from __future__ import annotations

import numpy as np

from pipeline import constants as C
from pipeline.kernels import RBF
from pipeline.linalg.dense_operator import DenseKernelOperator
from pipeline.linalg.precond import build_nystrom
from pipeline.linalg.spectrum import estimate_residual


def _data(n, d=4, seed=0):
    return np.random.default_rng(seed).normal(size=(n, d))


def test_edge_cases_and_sample_size():
    X = _data(300)
    assert estimate_residual(X, RBF(gamma=0.5), 300) == 0.0  # the factor covers every row
    assert estimate_residual(_data(700), RBF(gamma=0.5), 500) is None  # too few rows
    assert C.spectrum_sample_rows(10**6, 500) == C.SPECTRUM_SAMPLE_ROWS
    assert C.spectrum_sample_rows(10**6, 5000) == C.SPECTRUM_MAX_ROWS
    assert C.spectrum_sample_rows(1500, 100) == 1500


def test_matches_the_exact_residual_when_the_sample_is_every_row():
    X, k = _data(1200), RBF(gamma=0.5)
    rho = estimate_residual(X, k, 150)
    K = k(X)
    op = DenseKernelOperator(K)
    F = build_nystrom(op, centres="rpcholesky", rank=150, random_state=C.DEFAULT_RANDOM_STATE).F
    exact = float(np.linalg.eigvalsh(K - F @ F.T)[-1])
    assert 0.9 * exact <= rho <= 1.0001 * exact
    assert estimate_residual(X, k, 150) == rho  # deterministic: the same rows, the same ρ


def test_scales_with_n_from_a_subsample():
    k = RBF(gamma=0.5)
    small, big = estimate_residual(_data(2000), k, 100), estimate_residual(_data(8000), k, 100)
    # the residual of a fixed rank grows about linearly with N (a subsample of 2,000 rows
    # stands for 8,000)
    assert 2.0 <= big / small <= 8.0
