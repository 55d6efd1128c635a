"""Region specs: small, picklable descriptions of fused elementwise work.

A spec says how to produce any rectangular region of a 2-D expression from
stored arrays: read (whole I/O units, via the aggregated reader), transpose,
slice, apply a NumPy ufunc, broadcast a vector computed by an earlier task.
Tasks carry specs and indices, never arrays; :func:`evaluate` runs on the
worker. Nothing here touches a cluster.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..storage import ArrayRef, IOStats, read_region
from ..storage.geometry import Grid, Range
from ..storage.io import prefetch_region


@dataclass(frozen=True)
class Read:
    """A stored 2-D array."""

    ref: ArrayRef
    grid: Grid
    dtype: np.dtype


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
class Const:
    value: Any


@dataclass(frozen=True)
class Dep:
    """A small array (vector or scalar) computed by dependency task ``index``.

    ``kind`` is "row" (broadcast along rows, length = n columns), "col"
    (length = m rows), "scalar", or "block" (an ``m x k`` in-memory operand
    sliced like the expression: the right-hand sides of a least squares).
    """

    index: int
    kind: str


@dataclass(frozen=True)
class Op:
    """NumPy function ``name`` applied elementwise to ``args``."""

    name: str
    args: tuple
    kwargs: tuple = ()


_FUNCS = {
    "astype": lambda x, dtype: x.astype(dtype, copy=False),
    "getitem": lambda x, key: x[key],
    "where": np.where,
    "clip": np.clip,
    "slice2d": lambda x, start, step, shape: x[
        start[0] : start[0] + shape[0] * step[0] : step[0],
        start[1] : start[1] + shape[1] * step[1] : step[1],
    ],
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
    return []


def deps_of(spec) -> set[int]:
    if isinstance(spec, Dep):
        return {spec.index}
    if isinstance(spec, Trans | Slice):
        return deps_of(spec.x)
    if isinstance(spec, Op):
        return set().union(*(deps_of(a) for a in spec.args)) if spec.args else set()
    return set()


def n_temporaries(spec) -> int:
    """Arrays alive at once while evaluating a region (reads plus op results)."""
    if isinstance(spec, Read):
        return 1
    if isinstance(spec, Trans):
        return n_temporaries(spec.x)
    if isinstance(spec, Slice):
        return n_temporaries(spec.x) + 1
    if isinstance(spec, Op):
        return sum(n_temporaries(a) for a in spec.args) + 1
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
    return None


def evaluate(spec, rows: Range, cols: Range, deps: list, stats: IOStats, _seen=None,
             max_bytes: int | None = None) -> Any:
    """Compute region ``rows x cols`` of a spec on the worker.

    A stored array that appears several times (``a * a``, ``a - a.mean(0)``)
    is read once per region. ``max_bytes`` bounds each read request (and so
    the decode buffers alive at once).
    """
    seen = {} if _seen is None else _seen
    if isinstance(spec, Read):
        key = (spec, rows, cols)
        if key not in seen:
            seen[key] = read_region(spec.ref, rows, cols, stats, max_bytes=max_bytes)
        return seen[key]
    if isinstance(spec, Trans):
        return evaluate(spec.x, cols, rows, deps, stats, seen, max_bytes).T
    if isinstance(spec, Slice):
        (r0, c0), (rs, cs) = spec.start, spec.step
        rr = (r0 + rows[0] * rs, r0 + (rows[1] - 1) * rs + 1) if rows[1] > rows[0] else (r0, r0)
        cc = (c0 + cols[0] * cs, c0 + (cols[1] - 1) * cs + 1) if cols[1] > cols[0] else (c0, c0)
        block = evaluate(spec.x, rr, cc, deps, stats, seen, max_bytes)
        return block[::rs, ::cs] if (rs, cs) != (1, 1) else block
    if isinstance(spec, Const):
        return spec.value
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
        args = [evaluate(a, rows, cols, deps, stats, seen, max_bytes) for a in spec.args]
        return func(spec.name)(*args, **dict(spec.kwargs))
    raise TypeError(f"unknown spec node {spec!r}")


def prefetch(spec, rows: Range, cols: Range) -> None:
    """Hint the stores that region ``rows x cols`` of ``spec`` is read next
    (the OS loads its chunk files in the background; see
    :func:`~tilearray.storage.io.prefetch_region`)."""
    for leaf, r, c in reads(spec, rows, cols):
        prefetch_region(leaf.ref, r, c)


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
