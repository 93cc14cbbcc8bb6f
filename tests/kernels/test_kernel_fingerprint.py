"""A kernel's fingerprint covers its classes, not only its registered name (issue #13, item 7).

A subclass of RBF with another formula has RBF's spec; it must never reuse a
Gram, a CG checkpoint or a saved model computed with RBF.
"""

from __future__ import annotations

import numpy as np
import pytest

from pipeline import KernelRidge
from pipeline.kernels import RBF, Linear, kernel_from_spec
from pipeline.linalg.gram import gram_fingerprint
from pipeline.storage import StoreMismatchError


class SquaredRBF(RBF):
    """Same name and parameters as RBF, another formula: exp(-2 g d^2) + 0.1."""

    def _eval(self, X, Y, symmetric):
        return super()._eval(X, Y, symmetric) ** 2 + 0.1


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(5)
    X = rng.normal(size=(150, 3))
    return X, np.sin(X[:, 0]) + 0.1 * X[:, 1]


def test_fingerprint_names_each_node_class():
    from pipeline.kernels import kernel_fingerprint

    assert SquaredRBF(0.5).to_spec() == RBF(0.5).to_spec()  # the saved format is unchanged
    assert kernel_fingerprint(SquaredRBF(0.5)) != kernel_fingerprint(RBF(0.5))
    assert kernel_fingerprint(RBF(0.5)) == kernel_fingerprint(kernel_from_spec(RBF(0.5).to_spec()))
    # nested: the subclass inside a composition changes the composition's fingerprint
    assert kernel_fingerprint(SquaredRBF(0.5) + Linear()) != kernel_fingerprint(RBF(0.5) + Linear())
    assert gram_fingerprint("x", SquaredRBF(0.5), 64, "float64") != gram_fingerprint(
        "x", RBF(0.5), 64, "float64"
    )


def test_subclass_does_not_reuse_the_rbf_gram(data, tmp_path):
    from pipeline.linalg.gram import build_gram

    X, y = data
    kw = dict(alpha=0.1, solver="cholesky", block_size=64, store=tmp_path / "s")
    rbf = KernelRidge(kernel=RBF(gamma=0.5), **kw).fit(X, y)
    # the estimator gives each kernel identity its own subdirectory of the store ...
    sub = KernelRidge(kernel=SquaredRBF(gamma=0.5), **kw).fit(X, y)
    assert sub.fit_info_["store"] != rbf.fit_info_["store"]
    ref = KernelRidge(alpha=0.1, kernel=SquaredRBF(gamma=0.5), solver="dense").fit(X, y)
    np.testing.assert_allclose(sub.dual_coef_, ref.dual_coef_, rtol=1e-10, atol=1e-12)
    # ... and the stored RBF Gram is still never reused for the subclass
    with pytest.raises(StoreMismatchError, match="already holds 'gram'"):
        build_gram(X, SquaredRBF(gamma=0.5), rbf.fit_info_["store"], 64, progress=False)


def test_subclass_cg_checkpoint_is_its_own(data, tmp_path):
    X, y = data
    kw = dict(
        alpha=0.1, solver="cg", matvec="recompute", preconditioner="jacobi", tol=1e-11,
        block_size=64, store=tmp_path / "s",
    )  # fmt: skip
    KernelRidge(kernel=RBF(gamma=0.5), **kw).fit(X, y)
    sub = KernelRidge(kernel=SquaredRBF(gamma=0.5), **kw).fit(X, y)
    ref = KernelRidge(alpha=0.1, kernel=SquaredRBF(gamma=0.5), solver="dense").fit(X, y)
    np.testing.assert_allclose(sub.dual_coef_, ref.dual_coef_, rtol=1e-6, atol=1e-8)


def test_subclass_is_not_saved_as_its_parent(data, tmp_path):
    X, y = data
    est = KernelRidge(alpha=0.1, kernel=SquaredRBF(gamma=0.5), solver="dense").fit(X, y)
    with pytest.raises(ValueError, match="loads back as another kernel class"):
        est.save(tmp_path / "m")
