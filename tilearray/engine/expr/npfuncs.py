"""NumPy functions on TiledArrays (``np.sum(a, axis=0)``, ``np.dot(a, b)``, ...).

:meth:`TiledArray.__array_function__` looks functions up in ``HANDLED``;
each returns a lazy TiledArray. Anything else raises a TypeError that names
what is supported (like dask, we never silently load a matrix into memory).
Other modules add their own: :mod:`.npshape` (joins, gathers, reshapes,
scans), :mod:`.nporder` (sorting, counting, quantiles), imported below, and
``tilearray.linalg`` (``np.linalg.norm``, ``np.linalg.qr``...).
"""

from __future__ import annotations

import inspect
import operator

import numpy as np

from . import routines, statistics
from .lazy import LazyArray
from .nodes import Elemwise
from .npbase import implements
from .ops import (
    HANDLED,
    INITIAL,
    VARIANCES,
    elemwise,
    matmul,
    nan_as,
    reduce_as,
    reduce_initial,
    with_correction,
)


def _reduction(np_func, op: str):
    sig = inspect.signature(np_func)

    def impl(*args, **kwargs):
        bound = sig.bind(*args, **kwargs).arguments  # only what the caller passed
        a = bound.pop("a")
        axis = bound.pop("axis", None)
        keepdims = bool(bound.pop("keepdims", False))
        dtype = bound.pop("dtype", None)
        ddof = with_correction(bound.pop("ddof", 0), bound.pop("correction", None))
        initial = bound.pop("initial", None) if op in INITIAL else None
        mean = bound.pop("mean", None) if op in VARIANCES else None
        for name, value in bound.items():
            if not (name == "out" and value is None) and not (name == "where" and value is True):
                raise TypeError(f"np.{np_func.__name__}: argument {name}= is not supported "
                                "on TiledArrays")
        if not isinstance(a, LazyArray):
            raise TypeError(f"np.{np_func.__name__}: expected a TiledArray, got {type(a).__name__}")
        if mean is not None:
            return statistics.var_about(op, a, mean, axis, keepdims, ddof, dtype)
        if initial is not None:
            return reduce_initial(op, a, axis, keepdims, dtype, initial)
        return reduce_as(op, a, axis, keepdims, ddof, dtype)

    impl.__name__ = np_func.__name__
    return impl


_REDUCTIONS = {
    np.sum: "sum", np.prod: "prod", np.mean: "mean", np.min: "min", np.amin: "min",
    np.max: "max", np.amax: "max", np.var: "var", np.std: "std", np.any: "any", np.all: "all",
    np.nansum: "nansum", np.nanmean: "nanmean", np.nanmin: "nanmin", np.nanmax: "nanmax",
    np.nanvar: "nanvar", np.nanstd: "nanstd",
    np.count_nonzero: "count_nonzero", np.argmin: "argmin", np.argmax: "argmax",
    np.nanargmin: "nanargmin", np.nanargmax: "nanargmax",
}
for _f, _op in _REDUCTIONS.items():
    HANDLED[_f] = _reduction(_f, _op)


@implements(np.nanprod)
def nanprod(a, axis=None, dtype=None, out=None, keepdims=False, initial=None, where=None):
    """The product with NaNs taken as 1, as :func:`numpy.nanprod` (one pass)."""
    if out is not None or initial is not None or where is not None:
        raise TypeError("np.nanprod: out=, initial= and where= are not supported on TiledArrays")
    return np.prod(nan_as(a, 1), axis=axis, dtype=dtype, keepdims=keepdims)


@implements(np.dot)
def dot(a, b, out=None):
    if out is not None:
        raise TypeError("np.dot: out= is not supported on TiledArrays")
    return matmul(a, b)


@implements(np.transpose)
def transpose(a, axes=None):
    if axes is not None and tuple(axes) != (1, 0):
        raise TypeError(f"np.transpose: axes={axes!r} is not supported (2-D only)")
    return a.T


@implements(np.clip)
def clip(a, a_min=None, a_max=None, out=None, *, min=None, max=None):  # noqa: A002
    if out is not None:
        raise TypeError("np.clip: out= is not supported on TiledArrays")
    return a.clip(a_min if a_min is not None else min, a_max if a_max is not None else max)


@implements(np.round, np.around)
def round_(a, decimals=0, out=None):
    if out is not None:
        raise TypeError("np.round: out= is not supported on TiledArrays")
    return a.round(decimals)


@implements(np.nan_to_num)
def nan_to_num(x, copy=True, nan=0.0, posinf=None, neginf=None):
    """NaN and infinities replaced, as :func:`numpy.nan_to_num` (lazy,
    fused into the reads; ``copy`` is moot: stored data is never changed)."""
    return elemwise("nan_to_num", x, nan=nan, posinf=posinf, neginf=neginf)


@implements(np.ptp)
def ptp(a, axis=None, out=None, keepdims=False):
    """``max - min`` along ``axis``: both reductions share one pass."""
    if out is not None:
        raise TypeError("np.ptp: out= is not supported on TiledArrays")
    if a.dtype == np.bool_:
        raise TypeError("np.ptp: numpy boolean subtract is not supported (as NumPy)")
    return a.max(axis=axis, keepdims=keepdims) - a.min(axis=axis, keepdims=keepdims)


@implements(np.diff)
def diff(a, n=1, axis=-1, prepend=None, append=None):
    """The ``n``-th difference along ``axis``, as :func:`numpy.diff` (lazy).

    ``sum_k (-1)^(n-k) C(n, k) a[k : L-n+k]``: ``n + 1`` shifted slices,
    each read (``a`` is read ``n + 1`` times), combined elementwise in one
    pass (booleans: the exclusive or of the
    slices with an odd ``C(n, k)``, NumPy's ``!=`` chain; integers wrap as
    NumPy's repeated differences do). For ``n >= 2`` floating results may
    differ from NumPy's repeated differences by rounding. ``prepend`` /
    ``append`` (scalars broadcast as NumPy, rows / columns, small results)
    are joined first."""
    if (prepend is not None or append is not None) and a._node.small and \
            not isinstance(prepend, LazyArray) and not isinstance(append, LazyArray):
        kw = {k: v for k, v in (("prepend", prepend), ("append", append)) if v is not None}
        res = np.diff(np.zeros(a.shape, a.dtype), n=n, axis=axis, **kw)  # NumPy's checks
        return type(a)(Elemwise(res.shape, res.dtype, "diff", (a._node,),
                                tuple(sorted({"n": n, "axis": axis, **kw}.items()))))
    if (prepend is not None or append is not None) and a.ndim >= 1 and n != 0:
        ax = routines.axis_index(axis, "np.diff", a.ndim)
        parts = []
        for value, at_end in ((prepend, False), (append, True)):
            if value is None:
                continue
            if not isinstance(value, LazyArray) and np.ndim(value) == 0:  # NumPy's broadcast
                shape = list(a.shape)
                shape[ax] = 1
                value = np.broadcast_to(np.asarray(value), tuple(shape)).copy()
            parts.append((at_end, value))
        joined = [v for e, v in parts if not e] + [a] + [v for e, v in parts if e]
        return diff(np.concatenate(joined, axis=ax), n, ax)
    if not isinstance(n, int | np.integer):  # True is 1, as NumPy
        raise TypeError(f"np.diff: n must be an integer, got {n!r}")
    if n < 0:
        raise ValueError(f"np.diff: order must be non-negative but got {n!r}")
    if a.ndim == 0:
        raise ValueError("np.diff requires input that is at least one dimensional")
    if not -a.ndim <= axis < a.ndim:
        raise np.exceptions.AxisError(axis, a.ndim)
    axis, n, length = axis % a.ndim, int(n), a.shape[axis % a.ndim]

    def shifted(k):
        lo, hi = min(k, length), max(min(length - n + k, length), min(k, length))
        return a[tuple(slice(lo, hi) if i == axis else slice(None) for i in range(a.ndim))]

    if n == 0:
        return a
    if n >= length:
        return shifted(0)  # empty along axis, a's dtype
    from math import comb

    if a.dtype == np.bool_:
        out = None
        for k in range(n + 1):
            if comb(n, k) % 2:
                out = shifted(k) if out is None else out != shifted(k)
        return out
    plus, minus = None, None
    for k in range(n + 1):
        c = comb(n, k)
        if a.dtype.kind in "iu":  # wraps as NumPy's repeated differences do
            coef = np.asarray(c % 2 ** (8 * a.dtype.itemsize)).astype(a.dtype)[()]
        else:
            coef = a.dtype.type(float(c))
        term = shifted(k) if c == 1 else shifted(k) * coef
        if (n - k) % 2 == 0:
            plus = term if plus is None else plus + term
        else:
            minus = term if minus is None else minus + term
    return plus - minus


@implements(np.where)
def where(condition, x=None, y=None):
    """``np.where(cond, x, y)``: elementwise choice, fused into the reads like any
    ufunc. ``np.where(cond)``: ``np.nonzero(cond)``, computed now."""
    if x is None and y is None:  # NumPy: np.nonzero(condition), computed now
        return np.nonzero(condition)
    if x is None or y is None:
        raise ValueError("either both or neither of x and y should be given")
    return elemwise("where", condition, x, y)


@implements(np.shape)
def shape(a):
    return a.shape


@implements(np.ndim)
def ndim(a):
    return a.ndim


@implements(np.size)
def size(a, axis=None):
    return a.size if axis is None else a.shape[axis]


@implements(np.result_type)
def result_type(*arrays_and_dtypes):
    return np.result_type(*(x.dtype if isinstance(x, LazyArray) else x
                            for x in arrays_and_dtypes))


# -- statistics and comparisons (issue 30) -------------------------------------------------

implements(np.cov)(statistics.cov)
implements(np.corrcoef)(statistics.corrcoef)
implements(np.isclose)(statistics.isclose)
implements(np.allclose)(statistics.allclose)
implements(np.average)(statistics.average)


@implements(np.outer)
def outer(a, b, out=None):
    if out is not None:
        raise TypeError("np.outer: out= is not supported on TiledArrays")
    return statistics.outer(a, b)


# -- einsum: the subscripts that are a transpose, a reduction, a product --------------------


@implements(np.tensordot)
def tensordot(a, b, axes=2):
    """:func:`numpy.tensordot` of 1-D / 2-D operands, as the :func:`einsum`
    it is (``axes=1``: ``a @ b``; ``([0], [0])``: ``a.T @ b``; ``2``: the sum
    of the elementwise product)."""
    na, nb = np.ndim(a), np.ndim(b)
    if np.ndim(axes) == 0:
        k = operator.index(axes)
        if not 0 <= k <= min(na, nb):
            raise ValueError(f"np.tensordot: axes={k} for operands of {na} and {nb} dimensions")
        pairs = list(zip(range(na - k, na), range(k), strict=True))
    else:
        xa, xb = (np.atleast_1d(x).tolist() for x in axes)
        if len(xa) != len(xb):
            raise ValueError("shape-mismatch for sum")
        pairs = list(zip((routines.axis_index(x, "np.tensordot", na) for x in xa),
                         (routines.axis_index(x, "np.tensordot", nb) for x in xb), strict=True))
    la, lb = list("ab"[:na]), list("cd"[:nb])
    for i, j in pairs:
        if np.shape(a)[i] != np.shape(b)[j]:
            raise ValueError(f"shape-mismatch for sum: axis {i} of {np.shape(a)} and axis {j} "
                             f"of {np.shape(b)}")
        lb[j] = la[i]
    out = "".join(c for c in la if c not in lb) + "".join(c for c in lb if c not in la)
    return einsum(f"{''.join(la)},{''.join(lb)}->{out}", a, b)


@implements(np.inner)
def inner(a, b):
    """The sum over the last axes: ``a @ b.T`` for matrices."""
    return tensordot(a, b, (-1, -1))


@implements(np.vdot)
def vdot(a, b):
    """The sum of the elementwise product of same-shaped real arrays."""
    if np.shape(a) != np.shape(b):
        raise ValueError(f"np.vdot: shapes {np.shape(a)} and {np.shape(b)} differ (tilearray "
                         "does not flatten matrices)")
    return tensordot(a, b, np.ndim(a))


def _reduce_labels(x, labels: str, out: str):
    """One operand: sum the labels ``out`` lacks, then order the rest as ``out``."""
    if len(set(labels)) < len(labels):  # "ii": the diagonal
        if labels != labels[0] * 2 or out not in ("", labels[0]):
            raise TypeError(f"np.einsum: {labels}->{out} is not supported on TiledArrays")
        if x.shape[0] != x.shape[1]:
            raise ValueError(f"np.einsum: dimensions in operand 0 for collapsing index "
                             f"{labels[0]!r} don't match ({x.shape[0]} != {x.shape[1]})")
        return routines.diagonal(x) if out else np.trace(x, dtype=x.dtype)
    # einsum keeps the operands' dtype (int8 wraps, bool ors), unlike sum
    gone = tuple(i for i, c in enumerate(labels) if c not in out)
    if len(gone) == len(labels):
        return x.sum(dtype=x.dtype)
    if gone:
        x = x.sum(axis=gone[0], dtype=x.dtype)
    kept = "".join(c for c in labels if c in out)
    return x if kept == out else x.T


@implements(np.einsum)
def einsum(subscripts, *operands, out=None, optimize=False, **kwargs):
    """:func:`numpy.einsum` for subscripts that are a transpose, a sum, a
    trace or diagonal, an elementwise product (then summed), a matrix or
    matrix-vector product with one label contracted, or an outer product
    (lazy, as those operations: ``"ij,ij->i"`` is ``(a * b).sum(1)``,
    ``"ij,ik->jk"`` is ``a.T @ b``). Others are refused naming them."""
    if out is not None or kwargs:
        raise TypeError(f"np.einsum: {sorted(kwargs) or ['out']} not supported on TiledArrays")
    if not isinstance(subscripts, str) or "." in subscripts or len(operands) not in (1, 2):
        raise TypeError("np.einsum on TiledArrays takes a subscripts string (no '...') and "
                        "one or two operands")
    spec = subscripts.replace(" ", "")
    bad = sorted({c for c in spec if c not in ",->" and not (c.isascii() and c.isalpha())})
    if bad:
        raise ValueError(f"np.einsum: invalid subscript {bad[0]!r} in {subscripts!r}: "
                         "subscripts must be letters")
    ins, arrow, out_labels = spec.partition("->")
    labels = ins.split(",")
    if len(labels) != len(operands) or any(len(s) != np.ndim(o) for s, o in
                                           zip(labels, operands, strict=True)):
        raise ValueError(f"np.einsum: {subscripts!r} does not match the operands' dimensions")
    seen = "".join(labels)
    if not arrow:  # implicit: the labels seen once, sorted
        out_labels = "".join(sorted(c for c in set(seen) if seen.count(c) == 1))
    if not set(out_labels) <= set(seen) or len(set(out_labels)) != len(out_labels):
        raise ValueError(f"np.einsum: output subscripts of {subscripts!r} must be distinct "
                         "labels of the operands")
    refused = TypeError(f"np.einsum: {subscripts!r} is not supported on TiledArrays (a "
                        "transpose, sum, trace, elementwise or matrix product, outer product)")
    if len(operands) == 1:
        return _reduce_labels(operands[0], labels[0], out_labels)
    (lx, ly), (x, y) = labels, operands
    if len(set(lx)) < len(lx) or len(set(ly)) < len(ly):
        raise refused
    if set(lx) == set(ly):  # elementwise, then summed
        if ly != lx:
            y = y.T
        return _reduce_labels(x * y, lx, out_labels)
    shared = set(lx) & set(ly)
    if not shared and len(lx) == len(ly) == 1 and out_labels in (lx + ly, ly + lx):
        return np.outer(x, y) if out_labels == lx + ly else np.outer(y, x)
    if len(shared) != 1 or shared & set(out_labels):
        raise refused
    (c,) = shared
    rest_x, rest_y = lx.replace(c, ""), ly.replace(c, "")
    if set(rest_x + rest_y) != set(out_labels):
        raise refused
    if len(lx) == 2 and lx[1] != c:
        x = x.T
    if len(ly) == 2 and ly[0] != c:
        y = y.T
    result = x @ y
    return result if rest_x + rest_y == out_labels else result.T


from . import nporder, npshape  # noqa: E402, F401  (they register their functions)
