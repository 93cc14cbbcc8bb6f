"""The engine's in-process DAG executor (pipeline.engine.dag)."""

from __future__ import annotations

import threading
import time

import pytest

from pipeline.engine.dag import RankOrder, run_dag, serial_order, upward_ranks


def _diamond():
    #   a -> b -> d,  a -> c -> d,  e alone
    keys = ["a", "b", "c", "e", "d"]
    deps = {"a": [], "b": ["a"], "c": ["a"], "d": ["b", "c"], "e": []}
    return keys, deps


@pytest.mark.parametrize("n_threads", [1, 2, 4])
def test_every_task_runs_once_after_its_dependencies(n_threads):
    keys, deps = _diamond()
    finished: list[str] = []
    lock = threading.Lock()

    def run(k):
        with lock:
            assert all(d in finished for d in deps[k]), (k, finished)
        time.sleep(0.01)
        with lock:
            finished.append(k)
        return k.upper()

    done = []
    out = run_dag(
        keys, deps.__getitem__, run, n_threads=n_threads, on_done=lambda k, r: done.append(k)
    )
    assert sorted(out) == ["A", "B", "C", "D", "E"] and sorted(done) == sorted(keys)
    assert finished.index("d") == 4


def test_one_thread_takes_the_highest_rank_first():
    keys, deps = _diamond()
    rank = upward_ranks(keys, deps.__getitem__, lambda k: {"c": 5.0}.get(k, 1.0))
    assert rank == {"a": 7.0, "b": 2.0, "c": 6.0, "d": 1.0, "e": 1.0}
    order = run_dag(keys, deps.__getitem__, lambda k: k, rank=rank, n_threads=1)
    assert order == ["a", "c", "b", "e", "d"]  # equal ranks (e, d): the given order
    # without ranks: the topological order given
    assert run_dag(keys, deps.__getitem__, lambda k: k, n_threads=1) == ["a", "b", "c", "e", "d"]


def test_the_first_error_stops_the_run_and_is_raised():
    keys, deps = _diamond()
    ran = []

    def run(k):
        ran.append(k)
        if k == "b":
            raise ValueError("tile b failed")
        return k

    with pytest.raises(ValueError, match="tile b failed"):
        run_dag(keys, deps.__getitem__, run, n_threads=1)
    assert "d" not in ran  # its dependency failed


def test_dependencies_outside_the_keys_count_as_finished_and_a_cycle_is_reported():
    assert run_dag(["x"], lambda k: ["done-before"], lambda k: 1) == [1]
    with pytest.raises(RuntimeError, match="never became ready"):
        run_dag(["p", "q"], {"p": ["q"], "q": ["p"]}.__getitem__, lambda k: k)


def test_serial_order_is_one_thread_run_dag():
    deps = {"a": [], "b": [], "c": ["a"], "d": ["b", "c"], "e": ["a"]}
    rank = {"a": 1.0, "b": 5.0, "c": 3.0, "d": 0.5, "e": 4.0}
    order = serial_order(list(deps), deps.__getitem__, rank)
    ran = run_dag(list(deps), deps.__getitem__, lambda k: k, rank=rank, n_threads=1)
    assert order == ran == ["b", "a", "e", "c", "d"]


def test_rank_order_makes_the_threaded_scheduler_take_high_ranks_first():
    """Dask's threaded scheduler runs independent tasks in dask.order's order; with
    RankOrder the ready task of highest rank goes first."""
    import dask

    ran = []

    def note(k, *deps):
        ran.append("end" if k < 0 else f"t{k}")
        return k

    names = [f"t{k}" for k in range(6)]
    dsk = {n: (note, k) for k, n in enumerate(names)}
    dsk["end"] = (note, -1, *names)
    rank = {n: float(k % 3 * 10 - k) for k, n in enumerate(names)}
    dask.threaded.get(dsk, "end", num_workers=1, callbacks=[RankOrder(rank)._callback])
    assert ran[:-1] == sorted(names, key=lambda n: -rank[n])
    assert ran[-1] == "end"
    ran.clear()
    with RankOrder({n: -r for n, r in rank.items()}):  # the reverse, as a context manager
        dask.threaded.get(dsk, "end", num_workers=1)
    assert ran[:-1] == sorted(names, key=lambda n: rank[n])
