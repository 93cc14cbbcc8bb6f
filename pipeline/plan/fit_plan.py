"""One fit plan: :class:`FitPlan` and the one ``solver="auto"`` rule, :func:`plan_fit`.

``KernelRidge.fit``, the solve stage of ``krr run``, ``KernelRidgeCV``'s refit
and the tests' reference all call :func:`plan_fit` and log the plan it returns
with its reason, then run it with :func:`pipeline.fit.execute`. The rule:

1. A solver the user named is used as asked (``matvec="auto"`` still resolved).
2. ``auto`` with in-memory solving allowed (an estimator without ``store``): the
   primal for the linear kernel when it is cheaper (``n D² + D³/3`` against
   ``n² D + n³/3``) and α > 0; else the dense dual when it fits in memory
   (or must: callables, ``"precomputed"``, per-target α), unless the cost model
   predicts matrix-free CG :data:`~pipeline.constants.IN_MEMORY_CG_MARGIN` times
   faster than the dense solve (``dense_seconds``; a large, well-conditioned
   problem such as flights' λ = 1), when CG runs with X in memory.
3. Otherwise out of core: CG when the Gram and factor do not fit on disk, the
   Cholesky when CG's vectors do not fit in memory, else whichever the one cost
   model, :class:`pipeline.plan.calibrated.CalibratedCostModel`, predicts faster.
   It depends on λ: CG's iterations follow the preconditioner's residual ρ against
   the shift μ, and ρ is measured on a subsample of the training rows when the
   caller passes them (``probes=``, :class:`~pipeline.engine.placement.Probes`, built by
   :func:`pipeline.fit.row_probes`), as ``krr run`` and ``KernelRidge`` do. A kernel not known to be PSD never gets CG.
4. Every CG fit (named or chosen) takes its product's variant from
   :func:`pipeline.plan.cg_variant.choose_cg_variant`: recomputed or stored tiles,
   float64 or mixed precision (``matvec`` and ``cg_precision`` the user named are
   kept), by the same cost model; ``auto`` compares CG's best variant with the Cholesky.
5. ``nystrom`` (Nyström KRR by FALKON, :mod:`pipeline.linalg.nystrom_solve`) is an
   approximation: planned only when named, never by ``auto``; with ``n_centers >=
   n_samples`` it is no approximation and the exact rule above is used instead (logged).

Pure functions of sizes, user choices, measured resources and the caller's probes of
the rows (called only when their figure can change the plan): no I/O, no solver. Other cost models plug in through the ``cost_model``
argument of :func:`plan_fit` (any object with ``cholesky_seconds`` and
``cg_seconds`` methods taking ``(n, d, kernel)``; a method that also takes the
keywords ``shift``, ``tol`` or ``rho`` is given the diagonal shift μ, CG's
tolerance and the measured ρ), or by name: ``"calibrated"`` (the default) or
``"simple"`` (:class:`~pipeline.plan.calibrated.SimpleCostModel`: λ-blind constants that cross at
:data:`~pipeline.constants.CHOLESKY_MAX_N` rows; kept for comparison, it
picks the slower solver on much of the measured grid).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np

import pipeline.constants as C
from pipeline.engine.backend import resolve_device
from pipeline.engine.placement import Probes, Resources, default_block_size, tiles_on_workers
from pipeline.engine.where import gram_on_demand
from pipeline.kernels import Linear
from pipeline.linalg.dense_memory import dense_dual_bytes
from pipeline.options import (
    ALPHA_CONVENTION_ALIASES,
    FACTOR_DTYPES,
    MATVEC_ALIASES,
    SOLVERS,
    SolverOptions,
    diagonal_shift,
    normalize_alpha_convention,
    normalize_matvec,
    solver_options,
)
from pipeline.plan.calibrated import CalibratedCostModel, _accepts, _seconds, make_cost_model
from pipeline.plan.cg_cost import adaptive_rank_and_residual, gram_disk_bytes
from pipeline.plan.cg_variant import (
    choose_cg_variant,
    matvec_choice,
    normalize_precision,
    variant_candidates,
)
from pipeline.plan.factor_precision import choose_factor_dtype

__all__ = [
    "ALPHA_CONVENTION_ALIASES",
    "DEVICE_RECORD_KEYS",
    "FACTOR_DTYPES",
    "FP64_STRONG_CAPABILITIES",
    "FitPlan",
    "MATVEC_ALIASES",
    "Probes",
    "NYSTROM_RECORD_KEYS",
    "RECORD_KEYS",
    "Resources",
    "adaptive_cg_prediction",
    "adaptive_residual",
    "cg_memory_bytes",
    "dual_flops",
    "gram_and_factor_disk_bytes",
    "gram_disk_bytes",
    "gram_on_demand",
    "in_memory_choice",
    "matvec_choice",
    "normalize_alpha_convention",
    "normalize_matvec",
    "out_of_core_choice",
    "plan_fit",
    "primal_flops",
    "SOLVERS",
]


log = logging.getLogger(__name__)

#: the option tree's defaults (pipeline.options.SolverOptions): the knobs a FitPlan
#: decides default to them
_DEFAULT = SolverOptions()


def _zero_residual(rank: int) -> float:
    """The residual probe's best possible answer, ρ = 0 (``cg_pricing(floor=True)``)."""
    return 0.0


#: where ρ came from when CG is priced at its floor (``cg_pricing(floor=True)``)
FLOOR_RHO_SOURCE = "taken as 0, the best a measurement could give"


#: the keys of a plan's record (:meth:`FitPlan.to_dict`: ``plan.json``, the solve
#: stage's outputs), in their recorded order: the plan's own fields and the knobs of its
#: options that the fit runs with (never ``allow_unconverged`` nor ``cost_model``)
RECORD_KEYS = (
    "solver", "alpha", "alpha_convention", "block_size", "factor_dtype", "kernel_dtype",
    "cg_precision", "preconditioner", "rank", "tol", "max_iter", "matvec", "store",
    "random_state", "checkpoint_every", "jitter", "factor_scheduler", "keep_gram",
    "check_disk", "factor_dtype_auto",
)  # fmt: skip
#: the keys a plan of ``solver="nystrom"`` records after :data:`RECORD_KEYS` (only that
#: solver's records have them: every other record keeps its keys)
NYSTROM_RECORD_KEYS = ("n_centers", "centers")
#: the keys a plan that runs on a GPU (``device`` not ``"cpu"``) records after the others
#: (a CPU plan's record keeps its keys, byte for byte)
DEVICE_RECORD_KEYS = ("device", "device_reason")
#: the compute capabilities of NVIDIA's parts with a full float64 rate (1/2 of float32:
#: P100, V100, A100, H100/H200, B200); the others (consumer and workstation parts) run
#: float64 at 1/32 to 1/64 of their float32 rate
FP64_STRONG_CAPABILITIES = ((6, 0), (7, 0), (8, 0), (9, 0), (10, 0))


@dataclass(frozen=True)
class FitPlan:
    """Everything that decides how one kernel ridge fit runs; one default each.

    :attr:`options` holds the solver knobs as they were asked
    (:class:`~pipeline.options.SolverOptions`, read by
    :func:`~pipeline.options.solver_options`: ``plan.options.tol``,
    ``plan.options.keep_gram``...); the plan's own fields are what it decided and the fit's
    own values. Of the knobs the plan decides, the decision is the plan's field and the
    ask stays in :attr:`options`: ``solver`` (never ``"auto"``), ``matvec`` (never
    ``"auto"`` for CG; ``"stored"`` for the Cholesky, None in memory),
    ``cg_precision``, ``factor_dtype`` (never ``"auto"``) and ``rank`` (at most n).
    """

    #: the solver knobs as asked (checked and typed; None took the tree's default)
    options: SolverOptions = field(default_factory=SolverOptions)
    # what the plan decided
    solver: str = "cholesky"
    block_size: int = C.DEFAULT_BLOCK_SIZE
    factor_dtype: str = _DEFAULT.factor_dtype
    #: Cholesky: factor_dtype was chosen by factor_dtype="auto"; a float32 factor that
    #: fails (not positive definite, refinement short) is then redone in float64
    factor_dtype_auto: bool = False
    #: CG: "float64" products, or "mixed" (float32 kernel products refined to the
    #: float64 answer; pipeline.linalg.cg_mixed_fit)
    cg_precision: str = "float64"
    rank: int = C.DEFAULT_RANK
    matvec: str | None = None
    # the fit's own values (no knobs of the option tree)
    alpha: float = 1.0
    alpha_convention: str = C.DEFAULT_ALPHA_CONVENTION
    kernel_dtype: str = C.DEFAULT_KERNEL_DTYPE
    store: str | None = None
    #: where the fit runs, resolved from ``options.device``
    #: (:func:`~pipeline.engine.backend.resolve_device`): ``"cpu"`` or ``"cuda"``
    device: str = "cpu"
    #: why (recorded, with :attr:`device`, only for a plan that runs on a GPU)
    device_reason: str = field(default="", compare=False)
    #: the cost model's predicted seconds of the solvers the plan weighed, by name
    #: (``"dense"`` and ``"cg"`` in memory, ``"cholesky"`` and ``"cg"`` out of core;
    #: CG at its floor, ρ = 0, where ρ was not measured, as the reason says); empty
    #: where no prediction decided (a named solver, a rule on sizes or space). Not
    #: recorded: the reason states the same figures
    predicted_seconds: dict = field(default_factory=dict, compare=False)
    extra: dict = field(default_factory=dict, compare=False)

    @property
    def out_of_core(self) -> bool:
        return self.solver in ("cholesky", "cg")

    @property
    def needs_gram(self) -> bool:
        """Whether the fit reads a stored Gram (Cholesky, or CG with the stored matvec)."""
        return self.solver == "cholesky" or (self.solver == "cg" and self.matvec == "stored")

    @property
    def gram_dtype(self) -> str:
        """dtype of the Gram the fit builds: the factor's when the Cholesky factors in
        place (a float32 factor replaces a float32 Gram, half the disk, and alpha is
        refined to float64 with matrix-free products from X), else float64."""
        if self.solver == "cholesky" and not self.options.keep_gram:
            return np.dtype(self.factor_dtype).name
        return "float64"

    def describe(self) -> str:
        """One line for the log: the choices that matter for this solver."""
        o = self.options
        parts = [f"solver={self.solver}", f"alpha={self.alpha:g} ({self.alpha_convention})"]
        if self.out_of_core:
            parts.append(f"block_size={self.block_size}")
        if self.solver == "cholesky":
            parts.append(f"factor_dtype={self.factor_dtype}")
            if not o.keep_gram:
                parts.append("keep_gram=False")
        if self.solver == "cg":
            parts += [
                f"matvec={self.matvec}",
                *(["cg_precision=mixed"] if self.cg_precision == "mixed" else []),
                f"preconditioner={o.preconditioner}",
                # "adaptive" grows its own rank up to this cap; "nystrom" uses rank
                f"rank={f'adaptive, at most {self.rank}' if o.preconditioner == 'adaptive' else self.rank}",
                f"tol={o.tol:g}",
                f"max_iter={o.max_iter}",
            ]
        if self.solver == "nystrom":
            parts += [
                f"n_centers={o.n_centers}",
                f"centers={o.centers}",
                f"block_size={self.block_size}",
                f"tol={o.tol:g}",
                f"max_iter={o.max_iter}",
            ]
        if self.device != "cpu":
            parts.append(f"device={self.device}")
        return ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """The plan's record (JSON-able; :data:`RECORD_KEYS`, in that order): each key
        the plan's own field where it has one (a decision), else its options' knob."""
        own = {f.name for f in fields(self)}
        keys = RECORD_KEYS + (NYSTROM_RECORD_KEYS if self.solver == "nystrom" else ())
        keys += DEVICE_RECORD_KEYS if self.device != "cpu" else ()
        return {k: getattr(self if k in own else self.options, k) for k in keys}

    @classmethod
    def from_dict(cls, record: Mapping[str, Any]) -> FitPlan:
        """The plan of a record written by :meth:`to_dict` (or a mapping of its keys).

        A key the plan no longer records is ignored, and one it gained takes its
        default (a plan recorded by another version still resumes its run). The record
        keeps the decisions, not the asks: the options' knobs that the plan decides
        (``solver``, ``matvec``, ...) and the ones it does not record take the tree's
        defaults, so ``from_dict(p.to_dict()).to_dict() == p.to_dict()``.
        """
        own = {f.name for f in fields(cls)} - {"options", "extra", "predicted_seconds"}
        knobs = {f.name for f in fields(SolverOptions)} - own
        opts = {k: v for k, v in record.items() if k in knobs}
        return cls(options=SolverOptions(**opts), **{k: v for k, v in record.items() if k in own})


# ---------------------------------------------------------------------------
# sizes


def gram_and_factor_disk_bytes(n: int, itemsize: int = 8) -> int:
    """Disk a blocked Cholesky needs: the lower-tiled Gram plus its lower factor, each
    :func:`~pipeline.plan.cg_cost.gram_disk_bytes` (the tile-level figure is
    :func:`pipeline.plan.cholesky_cost.cholesky_disk_bytes`)."""
    return 2 * gram_disk_bytes(n, itemsize)


def cg_memory_bytes(
    n: int, n_features: int, rank: int = C.DEFAULT_RANK, n_rhs: int = 1, factor_itemsize: int = 8
) -> int:
    """Memory CG needs beyond a few tiles: X, the Nyström factor (twice: its build's
    temporaries; ``factor_itemsize`` 4 for the adaptive one's float32), six work vectors
    per RHS."""
    return n * (8 * n_features + 2 * factor_itemsize * rank + 48 * n_rhs)


def _gb(x: float) -> str:
    return f"{x / 1e9:.1f} GB"


# ---------------------------------------------------------------------------
# the rules


def out_of_core_choice(
    n: int,
    n_features: int,
    disk_free: float,
    mem_free: float,
    *,
    rank: int = C.DEFAULT_RANK,
    factor_itemsize: int = 8,
    cholesky_max_n: int | None = None,
    kernel: Any = None,
    cost_model: Any = None,
    shift: float | None = None,
    tol: float | None = None,
    rho: float | None = None,
    cg_options: Mapping[str, Any] | None = None,
    rho_source: str | None = None,
    cg_margin: float = 0.0,
) -> tuple[str, str, dict[str, float]]:
    """``"cholesky"`` or ``"cg"`` for an N x N kernel system, with the reason and the
    predicted seconds of both (empty when a rule on space or size decided).

    ``cholesky_max_n`` replaces the cost model by a row threshold. ``shift`` (μ),
    ``tol`` and ``rho`` (the preconditioner's measured residual) reach cost models
    whose methods accept them; so do ``cg_options`` (CG's ``matvec`` and
    ``precision``, :func:`pipeline.plan.cg_variant.choose_cg_variant`). ``rho_source``
    says where ρ came from (default: measured on a subsample when given, else assumed).
    ``cg_margin``: CG is chosen on time only when predicted faster by more than this many
    seconds (the price of measuring ρ, when CG is priced at its floor: ``plan_fit``).
    """
    if n < 1 or n_features < 1:
        raise ValueError(f"n and n_features must be >= 1, got n={n}, n_features={n_features}")
    if disk_free < 0 or mem_free < 0:
        raise ValueError(f"free disk and memory must be >= 0, got {disk_free}, {mem_free}")
    need_disk = gram_and_factor_disk_bytes(n)
    need_mem = cg_memory_bytes(n, n_features, min(rank, n), factor_itemsize=factor_itemsize)
    usable_disk = C.DISK_MARGIN * disk_free
    cg_fits_memory = need_mem <= C.DISK_MARGIN * mem_free
    if need_disk > usable_disk:
        if not cg_fits_memory:
            return (
                "cg",
                f"N={n}: neither fits: the Cholesky needs {_gb(need_disk)} of disk "
                f"({_gb(usable_disk)} usable) and CG with rank {min(rank, n)} about "
                f"{_gb(need_mem)} of memory ({_gb(mem_free)} free); CG is the only option, "
                "lower the Nyström rank",
                {},
            )
        return (
            "cg",
            f"N={n}: the Gram and Cholesky factor need {_gb(need_disk)} of disk but only "
            f"{_gb(usable_disk)} of {_gb(disk_free)} free is usable; matrix-free CG needs "
            f"no store and about {_gb(need_mem)} of memory",
            {},
        )
    if not cg_fits_memory:
        return (
            "cholesky",
            f"N={n}: CG would need about {_gb(need_mem)} of memory but {_gb(mem_free)} is "
            f"free, while the out-of-core Cholesky's {_gb(need_disk)} fit on disk",
            {},
        )
    if cholesky_max_n is not None:
        if n > cholesky_max_n:
            return (
                "cg",
                f"N={n} > {cholesky_max_n}: a Cholesky costs N³/3 = {n**3 / 3e12:.1f} TFLOP, "
                "more than ~100 CG products of N² kernel entries",
                {},
            )
        return (
            "cholesky",
            f"N={n} <= {cholesky_max_n} and the Gram plus factor ({_gb(need_disk)}) fit in "
            f"{_gb(usable_disk)} of usable disk: the exact blocked Cholesky is cheaper here",
            {},
        )
    cm = make_cost_model(cost_model)
    kw = {"shift": shift, "tol": tol, "rho": rho}
    t_chol = _seconds(cm.cholesky_seconds, n, n_features, kernel, **kw)
    t_cg = _seconds(cm.cg_seconds, n, n_features, kernel, **kw, **dict(cg_options or {}))
    seconds = {"cholesky": t_chol, "cg": t_cg}
    cg_why = f"{getattr(cm, 'name', 'cost')} model"
    if hasattr(cm, "cg_iterations") and _accepts(cm.cg_iterations, "rho"):
        its = cm.cg_iterations(n, shift, tol, rho=rho)
        rho_n = cm.residual(n, rho)
        source = rho_source or (
            "measured on a subsample of the rows" if rho is not None else "assumed"
        )
        cg_why += f": about {its} iterations at ρ/μ = {rho_n / (shift or 1.0):.3g}, ρ {source}"
    if t_chol > t_cg + cg_margin:
        return (
            "cg",
            f"N={n}: a Cholesky (N³/3 = {n**3 / 3e12:.1f} TFLOP) is predicted at "
            f"{t_chol:.3g} s, CG at {t_cg:.3g} s ({cg_why})",
            seconds,
        )
    if t_chol > t_cg:
        return (
            "cholesky",
            f"N={n}: CG could save at most {t_chol - t_cg:.3g} s over the exact blocked "
            f"Cholesky (predicted {t_chol:.3g} s; CG {t_cg:.3g} s, {cg_why}), less than "
            f"measuring ρ would cost ({cg_margin:.3g} s), and the Gram plus factor "
            f"({_gb(need_disk)}) fit in {_gb(usable_disk)} of usable disk",
            seconds,
        )
    return (
        "cholesky",
        f"N={n}: the exact blocked Cholesky (predicted {t_chol:.3g} s) is cheaper than CG "
        f"({t_cg:.3g} s, {cg_why}), and the Gram plus factor "
        f"({_gb(need_disk)}) fit in {_gb(usable_disk)} of usable disk",
        seconds,
    )


def dual_flops(n: int, d: int) -> float:
    """Approximate flops of the dense dual: forming K (n² D) plus its Cholesky (n³/3)."""
    return float(n) ** 2 * d + float(n) ** 3 / 3.0


def primal_flops(n: int, d: int) -> float:
    """Approximate flops of the primal: forming Φᵀ Φ (n D²) plus its Cholesky (D³/3)."""
    return float(n) * d * d + float(d) ** 3 / 3.0


def in_memory_choice(n: int, d: int, *, has_primal: bool, alpha: Any = 1.0) -> str:
    """``"primal"`` when the kernel has an explicit primal, α > 0 and it is cheaper,
    else ``"dense"`` (the dual)."""
    if not has_primal or np.any(np.asarray(alpha, dtype=np.float64) <= 0):
        return "dense"
    return "primal" if primal_flops(n, d) < dual_flops(n, d) else "dense"


def adaptive_residual(
    n: int, shift: float, cap: int, cost_model: Any, residual: Any = None
) -> tuple[int, float, int, bool]:
    """The plan's prediction of one fit's adaptive factor: it grows to
    ``ρ <= ADAPTIVE_FIT_FACTOR · μ`` or its ``cap``
    (:func:`~pipeline.plan.cg_cost.adaptive_rank_and_residual`), from ρ at a rank a
    subsample resolves, measured by ``residual(rank)`` (the row probe) when given, else
    the cost model's assumed ρ at :data:`~pipeline.constants.DEFAULT_RANK`.

    Returns ``(rank, ρ, the rank ρ was taken at, whether it was measured)``. ``plan_fit``
    prices CG with this rank and ρ, and so do the policy grid's replay and its tests.
    """
    r, rho_r = C.DEFAULT_RANK, None
    if residual is not None:
        r = C.probe_rank("adaptive", cap)
        rho_r = residual(r)
    measured = rho_r is not None
    if not measured:
        r, rho_r = C.DEFAULT_RANK, cost_model.residual(n)
    rank, rho = adaptive_rank_and_residual(rho_r, r, shift, cap, C.ADAPTIVE_FIT_FACTOR)
    return rank, rho, r, measured


def adaptive_cg_prediction(
    n: int, d: int, kernel: Any, shift: float, tol: float, memory_bytes: float, residual: Any
) -> dict[str, Any]:
    """The calibrated model's CG prediction for one fit with the default (adaptive)
    preconditioner, as ``plan_fit`` prices it: the rank cap
    (:func:`~pipeline.constants.preconditioner_rank`), the rank and ρ from
    :func:`adaptive_residual`, then :meth:`CalibratedCostModel.predict` at them. For the
    policy grid's replay and its tests; ``rho_source`` says whether ρ was measured."""
    cap = C.preconditioner_rank("adaptive", None, n, memory_bytes)
    rank, rho, _, measured = adaptive_residual(
        n, shift, cap, CalibratedCostModel(tol=tol), residual
    )
    pred = CalibratedCostModel(rank=rank, tol=tol).predict(
        n, d, kernel, shift=shift, tol=tol, rho=rho
    )
    return {**pred, "rank": rank, "rho_source": "subsample" if measured else "assumed"}


def _rho_matters(
    cm: Any, solver: str, n: int, d: int, kernel: Any, mu: float, tol: float, matvec, precision
) -> bool:
    """Whether measuring ρ on a subsample (about 1 s) can change the plan: with
    ``solver="auto"`` always here, since the plan asks first, with CG priced at its floor
    (``cg_pricing(floor=True)``), whether CG could replace the dense dual in memory, or
    beat the Cholesky out of core by more than the measurement costs; with
    ``solver="cg"`` when the product's variant is open and the solve is predicted to
    take :data:`~pipeline.constants.SPECTRUM_WORTH_SECONDS` or more."""
    if solver == "auto":
        return True
    if solver != "cg" or (matvec != "auto" and precision != "auto"):
        return False
    kw = {"shift": mu if mu > 0 else None, "tol": tol}
    return _seconds(cm.cg_seconds, n, d, kernel, **kw) >= C.SPECTRUM_WORTH_SECONDS


def _choice(choices: Mapping[str, Any], key: str, default: Any) -> Any:
    v = choices.get(key)
    return default if v is None else v


def plan_fit(
    n: int,
    d: int,
    kernel: Any,
    resources: Resources,
    choices: Mapping[str, Any] | SolverOptions | None = None,
    *,
    n_targets: int = 1,
    cost_model: Any = None,
    probes: Probes | None = None,
) -> tuple[FitPlan, str]:
    """The plan of one fit and why, from its sizes, kernel, resources and user choices.

    Parameters
    ----------
    n, d : int
        Training rows and features.
    kernel : Kernel or None
        The kernel object (None for callables and ``"precomputed"``: in memory only).
    resources : Resources
    choices : mapping or SolverOptions, optional
        User choices (:func:`pipeline.options.solver_choices`); a missing or None value
        takes the default. Keys: the solver knobs of the option tree
        (:class:`pipeline.options.SolverOptions`: ``solver``, ``tol``, ``max_iter``,
        ``preconditioner``, ``rank``, ``matvec``, ``cg_precision``, ``checkpoint_every``,
        ``jitter``, ``factor_dtype``, ``factor_scheduler``, ``keep_gram``, ``check_disk``,
        ``cost_model``, ``random_state``), read and checked by
        :func:`pipeline.options.solver_options` and held as the plan's
        :attr:`~FitPlan.options`, and the fit's own: ``alpha``, ``alpha_convention``,
        ``block_size``, ``kernel_dtype``, ``store``; and, for the in-memory rule,
        ``kernel_copies`` (K copies of the dense solve) and ``sample_weight`` (True when
        weights are given).
        A :class:`~pipeline.options.SolverOptions` alone gives the knobs, the fit's own
        values taking their defaults.
    n_targets : int
    cost_model : object or str, optional
        ``cholesky_seconds(n, d, kernel)`` and ``cg_seconds(n, d, kernel)`` (given
        ``shift=`` μ and ``tol=`` too when they accept them), or a name of
        :data:`~pipeline.options.COST_MODELS`; default ``choices["cost_model"]``, else
        :class:`~pipeline.plan.calibrated.CalibratedCostModel`.
    probes : Probes, optional
        The measurements the plan may take on the training rows as the kernel sees
        them (:func:`pipeline.fit.row_probes`). When ``solver="auto"`` goes out of core
        with the Nyström preconditioner, the residual ρ of that preconditioner is
        measured on a seeded subsample of them
        (:func:`pipeline.linalg.spectrum.estimate_residual`); without them the cost
        model assumes one. Callers that plan the same fit pass the same rows, so
        they get the same plan.

    The device (``choices["device"]``, :func:`plan_device`) is resolved first:
    ``"cuda"`` without CuPy or a GPU raises
    :class:`~pipeline.errors.DeviceUnavailableError` before any work; ``"auto"``
    without one plans for the CPU and says so in the reason. A plan on the GPU
    records its device and why (:data:`DEVICE_RECORD_KEYS`), with a warning when
    the GPU's float64 rate is low (:func:`fp64_warning`, from ``resources``).

    Returns
    -------
    (plan, reason) : (FitPlan, str)
    """
    # the device first: device="cuda" without CuPy or a GPU is refused before any work
    device, device_why = plan_device(solver_options(choices).device)
    plan, reason = _plan_solver(
        n, d, kernel, resources, choices, n_targets=n_targets, cost_model=cost_model,
        probes=probes,
    )  # fmt: skip
    if device == "cpu":
        if device_why:  # "auto" fell back to the CPU: said in the reason, not recorded
            reason = f"{reason}; {device_why}"
        return plan, reason
    cpu_why = _no_device_path(plan, kernel)
    if cpu_why:
        return plan, f"{reason}; {device_why}, but {cpu_why}: it runs on the CPU"
    why = device_why
    warning = fp64_warning(plan, resources)
    if warning:
        log.warning("%s", warning)
        why = f"{why}; {warning}"
    if resources.gpu_memory_bytes is not None:
        why = f"{why} ({resources.gpu_name or 'GPU'}: {_gb(resources.gpu_memory_bytes)} free)"
    return replace(plan, device=device, device_reason=why), f"{reason}; {why}"


#: the solvers with a GPU path (:func:`pipeline.fit.execute`); the others run on the CPU
DEVICE_SOLVERS = ("dense", "cholesky", "cg")


def _no_device_path(plan: FitPlan, kernel: Any) -> str:
    """Why ``plan`` has no GPU path (it then runs on the CPU), or ``""``: the dense dual,
    the float64 Cholesky (rows in memory without a store of the user's: factored in
    place in device memory; else the stored Gram's tiles streamed to the device, the
    factor's tiles stored) and CG's recomputed products run on the GPU; the primal,
    Nyström, the in-place stored factor, a float32 factor and CG on a stored Gram do
    not (yet)."""
    if plan.solver not in DEVICE_SOLVERS:
        return f"solver={plan.solver!r} has no GPU path"
    if kernel is None:
        return "a callable or precomputed kernel has no GPU path"
    if plan.solver == "cholesky" and not plan.options.keep_gram:
        return "the in-place stored factor (keep_gram=False) has no GPU path"
    if plan.solver == "cholesky" and np.dtype(plan.factor_dtype) != np.float64:
        return "a float32 factor (refined to float64 on the CPU) has no GPU path"
    if plan.solver == "cg" and plan.matvec == "stored":
        return "CG's products with a stored Gram have no GPU path"
    return ""


def plan_device(device: str) -> tuple[str, str]:
    """The resolved device (``"cpu"`` or ``"cuda"``) of the user's ``device`` and why:
    :func:`pipeline.engine.backend.resolve_device`, whose
    :class:`~pipeline.errors.DeviceUnavailableError` (``"cuda"`` without CuPy or a GPU)
    it lets through. ``"cpu"`` gives ``("cpu", "")`` without looking for a GPU."""
    if device == "cpu":
        return "cpu", ""
    backend, why = resolve_device(device)
    return backend.device, why


def fp64_warning(plan: FitPlan, resources: Resources) -> str:
    """The warning for a float64 fit on a GPU with a low float64 rate (its compute
    capability not in :data:`FP64_STRONG_CAPABILITIES`), or ``""``: a float32 factor
    and mixed-precision CG run their heavy products in float32."""
    cc = resources.gpu_compute_capability
    if cc is None or tuple(int(c) for c in cc) in FP64_STRONG_CAPABILITIES:
        return ""
    if (plan.solver == "cholesky" and np.dtype(plan.factor_dtype) == np.float32) or (
        plan.solver == "cg" and plan.cg_precision == "mixed"
    ):
        return ""
    name = resources.gpu_name or "this GPU"
    return (
        f"warning: {name} (compute capability {cc[0]}.{cc[1]}) runs float64 at 1/32 to "
        "1/64 of its float32 rate, so this float64 fit may be slower than on the CPU; "
        "use device='cpu', or a GPU with a full float64 rate (compute capability 6.0, "
        "7.0, 8.0, 9.0 or 10.0)"
    )


def _plan_solver(
    n: int,
    d: int,
    kernel: Any,
    resources: Resources,
    choices: Mapping[str, Any] | SolverOptions | None = None,
    *,
    n_targets: int = 1,
    cost_model: Any = None,
    probes: Probes | None = None,
) -> tuple[FitPlan, str]:
    """:func:`plan_fit` without the device: the solver rule."""
    check_width = getattr(kernel, "check_n_features", None)
    if check_width is not None:  # an ARD length-scale vector of the wrong width: before any work
        check_width(int(d))
    opts = solver_options(choices)  # the tree's knobs, checked; None taking their defaults
    ch = {} if isinstance(choices, SolverOptions) else dict(choices or {})
    solver = opts.solver
    alpha = _choice(ch, "alpha", 1.0)
    alphas = np.atleast_1d(np.asarray(alpha, dtype=np.float64))
    one_alpha = np.unique(alphas).size == 1
    matvec = opts.matvec
    rank = C.preconditioner_rank(opts.preconditioner, opts.rank, n, resources.memory_bytes)
    adaptive = opts.preconditioner == "adaptive"
    probes = Probes() if probes is None else probes
    x_here = probes.x_in_memory and kernel is not None

    def block_for(solver: str) -> int:
        w = tiles_on_workers(
            solver,
            resources,
            factor_scheduler=opts.factor_scheduler,
            keep_gram=opts.keep_gram,
            x_in_memory=x_here,
        )
        return int(_choice(ch, "block_size", default_block_size(n, w)))

    bs = block_for(solver)
    store = ch.get("store")
    factor_dtype = opts.factor_dtype
    base = FitPlan(
        options=opts,
        solver="dense",
        alpha=float(alphas[0]) if one_alpha else float("nan"),
        alpha_convention=normalize_alpha_convention(
            _choice(ch, "alpha_convention", C.DEFAULT_ALPHA_CONVENTION)
        ),
        block_size=bs,
        factor_dtype="float64" if factor_dtype == "auto" else factor_dtype,
        kernel_dtype=_choice(ch, "kernel_dtype", C.DEFAULT_KERNEL_DTYPE),
        rank=rank,
        store=None if store is None else str(store),
    )
    mercer = bool(getattr(kernel, "is_mercer", True))
    reason = f"requested solver={solver!r}"
    if solver == "nystrom":  # an approximation: planned only when named
        if opts.n_centers < n:
            return replace(base, solver="nystrom"), (
                f"{reason} (Nyström approximation with n_centers={opts.n_centers} of "
                f"n_samples={n}, solved by FALKON's preconditioned CG)"
            )
        reason = (
            f"solver='nystrom' with n_centers={opts.n_centers} >= n_samples={n} is no "
            "approximation: using the exact solver"
        )
        log.info("%s", reason)
        solver = "auto"

    def cg_pricing(solver: str, *, floor: bool = False) -> tuple:
        """CG as the cost model prices it for this fit: the model (at the adaptive
        factor's predicted rank), μ, ρ and its source, and the product variant.

        ``floor``: priced as if the subsample had measured ρ = 0, without measuring it.
        Every measured ρ prices CG at least as high (more iterations, and for the
        adaptive factor a higher rank), so when even this floor cannot change the plan,
        neither can the measurement."""
        precision = normalize_precision(opts.cg_precision)
        tol = opts.tol
        cm = make_cost_model(
            cost_model if cost_model is not None else opts.cost_model,
            block_size=bs,
            rank=base.rank,
            tol=tol,
            factor_dtype=base.factor_dtype,
        )
        mu = diagonal_shift(float(np.min(alphas)), n, base.alpha_convention)
        shift = mu if mu > 0 else None
        rho, rho_source = None, None
        if (
            probes.residual is not None
            and kernel is not None
            and mercer
            and opts.preconditioner == "nystrom"
            and _accepts(cm.cg_seconds, "rho")
            and (floor or _rho_matters(cm, solver, n, d, kernel, mu, tol, matvec, precision))
        ):
            rho = 0.0 if floor else probes.residual(C.probe_rank("nystrom", base.rank))
            rho_source = FLOOR_RHO_SOURCE if floor else None
        elif (
            adaptive
            and shift is not None
            and kernel is not None
            and mercer
            and hasattr(cm, "residual")
        ):
            # the adaptive factor's rank and ρ, from ρ measured on a subsample when it can
            # change the plan, else assumed
            measure = probes.residual is not None and (
                floor or _rho_matters(cm, solver, n, d, kernel, mu, tol, matvec, precision)
            )
            residual = _zero_residual if floor else probes.residual
            rank_est, rho, r, measured = adaptive_residual(
                n, mu, base.rank, cm, residual if measure else None
            )
            rho_source = (
                f"of the adaptive factor (rank about {rank_est} of at most {base.rank}), from ρ "
                f"at rank {r} "
                + (
                    FLOOR_RHO_SOURCE
                    if floor
                    else "measured on a subsample of the rows"
                    if measured
                    else "assumed"
                )
            )
            cm = make_cost_model(
                cost_model if cost_model is not None else opts.cost_model,
                block_size=bs, rank=rank_est, tol=tol, factor_dtype=base.factor_dtype,
            )  # fmt: skip
        variant = choose_cg_variant(
            n,
            d,
            kernel,
            resources.disk_bytes,
            matvec=matvec,
            precision=precision,
            cost_model=cm,
            shift=shift,
            tol=tol,
            rho=rho,
            n_targets=n_targets,
            kernel_dtype=base.kernel_dtype,
        )
        return precision, tol, cm, shift, rho, rho_source, variant

    def variants() -> list[tuple[str, str]]:
        """The product variants this fit's CG may run (as :func:`choose_cg_variant` weighs
        them)."""
        return variant_candidates(
            n, kernel, resources.disk_bytes, matvec=matvec,
            precision=normalize_precision(opts.cg_precision), n_targets=n_targets,
            kernel_dtype=base.kernel_dtype,
        )  # fmt: skip

    priced = None  # cg_pricing's result, computed once: ρ may be measured on the rows
    predicted: dict[str, float] = {}  # the predictions that decided (FitPlan.predicted_seconds)
    if solver == "auto" and resources.in_memory:
        has_primal = isinstance(kernel, Linear)
        choice = in_memory_choice(n, d, has_primal=has_primal, alpha=alphas)
        if choice == "primal":
            return replace(base, solver="primal"), (
                f"linear kernel with alpha > 0: the primal (n D² + D³/3 = "
                f"{primal_flops(n, d):.3g} flops) is cheaper than the dual "
                f"({dual_flops(n, d):.3g})"
            )
        need = dense_dual_bytes(n, d, n_targets, kernel_copies=int(ch.get("kernel_copies", 1)))
        budget = C.MEMORY_SAFETY_FRACTION * resources.memory_bytes
        if need <= budget:
            why = f"the in-memory dual for n_samples={n} needs {_gb(need)} and {_gb(budget)} is usable"
            # else only the dense dual; ρ is measured only when CG priced at its floor
            # (a perfect preconditioner) could replace the dense dual
            if kernel is None or not mercer or not one_alpha:
                return base, why
            may, floor_why, predicted = _cg_may_beat_dense(
                n, d, kernel, cg_pricing(solver, floor=True), variants()
            )
            if not may:  # the reason keeps both predictions: the user may name CG
                kept = replace(base, predicted_seconds=predicted)
                return kept, f"{why}; at best (ρ = 0), {floor_why}" if floor_why else why
            priced = cg_pricing(solver)
            beats, cg_why, predicted = _cg_beats_dense(n, d, kernel, priced)
            if not beats:
                kept = replace(base, predicted_seconds=predicted)
                return kept, f"{why}; {cg_why}" if cg_why else why
            reason, solver = f"{why}, but {cg_why}", "cg"
    if solver == "auto" and resources.in_memory:  # the in-memory dual does not fit
        only_dense = (
            "a callable or precomputed kernel"
            if kernel is None
            else "per-target alphas"
            if not one_alpha
            else None
        )
        if only_dense:
            return base, (
                f"the in-memory dual for n_samples={n} needs {_gb(need)} of {_gb(budget)} "
                f"usable, but {only_dense} can only be solved in memory"
            )
        reason = (
            f"the in-memory dual for n_samples={n} does not fit in memory ({_gb(need)} "
            f"needed, {_gb(budget)} usable); using the out-of-core solvers"
        )
        solver = "auto"
    if solver in ("dense", "primal"):
        return replace(base, solver=solver), reason

    def cholesky_or_cg(priced: tuple, variant: tuple | None = None, margin: float = 0.0):
        """:func:`out_of_core_choice` with CG as ``priced`` prices it, running its
        product ``variant`` (default: the priced one), chosen on time only when faster by
        more than ``margin`` seconds."""
        _, tol, cm, shift, rho, rho_source, chosen = priced
        matvec, precision = (variant or chosen)[:2]
        return out_of_core_choice(
            n,
            d,
            resources.disk_bytes,
            resources.memory_bytes,
            rank=rank,
            factor_itemsize=4 if adaptive else 8,
            kernel=kernel,
            cost_model=cm,
            shift=shift,
            tol=tol,
            rho=rho,
            cg_options={"matvec": matvec, "precision": precision},
            rho_source=rho_source,
            cg_margin=margin,
        )

    margin = 0.0
    if solver == "auto" and priced is None and probes.residual is not None:
        # measuring ρ pays only when CG could save more than it costs: priced at its floor
        # (ρ = 0, any product variant), CG must beat the Cholesky by the probe's price
        floor = cg_pricing(solver, floor=True)
        cm = floor[2]
        if floor[4] is not None:  # (else CG's price takes no ρ: nothing to measure)
            price = getattr(cm, "probe_seconds", None)
            r = C.probe_rank(opts.preconditioner, base.rank)
            margin = 0.0 if price is None else price(n, d, r)
            if all(cholesky_or_cg(floor, v, margin)[0] == "cholesky" for v in variants()):
                priced = floor  # the Cholesky, whatever ρ is: not measured
            else:
                margin = 0.0
    priced = priced or cg_pricing(solver)
    precision, tol, cm, shift, rho, rho_source, variant = priced
    if solver == "auto":
        name, why, predicted = cholesky_or_cg(priced, margin=margin)
        if name == "cg" and not mercer:
            name, why = "cholesky", f"{why}; but the kernel is not known to be PSD"
        reason = why if reason.startswith("requested") else f"{reason}: {why}"
        solver = name
    if solver == "cholesky":
        plan = replace(
            base, solver="cholesky", matvec="stored", block_size=block_for(solver),
            predicted_seconds=predicted,
        )  # fmt: skip
        if factor_dtype == "auto":
            risk = probes.float32_risk if mercer and kernel is not None else None
            dt, why = choose_factor_dtype(n, shift, risk=risk)
            plan = replace(plan, factor_dtype=dt, factor_dtype_auto=True)
            reason = f"{reason}; {why}"
        return plan, reason
    matvec, precision, why = variant
    plan = replace(
        base, solver="cg", matvec=matvec, cg_precision=precision, block_size=block_for("cg"),
        predicted_seconds=predicted,
    )  # fmt: skip
    return plan, f"{reason}; {why}"


def _cg_may_beat_dense(
    n: int, d: int, kernel: Any, floor: tuple, variants: list[tuple[str, str]]
) -> tuple[bool, str, dict[str, float]]:
    """Whether CG could replace the in-memory dense dual for some ρ, and the two
    predictions: the rule of :func:`_cg_beats_dense` with CG priced at its ``floor``
    (``cg_pricing(..., floor=True)``: ρ = 0) and its fastest product variant. When not,
    measuring ρ on a subsample (about 1 s at 4,000 rows) cannot change the plan, and the
    dense dual is taken without it."""
    return _cg_beats_dense(n, d, kernel, floor, variants)


def _cg_beats_dense(
    n: int, d: int, kernel: Any, priced: tuple, variants: list[tuple[str, str]] | None = None
) -> tuple[bool, str, dict[str, float]]:
    """Whether matrix-free CG replaces the in-memory dense dual that fits, and the two
    predictions that decide it, in words and by solver (``""`` and ``{}`` when the model
    has no dense price): for a known
    PSD kernel with one λ > 0 (the caller checks the kernel and λs; ``priced`` is CG as
    the plan prices it), when the cost model predicts CG
    :data:`~pipeline.constants.IN_MEMORY_CG_MARGIN` times faster than the dense solve
    (a large, well-conditioned problem: flights' λ = 1). CG runs its priced product
    variant, or the fastest of ``variants`` when given."""
    _, tol, cm, shift, rho, _, variant = priced
    if shift is None or not hasattr(cm, "dense_seconds"):
        return False, "", {}
    dense_s = cm.dense_seconds(n, d)
    cg_s = min(
        _seconds(cm.cg_seconds, n, d, kernel, shift=shift, tol=tol, rho=rho, matvec=m, precision=p)
        for m, p in (variants or [variant[:2]])
    )
    beats = cg_s * C.IN_MEMORY_CG_MARGIN < dense_s
    return (
        beats,
        f"matrix-free CG is predicted at {cg_s:.3g} s against {dense_s:.3g} s for the dense "
        f"solve ({'more' if beats else 'not more'} than {C.IN_MEMORY_CG_MARGIN:g}x faster)",
        {"dense": dense_s, "cg": cg_s},
    )
