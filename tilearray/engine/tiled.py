"""TiledArray: the lazy, NumPy-like array users touch, and its constructors."""

from __future__ import annotations

import logging
import os
import warnings
from typing import Any

import numpy as np
from dask.base import tokenize
from dask.utils import format_bytes

from .. import _config
from ..errors import PlanningError, StorageError
from ..graphs import elemwise as gel
from ..graphs.reduction import NO_IDENTITY, OPS
from ..graphs.spec import func
from ..storage import ArrayRef, Grid, create, done_units, grid_of, mark_complete, open_array
from ..storage import array as sarray
from . import cluster
from .lower import Lowered, Lowerer
from .nodes import Elemwise, MatMul, Node, Reduce, SliceNode, Source, Transpose, structure

log = logging.getLogger("tilearray")


def _node(x):
    return x._node if isinstance(x, TiledArray) else x


def _sample(x):
    if isinstance(x, Node):
        return np.ones((1,) * x.ndim, dtype=x.dtype)
    return x


def _elemwise(name: str, *args, **kwargs) -> TiledArray:
    nodes = [_node(a) for a in args]
    for a in nodes:
        if not isinstance(a, Node) and not np.isscalar(a) and not isinstance(a, np.dtype | type):
            raise PlanningError(
                f"{name}: operands must be TiledArrays or scalars, got {type(a).__name__}"
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
    return TiledArray(Elemwise(shape, dtype, name, tuple(nodes), tuple(sorted(kwargs.items()))))


def _binary(name):
    def op(self, other):
        return _elemwise(name, self, other)

    def rop(self, other):
        return _elemwise(name, other, self)

    return op, rop


class TiledArray:
    """A lazy 2-D array over Zarr storage (or an expression of such arrays).

    Build expressions with NumPy syntax (``a @ b``, ``a - a.mean(axis=0)``,
    ``np.sqrt(a)``); nothing is read until :meth:`compute` or :meth:`to_zarr`.
    """

    __array_priority__ = 100

    def __init__(self, node: Node):
        self._node = node
        self.stats: cluster.RunStats | None = None

    # -- basics -------------------------------------------------------------------
    shape = property(lambda self: tuple(self._node.shape))
    dtype = property(lambda self: np.dtype(self._node.dtype))
    ndim = property(lambda self: len(self._node.shape))
    size = property(lambda self: int(np.prod(self._node.shape)))
    nbytes = property(lambda self: self.size * self.dtype.itemsize)

    @property
    def T(self) -> TiledArray:
        n = self._node
        if n.ndim < 2:
            return self
        if isinstance(n, Transpose):
            return TiledArray(n.x)
        return TiledArray(Transpose(n.shape[::-1], n.dtype, n))

    def transpose(self) -> TiledArray:
        return self.T

    @property
    def grid(self) -> Grid | None:
        """Tile and I/O-unit grid of a stored array (None for expressions)."""
        return self._node.grid if isinstance(self._node, Source) else None

    @property
    def path(self) -> str | None:
        return str(self._node.ref) if isinstance(self._node, Source) else None

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
        dtype = np.dtype(dtype)
        if dtype == self.dtype:
            return self
        n = self._node
        return TiledArray(Elemwise(n.shape, dtype, "astype", (n,), (("dtype", dtype),)))

    def clip(self, min=None, max=None) -> TiledArray:
        return _elemwise("clip", self, min, max)

    def __getitem__(self, key) -> TiledArray:
        n = self._node
        if n.ndim != 2:
            raise PlanningError(f"indexing is supported on 2-D arrays, not shape {n.shape}")
        if not isinstance(key, tuple):
            key = (key, slice(None))
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

    def sum(self, axis=None, keepdims=False):
        return self._reduce("sum", axis, keepdims)

    def prod(self, axis=None, keepdims=False):
        return self._reduce("prod", axis, keepdims)

    def mean(self, axis=None, keepdims=False):
        return self._reduce("mean", axis, keepdims)

    def min(self, axis=None, keepdims=False):
        return self._reduce("min", axis, keepdims)

    def max(self, axis=None, keepdims=False):
        return self._reduce("max", axis, keepdims)

    def var(self, axis=None, ddof=0, keepdims=False):
        return self._reduce("var", axis, keepdims, ddof)

    def std(self, axis=None, ddof=0, keepdims=False):
        return self._reduce("std", axis, keepdims, ddof)

    def any(self, axis=None, keepdims=False):
        return self._reduce("any", axis, keepdims)

    def all(self, axis=None, keepdims=False):
        return self._reduce("all", axis, keepdims)

    def nansum(self, axis=None, keepdims=False):
        return self._reduce("nansum", axis, keepdims)

    def nanmean(self, axis=None, keepdims=False):
        return self._reduce("nanmean", axis, keepdims)

    def nanmin(self, axis=None, keepdims=False):
        return self._reduce("nanmin", axis, keepdims)

    def nanmax(self, axis=None, keepdims=False):
        return self._reduce("nanmax", axis, keepdims)

    def count_nonzero(self, axis=None, keepdims=False):
        return self._reduce("count_nonzero", axis, keepdims)

    def argmin(self, axis=None, keepdims=False):
        return self._reduce("argmin", axis, keepdims)

    def argmax(self, axis=None, keepdims=False):
        return self._reduce("argmax", axis, keepdims)

    # -- running ----------------------------------------------------------------------
    def _lower(self, out=None, out_grid=None, skip=(), budget=None, engine=None) -> Lowered:
        if budget is None:
            engine = engine or cluster.current_engine()
            budget = engine.budget()
        return lower(self._node, budget, out, out_grid, set(skip))

    def plan(self, path=None, *, tile=None, shard=None, engine=None, budget=None):
        """Plan the run (no I/O): tasks, memory per task, bytes, FLOPs.

        Raises :class:`PlanningError` if a task cannot fit the budget.
        """
        out_grid = None
        out = None
        if self.ndim == 2 and not self._node.small:
            out_grid = _output_grid(self._node, tile, shard)
            out = ArrayRef.from_location(path) if path else None
        return self._lower(out, out_grid, budget=budget, engine=engine).plan

    def compute(self, *, engine=None) -> np.ndarray | Any:
        """Run and return the result as NumPy (refused above
        ``tilearray.compute.max-result-size``; use :meth:`to_zarr` then)."""
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
        _create_temporaries(low)
        try:
            values, stats = engine.run(low.graph, low.keys, description="compute")
        finally:
            _cleanup(low)
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

    def to_zarr(self, path, *, tile=None, shard=None, overwrite=False, resume=False,
                engine=None) -> TiledArray:
        """Run and write the result as a Zarr v3 array at ``path``.

        Each output I/O unit is written whole by one task and then marked
        done; the array is marked complete only when all are. Returns a
        TiledArray over the output; for a reduction's vector or scalar (which
        is computed in memory) the NumPy value, also stored at ``path``. With
        ``resume=True`` an interrupted run of the *same* expression on the same
        inputs continues, skipping done units; anything else already at
        ``path`` is refused unless ``overwrite=True``.
        """
        return _to_zarr(self, path, tile, shard, overwrite, resume, engine)

    def to_dask(self):
        """A dask array over the stored data (stored arrays only)."""
        import dask.array as da

        if not isinstance(self._node, Source):
            raise PlanningError("to_dask() needs a stored array; call to_zarr() first")
        return da.from_zarr(self._node.ref.open())

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
    """``a @ b`` for 2-D TiledArrays (NumPy's result dtype)."""
    na, nb = _node(a), _node(b)
    for x in (na, nb):
        if not isinstance(x, Node):
            raise PlanningError(f"matmul: operands must be TiledArrays, got {type(x).__name__}")
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


def lower(node, budget, out=None, out_grid=None, skip=()) -> Lowered:
    """Plan ``node`` against ``budget``: stages, graph and keys (pure)."""
    from .plan import Plan

    low = Lowerer(budget)
    blocks: list = []
    if node.small:
        key = low.small(node)
        keys, result = [key], "small"
    elif isinstance(node, MatMul):
        res = low.matmul(node, out, out_grid, skip)
        keys, blocks = (res, []) if out is not None else res
        result = "store" if out is not None else "blocks"
    else:
        keys, blocks = low.map_blocks(node, out, out_grid, skip)
        result = "store" if out is not None else "blocks"
    plan = Plan(str(node), tuple(node.shape), str(node.dtype), budget, tuple(low.stages),
                str(out) if out else None)
    skipped = len(skip)
    return Lowered(plan, low.graph, keys, result, blocks, low.creates, skipped)


def _output_grid(node, tile, shard) -> Grid:
    """Output grid: the given tile, else the tiling of the inputs it derives from."""
    if tile is None:
        if isinstance(node, MatMul):
            tile = (_leaf_tile(node.a, 0), _leaf_tile(node.b, 1))
        else:
            tile = (_leaf_tile(node, 0), _leaf_tile(node, 1))
        tile = tuple(max(min(t, max(n, 1)), 1) for t, n in zip(tile, node.shape, strict=True))
    return Grid.regular(node.shape, tile, shard)


def _leaf_tile(node, axis: int, default: int = 1024) -> int:
    """Tile size along ``axis`` of the first stored array ``node`` reads."""
    if isinstance(node, Source):
        return node.grid.tile[axis]
    if isinstance(node, Transpose):
        return _leaf_tile(node.x, 1 - axis, default)
    if isinstance(node, SliceNode):
        return _leaf_tile(node.x, axis, default)
    if isinstance(node, MatMul):
        return _leaf_tile(node.a if axis == 0 else node.b, axis, default)
    if isinstance(node, Elemwise):
        for a in node.args:
            if isinstance(a, Node) and not a.small:
                return _leaf_tile(a, axis, default)
    return default


def _fingerprint(node) -> str:
    """Token of the expression and the state of every input it reads."""
    parts = [structure(node)]
    for leaf in _source_nodes(node):
        parts.append((str(leaf.ref), leaf.shape, str(leaf.dtype), sarray.local_files_state(leaf.ref)))
    return tokenize(*parts)


def _source_nodes(node):
    if isinstance(node, Source):
        yield node
    for child in ("x", "a", "b"):
        c = getattr(node, child, None)
        if isinstance(c, Node):
            yield from _source_nodes(c)
    for a in getattr(node, "args", ()):
        if isinstance(a, Node):
            yield from _source_nodes(a)


def _to_zarr(x: TiledArray, path, tile, shard, overwrite, resume, engine) -> TiledArray:
    node = x._node
    if node.small or node.ndim != 2:
        # a reduction's vector/scalar: computed in memory, stored as a plain Zarr array
        if os.path.exists(os.fspath(path)) and not overwrite:
            raise StorageError(
                f"{os.fspath(path)!r} already exists; pass overwrite=True to replace it"
            )
        value = np.asarray(x.compute(engine=engine))
        return _write_small(value, path, overwrite=True)
    engine = engine or cluster.current_engine()
    ref = ArrayRef.from_location(path)
    out_grid = _output_grid(node, tile, shard)
    out_loc = str(ref).rstrip("/")
    for leaf in _source_nodes(node):
        loc = str(leaf.ref).rstrip("/")
        if loc == out_loc or loc.startswith(out_loc + "/"):
            raise StorageError(
                f"{str(ref)!r} holds an input of the expression ({loc!r}); write the result "
                "elsewhere"
            )
    if _existing(ref) is None and _has_data(ref):
        raise StorageError(
            f"{str(ref)!r} exists and is not a Zarr array (a group, or other files); refusing "
            "to replace it — choose another path or remove it first"
        )
    fp = _fingerprint(node)
    skip: set = set()
    existing = _existing(ref)
    if existing is not None and resume and not overwrite:
        meta = sarray.info_attrs(existing)
        if meta.get("fingerprint") != fp or existing.shape != tuple(node.shape) \
                or existing.dtype != node.dtype:
            raise StorageError(
                f"cannot resume {str(ref)!r}: it was written by a different expression or "
                "from inputs that have changed since; pass overwrite=True to start again"
            )
        if meta.get("complete"):
            log.info("%s is already complete", ref)
            out = TiledArray(_source(ref))
            return out
        out_grid = grid_of(existing)
        skip = done_units(ref)
    elif existing is not None and not overwrite:
        raise StorageError(
            f"{str(ref)!r} already exists; pass overwrite=True to replace it "
            "(or resume=True to finish an interrupted run of the same expression)"
        )
    low = lower(node, engine.budget(), ref, out_grid, skip)  # refuse before touching disk
    if existing is not None:
        sarray.acquire_lock(ref)  # refuses while another live job writes it
    if existing is None or overwrite:
        create(ref.store, node.shape, node.dtype, out_grid.tile, shard=shard, overwrite=True,
               attributes={"tilearray": {"fingerprint": fp, "expression": str(node)}})
        sarray.acquire_lock(ref)
    try:
        _create_temporaries(low)
        _, stats = engine.run(low.graph, low.keys, description=f"-> {os.path.basename(str(path))}")
        stats.skipped_units = len(skip)
        mark_complete(ref, {"fingerprint": fp})
    finally:
        _cleanup(low)
        sarray.release_lock(ref)
    out = TiledArray(_source(ref))
    out.stats = stats
    x.stats = stats
    return out


def _has_data(ref: ArrayRef) -> bool:
    """True when anything at all is stored under ``ref``."""
    root = getattr(ref.store, "root", None)
    if root is not None:
        path = os.path.join(str(root), ref.path)
        return os.path.exists(path) and (not os.path.isdir(path) or bool(os.listdir(path)))
    try:
        return bool(ref.list_keys(""))
    except Exception:
        return False


def _existing(ref: ArrayRef):
    import zarr

    try:
        return zarr.open_array(ref.store, path=ref.path or None, mode="r")
    except Exception:
        return None


def _create_temporaries(low: Lowered) -> None:
    for c in low.creates:
        create(c.ref.store, c.shape, c.dtype, c.tile, shard=c.shard, overwrite=True,
               compressor=None)


def _cleanup(low: Lowered) -> None:
    import shutil

    for c in low.creates:
        if c.temporary and getattr(c.ref.store, "root", None):
            shutil.rmtree(str(c.ref.store.root), ignore_errors=True)


def _write_small(value: np.ndarray, path, overwrite) -> np.ndarray:
    """Store a small (in-memory) result, e.g. a reduction's vector, as Zarr."""
    import zarr

    if os.path.exists(os.fspath(path)) and not overwrite:
        raise StorageError(f"{os.fspath(path)!r} already exists; pass overwrite=True to replace it")
    zarr.create_array(os.fspath(path), data=np.asarray(value), overwrite=True,
                      attributes={"tilearray": {"format": 1, "complete": True}})
    return value


def _source(ref: ArrayRef, allow_incomplete: bool = False) -> Source:
    arr = open_array(ref, check_complete=not allow_incomplete)
    return Source(tuple(arr.shape), np.dtype(arr.dtype), ref, grid_of(arr))


# -- constructors ------------------------------------------------------------------------


def open(path, name: str = "", *, allow_incomplete: bool = False) -> TiledArray:  # noqa: A001
    """Open a 2-D Zarr array (format 2 or 3, sharded or not) as a TiledArray.

    ``path`` is a directory path or a Zarr store; ``name`` the array's path
    inside it when it is in a group.
    """
    if isinstance(path, TiledArray):
        return path
    ref = ArrayRef.from_location(path, name)
    return TiledArray(_source(ref, allow_incomplete))


def from_numpy(arr, path, *, tile=(1024, 1024), shard=None, overwrite=False) -> TiledArray:
    """Write a 2-D NumPy array to Zarr at ``path`` and return it as a TiledArray."""
    arr = np.asarray(arr)
    if arr.ndim != 2:
        raise StorageError(f"from_numpy needs a 2-D array, got shape {arr.shape}")
    ref = ArrayRef.from_location(path)
    z = create(ref.store, arr.shape, arr.dtype, tile, shard=shard, overwrite=overwrite)
    grid = grid_of(z)
    from ..storage import write_block

    for i in range(grid.unit_grid[0]):
        for j in range(grid.unit_grid[1]):
            rows, cols = grid.unit_range(0, i), grid.unit_range(1, j)
            write_block(ref, rows, cols, arr[rows[0] : rows[1], cols[0] : cols[1]], arr=z)
    mark_complete(ref)
    return open(path)


def random(shape, path, *, tile=(1024, 1024), shard=None, dtype="float64", seed=0,
           overwrite=False, engine=None) -> TiledArray:
    """Write a reproducible random matrix (standard normal for floats).

    Units are written in parallel on the active engine (``with Engine()``),
    or by local threads when none is active. Same seed and tiling, same values.
    """
    ref = ArrayRef.from_location(path)
    z = create(ref.store, shape, dtype, tile, shard=shard, overwrite=overwrite)
    grid = grid_of(z)
    graph, keys = {}, []
    token = tokenize("random", str(ref), shape, tile, shard, str(dtype), seed)
    for i in range(grid.unit_grid[0]):
        for j in range(grid.unit_grid[1]):
            key = ("random-" + token, i, j)
            graph[key] = (gel.random_block, ref, grid.unit_range(0, i), grid.unit_range(1, j),
                          np.dtype(dtype), seed, grid.tile)
            keys.append(key)
    engine = engine or cluster.current_engine(start=False)
    if engine is not None:
        engine.run(graph, keys, description=f"random -> {os.path.basename(str(path))}",
                   quiet=True)
    else:
        import dask.threaded

        dask.threaded.get(graph, keys)
    mark_complete(ref)
    return open(path)


def from_dask(x, path, *, overwrite=False, shard=None) -> TiledArray:
    """Store a 2-D dask array at ``path`` (its chunks become tiles)."""
    if x.ndim != 2:
        raise StorageError(f"from_dask needs a 2-D dask array, got shape {x.shape}")
    tile = tuple(max(c) if c else 1 for c in x.chunks)
    ref = ArrayRef.from_location(path)
    z = create(ref.store, x.shape, x.dtype, tile, shard=shard, overwrite=overwrite)
    x.rechunk(shard or tile).to_zarr(z)
    grid = grid_of(z)
    from ..storage.array import mark_unit_done

    for i in range(grid.unit_grid[0]):
        for j in range(grid.unit_grid[1]):
            mark_unit_done(ref, i, j)
    mark_complete(ref)
    return open(path)


__all__ = ["TiledArray", "from_dask", "from_numpy", "matmul", "open", "random"]
