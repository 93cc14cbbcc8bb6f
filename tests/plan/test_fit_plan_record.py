"""The fit plan's record (``plan.json``, the solve stage's outputs, the manifest):
``FitPlan.to_dict`` keeps the keys, their order and their values as they were when each
knob was a field of the plan (issue #43: the plan now holds the option tree,
``plan.options``, and only what it decides), and ``FitPlan.from_dict`` reads it back."""

from __future__ import annotations

import json

import pytest

import pipeline.constants as C
from pipeline.kernels import make_kernel
from pipeline.options import SolverOptions, solver_choices
from pipeline.plan.fit_plan import RECORD_KEYS, FitPlan, Resources, plan_fit

#: the record's keys in the order every recorded plan has them (plan.json is compared as
#: bytes by a resume: the order is part of the record)
RECORDED = [
    "solver", "alpha", "alpha_convention", "block_size", "factor_dtype", "kernel_dtype",
    "cg_precision", "preconditioner", "rank", "tol", "max_iter", "matvec", "store",
    "random_state", "checkpoint_every", "jitter", "factor_scheduler", "keep_gram",
    "check_disk", "factor_dtype_auto",
]  # fmt: skip

#: FitPlan()'s record when every knob was a field of its own (before the option tree)
DEFAULT_RECORD = {
    "solver": "cholesky", "alpha": 1.0, "alpha_convention": C.DEFAULT_ALPHA_CONVENTION,
    "block_size": C.DEFAULT_BLOCK_SIZE, "factor_dtype": C.DEFAULT_FACTOR_DTYPE,
    "kernel_dtype": C.DEFAULT_KERNEL_DTYPE, "cg_precision": "float64",
    "preconditioner": C.DEFAULT_PRECONDITIONER, "rank": C.DEFAULT_RANK, "tol": C.DEFAULT_TOL,
    "max_iter": C.DEFAULT_MAX_ITER, "matvec": None, "store": None,
    "random_state": C.DEFAULT_RANDOM_STATE, "checkpoint_every": C.DEFAULT_CHECKPOINT_EVERY,
    "jitter": False, "factor_scheduler": "auto", "keep_gram": True, "check_disk": True,
    "factor_dtype_auto": False,
}  # fmt: skip

INF = float("inf")
RES = Resources(INF, INF, in_memory=False)


def test_the_record_keeps_its_keys_order_and_defaults():
    assert list(RECORD_KEYS) == RECORDED
    rec = FitPlan().to_dict()
    assert list(rec) == RECORDED
    assert json.dumps(rec) == json.dumps(DEFAULT_RECORD)  # same keys, order and values


@pytest.mark.parametrize(
    "choices",
    [
        {"solver": "cholesky", "alpha": 0.1, "keep_gram": False, "check_disk": False},
        {"solver": "cg", "alpha": 1e-3, "tol": 1e-9, "rank": 10_000, "random_state": 4,
         "preconditioner": "jacobi", "checkpoint_every": 7, "matvec": "free"},
        {"solver": "auto", "alpha": 1e-2, "factor_dtype": "auto", "jitter": True,
         "factor_scheduler": "threads", "store": "/tmp/s", "block_size": 512},
        {"solver": "dense", "alpha": 2.0, "alpha_convention": "n"},
    ],
)  # fmt: skip
def test_a_record_reads_back_to_the_same_record(choices):
    plan, _ = plan_fit(3000, 4, make_kernel("rbf"), RES, solver_choices(**choices))
    rec = plan.to_dict()
    assert list(rec) == RECORDED
    again = FitPlan.from_dict(json.loads(json.dumps(rec)))
    assert json.dumps(again.to_dict()) == json.dumps(rec)
    # what the fit runs with comes back: the decisions and the options it reads
    o, back = plan.options, again.options
    for name in ("tol", "max_iter", "preconditioner", "random_state", "checkpoint_every",
                 "jitter", "factor_scheduler", "keep_gram", "check_disk"):  # fmt: skip
        assert getattr(back, name) == getattr(o, name), name
    assert (again.solver, again.matvec, again.rank, again.block_size) == (
        plan.solver, plan.matvec, plan.rank, plan.block_size,
    )  # fmt: skip


def test_a_record_of_another_version_still_reads():
    """A key the plan no longer records is ignored; one it gained takes its default."""
    rec = {**DEFAULT_RECORD, "solver": "cg", "tol": 1e-8, "retired_knob": 3}
    del rec["check_disk"]
    plan = FitPlan.from_dict(rec)
    assert (plan.solver, plan.options.tol, plan.options.check_disk) == ("cg", 1e-8, True)
    assert plan.options == SolverOptions(tol=1e-8)  # the asks it does not keep: defaults
