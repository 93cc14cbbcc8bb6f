"""Checkpointed pipeline stages, wired by name, and the runner that resumes them.

Stages (in order): ``ingest`` → ``select`` (only with a ``cv`` section: λ and
kernel parameters by cross-validation, which then replace the configured ones
downstream) → ``gram`` (only when the solver reads a stored
Gram) → ``solve`` → ``model`` (the fitted-model artifact) → ``predict`` (test
rows and an optional batch input) → ``evaluate`` (metrics on the test rows,
next to scikit-learn's). Each is a plain function ``run(stage_dir, inputs, **params)``
of typed arguments (the config's frozen sections, :mod:`pipeline.stages.config`) that
returns a typed output (:mod:`pipeline.stages.outputs`); :func:`default_stages`
wires them. The runner fingerprints and records each stage's arguments as JSON
(:meth:`pipeline.stages.config.RunConfig.stage_params`); :func:`typed_params` turns that
JSON into the typed arguments just before the call, so fingerprints are those of
the JSON.

``solve``, ``model``, ``predict`` and ``evaluate`` keep their results per
configuration, in ``RUN_DIR/results/<key>/`` (:mod:`pipeline.stages.results`);
``ingest``, ``select`` and ``gram`` are shared. :func:`run_status` lists the
configurations with their metrics, :func:`latest_model` names the latest model.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from types import ModuleType
from typing import Any

import pipeline.stages.config as config
from pipeline.linalg.nystrom_solve import NYSTROM_RECIPE
from pipeline.options import spelt_as_before

# the module, not its function: `pipeline.stages.source_identity` stays the submodule
from pipeline.stages import source_identity as _identity
from pipeline.stages.catalog import DATASETS, Catalog
from pipeline.stages.config import RunConfig, load_config
from pipeline.stages.lock import LockHeldError, RunLock
from pipeline.stages.manifest import Manifest, StageRecord
from pipeline.stages.outputs import IngestOutput
from pipeline.stages.runner import (
    RunDirConflict,
    RunReport,
    Stage,
    StageFailed,
    recorded_node_output,
    run_stages,
)
from pipeline.stages.solve import plan_record, recorded_plan
from pipeline.stages.stage import PER_CONFIG_STAGES, STAGE_NAMES, STAGE_WIRING, Node
from pipeline.stages.status import configurations, latest_model, run_status
from pipeline.stages.verify import verify_gram, verify_metrics, verify_model, verify_predictions

log = logging.getLogger("pipeline.stages")


#: JSON argument -> the config section it is validated into, per stage; the keys a
#: section spreads over (``**section.model_dump()``) are gathered back into it
_SECTIONS: dict[str, dict[str, Any]] = {
    "ingest": {"data": "DataConfig", "split": "SplitConfig", "preprocess": "PreprocessConfig"},
    "solve": {"solver": "SolverConfig"},
    "predict": {"predict": ("PredictConfig", ("input", "columns", "output"))},
    "evaluate": {
        "evaluate": ("EvaluateConfig", ("metrics", "baseline", "baseline_max_rows", "compare"))
    },
}


def typed_params(stage: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """A stage's JSON arguments (what the runner fingerprints) as its typed arguments.

    Each config section among them is validated into its frozen model from
    :mod:`pipeline.stages.config` (``solver`` into :class:`~pipeline.stages.config.SolverConfig`,
    ...; the predict and evaluate sections, whose keys the JSON holds at the top
    level, are gathered into ``predict`` and ``evaluate``). A section that is
    already a model is kept. Other arguments (the kernel spec, λ, block size)
    pass through.

    Parameters
    ----------
    stage : str
        The stage's name (a key of :data:`STAGE_WIRING`).
    params : mapping
        Its arguments as :meth:`~pipeline.stages.config.RunConfig.stage_params` gives them.

    Returns
    -------
    dict
        The keyword arguments of the stage's ``run``.
    """

    out = dict(params)
    for arg, kind in _SECTIONS.get(stage, {}).items():
        if isinstance(kind, tuple):
            model, keys = getattr(config, kind[0]), kind[1]
            if arg not in out:
                out[arg] = {k: out.pop(k) for k in keys if k in out}
        else:
            model = getattr(config, kind)
        out[arg] = model.model_validate(out.get(arg, {}))
    return out


def _typed(stage: str, module: ModuleType):
    """``module.run`` with typed arguments (looked up per call: a test may replace it)."""

    def call(stage_dir, inputs, **params):
        return module.run(stage_dir, inputs, **typed_params(stage, params))

    call.__name__ = f"{module.__name__}.run"
    return call


def _ingest_output(outputs: Mapping[str, Any]):

    return IngestOutput.from_json(outputs["ingest"])


def _plan_inputs(params: Mapping[str, Any], outputs: Mapping[str, Any]) -> dict[str, Any]:
    """What the fit plan is computed from: the solve stage's arguments (with the λ and
    kernel the select stage chose) and the ingested rows' shape and content hash.
    Not the free disk and memory: they are measured once, when the plan is computed."""
    ing = _ingest_output(outputs)
    return {
        "solve": _selected(dict(params["solve"]), outputs),
        "n_train": ing.n_train,
        "n_features": ing.n_features,
        "x_fingerprint": ing.x_fingerprint,
    }


def _plan(params: Mapping[str, Any], outputs: Mapping[str, Any]) -> dict[str, Any]:
    """The fit plan of the solve stage's arguments (:func:`pipeline.stages.solve.plan_record`)."""
    solve = typed_params("solve", _selected(dict(params["solve"]), outputs))
    return plan_record(_ingest_output(outputs), **solve)


#: the fit plan, computed once per configuration before the gram stage and recorded in
#: ``RUN_DIR/plan.json``; the gram stage (whether it runs) and the solve stage read it
PLAN = Node("plan", inputs=_plan_inputs, func=_plan)


def recorded_fit_plan(
    run_dir: str | Path, manifest: Manifest | None = None
) -> dict[str, Any] | None:
    """The fit plan recorded for the run directory's latest configuration, as the ``plan``
    node wrote it (``{"plan": FitPlan.to_dict(), "reason": str}``): what its solve stage
    runs or ran, also before that stage has finished. None when none is recorded (no
    configuration yet, or a run directory from before plans were recorded). Nothing is
    computed or measured."""
    manifest = Manifest.load(run_dir) if manifest is None else manifest
    cfg = manifest.results.get(manifest.latest) if manifest.latest is not None else None
    solve = (cfg.params or {}).get("solve") if cfg is not None else None
    outputs = {n: r.outputs for n, r in manifest.stages.items() if r.status == "done"}
    if not solve or "ingest" not in outputs:
        return None
    try:
        return recorded_node_output(run_dir, PLAN, {"solve": solve}, outputs)
    except (KeyError, TypeError, ValueError):  # a manifest of another version
        return None


def _gram_enabled(params: Mapping[str, Any], outputs: Mapping[str, Any]) -> bool:
    """Whether the recorded fit plan reads a stored Gram."""
    return recorded_plan(outputs[PLAN.name])[0].needs_gram


def _has_test_or_batch(params: Mapping[str, Any], outputs: Mapping[str, Any]) -> bool:
    predict = typed_params("predict", params["predict"])["predict"]
    return bool(_ingest_output(outputs).X_test) or bool(predict.input)


def _has_test(params: Mapping[str, Any], outputs: Mapping[str, Any]) -> bool:
    return bool(_ingest_output(outputs).X_test)


def _has_cv(params: Mapping[str, Any], outputs: Mapping[str, Any]) -> bool:
    return bool(params.get("select", {}).get("cv"))


def _selected(params: dict[str, Any], outputs: Mapping[str, Any]) -> dict[str, Any]:
    """The stage's arguments with the λ and kernel the select stage chose (if it ran)."""
    sel = outputs.get("select")
    if not sel:
        return params
    out = dict(params)
    if "kernel" in out:
        out["kernel"] = sel["kernel"]
    if "lam" in out:
        out["lam"] = sel["lam"]
    return out


def _ingest_source(params: dict[str, Any], outputs: Mapping[str, Any]) -> dict[str, Any]:
    """The ingest arguments plus the content identity of the data it will read."""

    ident = _identity.source_identity(params["data"], params.get("split"))
    return {**params, "source_identity": ident}


def _predict_input(params: dict[str, Any], outputs: Mapping[str, Any]) -> dict[str, Any]:
    """The predict arguments (with the selected λ/kernel) plus the batch input's identity."""
    out = _selected(params, outputs)
    if out.get("input"):
        out = {**out, "input_identity": _identity.path_identity(str(out["input"]))}
    return out


#: cheap checks of a complete stage's final outputs before it is skipped
_VERIFY = {
    "gram": verify_gram,
    "model": verify_model,
    "predict": verify_predictions,
    "evaluate": verify_metrics,
}

#: what a complete solve needs only to resume: freed when a run moves to another config
_SCRATCH = {"solve": tuple(DATASETS[name].path for name in ("factor", "cg"))}

_ENABLED = {
    "select": _has_cv,
    "gram": _gram_enabled,
    "predict": _has_test_or_batch,
    "evaluate": _has_test,
}
#: stages whose kernel and λ come from the select stage when it runs
_RESOLVE = {name: _selected for name in ("gram", "solve", "model", "predict", "evaluate")}
#: the stages that read the fit plan: the gram stage runs only when it reads a stored Gram
_READS = {"gram": (PLAN,), "solve": (PLAN,)}


def _solve_identity(params: dict[str, Any]) -> dict[str, Any]:
    """The solve stage's arguments as its fingerprint sees them: the solver section
    spelt as before issue #45 changed its defaults (:func:`pipeline.options.spelt_as_before`);
    a Nyström solve also names its arithmetic's version
    (:data:`~pipeline.linalg.nystrom_solve.NYSTROM_RECIPE`), so a solve of an older one is
    recomputed, never kept."""
    solver = params.get("solver")
    out = params
    if solver and "preconditioner" in solver:
        out = {**params, "solver": spelt_as_before("solve", solver)}
    if solver and solver.get("method") == "nystrom":
        out = {**out, "nystrom_recipe": NYSTROM_RECIPE}
    return out


def _select_identity(params: dict[str, Any]) -> dict[str, Any]:
    """The select stage's arguments as its fingerprint sees them: the search's CG options
    spelt as before issue #45 changed their defaults (:func:`pipeline.options.spelt_as_before`);
    a Nyström search names its arithmetic's version, as the solve stage does."""
    cv = params.get("cv")
    if not cv:
        return params
    out = {**params, "cv": spelt_as_before("select", cv)}
    if cv.get("solver") == "nystrom":
        out["nystrom_recipe"] = NYSTROM_RECIPE
    return out


def _evaluate_identity(params: dict[str, Any]) -> dict[str, Any]:
    """The evaluate stage's arguments as its fingerprint sees them: with ``compare`` it
    fits Nyström models, so it names their arithmetic's version, as the solve stage does."""
    if not (params.get("compare") or {}).get("nystrom"):
        return params
    return {**params, "nystrom_recipe": NYSTROM_RECIPE}


#: the stages whose fingerprint sees a view of their arguments (a changed default spelt
#: as before, so runs made before keep their identity; a Nyström arithmetic's version)
_IDENTITY = {"solve": _solve_identity, "select": _select_identity, "evaluate": _evaluate_identity}


#: the data's content identity is part of the fingerprint: a changed file reruns from ingest
_RESOLVE["ingest"] = _ingest_source
_RESOLVE["predict"] = _predict_input


def default_stages() -> list[Stage]:
    """The pipeline's stages in order, wired by name to their modules."""
    return [
        Stage(
            name,
            _typed(name, module),
            after=after,
            enabled=_ENABLED.get(name),
            resolve=_RESOLVE.get(name),
            verify=_VERIFY.get(name),
            per_config=name in PER_CONFIG_STAGES,
            scratch=_SCRATCH.get(name, ()),
            reusable=name == "solve",  # alpha: copied from an equal configuration's solve
            reads=_READS.get(name, ()),
            identity=_IDENTITY.get(name),
        )
        for name, (module, after) in STAGE_WIRING.items()
    ]


def _took_over(run_dir: str | Path, lock: RunLock):
    """The session of :func:`run_config` when its caller brings none: one warning when
    the lock of a killed run was taken over."""
    if lock.took_over:
        log.warning(
            "took over the lock of the killed run (pid %s, no longer alive); resuming",
            lock.took_over.get("pid"),
        )
    return contextlib.nullcontext()


def run_config(
    config: Any,
    run_dir: str | Path | None = None,
    *,
    overrides: Sequence[str] = (),
    force_new: bool = False,
    until: str | None = None,
    on_event: Callable[[str, str, dict[str, Any]], None] | None = None,
    session: Callable[[Any, RunLock], AbstractContextManager[Any]] | None = None,
) -> RunReport:
    """Run a config's stages in its run directory; ``pipeline.run`` and ``krr run``.

    The run directory's lock is held while the stages run (a lock left by a killed
    run on this host is taken over, with a warning); complete stages are skipped
    and partial ones resume from their completion records. The tile graphs run on
    the active Dask client when there is one (``distributed.Client``), else on
    threads of this process: unlike ``krr run``, no cluster is started here.

    Parameters
    ----------
    config : path, mapping or RunConfig
        A YAML config file, a mapping of its keys, or a config from
        :func:`pipeline.stages.config.load_config`.
    run_dir : path or URL, optional
        The run directory; default: the config's ``run_dir`` (``runs/<name>``).
    overrides : sequence of str
        ``key=value`` overrides, as on the ``krr run`` command line (only with a
        path or a mapping: a loaded config is final).
    force_new : bool
        Start over in a run directory that holds a run on other data.
    until : str, optional
        Stop after this stage.
    on_event : callable, optional
        ``on_event(stage, event, info)``, see :func:`run_stages`.
    session : callable, optional
        ``session(run_dir, lock)``: a context manager entered once the lock is held,
        around the stages, and exited before the lock is released (``krr run`` opens
        its ``run.log`` and its Dask client there, and maps errors to exit codes). If
        what it gives on entry is callable, it is called with the report before the
        session exits. It says itself that a killed run's lock was taken over.

    Returns
    -------
    RunReport
        What ran, what was complete, the timings; ``report.outputs[stage]`` holds
        each complete stage's outputs (e.g. ``report.outputs["model"]["path"]``).

    Raises
    ------
    LockHeldError
        Another run holds the run directory.
    StageFailed
        A stage failed (its cause is ``__cause__``); rerun to resume.
    ValueError
        ``overrides`` were given with a loaded config.
    """

    if isinstance(config, RunConfig):
        if overrides:
            raise ValueError(
                f"overrides {list(overrides)} given with a loaded config; pass them to "
                "pipeline.load_config(path, overrides) instead, or pass the config's path"
            )
        cfg = config
    else:
        cfg = load_config(config, overrides)
    run_dir = cfg.resolved_run_dir() if run_dir is None else run_dir
    recorded = cfg.model_dump(mode="json", by_alias=True)
    if isinstance(recorded.get("storage"), dict) and recorded["storage"].get("options"):
        recorded["storage"] = {**recorded["storage"], "options": "<not recorded>"}  # credentials
    lock = RunLock(run_dir).acquire()
    try:
        with (session or _took_over)(run_dir, lock) as finish:
            report = run_stages(
                run_dir,
                default_stages(),
                cfg.stage_params(),
                identity=cfg.identity(),
                config=recorded,
                force_new=force_new,
                until=until,
                on_event=on_event,
            )
            if callable(finish):
                finish(report)
        return report
    finally:
        lock.release()


__all__ = [
    "PER_CONFIG_STAGES",
    "Catalog",
    "STAGE_NAMES",
    "LockHeldError",
    "Manifest",
    "RunDirConflict",
    "RunLock",
    "RunReport",
    "Stage",
    "StageFailed",
    "StageRecord",
    "configurations",
    "default_stages",
    "latest_model",
    "recorded_fit_plan",
    "run_config",
    "run_stages",
    "run_status",
    "typed_params",
]
