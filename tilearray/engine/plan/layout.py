"""Block layouts: which blocks a stage's tasks cover, and what each one costs.

Pure arithmetic on array metadata (no store or cluster calls). A *layout* is
a pair of edge lists, one per axis of the result; its blocks are the
products of their intervals. What a block reads is separable by axis: a
stored array reached through transposes and (strided) slices reads the
whole I/O units covering an affine image of the block's row range times
those covering the image of its column range. So the cost of every block of
a layout comes from two short vectors per stored array
(:class:`BlockCosts`), and the planner can try many layouts cheaply: its
work grows with the number of blocks, never with blocks x chunks.

:func:`search` tries the layouts the planner may choose -- block edges on
the I/O unit edges shared by every input (no unit read twice), on their
union (finer, some units read by two blocks), and, when writing, on the
output's unit edges (hard: each output unit written by one task) -- from the
largest block the target allows down to single cells, and returns the one
that reads least among those whose every task fits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ...graphs.blocks import group_edges, max_interval
from ...graphs.spec import (
    Concat,
    Gather,
    Op,
    Read,
    Slice,
    Trans,
    held_bytes,
    map_interval,
    map_spans,
    reads_along,
    unit_edges,
)

#: Above this many blocks the peak is bounded per axis instead of block by block.
EXACT_BLOCKS = 1 << 16


@dataclass(frozen=True)
class Path:
    """One stored array a spec reads, seen from the result's coordinates.

    Leaf axis ``d`` reads result axis ``axes[d]`` through the affine map
    ``i -> start[d] + i * step[d]``.
    """

    leaf: Read
    axes: tuple[int, int]
    start: tuple[int, int]
    step: tuple[int, int]
    steps: tuple | None = None
    """Through a concatenation or a gather: per leaf axis, the chain of axis
    maps (:func:`~tilearray.graphs.spec.map_spans`) from the result's
    coordinates (``start``/``step`` unused); None for an affine path."""


def paths(spec) -> list[Path]:
    """The distinct stored-array reads of ``spec`` (each read once per block)."""
    out: dict[Path, None] = {}

    def walk(s, axes, chains):
        if isinstance(s, Read):
            out[_path(s, axes, chains)] = None
        elif isinstance(s, Trans):
            walk(s.x, axes[::-1], chains[::-1])
        elif isinstance(s, Slice):  # x[s0::st] then our map on the sliced axis
            walk(s.x, axes, tuple(chains[d] + (("a", s.start[d], s.step[d]),) for d in (0, 1)))
        elif isinstance(s, Op):
            for a in s.args:
                walk(a, axes, chains)
        elif isinstance(s, Concat):
            for k, part in enumerate(s.parts):
                w = ("w", s.offsets[k], s.offsets[k + 1] - s.offsets[k])
                walk(part, axes, tuple(c + (w,) if d == s.axis else c
                                       for d, c in enumerate(chains)))
        elif isinstance(s, Gather):
            g = ("g", s.index, s.edges)
            walk(s.x, axes, tuple(c + (g,) if d == s.axis else c for d, c in enumerate(chains)))

    walk(spec, (0, 1), ((), ()))
    return list(out)


def _path(leaf: Read, axes, chains) -> Path:
    """A leaf's path; affine chains composed into ``start + i * step``."""
    if any(st[0] != "a" for c in chains for st in c):
        return Path(leaf, axes, (0, 0), (1, 1), tuple(chains))
    start, step = [0, 0], [1, 1]
    for d in (0, 1):
        for _, s0, st in chains[d]:  # i -> start + i*step, then s0 + (.)*st
            start[d], step[d] = s0 + start[d] * st, step[d] * st
    return Path(leaf, axes, tuple(start), tuple(step))


@dataclass
class _Axis:
    """Per block interval along one result axis, for one path's leaf axis."""

    length: np.ndarray
    """Elements of the leaf read (whole units covering the image)."""
    units: np.ndarray
    """I/O units touched."""
    tiles: np.ndarray
    """Tiles inside those units (sum over the units)."""
    full_tiles: np.ndarray
    """Tiles inside those units that hold a whole unit's worth of tiles."""
    held: np.ndarray
    """Elements of its reads held at once: ``length``, or through a gather
    the largest span's (spans are read one at a time and picked into the
    gathered block, which counts as a temporary:
    :func:`~tilearray.graphs.spec.made_arrays`)."""
    reads: np.ndarray
    """Read requests: 1 (0 when empty), or through a gather one per span."""


def _axis(edges: np.ndarray, start: int, step: int, n: int, unit: int, tile: int) -> _Axis:
    lo_out, hi_out = edges[:-1], edges[1:]
    return _leaf_axis(start + lo_out * step, start + (hi_out - 1) * step + 1, hi_out <= lo_out,
                      n, unit, tile)


def _leaf_axis(lo: np.ndarray, hi: np.ndarray, empty: np.ndarray, n: int, unit: int,
               tile: int) -> _Axis:
    """The reads of the leaf spans ``[lo, hi)`` (``empty``: none) along an
    axis of ``n`` elements in I/O units of ``unit`` and tiles of ``tile``."""
    ul, uh = lo // unit, (np.maximum(hi, lo + 1) - 1) // unit
    length = np.minimum((uh + 1) * unit, n) - ul * unit
    units = uh - ul + 1
    per = unit // tile
    last = (n - 1) // unit
    last_tiles = -(-(n - last * unit) // tile)
    has_last = uh == last
    tiles = units * per - has_last * (per - last_tiles)
    full_tiles = (units - (has_last & (last_tiles != per))) * per
    zero = np.zeros_like(length)
    length, units, tiles, full_tiles = (np.where(empty, zero, v)
                                        for v in (length, units, tiles, full_tiles))
    return _Axis(length, units, tiles, full_tiles, length, (~empty).astype(np.int64))


def _mapped_axis(edges: np.ndarray, steps, n: int, unit: int, tile: int) -> _Axis:
    """:func:`_axis` through a chain of axis maps (a concatenation's window,
    a gather's spans): each block interval reads the spans
    :func:`~tilearray.graphs.spec.map_spans` gives, one request each. A
    gather reads them one at a time into its block
    (:func:`~tilearray.graphs.spec.evaluate`), so it holds the largest (its
    block counted apart, as a temporary: helper-36 found flips, pads and
    ``rot90`` refused at budgets they had planned at, the block counted
    twice). Without a gather each interval maps to one span: all at once
    (block by block, a search over a 20000-row axis had taken seconds)."""
    if not any(st[0] == "g" for st in steps):
        lo, hi = edges[:-1], edges[1:]
        empty = hi <= lo
        for st in steps:  # map_spans's affine and window steps, on every interval
            lo, hi = map_interval(st, lo, hi)
            empty = empty | (hi <= lo)
        return _leaf_axis(lo, hi, empty, n, unit, tile)
    cols = [[], [], [], [], [], []]
    for lo, hi in zip(edges[:-1].tolist(), edges[1:].tolist(), strict=True):
        spans = np.asarray(map_spans(steps, [(lo, hi)]), dtype=np.int64).reshape(-1, 2)
        one = _leaf_axis(spans[:, 0], spans[:, 1], spans[:, 1] <= spans[:, 0], n, unit, tile)
        parts = [int(v.sum()) for v in (one.length, one.units, one.tiles, one.full_tiles)]
        parts += [int(one.length.max(initial=0)), int(one.reads.sum())]
        for c, v in zip(cols, parts, strict=True):
            c.append(v)
    return _Axis(*(np.asarray(c, dtype=np.int64) for c in cols))


class BlockCosts:
    """Reads of every block of a layout: decoded bytes, requests, store gets.

    Exactly what :func:`tilearray.graphs.spec.read_cost` gives block by block
    (one whole-unit request per stored array and block), computed per axis.
    """

    def __init__(self, spec, row_edges, col_edges):
        self.row_edges, self.col_edges = tuple(row_edges), tuple(col_edges)
        e = (np.asarray(row_edges, dtype=np.int64), np.asarray(col_edges, dtype=np.int64))
        self.sizes = (np.diff(e[0]), np.diff(e[1]))
        self._paths = []
        self._units = []  # (bytes of one unit, leaf axis 0, leaf axis 1) per path
        for p in paths(spec):
            g = p.leaf.grid
            ax = [_axis(e[p.axes[d]], p.start[d], p.step[d], g.shape[d], g.unit[d], g.tile[d])
                  if p.steps is None else
                  _mapped_axis(e[p.axes[d]], p.steps[d], g.shape[d], g.unit[d], g.tile[d])
                  for d in (0, 1)]
            # as (result rows, result cols)
            r, c = (ax[0], ax[1]) if p.axes == (0, 1) else (ax[1], ax[0])
            self._paths.append((p.leaf.dtype.itemsize, g.sharded, r, c))
            self._units.append((p.leaf.dtype.itemsize * g.unit[0] * g.unit[1], ax[0], ax[1]))

    @property
    def shape(self) -> tuple[int, int]:
        return len(self.sizes[0]), len(self.sizes[1])

    def at(self, i: int, j: int) -> tuple[int, int, int]:
        """``(bytes, requests, store gets)`` of block ``(i, j)``."""
        nbytes = nreq = gets = 0
        for item, _sharded, r, c in self._paths:
            n = int(r.length[i]) * int(c.length[j])
            if n == 0:
                continue
            nbytes += n * item
            nreq += int(r.reads[i]) * int(c.reads[j])
            gets += int(r.units[i]) * int(c.units[j])  # one GET per unit (io.WholeObjectReads)
        return nbytes, nreq, gets

    def band(self, axis: int, index: int, lo: int, hi: int) -> tuple[int, int, int]:
        """``(bytes, requests, store gets)`` summed over the blocks ``index``
        along ``axis`` and ``lo:hi`` along the other (one row or column of
        blocks, e.g. a matmul task's K panels)."""
        nbytes = nreq = gets = 0
        for item, _sharded, r, c in self._paths:
            one, many = (r, c) if axis == 0 else (c, r)
            if one.length[index] == 0:
                continue
            lengths = many.length[lo:hi]
            nbytes += int(one.length[index]) * int(lengths.sum()) * item
            nreq += int(one.reads[index]) * int(many.reads[lo:hi].sum())
            gets += int(one.units[index]) * int(many.units[lo:hi].sum())
        return nbytes, nreq, gets

    def read_bytes(self, held: bool = False) -> np.ndarray | None:
        """Decoded bytes read by each block, ``(rows, cols)``, all held at
        once; or, when ``held``, those its reads hold at once if evaluated
        in one pass (:func:`~tilearray.graphs.spec.evaluate`: through a
        gather, its largest span's). None when too many blocks."""
        if self.shape[0] * self.shape[1] > EXACT_BLOCKS:
            return None
        out = np.zeros(self.shape, dtype=np.int64)
        for item, r, c in self._sides(held):
            out += np.multiply.outer(r * item, c)
        return out

    def max_read_bytes(self, exact: bool = True, held: bool = False) -> int:
        """Largest block's :meth:`read_bytes` (bounded per axis when there
        are many blocks, or when not ``exact``; the bound is exact for one
        stored array)."""
        per_block = self.read_bytes(held) if exact else None
        if per_block is not None:
            return int(per_block.max(initial=0))
        return int(sum(int(r.max(initial=0)) * int(c.max(initial=0)) * item
                       for item, r, c in self._sides(held)))

    def _sides(self, held: bool):
        """``(itemsize, rows' elements, columns' elements)`` per stored array:
        read (``length``) or held at once (``held``)."""
        return [(item, r.held, c.held) if held else (item, r.length, c.length)
                for item, _, r, c in self._paths]

    def total_read_bytes(self) -> int:
        return int(sum(int(r.length.sum()) * int(c.length.sum()) * item
                       for item, _, r, c in self._paths))

    def min_request_bytes(self) -> int:
        """Largest request a block's read makes when banded as finely as
        :func:`~tilearray.storage.plan_reads` allows: one unit row across the
        block when it spans several unit rows, else one unit."""
        out = 0
        for unit, r, c in self._units:
            rows, cols = int(r.units.max(initial=0)), int(c.units.max(initial=0))
            out = max(out, unit * (cols if rows > 1 else 1))
        return out


@dataclass
class ReadTotals:
    """Running sums of read costs ``(bytes, requests, store gets)`` as
    :meth:`BlockCosts.at` / :meth:`BlockCosts.band` give them: a stage's
    ``bytes_read``, ``reads`` and ``store_gets``."""

    nbytes: int = 0
    reads: int = 0
    gets: int = 0

    def add(self, *costs) -> None:
        """Add each ``(bytes, requests, store gets)`` of ``costs``."""
        for b, r, g in costs:
            self.nbytes, self.reads, self.gets = self.nbytes + b, self.reads + r, self.gets + g


FREE_STEP = 256
"""Elements: blocks of an expression that reads nothing break on multiples of this."""


def bases(spec, axis: int, n: int, hard: tuple[int, ...] | None) -> list[tuple[int, ...]]:
    """Edge lists blocks may break on along ``axis``, coarsest first.

    Without an output (``hard`` None): the edges shared by every input's I/O
    units (no unit split, so none read twice), then their union (every cell
    inside one unit of each input). With an output, blocks must break on its
    unit edges: those also shared by the inputs, those on the union, then all
    of the output's.
    """
    shared = unit_edges(spec, axis, n, common=True)
    union = unit_edges(spec, axis, n)
    if hard is None and len(union) <= 2 and not reads_along(spec, axis):
        # nothing read (a lazy identity, a matrix of one value): break anywhere
        union = shared = tuple(range(0, n, FREE_STEP)) + (n,) if n else (0,)
    if hard is None:
        out = [shared, union]
    else:
        h = set(hard)
        out = [tuple(sorted(h & set(shared))), tuple(sorted(h & set(union))), tuple(hard)]
    seen: list[tuple[int, ...]] = []
    for b in out:
        if b and b not in seen:
            seen.append(b)
    return seen


def shapes(rows_base, cols_base, m: int, n: int, max_elems: int):
    """Layouts on the given bases, largest blocks first: roughly square blocks
    of at most ``max_elems`` elements (whole rows when a row of cells fits),
    halving down to single cells."""
    last = None
    target = max(int(max_elems), 1)
    while True:
        if max_interval(rows_base) * n <= target:
            ce = group_edges(cols_base, max(n, 1))
        else:
            ce = group_edges(cols_base, max(math.isqrt(target), 1))
        re = group_edges(rows_base, max(target // max(max_interval(ce), 1), 1))
        if (re, ce) != last:
            yield re, ce
            last = (re, ce)
        if target <= 1:
            return
        target //= 2


def n_blocks(layout) -> int:
    return (len(layout[0]) - 1) * (len(layout[1]) - 1)


def spanning(rows_base, cols_base, m: int, n: int, max_elems: int, axis: int,
             inside: bool = True):
    """Layouts whose blocks span all of ``axis``, the other axis cut into
    bands of at most ``max_elems`` elements a block, halving down to single
    intervals, then (if ``inside``: no output's unit edges to keep) inside
    them, each band reading its units whole (fewer reads than short blocks
    meeting every unit), down to single lines.
    Along a gather's axis, a run of positions meets the source units in any
    order: a block of them all reads each unit it needs once, where a block
    of consecutive positions of an unsorted index meets most units (400
    random rows of a 4000² matrix in 1000² chunks, 33 MiB tasks: 1,220
    blocks read 9.09 GiB, 4 bands of all rows 0.12 GiB)."""
    length, base = (m, cols_base) if axis == 0 else (n, rows_base)
    other = n if axis == 0 else m
    target, seen = max(int(max_elems) // max(length, 1), 1), set()
    while True:
        edges = group_edges(base, target)
        cuts = [edges]
        if inside and max_interval(edges) > target:  # then inside them: bands of ``target``
            cuts.append(tuple(sorted(set(base) | set(range(0, other, target)))))
        for e in cuts:
            lay = ((0, m), e) if axis == 0 else (e, (0, n))
            if lay not in seen:
                seen.add(lay)
                yield lay
        if target <= 1:
            return
        target //= 2


def gathered_axes(spec) -> list[int]:
    """The result axes along which ``spec`` reads a stored array through a gather."""
    return sorted({p.axes[d] for p in paths(spec) if p.steps is not None for d in (0, 1)
                   if any(st[0] == "g" for st in p.steps[d])})


def search(spec, shape, hard_rows, hard_cols, max_elems: int, peak_of, budget: int):
    """The layout that reads least among those whose every task fits.

    ``peak_of(costs)`` projects a layout's largest task from its
    :class:`BlockCosts`. Layouts are :func:`shapes` on each pair of
    :func:`bases`, and :func:`spanning` blocks along the axes read through a
    gather. Returns ``(costs, peak)`` of the chosen layout, or of the layout
    with the smallest peak when none fits (the caller refuses, naming that
    peak).
    """
    m, n = shape
    best = smallest = None
    held = held_bytes(spec)  # NumPy matrix operands, whole in every task
    whole = gathered_axes(spec)
    for rb in bases(spec, 0, m, hard_rows):
        for cb in bases(spec, 1, n, hard_cols):
            for layouts in [shapes(rb, cb, m, n, max_elems),
                            *(spanning(rb, cb, m, n, max_elems, a,
                                       (hard_cols if a == 0 else hard_rows) is None)
                              for a in whole)]:
                for re, ce in layouts:
                    costs = BlockCosts(spec, re, ce)
                    peak = peak_of(costs) + held
                    if smallest is None or peak < smallest[1]:
                        smallest = (costs, peak)
                    if peak <= budget:
                        rank = (costs.total_read_bytes(), n_blocks((re, ce)))
                        if best is None or rank < best[0]:
                            best = (rank, costs, peak)
                        break  # finer layouts on these bases read no less
    if best is not None:
        return best[1], best[2]
    return smallest


__all__ = ["BlockCosts", "Path", "ReadTotals", "bases", "gathered_axes", "paths", "search",
           "shapes", "spanning"]


def widest_blocks(rows_base, cols_base, m: int, n: int, memory, budget: int) -> list:
    """``(row_edges, col_edges, memory)`` of, for every block height (a multiple
    of the row unit), the widest block that fits ``budget`` by ``memory(re, ce)``:
    blocks of any aspect ratio (at 10^6^2 on 2 GiB workers, 8192 x 12288 reads
    17 % less than the best square). The widest fit shrinks as the height
    grows, so one two-pointer pass: O(m / row unit + n / column unit) calls."""
    sr, sc = max(max_interval(rows_base), 1), max(max_interval(cols_base), 1)
    out = []
    tr, tc = sr, sc * math.ceil(max(n, 1) / sc)
    while tc >= sc:
        re, ce = group_edges(rows_base, tr), group_edges(cols_base, tc)
        mem = memory(re, ce)
        if mem <= budget:
            out.append((re, ce, mem))
            if tr >= m:
                break
            tr += sr
        else:
            tc -= sc
    return out
