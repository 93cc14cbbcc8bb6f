"""Solve stage: the dual coefficients α of (K + shift·I) α = y.

``cholesky`` factors the stored Gram tile by tile (:func:`pipeline.linalg.cholesky.tile_cholesky`,
checkpointed per factor tile) and substitutes blockwise. ``cg`` runs
preconditioned conjugate gradients (:func:`pipeline.linalg.cg_checkpoint.resumable_cg`,
checkpointed every ``checkpoint_every`` iterations) on the stored Gram or
matrix-free from X. ``auto`` is decided by :func:`pipeline.plan.fit_plan.plan_fit`
(the same rule as ``KernelRidge(solver="auto", store=...)``).

The plan is computed once per configuration, by :func:`plan_record`, before the gram
stage (which runs only when the plan reads a stored Gram), and recorded in
``RUN_DIR/plan.json`` (the ``plan`` node, :class:`pipeline.stages.stage.Node`): the
gram stage and this stage read that record, and a resume reads it back while its
inputs are the same, so the free disk and memory are measured once, before the Gram
takes its share of the disk.

α (``n_train x n_outputs``) is small and is written to ``{stage_dir}/alpha.npy``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.errors import ConfigError, IndefiniteKernelError, SolveNotConverged
from pipeline.fit import execute, log_plan, measure_resources, row_probes
from pipeline.kernels import kernel_from_spec, make_kernel
from pipeline.linalg.cholesky_inplace import GramTileRecomputer
from pipeline.linalg.gram import open_gram
from pipeline.options import solver_choices
from pipeline.plan.fit_plan import FitPlan, plan_fit
from pipeline.stages.catalog import Catalog, stage_catalog
from pipeline.stages.config import SolverConfig
from pipeline.stages.ingest import open_rows
from pipeline.stages.outputs import GramOutput, IngestOutput, SolveOutput

log = logging.getLogger("pipeline.stages")


def _choices(solver: SolverConfig, **extra: Any) -> dict[str, Any]:
    """The config's solver section in :func:`~pipeline.plan.fit_plan.plan_fit`'s vocabulary
    (the option tree's knobs, :class:`pipeline.options.SolverOptions`); ``extra`` adds the
    fit's own choices and overrides a knob (in place, the factor takes the Gram's dtype)."""
    return solver_choices(**{**solver.options().choices(), **extra})


def stage_plan(
    solver: SolverConfig | Mapping[str, Any],
    n_train: int,
    n_features: int = 1,
    *,
    kernel: Any = None,
    store: Any = None,
    X: Any = None,
    **choices: Any,
):
    """The fit plan of ``krr run`` and its reason (:func:`pipeline.plan.fit_plan.plan_fit`).

    ``krr run`` always solves out of core (its stages are checkpointed), so
    in-memory solvers are not planned; resources are measured where ``store`` lives.
    ``X`` (the stored training rows, e.g. a Dask array) lets ``auto`` measure CG's
    preconditioner on a subsample, as ``KernelRidge`` does.
    """
    solver = SolverConfig.model_validate(solver)

    k = None
    if kernel is not None:
        k = kernel_from_spec(kernel)
    resources = measure_resources(store, in_memory=False, device=solver.device)
    return plan_fit(
        int(n_train),
        int(n_features),
        k,
        resources,
        _choices(solver, **choices),
        probes=row_probes(X, k),
    )


def plan_record(
    ingest: IngestOutput | Mapping[str, Any],
    *,
    kernel: dict[str, Any],
    lam: float,
    lam_convention: str,
    block_size: int,
    dtype: str,
    solver: SolverConfig | Mapping[str, Any],
) -> dict[str, Any]:
    """The fit plan of this stage's arguments on the ingested rows, as the ``plan``
    node records it: ``{"plan": FitPlan.to_dict(), "reason": str}`` (read it with
    :func:`recorded_plan`).

    ``solver`` is the config's solver section; ``dtype`` is the Gram's storage: an
    in-place factor (``keep_gram: false``) takes it when ``factor_dtype`` is ``auto``.
    """
    ing = IngestOutput.from_json(ingest)
    try:  # the kernel against the data's width (an ARD length-scale vector), before any work
        make_kernel(kernel).check_n_features(ing.n_features)
    except ValueError as e:
        raise ConfigError(f"kernel: {e}") from None
    solver = SolverConfig.model_validate(solver)
    X_train = open_rows(ing, "X_train")
    in_place = {}
    if solver.factor_dtype == "auto":
        # the rule judges float32 on the rows in memory (the refinement reads them);
        # in place the factor takes the gram stage's dtype, chosen before this stage
        X_train = np.asarray(X_train.compute())
        if not solver.keep_gram:
            in_place = {"factor_dtype": dtype}
    plan, reason = stage_plan(
        solver,
        ing.n_train,
        ing.n_features,
        kernel=kernel,
        store=ing.store,
        X=X_train,
        alpha=lam,
        alpha_convention=lam_convention,
        block_size=block_size,
        **in_place,
    )  # ``dtype`` is the Gram's storage only: every product of the solve is float64
    return {"plan": plan.to_dict(), "reason": reason}


def recorded_plan(record: Mapping[str, Any]):
    """``(FitPlan, reason)`` from what :func:`plan_record` returned (or its JSON). A key
    :class:`~pipeline.plan.fit_plan.FitPlan` no longer has is ignored, and one it gained
    takes its default (a plan recorded by another version still resumes its run):
    :meth:`FitPlan.from_dict <pipeline.plan.fit_plan.FitPlan.from_dict>`."""
    return FitPlan.from_dict(record["plan"]), str(record["reason"])


def _open_gram(inputs: dict[str, dict[str, Any]]):
    g = inputs.get("gram")
    if not g:
        raise ValueError("the solver needs the stored Gram, but the gram stage did not run")
    gram = GramOutput.from_json(g)  # the gram stage's typed output
    return open_gram(gram.store, gram.name)


def _solve_cholesky(stage_dir, inputs, y, plan, kernel=None, X_mem=None) -> tuple[np.ndarray, dict]:
    gram = _open_gram(inputs)
    recompute = X = None
    # a float32 factor, or a factor of a float32 Gram, solves a single-precision
    # system: its alpha is refined to float64 from X_train (never returned as it is)
    single = np.float32 in (np.dtype(plan.factor_dtype), np.dtype(gram.dtype))
    if not plan.options.keep_gram or single:  # X_train, unless the plan already read it
        X = X_mem if X_mem is not None else _rows_in_memory(inputs)
    if not plan.options.keep_gram:
        # in place: the factor replaces the gram stage's tiles; a tile an earlier lambda
        # replaced is rebuilt from the stored X_train (tile_cholesky logs why)
        recompute = GramTileRecomputer.for_gram(gram, X, kernel)
    # refined with matrix-free products from X_train (in place there is no Gram left
    # to refine against; a kept float32 Gram is not the float64 K; and X is faster)
    factor_store, factor_name = stage_catalog("solve", stage_dir).store("factor")
    res = execute(
        plan,
        X if single else None,
        y,
        kernel if single else None,
        gram=gram,
        factor_store=factor_store,
        factor_name=factor_name,
        recompute_tile=recompute,
        progress=True,  # shown as pipeline.engine.progress's mode says (off with krr -q)
    )
    factor = res.factor
    refine = {
        k: v
        for k, v in res.info.items()
        if k not in ("factor_tiles_computed", "jitter", "device")  # (device: a GPU factor's)
    }
    info = {
        "shift": factor.shift,
        "factor_dtype": str(factor.L.dtype),
        **({"refinement": refine} if refine else {}),
        "jitter": factor.jitter,
        "factor": {
            "store": factor.L.store,
            "name": factor.L.name,
            "tiles": factor.L.grid.n_lower_tiles(),
        },
        "factor_tiles_computed": res.info["factor_tiles_computed"],
        **({"device": res.info["device"]} if "device" in res.info else {}),
    }
    return res.dual_coef, info


def _rows_in_memory(inputs) -> np.ndarray:
    """X_train as a numpy array (the refinement's float64 products read it)."""
    return np.asarray(open_rows(IngestOutput.from_json(inputs["ingest"]), "X_train").compute())


def check_cg_kernel(kernel: dict[str, Any]) -> None:
    """Refuse a kernel that is not known to be PSD before a CG solve (as ``auto`` routing does).

    Raises
    ------
    IndefiniteKernelError
        The kernel's ``is_mercer`` is False (e.g. sigmoid).
    """
    k = kernel_from_spec(kernel)
    if not getattr(k, "is_mercer", True):
        raise IndefiniteKernelError(
            f"solver 'cg' needs a positive semi-definite kernel, and {k!r} is not one "
            "(is_mercer is False): CG can break down or return a wrong alpha on an indefinite "
            "K + lambda*I. Use solver.method=cholesky (it names the shift that fails) or a "
            "Mercer kernel such as rbf."
        )


def _solve_cg(stage_dir, inputs, y, *, kernel, plan, solver):
    check_cg_kernel(kernel)
    catalog = stage_catalog("solve", stage_dir)
    if plan.matvec == "stored":
        gram, X = _open_gram(inputs), None
        if np.dtype(gram.dtype) == np.float32:  # float64 residuals from X_train (fit.execute)
            X = _rows_in_memory(inputs)
    else:
        gram, X = None, open_rows(IngestOutput.from_json(inputs["ingest"]), "X_train")
    fit = execute(
        plan, X, y, kernel, gram=gram, cg_dir=str(catalog.path("cg")), progress=True,
        # an unconverged solve resumed with another max_iter (a new configuration) resumes
        # from another configuration's checkpoint with the same iterates
        cg_adopt=catalog.in_other_configurations("cg"),
    )  # fmt: skip
    res, shift = fit.cg, fit.shift
    history_crc = catalog.save("cg_history", np.asarray(res.history))
    _check_converged(res, solver)
    info = {
        "shift": float(shift),
        "n_iter": int(res.n_iter),
        "resumed_from": int(res.start_iter),
        "converged": bool(res.converged),
        "rel_residual": np.asarray(res.rel_residual).tolist(),
        "history": str(catalog.path("cg_history")),
        "history_crc32c": history_crc,
    }
    return res.x, info


def _check_converged(res: Any, solver: SolverConfig) -> None:
    """Refuse an unconverged CG solve (exit 4) unless ``solver.allow_unconverged``."""
    if not res.converged and not solver.allow_unconverged:
        worst = float(np.max(res.rel_residual))
        raise SolveNotConverged(
            f"CG did not converge: relative residual {worst:.3e} > tol {res.tol:.1e} after "
            f"{res.n_iter} iterations (max_iter {res.max_iter}; a breakdown means K + lambda*I "
            "is not numerically positive definite). No alpha was written. Raise "
            "solver.max_iter, use solver.preconditioner=nystrom, loosen solver.tol or raise "
            "lambda; or set solver.allow_unconverged=true to accept this solve."
        )


def _solve_nystrom(stage_dir, inputs, y, *, kernel, plan, solver):
    """Nyström KRR (FALKON): X_train streamed from the ingest store in row blocks, CG
    checkpointed in ``solve/cg``; β is the stage's α, ``centres`` the rows it belongs to
    (the model stage's X_fit)."""
    catalog = stage_catalog("solve", stage_dir)
    X = open_rows(IngestOutput.from_json(inputs["ingest"]), "X_train")
    fit = execute(plan, X, y, kernel, cg_dir=str(catalog.path("cg")), progress=True)
    res = fit.cg
    _check_converged(res, solver)
    info = {
        "shift": float(fit.shift),
        "n_iter": int(res.n_iter),
        "resumed_from": int(res.start_iter),
        "converged": bool(res.converged),
        "rel_residual": np.asarray(res.rel_residual).tolist(),
        "n_centers": int(fit.info["n_centers"]),
        "centres": fit.info["centres"],
    }
    return fit.dual_coef, info


def run(
    stage_dir: Path,
    inputs: dict[str, dict[str, Any]],
    *,
    kernel: dict[str, Any],
    lam: float,
    lam_convention: str,
    block_size: int,
    dtype: str,
    solver: SolverConfig,
) -> SolveOutput:
    """Solve for α with the configured solver; write ``alpha.npy``.

    The solver and its options are the fit plan the runner recorded for these
    arguments (``inputs["plan"]``, the ``plan`` node: :func:`plan_record`, computed
    once before the gram stage); called without one, this computes it. ``solver`` is
    the config's frozen solver section; ``dtype`` is part of the fingerprint through
    the Gram; the solve itself is float64.
    """
    ing = IngestOutput.from_json(inputs["ingest"])
    y = np.asarray(open_rows(ing, "y_train").compute(), dtype=np.float64)
    record = inputs.get("plan") or plan_record(
        ing,
        kernel=kernel,
        lam=lam,
        lam_convention=lam_convention,
        block_size=block_size,
        dtype=dtype,
        solver=solver,
    )
    plan, reason = recorded_plan(record)
    method = plan.solver
    log_plan(plan, reason, origin="krr run", logger=log)
    if method == "cholesky":
        alpha, info = _solve_cholesky(stage_dir, inputs, y, plan, kernel)
    elif method == "nystrom":
        alpha, info = _solve_nystrom(stage_dir, inputs, y, kernel=kernel, plan=plan, solver=solver)
    else:
        alpha, info = _solve_cg(stage_dir, inputs, y, kernel=kernel, plan=plan, solver=solver)
    rows = len(info["centres"]) if method == "nystrom" else y.shape[0]  # (β: one per centre)
    alpha = np.asarray(alpha, dtype=np.float64).reshape((rows, *y.shape[1:]))
    catalog = stage_catalog("solve", stage_dir)
    crc = catalog.save("alpha", alpha)
    return SolveOutput(
        method=method,
        alpha=str(catalog.path("alpha")),
        alpha_crc32c=crc,
        lam=lam,
        lam_convention=lam_convention,
        plan=plan.to_dict(),
        plan_reason=reason,
        details=info,
    )


def model_rows(ing: IngestOutput, outputs: SolveOutput) -> Any:
    """The training rows α belongs to, lazily: X_train, or its centres when the solve
    was Nyström's (α is then β, one per centre; the model and predict stages' X_fit)."""
    X = open_rows(ing, "X_train")
    if outputs.method == "nystrom":
        X = X[np.asarray(outputs.details["centres"], dtype=np.int64)]
    return X


def load_alpha(outputs: SolveOutput | Mapping[str, Any]) -> np.ndarray:
    """α from the solve stage's outputs, checked against the CRC-32C recorded there.

    Raises
    ------
    CorruptFileError
        ``alpha.npy`` is missing, damaged, or has no recorded checksum; ``krr
        run`` then reruns the solve stage.
    """
    if isinstance(outputs, SolveOutput):
        path, crc = outputs.alpha, outputs.alpha_crc32c
    else:
        path, crc = outputs["alpha"], outputs.get("alpha_crc32c")
    # read where the solve stage recorded it (a configuration adopted from an older
    # layout, or copied from another one, keeps its recorded paths)
    return Catalog().load("alpha", path=path, crc32c=crc)
