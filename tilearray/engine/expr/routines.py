"""Builders of the NumPy routines beyond elementwise ops and reductions:
joins (``concatenate``), gathers (``take``, integer and boolean indexing),
diagonals, scans. Each checks its operands like NumPy and returns a lazy
array; nothing is read here -- except a boolean mask that is itself a lazy
result, which is computed when it indexes (its shape is the result's)."""

from __future__ import annotations

import operator

import numpy as np
from dask.base import tokenize

from ...errors import PlanningError
from ...graphs.spec import SCANS
from . import selection
from .nodes import (
    Concat,
    Constant,
    Diagonal,
    Elemwise,
    Full,
    Node,
    Points,
    Positions,
    Scan,
    Sort,
    Take,
)
from .ops import ExprBase, as_node, build_reduction, held, reduce_as, wrap_like

NOT_3D = ("tilearray matrices are 2-D; use np.concatenate, np.hstack or np.vstack for a "
          "2-D result")


def _operand(x, fn: str) -> Node:
    if isinstance(x, np.ndarray):
        raise TypeError(f"{fn}: a NumPy array operand (shape {x.shape}) is not supported; store "
                        "it with ta.from_numpy(x, path) first")
    if not isinstance(x, ExprBase):
        raise TypeError(f"{fn}: operands must be TiledArrays, got {type(x).__name__}")
    return as_node(x)


def join_small(how: str, arrays, dtype=None, **kw) -> ExprBase | None:
    """``np.<how>`` (concatenate, stack, hstack, vstack) of small results
    (reductions' vectors, 1-D arrays), in memory on a worker; None when
    some operand is a matrix."""
    arrays = list(arrays)
    nodes = [as_node(a) if isinstance(a, ExprBase) else a for a in arrays]
    if not nodes or not any(isinstance(n, Node) for n in nodes) or \
            not all(isinstance(n, Node) and n.small for n in nodes):
        return None
    samples = [np.zeros(n.shape, n.dtype) for n in nodes]
    res = getattr(np, how)(samples, dtype=dtype, **kw)
    kwargs = (("how", how),) + tuple(sorted(kw.items())) + \
        ((("dtype", np.dtype(dtype)),) if dtype is not None else ())
    first = next(a for a in arrays if isinstance(a, ExprBase))
    return wrap_like(first, Elemwise(res.shape, res.dtype, "join", tuple(nodes), kwargs))


def concatenate(arrays, axis=0, dtype=None) -> ExprBase:
    """``np.concatenate`` of 2-D TiledArrays along axis 0 or 1 (``None``:
    each flattened, as NumPy, then joined as a vector): lazy, each
    piece read in place when a block of the result needs it (a task reads
    only the pieces its block meets); nothing is copied until stored."""
    arrays = list(arrays)
    if not arrays:
        raise ValueError("need at least one array to concatenate")
    if axis is None:  # NumPy's: each flattened (row-major), then joined
        return concatenate([np.ravel(a) for a in arrays], axis=0, dtype=dtype)
    nodes = [as_node(a) if isinstance(a, np.ndarray) and a.ndim in (1, 2) else
             _operand(a, "concatenate") for a in arrays]
    if all(n.small for n in nodes) and any(isinstance(a, ExprBase) for a in arrays):
        return join_small("concatenate", [n if isinstance(a, np.ndarray) else a
                                          for a, n in zip(arrays, nodes, strict=True)],
                          dtype, axis=axis)
    axis = axis_index(axis, "concatenate")
    other = 1 - axis
    # a small part is a column (m, 1) in an hstack or a row (1, n) in a vstack, or
    # a NumPy matrix (sliced in memory)
    if any(n.ndim != 2 or (n.small and n.shape[axis] != 1 and not isinstance(n, Constant))
           for n in nodes) or all(n.small for n in nodes):
        raise PlanningError("concatenate: 2-D matrices are joined, with columns (m, 1) along "
                            "axis 1 or rows (1, n) along axis 0 of small results; "
                            f"got shapes {[tuple(n.shape) for n in nodes]}")
    if len({n.shape[other] for n in nodes}) > 1:
        raise ValueError(f"concatenate: all the input array dimensions except for the "
                         f"concatenation axis must match; got shapes "
                         f"{[tuple(n.shape) for n in nodes]} along axis {axis}")
    dt = np.dtype(dtype) if dtype is not None else np.result_type(*[n.dtype for n in nodes])
    first = next(a for a in arrays if isinstance(a, ExprBase))
    if len(nodes) == 1:
        return wrap_like(first, nodes[0])
    shape = [nodes[0].shape[0], nodes[0].shape[1]]
    shape[axis] = sum(n.shape[axis] for n in nodes)
    return wrap_like(first, Concat(tuple(shape), dt, tuple(nodes), axis))


def axis_index(axis, fn: str, ndim: int = 2) -> int:
    """``axis`` checked against ``ndim`` as NumPy (AxisError), made non-negative."""
    try:
        a = operator.index(axis)
    except TypeError:
        raise TypeError(f"{fn}: axis must be an integer, got {axis!r}") from None
    if not -ndim <= a < ndim:
        raise np.exceptions.AxisError(a, ndim)
    return a % ndim


def axes_as_one(axis, fn: str, ndim: int = 2):
    """A tuple of axes as the one axis it names, or None for all of them
    (NumPy's ``median(a, axis=(0, 1))`` is ``axis=None``); other values as given."""
    if not isinstance(axis, tuple | list):
        return axis
    axes = {axis_index(a, fn, ndim) for a in axis}
    if len(axes) != len(axis):
        raise ValueError(f"{fn}: repeated axis in {tuple(axis)!r}")
    if not axes:
        raise PlanningError(f"{fn}: axis=() (over nothing) is not supported")
    return None if len(axes) == ndim else axes.pop()


def take(a, indices, axis=None) -> ExprBase:
    """``np.take(a, indices, axis)``: rows (0) or columns (1) at integer
    positions (negative ones count from the end), in the order given,
    repeats allowed. Lazy: a task reads, per I/O unit its block needs, the
    span of the positions inside it (``X[:, [0, 5, 9]]`` reads the column
    units holding 0, 5 and 9 only). A scalar index drops the axis: the
    result is a small 1-D result (a reduction over the single line)."""
    n = _operand(a, "take")
    if n.ndim != 2:
        raise PlanningError(f"take: a 2-D TiledArray is needed, got shape {n.shape}")
    if axis is None:  # positions in the flattened matrix: its elements there
        if np.ndim(indices) > 2:
            raise IndexError(f"take: an index of shape {np.shape(indices)} makes a "
                             f"{np.ndim(indices)}-D array; tilearray arrays are 1-D or 2-D")
        out = flat_points(a, positions(indices, n.shape[0] * n.shape[1], None, "take"))
        return out.reshape(np.shape(indices)) if np.ndim(indices) != 1 else out
    axis = axis_index(axis, "take", n.ndim)
    scalar = np.ndim(indices) == 0
    if np.ndim(indices) > 1:  # NumPy would add axes: a 3-D result
        raise IndexError(f"take: an index of shape {np.shape(indices)} makes a "
                         f"{n.ndim - 1 + np.ndim(indices)}-D array; tilearray arrays are 1-D or "
                         "2-D (index with a flat list)")
    idx = positions(indices, n.shape[axis], axis, "take")
    shape = list(n.shape)
    shape[axis] = len(idx)
    out = wrap_like(a, Take(tuple(shape), n.dtype, n, axis, idx, tokenize(idx)))
    if scalar:  # one line: a small 1-D result (max over one element is that element)
        return build_reduction("max", out, axis, False, 0)
    return out


def positions(indices, size: int, axis: int | None, fn: str) -> np.ndarray:
    """Integer ``indices`` along an axis of ``size`` (``axis`` None: of the
    flattened array) as a read-only flat int64 vector, negative ones from
    the end; NumPy's errors for other dtypes and positions out of range."""
    idx = np.asarray(indices).reshape(-1)
    if idx.dtype.kind == "b":
        raise TypeError(f"{fn}: indices must be integers (for a boolean mask, index with it)")
    if idx.size and idx.dtype.kind not in "iu":
        raise IndexError(f"{fn}: indices must be integers, got dtype {idx.dtype}")
    idx = idx.astype(np.int64)
    bad = (idx < -size) | (idx >= size)
    if bad.any():
        where = f"axis {axis} with size" if axis is not None else "size"
        raise IndexError(f"index {int(idx[bad][0])} is out of bounds for {where} {size}")
    idx = np.where(idx < 0, idx + size, idx)
    idx.flags.writeable = False
    return idx


def pointwise(a, rows, cols) -> ExprBase:
    """NumPy's pointwise ``a[rows, cols]`` of a matrix: integer positions
    (negative ones from the end) broadcast together, a small 1-D result of
    the elements at those points (:func:`flat_points`)."""
    n = as_node(a)
    try:
        r, c = np.broadcast_arrays(np.asarray(rows), np.asarray(cols))
    except ValueError:
        raise IndexError("shape mismatch: indexing arrays could not be broadcast together with "
                         f"shapes {np.shape(rows)} {np.shape(cols)}") from None
    r, c = positions(r, n.shape[0], 0, "index"), positions(c, n.shape[1], 1, "index")
    return flat_points(a, r * n.shape[1] + c)


def flat_points(a, flat: np.ndarray) -> ExprBase:
    """The elements of matrix ``a`` at flat (C order) positions ``flat`` (in
    range), in that order (:class:`~.nodes.Points`: lazy, read from the I/O
    units holding them); of a small ``a``, picked in memory now."""
    n = as_node(a)
    if n.small:
        return held(a, np.asarray(a.compute()).reshape(-1)[flat])
    if flat.size == 0:
        return held(a, np.empty(0, n.dtype))
    return wrap_like(a, Points((flat.size,), n.dtype, n, flat, tokenize(flat)))


def mask_positions(mask, size: int, axis: int) -> np.ndarray:
    """Positions of a boolean mask along an axis of length ``size``: a NumPy
    mask, or a lazy one (computed now: one pass over what it reads)."""
    if isinstance(mask, ExprBase):
        m = as_node(mask)
        if m.ndim != 1 and not (m.ndim == 2 and 1 in m.shape):
            raise IndexError(f"a boolean index must be 1-D, got shape {m.shape} (NumPy's "
                             "a[mask] of a 2-D mask, a 1-D array of any length, is not "
                             "supported: keep the shape with np.where(mask, a, np.nan), or "
                             "select rows with a[mask.any(axis=1)])")
        mask = np.asarray(mask.compute())
    mask = np.asarray(mask).reshape(-1)
    if mask.shape[0] != size:
        raise IndexError(f"boolean index did not match indexed array along axis {axis}; size "
                         f"of axis is {size} but size of corresponding boolean axis is "
                         f"{mask.shape[0]}")
    return np.flatnonzero(mask)


def diagonal(a, offset=0, axis1=0, axis2=1) -> ExprBase:
    """``np.diagonal(a, offset)`` of a 2-D TiledArray: a small 1-D result
    reading only the I/O units the diagonal crosses."""
    n = _operand(a, "diagonal")
    if n.ndim != 2:
        raise PlanningError(f"diagonal: a 2-D TiledArray is needed, got shape {n.shape}")
    ax1, ax2 = axis_index(axis1, "diagonal"), axis_index(axis2, "diagonal")
    if ax1 == ax2:
        raise ValueError("diagonal: axis1 and axis2 cannot be the same")
    if (ax1, ax2) == (1, 0):
        n = as_node(wrap_like(a, n).T)
    offset = operator.index(offset)
    m, k = n.shape
    length = max(0, min(m, k - offset) if offset >= 0 else min(m + offset, k))
    if n.small:
        return wrap_like(a, Elemwise((length,), n.dtype, "diagonal", (n,), (("offset", offset),)))
    return wrap_like(a, Diagonal((length,), n.dtype, n, offset))


def diag(v, k=0) -> ExprBase:
    """``np.diag``: the diagonal of a 2-D TiledArray (see :func:`diagonal`);
    of a small 1-D result, the square matrix in memory."""
    n = _operand(v, "diag")
    if n.ndim == 2:
        return diagonal(v, k)
    if n.ndim == 1 and n.small:
        size = n.shape[0] + abs(operator.index(k))
        return wrap_like(v, Elemwise((size, size), n.dtype, "diag", (n,), (("k", k),)))
    raise PlanningError(f"diag: a 1-D or 2-D input is needed, got shape {n.shape}")


def tri(m, k: int = 0, upper: bool = True) -> ExprBase:
    """``np.triu`` (``upper``) / ``np.tril``: the elements on and above (below)
    the ``k``-th diagonal, zeros elsewhere; lazy, fused into the reads. A 1-D
    ``m`` is NumPy's: the rows of the result repeat it."""
    name = "triu" if upper else "tril"
    n = _operand(m, name)
    k = operator.index(k)
    if n.ndim not in (1, 2):
        raise PlanningError(f"{name}: a 1-D or 2-D input is needed, got shape {n.shape}")
    if n.small:  # in memory, as NumPy (1-D: an n x n matrix)
        return wrap_like(m, Elemwise(n.shape[-1:] * (3 - n.ndim) if n.ndim == 1 else n.shape,
                                     n.dtype, name, (n,), (("k", k),)))
    rows, cols = (Positions(n.shape, np.dtype(np.int64), axis) for axis in (0, 1))
    return wrap_like(m, Elemwise(n.shape, n.dtype, "tri", (n, rows, cols),
                                 (("k", k), ("upper", upper))))


def trace(a, offset=0, axis1=0, axis2=1, dtype=None) -> ExprBase:
    """``np.trace``: the sum of :func:`diagonal` (reads the diagonal's units only)."""

    return reduce_as("sum", diagonal(a, offset, axis1, axis2), None, False, 0, dtype)


def scan(op: str, a, axis=None, dtype=None) -> ExprBase:
    """``np.cumsum`` / ``np.cumprod`` along axis 0 or 1, or another scan of
    :data:`~tilearray.graphs.spec.SCANS` (``cummax``: ``np.maximum.accumulate``).
    Two passes over the input: each block's total along the axis
    (the last band of blocks needs none), then every block scanned with the
    carry of the blocks before it; the result is a lazy matrix. ``axis=None``
    (NumPy's default): the scan of the flattened array, a small result (see
    ``LazyArray.reshape``: a matrix's elements are gathered now)."""
    n = _operand(a, op)
    if axis is None and n.ndim > 1:  # the flattened array (a matrix's gathered now, if it fits)
        flat = a.reshape(-1) if n.small or 1 in n.shape else \
            selection.flat(a, f"np.{op}(a) (axis=None)", along_axis=True)
        return scan(op, flat, 0, dtype)
    x = wrap_like(a, n) if dtype is None else wrap_like(a, n).astype(dtype)
    n = as_node(x)
    axis = axis_index(0 if axis is None else axis, op, n.ndim)
    one = np.ones((1,) * n.ndim, n.dtype)
    out_dtype = np.dtype(dtype) if dtype is not None else \
        (getattr(np, op)(one, axis=axis) if op in ("cumsum", "cumprod") else
         SCANS[op].accumulate(one, axis=axis)).dtype  # NumPy's (int8's cumsum: int64)
    if n.small:  # NumPy's scan in memory, accumulating in out_dtype (int8 wraps as NumPy's)
        return wrap_like(a, Elemwise(n.shape, out_dtype, op, (n,),
                                     (("axis", axis), ("dtype", out_dtype))))
    return wrap_like(a, Scan(n.shape, out_dtype, op, n, axis))


def sort(op: str, a, axis, kind=None) -> ExprBase:
    """``np.sort`` / ``np.argsort`` (``op``) of a matrix along axis 0 or 1: a
    lazy matrix (the sorted values, or their indices along ``axis`` as
    intp); a task holds whole lines along ``axis`` (columns for ``axis=0``),
    refused when one does not fit the budget."""
    n = as_node(a)
    ax = axis_index(axis, f"np.{op}", n.ndim)
    dtype = n.dtype if op == "sort" else np.dtype(np.intp)
    if 0 in n.shape:  # nothing to sort: NumPy's empty result
        return wrap_like(a, Full(n.shape, dtype, 0))
    return wrap_like(a, Sort(n.shape, dtype, op, n, ax, kind))


def index(a, key: tuple) -> ExprBase:
    """``a[key]`` for a 2-D key with an integer, an integer list or a boolean
    mask on one or both axes (slices applied first, then the gathers), or
    NumPy's open mesh ``np.ix_(rows, cols)``: the block of those rows and
    columns."""
    if _open_mesh(key):
        rows, cols = (np.asarray(k).reshape(-1) for k in key)
        return take(take(a, rows, 0), cols, 1)
    basic = tuple(k if isinstance(k, slice) else slice(None) for k in key)
    x = a[basic] if basic != (slice(None), slice(None)) else a
    lists, scalars = [], []
    for ax, k in enumerate(key):
        if isinstance(k, slice):
            continue
        if isinstance(k, ExprBase) and as_node(k).dtype.kind != "b":
            k = np.asarray(k.compute())
        if isinstance(k, ExprBase) or np.asarray(k).dtype.kind == "b":
            if np.ndim(k) != 1:
                raise IndexError(f"a boolean index of shape {np.shape(k)} on axis {ax} of a "
                                 f"{a.shape} array: it must be 1-D, of the axis' length")
            lists.append((ax, mask_positions(k, x.shape[ax], ax)))
        elif np.ndim(k) == 0 and not isinstance(k, np.ndarray | list | tuple) or \
                isinstance(k, np.ndarray) and k.ndim == 0:
            scalars.append((ax, k))
        else:
            if np.ndim(k) > 1:  # NumPy's index arrays of more than one axis
                raise IndexError(f"an index of shape {np.shape(k)} on axis {ax}: tilearray "
                                 "indexes with flat (1-D) lists, or np.ix_(rows, cols) for the "
                                 "block of those rows and columns")
            lists.append((ax, k))
    if len(lists) == 2:  # NumPy's pointwise indexing: the elements at (rows[k], cols[k])
        return pointwise(x, lists[0][1], lists[1][1])
    for ax, k in lists:
        x = take(x, k, ax)
    for ax, k in scalars:
        x = take(x, [k], ax)
    if scalars:
        axis = None if len(scalars) == 2 else scalars[0][0]
        return build_reduction("max", x, axis, False, 0)
    return x


def _open_mesh(key: tuple) -> bool:
    """Whether ``key`` is what ``np.ix_`` makes of two index lists: integer
    arrays of shapes ``(k, 1)`` and ``(1, m)``."""
    if len(key) != 2 or any(isinstance(k, slice | ExprBase) for k in key):
        return False
    rows, cols = (np.asarray(k) for k in key)  # (k, 1) against (1, m), or (m,) as NumPy
    return rows.ndim == 2 and rows.shape[1] == 1 and (cols.ndim == 1 or cols.ndim == 2 and
                                                        cols.shape[0] == 1) and \
        rows.dtype.kind in "iu" and cols.dtype.kind in "iu"


UFUNC_REDUCE = {"add": "sum", "multiply": "prod", "maximum": "max", "minimum": "min",
                "fmax": "nanmax", "fmin": "nanmin", "logical_and": "all", "logical_or": "any"}
UFUNC_ACCUMULATE = {"add": "cumsum", "multiply": "cumprod", "maximum": "cummax",
                    "minimum": "cummin", "fmax": "cumfmax", "fmin": "cumfmin"}


def ufunc_method(ufunc, method: str, a, axis=0, dtype=None, out=None, keepdims=False,
                 **kwargs) -> ExprBase:
    """``np.add.reduce(a, axis=0)`` and the like (:data:`UFUNC_REDUCE`: the
    reductions they are) and ``np.add.accumulate`` / ``np.multiply.accumulate``
    (cumsum / cumprod; the running max / min of ``np.maximum.accumulate`` and
    the like), in NumPy's dtypes; ``axis=0`` by default."""
    name = f"np.{ufunc.__name__}.{method}"
    table = UFUNC_REDUCE if method == "reduce" else UFUNC_ACCUMULATE if \
        method == "accumulate" else {}
    if ufunc.__name__ not in table:
        raise TypeError(f"{name} is not supported on TiledArrays (reduce: "
                        f"{', '.join(UFUNC_REDUCE)}; accumulate: {', '.join(UFUNC_ACCUMULATE)})")
    extra = [k for k, v in kwargs.items() if not (k == "where" and v is True)]
    if out is not None or extra:
        raise TypeError(f"{name}: argument {'out' if out is not None else extra[0]}= is not "
                        "supported on TiledArrays")
    _operand(a, name)
    if method == "accumulate":
        if axis is None:
            raise ValueError(f"{name}: axis=None is not valid for accumulate (NumPy's rule)")
        if keepdims:
            raise TypeError(f"{name}: keepdims= is not an argument")
        return scan(table[ufunc.__name__], a, axis_index(axis, name, as_node(a).ndim), dtype)
    return reduce_as(table[ufunc.__name__], a, axis, keepdims, 0, dtype)
