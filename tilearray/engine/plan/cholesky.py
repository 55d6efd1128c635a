"""Lowering a tiled Cholesky factorization, blocked triangular solves and
one-task dense routines (:mod:`tilearray.graphs.cholesky` tasks). Pure:
node, specs and budget in, :class:`~.types.Stage` records out.

Cholesky is left-looking by square tile ``b``: task ``(i, j)``, ``i >= j``,
reads ``A_ij`` (strip by strip) and the L column panels of rows ``i`` and
``j`` left of the tile (and ``L_jj``) from the output array, which the tasks
that wrote them precede, and writes ``L_ij`` whole. The output's square I/O
unit ``u`` is given (``to_zarr(tile=...)``) or the planner's; ``b`` is the
largest multiple of ``u`` a task holds under the budget (panels are ``u``
wide, so a task holds about two tiles). Reads are about ``n^3 / (3 b)`` elements; the I/O lower bound
reported is ``n^3 / (3 sqrt(M))`` words (Ballard, Demmel, Holtz, Schwartz
2010: Omega(n^3 / sqrt(M)); this constant is the order, not the proven one),
``M`` the task's memory in elements, or A's lower triangle read once if
more.
"""

from __future__ import annotations

import math

import numpy as np
from dask.base import tokenize
from dask.utils import format_bytes

from ... import _config
from ...graphs import cholesky as gch
from ...graphs.blas import result_dtype, tile_edges
from ...graphs.blocks import group_edges, max_interval, tree
from ...graphs.emit import Tasks
from ...graphs.spec import Dep, Read, leaves, unit_edges
from . import layout
from .map import check_fits
from .memory import (
    as_rss,
    cholesky_peak,
    combine_peak,
    incore_peak,
    symv_peak,
    trsolve_peak,
)
from .memory import read_flight as zarr_flight
from .sizing import ahead, divisors, factor_tile, short
from .types import Budget, Output, Stage

MIN_TILE = 256
"""Elements: Cholesky tiles narrower than this waste BLAS efficiency."""
MIN_FIT = 64
"""Elements: the narrowest tile or panel the planner tries under a tight budget."""
TILE_ROWS_PER_THREAD = 4
"""Cholesky tile rows per thread at least (the tile is at most ``n / (4
threads)``): at 16384² on 2 threads, 8 x 8 tiles of 2048² took 24.4-25.0 s
against 29.8-30.6 s for 4 x 4 tiles of 4096² (twice each, interleaved, cold
cache), though they read 6.38 GiB instead of 3.75 GiB: along the diagonal
chain a 4 x 4 grid leaves one thread idle for whole tile tasks."""


SPLIT_ORDER = ((-1, -1), (-1, -2), (-2, -2))
"""Closing tiles that may run as two tasks, in this order as the budget
allows: the updates by the L columns left of column ``j - 1`` (ready while
column ``j - 1`` is being factored), held in worker memory, then the rest.
The chain ``(j, j) -> (j + 1, j) -> (j + 1, j + 1)`` otherwise runs alone on
one thread: at 32768² in 4096² tiles on 2 threads a task stream showed one
worker idle 30.7 s of 132.7 s behind ``(6, 6), (7, 6), (7, 7)`` (7.7 + 15.4
+ 8.6 s); splitting ``(7, 7)`` alone (what 2 x 1 GiB allows) took the run
from 134.7-135.4 s to 129.9 s. The partial tile is never written to the
output, where a marked unit must hold final values (a review showed a
partial written in place corrupting a resume with another tile size and a
rerun of the tile task)."""


def split_tiles(nt: int, peak: int, tile_bytes: int, budget: Budget) -> set:
    """The tiles of :data:`SPLIT_ORDER` whose partial tiles fit the budget
    beside a task's ``peak``, all held at once in the worst case (tiles in
    the first two columns have no early updates)."""
    room = max(budget.task_memory - peak, 0) // max(tile_bytes, 1)
    tiles = [(nt + i, nt + j) for i, j in SPLIT_ORDER if nt + j >= 2]
    return set(tiles[:room])


FLOPS_PER_BYTE = 20
"""Task work model of the priorities: a byte read costs about the time of
this many flops (2-core host: 53 GFLOP/s dgemm a thread, 0.9 GB/s zstd
decode of A, ~3 GB/s an uncompressed L panel)."""


def _work(bi: int, bj: int, k0: int, k1: int, diagonal: bool, itemsize: int) -> float:
    """Modelled work of subtracting the L columns ``[k0, k1)`` from a ``bi x bj``
    tile: its flops plus :data:`FLOPS_PER_BYTE` per byte of L panels read."""
    w = k1 - k0
    flops = bi * bi * w if diagonal else 2 * bi * bj * w
    return flops + FLOPS_PER_BYTE * itemsize * (bi * w + (0 if diagonal else bj * w))


def critical_paths(edges, done=frozenset(), itemsize: int = 8, split=frozenset()) -> dict:
    """``{(i, j): priority}`` of the tile tasks not ``done`` (and
    ``{("update", i, j): priority}`` of the early updates of the ``split``
    tiles): each task's bottom level -- its work plus the longest chain of
    tasks after it that read its tile -- in millions of modelled flops, at
    least 1. Ready tasks then run longest chain first: a list schedule of the
    diagonal chain ``(j, j) -> (j + 1, j) -> (j + 1, j + 1)`` and the tiles
    that feed it, not dask's row by row order, which left a thread idle
    behind the last columns' long tasks (simulated at 32768² in 4096² tiles
    on 2 threads: 139 s against 147 s; the measured run took 143 s).

    Task ``(i, j)`` is read by ``(i, q)``, ``j < q <= i``, and by column
    ``i``'s tasks (``j < i``) or column ``j``'s below it (``i == j``): taken
    column by column from the last, row ``i``'s best so far and column
    ``i``'s best are exactly its successors' best. A split tile's update
    precedes only its own tile task."""
    nt = len(edges)
    size = [e[1] - e[0] for e in edges]
    rowbest, colbest, out = [0.0] * nt, [0.0] * nt, {}
    for j in reversed(range(nt)):
        for i in reversed(range(j, nt)):
            if (i, j) in done:
                continue
            bi, bj, k = size[i], size[j], edges[j][0]
            k_stop = edges[j - 1][0] if (i, j) in split else 0
            finish = bi**3 / 3 if i == j else bi * bj * bj
            own = finish + _work(bi, bj, k_stop, k, i == j, itemsize) + \
                FLOPS_PER_BYTE * itemsize * (bi * bj + (0 if i == j else bj * bj))
            bl = own + max(rowbest[i], colbest[i])
            rowbest[i], colbest[j] = max(rowbest[i], bl), max(colbest[j], bl)
            out[i, j] = 1 + int(bl // 1e6)
            if (i, j) in split:
                early = _work(bi, bj, 0, k_stop, i == j, itemsize) + \
                    FLOPS_PER_BYTE * itemsize * bi * bj
                out["update", i, j] = 1 + int((bl + early) // 1e6)
    return out


def fetched_bytes(b: int, unit: int, n: int) -> int:
    """Rows (or columns) a read of ``b`` of them fetches: whole units."""
    if b % unit == 0:
        return min(b, n)
    if unit % b == 0 or unit >= n:  # tiles on multiples of b: inside one unit
        return min(unit, n)
    return min((-(-b // unit) + 1) * unit, n)


def _a_read(spec, b: int, n: int) -> int:
    """Bytes a read of one ``b x b`` tile of ``spec`` fetches, at most."""
    return sum(fetched_bytes(b, lf.grid.unit[0], n) * fetched_bytes(b, lf.grid.unit[1], n)
               * lf.dtype.itemsize for lf in leaves(spec))


def _strip_read(spec, b: int, n: int) -> int:
    """Bytes one strip of a ``b``-wide tile of ``spec`` fetches, at most: a
    strip lies inside one I/O unit row of every input (taken as its longer side)."""
    return sum(min(max(lf.grid.unit), n) * fetched_bytes(b, min(lf.grid.unit), n)
               * lf.dtype.itemsize for lf in leaves(spec))


def input_unit_side(spec) -> int:
    """The smallest I/O unit side of the stored arrays ``spec`` reads (1 without any)."""
    units = [u for lf in leaves(spec) for u in lf.grid.unit]
    return min(units) if units else 1


def chol_peak(spec, b: int, panel: int, n: int, itemsize: int) -> int:
    """Peak of a tile task: ``b x b`` tiles, L's I/O unit ``panel`` (square)."""
    return cholesky_peak(b, panel, _strip_read(spec, b, n), zarr_flight(spec), itemsize,
                         itemsize)


def fit_tile(n: int, align: int, cap: int, peak_of, budget: Budget) -> int:
    """The largest square tile ``<= cap`` whose task fits ``budget``: a
    multiple of ``align`` (the input's I/O unit) when one fits, else the
    larger of the largest divisor of it (``>=`` :data:`MIN_FIT`) and the
    largest multiple of 64 that fit; :data:`MIN_FIT` if none fits (the
    caller refuses it with its peak: thinner tiles would only multiply
    tasks and reads).

    A tile inside one unit reads that unit, one across a unit's edge reads
    two: with 1024² input units at 33 MiB a Cholesky task, 256 (a divisor)
    fits where no unaligned tile above 128 does. An LU panel reads a band of
    units whatever its width: at 16384² in 1024² units with 1 GiB workers,
    panels of 960 fit and the divisor would be 512."""
    cap = max(min(cap, n), 1)

    def fits(b: int) -> bool:
        return peak_of(b) <= budget.task_memory

    divisor = 0
    if align > 1:  # aligned tiles first: the largest multiple of the unit that fits
        m = cap // align  # peaks grow with the multiple
        lo, hi = 0, m
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if fits(mid * align) else (lo, mid - 1)
        if lo:
            return lo * align
        divisor = next((b for b in reversed(divisors(align)) if MIN_FIT <= b <= cap and fits(b)),
                       0)
    lo, hi = min(MIN_FIT, cap), cap  # never below MIN_FIT: the caller refuses it instead
    while lo < hi:  # the largest b that fits, were peaks to grow with b
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    unaligned = lo if lo < 64 or lo == cap else lo // 64 * 64
    best = divisor if divisor and (divisor >= unaligned or not fits(unaligned)) else unaligned
    return best if best >= MIN_TILE else _flat_tile(best, align, cap, peak_of)


FLAT_PEAK = 1.1
"""A tile under :data:`MIN_TILE` is kept only when no tile of at least
:data:`MIN_TILE` needs less than this times its peak (then refused, naming
the memory it needs)."""


def _flat_tile(best: int, align: int, cap: int, peak_of) -> int:
    """``best``, or the largest tile of at least :data:`MIN_TILE` (a multiple
    or divisor of ``align``, else of 64) whose peak is within
    :data:`FLAT_PEAK` of ``best``'s. A task whose peak is mostly fixed (a
    whole input unit read) grows little with its tile: at 16384² in 2048²
    chunks, 128-wide tiles needed 115.35 MiB and 1024-wide 124.8 MiB, and
    277 MiB a worker planned the 128s (24,767 tasks reading 345 GiB) where
    290 MiB plans 407 tasks reading 16.9 GiB."""
    if align > 1:
        sizes = {align * k for k in range(1, cap // align + 1)} | set(divisors(align))
    else:
        sizes = set(range(64, cap + 1, 64))
    floor = FLAT_PEAK * peak_of(best)
    return next((b for b in sorted(sizes, reverse=True)
                 if MIN_TILE <= b <= cap and peak_of(b) <= floor), best)


def cholesky_tile(node, spec, budget: Budget, unit: int | None = None) -> tuple[int, int]:
    """``(b, unit)``: the task tile ``b`` of a Cholesky whose factor is stored
    in square I/O units ``unit`` (the planner's choice when None: the stored
    default, :func:`~.sizing.factor_tile`, or the largest that fits).

    ``b`` is the largest multiple of ``unit`` whose task fits the budget, at
    most ``n / (TILE_ROWS_PER_THREAD threads)`` rounded up to a multiple of
    A's unit, but never under :data:`MIN_TILE`; the default unit is held to
    it too (at 4000² in 256² chunks on 2 threads, 1024-wide tiles at 200 MiB
    a worker and 256-wide ones at 180 MiB, now 512 at both; at 10000² in
    1000² chunks, 5 x 5 tiles of 2000 took 6.6-11.0 s against 9.4-12.4 s
    for 10 x 10 of 1000, interleaved). The L tiles are read back about ``n / (3 b)`` times,
    so reads fall as the tile grows, but fewer, larger tiles leave threads
    idle along the diagonal chain. When even ``b = unit`` does not fit,
    ``(unit, unit)`` is returned and the lowering refuses it with its peak."""
    n, item = node.shape[0], np.dtype(node.dtype).itemsize
    align = input_unit_side(spec)
    target = -(-n // (TILE_ROWS_PER_THREAD * budget.total_threads))
    cap = max(MIN_TILE, align * -(-target // align))  # a multiple of A's unit
    if unit is None:
        unit = min(factor_tile(node), max(n, 1))
        if unit > cap or chol_peak(spec, unit, unit, n, item) > budget.task_memory:
            unit = fit_tile(n, align, cap, lambda b: chol_peak(spec, b, b, n, item), budget)
    m = 1
    while m * unit < n and (m + 1) * unit <= cap and \
            chol_peak(spec, (m + 1) * unit, unit, n, item) <= budget.task_memory:
        m += 1
    return m * unit, unit


def io_bound(n: int, itemsize: int, budget: Budget) -> int:
    """Bytes read at least: ``n^3 / (3 sqrt(M))`` words, or A's lower triangle once."""
    m_words = max(budget.task_memory // itemsize, 1)
    return int(itemsize * max(n**3 / (3 * math.sqrt(m_words)), n * (n + 1) / 2))


def _tiles_done(skip, m: int, nu: int, nt: int) -> set:
    """Tiles ``(i, j)`` whose ``m x m`` units (of ``nu`` per side) are all in ``skip``."""
    def units(t):
        return range(t * m, min(t * m + m, nu))
    return {(i, j) for i in range(nt) for j in range(nt)
            if all((r, c) in skip for r in units(i) for c in units(j))} if skip else set()


def lower_cholesky(node, spec, deps: list, budget: Budget, b: int, out, l_grid,
                   skip=frozenset(), keep=False) -> Stage:
    """The Cholesky tile tasks of ``node`` (``A`` read as ``spec``) into ``out``
    (grid ``l_grid``: square I/O units dividing ``b``, those in ``skip``
    done): each ``b x b`` tile task, and per row one task marking the tiles
    above the diagonal as zeros, not stored (nothing written but markers).
    ``keep``: each block row is read back by a task (``compute()``; output
    "blocks"), after every tile task (their figures: output "stats")."""
    n, dtype = node.shape[0], np.dtype(node.dtype)
    u = l_grid.unit[1]
    peak = chol_peak(spec, b, u, n, dtype.itemsize)
    check_fits("cholesky", peak, f"{short(node)} in {b} x {b} tiles", budget)
    edges = tuple(tile_edges(n, b))
    nt = len(edges)
    done = _tiles_done(skip, b // u, -(-n // u), nt)
    strips = tuple(e for e in unit_edges(spec, 0, n) if 0 < e < n)
    name = "cholesky-" + tokenize(spec, deps, edges, strips, str(out), keep, sorted(done))
    cuts = [0, *(e[1] for e in edges)]
    row_cuts = sorted(set(cuts) | set(strips))
    a_costs = layout.BlockCosts(spec, row_cuts, cuts)
    lread = Read(out, l_grid, dtype)
    l_panels = layout.BlockCosts(lread, cuts, l_grid.unit_edges(1))
    l_tiles = layout.BlockCosts(lread, cuts, cuts)
    l_units = layout.BlockCosts(lread, l_grid.unit_edges(0), l_grid.unit_edges(1))
    work, keys, tot, written = Tasks(), [], layout.ReadTotals(), 0
    split = split_tiles(nt, peak, b * b * np.dtype(result_dtype(dtype)).itemsize, budget)
    priority = critical_paths(edges, done, dtype.itemsize, split)
    for j in range(nt):
        for i in range(j, nt):
            if (i, j) in done:
                continue
            reads = [(i, k) for k in range(j)] + ([(j, k) for k in range(j)] if i > j else [])
            reads += [(j, j)] if i > j else []
            after = [(name, r, c) for r, c in reads if (r, c) not in done]
            partial = None
            if (i, j) in split:  # the early updates as their own task, held in memory
                early = [a for a in after if a[2] < j - 1]
                after = [a for a in after if a[2] >= j - 1]
                partial = work.add((name, "update", i, j), gch.update, spec, deps, out, edges,
                                   strips, u, i, j, edges[j - 1][0], dtype, *early,
                                   priority=priority["update", i, j], queued=True)
            keys.append(work.add((name, i, j), gch.tile, spec, deps, out, edges, strips, u,
                                 i, j, dtype, partial, *after, priority=priority[i, j],
                                 queued=True))
            s0, s1 = row_cuts.index(edges[i][0]), row_cuts.index(edges[i][1])
            tot.add(*(a_costs.at(s, j) for s in range(s0, s1)))
            panels = range(edges[j][0] // u)
            tot.add(*(l_panels.at(i, k) for k in panels))
            if i > j:
                diag = range(edges[j][0] // u, -(-edges[j][1] // u))  # L_jj's lower units
                tot.add(*(l_panels.at(j, k) for k in panels),
                        *(l_units.at(r, c) for r in diag for c in diag if c <= r))
            written += (edges[i][1] - edges[i][0]) * (edges[j][1] - edges[j][0]) * dtype.itemsize
    for i in range(nt - 1):
        cols = tuple(j for j in range(i + 1, nt) if (i, j) not in done)
        if cols:
            keys.append(work.add((name, "zeros", i), gch.zeros, out, edges, i, cols, dtype))
    bound = io_bound(n, dtype.itemsize, budget)
    outputs = {"result": Output("store", tuple(keys))}
    back = ""
    if keep:  # compute(): each tile read back once its writer is done
        blocks = [(i, j) for i in range(nt) for j in range(nt)]
        back_keys = [work.add((name, "back", i, j), gch.read_back, out, edges[i], edges[j],
                              (name, i, j) if j <= i else (name, "zeros", i))
                     for i, j in blocks]
        tot.add(*(l_tiles.at(i, j) for i, j in blocks))
        outputs = {"result": Output("blocks", tuple(back_keys),
                                    tuple((edges[i], edges[j]) for i, j in blocks)),
                   "tiles": Output("stats", tuple(keys))}
        back = "; the factor is read back tile by tile for compute()"
    return Stage(
        "cholesky", f"{short(node)}: left-looking by {b} x {b} tiles ({nt} x {nt}; "
        f"{len(keys)} tasks, each writing its {u} x {u} units whole); each task reads its A "
        f"tile strip by strip and streams the L panels to its left back from the output"
        + (f" (tiles {sorted(split)} in two tasks: the updates known early, held in "
           "memory, then the rest)" if split else "") + "; "
        f"reads {format_bytes(tot.nbytes)} vs the I/O lower bound n^3/(3 sqrt(M)) = "
        f"{format_bytes(bound)} ({tot.nbytes / max(bound, 1):.2f}x)"
        + back, len(work), peak, tot.nbytes, written, flops=n**3 // 3, io_lower_bound=bound,
        reads=tot.reads, store_gets=tot.gets, work=work.freeze(), outputs=outputs)


def trsolve_tile(n: int, ncols: int, t_spec, itemsize: int, budget: Budget,
                 whole_rhs: bool = False) -> int:
    """The row tile of a substitution: the stored T's tile when T is a
    planner-tiled factor (a multiple of it up to :data:`MIN_TILE` rows, as
    fits, where it is narrower: a task per pair of 64-row tiles would be
    thousands of tasks), else the largest that fits."""
    def peak_of(b: int) -> int:
        return trsolve_peak(b, ncols, n, _a_read(t_spec, b, n), itemsize, whole_rhs)

    if isinstance(t_spec, Read) and t_spec.grid.tile[0] == t_spec.grid.tile[1]:
        b = t_spec.grid.tile[0]
        if peak_of(b) <= budget.task_memory:
            m = max(-(-min(MIN_TILE, n) // b), 1)
            while m > 1 and peak_of(m * b) > budget.task_memory:
                m -= 1
            return m * b
    return fit_tile(n, input_unit_side(t_spec), n, peak_of, budget)


def lower_trsolve(node, t_spec, b_spec, deps: list, budget: Budget,
                  label: str | None = None) -> Stage:
    """Blocked substitution ``T X = B`` (``node.options``: ``lower`` of the stored
    S, ``trans``: T = S^T, ``unit``, ``vector``): one task per tile left of
    (or right of, backwards) the diagonal, subtracting its term ``T_ik X_k``
    from the row tile's partial sum as soon as ``X_k`` is solved (the
    workers read the tiles side by side; a chain per row tile, so a row
    tile holds one partial sum, where a term per solved tile had piled up
    until its solve), one task per row tile solving the diagonal tile, in
    order, then a gather task whose value is X. ``label`` names the system
    in the plan where ``node`` does not (a factor read from a temporary)."""
    n, ncols = node.x.shape[0], node.y.shape[1]
    dtype = np.dtype(node.dtype)
    opts = dict(node.options)
    whole = isinstance(b_spec, Dep)  # an in-memory B: each task holds all of it
    b = trsolve_tile(n, ncols, t_spec, dtype.itemsize, budget, whole)
    peak = trsolve_peak(b, ncols, n, _a_read(t_spec, b, n), dtype.itemsize, whole)
    check_fits("triangular solve", peak, short(node), budget)
    edges = tuple(tile_edges(n, b))
    cuts = [0, *(e[1] for e in edges)]
    t_costs = layout.BlockCosts(t_spec, cuts, cuts)
    b_costs = layout.BlockCosts(b_spec, cuts, [0, ncols])
    forward = bool(opts["lower"]) != bool(opts["trans"])
    order = range(len(edges)) if forward else range(len(edges) - 1, -1, -1)
    name = "trsolve-" + tokenize(t_spec, b_spec, deps, edges, node.options)
    work, done, tot = Tasks(), [], layout.ReadTotals()
    for i in order:  # a task per tile left of the diagonal, as soon as its X_k is solved
        acc = None
        for k in done:
            acc = work.add((name, "eliminate", i, k), gch.eliminate, t_spec, deps, b_spec, deps,
                           edges, i, k, bool(opts["trans"]), ncols, dtype, acc, (name, k))
        work.add((name, i), gch.substitute, t_spec, deps, b_spec, deps, edges, i, ncols,
                 node.options, dtype, acc)
        tiles = [((k, i) if opts["trans"] else (i, k)) for k in done] + [(i, i)]
        tot.add(b_costs.at(i, 0), *(t_costs.at(r, c) for r, c in tiles))
        done.append(i)
    key = work.add(name + "-gather", gch.gather, bool(opts.get("vector")),
                   *[(name, i) for i in range(len(edges))])
    return Stage(
        "trsolve", f"{label or short(node)}: {'forward' if forward else 'backward'} substitution by "
        f"{len(edges)} row tiles of {b} (each tile of T read once, by the task of its term "
        "as soon as the row tile it multiplies is solved)", len(work), peak,
        tot.nbytes, flops=n * n * ncols, reads=tot.reads, store_gets=tot.gets, work=work.freeze(),
        outputs={"0": Output("value", (key,))})


def lower_symv(node, a_spec, w_spec, deps: list, budget: Budget) -> Stage:
    """``A W`` for a symmetric ``A`` taken from its lower triangle only (the
    one a Cholesky factor of ``A`` uses, so a residual ``b - A x`` checks the
    system the factor solved; the strict upper triangle never enters): one
    task per block of A holding part of the lower triangle -- ``A_ij W_j``
    into the block's rows and ``A_ij^T W_i`` into its columns, masked where
    it crosses the diagonal -- and a tree summing them (fan-in
    ``reduction.split-every``). With option ``norm`` the result has one more
    column: the row sums of ``|A|`` (its maximum is ``||A||_inf``). The
    tree's fan-in is lowered until ``fan + 2`` sums of ``n x k`` fit a task.

    Blocks are whole I/O units of A joined up to a side that fits the
    budget (at most ``n / (4 threads)`` where units allow), so no unit is
    read twice: square units read about half of A, units spanning whole
    rows or columns all of it, once."""
    n, k = node.x.shape[0], node.y.shape[1]
    dtype = np.dtype(node.dtype)
    norm = bool(dict(node.options).get("norm"))
    item = max(dtype.itemsize, 8)
    units = [unit_edges(a_spec, axis, n) for axis in (0, 1)]
    if not leaves(a_spec):  # nothing stored: any blocks
        units = [(*range(0, n, MIN_FIT), n)] * 2

    def blocks(side: int) -> tuple:
        return tuple(group_edges(u, side) for u in units)

    def peak_of(side: int) -> int:
        rows, cols = blocks(side)
        read = layout.BlockCosts(a_spec, rows, cols).max_read_bytes()
        h, w = max_interval(rows), max_interval(cols)
        return symv_peak(h * w, h + w, k, n, read, item, norm)

    cap = max(MIN_TILE, -(-n // (TILE_ROWS_PER_THREAD * budget.total_threads)))
    side = fit_tile(n, 1, cap, peak_of, budget) if n else 1
    row_cuts, col_cuts = blocks(side)
    piece = n * (k + int(norm)) * item  # a sum of block products
    fan = max(2, min(int(_config.get("reduction.split-every")),
                     budget.task_memory // max(as_rss(piece), 1) - 2))
    peak = max(peak_of(side), combine_peak(piece, fan))
    check_fits("symmetric product", peak, short(node), budget)
    costs = layout.BlockCosts(a_spec, row_cuts, col_cuts)
    spans = [((row_cuts[i], row_cuts[i + 1]), (col_cuts[j], col_cuts[j + 1]), i, j)
             for i in range(len(row_cuts) - 1) for j in range(len(col_cuts) - 1)
             if col_cuts[j] < row_cuts[i + 1]]  # some element on or below the diagonal
    name = "symv-" + tokenize(a_spec, w_spec, deps, row_cuts, col_cuts, node.options)
    work, tot, parts = Tasks(), layout.ReadTotals(), []
    for t, (rows, cols, i, j) in enumerate(spans):
        nxt = ahead(spans, t, budget)
        parts.append(work.add((name, i, j), gch.symv_tile, a_spec, deps, w_spec, deps, rows,
                              cols, k, norm, dtype, None if nxt is None else nxt[:2]))
        tot.add(costs.at(i, j))
    root = tree(parts, fan, lambda level, c: (name, "sum", level, c),
                lambda children: (gch.symv_sum, n, k, norm, dtype, *children), work)
    key = work.add(name + "-result", gch.symv_sum, n, k, norm, dtype, *([root] if parts else []))
    return Stage(
        "product", f"{short(node)}: symmetric product from the lower triangle, "
        f"{len(spans)} blocks of up to {max_interval(row_cuts)} x {max_interval(col_cuts)}"
        + (" and the row sums of |A|" if norm else "")
        + (f", partials summed with fan-in {fan}" if len(parts) > 1 else ""),
        len(work), peak, tot.nbytes, flops=2 * n * n * k, reads=tot.reads,
        store_gets=tot.gets, work=work.freeze(), outputs={"0": Output("value", (key,))})


def lower_logdiag(node, l_spec, deps: list) -> Stage:
    """One task: NumPy's ``slogdet`` from the diagonal tiles of a stored Cholesky factor."""
    n = node.x.shape[0]
    b = l_spec.grid.tile[0]
    edges = tuple(tile_edges(n, b))
    cuts = [0, *(e[1] for e in edges)]
    costs = layout.BlockCosts(l_spec, cuts, cuts)
    tot = layout.ReadTotals()
    tot.add(*(costs.at(i, i) for i in range(len(edges))))
    key = "logdiag-" + tokenize(l_spec, deps, edges)
    work = Tasks()
    work.add(key, gch.logdiag, l_spec, deps, edges, np.dtype(node.dtype))
    return Stage("small", f"slogdet from the {len(edges)} diagonal tiles of the Cholesky "
                 "factor", 1, 0, tot.nbytes, reads=tot.reads, store_gets=tot.gets,
                 work=work.freeze(), outputs={"0": Output("value", (key,))})


def incore_need(node, x_spec, y_spec) -> tuple:
    """``(peak, ReadTotals)`` of one task reading the whole matrix."""
    n = node.x.shape[0]
    ycols = node.y.shape[1] if node.y is not None else 0
    cuts = [0, n]
    tot = layout.ReadTotals(*layout.BlockCosts(x_spec, cuts, cuts).at(0, 0))
    if y_spec is not None:
        tot.add(layout.BlockCosts(y_spec, cuts, [0, ycols]).at(0, 0))
    item = np.dtype(node.dtype).itemsize
    # geev: the copy, real eigenvectors, their complex form (2 n^2) and workspace
    work = 6 if dict(node.options).get("op") == "eig" else 4
    return incore_peak(tot.nbytes, n, item, work) + as_cols(n, ycols, item), tot


def lower_incore(node, x_spec, y_spec, deps: list, budget: Budget) -> Stage:
    """One task reading the whole matrix (and right-hand sides): refused with
    the sizes when it cannot hold them."""
    n = node.x.shape[0]
    op = dict(node.options)["op"]
    ycols = node.y.shape[1] if node.y is not None else 0
    peak, tot = incore_need(node, x_spec, y_spec)
    check_fits(op, peak, f"{short(node)} ({op} reads the whole {n} x {n} matrix into one "
               "task: it is computed only for a matrix one task can hold, a covariance or a "
               "Gram)", budget, tiles_help=False)
    key = "incore-" + tokenize(op, x_spec, y_spec, deps, node.options)
    work = Tasks()
    work.add(key, gch.incore, op, node.options, x_spec, deps, n, y_spec, deps, ycols,
             np.dtype(node.dtype))
    return Stage("incore", f"{op} of the whole {n} x {n} matrix in one task", 1, peak,
                 tot.nbytes, flops=4 * n**3, reads=tot.reads, store_gets=tot.gets,
                 work=work.freeze(), outputs={"0": Output("value", (key,))})


def as_cols(n: int, ycols: int, itemsize: int) -> int:
    return 3 * n * ycols * max(itemsize, 8)


