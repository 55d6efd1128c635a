"""Lowering a TSQR (QR, thin SVD and least squares of a tall-skinny matrix):
row blocks as large as a task holds, R factors combined up a tree whose
fan-in is ``tilearray.reduction.split-every`` or the largest below it whose
combines fit the budget, and for Q or U a second pass
down the tree writing row blocks (:mod:`tilearray.graphs.tsqr` tasks). Pure:
node, specs and budget in, :class:`~.types.Stage` records out."""

from __future__ import annotations

import numpy as np
from dask.base import tokenize
from dask.utils import format_bytes

from ... import _config
from ...errors import PlanningError
from ...graphs import tsqr as gts
from ...graphs.blocks import group_edges, intervals, max_interval
from ...graphs.emit import Tasks
from ...graphs.spec import unit_edges
from . import layout
from .map import check_fits
from .memory import (
    as_rss,
    read_flight,
    tsqr_combine_peak,
    tsqr_leaf_peak,
    tsqr_root_peak,
    write_flight,
)
from .sizing import ahead, all_done, short
from .types import Budget, Output, Stage


def _costs(specs, widths, row_edges):
    return [layout.BlockCosts(s, row_edges, (0, w)) for s, w in zip(specs, widths, strict=True)]


def _leaf_peak(specs, widths, row_edges, itemsize, out_cols, out_grid,
               whole: bool | None = None) -> int:
    """A leaf's peak. Its block is read a column strip of I/O units at a
    time (:func:`~tilearray.graphs.tsqr.strips`), but in a Q or U job
    (``whole``, default: ``out_cols`` given) a float64 block may be read whole
    and used as read (the Gram and ``R_i^-1`` paths)."""
    whole = out_cols > 0 if whole is None else whole
    if whole:
        read = sum(c.max_read_bytes() for c in _costs(specs, widths, row_edges))
    else:
        read = max(layout.BlockCosts(s, row_edges, unit_edges(s, 1, w)).max_read_bytes()
                   for s, w in zip(specs, widths, strict=True))
    flight = max(read_flight(s) for s in specs)
    return tsqr_leaf_peak(read, max_interval(row_edges), sum(widths), itemsize, out_cols,
                          write_flight(out_grid, itemsize), flight)


def row_blocks(specs, widths, m: int, itemsize: int, budget: Budget, out_cols=0, out_grid=None):
    """Row edges of the leaves: on the I/O unit edges of every input (and of
    the output), as tall as a task holds up to ``map.block-bytes`` of block,
    and at least one leaf per thread of the cluster when the rows allow;
    where no such block fits (inputs whose units do not line up: ``lstsq(X[:-1],
    Y[1:])`` shares no row edge but 0 and m), on the union of their edges, a
    unit read by the two leaves it straddles. Returns ``(row_edges, peak)``."""
    from ...graphs.spec import Op

    hard = None if out_grid is None else out_grid.unit_edges(0)
    first = None
    for base in layout.bases(Op("tsqr", tuple(specs)), 0, m, hard):
        got = _tallest_fitting(base, specs, widths, m, itemsize, budget, out_cols, out_grid)
        if got[1] <= budget.task_memory:
            return got
        first = first or got
    return first  # the coarsest base's: refused naming its need


def _tallest_fitting(base, specs, widths, m, itemsize, budget, out_cols, out_grid):
    """:func:`row_blocks` on one base of row edges: leaves of ``k`` base
    steps, ``k`` the largest that fits the budget, at most the block cap and
    a leaf per thread, found by bisection (a leaf's peak grows with its
    height; stepping one unit at a time made planning quadratic in the row
    chunks: 75-89 s for 40,000 rows in 1-row chunks)."""
    step = max(max_interval(base), 1)
    cap = max(_config.get_bytes("map.block-bytes") // max(sum(widths) * itemsize, 1), step)
    cap = min(cap, max(-(-m // budget.total_threads), step))  # a leaf per thread

    def leaves(k):
        edges = group_edges(base, k * step)
        return edges, _leaf_peak(specs, widths, edges, itemsize, out_cols, out_grid)

    best = leaves(1)
    if best[1] > budget.task_memory:
        return best
    lo, hi = 1, max(min(cap // step, -(-m // step)), 1)  # lo fits; hi: the most tried
    top = leaves(hi) if hi > lo else best
    if top[1] <= budget.task_memory:
        return top
    while hi - lo > 1:
        mid = (lo + hi) // 2
        got = leaves(mid)
        if got[1] <= budget.task_memory:
            lo, best = mid, got
        else:
            hi = mid
    return best


def _tree(work: Tasks, name: str, leaves: list, fan_in: int, keep_q: bool):
    """Combine tasks up the tree: returns the top key and the levels (each a
    list of ``(key, children)``), top level last."""
    levels, keys = [], leaves
    while len(keys) > 1:
        level = []
        for q in range(0, len(keys), fan_in):
            children = keys[q : q + fan_in]
            key = work.add((name + "-combine", len(levels), q // fan_in), gts.combine, keep_q,
                           *children)
            level.append((key, children))
        levels.append(level)
        keys = [k for k, _ in level]
    return keys[0], levels


def lower_tsqr(node, specs, widths, deps: list, budget: Budget, out=None, out_grid=None,
               skip=frozenset()) -> list[Stage]:
    """The stages of ``node`` (a :class:`~tilearray.engine.expr.nodes.TSQR`
    part) over ``[X | Y]`` given as ``specs`` of ``widths`` columns: the up
    tree (a small result: ``node.part``), and for "Q"/"U" the down tree
    writing row blocks into ``out``."""
    m, n = node.x.shape
    w = sum(widths)
    itemsize = 8  # the kernels compute in float64 whatever X's dtype (graphs.tsqr._block)
    big = node.part in ("Q", "U")
    out_cols = node.shape[1] if big else 0
    row_edges, peak = row_blocks(specs, widths, m, itemsize, budget, out_cols if big else 0,
                                 out_grid if big else None)
    root_part = {"Q": "R", "U": "Vt"}.get(node.part, node.part)  # "down": R, or U's SVD
    fan_in, stacked, combine = _fan_in(intervals(row_edges), w, max(itemsize, 8), root_part,
                                       budget, big)
    # a combine (or the root) holds R factors of ``stacked x w`` whatever the
    # row blocks: named with the memory it needs, as every refusal
    check_fits("TSQR combine", combine, f"{short(node)} (R factors of {stacked} x {w} "
               f"stacked in one task, at fan-in {fan_in}; fewer columns lower it)", budget,
               tiles_help=False)
    check_fits("tsqr", max(peak, combine), short(node), budget)
    name = "tsqr-" + tokenize(node.part, specs, widths, row_edges, deps, node.options,
                              str(out))
    up, costs = Tasks(), _costs(specs, widths, row_edges)
    leaves, tot = [], layout.ReadTotals()
    spans = intervals(row_edges)
    # the down leaves may use their up leaf's R (X_i R_i^-1): those stay in
    # worker memory until then, so only while they are a small share of it;
    # then the up leaves may take R from the Gram matrix (graphs.tsqr.leaf_r)
    keep_r = big and len(spans) * min(m, w) * w * max(itemsize, 8) <= budget.task_memory // 4
    for i, rows in enumerate(spans):
        leaves.append(up.add((name + "-leaf", i), gts.leaf_r, tuple(specs), rows,
                             tuple(widths), deps, ahead(spans, i, budget), keep_r))
        tot.add(*(c.at(i, 0) for c in costs))
    top, levels = _tree(up, name, leaves, fan_in, keep_q=big)
    held, down_peak = _check_pieces_fit(node, spans, fan_in, w, itemsize, budget) if big \
        else (0, 0)
    part, options = node.part, node.options
    if np.dtype(node.dtype) != np.float64:  # float32 X: its R, s, Vt returned in float32
        options = tuple(sorted({**dict(options), "result": np.dtype(node.dtype).str}.items()))
    if big:  # the root hands down D (Q) or D @ U_R (U)
        part, options = "down", tuple(sorted({**dict(options), "right": node.part}.items()))
    root = up.add(name + "-root", gts.root, part, n, m, options, top)
    # s or Vt: the root also gives R, from which the driver takes the other
    factors = big or part in ("s", "Vt")
    value = up.add(name + "-" + part, gts.factor, part, root) if factors and not big else root
    flops = 2 * m * w * min(m, w)  # a wide X (m < w) costs 2 w m^2, not 2 m w^2
    # the up leaves read and factor (R only); with Q or U, ``peak`` is the
    # down leaves' (they also hold and write their rows of the result)
    up_peak = _leaf_peak(specs, widths, row_edges, itemsize, 0, None, whole=True) if big \
        else peak
    first = Stage(
        "tsqr", f"{short(node)}: QR of {len(leaves)} row blocks of up to "
        f"{max_interval(row_edges)} x {w}, R factors combined with fan-in {fan_in}"
        + (f" (their Q pieces, {format_bytes(held)}, held for the pass down)" if big else ""),
        len(up), max(up_peak, combine), tot.nbytes, flops=flops,
        reads=tot.reads, store_gets=tot.gets, work=up.freeze(),
        outputs={**({"R": Output("value", (value,))} if not big else {}),
                 **({"factors": Output("value", (root,))} if factors else {})})
    if not big:
        return [first]
    return [first, _down_stage(node, name, specs, widths, deps, row_edges, levels, root,
                               costs, max(peak, down_peak), out, out_grid, skip, budget,
                               keep_r)]


def _fan_in(spans, w: int, itemsize: int, part: str, budget: Budget,
            big: bool) -> tuple[int, int, int]:
    """``(fan_in, rows, peak)``: the largest fan-in of the R tree, at most
    ``tilearray.reduction.split-every``, whose combine tasks fit the budget
    -- and, writing Q or U (``big``), whose down tasks and held Q pieces do
    (:func:`_pieces`) -- down to 2 (when none does, fan-in 2's figures, the
    least need, or for Q or U the configured one's: more levels hold more
    Q pieces), with its largest combine's stacked rows and peak
    (:func:`_tree_peak`). A wide X's combines stack ``fan_in`` R factors of
    ``w x w``: at 15000 x 1500 the default fan-in was refused at 280 MiB a
    worker where fan-in 2 fits (helper-44)."""
    configured = max(int(_config.get("reduction.split-every")), 2)
    figures = {}
    for fan_in in range(configured, 1, -1):
        figures[fan_in] = rows, peak = _tree_peak(spans, fan_in, w, itemsize, part)
        if peak > budget.task_memory:
            continue
        if big:
            held, down, _ = _pieces(spans, fan_in, w, itemsize)
            if down > budget.task_memory or held > _pieces_room(budget):
                continue
        return fan_in, rows, peak
    last = configured if big else 2  # more levels hold more Q pieces
    return (last, *figures[last])


def _stacked(spans, fan_in: int, w: int) -> list[list[int]]:
    """Rows each combine of the R tree stacks, level by level (a leaf's R is
    ``min(rows, w) x w``; a combine passes on ``min(stacked, w)`` rows)."""
    rows, levels = [min(b - a, w) for a, b in spans], []
    while len(rows) > 1:
        levels.append([sum(rows[q:q + fan_in]) for q in range(0, len(rows), fan_in)])
        rows = [min(r, w) for r in levels[-1]]
    return levels


def _tree_peak(spans, fan_in: int, w: int, itemsize: int, part: str) -> tuple[int, int]:
    """``(rows, peak)`` of the largest combine or root task of the R tree
    over leaves ``spans`` (:func:`_stacked`): a wide X or a few leaves hold
    far less than ``fan_in`` full R's; the root computes ``part`` from the
    last R."""
    levels = _stacked(spans, fan_in, w)
    best = (0, 0)
    for stacked in levels:
        top = max(stacked)
        best = max(best, (top, tsqr_combine_peak(top, w, itemsize)), key=lambda x: x[1])
    last = min(levels[-1][0], w) if levels else min(spans[0][1] - spans[0][0], w) if spans else 0
    return max(best, (last, tsqr_root_peak(last, w, itemsize, part)), key=lambda x: x[1])


def _pieces(spans, fan_in: int, w: int, itemsize: int) -> tuple[int, int, int]:
    """Writing Q or U: ``(bytes of Q pieces held, the largest down task's
    peak, its node's stacked rows)``. Every combine node's Q pieces (its children's R factors' rows by
    ``w``) stay in worker memory from the up tree to the down tree. A down
    task holds its node's value (Q pieces, stacked x w, and its R, w x w),
    its parent's (the root's: the slice handed down and R, w x w each) and
    its children's slices (stacked x k, k <= w): a 3001² Q had planned 247
    MiB tasks and its down task killed 433 MiB workers (444 MiB, helper-37).
    No R in the tree has more than ``k = min(m, w)`` rows, so a piece is at
    most ``stacked x k`` and a slice ``k x k``: a wide X (64 x 5000) had been
    priced as if its R's were ``w x w`` (692 MiB for a 2.4 MiB X, helper-50)."""
    levels = _stacked(spans, fan_in, w)
    item = max(itemsize, 8)
    k = min(spans[-1][1] - spans[0][0], w) if spans else 0
    held = sum(sum(stacked) for stacked in levels) * k * item
    tallest = max((max(stacked) for stacked in levels), default=0)
    down = as_rss((2 * tallest + 3 * w) * k * item) if levels else 0  # one leaf: no down task
    return held, down, tallest


def _pieces_room(budget: Budget) -> int:
    """The Q pieces may take a quarter of the workers' task memory (they are
    not spread evenly)."""
    return budget.n_workers * budget.task_memory // 4


def _check_pieces_fit(node, spans, fan_in: int, w: int, itemsize: int,
                      budget: Budget) -> tuple:
    """Writing Q or U, refuse when the Q pieces held between the passes take
    more than :func:`_pieces_room`, or when a down task does not fit.
    Returns ``(bytes held, the largest down task's peak)`` (:func:`_pieces`)."""
    held, down, tallest = _pieces(spans, fan_in, w, itemsize)
    check_fits("TSQR down", down, f"{short(node)} (a node of the tree handing its slices "
               f"down: Q pieces of {tallest} x {w})", budget)
    room = _pieces_room(budget)
    if held > room:
        raise PlanningError(
            f"{short(node)}: writing {node.part}, the TSQR tree's Q pieces "
            f"({len(spans)} row blocks, {format_bytes(held)}) stay in worker memory between "
            f"its two passes, more than a quarter of the workers' task memory "
            f"({format_bytes(room)}): X has too many columns for its rows here (use a "
            "larger memory_per_worker or more workers; the singular values and R need no "
            "pieces, and svd(x, k=...) is randomized)")
    return held, down


def _down_stage(node, name, specs, widths, deps, row_edges, levels, root, costs, peak, out,
                out_grid, skip, budget, keep_r: bool) -> Stage:
    """Slices down the tree, then each leaf's rows of Q (or U) written
    (``keep_r``: each given its up leaf's R, see :func:`~tilearray.graphs.tsqr.leaf_store`)."""
    down, slices = Tasks(), {}
    for depth, level in reversed(list(enumerate(levels))):
        for g, (key, children) in enumerate(level):
            src, index = slices.get(key, (root, 0))
            d = down.add((name + "-down", depth, g), gts.down, key, src, index)
            for c, child in enumerate(children):
                slices[child] = (d, c)
    stores, leaves_done, blocks = Tasks(), [], []
    m, n = node.x.shape
    ncols = node.shape[1]
    tot, written = layout.ReadTotals(), 0
    spans = intervals(row_edges)
    for i, rows in enumerate(spans):
        if out_grid is not None and all_done(out_grid, rows, (0, ncols), skip):
            continue
        leaf = (name + "-leaf", i)
        src, index = slices.get(leaf, (root, 0))
        leaves_done.append(stores.add((name + "-q", i), gts.leaf_store, tuple(specs), rows,
                                      tuple(widths), deps, out, ncols, src, index,
                                      ahead(spans, i, budget),
                                      leaf if keep_r else None, np.dtype(node.dtype).str))
        blocks.append((rows, (0, ncols)))
        tot.add(*(c.at(i, 0) for c in costs))
        if out is not None:
            written += (rows[1] - rows[0]) * ncols * np.dtype(node.dtype).itemsize
    w = sum(widths)
    work = down.freeze() + stores.freeze()
    return Stage(
        "tsqr-q", f"{node.part} = the tree's Q factors applied back down: each of "
        f"{len(leaves_done)} row blocks read again, "
        + ("times R_i^-1 where R_i is well conditioned (float64), else factored again, "
           if keep_r else "factored again (R_i not kept: too many), ") + "and written "
        f"({max_interval(row_edges)} x {ncols})", len(work), peak, tot.nbytes, written,
        flops=4 * m * w * min(m, w) + 2 * m * w * ncols, reads=tot.reads, store_gets=tot.gets, work=work,
        outputs={"result": Output("store", tuple(leaves_done)) if out is not None else
                 Output("blocks", tuple(leaves_done), tuple(blocks)),
                 "slices": Output("stats", tuple(t.key for t in down.freeze()))})
