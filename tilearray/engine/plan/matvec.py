"""Lowering a product with a small in-memory operand (``X @ w``, ``v @ X``,
``W.T @ X``, ``X.T @ (X @ w)``): one pass over the blocks of the stored
side. Pure: node, spec, budget in, a :class:`~.types.Stage` out.

``A.T @ W`` is read as ``(W.T @ A).T``, so every product is one of two
kinds over A's own blocks: *right* (``A @ W``, partials ``A[rows, cols] @
W[cols]`` summed along each row of blocks: one result block per row block,
returned, written whole or joined into a value) or *left* (``W @ A``,
partials ``W[:, rows] @ A[rows, cols]`` summed down each column of blocks,
joined into one value). The operand is the result of one task (a constant,
a reduction, a joined product), which dask sends to each worker once; every
block task holds it whole, and the plan counts it in the task's peak.
"""

from __future__ import annotations

import numpy as np
from dask.base import tokenize
from dask.utils import format_bytes

from ... import _config
from ...graphs import matmul as gmm
from ...graphs import matvec as gmv
from ...graphs.blocks import intervals, max_interval, tree
from ...graphs.emit import Tasks
from ..expr.nodes import MatVec, Transpose, structure
from . import layout
from .map import block_reads
from .memory import (
    BlockTask,
    as_rss,
    block_peak,
    combine_peak,
    op_temporaries,
    per_element,
    read_flight,
    write_flight,
)
from .sizing import DoesNotFit, ahead, all_done, short
from .types import Budget, Output, Stage


def _nbytes(shape, dtype) -> int:
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def oriented(node: MatVec) -> tuple[str, bool, int]:
    """``(kind, transposed, k)``: the product read over A's own blocks
    (``"right"`` or ``"left"``), whether A is reached through a transpose
    (then the operand and the result are transposed) and the operand's
    width (1 for a vector)."""
    transposed = isinstance(node.a, Transpose)
    kind = "left" if node.small else "right"
    w = node.w.shape
    k = 1 if len(w) == 1 else (w[1] if node.side == "right" else w[0])
    return kind, transposed, k


def _layout(node: MatVec, spec, kind: str, k: int, w_bytes: int, budget: Budget, out_grid):
    """Blocks of A (reading least among those whose task fits): ``(costs,
    peak of a block task)``."""
    dtype = np.dtype(node.dtype)
    temps = op_temporaries(spec) * max(dtype.itemsize, 8)
    task = BlockTask(temps, 0, read_flight(spec), 0)

    def peak_of(costs: layout.BlockCosts) -> int:
        b, size = block_reads(costs)
        long = costs.sizes[0 if kind == "right" else 1].max(initial=0)
        # the operand, the partial product and BLAS's copy of a cast block
        return block_peak(task, b, size) + as_rss(w_bytes + 2 * int(long) * k * dtype.itemsize)

    per_elem = per_element(spec, np.dtype("u1")) + temps + 8
    room = max(budget.task_memory - as_rss(w_bytes), 1)
    cap = min(room, _config.get_bytes("map.block-bytes"))
    hard_rows = None if out_grid is None else out_grid.unit_edges(0)
    shape = node.a.shape[::-1] if isinstance(node.a, Transpose) else node.a.shape
    return layout.search(spec, shape, hard_rows, None, max(cap // max(per_elem, 1), 1),
                         peak_of, budget.task_memory)


def _refusal(node: MatVec, peak: int, w_bytes: int, budget: Budget) -> None:
    if peak <= budget.task_memory:
        return
    what = short(node)
    alone = as_rss(w_bytes) >= budget.task_memory  # no tiling of A helps then
    if alone or 4 * as_rss(w_bytes) >= peak:
        what += (f" (its in-memory operand, {format_bytes(w_bytes)}, is held whole by every "
                 "task: store it with ta.from_numpy(w, path), as a 2-D array, and multiply "
                 "the stored arrays)")
    raise DoesNotFit("product", peak, what, budget, tiles_help=not alone)


def lower_matvec(node: MatVec, a_spec, w_index: int, deps: list, budget: Budget, out=None,
                 out_grid=None, skip=frozenset(), value: bool = False) -> Stage:
    """The pass of ``node`` over A's blocks (``a_spec``; the operand is
    ``deps[w_index]``). Output ``"0"``, one value, for a left product or
    with ``value``; else ``"result"``: blocks written into ``out`` (units in
    ``skip`` done) or returned."""
    kind, transposed, k = oriented(node)
    spec = a_spec.x if transposed else a_spec
    dtype = np.dtype(node.dtype)
    w_bytes = _nbytes(node.w.shape, node.w.dtype)
    costs, peak = _layout(node, spec, kind, k, w_bytes, budget, out_grid)
    _refusal(node, peak, w_bytes, budget)
    row_edges, col_edges = costs.row_edges, costs.col_edges
    token = tokenize("matvec", spec, kind, transposed, str(dtype), row_edges, col_edges, deps,
                     w_index, str(out))
    name = "matvec-" + token
    work, parts, tot = Tasks(), {}, layout.ReadTotals()
    blocks = [(i, j, rows, cols) for i, rows in enumerate(intervals(row_edges))
              if out_grid is None or not all_done(out_grid, rows, (0, k), skip)
              for j, cols in enumerate(intervals(col_edges))]
    for n, (i, j, rows, cols) in enumerate(blocks):
        nxt = ahead(blocks, n, budget)
        parts[i, j] = work.add((name, "block", i, j), gmv.block_product, spec, rows, cols,
                               kind, transposed, dtype, w_index, deps,
                               None if nxt is None else nxt[2:])
        tot.add(costs.at(i, j))
    groups = _groups(parts, kind)
    fan = int(_config.get("reduction.split-every"))
    roots = {g: tree(keys, fan, lambda level, n, g=g: (name, "sum", g, level, n),
                     lambda children: (gmm.sum_partials, *children), work)
             for g, keys in groups.items()}
    piece = max_interval(row_edges if kind == "right" else col_edges) * k * dtype.itemsize
    peak = max(peak, combine_peak(piece, fan) if any(len(v) > 1 for v in groups.values()) else 0)
    edges = row_edges if kind == "right" else col_edges
    outputs, written = {}, 0
    if value or kind == "left":
        key = work.add(name, gmv.join, tuple(node.shape), 0 if kind == "right" else 1,
                       transposed, dtype, *roots.values())
        peak = max(peak, as_rss(2 * _nbytes(node.shape, dtype)))
        outputs["0"] = Output("value", (key,))
    elif out is not None:
        keys = []
        for g, root in roots.items():
            rows = intervals(edges)[g]
            keys.append(work.add((name, "store", g), gmm.store_partials, out, rows, (0, k), root))
            written += (rows[1] - rows[0]) * k * dtype.itemsize
        peak = max(peak, combine_peak(piece, 1) + write_flight(out_grid, dtype.itemsize))
        outputs["result"] = Output("store", tuple(keys))
    else:
        blocks = tuple((intervals(edges)[g], (0, k)) for g in roots)
        outputs["result"] = Output("blocks", tuple(roots.values()), blocks)
    _refusal(node, peak, 0, budget)
    nblocks = len(parts)
    return Stage(
        "product", f"{short(node)}: {kind} product with an in-memory operand of "
        f"{format_bytes(w_bytes)} over {nblocks} blocks of up to {max_interval(row_edges)}x"
        f"{max_interval(col_edges)}" + (f", partials summed with fan-in {fan}"
                                         if nblocks > len(groups) else ""),
        len(work), peak, tot.nbytes, written, flops=2 * int(np.prod(node.a.shape)) * k,
        reads=tot.reads, store_gets=tot.gets, work=work.freeze(), outputs=outputs)


def _groups(parts: dict, kind: str) -> dict:
    """Partials summed together: along a row of blocks (right), down a column (left)."""
    groups: dict = {}
    for (i, j), key in parts.items():
        groups.setdefault(i if kind == "right" else j, []).append(key)
    return dict(sorted(groups.items()))


def gram_form(node: MatVec):
    """``(inner, axis)`` when ``node`` is ``X.T @ (X @ W)`` (``axis`` 0: over
    X's row panels) or ``X @ (X.T @ W)`` (``axis`` 1: over its column
    panels) with the same X (one expression, elementwise ops and all) and an
    in-memory W; else None."""
    inner = node.w
    if node.side != "right" or not isinstance(inner, MatVec) or inner.side != "right":
        return None
    if isinstance(node.a, Transpose) and not isinstance(inner.a, Transpose):
        x, y, axis = node.a.x, inner.a, 0
    elif isinstance(inner.a, Transpose) and not isinstance(node.a, Transpose):
        x, y, axis = node.a, inner.a.x, 1
    else:
        return None
    if x.ndim != 2 or not inner.w.small or (x is not y and structure(x) != structure(y)):
        return None
    return inner, axis


def _gram_layout(node: MatVec, axis: int, x_spec, budget: Budget):
    """Whole panels of X for :func:`lower_gram`: ``(costs, peak)`` of the
    layout reading least whose every task fits; :class:`DoesNotFit` when no
    whole panel fits."""
    inner = node.w
    dtype = np.dtype(node.dtype)
    x_node = inner.a if axis == 0 else node.a
    m, n = x_node.shape
    side = n if axis == 0 else m  # length of the result (and of W)
    k = 1 if len(inner.w.shape) == 1 else inner.w.shape[1]
    w_bytes = _nbytes(inner.w.shape, inner.w.dtype)
    temps = op_temporaries(x_spec) * max(dtype.itemsize, 8)
    cast = dtype.itemsize if np.dtype(x_node.dtype) != dtype else 0
    task = BlockTask(temps + cast, 0, read_flight(x_spec), 0)

    def peak_of(costs: layout.BlockCosts) -> int:
        b, size = block_reads(costs)
        long = int(costs.sizes[axis].max(initial=0))
        # W, the thin product of the panel and the partial
        return block_peak(task, b, size) + as_rss(w_bytes + (long + side) * k * dtype.itemsize)

    per_elem = per_element(x_spec, np.dtype("u1")) + temps + cast + 8
    cap = min(max(budget.task_memory - as_rss(w_bytes), 1),
              _config.get_bytes("map.block-bytes"))
    whole = ((0, m), (0, n))[1 - axis]
    costs, peak = layout.search(x_spec, (m, n), whole if axis == 1 else None,
                                whole if axis == 0 else None, max(cap // max(per_elem, 1), 1),
                                peak_of, budget.task_memory)
    if len(costs.col_edges if axis == 0 else costs.row_edges) != 2:
        raise DoesNotFit("product", peak, short(node), budget)  # the panels are not whole
    fan = int(_config.get("reduction.split-every"))
    edges = costs.row_edges if axis == 0 else costs.col_edges
    peak = max(peak, combine_peak(side * k * dtype.itemsize, fan) if len(edges) > 2 else 0,
               as_rss(2 * _nbytes(node.shape, dtype)))
    _refusal(node, peak, w_bytes, budget)
    return costs, peak


def _panel(span, whole, axis: int) -> tuple:
    """``(rows, cols)`` of a row panel (``axis`` 0) or a column panel."""
    return (span, whole) if axis == 0 else (whole, span)


def lower_gram(node: MatVec, axis: int, x_spec, w_index: int, deps: list,
               budget: Budget) -> Stage:
    """``X.T @ (X @ W)`` (``axis`` 0) or ``X @ (X.T @ W)`` (``axis`` 1) in one
    pass: each task reads a whole panel of X (``x_spec``) once, multiplies it
    by W and its transpose by that, and the partials are tree-summed into one
    value (output ``"0"``). Raises :class:`DoesNotFit` when no panel fits a
    task (the caller then reads X twice)."""
    costs, peak = _gram_layout(node, axis, x_spec, budget)
    dtype = np.dtype(node.dtype)
    m, n = (node.w.a if axis == 0 else node.a).shape
    k = 1 if len(node.w.w.shape) == 1 else node.w.w.shape[1]
    whole = ((0, m), (0, n))[1 - axis]
    edges = costs.row_edges if axis == 0 else costs.col_edges
    fan = int(_config.get("reduction.split-every"))
    name = "gram-" + tokenize("gram", x_spec, axis, str(dtype), edges, deps, w_index)
    work, tot, parts = Tasks(), layout.ReadTotals(), []
    spans = intervals(edges)
    for i, span in enumerate(spans):
        nxt = ahead(spans, i, budget)
        parts.append(work.add((name, "block", i), gmv.gram_block, x_spec,
                              *_panel(span, whole, axis), axis, dtype, w_index, deps,
                              None if nxt is None else _panel(nxt, whole, axis)))
        tot.add(costs.at(i, 0) if axis == 0 else costs.at(0, i))
    roots = [tree(parts, fan, lambda level, c: (name, "sum", level, c),
                  lambda children: (gmm.sum_partials, *children), work)] if parts else []
    key = work.add(name, gmv.join, tuple(node.shape), 0, False, dtype, *roots)
    what = "row" if axis == 0 else "column"
    return Stage(
        "product", f"{short(node)}: one pass over {len(parts)} {what} panels of up to "
        f"{max_interval(edges)} {what}s, each multiplied by an in-memory operand of "
        f"{format_bytes(_nbytes(node.w.w.shape, node.w.w.dtype))} and by its transpose"
        + (f", partials summed with fan-in {fan}" if len(parts) > 1 else ""),
        len(work), peak, tot.nbytes, 0, flops=4 * m * n * k,
        reads=tot.reads, store_gets=tot.gets, work=work.freeze(), outputs={"0": Output(
            "value", (key,))})
