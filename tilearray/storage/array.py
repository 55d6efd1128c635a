"""Create, open and validate tiled matrices stored as Zarr arrays.

An :class:`ArrayRef` is the small, picklable handle that tasks carry (a Zarr
store plus the array's path inside it), never the data. Outputs written by
tilearray carry their bookkeeping under the ``tilearray`` attribute key and
per-unit done markers under ``<array>/tilearray.done/``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import zarr
from zarr.abc.store import Store
from zarr.codecs import BloscCodec, BloscShuffle, Crc32cCodec, ZstdCodec
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import collect_aiterator, sync
from zarr.errors import ArrayNotFoundError, ContainsGroupError, NodeTypeValidationError
from zarr.storage import LocalStore

from .. import _config
from ..errors import IncompleteOutputError, StorageError
from .geometry import Grid
from .locks import (  # noqa: F401  (the output lock, re-exported)
    acquire_lock,
    check_lock_held,
    check_unlocked,
    group_lock,
    local_root,
    lock_path,
    output_lock_key,
    release_lock,
)
from .stream import streams_rows

ATTR_KEY = "tilearray"
DONE_DIR = "tilearray.done"
FORMAT_VERSION = 2
"""Version 2: every I/O unit of a complete output is stored (empty chunks are
written too), so a missing chunk file is data loss, not the fill value."""
SUPPORTED_KINDS = "biuf"  # bool, signed/unsigned integers, floats


_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")


def _as_store(where: str | os.PathLike | Store) -> Store:
    """The store for a path, a URL (``file://`` as a local path; others through
    zarr's fsspec store) or a Store (as is)."""
    if isinstance(where, Store):
        return where
    try:
        text = os.fspath(where)
    except TypeError:
        raise TypeError(
            f"path={where!r} ({type(where).__name__}) is not a location: pass a path, a URL "
            "('file://...', 's3://...'), a zarr Store or a zarr.Array / zarr.Group"
        ) from None
    text = os.fsdecode(text)
    if _URL.match(text):
        return _url_store(text)
    # absolute: workers (and resume fingerprints) must not depend on a cwd
    return LocalStore(os.path.abspath(text))


def _url_store(url: str) -> Store:
    from urllib.parse import unquote, urlparse

    scheme = url.split("://", 1)[0].lower()
    if scheme == "file":
        parts = urlparse(url)
        if parts.netloc not in ("", "localhost"):
            raise StorageError(f"{url!r}: a file:// URL must name a local path "
                               f"(file:///abs/path), not host {parts.netloc!r}")
        return LocalStore(os.path.abspath(unquote(parts.path)))
    try:
        from zarr.storage import FsspecStore

        return FsspecStore.from_url(url, read_only=False)
    except ImportError as e:
        raise StorageError(
            f"cannot open {url!r}: {e}; install fsspec and the filesystem package for "
            f"{scheme}:// (e.g. s3fs for s3://), or pass a zarr Store"
        ) from None
    except (ValueError, TypeError, OSError) as e:
        raise StorageError(f"cannot open {url!r} through fsspec: {type(e).__name__}: {e}; "
                           "pass a zarr Store instead") from None


def describe(store: Store, path: str = "") -> str:
    """Human-readable location of an array: a file path for local stores, a URL
    for fsspec stores."""
    root = getattr(store, "root", None)
    if root is None and hasattr(store, "_store"):
        return describe(store._store, path)
    fs = getattr(store, "fs", None)
    if root is None and fs is not None and isinstance(getattr(store, "path", None), str):
        protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
        base = f"{protocol}://{store.path.lstrip('/')}"
    else:
        base = str(root) if root is not None else repr(store)
    return f"{base}/{path}" if path else base


_RESERVED_NAMES = frozenset({"zarr.json", ".zarray", ".zgroup", ".zattrs", ".zmetadata",
                             "tilearray.done", "tilearray.lock", "tilearray.consolidate.lock"})


def check_name(name: str | None) -> str:
    """Validate a member name (``name=``): "" for none, else a relative path of
    non-empty segments such as ``"x"`` or ``"sub/x"``.

    One spelling per member: every key tilearray writes (data, done markers,
    the lock) must land inside the store and next to the array, so absolute
    names, empty segments (``"x/"``, ``"a//b"``), ``"."`` / ``".."`` and Zarr's
    or tilearray's own key names are refused before anything is written.
    """
    if name is None:
        return ""
    if not isinstance(name, str):
        raise StorageError(f"member name must be a string, got {type(name).__name__} {name!r}")
    if name == "":
        return ""
    if name.startswith("/"):
        why = "it starts with '/' (a member name is relative to the group at the path)"
    elif any(seg == "" for seg in name.split("/")):
        why = "it has an empty segment (a trailing '/' or '//')"
    elif any(seg in (".", "..") for seg in name.split("/")):
        why = "'.' and '..' segments are not allowed"
    elif any(seg in _RESERVED_NAMES or seg.endswith(".tilearray.lock")
             or seg.endswith(".tilearray.lock.reclaim") for seg in name.split("/")):
        why = "it uses a name Zarr or tilearray keeps for its own keys"
    else:
        return name
    raise StorageError(
        f"bad member name {name!r}: {why}; use a relative path such as 'x' or 'sub/x'"
    )


@dataclass(frozen=True, eq=False)
class ArrayRef:
    """Picklable reference to a Zarr array: what tasks carry instead of data."""

    store: Store
    """The Zarr store holding the array."""
    path: str = ""
    """Path of the array inside the store ("" for the store root)."""

    @classmethod
    def from_location(cls, where: str | os.PathLike | Store, path: str = "") -> ArrayRef:
        """The array at ``where``, or member ``path`` of the group there.

        ``where`` is a path, a URL (``file://`` is a local path; ``s3://``
        and other schemes go through zarr's fsspec store when fsspec and the
        scheme's package are installed), a zarr Store, or an opened
        ``zarr.Array`` / ``zarr.Group`` (its store and path).

        Raises
        ------
        StorageError
            ``path`` is not a relative member name (see :func:`check_name`),
            or a URL cannot be opened.
        TypeError
            ``where`` is none of these.
        """
        if isinstance(where, zarr.Array | zarr.Group):
            inner = "/".join(p for p in (where.path.strip("/"), check_name(path)) if p)
            return cls(where.store, check_name(inner))
        return cls(_as_store(where), check_name(path))

    def __str__(self) -> str:
        return describe(self.store, self.path)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ArrayRef) and self.store == other.store and self.path == other.path

    def __hash__(self) -> int:
        return hash((type(self.store).__qualname__, str(self)))

    def __dask_tokenize__(self):
        return (type(self.store).__qualname__, str(self))

    def open(self, mode: str = "r") -> zarr.Array:
        """Open the array. Not cached: a task opens it once (one small metadata
        read), and a stale handle could outlive an overwritten array.

        Raises
        ------
        StorageError
            Nothing is there (any more): e.g. an input deleted while a job runs.
        """
        try:
            return zarr.open_array(self.store, path=self.path or None, mode=mode)
        except (ArrayNotFoundError, FileNotFoundError) as e:
            raise StorageError(f"no Zarr array at {str(self)!r} (deleted?): "
                               f"{type(e).__name__}: {e}") from None

    # -- raw keys next to the array (done markers) ---------------------------------
    def _key(self, *parts: str) -> str:
        return "/".join(p for p in (self.path, *parts) if p)

    def set_key(self, key: str, value: bytes) -> None:
        buf = default_buffer_prototype().buffer.from_bytes(value)
        sync(self.store.set(self._key(key), buf))

    def get_key(self, key: str) -> bytes | None:
        buf = sync(self.store.get(self._key(key), default_buffer_prototype()))
        return None if buf is None else buf.to_bytes()

    def delete_key(self, key: str) -> None:
        sync(self.store.delete(self._key(key)))

    def has_key(self, key: str) -> bool:
        return sync(self.store.exists(self._key(key)))

    def list_keys(self, prefix: str) -> list[str]:
        full = self._key(prefix) + "/"
        keys = collect_aiterator(self.store.list_prefix(full))
        return [k[len(full):] for k in keys]

    def delete_prefix(self, prefix: str) -> None:
        sync(self.store.delete_dir(self._key(prefix)))


def grid_of(arr: zarr.Array) -> Grid:
    """The tile / I/O-unit grid of an opened 2-D Zarr array (v2 or v3)."""
    shards = arr.shards
    return Grid.regular(arr.shape, arr.chunks, shards, streams_rows(arr))


def check_dtype(dtype: Any, where: str) -> np.dtype:
    try:
        dt = np.dtype(dtype)
    except TypeError as e:
        raise StorageError(f"{where}: unsupported dtype {dtype!r}: {e}") from None
    if dt.kind not in SUPPORTED_KINDS:
        raise StorageError(
            f"{where}: unsupported dtype {dt} (tilearray handles bool, integer and "
            "floating-point matrices)"
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
        raise StorageError(f"no Zarr array at {loc!r}: the path does not exist")
    try:
        arr = zarr.open_array(ref.store, path=ref.path or None, mode=mode)
    except (ArrayNotFoundError, FileNotFoundError, KeyError) as e:
        raise StorageError(f"no Zarr array at {loc!r}: {e}") from None
    except (ContainsGroupError, NodeTypeValidationError) as e:
        raise StorageError(
            f"{loc!r} is a Zarr group, not an array; pass the array's path inside it"
        ) from e
    if arr.ndim != 2:
        raise StorageError(not_a_matrix_message(ref, arr))
    check_dtype(arr.dtype, loc)
    if check_complete:
        check_output_complete(ref, arr)
    return arr


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
    return (f"{str(ref)!r} is a {arr.ndim}-D array of shape {arr.shape}, not a 2-D matrix: "
            f"TiledArrays are 2-D; read it into memory with {how}")


def info_attrs(arr: zarr.Array) -> dict:
    """The tilearray attributes of an array ({} for arrays we did not write)."""
    value = arr.attrs.get(ATTR_KEY)
    return dict(value) if isinstance(value, dict) else {}


def check_output_complete(ref: ArrayRef, arr: zarr.Array) -> None:
    meta = info_attrs(arr)
    if not meta or meta.get("complete", True):
        return
    grid = grid_of(arr)
    done = len(done_units(ref))
    missing = grid.n_units - done
    raise IncompleteOutputError(
        f"{str(ref)!r} is an incomplete tilearray output: {missing} of {grid.n_units} "
        "I/O units were never written (the job that wrote it stopped early). Rerun the "
        "same expression with to_zarr(..., resume=True) to finish it, or open it with "
        "allow_incomplete=True to inspect it."
    )


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
    raise StorageError(f"{loc!r}: unknown compressor {name!r} (use 'lz4', 'zstd' or None)")


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

    ``tile`` is the Zarr chunk; ``shard``, if given, is the I/O unit and must
    be a multiple of the tile. Chunks are compressed with ``compressor``:
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
    shape = tuple(int(s) for s in shape)
    if len(shape) != 2 or any(s < 0 for s in shape):
        raise StorageError(f"{loc!r}: shape must be 2 non-negative integers, got {shape}")
    dt = check_dtype(dtype, loc)
    tile = _clip_block(shape, tile, "tile", loc)
    if shard is not None:
        shard = tuple(int(s) for s in shard)
        if len(shard) != 2 or any(s <= 0 or s % t for s, t in zip(shard, tile, strict=True)):
            raise StorageError(
                f"{loc!r}: shard {shard} must be a positive multiple of the tile {tile}"
            )
    compressors = [*_compressor(compressor, dt, loc), Crc32cCodec()]
    attrs = dict(attributes or {})
    if output:
        attrs[ATTR_KEY] = {"format": FORMAT_VERSION, "complete": False, **attrs.get(ATTR_KEY, {})}
    if overwrite:
        overwrite = clear_for_overwrite(ref)
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
            dimension_names=tuple(dims) if dims is not None else ("row", "col"),
            attributes=attrs,
            zarr_format=3,
            overwrite=overwrite,
            config={"write_empty_chunks": True},  # every unit stored (FORMAT_VERSION 2)
        )
    except (FileExistsError, zarr.errors.ContainsArrayError, ContainsGroupError) as e:
        raise StorageError(
            f"{loc!r} already exists; pass overwrite=True to replace it ({e})"
        ) from None
    except (PermissionError, OSError, ValueError) as e:
        raise StorageError(f"cannot create {loc!r}: {type(e).__name__}: {e}") from None
    # an overwritten member leaves the group's listing until it is complete again
    refresh_consolidated(ref)
    return arr


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
    block = tuple(int(b) for b in block)
    if len(block) != 2 or any(b <= 0 for b in block):
        raise StorageError(f"{loc!r}: {name} must be 2 positive integers, got {block}")
    return block


# -- completion bookkeeping -----------------------------------------------------------


def unit_done_key(i: int, j: int) -> str:
    return f"{DONE_DIR}/{i}.{j}"


def mark_unit_done(ref: ArrayRef, i: int, j: int) -> None:
    """Record that unit ``(i, j)`` was written whole (after its data)."""
    ref.set_key(unit_done_key(i, j), b"1")


def done_units(ref: ArrayRef) -> set[tuple[int, int]]:
    """Units whose done marker is present. Other names are ignored: a job
    killed while writing a marker leaves the store's temporary file
    (LocalStore writes ``<name>.<uuid>.partial`` and renames it)."""
    out = set()
    for name in ref.list_keys(DONE_DIR):
        i, dot, j = name.partition(".")
        if dot and i.isdigit() and j.isdigit():
            out.add((int(i), int(j)))
    return out


def mark_complete(ref: ArrayRef, extra: dict | None = None) -> None:
    """Mark an output complete. Refuses unless every unit has its done marker."""
    arr = zarr.open_array(ref.store, path=ref.path or None, mode="r+")
    grid = grid_of(arr)
    done = done_units(ref)
    missing = grid.n_units - len(done)
    if missing:
        raise IncompleteOutputError(
            f"{str(ref)!r}: cannot mark complete, {missing} of {grid.n_units} units "
            "have no done marker"
        )
    meta = info_attrs(arr)
    meta.update(extra or {})
    meta["complete"] = True
    arr.attrs[ATTR_KEY] = meta
    refresh_consolidated(ref)


def every_unit_stored(arr: zarr.Array) -> bool:
    """True for a complete tilearray output of format 2 or later: each of its
    I/O units was written (empty ones too), so a missing chunk file is lost
    data. Other arrays -- written by others, or by tilearray before format 2
    -- may leave all-fill-value chunks unstored: a missing chunk reads as the
    fill value, as in Zarr."""
    meta = info_attrs(arr)
    fmt = meta.get("format")
    return meta.get("complete") is True and isinstance(fmt, int) and fmt >= 2


def is_complete(ref: ArrayRef) -> bool:
    arr = zarr.open_array(ref.store, path=ref.path or None, mode="r")
    return info_attrs(arr).get("complete", True)


def local_files_state(ref: ArrayRef) -> tuple[int, int, int] | None:
    """``(newest mtime ns, total bytes, file count)`` of a local array's files
    (None for stores that are not directories)."""
    root = getattr(ref.store, "root", None)
    if root is None:
        return None
    newest = total = count = 0
    for dirpath, _, files in os.walk(os.path.join(str(root), ref.path)):
        for f in files:
            try:
                st = os.stat(os.path.join(dirpath, f))
            except OSError:
                continue
            newest, total, count = max(newest, st.st_mtime_ns), total + st.st_size, count + 1
    return newest, total, count


# -- group members: dimension names and consolidated metadata ----------------------------


def dims_of(arr: zarr.Array) -> tuple[str, ...] | None:
    """Dimension names of an opened array: Zarr v3 ``dimension_names``, or the
    ``_ARRAY_DIMENSIONS`` attribute xarray writes on v2 arrays; None if unnamed."""
    names = getattr(arr.metadata, "dimension_names", None)
    if names is None:
        names = arr.attrs.get("_ARRAY_DIMENSIONS")
    if not names or any(not isinstance(n, str) for n in names) or len(names) != arr.ndim:
        return None
    return tuple(names)


def _parents(path: str) -> list[str]:
    """Group paths above an array path, nearest first ("a/b/c" -> ["a/b", "a", ""])."""
    parts = [p for p in path.split("/") if p]
    return ["/".join(parts[:i]) for i in range(len(parts) - 1, -1, -1)]


def sibling_dims(ref: ArrayRef) -> dict[str, tuple[int, str]]:
    """``{dimension name: (size, member)}`` over the other arrays of the group
    holding ``ref`` ({} for an array at a store's root). xarray needs one size
    per dimension name across a group's variables."""
    if not ref.path.strip("/"):
        return {}
    import warnings

    parent = _parents(ref.path)[0]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "<member>.tilearray.lock is not recognized"
            group = zarr.open_group(ref.store, path=parent or None, mode="r",
                                    use_consolidated=False)
            members = list(group.arrays())
    except Exception:  # no group yet
        return {}
    mine = ref.path.strip("/").rsplit("/", 1)[-1]
    out: dict[str, tuple[int, str]] = {}
    for name, arr in members:
        names = dims_of(arr)
        if name == mine or names is None:
            continue
        for d, size in zip(names, arr.shape, strict=True):
            out.setdefault(d, (int(size), name))
    return out


def choose_dims(ref: ArrayRef, shape: tuple, dims=None, derived=None,
                labels: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """Dimension names for a new array at ``ref`` that xarray can open with the
    rest of its group.

    ``dims`` given: used as is, checked. Otherwise ``derived`` (the names the
    expression carries from its inputs, e.g. ``a @ b`` -> (a's rows, b's
    columns)) when they are distinct and agree in size with the group's
    other members; else, for a group member ``C``, ``("C_row", "C_col")``
    (``labels`` name the axes: ``("col",)`` for column statistics); for an
    array at a store's root, the labels themselves.

    Raises
    ------
    StorageError
        ``dims`` has the wrong length or repeats a name, or a name is used by
        another member of the group with a different size.
    """
    shape = tuple(int(n) for n in shape)
    if labels is None or len(labels) != len(shape) or len(set(labels)) != len(labels):
        labels = ("row", "col")[: len(shape)]  # e.g. a.T @ a: (col, col) -> (row, col)
    labels = tuple(labels)
    siblings = sibling_dims(ref)

    def conflict(names):
        for n, size in zip(names, shape, strict=True):
            if n in siblings and siblings[n][0] != size:
                return n, size, *siblings[n]
        return None

    if dims is not None:
        dims = (dims,) if isinstance(dims, str) else tuple(dims)
        if len(dims) != len(shape) or len(set(dims)) != len(dims) \
                or not all(isinstance(d, str) and d for d in dims):
            raise StorageError(
                f"{str(ref)!r}: dims {dims!r} must be {len(shape)} distinct names for shape {shape}"
            )
        bad = conflict(dims)
        if bad:
            raise StorageError(
                f"{str(ref)!r}: dimension {bad[0]!r} would have size {bad[1]}, but member "
                f"{bad[3]!r} of the same group uses it with size {bad[2]}; xarray needs one "
                "size per dimension name; pass other dims="
            )
        return dims
    if derived is not None and len(derived) == len(shape) and len(set(derived)) == len(derived) \
            and not conflict(derived):
        return tuple(derived)
    name = ref.path.strip("/").rsplit("/", 1)[-1]
    fallback = tuple(f"{name}_{lab}" for lab in labels) if name else labels
    bad = conflict(fallback)
    if bad:
        raise StorageError(
            f"{str(ref)!r}: default dimension {bad[0]!r} (size {bad[1]}) is used by member "
            f"{bad[3]!r} of the same group with size {bad[2]}; pass dims=(...) with other names"
        )
    return fallback


def _node_at(store: Store, path: str) -> tuple[str | None, int | None]:
    """``(node type, Zarr format)`` of what is stored at ``path``: ("group", 2),
    ("array", 3), ...; (None, None) when nothing is there. A format-2 group key
    wins over a format-3 one: such a group still has format-2 readers."""
    import json

    def key(name):
        return f"{path}/{name}" if path else name

    def get(name):
        buf = sync(store.get(key(name), default_buffer_prototype()))
        return None if buf is None else buf.to_bytes()

    if get(".zgroup") is not None:
        return "group", 2
    if get(".zarray") is not None:
        return "array", 2
    raw = get("zarr.json")
    if raw is None:
        return None, None
    try:
        node_type = json.loads(raw).get("node_type")
    except (ValueError, AttributeError):
        node_type = None
    return (node_type if isinstance(node_type, str) else "unknown"), 3


def check_parents(ref: ArrayRef) -> None:
    """Refuse, before anything is written, to put a member (``name=``) where it
    would damage what holds it: inside an array, or inside a Zarr format 2
    group (tilearray writes format 3 arrays; a format-3 ``zarr.json`` next to
    the group's ``.zgroup`` hides its format-2 members and attributes).

    Raises
    ------
    StorageError
        Naming the parent's path and what it is.
    """
    if not ref.path:
        return
    for parent in reversed(_parents(ref.path)):  # outermost first
        try:
            kind, fmt = _node_at(ref.store, parent)
        except Exception:  # an unreadable parent: let the write itself report it
            return
        where = describe(ref.store, parent)
        if kind == "array":
            raise StorageError(
                f"cannot create {str(ref)!r}: {where!r} is a Zarr array, not a group; only a "
                "group can hold members (name=) — choose another path"
            )
        if kind == "group" and fmt == 2:
            raise StorageError(
                f"cannot write {str(ref)!r}: {where!r} is a Zarr format 2 group, and tilearray "
                "writes Zarr format 3 arrays (adding one would hide the group's format 2 "
                "members and attributes from zarr and xarray); write to a new path or to a "
                "Zarr format 3 group, e.g. zarr.open_group(path, zarr_format=3)"
            )


def _incomplete(meta) -> bool:
    """True for the stored metadata (a dict) of a tilearray output not yet complete."""
    attrs = meta.get("attributes") if isinstance(meta, dict) else None
    own = attrs.get(ATTR_KEY) if isinstance(attrs, dict) else None
    return isinstance(own, dict) and own.get("complete") is False


def _drop_incomplete(consolidated) -> bool:
    """Remove incomplete tilearray outputs from a consolidated-metadata dict
    (and the nested ones of its groups); True if anything was removed."""
    members = consolidated.get("metadata") if isinstance(consolidated, dict) else None
    if not isinstance(members, dict):
        return False
    drop = [k for k, v in members.items() if _incomplete(v)]
    for k in drop:
        del members[k]
    changed = bool(drop)
    for v in members.values():
        if isinstance(v, dict):
            changed |= _drop_incomplete(v.get("consolidated_metadata"))
    return changed


def refresh_consolidated(ref: ArrayRef) -> None:
    """Re-consolidate the metadata of every group above a group member, so that
    ``xarray.open_zarr(group)`` lists it without a fallback warning (and an
    existing consolidated group, as xarray writes, does not hide it).

    Outputs that are not complete (being written, or left by a failed job) are
    left out of the listing: xarray would read their unwritten units as fill
    values. Writers call this when an output is created (so an overwritten
    member drops out) and again once it is complete.

    Serialised under the store's group lock (:func:`.locks.group_lock`): a
    refresh reads every member and then rewrites the listing, so two writers
    of different members refreshing at once would otherwise drop one."""
    parents = _parents(ref.path) if ref.path.strip("/") else []
    if not parents:
        return
    with group_lock(ref.store) as held:
        if held:  # else the lock cannot even be created (a read-only store): no refresh
            _refresh(ref, parents)


def _refresh(ref: ArrayRef, parents: list[str]) -> None:
    """Rewrite each parent group's listing in one write of its ``zarr.json``.

    The listing is built from a copy of the metadata documents of the
    complete members only, consolidated in memory: writing zarr's full
    listing first and filtering it after would, if the job were killed
    between the two writes, leave an incomplete member listed."""
    import json
    import warnings

    for parent in parents:
        key = f"{parent}/zarr.json" if parent else "zarr.json"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "not part of the Zarr v3 specification"
            try:
                mirror = zarr.storage.MemoryStore()
                _copy_complete_metadata(ref.store, parent, mirror)
                zarr.consolidate_metadata(mirror)
                buf = sync(mirror.get("zarr.json", default_buffer_prototype()))
                doc = json.loads(buf.to_bytes())
                _drop_incomplete(doc.get("consolidated_metadata"))  # nested groups too
                out = default_buffer_prototype().buffer.from_bytes(
                    json.dumps(doc, indent=2).encode())
                sync(ref.store.set(key, out))
            except Exception:  # best effort: a read-only parent, a v2 group, ...
                pass


def _copy_complete_metadata(store, parent: str, mirror) -> None:
    """Copy ``zarr.json`` of the group at ``parent`` and of every member below
    it that is not an incomplete tilearray output into ``mirror`` (paths
    relative to the group). Arrays are not descended into (chunks are not
    listed)."""
    import json

    proto = default_buffer_prototype()
    base = f"{parent}/" if parent else ""

    def copy(rel: str) -> None:
        buf = sync(store.get(f"{base}{rel}zarr.json", proto))
        if buf is None:
            return
        doc = json.loads(buf.to_bytes())
        if rel and _incomplete(doc):
            return
        if doc.get("node_type") == "group":
            doc.pop("consolidated_metadata", None)
        sync(mirror.set(f"{rel}zarr.json", proto.buffer.from_bytes(json.dumps(doc).encode())))
        if doc.get("node_type") == "group":
            for child in collect_aiterator(store.list_dir(f"{base}{rel}".rstrip("/"))):
                if child != "zarr.json":
                    copy(f"{rel}{child}/")

    copy("")

