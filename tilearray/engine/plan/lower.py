"""The planner: an expression and a Budget -> a :class:`~.types.Plan`, the
ordered list of stage records that ``compute()`` / ``to_zarr()`` run.

Pure: block sizes, read requests and memory are computed from array metadata
already held by the expression; nothing is read or written here. Each
operation is lowered by a pure function (:func:`~.map.lower_map`,
:func:`~.reduce.lower_reduce`, :func:`~.matmul.lower_matmul`, the small ops
below) from its node, its inputs' specs and the budget to a frozen
:class:`~.types.Stage`; :class:`Planner` only walks the expression, resolves
each node's inputs (stored arrays, small results of earlier stages,
temporaries) and orders the records. Arrays the run must create first
(outputs, temporaries for a matmul used inside another expression) are
listed in the plan's ``creates``.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import uuid

import numpy as np
from dask.base import tokenize
from dask.utils import format_bytes

from ... import _config
from ...errors import PlanningError
from ...graphs import elemwise as gel
from ...graphs import lu as glu
from ...graphs.emit import Tasks, barrier, constant
from ...graphs.reduction import VARIANCES
from ...graphs.spec import (
    Concat,
    Const,
    Dep,
    Gather,
    Index,
    Op,
    Position,
    Read,
    Slice,
    Trans,
    leaves,
    tagged,
    unit_edges,
)
from ...storage import ArrayRef, Grid
from ...storage.io import read_vector, store_small
from ...storage.stream import raw_streams
from ..expr import nodes as nd
from ..expr.nodes import (
    TSQR,
    Constant,
    Elemwise,
    Factor,
    MatMul,
    MatVec,
    Node,
    Reduce,
    SliceNode,
    Source,
    Transpose,
    describe,
    sources,
    structure,
)
from .cholesky import (
    chol_peak,
    cholesky_tile,
    incore_need,
    lower_cholesky,
    lower_incore,
    lower_logdiag,
    lower_symv,
    lower_trsolve,
)
from .lu import lower_lu, lower_lu_forward, lower_lu_slogdet, lu_width, rhs_group
from .map import check_fits, lower_map
from .matmul import lower_matmul
from .matvec import gram_form, lower_gram, lower_matvec, oriented
from .memory import as_rss
from .npfuncs import (
    lower_diagonal,
    lower_points,
    lower_quantile,
    lower_scan,
    lower_select,
    lower_sort,
    lower_unique,
    lower_values,
)
from .reduce import fusable_groups, lower_empty_reduce, lower_reduce, unshifted
from .sizing import (
    SHRINK_MIN,
    DoesNotFit,
    leaf_tile,
    output_grid,
    product_tile,
    short,
    shrink_tile,
)
from .tsqr import lower_tsqr
from .types import Budget, Create, Output, Plan, Stage


def lower_small_op(node: Node, fn_name: str, kwargs: tuple, inputs: list) -> Stage:
    """One in-memory NumPy op on small results (``inputs``: their keys or
    plain values): a 1-task "small" stage whose output ``"0"`` is its value
    and its own stats only (the planner gathers its inputs' apart)."""
    key = "small-" + tokenize(structure(node), inputs)
    work = Tasks()
    work.add(key, gel.small_op_alone, fn_name, kwargs, *inputs)
    return Stage("small", f"in-memory {node}", 1, 0, 0, work=work.freeze(),
                 outputs={"0": Output("value", (key,))})


def lower_store_small(node: Node, key, target: ArrayRef) -> Stage:
    """A worker writes the small result ``key`` into ``target`` (created by the run)."""
    nbytes = int(np.prod(node.shape, dtype=np.int64)) * np.dtype(node.dtype).itemsize
    skey = "store-small-" + tokenize(str(target), key)
    work = Tasks()
    work.add(skey, store_small, target, key)
    return Stage("store", f"a worker writes the {tuple(node.shape)} result into "
                 f"{str(target)!r}", 1, 0, 0, nbytes, work=work.freeze(),
                 outputs={"result": Output("store", (skey,))})


def lower_load(node: Source) -> Stage:
    """A stored 1-D array read whole by one task: a small operand like a
    reduction's result (output ``"0"``)."""
    key = "load-" + tokenize(str(node.ref), node.shape, str(node.dtype))
    work = Tasks()
    work.add(key, read_vector, node.ref, tuple(node.shape))
    nbytes = int(np.prod(node.shape, dtype=np.int64)) * np.dtype(node.dtype).itemsize
    return Stage("small", f"read {str(node.ref)!r} ({format_bytes(nbytes)}) into memory", 1,
                 nbytes, nbytes, reads=1, store_gets=node.grid.n_units, work=work.freeze(),
                 outputs={"0": Output("value", (key,))})


def result_stage(node: Node) -> Stage:
    """No task: ``compute()`` brings the small result to the driver."""
    if isinstance(node, TSQR) and node.part == "lstsq":  # NumPy's tuple
        (m, n), k = node.x.shape, node.y.shape[1]
        x = result_shape(node)
        nbytes = (n * k + k + min(m, n)) * np.dtype(node.dtype).itemsize + 4
        return Stage("result", f"compute() brings NumPy's lstsq tuple to the driver: x {x}, "
                     f"the residuals, the rank and the {min(m, n)} singular values "
                     f"({format_bytes(nbytes)})", 0, 0, 0)
    nbytes = int(np.prod(node.shape, dtype=np.int64)) * np.dtype(node.dtype).itemsize
    return Stage("result", f"compute() brings {format_bytes(nbytes)} to the driver", 0, 0, 0)


def result_shape(node: Node) -> tuple:
    """The shape a plan names for ``node``'s result: an lstsq's is its solution x's."""
    if isinstance(node, TSQR) and node.part == "lstsq":
        n, k = node.x.shape[1], node.y.shape[1]
        return (n,) if dict(node.options).get("vector") else (n, k)
    return tuple(node.shape)


LINES_COPY = 4
"""Exact quantiles reading their input more than this many times read a
copy of it in units one band wide instead (:meth:`Planner._lines_copy`)."""

GRAM_COPY = 4
"""A Gram product ``F.T @ F`` of an expression ``F`` (not a stored array)
reading more than this many times F's size is computed from a copy of F
instead (:meth:`Planner._gram_copy`)."""
MIN_GRAM_WIDTH = 64
"""Columns: the narrowest units of that copy tried."""


def _gram_widths(width: int, tile: int) -> list[int]:
    """Unit widths tried for the copy of a ``width``-column operand whose
    stored input has ``tile`` columns (along the operand's columns): F's
    width halved, and the tile halved (units inside one input tile each:
    halving 4001 columns never lines up with 1000-wide tiles, and a unit
    across two of them decodes both), down to :data:`MIN_GRAM_WIDTH`."""
    out: set[int] = set()
    for w in (width, min(tile, width)):
        while w >= 1:
            out.add(w)
            if w < 2 * MIN_GRAM_WIDTH:
                break
            w = -(-w // 2)
    return sorted(out, reverse=True)


class Planner:
    """Walks one expression and orders its stage records.

    Its state is the walk's own memo (the key of each small result, each
    matmul temporary, each rewritten reduction, the arrays read so far);
    the lowering functions it calls share none of it."""

    def __init__(self, budget: Budget, inner_shards: bool = False, shrink: bool = True,
                 temp_cap: int = 0):
        self.budget = budget
        self.inner_shards = inner_shards
        """Sharded inputs are read by inner chunks (byte ranges), not whole shards."""
        self.shrink = shrink
        """Temporaries' inherited tiles are halved until they fit (:func:`~.sizing.shrink_tile`)."""
        self.temp_cap = temp_cap
        """The longest side of a temporary's tile (0: none): a later stage
        reading the temporary may need smaller units than its producer."""
        self.stages: list[Stage] = []
        self.creates: list[Create] = []
        self._loose = Tasks()  # constants, barriers: counted with the next stage
        self._small: dict[str, str] = {}  # an expression's identity -> its key
        self._shifted: dict = {}  # id(var/std node) -> (node, its unshifted form)
        self._temps: dict[str, tuple] = {}
        self._refused: dict[str, DoesNotFit] = {}  # temporaries that do not fit, by identity
        self._idents: dict[int, tuple] = {}  # id -> (node, identity): kept alive
        self._read_leaves: set = set()  # stored arrays read by the stages so far
        self._dep_keys: list = []  # small keys big tasks read as operands
        self._stats_only: list = []  # keys stages gather for their figures only
        self._padded: tuple[int, str] = (0, "")  # the largest padded chunk read (padding)
        self.run_id = uuid.uuid4().hex

    def _ident(self, node: Node) -> str:
        """An expression's identity in the plan: equal for equal expressions
        built twice (the two ``X.mean(0)`` of ``(X - X.mean(0)).T @ (X -
        X.mean(0))``), so each small result and temporary is planned once."""
        if id(node) not in self._idents:  # the node is held: its id is never reused
            self._idents[id(node)] = (node, tokenize(structure(node)))
        return self._idents[id(node)][1]

    # -- records ----------------------------------------------------------------
    def add(self, stage: Stage, spec=None, deps=None) -> Stage:
        """Append ``stage``, with the loose tasks added since the previous one
        (so the plan's task total is the graph's size, which RunStats counts)
        and, for a stage reading ``spec``, a note when it reads again what an
        earlier stage read."""
        if self._padded[0] and stage.bytes_read:
            stage = self._with_padding(stage)
        loose, self._loose = self._loose.freeze(), Tasks()
        note = self._reread(spec, deps) if spec is not None else ""
        stage = dataclasses.replace(stage, description=stage.description + note,
                                    work=loose + stage.work, tasks=len(loose) + stage.tasks)
        self.stages.append(stage)
        self._stats_only += [k for name, o in stage.outputs.items()
                             if o.kind == "stats" or name == "factors" for k in o.keys]
        return stage

    def _note_padding(self, node: Source) -> None:
        """Remember ``node`` if its stored chunks reach past the array itself
        (chunks of 8000 x 8000 holding a 600 x 600 array): Zarr decodes each
        chunk whole, padding included, so a read of it holds the whole
        decoded chunk, which the blocks' figures (the array's own extent)
        leave out."""
        (m, n), (t0, t1) = node.grid.shape, node.grid.tile
        if t0 <= m and t1 <= n:
            return
        item = np.dtype(node.dtype).itemsize
        padded = (t0 * t1 - min(t0, m) * min(t1, n)) * item
        if padded > self._padded[0]:
            shape = (m,) if node.ndim == 1 else (m, n)
            chunks = (t0,) if node.ndim == 1 else (t0, t1)
            self._padded = (padded, f"{str(node.ref)!r} is stored in chunks of {chunks}, "
                                    f"larger than its {shape} shape; Zarr decodes a chunk "
                                    f"whole, {format_bytes(t0 * t1 * item)} each")

    def _with_padding(self, stage: Stage) -> Stage:
        """``stage`` (it reads stored arrays) holding the largest padded chunk's
        padding too (:meth:`_note_padding`); refused when that is over the
        budget, naming the array (a larger budget, or the array rechunked)."""
        peak = stage.peak_task_memory + as_rss(self._padded[0])
        if peak > self.budget.task_memory:
            raise DoesNotFit(stage.kind, peak, self.padding_advice(), self.budget)
        return dataclasses.replace(stage, peak_task_memory=peak)

    def padding_advice(self) -> str:
        """The largest padded chunk read (:meth:`_note_padding`) and what to
        do about it, or ""."""
        if not self._padded[0]:
            return ""
        return f"{self._padded[1]} (rechunk it, e.g. with zarr, to chunks no larger than the array)"

    def finish(self) -> None:
        """Tasks after the last stage are its own."""
        if len(self._loose) and self.stages:
            loose, self._loose = self._loose.freeze(), Tasks()
            last = self.stages[-1]
            self.stages[-1] = dataclasses.replace(last, work=last.work + loose,
                                                  tasks=last.tasks + len(loose))

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

    # -- specs ------------------------------------------------------------------
    def spec(self, node: Node, deps: list):
        """Spec for a 2-D node; small operands become ``Dep`` on their keys."""
        if isinstance(node, Source):
            self._note_padding(node)
            sharded = self.inner_shards and node.grid.sharded
            return Read(node.ref, node.grid.inner() if sharded else node.grid, node.dtype)
        if isinstance(node, Transpose):
            return Trans(self.spec(node.x, deps))
        if isinstance(node, SliceNode):
            return Slice(self.spec(node.x, deps), node.start, node.step)
        if isinstance(node, Elemwise) and not node.small:
            return Op(node.name, tuple(self._arg(a, deps, node.shape) for a in node.args),
                      node.kwargs)
        if isinstance(node, MatMul | TSQR | nd.Scan | nd.Sort | Factor) or (isinstance(node, MatVec)
                                                                and node.ndim == 2):
            read, wait = self._materialise(node)
            self._depend(wait, deps)  # wait for every block of the temporary
            return read
        if isinstance(node, nd.Concat):
            parts = tuple(tagged(self._arg(a, deps, node.shape), k)  # a small part: a Dep
                          for k, a in enumerate(node.args))
            offsets = tuple(np.cumsum([0] + [a.shape[node.axis] for a in node.args]).tolist())
            return Concat(parts, node.axis, offsets, np.dtype(node.dtype))
        if isinstance(node, nd.Take):
            inner = self.spec(node.x, deps)
            edges = unit_edges(inner, node.axis, node.x.shape[node.axis])
            return Gather(inner, node.axis, Index(node.index), edges, np.dtype(node.dtype))
        if isinstance(node, nd.Full):
            return Const(np.dtype(node.dtype).type(node.fill))
        if isinstance(node, nd.Positions):
            return Position(node.axis)
        if isinstance(node, nd.Outer):  # a column times a row, both small
            return Op("multiply", (Dep(self._depend(self.small(node.a), deps), "col"),
                                   Dep(self._depend(self.small(node.b), deps), "row")))
        raise PlanningError(f"cannot tile {node}")

    def _depend(self, key, deps: list) -> int:
        if key not in deps:
            deps.append(key)
        if key not in self._dep_keys:
            self._dep_keys.append(key)
        return deps.index(key)

    def _arg(self, a, deps: list, shape):
        if not isinstance(a, Node):
            return Const(a)
        if not a.small:
            return self.spec(a, deps)
        kind = _dep_kind(a.shape, shape)
        nbytes = int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize if kind == "block" else 0
        return Dep(self._depend(self.small(a), deps), kind, nbytes)

    def _materialise(self, node: MatMul | TSQR | Factor) -> tuple:
        """A matmul (or a TSQR's Q / U, a Cholesky factor) inside another
        expression: computed into a temporary array first; returns its
        ``Read`` and the key of the barrier after its blocks."""
        ident = self._ident(node)
        if ident in self._temps:
            return self._temps[ident]
        if ident in self._refused:
            # refused once under this budget, refused again: without this, each
            # tile an enclosing product tried re-planned the whole subexpression,
            # and nested products (power iterations) took exponential time
            raise self._refused[ident]
        if isinstance(node, MatMul):
            tile = product_tile(node)
        elif isinstance(node, MatVec):
            tile = (leaf_tile(node.a, 0), max(node.shape[1], 1))
        elif isinstance(node, nd.Scan | nd.Sort):
            tile = (leaf_tile(node, 0), leaf_tile(node, 1))
        elif isinstance(node, Factor):  # square units the planner picks under the budget
            tile = (cholesky_tile(node, self.spec(node.x, []), self.budget)[1],) * 2
        else:
            tile = (leaf_tile(node.x, 0), max(node.shape[1], 1))
        if self.temp_cap and not isinstance(node, Factor):
            tile = tuple(min(t, self.temp_cap) for t in tile)
        lowering = {MatMul: self.matmul, MatVec: self.matvec, nd.Scan: self.scan,
                    nd.Sort: self.sort, Factor: self.factor}.get(type(node), self.tsqr)

        def attempt(t):
            mark = len(self.creates)
            ref, grid = self._temporary(node, t)
            try:
                return ref, grid, lowering(node, ref, grid)
            except DoesNotFit:
                del self.creates[mark]  # this tile's temporary is not made
                raise

        # the Cholesky factor's unit is already sized to the budget
        try:
            ref, grid, stage = attempt(tile) if isinstance(node, Factor) or not self.shrink \
                else shrink_tile(tile, attempt)
        except DoesNotFit as e:
            self._refused[ident] = e
            raise
        token = tokenize(structure(node), self.run_id)
        wait = self._loose.add("barrier-" + token, barrier, *stage.outputs["result"].keys)
        self._temps[ident] = (Read(ref, grid, np.dtype(node.dtype)), wait)
        return self._temps[ident]

    def _temporary(self, node: Node, tile: tuple, part: str = "", shape=None) -> tuple:
        """A temporary array for ``node`` (or its ``part`` of ``shape``; unique
        per run: concurrent runs never share or delete one), created by the
        run: ``(ref, grid)``."""
        shape = tuple(node.shape if shape is None else shape)
        token = tokenize(structure(node), self.run_id, *([part] if part else []))
        base = _config.get("temporary-directory") or tempfile.gettempdir()
        ref = ArrayRef.from_location(os.path.join(base, f"tilearray-tmp-{token}.zarr"))
        self.creates.append(Create(ref, shape, node.dtype, tile, None, temporary=True))
        return ref, Grid.regular(shape, tile)

    # -- the operations -----------------------------------------------------------
    def matmul(self, node: MatMul, out=None, out_grid=None, skip=frozenset()) -> Stage:
        deps: list = []
        a_spec, b_spec = self.spec(node.a, deps), self.spec(node.b, deps)
        try:
            stage = lower_matmul(node, a_spec, b_spec, deps, self.budget, out, out_grid, skip)
        except DoesNotFit as e:
            stage, refused = None, e
        if a_spec == Trans(b_spec) and not isinstance(b_spec, Read):
            copied = self._gram_copy(node, b_spec, deps, stage, out, out_grid, skip)
            if copied is not None:
                return copied
        if stage is None:
            raise refused
        return self.add(stage)

    def _gram_copy(self, node: MatMul, spec, deps: list, stage: Stage | None, out, out_grid,
                   skip) -> Stage | None:
        """``F.T @ F`` (``F = node.b``, evaluated as ``spec``) from a temporary
        copy of F, where the product of F itself reads F more than
        :data:`GRAM_COPY` times or does not fit (its blocks, small beside
        the inputs' units, each read whole units: ``np.cov`` of 4000² in
        1000² chunks at 200 MiB a worker read 8.11 GiB). The copy is stored
        raw in units of F's rows by the width (:func:`_gram_widths`) whose
        copy's reads and writes plus the product's reads are least; its
        diagonal blocks are then decoded in row slabs like a stored X's.
        Returns the product's stage (the copy's added first), or None when
        the copy does not read less."""
        x, dtype = node.b, np.dtype(node.b.dtype)
        if stage is not None and \
                stage.bytes_read <= GRAM_COPY * int(np.prod(x.shape)) * dtype.itemsize:
            return None
        mark = len(self.creates)
        wait = "barrier-" + tokenize(structure(node), self.run_id, "gram")
        rows, best = min(leaf_tile(x, 0), x.shape[0]), None
        for width in _gram_widths(x.shape[1], leaf_tile(x, 1)):
            ref, grid = self._temporary(x, (rows, width), "gram")
            del self.creates[mark:]  # only the chosen width's is made
            temp = Read(ref, Grid.regular(grid.shape, grid.tile, row_slabs=raw_streams(dtype)),
                        dtype)
            try:
                copy = lower_map(x, spec, deps, self.budget, ref, grid)
                gram = lower_matmul(node, Trans(temp), temp, [wait], self.budget, out, out_grid,
                                    skip)
            except DoesNotFit:
                gram = None
            if gram is not None:
                cost = copy.bytes_read + copy.bytes_written + gram.bytes_read
                if best is None or cost < best[0]:
                    best = (cost, width, copy, gram)
        if best is None or (stage is not None and best[0] >= stage.bytes_read):
            return None
        _, width, copy, gram = best
        self._temporary(x, (rows, width), "gram")
        self._add_copy(copy, spec, deps, wait)
        return self.add(gram)

    def _add_copy(self, copy: Stage, spec, deps: list, wait: str) -> list:
        """Add ``copy``, the stage writing a temporary copy of an operand, and
        its barrier ``wait``; returns the deps of a stage reading the copy."""
        self.add(copy, spec, deps)
        self._loose.add(wait, barrier, *copy.outputs["result"].keys)
        later: list = []
        self._depend(wait, later)
        return later

    def matvec(self, node: MatVec, out=None, out_grid=None, skip=frozenset(),
               value: bool = False) -> Stage:
        """``node``'s pass over its stored operand; its small operand is
        resolved first (one task holds it) and read by every block task.
        ``X.T @ (X @ w)`` and ``X @ (X.T @ w)`` computed to a value read X
        once when a whole panel of X fits a task (else ``X @ w`` is joined
        first and X read again)."""
        gram = gram_form(node) if out is None else None
        if gram is not None:
            inner, axis = gram
            deps = []
            w_index = self._depend(self.small(inner.w), deps)
            spec = self.spec(inner.a if axis == 0 else node.a, deps)
            try:
                return self.add(lower_gram(node, axis, spec, w_index, deps, self.budget),
                                spec, deps)
            except DoesNotFit:
                pass
        deps: list = []
        w_index = self._depend(self.small(node.w), deps)
        spec = self.spec(node.a, deps)
        _, transposed, _ = oriented(node)
        if transposed and not node.small and node.ndim == 2 and not value:
            if out is not None:
                raise PlanningError(f"{node}: a product of a small matrix with a transposed "
                                    "array is written as its transpose: store (a @ w.T) "
                                    "and use its .T")
            value = True  # compute(): joined in one task
        return self.add(lower_matvec(node, spec, w_index, deps, self.budget, out, out_grid,
                                     skip, value), spec, deps)

    def tsqr(self, node: TSQR, out=None, out_grid=None, skip=frozenset()) -> Stage:
        """The TSQR stages of ``node`` over ``[x | y]`` (``y`` stored, or a small
        in-memory operand split by rows); returns the last."""
        deps: list = []
        specs, widths = [self.spec(node.x, deps)], [node.x.shape[1]]
        if node.y is not None:
            y = node.y
            specs.append(self.spec(y, deps) if not y.small
                         else Dep(self._depend(self.small(y), deps), "block"))
            widths.append(y.shape[1])
        for stage in lower_tsqr(node, specs, widths, deps, self.budget, out, out_grid, skip):
            last = self.add(stage)
        return last

    def factor(self, node: Factor, out=None, out_grid=None, skip=frozenset()) -> Stage:
        """The stages of a Cholesky factor ("L": into ``out``, or a temporary
        whose tiles ``compute()`` gathers), a triangular solve, a slogdet
        from a factor's diagonal or a one-task dense routine; returns the last."""
        deps: list = []
        spec = self.spec(node.x, deps)
        if node.part == "L":
            if out is None:
                b, u = cholesky_tile(node, spec, self.budget)
                out, out_grid = self._temporary(node, (u, u))
                return self.add(lower_cholesky(node, spec, deps, self.budget, b, out, out_grid,
                                               keep=True))
            b, _ = cholesky_tile(node, spec, self.budget, _square_unit(node, out_grid))
            return self.add(lower_cholesky(node, spec, deps, self.budget, b, out, out_grid,
                                           skip))
        if node.part == "logdiag":
            return self.add(lower_logdiag(node, spec, deps))
        rhs, y_spec = None, None
        if node.y is not None and node.y.small:
            rhs = self.small(node.y)
            y_spec = Dep(self._depend(rhs, deps), "block")
        elif node.y is not None:
            y_spec = self.spec(node.y, deps)
        if node.part == "trsolve":
            return self.add(lower_trsolve(node, spec, y_spec, deps, self.budget))
        if node.part == "symv":
            return self.add(lower_symv(node, spec, y_spec, deps, self.budget))
        if dict(node.options)["op"] in ("solve", "slogdet") and \
                incore_need(node, spec, y_spec)[0] > self.budget.task_memory:
            return self._lu(node, spec, y_spec, deps)
        return self.add(lower_incore(node, spec, y_spec, deps, self.budget))

    def _lu(self, node: Factor, spec, y_spec, deps: list) -> Stage:
        """A general solve or slogdet too large for one task: LU by column
        panels into two temporaries (L, U), then ``L y = P b`` and ``U x = y``."""
        b = lu_width(node, spec, self.budget)
        l_ref, grid = self._temporary(node, (b, b), "L", node.x.shape)
        u_ref, _ = self._temporary(node, (b, b), "U", node.x.shape)
        panels = self.add(lower_lu(node, spec, deps, self.budget, b, l_ref, u_ref, grid))
        keys = panels.outputs["panels"].keys
        if dict(node.options)["op"] == "slogdet":
            return self.add(lower_lu_slogdet(node, keys))
        opts = tuple(sorted({"lower": False, "trans": False, "unit": False,
                             "vector": bool(dict(node.options).get("vector"))}.items()))
        n, ncols = node.y.shape[0], node.y.shape[1]
        g = rhs_group(n, b, ncols, np.dtype(node.dtype).itemsize, self.budget)
        solved = []
        for c0 in range(0, ncols, g):  # column groups of the right-hand sides, each on its own
            cols = (c0, min(c0 + g, ncols))
            fwd = self.add(lower_lu_forward(node, y_spec, deps, l_ref, grid, keys, b,
                                            self.budget, cols))
            y, shape = node.y, node.shape  # (a vector's x is 1-D)
            if g < ncols:
                y = SliceNode((n, cols[1] - c0), node.y.dtype, node.y, (0, c0), (1, 1))
                shape = y.shape
            back = Factor(shape, node.dtype, node.x, "trsolve", y, opts)
            tdeps = [keys[-1], fwd.outputs["last"].keys[0]]
            last = self.add(lower_trsolve(back, Read(u_ref, grid, np.dtype(node.dtype)),
                                          Dep(1, "block"), tdeps, self.budget,
                                          label="U x = y (U of the LU factors)"))
            solved.append(last.outputs["0"].keys[0])
        if len(solved) == 1:
            return last
        work, peak = Tasks(), as_rss(2 * n * ncols * np.dtype(node.dtype).itemsize)
        check_fits("join", peak, f"{short(node)}: the solutions of {len(solved)} groups of "
                   f"{g} right-hand sides joined in one task", self.budget, tiles_help=False)
        key = work.add("lu-join-" + tokenize(solved), glu.join_columns, *solved)
        return self.add(Stage("small", f"the {len(solved)} groups of {g} right-hand sides' "
                              "solutions side by side", 1, peak, 0, work=work.freeze(),
                              outputs={"0": Output("value", (key,))}))

    def map(self, node: Node, out=None, out_grid=None, skip=frozenset()) -> Stage:
        deps: list = []
        spec = self.spec(node, deps)
        return self.add(lower_map(node, spec, deps, self.budget, out, out_grid, skip), spec, deps)

    def scan(self, node, out=None, out_grid=None, skip=frozenset()) -> Stage:
        """``cumsum``/``cumprod``: :func:`~.npfuncs.lower_scan`'s two stages."""
        deps: list = []
        spec = self.spec(node.x, deps)
        stages, carries = lower_scan(node, spec, deps, self.budget, out, out_grid, skip)
        for st in stages:
            last = self.add(st, spec, deps)
        for key in carries:
            if key not in self._dep_keys:
                self._dep_keys.append(key)
        return last

    def sort(self, node, out=None, out_grid=None, skip=frozenset()) -> Stage:
        """``np.sort`` / ``np.argsort`` along an axis: :func:`~.npfuncs.lower_sort`."""
        deps: list = []
        spec = self.spec(node.x, deps)
        return self.add(lower_sort(node, spec, deps, self.budget, out, out_grid, skip), spec,
                        deps)

    def _lines(self, node) -> str:
        """A diagonal, exact quantiles, the values in an interval or the
        distinct values: one stage, its joined small value."""
        deps: list = []
        spec = self.spec(node.x, deps)
        lowering = {nd.Diagonal: lower_diagonal, nd.Values: lower_values,
                    nd.Unique: lower_unique}.get(type(node), lower_quantile)
        stage = lowering(node, spec, deps, self.budget)
        if isinstance(node, nd.Quantile):
            stage, spec, deps = self._lines_copy(node, stage, spec, deps)
        return self.add(stage, spec, deps).outputs["0"].keys[0]

    def _lines_copy(self, node: nd.Quantile, stage: Stage, spec, deps: list) -> tuple:
        """``(stage, spec, deps)`` of exact quantiles: ``stage`` as lowered, or,
        where its bands of whole lines read the input more than
        :data:`LINES_COPY` times (a band narrower than a unit reads the whole
        unit), the quantiles of a temporary copy whose units are one band
        wide, the copy's stage added first. A median along the rows of a
        2,000,000 x 256 matrix in 65536 x 256 chunks at 1 GiB a worker read
        122 GiB (bands of 12 columns, each reading whole 256-wide units);
        through the copy, 7.63 GiB read and 3.81 GiB written."""
        x, ax = node.x, node.axis
        x_bytes = int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize
        if stage.bytes_read <= LINES_COPY * x_bytes:
            return stage, spec, deps
        width = max(self.budget.task_memory // max(x.shape[ax] * 16, 1), 1)
        along = min(leaf_tile(x, ax), x.shape[ax])
        mark = len(self.creates)
        wait = "barrier-" + tokenize(structure(node), self.run_id, "lines")
        copy = None
        while copy is None:  # units as wide as the bands that fit: each read once
            del self.creates[mark:]
            ref, grid = self._temporary(x, (along, width) if ax == 0 else (width, along),
                                        "lines")
            temp = Read(ref, grid, np.dtype(x.dtype))
            try:
                lines = lower_quantile(node, temp, [wait], self.budget)
                if lines.bytes_read > 1.1 * x_bytes and width > 1:
                    width //= 2
                    continue
                copy = lower_map(x, spec, deps, self.budget, ref, grid)
            except DoesNotFit:
                break
        if copy is None or copy.bytes_read + copy.bytes_written + lines.bytes_read \
                >= stage.bytes_read:
            del self.creates[mark:]  # the copy is not made
            return stage, spec, deps
        return lines, temp, self._add_copy(copy, spec, deps, wait)

    def _unshifted(self, node: Reduce) -> Reduce:
        """:func:`~.reduce.unshifted`, once per node (the plan text names the rewrite)."""
        if id(node) not in self._shifted:
            self._shifted[id(node)] = (node, unshifted(node))
        return self._shifted[id(node)][1]

    def _reduce_pass(self, nodes: list[Reduce], specs: list, deps: list) -> list:
        shifts = [str(orig) for orig, new in self._shifted.values()
                  if new is not orig and any(new is r for r in nodes)]
        note = (f" ({', '.join(shifts)}: computed unshifted, as a shift constant along the "
                "reduced axis leaves the variance unchanged)") if shifts else ""
        joint = specs[0] if len(specs) == 1 else Op("fused", tuple(specs))
        stage = self.add(lower_reduce(nodes, specs, deps, self.budget, note), joint, deps)
        return [stage.outputs[str(q)].keys[0] for q in range(len(nodes))]

    def fuse_reductions(self, root: Node) -> None:
        """Lower together the reductions of ``root`` that can share a pass
        (:func:`~.reduce.fusable_groups`)."""
        for group in fusable_groups(root, lambda x: self.spec(x, []), self._unshifted):
            unique = {self._ident(r): (r, sp) for r, sp in group}  # one of equal ones
            keys = self._reduce_pass([self._unshifted(r) for r, _ in unique.values()],
                                     [sp for _, sp in unique.values()], [])
            self._small.update(zip(unique, keys, strict=True))

    def small(self, node: Node) -> str:
        """The key of a small (in-memory) result, lowering what it needs first."""
        if self._ident(node) in self._small:
            return self._small[self._ident(node)]
        if isinstance(node, Constant):
            key = self._loose.add("const-" + node.token, constant, node.value)
        elif isinstance(node, Reduce) and not node.x.small and node.x.ndim == 2:
            key = self._reduce(self._unshifted(node))
        elif isinstance(node, TSQR):
            key = self.tsqr(node).outputs["R"].keys[0]
        elif isinstance(node, Factor):
            key = self.factor(node).outputs["0"].keys[0]
        elif isinstance(node, MatVec):
            key = self.matvec(node, value=True).outputs["0"].keys[0]
        elif isinstance(node, Source):  # a stored 1-D array
            self._note_padding(node)
            key = self.add(lower_load(node)).outputs["0"].keys[0]
        elif isinstance(node, nd.Diagonal | nd.Quantile | nd.Values | nd.Unique) \
                and not node.x.small:
            key = self._lines(node)
        elif isinstance(node, nd.Points):
            deps = []
            spec = self.spec(node.x, deps)
            key = self.add(lower_points(node, spec, deps, self.budget), spec,
                           deps).outputs["0"].keys[0]
        elif isinstance(node, nd.Select):
            deps: list = []
            x_spec = self.spec(node.x, deps)
            mask_spec = self.spec(node.mask, deps) if not node.mask.small else \
                Dep(self._depend(self.small(node.mask), deps), "block")  # a NumPy mask
            stage = lower_select(node, x_spec, mask_spec, deps, self.budget)
            key = self.add(stage, Op("fused", (x_spec, mask_spec)), deps).outputs["0"].keys[0]
        else:
            key = self.add(self._small_op(node)).outputs["0"].keys[0]
            # it counts itself only: each operand's stats are gathered once on
            # their own, however many small ops share it (v[1:] - v[:-1])
            for c in [getattr(node, "x", None), *getattr(node, "args", ())]:
                k = self._small.get(self._ident(c)) if isinstance(c, Node) else None
                if k is not None and k not in self._stats_only:
                    self._stats_only.append(k)
        self._small[self._ident(node)] = key
        return key

    def _reduce(self, node: Reduce) -> str:
        if 0 in node.x.shape:  # nothing to read: NumPy's answer for an empty array
            return self.add(lower_empty_reduce(node)).outputs["0"].keys[0]
        deps: list = []
        spec = self.spec(node.x, deps)
        return self._reduce_pass([node], [spec], deps)[0]

    def _small_op(self, node: Node) -> Stage:
        if isinstance(node, Reduce):
            kwargs = {"axis": node.axis, "keepdims": node.keepdims}
            if node.op in VARIANCES:
                kwargs["ddof"] = node.ddof
            return lower_small_op(node, node.op, tuple(kwargs.items()), [self.small(node.x)])
        if isinstance(node, Elemwise):
            args = [self.small(a) if isinstance(a, Node) else a for a in node.args]
            return lower_small_op(node, node.name, node.kwargs, args)
        if isinstance(node, Transpose) and node.x.small:
            return lower_small_op(node, "transpose", (), [self.small(node.x)])
        if isinstance(node, nd.Take) and node.x.small:
            kwargs = (("indices", node.index), ("axis", node.axis))
            return lower_small_op(node, "take", kwargs, [self.small(node.x)])
        if isinstance(node, nd.Quantile) and node.x.small:
            q = np.asarray(node.q) if not node.scalar_q else node.q[0]
            kwargs = (("q", q), ("axis", node.axis), ("method", node.method)) \
                if not node.op.endswith("median") else (("axis", node.axis),)
            return lower_small_op(node, node.op, kwargs, [self.small(node.x)])
        if isinstance(node, SliceNode) and node.x.small:
            kwargs = (("shape", tuple(node.shape)), ("start", node.start), ("step", node.step))
            return lower_small_op(node, "slice2d", kwargs, [self.small(node.x)])
        raise PlanningError(f"cannot compute {node} in memory")

    def stat_keys(self, gathered: list) -> list:
        """Keys to gather for their stats alone: operands of big tasks and of
        small ops, and stages' stats-only outputs, not already ``gathered``.
        Every task's figures reach the run's totals through exactly one
        gathered key (small ops do not merge their operands')."""
        seen, out = set(gathered), []
        for k in self._dep_keys + self._stats_only:
            if k not in seen:
                seen.add(k)
                out.append(k)
        return out


def _square_unit(node: Factor, grid) -> int:
    """The Cholesky tile of an output grid: its I/O unit, which must be square."""
    u = grid.unit
    if u[0] != u[1]:
        raise PlanningError(
            f"{node}: a Cholesky factor is written in square tiles, but the output's I/O unit "
            f"is {u[0]} x {u[1]}; pass tile=(b, b) (and a square shard, if any)")
    return u[0]


def _dep_kind(small_shape: tuple, shape: tuple) -> str:
    if len(small_shape) == 0 or small_shape == (1, 1):
        return "scalar"
    if len(small_shape) == 1 or small_shape[0] == 1:
        return "row"
    if small_shape[1] != 1:  # an in-memory matrix of the expression's shape
        return "block"
    return "col"


def lower(node, budget, out=None, out_grid=None, skip=()) -> Plan:
    """Plan ``node`` against ``budget`` (pure): the stage records, named
    outputs, arrays to create and keys to gather. ``out``: the target array
    (a matrix written into ``out_grid``, units in ``skip`` already done; a
    small result written by one task); None to return the result.

    Raises PlanningError when a task cannot fit, naming the smallest
    ``memory_per_worker`` under which the whole expression fits (later stages
    may need more than the first one refused, so it plans again with each
    stage's need until all fit; then the least budget between the refused one
    and that which plans, by bisection).
    """
    skip = frozenset(skip)
    try:
        return _lower_retried(node, budget, out, out_grid, skip)
    except DoesNotFit as first:
        err, need = first, None
        for _ in range(16):
            try:  # inherited tiles kept as they are: a search of its own at each trial
                _lower_best(node, dataclasses.replace(budget, memory_per_worker=err.need), out,
                            out_grid, skip, shrink=False)
                need = err.need
                break
            except DoesNotFit as again:
                if again.need <= err.need:  # no budget helps (e.g. a fixed overhead)
                    break
                err = again
        if need is not None:
            need = _least_fitting(node, budget, out, out_grid, skip, need)
        raise first.explain(budget, need, err) from None


def _lower_retried(node, budget, out, out_grid, skip: frozenset) -> Plan:
    """:func:`_lower_best`, then, if a stage reading a temporary refused, again
    with the temporaries' tile halved until it fits; else the first refusal."""
    try:
        return _lower_best(node, budget, out, out_grid, skip)
    except DoesNotFit as first:
        cap = first.temp_tile // 2
        while cap >= SHRINK_MIN:  # a stage reading a temporary refused: smaller units
            try:
                return _lower_best(node, budget, out, out_grid, skip, temp_cap=cap)
            except DoesNotFit:
                cap //= 2
        raise


LEAST_STEPS = 6
"""Bisection steps of :func:`_least_fitting` (each a whole plan)."""
LEAST_READS = 2
"""A smaller budget is named only when its plan reads at most this many
times what the plan at the budget first found to fit reads."""


def _least_fitting(node, budget, out, out_grid, skip, fits: int) -> int:
    """The least ``memory_per_worker`` found, between ``budget``'s (refused) and
    ``fits`` (which plans), under which :func:`_lower_retried` plans, its
    plan reading at most :data:`LEAST_READS` times the plan at ``fits``:
    with tiles halved where needed, it may fit below the memory a plan
    keeping them needs (a Q of 12,000 x 1000 was named 325MiB and planned at
    271MiB), but a budget fitting only far narrower tasks is not offered (a
    Cholesky of 16384² at 280MiB: 1,584 tasks reading 39.8 GiB, against 407
    reading 16.9 GiB at 288MiB). Bisection to 1 MiB or 2%, at most
    :data:`LEAST_STEPS` plans; only budgets that planned are returned."""
    def plan(memory: int) -> Plan:
        return _lower_retried(node, dataclasses.replace(budget, memory_per_worker=memory), out,
                              out_grid, skip)

    try:
        most = LEAST_READS * plan(fits).bytes_read
    except DoesNotFit:  # fits only keeping the inherited tiles: named as found
        return fits
    lo = budget.memory_per_worker
    for _ in range(LEAST_STEPS):
        if fits - lo <= max(2**20, fits // 50):
            break
        mid = (lo + fits) // 2
        try:
            ok = plan(mid).bytes_read <= most
        except DoesNotFit:
            ok = False
        fits, lo = (mid, lo) if ok else (fits, mid)
    return fits


def fitted_output_grid(node, tile, shard, budget, out=None):
    """:func:`~.sizing.output_grid`; a tile inherited from the inputs (no
    ``tile`` or ``shard`` given) is halved until the plan of ``node`` into it
    fits ``budget`` (:func:`~.sizing.shrink_tile`); else the closest halving
    (the plan then refuses it, naming the budget it needs). A 1-D result, or
    no budget: :func:`~.sizing.output_grid` as it is."""
    inherited = tile is None and shard is None and budget is not None and len(node.shape) == 2
    if inherited and isinstance(node, Factor) and node.part == "L":
        # square units: the planner's, as for a temporary factor (the larger of
        # reading a sharded A by whole shards and by inner chunks, of those
        # whose tile task fits: a 6000^2 A in 1000 x 750 chunks and 2000 x
        # 3000 shards took the shards' 2000, which no 300 MiB worker holds)
        item = np.dtype(node.dtype).itemsize
        units = []
        for inner in {False, _sharded(node)}:
            spec = Planner(budget, inner).spec(node.x, [])
            u = cholesky_tile(node, spec, budget)[1]
            units.append((chol_peak(spec, u, u, node.shape[0], item) <= budget.task_memory, u))
        unit = max(units)[1]
        return Grid.regular(tuple(node.shape), (unit, unit))
    grid = output_grid(node, tile, shard)
    if not inherited:
        return grid

    def attempt(t):
        g = Grid.regular(tuple(node.shape), t)
        _lower_best(node, budget, out, g, frozenset())
        return g

    try:
        return shrink_tile(grid.tile, attempt)
    except DoesNotFit as e:  # the tile that came closest: the refusal names its need
        return Grid.regular(tuple(node.shape), getattr(e, "closest", grid.tile))


def _lower_best(node, budget, out, out_grid, skip, shrink: bool = True,
                temp_cap: int = 0) -> Plan:
    """The plan reading sharded inputs by whole shards (one request each: the
    I/O unit), or by their inner chunks (byte ranges through the shard's
    index) where a shard is more than a task holds or reading by chunk
    reads at most half the bytes (a few rows of a large shard; not tried
    when whole shards read each input byte once)."""
    if not _sharded(node):
        return _lower(node, budget, out, out_grid, skip, shrink=shrink, temp_cap=temp_cap)
    try:
        whole = _lower(node, budget, out, out_grid, skip, shrink=shrink, temp_cap=temp_cap)
    except DoesNotFit:
        return _lower(node, budget, out, out_grid, skip, inner_shards=True, shrink=shrink,
                      temp_cap=temp_cap)
    if not _reads_part(node):  # whole passes: whole shards read no more than chunks
        return whole
    try:
        inner = _lower(node, budget, out, out_grid, skip, inner_shards=True, shrink=shrink,
                       temp_cap=temp_cap)
    except DoesNotFit:
        return whole
    return inner if 2 * inner.bytes_read <= whole.bytes_read else whole


def _sharded(node) -> bool:
    """Whether ``node`` reads a sharded stored array."""
    return any(s.grid.sharded for s in sources(node))


def _reads_part(node) -> bool:
    """Whether ``node`` reads only part of some stored input (a slice, a
    gather, a mask, a diagonal), or in bands of whole lines narrower than a
    shard (a sort, exact quantiles along an axis: a median of 40000 x 400 in
    20000 x 400 shards of 1000 x 100 chunks read 7 times the array by
    shard, about once by chunk), where whole shards may read far more."""
    if isinstance(node, SliceNode | nd.Take | nd.Select | nd.Points | nd.Diagonal | nd.Sort |
                  nd.Quantile):
        return True
    kids = [getattr(node, c, None) for c in ("x", "a", "b", "y", "w", "mask")]
    kids += list(getattr(node, "args", ()))
    return any(isinstance(k, Node) and _reads_part(k) for k in kids)


def _lower(node, budget, out, out_grid, skip, inner_shards: bool = False,
           shrink: bool = True, temp_cap: int = 0) -> Plan:
    p = Planner(budget, inner_shards, shrink, temp_cap)
    try:
        return _lower_walk(p, node, budget, out, out_grid, skip)
    except DoesNotFit as e:  # the temporaries made before the refusal: :func:`lower` retries
        e.temp_tile = max((max(r.grid.tile) for r, _ in p._temps.values()), default=0)
        padded = p.padding_advice()
        if padded and padded not in e.what:  # a stage's own check: say why its reads are large
            e.what = f"{e.what} ({padded})"
        raise


def _lower_walk(p: Planner, node, budget, out, out_grid, skip) -> Plan:
    p.fuse_reductions(node)
    side = {}
    if node.small or (node.ndim != 2 and not isinstance(node, MatVec)):
        key = p.small(node)
        if isinstance(node, TSQR) and "factors" in p.stages[-1].outputs:
            side = {"factors": p.stages[-1].outputs["factors"]}  # R with s or Vt
        p.finish()
        stat_keys = p.stat_keys([key])
        last = p.add(lower_store_small(node, key, out) if out is not None else result_stage(node))
        result = last.outputs.get("result", Output("value", (key,)))
    else:
        lowering = {MatMul: p.matmul, TSQR: p.tsqr, MatVec: p.matvec,
                    nd.Scan: p.scan, nd.Sort: p.sort, Factor: p.factor}.get(type(node), p.map)
        stage = lowering(node, out, out_grid, skip)
        result = stage.outputs.get("result") or stage.outputs["0"]
        if isinstance(node, TSQR):  # R (and s, Vt) computed on the way: a named output
            side = {"factors": p.stages[-2].outputs["factors"]}
        p.finish()
        stat_keys = p.stat_keys([])
    return Plan(describe(node), result_shape(node), str(node.dtype), budget, tuple(p.stages),
                str(out) if out is not None else None, {"result": result, **side},
                tuple(p.creates), tuple(stat_keys))
