"""Constructors: open a stored matrix, or write one from NumPy, dask or a seed."""

from __future__ import annotations

import atexit
import contextlib
import math
import numbers
import operator
import os
import shutil
import tempfile

import numpy as np
from dask.base import tokenize

from .. import _config
from ..errors import ArgumentError, StorageArgumentError, StorageError
from ..graphs import elemwise as gel
from ..storage import ArrayRef, create, grid_of, int_pair, locks, mark_complete
from ..storage import array as sarray
from ..storage.commit import abandoned, existing_array, has_data
from ..storage.ref import check_task_writable, fs_protocols
from . import runtime
from .array import TiledArray
from .expr.nodes import sources
from .expr.ops import HANDLED
from .output import check_not_an_input, source


def open(store=None, name: str = "", *, path: str | None = None,  # noqa: A001
         allow_incomplete: bool = False, storage_options: dict | None = None) -> TiledArray:
    """Open a stored 2-D or 1-D Zarr array (format 2 or 3, sharded or not).

    A 1-D array is read whole by one task when used (like a reduction's
    result): it broadcasts as a row, ``v[:, None]`` as a column, and is an
    operand of products (``x @ v``).

    Parameters
    ----------
    store : str, os.PathLike or zarr Store
        The array, or the group holding it: a local path, a ``file://`` URL,
        an object-store URL (``s3://bucket/a.zarr``; any fsspec protocol
        whose package is installed) or a zarr Store.
    name : str, optional
        The array's path inside the group at ``store``: ``"x"`` or ``"sub/x"``
        (no leading ``/``, empty, ``.`` or ``..`` segments).
    path : str, optional
        The same as ``name``, spelled as ``zarr.open(store, path=...)``
        (alone, ``ta.open(path="a.zarr")`` opens ``a.zarr``).
    allow_incomplete : bool
        Open a tilearray output whose job did not finish (to inspect it).
    storage_options : dict, optional
        For object-store URLs: options of the fsspec filesystem (s3fs:
        ``key``, ``secret``, ``endpoint_url``, ``client_kwargs``, ...).
        Without them the usual environment is read (``AWS_ACCESS_KEY_ID``,
        ``AWS_SECRET_ACCESS_KEY``, ``AWS_ENDPOINT_URL``, ``AWS_PROFILE``).

    Returns
    -------
    TiledArray
        Lazy; nothing but metadata is read.

    Raises
    ------
    StorageError
        A bad ``name``; nothing is there, it is a group (pass ``name``), 0-d
        or n-D (the message says how to read it with zarr or xarray), or not
        a bool / integer / float array.
    IncompleteOutputError
        An unfinished output: rerun its job with ``to_zarr(..., resume=True)``.

    Examples
    --------
    >>> a = ta.open("a.zarr")                          # doctest: +SKIP
    >>> c = ta.open("results.zarr", "C")   # a member of a group  # doctest: +SKIP
    >>> x = ta.open("s3://bucket/x.zarr")                         # doctest: +SKIP
    """
    if store is None:  # ta.open(path="a.zarr")
        if path is None:
            raise TypeError("open() needs the array's store or path: ta.open('a.zarr')")
        store, path = path, None
    if path is not None:
        if name and path != name:
            raise TypeError(f"open() got the array's place in the group twice, as "
                            f"name={name!r} and path={path!r}: pass one")
        name = path
    if isinstance(store, TiledArray):
        return store
    ref = ArrayRef.from_location(store, name, storage_options)
    return TiledArray(source(ref, allow_incomplete))


_scratch: list[str] = []


def _remove_scratch() -> None:
    for d in _scratch:
        shutil.rmtree(d, ignore_errors=True)
    _scratch.clear()


def scratch_path(kind: str) -> str:
    """A fresh local path for an array written without one
    (``ta.from_numpy(x)``): under ``tilearray.temporary-directory`` (default:
    the system's temporary directory), removed when this process exits."""
    base = _config.get("temporary-directory") or tempfile.gettempdir()
    try:
        d = tempfile.mkdtemp(prefix=f"tilearray-{kind}-", dir=base)
    except OSError as e:
        raise StorageError(
            f"{kind}: cannot make a directory for an array written without a path in {base!r} "
            f"(tilearray.temporary-directory, default the system's temporary directory): "
            f"{type(e).__name__}: {e}; pass a path, or set that key to a writable directory"
        ) from None
    if not _scratch:
        atexit.register(_remove_scratch)
    _scratch.append(d)
    return os.path.join(d, f"{kind}.zarr")


@contextlib.contextmanager
def _new_array(path, name, shape, dtype, tile, shard, overwrite, dims, storage_options=None):
    """``with _new_array(...) as (ref, z):`` create an output array (refusing to
    replace a group) with its dims chosen, holding the output's lock (as
    ``to_zarr`` does: a second writer gets OutputLockedError) from before it
    is created until the block ends (after ``mark_complete``)."""
    ref = ArrayRef.from_location(path, name, storage_options)
    given = shape
    vector = isinstance(shape, tuple) and len(shape) == 1
    shape = int_pair((*shape, 1)) if vector else int_pair(shape)
    if shape is None or min(shape) < 0:  # before anything is created
        raise StorageArgumentError(
            f"{str(ref)!r}: shape must be 2 non-negative integers (or one, for a vector), "
            f"got {given!r}")
    shape = shape[:1] if vector else shape
    sarray.check_parents(ref)  # inside an array or a v2 group: refused before the lock's file
    if existing_array(ref) is None and has_data(ref) and not abandoned(ref, overwrite):
        raise StorageError(
            f"{str(ref)!r} exists and is not a Zarr array (a group, or other files); refusing "
            "to replace it — pass name= to write a member of a group, or choose another path"
        )
    dims = sarray.choose_dims(ref, shape, dims)
    with locks.writing(ref):
        yield ref, create(ref.store, shape, dtype, tile, shard=shard, overwrite=overwrite,
                          path=ref.path, dims=dims)


_WRITE_PARAMS = """name : str, optional
        Write the array as member ``name`` of the Zarr group at ``path``
        (created if needed; other members are left alone), so that
        ``xarray.open_zarr(path)`` lists it once complete. ``"x"`` or
        ``"sub/x"``; the group must be Zarr format 3 (format 2: refused).
    dims : tuple of str, optional
        Dimension names; default ``(f"{name}_row", f"{name}_col")``, or
        ``("row", "col")`` without a name.
    tile, shard : tuple of int
        Chunk shape and I/O unit (shard, a multiple of ``tile``; None: unsharded).
    overwrite : bool
        Replace an existing array there (never a group).
    storage_options : dict, optional
        Options of the fsspec filesystem for an object-store URL (``s3://``):
        see :func:`open`."""


VECTOR_TILE = 2**20
"""Default chunk of a 1-D array written by :func:`from_numpy`, in elements."""


def from_numpy(arr, path=None, *, name="", dims=None, tile=(1024, 1024), shard=None,
               overwrite=False, storage_options=None) -> TiledArray:
    arr = np.asarray(arr)
    if arr.ndim not in (1, 2):
        raise StorageArgumentError(f"from_numpy needs a 1-D or 2-D array, got shape {arr.shape}")
    path = scratch_path("from_numpy") if path is None else path
    from ..storage import write_block

    if arr.ndim == 1 and tile == (1024, 1024):
        tile = (VECTOR_TILE,)
    with _new_array(path, name, arr.shape, arr.dtype, tile, shard, overwrite, dims,
                    storage_options) as (ref, z):
        grid = grid_of(z)
        data = arr.reshape(-1, 1) if arr.ndim == 1 else arr  # a vector: the column (n, 1)
        for i in range(grid.unit_grid[0]):
            for j in range(grid.unit_grid[1]):
                rows, cols = grid.unit_range(0, i), grid.unit_range(1, j)
                write_block(ref, rows, cols, data[rows[0] : rows[1], cols[0] : cols[1]], arr=z)
        mark_complete(ref)
    return open(ref.store, ref.path)


from_numpy.__doc__ = f"""Write a 1-D or 2-D NumPy array to Zarr v3 and return it as a TiledArray.

    Parameters
    ----------
    arr : array_like
        1-D or 2-D, bool / integer / float (1-D: ``tile`` and ``shard`` are
        an int or ``(t,)``; default chunk {VECTOR_TILE} elements).
    path : str, os.PathLike or zarr Store, optional
        The array, or (with ``name``) the group that holds it. Without one,
        a fresh local directory under ``tilearray.temporary-directory``,
        removed when this Python process exits (for a cluster on other
        machines, give a path they can all read).
    {_WRITE_PARAMS}

    Returns
    -------
    TiledArray

    Raises
    ------
    StorageError
        Not 2-D, unsupported dtype, bad tile/shard (these are also
        ``ValueError``), or something is already at the target (without
        ``overwrite``).

    Examples
    --------
    >>> a = ta.from_numpy(np.eye(4), "a.zarr", tile=(2, 2))          # doctest: +SKIP
    """


def _check_seed(seed) -> int:
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise ArgumentError(f"seed={seed!r} must be a non-negative integer (0 or more); "
                         "nothing was written")
    return int(seed)


def random(shape, path=None, *, name="", dims=None, tile=(1024, 1024), shard=None,
           dtype="float64", seed=0, overwrite=False, engine=None,
           storage_options=None) -> TiledArray:
    seed = _check_seed(seed)  # before anything is created
    path = scratch_path("random") if path is None else path
    engine = engine or runtime.current_engine(start=False)
    if engine is not None:  # its workers write the units: not into this process's memory
        check_task_writable(ArrayRef.from_location(path, name, storage_options))
    with _new_array(path, name, shape, dtype, tile, shard, overwrite, dims,
                    storage_options) as (ref, z):
        grid = grid_of(z)
        graph, keys = {}, []
        token = tokenize("random", str(ref), shape, tile, shard, str(dtype), seed)
        for i in range(grid.unit_grid[0]):
            for j in range(grid.unit_grid[1]):
                key = ("random-" + token, i, j)
                graph[key] = (gel.random_block, ref, grid.unit_range(0, i), grid.unit_range(1, j),
                              np.dtype(dtype), seed, grid.tile)
                keys.append(key)
        if engine is not None:
            engine.run(graph, keys, description=f"random -> {os.path.basename(str(ref))}",
                       quiet=True, units_total=grid.n_units)
        else:
            import dask.threaded

            dask.threaded.get(graph, keys)
        mark_complete(ref)
    return open(ref.store, ref.path)


random.__doc__ = f"""Write a reproducible random matrix (standard normal for floats).

    Units are written in parallel on the active engine (``with Engine()``),
    or by local threads when none is active. Same seed and tiling, same values,
    whatever the engine or its memory; another ``tile=`` gives other values
    (each tile draws from its own stream, seeded by the seed and the tile's
    index, as ``dask.array.random`` depends on its chunks).

    Parameters
    ----------
    shape : tuple of int
    path : str, os.PathLike or zarr Store, optional
        The array, or (with ``name``) the group that holds it. Without one,
        a fresh local directory under ``tilearray.temporary-directory``,
        removed when this Python process exits (for a cluster on other
        machines, give a path they can all read).
    {_WRITE_PARAMS}
    dtype : dtype-like
        Floats: standard normal; integers: uniform in [-100, 100] (clipped to the
        dtype's range); bool: fair coin.
    seed : int
        0 or more (NumPy's seeds).
    engine : Engine, optional

    Returns
    -------
    TiledArray

    Raises
    ------
    ValueError
        A negative or non-integer ``seed`` (nothing is created).
    StorageError
        Bad shape, dtype, tile or shard, or something is already at the
        target (without ``overwrite``); nothing is created.

    Examples
    --------
    >>> a = ta.random((20_000, 8_000), "a.zarr", tile=(2048, 2048), seed=0)  # doctest: +SKIP
    """


def from_dask(x, path=None, *, name="", dims=None, overwrite=False, shard=None,
              storage_options=None) -> TiledArray:
    """Store a 1-D or 2-D dask array as Zarr v3 (its largest chunk becomes the tile).

    Parameters
    ----------
    x : dask.array.Array
        1-D or 2-D, bool / integer / float.
    path : str, os.PathLike or zarr Store, optional
        The array, or (with ``name``) the group that holds it. Without one,
        a fresh local directory under ``tilearray.temporary-directory``,
        removed when this Python process exits (for a cluster on other
        machines, give a path they can all read).
    name, dims, overwrite, storage_options
        As for :func:`from_numpy`.
    shard : int or tuple of int, optional
        I/O unit, a multiple of the chunks.

    Returns
    -------
    TiledArray

    Raises
    ------
    TypeError
        ``x`` is not a dask array (a NumPy array: use :func:`from_numpy`).
    StorageError
        Not 1-D or 2-D, unknown (NaN) chunk sizes, unsupported dtype, or something
        is already at the target; nothing is created.
    """
    import dask.array as da

    if not isinstance(x, da.Array):
        hint = ("; for a NumPy array use ta.from_numpy(x, path), or wrap it with "
                "dask.array.from_array(x)") if isinstance(x, np.ndarray) else ""
        raise TypeError(f"from_dask needs a dask array, got {type(x).__name__}{hint}")
    if x.ndim not in (1, 2):
        raise StorageArgumentError(
            f"from_dask needs a 1-D or 2-D dask array, got shape {x.shape}")
    if any(math.isnan(c) for cs in x.chunks for c in cs):
        raise StorageArgumentError(
            f"from_dask: the dask array has unknown (NaN) chunk sizes {x.chunks} (e.g. after "
            "boolean indexing); call x.compute_chunk_sizes() first (it computes x once), then "
            "pass it again")
    tile = tuple(max(c) if c else 1 for c in x.chunks)
    path = scratch_path("from_dask") if path is None else path
    from ..storage.array import mark_unit_done

    # refused before anything is written: replacing what the graph reads leaves
    # zeros; a process-local store, written by a cluster's workers, stays empty
    target = ArrayRef.from_location(path, name, storage_options)
    check_task_writable(target)
    check_not_an_input(target, _zarr_inputs(x), "the dask array")

    with _new_array(path, name, x.shape, x.dtype, tile, shard, overwrite, dims,
                    storage_options) as (ref, z):
        # one dask block per tile (or shard): each write is one whole I/O unit, and
        # no rechunk to dask's "auto" chunks (array.chunk-size, 128 MiB) that
        # dask.array.to_zarr would do, with a PerformanceWarning when they do not
        # divide the tile
        grid = grid_of(z)  # a vector's is the column (n, 1)
        da.store(x.rechunk(grid.unit[: x.ndim]), z, lock=False)
        for i in range(grid.unit_grid[0]):
            for j in range(grid.unit_grid[1]):
                mark_unit_done(ref, i, j)
        mark_complete(ref)
    return open(ref.store, ref.path)


__all__ = ["from_dask", "from_numpy", "open", "random"]


def _zarr_inputs(x) -> list:
    """ArrayRefs of the Zarr arrays dask array ``x`` reads (``da.from_zarr``,
    ``from_array`` of a ``zarr.Array`` or of a TiledArray, ``TiledArray.to_dask()``):
    held in its graph as values, or inside its tasks' arguments."""
    import zarr

    found, seen = [], set()

    def ref_of(arr):
        store = arr.store
        if {"file", "local"} & set(fs_protocols(store)):
            # dask's from_zarr(path) opens a local path through fsspec
            return ArrayRef.from_location(os.path.join(store.path, arr.path or ""))
        return ArrayRef.from_location(arr)

    def visit(v, depth):
        if isinstance(v, zarr.Array | TiledArray):
            if id(v) not in seen:
                seen.add(id(v))
                with contextlib.suppress(Exception):  # a store tilearray cannot name
                    found.extend([ref_of(v)] if isinstance(v, zarr.Array) else
                                 [leaf.ref for leaf in sources(v._node)])
        elif depth and isinstance(v, tuple | list):
            for item in v:
                visit(item, depth - 1)
        elif depth and hasattr(v, "args"):  # dask's Task: its function's arguments
            visit(tuple(v.args), depth - 1)
            visit(tuple(getattr(v, "kwargs", {}).values()), depth - 1)
        elif depth and hasattr(v, "value"):  # dask's DataNode: an inlined value
            visit(v.value, depth - 1)

    for value in x.__dask_graph__().values():
        with contextlib.suppress(Exception):  # an object whose attributes raise
            visit(value, 3)
    return found


def eye(N, M=None, k=0, dtype=float, order="C", *, device=None, like=None) -> TiledArray:
    """A lazy identity matrix, as :func:`numpy.eye`: ones on the ``k``-th
    diagonal, zeros elsewhere; nothing is stored or read (each block is
    made where it is used). ``S + lam * ta.eye(n)`` shifts a stored matrix's
    diagonal at any size (a NumPy ``np.eye(n)`` operand must fit in memory);
    ``np.eye(n, like=a)`` gives the same for a TiledArray ``a``.

    Examples
    --------
    >>> ridge = ta.linalg.solve(X.T @ X + 0.5 * ta.eye(X.shape[1]), X.T @ y)  # doctest: +SKIP
    """
    from .expr.nodes import Elemwise, Positions

    if device not in (None, "cpu"):
        raise ValueError(f"eye: device={device!r}: tilearray computes on the CPU")
    n = operator.index(N)
    m = n if M is None else operator.index(M)
    k = operator.index(k)
    if n < 0 or m < 0:
        raise ValueError(f"eye: negative dimensions are not allowed, got N={N}, M={M}")
    dt = np.dtype(dtype)
    if dt.kind not in "biuf":
        raise TypeError(f"eye: dtype {dt} is not supported; tilearray handles bool, integer "
                        "and floating-point values")
    shape = (n, m)
    rows, cols = (Positions(shape, np.dtype(np.int64), axis) for axis in (0, 1))
    return TiledArray(Elemwise(shape, dt, "eye", (rows, cols), (("dtype", dt), ("k", k))))


HANDLED[np.eye] = eye
