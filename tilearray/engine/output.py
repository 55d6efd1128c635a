"""Writing results: the output's checks, fingerprint, lock, resume and
completion around a run, and the run's temporaries."""

from __future__ import annotations

import logging
import os

import numpy as np
from dask.base import tokenize

from ..errors import StorageError
from ..storage import ArrayRef, Grid, create, done_units, grid_of, mark_complete, open_array
from ..storage import array as sarray
from . import cluster
from .lower import Lowered, lower, output_grid
from .nodes import Source, derive_dims, sources, structure

log = logging.getLogger("tilearray")


def _fingerprint(node) -> str:
    """Token of the expression and the state of every input it reads."""
    parts = [structure(node)]
    for leaf in sources(node):
        parts.append((str(leaf.ref), leaf.shape, str(leaf.dtype), sarray.local_files_state(leaf.ref)))
    return tokenize(*parts)


def write(x, path, tile, shard, overwrite, resume, engine, name="", dims=None):
    """``x.to_zarr(...)``: run ``x`` into the Zarr array at ``path``/``name``."""
    from .tiled import TiledArray, check_sources

    node = x._node
    ref = ArrayRef.from_location(path, name)
    sarray.check_parents(ref)  # inside an array or a Zarr v2 group: refused before any work
    labels = derive_dims(node, lambda src: ("row", "col"))
    if node.small or node.ndim != 2:
        # a reduction's vector/scalar: computed in memory, stored as a plain Zarr array
        existing = existing_array(ref)
        if existing is None and has_data(ref):
            raise StorageError(f"{str(ref)!r} exists and is not a Zarr array; refusing to "
                               "replace it")
        fp = _fingerprint(node)
        if existing is not None and resume and not overwrite:
            meta = sarray.info_attrs(existing)
            if meta.get("fingerprint") != fp or existing.shape != tuple(node.shape):
                raise StorageError(
                    f"cannot resume {str(ref)!r}: it was written by a different expression "
                    "or from inputs that have changed since; pass overwrite=True to start again"
                )
            if meta.get("complete"):
                log.info("%s is already complete", ref)
                return np.asarray(existing[...])
            # same expression, but its write was cut short: compute and write it again
        elif existing is not None and not overwrite:
            raise StorageError(
                f"{str(ref)!r} already exists; pass overwrite=True to replace it "
                "(or resume=True to reuse a complete result of the same expression)"
            )
        dims = sarray.choose_dims(ref, node.shape, dims, derive_dims(node), labels)
        value = np.asarray(x.compute(engine=engine))
        out = _write_small(value, ref, dims, {"fingerprint": fp, "expression": str(node)})
        if x.stats is not None:  # the client wrote it: count the write in the run's figures
            x.stats.bytes_written += value.nbytes
        return out
    engine = engine or cluster.current_engine()
    check_sources(node)  # inputs overwritten since they were opened: refused before writing
    out_loc = str(ref).rstrip("/")
    for leaf in sources(node):
        loc = str(leaf.ref).rstrip("/")
        if loc == out_loc or loc.startswith(out_loc + "/"):
            raise StorageError(
                f"{str(ref)!r} holds an input of the expression ({loc!r}); write the result "
                "elsewhere"
            )
    if existing_array(ref) is None and has_data(ref):
        raise StorageError(
            f"{str(ref)!r} exists and is not a Zarr array (a group, or other files); refusing "
            "to replace it — choose another path or remove it first"
        )
    fp = _fingerprint(node)
    skip: set = set()
    existing = existing_array(ref)
    if existing is not None and resume and not overwrite:
        meta = sarray.info_attrs(existing)
        if meta.get("fingerprint") != fp or existing.shape != tuple(node.shape) \
                or existing.dtype != node.dtype:
            raise StorageError(
                f"cannot resume {str(ref)!r}: it was written by a different expression or "
                "from inputs that have changed since; pass overwrite=True to start again"
            )
        old = grid_of(existing)
        for what, asked, has in (("tile", tile, old.tile), ("shard", shard, old.unit)):
            if asked is not None and tuple(int(v) for v in asked) != has:
                raise StorageError(
                    f"cannot resume {str(ref)!r} with {what}={tuple(asked)}: it is stored with "
                    f"tile={old.tile}, shard={old.unit if old.sharded else None}; resume "
                    "without tile=/shard= (or with these), or pass overwrite=True"
                )
        stored_dims = sarray.dims_of(existing)
        if dims is not None and stored_dims is not None and tuple(dims) != stored_dims:
            raise StorageError(f"cannot resume {str(ref)!r} with dims={tuple(dims)}: it is "
                               f"stored with dims={stored_dims}")
        if meta.get("complete"):
            log.info("%s is already complete", ref)
            out = TiledArray(source(ref))
            return out
        out_grid = grid_of(existing)
        skip = done_units(ref)
    elif existing is not None and not overwrite:
        raise StorageError(
            f"{str(ref)!r} already exists; pass overwrite=True to replace it "
            "(or resume=True to finish an interrupted run of the same expression)"
        )
    else:
        out_grid = output_grid(node, tile, shard)
    low = lower(node, engine.budget(), ref, out_grid, skip)  # refuse before touching disk
    if existing is None or overwrite:
        dims = sarray.choose_dims(ref, node.shape, dims, derive_dims(node), labels)
    if existing is not None:
        sarray.acquire_lock(ref)  # refuses while another live job writes it
    if existing is None or overwrite:
        create(ref.store, node.shape, node.dtype, out_grid.tile, shard=shard, overwrite=True,
               path=ref.path, dims=dims,
               attributes={"tilearray": {"fingerprint": fp, "expression": str(node)}})
        sarray.acquire_lock(ref)
    try:
        create_temporaries(low)
        _, stats = engine.run(low.graph, low.keys, description=f"-> {os.path.basename(str(ref))}",
                              plan=low.plan, units_skipped=len(skip),
                              units_total=out_grid.n_units + temporary_units(low))
        stats.skipped_units = len(skip)
        mark_complete(ref, {"fingerprint": fp})
    finally:
        cleanup(low)
        sarray.release_lock(ref)
    out = TiledArray(source(ref))
    out.stats = stats
    x.stats = stats
    return out


def has_data(ref: ArrayRef) -> bool:
    """True when anything at all is stored under ``ref``."""
    root = getattr(ref.store, "root", None)
    if root is not None:
        path = os.path.join(str(root), ref.path)
        return os.path.exists(path) and (not os.path.isdir(path) or bool(os.listdir(path)))
    try:
        return bool(ref.list_keys(""))
    except Exception:
        return False


def existing_array(ref: ArrayRef):
    import zarr

    try:
        return zarr.open_array(ref.store, path=ref.path or None, mode="r")
    except Exception:
        return None


def create_temporaries(low: Lowered) -> None:
    for c in low.creates:
        create(c.ref.store, c.shape, c.dtype, c.tile, shard=c.shard, overwrite=True,
               compressor=None)


def temporary_units(low: Lowered) -> int:
    """I/O units of the run's temporaries (they are written like outputs)."""
    return sum(Grid.regular(c.shape, c.tile, c.shard).n_units for c in low.creates)


def cleanup(low: Lowered) -> None:
    import shutil

    for c in low.creates:
        if c.temporary and getattr(c.ref.store, "root", None):
            shutil.rmtree(str(c.ref.store.root), ignore_errors=True)


def _write_small(value: np.ndarray, ref: ArrayRef, dims, meta: dict | None = None) -> np.ndarray:
    """Store a small (in-memory) result, e.g. a reduction's vector, as Zarr.

    Like a matrix output it is created incomplete (which also takes a member it
    replaces out of its group's consolidated listing), filled, and only then
    marked complete and listed; ``meta`` (the fingerprint) is recorded for
    ``resume=True``."""
    import zarr

    value = np.asarray(value)
    attrs = {"format": sarray.FORMAT_VERSION, **(meta or {})}
    arr = zarr.create_array(ref.store, name=ref.path or None, shape=value.shape,
                            dtype=value.dtype, overwrite=True, zarr_format=3,
                            dimension_names=tuple(dims),
                            attributes={sarray.ATTR_KEY: {**attrs, "complete": False}})
    sarray.refresh_consolidated(ref)
    arr[...] = value
    arr.attrs[sarray.ATTR_KEY] = {**attrs, "complete": True}
    sarray.refresh_consolidated(ref)
    return value


def source(ref: ArrayRef, allow_incomplete: bool = False) -> Source:
    arr = open_array(ref, check_complete=not allow_incomplete)
    return Source(tuple(arr.shape), np.dtype(arr.dtype), ref, grid_of(arr), sarray.dims_of(arr))
