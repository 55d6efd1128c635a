"""TiledArray: the lazy, NumPy-like array users touch, and its constructors."""

from __future__ import annotations

import dataclasses
import logging
import warnings
from typing import Any

import numpy as np
from dask.base import tokenize
from dask.utils import format_bytes

from .. import _config
from ..errors import PlanningError, StorageError
from ..graphs.reduction import NO_IDENTITY, OPS
from ..graphs.spec import func
from ..storage import ArrayRef, Grid
from . import cluster, output
from .lower import Lowered, lower, output_grid
from .nodes import (
    Constant,
    Elemwise,
    MatMul,
    Node,
    Reduce,
    SliceNode,
    Source,
    Transpose,
    derive_dims,
    sources,
)
from .plan import Stage

log = logging.getLogger("tilearray")


def _node(x):
    if isinstance(x, TiledArray):
        return x._node
    if isinstance(x, np.ndarray):
        return _constant(x)
    return x


def _constant(x: np.ndarray):
    """A NumPy operand: a 0-d array is a scalar; a row or column vector is
    broadcast like a reduction's result; a whole matrix must be stored."""
    if x.ndim == 0:
        return x[()]
    if x.ndim > 2 or (x.ndim == 2 and 1 not in x.shape):
        raise TypeError(
            f"a NumPy array of shape {x.shape} cannot be an operand of a TiledArray "
            "expression: only scalars, rows (n,) / (1, n) and columns (m, 1) broadcast; "
            "store a matrix with ta.from_numpy(x, path) first"
        )
    if x.dtype.kind not in "biuf":
        raise TypeError(f"a NumPy operand of dtype {x.dtype} is not supported; tilearray "
                        "handles bool, integer and floating-point values")
    value = np.array(x, copy=True)  # later changes to the caller's array do not leak in
    return Constant(tuple(value.shape), value.dtype, value, tokenize(value))


def _sample(x):
    if isinstance(x, Node):
        return np.ones((1,) * x.ndim, dtype=x.dtype)
    return x


def _elemwise(name: str, *args, **kwargs) -> TiledArray:
    nodes = [_node(a) for a in args]
    for a in nodes:
        _check_operand(a, name)
        if isinstance(a, complex | np.complexfloating):
            raise PlanningError(
                f"{name}: complex values are not supported (got {a!r}); tilearray handles "
                "bool, integer and floating-point matrices"
            )
    shapes = [a.shape for a in nodes if isinstance(a, Node)]
    try:
        shape = np.broadcast_shapes(*shapes)
    except ValueError:
        raise PlanningError(
            f"{name}: operands could not be broadcast together with shapes "
            + " and ".join(str(s) for s in shapes)
        ) from None
    tiled = [a for a in nodes if isinstance(a, Node) and not a.small]
    for a in tiled:
        if a.shape != shape:
            raise PlanningError(
                f"{name}: cannot broadcast stored array of shape {a.shape} to {shape}; "
                "only reductions (vectors, scalars) broadcast against matrices"
            )
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            dtype = np.asarray(func(name)(*[_sample(a) for a in nodes], **kwargs)).dtype
        except TypeError as e:
            raise PlanningError(f"{name}: unsupported for dtypes "
                                f"{[str(a.dtype) for a in nodes if isinstance(a, Node)]}: {e}") from None
    if dtype.kind not in "biuf":
        raise PlanningError(f"{name}: the result dtype {dtype} is not supported; tilearray "
                            "handles bool, integer and floating-point matrices")
    return TiledArray(Elemwise(shape, dtype, name, tuple(nodes), tuple(sorted(kwargs.items()))))


def check_sources(node) -> None:
    """Before a run: every stored input still has the shape, dtype and tiling
    it had when the expression was built (it may have been overwritten since)."""
    from ..storage import grid_of, open_array

    seen: set = set()
    for n in sources(node):
        if id(n) in seen:
            continue
        seen.add(id(n))
        arr = open_array(n.ref)
        g = grid_of(arr)
        if (tuple(arr.shape), np.dtype(arr.dtype), g.tile, g.unit) != (
                tuple(n.shape), np.dtype(n.dtype), n.grid.tile, n.grid.unit):
            raise StorageError(
                f"{str(n.ref)!r} changed since it was opened: now {tuple(arr.shape)} "
                f"{arr.dtype} tile={g.tile}, was {tuple(n.shape)} {n.dtype} "
                f"tile={n.grid.tile}; open it again (ta.open) and rebuild the expression")


def _check_operand(a, name: str) -> None:
    """Refuse what cannot be an elementwise operand, with a TypeError like NumPy's."""
    if not isinstance(a, Node) and not np.isscalar(a) and not isinstance(a, np.dtype | type):
        raise TypeError(f"{name}: operands must be TiledArrays, scalars or small NumPy "
                        f"vectors, got {type(a).__name__}")


def _binary(name):
    def op(self, other):
        return _elemwise(name, self, other)

    def rop(self, other):
        return _elemwise(name, other, self)

    return op, rop


HANDLED: dict = {}
"""NumPy function -> TiledArray implementation, for ``__array_function__``
(filled by :mod:`.npfuncs` and ``tilearray.linalg``)."""


_DTYPE_OPS = frozenset({"sum", "prod", "mean", "var", "std", "nansum", "nanmean"})
"""Reductions that take NumPy's ``dtype=`` (the accumulator and result type)."""


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
    if op in _DTYPE_OPS:
        dtype_doc = ("\n    dtype : dtype-like, optional (keyword)\n        As NumPy's ``dtype=``: the "
                     "elements are cast to it and the result has it"
                     + (" (floating-point only)" if op in ("var", "std") else "") + ".")
    if op in ("var", "std"):
        def method(self, axis=None, ddof=0, keepdims=False, *, dtype=None):
            return reduce_as(op, self, axis, keepdims, ddof, dtype)
        ddof_doc = "\n    ddof : int\n        Delta degrees of freedom: divide by ``N - ddof``."
    elif op in _DTYPE_OPS:
        def method(self, axis=None, keepdims=False, *, dtype=None):
            return reduce_as(op, self, axis, keepdims, 0, dtype)
        ddof_doc = ""
    else:
        def method(self, axis=None, keepdims=False):
            return self._reduce(op, axis, keepdims)
        ddof_doc = ""
    empty = ", or a zero-size reduction without identity" if op in NO_IDENTITY else ""
    method.__name__ = method.__qualname__ = op
    method.__doc__ = doc.format(summary=summary, op=op, ddof=ddof_doc, empty=empty,
                                dtype=dtype_doc)
    return method


def reduce_as(op, x, axis=None, keepdims=False, ddof=0, dtype=None) -> TiledArray:
    """``op`` over ``axis`` with NumPy's ``dtype=``: the elements are cast to
    ``dtype`` and the result is of ``dtype`` (``mean(dtype=int)`` truncates,
    ``sum(dtype=int8)`` wraps, like NumPy)."""
    if dtype is None:
        return _reduce(op, x, axis, keepdims, ddof)
    if op not in _DTYPE_OPS:
        raise PlanningError(f"{op}: dtype= is not an argument of numpy.{op}")
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise PlanningError(f"{op}: dtype={dtype!r} is not a NumPy dtype") from None
    if dt.kind not in "biuf":
        raise PlanningError(f"{op}: dtype={dt} is not supported; tilearray handles bool, "
                            "integer and floating-point dtypes")
    if op in ("var", "std") and dt.kind != "f":
        raise PlanningError(f"{op}: dtype={dt} is not supported; use a floating-point dtype "
                            "(NumPy computes integer variances from truncated means)")
    if op == "nanmean" and dt.kind != "f" and _node(x).dtype.kind == "f":
        raise PlanningError(f"nanmean: dtype={dt} is not floating-point while the input is "
                            f"{_node(x).dtype} (NumPy refuses it too)")
    if op in ("mean", "nanmean") and dt.kind != "f":
        # NumPy: the sum accumulates in dtype (wrapping), then is divided and cast back
        total = reduce_as("sum", x, axis, keepdims, 0, dt)
        count = int(np.prod(_node(x).shape)) // max(int(np.prod(total.shape)), 1)
        if not count:
            raise PlanningError(f"{op}: mean of an empty selection with dtype={dt} (NumPy "
                                "gives NaN, which dtype cannot hold)")
        return (total / count).astype(dt)
    res = _reduce(op, TiledArray(_node(x)).astype(dt), axis, keepdims, ddof)
    return res if res.dtype == dt else res.astype(dt)


class TiledArray:
    """A lazy 2-D array over Zarr storage (or an expression of such arrays).

    Build expressions with NumPy syntax (``a @ b``, ``a - a.mean(axis=0)``,
    ``np.sqrt(a)``, ``np.sum(a, axis=0)``); nothing is read until
    :meth:`compute` or :meth:`to_zarr`. Make one with :func:`open`,
    :func:`from_numpy`, :func:`random` or :func:`from_dask`.

    Attributes
    ----------
    shape, dtype, ndim, size, nbytes
        As for a NumPy array (``nbytes`` is the logical size, in bytes).
    stats : RunStats or None
        Measured figures of the last run that produced or computed this array.

    Examples
    --------
    >>> a = ta.open("a.zarr")                        # doctest: +SKIP
    >>> centred = a - a.mean(axis=0)                 # doctest: +SKIP
    >>> cov = (centred.T @ centred).compute()        # doctest: +SKIP
    """

    __array_priority__ = 100

    def __init__(self, node: Node):
        self._node = node
        self.stats: cluster.RunStats | None = None

    # -- basics -------------------------------------------------------------------
    shape = property(lambda self: tuple(self._node.shape), doc="Shape, a tuple of ints.")
    dtype = property(lambda self: np.dtype(self._node.dtype), doc="NumPy dtype.")
    ndim = property(lambda self: len(self._node.shape), doc="Number of dimensions.")
    size = property(lambda self: int(np.prod(self._node.shape)), doc="Number of elements.")
    nbytes = property(lambda self: self.size * self.dtype.itemsize,
                      doc="Logical size, in bytes (not the compressed size on disk).")

    @property
    def T(self) -> TiledArray:
        """The transpose (lazy; read as transposed panels, never copied)."""
        n = self._node
        if n.ndim < 2:
            return self
        if isinstance(n, Transpose):
            return TiledArray(n.x)
        return TiledArray(Transpose(n.shape[::-1], n.dtype, n))

    def transpose(self) -> TiledArray:
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

    # -- operators -------------------------------------------------------------------
    __add__, __radd__ = _binary("add")
    __sub__, __rsub__ = _binary("subtract")
    __mul__, __rmul__ = _binary("multiply")
    __truediv__, __rtruediv__ = _binary("true_divide")
    __floordiv__, __rfloordiv__ = _binary("floor_divide")
    __pow__, __rpow__ = _binary("power")
    __mod__, __rmod__ = _binary("mod")
    __lt__, _ = _binary("less")
    __le__, _ = _binary("less_equal")
    __gt__, _ = _binary("greater")
    __ge__, _ = _binary("greater_equal")
    __eq__, _ = _binary("equal")
    __ne__, _ = _binary("not_equal")
    __and__, __rand__ = _binary("bitwise_and")
    __or__, __ror__ = _binary("bitwise_or")
    __xor__, __rxor__ = _binary("bitwise_xor")
    __hash__ = object.__hash__

    def __neg__(self):
        return _elemwise("negative", self)

    def __pos__(self):
        return self

    def __abs__(self):
        return _elemwise("absolute", self)

    def __invert__(self):
        return _elemwise("invert", self)

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if method != "__call__" or kwargs.get("out") is not None or ufunc.nout != 1:
            return NotImplemented
        if ufunc is np.matmul:
            return matmul(*inputs)
        return _elemwise(ufunc.__name__, *inputs, **kwargs)

    def __matmul__(self, other) -> TiledArray:
        return matmul(self, other)

    def __rmatmul__(self, other) -> TiledArray:
        return matmul(other, self)

    def astype(self, dtype) -> TiledArray:
        """Cast to ``dtype`` (lazy; fused into the reading tasks).

        Parameters
        ----------
        dtype : dtype-like
            A bool, integer or floating-point dtype.

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
        if dtype == self.dtype:
            return self
        n = self._node
        return TiledArray(Elemwise(n.shape, dtype, "astype", (n,), (("dtype", dtype),)))

    def clip(self, min=None, max=None) -> TiledArray:
        """Limit the values to ``[min, max]`` (scalars or broadcastable results).

        Examples
        --------
        >>> a.clip(0, 1)                                 # doctest: +SKIP
        >>> a.clip(max=5)                                # doctest: +SKIP
        """
        if min is None and max is None:
            raise TypeError("clip: one of min or max must be given")
        if min is None:
            return _elemwise("minimum", self, max)
        if max is None:
            return _elemwise("maximum", self, min)
        return _elemwise("clip", self, min, max)

    def __getitem__(self, key) -> TiledArray:
        """Lazy basic slicing with positive steps, e.g. ``a[:100, ::2]``,
        ``a[..., :3]`` (``...`` stands for the axes not given).

        Raises
        ------
        PlanningError
            For integer, fancy or boolean indexing, or negative steps.
        """
        n = self._node
        if n.ndim != 2:
            raise PlanningError(f"indexing is supported on 2-D arrays, not shape {n.shape}")
        if not isinstance(key, tuple):
            key = (key,)
        if sum(k is Ellipsis for k in key) > 1:
            raise PlanningError(f"an index can only have a single ellipsis ('...'), got {key!r}")
        if Ellipsis in key:
            i = next(i for i, k in enumerate(key) if k is Ellipsis)
            fill = (slice(None),) * max(n.ndim - (len(key) - 1), 0)
            key = key[:i] + fill + key[i + 1:]
        if len(key) > n.ndim:
            raise PlanningError(f"too many indices for a {n.ndim}-D array: {key!r}")
        key = key + (slice(None),) * (n.ndim - len(key))
        if len(key) != 2 or not all(isinstance(k, slice) for k in key):
            raise PlanningError(f"only slices are supported for indexing, got {key!r}")
        starts, steps, shape = [], [], []
        for k, size in zip(key, n.shape, strict=True):
            start, stop, step = k.indices(size)
            if step <= 0:
                raise PlanningError(f"slice step must be positive, got {step}")
            starts.append(start)
            steps.append(step)
            shape.append(len(range(start, stop, step)))
        return TiledArray(SliceNode(tuple(shape), n.dtype, n, tuple(starts), tuple(steps)))

    # -- reductions -------------------------------------------------------------------
    def _reduce(self, op, axis=None, keepdims=False, ddof=0) -> TiledArray:
        return _reduce(op, self, axis, keepdims, ddof)

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

    # -- running ----------------------------------------------------------------------
    def _lower(self, out=None, out_grid=None, skip=(), budget=None, engine=None) -> Lowered:
        if budget is None:
            engine = engine or cluster.current_engine(start=False)
            # no engine yet: plan for the one compute() would start, without starting it
            budget = engine.budget() if engine is not None else cluster.default_budget()
        return lower(self._node, budget, out, out_grid, set(skip))

    def plan(self, path=None, *, name="", tile=None, shard=None, engine=None, budget=None):
        """Plan the run without running it (no I/O, no cluster if ``budget`` given).

        Parameters
        ----------
        path, name, tile, shard
            The output :meth:`to_zarr` would write (optional).
        engine : Engine, optional
            Whose budget to plan for; default: the current engine, or, when
            none is running, the default engine :meth:`compute` would start
            (planned for without starting it).
        budget : Budget, optional
            Plan for this budget instead of an engine's.

        Returns
        -------
        Plan
            Stages with tasks, projected peak memory per task, bytes read
            and written, FLOPs and the matmul I/O lower bound.

        Raises
        ------
        PlanningError
            A task cannot fit the budget (the message names the smallest
            budget that would), or ``shard`` is not a multiple of the tile.
        """
        out_grid = None
        out = None
        small = self.ndim != 2 or self._node.small
        if not small and (path or tile or shard):
            out_grid = output_grid(self._node, tile, shard)
            out = ArrayRef.from_location(path, name) if path else None
        plan = self._lower(out, out_grid, budget=budget, engine=engine).plan
        if small:  # where the value goes: a worker writes it, or compute() brings it back
            nbytes = int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize
            target = str(ArrayRef.from_location(path, name)) if path else None
            stage = Stage("store" if target else "result",
                          f"a worker writes the {self.shape} result into {target!r}" if target
                          else f"compute() brings {format_bytes(nbytes)} to the driver",
                          1 if target else 0, 0, 0, nbytes if target else 0)
            plan = dataclasses.replace(plan, stages=(*plan.stages, stage), output=target)
        return plan

    def compute(self, *, engine=None) -> np.ndarray | Any:
        """Run and return the result in memory.

        Parameters
        ----------
        engine : Engine, optional
            Where to run; default: the current engine (started if none).

        Returns
        -------
        numpy.ndarray or scalar
            A NumPy scalar for 0-d results (``a.sum()``).

        Raises
        ------
        PlanningError
            The result is larger than ``tilearray.compute.max-result-size``
            (write it with :meth:`to_zarr`), or the plan does not fit.
        """
        n = self._node
        if isinstance(n, Source) and n.grid.n_units == 0:
            return np.zeros(n.shape, n.dtype)
        limit = _config.get_bytes("compute.max-result-size")
        if self.nbytes > limit:
            raise PlanningError(
                f"result of shape {self.shape} {self.dtype} is {format_bytes(self.nbytes)}, "
                f"over the compute limit {format_bytes(limit)}; write it with "
                ".to_zarr(path) (or raise tilearray.compute.max-result-size)"
            )
        engine = engine or cluster.current_engine()
        low = self._lower(engine=engine)
        check_sources(n)
        output.create_temporaries(low)
        try:
            values, stats = engine.run(low.graph, low.keys, description="compute", plan=low.plan,
                                       stat_keys=low.stat_keys,
                                       units_total=output.temporary_units(low))
        finally:
            output.cleanup(low)
        self.stats = stats
        if low.result == "small":
            v = values[0]
            return v[()] if isinstance(v, np.ndarray) and v.ndim == 0 else v
        out = np.empty(self.shape, dtype=self.dtype)
        for (rows, cols), v in zip(low.blocks, values, strict=True):
            out[rows[0] : rows[1], cols[0] : cols[1]] = v
        return out

    def __array__(self, dtype=None, copy=None):
        x = np.asarray(self.compute())
        return x.astype(dtype, copy=False) if dtype is not None else x

    def __array_function__(self, func, types, args, kwargs):
        if not all(issubclass(t, TiledArray | np.ndarray) for t in types):
            return NotImplemented
        impl = HANDLED.get(func)
        if impl is None:
            name = getattr(func, "__module__", "numpy") + "." + getattr(func, "__name__", "?")
            raise TypeError(
                f"{name} is not supported on TiledArrays (supported: "
                f"{', '.join(sorted({f.__name__ for f in HANDLED}))}); for a small array "
                "compute it first, e.g. np.asarray(a)"
            )
        return impl(*args, **kwargs)

    def _scalar(self, kind):
        if self.size != 1:
            raise TypeError(f"only size-1 arrays can be converted to Python scalars; this "
                            f"TiledArray has shape {self.shape}")
        return kind(np.asarray(self.compute()).reshape(()))

    def __float__(self):
        return self._scalar(float)

    def __int__(self):
        return self._scalar(int)

    def __complex__(self):
        return self._scalar(complex)

    def __index__(self):
        if self.dtype.kind not in "biu":
            raise TypeError(f"only integer arrays can be used as an index, not {self.dtype}")
        return self._scalar(int)

    def __bool__(self):
        if self.size != 1:
            raise ValueError(
                f"the truth value of a TiledArray of shape {self.shape} is ambiguous; use "
                ".any() or .all() (and float()/bool() on their result)"
            )
        return self._scalar(bool)

    def to_zarr(self, path, name="", *, dims=None, tile=None, shard=None, overwrite=False,
                resume=False, engine=None) -> TiledArray:
        """Run and write the result as a Zarr v3 array.

        Each output I/O unit is written whole by one task and then marked
        done; the array is marked complete only when all are.

        Parameters
        ----------
        path : str, os.PathLike or zarr Store
            Where to write: the array itself, or (with ``name``) the group
            that holds it.
        name : str, optional
            Write the array as member ``name`` of the Zarr group at ``path``
            (created if needed; other members are left alone), so that
            ``xarray.open_zarr(path)`` gives a Dataset with variable ``name``
            once it is complete. Nested names (``"sub/x"``) are allowed;
            absolute names, empty or ``.``/``..`` segments are refused. The
            group must be Zarr format 3 (a format 2 group is refused).
        dims : tuple of str, optional
            Dimension names (``dimension_names``). Default: the names the
            expression carries from its inputs (``a @ b``: a's rows, b's
            columns; ``a.mean(axis=0)``: a's columns) when they fit the
            group, else ``(f"{name}_row", f"{name}_col")`` (``("row",
            "col")`` without a name).
        tile, shard : tuple of int, optional
            Output chunk and I/O unit (shard); ``shard`` must be a multiple
            of ``tile``. Default tile: the tiling of the inputs.
        overwrite : bool
            Replace whatever array is at the target (never a group).
        resume : bool
            Finish an interrupted run of the *same* expression on unchanged
            inputs, skipping units already done (a complete output, matrix
            or reduction, is returned as stored).
        engine : Engine, optional
            Where to run; default: the current engine.

        Returns
        -------
        TiledArray or numpy.ndarray
            A TiledArray over the output; for a reduction's vector or scalar
            (computed in memory) its NumPy value, also stored.

        Raises
        ------
        StorageError
            Something is already at the target (without ``overwrite`` /
            ``resume``), the target is a group or one of the expression's
            inputs, a resume does not match the stored output (expression,
            inputs, tiling), ``dims`` conflict with the group, an input was
            overwritten since it was opened, or ``name`` is invalid or
            inside a Zarr format 2 group or an array.
        OutputLockedError
            Another live job is writing the same output.
        PlanningError
            The plan does not fit the budget, or ``shard`` is not a multiple
            of the tile.
        ValueError
            Both ``overwrite`` and ``resume`` (refused before anything).

        Examples
        --------
        >>> (a @ b).to_zarr("results.zarr", name="C")      # doctest: +SKIP
        >>> xr.open_zarr("results.zarr").C                 # doctest: +SKIP
        """
        if overwrite and resume:
            raise ValueError("to_zarr: overwrite=True and resume=True contradict each other "
                             "(overwrite starts again, resume keeps what is done); pass one")
        return output.write(self, path, tile, shard, overwrite, resume, engine, name, dims)

    def to_dask(self):
        """A dask array over the stored data (stored arrays only).

        Raises
        ------
        PlanningError
            For an expression: call :meth:`to_zarr` first.
        """
        import dask.array as da

        if not isinstance(self._node, Source):
            raise PlanningError("to_dask() needs a stored array; call to_zarr() first")
        return da.from_zarr(self._node.ref.open())

    def to_xarray(self):
        """An :class:`xarray.DataArray` over the stored data (lazy, dask-backed),
        with the stored dimension names and the array's name: the member name
        in a group (``"C"``), else the file name without ``.zarr``
        (``"c.zarr"`` -> ``"c"``).

        Raises
        ------
        PlanningError
            For an expression: call :meth:`to_zarr` first.
        """
        import xarray as xr

        x = self.to_dask()
        ref = self._node.ref
        dims = self.dims or tuple(f"dim_{i}" for i in range(self.ndim))
        name = ref.path.strip("/").rsplit("/", 1)[-1]
        if not name:
            name = str(ref).rstrip("/").rsplit("/", 1)[-1]
            name = name[: -len(".zarr")] if name.endswith(".zarr") and len(name) > 5 else name
        name = name or None
        return xr.DataArray(x, dims=dims, name=name)

    # -- display -------------------------------------------------------------------------
    def __repr__(self) -> str:
        n = self._node
        if isinstance(n, Source):
            g = n.grid
            return (f"<TiledArray {str(n.ref)!r} shape={g.shape} dtype={n.dtype} tile={g.tile}"
                    f" unit={g.unit} grid={g.tile_grid} ({format_bytes(self.nbytes)})>")
        return f"<TiledArray lazy {n} shape={self.shape} dtype={self.dtype}>"

    def _repr_html_(self) -> str:
        from .display import tiled_html

        return tiled_html(self)


def _reduce(op, x, axis, keepdims, ddof) -> TiledArray:
    n = _node(x)
    if op not in OPS:
        raise PlanningError(f"unknown reduction {op!r}; choose from {', '.join(OPS)}")
    if isinstance(axis, tuple | list) and not op.startswith("arg"):  # NumPy's tuple of axes
        axes = {int(a) % max(n.ndim, 1) if isinstance(a, int | np.integer) and
                -n.ndim <= a < max(n.ndim, 1) else None for a in axis}
        if None in axes or len(axes) != len(axis):
            raise PlanningError(f"{op}: axis {tuple(axis)!r} is out of bounds or repeated for "
                                f"shape {n.shape}")
        axis = None if len(axes) == n.ndim else (axes.pop() if axes else "none")
        if axis == "none":
            raise PlanningError(f"{op}: axis=() (reduce nothing) is not supported")
    if axis is not None:
        if not isinstance(axis, int | np.integer) or not -n.ndim <= axis < max(n.ndim, 1):
            raise PlanningError(f"{op}: axis {axis!r} is out of bounds for shape {n.shape}")
        axis = int(axis) % n.ndim
    if op in NO_IDENTITY:
        red = n.shape if axis is None else (n.shape[axis],)
        if 0 in red:
            raise PlanningError(
                f"{op}: zero-size array of shape {n.shape} along axis {axis} has no identity"
            )
    sample = np.ones((2,) * n.ndim, dtype=n.dtype)
    kw = {"ddof": ddof} if op in ("var", "std") else {}
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = np.asarray(getattr(np, op)(sample, axis=axis, keepdims=keepdims, **kw))
    if axis is None:
        shape = (1,) * n.ndim if keepdims else ()
    else:
        shape = tuple(1 if i == axis else s for i, s in enumerate(n.shape)) if keepdims else \
            tuple(s for i, s in enumerate(n.shape) if i != axis)
    return TiledArray(Reduce(shape, res.dtype, op, n, axis, bool(keepdims), int(ddof)))


def matmul(a, b) -> TiledArray:
    """Matrix product ``a @ b`` of two 2-D TiledArrays or expressions (lazy).

    Planned as streaming output blocks that accumulate K-panels, sized to
    the budget; the contraction is split and tree-summed when the output has
    too few blocks (``x.T @ x``). Same as ``a @ b``, ``np.matmul(a, b)`` and
    ``np.dot(a, b)``.

    Parameters
    ----------
    a, b : TiledArray
        Shapes ``(m, k)`` and ``(k, n)``; any tilings.

    Returns
    -------
    TiledArray
        Shape ``(m, n)``, NumPy's result dtype.

    Raises
    ------
    TypeError
        An operand is not a TiledArray (NumPy arrays: store them first).
    PlanningError
        An operand is a small result (a reduction), or the shapes do not
        align (the message names both).
    """
    for x in (a, b):
        if isinstance(x, np.ndarray):
            raise TypeError(f"matmul: a NumPy array operand (shape {x.shape}) is not supported; "
                            "store it with ta.from_numpy(x, path) and multiply the TiledArrays")
        if not isinstance(x, TiledArray):
            raise TypeError(f"matmul: operands must be TiledArrays, got {type(x).__name__}")
    na, nb = _node(a), _node(b)
    if na.ndim != 2 or nb.ndim != 2 or na.small or nb.small:
        raise PlanningError(
            f"matmul needs two stored 2-D arrays or expressions; got shapes {na.shape} and "
            f"{nb.shape}"
        )
    if na.shape[1] != nb.shape[0]:
        raise PlanningError(
            f"matmul: shapes {na.shape} and {nb.shape} are not aligned: "
            f"{na.shape[1]} (dim 1) != {nb.shape[0]} (dim 0)"
        )
    dtype = np.matmul(np.ones((1, 1), na.dtype), np.ones((1, 1), nb.dtype)).dtype
    return TiledArray(MatMul((na.shape[0], nb.shape[1]), dtype, na, nb))



__all__ = ["TiledArray", "matmul"]
