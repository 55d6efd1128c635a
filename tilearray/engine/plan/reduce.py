"""Lowering reductions: sibling reductions over the same stored arrays fused
into one pass, each pass a map over blocks whose partials a tree combines
(:mod:`tilearray.graphs.reduction` tasks). Pure: nodes, specs and budget
in, a :class:`~.types.Stage` out."""

from __future__ import annotations

import dataclasses

import numpy as np
from dask.base import tokenize

from ... import _config
from ...graphs import elemwise as gel
from ...graphs import reduction as gred
from ...graphs.blocks import intervals, max_interval, tree
from ...graphs.emit import Tasks
from ...graphs.spec import Op, has_gather, leaves
from ..expr.nodes import Elemwise, MatMul, MatVec, Node, Reduce, Scan, Sort, structure
from . import layout
from .map import check_fits, fit_blocks
from .memory import op_temporaries
from .sizing import short
from .types import Budget, Output, Stage


def fusable_groups(root: Node, spec_of, unshift) -> list[list[tuple[Reduce, object]]]:
    """The reductions of ``root`` to lower together: those that read the same
    stored arrays over the same shape and need no other reduction first
    (``(a * a).sum() + a.sum()``, ``a.mean(0)`` and ``a.std(0)``), so one
    pass over the blocks evaluates all of them and each array is read once.
    ``spec_of(node)`` gives a node's spec; ``unshift`` is :func:`unshifted`
    (memoised by the caller). Returns groups of two or more ``(node, spec)``."""
    groups: dict = {}
    seen: set = set()

    def visit(node):
        if not isinstance(node, Node) or id(node) in seen:
            return
        seen.add(id(node))
        red = unshift(node) if isinstance(node, Reduce) else None
        if red is not None and not red.x.small and 0 not in red.x.shape \
                and _reads_only_stored(red.x):  # so it can share a pass
            spec = spec_of(red.x)
            reads = frozenset(tokenize(leaf) for leaf in leaves(spec))
            groups.setdefault(tuple(red.x.shape), []).append((node, spec, reads))
        if red is not None:  # a rewritten var/std no longer needs its shift's mean
            node = red
        for child in ("x", "a", "b", "w"):
            visit(getattr(node, child, None))
        for a in getattr(node, "args", ()):
            visit(a)

    visit(root)
    out = []
    for members in groups.values():
        # reductions sharing a stored array, directly or through others, share a pass
        parts: list[tuple[set, list]] = []
        for r, spec, reads in members:
            joined = [p for p in parts if p[0] & reads]
            parts = [p for p in parts if not p[0] & reads]
            keys = set(reads).union(*(p[0] for p in joined))
            parts.append((keys, [m for p in joined for m in p[1]] + [(r, spec)]))
        out += [group for _, group in parts if len(group) > 1]
    return out


def lower_empty_reduce(node: Reduce) -> Stage:
    """A reduction of an empty array: nothing to read, NumPy's answer."""
    kwargs = {"axis": node.axis, "keepdims": node.keepdims}
    if node.op in gred.VARIANCES:
        kwargs["ddof"] = node.ddof
    key = "reduce-empty-" + tokenize(structure(node))
    empty = np.empty(node.x.shape, dtype=node.x.dtype)
    work = Tasks()
    work.add(key, gel.small_op, node.op, tuple(kwargs.items()), empty)
    return Stage("small", f"in-memory {node}", 1, 0, 0, work=work.freeze(),
                 outputs={"0": Output("value", (key,))})


def lower_reduce(nodes: list[Reduce], specs: list, deps: list, budget: Budget,
                 note: str = "") -> Stage:
    """One map over the blocks of ``nodes``' common input shape, then a
    combine tree and final value per reduction: outputs ``"0"``, ``"1"``, ...
    (one per node, in order). ``note`` is appended to the description."""
    m, n = nodes[0].x.shape
    joint = specs[0] if len(specs) == 1 else Op("fused", tuple(specs))  # for costs only
    # blocks are read whole first, then reduced strip by strip (an
    # expression's temporaries a strip at a time); through a gather,
    # evaluated in one pass (:func:`~tilearray.graphs.reduction.reduce_map`)
    gather = has_gather(joint)
    temps = [0, 0]  # bytes per element: over the block, over a strip
    for r, spec in zip(nodes, specs, strict=True):
        # op results, plus the float64 accumulation copy / (x - mean)**2 of
        # var, the NaN mask and filled copy of nanargmin; the reductions of a
        # pass take their partials one after another (the reads shared, held
        # throughout), so the largest one's temporaries are the pass's (their
        # sum had refused np.median(X)'s census of 5 at 150 MiB, helper-51)
        per = (op_temporaries(spec) + (2 if r.op in gred.VARIANCES or r.op.startswith("nanarg")
                                       else 1)) * max(np.dtype(r.x.dtype).itemsize, 8)
        k = int(gred.strip_mined(spec, r.op) and not gather)
        temps[k] = max(temps[k], per)
    costs, peak = fit_blocks(joint, (m, n), None, temps[0], budget, one_pass=gather,
                             strip_temps=temps[1])
    row_edges, col_edges = costs.row_edges, costs.col_edges
    what = [(r.op, r.axis, r.ddof) for r in nodes]
    token = tokenize("reduce", what, specs, row_edges, col_edges, deps)
    name = f"reduce-{'-'.join(dict.fromkeys(r.op for r in nodes))}-{token}"
    work, parts, tot = Tasks(), {}, layout.ReadTotals()
    for i, rows in enumerate(intervals(row_edges)):
        for j, cols in enumerate(intervals(col_edges)):
            if len(nodes) == 1:
                parts[i, j] = work.add((name, "map", i, j), gred.reduce_map, specs[0], rows, cols,
                                       nodes[0].op, nodes[0].axis, n, deps)
            else:
                parts[i, j] = work.add((name, "map", i, j), gred.reduce_map_many, tuple(specs),
                                       rows, cols, tuple(r.op for r in nodes),
                                       tuple(r.axis for r in nodes), n, deps)
            tot.add(costs.at(i, j))
    check_fits("reduce", peak, short(nodes[0]) + (f" and {len(nodes) - 1} more reduction(s) "
               "of the same pass" if len(nodes) > 1 else ""), budget)
    split_every = int(_config.get("reduction.split-every"))
    outputs = {}
    for q, node in enumerate(nodes):
        qname = name if len(nodes) == 1 else f"{name}-{q}"
        mine = parts
        if len(nodes) > 1:  # this reduction's partials out of the shared map
            mine = {ij: work.add((qname, "pick", *ij), gred.pick, q, key)
                    for ij, key in parts.items()}
        key = _combine(work, node, qname, mine, len(row_edges) - 1, len(col_edges) - 1,
                       split_every)
        outputs[str(q)] = Output("value", (key,))
    ops = ", ".join(f"{r.op}(axis={r.axis})" for r in nodes)
    shared = f" in one pass ({len(nodes)} reductions read each block once)" \
        if len(nodes) > 1 else ""
    return Stage(
        "reduce", f"{ops}{note} over {len(parts)} blocks of up to "
        f"{max_interval(row_edges)}x{max_interval(col_edges)}, fan-in {split_every}{shared}",
        len(work), peak, tot.nbytes, reads=tot.reads, store_gets=tot.gets, work=work.freeze(),
        outputs=outputs)


def _combine(work: Tasks, node: Reduce, qname: str, parts: dict, nr: int, nc: int,
             split_every: int):
    """The combine trees, finals and result of one reduction over its block
    partials ``parts[i, j]``; returns the result's key."""
    if node.axis is None:
        groups = {0: [parts[i, j] for i in range(nr) for j in range(nc)]}
    elif node.axis == 0:
        groups = {j: [parts[i, j] for i in range(nr)] for j in range(nc)}
    else:
        groups = {i: [parts[i, j] for j in range(nc)] for i in range(nr)}
    finals = []
    for g, keys in groups.items():
        root = tree(keys, split_every,
                    lambda level, k, g=g: (qname, "combine", g, level, k),
                    lambda children: (gred.reduce_combine, node.op, *children), work)
        finals.append(work.add((qname, "final", g), gred.reduce_final, node.op, node.dtype,
                               node.ddof, root))
    key = work.add(qname, gred.concat_final, node.axis, *finals)
    if not node.keepdims:
        key = work.add(qname + "-squeezed", gel.small_op, "reshape", (), key, node.shape)
    return key


def _reads_only_stored(node) -> bool:
    """True if a big node is computed from stored arrays alone: no small
    operand (a reduction's result) and no matmul temporary below it."""
    if isinstance(node, MatMul | MatVec | Scan | Sort) or (isinstance(node, Node) and node.small):
        return False
    children = [getattr(node, c, None) for c in ("x", "a", "b")] + list(getattr(node, "args", ()))
    return all(_reads_only_stored(c) for c in children if isinstance(c, Node))



def unshifted(node: Reduce) -> Reduce:
    """``(x - x.mean(axis)).var(axis)`` (or ``.std``) as ``x.var(axis)``.

    A shift constant along the reduced axis does not change the variance, and
    the mean of ``x`` along that axis is such a shift; lowering the reduction
    of ``x`` itself saves the pass that computes the mean (``x`` is read once,
    not twice). Only this exact form is rewritten: the shift is a mean of the
    same expression over the same axis, broadcast along that axis (``(n,)``
    or ``(1, n)`` for axis 0, ``(m, 1)`` for axis 1, a scalar for None), so
    non-finite values give NumPy's NaN either way. Any other node is
    returned as it is."""
    x = node.x
    if node.op not in ("var", "std") or not isinstance(x, Elemwise) \
            or x.name != "subtract" or len(x.args) != 2 or x.kwargs:
        return node
    base, shift = x.args
    if not isinstance(base, Node) or base.small or not isinstance(shift, Reduce) \
            or shift.op != "mean" or shift.axis != node.axis \
            or structure(shift.x) != structure(base) or base.shape != x.shape:
        return node
    s = tuple(shift.shape)
    if node.axis is None:
        along = s == () or s == (1, 1)
    elif node.axis == 0:
        along = s in ((x.shape[1],), (1, x.shape[1]))
    else:
        along = s == (x.shape[0], 1)
    if not along:
        return node
    return dataclasses.replace(node, x=base)

