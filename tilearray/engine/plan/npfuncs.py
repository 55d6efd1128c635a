"""Lowering the NumPy functions that are neither maps nor tree reductions
(pure: node, spec and budget in, :class:`~.types.Stage` records out).

- a diagonal: one task per stretch of the diagonal inside one I/O unit of
  every input, then one task joining the pieces -- only the units the
  diagonal crosses are read;
- a sort / argsort along an axis: whole lines in one task each, written whole;
- exact quantiles along an axis: whole lines (columns for ``axis=0``) in one
  task each, in bands as wide as the budget allows, then a join;
- a scan (``cumsum``/``cumprod``/``cummax``...): two passes over the input -- each
  block's total along the axis (all bands but the last), one carry task per
  band across, then every block scanned with its carry added.
"""

from __future__ import annotations

import numpy as np
from dask.base import tokenize

from ... import _config
from ...graphs import npfuncs as gnp
from ...graphs.blocks import group_edges, intervals, max_interval, tree
from ...graphs.emit import Tasks
from ...graphs.spec import Op, unit_edges
from . import layout
from .map import check_fits, fit_blocks
from .memory import BlockTask, as_rss, block_peak, leaf_itemsize, op_temporaries, read_flight
from .sizing import DoesNotFit, all_done, divisors, short
from .types import Budget, Output, Stage


def _line_stage(node, kind: str, spec, deps, blocks, fn: str, kwargs: tuple, join_axis: int,
                temp_per_elem: int, budget: Budget, what: str, label: str = "",
                strips=None, join=None) -> Stage:
    """One task per block (``fn`` of the block: a small array), one join
    (along ``join_axis``, or the task ``join`` of the values); with
    ``strips``, each block read strip by strip (:func:`_strip_peak`)."""
    token = tokenize(kind, spec, blocks, fn, kwargs, deps)
    work, keys = Tasks(), []
    tot, peak = layout.ReadTotals(), 0
    task = BlockTask(temp_per_elem, 0, read_flight(spec))
    for i, (rows, cols) in enumerate(blocks):
        if strips is None:
            cost = layout.BlockCosts(spec, rows, cols).at(0, 0)
            size = (rows[1] - rows[0]) * (cols[1] - cols[0])
            peak = max(peak, block_peak(task, cost[0], size))
        else:
            *cost, p = _strip_costs(spec, rows, cols, strips, task, dict(kwargs)["axis"])
            peak = max(peak, p)
        tot.add(cost)
        keys.append(work.add((f"{kind}-" + token, i), gnp.block_line, spec, rows, cols, deps,
                             fn, kwargs, strips))
    check_fits(kind, peak, label or short(node), budget)
    key = work.add(f"{kind}-join-" + token, *((join,) if join else (gnp.join_values, join_axis)),
                   *keys)
    return Stage("reduce", what, len(work), peak, tot.nbytes, reads=tot.reads,
                 store_gets=tot.gets, work=work.freeze(), outputs={"0": Output("value", (key,))})


def _strip_costs(spec, rows, cols, strips, task: BlockTask, axis: int):
    """``(bytes, requests, gets, peak)`` of a block read strip by strip along
    ``axis`` (``strips``: its cuts), as the worker reads it: one strip's
    reads and temporaries at a time, plus the whole block's buffer and
    NumPy's float64 working copy of it. (The axis was once guessed from
    whether ``rows`` spans the strips, wrong for a band of a square matrix
    spanning all rows: 32,000,000 bytes planned, 1,280,000 read.)"""
    along_rows = axis == 0
    costs = layout.BlockCosts(spec, strips, cols) if along_rows else \
        layout.BlockCosts(spec, rows, strips)
    n_strips = len(strips) - 1
    cells = [costs.at(k, 0) if along_rows else costs.at(0, k) for k in range(n_strips)]
    other = (cols[1] - cols[0]) if along_rows else (rows[1] - rows[0])
    worst = max(((c[0], (strips[k + 1] - strips[k]) * other) for k, c in enumerate(cells)),
                default=(0, 0))
    size = (rows[1] - rows[0]) * (cols[1] - cols[0])
    peak = block_peak(task, worst[0], worst[1]) + as_rss(size * 16)
    return (sum(c[0] for c in cells), sum(c[1] for c in cells), sum(c[2] for c in cells), peak)


def lower_diagonal(node, spec, deps: list, budget: Budget) -> Stage:
    """``np.diagonal(x, offset)``: the blocks the diagonal crosses, cut where it
    crosses an I/O unit edge of any input (each unit read once)."""
    m, n = node.x.shape
    r0, c0 = max(-node.offset, 0), max(node.offset, 0)
    length = int(node.shape[0])
    cuts = {0, length}
    cuts |= {e - r0 for e in unit_edges(spec, 0, m) if 0 < e - r0 < length}
    cuts |= {e - c0 for e in unit_edges(spec, 1, n) if 0 < e - c0 < length}
    blocks = [((r0 + a, r0 + b), (c0 + a, c0 + b)) for a, b in intervals(sorted(cuts))
              if b > a]
    temps = (op_temporaries(spec) + 1) * max(np.dtype(node.dtype).itemsize, 8)
    kwargs = (("dtype", np.dtype(node.dtype)),)
    if not blocks:  # an empty diagonal: one task gives NumPy's empty answer
        blocks = [((0, 0), (0, 0))]
    return _line_stage(node, "diagonal", spec, deps, blocks, "diagonal", kwargs, 0, temps,
                       budget, f"{short(node)}: {len(blocks)} blocks along the diagonal")


STRIP_BYTES = 4 * 2**20
"""Bytes across the whole width a strip of lines' reads holds, at most (a
strip is whole I/O units along the lines, at least one)."""


def _strips(spec, ax: int, length: int, width: int, budget: Budget) -> tuple:
    """The strips a task holding whole lines along ``ax`` reads them in: whole
    I/O units along the lines, as many as :data:`STRIP_BYTES` across the
    width holds (one at a time made a median of 10,000 x 200 in 1-row
    chunks 10,000 reads of 1.6 kB: 16.9 s against 0.9 s for its sum), and
    at most an eighth of a task's memory (a whole 6002 x 77 X read as one
    strip at 7.5 MiB a task left no room for a band of lines beside it: one
    band a column, X read 36 times, helper-51)."""
    most = min(STRIP_BYTES, budget.task_memory // 8)
    per = max(most // max(width * leaf_itemsize(spec), 1), 1)
    return group_edges(unit_edges(spec, ax, length), per)


def lower_quantile(node, spec, deps: list, budget: Budget) -> Stage:
    """Exact quantiles along ``node.axis``: a task holds whole lines (a
    buffer of them and NumPy's float64 working copy), filled strip by strip
    along the lines on the inputs' I/O unit edges (one strip's units held at
    a time), in bands across as wide as fit -- on unit edges while a unit's
    width fits, else cut inside units (each band then reads the units it
    meets). Refused (DoesNotFit, naming the line length) when one line does
    not fit."""
    ax, other = node.axis, 1 - node.axis
    length, width = node.x.shape[ax], node.x.shape[other]
    temps = (op_temporaries(spec) + 1) * 8
    strips = _strips(spec, ax, length, width, budget)
    base = unit_edges(spec, other, width)
    task = BlockTask(temps, 0, read_flight(spec))
    w = max(budget.task_memory // max(length * 16, 1), 1)
    unit = max_interval(base)
    while True:
        edges = group_edges(base, w)
        if max_interval(edges) > w:  # a unit wider than fits: cut inside units,
            # a divisor of the unit wide (a band across a unit's edge reads two
            # units, more than the widest band checked here)
            w = max(d for d in divisors(unit) if d <= w)
            edges = tuple(range(0, width, w)) + (width,) if width else (0,)
        band = max(intervals(edges), key=lambda b: b[1] - b[0], default=(0, 0))
        block = ((0, length), band) if ax == 0 else (band, (0, length))
        peak = _strip_costs(spec, *block, strips, task, ax)[3]
        # narrower bands would not lower it: the units each band reads are most of it
        # (a 20,000 x 256 median along rows in one chunk had gone down to a band per
        # line, 20,000 tasks costed before the refusal, 2M rows many minutes)
        held = (band[1] - band[0]) * length * 16
        if peak <= budget.task_memory or w == 1 or 32 * held < peak:
            break
        w = max(w // 2, 1)
    label = (f"{short(node)} (exact: one task holds whole lines along axis {ax}, "
             f"{length} elements each)")
    if peak > budget.task_memory:  # refused before laying out a band per line
        check_fits("quantile", peak, label, budget)
    bands = intervals(edges) or [(0, 0)]
    blocks = [((0, length), band) if ax == 0 else (band, (0, length)) for band in bands]
    q = np.asarray(node.q, dtype=np.float64)
    kwargs = (("q", q if not node.scalar_q else float(q[0])), ("axis", ax),
              ("method", node.method), ("dtype", np.dtype(node.dtype)))
    if node.op.endswith("median"):
        kwargs = (("axis", ax), ("dtype", np.dtype(node.dtype)))
    return _line_stage(node, "quantile", spec, deps, blocks, node.op, kwargs,
                       0 if node.scalar_q else 1, temps, budget,
                       f"{short(node)}: {len(blocks)} bands of whole lines (exact), each "
                       f"read in {len(strips) - 1} strips", label, strips)


def lower_sort(node, spec, deps: list, budget: Budget, out=None, out_grid=None,
               skip=frozenset()) -> Stage:
    """``np.sort`` / ``np.argsort`` along ``node.axis``: a task holds whole
    lines (read strip by strip on the inputs' unit edges into one buffer,
    sorted in it; argsort's indices beside it), in bands across as wide as
    fit (at most ``map.block-bytes``, and at least one band per worker
    thread): on the output's unit edges when it is written (a unit is never
    split between tasks: refused when one unit's lines do not fit), else on
    the inputs' (cut inside units when one is too wide). Each band is read
    once and written whole."""
    ax, other = node.axis, 1 - node.axis
    length, width = node.x.shape[ax], node.x.shape[other]
    out_size = np.dtype(node.dtype).itemsize
    temps = (op_temporaries(spec) + 1) * 8
    strips = _strips(spec, ax, length, width, budget)
    base = out_grid.unit_edges(other) if out_grid is not None else unit_edges(spec, other, width)
    task = BlockTask(temps, 0, read_flight(spec))

    def peak_of(band) -> int:
        block = ((0, length), band) if ax == 0 else (band, (0, length))
        size = (band[1] - band[0]) * length
        return _strip_costs(spec, *block, strips, task, ax)[3] + as_rss(2 * size * out_size)

    cap = min(budget.task_memory, _config.get_bytes("map.block-bytes"))
    slots = budget.n_workers * budget.threads_per_worker  # every worker busy
    w = max(min(cap // max(length * (16 + 2 * out_size), 1), -(-width // max(slots, 1))), 1)
    edges = group_edges(base, w)  # whole units, even one wider than w
    while True:
        peak = max((peak_of(b) for b in intervals(edges)), default=0)
        widest = max_interval(edges)
        if peak <= budget.task_memory or widest <= 1 or out_grid is not None and \
                widest <= max_interval(base):
            break
        w = max(widest // 2, 1)
        edges = group_edges(base, w)
        if max_interval(edges) > w and out_grid is None:  # a unit's lines do not fit: cut
            edges = tuple(range(0, width, w)) + (width,) if width else (0,)  # inside units
        # (never an output's units, written whole by one task: the next round stops on
        # them, and the stage is refused if they do not fit; helper-51's np.sort into
        # 1000-row units had been cut in 501-row bands and failed as it wrote)
    what = f"{node} (whole lines along axis {ax}, {length} elements each)"
    check_fits("sort", peak, what, budget)
    token = tokenize("sort", spec, edges, str(out), deps, node.op, ax, node.kind)
    work, blocks = Tasks(), []
    tot, written = layout.ReadTotals(), 0
    for i, band in enumerate(intervals(edges)):
        rows, cols = ((0, length), band) if ax == 0 else (band, (0, length))
        if out_grid is not None and all_done(out_grid, rows, cols, skip):
            continue
        tot.add(_strip_costs(spec, rows, cols, strips, task, ax)[:3])
        work.add(("sort-" + token, i), gnp.sort_block, spec, rows, cols, deps, strips, node.op,
                 ax, node.kind, np.dtype(node.dtype), out)
        if out is not None:
            written += (rows[1] - rows[0]) * (cols[1] - cols[0]) * out_size
        blocks.append((rows, cols))
    keys = tuple(t.key for t in work.freeze())
    result = Output("store", keys) if out is not None else Output("blocks", keys, tuple(blocks))
    return Stage("map", f"{short(node)}: {len(intervals(edges))} bands of whole lines, each "
                 f"read in {len(strips) - 1} strips and sorted", len(work), peak, tot.nbytes,
                 written, reads=tot.reads, store_gets=tot.gets, work=work.freeze(),
                 outputs={"result": result})


UNIQUE_LIMIT = 1 << 22
"""At most this many distinct values in a task of ``np.unique`` (fewer when
the budget is smaller): beyond, the run stops with a clear error."""


def lower_unique(node, spec, deps: list, budget: Budget) -> Stage:
    """``np.unique`` of all elements: each block's distinct values (with
    counts and first indices), merged up a tree of fan-in
    ``reduction.split-every``; every task refuses (at run time) to hold more
    than a limit of distinct values that its memory allows."""
    item = np.dtype(node.x.dtype).itemsize
    per_value = item + 16  # the value, its count, its first index
    fan = int(_config.get("reduction.split-every"))
    # a merge holds its children, their concatenation, its sorted copy, the order and flags
    merge_per_value = 3 * per_value + 16
    # as many as fit a task once the allocator's overhead is counted (as the
    # peak below): without it, a budget-bound limit planned over the budget
    # and refused every unique under ~220 MiB workers (helper-45)
    overhead = float(_config.get("memory.allocator-overhead"))
    limit = int(max(min(UNIQUE_LIMIT, budget.task_memory // ((fan + 1) * merge_per_value
                                                             * overhead)), 1))
    # NumPy's unique of a block, measured (tracemalloc, 700k elements all
    # distinct): 57 bytes an element for float64, the sort's permutation and
    # copies and the distinct values with their first indices and counts
    temps = op_temporaries(spec) * max(item, 8) + 33 + 3 * item
    costs, peak = fit_blocks(spec, node.x.shape, None, temps, budget)
    check_fits("unique", peak, short(node), budget)
    m, n = node.x.shape
    token = tokenize("unique", spec, costs.row_edges, costs.col_edges, deps, node.equal_nan)
    work, keys, tot = Tasks(), [], layout.ReadTotals()
    for i, rows in enumerate(intervals(costs.row_edges)):
        for j, cols in enumerate(intervals(costs.col_edges)):
            tot.add(costs.at(i, j))
            keys.append(work.add(("unique-" + token, i, j), gnp.unique_block, spec, rows, cols,
                                 deps, n, node.equal_nan, limit))
    root = tree(keys, fan, lambda level, k: ("unique-merge-" + token, level, k),
                lambda children: (gnp.unique_merge, node.equal_nan, limit, *children), work)
    peak = max(peak, as_rss((fan + 1) * merge_per_value * limit))
    return Stage("reduce", f"{short(node)}: the distinct values of {len(keys)} blocks, merged "
                 f"with fan-in {fan} (at most {limit} a task)", len(work), peak, tot.nbytes,
                 reads=tot.reads, store_gets=tot.gets, work=work.freeze(),
                 outputs={"0": Output("value", (root,))})


POINT_TASK_BYTES = 1 << 20
"""What a task costs, as bytes read, when points choose their blocks: the
I/O units holding them (least read), or fewer larger blocks."""


def lower_points(node, spec, deps: list, budget: Budget) -> Stage:
    """NumPy's pointwise ``x[rows, cols]`` (:class:`~..expr.nodes.Points`): a
    task per block holding points (each read once, its points picked), then
    one task putting them in order. The blocks are the I/O units (a few
    scattered points read only their units), or the planner's larger
    blocks where those cost less, counting :data:`POINT_TASK_BYTES` a task
    (points in every unit of a matrix in 1-row chunks)."""
    m, n = node.x.shape
    item = np.dtype(node.dtype).itemsize
    temps = (op_temporaries(spec) + 1) * max(item, 8)
    task = BlockTask(temps, 0, read_flight(spec))
    rows, cols = np.divmod(node.index, n)
    fitted, _ = fit_blocks(spec, (m, n), None, temps, budget)
    units = layout.BlockCosts(spec, unit_edges(spec, 0, m), unit_edges(spec, 1, n))

    def groups(costs):  # (i, j, positions in the result) of each block holding points
        bi = np.searchsorted(costs.row_edges, rows, side="right") - 1
        bj = np.searchsorted(costs.col_edges, cols, side="right") - 1
        ids = bi * len(costs.col_edges) + bj
        order = np.argsort(ids, kind="stable")
        first, starts = np.unique(ids[order], return_index=True)
        ends = list(starts[1:]) + [len(order)]
        return [(int(b) // len(costs.col_edges), int(b) % len(costs.col_edges), order[s:e])
                for b, s, e in zip(first, starts, ends, strict=True)]

    def cost(costs, blocks):
        return sum(costs.at(i, j)[0] for i, j, _ in blocks) + len(blocks) * POINT_TASK_BYTES

    costs, blocks = min(((c, groups(c)) for c in (units, fitted)), key=lambda cb: cost(*cb))
    re, ce = costs.row_edges, costs.col_edges
    peak = max(block_peak(task, costs.at(i, j)[0], (re[i + 1] - re[i]) * (ce[j + 1] - ce[j]))
               for i, j, _ in blocks)
    count = len(node.index)
    peak = max(peak, as_rss(2 * count * (item + 8)))  # the join: the parts, the result
    check_fits("points", peak, short(node), budget)
    token = tokenize("points", spec, node.token, re, ce, deps)
    work, keys, tot = Tasks(), [], layout.ReadTotals()
    for i, j, at in blocks:
        tot.add(costs.at(i, j))
        keys.append(work.add(("points-" + token, i, j), gnp.points_block, spec,
                             (re[i], re[i + 1]), (ce[j], ce[j + 1]), deps, rows[at] - re[i],
                             cols[at] - ce[j], at))
    key = work.add("points-join-" + token, gnp.join_points, count, np.dtype(node.dtype), *keys)
    return Stage("reduce", f"{short(node)}: the {count} points of {len(keys)} blocks, each "
                 "read once, put in order", len(work), peak, tot.nbytes, reads=tot.reads,
                 store_gets=tot.gets, work=work.freeze(), outputs={"0": Output("value", (key,))})


def lower_select(node, x_spec, mask_spec, deps: list, budget: Budget) -> Stage:
    """``x[mask]`` of a 2-D mask: blocks as large as fit (the stored arrays
    both read, read once), each giving its selected elements and their flat
    indices; one task puts them in C order (refused when they do not fit)."""
    joint = Op("fused", (x_spec, mask_spec))  # for costs only
    item = np.dtype(node.dtype).itemsize
    temps = (op_temporaries(joint) + 2) * max(item, 8) + 3 * 8  # + the positions
    costs, peak = fit_blocks(joint, node.x.shape, None, temps, budget)
    check_fits("select", peak, short(node), budget)
    count = int(node.shape[0])
    join_peak = as_rss(count * (3 * item + 24))  # parts, joined, order, the ordered values
    check_fits("select", join_peak, f"{short(node)}: joining the {count} selected elements in C "
               "order in one task", budget)
    token = tokenize("select", joint, costs.row_edges, costs.col_edges, deps, count,
                     node.positions)
    work, keys, tot = Tasks(), [], layout.ReadTotals()
    for i, rows in enumerate(intervals(costs.row_edges)):
        for j, cols in enumerate(intervals(costs.col_edges)):
            tot.add(costs.at(i, j))
            keys.append(work.add(("select-" + token, i, j), gnp.select_block, x_spec, mask_spec,
                                 rows, cols, deps, node.x.shape[1], node.positions))
    key = work.add("select-join-" + token, gnp.join_selected, count, *keys)
    return Stage("reduce", f"{short(node)}: the selected elements of {len(keys)} blocks, "
                 "joined in C order", len(work), max(peak, join_peak), tot.nbytes,
                 reads=tot.reads, store_gets=tot.gets, work=work.freeze(),
                 outputs={"0": Output("value", (key,))})


def lower_values(node, spec, deps: list, budget: Budget) -> Stage:
    """A histogram of the elements in an interval, or those elements
    (:class:`~..expr.nodes.Values`): blocks as large as fit (each read once),
    then one task summing the histograms or joining the elements."""
    temps = (op_temporaries(spec) + 3) * 8  # the float64 values, the mask, the selection
    costs, _ = fit_blocks(spec, node.x.shape, None, temps, budget)
    blocks = [(r, c) for r in intervals(costs.row_edges) for c in intervals(costs.col_edges)]
    kwargs = (("lo", node.lo), ("hi", node.hi), ("closed", node.closed))
    counts = bool(node.edges)
    if counts:
        kwargs += (("edges", node.edges),)
    what = (f"{short(node)}: {len(blocks)} blocks, each read once "
            f"({'their histograms summed' if counts else 'the elements in the interval joined'})")
    return _line_stage(node, "values", spec, deps, blocks,
                       "interval_counts" if counts else "interval_values", kwargs, 0, temps,
                       budget, what, join=gnp.join_counts if counts else None)


def lower_scan(node, spec, deps: list, budget: Budget, out=None, out_grid=None,
               skip=frozenset()) -> tuple[list[Stage], list]:
    """A scan (``cumsum``, ``cummax``...) along ``node.axis`` in two passes: returns the
    stages (totals + carries, then the scanned blocks) and the carry keys
    the second stage reads (operands whose stats the run gathers)."""
    dtype, ax, op = np.dtype(node.dtype), node.axis, node.op
    temps = (op_temporaries(spec) + 1) * max(dtype.itemsize, 8)
    costs, peak = fit_blocks(spec, node.shape, out_grid, temps, budget, dtype.itemsize)
    check_fits("scan", peak, short(node), budget)
    row_edges, col_edges = costs.row_edges, costs.col_edges
    token = tokenize("scan", spec, row_edges, col_edges, str(out), str(dtype), deps, op, ax)
    bands = intervals(row_edges if ax == 0 else col_edges)
    across = intervals(col_edges if ax == 0 else row_edges)
    pass1, carry_keys = Tasks(), []
    tot1 = layout.ReadTotals()
    for j, other in enumerate(across):
        totals = []
        for i, band in enumerate(bands[:-1]):
            rows, cols = (band, other) if ax == 0 else (other, band)
            tot1.add(costs.at(i, j) if ax == 0 else costs.at(j, i))
            totals.append(pass1.add(("scan-total-" + token, i, j), gnp.block_total, spec,
                                    rows, cols, deps, op, ax, dtype))
        if totals:
            carry_keys.append(pass1.add(("scan-carry-" + token, j), gnp.scan_carries, op,
                                        *totals))
    stages = []
    if len(pass1):
        stages.append(Stage("reduce", f"{short(node)}: totals of {len(bands) - 1} bands "
                            "(first pass)", len(pass1), peak, tot1.nbytes, reads=tot1.reads,
                            store_gets=tot1.gets, work=pass1.freeze()))
    pass2, blocks = Tasks(), []
    tot, written = layout.ReadTotals(), 0
    for j, other in enumerate(across):
        dj = list(deps) + ([carry_keys[j]] if carry_keys else [])
        for i, band in enumerate(bands):
            rows, cols = (band, other) if ax == 0 else (other, band)
            if out_grid is not None and all_done(out_grid, rows, cols, skip):
                continue
            tot.add(costs.at(i, j) if ax == 0 else costs.at(j, i))
            pass2.add(("scan-" + token, i, j), gnp.scan_block, spec, rows, cols, dtype, out,
                      dj, op, ax, len(deps) if carry_keys else -1, i)
            if out is not None:
                written += (rows[1] - rows[0]) * (cols[1] - cols[0]) * dtype.itemsize
            blocks.append((rows, cols))
    keys = tuple(t.key for t in pass2.freeze())
    result = Output("store", keys) if out is not None else Output("blocks", keys, tuple(blocks))
    stages.append(Stage("map", f"{short(node)} in blocks of up to {max_interval(row_edges)}x"
                        f"{max_interval(col_edges)}, each with its carry", len(pass2), peak,
                        tot.nbytes, written, reads=tot.reads, store_gets=tot.gets,
                        work=pass2.freeze(), outputs={"result": result}))
    return stages, carry_keys


__all__ = ["DoesNotFit", "lower_diagonal", "lower_points", "lower_quantile", "lower_scan",
           "lower_select", "lower_sort", "lower_unique"]
