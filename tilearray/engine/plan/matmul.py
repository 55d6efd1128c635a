"""Lowering a matrix product: the block layout that reads least within the
budget (output blocks accumulating K panels, prefetched or read in place in
bands, a split and tree-summed contraction when blocks are too few) and its
:mod:`tilearray.graphs.matmul` tasks. Pure: node, specs and budget in, a
:class:`~.types.Stage` out.

The steps, one function each: the operands' panels and the memory terms of a
task (:func:`operands`), the candidate layouts that fit (:func:`candidates`),
the choice among them and the K split (:func:`choose`), the tasks
(:func:`tasks`), and the I/O lower bound and the stage text."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
from dask.base import tokenize
from dask.utils import format_bytes

from ... import _config
from ...graphs import matmul as gmm
from ...graphs.blocks import compact, group_edges, intervals, max_interval, split_points, tree
from ...graphs.emit import Tasks
from ...graphs.spec import Read, Trans, held_bytes, leaves, unit_edges
from ...storage.stream import slab_plan
from . import layout
from .map import check_fits
from .memory import (
    MatmulTask,
    band_bytes,
    combine_peak,
    leaf_itemsize,
    matmul_peak,
    op_temporaries,
)
from .sizing import all_done, missing_parts, panels, short
from .types import Budget, Output, Stage

MODES = ("prefetch", "stream", "in-place", "slabs")
"""Read modes, in order of preference among layouts that read as little."""


@dataclass(frozen=True)
class Operands:
    """What the layout search needs to know of ``A @ B``: shapes, K panels,
    per-task memory terms and whether it is a symmetric product."""

    a_spec: object
    b_spec: object
    m: int
    k: int
    n: int
    a_units: tuple
    b_units: tuple
    a_k: tuple
    """A's K panel edges."""
    b_k: tuple
    b_cols: tuple
    """B's column unit edges (the bands of streaming)."""
    gram: bool
    """``X.T @ X`` / ``X @ X.T`` with the same K panels."""
    stream: bool
    """A and B share their K panels: B may be streamed band by band."""
    slabs: bool
    """``X.T @ X`` whose chunks decode in row slabs."""
    slab_rows: int
    task: MatmulTask
    ca: int
    """Bytes per A panel element (cast to the result dtype)."""
    cb: int
    ta: int
    """Temporaries per A panel element of its fused ops."""
    tb: int


def operands(a_spec, b_spec, shape_a, n: int, dtype: np.dtype, budget: Budget,
             out_grid) -> Operands:
    """Panels and memory terms of ``a_spec @ b_spec`` (A ``shape_a``, B ``k x n``)."""
    m, k = shape_a
    a_units, b_units = unit_edges(a_spec, 1, k), unit_edges(b_spec, 0, k)
    a_k, b_k = panels(a_units), panels(b_units)
    ka, kb = max_interval(a_k), max_interval(b_k)
    ca = max(leaf_itemsize(a_spec), dtype.itemsize)
    cb = max(leaf_itemsize(b_spec), dtype.itemsize)
    tb = op_temporaries(b_spec)
    band = band_bytes(a_spec, b_spec, max(ka, kb), budget.task_memory)
    gram = (a_spec == Trans(b_spec) or b_spec == Trans(a_spec)) and a_k == b_k
    out_unit = (out_grid.unit[0] * out_grid.unit[1] if out_grid is not None else 0) \
        * dtype.itemsize
    stream = a_k == b_k and k > 0
    b_cols = unit_edges(b_spec, 1, n)
    b_band = b_band_request = 0
    if stream:  # one B band -- a K panel by one of B's column I/O units -- resident
        c = layout.BlockCosts(b_spec, b_k, b_cols)
        wb = max_interval(b_cols)
        b_band = max(c.max_read_bytes(exact=False), kb * wb * cb) + kb * wb * cb * tb
        b_band_request = c.min_request_bytes()
    slabs = gram and k > 0 and m > 0 and a_spec == Trans(b_spec) \
        and isinstance(b_spec, Read) and b_spec.grid.row_slabs
    slab_rows = slab_mem = 0
    if slabs:  # X streamed slab by slab (slab buffer + zstd decoders, never a whole chunk)
        slab_rows, slab_mem = slab_plan(b_spec.grid.tile, b_spec.dtype.itemsize, (0, n),
                                        budget.task_memory, b_spec.grid.row_slabs)
    task = MatmulTask(dtype.itemsize, out_unit, band, b_band, b_band_request, slab_mem)
    return Operands(a_spec, b_spec, m, k, n, a_units, b_units, a_k, b_k, b_cols, gram, stream,
                    bool(slabs), slab_rows, task, ca, cb, op_temporaries(a_spec), tb)


class _Peaks:
    """:func:`~.memory.matmul_peak` of candidate layouts, panel sizes cached per edge list."""

    def __init__(self, op: Operands):
        self.op, self._a, self._b = op, {}, {}
        self.held = held_bytes(op.a_spec) + held_bytes(op.b_spec)  # NumPy matrix operands

    def panels(self, rows_edges, cols_edges) -> tuple[int, int, int]:
        """Largest A panel (rows block x K panel) and B panel (K panel x cols
        block): the whole units read, or the region cast to dtype, plus fused
        temporaries; and the least read request of either."""
        op = self.op
        if rows_edges not in self._a:
            c = layout.BlockCosts(op.a_spec, rows_edges, op.a_k)
            self._a[rows_edges] = c.max_read_bytes(exact=False), c.min_request_bytes()
        if cols_edges not in self._b:
            c = layout.BlockCosts(op.b_spec, op.b_k, cols_edges)
            self._b[cols_edges] = c.max_read_bytes(exact=False), c.min_request_bytes()
        (ra, qa), (rb, qb) = self._a[rows_edges], self._b[cols_edges]
        bm, bn = max_interval(rows_edges), max_interval(cols_edges)
        ka, kb = max_interval(op.a_k), max_interval(op.b_k)
        pa = max(ra, bm * ka * op.ca) + bm * ka * op.ca * op.ta
        pb = max(rb, kb * bn * op.cb) + kb * bn * op.cb * op.tb
        if op.gram and bm == op.m and bn == op.n:
            pa = 0  # X.T @ X in one block: each panel serves as both operands
        return pa, pb, max(qa, qb)

    def __call__(self, rows_edges, cols_edges, mode: str) -> int:
        if mode == "slabs":
            return matmul_peak(self.op.task, rows_edges, cols_edges, mode, None) + self.held
        return matmul_peak(self.op.task, rows_edges, cols_edges, mode,
                           self.panels(rows_edges, cols_edges)) + self.held


def candidates(op: Operands, peak: _Peaks, budget: int, hard, symmetric_out: bool):
    """Every distinct layout that fits, for each read mode: ``[(row_edges,
    col_edges, peak, mode)]``, and the smallest one that does not (or None).

    Square blocks and 1:2 / 2:1 grow from each base until they no longer fit,
    and for every block height the widest block that fits joins them; a
    symmetric product written to storage keeps square blocks only (block
    pairs are computed once)."""
    layouts, smallest = [], None
    modes = ("prefetch", "in-place") + (("stream",) if op.stream else ())
    ratios = ((1, 1),) if symmetric_out else ((1, 1), (1, 2), (2, 1))

    def consider(re, ce, mode):
        nonlocal smallest
        mem = peak(re, ce, mode)
        if mem <= budget:
            layouts.append((re, ce, mem, mode))
        elif smallest is None or mem < smallest[2]:
            smallest = (re, ce, mem, mode)
        return mem

    for rows_c in layout.bases(op.a_spec, 0, op.m, hard[0]):
        for cols_c in layout.bases(op.b_spec, 1, op.n, hard[1]):
            step = max(min(max_interval(rows_c), max_interval(cols_c)), 1)
            for mode, (fr, fc) in itertools.product(modes, ratios):
                t, last = step, None
                while True:
                    re, ce = group_edges(rows_c, t * fr), group_edges(cols_c, t * fc)
                    if (re, ce) != last:
                        mem = consider(re, ce, mode)
                        last = (re, ce)
                    if mem > budget or t >= max(op.m, op.n):
                        break
                    t += step
            if not symmetric_out:
                for mode in modes:
                    layouts += [(re, ce, mem, mode) for re, ce, mem in layout.widest_blocks(
                        rows_c, cols_c, op.m, op.n,
                        lambda re, ce, mode=mode: peak(re, ce, mode), budget)]
    if op.slabs:  # one block, whole: every task is a diagonal (syrk) block
        consider((0, op.m), (0, op.n), "slabs")
    return layouts, smallest


def _n_blocks(lay) -> int:
    return (len(lay[0]) - 1) * (len(lay[1]) - 1)


def _n_tasks(lay, symmetric: bool) -> int:
    """Tasks of a layout (unsplit): one per block, one per block pair of a
    symmetric product written to storage."""
    if symmetric and lay[0] == lay[1]:
        r = len(lay[0]) - 1
        return r * (r + 1) // 2
    return _n_blocks(lay)


def _reads(op: Operands, lay) -> int:
    """Elements read: A once per block column, B once per block row."""
    return op.m * op.k * (len(lay[1]) - 1) + op.k * op.n * (len(lay[0]) - 1)


def _rank(op: Operands, lay) -> tuple:
    """Reads, then fewer blocks, then by :data:`MODES`."""
    return _reads(op, lay), _n_blocks(lay), MODES.index(lay[3])


@dataclass(frozen=True)
class Tradeoff:
    """What the task-count objective did: the chosen layout's tasks and reads
    against the fewest-read layout's (equal when it kept that one)."""

    tasks: int
    reads: int
    fewest_tasks: int
    fewest_reads: int
    target: int
    """Tasks aimed for: ``tilearray.planner.tasks-per-thread`` x threads."""
    margin: float

    def text(self) -> str:
        margin = f"{self.margin:.0%} (tilearray.planner.read-margin)"
        if self.reads > self.fewest_reads:
            less = (self.reads - self.fewest_reads) / self.reads
            return (f"{self.tasks} tasks (aiming for {self.target}); the fewest-read layout "
                    f"would read {less:.1%} less in {self.fewest_tasks} tasks, within {margin}")
        if self.tasks < self.target and self.margin > 0:
            return (f"{self.tasks} task(s), fewer than the {self.target} aimed for: every "
                    f"layout with more tasks reads over {margin} more")
        return ""


def by_tasks(op: Operands, layouts: list, threads: int, symmetric: bool = False):
    """Among the layouts reading within ``tilearray.planner.read-margin`` of
    the least, the one with at least ``tasks-per-thread`` x ``threads`` tasks
    (else the most tasks) that reads least; margin 0: the fewest-read layout.
    Ties: fewer tasks, then by :data:`MODES`. Returns ``(layout, Tradeoff)``."""
    def rank(lay):
        return _rank(op, lay)

    fewest = min(layouts, key=rank)
    margin = float(_config.get("planner.read-margin"))
    target = int(_config.get("planner.tasks-per-thread")) * threads
    best = fewest
    if margin > 0:
        limit = _reads(op, fewest) * (1 + margin)
        pool = [lay for lay in layouts if _reads(op, lay) <= limit]
        best = min(pool, key=lambda lay: (-min(_n_tasks(lay, symmetric), target), *rank(lay)))
    return best, Tradeoff(_n_tasks(best, symmetric), _reads(op, best),
                          _n_tasks(fewest, symmetric), _reads(op, fewest), target, margin)


def choose(op: Operands, layouts: list, budget: Budget, dtype: np.dtype,
           symmetric: bool = False):
    """The layout (:func:`by_tasks`: the fewest-read one, or more tasks within
    the read margin) and the K split: when it has fewer blocks than the
    cluster has threads, K is split and partial blocks tree-summed if the sums
    fit, else smaller blocks are taken. Returns ``(layout, k_split, Tradeoff
    or None)``: None when the split or the fallback made the tasks."""
    threads = budget.total_threads
    best, trade = by_tasks(op, layouts, threads, symmetric)
    k_split = (0, op.k)
    if 0 < _n_blocks(best) < threads and op.k > 0:
        acc = max_interval(best[0]) * max_interval(best[1]) * dtype.itemsize
        parts = math.ceil(threads / _n_blocks(best))
        combine = combine_peak(acc, min(int(_config.get("reduction.split-every")), parts))
        if combine <= budget.task_memory:
            k_split = split_points(op.a_units, op.b_units, parts)
            best = (*best[:2], max(best[2], combine), best[3])
            if len(k_split) > 2 and trade.reads == trade.fewest_reads:
                trade = None  # the split makes the tasks, at no extra reads
        else:
            enough = [lay for lay in layouts if _n_blocks(lay) >= threads]
            if enough:
                best = min(enough, key=lambda lay: _rank(op, lay))
                trade = None
    return best, k_split, trade


def _segments(op: Operands, k_split):
    """Per K segment: its A and B panels (compact) and their index ranges;
    panels never straddle a split point. Also the refined panel edges."""
    a_k, b_k = op.a_k, op.b_k
    if len(k_split) > 2:
        a_k = tuple(sorted(set(a_k) | set(k_split)))
        b_k = tuple(sorted(set(b_k) | set(k_split)))
    a_iv, b_iv = intervals(a_k), intervals(b_k)
    segments = []
    for k0, k1 in (intervals(k_split) if op.k > 0 else [(0, 0)]):
        qa = [q for q, p in enumerate(a_iv) if k0 <= p[0] < k1]
        qb = [q for q, p in enumerate(b_iv) if k0 <= p[0] < k1]
        segments.append((compact(a_iv[q] for q in qa), compact(b_iv[q] for q in qb),
                         (qa[0], qa[-1] + 1) if qa else (0, 0),
                         (qb[0], qb[-1] + 1) if qb else (0, 0)))
    return segments, a_k, b_k


def tasks(op: Operands, chosen, k_split, dtype, deps, out=None, out_grid=None, skip=frozenset()):
    """The stage's tasks: per output block, one task per K segment (tree-summed
    when split), storing or returning the block. Returns ``(Tasks, Output,
    ReadTotals, bytes written)``."""
    row_edges, col_edges, _, mode = chosen
    read_bytes = None if mode == "prefetch" else op.task.band
    slab = op.slab_rows if mode == "slabs" else None
    segments, a_k, b_k = _segments(op, k_split)
    whole = _segments(op, (0, op.k))[0][0], op.a_k, op.b_k  # K unsplit
    name = "matmul-" + tokenize("matmul", op.a_spec, op.b_spec, row_edges, col_edges, k_split,
                                str(out), deps)
    a_costs = layout.BlockCosts(op.a_spec, row_edges, a_k)
    # streaming reads B in bands split at its column units and the block edges
    b_edges = tuple(sorted(set(col_edges) | set(op.b_cols))) if mode == "stream" else col_edges
    b_at = {e: q for q, e in enumerate(b_edges)}
    b_costs = layout.BlockCosts(op.b_spec, b_k, b_edges)
    split_every = int(_config.get("reduction.split-every"))
    split = len(k_split) > 2
    # X.T @ X, X @ X.T into storage: the result is symmetric, so each pair of
    # blocks (i, j), (j, i) is computed once and written twice
    sym = op.gram and out is not None and not split and row_edges == col_edges
    work, keys, blocks, tot, written = Tasks(), [], [], layout.ReadTotals(), 0
    for i, rows in enumerate(intervals(row_edges)):
        for j, cols in enumerate(intervals(col_edges)):
            if sym and i > j:
                continue
            if out_grid is not None and all_done(out_grid, rows, cols, skip) and (
                    not sym or all_done(out_grid, cols, rows, skip)):
                continue
            todo = None if out_grid is None or sym or mode == "slabs" else \
                missing_parts(out_grid, rows, cols, skip)
            if todo is not None:  # resumed: only the parts whose units are not done
                for q, (prows, pcols) in enumerate(todo):  # each unsplit along K
                    keys.append(_part(work, tot, op, (name, i, j, q), prows, pcols, *whole,
                                      mode, dtype, out, deps, read_bytes))
                    written += (prows[1] - prows[0]) * (pcols[1] - pcols[0]) * dtype.itemsize
                continue
            j0, j1 = b_at[cols[0]], b_at[cols[1]]
            b_bands = compact(intervals(b_edges[j0 : j1 + 1])) if mode == "stream" else None
            parts = []
            for s, (pa, pb, qa, qb) in enumerate(segments):
                if not gmm.is_gram(op.a_spec, op.b_spec, rows, cols, pa, pb):
                    tot.add(a_costs.band(0, i, *qa))
                for jj in range(j0, j1):
                    tot.add(b_costs.band(1, jj, *qb))
                args = (op.a_spec, op.b_spec, rows, cols, pa, pb, dtype)
                if not split and out is not None:
                    store = gmm.matmul_store_pair if sym and i < j else gmm.matmul_store
                    parts.append(work.add((name, i, j), store, *args, out, deps, read_bytes,
                                          b_bands, slab))
                else:
                    parts.append(work.add((name + "-part", i, j, s), gmm.matmul_block, *args,
                                          deps, read_bytes, b_bands, slab))
            if len(parts) > 1 or (out is None and split):
                parts = [tree(parts, split_every,
                              lambda level, q, i=i, j=j: (name + "-sum", i, j, level, q),
                              lambda children: (gmm.sum_partials, *children), work)]
            key = parts[0]
            if out is not None and split:
                key = work.add((name, i, j), gmm.store_partials, out, rows, cols, key)
            if out is not None:
                written += (rows[1] - rows[0]) * (cols[1] - cols[0]) * dtype.itemsize \
                    * (2 if sym and i < j else 1)
            keys.append(key)
            blocks.append((rows, cols))
    result = Output("store", tuple(keys)) if out is not None else \
        Output("blocks", tuple(keys), tuple(blocks))
    return work, result, tot, written


def _part(work, tot, op: Operands, key, rows, cols, segment, a_k, b_k, mode, dtype, out, deps,
          read_bytes):
    """The task storing part ``rows x cols`` of a block (a resumed output's
    units not done; :func:`~.sizing.missing_parts`): the block's task on a
    smaller block, which its peak covers; its reads added to ``tot``."""
    pa, pb, qa, qb = segment
    b_edges = (tuple(sorted({*cols, *(c for c in op.b_cols if cols[0] < c < cols[1])}))
               if mode == "stream" else cols)
    if not gmm.is_gram(op.a_spec, op.b_spec, rows, cols, pa, pb):
        tot.add(layout.BlockCosts(op.a_spec, rows, a_k).band(0, 0, *qa))
    b_costs = layout.BlockCosts(op.b_spec, b_k, b_edges)
    for jj in range(len(b_edges) - 1):
        tot.add(b_costs.band(1, jj, *qb))
    b_bands = compact(intervals(b_edges)) if mode == "stream" else None
    return work.add(key, gmm.matmul_store, op.a_spec, op.b_spec, rows, cols, pa, pb, dtype, out,
                    deps, read_bytes, b_bands, None)


def io_lower_bound(op: Operands, node, budget: Budget) -> int:
    """max(2mnk / sqrt(M / itemsize), every input read once), in bytes (0 without FLOPs)."""
    flops = 2 * op.m * op.n * op.k
    if not flops:
        return 0
    itemsize = max(np.dtype(node.a.dtype).itemsize, np.dtype(node.b.dtype).itemsize)
    lb = int(flops / math.sqrt(max(budget.task_memory, 1) / itemsize) * itemsize)
    once = {tokenize(leaf): leaf.grid.shape[0] * leaf.grid.shape[1] * leaf.dtype.itemsize
            for leaf in leaves(op.a_spec) + leaves(op.b_spec)}
    return max(lb, sum(once.values()))


def describe(op: Operands, node, chosen, k_split, trade: Tradeoff | None = None) -> str:
    row_edges, col_edges, _, mode = chosen
    sym = ", symmetric: each block pair computed once, diagonal blocks by syrk" \
        if op.gram else ""
    ksplit = f", K split in {len(k_split) - 1}" if len(k_split) > 2 else ""
    how = {"prefetch": "next panel prefetched",
           "stream": f"A panels read in place, B streamed in bands of {max_interval(op.b_cols)}"
                     " columns",
           "in-place": "panels read in place",
           "slabs": f"X decoded in row slabs of {op.slab_rows} rows, never a whole chunk "
                    f"({format_bytes(op.task.slab_mem)} of slab and decoder buffers)"}[mode]
    if mode not in ("prefetch", "slabs"):
        how += f" (requests <= {format_bytes(op.task.band)})"
    return (f"{short(node)}: output blocks up to {max_interval(row_edges)}x"
            f"{max_interval(col_edges)}, K panels A {max_interval(op.a_k)} / B "
            f"{max_interval(op.b_k)}{ksplit}{sym}, {how}"
            + (f"; {trade.text()}" if trade is not None and trade.text() else ""))


def lower_matmul(node, a_spec, b_spec, deps: list, budget: Budget, out=None, out_grid=None,
                 skip=frozenset()) -> Stage:
    """The matmul stage of ``node`` (``a_spec @ b_spec``, reading the small
    results ``deps``): blocks stored into ``out`` (units in ``skip`` already
    done) or returned."""
    dtype = np.dtype(node.dtype)
    op = operands(a_spec, b_spec, node.a.shape, node.b.shape[1], dtype, budget, out_grid)
    hard = (None, None) if out_grid is None else (out_grid.unit_edges(0), out_grid.unit_edges(1))
    layouts, smallest = candidates(op, _Peaks(op), budget.task_memory, hard,
                                   op.gram and out is not None)
    if not layouts:
        check_fits("matmul", smallest[2], short(node), budget)
    chosen, k_split, trade = choose(op, layouts, budget, dtype, op.gram and out is not None)
    work, result, tot, written = tasks(op, chosen, k_split, dtype, deps, out, out_grid, skip)
    return Stage("matmul", describe(op, node, chosen, k_split, trade), len(work), chosen[2],
                 tot.nbytes, written, 2 * op.m * op.n * op.k,
                 io_lower_bound=io_lower_bound(op, node, budget) or None, reads=tot.reads,
                 store_gets=tot.gets, work=work.freeze(), outputs={"result": result})
