"""scikit-learn's estimator checks on KernelRidge (every solver), KernelRidgeCV, KernelPerceptron.

The out-of-core solvers take ``sample_weight`` like the in-memory ones (issue #20,
item 6), so they run every sample-weight check; KernelRidgeCV passes every check.
"""

from __future__ import annotations

from sklearn.utils.estimator_checks import parametrize_with_checks

from pipeline import KernelPerceptron, KernelRidge
from pipeline.kernels import RBF
from pipeline.models.selection import KernelRidgeCV

#: checks scikit-learn's own KernelRidge(kernel="precomputed") fails: they feed a sparse
#: matrix as a precomputed kernel and expect success (ours passes them)
_PRECOMPUTED_SPARSE = {
    "check_estimator_sparse_tag": (
        "the check passes a non-square sparse X to a precomputed-kernel estimator; "
        "sklearn.kernel_ridge.KernelRidge(kernel='precomputed') fails it the same way"
    ),
    "check_estimator_sparse_array": "as check_estimator_sparse_tag (non-square precomputed X)",
    "check_estimator_sparse_matrix": "as check_estimator_sparse_tag (non-square precomputed X)",
}

ESTIMATORS = [
    KernelRidge(),
    KernelRidge(kernel="rbf", solver="dense"),
    KernelRidge(kernel="linear", solver="primal"),
    KernelRidge(kernel=RBF(gamma=0.5), alpha_convention="n_samples"),
    KernelRidge(kernel="precomputed"),
    # out of core in a temporary store; ragged last tiles (checks use 15 to 200 rows)
    KernelRidge(kernel="rbf", solver="cholesky", block_size=64),
    KernelRidge(kernel="rbf", solver="cg", tol=1e-10, block_size=64),
    KernelRidgeCV(),
    KernelRidgeCV(alphas=(0.01, 1.0), param_grid={"gamma": [0.1, 1.0]}, cv=3),
    KernelPerceptron(),
    KernelPerceptron(kernel="poly", degree=2, shuffle=True, random_state=0),
]


def expected_failed_checks(estimator) -> dict[str, str]:
    """Every check an estimator is known to fail, with the reason (empty: passes all).
    Since session 26 a sparse precomputed K is densified, so ours passes the three
    sparse checks scikit-learn's own KernelRidge(kernel="precomputed") fails."""
    return {}


@parametrize_with_checks(ESTIMATORS, expected_failed_checks=expected_failed_checks)
def test_sklearn_compatible_estimator(estimator, check):
    check(estimator)


def test_precomputed_expected_failures_are_sklearns_own():
    """The listed failures are exactly those of scikit-learn's own KernelRidge."""
    import warnings

    from sklearn.kernel_ridge import KernelRidge as SKKernelRidge
    from sklearn.utils.estimator_checks import check_estimator

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = check_estimator(SKKernelRidge(kernel="precomputed"), on_fail=None)
    failed = {r["check_name"] for r in res if r["status"] == "failed"}
    assert failed == set(_PRECOMPUTED_SPARSE)
