"""The solver options' vocabulary, the λ convention and the diagonal shift, defined once.

Every way of asking for a fit (``KernelRidge``'s parameters, ``krr run``'s ``solver``
section, the out-of-core fit, the CV refit) hands its choices to
:func:`pipeline.plan.fit_plan.plan_fit` under the names of :data:`SOLVER_KNOBS`, built by
:func:`solver_choices`; the allowed values of each categorical knob are the tuples below.

The λ convention: ``"sklearn"`` solves ``(K + λ I) α = y`` (scikit-learn's ``alpha``); ``"n_samples"`` solves
``(K + n λ I) α = y``. ``"n"`` is the old spelling of ``"n_samples"``, and the spelling
the solvers and model artifacts use (:func:`solver_convention`). :func:`diagonal_shift` is the one
computation of the diagonal shift.

This module imports only :mod:`pipeline.errors`, numpy and the standard library.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ALPHA_CONVENTIONS",
    "ALPHA_CONVENTION_ALIASES",
    "CG_PRECISIONS",
    "COST_MODELS",
    "FACTOR_DTYPES",
    "FACTOR_SCHEDULERS",
    "IN_MEMORY_SOLVERS",
    "MATVECS",
    "MATVEC_ALIASES",
    "OUT_OF_CORE_SOLVERS",
    "PRECONDITIONERS",
    "RUN_SOLVERS",
    "SOLVERS",
    "SOLVER_CONVENTIONS",
    "SOLVER_KNOBS",
    "normalize_alpha_convention",
    "normalize_matvec",
    "public_convention",
    "diagonal_shift",
    "solver_choices",
    "solver_convention",
]

# ---------------------------------------------------------------------------
# the λ convention

#: the conventions by their public names: "sklearn" solves (K + λI), "n_samples" (K + nλI)
ALPHA_CONVENTIONS = ("sklearn", "n_samples")
#: every accepted spelling -> its public name; ``n`` is the old spelling of ``n_samples``
ALPHA_CONVENTION_ALIASES = {"sklearn": "sklearn", "n_samples": "n_samples", "n": "n_samples"}
#: the conventions as the solvers (the tile Cholesky) and model artifacts spell them
SOLVER_CONVENTIONS = ("sklearn", "n")


def normalize_alpha_convention(value: str) -> str:
    """``"sklearn"`` or ``"n_samples"`` for any accepted spelling (``"n"`` is old)."""
    try:
        return ALPHA_CONVENTION_ALIASES[value]
    except (KeyError, TypeError):
        raise ValueError(
            f"alpha_convention={value!r} is not valid; choose 'sklearn' or 'n_samples'"
        ) from None


def public_convention(value: str) -> str:
    """The public name (``"sklearn"`` or ``"n_samples"``) of a convention as any writer
    spelt it: ``"n_samples"`` for ``"n_samples"`` and ``"n"``, ``"sklearn"`` for anything
    else (a model artifact's ``regularization_convention`` is any non-empty string)."""
    return "n_samples" if value in ("n_samples", "n") else "sklearn"


def solver_convention(alpha_convention: str) -> str:
    """The solvers' spelling (``"sklearn"`` or ``"n"``) of an alpha convention: ``"n"``
    for ``"n_samples"`` and ``"n"``, ``"sklearn"`` for anything else."""
    return "n" if alpha_convention in ("n_samples", "n") else "sklearn"


def diagonal_shift(lam: Any, n: Any, convention: str) -> Any:
    """The diagonal shift of ``K + shift·I`` for ridge strength ``lam``: ``lam`` itself
    under ``"sklearn"``, ``lam * n`` under ``"n_samples"`` (or its spelling ``"n"``).

    The one computation of the shift, for a float or an array of them (one per target).
    ``lam`` and ``n`` are used as given (no conversion): the product is the one IEEE
    multiplication every caller did before, so the shift is the same to the last bit.
    The caller checks ``lam`` (finite, > 0 or >= 0) with its own message.

    Parameters
    ----------
    lam : float or ndarray
        The ridge strength λ (scikit-learn's ``alpha``).
    n : int or float
        The number of training rows (or the sum of the sample weights).
    convention : {"sklearn", "n_samples", "n"}

    Raises
    ------
    ValueError
        ``convention`` is none of those.
    """
    if convention == "sklearn":
        return lam
    if convention in ("n_samples", "n"):
        return lam * n
    raise ValueError(
        f"alpha_convention={convention!r} is not valid; choose 'sklearn' or 'n_samples'"
    )


# ---------------------------------------------------------------------------
# the solver knobs and their values

#: ``KernelRidge(solver=...)`` and :func:`~pipeline.plan.fit_plan.plan_fit`'s ``solver``
IN_MEMORY_SOLVERS = ("auto", "dense", "primal")
OUT_OF_CORE_SOLVERS = ("cholesky", "cg")
SOLVERS = IN_MEMORY_SOLVERS + OUT_OF_CORE_SOLVERS
#: ``krr run``'s ``solver.method`` (always out of core)
RUN_SOLVERS = ("cholesky", "cg", "auto")
#: CG's product with K
MATVECS = ("auto", "stored", "recompute")
#: every accepted spelling of :data:`MATVECS` -> its name; old spellings are mapped
MATVEC_ALIASES = {
    "auto": "auto",
    "stored": "stored",
    "recompute": "recompute",
    "matrix_free": "recompute",
    "matrix-free": "recompute",
    "free": "recompute",
}
#: CG's preconditioner (``adaptive``: RPCholesky Nyström whose rank grows)
PRECONDITIONERS = ("none", "jacobi", "nystrom", "adaptive")
#: CG's product precision: ``mixed`` is float32 kernel entries with float64 refinement
CG_PRECISIONS = ("auto", "float64", "mixed")
#: the stored Cholesky factor's dtype
FACTOR_DTYPES = ("float64", "float32", "auto")
#: where factor tiles run
FACTOR_SCHEDULERS = ("auto", "threads", "dask")
#: how ``auto`` predicts the solvers' seconds (:mod:`pipeline.plan.calibrated`)
COST_MODELS = ("calibrated", "simple")

#: the names of the solver knobs, as :func:`~pipeline.plan.fit_plan.plan_fit` reads them
#: (``kernel_copies`` and ``sample_weight`` inform the in-memory rule)
SOLVER_KNOBS = (
    "solver",
    "alpha",
    "alpha_convention",
    "block_size",
    "tol",
    "max_iter",
    "preconditioner",
    "rank",
    "matvec",
    "cg_precision",
    "checkpoint_every",
    "jitter",
    "factor_dtype",
    "factor_scheduler",
    "cost_model",
    "keep_gram",
    "check_disk",
    "kernel_dtype",
    "random_state",
    "store",
    "kernel_copies",
    "sample_weight",
)


def normalize_matvec(value: str) -> str:
    """``"stored"``, ``"recompute"`` or ``"auto"`` for any accepted spelling."""
    try:
        return MATVEC_ALIASES[value]
    except (KeyError, TypeError):
        raise ValueError(
            f"matvec={value!r} is not valid; choose 'stored', 'recompute' or 'auto'"
        ) from None


def solver_choices(**choices: Any) -> dict[str, Any]:
    """The user's solver choices as :func:`~pipeline.plan.fit_plan.plan_fit` takes them.

    Every key must be one of :data:`SOLVER_KNOBS` (a misspelt key would otherwise be
    ignored and its knob silently take the plan's default); a value of None takes
    the plan's default.

    Raises
    ------
    TypeError
        A key that is not a solver knob.
    """
    unknown = sorted(set(choices) - set(SOLVER_KNOBS))
    if unknown:
        raise TypeError(f"not solver knobs: {unknown}; the knobs are {list(SOLVER_KNOBS)}")
    return dict(choices)
