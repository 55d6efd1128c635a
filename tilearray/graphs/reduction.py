"""Tree reductions: per-block partials, pairwise merges, final values.

A map task evaluates one block of a (fused) expression and emits a partial
result keeping the reduced axis as length 1. Combine tasks merge up to
``split_every`` partials; a final task turns the merged partial into the
value. var/std (and nanvar/nanstd, over the non-NaN elements) carry
``(count, mean, M2)`` merged with Chan et al.'s pairwise update, which is
stable where sum-of-squares formulas are not.
Floating inputs narrower than float64 accumulate in float64 and the result
is cast back to NumPy's result dtype (float32 stays float32 to the user).
"""

from __future__ import annotations

import warnings

import numpy as np

from ..errors import AllNaNSliceError
from ..storage import IOStats, buffers, read_region
from .matmul import counted, merge_stats
from .spec import Op, Read, Trans, evaluate, func, has_gather, reads

SIMPLE = {
    # op: (block reducer, pairwise merge)
    "sum": (np.sum, np.add),
    "nansum": (np.nansum, np.add),
    "prod": (np.prod, np.multiply),
    "min": (np.min, np.minimum),
    "max": (np.max, np.maximum),
    "nanmin": (np.nanmin, np.fmin),
    "nanmax": (np.nanmax, np.fmax),
    "any": (np.any, np.logical_or),
    "all": (np.all, np.logical_and),
}
VARIANCES = ("var", "std", "nanvar", "nanstd")
"""Reductions that carry ``(count, mean, M2)`` and take ``ddof``."""
MOMENTS = {"mean", "nanmean", *VARIANCES}
ARG = {"argmin", "argmax", "nanargmin", "nanargmax"}
"""Reductions giving an index; the ``nan`` ones skip NaNs and raise NumPy's
``ValueError`` for a slice that is all NaN."""
OPS = tuple(SIMPLE) + ("count_nonzero",) + tuple(sorted(MOMENTS)) + tuple(sorted(ARG))
NO_IDENTITY = {"min", "max", "nanmin", "nanmax", *ARG}


def accumulation_dtype(op: str, dtype: np.dtype) -> np.dtype | None:
    """dtype partials accumulate in (None: the block reducer's default)."""
    dtype = np.dtype(dtype)
    if op in ("sum", "nansum", "prod", *MOMENTS) and dtype.kind == "f" and dtype.itemsize < 8:
        return np.dtype("float64")
    if op in MOMENTS and dtype.kind in "biu":
        return np.dtype("float64")
    return None


def _quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return fn(*args, **kwargs)


def partial(x: np.ndarray, op: str, axis, offset: tuple[int, int], ncols: int,
            work: np.ndarray | None = None):
    """Partial result of ``op`` over block ``x`` (reduced axes kept as length 1).

    ``work``, a C-ordered array of ``x``'s shape in the accumulation dtype,
    holds var/std's squared deviations (else a new array does)."""
    acc = accumulation_dtype(op, x.dtype)
    if op in SIMPLE:
        fn = SIMPLE[op][0]
        kw = {"dtype": acc} if op in ("sum", "nansum", "prod") and acc is not None else {}
        return (_quiet(fn, x, axis=axis, keepdims=True, **kw),)
    if op == "count_nonzero":
        return (np.count_nonzero(x, axis=axis, keepdims=True).astype(np.intp),)
    if op in MOMENTS:
        xf = x.astype(acc or x.dtype, copy=False)
        if op == "nanmean":
            mask = ~np.isnan(xf)
            n = np.sum(mask, axis=axis, keepdims=True)
            return (np.nansum(xf, axis=axis, keepdims=True), n)
        if op in ("nanvar", "nanstd"):
            return _nan_moments(xf, axis, work)
        n = np.full(_kept_shape(x.shape, axis), x.size if axis is None else x.shape[axis])
        if op == "mean":
            return (np.sum(xf, axis=axis, keepdims=True), n)
        mean = _quiet(np.mean, xf, axis=axis, keepdims=True)
        if work is None or work.shape != xf.shape or work.dtype != xf.dtype:
            work = None
        d = np.subtract(xf, mean, out=work)  # one temporary, squared in place
        np.multiply(d, d, out=d)
        m2 = np.sum(d, axis=axis, keepdims=True)
        del d
        return (n.astype(np.float64), mean, m2)
    if op in ARG:
        return _arg_partial(x, op, axis, offset, ncols)
    raise ValueError(f"unknown reduction {op!r}")


def _nan_moments(xf, axis, work):
    """``(count, mean, M2)`` of the non-NaN elements; a partial without any
    has mean 0 and M2 0, so that merging it changes nothing."""
    keep = ~np.isnan(xf)
    n = np.sum(keep, axis=axis, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(n > 0, np.nansum(xf, axis=axis, keepdims=True) / np.maximum(n, 1), 0.0)
    if work is None or work.shape != xf.shape or work.dtype != xf.dtype:
        work = None
    d = np.subtract(xf, mean, out=work)
    np.multiply(d, d, out=d)
    d[~keep] = 0.0
    m2 = np.sum(d, axis=axis, keepdims=True)
    return (n.astype(np.float64), mean.astype(xf.dtype, copy=False), m2)


def _kept_shape(shape, axis):
    if axis is None:
        return (1, 1)
    s = list(shape)
    s[axis] = 1
    return tuple(s)


def _arg_partial(x, op, axis, offset, ncols):
    """``(value, index)`` of the block's first minimum / maximum; the
    ``nan`` ops, as NumPy's, take NaN as +inf (nanargmin) or -inf and add
    whether the slice held any other value."""
    fn = np.argmin if op.endswith("argmin") else np.argmax
    extra = ()
    if op.startswith("nan"):
        nan = np.isnan(x)
        extra = (~np.all(nan, axis=axis, keepdims=True),)
        x = np.where(nan, np.inf if op == "nanargmin" else -np.inf, x)
    if axis is None:
        i, j = divmod(int(fn(x)), x.shape[1])
        idx = (offset[0] + i) * ncols + (offset[1] + j)
        return (np.array([[x[i, j]]]), np.array([[idx]], dtype=np.intp), *extra)
    loc = fn(x, axis=axis, keepdims=True)
    val = np.take_along_axis(x, loc, axis=axis)
    return (val, loc.astype(np.intp) + offset[axis], *extra)


def merge(op: str, p, q):
    """Merge two partials of ``op`` (p comes before q along the reduced axis)."""
    if op in SIMPLE:
        return (SIMPLE[op][1](p[0], q[0]),)
    if op == "count_nonzero" or op in ("mean", "nanmean"):
        return tuple(a + b for a, b in zip(p, q, strict=True))
    if op in VARIANCES:
        (na, ma, m2a), (nb, mb, m2b) = p, q
        n = na + nb
        with np.errstate(invalid="ignore", divide="ignore"):
            delta = mb - ma
            w = np.where(n > 0, nb / np.where(n > 0, n, 1), 0.0)
            mean = ma + delta * w
            m2 = m2a + m2b + delta**2 * na * w
        return (n, mean, m2)
    if op in ARG:
        (va, ia), (vb, ib) = p[:2], q[:2]
        na, nb = _isnan(va), _isnan(vb)  # a NaN wins: NumPy's argmin is the first NaN
        take_b = ((vb < va) if op.endswith("argmin") else (vb > va)) | (nb & ~na)
        # ties (equal values, or both NaN): the first occurrence in flat order
        take_b |= ((vb == va) | (na & nb)) & (ib < ia)
        seen = (p[2] | q[2],) if op.startswith("nan") else ()
        return (np.where(take_b, vb, va), np.where(take_b, ib, ia), *seen)
    raise ValueError(f"unknown reduction {op!r}")


def _isnan(v):
    v = np.asarray(v)
    return np.isnan(v) if v.dtype.kind in "fc" else np.zeros(v.shape, dtype=bool)


def finalize(op: str, p, out_dtype, ddof: float = 0):
    """Value of a fully merged partial, cast to NumPy's result dtype."""
    if op in SIMPLE or op == "count_nonzero":
        value = p[0]
    elif op in ("mean", "nanmean"):
        with np.errstate(invalid="ignore", divide="ignore"):
            value = p[0] / p[1]
    elif op in VARIANCES:
        n, _, m2 = p
        with np.errstate(invalid="ignore", divide="ignore"):
            value = m2 / np.maximum(n - ddof, 0)
        if op in ("nanvar", "nanstd"):  # NumPy's nanvar: NaN wherever dof <= 0
            value = np.where(n - ddof > 0, value, np.nan)
        if op in ("std", "nanstd"):
            value = np.sqrt(value)
    elif op in ARG:
        if op.startswith("nan") and not np.all(p[2]):
            raise AllNaNSliceError(f"np.{op}: All-NaN slice encountered")
        value = p[1]
    else:
        raise ValueError(f"unknown reduction {op!r}")
    return np.asarray(value).astype(out_dtype, copy=False)


# -- task functions ------------------------------------------------------------------


STRIP_BYTES = 2**20
"""Height of the strips a block's expression and var partials are evaluated
in, in bytes of one strip (a 2048-wide float64 block: 64 rows). Their
temporaries then stay in a core's L2 cache (2 MiB here) instead of being
fresh block-sized arrays: ``(a - b)`` and var's squared deviations of a
32 MiB block cost 8 and 11 ms as whole-block NumPy calls, mostly page
faults of the new arrays, against ~3 ms in strips."""


def strip_rows(width: int) -> int:
    """Rows of the strips a block ``width`` wide is evaluated in:
    :data:`STRIP_BYTES` of float64, at least one."""
    return max(1, STRIP_BYTES // max(8 * width, 1))


def strip_bound(width):
    """At most this many elements in a strip of a block ``width`` wide (an
    int or an array of widths): :data:`STRIP_BYTES` of float64, or one row."""
    return np.maximum(STRIP_BYTES // 8, width)


def strip_mined(spec, op) -> bool:
    """Whether evaluating ``spec`` for ``op`` makes block-sized temporaries
    (an elementwise op, var's deviations); a bare read reduces in place."""
    while isinstance(spec, Trans):
        spec = spec.x
    return not isinstance(spec, Read) or op in VARIANCES


def _read_leaves(specs, rows, cols, stats, lent: list) -> dict:
    """Every distinct stored region the specs read over ``rows x cols``,
    read once, into this thread's reused block buffers where the region is
    read directly (see :mod:`tilearray.storage.buffers`); buffers used are
    appended to ``lent``."""
    full: dict = {}
    for spec in specs:
        for leaf, r, c in reads(spec, rows, cols):
            key = (leaf, r, c)
            if key in full:
                continue
            buf = buffers.take((r[1] - r[0], c[1] - c[0]), leaf.dtype)
            data = read_region(leaf.ref, r, c, stats, out=buf, inner=leaf.grid.within is not None)
            if data is buf or np.may_share_memory(data, buf):
                lent.append(buf)
            else:  # read through Zarr: the buffer was not touched
                buffers.give(buf)
            full[key] = data
    return full


def _views(spec, rows, cols, full: dict) -> dict:
    """``evaluate``'s read cache for region ``rows x cols``: views of the
    leaf regions already read for the whole block (``full``)."""
    seen = {}
    for leaf, r, c in reads(spec, rows, cols):
        for (fl, fr, fc), data in full.items():
            if fl == leaf and fr[0] <= r[0] and r[1] <= fr[1] and fc[0] <= c[0] \
                    and c[1] <= fc[1]:
                seen[leaf, r, c] = data[r[0] - fr[0] : r[1] - fr[0], c[0] - fc[0] : c[1] - fc[0]]
                break
    return seen


def _owned(part, lent):
    """``part`` with nothing sharing memory with a lent buffer (partials are
    reductions, so this copies only a degenerate one)."""
    if not lent:
        return part
    return tuple(np.array(p, copy=True) if isinstance(p, np.ndarray) and any(
        np.may_share_memory(p, b) for b in lent) else p for p in part)


def _block_partial(spec, op, axis, rows, cols, ncols, deps, stats, full, lent):
    """Partial of ``op`` over block ``rows x cols`` of ``spec``, its reads in
    ``full``: whole, or strip by strip (merged along the reduced axis, joined
    along a kept one) when the expression would make block-sized temporaries.

    A strip's top-level ufunc result and var's deviations go to reused strip
    buffers (appended to ``lent``): a fresh 1 MiB array is above glibc's mmap
    threshold (distributed's MALLOC_TRIM_THRESHOLD_ fixes it at 128 KiB), so
    each would be new pages, faulted in and zeroed."""
    h = rows[1] - rows[0]
    if strip_mined(spec, op) and not has_gather(spec):
        h = strip_rows(cols[1] - cols[0])
    if h >= rows[1] - rows[0]:  # a gather's reads and result shared through ``full``
        seen = full if has_gather(spec) else _views(spec, rows, cols, full)
        x = evaluate(spec, rows, cols, list(deps), stats, _seen=seen)
        return partial(np.asarray(x), op, axis, (rows[0], cols[0]), ncols)
    width = cols[1] - cols[0]
    ufunc = func(spec.name) if isinstance(spec, Op) and not spec.kwargs else None
    if not (isinstance(ufunc, np.ufunc) and ufunc.nout == 1):
        ufunc = None
    result = work = None  # strip buffers, made after the first strip
    merged, joined = None, []
    for s0 in range(rows[0], rows[1], h):
        srows = (s0, min(s0 + h, rows[1]))
        hh = srows[1] - srows[0]
        seen = _views(spec, srows, cols, full)
        if result is not None:
            args = [evaluate(a, srows, cols, list(deps), stats, _seen=seen, whole=False)
                        for a in spec.args]
            x = ufunc(*args, out=result[:hh])
        else:
            x = np.asarray(evaluate(spec, srows, cols, list(deps), stats, _seen=seen))
            if ufunc is not None and x.shape == (h, width) and x.base is None \
                    and x.flags.c_contiguous:
                # every strip's ufunc gets the same operand dtypes: this one's
                # result dtype is theirs
                result = buffers.take((h, width), x.dtype)
                lent.append(result)
        if op in VARIANCES and work is None:
            work = buffers.take((h, width), accumulation_dtype(op, x.dtype) or x.dtype)
            lent.append(work)
        p = partial(x, op, axis, (srows[0], cols[0]), ncols,
                    None if work is None else work[:hh])
        if axis == 1:
            joined.append(p)
        else:
            merged = p if merged is None else merge(op, merged, p)
    if axis == 1:
        return tuple(np.concatenate(c, axis=0) for c in zip(*joined, strict=True))
    return merged


def reduce_map(spec, rows, cols, op, axis, ncols, deps=()):
    return _map([spec], rows, cols, [op], [axis], ncols, deps, many=False)


def reduce_map_many(specs, rows, cols, ops, axes, ncols, deps=()):
    """Partials of several reductions over one block; a stored array they
    share is read once (one read of each region for all)."""
    return _map(specs, rows, cols, ops, axes, ncols, deps, many=True)


def _map(specs, rows, cols, ops, axes, ncols, deps, many):
    stats = IOStats()
    lent: list = []
    try:
        # a gather reads its spans one at a time, once a block: never read first
        full = {} if any(map(has_gather, specs)) else _read_leaves(specs, rows, cols, stats,
                                                                     lent)
        out = tuple(_owned(_block_partial(spec, op, axis, rows, cols, ncols, deps, stats, full,
                                          lent), lent)
                    for spec, op, axis in zip(specs, ops, axes, strict=True))
        del full
    finally:
        for buf in lent:
            buffers.give(buf)
    st = stats.as_dict()
    st["tasks"] = 1
    return (out if many else out[0]), st


def pick(q, result):
    """Partial ``q`` of a :func:`reduce_map_many` result; the shared task's
    stats travel with partial 0 only, so they are counted once."""
    parts, st = result
    return parts[q], counted(st if q == 0 else {})


def reduce_combine(op, *parts):
    part, stats = parts[0][0], merge_stats({}, parts[0][1])
    for p, st in parts[1:]:
        part = merge(op, part, p)
        stats = merge_stats(stats, st)
    return part, counted(stats)


def reduce_final(op, out_dtype, ddof, *parts):
    part, stats = reduce_combine(op, *parts)
    return finalize(op, part, out_dtype, ddof), stats


def concat_final(axis, *finals):
    """Join final values of column (axis=0) or row (axis=1) blocks into one array."""
    values = [f[0] for f in finals]
    stats: dict = {}
    for f in finals:
        stats = merge_stats(stats, f[1])
    stats = counted(stats)
    if axis is None:
        return values[0], stats
    return np.concatenate(values, axis=1 - axis), stats
