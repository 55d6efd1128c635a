"""Worker kernels of the NumPy functions that are neither maps nor tree
reductions: per-block values joined into one small result (a diagonal, the
exact quantiles of whole lines), and the two halves of a scan (each block's
total along the scanned axis; the block's own scan plus the carry of the
blocks before it)."""

from __future__ import annotations

import numpy as np

from ..storage import IOStats, buffers, write_block
from .matmul import counted, merge_stats
from .spec import SCANS, evaluate


def _block(spec, rows, cols, deps) -> tuple[np.ndarray, IOStats]:
    buffers.release(blocks_only=True)
    stats = IOStats()
    x = np.asarray(evaluate(spec, rows, cols, list(deps), stats))
    return np.broadcast_to(x, (rows[1] - rows[0], cols[1] - cols[0])), stats


def _done(value, stats: IOStats):
    out = stats.as_dict()
    out["tasks"] = 1
    return value, out


def block_line(spec, rows, cols, deps, fn: str, kwargs: tuple, strips=None):
    """Block ``rows x cols`` of ``spec`` through ``fn`` (``diagonal``,
    ``quantile``, ``nanquantile``, or one of :data:`BLOCK_FNS`): a small
    array. With ``strips`` (edges along ``kwargs``' axis), the block is read
    strip by strip into one buffer, so only one strip's I/O units are held
    at a time."""
    if strips is None:
        x, stats = _block(spec, rows, cols, deps)
    else:
        x, stats = _by_strips(spec, rows, cols, deps, dict(kwargs)["axis"], strips)
    kw = dict(kwargs)
    dtype = kw.pop("dtype", None)
    value = np.ascontiguousarray((BLOCK_FNS.get(fn) or getattr(np, fn))(x, **kw))
    return _done(value if dtype is None else value.astype(dtype), stats)


def _by_strips(spec, rows, cols, deps, axis: int, strips):
    buffers.release(blocks_only=True)
    stats = IOStats()
    x = None
    for lo, hi in zip(strips[:-1], strips[1:], strict=True):
        sub = ((lo, hi), cols) if axis == 0 else (rows, (lo, hi))
        piece = np.asarray(evaluate(spec, *sub, list(deps), stats))
        if x is None:
            x = np.empty((rows[1] - rows[0], cols[1] - cols[0]), dtype=piece.dtype)
        dst = (slice(lo - strips[0], hi - strips[0]), slice(None)) if axis == 0 else \
            (slice(None), slice(lo - strips[0], hi - strips[0]))
        x[dst] = piece
    return x, stats


def sort_block(spec, rows, cols, deps, strips, op: str, axis: int, kind, dtype, out_ref):
    """Block ``rows x cols`` (whole lines along ``axis``, read strip by strip
    on ``strips``) sorted (``op`` sort) or argsorted along ``axis``; written
    whole into ``out_ref``, or returned when it is None."""
    x, stats = _by_strips(spec, rows, cols, deps, axis, strips)
    kw = {} if kind is None else {"kind": kind}
    if op == "sort":
        x.sort(axis=axis, **kw)  # the block's own buffer: in place
        y = x
    else:
        y = np.argsort(x, axis=axis, **kw)
    y = np.ascontiguousarray(y.astype(dtype, copy=False))
    if out_ref is None:
        return _done(y, stats)
    write_block(out_ref, rows, cols, y, stats)
    return _done(None, stats)


def join_values(axis: int, *parts):
    """Concatenate the small results of tasks (``(value, stats)``) along ``axis``."""
    stats: dict = {}
    values = []
    for v, st in parts:
        values.append(v)
        stats = merge_stats(stats, st)
    return np.concatenate(values, axis=axis), counted(stats)


def block_total(spec, rows, cols, deps, op: str, axis: int, dtype):
    """The total of block ``rows x cols`` along ``axis`` under scan ``op``'s
    ufunc (:data:`~.spec.SCANS`: the sum for cumsum, the max for cummax)."""
    x, stats = _block(spec, rows, cols, deps)
    return _done(SCANS[op].reduce(x, axis=axis, dtype=dtype), stats)


def scan_carries(op: str, *totals):
    """Carries of a column (or row) of blocks: for block ``i > 0`` (row
    ``i - 1``), the scan ``op``'s ufunc over the totals of blocks
    ``0..i-1``. ``totals`` are ``(value, stats)`` of every block but the last."""
    stats: dict = {}
    for _, st in totals:
        stats = merge_stats(stats, st)
    vals = np.stack([v for v, _ in totals])
    return SCANS[op].accumulate(vals, axis=0, dtype=vals.dtype), counted(stats)


def scan_block(spec, rows, cols, dtype, out_ref, deps, op: str, axis: int, carry: int, i: int):
    """Block ``rows x cols`` of scan ``op`` (cumsum, cumprod, cummax...)
    along ``axis``: the block's own scan combined with the carry of the
    blocks before it (``deps[carry]``, row ``i - 1``); written whole into
    ``out_ref``, or returned when it is None."""
    x, stats = _block(spec, rows, cols, deps)
    ufunc = SCANS[op]
    y = ufunc.accumulate(x, axis=axis, dtype=dtype)
    if carry >= 0 and i > 0:
        c = deps[carry][0][i - 1]
        c = c.reshape(1, -1) if axis == 0 else c.reshape(-1, 1)
        y = ufunc(y, c, out=y)
    y = np.ascontiguousarray(y.astype(dtype, copy=False))
    if out_ref is None:
        return _done(y, stats)
    write_block(out_ref, rows, cols, y, stats)
    return _done(None, stats)


# -- the values of a whole array: histograms and selections (np.quantile / np.histogram with
# axis=None); a value's key is its float64 value, compared exactly with the edges.


def counts_dtype(dtype, lo, hi) -> np.dtype:
    """The dtype :func:`interval_counts` returns for elements of ``dtype``:
    int64 / uint64 for integers against integer bounds (compared as integers,
    exact beyond 2**53), else float64."""
    kind = np.dtype(dtype).kind
    if kind in "iu" and isinstance(lo, int) and isinstance(hi, int):
        return np.dtype("int64" if kind == "i" else "uint64")
    return np.dtype("float64")


def _in_interval(x: np.ndarray, lo, hi, closed: bool) -> np.ndarray:
    """The elements of block ``x`` in ``[lo, hi)`` (``[lo, hi]`` when
    ``closed``), NaNs never, compared in :func:`counts_dtype`; flattened, in
    their own dtype."""
    v = x.reshape(-1)
    keys = v.astype(counts_dtype(v.dtype, lo, hi), copy=False)
    mask = (keys >= lo) & ((keys <= hi) if closed else (keys < hi))
    return v[mask]


def interval_counts(x, lo, hi, closed: bool, edges):
    """``[counts per bin of edges..., min, max]`` (:func:`counts_dtype`) of
    the elements in the interval (:func:`_in_interval`): NumPy's histogram of
    them over ``edges`` (spanning the interval), their smallest and largest."""
    kind = counts_dtype(x.dtype, lo, hi)
    sel = _in_interval(x, lo, hi, closed).astype(kind, copy=False)
    counts = np.histogram(sel, bins=np.asarray(edges))[0].astype(kind)
    if sel.size:
        ends = [sel.min(), sel.max()]
    else:  # merging it changes nothing
        ends = [np.inf, -np.inf] if kind.kind == "f" else [np.iinfo(kind).max,
                                                            np.iinfo(kind).min]
    return np.concatenate([counts, np.asarray(ends, dtype=kind)])


def interval_values(x, lo, hi, closed: bool):
    """The elements in the interval (:func:`_in_interval`), in block order."""
    return _in_interval(x, lo, hi, closed)


BLOCK_FNS = {"interval_counts": interval_counts, "interval_values": interval_values}


def join_counts(*parts):
    """Sum the ``[counts..., min, max]`` of :func:`interval_counts` tasks."""
    stats: dict = {}
    total = None
    for v, st in parts:
        stats = merge_stats(stats, st)
        if total is None:
            total = v.copy()
        else:
            total[:-2] += v[:-2]
            total[-2], total[-1] = min(total[-2], v[-2]), max(total[-1], v[-1])
    return total, counted(stats)


# -- the distinct values of a whole array (np.unique): per block, then merged up a tree


class TooManyValues(ValueError):
    """More distinct values than a task may hold (:func:`unique_block`)."""


def _too_many(where: str, limit: int) -> str:
    return (f"np.unique: {where} holds more than {limit} distinct values, more than a task may "
            "hold (the result would not fit); np.unique is meant for few distinct values "
            "(labels, codes): for order statistics use np.quantile / np.histogram")


def _distinct(values, counts, first, equal_nan: bool, limit: int, where: str):
    """Merge ``(values, counts, first flat index)`` whose values may repeat:
    sorted distinct values, their summed counts, their smallest first index."""
    order = np.lexsort((first, values))  # by value, then first position: NumPy's stable order
    v, c, f = values[order], counts[order], first[order]
    new = np.ones(len(v), dtype=bool)
    if len(v) > 1:
        same = v[1:] == v[:-1]
        if equal_nan and v.dtype.kind in "fc":
            same |= np.isnan(v[1:]) & np.isnan(v[:-1])
        new[1:] = ~same
    starts = np.flatnonzero(new)
    if len(starts) > limit:
        raise TooManyValues(_too_many(where, limit))
    return (v[starts], np.add.reduceat(c, starts) if len(v) else c,
            np.minimum.reduceat(f, starts) if len(v) else f)


def unique_block(spec, rows, cols, deps, ncols: int, equal_nan: bool, limit: int):
    """The distinct values of block ``rows x cols`` with their counts and the
    flat (C order) index of their first occurrence in the whole array."""
    x, stats = _block(spec, rows, cols, deps)
    # NumPy's unique of the block (its first occurrences in the block's C
    # order, then placed in the whole array's): a sort and a few arrays of the
    # distinct values, where sorting (value, position) pairs built two more
    # int64 arrays of the block (helper-45: 83 bytes an element planned)
    v, first, c = np.unique(np.asarray(x).ravel(), return_index=True, return_counts=True,
                            equal_nan=equal_nan)
    if len(v) > limit:
        raise TooManyValues(_too_many(f"block rows {rows} cols {cols}", limit))
    width = cols[1] - cols[0]
    first = (first // width + rows[0]) * ncols + first % width + cols[0]
    return _done((v, c.astype(np.int64), first.astype(np.int64)), stats)


def unique_merge(equal_nan: bool, limit: int, *parts):
    """Merge :func:`unique_block` results (a combine node of the tree)."""
    stats: dict = {}
    for _, st in parts:
        stats = merge_stats(stats, st)
    vals = [p[0] for p in parts]
    value = _distinct(*(np.concatenate([v[k] for v in vals]) for k in range(3)), equal_nan,
                      limit, "the array")
    return value, counted(stats)


# -- x[mask] of a 2-D mask: the selected elements in C order


def select_block(x_spec, mask_spec, rows, cols, deps, ncols: int, positions: bool = False):
    """The elements of block ``rows x cols`` of ``x_spec`` where ``mask_spec``
    is True (with ``positions``: their flat indices as the values), with
    their flat (C order) indices in the whole array; a stored array both
    read is read once."""
    buffers.release(blocks_only=True)
    stats, seen = IOStats(), {}
    shape = (rows[1] - rows[0], cols[1] - cols[0])
    mask = np.broadcast_to(evaluate(mask_spec, rows, cols, list(deps), stats, seen), shape)
    r, c = np.nonzero(mask)
    flat = (r.astype(np.intp) + rows[0]) * ncols + (c.astype(np.intp) + cols[0])
    if positions:
        return _done((flat, flat), stats)
    x = np.broadcast_to(evaluate(x_spec, rows, cols, list(deps), stats, seen), shape)
    return _done((np.ascontiguousarray(x[r, c]), flat), stats)


def points_block(x_spec, rows, cols, deps, r, c, at):
    """The elements of block ``rows x cols`` of ``x_spec`` at local rows ``r``
    and columns ``c``, for the result's positions ``at``."""
    buffers.release(blocks_only=True)
    stats = IOStats()
    x = evaluate(x_spec, rows, cols, list(deps), stats, {})
    return _done((np.ascontiguousarray(x[r, c]), at), stats)


def join_points(count: int, dtype, *parts):
    """The elements of :func:`points_block` tasks, each put at its positions."""
    stats: dict = {}
    out = np.empty(count, dtype)
    for (values, at), st in parts:
        out[at] = values
        stats = merge_stats(stats, st)
    return out, counted(stats)


def join_selected(count: int, *parts):
    """The elements of :func:`select_block` tasks in C order (by flat index)."""
    stats: dict = {}
    for _, st in parts:
        stats = merge_stats(stats, st)
    values = np.concatenate([v for (v, _), _ in parts])
    flat = np.concatenate([f for (_, f), _ in parts])
    if len(values) != count:
        raise ValueError(f"a[mask] found {len(values)} selected elements, the count before "
                         f"found {count}: did the array change while it was read?")
    return values[np.argsort(flat, kind="stable")], counted(stats)
