"""The planner: expression + budget -> sized stages (a Plan) and a dask graph.

Pure: block sizes, read requests and memory are computed from array metadata
already held by the expression; nothing is read or written here. Arrays the
run must create first (outputs, temporaries for a matmul used inside another
expression) are listed in ``creates`` for the engine.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import uuid
from dataclasses import dataclass, field

import numpy as np
from dask.base import tokenize

from ... import _config
from ...errors import PlanningError
from ...graphs import elemwise as gel
from ...graphs import matmul as gmm
from ...graphs.blocks import intervals, max_interval
from ...graphs.spec import Const, Dep, Op, Read, Slice, Trans, leaves
from ...storage import ArrayRef, Grid
from ..expr.nodes import (
    Constant,
    Elemwise,
    MatMul,
    Node,
    Reduce,
    SliceNode,
    Source,
    Transpose,
    structure,
)
from . import layout
from .matmul import MatmulLowering
from .reduce import ReductionLowering
from .sizing import (
    _all_done,
    _as_rss,
    _DoesNotFit,
    _io_overhead,
    _op_temporaries,
    _per_element,
    _short,
    leaf_tile,
)
from .types import Budget, Plan, Stage


@dataclass(frozen=True)
class Create:
    """An array the engine creates before running (output or temporary)."""

    ref: ArrayRef
    shape: tuple
    dtype: np.dtype
    tile: tuple
    shard: tuple | None
    temporary: bool = False


@dataclass
class Lowered:
    plan: Plan
    graph: dict
    keys: list
    """Keys whose results the run gathers: ``(value, stats)`` pairs."""
    result: str
    """"store" (write to output), "blocks" (assemble 2-D), "small" (one value)."""
    blocks: list = field(default_factory=list)
    """For "blocks": ``(rows, cols)`` of each key."""
    creates: list = field(default_factory=list)
    skipped_units: int = 0
    stat_keys: list = field(default_factory=list)
    """More keys to gather for their stats only: small results big tasks read
    as operands (a reduction feeding a map) and matmul temporaries' barriers,
    whose figures no gathered key carries (each counted once)."""


class Lowerer(MatmulLowering, ReductionLowering):
    """Lowers one expression: specs, stages and graph, filled as it walks
    (matrix products: :class:`~.matmul.MatmulLowering`; reductions:
    :class:`~.reduce.ReductionLowering`)."""

    def __init__(self, budget: Budget, temp_dir: str | None = None):
        self.budget = budget
        self.graph: dict = {}
        self.stages: list[Stage] = []
        self._counted = 0  # graph tasks already attributed to a stage
        self.creates: list[Create] = []
        self._small: dict[int, str] = {}
        self._shifted: dict = {}  # id(var/std node) -> (node, its unshifted form)
        self._temps: dict[int, Read] = {}
        self._read_leaves: set = set()  # stored arrays read by the stages so far
        self._covers: dict = {}  # small key -> keys whose stats its result carries
        self._dep_keys: list = []  # small keys big tasks read as operands
        self.temp_dir = temp_dir
        self.run_id = uuid.uuid4().hex

    # -- specs ------------------------------------------------------------------
    def spec(self, node: Node, deps: list):
        """Spec for a 2-D node; small operands become ``Dep`` on their keys."""
        if isinstance(node, Source):
            return Read(node.ref, node.grid, node.dtype)
        if isinstance(node, Transpose):
            return Trans(self.spec(node.x, deps))
        if isinstance(node, SliceNode):
            return Slice(self.spec(node.x, deps), node.start, node.step)
        if isinstance(node, Elemwise) and not node.small:
            args = tuple(self._arg(a, deps, node.shape) for a in node.args)
            return Op(node.name, args, node.kwargs)
        if isinstance(node, MatMul):
            read, barrier = self._materialise(node)
            if barrier not in deps:
                deps.append(barrier)  # wait for every block of the temporary
            if barrier not in self._dep_keys:
                self._dep_keys.append(barrier)
            return read
        raise PlanningError(f"cannot tile {node}")

    def _arg(self, a, deps: list, shape):
        if not isinstance(a, Node):
            return Const(a)
        if not a.small:
            return self.spec(a, deps)
        key = self.small(a)
        if key not in deps:
            deps.append(key)
        if key not in self._dep_keys:
            self._dep_keys.append(key)
        return Dep(deps.index(key), _dep_kind(a.shape, shape))

    def _materialise(self, node: MatMul) -> Read:
        if id(node) in self._temps:
            return self._temps[id(node)]
        # unique per run: concurrent runs never share (or delete) a temporary
        token = tokenize(structure(node), self.run_id)
        base = self.temp_dir or _config.get("temporary-directory") or tempfile.gettempdir()
        ref = ArrayRef.from_location(os.path.join(base, f"tilearray-tmp-{token}.zarr"))
        tile = (leaf_tile(node.a, 0), leaf_tile(node.b, 1))
        create = Create(ref, node.shape, node.dtype, tile, None, temporary=True)
        self.creates.append(create)
        grid = Grid.regular(node.shape, tile)
        keys = self.matmul(node, ref, grid, skip=set())
        # later readers of the temporary wait for every block of it
        barrier = "barrier-" + token
        self.graph[barrier] = (_barrier, *keys)
        read = Read(ref, grid, np.dtype(node.dtype))
        self._temps[id(node)] = (read, barrier)
        return read, barrier

    # -- small values (reductions and ops on them) -------------------------------
    def small(self, node: Node) -> str:
        if id(node) in self._small:
            return self._small[id(node)]
        if isinstance(node, Constant):
            key = "const-" + node.token
            self.graph[key] = (_constant, node.value)
        elif isinstance(node, Reduce) and not node.x.small:
            key = self.reduce(self._unshifted(node))
        elif isinstance(node, Reduce):
            inner = self.small(node.x)
            key = "small-" + tokenize(structure(node), inner)
            kwargs = {"axis": node.axis, "keepdims": node.keepdims}
            if node.op in ("var", "std"):
                kwargs["ddof"] = node.ddof
            self.graph[key] = (gel.small_op, node.op, tuple(kwargs.items()), inner)
            self._stage_small(str(node))
        elif isinstance(node, Elemwise):
            args = [self.small(a) if isinstance(a, Node) else a for a in node.args]
            key = "small-" + tokenize(structure(node), args)
            self.graph[key] = (gel.small_op, node.name, node.kwargs, *args)
            self._stage_small(str(node))
        elif isinstance(node, Transpose | SliceNode) and node.x.small:
            inner = self.small(node.x)
            key = "small-" + tokenize(structure(node), inner)
            if isinstance(node, Transpose):
                self.graph[key] = (gel.small_op, "transpose", (), inner)
            else:
                kwargs = (("shape", tuple(node.shape)), ("start", node.start), ("step", node.step))
                self.graph[key] = (gel.small_op, "slice2d", kwargs, inner)
            self._stage_small(str(node))
        else:
            raise PlanningError(f"cannot compute {node} in memory")
        self._small[id(node)] = key
        if key not in self._covers:  # small ops merge their operands' stats
            self._covers[key] = {key}.union(*(
                self._covers.get(self._small.get(id(c)), set())
                for c in [getattr(node, "x", None), *getattr(node, "args", ())]
                if isinstance(c, Node) and c.small))
        return key

    def stat_keys(self, gathered: list) -> list:
        """Keys whose stats reach no gathered result: operands of big tasks
        not merged into a gathered small result nor into another such key."""
        covered = set().union(*(self._covers.get(k, {k}) for k in gathered)) if gathered \
            else set()
        todo = [d for d in self._dep_keys if d not in covered]
        return [d for d in todo
                if not any(d in self._covers.get(e, ()) for e in todo if e != d)]

    def _stage_small(self, what: str) -> None:
        self._add_stage(Stage("small", f"in-memory {what}", 1, 0, 0))

    def _add_stage(self, stage: Stage) -> None:
        """Append ``stage``, counting as its tasks every graph task added since
        the previous stage (its combines, picks, barriers and squeezes too), so
        the plan's task total is the graph's size, which RunStats counts."""
        self.stages.append(dataclasses.replace(stage, tasks=len(self.graph) - self._counted))
        self._counted = len(self.graph)

    # -- map: elementwise into blocks --------------------------------------------
    def map_blocks(self, node: Node, out: ArrayRef | None, out_grid: Grid | None, skip):
        deps: list = []
        spec = self.spec(node, deps)
        m, n = node.shape
        dtype = np.dtype(node.dtype)
        temps = _op_temporaries(spec) * max(dtype.itemsize, 8)
        costs, peak = self._fit_blocks(spec, node.shape, out_grid, temps, dtype.itemsize)
        row_edges, col_edges = costs.row_edges, costs.col_edges
        token = tokenize("map", spec, row_edges, col_edges, str(out), str(dtype), deps)
        keys, blocks = [], []
        nbytes = nreq = gets = written = 0
        for i, rows in enumerate(intervals(row_edges)):
            for j, cols in enumerate(intervals(col_edges)):
                if out_grid is not None and _all_done(out_grid, rows, cols, skip):
                    continue
                b, r, g = costs.at(i, j)
                nbytes, nreq, gets = nbytes + b, nreq + r, gets + g
                size = (rows[1] - rows[0]) * (cols[1] - cols[0])
                key = ("map-" + token, i, j)
                if out is None:
                    self.graph[key] = (gel.block_compute, spec, rows, cols, dtype, deps)
                else:
                    self.graph[key] = (gel.block_store, spec, rows, cols, dtype, out, deps)
                    written += size * dtype.itemsize
                keys.append(key)
                blocks.append((rows, cols))
        self._check_fits("map", peak, str(node))
        self._add_stage(Stage(
            "map", f"{_short(node)} in blocks of up to {max_interval(row_edges)}x"
            f"{max_interval(col_edges)}{self._reread(spec, deps)}", len(keys), peak, nbytes,
            written, reads=nreq, store_gets=gets))
        return keys, blocks

    def _reread(self, spec, deps) -> str:
        """Note for a stage reading stored arrays an earlier stage read: it
        needs that stage's result (``a - a.mean(axis=0)``), so reads them again."""
        names = {tokenize(leaf): str(leaf.ref) for leaf in leaves(spec)}
        again = sorted({v for k, v in names.items() if k in self._read_leaves})
        self._read_leaves.update(names)
        if not again or not deps:
            return ""
        return (f"; reads {', '.join(repr(a) for a in again)} again: it needs the result of "
                "an earlier pass over it")

    def _fit_blocks(self, spec, shape, out_grid, temp_bytes_per_elem, out_itemsize=0):
        """The layout whose every task fits and that reads least (see
        :func:`layout.search`): its :class:`~layout.BlockCosts` and peak.

        A task holds its reads compressed and decoded (``2b``), zarr's chunk
        buffers in flight (at most ``async.concurrency`` chunks, never more
        than the reads), the temporaries of its ops, and, when it stores, the
        output block and its encoded chunks in flight.
        """
        per_elem = _per_element(spec, np.dtype("u1")) + temp_bytes_per_elem + 2 * out_itemsize
        read_flight = _io_overhead(spec, spec, None, np.dtype("u1")) // 2
        write_flight = 0
        if out_grid is not None:  # one output unit copied + encoded at a time
            write_flight = 2 * out_grid.unit[0] * out_grid.unit[1] * max(out_itemsize, 1)

        def peak_of(costs: layout.BlockCosts) -> int:
            b = costs.read_bytes()
            if b is None:  # many blocks: bound by the largest along each axis
                b = costs.max_read_bytes()
                size = int(costs.sizes[0].max(initial=0)) * int(costs.sizes[1].max(initial=0))
            else:
                size = np.multiply.outer(costs.sizes[0], costs.sizes[1])
            out = size * out_itemsize
            task = (2 * b + np.minimum(read_flight, b) + size * temp_bytes_per_elem
                    + out + np.minimum(write_flight, out))
            return _as_rss(int(np.max(task, initial=0)))

        cap = min(self.budget.task_memory, _config.get_bytes("map.block-bytes"))
        hard = (None, None) if out_grid is None else (out_grid.unit_edges(0),
                                                      out_grid.unit_edges(1))
        return layout.search(spec, shape, *hard, max(cap // max(per_elem, 1), 1), peak_of,
                             self.budget.task_memory)

    def _check_fits(self, kind: str, peak: int, what: str) -> None:
        if peak > self.budget.task_memory:
            raise _DoesNotFit(kind, peak, what, self.budget)




def _constant(value):
    return value, {"tasks": 1}


def _barrier(*args):
    stats: dict = {}
    for a in args:
        st = a[1] if isinstance(a, tuple) else a
        stats = gmm.merge_stats(stats, st)
    return None, gmm.counted(stats)


def _dep_kind(small_shape: tuple, shape: tuple) -> str:
    if len(small_shape) == 0 or small_shape == (1, 1):
        return "scalar"
    if len(small_shape) == 1 or small_shape[0] == 1:
        return "row"
    return "col"


def lower(node, budget, out=None, out_grid=None, skip=()) -> Lowered:
    """Plan ``node`` against ``budget``: stages, graph and keys (pure).

    Raises PlanningError when a task cannot fit, naming the smallest
    ``memory_per_worker`` under which the whole expression fits (later stages
    may need more than the first one refused, so it plans again with each
    stage's need until all fit).
    """
    try:
        return _lower(node, budget, out, out_grid, skip)
    except _DoesNotFit as first:
        err, need = first, None
        for _ in range(16):
            try:
                _lower(node, dataclasses.replace(budget, memory_per_worker=err.need), out,
                       out_grid, skip)
                need = err.need
                break
            except _DoesNotFit as again:
                if again.need <= err.need:  # no budget helps (e.g. a fixed overhead)
                    break
                err = again
        raise first.explain(budget, need) from None


def _lower(node, budget, out, out_grid, skip) -> Lowered:
    low = Lowerer(budget)
    low.fuse_reductions(node)
    blocks: list = []
    if node.small:
        key = low.small(node)
        keys, result = [key], "small"
    elif isinstance(node, MatMul):
        res = low.matmul(node, out, out_grid, skip)
        keys, blocks = (res, []) if out is not None else res
        result = "store" if out is not None else "blocks"
    else:
        keys, blocks = low.map_blocks(node, out, out_grid, skip)
        result = "store" if out is not None else "blocks"
    if len(low.graph) > low._counted and low.stages:  # tasks after the last stage: its own
        last = low.stages[-1]
        low.stages[-1] = dataclasses.replace(
            last, tasks=last.tasks + len(low.graph) - low._counted)
    plan = Plan(str(node), tuple(node.shape), str(node.dtype), budget, tuple(low.stages),
                str(out) if out else None)
    skipped = len(skip)
    return Lowered(plan, low.graph, keys, result, blocks, low.creates, skipped,
                   low.stat_keys(keys if result == "small" else []))
