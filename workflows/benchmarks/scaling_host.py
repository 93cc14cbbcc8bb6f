"""The hardware a scaling-model run simulates, and a host-sharing replay of the tile Cholesky.

:func:`simulate_hosts` replays the left-looking tile graph of
``tile_cholesky(scheduler="dask")`` on workers grouped into hosts. Unlike
:func:`scaling_model.simulate` (one core per worker, workers independent), the
workers of a host share its cores:

* a task is a sequence of phases: Python work and tile reads (one core), BLAS
  calls (``blas_threads`` cores each), the tile write (one core); factor tiles a
  worker already holds (its LRU tile cache) are not read again;
* BLAS calls wider than one thread hold the host-wide lock (``host_lock``, as
  :func:`pipeline.engine.blas._host_lock`): one wide call at a time per host;
* one-core phases share the host's cores in proportion (processor sharing);
* a wide BLAS call whose threads are oversubscribed (the other workers' one-core
  phases need cores too) runs ``wide_penalty[k]`` times slower with ``k`` other
  busy cores: OpenBLAS threads wait on each other when one is descheduled.
  The penalty is measured (:func:`scaling_calibrate.calibrate`), not fitted;
* the scheduler dispatches one task at a time, ``scheduler_overhead`` s each.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from dataclasses import dataclass, field


@dataclass
class Hardware:
    """What the model simulates.

    workers : Dask worker processes (one task at a time each).
    workers_per_host, cores_per_host : how they share machines (a worker's compute
        rate is its share of its host's cores).
    blas_threads : BLAS threads of every tile task; above 1 with ``host_lock``, the
        wide calls of a host run one at a time.
    task_fixed : seconds of one-core Python work per task besides BLAS and tile I/O.
    scheduler_overhead : the scheduler's serial seconds per task.
    task_latency : seconds between a worker's task end and its next task's start
        (the round trip to the scheduler: Python work, one core, in parallel).
    remote_dep : seconds (one core) a task spends per other worker it fetches
        dependency results from (Dask gathers them per worker).
    bandwidth : bytes/s per worker for tile reads and writes over a network (no CPU);
        None: the measured local read and write times (one core).
    wide_penalty : slowdown of a wide BLAS call with 0, 1, 2, ... other busy cores.
    corun_penalty : slowdown of a one-thread BLAS call with 0, 1, ... other one-thread
        BLAS calls running at the same time on the host (shared caches and memory
        bandwidth; measured, :func:`scaling_calibrate.calibrate`).
    cache_tiles : factor tiles a worker keeps (``KRR_TILE_CACHE_BYTES`` / tile bytes).
    scheduler_on_host : the scheduler runs on host 0 (a LocalCluster): while it
        dispatches it takes a core there.
    background : runnable processes of other jobs on every host (their share of the
        cores is taken from the workers'; 0 on a dedicated machine).
    edge_overhead : the scheduler's serial seconds per dependency edge of a task.
    cache_model : "lru" (every tile access through each worker's LRU cache) or
        "stack" (misses from the LRU stack distances of the left-looking access
        pattern, O(1) per task; only where phases merge, see :func:`_task_seconds_stack`).
    reduced_edges : the executor submits the 2-edge transitive reduction of the
        dependencies (:func:`pipeline.linalg.cholesky_exec.submitted_deps`); False:
        all ``2 j + 1`` (``j`` on the diagonal), as before.
    placement : "free" (an idle worker takes the most critical ready task),
        "cyclic" (tile row i runs on worker i mod P, as the Dask executor deals them)
        or "follow" (a task runs where most of its dependencies ran: Dask's default
        placement, which put every tile task on one worker; work stealing ignored).
    """

    workers: int
    workers_per_host: int = 1
    cores_per_host: int = 1
    blas_threads: int = 1
    host_lock: bool = False
    task_fixed: float = 0.0
    scheduler_overhead: float = 1e-3
    task_latency: float = 0.0
    remote_dep: float = 0.0
    bandwidth: float | None = None
    wide_penalty: tuple = field(default_factory=lambda: (1.0,))
    corun_penalty: tuple = field(default_factory=lambda: (1.0,))
    cache_tiles: int = 1 << 30
    background: float = 0.0
    scheduler_on_host: bool = False
    placement: str = "free"
    edge_overhead: float = 0.0
    cache_model: str = "lru"
    reduced_edges: bool = True

    @property
    def hosts(self) -> int:
        return -(-self.workers // self.workers_per_host)


def _deps(i: int, j: int) -> list[tuple[int, int]]:
    d = [(i, k) for k in range(j)]
    if i != j:
        d += [(j, k) for k in range(j)] + [(j, j)]
    return d


def _phases(i, j, c, hw: Hardware, cache: OrderedDict, n_remote: int = 0) -> list[list]:
    """[kind, seconds alone] of task (i, j) on a worker holding ``cache``; updates it."""
    io_kind = "cpu" if hw.bandwidth is None else "net"
    tile_bytes = 8.0 * c.b * c.b
    rd = c.read if hw.bandwidth is None else tile_bytes / hw.bandwidth
    wr = c.write if hw.bandwidth is None else tile_bytes / hw.bandwidth
    out: list[list] = []

    def add(kind, sec):
        if sec <= 0:
            return
        if out and out[-1][0] == kind and kind != "blas":
            out[-1][1] += sec
        else:
            out.append([kind, sec])

    def read(t):
        if t in cache:
            cache.move_to_end(t)
            return
        add(io_kind, rd)
        cache[t] = None
        while len(cache) > hw.cache_tiles:
            cache.popitem(last=False)

    # the round trip to the scheduler and the dependency fetches from other workers
    # are Python work (scheduler, workers' event loops) on the host's cores: over
    # loopback the wire costs nothing
    add("cpu", hw.task_latency + n_remote * hw.remote_dep + hw.task_fixed)
    add(io_kind, rd)  # the Gram tile
    for k in range(j):
        read((j, k))
        if i != j:
            read((i, k))
        add("blas", c.syrk if i == j else c.gemm)
    if i != j:
        read((j, j))
    add("blas", c.potrf if i == j else c.trsm)
    add(io_kind, wr)
    cache[(i, j)] = None
    while len(cache) > hw.cache_tiles:
        cache.popitem(last=False)
    return out


def _near_deps(i: int, j: int) -> list[tuple[int, int]]:
    """The transitive reduction of :func:`_deps`: ``(i, j - 1)`` (which needed every
    ``(i, k)``, ``k < j - 1``) and ``(j, j)`` (which needed every ``(j, k)``, ``k < j``).
    The same ready times and longest paths with 2 edges per task instead of ``2 j + 1``."""
    d = [(i, j - 1)] if j else []
    if i != j:
        d.append((j, j))
    return d


def _task_seconds_stack(i, j, w, c, hw: Hardware, n_remote: int, col: list, nb: int) -> float:
    """Seconds of task (i, j) on worker w with tile misses from LRU stack distances.

    The access pattern of a left-looking task is ``(j,0), (i,0), ..., (j,j-1),
    (i,j-1), (j,j)``: ``2 j + 2`` distinct tiles with its output. A tile of row ``j``
    was last used by the worker's previous task of the same column (stack distance
    about ``2 j + 1``): it hits iff that fits the cache; the first task of a column
    misses them (unless row ``j`` is the worker's own and still cached). A tile of
    the task's own row ``i`` was last used one column earlier, with the worker's
    other tasks of that column in between (about ``m (2 j + 2)`` tiles for ``m`` tasks
    a column): it hits iff that fits. Checked against the exact LRU replay
    (``cache_model="lru"``) in docs/SCALING.md.
    """
    tile_bytes = 8.0 * c.b * c.b
    rd = c.read if hw.bandwidth is None else tile_bytes / hw.bandwidth
    wr = c.write if hw.bandwidth is None else tile_bytes / hw.bandwidth
    C = hw.cache_tiles
    s = 2 * j + 2
    m = -(-(nb - max(j - 1, 0)) // hw.workers)  # a worker's tasks in one column
    own_hit = m * s <= C
    reads = 1  # the Gram tile
    if j:
        row_j_own = hw.placement == "cyclic" and j % hw.workers == w
        if i == j:
            reads += 0 if (row_j_own and own_hit) else j
        else:
            if col[w] == j:
                shared = 0 if s <= C else j + 1
            else:
                shared = 0 if (row_j_own and own_hit) else j + 1
            reads += shared + (0 if own_hit else j)
    comp = j * (c.syrk if i == j else c.gemm) + (c.potrf if i == j else c.trsm)
    cpu = hw.task_latency + n_remote * hw.remote_dep + hw.task_fixed
    return cpu + reads * rd + comp + wr


def _simple(hw: Hardware) -> bool:
    """No phase of any task can ever be slowed by another: one rate, phases merged."""
    co = hw.corun_penalty if hw.workers_per_host > 1 else (1.0,)
    return (
        not (hw.host_lock and hw.blas_threads > 1)
        and not hw.scheduler_on_host
        and hw.background == 0
        and hw.workers_per_host * max(1, hw.blas_threads) <= hw.cores_per_host
        and all(x == 1.0 for x in co)
    )


def simulate_hosts(nb: int, costs, hw: Hardware) -> dict[str, float]:
    """Simulated wall time of the tile Cholesky (``nb`` row blocks) on ``hw``."""
    tasks = [(i, j) for j in range(nb) for i in range(j, nb)]
    succ: dict = {t: [] for t in tasks}
    n_dep = {}
    for t in tasks:
        ds = _near_deps(*t)
        n_dep[t] = len(ds)
        for d in ds:
            succ[d].append(t)
    simple = _simple(hw)
    col = [-1] * hw.workers  # the last column each worker ran a task of
    # critical-path priority, in tile flops (as the threads executor ranks them)
    rank: dict = {}
    for t in reversed(tasks):
        i, j = t
        own = (j + 1 / 3) if i == j else (2 * j + 1)
        rank[t] = own + max((rank[s] for s in succ[t]), default=0.0)
    C, t_w = float(hw.cores_per_host), hw.blas_threads
    lock = hw.host_lock and t_w > 1
    pen = hw.wide_penalty
    co = hw.corun_penalty
    host_of = [w // hw.workers_per_host for w in range(hw.workers)]
    members = [[w for w in range(hw.workers) if host_of[w] == h] for h in range(hw.hosts)]
    holder: list = [None] * hw.hosts
    queue: list[list] = [[] for _ in range(hw.hosts)]
    caches = [OrderedDict() for _ in range(hw.workers)]
    # per worker: phases, index, remaining, rate, last update, version, waiting
    ph: list = [None] * hw.workers
    idx = [0] * hw.workers
    rem = [0.0] * hw.workers
    rate = [1.0] * hw.workers
    last = [0.0] * hw.workers
    ver = [0] * hw.workers
    waiting = [False] * hw.workers
    cur_task: list = [None] * hw.workers
    ran_on: dict = {}
    events: list = []
    seq = 0
    now = 0.0
    sched_free = 0.0
    ready = [(-rank[t], t) for t in tasks if n_dep[t] == 0]
    heapq.heapify(ready)
    idle = list(range(hw.workers))
    done = 0
    busy_blas = 0.0

    def push(time, kind, w, v=0):
        nonlocal seq
        seq += 1
        heapq.heappush(events, (time, seq, kind, w, v))

    def kind_of(w):
        return None if ph[w] is None or waiting[w] else ph[w][idx[w]][0]

    def rerate(h):
        ks = {w: kind_of(w) for w in members[h]}
        n_cpu = sum(k == "cpu" for k in ks.values())
        n_blas = sum(k == "blas" for k in ks.values())
        demand = n_cpu + n_blas * t_w + hw.background
        if hw.scheduler_on_host and h == 0 and sched_free > now + 1e-12:
            demand += 1
        for w, k in ks.items():
            if k is None:
                continue
            rem[w] -= (now - last[w]) * rate[w]
            last[w] = now
            if k in ("net", "wait"):
                r = 1.0
            elif k == "blas" and t_w > 1:
                others = int(round(demand - t_w))
                r = 1.0 if demand <= C else 1.0 / pen[min(others, len(pen) - 1)]
            else:
                r = min(1.0, C / demand) if demand else 1.0
                if k == "blas" and n_blas > 1:  # one-thread calls side by side
                    r /= co[max(0, min(int(min(n_blas, C)) - 1, len(co) - 1))]
            rate[w] = r
            ver[w] += 1
            push(now + max(rem[w], 0.0) / r, "end", w, ver[w])

    def begin(w):
        """Start phase idx[w] of worker w (queue on the host lock if needed)."""
        k, sec = ph[w][idx[w]]
        rem[w], last[w] = sec, now
        h = host_of[w]
        if k == "blas" and lock:
            if holder[h] is None:
                holder[h] = w
            else:
                waiting[w] = True
                queue[h].append(w)

    own: list[list] = [[] for _ in range(hw.workers)]  # cyclic: ready tasks per worker

    def dispatch():
        nonlocal sched_free
        if hw.placement in ("cyclic", "follow"):
            while ready:
                _, t = heapq.heappop(ready)
                if hw.placement == "cyclic":
                    w = t[0] % hw.workers
                else:
                    ds = [ran_on[d] for d in _deps(*t)]
                    w = max(set(ds), key=ds.count) if ds else 0
                heapq.heappush(own[w], (-rank[t], t))
            for w in list(idle):
                if own[w]:
                    _, t = heapq.heappop(own[w])
                    idle.remove(w)
                    start = max(now, sched_free) + sched_cost(t)
                    sched_free = start
                    cur_task[w] = t
                    push(start, "start", w)
                    push(start, "sched", 0)
            return
        while ready and idle:
            _, t = heapq.heappop(ready)
            w = idle.pop(0)
            start = max(now, sched_free) + sched_cost(t)
            sched_free = start
            cur_task[w] = t
            push(start, "start", w)
            push(start, "sched", 0)

    def sched_cost(t):
        if not hw.edge_overhead:
            return hw.scheduler_overhead
        i, j = t
        if hw.reduced_edges:
            edges = (j > 0) + (i != j)
        else:
            edges = j if i == j else 2 * j + 1
        return hw.scheduler_overhead + hw.edge_overhead * edges

    dispatch()
    while done < len(tasks):
        now, _, kind, w, v = heapq.heappop(events)
        h = host_of[w]
        if kind == "sched":
            if hw.scheduler_on_host:
                rerate(0)
            continue
        if kind == "start":
            i, j = cur_task[w]
            # the workers the dependencies' records come from: row i's and row j's
            # last tiles stand for their rows (all of a row runs on one worker when
            # placed row-cyclic)
            near = [(i, j - 1), (j, j - 1), (j, j)] if j else []
            n_remote = len({ran_on[d] for d in near if d != (i, j)} - {w})
            if simple and hw.cache_model == "stack":
                ph[w] = [["net", _task_seconds_stack(i, j, w, costs, hw, n_remote, col, nb)]]
            else:
                ph[w] = _phases(i, j, costs, hw, caches[w], n_remote)
            if simple:  # every phase runs at rate 1: one phase
                ph[w] = [["net", sum(x[1] for x in ph[w])]]
            col[w] = j
            idx[w] = 0
            begin(w)
            rerate(h)
            continue
        if v != ver[w] or waiting[w]:
            continue  # superseded
        k = ph[w][idx[w]][0]
        if k == "blas":
            busy_blas += ph[w][idx[w]][1]
            if lock and holder[h] == w:
                holder[h] = None
                if queue[h]:
                    nxt = queue[h].pop(0)
                    waiting[nxt] = False
                    holder[h] = nxt
                    last[nxt] = now
        idx[w] += 1
        if idx[w] < len(ph[w]):
            begin(w)
        else:
            t = cur_task[w]
            ran_on[t] = w
            ph[w] = None
            done += 1
            idle.append(w)
            for s in succ[t]:
                n_dep[s] -= 1
                if n_dep[s] == 0:
                    heapq.heappush(ready, (-rank[s], s))
            dispatch()
        rerate(h)
        if hw.scheduler_on_host and h != 0:
            rerate(0)
    return {"wall": now, "tasks": len(tasks), "blas_seconds_alone": busy_blas}


def placement_study(
    costs, b: int, cores: int, bandwidth: float, serial: float, latency: float,
    sizes: tuple[int, ...] = (100_000, 200_000, 500_000), workers=(8, 16, 32, 64, 128),
) -> list:  # fmt: skip
    """Item 4 of issue #19: where the tile tasks run. One worker per host of ``cores``
    cores, all of them BLAS threads of every task (``costs`` at that width); tiles over
    the network at ``bandwidth``. Dask's default placement ("follow": where the
    dependencies' records are) against the executor's row-cyclic dealing and an ideal
    list scheduler ("free")."""
    c = costs.scaled(b)
    cache = max(1, (1 << 30) // (8 * b * b))
    rows = []
    for n in sizes:
        nb = math.ceil(n / b)
        for p in workers:
            row = {"n": n, "workers": p, "tasks": nb * (nb + 1) // 2}
            for placement in ("follow", "cyclic", "free"):
                hw = Hardware(workers=p, cores_per_host=cores, blas_threads=cores,
                              scheduler_overhead=serial, task_latency=latency,
                              bandwidth=bandwidth, cache_tiles=cache, placement=placement)  # fmt: skip
                row[f"{placement}_h"] = simulate_hosts(nb, c, hw)["wall"] / 3600
            print(f"N={n:>9,} P={p:>4} follow={row['follow_h']:7.2f} h "
                  f"cyclic={row['cyclic_h']:7.2f} h free={row['free_h']:7.2f} h", flush=True)  # fmt: skip
            rows.append(row)
    return rows


def plot_placement(rows: list, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for n in sorted({r["n"] for r in rows}):
        rs = [r for r in rows if r["n"] == n]
        ps = [r["workers"] for r in rs]
        (line,) = ax.loglog(ps, [r["cyclic_h"] for r in rs], "o-", label=f"N={n:,} row-cyclic")
        ax.loglog(ps, [r["follow_h"] for r in rs], "x--", color=line.get_color(),
                  label=f"N={n:,} Dask default")  # fmt: skip
    ax.set_xlabel("workers (one per host)")
    ax.set_ylabel("predicted factor time (h)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
