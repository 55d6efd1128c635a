"""Region specs: small, picklable descriptions of fused elementwise work.

A spec says how to produce any rectangular region of a 2-D expression from
stored arrays: read (whole I/O units, via the aggregated reader), transpose,
slice, apply a NumPy ufunc, broadcast a vector computed by an earlier task.
Tasks carry specs and indices, never arrays; :func:`evaluate` runs on the
worker. Nothing here touches a cluster.
"""

from __future__ import annotations

from collections import ChainMap
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..storage import ArrayRef, IOStats, prefetch_region, read_region
from ..storage.geometry import Grid, Range


@dataclass(frozen=True)
class Read:
    """A stored 2-D array."""

    ref: ArrayRef
    grid: Grid
    dtype: np.dtype
    part: tuple = ()
    """Which part of a concatenation reads it (``()``: none): the parts of
    ``np.hstack([a, a])`` read ``a`` apart, as the planner prices them."""


@dataclass(frozen=True)
class Trans:
    """Transpose of a 2-D spec: read as a transposed region, never materialised."""

    x: Any


@dataclass(frozen=True)
class Slice:
    """``x[r0::rstep, c0::cstep]`` restricted to the requested region."""

    x: Any
    start: tuple[int, int]
    step: tuple[int, int]


@dataclass(frozen=True)
class Concat:
    """``parts`` joined along ``axis``: part ``k`` covers ``offsets[k]:offsets[k+1]``
    of that axis (``np.concatenate``); only the parts a region meets are read."""

    parts: tuple
    axis: int
    offsets: tuple
    dtype: np.dtype


class Index:
    """Integer positions (a NumPy int64 vector), compared and hashed by content."""

    __slots__ = ("values", "token")

    def __init__(self, values):
        from dask.base import tokenize

        self.values = np.asarray(values, dtype=np.int64)
        self.token = tokenize(self.values)

    def __eq__(self, other) -> bool:
        return isinstance(other, Index) and other.token == self.token

    def __hash__(self) -> int:
        return hash(self.token)

    def __len__(self) -> int:
        return len(self.values)

    def __reduce__(self):
        # every task of a gather carries its spec: an arithmetic progression
        # (a slice, a[::-1]) travels as its range, an increasing index (a
        # boolean mask's positions) as the mask's bits when smaller
        v = self.values
        if len(v) > 64 and np.all(np.diff(v) == v[1] - v[0]) and v[1] != v[0]:
            return (_range_index, (int(v[0]), int(v[-1]) + int(np.sign(v[1] - v[0])),
                                   int(v[1] - v[0])))
        if len(v) > 64 and int(v[-1]) + 1 < 64 * len(v) and bool(np.all(np.diff(v) > 0)):
            mask = np.zeros(int(v[-1]) + 1, dtype=bool)
            mask[v] = True
            return (_unpack_index, (np.packbits(mask), len(mask)))
        return (Index, (v,))

    def __dask_tokenize__(self):
        return ("Index", self.token)


def _range_index(start: int, stop: int, step: int) -> Index:
    return Index(np.arange(start, stop, step))


def _unpack_index(bits, n: int) -> Index:
    return Index(np.flatnonzero(np.unpackbits(bits, count=n)))


@dataclass(frozen=True)
class Gather:
    """``np.take(x, index, axis)``: the rows (axis 0) or columns (axis 1) of
    ``x`` at ``index``. A region reads, for each run of its positions that
    falls between two of ``edges`` (the I/O unit edges of ``x`` along
    ``axis``), the span from their smallest to their largest position: each
    unit a region needs is read once, and no unit it does not need."""

    x: Any
    axis: int
    index: Index
    edges: tuple
    dtype: np.dtype


def tagged(spec, k: int):
    """``spec`` with its reads marked as part ``k`` of a concatenation."""
    import dataclasses

    if isinstance(spec, Read):
        return dataclasses.replace(spec, part=(k, *spec.part))
    if isinstance(spec, Trans | Slice | Gather):
        return dataclasses.replace(spec, x=tagged(spec.x, k))
    if isinstance(spec, Op):
        return dataclasses.replace(spec, args=tuple(tagged(a, k) for a in spec.args))
    if isinstance(spec, Concat):
        return dataclasses.replace(spec, parts=tuple(tagged(a, k) for a in spec.parts))
    return spec


def has_gather(spec) -> bool:
    """Whether ``spec`` takes positions of an expression (a :class:`Gather`
    anywhere in it)."""
    if isinstance(spec, Gather):
        return True
    if isinstance(spec, Trans | Slice):
        return has_gather(spec.x)
    if isinstance(spec, Op):
        return any(has_gather(a) for a in spec.args)
    if isinstance(spec, Concat):
        return any(has_gather(a) for a in spec.parts)
    return False


def gather_spans(index: Index, edges, lo: int, hi: int) -> list:
    """``(start, stop)`` spans of ``x`` that positions ``lo:hi`` of a gather
    read, one per unit interval of ``edges`` they meet, in interval order
    (pure; :func:`evaluate`, :func:`reads` and the layout costs share it)."""
    sel = index.values[lo:hi]
    if not len(sel):
        return []
    g = np.searchsorted(np.asarray(edges), sel, side="right")
    order = np.argsort(g, kind="stable")
    gs, ss = g[order], sel[order]
    cut = np.flatnonzero(np.diff(gs)) + 1
    return [(int(part.min()), int(part.max()) + 1) for part in np.split(ss, cut)]


def map_interval(st, lo, hi):
    """One affine (``"a"``) or window (``"w"``) step of :func:`map_spans` on
    ``[lo, hi)``: ints, or arrays of intervals (the planner's costs); the
    result is empty (``hi <= lo``) where the window misses it."""
    if st[0] == "a":
        return st[1] + lo * st[2], st[1] + (hi - 1) * st[2] + 1
    return np.maximum(lo - st[1], 0), np.minimum(hi - st[1], st[2])


def map_spans(steps, spans) -> list:
    """Map index spans of a result axis through a chain of axis maps to a
    leaf's axis: ``("a", start, step)`` affine (a slice), ``("w", offset, n)``
    a window (one part of a concatenation), ``("g", index, edges)`` a gather."""
    for st in steps:
        out = []
        for lo, hi in spans:
            if hi <= lo:
                continue
            if st[0] == "g":
                out += gather_spans(st[1], st[2], lo, hi)
                continue
            a, b = map_interval(st, lo, hi)
            if st[0] == "a" or b > a:  # a window may miss the span
                out.append((int(a), int(b)))
        spans = out
    return spans


@dataclass(frozen=True)
class Const:
    value: Any


@dataclass(frozen=True)
class Position:
    """Each element's row (``axis`` 0) or column (``axis`` 1) number in the
    spec's own coordinates, as a column or row to broadcast."""

    axis: int


@dataclass(frozen=True)
class Dep:
    """A small array (vector or scalar) computed by dependency task ``index``.

    ``kind`` is "row" (broadcast along rows, length = n columns), "col"
    (length = m rows), "scalar", or "block" (an ``m x k`` in-memory operand
    sliced like the expression: the right-hand sides of a least squares).
    """

    index: int
    kind: str
    nbytes: int = 0
    """A "block" operand's size: every task evaluating the spec holds it whole."""


def held_bytes(spec) -> int:
    """Bytes of the in-memory matrix operands (``Dep`` of kind "block") every
    task evaluating ``spec`` holds whole, each counted once."""
    found: dict = {}

    def walk(s):
        if isinstance(s, Dep):
            if s.kind == "block":
                found[s.index] = max(found.get(s.index, 0), s.nbytes)
        elif isinstance(s, Trans | Slice | Gather):
            walk(s.x)
        elif isinstance(s, Op):
            for a in s.args:
                walk(a)
        elif isinstance(s, Concat):
            for a in s.parts:
                walk(a)

    walk(spec)
    return sum(found.values())


@dataclass(frozen=True)
class Op:
    """NumPy function ``name`` applied elementwise to ``args``."""

    name: str
    args: tuple
    kwargs: tuple = ()


SCANS = {"cumsum": np.add, "cumprod": np.multiply, "cummax": np.maximum, "cummin": np.minimum,
         "cumfmax": np.fmax, "cumfmin": np.fmin}
"""The scans (``ufunc.accumulate``) by name: ``np.cumsum`` is ``np.add.accumulate``
with NumPy's default accumulation dtype, ``cummax`` is ``np.maximum.accumulate``."""


def _accumulate(name: str):
    def scan(x, axis=0, dtype=None):
        return SCANS[name].accumulate(x, axis=axis, dtype=dtype)

    return scan


_FUNCS = {
    **{name: _accumulate(name) for name in ("cummax", "cummin", "cumfmax", "cumfmin")},
    "astype": lambda x, dtype: x.astype(dtype, copy=False),
    "getitem": lambda x, key: x[key],
    "reshape": lambda x, shape, order="C": np.reshape(x, shape, order=order),  # NumPy 1.26
    "where": np.where,
    # np.triu / np.tril of a block, given its elements' row and column numbers
    "tri": lambda x, r, c, k, upper: np.where(c - r >= k if upper else c - r <= k, x,
                                              np.zeros((), x.dtype)),
    # np.eye's block, given its elements' row and column numbers
    "eye": lambda r, c, k, dtype: (c - r == k).astype(dtype),
    "clip": np.clip,
    # each element's index among sorted distinct values (np.unique's inverse): the table
    # rebuilt in its own dtype (uint64 beyond 2**63 exact), NaN sorted last as np.unique
    "codes": lambda x, values, dtype: np.searchsorted(np.asarray(values, dtype=dtype), x),
    "slice2d": lambda x, start, step, shape: x[
        start[0] : start[0] + shape[0] * step[0] : step[0],
        start[1] : start[1] + shape[1] * step[1] : step[1],
    ],
    # np.concatenate / stack / hstack / vstack of small in-memory results
    "join": lambda *xs, how, **kw: getattr(np, how)(xs, **kw),
    # output ``index`` of a ufunc of several (np.divmod, np.modf, np.frexp)
    "output": lambda *xs, ufunc, index, **kw: getattr(np, ufunc)(*xs, **kw)[index],
    # a NumPy function of small in-memory results, passed by keyword (np.cov of vectors)
    "call": lambda *xs, names, numpy, **kw: getattr(np, numpy)(**dict(zip(names, xs, strict=True)),
                                                                    **kw),
}


def func(name: str):
    """The NumPy callable behind an op name (``add``, ``sqrt``, ``astype``...)."""
    return _FUNCS.get(name) or getattr(np, name)


def leaves(spec) -> list[Read]:
    """Stored arrays a spec reads."""
    if isinstance(spec, Read):
        return [spec]
    if isinstance(spec, Trans | Slice):
        return leaves(spec.x)
    if isinstance(spec, Op):
        return [r for a in spec.args for r in leaves(a)]
    if isinstance(spec, Concat):
        return [r for a in spec.parts for r in leaves(a)]
    if isinstance(spec, Gather):
        return leaves(spec.x)
    return []


def deps_of(spec) -> set[int]:
    if isinstance(spec, Dep):
        return {spec.index}
    if isinstance(spec, Trans | Slice):
        return deps_of(spec.x)
    if isinstance(spec, Op):
        return set().union(*(deps_of(a) for a in spec.args)) if spec.args else set()
    if isinstance(spec, Concat):
        return set().union(*(deps_of(a) for a in spec.parts))
    if isinstance(spec, Gather):
        return deps_of(spec.x)
    return set()


def made_arrays(spec) -> int:
    """Arrays a region's evaluation makes beyond its reads, alive at once at
    its peak: each op's and slice's result, an op's operands together; a
    join's parts one at a time (:func:`_evaluate_joined`: its largest part
    and the joined block). (Until 2026-12-07 a join held all its parts: the
    three of ``np.gradient`` planned 2-5x ``np.diff``'s memory, helper-50.)"""
    if isinstance(spec, Trans):
        return made_arrays(spec.x)
    if isinstance(spec, Slice | Gather):
        return made_arrays(spec.x) + 1
    if isinstance(spec, Op):
        return sum(made_arrays(a) for a in spec.args) + 1
    if isinstance(spec, Concat):
        return max((made_arrays(a) for a in spec.parts), default=0) + 1
    return 0


def unit_edges(spec, axis: int, n: int, common: bool = False) -> tuple[int, ...]:
    """Boundaries along ``axis`` where the spec's reads fall on I/O unit edges.

    Blocks that break only at these edges never split a unit between tasks.
    For several leaves, the union of their edges, or with ``common=True`` the
    edges shared by all of them (no leaf's unit split); slices map edges back.
    """
    edges = _edges(spec, axis, common)
    if edges is None:
        return (0, n) if n else (0,)
    return tuple(sorted({e for e in edges if 0 <= e <= n} | {0, n}))


def reads_along(spec, axis: int) -> bool:
    """Whether ``spec`` reads stored units that cut ``axis`` (False for an
    expression of constants, positions and small results only)."""
    return _edges(spec, axis) is not None


def _edges(spec, axis: int, common: bool = False):
    if isinstance(spec, Read):
        return set(spec.grid.unit_edges(axis))
    if isinstance(spec, Trans):
        return _edges(spec.x, 1 - axis, common)
    if isinstance(spec, Slice):
        inner = _edges(spec.x, axis, common)
        if inner is None:
            return None
        s0, st = spec.start[axis], spec.step[axis]
        return {-(-(e - s0) // st) for e in inner if e >= s0}
    if isinstance(spec, Op):
        out = None
        for a in spec.args:
            e = _edges(a, axis, common)
            if e is not None:
                out = e if out is None else (out & e if common else out | e)
        return out
    if isinstance(spec, Concat):
        return _concat_edges(spec, axis, common)
    if isinstance(spec, Gather):
        inner = _edges(spec.x, axis, common)
        if inner is None or axis != spec.axis:
            return inner
        g = np.searchsorted(np.asarray(sorted(inner)), spec.index.values, side="right")
        return {0, len(g)} | {int(i) for i in np.flatnonzero(np.diff(g)) + 1}
    return None


def _concat_edges(spec: Concat, axis: int, common: bool):
    """Block edges of a concatenation: along its axis, each part's edges
    shifted to its place, and the places where parts meet; across it,
    combined like an elementwise op's."""
    out = None
    for k, part in enumerate(spec.parts):
        e = _edges(part, axis, common)
        if axis == spec.axis:
            off, n = spec.offsets[k], spec.offsets[k + 1] - spec.offsets[k]
            e = {off + x for x in (e if e is not None else {0, n}) if 0 <= x <= n}
            out = (out or set()) | e
        elif e is not None:
            out = e if out is None else (out & e if common else out | e)
    return out


def evaluate(spec, rows: Range, cols: Range, deps: list, stats: IOStats, _seen=None,
             max_bytes: int | None = None, whole: bool = True) -> Any:
    """Compute region ``rows x cols`` of a spec on the worker.

    A stored array that appears several times (``a * a``, ``a - a.mean(0)``)
    is read once per region. ``max_bytes`` bounds each read request (and so
    the decode buffers alive at once). ``whole``: the result has the
    region's shape, a spec of constants, rows or columns alone
    (``np.ones_like(a)``, ``np.full_like(a, 3) * 2``) broadcast to it in a
    new array (its callers may write into it); else (an operand of a ufunc
    that broadcasts) it may be anything broadcasting to it. (Until
    2026-12-07 such a spec's block was its scalar: ``np.full_like(a,
    3).sum()`` summed one 3 per block, helper-45.)
    """
    x = _evaluate(spec, rows, cols, deps, stats, {} if _seen is None else _seen, max_bytes)
    shape = (rows[1] - rows[0], cols[1] - cols[0])
    if whole and np.shape(x) != shape:
        x = np.array(np.broadcast_to(x, shape))
    return x


def _evaluate(spec, rows: Range, cols: Range, deps: list, stats: IOStats, seen: dict,
              max_bytes: int | None) -> Any:
    """:func:`evaluate`, its result any array broadcasting to the region."""
    if isinstance(spec, Read):
        key = (spec, rows, cols)
        if key not in seen:
            seen[key] = read_region(spec.ref, rows, cols, stats, max_bytes=max_bytes,
                                    inner=spec.grid.within is not None)
        return seen[key]
    if isinstance(spec, Trans):
        return _evaluate(spec.x, cols, rows, deps, stats, seen, max_bytes).T
    if isinstance(spec, Slice):
        (r0, c0), (rs, cs) = spec.start, spec.step
        rr = (r0 + rows[0] * rs, r0 + (rows[1] - 1) * rs + 1) if rows[1] > rows[0] else (r0, r0)
        cc = (c0 + cols[0] * cs, c0 + (cols[1] - 1) * cs + 1) if cols[1] > cols[0] else (c0, c0)
        block = _evaluate(spec.x, rr, cc, deps, stats, seen, max_bytes)
        return block[::rs, ::cs] if (rs, cs) != (1, 1) else block
    if isinstance(spec, Const):
        return spec.value
    if isinstance(spec, Position):
        return np.arange(*rows)[:, None] if spec.axis == 0 else np.arange(*cols)[None, :]
    if isinstance(spec, Dep):
        v = deps[spec.index]
        if isinstance(v, tuple):  # (value, stats) from a dependency task
            v = v[0]
        if spec.kind == "row":
            return np.asarray(v).reshape(1, -1)[:, cols[0] : cols[1]]
        if spec.kind == "col":
            return np.asarray(v).reshape(-1, 1)[rows[0] : rows[1], :]
        if spec.kind == "block":  # an in-memory operand of the expression's own shape
            return np.asarray(v).reshape(len(v), -1)[rows[0] : rows[1], cols[0] : cols[1]]
        return v
    if isinstance(spec, Op):
        args = [_evaluate(a, rows, cols, deps, stats, seen, max_bytes) for a in spec.args]
        return func(spec.name)(*args, **dict(spec.kwargs))
    if isinstance(spec, Concat | Gather):  # its parts' reads are dropped once copied in
        key = (spec, tuple(rows), tuple(cols))
        if key not in seen:
            seen[key] = _evaluate_joined(spec, rows, cols, deps, stats, seen, max_bytes)
        return seen[key]
    raise TypeError(f"unknown spec node {spec!r}")


def _evaluate_joined(spec, rows: Range, cols: Range, deps, stats, seen, max_bytes):
    """A region of a :class:`Concat` (the parts it meets, joined) or of a
    :class:`Gather` (one read per span of :func:`gather_spans`, picked),
    one part or span at a time: reads it makes are freed as it is copied in
    (the planner holds the largest, :class:`~tilearray.engine.plan.layout.BlockCosts`),
    those already in ``seen`` (a reduction's block read first) are used."""
    region = [tuple(rows), tuple(cols)]
    ax = spec.axis
    out = np.empty((rows[1] - rows[0], cols[1] - cols[0]), dtype=spec.dtype)
    lo, hi = region[ax]
    if isinstance(spec, Concat):
        for k, part in enumerate(spec.parts):
            a, b = max(lo, spec.offsets[k]), min(hi, spec.offsets[k + 1])
            if b > a:
                sub = list(region)
                sub[ax] = (a - spec.offsets[k], b - spec.offsets[k])
                piece = _evaluate(part, *sub, deps, stats, ChainMap({}, seen), max_bytes)
                dst = [slice(None), slice(None)]
                dst[ax] = slice(a - lo, b - lo)
                out[tuple(dst)] = piece
                del piece  # a view may hold its whole decoded chunk: freed before the next read
        return out
    sel = spec.index.values[lo:hi]
    for a, b in gather_spans(spec.index, spec.edges, lo, hi):
        sub = list(region)
        sub[ax] = (a, b)
        piece = _evaluate(spec.x, *sub, deps, stats, ChainMap({}, seen), max_bytes)
        shape = [rows[1] - rows[0], cols[1] - cols[0]]
        shape[ax] = b - a
        piece = np.broadcast_to(piece, shape)
        pos = np.flatnonzero((sel >= a) & (sel < b))
        if ax == 0:
            out[pos, :] = piece[sel[pos] - a, :]
        else:
            out[:, pos] = piece[:, sel[pos] - a]
        del piece  # a view may hold its whole decoded chunk: freed before the next read
    return out


def prefetch(spec, rows: Range, cols: Range) -> None:
    """Hint the stores that region ``rows x cols`` of ``spec`` is read next
    (the OS loads its chunk files in the background; see
    :func:`~tilearray.storage.io.prefetch_region`)."""
    for leaf, r, c in reads(spec, rows, cols):
        prefetch_region(leaf.ref, r, c)


def prefetch_next(specs, regions) -> None:
    """Hint the region a later task reads (``regions``: one ``(rows, cols)``
    per spec, or None): asked right after a task's own read, the OS loads
    it while this task computes."""
    if regions is None:
        return
    for spec, (rows, cols) in zip(specs, regions, strict=True):
        prefetch(spec, rows, cols)


def reads(spec, rows: Range, cols: Range):
    """Yield ``(leaf, rows, cols)`` in leaf coordinates that evaluating
    ``rows x cols`` of ``spec`` reads (mirrors :func:`evaluate`; pure)."""
    if isinstance(spec, Read):
        yield spec, rows, cols
    elif isinstance(spec, Trans):
        yield from reads(spec.x, cols, rows)
    elif isinstance(spec, Slice):
        (r0, c0), (rs, cs) = spec.start, spec.step
        rr = (r0 + rows[0] * rs, r0 + (rows[1] - 1) * rs + 1) if rows[1] > rows[0] else (r0, r0)
        cc = (c0 + cols[0] * cs, c0 + (cols[1] - 1) * cs + 1) if cols[1] > cols[0] else (c0, c0)
        yield from reads(spec.x, rr, cc)
    elif isinstance(spec, Op):
        for a in spec.args:
            yield from reads(a, rows, cols)
    elif isinstance(spec, Concat | Gather):
        region, ax = [tuple(rows), tuple(cols)], spec.axis
        if isinstance(spec, Concat):
            for k, part in enumerate(spec.parts):
                sub = list(region)
                sub[ax] = map_spans([("w", spec.offsets[k], spec.offsets[k + 1]
                                      - spec.offsets[k])], [region[ax]])
                if sub[ax]:
                    sub[ax] = sub[ax][0]
                    yield from reads(part, *sub)
        else:
            for span in gather_spans(spec.index, spec.edges, *region[ax]):
                sub = list(region)
                sub[ax] = span
                yield from reads(spec.x, *sub)


def read_cost(spec, rows: Range, cols: Range) -> tuple[int, int, int]:
    """``(decoded bytes, read requests, store gets)`` of evaluating a region."""
    from ..storage import plan_reads

    nbytes = nreq = gets = 0
    for leaf, r, c in dict.fromkeys(reads(spec, rows, cols)):  # each distinct read once
        for req in plan_reads(leaf.grid, r, c, leaf.dtype.itemsize):
            nbytes += req.nbytes
            nreq += 1
            gets += req.store_gets
    return nbytes, nreq, gets
