"""The one preconditioner of a stored Cholesky factor
(:class:`pipeline.linalg.triangular.FactorPreconditioner`): ``(L Lᵀ)⁻¹`` in the
factor's own precision. Issue #43 merged the float64 one and its float32 subclass
(``NativeFactorPreconditioner``, kept as an alias)."""

from __future__ import annotations

import numpy as np
import pytest
from test_cholesky import rbf_matrix, rel, write_gram

from pipeline.linalg.cholesky import tile_cholesky
from pipeline.linalg.triangular import (
    FactorPreconditioner,
    NativeFactorPreconditioner,
    back_substitution,
    forward_substitution,
)


def test_the_old_name_is_the_one_class():
    assert NativeFactorPreconditioner is FactorPreconditioner


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_factor_preconditioner_solves_in_the_factors_precision(tmp_path, dtype):
    n, lam = 150, 1e-2
    K = rbf_matrix(n, seed=4)
    f = tile_cholesky(write_gram(tmp_path, K, 64), lam, dtype=dtype, progress=False)
    y = np.random.default_rng(1).standard_normal((n, 2))
    want = np.linalg.solve(K + lam * np.eye(n), y)
    got = FactorPreconditioner(f).apply(y)
    assert got.dtype == np.float64 and got.shape == y.shape
    one = FactorPreconditioner(f).apply(y[:, 0])
    assert one.shape == (n,)
    assert rel(one, got[:, 0]) < (1e-12 if dtype == np.float64 else 1e-5)
    if dtype == np.float64:  # the float64 sweeps, bit for bit
        L = f.L
        np.testing.assert_array_equal(got, back_substitution(L, forward_substitution(L, y)))
        assert rel(got, want) < 1e-10
    else:  # float32 sweeps: single precision, not the float64 answer
        assert 1e-12 < rel(got, want) < 1e-3
