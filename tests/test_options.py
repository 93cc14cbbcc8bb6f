"""``pipeline.options``: the solver knobs' vocabulary, the λ convention and the diagonal
shift, each defined once.

Issue #43 ("one concept, one home"): the 14 solver knobs were spelled in three hand-built
``choices`` dicts (``estimator``, ``out_of_core``, ``stages.solve``; a fourth in the CV
refit), the λ convention was translated in 7 places and the shift computed in 4 (one of
them inside the tile Cholesky). The shift must stay the same to the last bit: it is the
same IEEE product as before, which these tests compare against the old formulas.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path
from typing import get_args

import numpy as np
import pytest

import pipeline
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
    ("pipeline.models.estimator", "SOLVERS", options.SOLVERS),
    ("pipeline.models.estimator", "MATVECS", options.MATVECS),
]


@pytest.mark.parametrize(
    ("module", "name", "one"),
    SAME_OBJECT,
    # a function by its name, not its address: the same ids in every process (pytest-xdist)
    ids=lambda v: v.__name__ if callable(v) else str(v)[:40],
)
def test_old_names_are_the_one_definition(module, name, one):
    assert getattr(importlib.import_module(module), name) is one


def test_orders_kept_for_messages_have_the_same_values():
    """Two places list a knob's values in their own order in a message (kept byte for
    byte): the values are the vocabulary's."""
    from pipeline.models import estimator
    from pipeline.models.selection import choice
    from pipeline.stages.config import SolverConfig

    assert sorted(estimator.PRECONDITIONERS) == sorted(options.PRECONDITIONERS)
    assert choice.CONVENTIONS == tuple(options.ALPHA_CONVENTION_ALIASES)
    fields = SolverConfig.model_fields
    assert sorted(get_args(fields["matvec"].annotation)) == sorted(options.MATVECS)
    assert sorted(get_args(fields["cost_model"].annotation)) == sorted(options.COST_MODELS)


def test_config_literals_are_the_vocabulary():
    from pipeline.stages.config import RunConfig, SolverConfig

    fields = SolverConfig.model_fields
    for name, vocab in (
        ("method", options.RUN_SOLVERS),
        ("preconditioner", options.PRECONDITIONERS),
        ("cg_precision", options.CG_PRECISIONS),
        ("factor_dtype", options.FACTOR_DTYPES),
        ("factor_scheduler", options.FACTOR_SCHEDULERS),
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
    from pipeline.plan import fit_plan as plan

    src = inspect.getsource(plan.plan_fit)
    unread = [k for k in options.SOLVER_KNOBS if f'"{k}"' not in src]
    # KernelRidge passes sample_weight (its docstring says the in-memory rule reads it);
    # plan_fit has not read it since sample weights went out of core (b6a175f)
    assert unread == ["sample_weight"], f"plan_fit does not read {unread}"


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


def test_options_imports_only_errors_and_the_standard_library():
    tree = ast.parse((ROOT / "options.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            assert mod in ("__future__", "typing") or mod == "pipeline.errors", mod
        elif isinstance(node, ast.Import):
            assert all(a.name in ("numpy",) for a in node.names)
