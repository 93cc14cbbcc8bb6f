"""The solver options' vocabulary, the λ convention and the diagonal shift, defined once.

Every way of asking for a fit (``KernelRidge``'s parameters, ``krr run``'s ``solver``
section, the out-of-core fit, the CV refit, the in-memory reference) hands its choices to
:func:`pipeline.plan.fit_plan.plan_fit` under the names of :data:`SOLVER_KNOBS`, built by
:func:`solver_choices`; the allowed values of each categorical knob are the tuples below.

The λ convention: ``"sklearn"`` solves ``(K + λ I) α = y`` (scikit-learn's ``alpha``); ``"n_samples"`` solves
``(K + n λ I) α = y``. ``"n"`` is the old spelling of ``"n_samples"``, and the spelling
the solvers and model artifacts use (:func:`solver_convention`). :func:`diagonal_shift` is the one
computation of the diagonal shift.

The option tree: :class:`SolverOptions` is the one definition of the solver knobs, each
field with its type, default, allowed values (or bounds) and one doc line
(:class:`Knob`, read with :func:`knobs`). The spellings derive from it:
:class:`pipeline.stages.config.SolverConfig`'s fields, ``KernelRidge``'s solver parameters'
defaults and checks, and :func:`~pipeline.plan.fit_plan.plan_fit`'s reading of the choices
(:func:`solver_options`: checked and typed), which the plan holds as it is
(``FitPlan.options``; the plan's own fields are what it decided).
:class:`CvOptions` is the same for the cross-validated search: ``KernelRidgeCV``'s
search knobs (defaults and checks) and :class:`pipeline.stages.config.CvConfig`'s
fields derive from it. A new knob is added here, once.

This module imports only :mod:`pipeline.constants` (the defaults' measured
values) and the standard library.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, get_args, get_type_hints

import pipeline.constants as C

__all__ = [
    "ALPHA_CONVENTIONS",
    "CV_EIGEN_MODES",
    "CV_KERNEL_DTYPES",
    "CV_PRECONDITIONERS",
    "CV_SOLVERS",
    "CvOptions",
    "Knob",
    "SolverOptions",
    "knobs",
    "solver_options",
    "ALPHA_CONVENTION_ALIASES",
    "CG_PRECISIONS",
    "COST_MODELS",
    "DEVICES",
    "FACTOR_DTYPES",
    "FACTOR_SCHEDULERS",
    "APPROXIMATE_SOLVERS",
    "IN_MEMORY_SOLVERS",
    "MATVECS",
    "MATVEC_ALIASES",
    "NYSTROM_CENTRES",
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
    "named_knobs",
    "without_unnamed",
    "spelt_as_before",
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
#: Nyström kernel ridge regression (FALKON): an approximation, chosen only when named
#: (``solver="auto"`` stays exact)
APPROXIMATE_SOLVERS = ("nystrom",)
SOLVERS = IN_MEMORY_SOLVERS + OUT_OF_CORE_SOLVERS + APPROXIMATE_SOLVERS
#: ``krr run``'s ``solver.method`` (always out of core)
RUN_SOLVERS = ("cholesky", "cg", "auto", "nystrom")
#: how ``solver="nystrom"`` chooses its centres: uniformly at random (FALKON's) or by
#: randomly pivoted Cholesky
NYSTROM_CENTRES = ("uniform", "rpcholesky")
#: CG's product with K (in the order ``krr run``'s config messages always listed them)
MATVECS = ("stored", "recompute", "auto")
#: every accepted spelling of :data:`MATVECS` -> its name; old spellings are mapped
MATVEC_ALIASES = {
    "auto": "auto",
    "stored": "stored",
    "recompute": "recompute",
    "matrix_free": "recompute",
    "matrix-free": "recompute",
    "free": "recompute",
}
#: CG's preconditioner (``adaptive``: RPCholesky Nyström whose rank grows); one list for
#: the config's and the estimator's messages (the estimator's listed "nystrom" first)
PRECONDITIONERS = ("none", "jacobi", "nystrom", "adaptive")
#: CG's product precision: ``mixed`` is float32 kernel entries with float64 refinement
CG_PRECISIONS = ("auto", "float64", "mixed")
#: the stored Cholesky factor's dtype
FACTOR_DTYPES = ("float64", "float32", "auto")
#: where factor tiles run
FACTOR_SCHEDULERS = ("auto", "threads", "dask")
#: where a fit's arithmetic runs: the host, an NVIDIA GPU through CuPy (the extra
#: ``[gpu]``), or the GPU when one is usable, else the host
#: (:func:`pipeline.engine.backend.resolve_device`, whose ``DEVICES`` are these)
DEVICES = ("cpu", "cuda", "auto")
#: how ``auto`` predicts the solvers' seconds (:mod:`pipeline.plan.calibrated`; in the
#: order ``krr run``'s config messages always listed them)
COST_MODELS = ("simple", "calibrated")

#: ``KernelRidgeCV(solver=...)`` and the config's ``cv.solver``: in memory (band, eigen,
#: dense), out of core (cholesky, cg), auto, or Nyström KRR (an approximation, only when
#: named: pipeline.models.selection.nystrom_cv)
CV_SOLVERS = ("auto", "band", "eigen", "dense", "cholesky", "cg", "nystrom")
#: the eigen strategy: one eigendecomposition of the full K ("lgo") or one per fold
CV_EIGEN_MODES = ("auto", "lgo", "fold")
#: the CV search's CG preconditioners (no "jacobi": one Nyström factor serves every fold)
CV_PRECONDITIONERS = ("nystrom", "adaptive", "none")
#: the kernel values of the CV search's inner CG solves ("auto": float32)
CV_KERNEL_DTYPES = ("auto", "float32", "float64")

# ---------------------------------------------------------------------------
# the option tree


@dataclass(frozen=True)
class Knob:
    """One option of the tree: its type, default, allowed values or bounds and doc line,
    and which spellings carry it.

    ``unset``: the estimators spell the default None (scikit-learn's "not set"; the
    plan then takes :attr:`default`), or the default is None in every spelling (the
    search chooses); :attr:`type` is then the type of a value that is set. ``config_name``/``config_choices``: the config's
    name and allowed values where they differ (``solver.method`` is always out of core).
    ``example``: the value a bound's message suggests.
    """

    name: str
    type: type
    default: Any
    doc: str
    choices: tuple[str, ...] | None = None
    aliases: Mapping[str, str] | None = None
    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    unset: bool = False
    example: str | None = None
    #: None turns the knob off (though its default is a value): the estimators take None
    #: and the config null (CvOptions.screen_tol)
    off: bool = False
    #: the spellings that carry it: "config" (SolverConfig), "estimator" (KernelRidge),
    #: "plan" (plan_fit's choices)
    spelt_by: frozenset[str] = frozenset({"config", "estimator", "plan"})
    config_name: str | None = None
    config_choices: tuple[str, ...] | None = None


def _knob(default: Any, doc: str, **spec: Any) -> Any:
    """A field of an option group: ``default`` and the rest of its :class:`Knob`."""
    if "spelt_by" in spec:
        spec["spelt_by"] = frozenset(spec["spelt_by"])
    return field(default=default, metadata={"knob": {"default": default, "doc": doc, **spec}})


_NOT_ESTIMATOR = ("config", "plan")


@dataclass(frozen=True)
class SolverOptions:
    """The solver knobs of one fit, one definition each.

    ``krr run``'s ``solver`` section (:class:`pipeline.stages.config.SolverConfig`, in this
    order), ``KernelRidge``'s solver parameters and :func:`~pipeline.plan.fit_plan.plan_fit`'s
    choices are derived from these fields; :func:`knobs` reads their :class:`Knob`.
    A plain record: each spelling checks its values with its own messages.
    """

    solver: str = _knob(
        "auto", "the solver: in memory (dense, primal), out of core (cholesky, cg), Nyström "
        "(nystrom: approximate, only when named), or auto",
        choices=SOLVERS, config_name="method", config_choices=RUN_SOLVERS,
    )  # fmt: skip
    # conjugate gradients (defaults: pipeline.constants)
    tol: float = _knob(
        C.DEFAULT_TOL, "CG's relative residual tolerance (1 is the residual of alpha = 0)",
        gt=0, lt=1, example="1e-6",
    )  # fmt: skip
    max_iter: int = _knob(C.DEFAULT_MAX_ITER, "CG's iteration limit", ge=1, unset=True)
    #: "adaptive": RPCholesky Nyström whose rank grows until it resolves K at the shift
    preconditioner: str = _knob(
        C.DEFAULT_PRECONDITIONER, "CG's preconditioner", choices=PRECONDITIONERS
    )
    #: None: :data:`~pipeline.constants.DEFAULT_RANK` for "nystrom"; for "adaptive" the cap
    #: that scales with N (:func:`pipeline.constants.adaptive_rank_cap`, and memory)
    rank: int | None = _knob(
        None, "rank of the Nyström preconditioner (a cap for adaptive; null: chosen)", ge=1,
        unset=True,
    )  # fmt: skip
    #: the estimators take scikit-learn's ``random_state`` (an int, a ``RandomState`` or
    #: None: :func:`pipeline.validation.check_random_seed`) and pass the seed it gives;
    #: ``krr run`` always seeds 0
    random_state: int = _knob(
        C.DEFAULT_RANDOM_STATE, "seed of the Nyström preconditioner's landmarks",
        spelt_by=("plan",),
    )  # fmt: skip
    #: ``stored`` (read the Gram), ``recompute`` (kernel tiles on the fly) or ``auto`` (by
    #: D and free disk); the config reads the old spellings ``matrix_free``, ``matrix-free``
    #: and ``free`` as ``recompute`` (the estimator refuses them)
    matvec: str = _knob("auto", "CG's product with K", choices=MATVECS, aliases=MATVEC_ALIASES)
    #: "mixed" computes kernel tiles in float32 inside a float64 iterative refinement (the
    #: answer still meets tol in float64); "auto": the cost model chooses
    #: (pipeline.plan.cg_variant)
    cg_precision: str = _knob("auto", "CG's product precision", choices=CG_PRECISIONS)
    checkpoint_every: int = _knob(
        C.DEFAULT_CHECKPOINT_EVERY, "CG's checkpoint interval (iterations)", ge=1,
        spelt_by=_NOT_ESTIMATOR,
    )  # fmt: skip
    #: by default a CG solve that stops at max_iter or breaks down fails the run (exit 4);
    #: the estimators warn and keep it (CGConvergenceWarning)
    allow_unconverged: bool = _knob(
        False, "accept an unconverged CG solve (the run summary says so)",
        spelt_by=("config",),
    )  # fmt: skip
    # cholesky
    jitter: bool = _knob(
        False,
        "retry a factor tile that is not positive definite with diagonal jitter",
        spelt_by=_NOT_ESTIMATOR,
    )
    #: "float32" halves the factor's bytes and runs the tile updates at float32 speed
    #: (diagonal tiles still factored in float64); alpha is then refined to double
    #: precision by CG preconditioned with the factor; "auto" chooses float32 when a
    #: subsample says it is safe and pays (pipeline.plan.factor_precision), redoing a
    #: failed float32 factor in float64 (in place: the Gram's dtype)
    factor_dtype: str = _knob(
        C.DEFAULT_FACTOR_DTYPE, "precision of the stored Cholesky factor", choices=FACTOR_DTYPES
    )
    #: see pipeline.linalg.cholesky.tile_cholesky: "auto" runs them on threads of this process,
    #: unless the cluster's workers run on other machines (then on the cluster, one task
    #: per tile); "dask" always on the cluster
    factor_scheduler: str = _knob(
        "auto", "where the Cholesky's factor tiles run", choices=FACTOR_SCHEDULERS,
        spelt_by=_NOT_ESTIMATOR,
    )  # fmt: skip
    #: false factors in place: the factor replaces the Gram tile by tile (the Gram's disk
    #: is needed once); a rerun with another lambda recomputes the replaced tiles from X
    keep_gram: bool = _knob(True, "keep the Gram beside the Cholesky factor")
    check_disk: bool = _knob(
        True, "check the free disk before the factorisation (InsufficientDiskError)",
        spelt_by=_NOT_ESTIMATOR,
    )  # fmt: skip
    #: "calibrated": the one cost model (pipeline.plan.calibrated: measured rates, and
    #: CG's iterations from λ and the preconditioner's residual measured on a subsample of
    #: the rows); "simple": the old λ-blind constants, crossing at 30,000 rows
    cost_model: str = _knob(
        "calibrated", "how solver auto predicts the two solvers' seconds", choices=COST_MODELS,
        spelt_by=_NOT_ESTIMATOR,
    )  # fmt: skip
    # the Nyström solver (solver="nystrom"; pipeline.linalg.nystrom_solve)
    n_centers: int = _knob(
        C.DEFAULT_N_CENTERS, "solver nystrom: the number of centres M (M >= N: the exact solver)",
        ge=1, unset=True,
    )  # fmt: skip
    centers: str = _knob(
        "uniform", "solver nystrom: how the centres are chosen", choices=NYSTROM_CENTRES
    )
    #: resolved once, by the plan (:func:`pipeline.engine.backend.resolve_device`): "cuda"
    #: without CuPy or a GPU is refused before any work, "auto" falls back to the CPU
    device: str = _knob(
        "cpu", "where the fit runs: the CPU, an NVIDIA GPU (cuda: the extra [gpu]), or auto",
        choices=DEVICES,
    )  # fmt: skip

    def choices(self) -> dict[str, Any]:
        """The knobs :func:`~pipeline.plan.fit_plan.plan_fit` reads, as its choices."""
        return {name: getattr(self, name) for name in knobs(spelt_by="plan")}


_CV = ("config", "estimator")


@dataclass(frozen=True)
class CvOptions:
    """The search knobs of a cross-validated search, one definition each.

    ``KernelRidgeCV``'s parameters of these names (their defaults and the checks of
    :func:`pipeline.models.selection.choice.check_params`) and ``krr run``'s ``cv``
    section (:class:`pipeline.stages.config.CvConfig`, in this order; the section's
    grid, splits, scorer and seed are its own) are derived from these fields. A default
    of None is "not set" in every spelling (the search chooses); ``screen_tol``'s None
    (:attr:`Knob.off`) is "no screening". A plain record, as :class:`SolverOptions`.
    """

    solver: str = _knob(
        "auto", "the search's solver: in memory (band, eigen, dense), out of core "
        "(cholesky, cg), auto, or nystrom (an approximation)", choices=CV_SOLVERS,
        spelt_by=_CV,
    )  # fmt: skip
    eigen_mode: str = _knob(
        "auto", "solver eigen: one eigendecomposition of K (lgo) or one per fold",
        choices=CV_EIGEN_MODES, spelt_by=_CV,
    )  # fmt: skip
    # conjugate gradients (solver cg); a search's solves are tighter than one fit's
    tol: float = _knob(
        C.CV_TOL, "CG's relative residual tolerance (1 is the residual of alpha = 0)",
        gt=0, lt=1, example="1e-6", spelt_by=_CV,
    )  # fmt: skip
    #: None: pipeline.constants.DEFAULT_MAX_ITER
    max_iter: int | None = _knob(None, "CG's iteration limit", ge=1, unset=True, spelt_by=_CV)
    #: "adaptive" (issue #45): its rank grows until it resolves K at the grid's smallest
    #: shift, capped by max(CV_RANK_FLOOR, CV_RANK_SCALE * n^(2/3)) and CV_PRECOND_BUDGET;
    #: "nystrom" (the default before) is a fixed rank
    preconditioner: str = _knob(
        "adaptive", "CG's preconditioner, one Nyström factor of K for every fold",
        choices=CV_PRECONDITIONERS, spelt_by=_CV,
    )  # fmt: skip
    #: None: pipeline.constants.CV_DEFAULT_RANK (nystrom), the memory cap (adaptive)
    rank: int | None = _knob(
        None, "rank of the Nyström preconditioner (a cap for adaptive)", ge=1, unset=True,
        spelt_by=_CV,
    )  # fmt: skip
    #: the estimator also takes scikit-learn's -1 (below 1: one at a time)
    n_jobs: int | None = _knob(
        None, "kernel settings (band: reductions) searched concurrently, in memory", ge=1,
        unset=True, spelt_by=_CV,
    )  # fmt: skip
    max_search_seconds: float | None = _knob(
        None, "refuse (before any work) a grid predicted to take longer than this many seconds",
        gt=0, unset=True, spelt_by=_CV,
    )  # fmt: skip
    kernel_dtype: str = _knob(
        "auto", "solver cg: kernel values of the inner solves (residuals are float64 either way)",
        choices=CV_KERNEL_DTYPES, spelt_by=_CV,
    )  # fmt: skip
    #: on by default (issue #45); None (null) turns screening off: every system to tol.
    #: The other solvers are exact and ignore it
    screen_tol: float | None = _knob(
        C.CV_SCREEN_TOL,
        "solver cg: screen every system to this residual, then only the best λ to tol "
        "(null: no screening)",
        gt=0, lt=1, off=True, example="1e-3", spelt_by=_CV,
    )  # fmt: skip
    screen_top: int = _knob(
        C.CV_SCREEN_TOP, "solver cg: the λ of each kernel setting solved on to tol after screening (with "
        "screen_centers: the finalists of the grid)", ge=1, spelt_by=_CV,
    )  # fmt: skip
    #: on by default (issue #45); None (null): every candidate exactly. Only
    #: where the search runs the block CG (solver cg, or auto above IN_MEMORY_MAX_N)
    screen_centers: int | None = _knob(
        C.CV_SCREEN_CENTERS,
        "solver cg: score the grid by Nyström KRR on this many RPCholesky centres, then "
        "solve only the screen_top best candidates (and the λ below each kernel "
        "setting's smallest) exactly (null: every candidate exactly)",
        ge=1, off=True, example="1000", spelt_by=_CV,
    )  # fmt: skip
    # λ for the full N (pipeline.models.selection.refine)
    #: None: all rows; an integer of at least two rows per fold
    subsample: int | None = _knob(
        None, "run the grid search on this many training rows (a seeded uniform subsample)",
        ge=1, unset=True, example="8000", spelt_by=_CV,
    )  # fmt: skip
    #: None: on when a subsample was drawn
    refine: bool | None = _knob(
        None, "score λ at and below the search's choice on all rows (null: when subsampled)",
        unset=True, spelt_by=_CV,
    )  # fmt: skip
    # solver nystrom (pipeline.models.selection.nystrom_cv)
    #: None: pipeline.constants.DEFAULT_N_CENTERS, at most the rows searched
    n_centers: int | None = _knob(
        None, "solver nystrom: the number of centres M", ge=1, unset=True, spelt_by=_CV
    )
    centers: str = _knob(
        "uniform", "solver nystrom: how the centres are chosen", choices=NYSTROM_CENTRES,
        spelt_by=_CV,
    )  # fmt: skip


def knobs(group: type = SolverOptions, spelt_by: str | None = None) -> dict[str, Knob]:
    """The :class:`Knob` of each field of an option group (:class:`SolverOptions`,
    :class:`CvOptions`), in field order; only those that ``spelt_by`` (``"config"``,
    ``"estimator"``, ``"plan"``) carries when given."""
    hints = get_type_hints(group)
    out = {}
    for f in fields(group):
        kind = hints[f.name]  # ``int | None``: the type of a value that is set
        kind = next((t for t in get_args(kind) if t is not type(None)), kind)
        k = Knob(name=f.name, type=kind, **f.metadata["knob"])
        if spelt_by is None or spelt_by in k.spelt_by:
            out[f.name] = k
    return out


def solver_options(choices: Mapping[str, Any] | SolverOptions | None = None) -> SolverOptions:
    """The solver knobs of a choices mapping (:func:`solver_choices`) or of a
    :class:`SolverOptions`, as the tree, checked: the one reading of the user's solver
    choices (:func:`~pipeline.plan.fit_plan.plan_fit` holds what it returns as
    :attr:`FitPlan.options <pipeline.plan.fit_plan.FitPlan>`).

    A missing or None value takes the tree's default; keys that are no knob of the tree
    are ignored (the fit's own: ``alpha``, ``store``, ...). ``solver``, ``matvec`` and
    ``factor_dtype`` must be allowed values (ValueError naming the value and the valid
    ones), and ``matvec`` takes its one spelling (:func:`normalize_matvec`); the numbers
    and flags take their types (``tol`` a float, ``max_iter``, ``rank``,
    ``checkpoint_every`` and ``random_state`` ints, the flags bools: NumPy scalars become
    Python ones). ``cg_precision`` is checked where a CG fit is planned
    (:func:`pipeline.plan.cg_variant.normalize_precision`); the other knobs are taken as
    given (their readers check them).

    Raises
    ------
    ValueError
        ``solver``, ``matvec`` or ``factor_dtype`` is not an allowed value.
    """
    if isinstance(choices, SolverOptions):
        choices = {f.name: getattr(choices, f.name) for f in fields(SolverOptions)}
    names = {f.name for f in fields(SolverOptions)}
    given = {k: v for k, v in (choices or {}).items() if k in names and v is not None}
    opts = SolverOptions(**given)
    if opts.solver not in SOLVERS:
        raise ValueError(f"solver={opts.solver!r} is not valid; choose one of {SOLVERS}")
    matvec = normalize_matvec(opts.matvec)
    n_centers = opts.n_centers
    # an integer (NumPy's too: ``__index__``), never a bool, a float or a string
    if isinstance(n_centers, bool) or not hasattr(n_centers, "__index__") or n_centers < 1:
        raise ValueError(
            f"n_centers must be a positive integer (the number of Nyström centres M), got "
            f"{n_centers!r}; e.g. n_centers=1000"
        )
    if opts.centers not in NYSTROM_CENTRES:
        raise ValueError(f"centers={opts.centers!r} is not valid; choose one of {NYSTROM_CENTRES}")
    if opts.device not in DEVICES:
        raise ValueError(f"device={opts.device!r} is not valid; choose one of {DEVICES}")
    if opts.factor_dtype not in FACTOR_DTYPES:
        raise ValueError(
            f"factor_dtype={opts.factor_dtype!r} is not valid; choose one of {FACTOR_DTYPES}"
        )
    typed = {
        **{
            name: int(getattr(opts, name)) for name in _INT_KNOBS if getattr(opts, name) is not None
        },
        **{name: bool(getattr(opts, name)) for name in _BOOL_KNOBS},
    }
    return replace(opts, matvec=matvec, tol=float(opts.tol), **typed)


#: the knobs of :class:`SolverOptions` that :func:`solver_options` makes ints and bools
_INT_KNOBS = ("max_iter", "rank", "checkpoint_every", "random_state", "n_centers")
_BOOL_KNOBS = ("allow_unconverged", "jitter", "keep_gram", "check_disk")


#: the names of the solver knobs, as :func:`~pipeline.plan.fit_plan.plan_fit` reads them:
#: the tree's (:class:`SolverOptions`) and the fit's own (``kernel_copies`` and
#: ``sample_weight`` inform the in-memory rule)
SOLVER_KNOBS = (
    "solver",
    "alpha",
    "alpha_convention",
    "block_size",
    *(name for name in knobs(spelt_by="plan") if name not in ("solver", "random_state")),
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
    """The user's solver choices as :func:`~pipeline.plan.fit_plan.plan_fit` takes them:
    the one builder of every caller's choices (``KernelRidge``, its out-of-core fit,
    ``KernelRidgeCV``'s refit, ``krr run``'s solve stage, the in-memory reference).

    Every key must be one of :data:`SOLVER_KNOBS` (a misspelt key would otherwise be
    ignored and its knob silently take the plan's default); a value of None takes
    the plan's default. The tree's knobs are checked as the plan reads them
    (:func:`solver_options`), before any work; the mapping is returned as given.

    Raises
    ------
    TypeError
        A key that is not a solver knob.
    ValueError
        ``solver``, ``matvec`` or ``factor_dtype`` is not an allowed value.
    """
    unknown = sorted(set(choices) - set(SOLVER_KNOBS))
    if unknown:
        raise TypeError(f"not solver knobs: {unknown}; the knobs are {list(SOLVER_KNOBS)}")
    solver_options(choices)  # the values, as the plan will read them
    return dict(choices)


# -- identities: knobs that name no choice, and changed defaults spelt as before -------


def without_unnamed(knobs: Mapping[str, Any], no_choice: Mapping[str, Any]) -> dict[str, Any]:
    """``knobs`` without each key whose value is its entry in ``no_choice``: the value
    that names no choice. The one rule by which a knob added later, at that value, keeps
    every earlier identity (a stage's fingerprint, a store's name). A new dict."""
    return {k: v for k, v in knobs.items() if k not in no_choice or v != no_choice[k]}


#: the solver knobs at the values that name no choice (:func:`named_knobs`)
SOLVER_NO_CHOICE: dict[str, Any] = {"cg_precision": "auto", "device": "cpu"}


def named_knobs(knobs: Mapping[str, Any], method: str | None) -> dict[str, Any]:
    """The solver knobs as an identity sees them (:func:`without_unnamed`): without the
    knobs whose value names no choice, so that a knob added with its default keeps every
    earlier identity (a run config's solve stage, a ``KernelRidge`` store's name).
    ``cg_precision="auto"`` (a mixed solve's checkpoints carry their own fingerprint),
    ``device="cpu"`` (another device's fit is another fit: other bits, to 1e-10), and
    ``n_centers`` / ``centers`` unless ``method`` (the solver) is ``"nystrom"``. A new
    dict, the input untouched."""
    out = without_unnamed(knobs, SOLVER_NO_CHOICE)
    if method != "nystrom":
        out.pop("n_centers", None)
        out.pop("centers", None)
    return out


def spelt_as_before(view: str, knobs: Mapping[str, Any]) -> dict[str, Any]:
    """The knobs as a fingerprint or a store's name sees them, with the defaults that
    issue #45 changed spelt as the defaults they replaced: runs and stores made before
    keep their identity. The one home of that rule, for each place that names knobs.

    What it keeps is sound: a Gram or a factor does not depend on CG's preconditioner,
    a solve made before is an answer to the same tolerance, and a search that screened
    selected from scores as good; a CG checkpoint's own fingerprint names the
    preconditioner it used, so an earlier one is restarted, never resumed with another.

    Parameters
    ----------
    view : {"solve", "select", "estimator"}
        - ``"solve"``: a run config's ``solver`` section (the solve stage). A rank not
          set is :data:`~pipeline.constants.DEFAULT_RANK` (the default before), and
          ``adaptive`` with it unset is ``nystrom`` (the default preconditioner before).
        - ``"select"``: a run config's ``cv`` section (the select stage). ``adaptive``
          with ``screen_tol`` at :data:`~pipeline.constants.CV_SCREEN_TOL` is ``nystrom``
          without screening (the defaults before).
        - ``"estimator"``: ``KernelRidge``'s parameters (its store's name). ``adaptive``
          is ``nystrom``; its rank default was and is None.
    knobs : mapping
        The section or parameters; returned as a new dict, the input untouched.
    """
    out = dict(knobs)
    if view == "solve":
        if "preconditioner" in out and out.get("rank") is None:
            if out["preconditioner"] == "adaptive":
                out["preconditioner"] = "nystrom"
            out["rank"] = C.DEFAULT_RANK
    elif view == "select":
        if out.get("preconditioner") == "adaptive" and out.get("screen_tol") == C.CV_SCREEN_TOL:
            out.update(preconditioner="nystrom", screen_tol=None)
    elif view == "estimator":
        if out.get("preconditioner") == "adaptive":
            out["preconditioner"] = "nystrom"
    else:
        raise ValueError(f"view={view!r} is not valid; choose 'solve', 'select' or 'estimator'")
    return out
