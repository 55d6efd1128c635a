"""Create, open and validate tiled matrices stored as Zarr arrays, and the
per-unit done markers and completion of outputs. The handle
(:class:`ArrayRef`) is in :mod:`.ref`, group membership and consolidated
metadata in :mod:`.groups`; both are re-exported here.

An :class:`ArrayRef` is the small, picklable handle that tasks carry (a Zarr
store plus the array's path inside it), never the data. Outputs written by
tilearray carry their bookkeeping under the ``tilearray`` attribute key and
per-unit done markers under ``<array>/tilearray.done/``.
"""

from __future__ import annotations

import os
from typing import Any

import numcodecs.errors
import numpy as np
import zarr
from zarr.abc.store import Store
from zarr.codecs import BloscCodec, BloscShuffle, Crc32cCodec, ZstdCodec
from zarr.core.sync import collect_aiterator, sync
from zarr.errors import ArrayNotFoundError, ContainsGroupError, NodeTypeValidationError
from zarr.storage import LocalStore

from .. import _config
from ..errors import IncompleteOutputError, StorageArgumentError, StorageError
from .geometry import Grid, int_pair
from .groups import (  # noqa: F401  (re-exported: callers use storage.array's names)
    check_parents,
    choose_dims,
    dims_of,
    node_at,
    prepare_member,
    refresh_consolidated,
    sibling_dims,
)
from .locks import (  # noqa: F401  (the output lock, re-exported)
    abandoned_by,
    acquire_lock,
    check_lock_held,
    check_unlocked,
    describe_holder,
    group_lock,
    live_writer,
    local_root,
    lock_path,
    output_lock_key,
    release_lock,
)
from .objects import missing_bucket, refused_options, store_refused
from .ref import (  # noqa: F401  (re-exported: callers use storage.array's names)
    ATTR_KEY,
    DONE_DIR,
    FORMAT_VERSION,
    ArrayRef,
    check_name,
    describe,
    info_attrs,
    unit_done_key,
    unit_fill_key,
)
from .stream import streams_rows

SUPPORTED_KINDS = "biuf"  # bool, signed/unsigned integers, floats


def grid_of(arr: zarr.Array) -> Grid:
    """The tile / I/O-unit grid of an opened 2-D Zarr array (v2 or v3); a 1-D
    array of length n is seen as the column ``(n, 1)``."""
    shards = arr.shards
    if arr.ndim == 1:
        return Grid.regular((arr.shape[0], 1), (arr.chunks[0], 1),
                            None if shards is None else (shards[0], 1))
    return Grid.regular(arr.shape, arr.chunks, shards, streams_rows(arr))


def check_dtype(dtype: Any, where: str, error: type = StorageError) -> np.dtype:
    """The NumPy dtype of ``dtype`` if tilearray handles it, else ``error``
    (:class:`StorageArgumentError` where the user passed it)."""
    try:
        dt = np.dtype(dtype)
    except TypeError as e:
        raise error(f"{where}: unsupported dtype {dtype!r}: {e}") from None
    if dt.kind not in SUPPORTED_KINDS or dt.kind == "f" and dt.itemsize > 8:
        raise error(  # Zarr has no long double
            f"{where}: unsupported dtype {dt} (tilearray handles bool, integer and "
            "floating-point matrices, float16 to float64)"
        )
    return dt


def open_array(
    where: str | os.PathLike | Store | ArrayRef,
    path: str = "",
    *,
    mode: str = "r",
    check_complete: bool = True,
) -> zarr.Array:
    """Open and validate an existing 2-D Zarr array (format 2 or 3, sharded or not).

    Raises
    ------
    StorageError
        Nothing is at ``where`` / ``path``, it is a group, the array is not
        2-D, or its dtype is not numeric.
    IncompleteOutputError
        It is a tilearray output whose job did not finish (``check_complete``).
    """
    ref = where if isinstance(where, ArrayRef) else ArrayRef.from_location(where, path)
    loc = str(ref)
    if isinstance(ref.store, LocalStore) and not os.path.exists(ref.store.root):
        why = ("it is a symbolic link to a missing target "
               f"({os.readlink(ref.store.root)!r})" if os.path.islink(ref.store.root)
               else "the path does not exist")
        raise StorageError(f"no Zarr array at {loc!r}: {why}")
    try:
        arr = zarr.open_array(ref.store, path=ref.path or None, mode=mode)
    except (ArrayNotFoundError, FileNotFoundError, KeyError) as e:
        dead = abandoned_by(ref) if check_complete else None
        if dead is not None:  # a killed job's create, cut short before zarr.json
            raise IncompleteOutputError(
                f"{loc!r} is an unfinished output: the job creating it "
                f"({describe_holder(dead)}) was killed before its array metadata was "
                "written; rerun that job with resume=True or overwrite=True") from None
        if _is_group(ref):  # a format 2 group: zarr says only "no array found"
            raise StorageError(_group_message(ref)) from None
        why = missing_bucket(ref.store) or ("no zarr.json or .zarray is stored there"
                                            if isinstance(e, ArrayNotFoundError) else e)
        raise StorageError(f"no Zarr array at {loc!r}: {why}") from None
    except (ContainsGroupError, NodeTypeValidationError) as e:
        raise StorageError(_group_message(ref)) from e
    except (numcodecs.errors.UnknownCodecError, zarr.errors.UnknownCodecError) as e:
        raise StorageError(
            f"cannot open {loc!r}: its metadata names a codec that is not installed here "
            f"({e}); install the package that provides it (zfpy, imagecodecs, ...) where "
            "the driver and the dask workers run") from e
    except (ValueError, TypeError) as e:  # e.g. json's "Expecting value": no path named
        if (err := refused_options(e)) is not None:
            raise err from None
        raise StorageError(
            f"cannot read the metadata of {loc!r} (zarr.json / .zarray): {type(e).__name__}: "
            f"{e} — the file is damaged or cut short (a copy that ran out of space?)") from e
    except Exception as e:  # credentials refused, an endpoint that does not answer
        if (err := store_refused("open", loc, e)) is None:
            raise
        raise err from e
    if arr.ndim not in (1, 2):
        raise StorageError(not_a_matrix_message(ref, arr))
    check_dtype(arr.dtype, loc)
    if check_complete:
        check_output_complete(ref, arr)
    return arr


def _is_group(ref: ArrayRef) -> bool:
    """True when a Zarr group (format 2 or 3) is stored at ``ref``."""
    try:
        return node_at(ref.store, ref.path)[0] == "group"
    except Exception:  # an unreadable store: report what zarr said
        return False


def _group_message(ref: ArrayRef) -> str:
    """Why a group does not open as a matrix, with the members that would."""
    try:
        # the members as stored, not a consolidated listing that may be stale
        group = zarr.open_group(ref.store, path=ref.path or None, mode="r",
                                use_consolidated=False)
        # every array, those of subgroups by their paths ("sub/X")
        names = sorted(p for p, a in group.members(max_depth=None)
                       if isinstance(a, zarr.Array))
        listed = (" (its arrays: " + ", ".join(names[:10])
                  + (f", ... ({len(names)} in all)" if len(names) > 10 else "") + ")"
                  if names else " (it holds no arrays)")
    except Exception:  # unreadable: the message stands without the list
        listed = ""
    return (f"{str(ref)!r} is a Zarr group, not an array; pass the array's path inside "
            f"it{listed}, e.g. ta.open(path, name)")


def not_a_matrix_message(ref: ArrayRef, arr: zarr.Array) -> str:
    """Why a 1-D / 0-d (or n-D) array does not open as a TiledArray, and how to read it."""
    root = describe(ref.store)
    if ref.path:
        group, _, member = ref.path.rpartition("/")
        where = f"{root}/{group}" if group else root
        how = (f"zarr.open_array({root!r}, path={ref.path!r})[...] or "
               f"xarray.open_zarr({where!r})[{member!r}]")
    else:
        how = f"zarr.open_array({root!r})[...]"
    return (f"{str(ref)!r} is a {arr.ndim}-D array of shape {arr.shape}: TiledArrays are "
            f"1-D or 2-D; read it into memory with {how}")


def check_output_complete(ref: ArrayRef, arr: zarr.Array) -> None:
    meta = info_attrs(arr)
    if not meta or meta.get("complete", True):
        return
    grid = grid_of(arr)
    done = len(done_units(ref))
    missing = grid.n_units - done
    writer = live_writer(ref)
    if writer is not None:  # not "stopped early": being written right now
        raise IncompleteOutputError(
            f"{str(ref)!r} is an incomplete tilearray output being written right now by "
            f"{describe_holder(writer)}: {missing} of {grid.n_units} I/O units still to "
            "write; open it once that job has finished")
    what, how = unfinished(meta, missing, grid.n_units)
    raise IncompleteOutputError(
        f"{str(ref)!r} is an incomplete tilearray output: {what}. {how}"
        ", or open it with allow_incomplete=True to inspect it."
    )


def resumable(meta: dict) -> bool:
    """Whether an output can be finished with ``resume=True``: only ``to_zarr``
    records the fingerprint of the expression it writes; arrays written by
    ``random``, ``from_numpy`` or ``from_dask`` have none."""
    return bool(meta and meta.get("fingerprint"))


def redo_hint(meta: dict) -> str:
    """How to finish an incomplete output (``meta``: its tilearray attributes):
    ``resume=True`` only when a resume would be accepted (written from an
    expression whose recorded inputs are unchanged), else ``overwrite=True``."""
    changed = changed_inputs(meta)
    if changed:
        more = f" (and {len(changed) - 1} more)" if len(changed) > 1 else ""
        return (f"Its input {changed[0]}{more} since the job started, so a resume would be "
                "refused: rerun the expression with overwrite=True to compute it again")
    if resumable(meta):
        return "Rerun the same expression with to_zarr(..., resume=True) to finish it"
    return ("It was not written from an expression (random, from_numpy or from_dask), so it "
            "cannot be resumed: rerun what wrote it with overwrite=True")


def unfinished(meta: dict, missing: int, n_units: int) -> tuple[str, str]:
    """(what is wrong, how to finish it) for an incomplete output no job is
    writing: ``missing`` of its ``n_units`` I/O units have no done marker."""
    if missing:
        what = (f"{missing} of {n_units} I/O units were never written (the job that wrote it "
                "stopped early)")
    else:
        why = ("its inputs changed" if changed_inputs(meta)
               else "it was killed or failed before its commit")
        what = (f"all {n_units} I/O units were written, but the job stopped before marking "
                f"it complete ({why})")
    how = redo_hint(meta)
    if not missing and how.startswith("Rerun the same expression"):
        how = ("Rerun the same expression with to_zarr(..., resume=True) to mark it complete "
               "(nothing is recomputed)")
    return what, how


INPUTS_KEY = "inputs"
"""The output attribute (under :data:`ATTR_KEY`) holding, while it is
incomplete, the state of each input when its job started:
``[[where, state], ...]``: a local input's path and ``[newest mtime ns,
bytes, files]``, an object store's location (``s3://...``) and ``[digest,
bytes, objects]`` (:func:`local_files_state`). A resume is refused when an
input changed (the fingerprint covers these states), so an unfinished
output whose inputs differ now says to rerun with ``overwrite=True``."""


def record_inputs(ref: ArrayRef, states: dict[str, tuple[str, tuple]]) -> None:
    """Record ``states`` (``{location: (local path or location, state)}``) in
    the incomplete output at ``ref`` (nothing when empty: no stored inputs)."""
    if not states:
        return
    arr = zarr.open_array(ref.store, path=ref.path or None, mode="r+")
    meta = info_attrs(arr)
    meta[INPUTS_KEY] = [[where, list(state)] for where, state in states.values()]
    arr.attrs[ATTR_KEY] = meta


def changed_inputs(meta: dict, refs: dict[str, ArrayRef] | None = None) -> list[str]:
    """What happened to each recorded input (:data:`INPUTS_KEY`) whose files
    or objects differ now from when the job started: ``"'path' was
    modified"`` or ``"... was deleted"``; [] when none did or none were
    recorded. An object store's input is looked at only through ``refs``
    (``{location: ref}``, the expression's inputs: their options reach the
    store); a local one by its path."""
    out = []
    recorded = meta.get(INPUTS_KEY) if meta else None
    for item in recorded if isinstance(recorded, list) else []:
        try:
            where, state = str(item[0]), list(item[1])
        except (TypeError, IndexError):
            continue
        if refs is not None and where in refs:
            now = local_files_state(refs[where])
        elif "://" not in where:
            now = files_state(where)
        else:
            continue
        if now is not None and list(now) != state:
            out.append(f"{where!r} " + ("was deleted" if now[-1] == 0 else "was modified"))
    return out


def _compressor(name: str | None, dtype: np.dtype, loc: str) -> list:
    if name == "default":
        name = _config.get("storage.compressor")
    if name is None or name == "none":
        return []
    if name == "lz4":
        return [BloscCodec(cname="lz4", clevel=5, shuffle=BloscShuffle.shuffle,
                           typesize=dtype.itemsize)]
    if name == "zstd":
        return [ZstdCodec(level=int(_config.get("storage.zstd-level")))]
    raise StorageArgumentError(f"{loc!r}: unknown compressor {name!r} (use 'lz4', 'zstd' or "
                               "None)")


def create(
    where: str | os.PathLike | Store,
    shape: tuple[int, int],
    dtype: Any,
    tile: tuple[int, int],
    *,
    shard: tuple[int, int] | None = None,
    path: str = "",
    compressor: str | None = "default",
    overwrite: bool = False,
    attributes: dict | None = None,
    output: bool = True,
    dims: tuple[str, str] | None = None,
) -> zarr.Array:
    """Create a 2-D Zarr v3 array laid out for tilearray.

    ``tile`` is the Zarr chunk (clipped to the shape when unsharded); ``shard``,
    if given, is the I/O unit and must be a multiple of the tile. Chunks are compressed with ``compressor``:
    ``"lz4"`` (blosc lz4 + byte shuffle), ``"zstd"`` (level
    ``tilearray.storage.zstd-level``) or None; ``"default"`` is
    ``tilearray.storage.compressor``. They always carry a crc32c checksum. With ``output=True``
    the array starts *incomplete* until :func:`mark_complete`. ``dims`` are
    the stored ``dimension_names`` (default ``("row", "col")``); a ``path``
    inside a store makes the array a member of the group there (parent
    groups are created, existing members are left alone).
    """
    ref = ArrayRef.from_location(where, path)
    loc = str(ref)
    check_parents(ref)
    vector = _is_vector_shape(shape)
    if vector:  # a 1-D array: planned as the column (n, 1)
        shape = (shape[0], 1)
        tile = (_first(tile), 1)
        shard = None if shard is None else (_first(shard), 1)
        dims = None if dims is None else ((dims,) if isinstance(dims, str) else tuple(dims))
    given, shape = shape, int_pair(shape)
    if shape is None or any(s < 0 for s in shape):
        raise StorageArgumentError(
            f"{loc!r}: shape must be 2 non-negative integers, got {given!r}")
    dt = check_dtype(dtype, loc, StorageArgumentError)
    tile = _clip_block(shape, tile, "tile", loc)
    if shard is None:  # a tile larger than the array is clipped to it, as dask's chunks
        tile = tuple(min(t, max(s, 1)) for t, s in zip(tile, shape, strict=True))
    else:
        given, shard = shard, int_pair(shard)
        if shard is None:
            raise StorageArgumentError(
                f"{loc!r}: shard must be 2 positive integers, got {given!r}")
        if any(s <= 0 or s % t for s, t in zip(shard, tile, strict=True)):
            raise StorageArgumentError(
                f"{loc!r}: shard {shard} must be a positive multiple of the tile {tile}"
            )
    compressors = [*_compressor(compressor, dt, loc), Crc32cCodec()]
    attrs = dict(attributes or {})
    if output:
        attrs[ATTR_KEY] = {"format": FORMAT_VERSION, "complete": False, **attrs.get(ATTR_KEY, {})}
    if output:  # out of its group's listing before its files are created or replaced
        prepare_member(ref, replacing=bool(overwrite))
    if overwrite:
        overwrite = clear_for_overwrite(ref)
    else:  # zarr refuses an existing format 3 node itself, but writes beside a format 2 one
        kind, fmt = node_at(ref.store, ref.path)
        if fmt == 2:
            raise StorageError(f"{loc!r} already exists (a Zarr format 2 {kind}); pass "
                               "overwrite=True to replace it")
    default_dims = ("row", "col")
    if vector:
        shape, tile, shard, default_dims = shape[:1], tile[:1], shard and shard[:1], ("row",)
    try:
        arr = zarr.create_array(
            ref.store,
            name=ref.path or None,
            shape=shape,
            dtype=dt,
            chunks=tile,
            shards=shard,
            compressors=compressors,
            fill_value=0,
            dimension_names=tuple(dims) if dims is not None else default_dims,
            attributes=attrs,
            zarr_format=3,
            overwrite=overwrite,
            config={"write_empty_chunks": True},  # every unit stored (format 2; 3: fill units)
        )
    except (FileExistsError, zarr.errors.ContainsArrayError, ContainsGroupError) as e:
        raise StorageError(
            f"{loc!r} already exists; pass overwrite=True to replace it ({e})"
        ) from None
    except (PermissionError, OSError, ValueError) as e:
        raise StorageError(f"cannot create {loc!r}: {type(e).__name__}: {e}") from None
    except Exception as e:  # an object store's client: no credentials, no endpoint
        if (err := store_refused("create", loc, e)) is None:
            raise
        raise err from None
    # an overwritten member leaves the group's listing until it is complete again
    refresh_consolidated(ref)
    return arr


def _is_vector_shape(shape) -> bool:
    try:
        return len(shape) == 1
    except TypeError:
        return False


def _first(block):
    """The first entry of a tile / shard given for a 1-D array (an int, or a
    tuple of one or two entries: ``(t,)`` or ``(t, 1)``)."""
    try:
        return block[0]
    except (TypeError, IndexError):
        return block


def clear_for_overwrite(ref: ArrayRef) -> bool:
    """Prepare replacing the array at ``ref``; returns the ``overwrite`` to pass
    to Zarr. Done markers go first. The output's lock is never inside what is
    deleted: on a local store it sits next to the array; on other stores an
    array at the root keeps its lock key inside, so the old keys are deleted
    here, all but the lock, and Zarr is told not to overwrite."""
    try:
        ref.delete_prefix(DONE_DIR)
    except Exception:  # nothing to delete
        pass
    if local_root(ref.store) is not None or ref.path:
        return True
    keep = output_lock_key("", False)
    for key in collect_aiterator(ref.store.list_prefix("")):
        if key != keep and not key.startswith(keep + "."):
            sync(ref.store.delete(key))
    return False


def _clip_block(shape, block, name: str, loc: str) -> tuple[int, int]:
    pair = int_pair(block)
    if pair is None or any(b <= 0 for b in pair):
        raise StorageArgumentError(
            f"{loc!r}: {name} must be 2 positive integers, got {block!r}")
    return pair


# -- completion bookkeeping -----------------------------------------------------------


def mark_unit_done(ref: ArrayRef, i: int, j: int) -> None:
    """Record that unit ``(i, j)`` was written whole (after its data)."""
    ref.set_key(unit_done_key(i, j), b"1")


def mark_unit_fill(ref: ArrayRef, i: int, j: int, chunk_key: str) -> None:
    """Record that unit ``(i, j)`` (stored at ``chunk_key``) holds the fill
    value and is not stored: a done marker and a chunk left there are
    deleted first (in that order: never a done marker without its chunk)."""
    ref.delete_key(unit_done_key(i, j))
    ref.delete_key(chunk_key)
    ref.set_key(unit_fill_key(i, j), b"1")


def done_units(ref: ArrayRef) -> set[tuple[int, int]]:
    """Units whose done or fill marker is present. Other names are ignored:
    a job killed while writing a marker leaves the store's temporary file
    (LocalStore writes ``<name>.<uuid>.partial`` and renames it)."""
    out = set()
    for name in ref.list_keys(DONE_DIR):
        name = name.removesuffix(".fill")
        i, dot, j = name.partition(".")
        if dot and i.isdigit() and j.isdigit():
            out.add((int(i), int(j)))
    return out


UNSEEN_WRITES = (" (if the tasks that wrote them succeeded, the workers do not see this "
                 "store as this process does: use a path on a filesystem they all share)")


def mark_complete(ref: ArrayRef, extra: dict | None = None) -> None:
    """Mark an output complete. Refuses unless every unit has its done marker."""
    arr = zarr.open_array(ref.store, path=ref.path or None, mode="r+")
    grid = grid_of(arr)
    done = done_units(ref)
    missing = grid.n_units - len(done)
    if missing:
        raise IncompleteOutputError(
            f"{str(ref)!r}: cannot mark complete, {missing} of {grid.n_units} units "
            f"have no done marker{UNSEEN_WRITES}"
        )
    meta = info_attrs(arr)
    meta.update(extra or {})
    meta.pop(INPUTS_KEY, None)  # only an unfinished output's advice needs them
    meta["complete"] = True
    arr.attrs[ATTR_KEY] = meta
    refresh_consolidated(ref)


def every_unit_stored(arr: zarr.Array) -> bool:
    """True for a complete tilearray output of format 2 or later: each of its
    I/O units was written (empty ones too; format 3: but those with a fill
    marker, never stored), so a missing chunk file of a unit with its done
    marker is lost data. Other arrays -- written by others, or
    by tilearray before format 2 -- may leave all-fill-value chunks unstored:
    a missing chunk reads as the fill value, as in Zarr. So do copies of an
    output made with zarr or xarray: they carry its attributes but neither its
    done markers nor (zarr skips them by default) its all-fill chunks."""
    meta = info_attrs(arr)
    fmt = meta.get("format")
    return meta.get("complete") is True and isinstance(fmt, int) and fmt >= 2


def is_complete(ref: ArrayRef) -> bool:
    return marked_complete(zarr.open_array(ref.store, path=ref.path or None, mode="r"))


def marked_complete(arr: zarr.Array) -> bool:
    """False for a tilearray output whose job has not finished (True for
    arrays written by others)."""
    return info_attrs(arr).get("complete", True)


def local_files_state(ref: ArrayRef) -> tuple[int, int, int] | None:
    """``(newest mtime ns, total bytes, file count)`` of a local array's files;
    on an object store ``(digest of keys, sizes and ETags, total bytes, object
    count)`` (:func:`.objects.objects_state`); None for other stores."""
    root = getattr(ref.store, "root", None)
    if root is None:
        from .objects import objects_state

        return objects_state(ref)
    return files_state(os.path.join(str(root), ref.path))


def files_state(path: str) -> tuple[int, int, int]:
    """``(newest mtime ns, total bytes, file count)`` of the files under ``path``."""
    newest = total = count = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            try:
                st = os.stat(os.path.join(dirpath, f))
            except OSError:
                continue
            newest, total, count = max(newest, st.st_mtime_ns), total + st.st_size, count + 1
    return newest, total, count


# -- group members: dimension names and consolidated metadata ----------------------------


