"""Kernel library: references, dtypes, diag, specs, params, algebra, sklearn parity.

Kernel and tile-engine edges found by the session-26 review (each fails on the old code).
"""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.base import clone
from sklearn.gaussian_process.kernels import RBF as GPRBF
from sklearn.gaussian_process.kernels import Matern as GPMatern
from sklearn.metrics.pairwise import pairwise_kernels

from pipeline.kernels import (
    RBF,
    SKLEARN_KERNELS,
    AdditiveChi2,
    Chain,
    Chi2,
    Constant,
    Coordinate,
    Cosine,
    ElementwiseScale,
    Exp,
    FunctionScaled,
    GaussianEnvelope,
    InverseRowNorm,
    Kernel,
    L2Normalize,
    Laplacian,
    Linear,
    LinearMap,
    Matern,
    Normalized,
    Polynomial,
    Product,
    RowNorm,
    Scaled,
    SelectFeatures,
    Sigmoid,
    Standardize,
    Sum,
    Warped,
    kernel_from_spec,
    make_kernel,
    registered_names,
    registered_warpings,
    warping_from_spec,
)

RNG = np.random.default_rng(20261122)
# non-negative data so the chi² kernels apply everywhere
X = RNG.random((30, 4))
Y = RNG.random((17, 4))
W = RNG.normal(size=(4, 3))
STD = Standardize(X.mean(0), X.std(0))


def pk(metric, A, B=None, **kw):
    return pairwise_kernels(A, B, metric=metric, **kw)


# ---- hand / scikit-learn references for warpings and functions ----------------
def ref_warp(f, A):
    if isinstance(f, Standardize):
        return (A - np.asarray(f.mean)) / np.asarray(f.scale)
    if isinstance(f, LinearMap):
        out = A @ np.asarray(f.matrix)
        return out if f.offset is None else out + np.asarray(f.offset)
    if isinstance(f, SelectFeatures):
        return A[:, list(f.indices)]
    if isinstance(f, ElementwiseScale):
        return A * np.asarray(f.scale)
    if isinstance(f, L2Normalize):
        return A / np.linalg.norm(A, axis=1, keepdims=True)
    if isinstance(f, Chain):
        for s in f.steps:
            A = ref_warp(s, A)
        return A
    raise AssertionError(f)


def ref_fun(f, A):
    n = np.sqrt((A**2).sum(1))
    if isinstance(f, RowNorm):
        return n
    if isinstance(f, InverseRowNorm):
        return 1.0 / n
    if isinstance(f, GaussianEnvelope):
        return np.exp(-f.gamma * n**2)
    if isinstance(f, Coordinate):
        return A[:, f.index]
    raise AssertionError(f)


def ref(k: Kernel, A, B):
    """Dense reference, built independently of the library's arithmetic."""
    d = A.shape[1]
    if isinstance(k, Linear):
        return pk("linear", A, B)
    if isinstance(k, Polynomial):
        return pk("poly", A, B, degree=k.degree, gamma=k.gamma, coef0=k.coef0)
    if isinstance(k, RBF) and np.ndim(k.length_scale) == 1:  # ARD
        return GPRBF(length_scale=np.asarray(k.length_scale))(A, B)
    if isinstance(k, Matern):
        return GPMatern(nu=k.nu, length_scale=np.asarray(k.length_scale))(A, B)
    if isinstance(k, RBF):
        g = k.gamma if k.length_scale is None else 1 / (2 * k.length_scale**2)
        return pk("rbf", A, B, gamma=g)
    if isinstance(k, Laplacian):
        return pk("laplacian", A, B, gamma=k.gamma)
    if isinstance(k, Constant):
        return np.full((len(A), len(B)), k.value)
    if isinstance(k, Sigmoid):
        return pk("sigmoid", A, B, gamma=k.gamma, coef0=k.coef0)
    if isinstance(k, Cosine):
        return pk("cosine", A, B)
    if isinstance(k, Chi2):
        return pk("chi2", A, B, gamma=k.gamma)
    if isinstance(k, AdditiveChi2):
        return pk("additive_chi2", A, B)
    if isinstance(k, Scaled):
        return k.weight * ref(k.kernel, A, B)
    if isinstance(k, Sum):
        return ref(k.k1, A, B) + ref(k.k2, A, B)
    if isinstance(k, Product):
        return ref(k.k1, A, B) * ref(k.k2, A, B)
    if isinstance(k, Exp):
        return np.exp(k.scale * ref(k.kernel, A, B))
    if isinstance(k, Warped):
        return ref(k.kernel, ref_warp(k.f, A), ref_warp(k.f, B))
    if isinstance(k, FunctionScaled):
        return ref_fun(k.f, A)[:, None] * ref(k.kernel, A, B) * ref_fun(k.f, B)[None, :]
    if isinstance(k, Normalized):
        num = ref(k.kernel, A, B)
        da = np.array([ref(k.kernel, a[None], a[None])[0, 0] for a in A])
        db = np.array([ref(k.kernel, b[None], b[None])[0, 0] for b in B])
        return num / np.sqrt(np.outer(da, db))
    raise AssertionError(f"no reference for {k!r} (d={d})")


def all_kernels():
    return {
        "linear": Linear(),
        "poly_default": Polynomial(),
        "poly2": Polynomial(degree=2, gamma=0.5, coef0=0.3),
        "rbf_default": RBF(),
        "rbf_gamma": RBF(gamma=0.7),
        "rbf_length_scale": RBF(length_scale=0.8),
        "laplacian": Laplacian(gamma=0.4),
        "rbf_ard": RBF(length_scale=[0.5, 1.0, 2.0, 0.25]),
        "matern05": Matern(nu=0.5, length_scale=0.7),
        "matern15": Matern(),
        "matern25_ard": Matern(nu=2.5, length_scale=np.array([0.5, 1.0, 2.0, 0.25])),
        "matern_algebra": 0.5 * Matern(nu=0.5) * RBF(0.3)
        + Warped(Matern(nu=1.5, length_scale=[0.3, 2.0]), SelectFeatures([3, 0])),
        "constant": Constant(2.5),
        "sigmoid": Sigmoid(gamma=0.3, coef0=-0.2),
        "cosine": Cosine(),
        "chi2": Chi2(gamma=0.6),
        "additive_chi2": AdditiveChi2(),
        "scaled": Scaled(RBF(0.5), 3.0),
        "scaled_op": 0.25 * Laplacian(),
        "sum": Linear() + RBF(1.0),
        "product": Polynomial(2) * Laplacian(0.3),
        "exp": Exp(Linear(), scale=0.4),
        "normalized": Normalized(Polynomial(3, coef0=0.5)),
        "normalized_sum": Normalized(RBF(0.2) + Linear()),
        "warped_standardize": Warped(RBF(0.3), STD),
        "warped_linear_map": Warped(Polynomial(2), LinearMap(W, offset=[0.1, -0.2, 0.3])),
        "warped_select": Warped(Laplacian(1.0), SelectFeatures([3, 0])),
        "warped_scale": Warped(RBF(1.0), ElementwiseScale([1.0, 0.5, 2.0, 0.0])),
        "warped_l2": Warped(Linear(), L2Normalize()),
        "warped_chain": Warped(RBF(0.5), Chain([STD, SelectFeatures([0, 2, 3]), L2Normalize()])),
        "fs_norm": FunctionScaled(RBF(0.5), RowNorm()),
        "fs_inv_norm": FunctionScaled(Linear(), InverseRowNorm()),
        "fs_gauss": FunctionScaled(Exp(Linear(), 0.6), GaussianEnvelope(0.3)),
        "fs_coordinate": FunctionScaled(Constant(1.0), Coordinate(2)),
        "nested": Exp(
            Normalized(
                Sum(
                    Scaled(Warped(RBF(length_scale=1.5), STD), 0.5),
                    Product(Chi2(0.5), FunctionScaled(Cosine(), RowNorm())),
                )
            ),
            0.5,
        ),
    }


KERNELS = all_kernels()
IDS = sorted(KERNELS)


@pytest.mark.parametrize("kid", IDS)
def test_matches_dense_reference(kid):
    k = KERNELS[kid]
    np.testing.assert_allclose(k(X, Y), ref(k, X, Y), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(k(X), ref(k, X, X), rtol=1e-12, atol=1e-12)
    assert k(X).shape == (30, 30) and k(X, Y).shape == (30, 17)


@pytest.mark.parametrize("kid", IDS)
def test_diag_equals_einsum_of_full(kid):
    k = KERNELS[kid]
    np.testing.assert_allclose(k.diag(X), np.einsum("ii->i", k(X)), rtol=1e-12, atol=1e-13)
    assert k.diag(X.astype(np.float32)).dtype == np.float32


@pytest.mark.parametrize("kid", IDS)
def test_spec_roundtrip_through_json(kid):
    k = KERNELS[kid]
    spec = k.to_spec()
    text = json.dumps(spec)  # plain JSON: no numpy types, no objects
    k2 = kernel_from_spec(json.loads(text))
    assert type(k2) is type(k)
    assert k2.to_spec() == spec and k2 == k and hash(k2) == hash(k)
    np.testing.assert_array_equal(k2(X, Y), k(X, Y))
    np.testing.assert_array_equal(k2.diag(X), k.diag(X))
    assert make_kernel(json.loads(text)) == k


@pytest.mark.parametrize("kid", IDS)
def test_float32_in_float32_out(kid):
    k = KERNELS[kid]
    X32, Y32 = X.astype(np.float32), Y.astype(np.float32)
    K32 = k(X32, Y32)
    assert K32.dtype == np.float32
    np.testing.assert_allclose(K32, k(X, Y), rtol=2e-5, atol=2e-5)
    assert k(X32, Y).dtype == np.float64  # mixed -> float64
    assert k((X * 10).astype(np.int64)).dtype == np.float64


@pytest.mark.parametrize("kid", IDS)
def test_pickle_and_clone(kid):
    k = KERNELS[kid]
    for k2 in (pickle.loads(pickle.dumps(k)), clone(k)):
        assert k2 is not k and k2 == k
        np.testing.assert_array_equal(k2(X, Y), k(X, Y))


def test_every_registered_name_is_covered():
    covered = set()

    def walk(obj):
        covered.add(obj.name)
        for v in obj.get_params(deep=False).values():
            if hasattr(v, "get_params"):
                walk(v)
            if isinstance(v, list):
                for s in v:
                    if hasattr(s, "get_params"):
                        walk(s)

    for k in KERNELS.values():
        walk(k)
    assert set(registered_names()) <= covered
    assert set(registered_warpings()) <= covered


# ---- scikit-learn parity ---------------------------------------------------
SK_PARAMS = [
    dict(gamma=None, degree=3, coef0=1),  # KernelRidge defaults
    dict(gamma=0.37, degree=2, coef0=0.5),
    dict(gamma=1.3, degree=4.0, coef0=-0.25),
    dict(gamma=0.0, degree=1, coef0=2.0),
]


@pytest.mark.parametrize("name", SKLEARN_KERNELS)
@pytest.mark.parametrize("pi", range(len(SK_PARAMS)))
def test_equals_sklearn_pairwise_kernels(name, pi):
    params = dict(SK_PARAMS[pi])
    if name == "chi2" and params["gamma"] is None:
        # sklearn's chi2_kernel fails on gamma=None; ours falls back to its default 1.0
        ours = make_kernel(name, **params)
        params["gamma"] = 1.0
        np.testing.assert_allclose(ours(X, Y), pk(name, X, Y, **params, filter_params=True))
    k = make_kernel(name, **params)
    Xn, Yn = RNG.normal(size=(25, 5)), RNG.normal(size=(11, 5))
    if name in ("chi2", "additive_chi2"):
        Xn, Yn = np.abs(Xn), np.abs(Yn)
        Xn[0, :2] = 0.0  # 0/0 terms
        Yn[0, :2] = 0.0
    Xn[1] = 0.0  # an all-zero row (cosine's convention)
    for A, B in ((Xn, Yn), (Xn, None)):
        expected = pk(name, A, B, filter_params=True, **params)
        np.testing.assert_allclose(k(A, B), expected, rtol=1e-12, atol=1e-12)
    # float32 inputs: float32 out, equal to sklearn to float32 precision
    A32 = Xn.astype(np.float32)
    K32 = k(A32)
    assert K32.dtype == np.float32
    expected32 = pk(name, A32.astype(np.float64), filter_params=True, **params)
    np.testing.assert_allclose(K32, expected32, rtol=1e-5, atol=1e-5)


def test_sklearn_diabetes_every_name():
    from sklearn.datasets import load_diabetes

    Xd = load_diabetes().data
    for name in SKLEARN_KERNELS:
        A = np.abs(Xd) if "chi2" in name else Xd
        got = make_kernel(name, gamma=0.5, degree=2, coef0=1)(A[:60], A[60:100])
        exp = pk(name, A[:60], A[60:100], filter_params=True, gamma=0.5, degree=2, coef0=1)
        np.testing.assert_allclose(got, exp, rtol=1e-12, atol=1e-12)


def test_float32_rbf_large_magnitude_close_points():
    rng = np.random.default_rng(3)
    X32 = (1000.0 + 0.1 * rng.normal(size=(60, 8))).astype(np.float32)
    X64 = X32.astype(np.float64)  # the same points, exactly
    gamma = 20.0
    exact = np.exp(-gamma * ((X64[:, None, :] - X64[None, :, :]) ** 2).sum(-1))
    K32 = RBF(gamma=gamma)(X32)
    assert K32.dtype == np.float32
    assert np.abs(K32 - exact).max() < 1e-6  # float32 precision
    np.testing.assert_allclose(RBF(gamma=gamma)(X64), exact, atol=1e-9)
    # the naive float32 expansion |x|² + |y|² - 2x·y loses everything here
    sq = (X32 * X32).sum(1)
    naive = np.exp(-gamma * np.maximum(sq[:, None] + sq[None, :] - 2 * X32 @ X32.T, 0))
    assert np.abs(naive - exact).max() > 1e-2
    # and accumulation in float64 matters for the inner-product kernels too
    big = np.full((2, 20000), 1.0, dtype=np.float32)
    big[1] += np.float32(1e-3)
    K = Linear()(big)
    np.testing.assert_allclose(K, big.astype(np.float64) @ big.astype(np.float64).T, rtol=1e-7)


# ---- the kernel trick and the seed's constructions ---------------------------
def quadratic_features(A, gamma, coef0):
    """Explicit map with φ(x)·φ(y) = (γ x·y + c)²."""
    n = A.shape[0]
    outer = np.einsum("ni,nj->nij", A, A).reshape(n, -1)
    return np.hstack([np.full((n, 1), coef0), np.sqrt(2 * coef0 * gamma) * A, gamma * outer])


def test_degree2_polynomial_is_inner_product_of_quadratic_features():
    gamma, coef0 = 0.7, 1.5
    k = Polynomial(degree=2, gamma=gamma, coef0=coef0)
    PX, PY = quadratic_features(X, gamma, coef0), quadratic_features(Y, gamma, coef0)
    assert PX.shape[1] == 1 + 4 + 16
    np.testing.assert_allclose(k(X, Y), PX @ PY.T, rtol=1e-12)
    np.testing.assert_allclose(k.diag(X), (PX**2).sum(1), rtol=1e-12)


def test_seed_constructions():
    g = 0.35
    # RBF = f(x) exp(x·y / ...) f(y): the seed's factorisation
    rbf_built = FunctionScaled(Exp(Linear(), 2 * g), GaussianEnvelope(g))
    np.testing.assert_allclose(rbf_built(X, Y), RBF(g)(X, Y), rtol=1e-12)
    # linear = Σ_i f_i(x)·1·f_i(y) with coordinate maps
    lin = sum(FunctionScaled(Constant(1.0), Coordinate(i)) for i in range(X.shape[1]))
    np.testing.assert_allclose(lin(X, Y), Linear()(X, Y), rtol=1e-12)
    # cosine normalisation three ways
    for k in (Normalized(Linear()), FunctionScaled(Linear(), InverseRowNorm())):
        np.testing.assert_allclose(k(X, Y), Cosine()(X, Y), rtol=1e-12)
    # Normalized(k) = FunctionScaled(k, 1/sqrt(k(x,x))) with an in-memory callable
    base = Polynomial(3, coef0=0.5)
    fs = FunctionScaled(base, lambda A: 1.0 / np.sqrt(base.diag(A)))
    np.testing.assert_allclose(Normalized(base)(X, Y), fs(X, Y), rtol=1e-12)
    # (x·y) + (x·y)² from sum and product
    np.testing.assert_allclose(
        (Linear() + Linear() * Linear())(X, Y), Polynomial(2, 1.0, 0.0)(X, Y) + Linear()(X, Y)
    )


def test_normalized_zero_rows_and_negative_diag():
    Z = X.copy()
    Z[0] = 0.0
    K = Normalized(Linear())(Z)
    assert np.all(K[0] == 0) and Normalized(Linear()).diag(Z)[0] == 0
    np.testing.assert_allclose(K, pk("cosine", Z), atol=1e-12)
    with pytest.raises(ValueError, match="k\\(x, x\\) >= 0"):
        Normalized(Sigmoid(gamma=0.01, coef0=-3.0))(X)


# ---- callables in memory, never serialised ----------------------------------
def test_python_callables_work_in_memory_but_do_not_serialise():
    k = Warped(RBF(0.5), lambda A: 2.0 * A)
    np.testing.assert_allclose(k(X, Y), RBF(0.5)(2 * X, 2 * Y), rtol=1e-12)
    with pytest.raises(TypeError, match="cannot be serialised"):
        k.to_spec()
    with pytest.raises(TypeError, match="cannot be serialised"):
        (Linear() + FunctionScaled(Linear(), np.linalg.norm)).to_spec()
    assert k == k and k != Warped(RBF(0.5), lambda A: 2.0 * A)
    hash(k)  # falls back to identity
    with pytest.raises(TypeError, match="warping"):
        Warped(RBF(), "standardize")
    with pytest.raises(ValueError, match="must map"):
        Warped(RBF(), lambda A: A[:, 0])(X)
    with pytest.raises(ValueError, match="must map"):
        FunctionScaled(RBF(), lambda A: A)(X)


def test_specs_never_eval_unknown_names():
    with pytest.raises(ValueError, match="unknown kernel 'os.system'"):
        kernel_from_spec({"name": "os.system", "params": {}})
    with pytest.raises(ValueError, match="unknown warping or kernel '__import__'"):
        kernel_from_spec(
            {
                "name": "warped",
                "params": {"kernel": Linear().to_spec(), "f": {"name": "__import__"}},
            }
        )
    with pytest.raises(ValueError, match="does not take parameters \\['evil'\\]"):
        kernel_from_spec({"name": "rbf", "params": {"evil": 1}})
    with pytest.raises(ValueError, match="does not take parameters"):
        warping_from_spec({"name": "l2_normalize", "params": {"x": 1}})
    with pytest.raises(ValueError, match="spec"):
        kernel_from_spec(["rbf"])


# ---- parameters ------------------------------------------------------------
def test_get_set_params_nested():
    k = Sum(RBF(gamma=0.5), Scaled(Warped(Polynomial(2), STD), 2.0))
    p = k.get_params()
    assert p["k1__gamma"] == 0.5 and p["k2__weight"] == 2.0
    assert p["k2__kernel__kernel__degree"] == 2
    assert p["k2__kernel__f__mean"] is STD.mean
    assert set(k.get_params(deep=False)) == {"k1", "k2"}
    k.set_params(k1__gamma=2.0, k2__weight=0.5, k2__kernel__kernel__coef0=3.0)
    assert k.k1.gamma == 2.0 and k.k2.weight == 0.5 and k.k2.kernel.kernel.coef0 == 3.0
    expected = RBF(2.0)(X, Y) + 0.5 * Polynomial(2, coef0=3.0)(ref_warp(STD, X), ref_warp(STD, Y))
    np.testing.assert_allclose(k(X, Y), expected, rtol=1e-12)
    k.set_params(k2__kernel__f__scale=np.ones(4))
    assert np.all(k.k2.kernel.f.scale == 1.0)
    k.set_params(k1=Laplacian(0.1))
    assert isinstance(k.k1, Laplacian)
    with pytest.raises(ValueError, match="invalid parameter 'k3'"):
        k.set_params(k3=1)
    with pytest.raises(ValueError, match="invalid parameter 'foo'"):
        k.set_params(k1__foo=1)


def test_failed_set_params_restores_old_value():
    k = RBF(gamma=0.5)
    with pytest.raises(ValueError, match="-1"):
        k.set_params(gamma=-1.0)
    assert k.gamma == 0.5
    s = Scaled(Linear(), 2.0)
    with pytest.raises(ValueError, match="weight must be"):
        s.set_params(weight=-3)
    assert s.weight == 2.0


@pytest.mark.parametrize(
    "build, bad",
    [
        (lambda: RBF(gamma=-1.0), "-1.0"),
        (lambda: RBF(gamma=float("nan")), "nan"),
        (lambda: RBF(gamma="big"), "'big'"),
        (lambda: RBF(length_scale=0.0), "0.0"),
        (lambda: RBF(gamma=1.0, length_scale=1.0), "not both"),
        (lambda: Polynomial(degree=-2), "-2"),
        (lambda: Polynomial(coef0=float("inf")), "inf"),
        (lambda: Laplacian(gamma=-0.5), "-0.5"),
        (lambda: Constant(-1.0), "-1.0"),
        (lambda: Sigmoid(gamma=-2.0), "-2.0"),
        (lambda: Chi2(gamma=-3.0), "-3.0"),
        (lambda: Scaled(RBF(), -2.0), "-2.0"),
        (lambda: -2.0 * RBF(), "-2.0"),
        (lambda: Exp(Linear(), scale=-0.1), "-0.1"),
        (lambda: Standardize([0.0, 1.0], [1.0, 0.0]), "0.0"),
        (lambda: Standardize([0.0, 1.0], [1.0]), "must match"),
        (lambda: Standardize([0.0, np.nan], [1.0, 1.0]), "nan"),
        (lambda: SelectFeatures([1.5]), "1.5"),
        (lambda: SelectFeatures([-1]), "-1"),
        (lambda: LinearMap(np.ones(3)), "2-D"),
        (lambda: LinearMap(np.ones((3, 2)), offset=[1.0]), "offset"),
        (lambda: GaussianEnvelope(-1.0), "-1.0"),
        (lambda: Coordinate(-1), "-1"),
        (lambda: Chain([]), "non-empty"),
        (lambda: make_kernel("rbf", foo=3), "foo"),
        (lambda: make_kernel("nope"), "'nope'"),
        (lambda: make_kernel("sum"), "needs parameters"),
        (lambda: Chi2()(X - 0.5), "< 0"),
        (lambda: AdditiveChi2()(X, Y - 2.0), "< 0"),
        (lambda: RBF()(X, Y[:, :3]), "features"),
        (lambda: RBF()(X[0]), "2-D"),
        (lambda: Warped(RBF(), SelectFeatures([7]))(X), "index 7"),
        (lambda: Warped(RBF(), STD)(X[:, :3]), "3 features"),
    ],
)
def test_bad_params_raise_valueerror_naming_the_value(build, bad):
    with pytest.raises(ValueError) as info:
        build()
    assert bad in str(info.value)


def test_composition_type_errors():
    with pytest.raises(TypeError, match="must be a Kernel"):
        Sum(RBF(), 3)
    with pytest.raises(TypeError):
        RBF() * "a"
    with pytest.raises(TypeError):
        RBF() - Linear()


# ---- algebra and the factory --------------------------------------------------
def test_operators():
    r, l = RBF(0.5), Linear()
    assert isinstance(2 * r, Scaled) and (2 * r) == (r * 2) == Scaled(r, 2.0)
    assert isinstance(np.float64(3.0) * r, Scaled)
    assert isinstance(r + l, Sum) and isinstance(r * l, Product)
    assert sum([r, l]) == Sum(r, l)
    np.testing.assert_allclose((r + 1.5)(X, Y), r(X, Y) + 1.5)
    np.testing.assert_allclose((1.5 + r)(X, Y), r(X, Y) + 1.5)
    np.testing.assert_allclose((0.0 * r)(X, Y), 0.0)


def test_make_kernel():
    assert make_kernel("poly", degree=2) == Polynomial(degree=2)
    assert make_kernel("gaussian", gamma=0.1) == RBF(0.1)
    # scikit-learn's KernelRidge forwards gamma/degree/coef0 to every name
    assert make_kernel("rbf", gamma=None, degree=3, coef0=1) == RBF()
    assert make_kernel("linear", gamma=0.2, degree=3, coef0=1) == Linear()
    assert make_kernel("sigmoid", gamma=0.2, degree=3, coef0=0.5) == Sigmoid(0.2, 0.5)
    assert make_kernel("chi2", gamma=None) == Chi2()
    assert make_kernel("rbf", length_scale=2.0) == RBF(length_scale=2.0)
    k = RBF(0.3)
    assert make_kernel(k) is k
    assert make_kernel(k.to_spec(), gamma=0.9) == RBF(0.9)
    # a spec with the estimator's forwarded defaults: only what the kernel takes applies
    assert make_kernel(k.to_spec(), gamma=None, degree=3, coef0=1) == RBF(0.3)
    assert make_kernel((k + Linear()).to_spec(), gamma=2.0, degree=3) == k + Linear()
    with pytest.raises(ValueError, match="bogus"):
        make_kernel(k.to_spec(), bogus=1)
    with pytest.raises(TypeError):
        make_kernel(3)


def test_polynomial_is_mercer_depends_on_params():
    assert Polynomial(2, coef0=1.0).is_mercer
    assert not Polynomial(2, coef0=-1.0).is_mercer
    assert not Polynomial(2.5).is_mercer
    assert not (RBF() + Sigmoid()).is_mercer
    assert (RBF() * Warped(Linear(), STD)).is_mercer
    assert not Exp(AdditiveChi2()).is_mercer


def test_sparse_input_is_densified():
    Xs = sp.csr_matrix(np.where(X > 0.5, X, 0.0))
    np.testing.assert_allclose(RBF(0.5)(Xs, Y), RBF(0.5)(Xs.toarray(), Y))
    np.testing.assert_allclose(Cosine().diag(Xs), Cosine().diag(Xs.toarray()))


def test_standardize_from_data_matches_sklearn_scaler():
    from sklearn.preprocessing import StandardScaler

    A = np.hstack([X, np.ones((30, 1))])  # a constant column: scale 1
    w = Standardize.from_data(A)
    np.testing.assert_allclose(w(A), StandardScaler().fit_transform(A), atol=1e-12)


def test_default_diag_fallback_in_blocks():
    class Plain(Kernel):
        name = "test-plain-unregistered"

        def _eval(self, A, B, symmetric):
            return (A @ B.T) ** 2

    A = RNG.normal(size=(600, 3))
    np.testing.assert_allclose(Plain().diag(A), (A**2).sum(1) ** 2, rtol=1e-12)


def test_kernel_modules_import_numpy_only():
    """pipeline.kernels never imports dask, zarr or scikit-learn (scipy only in mercer)."""
    import ast
    from pathlib import Path

    import pipeline.kernels

    for path in Path(pipeline.kernels.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                mods = [node.module or ""]
            else:
                continue
            for mod in mods:
                top = mod.split(".")[0]
                assert top not in ("dask", "distributed", "zarr", "sklearn"), (path, mod)
                assert top != "scipy" or path.name == "mercer.py", (path, mod)


def test_a_float32_gram_that_overflows_is_refused(tmp_path):
    from pipeline.linalg.gram import build_gram

    X = np.random.default_rng(13).standard_normal((60, 3)) * 1e20  # K ~ 1e40: float64 only
    for kd in (None, "float64"):
        from pipeline.errors import NonFiniteKernelError

        with pytest.raises(NonFiniteKernelError, match="overflows float32 storage"):
            build_gram(X, Linear(), str(tmp_path / f"g{kd}"), 25, dtype="float32",
                       kernel_dtype=kd, progress=False)  # fmt: skip


def test_float64_evaluation_of_float32_rows_is_float64_for_composites():
    from pipeline.engine import kernel_tile

    X = np.random.default_rng(0).standard_normal((50, 4)).astype(np.float32)
    ref = RBF(gamma=0.5)(X.astype(np.float64))
    for k in (Scaled(RBF(gamma=0.5), 1.0), Sum(RBF(gamma=0.5), Scaled(RBF(gamma=0.5), 0.0))):
        out = np.empty((50, 50))
        kernel_tile(k, X, None, out, kernel_dtype="float64")
        np.testing.assert_allclose(out, ref, rtol=0, atol=1e-13)


def test_a_refused_nested_set_params_changes_nothing():
    k = Sum(RBF(gamma=1.0), RBF(gamma=1.0))
    with pytest.raises(ValueError, match="gamma"):
        k.set_params(k1__gamma=0.5, k2__gamma=-1.0)
    assert k.k1.gamma == 1.0 and k.k2.gamma == 1.0
    s = Scaled(RBF(gamma=1.0), 1.0)
    with pytest.raises(ValueError, match="gamma"):
        s.set_params(weight=5.0, kernel__gamma=-3.0)
    assert s.weight == 1.0 and s.kernel.gamma == 1.0


def test_check_mercer_does_not_depend_on_the_kernels_scale():
    from pipeline.kernels import check_mercer, make_kernel

    X = np.random.default_rng(1).standard_normal((80, 3))
    for w in (1.0, 1e-12):
        rep = check_mercer(Scaled(make_kernel("sigmoid"), w), X)
        assert not rep.psd, w
        assert check_mercer(Scaled(RBF(), w), X).psd, w


def test_auto_with_a_store_fits_a_callable_warped_kernel_in_memory(tmp_path):
    from pipeline import KernelRidge

    rng = np.random.default_rng(2)
    X, y = rng.standard_normal((200, 3)), rng.standard_normal(200)
    m = KernelRidge(kernel=Warped(RBF(), lambda Z: 2 * Z), store=str(tmp_path / "s")).fit(X, y)
    assert m.solver_ == "dense"


def test_a_refused_set_params_keeps_the_users_nested_objects():
    inner = RBF(gamma=0.5)
    k = Sum(Sum(inner, RBF()), RBF())
    with pytest.raises(ValueError, match="gamma"):
        k.set_params(k1__k1__gamma=0.1, k2__gamma=-1.0)
    assert k.k1.k1 is inner and inner.gamma == 0.5  # the user's object, its old value


def test_a_spec_with_parameters_beside_params_is_refused():
    """``{"name": "rbf", "gamma": 0.3}`` once built RBF() with its default γ, silently."""
    from pipeline import KernelRidge

    msg = "has keys \\['gamma'\\] besides 'name' and 'params'.*'params': \\{'gamma': 0.3\\}"
    with pytest.raises(ValueError, match=msg):
        kernel_from_spec({"name": "rbf", "gamma": 0.3})
    with pytest.raises(ValueError, match=msg):
        make_kernel({"name": "rbf", "gamma": 0.3})
    X = np.random.default_rng(0).standard_normal((20, 2))
    with pytest.raises(ValueError, match=msg):
        KernelRidge(kernel={"name": "rbf", "gamma": 0.3}).fit(X, X[:, 0])
    assert make_kernel({"name": "rbf", "params": {"gamma": 0.3}}).gamma == 0.3
    with pytest.raises(ValueError, match="warping spec .* has keys \\['p'\\] besides"):
        warping_from_spec({"name": "l2_normalize", "p": 1})


def test_kernels_and_warpings_share_one_namespace_of_spec_names():
    """A kernel may not take a warping's name, nor a warping a kernel's (a spec names
    either); the refused class is not registered."""
    from pipeline.kernels.base import register
    from pipeline.kernels.warping import Warping, register_warping

    warping, kernel = registered_warpings()[0], registered_names()[0]
    with pytest.raises(ValueError, match=f"kernel name {warping!r} is already a warping name"):
        register(type("Clash", (Kernel,), {"name": warping}))
    with pytest.raises(ValueError, match=f"warping name {kernel!r} is already a kernel name"):
        register_warping(type("Clash", (Warping,), {"name": kernel}))
    assert warping not in registered_names() and kernel not in registered_warpings()
