"""LazyArray: the NumPy-like half of a TiledArray (shape and dtype,
operators, casting, slicing, reductions, the NumPy protocols); every
operation builds a new expression node and reads nothing. Running it
(plan, compute, to_zarr) is :class:`tilearray.engine.array.TiledArray`'s."""

from __future__ import annotations

import math
import operator

import numpy as np

from ...errors import PlanningError, PlanningIndexError
from ...graphs.reduction import NO_IDENTITY
from ...storage import Grid
from . import routines, selection, statistics
from .nodes import Elemwise, SliceNode, Source, Transpose, derive_dims
from .ops import (
    DTYPE_OPS,
    HANDLED,
    INITIAL,
    ExprBase,
    build_reduction,
    elemwise,
    matmul,
    reduce_as,
    reduce_initial,
)


def _wraps_duck_arrays(other) -> bool:
    """An xarray object: its own operator wraps a TiledArray as its data,
    lazily (``DataArray + X``); NumPy arrays defer to it the same way."""
    return type(other).__module__.split(".")[0] == "xarray"


def _binary(name):
    def op(self, other):
        if _wraps_duck_arrays(other):
            return NotImplemented
        return elemwise(name, self, other)

    def rop(self, other):
        return elemwise(name, other, self)

    return op, rop


def _row_or_column(key: tuple, shape: tuple) -> tuple:
    """``a[None, 3]``, ``a[3, None]`` (the row ``(1, n)``) and ``a[:, 3, None]``
    (the column ``(m, 1)``): one integer and one None keep two axes, as the
    slice ``i:i+1`` does; any other key as it is."""
    ints = [k for k in key if isinstance(k, int | np.integer) and not isinstance(k, bool)]
    if sum(k is None for k in key) != 1 or len(ints) != 1 or \
            not all(k is None or isinstance(k, slice) or k is ints[0] for k in key):
        return key
    rest = [k for k in key if k is not None]
    ax = next(i for i, k in enumerate(rest) if k is ints[0])
    i = operator.index(ints[0])
    if not -shape[ax] <= i < shape[ax]:
        raise IndexError(f"index {i} is out of bounds for axis {ax} with size {shape[ax]}")
    rest[ax] = slice(i % shape[ax], i % shape[ax] + 1)
    return tuple(rest)


def _unsupported(op: str, **given) -> None:
    """Refuse NumPy arguments a lazy reduction has no use for (``out=``,
    ``where=``), naming them."""
    bad = sorted(k for k, v in given.items() if v is not None)
    if bad:
        raise TypeError(f"{op}: {', '.join(k + '=' for k in bad)} not supported on TiledArrays "
                        "(a reduction returns a new lazy array)")


def _reduction(op: str, summary: str):
    """A reduction method with a numpydoc docstring (``ddof`` for var/std,
    ``dtype`` where NumPy takes it)."""
    doc = """{summary} over ``axis`` (lazy), like :func:`numpy.{op}`.

    Parameters
    ----------
    axis : {{None, 0, 1}}
        Reduce over all elements (None, a 0-d result), down the columns (0,
        one value per column) or along the rows (1, one value per row).{ddof}
    keepdims : bool
        Keep the reduced axis with length 1.{dtype}

    Returns
    -------
    TiledArray
        A small lazy result: :meth:`compute` gives NumPy, ``float()`` a
        scalar; it broadcasts against the matrix (``a - a.{op}(axis=0)``).
        Float32 input accumulates in float64 and returns float32, like NumPy.

    Raises
    ------
    PlanningError
        ``axis`` out of bounds{empty}.
    """
    dtype_doc = ""
    if op in DTYPE_OPS:
        dtype_doc = ("\n    dtype : dtype-like, optional (keyword)\n        As NumPy's ``dtype=``: the "
                     "elements are cast to it and the result has it"
                     + (" (floating-point only)" if op in ("var", "std") else "") + ".")
    initial_doc = ("\n    initial : scalar, optional\n        As NumPy's: combined with the "
                   "result (the value of a zero-size reduction).")
    # NumPy's positional order: (axis, dtype, out, [ddof,] keepdims[, initial]) /
    # (axis, out, keepdims[, initial])
    if op in ("var", "std"):
        def method(self, axis=None, dtype=None, out=None, ddof=0, keepdims=False, *,
                   where=None, mean=None):
            _unsupported(op, out=out, where=where)
            if mean is not None:
                return statistics.var_about(op, self, mean, axis, keepdims, ddof, dtype)
            return reduce_as(op, self, axis, keepdims, ddof, dtype)
        ddof_doc = ("\n    ddof : int or float\n        Delta degrees of freedom: divide by "
                    "``N - ddof``.\n    mean : array-like or TiledArray, optional (keyword)\n"
                    "        As NumPy 2's: the spread about this mean (broadcasting as a "
                    "``keepdims``\n        mean), not the data's own.")
    elif op in INITIAL and op in DTYPE_OPS:
        def method(self, axis=None, dtype=None, out=None, keepdims=False, initial=None, *,
                   where=None):
            _unsupported(op, out=out, where=where)
            return reduce_initial(op, self, axis, keepdims, dtype, initial)
        ddof_doc = initial_doc
    elif op in DTYPE_OPS:
        def method(self, axis=None, dtype=None, out=None, keepdims=False, *, where=None):
            _unsupported(op, out=out, where=where)
            return reduce_as(op, self, axis, keepdims, 0, dtype)
        ddof_doc = ""
    elif op in INITIAL:
        def method(self, axis=None, out=None, keepdims=False, initial=None, *, where=None):
            _unsupported(op, out=out, where=where)
            return reduce_initial(op, self, axis, keepdims, None, initial)
        ddof_doc = initial_doc
    elif op in ("argmin", "argmax", "count_nonzero"):
        def method(self, axis=None, out=None, *, keepdims=False):
            _unsupported(op, out=out)
            return self.build_reduction(op, axis, keepdims)
        ddof_doc = ""
    else:
        def method(self, axis=None, out=None, keepdims=False, *, where=None):
            _unsupported(op, out=out, where=where)
            return self.build_reduction(op, axis, keepdims)
        ddof_doc = ""
    empty = ", or a zero-size reduction without identity" if op in NO_IDENTITY else ""
    method.__name__ = method.__qualname__ = op
    method.__doc__ = doc.format(summary=summary, op=op, ddof=ddof_doc, empty=empty,
                                dtype=dtype_doc)
    return method


class LazyArray(ExprBase):
    """The expression half of :class:`~tilearray.engine.array.TiledArray`
    (see there); operations return arrays of the caller's type."""

    # -- basics -------------------------------------------------------------------
    shape = property(lambda self: tuple(self._node.shape), doc="Shape, a tuple of ints.")
    dtype = property(lambda self: np.dtype(self._node.dtype), doc="NumPy dtype.")
    ndim = property(lambda self: len(self._node.shape), doc="Number of dimensions.")
    size = property(lambda self: int(np.prod(self._node.shape)), doc="Number of elements.")
    nbytes = property(lambda self: self.size * self.dtype.itemsize,
                      doc="Logical size, in bytes (not the compressed size on disk).")

    @property
    def T(self) -> LazyArray:
        """The transpose (lazy; read as transposed panels, never copied)."""
        n = self._node
        if n.ndim < 2:
            return self
        if isinstance(n, Transpose):
            return type(self)(n.x)
        return type(self)(Transpose(n.shape[::-1], n.dtype, n))

    @property
    def mT(self) -> LazyArray:  # noqa: N802 - NumPy's name
        """The matrix transpose (NumPy 2's ``a.mT``): :attr:`T` of a matrix;
        NumPy's ValueError for a 1-D array."""
        if self._node.ndim < 2:
            raise ValueError("matrix transpose with ndim < 2 is undefined")
        return self.T

    def transpose(self) -> LazyArray:
        """The transpose; same as :attr:`T`."""
        return self.T

    @property
    def grid(self) -> Grid | None:
        """Tile and I/O-unit grid of a stored array (None for expressions)."""
        return self._node.grid if isinstance(self._node, Source) else None

    @property
    def path(self) -> str | None:
        """Location of a stored array (None for expressions)."""
        return str(self._node.ref) if isinstance(self._node, Source) else None

    @property
    def dims(self) -> tuple[str, ...] | None:
        """Dimension names: stored ``dimension_names`` of an array, carried
        through expressions (``.T`` swaps them, ``a @ b`` takes a's rows and
        b's columns, a reduction drops its axis); None when unknown."""
        return derive_dims(self._node)

    def __len__(self) -> int:
        return self.shape[0]

    def __iter__(self):
        """The rows ``a[0], a[1], ...`` (lazy, as dask's arrays; each computed
        on its own when used: slow for many rows -- prefer a whole-matrix
        expression); the elements of a 1-D array, computed once."""
        if self.ndim == 1:
            yield from np.asarray(self.compute())
            return
        for i in range(self.shape[0]):
            yield self[i]

    # -- operators -------------------------------------------------------------------
    __add__, __radd__ = _binary("add")
    __sub__, __rsub__ = _binary("subtract")
    __mul__, __rmul__ = _binary("multiply")
    __truediv__, __rtruediv__ = _binary("true_divide")
    __floordiv__, __rfloordiv__ = _binary("floor_divide")
    _, __rpow__ = _binary("power")

    def __pow__(self, other):
        if type(other) is int and other == 2:
            # ndarray ** 2 is np.square: bool ** 2 is int8 there, np.power's int64
            return elemwise("square", self)
        return elemwise("power", self, other)

    __mod__, __rmod__ = _binary("mod")

    def __divmod__(self, other):
        return np.divmod(self, other)

    def __rdivmod__(self, other):
        return np.divmod(other, self)

    __lt__, _ = _binary("less")
    __le__, _ = _binary("less_equal")
    __gt__, _ = _binary("greater")
    __ge__, _ = _binary("greater_equal")
    __eq__, _ = _binary("equal")
    __ne__, _ = _binary("not_equal")
    __and__, __rand__ = _binary("bitwise_and")
    __or__, __ror__ = _binary("bitwise_or")
    __xor__, __rxor__ = _binary("bitwise_xor")
    __lshift__, __rlshift__ = _binary("left_shift")
    __rshift__, __rrshift__ = _binary("right_shift")
    __hash__ = object.__hash__

    def __neg__(self):
        return elemwise("negative", self)

    def __pos__(self):
        return self

    def __abs__(self):
        return elemwise("absolute", self)

    def __invert__(self):
        return elemwise("invert", self)

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if method in ("reduce", "accumulate") and len(inputs) == 1:
            return routines.ufunc_method(ufunc, method, *inputs, **kwargs)
        if method != "__call__":
            return NotImplemented
        name = ufunc.__name__
        if kwargs.get("out") is not None or kwargs.get("where", True) is not True:
            raise TypeError(f"np.{name}: out= and where= are not supported on TiledArrays; build "
                            f"the result lazily, e.g. np.where(mask, np.{name}(a, ...), a)")
        kwargs.pop("out", None)
        kwargs.pop("where", None)
        if ufunc.nout != 1:  # np.divmod, np.modf, np.frexp: one lazy array per output
            return tuple(elemwise("output", *inputs, ufunc=name, index=k, **kwargs)
                         for k in range(ufunc.nout))
        if ufunc is np.matmul:
            return matmul(*inputs)
        return elemwise(ufunc.__name__, *inputs, **kwargs)

    def __matmul__(self, other) -> LazyArray:
        return matmul(self, other)

    def __rmatmul__(self, other) -> LazyArray:
        return matmul(other, self)

    def astype(self, dtype, order="K", casting="unsafe", subok=True, copy=True) -> LazyArray:
        """Cast to ``dtype`` (lazy; fused into the reading tasks).

        Parameters
        ----------
        dtype : dtype-like
            A bool, integer or floating-point dtype.
        order, casting, subok, copy
            Accepted as NumPy's (a lazy array is never copied; ``casting`` is
            checked as :func:`numpy.can_cast`).

        Returns
        -------
        TiledArray
            ``self`` when the dtype is already ``dtype``.

        Raises
        ------
        PlanningError
            For complex or other non-numeric dtypes.
        """
        dtype = np.dtype(dtype)
        if dtype.kind not in "biuf":
            raise PlanningError(f"astype: dtype {dtype} is not supported; tilearray handles "
                                "bool, integer and floating-point matrices")
        if casting != "unsafe" and not np.can_cast(self.dtype, dtype, casting=casting):
            raise TypeError(f"Cannot cast array data from dtype({str(self.dtype)!r}) to "
                            f"dtype({str(dtype)!r}) according to the rule {casting!r}")
        if dtype == self.dtype:
            return self
        n = self._node
        return type(self)(Elemwise(n.shape, dtype, "astype", (n,), (("dtype", dtype),)))

    def clip(self, min=None, max=None) -> LazyArray:
        """Limit the values to ``[min, max]`` (scalars or broadcastable results).

        Examples
        --------
        >>> a.clip(0, 1)                                 # doctest: +SKIP
        >>> a.clip(max=5)                                # doctest: +SKIP
        """
        if min is None and max is None:
            raise TypeError("clip: one of min or max must be given")
        if min is None:
            return elemwise("minimum", self, max)
        if max is None:
            return elemwise("maximum", self, min)
        return elemwise("clip", self, min, max)

    def round(self, decimals: int = 0) -> LazyArray:
        """Round to ``decimals`` decimal places, as :func:`numpy.round` (lazy,
        fused into the reads like a ufunc)."""
        if isinstance(decimals, bool) or not isinstance(decimals, int | np.integer):
            raise TypeError(f"round: decimals must be an integer, got {decimals!r}")
        return elemwise("round", self, int(decimals))

    def __getitem__(self, key) -> LazyArray:
        """Lazy basic slicing, e.g. ``a[:100, ::2]``, ``a[..., :3]`` (``...``
        stands for the axes not given); negative steps (``a[::-1]``: the
        positions gathered in that order, see :func:`~.routines.take`); integer
        lists on one axis (``a[:, [0, 5, 9]]``, :func:`~.routines.take`);
        boolean masks (``a[a[:, 0] > 0]``: a lazy mask is computed now, in
        one pass over what it reads -- the result's shape depends on it --
        and the rows are gathered when the result is stored or computed);
        an integer drops its axis (``a[:, 0]``: a small 1-D result); a 2-D
        boolean mask of the matrix's shape (``a[a > 0]``: the selected elements
        in C order, a small 1-D result computed now, :func:`~.selection.masked`).

        Raises
        ------
        PlanningError
            Lists on both axes (NumPy's pointwise indexing).
        IndexError
            Positions out of range, a mask of the wrong length.
        """
        n = self._node
        if n.ndim == 1:
            return self._vector_item(key)
        if n.ndim != 2:
            raise PlanningError(f"indexing is supported on 1-D and 2-D arrays, not shape "
                                f"{n.shape}")
        if isinstance(key, tuple) and key and all(k is Ellipsis for k in key[1:]):
            key = key[0] if isinstance(key[0], ExprBase | np.ndarray) and np.ndim(key[0]) == 2 \
                else key  # a[mask, ...] and a[(mask,)] are a[mask]
        if isinstance(key, ExprBase | np.ndarray) and np.ndim(key) == 2:
            return selection.masked(self, key)  # its elements, in C order
        if not isinstance(key, tuple):
            key = (key,)
        if sum(k is Ellipsis for k in key) > 1:
            raise PlanningError(f"an index can only have a single ellipsis ('...'), got {key!r}")
        if any(k is Ellipsis for k in key):
            i = next(i for i, k in enumerate(key) if k is Ellipsis)
            fill = (slice(None),) * max(n.ndim - (len(key) - 1), 0)
            key = key[:i] + fill + key[i + 1:]
        key = _row_or_column(key, n.shape)
        if any(k is None for k in key):
            raise PlanningError(f"indexing a matrix with None (np.newaxis) makes a 3-D array: "
                                f"{key!r}; tilearray arrays are 1-D or 2-D")
        if len(key) > n.ndim:
            raise PlanningIndexError(f"too many indices for a {n.ndim}-D array: {key!r}")
        key = key + (slice(None),) * (n.ndim - len(key))
        flips = [ax for ax, k in enumerate(key) if isinstance(k, slice) and (k.step or 1) < 0]
        if flips:  # each such axis gathered in its order, then the rest of the key
            x = self
            for ax in flips:
                x = routines.take(x, np.arange(*key[ax].indices(n.shape[ax])), ax)
            rest = tuple(slice(None) if ax in flips else k for ax, k in enumerate(key))
            return x[rest] if rest != (slice(None),) * 2 else x
        if len(key) == 2 and not all(isinstance(k, slice) for k in key):
            return routines.index(self, key)
        if len(key) != 2 or not all(isinstance(k, slice) for k in key):
            raise PlanningError(f"only slices are supported for indexing, got {key!r}")
        starts, steps, shape = [], [], []
        for k, size in zip(key, n.shape, strict=True):
            start, stop, step = k.indices(size)
            starts.append(start)
            steps.append(step)
            shape.append(len(range(start, stop, step)))
        return type(self)(SliceNode(tuple(shape), n.dtype, n, tuple(starts), tuple(steps)))

    def __setitem__(self, key, value):
        raise TypeError("TiledArrays are not modified in place: build the new array "
                        "lazily (np.where(mask, value, a), np.concatenate, ...) and store it "
                        "with .to_zarr(path)")

    def _vector_item(self, key) -> LazyArray:
        """``v[a:b:c]``, ``v[3]``, ``v[[1, 2]]``, ``v[v > 0]``, ``v[:, None]`` (a
        column) or ``v[None, :]`` (a row) of a 1-D array held in memory (a
        stored vector, a reduction's result), by NumPy's rules."""
        n = self._node
        key = key if isinstance(key, tuple) else (key,)
        if not n.small:  # a blocked product (x @ w): computed first (compute() refuses
            # one over its limit, naming to_zarr), as reshape does
            return selection.held(self, np.asarray(self.compute()))[key]
        # a lazy index or mask (small: means[means > 0]) is computed now; lists as NumPy's
        key = tuple(np.asarray(k.compute()) if isinstance(k, ExprBase) else
                    _list_index(k) if isinstance(k, list) else k for k in key)
        shape = np.empty(n.shape, dtype=bool)[key].shape  # NumPy's own rules and IndexErrors
        if len(shape) > 2:
            raise PlanningError(f"indexing {n} with {key!r} makes a {len(shape)}-D array; "
                                "tilearray arrays are 1-D or 2-D")
        key = tuple(k.copy() if isinstance(k, np.ndarray) else k for k in key)
        return type(self)(Elemwise(shape, n.dtype, "getitem", (n,), (("key", key),)))

    # -- reductions -------------------------------------------------------------------
    def build_reduction(self, op, axis=None, keepdims=False, ddof=0) -> LazyArray:
        return build_reduction(op, self, axis, keepdims, ddof)

    sum = _reduction("sum", "Sum of the elements")
    prod = _reduction("prod", "Product of the elements")
    mean = _reduction("mean", "Arithmetic mean")
    min = _reduction("min", "Minimum")
    max = _reduction("max", "Maximum")
    var = _reduction("var", "Variance")
    std = _reduction("std", "Standard deviation")
    any = _reduction("any", "Whether any element is true")
    all = _reduction("all", "Whether all elements are true")
    nansum = _reduction("nansum", "Sum ignoring NaNs")
    nanmean = _reduction("nanmean", "Mean ignoring NaNs")
    nanmin = _reduction("nanmin", "Minimum ignoring NaNs")
    nanmax = _reduction("nanmax", "Maximum ignoring NaNs")
    count_nonzero = _reduction("count_nonzero", "Number of non-zero elements")
    argmin = _reduction("argmin", "Index of the minimum (flat index for ``axis=None``)")
    argmax = _reduction("argmax", "Index of the maximum (flat index for ``axis=None``)")

    # -- NumPy routines (issue 30) ------------------------------------------------------
    def cumsum(self, axis=None, dtype=None) -> LazyArray:
        """Cumulative sum along ``axis`` (0 or 1), like :func:`numpy.cumsum`;
        two passes over the input (see :func:`~.routines.scan`)."""
        return routines.scan("cumsum", self, axis, dtype)

    def argsort(self, axis=-1, kind=None, order=None, *, stable=None) -> LazyArray:
        """Indices that sort along ``axis``, like :func:`numpy.argsort`."""
        return np.argsort(self, axis=axis, kind=kind, order=order, stable=stable)

    @property
    def itemsize(self) -> int:
        """Bytes of one element."""
        return self.dtype.itemsize

    def nonzero(self):
        """The indices of the nonzero elements, one array per axis, like
        :func:`numpy.nonzero` (computed now)."""
        return np.nonzero(self)

    def cumprod(self, axis=None, dtype=None) -> LazyArray:
        """Cumulative product along ``axis`` (0 or 1), like :func:`numpy.cumprod`."""
        return routines.scan("cumprod", self, axis, dtype)

    def diagonal(self, offset=0, axis1=0, axis2=1) -> LazyArray:
        """The diagonal (a small 1-D result), reading only the units it crosses."""
        return routines.diagonal(self, offset, axis1, axis2)

    def trace(self, offset=0, axis1=0, axis2=1, dtype=None) -> LazyArray:
        """Sum of the diagonal (reads only the units it crosses)."""
        return routines.trace(self, offset, axis1, axis2, dtype)

    def dot(self, b) -> LazyArray:
        """``self @ b`` (as :meth:`numpy.ndarray.dot`)."""
        return matmul(self, b)

    def copy(self) -> LazyArray:
        """The array itself: TiledArrays are never modified in place, so a
        copy is the same lazy expression (store one with ``.to_zarr``)."""
        return self

    def tolist(self) -> list:
        """The values as nested Python lists (computed and loaded into memory)."""
        return np.asarray(self).tolist()

    def reshape(self, *shape, order="C") -> LazyArray:
        """The same elements in ``shape`` (one ``-1`` is inferred),
        like :meth:`numpy.ndarray.reshape`. A small result (in memory) takes
        any shape; a matrix gaining or losing an axis of length 1 (a column
        ``(m, 1)`` <-> ``(m,)`` <-> ``(1, m)``, a row likewise) stays lazy;
        any other reshape of a matrix gathers its elements now, in one pass,
        into a small result (:func:`~.selection.flat`: refused by the planner
        when they do not fit one task)."""
        shape = shape[0] if len(shape) == 1 and np.ndim(shape[0]) == 1 else shape
        new = _reshaped(self.shape, tuple(int(operator.index(k)) for k in np.atleast_1d(shape)))
        if order not in ("C", "F", "A"):
            raise ValueError(f"order must be one of 'C', 'F', 'A' (got {order!r})")
        n = self._node
        if new == n.shape:
            return self
        if n.small:
            return type(self)(Elemwise(new, n.dtype, "reshape", (n,),
                                       (("order", order), ("shape", new))))
        if n.ndim == 2 and new == n.shape[::-1] and 1 in n.shape:  # a row <-> a column
            return self.T
        if n.ndim == 2 and len(new) == 1 and 1 in n.shape:
            return self[:, 0] if n.shape[1] == 1 else self[0]
        if n.ndim == 1 and len(new) == 2 and 1 in new:
            return self[:, None] if new[1] == 1 else self[None, :]
        # any other shape: the elements gathered now (in F order: the transpose's C
        # order), refused by the planner when they do not fit a task, then in memory
        if n.ndim == 1:  # a blocked product (x @ w): computed first
            values = selection.held(self, np.asarray(self.compute()))
            return values.reshape(new, order=order)
        values = selection.flat(self.T if order == "F" else self,
                                "a.ravel()" if len(new) == 1 else f"a.reshape({new})")
        return values if len(new) == 1 else values.reshape(new, order=order)

    def ravel(self, order="C") -> LazyArray:
        """1-D (see :meth:`reshape`: a column or a row stays lazy; a matrix's
        elements are gathered now, when they fit one task)."""
        return self.reshape(-1, order=order)

    flatten = ravel

    def squeeze(self, axis=None) -> LazyArray:
        """Axes of length 1 dropped (see :func:`numpy.squeeze`)."""
        return np.squeeze(self, axis)

    def swapaxes(self, axis1, axis2) -> LazyArray:
        """The transpose when the axes differ (2-D)."""
        return np.swapaxes(self, axis1, axis2)

    def repeat(self, repeats, axis=None) -> LazyArray:
        """Each element repeated (see :func:`numpy.repeat`)."""
        return np.repeat(self, repeats, axis)

    def take(self, indices, axis=None) -> LazyArray:
        """Rows or columns at integer positions (see :func:`~.routines.take`)."""
        return routines.take(self, indices, axis)

    # -- NumPy protocol ---------------------------------------------------------------
    def __array_function__(self, func, types, args, kwargs):
        if not all(issubclass(t, LazyArray | np.ndarray) for t in types):
            return NotImplemented
        impl = HANDLED.get(func)
        operands = _lazy_operands((args, kwargs))
        small = bool(operands) and all(a._node.small or a.ndim == 1 for a in operands)
        if impl is not None:
            try:
                return impl(*args, **kwargs)
            except TypeError:
                # a form tilearray's own refuses (np.tile(v, (2, 2, 2))): NumPy's,
                # as below, when every operand is small; else the refusal stands
                if not small:
                    raise
        if small:
            # small results (vectors, a reduction's values): computed now and handed to
            # NumPy itself, as dask does for the functions it lacks (np.ediff1d(v))
            return func(*_computed(args), **_computed(kwargs))
        name = getattr(func, "__module__", "numpy") + "." + getattr(func, "__name__", "?")
        big = next((a for a in operands if not (a._node.small or a.ndim == 1)), self)
        raise TypeError(
            f"{name} of a {' x '.join(map(str, big.shape))} TiledArray is not supported (the "
            "supported NumPy functions are listed in the README, 'NumPy functions'; others take "
            "small results, vectors, which are computed first); for a matrix that fits in "
            "memory compute it first, e.g. np.asarray(a)"
        )


def _lazy_operands(x) -> list:
    """The LazyArrays in ``x`` (nested lists, tuples and dicts, as NumPy's
    functions take them)."""
    if isinstance(x, LazyArray):
        return [x]
    if isinstance(x, list | tuple):
        return [a for v in x for a in _lazy_operands(v)]
    if isinstance(x, dict):
        return _lazy_operands(list(x.values()))
    return []


def _computed(x):
    """``x`` with each LazyArray in it computed (see :func:`_lazy_operands`)."""
    if isinstance(x, LazyArray):
        return np.asarray(x.compute())
    if isinstance(x, list | tuple):
        return type(x)(_computed(v) for v in x)
    if isinstance(x, dict):
        return {k: _computed(v) for k, v in x.items()}
    return x


def _reshaped(old: tuple, new: tuple) -> tuple:
    """``new`` with its ``-1`` resolved against ``old``'s size, as NumPy."""
    size = math.prod(old)
    if sum(k == -1 for k in new) > 1:
        raise ValueError("can only specify one unknown dimension")
    known = math.prod(k for k in new if k != -1)
    if any(k < -1 for k in new) or (-1 in new and (known == 0 or size % known)) or \
            (-1 not in new and known != size):
        raise ValueError(f"cannot reshape array of size {size} into shape {new}")
    return tuple(size // known if k == -1 else k for k in new)


def _list_index(k: list) -> np.ndarray:
    """A list index as NumPy reads it: an empty list selects nothing (NumPy
    takes ``[]`` as integer positions, though ``np.asarray([])`` is float)."""
    a = np.asarray(k)
    return a.astype(np.intp) if a.size == 0 and a.dtype.kind == "f" else a
