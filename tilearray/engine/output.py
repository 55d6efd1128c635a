"""Running a plan: the commit protocol, written once (:func:`commit`) and used
by ``to_zarr`` of a matrix, of a small result and by ``compute()``; the
expression's fingerprint and resume decision; the run's temporaries. The
storage steps themselves are in :mod:`tilearray.storage` (``commit``,
``array``, ``locks``)."""

from __future__ import annotations

import dataclasses
import logging
import os
import uuid
from dataclasses import dataclass

import numpy as np
from dask.base import tokenize

from .. import _config
from ..errors import IncompleteOutputError, PlanningArgumentError, StorageError
from ..graphs.linalg import svd_from_r
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
from ..storage.ref import check_task_readable, check_task_writable
from . import runtime
from .expr.nodes import (
    TSQR,
    Factor,
    Node,
    Source,
    derive_dims,
    is_big_vector,
    sources,
    structure,
)
from .plan.lower import fitted_output_grid, lower
from .plan.sizing import output_grid
from .plan.types import Plan

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
    check_not_an_input(ref, [leaf.ref for leaf in sources(node)], "the expression")
    out_file = local_path(ref)
    if out_file is not None and os.path.islink(out_file):
        raise StorageError(
            f"{str(ref)!r} is a symbolic link (to {os.path.realpath(out_file)!r}); tilearray "
            "does not replace a link: write to its target itself, or remove the link")


def check_not_an_input(ref: ArrayRef, inputs, what: str) -> None:
    """Refuse a target ``ref`` that is, holds or lies inside one of the
    ``inputs`` (ArrayRefs), symbolic links resolved; ``what`` reads them."""
    out_loc = str(ref).rstrip("/")
    out_file = local_path(ref)
    out_real = os.path.realpath(out_file) if out_file is not None else None
    for in_ref in inputs:
        loc = str(in_ref).rstrip("/")
        same = loc == out_loc or loc.startswith(out_loc + "/")
        in_file = local_path(in_ref)
        if not same and out_real is not None and in_file is not None:
            in_real = os.path.realpath(in_file)
            same = in_real == out_real or in_real.startswith(out_real + os.sep) \
                or out_real.startswith(in_real + os.sep)
        if same:
            via = f" (through symbolic links: {out_real!r})" if out_real and \
                out_real != os.path.abspath(out_file) else ""
            raise StorageError(
                f"{str(ref)!r} holds an input of {what} ({loc!r}){via}; write the "
                "result elsewhere"
            )


# -- the commit protocol -------------------------------------------------------------------


@dataclass(frozen=True)
class _State:
    """What is at the target, and what this job will do with it."""

    existing: object
    """The opened Zarr array there, or None."""
    complete: bool
    """Resume of a complete output: nothing to do."""
    grid: Grid | None = None
    """The output's grid (a matrix)."""
    skip: frozenset = frozenset()
    """Units already done (resume)."""

    def key(self):
        g = self.grid
        return (self.existing is None, self.complete, g and (g.shape, g.tile, g.unit), self.skip)


@dataclass(frozen=True)
class Ran:
    """What :func:`commit` did."""

    values: list | None
    """The gathered values of the plan's result (None: nothing ran)."""
    stats: object
    """:class:`~tilearray.engine.runtime.RunStats` of the run (no task, every
    unit skipped: the output was already complete)."""
    state: _State | None
    """The target as the job found it (None without a target)."""
    plan: Plan | None
    """The plan that ran."""
    outputs: dict | None = None
    """Values of the plan's other named outputs that are in memory (``"factors"``
    of a TSQR: R, s, Vt computed on the way to Q or U)."""


def _nothing_ran(state: _State):
    """The figures of a resumed job whose output was already complete: no
    task, every unit skipped (a small result, written whole, is one unit)."""
    return runtime.RunStats(skipped_units=state.grid.n_units if state.grid is not None else 1)


def commit(node, engine, job=None, description: str = "compute") -> Ran:
    """Run ``node`` under the commit protocol (nothing runs when a resumed
    output is already complete).

    The order, the same for every job: the inputs' state is recorded and
    checked against the expression; with a target (``job``), every check that
    can refuse runs first and the plan is made (refused before anything is
    written); then the output's lock is taken (a second writer is refused
    with :class:`OutputLockedError`) and the target inspected again under it;
    only then is the array created or replaced, the plan run, the inputs
    verified unchanged since the job started, and the output marked complete
    by ``job``. Without a target (``compute()``), the plan is run and its
    inputs verified: a result read from changing inputs is never returned."""
    check_sources(node)  # inputs overwritten since they were opened: refused before anything
    states = input_states(node)
    for ref, _ in states.values():  # memory:// inputs are empty in worker processes
        check_task_readable(ref, engine.in_process)
    if job is None:
        plan = job_plan(node, engine, states)
        values, stats, side = _run(plan, states, None, engine, description)
        _remember(node, states, side, values)
        return Ran(values, stats, None, plan, side)
    state = refusing(job.ref, job.inspect, states)
    if state.complete:
        log.info("%s is already complete", job.ref)
        return Ran(None, _nothing_ran(state), state, None)
    plan = job_plan(node, engine, states, job.ref, state)  # refuse before disk
    sarray.acquire_lock(job.ref)  # before anything is created or replaced
    try:
        again = job.inspect(states)  # the truth, now that no other job can change it
        if again.complete:
            return Ran(None, _nothing_ran(again), again, None)
        if again.key() != state.key():
            plan = job_plan(node, engine, states, job.ref, again)
        job.create(again)
        values, stats, side = _run(plan, states, job.ref, engine, description,
                                   units_skipped=len(again.skip),
                                   units_total=again.grid.n_units if again.grid is not None
                                   else 0)
        sarray.check_lock_held(job.ref)
        job.complete(again)
        _remember(node, states, side, values)
    finally:
        sarray.release_lock(job.ref)
    return Ran(values, stats, again, plan, side)


_FACTORS: dict = {}
"""Small factors a TSQR run computed on the way to Q or U (R, s, Vt), by
``(the factorization's structure, its inputs' fingerprint)``: ``s.compute()``
after ``U.to_zarr()`` of the same ``svd(x)`` on unchanged inputs is not
another pass over X. The newest few are kept."""


def _factor_key(node, states) -> tuple | None:
    if not isinstance(node, TSQR):
        return None
    whole = dataclasses.replace(node, part="*", shape=())  # every part of one factorization
    return _fingerprint(whole, states)


def cached_factor(node):
    """The value of ``node`` (a TSQR's R, s or Vt) if a run of the same
    factorization on unchanged inputs computed it, else None."""
    if not isinstance(node, TSQR) or node.part not in ("R", "s", "Vt") or not _FACTORS:
        return None
    value = _part(_FACTORS.get(_factor_key(node, input_states(node))), node.part,
                  node.x.shape[1])
    # a float32 X's factors are kept in float64 where a run gave them so (R beside s)
    return None if value is None else np.asarray(value).astype(node.dtype, copy=False)


def _part(hit: dict | None, part: str, n: int):
    """``part`` of a remembered factorization ``hit`` of an ``m x n`` X: as a
    run gave it, or s and Vt from its R (the root's SVD of R, taken here:
    ``s.compute()`` then ``Vt.compute()`` of one ``svd(x)`` read X once)."""
    if hit is None:
        return None
    r = hit.get("R")
    # a float32 X's R computed alone is returned rounded to float32: its small singular
    # values would lose what a float64 R keeps (eps32 * cond), so those take a run
    if hit.get(part) is None and part in ("s", "Vt") and r is not None and \
            np.asarray(r).dtype == np.float64:
        _, hit["s"], hit["Vt"] = svd_from_r(np.asarray(r)[:, :n])
    return hit.get(part)


def _remember(node, states, outputs, values=None) -> None:
    """Keep the small factors a TSQR run gave: those of a Q / U run, or the
    R, s or Vt it computed."""
    key = _factor_key(node, states)
    if key is None:
        return
    got = dict(outputs["factors"]) if outputs and "factors" in outputs else {}
    if node.part in ("R", "s", "Vt") and values:
        got[node.part] = values[0]
    if got:
        _FACTORS[key] = {**_FACTORS.pop(key, {}), **got}
        while len(_FACTORS) > 8:
            _FACTORS.pop(next(iter(_FACTORS)))


def aligned(node, states: dict, memo=None):
    """``node`` with each TSQR U in it (``svd(x).U``) given the ``Vt`` an
    earlier run of the same factorization computed, if any, to match:
    ``U, s, Vt = svd(x)`` computed one at a time, ``Vt`` first, come from two
    runs and two R factors of X (:func:`~tilearray.graphs.linalg.align_svd`).
    ``states``: the job's :func:`input_states` (each input's files walked once)."""
    memo = {} if memo is None else memo
    if id(node) in memo:
        return memo[id(node)]
    new = node
    if dataclasses.is_dataclass(node) and isinstance(node, Node):
        changes = {}
        for f in dataclasses.fields(node):
            v = getattr(node, f.name)
            if isinstance(v, Node) and aligned(v, states, memo) is not v:
                changes[f.name] = aligned(v, states, memo)
            elif isinstance(v, tuple) and any(isinstance(a, Node) for a in v):
                w = tuple(aligned(a, states, memo) if isinstance(a, Node) else a for a in v)
                if any(a is not b for a, b in zip(v, w, strict=True)):
                    changes[f.name] = w
        if isinstance(node, TSQR) and node.part == "U" and "align" not in dict(node.options):
            vt = _part(_FACTORS.get(_factor_key(node, states)), "Vt",
                       node.x.shape[1]) if _FACTORS else None
            if vt is not None:
                changes["options"] = tuple(sorted({**dict(node.options),
                                                   "align": np.asarray(vt)}.items()))
        if changes:
            new = dataclasses.replace(node, **changes)
    memo[id(node)] = new
    return new


def job_plan(node, engine, states: dict, ref=None, state=None) -> Plan:
    """The plan a job runs: into ``ref`` (the units of ``state.skip`` done) or
    returned; ``states``: the job's :func:`input_states`."""
    grid = state.grid if state is not None else None
    return lower(aligned(node, states), engine.budget(), ref, grid,
                 state.skip if state is not None else ())


def _not_rewritten(stats, plan: Plan, done: int, n_units: int) -> int:
    """Of the ``done`` output units found done before a resumed run, those it
    did not write again: a task whose block holds a missing unit writes the
    whole block (a plan with other blocks than the killed job's), so the
    output units it wrote beyond the missing ones were done already."""
    if not done:
        return 0
    output_written = stats.units_written - plan.temporary_units()
    return max(0, done - max(0, output_written - (n_units - done)))


def _run(plan: Plan, states, ref, engine, description, units_skipped=0, units_total=0):
    """Create the plan's temporaries, run it, delete them, verify the inputs.
    Returns the result's values, the RunStats and the plan's other in-memory
    named outputs (``{name: value}``)."""
    side = [(name, o.keys[0]) for name, o in plan.outputs.items()
            if name != "result" and o.kind == "value"]
    keys = list(plan.result.keys)
    create_temporaries(plan)
    try:
        values, stats = run_checked(
            states, ref, engine.run, plan.graph(), keys + [k for _, k in side],
            description=description, plan=plan, units_skipped=units_skipped,
            stat_keys=list(plan.stat_keys), units_total=units_total + plan.temporary_units())
        stats.skipped_units = _not_rewritten(stats, plan, units_skipped, units_total)
    finally:
        cleanup(plan)
    verify_inputs(states, ref)  # read unchanged from start to end: else never complete
    return values[: len(keys)], stats, {name: v for (name, _), v in
                                        zip(side, values[len(keys):], strict=True)}


def _resume_refused(ref, existing=None, meta=None, node=None) -> StorageError:
    """The refusal of a resume whose target was not written by this job,
    naming why where the target tells: its shape or dtype, or the inputs
    recorded when its job started that changed since."""
    why = "it was written by a different expression or from inputs that have changed since"
    if existing is not None and node is not None and (
            existing.shape != tuple(node.shape) or
            (node.dtype is not None and existing.dtype != node.dtype)):
        why = (f"it holds a {existing.shape} {existing.dtype} array, the expression gives "
               f"{tuple(node.shape)} {node.dtype}")
    elif meta and (changed := sarray.changed_inputs(
            meta, None if node is None else {str(leaf.ref): leaf.ref for leaf in sources(node)})):
        why = "its inputs changed since its job started: " + "; ".join(changed)
    return StorageError(f"cannot resume {str(ref)!r}: {why}; pass overwrite=True to start again")


class MatrixJob:
    """A 2-D result written unit by unit into ``ref`` (``to_zarr``)."""

    def __init__(self, ref, node, tile, shard, dims, overwrite, resume):
        self.ref, self.node, self.tile, self.shard = ref, node, tile, shard
        self.dims, self.overwrite, self.resume = dims, overwrite, resume
        self.budget = None
        """The engine's budget, once known: an inherited tile is fitted to it."""
        self._fitted = None  # (budget, grid)
        self.fp = None

    def inspect(self, states) -> _State:
        """Decide from the target's state; raises the refusals (nothing is written)."""
        ref, node, tile, shard, dims = self.ref, self.node, self.tile, self.shard, self.dims
        self.fp = self.fp or _fingerprint(node, states)
        check_target_kind(ref, replace_abandoned=self.overwrite or self.resume)
        existing = existing_array(ref)
        if existing is not None and self.resume and not self.overwrite:
            meta = sarray.info_attrs(existing)
            if meta.get("fingerprint") != self.fp or existing.shape != tuple(node.shape) \
                    or existing.dtype != node.dtype:
                raise _resume_refused(ref, existing, meta, node)
            old = grid_of(existing)
            for what, asked, has in (("tile", tile, old.tile), ("shard", shard, old.unit)):
                if asked is not None and tuple(int(v) for v in asked) != has:
                    raise StorageError(
                        f"cannot resume {str(ref)!r} with {what}={tuple(asked)}: it is stored "
                        f"with tile={old.tile}, shard={old.unit if old.sharded else None}; "
                        "resume without tile=/shard= (or with these), or pass overwrite=True")
            stored_dims = sarray.dims_of(existing)
            if dims is not None and stored_dims is not None and tuple(dims) != stored_dims:
                raise StorageError(f"cannot resume {str(ref)!r} with dims={tuple(dims)}: it is "
                                   f"stored with dims={stored_dims}")
            if meta.get("complete"):
                return _State(existing, True, old)
            return _State(existing, False, old, frozenset(done_units(ref)))
        if existing is not None and not self.overwrite:
            raise StorageError(
                f"{str(ref)!r} already exists; pass overwrite=True to replace it "
                "(or resume=True to finish an interrupted run of the same expression)")
        # planned once a job for its budget (inspect runs again under the lock)
        if self._fitted is None or self._fitted[0] != self.budget:
            self._fitted = (self.budget, fitted_output_grid(node, tile, shard, self.budget, ref))
        return _State(existing, False, self._fitted[1])

    def create(self, state: _State) -> None:
        if state.existing is None or self.overwrite:
            node = self.node
            dims = _output_dims(self.ref, node, self.dims)
            create(self.ref.store, node.shape, node.dtype, state.grid.tile, shard=self.shard,
                   overwrite=True, path=self.ref.path, dims=dims, compressor=_codec(node),
                   attributes={"tilearray": {"fingerprint": self.fp,
                                             "expression": str(node)}})

    def complete(self, state: _State) -> None:
        mark_complete(self.ref, {"fingerprint": self.fp})


def _output_dims(ref: ArrayRef, node, dims) -> tuple:
    """Dimension names of a new output (:func:`~tilearray.storage.array.choose_dims`):
    those carried from the inputs; an input without any (plain zarr) named
    after itself, ``X_row`` / ``X_col``, so that ``X - X.mean(0)`` and
    ``X.mean(0)`` stored beside it share X's column dimension in xarray
    (each output had got its own: helper-50)."""

    def stored_or_named(src):
        name = src.ref.short_name
        if src.dims is not None or name is None:
            return src.dims
        return tuple(f"{name}_{label}" for label in ("row", "col")[: len(src.shape)])

    labels = derive_dims(node, lambda src: ("row", "col"))
    return sarray.choose_dims(ref, node.shape, dims,
                              derive_dims(node, stored_or_named, partial=True), labels)


def _codec(node) -> str:
    """The compressor of ``node``'s stored output: a Cholesky factor, read
    back by its own job as it is written, takes ``storage.factor-compressor``."""
    if isinstance(node, Factor) and node.part == "L":
        return _config.get("storage.factor-compressor")
    return "default"


class SmallJob:
    """A reduction's vector or scalar, written by one worker task into a
    plain Zarr array at ``ref``."""

    def __init__(self, ref, node, dims, overwrite, resume, tile=None, shard=None):
        self.ref, self.node, self.dims = ref, node, dims
        self.overwrite, self.resume = overwrite, resume
        self.fp = self.arr = self.meta = None
        self.chunks = self.shards = None  # Zarr's default unless given (checked here)
        if tile is not None or shard is not None:
            if len(node.shape) != 1:
                raise PlanningArgumentError(f"tile= / shard= given for a {len(node.shape)}-d "
                                            "result: it is stored as one value")
            grid = output_grid(node, tile, shard)  # a vector's grid: the column (m, 1)
            self.chunks = (grid.tile[0],)
            self.shards = (grid.unit[0],) if grid.unit[0] != grid.tile[0] else None

    def inspect(self, states) -> _State:
        ref, node, dims = self.ref, self.node, self.dims
        self.fp = self.fp or _fingerprint(node, states)
        check_target_kind(ref, replace_abandoned=self.overwrite or self.resume)
        existing = existing_array(ref)
        if existing is not None and self.resume and not self.overwrite:
            meta = sarray.info_attrs(existing)
            if meta.get("fingerprint") != self.fp or existing.shape != tuple(node.shape):
                raise _resume_refused(ref, existing, meta, node)
            stored_dims = sarray.dims_of(existing)
            asked = None if dims is None else ((dims,) if isinstance(dims, str) else tuple(dims))
            if asked is not None and stored_dims is not None and asked != stored_dims:
                raise StorageError(f"cannot resume {str(ref)!r} with dims={asked}: it is "
                                   f"stored with dims={stored_dims}; resume without dims= (or "
                                   "with these), or pass overwrite=True")
            if meta.get("complete"):
                return _State(existing, True)
            # same expression, but its write was cut short: compute and write it again
        elif existing is not None and not self.overwrite:
            raise StorageError(
                f"{str(ref)!r} already exists; pass overwrite=True to replace it "
                "(or resume=True to reuse a complete result of the same expression)")
        return _State(existing, False)

    def create(self, state: _State) -> None:
        node = self.node
        dims = _output_dims(self.ref, node, self.dims)
        self.meta = {"format": sarray.FORMAT_VERSION, "fingerprint": self.fp,
                     "expression": str(node)}
        self.arr = create_small(self.ref, node.shape, node.dtype, dims, self.meta, self.chunks,
                                self.shards)

    def complete(self, state: _State) -> None:
        if (0, 0) not in done_units(self.ref):  # the worker's write never reached this store
            raise IncompleteOutputError(
                f"{str(self.ref)!r}: the task that wrote the result succeeded but its write is "
                f"not in the store{sarray.UNSEEN_WRITES}")
        self.arr.attrs[sarray.ATTR_KEY] = {**self.meta, "complete": True}
        sarray.refresh_consolidated(self.ref)


def write(x, path, tile, shard, overwrite, resume, engine, name="", dims=None):
    """``x.to_zarr(...)``: run ``x`` into the Zarr array at ``path``/``name``
    under :func:`commit`; returns ``(Source of the output, RunStats)`` (no
    task when the output was already complete), or for a reduction's small result ``(its NumPy
    value, None)`` (``x.stats`` then holds the run's figures)."""
    node = x._node
    ref = ArrayRef.from_location(path, name)
    sarray.check_parents(ref)  # inside an array or a Zarr v2 group: refused before any work
    check_task_writable(ref)  # workers could not write into a MemoryStore of this process
    check_target(ref, node)
    small = node.small or (node.ndim != 2 and not is_big_vector(node))
    # a matrix job's tasks write only while its lock carries this token (ArrayRef.run)
    job = SmallJob(ref, node, dims, overwrite, resume, tile, shard) if small else \
        MatrixJob(dataclasses.replace(ref, run=uuid.uuid4().hex), node, tile, shard, dims,
                  overwrite, resume)
    refusing(ref, job.inspect, input_states(node))  # refused before the engine starts
    engine = engine or runtime.current_engine()
    if not small:
        job.budget = engine.budget()
    ran = commit(node, engine, job, f"-> {os.path.basename(str(ref))}")
    if small:
        x.stats = ran.stats
        return small_return(ran.state.existing if ran.state.complete else job.arr), None
    return source(ref), ran.stats


def create_temporaries(plan: Plan) -> None:
    for c in plan.creates:
        create(c.ref.store, c.shape, c.dtype, c.tile, shard=c.shard, overwrite=True,
               compressor=None)


def cleanup(plan: Plan) -> None:
    import shutil

    for c in plan.creates:
        if c.temporary and getattr(c.ref.store, "root", None):
            shutil.rmtree(str(c.ref.store.root), ignore_errors=True)


def source(ref: ArrayRef, allow_incomplete: bool = False) -> Source:
    arr = open_array(ref, check_complete=not allow_incomplete)
    return Source(tuple(arr.shape), np.dtype(arr.dtype), ref, grid_of(arr), sarray.dims_of(arr),
                  allow_incomplete and not sarray.marked_complete(arr))


def _check_finished(ref) -> None:
    """An output opened with ``allow_incomplete=True`` is computed with only
    once its job has finished: its units not done would read as zeros (or
    as a unit cut short by the kill)."""
    arr = open_array(ref, check_complete=False)
    if sarray.marked_complete(arr):
        return
    units = grid_of(arr).n_units
    raise IncompleteOutputError(
        f"{str(ref)!r} was opened with allow_incomplete=True to inspect it, and it is still "
        f"incomplete ({units - len(done_units(ref))} of {units} I/O units not done): computing "
        "with it is refused, as its units not done would read as zeros. Finish it first "
        "(to_zarr(..., resume=True) with the expression that writes it), or read the units it "
        "holds with .to_dask() or zarr")


def check_sources(node) -> None:
    """Before a run: every stored input still has the shape, dtype and tiling
    it had when the expression was built (it may have been overwritten since)."""
    from ..storage import grid_of, open_array

    seen: set = set()
    for n in sources(node):
        if id(n) in seen:
            continue
        seen.add(id(n))
        if n.incomplete:
            _check_finished(n.ref)
        arr = open_array(n.ref)
        g = grid_of(arr)
        if (tuple(arr.shape), np.dtype(arr.dtype), g.tile, g.unit) != (
                tuple(n.shape), np.dtype(n.dtype), n.grid.tile, n.grid.unit):
            raise StorageError(
                f"{str(n.ref)!r} changed since it was opened: now {tuple(arr.shape)} "
                f"{arr.dtype} tile={g.tile}, was {tuple(n.shape)} {n.dtype} "
                f"tile={n.grid.tile}; open it again (ta.open) and rebuild the expression")
