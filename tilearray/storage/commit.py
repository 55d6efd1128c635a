"""The output commit protocol's storage side: what an input's state is (and
whether it changed under a running job), what kind of thing stands at a
target, and the whole write of a small in-memory result (created incomplete,
filled, then marked complete). The order of a job's steps -- checks, lock,
create, run, verify, commit -- is :func:`tilearray.engine.output.commit`'s."""

from __future__ import annotations

import os

import numpy as np

from ..errors import CorruptChunkError, IncompleteOutputError, StorageError
from . import array as sarray
from . import locks
from .array import ArrayRef
from .ref import not_a_directory, refusal_of_non_directory


class Unreachable:
    """The state of an array whose store did not answer (a server down,
    refused credentials): unknown, so never equal to a state taken before --
    and not a missing array, which is a deleted one."""

    def __init__(self, why: str):
        self.why = why

    def __eq__(self, other) -> bool:
        return False

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return f"Unreachable({self.why!r})"


def input_state(ref: ArrayRef):
    """What must not change under a running job: a local array's files (newest
    mtime, bytes, count), an object store's listing, else its stored
    metadata (None when missing: deleted); :class:`Unreachable`
    when the store does not answer (unknown, never unchanged)."""
    state = sarray.local_files_state(ref)
    if state is not None:
        return state
    try:
        return ref.get_key("zarr.json") or ref.get_key(".zarray")
    except Exception as e:
        return Unreachable(f"{type(e).__name__}: {e}")


def changed_input(states: dict, out: ArrayRef | None) -> StorageError | None:
    """An error naming the first input whose state differs from ``states``, or None.
    ``out``: the output being written; None for ``compute()`` (nothing written)."""
    for loc, (ref, before) in states.items():
        now = input_state(ref)
        if isinstance(now, Unreachable) or isinstance(before, Unreachable):
            why = (now if isinstance(now, Unreachable) else before).why  # unknown: resumable
            then = ("its result is discarded — compute again once the store answers"
                    if out is None else f"{str(out)!r} is not marked complete — finish it "
                    "with resume=True once the store answers")
            return StorageError(f"input {loc!r} could not be checked: its store did not "
                                f"answer ({why}); {then}")
        if now != before:
            gone = now is None or (isinstance(now, tuple) and now[2] == 0)
            what = 'was deleted' if gone else 'was modified'
            if out is None:
                return StorageError(
                    f"input {loc!r} {what} while compute() read it (e.g. another job "
                    "overwrote it); its result is discarded, never returned from a mix of "
                    "old and new data — compute again once the input is stable")
            return StorageError(
                f"input {loc!r} {what} while the job "
                f"writing {str(out)!r} read it; {str(out)!r} is not marked complete (never on "
                "stale data) — rerun once the input is stable (overwrite=True)")
    return None


def verify_inputs(states: dict, out: ArrayRef | None) -> None:
    """Raise if any input changed since the job recorded ``states``."""
    err = changed_input(states, out)
    if err is not None:
        raise err


def run_checked(states: dict, out: ArrayRef | None, fn, *args, **kwargs):
    """``fn(...)``; when it fails, an input that changed meanwhile is named
    (a deleted input otherwise surfaces as a raw FileNotFoundError). The
    output ``out`` (created, incomplete) first records its inputs' states
    (a local one by its path, an object store's by its location): should
    the job stop, opening it or resuming it tells whether a resume would be
    accepted (:func:`~.array.changed_inputs`)."""
    if out is not None:
        sarray.record_inputs(out, {
            loc: (local_path(ref) or loc, state) for loc, (ref, state) in states.items()
            if isinstance(state, tuple)})
    try:
        return fn(*args, **kwargs)
    except Exception as e:
        err = changed_input(states, out)
        if err is not None:
            raise err from e
        if isinstance(e, FileNotFoundError) and not isinstance(e, StorageError):
            raise StorageError(f"a file the job needed is gone: {e}") from e
        if isinstance(e, CorruptChunkError) and out is not None and e.path == str(out):
            raise CorruptChunkError(  # a factor's units, read back: a resume reads it again
                e.path, e.tile, f"{e.reason}; it is this job's own output, a unit an "
                "earlier run of it wrote and this run read back: pass overwrite=True to "
                "compute the output again") from e
        raise


def local_path(ref: ArrayRef) -> str | None:
    root = sarray.local_root(ref.store)
    return None if root is None else os.path.join(root, *[p for p in ref.path.split("/") if p])


def check_target_kind(ref: ArrayRef, replace_abandoned: bool = False) -> None:
    """Refuse a target that is a regular file, a group or other files. Part of
    inspecting the target (while another job replaces an array, its directory
    is briefly neither: that job's lock then says so).

    What a killed job left before its array's metadata existed (its stale lock
    says so, :func:`~.locks.abandoned_by`) is an unfinished output: replaced
    when ``replace_abandoned`` (resume / overwrite), else refused with
    :class:`IncompleteOutputError`."""
    out_file = local_path(ref)
    found = None if out_file is None else not_a_directory(out_file)
    if found is not None:
        raise refusal_of_non_directory(str(ref), found, "a Zarr array")
    if existing_array(ref) is None and has_data(ref):
        if abandoned(ref, replace_abandoned):
            return
        raise StorageError(
            f"{str(ref)!r} exists and is not a Zarr array (a group, or other files); refusing "
            "to replace it — choose another path or remove it first"
        )


def abandoned(ref: ArrayRef, replace: bool) -> bool:
    """True if the non-array data at ``ref`` was left by a killed writer and
    ``replace`` allows replacing it; False if no killed writer left it;
    IncompleteOutputError if one did and ``replace`` is False."""
    dead = locks.abandoned_by(ref)
    if dead is None:
        return False
    if replace:
        return True
    raise IncompleteOutputError(
        f"{str(ref)!r} is an unfinished output: the job creating it "
        f"({locks.describe_holder(dead)}) was killed before its array metadata was "
        "written; rerun with resume=True or overwrite=True to replace it")


def refusing(ref: ArrayRef, fn, *args):
    """``fn(*args)``; a refusal about the target's state becomes
    :class:`OutputLockedError` when another job is writing it right now."""
    try:
        return fn(*args)
    except OSError:  # StorageError, or a file vanishing under another job's overwrite
        sarray.check_unlocked(ref)
        raise


def has_data(ref: ArrayRef) -> bool:
    """True when anything at all is stored under ``ref``."""
    root = getattr(ref.store, "root", None)
    if root is not None:
        path = os.path.join(str(root), ref.path)
        return os.path.exists(path) and (not os.path.isdir(path) or bool(os.listdir(path)))
    try:  # other stores keep an array's own lock inside it (locks.ROOT_LOCK_KEY): not data
        return any(k.split("/", 1)[0] not in locks.OWN_KEYS for k in ref.list_keys(""))
    except Exception:
        return False


def existing_array(ref: ArrayRef):
    import zarr

    try:
        return zarr.open_array(ref.store, path=ref.path or None, mode="r")
    except Exception:
        return None


def create_small(ref: ArrayRef, shape: tuple, dtype, dims, meta: dict, chunks=None,
                 shards=None):
    """The empty, incomplete Zarr array a small (1-D / 0-d) result is written
    into by a worker task; creating it also takes a member it replaces out of
    its group's consolidated listing. ``meta`` (the fingerprint) is recorded
    for ``resume=True``; the caller marks it complete. ``chunks`` /
    ``shards``: the user's (``to_zarr(tile=, shard=)``), else Zarr's."""
    import zarr

    sarray.prepare_member(ref)  # out of its group's listing before it is (re)created
    arr = zarr.create_array(ref.store, name=ref.path or None, shape=tuple(shape),
                            chunks=chunks or "auto", shards=shards,
                            dtype=np.dtype(dtype), overwrite=sarray.clear_for_overwrite(ref),
                            zarr_format=3, dimension_names=tuple(dims),
                            config={"write_empty_chunks": True},
                            attributes={sarray.ATTR_KEY: {**meta, "complete": False}})
    sarray.refresh_consolidated(ref)
    return arr


SMALL_RETURN = 64 * 2**20
"""A 1-D / 0-d result written to Zarr up to this size is also returned as a
NumPy array (read back from the store); a larger one as the read-only
``zarr.Array``, so it never passes through the driver's memory."""


def small_return(arr):
    """What ``to_zarr`` of a small result returns: the stored values as NumPy,
    or, above :data:`SMALL_RETURN`, the read-only ``zarr.Array``."""
    import zarr

    arr = zarr.open_array(arr.store_path.store, path=arr.store_path.path or None, mode="r")
    nbytes = int(np.prod(arr.shape, dtype=np.int64)) * arr.dtype.itemsize
    return np.asarray(arr[...]) if nbytes <= SMALL_RETURN else arr
