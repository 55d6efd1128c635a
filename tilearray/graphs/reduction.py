"""Tree reductions: per-block partials, pairwise merges, final values.

A map task evaluates one block of a (fused) expression and emits a partial
result keeping the reduced axis as length 1. Combine tasks merge up to
``split_every`` partials; a final task turns the merged partial into the
value. var/std carry ``(count, mean, M2)`` merged with Chan et al.'s
pairwise update, which is stable where sum-of-squares formulas are not.
Floating inputs narrower than float64 accumulate in float64 and the result
is cast back to NumPy's result dtype (float32 stays float32 to the user).
"""

from __future__ import annotations

import warnings

import numpy as np

from .matmul import counted, merge_stats
from .spec import evaluate

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
MOMENTS = {"mean", "nanmean", "var", "std"}
ARG = {"argmin", "argmax"}
OPS = tuple(SIMPLE) + ("count_nonzero",) + tuple(sorted(MOMENTS)) + tuple(sorted(ARG))
NO_IDENTITY = {"min", "max", "nanmin", "nanmax", "argmin", "argmax"}


def accumulation_dtype(op: str, dtype: np.dtype) -> np.dtype | None:
    """dtype partials accumulate in (None: the block reducer's default)."""
    dtype = np.dtype(dtype)
    if op in ("sum", "nansum", "prod", *MOMENTS) and dtype.kind == "f" and dtype.itemsize < 8:
        return np.dtype("float64")
    if op in ("mean", "nanmean", "var", "std") and dtype.kind in "biu":
        return np.dtype("float64")
    return None


def _quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return fn(*args, **kwargs)


def partial(x: np.ndarray, op: str, axis, offset: tuple[int, int], ncols: int):
    """Partial result of ``op`` over block ``x`` (reduced axes kept as length 1)."""
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
        n = np.full(_kept_shape(x.shape, axis), x.size if axis is None else x.shape[axis])
        if op == "mean":
            return (np.sum(xf, axis=axis, keepdims=True), n)
        mean = _quiet(np.mean, xf, axis=axis, keepdims=True)
        d = np.subtract(xf, mean)  # one temporary, squared in place
        np.multiply(d, d, out=d)
        m2 = np.sum(d, axis=axis, keepdims=True)
        del d
        return (n.astype(np.float64), mean, m2)
    if op in ARG:
        return _arg_partial(x, op, axis, offset, ncols)
    raise ValueError(f"unknown reduction {op!r}")


def _kept_shape(shape, axis):
    if axis is None:
        return (1, 1)
    s = list(shape)
    s[axis] = 1
    return tuple(s)


def _arg_partial(x, op, axis, offset, ncols):
    fn = np.argmin if op == "argmin" else np.argmax
    if axis is None:
        flat = int(fn(x))
        i, j = divmod(flat, x.shape[1])
        val = x[i, j]
        idx = (offset[0] + i) * ncols + (offset[1] + j)
        return (np.array([[val]]), np.array([[idx]], dtype=np.intp))
    loc = fn(x, axis=axis, keepdims=True)
    val = np.take_along_axis(x, loc, axis=axis)
    return (val, loc.astype(np.intp) + offset[axis])


def merge(op: str, p, q):
    """Merge two partials of ``op`` (p comes before q along the reduced axis)."""
    if op in SIMPLE:
        return (SIMPLE[op][1](p[0], q[0]),)
    if op == "count_nonzero" or op in ("mean", "nanmean"):
        return tuple(a + b for a, b in zip(p, q, strict=True))
    if op in ("var", "std"):
        (na, ma, m2a), (nb, mb, m2b) = p, q
        n = na + nb
        with np.errstate(invalid="ignore", divide="ignore"):
            delta = mb - ma
            w = np.where(n > 0, nb / np.where(n > 0, n, 1), 0.0)
            mean = ma + delta * w
            m2 = m2a + m2b + delta**2 * na * w
        return (n, mean, m2)
    if op in ARG:
        (va, ia), (vb, ib) = p, q
        na, nb = _isnan(va), _isnan(vb)
        if op == "argmin":
            take_b = (vb < va) | (nb & ~na)
        else:
            take_b = (vb > va) | (nb & ~na)
        # ties (equal values, or both NaN): the first occurrence in flat order
        take_b |= ((vb == va) | (na & nb)) & (ib < ia)
        return (np.where(take_b, vb, va), np.where(take_b, ib, ia))
    raise ValueError(f"unknown reduction {op!r}")


def _isnan(v):
    v = np.asarray(v)
    return np.isnan(v) if v.dtype.kind in "fc" else np.zeros(v.shape, dtype=bool)


def finalize(op: str, p, out_dtype, ddof: int = 0):
    """Value of a fully merged partial, cast to NumPy's result dtype."""
    if op in SIMPLE or op == "count_nonzero":
        value = p[0]
    elif op in ("mean", "nanmean"):
        with np.errstate(invalid="ignore", divide="ignore"):
            value = p[0] / p[1]
    elif op in ("var", "std"):
        n, _, m2 = p
        with np.errstate(invalid="ignore", divide="ignore"):
            value = m2 / np.maximum(n - ddof, 0)
        if op == "std":
            value = np.sqrt(value)
    elif op in ARG:
        value = p[1]
    else:
        raise ValueError(f"unknown reduction {op!r}")
    return np.asarray(value).astype(out_dtype, copy=False)


# -- task functions ------------------------------------------------------------------


def reduce_map(spec, rows, cols, op, axis, ncols, deps=()):
    from ..storage import IOStats

    stats = IOStats()
    x = evaluate(spec, rows, cols, list(deps), stats)
    part = partial(np.asarray(x), op, axis, (rows[0], cols[0]), ncols)
    st = stats.as_dict()
    st["tasks"] = 1
    return part, st


def reduce_map_many(specs, rows, cols, ops, axes, ncols, deps=()):
    """Partials of several reductions over one block; a stored array they
    share is read once (one ``evaluate`` cache for all)."""
    from ..storage import IOStats

    stats = IOStats()
    seen: dict = {}
    out = []
    for spec, op, axis in zip(specs, ops, axes, strict=True):
        x = evaluate(spec, rows, cols, list(deps), stats, _seen=seen)
        out.append(partial(np.asarray(x), op, axis, (rows[0], cols[0]), ncols))
    del seen
    st = stats.as_dict()
    st["tasks"] = 1
    return tuple(out), st


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
