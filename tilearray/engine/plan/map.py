"""Lowering an elementwise expression: a map over output blocks, each task
evaluating its block of the fused spec and writing it whole (or returning it).
Pure: node, spec and budget in, a :class:`~.types.Stage` out."""

from __future__ import annotations

import numpy as np
from dask.base import tokenize

from ... import _config
from ...graphs import elemwise as gel
from ...graphs import reduction as gred
from ...graphs.blocks import intervals, max_interval
from ...graphs.emit import Tasks
from . import layout
from .memory import BlockTask, block_peak, op_temporaries, per_element, read_flight, write_flight
from .sizing import DoesNotFit, all_done, missing_parts, short
from .types import Budget, Output, Stage


def block_reads(costs: layout.BlockCosts, held: bool = True):
    """``(bytes read, elements)`` of every block of a layout, as NumPy arrays,
    or, past :data:`layout.EXACT_BLOCKS`, of the largest along each axis.
    ``held``: the bytes its reads hold at once when the block is evaluated
    in one pass (:meth:`~layout.BlockCosts.read_bytes`)."""
    b = costs.read_bytes(held)
    if b is None:  # many blocks: bound by the largest along each axis
        return (costs.max_read_bytes(held=held),
                int(costs.sizes[0].max(initial=0)) * int(costs.sizes[1].max(initial=0)))
    return b, np.multiply.outer(costs.sizes[0], costs.sizes[1])


def fit_blocks(spec, shape, out_grid, temp_per_elem: int, budget: Budget, out_itemsize: int = 0,
               one_pass: bool = True, strip_temps: int = 0):
    """The layout whose every task fits and that reads least (see
    :func:`layout.search`): its :class:`~layout.BlockCosts` and peak
    (:func:`~.memory.block_peak` of its largest task). ``one_pass``: each
    block is evaluated in one pass, not read whole first (a reduction's).
    ``strip_temps``: bytes per element of temporaries made one strip of
    the block at a time (:func:`~tilearray.graphs.reduction.strip_bound`)."""
    task = BlockTask(temp_per_elem, out_itemsize, read_flight(spec),
                     write_flight(out_grid, out_itemsize), strip_temps)
    per_elem = per_element(spec, np.dtype("u1")) + temp_per_elem + 2 * out_itemsize

    def peak_of(costs: layout.BlockCosts) -> int:
        read, size = block_reads(costs, one_pass)
        widths = costs.sizes[1] if np.ndim(size) else costs.sizes[1].max(initial=0)
        return block_peak(task, read, size, gred.strip_bound(widths) if strip_temps else None)

    cap = min(budget.task_memory, _config.get_bytes("map.block-bytes"))
    hard = (None, None) if out_grid is None else (out_grid.unit_edges(0), out_grid.unit_edges(1))
    return layout.search(spec, shape, *hard, max(cap // max(per_elem, 1), 1), peak_of,
                         budget.task_memory)


def check_fits(kind: str, peak: int, what: str, budget: Budget,
               tiles_help: bool = True) -> None:
    """Refuse a stage whose largest task is over the budget (``tiles_help``:
    whether smaller tiles could lower it, as the refusal then says)."""
    if peak > budget.task_memory:
        raise DoesNotFit(kind, peak, what, budget, tiles_help)


def lower_map(node, spec, deps: list, budget: Budget, out=None, out_grid=None,
              skip=frozenset()) -> Stage:
    """The map stage of ``node`` (evaluated as ``spec``, reading the small
    results ``deps``): blocks on the output's unit edges when it is written
    into ``out`` (units in ``skip`` already done), else returned."""
    dtype = np.dtype(node.dtype)
    temps = op_temporaries(spec) * max(dtype.itemsize, 8)
    costs, peak = fit_blocks(spec, node.shape, out_grid, temps, budget, dtype.itemsize)
    row_edges, col_edges = costs.row_edges, costs.col_edges
    token = tokenize("map", spec, row_edges, col_edges, str(out), str(dtype), deps)
    work, blocks = Tasks(), []
    tot, written = layout.ReadTotals(), 0
    for i, rows in enumerate(intervals(row_edges)):
        for j, cols in enumerate(intervals(col_edges)):
            if out_grid is not None and all_done(out_grid, rows, cols, skip):
                continue
            key = ("map-" + token, i, j)
            if out is None:
                tot.add(costs.at(i, j))
                work.add(key, gel.block_compute, spec, rows, cols, dtype, deps)
                blocks.append((rows, cols))
                continue
            # resumed: a block with some units done stores only the others, as
            # parts (each inside the block: its peak covers them)
            todo = missing_parts(out_grid, rows, cols, skip)
            parts = [(rows, cols, costs.at(i, j))] if todo is None else \
                [(r, c, layout.BlockCosts(spec, r, c).at(0, 0)) for r, c in todo]
            for q, (r, c, cost) in enumerate(parts):
                tot.add(cost)
                work.add(key if todo is None else (*key, q), gel.block_store, spec, r, c, dtype,
                         out, deps)
                written += (r[1] - r[0]) * (c[1] - c[0]) * dtype.itemsize
                blocks.append((r, c))
    check_fits("map", peak, short(node), budget)
    keys = tuple(t.key for t in work.freeze())
    result = Output("store", keys) if out is not None else Output("blocks", keys, tuple(blocks))
    return Stage(
        "map", f"{short(node)} in blocks of up to {max_interval(row_edges)}x"
        f"{max_interval(col_edges)}", len(work), peak, tot.nbytes, written, reads=tot.reads,
        store_gets=tot.gets, work=work.freeze(), outputs={"result": result})
