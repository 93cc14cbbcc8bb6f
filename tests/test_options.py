"""``pipeline.options``: the solver knobs' vocabulary and option tree, the λ convention and
the diagonal shift, each defined once.

Issue #43 ("one concept, one home"): the 14 solver knobs were spelled in three hand-built
``choices`` dicts (``estimator``, ``out_of_core``, ``stages.solve``; a fourth in the CV
refit), the λ convention was translated in 7 places and the shift computed in 4 (one of
them inside the tile Cholesky). The shift must stay the same to the last bit: it is the
same IEEE product as before, which these tests compare against the old formulas.

Issue #43 again ("one options tree from which the config models, the estimators'
parameters and the plan derive"): the knobs were spelt four ways, ``SolverConfig``,
``KernelRidge.__init__``, the choices dicts and ``FitPlan``, each with its own defaults,
and the config and the estimator listed the preconditioners in two orders.
``options.SolverOptions`` is the one tree; the tests below check that each spelling is
derived from it.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import re
from pathlib import Path
from typing import get_args

import numpy as np
import pytest

import pipeline
from pipeline import constants as C
from pipeline import options
from pipeline.options import diagonal_shift

ROOT = Path(pipeline.__file__).parent

LAMS = [0.1, 1e-3, 0.7, 1 / 3, 2.5e-7, 1e-300, 123.456, 0.0]
NS = [1, 3, 7, 442, 1000, 99_991, 2**31 + 11]


@pytest.mark.parametrize("lam", LAMS)
@pytest.mark.parametrize("n", NS)
def test_shift_is_bitwise_the_old_formulas(lam, n):
    """Every old site's formula, and the one function, give the same float64 bits."""
    old = {
        "cholesky_options": n * lam,  # lam if convention == "sklearn" else n * lam
        "plan_fit": lam * n,  # mu = float(min(alphas)); mu *= n
        "dual.effective_alpha": np.asarray([lam]) * float(n),  # a * float(n_samples)
        "KernelRidgeCV._shift": float(lam) * n,  # float(alpha) * (n_train if ... else 1.0)
        "model_io": np.asarray([lam]) * n,  # reg * X.shape[0]
    }
    new = diagonal_shift(lam, n, "n_samples")
    for site, value in old.items():
        assert np.asarray(value).view(np.uint64)[()] == np.float64(new).view(np.uint64), site
    assert diagonal_shift(lam, n, "n") == new
    assert diagonal_shift(lam, n, "sklearn") is lam
    assert float(lam) * 1.0 == diagonal_shift(float(lam), n, "sklearn")  # the CV's sklearn case


def test_shift_of_an_array_and_of_weights():
    a = np.array([0.1, 0.3, 1 / 3])
    w = np.array([0.5, 2.0, 1.25, 3.0])
    np.testing.assert_array_equal(diagonal_shift(a, float(np.sum(w)), "n_samples"), a * 6.75)
    assert diagonal_shift(a, 4, "sklearn") is a


def test_shift_refuses_an_unknown_convention():
    with pytest.raises(ValueError, match="alpha_convention='N' is not valid"):
        diagonal_shift(0.1, 10, "N")


def test_the_sites_call_the_one_shift():
    """The tile Cholesky's shift, the plan's, the in-memory one, the CV's and a loaded
    model's are the one function's (each site's own checks stay in front of it)."""
    from pipeline.linalg.cholesky import regularisation_shift
    from pipeline.linalg.dense_dual import effective_alpha
    from pipeline.models.selection import KernelRidgeCV

    for lam, n in [(0.1, 3), (1 / 3, 442), (1e-3, 99_991)]:
        assert regularisation_shift(lam, n, "n") == diagonal_shift(lam, n, "n")
        assert regularisation_shift(lam, n, "sklearn") == lam
        got = effective_alpha(lam, n, alpha_convention="n_samples")
        np.testing.assert_array_equal(got, diagonal_shift(np.asarray([lam]), float(n), "n"))
        assert KernelRidgeCV(lambda_convention="n")._shift(lam, n) == lam * n
        assert KernelRidgeCV()._shift(lam, n) == lam
    with pytest.raises(ValueError, match="'sklearn' .K \\+ alpha I. or 'n_samples'"):
        effective_alpha(0.1, 3, alpha_convention="n")  # the in-memory API's old refusal


def test_plan_shift_uses_the_convention():
    from pipeline.plan.fit_plan import Resources, plan_fit

    inf = float("inf")
    seen = []

    class Model:
        def cholesky_seconds(self, n, d, kernel, shift=None, tol=None):
            seen.append(shift)
            return 1.0

        def cg_seconds(self, n, d, kernel, shift=None, tol=None):
            return 2.0

    for conv, want in (("sklearn", 0.1), ("n_samples", 0.1 * 30), ("n", 0.1 * 30)):
        seen.clear()
        plan_fit(
            30, 2, None, Resources(inf, inf, in_memory=False),
            {"solver": "auto", "alpha": 0.1, "alpha_convention": conv}, cost_model=Model(),
        )  # fmt: skip
        assert seen and seen[0] == want


# ---------------------------------------------------------------------------
# the convention's spellings


def test_convention_spellings():
    assert options.normalize_alpha_convention("n") == "n_samples"
    assert options.normalize_alpha_convention("sklearn") == "sklearn"
    with pytest.raises(ValueError, match="alpha_convention='x' is not valid"):
        options.normalize_alpha_convention("x")
    assert [options.solver_convention(c) for c in ("sklearn", "n_samples", "n", "?")] == [
        "sklearn", "n", "n", "sklearn",
    ]  # fmt: skip
    assert [options.public_convention(c) for c in ("sklearn", "n_samples", "n", "?")] == [
        "sklearn", "n_samples", "n_samples", "sklearn",
    ]  # fmt: skip
    assert set(options.ALPHA_CONVENTION_ALIASES.values()) == set(options.ALPHA_CONVENTIONS)
    assert {options.solver_convention(c) for c in options.ALPHA_CONVENTIONS} == set(
        options.SOLVER_CONVENTIONS
    )


# ---------------------------------------------------------------------------
# the vocabulary: one definition, the old names are it

#: (module, name) -> the one definition it must be
SAME_OBJECT = [
    ("pipeline.plan.fit_plan", "SOLVERS", options.SOLVERS),
    ("pipeline.plan.fit_plan", "FACTOR_DTYPES", options.FACTOR_DTYPES),
    ("pipeline.plan.fit_plan", "MATVEC_ALIASES", options.MATVEC_ALIASES),
    ("pipeline.plan.fit_plan", "ALPHA_CONVENTION_ALIASES", options.ALPHA_CONVENTION_ALIASES),
    ("pipeline.plan.fit_plan", "normalize_matvec", options.normalize_matvec),
    ("pipeline.plan.fit_plan", "normalize_alpha_convention", options.normalize_alpha_convention),
    ("pipeline.plan.cg_variant", "CG_PRECISIONS", options.CG_PRECISIONS),
    ("pipeline.linalg.precond", "PRECONDITIONERS", options.PRECONDITIONERS),
    ("pipeline.linalg.cholesky_options", "CONVENTIONS", options.SOLVER_CONVENTIONS),
    ("pipeline.linalg.dense_dual", "ALPHA_CONVENTIONS", options.ALPHA_CONVENTIONS),
    ("pipeline.fit", "solver_convention", options.solver_convention),
]


@pytest.mark.parametrize(
    ("module", "name", "one"),
    SAME_OBJECT,
    # a function by its name, not its address: the same ids in every process (pytest-xdist)
    ids=lambda v: v.__name__ if callable(v) else str(v)[:40],
)
def test_old_names_are_the_one_definition(module, name, one):
    assert getattr(importlib.import_module(module), name) is one


def test_the_config_and_the_estimator_list_the_values_in_one_order():
    """The config's messages and the estimator's listed the preconditioners (and CG's
    products) in two orders; now both list the tree's one tuple."""
    from pipeline import KernelRidge
    from pipeline.stages.config import SolverConfig

    X, y = np.ones((4, 1)), np.ones(4)
    for name in ("preconditioner", "matvec"):
        values = getattr(options, {"matvec": "MATVECS"}.get(name, "PRECONDITIONERS"))
        assert get_args(SolverConfig.model_fields[name].annotation) == values
        with pytest.raises(ValueError, match=re.escape(f"choose one of {list(values)}")):
            KernelRidge(solver="cg", **{name: "x"}).fit(X, y)
    assert options.PRECONDITIONERS == ("none", "jacobi", "nystrom", "adaptive")  # the CLI's
    from pipeline.models.selection import choice

    assert choice.CONVENTIONS == tuple(options.ALPHA_CONVENTION_ALIASES)


def test_config_literals_are_the_vocabulary():
    from pipeline.stages.config import RunConfig, SolverConfig

    fields = SolverConfig.model_fields
    for name, vocab in (
        ("method", options.RUN_SOLVERS),
        ("preconditioner", options.PRECONDITIONERS),
        ("matvec", options.MATVECS),
        ("cg_precision", options.CG_PRECISIONS),
        ("factor_dtype", options.FACTOR_DTYPES),
        ("factor_scheduler", options.FACTOR_SCHEDULERS),
        ("cost_model", options.COST_MODELS),
    ):
        assert get_args(fields[name].annotation) == vocab, name
    conv = RunConfig.model_fields["lam_convention"].annotation
    assert get_args(conv) == options.ALPHA_CONVENTIONS
    assert set(options.RUN_SOLVERS) <= set(options.SOLVERS)


# ---------------------------------------------------------------------------
# the choices: one vocabulary of knob names


def test_solver_choices_refuses_a_knob_that_does_not_exist():
    """A misspelt key in a hand-built dict was silently ignored (its knob took the
    plan's default); the one builder refuses it."""
    assert options.solver_choices(solver="cg", tol=None) == {"solver": "cg", "tol": None}
    with pytest.raises(TypeError, match=r"not solver knobs: \['precondtioner'\]"):
        options.solver_choices(precondtioner="jacobi")


def test_plan_fit_reads_every_knob():
    """The tree's knobs reach the plan as its options (options.solver_options), the
    fit's own by key."""
    from pipeline.plan import fit_plan as plan

    # plan_fit resolves the device, then plans the solver (_plan_solver)
    src = inspect.getsource(plan.plan_fit) + inspect.getsource(plan._plan_solver)
    assert "opts = solver_options(choices)" in src and "options=opts" in src
    assert "solver_options(choices).device" in inspect.getsource(plan.plan_fit)
    tree = options.knobs(spelt_by="plan")
    unread = [k for k in options.SOLVER_KNOBS if k not in tree and f'"{k}"' not in src]
    # KernelRidge passes sample_weight (its docstring says the in-memory rule reads it);
    # plan_fit has not read it since sample weights went out of core (b6a175f)
    assert unread == ["sample_weight"], f"plan_fit does not read {unread}"
    assert set(tree) <= set(options.SOLVER_KNOBS)


def test_the_plan_holds_the_options_it_was_given():
    """``plan.options`` is the one reading of the choices (checked and typed), whatever
    the plan decided; the decisions are the plan's own fields."""
    from pipeline.kernels import make_kernel
    from pipeline.plan.fit_plan import Resources, plan_fit

    inf = float("inf")
    res = Resources(inf, inf, in_memory=False)
    choices = options.solver_choices(
        solver="auto", alpha=0.1, tol=np.float32(1e-5), max_iter=np.int64(7), rank=None,
        matvec="matrix_free", factor_dtype="auto", keep_gram=np.True_, random_state=5,
        checkpoint_every=3, cost_model="simple",
    )  # fmt: skip
    plan, _ = plan_fit(50_000, 3, make_kernel("rbf"), res, choices)
    o = plan.options
    assert o == options.solver_options(choices)
    assert (o.solver, o.matvec, o.factor_dtype) == ("auto", "recompute", "auto")  # as asked
    assert plan.solver in ("cholesky", "cg") and plan.factor_dtype in ("float64", "float32")
    assert (o.tol, o.max_iter, o.random_state) == (float(np.float32(1e-5)), 7, 5)
    assert o.rank == options.SolverOptions().rank  # None: the tree's default
    assert [type(v) for v in (o.tol, o.max_iter, o.keep_gram)] == [float, int, bool]
    assert (o.cost_model, o.checkpoint_every) == ("simple", 3)
    for bad, message in (
        ({"solver": "lu"}, "solver='lu' is not valid"),
        ({"matvec": "sideways"}, "matvec='sideways' is not valid"),
        ({"factor_dtype": "half"}, "factor_dtype='half' is not valid"),
    ):
        with pytest.raises(ValueError, match=message):
            options.solver_options(bad)
        with pytest.raises(ValueError, match=message):
            plan_fit(100, 3, None, res, bad)


def test_random_state_is_a_knob_of_the_tree():
    """The seed had its own default in FitPlan and in plan_fit; now the tree's."""
    from pipeline.constants import DEFAULT_RANDOM_STATE
    from pipeline.plan.fit_plan import FitPlan, Resources, plan_fit

    k = options.knobs()["random_state"]
    assert k.default == DEFAULT_RANDOM_STATE and k.spelt_by == {"plan"}
    assert FitPlan().options.random_state == DEFAULT_RANDOM_STATE
    res = Resources(float("inf"), float("inf"), in_memory=False)
    plan, _ = plan_fit(100, 3, None, res, options.solver_choices(solver="cg", random_state=9))
    assert plan.options.random_state == 9 and plan.to_dict()["random_state"] == 9


def test_no_hand_built_choices_dict_is_left():
    """The callers of plan_fit build their choices with options.solver_choices."""
    offenders = []
    for path in sorted(ROOT.rglob("*.py")):
        if path.name == "options.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Dict):
                keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
                if {"solver", "tol", "max_iter", "preconditioner"} <= keys:
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not offenders


def test_options_imports_only_the_constants_and_the_standard_library():
    """The tree's defaults are the measured constants; nothing else of the package."""
    tree = ast.parse((ROOT / "options.py").read_text())
    stdlib = ("__future__", "typing", "dataclasses", "collections.abc")
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            names = [a.name for a in node.names]
            assert mod in stdlib, mod
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
            assert names == ["pipeline.constants"], f"options.py imports {names}"


# ---------------------------------------------------------------------------
# the option tree: every spelling of the solver knobs derives from SolverOptions


def _tree():
    return options.knobs()


def test_the_tree_has_a_type_default_and_doc_line_per_knob():
    assert list(_tree()) == [f.name for f in dataclasses.fields(options.SolverOptions)]
    default = options.SolverOptions()
    for name, k in _tree().items():
        assert k.type in (str, int, float, bool), name
        assert getattr(default, name) == k.default, name
        assert k.doc and "\n" not in k.doc, name
        if k.choices is not None:
            assert k.default in k.choices and k.type is str, name
        assert k.spelt_by <= {"config", "estimator", "plan"} and k.spelt_by, name
    with pytest.raises(dataclasses.FrozenInstanceError):
        default.tol = 0.1


def test_every_solver_config_field_comes_from_the_tree():
    """Same fields in the same order (the order of "valid keys here" and of the stage
    fingerprint's dump), same defaults, allowed values, bounds and doc."""
    from pipeline.stages.config import SolverConfig

    want = {k.config_name or n: k for n, k in options.knobs(spelt_by="config").items()}
    fields = SolverConfig.model_fields
    assert list(fields) == list(want)
    for name, k in want.items():
        f = fields[name]
        assert f.default == k.default and type(f.default) is type(k.default), name
        choices = k.config_choices or k.choices
        # a knob whose default is None (not set: the plan chooses) is optional in the config
        typ = k.type if k.default is not None else k.type | None
        assert (get_args(f.annotation) if choices else f.annotation) == (choices or typ), name
        bounds = {
            type(m).__name__.lower(): getattr(m, type(m).__name__.lower()) for m in f.metadata
        }
        want_bounds = {b: getattr(k, b) for b in ("gt", "ge", "lt") if getattr(k, b) is not None}
        assert bounds == want_bounds, name
        assert f.description == k.doc, name
    assert SolverConfig().options() == options.SolverOptions()


def test_every_estimator_solver_param_comes_from_the_tree():
    """KernelRidge's solver parameters are the tree's "estimator" knobs (a knob added to
    the tree for the estimators fails here until ``__init__`` takes it), with the tree's
    default, or None where the estimators leave it unset (``get_params`` as before)."""
    from pipeline import KernelRidge
    from pipeline.models.estimator import SOLVER_PARAMS

    params = KernelRidge().get_params()
    est = options.knobs(spelt_by="estimator")
    assert SOLVER_PARAMS == est
    assert set(est) <= set(params)
    # no knob of the tree taken unannounced; random_state is scikit-learn's (an int, a
    # RandomState or None), whose seed (validation.check_random_seed) is the tree's knob
    assert set(_tree()) & set(params) == set(est) | {"random_state"}
    assert "random_state" not in est and params["random_state"] is None
    for name, k in est.items():
        assert params[name] == (None if k.unset else k.default), name
        assert type(params[name]) is (type(None) if k.unset else k.type), name
    assert {n for n, k in est.items() if k.unset} == {"max_iter", "rank", "n_centers"}


def test_the_out_of_core_fit_takes_the_trees_knobs_as_they_are(tmp_path):
    """``fit_out_of_core`` (what ``KernelRidge._solver_knobs`` feeds) restated eight knobs
    with the tree's defaults; it takes them as they are now, for ``solver_choices``
    (checked before any work), and the plan it runs holds them."""
    from pipeline.fit import fit_out_of_core
    from pipeline.kernels import make_kernel

    sig = inspect.signature(fit_out_of_core).parameters
    assert set(sig) & set(_tree()) == {"solver"}  # its own: "cholesky", "cg" or "auto"
    assert sig["knobs"].kind is inspect.Parameter.VAR_KEYWORD
    X = np.random.default_rng(0).normal(size=(40, 2))
    y, k = X[:, 0], make_kernel("rbf")
    knobs = {"tol": 1e-9, "preconditioner": "jacobi", "random_state": 3, "checkpoint_every": 2}
    res = fit_out_of_core(X, y, k, 0.1, solver="cg", progress=False, **knobs)
    assert {n: getattr(res.plan.options, n) for n in knobs} == knobs
    assert res.plan.solver == "cg" and res.info["converged"]
    with pytest.raises(TypeError, match=r"not solver knobs: \['precondtioner'\]"):
        fit_out_of_core(X, y, k, 0.1, solver="cg", precondtioner="jacobi")
    store = tmp_path / "store"
    with pytest.raises(ValueError, match="matvec='sideways' is not valid"):
        fit_out_of_core(X, y, k, 0.1, solver="cg", store=str(store), matvec="sideways")
    assert not store.exists()  # refused before the store directory was made


def test_a_knob_added_to_the_tree_appears_in_the_config_and_the_estimator_checks(monkeypatch):
    """The config's fields and the estimator's checks are generated from the tree: a
    new knob there is a config field (with its choices and default) and is checked."""
    from pydantic import ValidationError, create_model

    from pipeline import KernelRidge
    from pipeline.models import estimator
    from pipeline.stages import config

    @dataclasses.dataclass(frozen=True)
    class Wider(options.SolverOptions):
        sweep: str = options._knob("up", "a new knob", choices=("up", "down"))

    fields = config.solver_config_fields(Wider)
    assert list(fields) == [*config.SolverConfig.model_fields, "sweep"]
    Model = create_model("Wider", __base__=config._Model, **fields)
    assert Model().sweep == "up" and Model(sweep="down").sweep == "down"
    with pytest.raises(ValidationError, match="'up' or 'down'"):
        Model(sweep="sideways")

    monkeypatch.setattr(estimator, "SOLVER_PARAMS", options.knobs(Wider, spelt_by="estimator"))
    est = KernelRidge()
    est.sweep = "sideways"
    with pytest.raises(ValueError, match=r"sweep='sideways' is not valid; choose one of \['up'"):
        est.fit(np.ones((4, 1)), np.ones(4))
    est.sweep, est._seed = "down", 0  # and the plan's choices take it
    assert est._solver_knobs()["sweep"] == "down"


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("tol", 1.0, r"tol must be a float in \(0, 1\), e.g. 1e-6, got 1.0"),
        ("tol", True, r"tol must be a float in \(0, 1\), e.g. 1e-6, got True"),
        ("max_iter", 0, r"max_iter must be a positive integer or None, got 0"),
        ("rank", 2.5, r"rank must be a positive integer or None, got 2.5"),
        ("keep_gram", 1, r"keep_gram must be True or False, got 1"),
        ("solver", "lu", r"solver='lu' is not valid; choose one of \['auto', 'dense'"),
        ("cg_precision", "x", r"cg_precision='x' is not valid; choose one of \['auto', 'float64'"),
        ("factor_dtype", "x", r"factor_dtype='x' is not valid; choose one of \['float64', 'float"),
    ],
)
def test_the_estimators_checks_are_the_trees_with_the_old_messages(name, value, message):
    from pipeline import KernelRidge

    with pytest.raises(ValueError, match=f"^{message}"):
        KernelRidge(**{name: value}).fit(np.ones((4, 1)), np.ones(4))


def test_fit_plan_defaults_are_the_trees():
    """The plan's options default to the tree; the knobs it decides (never "auto" in a
    plan) have their decided defaults, the rest of the tree's knobs are no plan fields."""
    from pipeline.plan.fit_plan import FitPlan

    plan = FitPlan()
    assert plan.options == options.SolverOptions()
    decided = {"solver": "cholesky", "matvec": None, "cg_precision": "float64",
               "factor_dtype": options.SolverOptions().factor_dtype,
               # the rank the plan resolves (the tree's is None: not set, chosen by the plan)
               "rank": C.DEFAULT_RANK,
               "device": "cpu"}  # fmt: skip
    own = {f.name for f in dataclasses.fields(FitPlan)}
    assert own & set(_tree()) == set(decided)
    for name, want in decided.items():
        assert getattr(plan, name) == want, name


def test_plan_fit_takes_the_trees_options_object():
    from pipeline.kernels import make_kernel
    from pipeline.plan.fit_plan import Resources, plan_fit

    inf = float("inf")
    res = Resources(inf, inf, in_memory=False)
    opts = options.SolverOptions(solver="cg", tol=1e-8, preconditioner="jacobi", matvec="recompute")
    k = make_kernel("rbf")
    by_object, _ = plan_fit(300, 3, k, res, opts)
    by_mapping, _ = plan_fit(300, 3, k, res, opts.choices())
    by_keys, _ = plan_fit(
        300, 3, k, res, options.solver_choices(solver="cg", tol=1e-8, preconditioner="jacobi",
                                               matvec="recompute", rank=None)
    )  # fmt: skip
    assert by_object == by_mapping == by_keys
    assert (by_object.solver, by_object.options.tol, by_object.options.preconditioner) == (
        "cg", 1e-8, "jacobi",
    )  # fmt: skip
    assert options.solver_options({"tol": None, "alpha": 2.0}) == options.SolverOptions()


def test_the_solve_stage_takes_the_configs_options_and_its_own_override():
    """``krr run`` with ``factor_dtype: auto`` and ``keep_gram: false`` failed in the solve
    stage (exit 4) with "solver_choices() got multiple values for keyword argument
    'factor_dtype'": the stage passes the Gram's dtype for the in-place factor on top of
    the hand-listed config knobs. The stage's choices are now the config's options,
    the stage's own values overriding them."""
    from pipeline.stages.config import SolverConfig
    from pipeline.stages.solve import stage_plan

    solver = SolverConfig(method="cholesky", factor_dtype="auto", keep_gram=False)
    plan, _ = stage_plan(solver, 100, 3, alpha=0.1, factor_dtype="float32")
    assert (plan.solver, plan.factor_dtype) == ("cholesky", "float32")
    assert plan.options.keep_gram is False
    plan, _ = stage_plan(SolverConfig(method="cg", tol=1e-9, checkpoint_every=3), 100, 3)
    assert (plan.options.tol, plan.options.checkpoint_every) == (1e-9, 3)


# ---------------------------------------------------------------------------
# the CV option group: KernelRidgeCV's search knobs and the config's cv section
# derive from CvOptions (they were spelt twice, with the preconditioners in two orders
# and kernel_dtype, screen_tol, screen_top, max_iter and rank unchecked by the estimator)

#: the cv section's keys in their historical order ("valid keys here", the stage's dump)
CV_SECTION_ORDER = [
    "alphas", "param_grid", "folds", "shuffle", "scoring", "solver", "eigen_mode",
    "random_state", "tol", "max_iter", "preconditioner", "rank", "n_jobs",
    "max_search_seconds", "kernel_dtype", "screen_tol", "screen_top", "screen_centers", "subsample", "refine",
    "n_centers", "centers",
]  # fmt: skip


def test_the_cv_tree_has_a_type_default_and_doc_line_per_knob():
    from pipeline.constants import CV_TOL

    tree = options.knobs(options.CvOptions)
    assert list(tree) == [f.name for f in dataclasses.fields(options.CvOptions)]
    default = options.CvOptions()
    for name, k in tree.items():
        assert k.type in (str, int, float, bool), name
        assert getattr(default, name) == k.default, name
        assert k.doc and "\n" not in k.doc, name
        if k.choices is not None:
            assert k.default in k.choices and k.type is str, name
        assert k.unset == (k.default is None), name
        assert k.spelt_by == {"config", "estimator"}, name
    assert default.tol == CV_TOL and default.screen_top == 3
    assert (options.CV_PRECONDITIONERS, options.CV_SOLVERS[:3]) == (
        ("nystrom", "adaptive", "none"), ("auto", "band", "eigen"),
    )  # fmt: skip
    with pytest.raises(dataclasses.FrozenInstanceError):
        default.tol = 0.1
    assert options.knobs() == options.knobs(options.SolverOptions)  # the default group


def test_every_cv_config_field_comes_from_the_tree():
    """The cv section: its own fields and the tree's, in the historical order, with the
    tree's defaults, allowed values, bounds and docs; null where the default is None or
    null turns the knob off (screen_tol)."""
    from pipeline.stages.config import CvConfig

    fields = CvConfig.model_fields
    assert list(fields) == CV_SECTION_ORDER
    for name, k in options.knobs(options.CvOptions, spelt_by="config").items():
        f = fields[name]
        assert f.default == k.default and type(f.default) is type(k.default), name
        ann = f.annotation
        if k.default is None or k.off:
            assert type(None) in get_args(ann), name
            ann = next(a for a in get_args(ann) if a is not type(None))
        assert (get_args(ann) if k.choices else ann) == (k.choices or k.type), name
        bounds = {
            type(m).__name__.lower(): getattr(m, type(m).__name__.lower()) for m in f.metadata
        }
        want_bounds = {b: getattr(k, b) for b in ("gt", "ge", "lt") if getattr(k, b) is not None}
        assert bounds == want_bounds, name
        assert f.description == k.doc, name
    dump = CvConfig(alphas=[1.0]).model_dump()
    assert {n: dump[n] for n in options.knobs(options.CvOptions)} == dataclasses.asdict(
        options.CvOptions()
    )
    assert dump["random_state"] == 0 and CvConfig(alphas=[1.0], max_iter=None).max_iter is None
    # screening is on by default (issue #45); null turns it off
    assert [n for n, k in options.knobs(options.CvOptions).items() if k.off] == [
        "screen_tol",
        "screen_centers",
    ]
    assert dump["screen_tol"] == 1e-3 and dump["preconditioner"] == "adaptive"
    assert CvConfig(alphas=[1.0], screen_tol=None).screen_tol is None


def test_every_search_param_comes_from_the_tree():
    """KernelRidgeCV's search knobs are the tree's "estimator" knobs, with its defaults
    (``get_params`` as before)."""
    from pipeline import KernelRidgeCV
    from pipeline.models.selection.choice import CV_PARAMS, EIGEN_MODES, SOLVERS

    params = KernelRidgeCV().get_params()
    est = options.knobs(options.CvOptions, spelt_by="estimator")
    assert CV_PARAMS == est and set(est) <= set(params)
    for name, k in est.items():
        assert params[name] == k.default and type(params[name]) is type(k.default), name
    assert (SOLVERS, EIGEN_MODES) == (options.CV_SOLVERS, options.CV_EIGEN_MODES)


def test_a_knob_added_to_the_cv_tree_appears_in_the_config_and_the_search_checks(monkeypatch):
    from pydantic import ValidationError, create_model

    from pipeline import KernelRidgeCV
    from pipeline.models.selection import choice
    from pipeline.stages import config

    @dataclasses.dataclass(frozen=True)
    class Wider(options.CvOptions):
        sweep: str = options._knob("up", "a new knob", choices=("up", "down"),
                                   spelt_by=("config", "estimator"))  # fmt: skip

    fields = config.cv_config_fields(Wider)
    assert list(fields) == [*CV_SECTION_ORDER, "sweep"]
    Model = create_model("Wider", __base__=config._Model, **fields)
    assert Model(alphas=[1.0]).sweep == "up"
    with pytest.raises(ValidationError, match="'up' or 'down'"):
        Model(alphas=[1.0], sweep="sideways")

    monkeypatch.setattr(choice, "CV_PARAMS", options.knobs(Wider, spelt_by="estimator"))
    est = KernelRidgeCV()
    est.sweep = "sideways"
    with pytest.raises(ValueError, match=r"^sweep='sideways' is not valid; choose one of \('up'"):
        est.fit(np.ones((4, 1)), np.ones(4))


def _no_search(monkeypatch):
    """Any search work fails the test: the refusals come first."""
    import pipeline.models.selection.search as search

    def boom(*a, **k):
        raise AssertionError("the search started before its options were checked")

    monkeypatch.setattr(search, "choose_search", boom)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        # the search's checks before the tree (the messages are pinned)
        ("solver", "lu", r"solver='lu' is not valid; choose one of \('auto', 'band', 'eigen'"),
        ("eigen_mode", "x", r"eigen_mode='x' is not valid; choose one of \('auto', 'lgo', 'fold'\)$"),
        ("tol", 1.0, r"tol must be a float in \(0, 1\), e.g. 1e-6, got 1.0$"),
        ("tol", True, r"tol must be a float in \(0, 1\), e.g. 1e-6, got True$"),
        # the tree's knobs that the search did not check before any work
        ("preconditioner", "jacobi",
         r"preconditioner='jacobi' is not supported by the CV search; use 'nystrom', "
         r"'adaptive' or 'none'$"),
        ("kernel_dtype", "float16", r"kernel_dtype='float16' is not valid; choose one of "
                                    r"\('auto', 'float32', 'float64'\)$"),
        ("max_iter", 0, r"max_iter must be a positive integer or None, got 0$"),
        ("rank", 2.5, r"rank must be a positive integer or None, got 2.5$"),
        ("screen_tol", 2.0, r"screen_tol must be a float in \(0, 1\), e.g. 1e-3, got 2.0$"),
        ("screen_top", 0, r"screen_top must be a positive integer, got 0$"),
        ("screen_top", None, r"screen_top must be a positive integer, got None$"),
    ],
)  # fmt: skip
def test_the_searchs_checks_are_the_trees_before_any_work(monkeypatch, name, value, message):
    from pipeline import KernelRidgeCV

    _no_search(monkeypatch)
    with pytest.raises(ValueError, match=f"^{message}"):
        KernelRidgeCV([1.0], **{"solver": "cg", name: value}).fit(np.ones((6, 1)), np.arange(6.0))


def test_the_search_takes_none_where_the_tree_leaves_a_knob_unset(monkeypatch):
    from pipeline import KernelRidgeCV

    X = np.random.default_rng(0).normal(size=(30, 2))
    m = KernelRidgeCV(
        [0.1], cv=3, solver="eigen", max_iter=None, rank=None, screen_tol=None, n_jobs=-1,
        max_search_seconds=None, tol=np.float32(1e-4),
    ).fit(X, X[:, 0])  # fmt: skip
    assert m.solver_ == "eigen"


def test_spelt_as_before_is_the_one_rule_for_changed_defaults():
    """Each view spells the defaults issue #45 changed as the ones they replaced, and
    leaves every other choice as given (the input untouched)."""
    from pipeline.options import spelt_as_before

    solver = {"method": "cg", "preconditioner": "adaptive", "rank": None}
    assert spelt_as_before("solve", solver) == {**solver, "preconditioner": "nystrom", "rank": 500}
    assert solver["preconditioner"] == "adaptive"
    named = {"method": "cg", "preconditioner": "adaptive", "rank": 900}
    assert spelt_as_before("solve", named) == named  # a named cap is another solve
    assert spelt_as_before("solve", {"preconditioner": "nystrom", "rank": None})["rank"] == 500
    assert spelt_as_before("solve", {"method": "cholesky"}) == {"method": "cholesky"}
    cv = {"solver": "cg", "preconditioner": "adaptive", "screen_tol": 1e-3, "rank": None}
    assert spelt_as_before("select", cv) == {**cv, "preconditioner": "nystrom", "screen_tol": None}
    assert spelt_as_before("select", {**cv, "screen_tol": 1e-2}) == {**cv, "screen_tol": 1e-2}
    est = {"preconditioner": "adaptive", "rank": None}
    assert spelt_as_before("estimator", est) == {"preconditioner": "nystrom", "rank": None}
    with pytest.raises(ValueError, match="view='fit' is not valid"):
        spelt_as_before("fit", {})


def test_named_knobs_leave_out_what_names_no_choice():
    """One rule for the run config's solve identity and a KernelRidge store's name."""
    from pipeline.options import named_knobs

    knobs = {"cg_precision": "auto", "device": "cpu", "n_centers": 9, "centers": "uniform",
             "rank": None}  # fmt: skip
    assert named_knobs(knobs, "cg") == {"rank": None}
    assert named_knobs(knobs, "nystrom") == {"n_centers": 9, "centers": "uniform", "rank": None}
    named = {"cg_precision": "mixed", "device": "cuda"}
    assert named_knobs(named, "cg") == named
    assert knobs["device"] == "cpu"  # the input untouched


def test_without_unnamed_is_the_one_rule_for_every_section():
    """A knob at the value that names no choice leaves the identity; any other value stays."""
    from pipeline.options import without_unnamed
    from pipeline.stages.config import PreprocessConfig

    assert without_unnamed({"a": None, "b": 1}, {"a": None}) == {"b": 1}
    assert without_unnamed({"a": 0, "b": 1}, {"a": None}) == {"a": 0, "b": 1}
    assert "ard_rows" not in PreprocessConfig().identity()
    assert PreprocessConfig(ard_rows=2000).identity()["ard_rows"] == 2000
