"""Tiled out-of-core Cholesky, SPD solve, triangular solves, determinants and
one-task dense routines against NumPy / SciPy; plan figures against measured
RunStats; failure, resume and worker memory."""

import os

import numpy as np
import psutil
import pytest
import scipy.linalg as sla
import zarr
from hypothesis import given, settings
from hypothesis import strategies as st

import tilearray as ta
from tilearray.errors import NotPositiveDefiniteError, SingularMatrixError
from tilearray.linalg import _rhs, _trsolve
from tilearray.storage import ArrayRef
from tilearray.storage.array import done_units
from tilearray.storage.ref import unit_done_key, unit_fill_key
from tilearray.testing import assert_close

MiB = 2**20


@pytest.fixture(scope="module")
def eng():
    with ta.Engine(n_workers=1, threads_per_worker=2, memory_per_worker="1GiB",
                   processes=False, quiet=True) as e:
        yield e


def spd(rng, n, dtype="float64"):
    m = rng.uniform(-1, 1, (n, n))
    return ((m + m.T) / 2 + n * np.eye(n)).astype(dtype)  # diagonally dominant


def close(got, want, dtype="float64", rtol=None):
    """Equal up to rounding relative to the largest entry (a factorization's error)."""
    r = rtol or (2e-3 if np.dtype(dtype) == np.float32 else 1e-9)
    np.testing.assert_allclose(got, want, rtol=r, atol=r * np.max(np.abs(want)))


def stored(tmp_path, name, x, tile):
    z = zarr.create_array(tmp_path / name, shape=x.shape, chunks=tile, dtype=x.dtype)
    z[...] = x
    return ta.open(tmp_path / name)


def same_figures(plan, stats):
    assert stats.tasks == plan.tasks, (stats, plan)
    assert stats.bytes_read == plan.bytes_read, (stats, plan)
    assert stats.bytes_written == plan.bytes_written, (stats, plan)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("n, in_tile, out_tile", [
    (203, (50, 50), (64, 64)),   # ragged n, input chunks misaligned with the tile
    (130, (37, 61), (40, 40)),   # non-square input chunks
    (90, (90, 90), (90, 90)),    # one tile
])
def test_cholesky_matches_numpy(eng, tmp_path, rng, dtype, n, in_tile, out_tile):
    x = spd(rng, n, dtype)
    a = stored(tmp_path, "a.zarr", x, in_tile)
    want = np.linalg.cholesky(x)
    low = ta.linalg.cholesky(a)
    assert low.shape == (n, n) and low.dtype == np.dtype(dtype)
    plan = low.plan()
    got = low.compute()
    close(got, want, dtype)
    same_figures(plan, low.stats)
    plan = low.plan(tmp_path / "l.zarr", tile=out_tile)
    out = low.to_zarr(tmp_path / "l.zarr", tile=out_tile)
    same_figures(plan, out.stats)
    assert out.grid.tile == out_tile
    close(out.compute(), want, dtype)
    assert np.all(np.triu(out.compute(), 1) == 0)
    close(np.linalg.cholesky(a).compute(), want, dtype)  # NumPy dispatch


def test_upper_factor_reads_the_upper_triangle_as_numpy(eng, tmp_path, rng):
    """``upper=True`` is NumPy's: the factor of A's upper triangle (``U.T @ U``),
    not the lower factor's transpose, which differs where a stored A is not
    exactly symmetric (2.2 % off for a perturbation of 1e-2; helper-47)."""
    x = spd(rng, 203, "float64")
    x[np.triu_indices(203, 1)] += 1e-2 * rng.standard_normal(203 * 202 // 2)
    a = stored(tmp_path, "a.zarr", x, (50, 50))
    for upper in (False, True):
        want = np.linalg.cholesky(x, upper=upper)
        close(ta.linalg.cholesky(a, upper=upper).compute(), want, "float64")
        close(np.linalg.cholesky(a, upper=upper).compute(), want, "float64")
    u = ta.linalg.cholesky(a, upper=True).to_zarr(tmp_path / "u.zarr")
    close(u.compute(), np.linalg.cholesky(x, upper=True), "float64")


def _twice(fn, *args):
    fn(*args)
    return fn(*args)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_split_tail_tiles_match_numpy(eng, tmp_path, rng, dtype):
    """n = 1100 in 256 x 256 tiles (5 x 5, the last 76 wide): the closing
    tiles (4, 4), (4, 3), (3, 3) run as an early update (held in memory) and
    the rest; the factor is NumPy's and the figures are the plan's. A budget
    with room for one partial tile splits (4, 4) alone. Rerunning a split
    tile's task (a retry after its worker died) gives the same factor."""
    from tilearray.engine.plan import cholesky as pc

    n = 1100
    x = spd(rng, n, dtype)
    a = stored(tmp_path, "a.zarr", x, (100, 100))
    # the factor stored as it is computed: in float64 (of float32 A, NumPy's
    # cholesky's precision; its float32 result is a cast of this factor)
    low = ta.linalg.cholesky(a.astype(np.float64))
    plan = low.plan(tmp_path / "l.zarr", tile=(64, 64))
    assert "by 256 x 256 tiles (5 x 5" in plan.stages[0].description
    assert "in two tasks" in plan.stages[0].description
    updates = sorted(t.key[2:] for t in plan.stages[0].work if "update" in t.key)
    assert updates == [(3, 3), (4, 3), (4, 4)]
    one = ta.Budget.from_config("1GiB", 1, 1)
    assert pc.split_tiles(5, 10, 4, one) == {(4, 4), (4, 3), (3, 3)}
    assert pc.split_tiles(5, one.task_memory - 5, 4, one) == {(4, 4)}
    assert pc.split_tiles(5, one.task_memory - 3, 4, one) == set()
    assert pc.split_tiles(3, 0, 4, one) == {(2, 2)}  # (2, 1), (1, 1): no early columns
    # each task of the graph run twice in a row (as a retry after a write would):
    # the partial tile is the dependency's value, never changed, so the factor is the same
    import dask

    graph = dict(plan.graph())
    for key in [k for k in graph if isinstance(k, tuple) and len(k) == 3
                and isinstance(k[1], int) and (k[1], k[2]) in {(4, 4), (4, 3), (3, 3)}]:
        fn, *args = graph[key]
        graph[key] = (_twice, fn, *args)
    out = low.to_zarr(tmp_path / "l.zarr", tile=(64, 64))
    same_figures(plan, out.stats)
    want = np.linalg.cholesky(x.astype(np.float64)).astype(dtype)
    close(out.compute(), want, dtype)
    dask.get(graph, list(plan.result.keys))  # rewrites the same output's tiles
    close(np.tril(zarr.open_array(tmp_path / "l.zarr")[...]), want, dtype)


def test_stored_factor_codec(eng, tmp_path, rng):
    """The factor, read back by its own job, is stored without compression
    unless tilearray.storage.factor-compressor says otherwise; other outputs
    keep tilearray.storage.compressor."""
    import dask

    x = spd(rng, 150)
    a = stored(tmp_path, "a.zarr", x, (64, 64))
    want = np.linalg.cholesky(x)
    codecs = {}
    for name, conf in [("plain", {}), ("zstd", {"tilearray.storage.factor-compressor": "zstd"}),
                       ("same", {"tilearray.storage.factor-compressor": "default",
                                 "tilearray.storage.compressor": "lz4"})]:
        with dask.config.set(conf):
            out = ta.linalg.cholesky(a).to_zarr(tmp_path / f"l_{name}.zarr")
        close(out.compute(), want)
        codecs[name] = [type(c).__name__ for c in zarr.open_array(out.path).compressors]
    scaled = (a * 2).to_zarr(tmp_path / "scaled.zarr")
    assert codecs == {"plain": ["Crc32cCodec"], "zstd": ["ZstdCodec", "Crc32cCodec"],
                      "same": ["BloscCodec", "Crc32cCodec"]}
    assert [type(c).__name__ for c in zarr.open_array(scaled.path).compressors] == \
        ["BloscCodec", "Crc32cCodec"]


@given(st.lists(st.integers(1, 50), min_size=1, max_size=9), st.data())
@settings(max_examples=40, deadline=None)
def test_priorities_are_the_longest_chains(sizes, data):
    """critical_paths against a brute-force longest path over the tile DAG
    (task (p, q) reads (p, k) and (q, k), k < q, and (q, q)), with done
    tiles and split tiles (an early update before the tile task)."""
    from tilearray.engine.plan import cholesky as pc

    edges = tuple(zip(np.cumsum([0, *sizes[:-1]]).tolist(), np.cumsum(sizes).tolist(),
                      strict=True))
    nt = len(edges)
    tiles = [(i, j) for j in range(nt) for i in range(j, nt)]
    done = frozenset(data.draw(st.lists(st.sampled_from(tiles), max_size=3)))
    late = [t for t in tiles if t[1] >= 2 and t not in done]
    split = frozenset(data.draw(st.lists(st.sampled_from(late), max_size=3))) if late else set()
    got = pc.critical_paths(edges, done, 8, split)
    assert set(got) == (set(tiles) - done) | {("update", *t) for t in split}

    def reads(p, q):
        return {(p, k) for k in range(q)} | {(q, k) for k in range(q)} | \
            ({(q, q)} if p > q else set())

    def cost(i, j, k0, k1):  # updates by L columns [k0, k1), flops + bytes of panels
        bi, bj = edges[i][1] - edges[i][0], edges[j][1] - edges[j][0]
        w = k1 - k0
        return (bi * bi * w if i == j else 2 * bi * bj * w) + \
            pc.FLOPS_PER_BYTE * 8 * (bi * w + (0 if i == j else bj * w))

    own, early = {}, {}
    for i, j in tiles:
        bi, bj = edges[i][1] - edges[i][0], edges[j][1] - edges[j][0]
        k_stop = edges[j - 1][0] if (i, j) in split else 0
        own[i, j] = (bi**3 / 3 if i == j else bi * bj * bj) + cost(i, j, k_stop, edges[j][0]) + \
            pc.FLOPS_PER_BYTE * 8 * (bi * bj + (0 if i == j else bj * bj))
        early[i, j] = cost(i, j, 0, k_stop) + pc.FLOPS_PER_BYTE * 8 * bi * bj
    memo = {}

    def longest(t):
        if t not in memo:
            after = [s for s in tiles if t in reads(*s) and s not in done]
            memo[t] = own[t] + max((longest(s) for s in after), default=0)
        return memo[t]

    for t in got:
        if t[0] == "update":
            assert got[t] == 1 + int((longest(t[1:]) + early[t[1:]]) // 1e6)
            continue
        assert got[t] == 1 + int(longest(t) // 1e6)
        # a task's chain is never shorter than a task's it feeds
        assert all(got[t] >= got[s] for s in got if s[0] != "update" and t in reads(*s))


def test_task_priorities_reach_the_scheduler():
    """Tasks with a priority run before ready tasks with a lower one (dask's
    priority annotation, set by gather for a plan that has some)."""
    import time
    from types import SimpleNamespace

    from tilearray.engine.runtime.gather import _submitted

    def stamp(i):
        time.sleep(0.02)
        return i, time.perf_counter()

    graph = {("t", i): (stamp, i) for i in range(8)}
    prio = {("t", i): (5 * i) % 8 + 1 for i in range(8)}
    plan = SimpleNamespace(priorities=lambda: prio)
    assert _submitted(graph, SimpleNamespace(priorities=dict)) is graph
    with ta.Engine(n_workers=1, threads_per_worker=1, processes=False, quiet=True) as e:
        done = e.client.gather(e.client.get(_submitted(graph, plan), list(graph), sync=False))
    ran = [i for i, _ in sorted(done, key=lambda r: r[1])]
    assert ran == sorted(range(8), key=lambda i: -prio["t", i])


@pytest.mark.parametrize("queued", [True, False])
def test_queued_tasks_wait_on_the_scheduler_for_a_free_thread(queued):
    """A Cholesky's tile tasks are queued: each waits on the scheduler until a
    worker thread is free (one task a thread while the run lasts, not dask's
    two on a one-thread worker), then the highest priority goes; unqueued
    ready tasks go to a worker at once. The setting comes back after the run."""
    import time
    from types import SimpleNamespace

    from distributed.diagnostics.plugin import SchedulerPlugin

    from tilearray.engine.runtime.gather import _queuing, _submitted

    class Busiest(SchedulerPlugin):
        most = 0

        def transition(self, key, start, finish, *args, **kwargs):
            if finish == "processing":
                ws = self.scheduler.tasks[key].processing_on
                self.most = max(self.most, len(ws.processing))

    graph = {("q", i): (time.sleep, 0.05) for i in range(6)}
    graph["root"] = (len, list(graph))  # 6 tasks ready at once, with a dependent
    keys = frozenset(graph) - {"root"} if queued else frozenset()
    plan = SimpleNamespace(priorities=dict)
    with ta.Engine(n_workers=1, threads_per_worker=1, processes=False, quiet=True) as e:
        scheduler = e.cluster.scheduler
        before = scheduler.WORKER_SATURATION
        plugin = Busiest()
        plugin.scheduler = scheduler
        scheduler.add_plugin(plugin, name="busiest")
        with _queuing(e.client, keys):
            assert e.client.gather(e.client.get(_submitted(graph, plan, keys), "root")) == 6
        assert scheduler.WORKER_SATURATION == before
    assert (plugin.most == 1) if queued else (plugin.most > 1), plugin.most


def test_plan_reports_io_against_the_lower_bound(tmp_path):
    """Planned on metadata alone: the task tile is the largest multiple of the
    output's 2048 unit that fits (4096 at 1 GiB workers: two tiles and a unit
    write), reads are A's lower triangle once plus the L panels, about
    n^3 / (3 b), reported against n^3 / (3 sqrt(M))."""
    zarr.create_array(tmp_path / "a.zarr", shape=(32768, 32768), chunks=(2048, 2048), dtype="f8")
    a = ta.open(tmp_path / "a.zarr")
    budget = ta.Budget.from_config("1GiB", 2, 1)
    plan = ta.linalg.cholesky(a).plan(tmp_path / "l.zarr", tile=(2048, 2048), budget=budget)
    st = plan.stages[0]
    n, b = 32768, 4096
    assert f"by {b} x {b} tiles" in st.description, st.description
    assert st.peak_task_memory <= budget.task_memory
    nt = n // b
    assert st.bytes_written == nt * (nt + 1) // 2 * b * b * 8  # tiles above: not stored
    a_once = nt * (nt + 1) // 2 * b * b * 8
    l_back = 8 * n**3 / (3 * b)
    assert abs(st.bytes_read - a_once - l_back) < 0.1 * l_back, st
    assert plan.io_lower_bound and "Cholesky I/O lower bound" in str(plan)
    assert st.bytes_read / st.io_lower_bound < 3  # 5.3x with tiles of one unit
    # a tile of one unit would not use the budget: the next multiple does not fit
    # (one thread: the cap n / (4 threads) = 8192 does not bind)
    bigger = ta.linalg.cholesky(a).plan(tmp_path / "l.zarr", tile=(2048, 2048),
                                        budget=ta.Budget.from_config("1536MiB", 1, 1))
    assert "by 6144 x 6144 tiles" in bigger.stages[0].description
    # with 4 GiB workers the planner's own tiles (an SPD solve's factor) are
    # at most n / (4 threads): 8192 on one thread, 4096 on two (8 x 8 tiles,
    # work for both threads along the diagonal chain)
    solve = ta.linalg.solve_plan(a, np.ones(n), assume_a="pos")  # float64: the fallback
    chosen = solve.plan(budget=ta.Budget.from_config("4GiB", 1, 1),
                        precision="double").stages[0]
    assert "by 8192 x 8192 tiles" in chosen.description, chosen
    two = solve.plan(budget=ta.Budget.from_config("4GiB", 2, 1), precision="double").stages[0]
    assert "by 4096 x 4096 tiles" in two.description, two
    assert 1 < chosen.bytes_read / chosen.io_lower_bound < 4


def test_tile_cap_holds_whatever_the_default_unit(tmp_path):
    """The tile is at most ``n / (4 threads)`` rounded up to A's unit, whether
    the default unit fits or not: 4000² in 256² chunks on 2 threads planned
    1024-wide tiles at 200 MiB a worker and 256-wide ones at 180 MiB (410
    tasks); 10000² in 1000² and 1024² chunks, 2000 and 1024."""
    def tile(n, chunk, mem):
        path = tmp_path / f"a{n}_{chunk}.zarr"
        if not path.exists():
            zarr.create_array(path, shape=(n, n), chunks=(chunk, chunk), dtype="f8")
        stage = ta.linalg.cholesky(ta.open(path)).plan(
            budget=ta.Budget.from_config(mem, 2, 1)).stages[0]
        return stage.description.split(" tiles")[0].rsplit("by ", 1)[1]

    assert tile(4000, 256, "180MiB") == tile(4000, 256, "200MiB") == "512 x 512"
    assert tile(10000, 1000, "1GiB") == "2000 x 2000"
    assert tile(10000, 1024, "1GiB") == tile(10000, 1024, "4GiB") == "2048 x 2048"


def test_default_output_units_fit_when_shards_do_not(tmp_path):
    """``cholesky(A).to_zarr(path)`` with no tile given stores the factor in
    units whose tile task fits: a 6000² A in 1000 x 750 chunks inside 2000 x
    3000 shards (as plain zarr writes them) took the shards' 2000 -- 220 MiB
    a task, refused at 300 MiB a worker -- where compute() and an explicit
    tile planned under 135 (helper-47). Planned on metadata alone."""
    n = 6000
    zarr.create_array(tmp_path / "a.zarr", shape=(n, n), chunks=(1000, 750),
                      shards=(2000, 3000), dtype="f8")
    chol = ta.linalg.cholesky(ta.open(tmp_path / "a.zarr"))
    budget = ta.Budget.from_config("300MiB", 2, 1)
    plan = chol.plan(tmp_path / "l.zarr", budget=budget)
    assert plan.peak_task_memory <= budget.task_memory, str(plan)
    assert chol.plan(budget=budget).peak_task_memory <= budget.task_memory
    # where the shards' units fit, they are kept (the larger unit reads less)
    roomy = ta.Budget.from_config("2GiB", 2, 1)
    assert "by 2000 x 2000 tiles" in chol.plan(tmp_path / "l.zarr", budget=roomy).stages[0].description


def test_no_thin_tiles_where_a_little_more_memory_buys_wide_ones(tmp_path):
    """Reading a 2048² unit of A fixes most of a task's peak: 128-wide tiles
    needed 115.35 MiB and 1024-wide 124.8 MiB. At 277 MiB a worker the
    planner took 128 (24,767 tasks reading 345 GiB); it now refuses, naming
    the memory of a tile of at least MIN_TILE, which then plans."""
    import re

    from dask.utils import parse_bytes

    from tilearray.engine.plan.cholesky import MIN_TILE

    zarr.create_array(tmp_path / "a.zarr", shape=(16384, 16384), chunks=(2048, 2048), dtype="f8")
    chol = ta.linalg.cholesky(ta.open(tmp_path / "a.zarr"))
    for mem in ("200MiB", "270MiB", "277MiB"):
        with pytest.raises(ta.PlanningError, match="it would fit with") as err:
            chol.plan(budget=ta.Budget.from_config(mem, 2, 1))
        need = re.search(r"memory_per_worker >= (\d+MiB)", str(err.value)).group(1)
        stage = chol.plan(budget=ta.Budget.from_config(parse_bytes(need), 2, 1)).stages[0]
        b = int(stage.description.split(" tiles")[0].rsplit("by ", 1)[1].split(" x ")[0])
        assert b >= MIN_TILE and stage.tasks < 500, stage.description


def test_tight_budget_tiles_stay_inside_the_input_units(tmp_path):
    """At ~33 MiB a task with input chunks of 1024² (8 MiB), a tile crossing a
    chunk's edge reads two chunks per strip and fits only at 128 rows (562
    Cholesky tasks reading 68x the I/O lower bound, then 4,000 substitution
    tasks of 64 rows); a tile inside one chunk (a half or quarter of it)
    reads one. Planned on metadata alone."""
    n = 4000
    zarr.create_array(tmp_path / "a.zarr", shape=(n, n), chunks=(1024, 1024), dtype="f8")
    a = ta.open(tmp_path / "a.zarr")
    budget = ta.Budget.from_config("180MiB", 2, 1)
    plan = ta.linalg.solve_plan(a, np.ones(n), assume_a="pos").plan(budget=budget)
    chol, fwd, back = plan.stages[:3]
    b = int(chol.description.split(" x ")[0].rsplit(" ", 1)[1])
    assert b >= 256 and 1024 % b == 0, chol.description
    assert chol.peak_task_memory <= budget.task_memory
    assert chol.bytes_read / chol.io_lower_bound < 25, chol
    for stage in (fwd, back):
        rows = int(stage.description.split("row tiles of ")[1].split(" ")[0])
        assert rows >= 256 and stage.peak_task_memory <= budget.task_memory, stage.description
    assert plan.tasks < 600, plan

    # an LU panel reads a band of units whatever its width: an unaligned
    # panel wider than the unit's divisor (960 against 512; 594 tasks
    # reading 38 GiB with panels of 512, 209 tasks and 25 GiB with 960)
    big = tmp_path / "g.zarr"
    zarr.create_array(big, shape=(16384, 16384), chunks=(1024, 1024), dtype="f8")
    lu = ta.linalg.solve_plan(ta.open(big), np.ones(16384)).plan(
        budget=ta.Budget.from_config("1GiB", 2, 1)).stages[0]
    assert "column panels of 960 " in lu.description, lu.description

    # a triangular matrix stored in 64² chunks: row tiles of several chunks
    t = tmp_path / "t.zarr"
    zarr.create_array(t, shape=(n, n), chunks=(64, 64), dtype="f8")
    ynode, vector = _rhs(np.ones(n), n, "solve_triangular")
    sub = ta.TiledArray(_trsolve(ta.open(t)._node, ynode, np.dtype("f8"), lower=True,
                                 trans=False, vector=vector)).plan(budget=budget)
    stage = sub.stages[0]
    rows = int(stage.description.split("row tiles of ")[1].split(" ")[0])
    assert rows >= 256 and rows % 64 == 0 and stage.peak_task_memory <= budget.task_memory, stage


@given(align=st.integers(1, 3000), cap=st.integers(1, 5000), n=st.integers(1, 6000),
       mem=st.integers(1, 200))
@settings(max_examples=300, deadline=None)
def test_fit_tile_prefers_aligned_tiles(align, cap, n, mem):
    """``fit_tile`` returns a tile that fits (or MIN_FIT, refused by its
    caller), at most the cap: the largest multiple of the unit when one
    fits, else at least the largest divisor of it that fits."""
    from tilearray.engine.plan.cholesky import MIN_FIT, fit_tile

    budget = ta.Budget(mem * MiB + 120 * MiB, fraction=1.0)

    def peak(b):  # a read crossing a unit's edge fetches two units, one inside fetches one
        units = 1 if align % b == 0 or b % align == 0 else 2
        return b * b * 8 + units * max(b, align) ** 2 * 8 // 64

    got = fit_tile(n, align, cap, peak, budget)
    top = max(min(cap, n), 1)
    assert 1 <= got <= top
    fitting = [b for b in range(1, top + 1) if peak(b) <= budget.task_memory]
    multiples = [b for b in fitting if b % align == 0]
    divisors = [b for b in fitting if align % b == 0 and b >= MIN_FIT]
    if align > 1 and multiples:
        assert got == max(multiples), (got, multiples)
    elif fitting and max(fitting) >= min(MIN_FIT, top):
        assert peak(got) <= budget.task_memory
        assert align == 1 or got >= max(divisors, default=0), (got, divisors)
    else:
        assert got == min(MIN_FIT, top)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_spd_solve(eng, tmp_path, rng, dtype):
    n = 157
    x = spd(rng, n, dtype)
    a = stored(tmp_path, "a.zarr", x, (40, 30))
    b1 = rng.standard_normal(n).astype(dtype)
    b2 = rng.standard_normal((n, 3)).astype(dtype)
    got = ta.linalg.solve(a, b1, assume_a="pos")
    assert got.shape == (n,)
    close(got, np.linalg.solve(x, b1), dtype)
    lazy = ta.linalg.solve_plan(a, b2, assume_a="pos")
    plan = lazy.plan()
    close(lazy.compute(), np.linalg.solve(x, b2), dtype)
    same_figures(plan, lazy.stats)
    bs = stored(tmp_path, "b.zarr", b2, (25, 3))  # stored right-hand sides
    close(ta.linalg.solve(a, bs, assume_a="pos"), np.linalg.solve(x, b2), dtype)


def test_triangular_solves(eng, tmp_path, rng):
    """Row tiles of several stored 30² tiles (270 rows: under MIN_TILE rows a
    tile task would be thousands of tasks at scale), ragged at the end."""
    n = 611
    t = np.tril(rng.standard_normal((n, n))) / np.sqrt(n) + 2 * np.eye(n)
    lo = stored(tmp_path, "t.zarr", t, (30, 30))
    up = stored(tmp_path, "u.zarr", t.T.copy(), (30, 30))
    b = rng.standard_normal((n, 2))
    ynode, _ = _rhs(b, n, "solve_triangular")
    lazy = ta.TiledArray(_trsolve(lo._node, ynode, np.dtype("f8"), lower=True, trans=False))
    assert "by 3 row tiles of 270" in str(lazy.plan(engine=eng)), lazy.plan(engine=eng)
    for a, x, lower in ((lo, t, True), (up, t.T, False)):
        for trans in (0, 1):
            want = sla.solve_triangular(x, b, lower=lower, trans=trans)
            assert_close(ta.linalg.solve_triangular(a, b, lower=lower, trans=trans), want)
    want = sla.solve_triangular(t, b[:, 0], lower=True, unit_diagonal=True)
    assert_close(ta.linalg.solve_triangular(lo, b[:, 0], lower=True, unit_diagonal=True), want)


def test_determinants_inverse_eigh(eng, tmp_path, rng):
    n = 77
    x = spd(rng, n)
    a = stored(tmp_path, "a.zarr", x, (20, 20))
    sign, logdet = ta.linalg.slogdet(a, assume_a="pos")
    assert sign == 1 and logdet == pytest.approx(np.linalg.slogdet(x)[1], rel=1e-12)
    assert np.linalg.slogdet(a)[1] == pytest.approx(np.linalg.slogdet(x)[1], rel=1e-12)
    assert np.linalg.det(a) == pytest.approx(np.linalg.det(x), rel=1e-9)
    assert ta.linalg.det(a, assume_a="pos") == pytest.approx(np.linalg.det(x), rel=1e-9)
    assert_close(np.linalg.inv(a), np.linalg.inv(x))
    assert_close(ta.linalg.inv(a, assume_a="pos"), np.linalg.inv(x))
    w, v = np.linalg.eigh(a)
    assert_close(w, np.linalg.eigvalsh(x))
    close(np.abs(v.T @ x @ v), np.abs(np.diag(w)))
    assert_close(np.linalg.eigvalsh(a), np.linalg.eigvalsh(x))
    g = rng.standard_normal((n, n))  # a general matrix: one-task LU
    ga = stored(tmp_path, "g.zarr", g, (20, 20))
    b = rng.standard_normal(n)
    assert_close(np.linalg.solve(ga, b), np.linalg.solve(g, b))
    assert np.linalg.det(ga) == pytest.approx(np.linalg.det(g), rel=1e-9)
    w, v = np.linalg.eig(ga)  # complex, as NumPy's for this spectrum
    want = np.linalg.eigvals(g)
    assert w.dtype == want.dtype == np.complex128
    close(np.sort_complex(w), np.sort_complex(want))
    close(g @ v, v * w)
    close(np.sort_complex(np.linalg.eigvals(ga)), np.sort_complex(want))
    f32 = stored(tmp_path, "f.zarr", np.diag(np.arange(1.0, 6.0)).astype("float32"), (2, 2))
    assert np.linalg.eigvals(f32).dtype == np.float32  # a real spectrum stays real


def test_singular_and_too_large_are_refused(eng, tmp_path, rng):
    n = 40
    s = rng.standard_normal((n, n))
    s[:, 7] = 0.0  # exactly singular: LAPACK finds no pivot in column 7
    a = stored(tmp_path, "s.zarr", s, (16, 16))
    with pytest.raises(SingularMatrixError) as err:
        ta.linalg.solve(a, np.ones(n))
    assert isinstance(err.value, np.linalg.LinAlgError) and err.value.column == 7
    assert tuple(np.linalg.slogdet(a)) == (0.0, -np.inf)
    assert np.linalg.det(a) == 0.0
    zarr.create_array(tmp_path / "big.zarr", shape=(20000, 20000), chunks=(2000, 2000),
                      dtype="f8")
    big = ta.open(tmp_path / "big.zarr")
    budget = ta.Budget.from_config("1GiB", 2, 1)
    with pytest.raises(ta.PlanningError, match=r"one task.*memory_per_worker >= \d+MiB$"):
        ta.linalg._incore(big, "eigh", ()).plan(budget=budget)  # named, as every refusal
    # a general solve of it is planned as a tiled LU
    assert "partial pivoting" in str(ta.linalg.solve_plan(big, np.ones(20000)).plan(budget=budget))
    # an SPD solve of the same matrix plans (tiled)
    assert ta.linalg.solve_plan(big, np.ones(20000), assume_a="pos").plan(budget=budget)


def test_not_positive_definite_names_tile_and_column(eng, tmp_path, rng, caplog):
    n = 150
    x = spd(rng, n)
    x[100, 100] = -5.0  # the leading minor of order 101 is not positive
    a = stored(tmp_path, "a.zarr", x, (50, 50))
    low = ta.linalg.cholesky(a)
    with pytest.raises(NotPositiveDefiniteError) as err:
        low.to_zarr(tmp_path / "l.zarr", tile=(40, 40))
    # the error alone, without the worker's "Compute Failed" record before it
    assert "Compute Failed" not in caplog.text
    assert err.value.tile == (2, 2) and err.value.column == 100
    assert "column 100" in str(err.value) and "(2, 2)" in str(err.value)
    meta = zarr.open_array(tmp_path / "l.zarr").attrs["tilearray"]
    assert meta.get("complete") is not True
    with pytest.raises(NotPositiveDefiniteError):
        ta.linalg.solve(a, np.ones(n), assume_a="pos")


def test_resume_recomputes_only_missing_tiles(eng, tmp_path, rng):
    """A driver killed mid-run leaves some units without their done marker:
    resume recomputes the tiles holding them alone, reading the done ones back.
    n = 600 in 40 x 40 units: tasks of 240 x 240 tiles (6 x 6 units; the
    largest multiple under n / (2 threads), at least 256)."""
    n, u, b = 600, 40, 240
    x = spd(rng, n)
    a = stored(tmp_path, "a.zarr", x, (50, 50))
    low = ta.linalg.cholesky(a)
    out = tmp_path / "l.zarr"
    plan = low.plan(out, tile=(u, u))
    assert f"by {b} x {b} tiles" in plan.stages[0].description
    first = low.to_zarr(out, tile=(u, u))
    # lower tiles + a zeros task per row but the last + the early update of (2, 2),
    # a tile of the last SPLIT_COLUMNS columns (its column 0 part: ready before (2, 1))
    assert first.stats.tasks == 6 + 2 + 1
    same_figures(plan, first.stats)
    # as if killed: not complete, and the units of tiles (0, 0), (2, 1), (2, 2)
    # and the upper (0, 1) lost -- one unit each
    ref = ArrayRef.from_location(out)
    z = zarr.open_array(out, mode="r+")
    meta = dict(z.attrs["tilearray"])
    meta["complete"] = False
    z.attrs["tilearray"] = meta
    lost = [(2, 1), (13, 7), (14, 14), (0, 8)]
    for i, j in lost:
        z[i * u:(i + 1) * u, j * u:(j + 1) * u] = np.nan
        # a local store: the marker is a file (the upper unit's says "fill")
        os.remove(out / (unit_fill_key(i, j) if j > i else unit_done_key(i, j)))
    assert len(done_units(ref)) == 15 * 15 - 4
    again = low.to_zarr(out, resume=True)
    assert again.stats.tasks == 3 + 1 + 1  # three lower tiles, zeros of row 0, (2, 2)'s update
    # the upper tile is marked as zeros, not written: its stale NaN chunk is deleted
    assert again.stats.bytes_written == (b * b + 120 * b + 120 * 120) * 8
    assert not (out / z.metadata.encode_chunk_key((0, 8))).exists()
    # skipped: the done units the resume did not write again (the three tiles'
    # other units were rewritten with them, the zeros of row 0 marked again)
    assert again.stats.skipped_units + again.stats.units_written == 15 * 15, again.stats
    assert_close(again.compute(), np.linalg.cholesky(x))


def test_tiles_above_the_diagonal_are_not_stored_and_read_as_zeros(eng, tmp_path, rng):
    """The zero tiles above the diagonal tiles are marked, not stored (format
    3): plain Zarr reads them as its fill value, tilearray's readers (direct,
    streamed) too, while a lost chunk of a stored unit is still an error."""
    n, u = 300, 40
    x = spd(rng, n)
    out = tmp_path / "l.zarr"
    ta.linalg.cholesky(stored(tmp_path, "a.zarr", x, (50, 50))).to_zarr(out, tile=(u, u))
    want = np.linalg.cholesky(x)
    z = zarr.open_array(out, mode="r")
    absent = {(i, j) for i in range(8) for j in range(8)
              if not (out / z.metadata.encode_chunk_key((i, j))).exists()}
    # 240 x 240 task tiles: the tile (0, 1) above the diagonal, units 0-5 x 6-7
    assert absent == {(i, j) for i in range(6) for j in (6, 7)}
    assert len(done_units(ArrayRef.from_location(out))) == 64
    assert_close(z[...], want)
    low = ta.open(out)
    assert_close(np.asarray(low), want)
    assert_close(low.sum(axis=0), want.sum(axis=0))
    v = rng.standard_normal(n)
    assert_close(low @ v, want @ v)
    os.remove(out / z.metadata.encode_chunk_key((7, 0)))  # a stored unit, lost
    with pytest.raises(ta.errors.CorruptChunkError, match="missing"):
        np.asarray(ta.open(out))
    with pytest.raises(ta.errors.CorruptChunkError, match="missing"):
        ta.open(out).sum(axis=0).compute()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_worker_memory_under_budget_for_a_matrix_several_times_it(tmp_path):
    """n = 3000 float64 (72 MB, 2.2x a task's budget) on 2 x 180 MiB process
    workers (33 MiB per task): each worker's RSS stays under its limit and
    within its baseline plus the planned task; the factor is right (checked
    through L L^T v)."""
    rng = np.random.default_rng(3)
    n = 3000
    x = spd(rng, n)
    a = stored(tmp_path, "a.zarr", x, (500, 500))
    v = rng.standard_normal(n)
    want = x @ v
    del x
    with ta.Engine(n_workers=2, threads_per_worker=1, memory_per_worker="180MiB",
                   quiet=True) as e:
        idle = max(e.client.run(lambda: psutil.Process().memory_info().rss).values())
        low = ta.linalg.cholesky(a)
        plan = low.plan(tmp_path / "l.zarr", tile=(500, 500))
        assert n * n * 8 > 2 * e.budget().task_memory
        assert plan.peak_task_memory <= e.budget().task_memory
        out = low.to_zarr(tmp_path / "l.zarr", tile=(500, 500))
        same_figures(plan, out.stats)
        assert 0 < out.stats.peak_worker_memory <= e.budget().memory_per_worker, out.stats
        # the planner's contract: a worker holds its baseline plus the planned task (the
        # first run also loads code, e.g. LAPACK and the codecs: the baseline covers it)
        assert out.stats.peak_worker_memory <= e.budget().baseline + plan.peak_task_memory, \
            (out.stats, idle, plan)
    lv = zarr.open_array(tmp_path / "l.zarr")[...]
    close(lv @ (lv.T @ v), want)


@pytest.fixture(scope="module")
def small_eng():
    """16 MiB per task: a 1000 x 1000 float64 matrix (8 MB) does not fit one
    task's LAPACK call, so general solves take the tiled LU."""
    with ta.Engine(n_workers=1, threads_per_worker=1, memory_per_worker="160MiB",
                   processes=False, quiet=True) as e:
        yield e


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_tiled_lu_solve_needs_and_does_pivoting(small_eng, tmp_path, rng, dtype):
    """A zero and a tiny leading pivot (LU without pivoting breaks down or loses
    every digit), ragged panels, chunks misaligned with them."""
    n = 1000
    g = rng.standard_normal((n, n))
    g[0, 0], g[1, 1] = 0.0, 1e-20
    g = g.astype(dtype)
    a = stored(tmp_path, "g.zarr", g, (96, 96))
    b = rng.standard_normal((n, 2)).astype(dtype)
    lazy = ta.linalg.solve_plan(a, b)
    plan = lazy.plan()
    assert "partial pivoting" in str(plan), plan
    assert "U x = y (U of the LU factors): backward substitution" in str(plan), plan
    assert plan.peak_task_memory <= small_eng.budget().task_memory
    got = lazy.compute()
    same_figures(plan, lazy.stats)
    want = np.linalg.solve(g.astype("f8"), b.astype("f8"))
    if dtype == "float64":
        close(got, want)
    else:  # f32: the residual, not the solution, is what LU keeps small
        r = g.astype("f8") @ got.astype("f8") - b
        assert np.abs(r).max() < 1e-2 * np.abs(b).max()
    v = ta.linalg.solve(a, b[:, 0])
    assert v.shape == (n,)
    sign, logabs = np.linalg.slogdet(a)
    want_sign, want_log = np.linalg.slogdet(g.astype("f8"))
    assert sign == want_sign and logabs == pytest.approx(want_log, rel=1e-4)


def test_tiled_lu_singular_names_the_column(small_eng, tmp_path, rng):
    n = 1000
    g = rng.standard_normal((n, n))
    g[:, 700] = 0.0
    a = stored(tmp_path, "g.zarr", g, (128, 128))
    with pytest.raises(SingularMatrixError) as err:
        ta.linalg.solve(a, np.ones(n))
    assert err.value.column == 700 and isinstance(err.value, np.linalg.LinAlgError)
    # a determinant of the same matrix is NumPy's 0 (the LU runs to the end)
    assert ta.linalg.det(a) == 0.0
    sign, logabs = np.linalg.slogdet(a)
    assert sign == 0.0 and logabs == -np.inf


def test_tiled_lu_sweeps_right_hand_sides_in_column_groups(small_eng, tmp_path, rng):
    """The forward sweep holds its right-hand sides with a panel: more than a
    task holds are swept in column groups, each on its own (reading the L
    panels again), their solutions joined. ``inv`` (and ``np.linalg.cond``)
    of a matrix the tiled LU takes, whose inverse one task cannot join, is
    refused naming the memory needed -- before the LU runs, not by workers
    killed for memory."""
    n = 1000
    g = rng.standard_normal((n, n))
    a = stored(tmp_path, "g.zarr", g, (96, 96))
    b = rng.standard_normal((n, 600))
    lazy = ta.linalg.solve_plan(a, b)
    plan = lazy.plan()
    sweeps = [s for s in plan.stages if s.kind == "lu-fwd"]
    assert len(sweeps) >= 2 and "right-hand sides 0:" in sweeps[0].description, plan
    assert plan.peak_task_memory <= small_eng.budget().task_memory
    close(lazy.compute(), np.linalg.solve(g, b))
    same_figures(plan, lazy.stats)
    for attempt in (lambda: ta.linalg.solve_plan(a, np.eye(n)).plan(), lambda: np.linalg.inv(a),
                    lambda: np.linalg.cond(a, 1)):
        with pytest.raises(ta.PlanningError, match=r"joined in one task.* it would fit with "
                                                   r"memory_per_worker >= \d+MiB$"):
            attempt()  # not "or with smaller tiles": no tiling lowers the join
    b = rng.standard_normal((n, 4))  # a few columns: one sweep
    close(ta.linalg.solve(a, b), np.linalg.solve(g, b))


def test_spd_solve_promotes_as_numpy(small_eng, tmp_path, rng):
    """A float32 SPD matrix with a float64 right-hand side is solved in
    float64, as NumPy promotes (it had been factored in float32: a float64
    answer with float32's accuracy); both float32 stays float32."""
    n = 300
    x = spd(rng, n, "float32")
    a = stored(tmp_path, "s32.zarr", x, (64, 96))
    b = rng.standard_normal(n)
    want = np.linalg.solve(x.astype("f8"), b)
    for assume in ("pos", "gen"):
        got = ta.linalg.solve(a, b, assume_a=assume)
        assert got.dtype == np.float64
        close(got, want, rtol=1e-12)
    got = ta.linalg.solve(a, b.astype("f4"), assume_a="pos")
    assert got.dtype == np.float32
    close(got, want, "float32")


def test_big_endian_and_zero_diagonal(small_eng, tmp_path, rng):
    """Big-endian data (v2 arrays from netCDF) is factored in native order; a
    zero on a triangular matrix's diagonal is SciPy's LinAlgError, never inf."""
    n = 300
    x = spd(rng, n)
    z = zarr.create_array(tmp_path / "be.zarr", shape=(n, n), chunks=(70, 70), dtype=">f8",
                          zarr_format=2)
    z[...] = x
    a = ta.open(tmp_path / "be.zarr")
    low = ta.linalg.cholesky(a)
    assert low.dtype == np.float64
    close(low.compute(), np.linalg.cholesky(x))
    close(ta.linalg.solve(a, np.arange(float(n)), assume_a="pos"),
          np.linalg.solve(x, np.arange(float(n))))
    t = np.tril(x)
    t[123, 123] = 0
    with pytest.raises(SingularMatrixError, match="resolution failed at diagonal 123"):
        ta.linalg.solve_triangular(stored(tmp_path, "t.zarr", t, (64, 64)), np.ones(n),
                                   lower=True)
    got = ta.linalg.solve_triangular(stored(tmp_path, "t1.zarr", t, (64, 64)), np.ones(n),
                                     lower=True, unit_diagonal=True)
    close(got, sla.solve_triangular(t, np.ones(n), lower=True, unit_diagonal=True))


def test_planning_makes_zero_store_calls(tmp_path, rng):
    """Every lowering here is pure: plans of the factorization, the solves and
    the one-task routines read nothing (only the opened arrays' metadata)."""
    from zarr.storage import LocalStore

    from tilearray.engine.expr.nodes import Source
    from tilearray.testing import CountingStore, counts, reset_counts

    n, name = 300, f"plan-chol-{tmp_path.name}"
    ta.from_numpy(spd(rng, n), tmp_path / "a.zarr", tile=(64, 64))
    ref = ArrayRef(CountingStore(LocalStore(str(tmp_path / "a.zarr")), name))
    opened = ta.open(ref.store)
    a = ta.TiledArray(Source(opened.shape, opened.dtype, ref, opened.grid))
    budget = ta.Budget.from_config("160MiB", 2, 1)
    reset_counts(name)
    b = np.ones(n)
    for lazy in [ta.linalg.cholesky(a), ta.linalg.solve_plan(a, b, assume_a="pos"),
                 ta.linalg.solve_plan(a, b), ta.linalg._incore(a, "eigh", ())]:
        plan = lazy.plan(budget=budget)
        assert plan.tasks > 0 and plan.bytes_read > 0
    tight = ta.Budget.from_config("145MiB", 2, 1)  # ~3 MiB per task: the tiled LU
    assert "partial pivoting" in str(ta.linalg.solve_plan(a, b).plan(budget=tight))
    assert counts(name)["gets"] == 0 and counts(name).get("sets", 0) == 0


def test_only_known_errors_lose_the_workers_failure_log():
    """tilearray's own errors (which the client raises, naming the tile,
    chunk or path) and LinAlgError fail without distributed's "Compute
    Failed" record; any other failure keeps it."""
    import logging

    from tilearray.engine.runtime.plugins import _keep_record as keep

    def record(exception_text):
        return logging.LogRecord("distributed.worker", logging.ERROR, __file__, 1,
                                 "Compute Failed\nKey: %s\nState: %s\nTask: %s\n"
                                 "Exception: %r\nTraceback: %r\n",
                                 ("k", "executing", "t", exception_text, "tb"), None)

    assert not keep(record('NotPositiveDefiniteError("... column 100 ...")'))
    assert not keep(record("SingularMatrixError('... column 3 ...')"))
    assert not keep(record("AllNaNSliceError('np.nanargmin: All-NaN slice encountered')"))
    assert not keep(record("CorruptChunkError('a.zarr: chunk (0, 1): crc32c mismatch')"))
    assert not keep(record("StorageError('input b.zarr was modified while compute() read it')"))
    assert keep(record("ZeroDivisionError('division by zero')"))
    assert keep(record("RuntimeError('Zstd decompression error')"))
    other = logging.LogRecord("distributed.worker", logging.ERROR, __file__, 1,
                              "Failed to communicate", (), None)
    assert keep(other)


def test_solve_with_a_lazy_vector_b(eng, tmp_path, rng):
    """``solve(X.T @ X, X.T @ y)``, ``solve(A, A.sum(0))``: b a lazy vector."""
    x = rng.standard_normal((500, 30))
    xs = stored(tmp_path, "x.zarr", x, (64, 16))
    y = rng.standard_normal(500)
    got = np.linalg.solve(xs.T @ xs, xs.T @ y)
    want = np.linalg.solve(x.T @ x, x.T @ y)
    assert np.shape(got) == (30,)
    close(got, want)
    s = spd(rng, 120)
    a = stored(tmp_path, "a.zarr", s, (50, 50))
    for assume_a in ("gen", "pos"):
        got = ta.linalg.solve(a, a.sum(axis=0), assume_a=assume_a)
        close(got, np.linalg.solve(s, s.sum(axis=0)))
    with pytest.raises(ValueError, match=r"b of shape \(119,\)"):
        ta.linalg.solve(a, a.sum(axis=0)[:119])


def test_stored_factor_without_a_tile_fits_the_budget(small_eng, tmp_path, rng):
    """``cholesky(A).to_zarr(path)`` without ``tile=`` stores the planner's
    square unit, as a temporary factor: A's chunks of 300 would give 1200,
    one of whose tasks does not fit 16 MiB."""
    x = spd(rng, 1500)
    a = stored(tmp_path, "a.zarr", x, (300, 300))
    low = ta.linalg.cholesky(a)
    plan = low.plan(tmp_path / "l.zarr", engine=small_eng)  # not another module engine
    assert plan.peak_task_memory <= plan.budget.task_memory
    out = low.to_zarr(tmp_path / "l.zarr", engine=small_eng)
    assert out.grid.tile[0] == out.grid.tile[1] < 1200
    assert_close(np.asarray(out), np.linalg.cholesky(x))


def test_assume_a_spellings_and_bad_right_hand_sides(eng, tmp_path, rng):
    """SciPy's spellings of ``assume_a`` (a symmetric matrix is solved as a
    general one), one refusal naming the choices everywhere (det too), and a
    right-hand side that is not an array refused as a TypeError."""
    n = 60
    x = spd(rng, n)
    a = stored(tmp_path, "a.zarr", x, (25, 25))
    b = rng.standard_normal(n)
    want = np.linalg.solve(x, b)
    for kind in ["gen", "general", "sym", "symmetric", "pos", "positive definite"]:
        assert_close(ta.linalg.solve(a, b, assume_a=kind), want, err_msg=kind)
    assert_close(ta.linalg.det(a / 10, assume_a="positive definite"), np.linalg.det(x / 10))
    for call in [lambda: ta.linalg.solve(a, b, assume_a="foo"),
                 lambda: ta.linalg.solve_plan(a, b, assume_a="foo"),
                 lambda: ta.linalg.det(a, assume_a="foo"),
                 lambda: ta.linalg.slogdet(a, assume_a=None),
                 lambda: ta.linalg.inv(a, assume_a="diagonal")]:
        with pytest.raises(ValueError, match="assume_a=.*'gen'"):
            call()
    with pytest.raises(TypeError, match="b must be a numeric array"):
        ta.linalg.solve(a, "abc")
    with pytest.raises(TypeError, match="b must be a numeric array"):
        ta.linalg.solve(a, {1: 2})


EMPTY_CASES = {
    "cholesky": lambda L, A: L.cholesky(A), "inv": lambda L, A: L.inv(A),
    "det": lambda L, A: L.det(A), "slogdet": lambda L, A: tuple(L.slogdet(A)),
    "eigh": lambda L, A: tuple(L.eigh(A)), "eigvalsh": lambda L, A: L.eigvalsh(A),
    "eigvals": lambda L, A: L.eigvals(A),
    "solve": lambda L, A: L.solve(A, np.ones((A.shape[0], 2))),
    "solve_vector": lambda L, A: L.solve(A, np.ones(A.shape[0])),
    "qr": lambda L, A: tuple(L.qr(A)), "qr_r": lambda L, A: L.qr(A, mode="r"),
    "svd": lambda L, A: tuple(L.svd(A, full_matrices=False)),
    "svdvals": lambda L, A: L.svd(A, compute_uv=False),
    "lstsq": lambda L, A: L.lstsq(A, np.ones(A.shape[0]))[0],
    "matrix_rank": lambda L, A: L.matrix_rank(A), "pinv": lambda L, A: L.pinv(A),
    "norm2": lambda L, A: L.norm(A, 2), "nuc": lambda L, A: L.norm(A, "nuc"),
    "matrix_norm": lambda L, A: L.matrix_norm(A), "matrix_power": lambda L, A: L.matrix_power(A, 3),
    "cond": lambda L, A: L.cond(A),
    "solve_triangular": lambda L, A: (sla if L is np.linalg else L).solve_triangular(
        A, np.ones(A.shape[0])),
}


@pytest.mark.parametrize("dtype", ["float64", "float32", "int32"])
@pytest.mark.parametrize("shape", [(0, 0), (0, 3), (3, 0)])
def test_empty_matrices_as_numpy(eng, tmp_path, shape, dtype):
    """Empty inputs give NumPy's answers (an empty factor, det 1, rank 0,
    zero norms, minimum-norm zeros) in NumPy's shapes and dtypes; NumPy's
    refusals (a non-square empty matrix to a square function) are
    LinAlgErrors here too. They had all been refused as empty."""
    import warnings

    def value(v):
        if isinstance(v, tuple):
            return tuple(value(u) for u in v)
        return np.asarray(v.compute() if hasattr(v, "compute") else v)

    x = np.empty(shape, dtype)
    a = ta.from_numpy(x, tmp_path / "e.zarr")
    for name, f in EMPTY_CASES.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                want = value(f(np.linalg, x))
            except (np.linalg.LinAlgError, ValueError) as e:
                with pytest.raises(type(e)):  # NumPy's (SciPy's) refusal: the same class
                    value(f(ta.linalg, a))
                continue
            got = value(f(ta.linalg, a))
        want, got = (want, got) if isinstance(want, tuple) else ((want,), (got,))
        assert len(got) == len(want), name
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape and g.dtype == w.dtype, (name, g.shape, w.shape, g.dtype)
            np.testing.assert_array_equal(g, w, err_msg=name)
