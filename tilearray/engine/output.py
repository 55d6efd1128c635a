"""Writing results: the order of the output commit protocol around a run
(checks, lock, create, run, verify inputs, mark complete), the expression's
fingerprint and resume decision, the run's temporaries. The storage steps
themselves are in :mod:`tilearray.storage` (``commit``, ``array``, ``locks``)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import numpy as np
from dask.base import tokenize

from ..errors import IncompleteOutputError, StorageError
from ..storage import ArrayRef, Grid, create, done_units, grid_of, mark_complete, open_array
from ..storage import array as sarray
from ..storage.commit import (
    check_target_kind,
    create_small,
    existing_array,
    input_state,
    local_path,
    refusing,
    run_checked,
    small_return,
    verify_inputs,
)
from ..storage.io import store_small
from ..storage.ref import check_task_writable
from . import runtime
from .expr.nodes import Source, derive_dims, sources, structure
from .plan.lower import Lowered, lower
from .plan.sizing import output_grid

log = logging.getLogger("tilearray")


def _fingerprint(node, states: dict | None = None) -> str:
    """Token of the expression and the state of every input it reads
    (``states``: from :func:`input_states`, to walk each input's files once)."""
    parts = [structure(node)]
    for leaf in sources(node):
        if states is not None and str(leaf.ref) in states:
            st = states[str(leaf.ref)][1]
            files = st if isinstance(st, tuple) else None  # local_files_state's value
        else:
            files = sarray.local_files_state(leaf.ref)
        parts.append((str(leaf.ref), leaf.shape, str(leaf.dtype), files))
    return tokenize(*parts)


# -- inputs: recorded when the job starts, verified before its output is marked complete --


def input_states(node) -> dict:
    """``{location: (ref, state)}`` of every stored input of ``node``."""
    out: dict = {}
    for leaf in sources(node):
        out.setdefault(str(leaf.ref), (leaf.ref, input_state(leaf.ref)))
    return out


# -- the target ---------------------------------------------------------------------------


def check_target(ref: ArrayRef, node) -> None:
    """Refuse, before anything is written, a target that is (or holds, or lies
    inside) one of the expression's inputs -- symbolic links resolved -- a
    symbolic link itself (see also :func:`check_target_kind`)."""
    out_loc = str(ref).rstrip("/")
    out_file = local_path(ref)
    out_real = os.path.realpath(out_file) if out_file is not None else None
    for leaf in sources(node):
        loc = str(leaf.ref).rstrip("/")
        same = loc == out_loc or loc.startswith(out_loc + "/")
        in_file = local_path(leaf.ref)
        if not same and out_real is not None and in_file is not None:
            in_real = os.path.realpath(in_file)
            same = in_real == out_real or in_real.startswith(out_real + os.sep) \
                or out_real.startswith(in_real + os.sep)
        if same:
            via = f" (through symbolic links: {out_real!r})" if out_real and \
                out_real != os.path.abspath(out_file) else ""
            raise StorageError(
                f"{str(ref)!r} holds an input of the expression ({loc!r}){via}; write the "
                "result elsewhere"
            )
    if out_file is not None and os.path.islink(out_file):
        raise StorageError(
            f"{str(ref)!r} is a symbolic link (to {os.path.realpath(out_file)!r}); tilearray "
            "does not replace a link: write to its target itself, or remove the link")


# -- writing ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _State:
    """What is at the target, and what this job will do with it."""

    existing: object
    """The opened Zarr array there, or None."""
    complete: bool
    """Resume of a complete output: nothing to do."""
    grid: Grid | None
    """The output's grid."""
    skip: frozenset
    """Units already done (resume)."""

    def key(self):
        g = self.grid
        return (self.existing is None, self.complete, g and (g.shape, g.tile, g.unit), self.skip)


def _inspect(ref, node, fp, tile, shard, dims, overwrite, resume) -> _State:
    """Decide from the target's state; raises the refusals (nothing is written)."""
    check_target_kind(ref, replace_abandoned=overwrite or resume)
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
            return _State(existing, True, old, frozenset())
        return _State(existing, False, old, frozenset(done_units(ref)))
    if existing is not None and not overwrite:
        raise StorageError(
            f"{str(ref)!r} already exists; pass overwrite=True to replace it "
            "(or resume=True to finish an interrupted run of the same expression)"
        )
    return _State(existing, False, output_grid(node, tile, shard), frozenset())


def write(x, path, tile, shard, overwrite, resume, engine, name="", dims=None):
    """``x.to_zarr(...)``: run ``x`` into the Zarr array at ``path``/``name``;
    returns ``(Source of the output, RunStats or None when nothing ran)``, or
    for a reduction's small result ``(its NumPy value, None)`` (``x.stats``
    then holds the run's figures).

    The commit protocol: every check that can refuse runs first (nothing is
    created); then the output's lock is taken (a second writer is refused
    with :class:`OutputLockedError`) and the target inspected again under it;
    only then is the array created or replaced, computed, its inputs verified
    unchanged since the job started, and the output marked complete."""
    node = x._node
    ref = ArrayRef.from_location(path, name)
    sarray.check_parents(ref)  # inside an array or a Zarr v2 group: refused before any work
    check_task_writable(ref)  # workers could not write into a MemoryStore of this process
    check_target(ref, node)
    labels = derive_dims(node, lambda src: ("row", "col"))
    if node.small or node.ndim != 2:
        return _write_small_result(x, ref, overwrite, resume, engine, dims, labels), None
    engine = engine or runtime.current_engine()
    check_sources(node)  # inputs overwritten since they were opened: refused before writing
    states = input_states(node)
    fp = _fingerprint(node, states)
    args = (ref, node, fp, tile, shard, dims, overwrite, resume)
    state = refusing(ref, _inspect, *args)
    if state.complete:
        log.info("%s is already complete", ref)
        return source(ref), None
    low = lower(node, engine.budget(), ref, state.grid, set(state.skip))  # refuse before disk
    sarray.acquire_lock(ref)  # before anything is created or replaced
    try:
        again = _inspect(*args)  # the truth, now that no other job can change it
        if again.complete:
            return source(ref), None
        if again.key() != state.key():
            low = lower(node, engine.budget(), ref, again.grid, set(again.skip))
        state = again
        if state.existing is None or overwrite:
            dims = sarray.choose_dims(ref, node.shape, dims, derive_dims(node), labels)
            create(ref.store, node.shape, node.dtype, state.grid.tile, shard=shard,
                   overwrite=True, path=ref.path, dims=dims,
                   attributes={"tilearray": {"fingerprint": fp, "expression": str(node)}})
        try:
            create_temporaries(low)
            _, stats = run_checked(
                states, ref, engine.run, low.graph, low.keys,
                description=f"-> {os.path.basename(str(ref))}", plan=low.plan,
                units_skipped=len(state.skip), stat_keys=low.stat_keys,
                units_total=state.grid.n_units + temporary_units(low))
            stats.skipped_units = len(state.skip)
            verify_inputs(states, ref)  # read unchanged from start to end: else never complete
            sarray.check_lock_held(ref)
            mark_complete(ref, {"fingerprint": fp})
        finally:
            cleanup(low)
    finally:
        sarray.release_lock(ref)
    return source(ref), stats


def _write_small_result(x, ref, overwrite, resume, engine, dims, labels):
    """A reduction's vector/scalar: computed in memory, stored as a plain Zarr
    array under the same protocol (checks, lock, verified inputs, commit)."""
    node = x._node

    def inspect():
        check_target_kind(ref, replace_abandoned=overwrite or resume)
        existing = existing_array(ref)
        if existing is not None and resume and not overwrite:
            meta = sarray.info_attrs(existing)
            if meta.get("fingerprint") != fp or existing.shape != tuple(node.shape):
                raise StorageError(
                    f"cannot resume {str(ref)!r}: it was written by a different expression "
                    "or from inputs that have changed since; pass overwrite=True to start again"
                )
            stored_dims = sarray.dims_of(existing)
            asked = None if dims is None else ((dims,) if isinstance(dims, str) else tuple(dims))
            if asked is not None and stored_dims is not None and asked != stored_dims:
                raise StorageError(f"cannot resume {str(ref)!r} with dims={asked}: it is "
                                   f"stored with dims={stored_dims}; resume without dims= (or "
                                   "with these), or pass overwrite=True")
            if meta.get("complete"):
                return existing
            # same expression, but its write was cut short: compute and write it again
        elif existing is not None and not overwrite:
            raise StorageError(
                f"{str(ref)!r} already exists; pass overwrite=True to replace it "
                "(or resume=True to reuse a complete result of the same expression)"
            )
        return None

    states = input_states(node)
    fp = _fingerprint(node, states)
    done = refusing(ref, inspect)
    if done is not None:
        log.info("%s is already complete", ref)
        return small_return(done)
    engine = engine or runtime.current_engine()
    sarray.acquire_lock(ref)
    try:
        done = inspect()
        if done is not None:
            return small_return(done)
        dims = sarray.choose_dims(ref, node.shape, dims, derive_dims(node), labels)
        meta = {"format": sarray.FORMAT_VERSION, "fingerprint": fp, "expression": str(node)}
        arr = create_small(ref, node.shape, node.dtype, dims, meta)
        # a worker computes the value and writes it: nothing passes the driver
        low = lower(node, engine.budget())
        key = "store-small-" + tokenize(str(ref), low.keys[0])
        low.graph[key] = (store_small, ref, low.keys[0])
        create_temporaries(low)
        try:
            _, stats = run_checked(states, ref, engine.run, low.graph, [key],
                                   description=f"-> {os.path.basename(str(ref))}",
                                   plan=low.plan, stat_keys=low.stat_keys,
                                   units_total=temporary_units(low))
        finally:
            cleanup(low)
        verify_inputs(states, ref)
        sarray.check_lock_held(ref)
        if (0, 0) not in done_units(ref):  # the worker's write never reached this store
            raise IncompleteOutputError(
                f"{str(ref)!r}: the task that wrote the result succeeded but its write is not "
                f"in the store{sarray.UNSEEN_WRITES}")
        arr.attrs[sarray.ATTR_KEY] = {**meta, "complete": True}
        sarray.refresh_consolidated(ref)
    finally:
        sarray.release_lock(ref)
    x.stats = stats
    return small_return(arr)


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


def source(ref: ArrayRef, allow_incomplete: bool = False) -> Source:
    arr = open_array(ref, check_complete=not allow_incomplete)
    return Source(tuple(arr.shape), np.dtype(arr.dtype), ref, grid_of(arr), sarray.dims_of(arr))


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
