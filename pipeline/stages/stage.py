"""What a stage is, and the pipeline's stages by name.

:class:`Stage` (a named function with its upstream stages), its fingerprint
(:func:`stage_fingerprint`), :class:`RunReport` (what one run of the stages did), and
:data:`STAGE_WIRING` (each stage of ``krr run``: its module and upstream stages, in order).
The runner (:mod:`pipeline.stages.runner`), its per-configuration results
(:mod:`pipeline.stages.results`), its recovery (:mod:`pipeline.stages.recovery`) and a run
directory's status (:mod:`pipeline.stages.status`) all read them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from pipeline.stages import evaluate, gram, ingest, model, predict, select, solve
from pipeline.stages.manifest import Manifest
from pipeline.storage import fingerprint_obj

#: stage name -> (its module, whose ``run`` is the stage; upstream stages)
STAGE_WIRING: dict[str, tuple[ModuleType, tuple[str, ...]]] = {
    "ingest": (ingest, ()),
    "select": (select, ("ingest",)),
    "gram": (gram, ("ingest",)),
    "solve": (solve, ("ingest", "gram")),
    "model": (model, ("ingest", "solve")),
    "predict": (predict, ("ingest", "solve")),
    "evaluate": (evaluate, ("ingest", "predict")),
}
STAGE_NAMES = tuple(STAGE_WIRING)
#: stages whose results are kept per configuration, in ``results/<key>/`` (see
#: :mod:`pipeline.stages.results`); the others are shared by every configuration
PER_CONFIG_STAGES = ("solve", "model", "predict", "evaluate")


StageFunc = Callable[..., dict[str, Any]]
#: ``enabled(params_by_stage, outputs_so_far) -> bool``
EnabledFunc = Callable[[Mapping[str, dict[str, Any]], Mapping[str, dict[str, Any]]], bool]
#: ``resolve(stage_params, outputs_so_far) -> stage_params``
ResolveFunc = Callable[[dict[str, Any], Mapping[str, dict[str, Any]]], dict[str, Any]]
#: ``f(params_by_stage, outputs_so_far) -> dict`` (JSON-able): a node's inputs or output
NodeFunc = Callable[[Mapping[str, Mapping[str, Any]], Mapping[str, dict[str, Any]]], dict[str, Any]]


@dataclass(frozen=True)
class Node:
    """A decision the stages read, computed once and recorded (a kedro-like node).

    The runner evaluates it when it first reaches a stage that names it in ``reads``:
    ``inputs(params, outputs)`` gives what it is computed from (JSON-able), and
    ``func(params, outputs)`` computes its output (JSON-able) from the stages'
    arguments and the outputs of the stages before. The output is recorded in
    ``{run_dir}/{name}.json`` under the fingerprint of its inputs; a later run (a
    resume, another pass after a recovery) reads it back while that fingerprint
    matches, instead of computing it again (see :func:`pipeline.stages.runner.node_output`).
    A node has no directory and no manifest record, and it does not enter any stage's
    fingerprint: it says *how* a stage computes, not *what*.

    The fit plan is one (``solver: auto`` measures free memory and disk: planned
    before the Gram is written and again after it, it could disagree with itself).
    """

    name: str
    inputs: NodeFunc
    func: NodeFunc


@dataclass(frozen=True)
class Stage:
    """One named stage.

    Parameters
    ----------
    name : str
        Stage name; also the name of its directory under the run directory.
    func : callable
        ``func(stage_dir, inputs, **params) -> dict``: a pure function of its
        arguments and of upstream outputs (``inputs[name]`` is the outputs dict
        of upstream stage ``name``, plus its fingerprint as ``"_fingerprint"``).
        It returns its own outputs (JSON-able).
    after : tuple of str
        Upstream stages whose outputs it reads and whose fingerprints it chains.
    enabled : callable, optional
        Whether the stage runs at all for this config (e.g. the Gram is only
        built when the solver needs it). A disabled stage is recorded as
        ``skipped`` and its fingerprint is ``None`` for downstream stages.
    resolve : callable, optional
        Completes the stage's arguments from earlier stages' outputs before it is
        fingerprinted and run (e.g. the λ and kernel a model-selection stage
        chose). The fingerprint hashes the resolved arguments.
    verify : callable, optional
        ``verify(stage_dir, outputs)``: a cheap re-read of a complete stage's
        final outputs (through their checksums) before the stage is skipped.
        It raises :class:`~pipeline.storage.CorruptTileError` (that tile's
        record is removed) or any ``ValueError`` for damaged outputs; the stage
        is then rerun instead of skipped (see :mod:`pipeline.stages.verify`).
    """

    name: str
    func: StageFunc
    after: tuple[str, ...] = ()
    enabled: EnabledFunc | None = None
    resolve: ResolveFunc | None = None
    verify: Callable[[Path, dict[str, Any]], None] | None = None
    #: results kept per configuration: the stage's directory is
    #: ``{run_dir}/results/<key>/{name}``, one per distinct configuration (see
    #: :mod:`pipeline.stages.results`), instead of ``{run_dir}/{name}``, replaced when
    #: its fingerprint changes. Its ``enabled`` and ``resolve`` may read only the
    #: outputs of stages that are not ``per_config``.
    per_config: bool = False
    #: a ``per_config`` stage whose complete result in another configuration with the
    #: same fingerprint is copied instead of computed again (results.adopt_result)
    reusable: bool = False
    #: entries of a ``per_config`` stage's directory needed only to resume it (e.g. the
    #: Cholesky factor): removed from a complete configuration when a run moves to another
    #: one, so kept configurations cost their results' disk, not their factors'
    scratch: tuple[str, ...] = ()
    #: nodes whose output the stage reads: under their names in ``outputs`` (its ``enabled``
    #: and ``resolve``) and in ``inputs`` (its function); not part of its fingerprint
    reads: tuple[Node, ...] = ()
    #: ``identity(params)``: the view of its (resolved) arguments that its fingerprint
    #: hashes, where a changed default is spelt as before (runs made before keep their
    #: identity); None: the arguments themselves
    identity: Callable[[dict[str, Any]], dict[str, Any]] | None = None


@dataclass
class RunReport:
    """What one call of :func:`run_stages` did."""

    manifest: Manifest
    ran: list[str] = field(default_factory=list)
    skipped_done: list[str] = field(default_factory=list)
    disabled: list[str] = field(default_factory=list)
    invalidated: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    #: one entry per corrupt tile recovered: stage, owner, store, array, tile, checksums
    recovered: list[dict[str, Any]] = field(default_factory=list)
    #: key of the configuration whose results this run wrote or found (``per_config`` stages)
    configuration: str | None = None
    #: the output of each node the stages read (:class:`Node`), recorded or read back
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def outputs(self) -> dict[str, dict[str, Any]]:
        return {n: r.outputs for n, r in self.manifest.stages.items() if r.status == "done"}


def stage_fingerprint(
    stage: Stage, params: Mapping[str, Any], upstream: Mapping[str, str | None]
) -> str:
    """Hash of a stage's name, its arguments (as its ``identity`` views them), and its
    upstream stages' fingerprints."""
    seen = dict(params) if stage.identity is None else stage.identity(dict(params))
    return fingerprint_obj({"stage": stage.name, "params": seen, "upstream": dict(upstream)})
