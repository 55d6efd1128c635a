"""NumPy functions on TiledArrays (``np.sum(a, axis=0)``, ``np.dot(a, b)``, ...).

:meth:`TiledArray.__array_function__` looks functions up in ``HANDLED``;
each returns a lazy TiledArray. Anything else raises a TypeError that names
what is supported (like dask, we never silently load a matrix into memory).
Other modules add their own (``tilearray.linalg`` registers ``np.linalg.norm``).
"""

from __future__ import annotations

import inspect
import operator
import warnings

import numpy as np

from ...errors import PlanningError
from . import routines, selection, statistics
from .lazy import LazyArray
from .nodes import Elemwise, Full
from .ops import HANDLED, elemwise, matmul, reduce_as, wrap_like


def implements(*funcs):
    """Register the decorated function for each NumPy function in ``funcs``."""

    def register(impl):
        for f in funcs:
            HANDLED[f] = impl
        return impl

    return register


def _reduction(np_func, op: str):
    sig = inspect.signature(np_func)

    def impl(*args, **kwargs):
        bound = sig.bind(*args, **kwargs).arguments  # only what the caller passed
        a = bound.pop("a")
        axis = bound.pop("axis", None)
        keepdims = bool(bound.pop("keepdims", False))
        dtype = bound.pop("dtype", None)
        ddof = bound.pop("ddof", bound.pop("correction", 0))
        for name, value in bound.items():
            if not (name == "out" and value is None) and not (name == "where" and value is True):
                raise TypeError(f"np.{np_func.__name__}: argument {name}= is not supported "
                                "on TiledArrays")
        if not isinstance(a, LazyArray):
            raise TypeError(f"np.{np_func.__name__}: expected a TiledArray, got {type(a).__name__}")
        return reduce_as(op, a, axis, keepdims, ddof, dtype)

    impl.__name__ = np_func.__name__
    return impl


_REDUCTIONS = {
    np.sum: "sum", np.prod: "prod", np.mean: "mean", np.min: "min", np.amin: "min",
    np.max: "max", np.amax: "max", np.var: "var", np.std: "std", np.any: "any", np.all: "all",
    np.nansum: "nansum", np.nanmean: "nanmean", np.nanmin: "nanmin", np.nanmax: "nanmax",
    np.nanvar: "nanvar", np.nanstd: "nanstd",
    np.count_nonzero: "count_nonzero", np.argmin: "argmin", np.argmax: "argmax",
}
for _f, _op in _REDUCTIONS.items():
    HANDLED[_f] = _reduction(_f, _op)


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
    differ from NumPy's repeated differences by rounding."""
    if prepend is not None or append is not None:
        raise TypeError("np.diff: prepend= / append= are not supported on TiledArrays")
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


def _small_only(a, name: str, hint: str):
    """``a`` itself when small (in memory), a blocked vector (``x @ w``)
    computed first; a stored matrix is refused."""
    if not isinstance(a, LazyArray):
        raise TypeError(f"np.{name}: expected a TiledArray, got {type(a).__name__}")
    if a._node.small:
        return a
    if a.ndim == 1:
        return np.asarray(a.compute())
    raise TypeError(f"np.{name} of a stored {' x '.join(map(str, a.shape))} matrix is not "
                    f"supported on TiledArrays: {hint}")


def _small_values(a, name: str, hint: str) -> np.ndarray:
    """The values of a small result (see :func:`_small_only`), computed now."""
    a = _small_only(a, name, hint)
    return a if isinstance(a, np.ndarray) else np.asarray(a.compute())


def _given(**kwargs) -> dict:
    """The keywords a caller set (NumPy's newer ones, ``stable=`` 2.0,
    ``sorted=`` 2.3, passed only when set: older NumPy lacks them)."""
    return {k: v for k, v in kwargs.items() if v is not None}


def _ordering(name: str, a, axis, kind, order, stable):
    """np.sort / np.argsort: of a matrix along axis 0 or 1, lazy (whole
    lines in a task, :func:`.routines.sort`); with ``axis=None``, of its
    elements gathered now (:func:`.selection.flat`, when they fit a task);
    of a small result, lazy too (elemwise over the in-memory value); a
    blocked vector is computed first."""
    if order is not None:
        raise TypeError(f"np.{name}: order= (structured arrays) is not supported on TiledArrays")
    if stable is not None and kind is not None:
        raise ValueError(f"np.{name}: `kind` and `stable` parameters can't both be specified.")
    if stable:
        kind = "stable"
    if isinstance(a, LazyArray) and not a._node.small and a.ndim == 2:
        if axis is not None:
            return routines.sort(name, a, axis, kind)
        a = selection.flat(a)  # all elements in one vector: gathered now, when they fit
    a = _small_only(a, name, "")
    kw = _given(kind=kind)
    if isinstance(a, np.ndarray):
        return getattr(np, name)(a, axis=axis, **kw)
    return elemwise(name, a, axis=axis, **kw)


@implements(np.sort)
def sort(a, axis=-1, kind=None, order=None, *, stable=None):
    """Sorted copy, as :func:`numpy.sort`: a matrix along axis 0 or 1 (lazy;
    a task holds whole lines), a small result (a column, a reduction's
    vector) in memory; a blocked vector such as ``x @ w`` is computed first."""
    return _ordering("sort", a, axis, kind, order, stable)


@implements(np.argsort)
def argsort(a, axis=-1, kind=None, order=None, *, stable=None):
    """Indices that sort along an axis, as :func:`numpy.argsort` (see :func:`sort`)."""
    return _ordering("argsort", a, axis, kind, order, stable)


@implements(np.unique)
def unique(ar, return_index=False, return_inverse=False, return_counts=False, axis=None,
           *, equal_nan=True, sorted=None):  # noqa: A002
    """:func:`numpy.unique`, computed now (its size depends on the data): of
    a small result in memory; of a matrix (``axis=None``: all its elements)
    in one pass, each block's distinct values merged up a tree, with
    ``return_counts`` and ``return_index`` (flat, C order) as NumPy's. Meant
    for few distinct values (labels, codes): a task that would hold more than
    its memory allows stops the run with a clear error."""
    if isinstance(ar, LazyArray) and not ar._node.small and ar.ndim == 2:
        return statistics.unique(ar, return_index, return_inverse, return_counts, axis,
                                 equal_nan)
    ar = _small_values(ar, "unique", "take the unique values of a column (np.unique(a[:, j]))")
    return np.unique(ar, return_index=return_index, return_inverse=return_inverse,
                     return_counts=return_counts, axis=axis, equal_nan=equal_nan,
                     **_given(sorted=sorted))


@implements(np.bincount)
def bincount(x, weights=None, minlength=0):
    """:func:`numpy.bincount` of a vector (a column ``a[:, j]``, a
    reduction's result), computed now; NumPy's 1-D rule for matrices."""
    hint = ("count a column (np.bincount(a[:, j])), or all elements with "
            "np.unique(a, return_counts=True)")
    x = _small_values(x, "bincount", hint)
    if isinstance(weights, LazyArray):
        weights = _small_values(weights, "bincount", hint)
    return np.bincount(x, weights=weights, minlength=minlength)


@implements(np.histogram)
def histogram(a, bins=10, range=None, density=None, weights=None):  # noqa: A002
    """:func:`numpy.histogram` of a small result (a column ``a[:, j]``, a
    vector) or of all elements of a matrix (see :mod:`.selection`),
    computed now: ``(counts, bin_edges)`` as NumPy."""
    if isinstance(a, LazyArray) and not a._node.small and a.ndim == 2 and weights is None:
        if isinstance(bins, LazyArray):
            bins = np.asarray(bins.compute())
        return selection.histogram(a, bins, range, density)
    a = _small_values(a, "histogram", "histogram a column (np.histogram(a[:, j])) or a vector")
    if isinstance(weights, LazyArray):
        weights = np.asarray(weights.compute())
    if isinstance(bins, LazyArray):
        bins = np.asarray(bins.compute())
    return np.histogram(a, bins=bins, range=range, density=density, weights=weights)


_TABLE_LIMIT = 65_536
"""Elements of the table ``np.isin`` / ``np.digitize`` carry into every task."""


def _table(values, name: str, what: str) -> tuple:
    """A small NumPy table of an elementwise op (a small result computed
    first), as a tuple (it travels in the op, hashed with it)."""
    if isinstance(values, LazyArray):
        values = _small_values(values, name, f"give the {what} as a NumPy array")
    values = np.asarray(values)
    if values.dtype.kind not in "biuf":
        raise TypeError(f"np.{name}: {what} of dtype {values.dtype} are not supported")
    if values.size > _TABLE_LIMIT:
        raise PlanningError(f"np.{name}: {values.size} {what} (every task carries them; at "
                            f"most {_TABLE_LIMIT})")
    return tuple(values.reshape(-1).tolist())


@implements(np.isin)
def isin(element, test_elements, assume_unique=False, invert=False, *, kind=None):
    """Elementwise membership in a small set (NumPy's values; fused into the reads)."""
    if not isinstance(element, LazyArray):  # a NumPy element against a small result
        return np.isin(element, _small_values(test_elements, "isin", ""), invert=invert)
    table = tuple(np.unique(np.asarray(_table(test_elements, "isin", "test elements"))).tolist())
    return elemwise("isin", element, test_elements=table, invert=bool(invert))


@implements(np.digitize)
def digitize(x, bins, right=False):
    """Elementwise bin numbers against monotonic ``bins`` (fused into the reads)."""
    table = _table(bins, "digitize", "bins")
    b = np.asarray(table)
    if b.ndim != 1 or not (np.all(np.diff(b) >= 0) or np.all(np.diff(b) <= 0)):
        raise ValueError("bins must be monotonically increasing or decreasing")
    return elemwise("digitize", x, bins=table, right=bool(right))


@implements(np.where)
def where(condition, x=None, y=None):
    """``np.where(cond, x, y)``: elementwise choice, fused into the reads like any
    ufunc. The one-argument form (indices of non-zeros) is refused: its size
    is not known before the data is read."""
    if x is None or y is None:
        raise TypeError("np.where(condition) (the indices of non-zero entries) is not "
                        "supported on TiledArrays; use np.where(condition, x, y)")
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


# -- joins, gathers, diagonals, scans (issue 30) ----------------------------------------


@implements(np.concatenate)
def concatenate(arrays, axis=0, out=None, dtype=None, casting="same_kind"):
    if out is not None:
        raise TypeError("np.concatenate: out= is not supported on TiledArrays")
    return routines.concatenate(arrays, axis, dtype)


@implements(np.hstack)
def hstack(tup, *, dtype=None, casting="same_kind"):
    tup = list(tup)
    res = routines.join_small("hstack", tup, dtype)
    return res if res is not None else routines.concatenate(tup, 1, dtype)


@implements(np.vstack)
def vstack(tup, *, dtype=None, casting="same_kind"):
    tup = list(tup)
    res = routines.join_small("vstack", tup, dtype)
    return res if res is not None else routines.concatenate(tup, 0, dtype)


@implements(np.stack)
def stack(arrays, axis=0, out=None, *, dtype=None, casting="same_kind"):
    """Small results (vectors) stack in memory into a matrix; 2-D TiledArrays
    would make a 3-D array: refused."""
    if out is not None:
        raise TypeError("np.stack: out= is not supported on TiledArrays")
    res = routines.join_small("stack", arrays, dtype, axis=axis)
    if res is None:
        raise TypeError("np.stack of 2-D TiledArrays makes a 3-D array; " + routines.NOT_3D)
    if res.ndim > 2:
        raise TypeError(f"np.stack gives shape {res.shape}; tilearray arrays are 1-D or 2-D")
    return res


@implements(np.column_stack)
def column_stack(tup):
    """1-D arrays as columns, 2-D ones as they are, joined along axis 1."""
    tup = list(tup)
    if tup and all(np.ndim(a) == 1 for a in tup):
        res = routines.join_small("stack", tup, axis=1)
        if res is not None:
            return res
    return routines.concatenate([a[:, None] if np.ndim(a) == 1 else a for a in tup], 1)


@implements(np.flip)
def flip(m, axis=None):
    """Reversed along ``axis`` (None: every axis): ``m[::-1]`` and the like."""
    nd = np.ndim(m)
    axes = range(nd) if axis is None else (axis,) if np.ndim(axis) == 0 else axis
    key = [slice(None)] * nd
    for ax in axes:
        key[routines.axis_index(ax, "np.flip", nd)] = slice(None, None, -1)
    return m[tuple(key)]


@implements(np.flipud)
def flipud(m):
    return flip(m, 0)


@implements(np.fliplr)
def fliplr(m):
    if np.ndim(m) < 2:
        raise ValueError("Input must be >= 2-d.")
    return flip(m, 1)


@implements(np.swapaxes)
def swapaxes(a, axis1, axis2):
    nd = np.ndim(a)
    same = routines.axis_index(axis1, "np.swapaxes", nd) == \
        routines.axis_index(axis2, "np.swapaxes", nd)
    return a if same else a.T


@implements(np.moveaxis)
def moveaxis(a, source, destination):
    nd = np.ndim(a)
    src, dst = (np.atleast_1d(x).tolist() for x in (source, destination))
    if len(src) != len(dst):
        raise ValueError("`source` and `destination` arguments must have the same number "
                         "of elements")
    order = [n for n in range(nd) if n not in
             [routines.axis_index(s, "np.moveaxis", nd) for s in src]]
    for d, s in sorted(zip((routines.axis_index(d, "np.moveaxis", nd) for d in dst),
                           (routines.axis_index(s, "np.moveaxis", nd) for s in src),
                           strict=True)):
        order.insert(d, s)
    return a if order == list(range(nd)) else a.T


@implements(np.reshape)
def reshape(a, shape=None, order="C", *, newshape=None, copy=None):
    """See :meth:`TiledArray.reshape`."""
    return a.reshape(shape if shape is not None else newshape, order=order)


@implements(np.ravel)
def ravel(a, order="C"):
    return a.reshape(-1, order=order)


@implements(np.squeeze)
def squeeze(a, axis=None):
    """Drops axes of length 1 (a matrix's single column or row: a 1-D result)."""
    nd, shape = np.ndim(a), np.shape(a)
    axes = [n for n in range(nd) if shape[n] == 1] if axis is None else \
        [routines.axis_index(x, "np.squeeze", nd) for x in np.atleast_1d(axis).tolist()]
    if any(shape[x] != 1 for x in axes):
        raise ValueError("cannot select an axis to squeeze out which has size not equal to one")
    if not axes:
        return a
    if nd == 1 or len(axes) == 2:
        raise TypeError(f"np.squeeze of shape {shape} gives a 0-d result: compute it first "
                        "(float(a[0, 0]))")
    return a[0] if axes == [0] else a[:, 0]


@implements(np.expand_dims)
def expand_dims(a, axis):
    """A 1-D array as a column (``axis=1``) or a row (``axis=0``)."""
    if np.ndim(a) != 1:
        raise TypeError(f"np.expand_dims of shape {np.shape(a)} makes a 3-D array; "
                        + routines.NOT_3D)
    return a[None, :] if routines.axis_index(axis, "np.expand_dims", 2) == 0 else a[:, None]


@implements(np.array_equal)
def array_equal(a1, a2, equal_nan=False):
    """Same shape and elements (one pass, computed now: a bool as NumPy's)."""
    if np.shape(a1) != np.shape(a2):
        return False
    if isinstance(a1, np.ndarray) or isinstance(a2, np.ndarray):  # one is in memory already
        return np.array_equal(np.asarray(a1), np.asarray(a2), equal_nan=equal_nan)
    same = a1 == a2
    if equal_nan:
        same = same | (np.isnan(a1) & np.isnan(a2))
    return bool(same.all())


@implements(np.real)
def real(val):
    if np.dtype(val.dtype).kind == "c":
        raise TypeError("np.real: complex TiledArrays are not supported")
    return val


@implements(np.roll)
def roll(a, shift, axis=None):
    """Rolled along ``axis`` (0 or 1; a tuple rolls each): the two slices
    joined, nothing copied until stored. ``axis=None`` (the flattened
    array) is refused for matrices."""
    if axis is None:
        if np.ndim(a) != 1:
            raise TypeError("np.roll: axis=None (the flattened matrix) is not supported on "
                            "TiledArrays; give axis=0 or axis=1")
        axis = 0
    shifts, axes = np.broadcast_arrays(np.asarray(shift), np.asarray(axis))
    for s, ax in zip(shifts.reshape(-1).tolist(), axes.reshape(-1).tolist(), strict=True):
        ax = routines.axis_index(ax, "np.roll", np.ndim(a))
        size = np.shape(a)[ax]
        k = s % size if size else 0
        if k:
            key = [slice(None)] * np.ndim(a)
            head, tail = list(key), list(key)
            head[ax], tail[ax] = slice(size - k, None), slice(None, size - k)
            a = concatenate([a[tuple(head)], a[tuple(tail)]], axis=ax)
    return a


@implements(np.tile)
def tile(A, reps):
    """``A`` repeated ``reps`` times along each axis (a join of itself: each
    copy read where a block meets it)."""
    reps = tuple(np.atleast_1d(reps).tolist())
    if np.ndim(A) != 2 or len(reps) > 2 or any(r < 1 for r in reps):
        raise TypeError(f"np.tile: reps={reps!r} of shape {np.shape(A)}: tilearray tiles a "
                        "matrix by at most 2 positive counts")
    reps = (1,) * (2 - len(reps)) + reps
    for ax, r in enumerate(reps):
        if r > 1:
            A = concatenate([A] * r, axis=ax)
    return A


PAD_GATHERS = ("edge", "reflect", "symmetric", "wrap")
"""np.pad modes that only repeat existing elements: one gather per axis."""


@implements(np.pad)
def pad(array, pad_width, mode="constant", **kwargs):
    """:func:`numpy.pad` of a matrix, lazy: ``constant`` joins constant
    blocks (nothing read for them); ``edge``, ``reflect``, ``symmetric`` and
    ``wrap`` gather, along each axis, the positions NumPy's own pad gives
    ``np.arange(n)`` (each block reads the units its positions meet). A small result: NumPy's pad in
    memory. Other modes (statistics, ramps) are refused with a message."""
    a = array
    if not isinstance(a, LazyArray):
        raise TypeError(f"np.pad: expected a TiledArray, got {type(a).__name__}")
    if a._node.small or a.ndim == 1:
        values = _small_values(a, "pad", "")
        return selection.held(a, np.pad(values, pad_width, mode, **kwargs))
    widths = np.broadcast_to(np.asarray(pad_width, dtype=np.int64), (2, 2))
    if (widths < 0).any():
        raise ValueError(f"index can't contain negative values: pad_width={pad_width!r}")
    if mode == "constant":
        extra = set(kwargs) - {"constant_values"}
        values = np.broadcast_to(np.asarray(kwargs.get("constant_values", 0)), (2, 2))
    elif mode in PAD_GATHERS:
        extra = set(kwargs) - ({"reflect_type"} if mode in ("reflect", "symmetric") else set())
        if kwargs.get("reflect_type", "even") != "even":
            raise TypeError(f"np.pad(mode={mode!r}, reflect_type='odd') is not supported on "
                            "TiledArrays (it computes new values): use reflect_type='even'")
    else:
        raise TypeError(f"np.pad(mode={mode!r}) is not supported on TiledArrays: modes "
                        f"'constant', {', '.join(repr(m) for m in PAD_GATHERS)}")
    if extra:
        raise TypeError(f"np.pad: unsupported keyword arguments for mode {mode!r}: "
                        f"{sorted(extra)}")
    for ax in (0, 1):  # NumPy's order: axis 0 first (the corners take axis 1's)
        before, after = (int(w) for w in widths[ax])
        if before == after == 0:
            continue
        size = a.shape[ax]
        if mode != "constant":
            if size == 0:
                raise ValueError(f"can't extend empty axis {ax} using modes other than "
                                 "'constant' or 'empty'")
            positions = np.pad(np.arange(size), (before, after), mode, **kwargs)
            a = routines.take(a, positions, ax)
            continue
        parts = []
        for width, fill in ((before, values[ax][0]), (after, values[ax][1])):
            shape = (width, a.shape[1]) if ax == 0 else (a.shape[0], width)
            fill = np.asarray(fill).astype(a.dtype)[()]  # NumPy casts the value
            parts.append(wrap_like(a, Full(shape, a.dtype, fill)))
        a = concatenate([p for p in (parts[0], a, parts[1]) if 0 not in p.shape] or [a], axis=ax)
    return a


@implements(np.repeat)
def repeat(a, repeats, axis=None):
    """Each row (``axis=0``) or column (``axis=1``) repeated: a gather of the
    positions ``np.repeat(np.arange(n), repeats)``."""
    if np.ndim(a) == 1 and a._node.small:  # a small vector: in memory (lazy), as NumPy
        reps = repeats if np.ndim(repeats) == 0 else tuple(np.asarray(repeats).tolist())
        shape = np.repeat(np.empty(a.shape, bool), reps, axis).shape  # NumPy's checks
        return wrap_like(a, Elemwise(shape, a.dtype, "repeat", (a._node,),
                                     (("axis", axis), ("repeats", reps))))
    if np.ndim(a) == 1:  # a blocked product (x @ w): computed first
        return np.repeat(_small_values(a, "repeat", ""), repeats, axis)
    if axis is None:
        raise TypeError("np.repeat: axis=None (the flattened array) is not supported on "
                        "TiledArrays; give axis=0 or axis=1")
    ax = routines.axis_index(axis, "np.repeat", np.ndim(a))
    return routines.take(a, np.repeat(np.arange(np.shape(a)[ax]), repeats), ax)


@implements(np.searchsorted)
def searchsorted(a, v, side="left", sorter=None):
    """On a small sorted 1-D result (computed now): NumPy's answer."""
    values = a if not isinstance(a, LazyArray) else \
        _small_values(a, "searchsorted", "search a column's sorted values")
    if isinstance(v, LazyArray):
        v = _small_values(v, "searchsorted", "search for a small result's values")
    srt = _small_values(sorter, "searchsorted", "") if isinstance(sorter, LazyArray) else sorter
    return np.searchsorted(values, v, side=side, sorter=srt)


def _positions(name: str):
    np_func = getattr(np, name)

    def impl(a):
        return np_func(_small_values(a, name, "take the positions of a column "
                                     f"(np.{name}(a[:, j] > 0)) or mask rows with a[mask]"))

    impl.__name__ = name
    return impl


for _name in ("nonzero", "flatnonzero", "argwhere"):
    HANDLED[getattr(np, _name)] = _positions(_name)


@implements(np.take)
def take(a, indices, axis=None, out=None, mode="raise"):
    if out is not None or mode != "raise":
        raise TypeError("np.take: out= and mode= are not supported on TiledArrays")
    return routines.take(a, indices, axis)


implements(np.diagonal)(routines.diagonal)
implements(np.diag)(routines.diag)


@implements(np.triu)
def triu(m, k=0):
    return routines.tri(m, k, upper=True)


@implements(np.tril)
def tril(m, k=0):
    return routines.tri(m, k, upper=False)


@implements(np.trace)
def trace(a, offset=0, axis1=0, axis2=1, dtype=None, out=None):
    if out is not None:
        raise TypeError("np.trace: out= is not supported on TiledArrays")
    return routines.trace(a, offset, axis1, axis2, dtype)




def _scan(op):
    def impl(a, axis=None, dtype=None, out=None):
        if out is not None:
            raise TypeError(f"np.{op}: out= is not supported on TiledArrays")
        return routines.scan(op, a, axis, dtype)

    impl.__name__ = op
    return impl


HANDLED[np.cumsum], HANDLED[np.cumprod] = _scan("cumsum"), _scan("cumprod")


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


def _quantile(name: str, op: str, scale: float):
    def impl(a, q=None, axis=None, out=None, overwrite_input=False, method="linear",
             keepdims=False, *, weights=None, interpolation=None):
        if out is not None or weights is not None or interpolation is not None:
            raise TypeError(f"np.{name}: out=, weights= and interpolation= are not supported "
                            "on TiledArrays")
        qv = np.asarray(q, dtype=np.float64) / scale
        # NumPy's result dtype (NEP 50: a Python float q keeps float32 data float32)
        dtype = np.asarray(np_func(np.ones((2, 2), a.dtype), q, axis=0, method=method)).dtype
        return statistics.quantile(op, a, qv, axis, method, keepdims, dtype)

    np_func = getattr(np, name)
    impl.__name__ = name
    return impl


for _f, _op, _scale in [(np.quantile, "quantile", 1.0), (np.nanquantile, "nanquantile", 1.0),
                        (np.percentile, "quantile", 100.0),
                        (np.nanpercentile, "nanquantile", 100.0)]:
    HANDLED[_f] = _quantile(_f.__name__, _op, _scale)


def _median(name: str):
    np_func = getattr(np, name)

    def impl(a, axis=None, out=None, overwrite_input=False, keepdims=False):
        """NumPy's median: the mean of the middle one or two (not the 0.5 quantile's lerp)."""
        if out is not None:
            raise TypeError(f"np.{name}: out= is not supported on TiledArrays")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            dtype = np.asarray(np_func(np.ones((2, 2), a.dtype), axis=0)).dtype
        return statistics.quantile(name, a, 0.5, axis, "linear", keepdims, dtype)

    impl.__name__ = name
    return impl


HANDLED[np.median], HANDLED[np.nanmedian] = _median("median"), _median("nanmedian")


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
