"""The planner: expression + budget -> sized stages (a Plan) and a dask graph.

Pure: block sizes, read requests and memory are computed from array metadata
already held by the expression; nothing is read or written here. Arrays the
run must create first (outputs, temporaries for a matmul used inside another
expression) are listed in ``creates`` for the engine.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import tempfile
import uuid
from dataclasses import dataclass, field

import numpy as np
from dask.base import tokenize
from dask.utils import format_bytes

from .. import _config
from ..errors import PlanningError
from ..graphs import elemwise as gel
from ..graphs import matmul as gmm
from ..graphs import reduction as gred
from ..graphs.blocks import compact, group_edges, intervals, max_interval, split_points, tree
from ..graphs.spec import Const, Dep, Op, Read, Slice, Trans, leaves, n_temporaries, unit_edges
from ..storage import ArrayRef, Grid
from ..storage.stream import slab_plan
from . import layout
from .nodes import (
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
from .plan import Budget, Plan, Stage

MIN_PANEL = 512  # elements: K panels narrower than this waste BLAS efficiency


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


class Lowerer:
    def __init__(self, budget: Budget, temp_dir: str | None = None):
        self.budget = budget
        self.graph: dict = {}
        self.stages: list[Stage] = []
        self.creates: list[Create] = []
        self._small: dict[int, str] = {}
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
            key = self.reduce(node)
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
        self.stages.append(Stage("small", f"in-memory {what}", 1, 0, 0))

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
        self.stages.append(Stage(
            "map", f"{_short(node)} in blocks of up to {max_interval(row_edges)}x"
            f"{max_interval(col_edges)}{self._reread(spec, deps)}", len(keys), peak, nbytes,
            written, reads=nreq, store_gets=gets))
        return keys, blocks

    def _reread(self, spec, deps) -> str:
        """Note for a stage reading stored arrays an earlier stage read: it
        needs that stage's result (``a - a.mean(axis=0)``), so reads them again."""
        from ..graphs.spec import leaves

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

    # -- reductions -------------------------------------------------------------
    def fuse_reductions(self, root: Node) -> None:
        """Lower together the reductions of ``root`` that read the same stored
        arrays over the same shape and need no other reduction first
        (``(a * a).sum() + a.sum()``, ``a.mean(0)`` and ``a.std(0)``): one pass
        over the blocks evaluates all of them, so each array is read once."""
        groups: dict = {}
        seen: set = set()

        def visit(node):
            if not isinstance(node, Node) or id(node) in seen:
                return
            seen.add(id(node))
            if isinstance(node, Reduce) and not node.x.small and 0 not in node.x.shape \
                    and _reads_only_stored(node.x):  # so it can share a pass
                deps: list = []
                spec = self.spec(node.x, deps)
                if not deps:
                    from ..graphs.spec import leaves

                    reads = frozenset(tokenize(leaf) for leaf in leaves(spec))
                    groups.setdefault(tuple(node.x.shape), []).append((node, spec, reads))
            for child in ("x", "a", "b"):
                visit(getattr(node, child, None))
            for a in getattr(node, "args", ()):
                visit(a)

        visit(root)
        for members in groups.values():
            # reductions sharing a stored array, directly or through others, share a pass
            parts: list[tuple[set, list]] = []
            for r, spec, reads in members:
                joined = [p for p in parts if p[0] & reads]
                parts = [p for p in parts if not p[0] & reads]
                keys = set(reads).union(*(p[0] for p in joined))
                parts.append((keys, [m for p in joined for m in p[1]] + [(r, spec)]))
            for _, group in parts:
                if len(group) > 1:
                    nodes = [r for r, _ in group]
                    keys = self._reduce_pass(nodes, [sp for _, sp in group], [])
                    for r, key in zip(nodes, keys, strict=True):
                        self._small[id(r)] = key

    def reduce(self, node: Reduce) -> str:
        m, n = node.x.shape
        if m == 0 or n == 0:  # nothing to read: NumPy's answer for an empty array
            kwargs = {"axis": node.axis, "keepdims": node.keepdims}
            if node.op in ("var", "std"):
                kwargs["ddof"] = node.ddof
            key = "reduce-empty-" + tokenize(structure(node))
            empty = np.empty(node.x.shape, dtype=node.x.dtype)
            self.graph[key] = (gel.small_op, node.op, tuple(kwargs.items()), empty)
            self._stage_small(str(node))
            return key
        deps: list = []
        spec = self.spec(node.x, deps)
        return self._reduce_pass([node], [spec], deps)[0]

    def _reduce_pass(self, nodes: list[Reduce], specs: list, deps: list) -> list[str]:
        """One map over the blocks of ``nodes``' common input shape, then a
        combine tree and final value per reduction; returns their keys."""
        m, n = nodes[0].x.shape
        # op results, plus the float64 accumulation copy / (x - mean)**2 of var
        temps = sum((_op_temporaries(spec) + (2 if r.op in ("var", "std") else 1))
                    * max(np.dtype(r.x.dtype).itemsize, 8) for r, spec in zip(nodes, specs,
                                                                                strict=True))
        joint = specs[0] if len(specs) == 1 else Op("fused", tuple(specs))  # for costs only
        costs, peak = self._fit_blocks(joint, (m, n), None, temps)
        row_edges, col_edges = costs.row_edges, costs.col_edges
        what = [(r.op, r.axis, r.ddof) for r in nodes]
        token = tokenize("reduce", what, specs, row_edges, col_edges, deps)
        name = f"reduce-{'-'.join(dict.fromkeys(r.op for r in nodes))}-{token}"
        parts = {}
        nbytes = nreq = gets = 0
        for i, rows in enumerate(intervals(row_edges)):
            for j, cols in enumerate(intervals(col_edges)):
                key = (name, "map", i, j)
                if len(nodes) == 1:
                    self.graph[key] = (gred.reduce_map, specs[0], rows, cols, nodes[0].op,
                                       nodes[0].axis, n, deps)
                else:
                    self.graph[key] = (gred.reduce_map_many, tuple(specs), rows, cols,
                                       tuple(r.op for r in nodes), tuple(r.axis for r in nodes),
                                       n, deps)
                parts[i, j] = key
                b, r, g = costs.at(i, j)
                nbytes, nreq, gets = nbytes + b, nreq + r, gets + g
        self._check_fits("reduce", peak, " and ".join(str(r) for r in nodes))
        split_every = int(_config.get("reduction.split-every"))
        nr, nc = len(row_edges) - 1, len(col_edges) - 1
        out_keys, n_tasks = [], len(parts)
        for q, node in enumerate(nodes):
            qname = name if len(nodes) == 1 else f"{name}-{q}"
            mine = parts
            if len(nodes) > 1:  # this reduction's partials out of the shared map
                mine = {}
                for (i, j), key in parts.items():
                    mine[i, j] = (qname, "pick", i, j)
                    self.graph[mine[i, j]] = (gred.pick, q, key)
                n_tasks += len(mine)
            if node.axis is None:
                groups = {0: [mine[i, j] for i in range(nr) for j in range(nc)]}
            elif node.axis == 0:
                groups = {j: [mine[i, j] for i in range(nr)] for j in range(nc)}
            else:
                groups = {i: [mine[i, j] for j in range(nc)] for i in range(nr)}
            finals = []
            for g, keys in groups.items():
                root = tree(
                    keys, split_every,
                    lambda level, k, g=g, qname=qname: (qname, "combine", g, level, k),
                    lambda children, node=node: (gred.reduce_combine, node.op, *children),
                    self.graph,
                )
                fk = (qname, "final", g)
                self.graph[fk] = (gred.reduce_final, node.op, node.dtype, node.ddof, root)
                finals.append(fk)
            key = qname
            self.graph[key] = (gred.concat_final, node.axis, *finals)
            if not node.keepdims:
                flat = qname + "-squeezed"
                self.graph[flat] = (gel.small_op, "reshape", (), key, node.shape)
                key = flat
            n_tasks += len(finals) + 1
            out_keys.append(key)
            self._covers[key] = {key}  # its map tasks' stats, not their operands'
        ops = ", ".join(f"{r.op}(axis={r.axis})" for r in nodes)
        shared_note = self._reread(joint, deps)
        shared = f" in one pass ({len(nodes)} reductions read each block once)" \
            if len(nodes) > 1 else ""
        self.stages.append(Stage(
            "reduce", f"{ops} over {len(parts)} blocks of up to "
            f"{max_interval(row_edges)}x{max_interval(col_edges)}, fan-in {split_every}{shared}"
            f"{shared_note}",
            n_tasks, peak, nbytes, reads=nreq, store_gets=gets))
        return out_keys

    # -- matmul -------------------------------------------------------------------
    def matmul(self, node: MatMul, out: ArrayRef | None, out_grid: Grid | None, skip):
        deps: list = []
        a_spec = self.spec(node.a, deps)
        b_spec = self.spec(node.b, deps)
        (m, k), n = node.a.shape, node.b.shape[1]
        dtype = np.dtype(node.dtype)
        a_units, b_units = unit_edges(a_spec, 1, k), unit_edges(b_spec, 0, k)
        a_k, b_k = _panels(a_units), _panels(b_units)
        ka, kb = max_interval(a_k), max_interval(b_k)
        # bytes per panel element of each fused temporary, cast to dtype
        ca = max(_leaf_itemsize(a_spec), dtype.itemsize)
        cb = max(_leaf_itemsize(b_spec), dtype.itemsize)
        ta, tb = _op_temporaries(a_spec), _op_temporaries(b_spec)
        band = _band_bytes(a_spec, b_spec, max(ka, kb), self.budget.task_memory)
        gram = (a_spec == Trans(b_spec) or b_spec == Trans(a_spec)) and a_k == b_k
        out_unit = (out_grid.unit[0] * out_grid.unit[1] if out_grid is not None else 0) \
            * dtype.itemsize
        a_panel_cache: dict = {}
        b_panel_cache: dict = {}

        def panel_bytes(rows_edges, cols_edges) -> tuple[int, int]:
            """Largest A panel (rows block x K panel) and B panel (K panel x
            cols block): the whole units read, or the region cast to dtype,
            plus fused temporaries."""
            if rows_edges not in a_panel_cache:
                c = layout.BlockCosts(a_spec, rows_edges, a_k)
                a_panel_cache[rows_edges] = c.max_read_bytes(exact=False), c.min_request_bytes()
            if cols_edges not in b_panel_cache:
                c = layout.BlockCosts(b_spec, b_k, cols_edges)
                b_panel_cache[cols_edges] = c.max_read_bytes(exact=False), c.min_request_bytes()
            (ra, qa), (rb, qb) = a_panel_cache[rows_edges], b_panel_cache[cols_edges]
            bm, bn = max_interval(rows_edges), max_interval(cols_edges)
            pa = max(ra, bm * ka * ca) + bm * ka * ca * ta
            pb = max(rb, kb * bn * cb) + kb * bn * cb * tb
            return pa, pb, max(qa, qb)

        # B streamed band by band (A and B share their K panels): one B band
        # -- a K panel by one of B's column I/O units -- resident, not a panel
        stream = a_k == b_k and k > 0
        b_cols = unit_edges(b_spec, 1, n)
        if stream:
            c = layout.BlockCosts(b_spec, b_k, b_cols)
            wb = max_interval(b_cols)
            b_band = max(c.max_read_bytes(exact=False), kb * wb * cb) + kb * wb * cb * tb
            b_band_request = c.min_request_bytes()

        # X.T @ X in one block, X's chunks decodable in row slabs: X streamed slab
        # by slab (slab buffer + zstd decoders, never a whole chunk)
        slabs = gram and k > 0 and m > 0 and a_spec == Trans(b_spec) \
            and isinstance(b_spec, Read) and b_spec.grid.row_slabs
        slab_rows = slab_mem = 0
        if slabs:
            slab_rows, slab_mem = slab_plan(b_spec.grid.tile, b_spec.dtype.itemsize, (0, n),
                                            self.budget.task_memory, b_spec.grid.row_slabs)

        def memory(re, ce, mode: str) -> int:
            """Peak of one task: the accumulator and the current panels, plus
            the panel in flight (compressed + decoded) when prefetching, or,
            reading in place, one band's buffers while a panel fills (a panel
            read in one request is its own decoded buffer); at the end the
            accumulator and one output unit copied and encoded at a time.
            Streaming B holds the accumulator, one A panel and one B band,
            each a single large buffer freed whole (so priced as allocated),
            plus one read's buffers."""
            bm, bn = max_interval(re), max_interval(ce)
            acc = bm * bn * dtype.itemsize
            if mode == "slabs":
                return _as_rss(acc + max(2 * out_unit, slab_mem))
            pa, pb, request = panel_bytes(re, ce)
            if gram and bm == m and bn == n:
                pa = 0  # X.T @ X in one block: each panel serves as both operands
            if mode == "stream":
                reading = min(2 * max(band, request, b_band_request), max(pa, b_band))
                return acc + max(2 * out_unit, pa + b_band + _as_rss(reading))
            if mode == "prefetch":
                reading = 2 * max(pa, pb)
            else:  # each request compressed + decoded, at most the panel twice
                reading = min(2 * max(band, request), max(pa, pb))
            return _as_rss(acc + max(2 * out_unit, pa + pb + reading))

        budget = self.budget.task_memory
        hard = (None, None) if out_grid is None else (out_grid.unit_edges(0),
                                                      out_grid.unit_edges(1))
        layouts = []  # every distinct layout that fits, for either read mode
        smallest = None
        for rows_c in layout.bases(a_spec, 0, m, hard[0]):
            for cols_c in layout.bases(b_spec, 1, n, hard[1]):
                step = max(min(max_interval(rows_c), max_interval(cols_c)), 1)
                # roughly square blocks (and 1:2 / 2:1), growing until they no longer fit
                modes = ("prefetch", "in-place") + (("stream",) if stream else ())
                # square blocks for a symmetric product: block pairs are computed once
                ratios = ((1, 1),) if gram and out is not None else ((1, 1), (1, 2), (2, 1))
                for mode, (fr, fc) in itertools.product(modes, ratios):
                    t, last = step, None
                    while True:
                        re, ce = group_edges(rows_c, t * fr), group_edges(cols_c, t * fc)
                        if (re, ce) != last:
                            mem = memory(re, ce, mode)
                            if mem <= budget:
                                layouts.append((re, ce, mem, mode))
                            elif smallest is None or mem < smallest[2]:
                                smallest = (re, ce, mem, mode)
                            last = (re, ce)
                        if mem > budget or t >= max(m, n):
                            break
                        t += step
        if slabs:  # one block, whole: every task is a diagonal (syrk) block
            mem = memory((0, m), (0, n), "slabs")
            if mem <= budget:
                layouts.append(((0, m), (0, n), mem, "slabs"))
            elif smallest is None or mem < smallest[2]:
                smallest = ((0, m), (0, n), mem, "slabs")
        if not layouts:
            self._check_fits("matmul", smallest[2], str(node))

        def n_of(lay):
            return (len(lay[0]) - 1) * (len(lay[1]) - 1)

        def reads_of(lay):  # elements read: A once per block column, B once per block row
            return m * k * (len(lay[1]) - 1) + k * n * (len(lay[0]) - 1)

        def rank(lay):  # least read, then fewest tasks, then prefetch > stream > in place
            return (reads_of(lay), n_of(lay),
                    ("prefetch", "stream", "in-place", "slabs").index(lay[3]))

        best = min(layouts, key=rank)
        threads = self.budget.total_threads
        split_every = int(_config.get("reduction.split-every"))
        k_split = (0, k)
        if 0 < n_of(best) < threads and k > 0:
            # too few blocks for the workers: split K (tree-summing partial
            # blocks) if the sums fit, else use smaller blocks
            acc = max_interval(best[0]) * max_interval(best[1]) * dtype.itemsize
            parts = math.ceil(threads / n_of(best))
            combine = _as_rss((min(split_every, parts) + 2) * acc)
            if combine <= budget:
                k_split = split_points(a_units, b_units, parts)
                best = (*best[:2], max(best[2], combine), best[3])
            else:
                enough = [lay for lay in layouts if n_of(lay) >= threads]
                if enough:
                    best = min(enough, key=rank)
        row_edges, col_edges, peak, mode = best
        read_bytes = None if mode == "prefetch" else band
        slab = slab_rows if mode == "slabs" else None
        if len(k_split) > 2:  # panels never straddle a split point
            a_k = tuple(sorted(set(a_k) | set(k_split)))
            b_k = tuple(sorted(set(b_k) | set(k_split)))
        token = tokenize("matmul", a_spec, b_spec, row_edges, col_edges, k_split, str(out), deps)
        name = "matmul-" + token
        a_costs = layout.BlockCosts(a_spec, row_edges, a_k)
        # streaming reads B in bands split at its column units and the block edges
        b_edges = tuple(sorted(set(col_edges) | set(b_cols))) if mode == "stream" \
            else col_edges
        b_at = {e: q for q, e in enumerate(b_edges)}
        b_costs = layout.BlockCosts(b_spec, b_k, b_edges)
        a_iv, b_iv = intervals(a_k), intervals(b_k)
        segments = []  # per K segment: its A and B panels and their index ranges
        for k0, k1 in (intervals(k_split) if k > 0 else [(0, 0)]):
            qa = [q for q, p in enumerate(a_iv) if k0 <= p[0] < k1]
            qb = [q for q, p in enumerate(b_iv) if k0 <= p[0] < k1]
            segments.append((compact(a_iv[q] for q in qa), compact(b_iv[q] for q in qb),
                             (qa[0], qa[-1] + 1) if qa else (0, 0),
                             (qb[0], qb[-1] + 1) if qb else (0, 0)))
        keys, blocks = [], []
        nbytes = nreq = gets = written = 0
        # X.T @ X, X @ X.T into storage: the result is symmetric, so each pair of
        # blocks (i, j), (j, i) is computed once and written twice
        sym = gram and out is not None and len(k_split) <= 2 and row_edges == col_edges
        for i, rows in enumerate(intervals(row_edges)):
            for j, cols in enumerate(intervals(col_edges)):
                if sym and i > j:
                    continue
                if out_grid is not None and _all_done(out_grid, rows, cols, skip) and (
                        not sym or _all_done(out_grid, cols, rows, skip)):
                    continue
                parts = []
                j0, j1 = b_at[cols[0]], b_at[cols[1]]
                b_bands = compact(intervals(b_edges[j0 : j1 + 1])) if mode == "stream" else None
                for s, (pa, pb, qa, qb) in enumerate(segments):
                    if not gmm.is_gram(a_spec, b_spec, rows, cols, pa, pb):
                        b, r, g = a_costs.band(0, i, *qa)
                        nbytes, nreq, gets = nbytes + b, nreq + r, gets + g
                    for jj in range(j0, j1):
                        b, r, g = b_costs.band(1, jj, *qb)
                        nbytes, nreq, gets = nbytes + b, nreq + r, gets + g
                    args = (a_spec, b_spec, rows, cols, pa, pb, dtype)
                    if len(k_split) <= 2 and out is not None:
                        key = (name, i, j)
                        store = gmm.matmul_store_pair if sym and i < j else gmm.matmul_store
                        self.graph[key] = (store, *args, out, deps, read_bytes, b_bands, slab)
                    else:
                        key = (name + "-part", i, j, s)
                        self.graph[key] = (gmm.matmul_block, *args, deps, read_bytes, b_bands,
                                           slab)
                    parts.append(key)
                if len(parts) > 1 or (out is None and len(k_split) > 2):
                    root = tree(
                        parts, split_every,
                        lambda level, q, i=i, j=j: (name + "-sum", i, j, level, q),
                        lambda children: (gmm.sum_partials, *children), self.graph)
                    parts = [root]
                key = parts[0]
                if out is not None and len(k_split) > 2:
                    sk = (name, i, j)
                    self.graph[sk] = (gmm.store_partials, out, rows, cols, key)
                    key = sk
                if out is not None:
                    written += (rows[1] - rows[0]) * (cols[1] - cols[0]) * dtype.itemsize \
                        * (2 if sym and i < j else 1)
                keys.append(key)
                blocks.append((rows, cols))
        flops = 2 * m * n * k
        sym_txt = ", symmetric: each block pair computed once, diagonal blocks by syrk" \
            if gram else ""
        itemsize = max(np.dtype(node.a.dtype).itemsize, np.dtype(node.b.dtype).itemsize)
        lb = int(flops / math.sqrt(max(budget, 1) / itemsize) * itemsize) if flops else 0
        # and every input is read at least once (the bound's leading term is below
        # that for tall-skinny products)
        once = {tokenize(leaf): leaf.grid.shape[0] * leaf.grid.shape[1] * leaf.dtype.itemsize
                for leaf in leaves(a_spec) + leaves(b_spec)}
        lb = max(lb, sum(once.values())) if flops else 0
        ksplit_txt = f", K split in {len(k_split) - 1}" if len(k_split) > 2 else ""
        self.stages.append(Stage(
            "matmul", f"{_short(node)}: output blocks up to {max_interval(row_edges)}x"
            f"{max_interval(col_edges)}, K panels A {ka} / B {kb}{ksplit_txt}{sym_txt}, "
            + {"prefetch": "next panel prefetched",
               "stream": f"A panels read in place, B streamed in bands of {max_interval(b_cols)}"
                         " columns",
               "in-place": "panels read in place",
               "slabs": f"X decoded in row slabs of {slab} rows, never a whole chunk "
                        f"({format_bytes(slab_mem)} of slab and decoder buffers)"}[mode]
            + ("" if mode in ("prefetch", "slabs")
               else f" (requests <= {format_bytes(read_bytes)})"),
            len(keys) * max(len(k_split) - 1, 1), peak, nbytes, written, flops,
            io_lower_bound=lb or None, reads=nreq, store_gets=gets))
        return keys if out is not None else (keys, blocks)

    def _check_fits(self, kind: str, peak: int, what: str) -> None:
        if peak > self.budget.task_memory:
            raise _DoesNotFit(kind, peak, what, self.budget)


class _DoesNotFit(PlanningError):
    """One stage's smallest task is over the per-task budget."""

    def __init__(self, kind: str, peak: int, what: str, budget: Budget):
        super().__init__(f"{what}: the smallest {kind} task needs {format_bytes(peak)}")
        self.kind, self.peak, self.what, self.budget = kind, peak, what, budget
        self.need = budget.worker_memory_for(peak)

    def explain(self, original: Budget, need: int | None) -> PlanningError:
        """The refusal users see: against the budget they gave, with the
        smallest ``memory_per_worker`` under which *every* stage fits."""
        b = original
        where = f", the smallest worker {b.worker}" if b.worker else ""
        fix = (f"memory_per_worker >= {_round_up_mib(need)}, or with smaller tiles/shards"
               if need else "smaller tiles/shards")
        return PlanningError(
            f"{self.what}: the smallest {self.kind} task needs {format_bytes(self.peak)} but the "
            f"budget allows {format_bytes(b.task_memory)} per task ({format_bytes(b.memory_per_worker)}"
            f" per worker, {b.threads_per_worker} thread(s){where}); it would fit with {fix}"
        )


def _round_up_mib(nbytes: int) -> str:
    """A size users can pass back: whole MiB, rounded up (never below the need)."""
    return f"{-(-nbytes // 2**20)}MiB"


def _constant(value):
    return value, {}


def _barrier(*args):
    stats: dict = {}
    for a in args:
        st = a[1] if isinstance(a, tuple) else a
        stats = gmm.merge_stats(stats, st)
    return None, stats


def _dep_kind(small_shape: tuple, shape: tuple) -> str:
    if len(small_shape) == 0 or small_shape == (1, 1):
        return "scalar"
    if len(small_shape) == 1 or small_shape[0] == 1:
        return "row"
    return "col"


def _reads_only_stored(node) -> bool:
    """True if a big node is computed from stored arrays alone: no small
    operand (a reduction's result) and no matmul temporary below it."""
    if isinstance(node, MatMul) or (isinstance(node, Node) and node.small):
        return False
    children = [getattr(node, c, None) for c in ("x", "a", "b")] + list(getattr(node, "args", ()))
    return all(_reads_only_stored(c) for c in children if isinstance(c, Node))


def _panels(edges) -> tuple[int, ...]:
    return group_edges(edges, max(MIN_PANEL, 1))


def _op_temporaries(spec) -> int:
    """Arrays a region evaluation makes beyond the reads themselves."""
    from ..graphs.spec import leaves

    return max(n_temporaries(spec) - len(leaves(spec)), 0)


def _as_rss(allocated: int) -> int:
    """Resident memory for ``allocated`` bytes of buffers: the allocator keeps
    some freed memory (measured here: worker RSS 10-20% above traced peaks)."""
    return int(allocated * float(_config.get("memory.allocator-overhead")))


def _io_overhead(a_spec, b_spec, out_grid, dtype) -> int:
    """Zarr's own buffers: up to ``async.concurrency`` chunks in flight, each
    held compressed and decoded, on the read side and on the write side."""
    import zarr

    from ..graphs.spec import leaves

    tiles = [leaf.grid.tile[0] * leaf.grid.tile[1] * leaf.dtype.itemsize
             for leaf in leaves(a_spec) + leaves(b_spec)]
    if out_grid is not None:
        tiles.append(out_grid.tile[0] * out_grid.tile[1] * np.dtype(dtype).itemsize)
    return 2 * int(zarr.config.get("async.concurrency")) * max(tiles, default=0)


def _leaf_itemsize(spec) -> int:
    from ..graphs.spec import leaves

    return max((leaf.dtype.itemsize for leaf in leaves(spec)), default=8)


def _band_bytes(a_spec, b_spec, panel_width: int, task_memory: int) -> int:
    """Read request bound when panels are read in place, band by band: one
    unit deep across the panel's width, at most an eighth of the task's
    memory, and never less than one whole unit (units are never split)."""
    from ..graphs.spec import leaves

    out = 0
    for leaf in leaves(a_spec) + leaves(b_spec):
        u0, u1 = leaf.grid.unit
        unit = u0 * u1 * leaf.dtype.itemsize
        wide = max(u0, u1) * max(panel_width, min(u0, u1)) * leaf.dtype.itemsize
        out = max(out, unit, min(wide, task_memory // 8))
    return out


def _per_element(spec, dtype: np.dtype) -> int:
    """Projected bytes per output element of evaluating a region of ``spec``:
    each read twice (compressed + decoded), plus every temporary."""
    from ..graphs.spec import leaves

    reads_ = sum(2 * leaf.dtype.itemsize for leaf in leaves(spec))
    return reads_ + (n_temporaries(spec) * max(dtype.itemsize, 8) if dtype.itemsize > 1 else 0)


def _all_done(grid: Grid, rows, cols, done) -> bool:
    if not done:
        return False
    return all((i, j) in done for i in grid.units_touching(0, rows)
               for j in grid.units_touching(1, cols))


def _short(node) -> str:
    s = str(node)
    return s if len(s) < 90 else s[:87] + "..."


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
    plan = Plan(str(node), tuple(node.shape), str(node.dtype), budget, tuple(low.stages),
                str(out) if out else None)
    skipped = len(skip)
    return Lowered(plan, low.graph, keys, result, blocks, low.creates, skipped,
                   low.stat_keys(keys if result == "small" else []))


def output_grid(node, tile, shard) -> Grid:
    """Output grid: the given tile, else the tiling of the inputs it derives from."""
    if tile is None:
        if isinstance(node, MatMul):
            tile = (leaf_tile(node.a, 0), leaf_tile(node.b, 1))
        else:
            tile = (leaf_tile(node, 0), leaf_tile(node, 1))
        tile = tuple(max(min(t, max(n, 1)), 1) for t, n in zip(tile, node.shape, strict=True))
        how = "inherited from the inputs"
    else:
        how = "given"
    tile = tuple(int(t) for t in tile)
    if len(tile) != 2 or any(t <= 0 for t in tile):
        raise PlanningError(f"tile must be 2 positive integers, got {tile}")
    if shard is None:  # a tile larger than the array is clipped to it
        tile = tuple(min(t, max(n, 1)) for t, n in zip(tile, node.shape, strict=True))
    if shard is not None:
        shard = tuple(int(s) for s in shard)
        if len(shard) != 2 or any(s <= 0 or s % t for s, t in zip(shard, tile, strict=True)):
            hint = tuple(max(d for d in range(1, min(t, s) + 1) if s % d == 0) if s > 0 else 1
                         for s, t in zip(shard, tile, strict=False))
            raise PlanningError(
                f"shard {shard} is not a positive multiple of the tile {tile} ({how}); pass a "
                f"tile that divides the shard, e.g. tile={hint}"
            )
    return Grid.regular(node.shape, tile, shard)


def leaf_tile(node, axis: int, default: int = 1024) -> int:
    """Tile size along ``axis`` of the first stored array ``node`` reads."""
    if isinstance(node, Source):
        return node.grid.tile[axis]
    if isinstance(node, Transpose):
        return leaf_tile(node.x, 1 - axis, default)
    if isinstance(node, SliceNode):  # a strided slice's tile covers one parent tile
        return max(-(-leaf_tile(node.x, axis, default) // node.step[axis]), 1)
    if isinstance(node, MatMul):
        return leaf_tile(node.a if axis == 0 else node.b, axis, default)
    if isinstance(node, Elemwise):
        for a in node.args:
            if isinstance(a, Node) and not a.small:
                return leaf_tile(a, axis, default)
    return default
