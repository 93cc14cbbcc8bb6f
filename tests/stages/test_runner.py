"""The stage runner: order, skip done stages, resume partial ones, invalidate downstream only."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from pipeline.stages import default_stages
from pipeline.stages.manifest import Manifest
from pipeline.stages.runner import RunDirConflict, Stage, StageFailed, run_stages


class Recorder:
    """Toy stages that log their calls and write a file into their directory."""

    def __init__(self):
        self.calls: list[str] = []
        self.fail: set[str] = set()

    def stage(self, name):
        def func(stage_dir: Path, inputs, **params):
            self.calls.append(name)
            seen = sorted(p.name for p in stage_dir.iterdir())
            (stage_dir / "work").write_text("partial")
            if name in self.fail:
                raise RuntimeError(f"{name} broke")
            up = {k: v["value"] for k, v in inputs.items() if "value" in v}  # (not nodes')
            return {
                "value": f"{name}({params.get('p')};{','.join(f'{k}={v}' for k, v in sorted(up.items()))})",
                "seen": seen,
            }

        return func


def toy_stages(rec, enabled_b=None):
    return [
        Stage("a", rec.stage("a")),
        Stage("b", rec.stage("b"), after=("a",), enabled=enabled_b),
        Stage("c", rec.stage("c"), after=("a", "b")),
        Stage("d", rec.stage("d"), after=("c",)),
    ]


PARAMS = {"a": {"p": 1}, "b": {"p": 2}, "c": {"p": 3}, "d": {"p": 4}}


def test_runs_in_order_and_passes_outputs(tmp_path):
    rec = Recorder()
    rep = run_stages(tmp_path, toy_stages(rec), PARAMS)
    assert rec.calls == ["a", "b", "c", "d"]
    assert rep.ran == ["a", "b", "c", "d"]
    assert rep.outputs["c"]["value"] == "c(3;a=a(1;),b=b(2;a=a(1;)))"
    m = Manifest.load(tmp_path)
    assert all(r.status == "done" for r in m.stages.values())
    assert json.loads((tmp_path / "manifest.json").read_text())["stages"]["d"]["status"] == "done"


def test_rerun_skips_complete_stages(tmp_path):
    rec = Recorder()
    run_stages(tmp_path, toy_stages(rec), PARAMS)
    rec.calls.clear()
    rep = run_stages(tmp_path, toy_stages(rec), PARAMS)
    assert rec.calls == []
    assert rep.skipped_done == ["a", "b", "c", "d"]
    assert rep.outputs["d"]["value"].startswith("d(4;")


def test_param_change_invalidates_exactly_downstream(tmp_path):
    rec = Recorder()
    run_stages(tmp_path, toy_stages(rec), PARAMS)
    rec.calls.clear()
    rep = run_stages(tmp_path, toy_stages(rec), {**PARAMS, "b": {"p": 20}})
    assert rec.calls == ["b", "c", "d"]
    assert rep.skipped_done == ["a"]
    assert rep.invalidated == ["b", "c", "d"]
    # an invalidated stage starts from an empty directory
    assert rep.outputs["b"]["seen"] == []
    rec.calls.clear()
    rep = run_stages(tmp_path, toy_stages(rec), {**PARAMS, "b": {"p": 20}, "d": {"p": 5}})
    assert rec.calls == ["d"]


def test_failed_stage_stops_and_resumes_with_its_directory(tmp_path):
    rec = Recorder()
    rec.fail = {"c"}
    with pytest.raises(StageFailed, match="stage 'c' failed: RuntimeError: c broke") as e:
        run_stages(tmp_path, toy_stages(rec), PARAMS)
    assert isinstance(e.value.__cause__, RuntimeError)
    assert rec.calls == ["a", "b", "c"]
    m = Manifest.load(tmp_path)
    assert m.stages["c"].status == "failed" and "c broke" in m.stages["c"].error
    assert "d" not in m.stages
    rec.fail.clear()
    rec.calls.clear()
    rep = run_stages(tmp_path, toy_stages(rec), PARAMS)
    assert rec.calls == ["c", "d"]
    # same fingerprint: the partial work of the failed attempt is still there to resume from
    assert rep.outputs["c"]["seen"] == ["work"]


def test_killed_stage_left_running_is_resumed(tmp_path):
    rec = Recorder()
    run_stages(tmp_path, toy_stages(rec), PARAMS)
    m = Manifest.load(tmp_path)
    m.stages["c"].status = "running"  # what a SIGKILL mid-stage leaves behind
    m.save()
    rec.calls.clear()
    rep = run_stages(tmp_path, toy_stages(rec), PARAMS)
    # d completed under the same fingerprint chain (c's fingerprint did not change): only c
    assert rec.calls == ["c"]
    assert "d" in rep.skipped_done
    assert rep.outputs["c"]["seen"] == ["work"]


def test_disabled_stage_is_skipped_and_chained_as_none(tmp_path):
    rec = Recorder()
    rep = run_stages(tmp_path, toy_stages(rec, enabled_b=lambda p, o: False), PARAMS)
    assert rec.calls == ["a", "c", "d"]
    assert rep.disabled == ["b"]
    assert Manifest.load(tmp_path).stages["b"].status == "skipped"
    # enabling it later changes c's upstream fingerprint: b, c and d run
    rec.calls.clear()
    run_stages(tmp_path, toy_stages(rec), PARAMS)
    assert rec.calls == ["b", "c", "d"]


def test_identity_conflict_and_force_new(tmp_path):
    rec = Recorder()
    run_stages(tmp_path, toy_stages(rec), PARAMS, identity={"data": 1})
    (tmp_path / ".lock").write_text("{}")
    with pytest.raises(RunDirConflict, match="--force-new"):
        run_stages(tmp_path, toy_stages(rec), PARAMS, identity={"data": 2})
    rec.calls.clear()
    rep = run_stages(tmp_path, toy_stages(rec), PARAMS, identity={"data": 2}, force_new=True)
    assert rec.calls == ["a", "b", "c", "d"] and rep.skipped_done == []
    assert (tmp_path / ".lock").exists()  # the lock is never removed by a reset


def test_resolve_completes_params_from_upstream_outputs(tmp_path):
    """A stage's arguments resolved from upstream outputs are what its fingerprint hashes."""
    rec = Recorder()

    def from_b(params, outputs):
        return {**params, "p": outputs["b"]["value"][:1]}

    stages = toy_stages(rec)
    stages[3] = Stage("d", rec.stage("d"), after=("c",), resolve=from_b)
    rep = run_stages(tmp_path, stages, PARAMS)
    assert rep.outputs["d"]["value"].startswith("d(b;")
    rec.calls.clear()
    run_stages(tmp_path, stages, {**PARAMS, "d": {"p": 99}})  # overridden by resolve
    assert rec.calls == []


def test_until_and_unknown_params(tmp_path):
    rec = Recorder()
    run_stages(tmp_path, toy_stages(rec), PARAMS, until="b")
    assert rec.calls == ["a", "b"]
    with pytest.raises(ValueError, match="unknown stages"):
        run_stages(tmp_path, toy_stages(rec), {**PARAMS, "zz": {}})


def test_real_pipeline_lambda_keeps_gram_kernel_does_not(tmp_path):
    """The wired stages on shipped data, threaded scheduler (no cluster)."""
    from pipeline.stages.config import load_config

    base = {
        "data": {"source": "sklearn", "name": "diabetes"},
        "split": {"test_fraction": 0.25},
        "preprocess": {"standardize_y": True},
        "kernel": {"name": "rbf", "params": {"gamma": 0.05}},
        "lambda": 0.5,
        "solver": {"method": "cholesky"},
        "block_size": 128,
        "evaluate": {"baseline": "none"},
    }
    run = tmp_path / "run"

    def go(*overrides):
        cfg = load_config(base, list(overrides))
        return run_stages(run, default_stages(), cfg.stage_params(), identity=cfg.identity())

    rep = go()
    assert rep.ran == ["ingest", "gram", "solve", "model", "predict", "evaluate"]
    assert rep.disabled == ["select"]
    gram_tiles = sorted((run / "gram" / "gram.zarr" / "_markers" / "gram").iterdir())
    mtimes = [p.stat().st_mtime_ns for p in gram_tiles]
    r2 = rep.outputs["evaluate"]["metrics"]["r2"]
    assert 0.2 < r2 < 0.8

    rep = go("lambda=0.3")
    assert rep.skipped_done == ["ingest", "gram"]
    assert rep.ran == ["solve", "model", "predict", "evaluate"]
    assert [p.stat().st_mtime_ns for p in gram_tiles] == mtimes  # the Gram was not rewritten

    rep = go("lambda=0.3", "kernel.params.gamma=0.2")
    assert rep.skipped_done == ["ingest"]
    assert rep.ran == ["gram", "solve", "model", "predict", "evaluate"]

    # CG, matrix-free: the Gram is not needed
    rep = go(
        "lambda=0.3", "kernel.params.gamma=0.2", "solver.method=cg", "solver.preconditioner=jacobi"
    )
    assert rep.disabled == ["select", "gram"]  # no cv section; matrix-free CG
    assert rep.outputs["solve"]["method"] == "cg" and rep.outputs["solve"]["converged"]


# ---------------------------------------------------------------------------
# recorded nodes (issue #43: "a plan node whose output is recorded, so the plan is
# computed once"): a decision several stages read, computed once, kept in RUN_DIR


def node_stages(rec, calls):
    """Toy stages b and c read node ``n``, computed from a's output and b's argument."""
    from pipeline.stages.stage import Node

    def inputs(params, outputs):
        return {"a": outputs["a"]["value"], "p": params["b"]["p"]}

    def func(params, outputs):
        calls.append(dict(inputs(params, outputs)))
        return {"choice": f"{outputs['a']['value']}/{params['b']['p']}"}

    node = Node("n", inputs=inputs, func=func)
    seen = []

    def b_enabled(params, outputs):
        seen.append(outputs["n"]["choice"])
        return True

    stages = toy_stages(rec, enabled_b=b_enabled)
    stages[1] = Stage("b", rec.stage("b"), after=("a",), enabled=b_enabled, reads=(node,))
    stages[2] = Stage("c", rec.stage("c"), after=("a", "b"), reads=(node,))
    return stages, seen


def test_a_node_is_computed_once_recorded_and_read_back(tmp_path):
    rec, calls = Recorder(), []
    stages, seen = node_stages(rec, calls)
    rep = run_stages(tmp_path, stages, PARAMS)
    # computed once for the two stages that read it (b's enabled, c's function)
    assert len(calls) == 1 and seen == ["a(1;)/2"]
    assert rep.nodes == {"n": {"choice": "a(1;)/2"}}
    doc = json.loads((tmp_path / "n.json").read_text())
    assert doc["node"] == "n"
    (record,) = doc["records"].values()
    assert record["inputs"] == {"a": "a(1;)", "p": 2}
    assert record["output"] == {"choice": "a(1;)/2"}
    # it is not part of any fingerprint: the stages' outputs are as without it
    assert rep.outputs["c"]["value"] == "c(3;a=a(1;),b=b(2;a=a(1;)))"
    # a rerun (or a resume) reads it back instead of computing it again
    rep = run_stages(tmp_path, stages, PARAMS)
    assert len(calls) == 1 and rep.nodes == {"n": {"choice": "a(1;)/2"}}
    # other inputs: computed once more, recorded beside the first
    run_stages(tmp_path, stages, {**PARAMS, "b": {"p": 5}})
    assert len(calls) == 2 and seen[-1] == "a(1;)/5"
    assert len(json.loads((tmp_path / "n.json").read_text())["records"]) == 2
    run_stages(tmp_path, stages, PARAMS)  # and the first is still read back
    assert len(calls) == 2


def test_a_nodes_stage_gets_its_output_and_force_new_removes_its_record(tmp_path):
    rec, calls = Recorder(), []
    stages, _ = node_stages(rec, calls)
    got = {}

    def c_func(stage_dir, inputs, **params):
        got.update(inputs)
        return {"value": "c"}

    stages[2] = dataclasses.replace(stages[2], func=c_func)
    run_stages(tmp_path, stages, PARAMS, identity={"data": 1})
    assert got["n"] == {"choice": "a(1;)/2"} and "_fingerprint" not in got["n"]
    run_stages(tmp_path, stages, PARAMS, identity={"data": 2}, force_new=True)
    assert len(calls) == 2  # its record went with the run it belonged to


def test_a_foreign_file_in_a_nodes_place_is_refused_before_any_work(tmp_path):
    rec, calls = Recorder(), []
    stages, _ = node_stages(rec, calls)
    (tmp_path / "n.json").write_text('{"mine": true}')
    with pytest.raises(RunDirConflict, match="n.json.*is not the record krr-pipeline writes"):
        run_stages(tmp_path, stages, PARAMS)
    assert rec.calls == [] and (tmp_path / "n.json").read_text() == '{"mine": true}'


DIABETES = {
    "data": {"source": "sklearn", "name": "diabetes"},
    "split": {"test_fraction": 0.25},
    "preprocess": {"standardize_y": True},
    "kernel": {"name": "rbf", "params": {"gamma": 0.05}},
    "lambda": 0.5,
    "solver": {"method": "auto"},
    "block_size": 128,
    "evaluate": {"baseline": "none"},
}


@pytest.fixture
def counted_plans(monkeypatch):
    """Every call of plan_fit, with the free disk the plan saw (a fixture: 1 TB, or
    what the test sets in ``disk``) and 16 GB of free memory."""
    import pipeline.fit as fit_mod
    import pipeline.linalg.dense_memory as memory
    import pipeline.stages.solve as solve_mod  # where the stages name plan_fit

    calls, disk = [], {"free": 1e12}
    real = solve_mod.plan_fit

    def counting(n, d, kernel, resources, *a, **k):
        calls.append(resources.disk_bytes)
        return real(n, d, kernel, resources, *a, **k)

    monkeypatch.setattr(solve_mod, "plan_fit", counting)
    monkeypatch.setattr(fit_mod, "_disk_free", lambda store: disk["free"])
    monkeypatch.setattr(memory, "available_memory", lambda: int(16e9))
    return calls, disk


def test_a_run_plans_its_fit_once_and_a_resume_reads_the_plan_back(tmp_path, counted_plans):
    """The gram stage's ``enabled`` and the solve stage each planned the fit (plan_fit
    twice per run, and once more on every rerun of a complete run); they read the one
    recorded plan now."""
    import pipeline

    calls, _ = counted_plans
    run = tmp_path / "run"
    rep = pipeline.run(DIABETES, run)
    assert rep.ran == ["ingest", "gram", "solve", "model", "predict", "evaluate"]
    assert len(calls) == 1
    (record,) = json.loads((run / "plan.json").read_text())["records"].values()
    solve = rep.outputs["solve"]
    assert solve["plan"] == record["output"]["plan"] and solve["method"] == "cholesky"
    assert solve["plan_reason"] == record["output"]["reason"]
    assert rep.nodes["plan"] == record["output"]
    rep = pipeline.run(DIABETES, run)  # complete: nothing runs, nothing is planned
    assert rep.ran == [] and len(calls) == 1
    rep = pipeline.run(DIABETES, run, overrides=["lambda=0.3"])  # a new configuration
    assert rep.ran == ["solve", "model", "predict", "evaluate"] and len(calls) == 2


def test_a_resume_after_the_gram_took_the_disk_keeps_the_plan(tmp_path, counted_plans):
    """A run stopped after the gram stage, resumed once the Gram holds the disk: the
    plan the Gram was built for is the one the solve runs. Planned again on resume, the
    Gram's own share of the disk turned ``auto`` to matrix-free CG, the gram stage was
    recorded as skipped and the built Gram was left unused (the solve stage's
    ``reclaim_bytes`` made only its own plan agree)."""
    import pipeline

    calls, disk = counted_plans
    run = tmp_path / "run"
    rep = pipeline.run(DIABETES, run, until="gram")
    assert rep.ran == ["ingest", "gram"] and len(calls) == 1
    disk["free"] = 1e3  # the Gram and everything else filled the disk since
    rep = pipeline.run(DIABETES, run)
    assert rep.skipped_done == ["ingest", "gram"] and rep.disabled == ["select"]
    assert rep.outputs["solve"]["method"] == "cholesky" and len(calls) == 1
    assert Manifest.load(run).stages["gram"].status == "done"
