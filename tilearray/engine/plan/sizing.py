"""Block sizing for the lowering (pure): the refusal when even the smallest
task does not fit, the output grid and the tile an expression inherits from
its inputs. Numbers in, numbers out (what a task holds: :mod:`.memory`)."""

from __future__ import annotations

import math

import numpy as np
from dask.utils import format_bytes

from ...errors import PlanningArgumentError, PlanningError
from ...graphs.blocks import group_edges
from ...storage import Grid, int_pair
from ..expr.nodes import (
    TSQR,
    Elemwise,
    Factor,
    MatMul,
    MatVec,
    Node,
    SliceNode,
    Source,
    Transpose,
)
from .types import Budget

MIN_PANEL = 512  # elements: K panels narrower than this waste BLAS efficiency


class DoesNotFit(PlanningError):
    """One stage's smallest task is over the per-task budget."""

    temp_tile: int = 0
    """The longest tile side of the temporaries planned before the refusal."""

    def __init__(self, kind: str, peak: int, what: str, budget: Budget,
                 tiles_help: bool = True):
        super().__init__(f"{what}: the smallest {kind} task needs {format_bytes(peak)}")
        self.kind, self.peak, self.what, self.budget = kind, peak, what, budget
        self.need = budget.worker_memory_for(peak)
        self.tiles_help = tiles_help
        """False where no tiling lowers the task (it holds a whole matrix or factor)."""

    def explain(self, original: Budget, need: int | None,
                later: DoesNotFit | None = None) -> PlanningError:
        """The refusal users see: against the budget they gave, with the
        smallest ``memory_per_worker`` under which *every* stage fits
        (``later``: the stage refused under a larger budget, which sets it,
        named when of another kind: under a larger budget a stage of the same
        kind may be this one with larger blocks)."""
        b = original
        where = f", the smallest worker {b.worker}" if b.worker else ""
        if later is not None and later.kind != self.kind:
            where += (f"; a later {later.kind} stage needs {format_bytes(later.peak)} a task"
                      f"{'' if later.tiles_help else ' whatever the tiles'}")
        tiles = "smaller tiles/shards" if self.tiles_help and (later is None or later.tiles_help) \
            else ""
        fix = f"memory_per_worker >= {_round_up_mib(need)}" if need else \
            (tiles or "a larger memory_per_worker")
        if need and tiles:
            fix += f", or with {tiles}"
        return PlanningError(
            f"{self.what}: the smallest {self.kind} task needs {format_bytes(self.peak)} but the "
            f"budget allows {format_bytes(b.task_memory)} per task ({format_bytes(b.memory_per_worker)}"
            f" per worker, {b.threads_per_worker} thread(s){where}); it would fit with {fix}"
        )


def _round_up_mib(nbytes: int) -> str:
    """A size users can pass back: whole MiB, rounded up (never below the need)."""
    return f"{-(-nbytes // 2**20)}MiB"


def divisors(n: int) -> list[int]:
    """The divisors of ``n`` (``>= 1``), ascending: the tile widths that
    stay inside one I/O unit ``n`` wide."""
    small = [d for d in range(1, math.isqrt(max(n, 1)) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


def panels(edges) -> tuple[int, ...]:
    return group_edges(edges, max(MIN_PANEL, 1))


def all_done(grid: Grid, rows, cols, done) -> bool:
    if not done:
        return False
    return all((i, j) in done for i in grid.units_touching(0, rows)
               for j in grid.units_touching(1, cols))


def missing_parts(grid: Grid, rows, cols, done) -> list | None:
    """The block ``rows x cols`` of an output being resumed, when some of its
    units are ``done`` and some not: the parts still to compute, as ``(rows,
    cols)`` -- per row of units, each run of units not done (runs that repeat
    over consecutive unit rows merged) -- all unit-aligned; None when none
    of its units is done (the whole block is computed)."""
    if not done:
        return None
    urows, ucols = grid.units_touching(0, rows), grid.units_touching(1, cols)
    if not any((i, j) in done for i in urows for j in ucols):
        return None

    def clip(axis, index, rng):
        lo, hi = grid.unit_range(axis, index)
        return max(lo, rng[0]), min(hi, rng[1])

    parts: list = []
    above: dict = {}  # column run -> its part (index) ending at the unit row above
    for i in urows:
        r0, r1 = clip(0, i, rows)
        runs, start = [], None
        for j in ucols:
            if (i, j) not in done:
                start, last = (j if start is None else start), j
            elif start is not None:
                runs.append((clip(1, start, cols)[0], clip(1, last, cols)[1]))
                start = None
        if start is not None:
            runs.append((clip(1, start, cols)[0], clip(1, last, cols)[1]))
        here = {}
        for run in runs:
            q = above.get(run)
            if q is not None and parts[q][0][1] == r0:
                parts[q] = ((parts[q][0][0], r1), run)
            else:
                q = len(parts)
                parts.append(((r0, r1), run))
            here[run] = q
        above = here
    return parts


def ahead(spans, i: int, budget) -> tuple | None:
    """The span a pass's task ``i`` hints to the stores after its own read:
    the one the next wave of tasks starts on (``spans[i + slots]``, slots =
    the budget's parallel tasks), or None past the end."""
    nxt = i + budget.n_workers * budget.threads_per_worker
    return tuple(spans[nxt]) if nxt < len(spans) else None


def short(node) -> str:
    s = str(node)
    return s if len(s) < 90 else s[:87] + "..."


def output_grid(node, tile, shard) -> Grid:
    """Output grid: the given tile, else the tiling of the inputs it derives
    from. A 1-D result of length m is the column ``(m, 1)`` (``tile`` and
    ``shard``: an int, ``(t,)`` or ``(t, 1)``)."""
    if len(node.shape) == 1:
        return _vector_grid(node, tile, shard)
    if tile is None:
        if isinstance(node, MatVec):
            tile = (leaf_tile(node.a, 0), node.shape[1])
        elif isinstance(node, MatMul):
            tile = product_tile(node)
        else:
            tile = (leaf_tile(node, 0), leaf_tile(node, 1))
        tile = tuple(max(min(t, max(n, 1)), 1) for t, n in zip(tile, node.shape, strict=True))
        tile = _capped(tile, np.dtype(node.dtype).itemsize)
        how = "inherited from the inputs"
    else:
        how = "given"
    given, tile = tile, int_pair(tile)
    if tile is None or any(t <= 0 for t in tile):
        raise PlanningArgumentError(f"tile must be 2 positive integers, got {given!r}")
    if shard is None:  # a tile larger than the array is clipped to it
        tile = tuple(min(t, max(n, 1)) for t, n in zip(tile, node.shape, strict=True))
    if shard is not None:
        given, shard = shard, int_pair(shard)
        if shard is None:
            raise PlanningArgumentError(f"shard must be 2 positive integers, got {given!r}")
        if any(s <= 0 or s % t for s, t in zip(shard, tile, strict=True)):
            hint = tuple(max(d for d in range(1, min(t, s) + 1) if s % d == 0) if s > 0 else 1
                         for s, t in zip(shard, tile, strict=False))
            raise PlanningArgumentError(
                f"shard {shard} is not a positive multiple of the tile {tile} ({how}); pass a "
                f"tile that divides the shard, e.g. tile={hint}"
            )
    return Grid.regular(node.shape, tile, shard)


def _vector_grid(node, tile, shard) -> Grid:
    m = node.shape[0]

    def first(given, what):
        block = (int(given),) if isinstance(given, int | np.integer) \
            and not isinstance(given, bool) else given
        try:
            items = tuple(block)
        except TypeError:
            items = ()
        if len(items) not in (1, 2) or (len(items) == 2 and items[1] != 1) \
                or not isinstance(items[0], int | np.integer) or items[0] <= 0:
            raise PlanningError(f"{what} of a 1-D result must be a positive integer or (t,), "
                                f"got {given!r}")
        return int(items[0])

    if tile is None:
        t = leaf_tile(node.a, 1 if isinstance(node.a, Transpose) else 0) \
            if isinstance(node, MatVec) else 1024
        t = min(_capped((t, 1), np.dtype(node.dtype).itemsize)[0], max(m, 1))
    else:
        t = first(tile, "tile")
    s = None if shard is None else first(shard, "shard")
    if s is None:
        t = min(t, max(m, 1))
    elif s % t:
        raise PlanningArgumentError(f"shard {s} is not a positive multiple of the tile {t}")
    return Grid.regular((m, 1), (t, 1), None if s is None else (s, 1))


MAX_INHERITED_TILE = 64 * 2**20
"""Bytes of an output tile inherited from the inputs, at most: larger ones
(a matmul's rows of A's tile x columns of B's, e.g. 8192 x 8192 from
8192 x 512 and 512 x 8192 chunks) are halved along their longer side until
under. A tile is the unit of one write and of its encode buffer; keeping it
moderate lets the planner fit blocks that a 512 MiB chunk would not."""


SHRINK_STEPS = 10
"""Halvings :func:`shrink_tile` tries at most (each plans the job again)."""
SHRINK_MIN = 4
"""Elements: a side :func:`shrink_tile` does not halve below."""


def shrink_tile(tile: tuple, attempt):
    """``attempt(tile)`` for an inherited tile, or, where its plan does not fit
    the budget (:class:`DoesNotFit`), for the tile halved along one axis at a
    time -- the longer first, else the halving that lowers the peak more --
    until one fits (an output or temporary chunk of the inputs' tiling can be
    wider than a task holds: a sort's whole lines, a product's output
    block). Raises the first refusal, with ``closest``, the tile that came
    nearest, when halving no longer lowers the peak by 5 % (an input's unit,
    not the tile, fills the task), after :data:`SHRINK_STEPS` halvings, or
    at sides of :data:`SHRINK_MIN`."""
    try:
        return attempt(tile)
    except DoesNotFit as e:
        first = best = e
    for _ in range(SHRINK_STEPS):
        tried = []
        for ax in sorted((0, 1), key=lambda a: -tile[a]):
            if tile[ax] < 2 * SHRINK_MIN:
                continue
            t = (-(-tile[0] // 2), tile[1]) if ax == 0 else (tile[0], -(-tile[1] // 2))
            try:
                return attempt(t)
            except DoesNotFit as e:
                tried.append((e.peak, t, e))
        if not tried:
            break
        peak, t, e = min(tried, key=lambda x: x[0])
        if peak > 0.95 * best.peak:
            break  # the tile is not what fills the task (an input unit is)
        tile, best = t, e
    first.closest = tile  # the tile whose task came nearest to fitting
    raise first


def _capped(tile: tuple, itemsize: int) -> tuple:
    r, c = tile
    while r * c * itemsize > MAX_INHERITED_TILE and max(r, c) > 1:
        if r >= c:
            r = -(-r // 2)
        else:
            c = -(-c // 2)
    return r, c


def leaf_tile(node, axis: int, default: int = 1024) -> int:
    """Tile size along ``axis`` of the first stored array ``node`` reads."""
    if isinstance(node, Source):
        return node.grid.tile[axis]
    if isinstance(node, Transpose):
        return leaf_tile(node.x, 1 - axis, default)
    if isinstance(node, SliceNode):  # a strided slice's tile covers one parent tile
        return max(-(-leaf_tile(node.x, axis, default) // node.step[axis]), 1)
    if isinstance(node, MatMul):
        return product_tile(node, default)[axis]
    if isinstance(node, MatVec):
        return leaf_tile(node.a, axis, default) if axis == 0 else default
    if isinstance(node, TSQR):  # Q, U: the rows of X, every column in one tile
        return leaf_tile(node.x, 0, default) if axis == 0 else max(node.shape[1], 1)
    if isinstance(node, Factor):  # a Cholesky factor: square tiles
        return factor_tile(node, default)
    if isinstance(node, Elemwise) or hasattr(node, "args"):  # also a concatenation
        for a in node.args:
            if isinstance(a, Node) and not a.small:
                return leaf_tile(a, axis, default)
    if isinstance(getattr(node, "x", None), Node) and not node.x.small:  # take, cumsum
        return leaf_tile(node.x, axis, default)
    return default


MIN_PRODUCT_TILE = 64 * 2**10
"""Bytes of a product's tile inherited from its operands, at least: A's row
tile by B's column tile is tiny when they are thin (``X.T @ X`` of X in
``(m, 1)`` chunks: 1 x 1), and every tile is a file and a done marker (a
100 x 100 Gram stored in 20,001 files took 24 s against 0.2 s to
compute)."""


def product_tile(node, default: int = 1024) -> tuple[int, int]:
    """The tile a matmul's result inherits: A's row tile by B's column tile,
    each side doubled in turn (the smaller first; within the shape) while
    the tile is under :data:`MIN_PRODUCT_TILE` bytes."""
    r = max(min(leaf_tile(node.a, 0, default), node.shape[0]), 1)
    c = max(min(leaf_tile(node.b, 1, default), node.shape[1]), 1)
    item = np.dtype(node.dtype).itemsize
    while r * c * item < MIN_PRODUCT_TILE and (r < node.shape[0] or c < node.shape[1]):
        if (r <= c or c >= node.shape[1]) and r < node.shape[0]:
            r = min(2 * r, node.shape[0])
        else:
            c = min(2 * c, node.shape[1])
    return r, c


def factor_tile(node, default: int = 1024) -> int:
    """Default square tile of a stored Cholesky factor (``to_zarr`` without
    ``tile=``): a multiple of the input's larger tile of at least ``default``
    elements, at most :data:`MAX_INHERITED_TILE` bytes, within ``n``."""
    n = max(node.shape[0], 1)
    t_in = max(leaf_tile(node.x, 0, default), leaf_tile(node.x, 1, default), 1)
    cap = max(int((MAX_INHERITED_TILE // np.dtype(node.dtype).itemsize) ** 0.5), 1)
    b = t_in * -(-default // t_in) if t_in < default else t_in
    if b > cap:
        b = cap // t_in * t_in if t_in <= cap else cap
    return max(min(b, n), 1)
