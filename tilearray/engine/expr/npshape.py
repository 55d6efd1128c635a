"""NumPy's joins, gathers, reshapes, diagonals and scans on TiledArrays:
``np.concatenate`` / ``stack`` / ``hstack``, ``np.flip``, ``np.reshape`` /
``ravel``, ``np.pad`` / ``roll`` / ``tile`` / ``repeat``, ``np.take``,
``np.diagonal`` / ``trace`` / ``triu``, ``np.cumsum`` and the other scans,
``np.rot90``, ``np.delete`` / ``np.append``, ``np.block``, ``np.gradient``,
``np.atleast_2d``: lazy, each
read only where a block meets it (see the README's table)."""

from __future__ import annotations

import operator

import numpy as np

from . import routines, selection
from .lazy import LazyArray
from .nodes import Elemwise, Full
from .npbase import implements, small_values
from .ops import HANDLED, elemwise, nan_as, wrap_like


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
    """1-D operands are rows ``(1, n)``, as NumPy (``np.vstack([a, a.mean(0)])``)."""
    tup = list(tup)
    res = routines.join_small("vstack", tup, dtype)
    if res is not None:
        return res
    return routines.concatenate([np.reshape(a, (1, -1)) if np.ndim(a) == 1 else a
                                 for a in tup], 0, dtype)


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
    array): of a matrix, a small result (its elements gathered now, when
    they fit a task)."""
    if axis is None:
        if np.ndim(a) != 1:  # the flattened matrix (gathered now, if it fits), reshaped back
            return roll(a.reshape(-1), shift, 0).reshape(a.shape)
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
    if np.ndim(A) not in (1, 2) or len(reps) > 2 or any(r < 0 for r in reps):
        raise TypeError(f"np.tile: reps={reps!r} of shape {np.shape(A)}: tilearray tiles a "
                        "vector or a matrix by at most 2 counts")
    if 0 in reps:  # an empty result, NumPy's shape
        return selection.held(A, np.tile(np.empty(np.shape(A), A.dtype), reps))
    if np.ndim(A) == 1 and len(reps) == 1:  # a vector stays a vector, as NumPy
        return concatenate([A] * reps[0]) if reps[0] > 1 else A
    if np.ndim(A) == 1:
        A = A.reshape(1, -1)
    reps = (1,) * (2 - len(reps)) + reps
    for ax, r in enumerate(reps):
        if r > 1:
            A = concatenate([A] * r, axis=ax)
    return A


PAD_GATHERS = ("edge", "reflect", "symmetric", "wrap")
"""np.pad modes that only repeat existing elements: one gather per axis."""


def _grown(shape, ax: int, by: int) -> tuple:
    return (shape[0] + by, shape[1]) if ax == 0 else (shape[0], shape[1] + by)


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
        values = small_values(a, "pad", "")
        return selection.held(a, np.pad(values, pad_width, mode, **kwargs))
    widths = np.asarray(pad_width)
    if widths.dtype.kind not in "iu":
        raise TypeError("`pad_width` must be of integral type.")
    widths = np.broadcast_to(widths.astype(np.int64), (2, 2))
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
        raise ValueError(f"unsupported keyword arguments for mode {mode!r}: {sorted(extra)}")
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
            if np.dtype(a.dtype).kind in "iu" and not np.isfinite(np.asarray(fill, float)):
                raise ValueError(f"cannot convert float {fill} to integer")  # NumPy's error
            fill = np.full((), fill, a.dtype)[()]  # NumPy's cast (7.6 -> 7 for integers)
            parts.append(wrap_like(a, Full(shape, a.dtype, fill)))
        a = concatenate([p for p in (parts[0], a, parts[1]) if p.shape[ax]], axis=ax) \
            if a.shape[1 - ax] else wrap_like(a, Full(_grown(a.shape, ax, before + after),
                                                      a.dtype, 0))
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
        return np.repeat(small_values(a, "repeat", ""), repeats, axis)
    if axis is None:  # the flattened matrix: gathered now (if it fits), then in memory
        return repeat(a.reshape(-1), repeats, 0)
    ax = routines.axis_index(axis, "np.repeat", np.ndim(a))
    return routines.take(a, np.repeat(np.arange(np.shape(a)[ax]), repeats), ax)


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


def _nan_scan(op: str, fill: int):
    def impl(a, axis=None, dtype=None, out=None):
        if out is not None:
            raise TypeError(f"np.nan{op}: out= is not supported on TiledArrays")
        return routines.scan(op, nan_as(a, fill), axis, dtype)  # NaN: 0 (sum), 1 (product)

    impl.__name__ = f"nan{op}"
    return impl


HANDLED[np.nancumsum], HANDLED[np.nancumprod] = _nan_scan("cumsum", 0), _nan_scan("cumprod", 1)


@implements(np.rot90)
def rot90(m, k=1, axes=(0, 1)):
    """Rotated by 90 degrees ``k`` times in the plane of ``axes``: a reversed
    view, transposed (nothing is copied until stored)."""
    axes = tuple(axes)
    if len(axes) != 2:
        raise ValueError("len(axes) must be 2.")
    nd = np.ndim(m)
    ax = tuple(routines.axis_index(a, "np.rot90", nd) for a in axes)
    if ax[0] == ax[1]:
        raise ValueError("Axes must be different.")
    k = operator.index(k) % 4
    if ax == (1, 0):
        k = -k % 4
    return (m[:, :], m[:, ::-1].T, m[::-1, ::-1], m[::-1, :].T)[k]


def _positions_of(obj, size: int, axis: int, fn: str) -> np.ndarray:
    """The positions ``obj`` names along an axis of ``size`` (a slice, integers
    counting from the end when negative, or a boolean mask), as NumPy checks them."""
    if isinstance(obj, slice):
        return np.arange(size)[obj]
    if isinstance(obj, LazyArray):
        obj = small_values(obj, fn, "")
    idx = np.asarray(obj)
    if idx.dtype == bool:
        if idx.shape != (size,):
            raise ValueError(f"boolean array argument obj to {fn} must be one dimensional and "
                             f"match the axis length of {size}")
        return np.flatnonzero(idx)
    if idx.size and idx.dtype.kind not in "iu":
        raise IndexError("arrays used as indices must be of integer (or boolean) type")
    idx = idx.reshape(-1).astype(np.int64)
    bad = (idx < -size) | (idx >= size)
    if bad.any():
        raise IndexError(f"index {int(idx[bad][0])} is out of bounds for axis {axis} with "
                         f"size {size}")
    return idx % max(size, 1)


@implements(np.delete)
def delete(arr, obj, axis=None):
    """Without the rows (``axis=0``) or columns (``axis=1``) ``obj`` names: the
    runs kept, joined lazily (a gather of the kept positions when they are
    many runs). ``axis=None`` on a matrix (flattening) is refused."""
    nd = np.ndim(arr)
    if axis is None and nd != 1:
        raise TypeError("np.delete: axis=None deletes from the flattened matrix, which is not "
                        "supported on TiledArrays; give axis=0 (rows) or axis=1 (columns)")
    ax = routines.axis_index(0 if axis is None else axis, "np.delete", nd)
    size = arr.shape[ax]
    keep = np.setdiff1d(np.arange(size), _positions_of(obj, size, ax, "delete"))
    breaks = np.flatnonzero(np.diff(keep) != 1) + 1
    runs = [(int(r[0]), int(r[-1]) + 1) for r in np.split(keep, breaks) if r.size]
    if len(runs) > 16 or not runs:  # many holes: one gather of what is kept
        return routines.take(arr, keep, ax) if nd == 2 else arr[keep]
    key = [slice(None)] * nd
    parts = []
    for r0, r1 in runs:
        key[ax] = slice(r0, r1)
        parts.append(arr[tuple(key)])
    return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=ax)


@implements(np.append)
def append(arr, values, axis=None):
    """``values`` joined after ``arr`` along ``axis`` (np.concatenate); with
    ``axis=None`` both flattened first, as NumPy."""
    if axis is None:
        return np.concatenate([np.ravel(arr), np.ravel(values)], axis=0)
    return np.concatenate([arr, values], axis=axis)


@implements(np.block)
def block(arrays):
    """NumPy's ``np.block``: the innermost lists joined along the last axis,
    the lists holding them along the one before (``[[A, B], [C, D]]``);
    1-D parts and scalars become rows. Built from ``np.concatenate``: lazy."""
    def depth(x, where):
        if isinstance(x, tuple):
            raise TypeError(f"np.block: {where} is a tuple; only lists arrange blocks")
        if not isinstance(x, list):
            return 0, [x]
        if not x:
            raise ValueError(f"np.block: {where} is an empty list")
        found = [depth(v, f"{where}[{i}]") for i, v in enumerate(x)]
        if len({d for d, _ in found}) > 1:
            raise ValueError(f"np.block: list depths are mismatched under {where}")
        return found[0][0] + 1, [leaf for _, leaves in found for leaf in leaves]

    nest, leaves = depth(arrays, "arrays")
    nd = max([nest] + [np.ndim(a) for a in leaves])
    if nd > 2:
        raise ValueError(f"np.block would give a {nd}-D array; tilearray arrays are 1-D or 2-D")

    def join(x, level):
        if level == nest:  # a part, as a row (1, n) / (1, 1) when the result is a matrix
            return x if np.ndim(x) == nd else \
                np.reshape(x, (1,) * (nd - np.ndim(x)) + np.shape(x))
        return np.concatenate([join(v, level + 1) for v in x], axis=level - nest)

    return join(arrays, 0)


@implements(np.gradient)
def gradient(f, *varargs, axis=None, edge_order=1):
    """NumPy's ``np.gradient``: central differences inside, one-sided ones
    (of ``edge_order`` 1 or 2) at the ends, along ``axis`` (None: each axis,
    a tuple of results); spacings a scalar or the coordinates (a 1-D NumPy
    array) per axis, as NumPy. Lazy: slices of ``f`` joined."""
    nd = np.ndim(f)
    axes = list(range(nd)) if axis is None else \
        [routines.axis_index(a, "np.gradient", nd) for a in np.atleast_1d(axis).tolist()]
    if len(varargs) == 0:
        spacing = [1.0] * len(axes)
    elif len(varargs) == 1 and np.ndim(varargs[0]) == 0:
        spacing = list(varargs) * len(axes)
    elif len(varargs) == len(axes):
        spacing = list(varargs)
    else:
        raise TypeError("np.gradient: invalid number of arguments (one spacing, or one per axis)")
    if edge_order not in (1, 2):
        raise ValueError("'edge_order' greater than 2 not supported")
    if np.dtype(f.dtype).kind == "b":
        raise TypeError("np.gradient: numpy boolean subtract, the `-` operator, is not "
                        "supported (as NumPy's); use astype first")
    if np.dtype(f.dtype).kind in "iu":
        f = f.astype(np.float64)
    res = tuple(_gradient(f, ax, h, edge_order) for ax, h in zip(axes, spacing, strict=True))
    return res[0] if len(res) == 1 else res


def _gradient(f, axis: int, h, edge_order: int):
    n = f.shape[axis]
    if n < edge_order + 1:
        raise ValueError("Shape of array too small to calculate a numerical gradient, at least "
                         "(edge_order + 1) elements are required.")

    def at(start, stop=0):  # f's lines start:stop along the axis (line start alone)
        key = [slice(None)] * np.ndim(f)
        key[axis] = slice(start, start + 1 or None if stop == 0 else stop)
        return f[tuple(key)]

    def along(v):  # a vector of coefficients, one per line along the axis
        return np.reshape(v, (-1,) + (1,) * (np.ndim(f) - 1 - axis))

    uniform = np.ndim(h) == 0  # else the coordinates along the axis
    if not uniform:
        x = np.asarray(h)
        if x.shape != (n,):
            raise ValueError(f"np.gradient: the coordinates along axis {axis} must be a 1-D "
                             f"array of length {n}, got shape {x.shape}")
        dx = np.diff(x).astype(np.result_type(x.dtype, np.float64))
    parts = []
    if edge_order == 1:
        parts.append((at(1) - at(0)) / (h if uniform else dx[0]))
    elif uniform:
        parts.append((-1.5 * at(0) + 2.0 * at(1) - 0.5 * at(2)) / h)
    else:
        d1, d2 = dx[0], dx[1]
        parts.append(-(2 * d1 + d2) / (d1 * (d1 + d2)) * at(0) + (d1 + d2) / (d1 * d2) * at(1)
                     - d1 / (d2 * (d1 + d2)) * at(2))
    if n > 2:
        if uniform:
            parts.append((at(2, None) - at(0, -2)) / (2.0 * h))
        else:
            d1, d2 = dx[:-1], dx[1:]
            parts.append(along(-d2 / (d1 * (d1 + d2))) * at(0, -2) +
                         along((d2 - d1) / (d1 * d2)) * at(1, -1) +
                         along(d1 / (d2 * (d1 + d2))) * at(2, None))
    if edge_order == 1:
        parts.append((at(-1) - at(-2)) / (h if uniform else dx[-1]))
    elif uniform:
        parts.append((0.5 * at(-3) - 2.0 * at(-2) + 1.5 * at(-1)) / h)
    else:
        d1, d2 = dx[-2], dx[-1]
        parts.append(d2 / (d1 * (d1 + d2)) * at(-3) - (d2 + d1) / (d1 * d2) * at(-2)
                     + (2 * d2 + d1) / (d2 * (d1 + d2)) * at(-1))
    # NumPy's out= is f's dtype: float64 coefficients give float32 f a float32 result
    return np.concatenate(parts, axis=axis, dtype=f.dtype)


@implements(np.atleast_2d)
def atleast_2d(*arys):
    """A matrix as it is; a 1-D array as the row ``(1, n)``."""
    res = [a if np.ndim(a) >= 2 else np.reshape(a, (1, -1)) for a in arys]
    return res[0] if len(res) == 1 else tuple(res)


@implements(np.atleast_1d)
def atleast_1d(*arys):
    res = [a if np.ndim(a) >= 1 else np.reshape(a, (1,)) for a in arys]
    return res[0] if len(res) == 1 else tuple(res)


def _like(fill_of):
    def impl(a, *args, dtype=None, order="K", subok=True, shape=None, **kw):
        fill = fill_of(args, kw)
        shape = tuple(a.shape) if shape is None else \
            tuple(operator.index(d) for d in np.atleast_1d(shape).tolist())
        if any(d < 0 for d in shape):
            raise ValueError(f"np.{impl.__name__}: negative dimensions are not allowed, "
                             f"shape={shape}")
        if len(shape) > 2:
            raise ValueError(f"np.{impl.__name__}: TiledArrays have at most 2 dimensions, "
                             f"shape={shape}")
        dt = np.dtype(dtype) if dtype is not None else a.dtype
        if len(shape) == 2 and not a._node.small:  # a lazy matrix of one value: nothing is read
            return wrap_like(a, Full(shape, dt, dt.type(fill)))
        return wrap_like(a, Elemwise(shape, dt, "full", (),
                                     (("shape", shape), ("fill_value", dt.type(fill)),
                                      ("dtype", dt))))

    return impl


for _f, _fill in [(np.zeros_like, lambda args, kw: 0), (np.ones_like, lambda args, kw: 1),
                  (np.empty_like, lambda args, kw: 0),
                  (np.full_like, lambda args, kw: args[0] if args else kw.pop("fill_value"))]:
    HANDLED[_f] = _like(_fill)
    HANDLED[_f].__name__ = _f.__name__


def _split(ary, indices_or_sections, axis, equal: bool, fn: str) -> list:
    """Lazy pieces along ``axis`` (slices: each read only when used), as
    :func:`numpy.array_split`; ``equal``: ``np.split``'s refusal of unequal sections."""
    ax = routines.axis_index(axis, fn, np.ndim(ary))
    size = ary.shape[ax]
    if np.ndim(indices_or_sections) == 0:
        parts = operator.index(indices_or_sections)
        if parts <= 0:
            raise ValueError("number sections must be larger than 0.")
        if equal and size % parts:
            raise ValueError("array split does not result in an equal division")
        base, extra = divmod(size, parts)
        cuts = np.cumsum([0] + [base + 1] * extra + [base] * (parts - extra)).tolist()
    else:
        cuts = [0, *[min(max(int(i) if i >= 0 else size + int(i), 0), size)
                     for i in indices_or_sections], size]
    key = [slice(None)] * np.ndim(ary)
    out = []
    for c0, c1 in zip(cuts, cuts[1:], strict=False):
        key[ax] = slice(c0, max(c0, c1))
        out.append(ary[tuple(key)])
    return out


@implements(np.array_split)
def array_split(ary, indices_or_sections, axis=0):
    return _split(ary, indices_or_sections, axis, False, "np.array_split")


@implements(np.split)
def split(ary, indices_or_sections, axis=0):
    return _split(ary, indices_or_sections, axis, True, "np.split")


def _signed_inf(positive: bool):
    def impl(x, out=None):
        if out is not None:
            raise TypeError("out= is not supported on TiledArrays")
        side = elemwise("greater" if positive else "less", x, 0)
        return elemwise("logical_and", elemwise("isinf", x), side)

    impl.__name__ = "isposinf" if positive else "isneginf"
    return impl


HANDLED[np.isposinf], HANDLED[np.isneginf] = _signed_inf(True), _signed_inf(False)


@implements(np.fix)
def fix(x, out=None):
    """Rounded toward zero, as :func:`numpy.fix` (floats stay floats)."""
    if out is not None:
        raise TypeError("np.fix: out= is not supported on TiledArrays")
    return elemwise("trunc", x) if np.dtype(x.dtype).kind == "f" else x


@implements(np.select)
def select(condlist, choicelist, default=0):
    """``np.select``: the first true condition's choice, elementwise (nested
    ``np.where``, fused into the reads)."""
    condlist, choicelist = list(condlist), list(choicelist)
    if len(condlist) != len(choicelist):
        raise ValueError("list of cases must be same length as list of conditions")
    if not condlist:
        raise ValueError("select with an empty condition list is not possible")
    out = default
    for cond, choice in zip(reversed(condlist), reversed(choicelist), strict=True):
        out = elemwise("where", cond, choice, out)
    return out


@implements(np.extract)
def extract(condition, arr):
    """``arr[condition]`` of a 2-D mask: the elements, in C order (see ``a[mask]``)."""
    return arr[condition]


@implements(np.compress)
def compress(condition, a, axis=None, out=None):
    """The rows (``axis=0``) or columns (``axis=1``) where ``condition`` is
    true, as :func:`numpy.compress` (a shorter condition selects from the first)."""
    if out is not None or axis is None:
        raise TypeError("np.compress: give axis=0 or 1 (axis=None flattens the matrix) and "
                        "no out= on TiledArrays")
    ax = routines.axis_index(axis, "np.compress", np.ndim(a))
    cond = np.asarray(condition.compute() if isinstance(condition, LazyArray) else condition,
                      dtype=bool).reshape(-1)
    if cond.size > a.shape[ax]:
        raise IndexError(f"index {cond.size - 1} is out of bounds for axis {ax} with size "
                         f"{a.shape[ax]}")
    return routines.take(a, np.flatnonzero(cond), ax)
