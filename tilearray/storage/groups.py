"""Arrays inside Zarr groups: dimension names chosen to agree with the
group's other members, parents checked (never inside an array or a Zarr
format 2 group), and the group's consolidated listing kept to complete
members, refreshed under the store's group lock."""

from __future__ import annotations

import json
import os

import zarr
from zarr.abc.store import Store
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import collect_aiterator, sync

from ..errors import StorageArgumentError, StorageError
from .locks import group_lock, local_root
from .ref import ATTR_KEY, ArrayRef, describe, not_a_directory, refusal_of_non_directory


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
    columns); None for an axis with none carried, which takes its default
    name) when they are distinct and agree in size with the group's
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
            raise StorageArgumentError(
                f"{str(ref)!r}: dims {dims!r} must be {len(shape)} distinct names for shape {shape}"
            )
        bad = conflict(dims)
        if bad:
            raise StorageArgumentError(
                f"{str(ref)!r}: dimension {bad[0]!r} would have size {bad[1]}, but member "
                f"{bad[3]!r} of the same group uses it with size {bad[2]}; xarray needs one "
                "size per dimension name; pass other dims="
            )
        return dims
    name = ref.path.strip("/").rsplit("/", 1)[-1]
    fallback = tuple(f"{name}_{lab}" for lab in labels) if name else labels
    if derived is not None and len(derived) == len(shape):
        # an axis with no name carried (X[:, :3]'s columns) takes its default one
        derived = tuple(fallback[i] if d is None else d for i, d in enumerate(derived))
        if len(set(derived)) == len(derived) and not conflict(derived):
            return derived
    bad = conflict(fallback)
    if bad:
        raise StorageError(
            f"{str(ref)!r}: default dimension {bad[0]!r} (size {bad[1]}) is used by member "
            f"{bad[3]!r} of the same group with size {bad[2]}; pass dims=(...) with other names"
        )
    return fallback


def node_at(store: Store, path: str) -> tuple[str | None, int | None]:
    """``(node type, Zarr format)`` of what is stored at ``path``: ("group", 2),
    ("array", 3), ...; (None, None) when nothing is there. A format-2 group key
    wins over a format-3 one: such a group still has format-2 readers."""

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


def _check_enclosing_directories(ref: ArrayRef) -> None:
    """Refuse a local store whose directory lies inside a Zarr array's
    directory (``a.zarr/x`` or ``a.zarr/c/0/x``): the array's readers ignore
    it, but replacing that array (``overwrite``) deletes it with the array's
    own files, and it changes the array's recorded file state."""

    root = local_root(ref.store)
    if root is None:
        return
    found = not_a_directory(root)
    if found is not None:
        wanted = "a Zarr array" if not ref.path else "a Zarr group (to hold member " \
            f"{ref.path!r})"
        raise refusal_of_non_directory(str(root), found, wanted)
    here = os.path.dirname(os.path.abspath(root))
    while True:
        kind = None
        if os.path.isfile(os.path.join(here, ".zarray")):
            kind = "array"
        elif os.path.isfile(os.path.join(here, "zarr.json")):
            try:
                with open(os.path.join(here, "zarr.json"), "rb") as f:
                    kind = json.loads(f.read()).get("node_type")
            except (OSError, ValueError, AttributeError):
                kind = None
        if kind == "array":
            raise StorageError(
                f"cannot write {str(ref)!r}: it lies inside the Zarr array {here!r} (replacing "
                "that array would delete it, and its readers ignore it) — choose a path "
                "outside it")
        parent = os.path.dirname(here)
        if parent == here:
            return
        here = parent


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
    _check_enclosing_directories(ref)
    if not ref.path:
        return
    for parent in reversed(_parents(ref.path)):  # outermost first
        try:
            kind, fmt = node_at(ref.store, parent)
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


def prepare_member(ref: ArrayRef, replacing: bool = True) -> None:
    """Before a group member is created or replaced: its parent groups exist
    and carry a consolidated listing that leaves it out (with ``replacing``
    False, an existing member is kept listed: its create will be refused).

    Else, between Zarr's create (which writes a new parent group's
    ``zarr.json`` without a listing) and the refresh after it, xarray falls
    back to listing every member -- the one just created, incomplete,
    included -- and an old complete member being replaced stays listed while
    its files are deleted and rewritten (readers got zeros and new tiles as
    its data)."""
    parents = _parents(ref.path) if ref.path.strip("/") else []
    if not parents:
        return
    with group_lock(ref.store) as held:
        if not held:  # a read-only store: the create itself will say so
            return
        for parent in reversed(parents):  # outermost first
            try:
                if node_at(ref.store, parent)[0] is None:
                    zarr.open_group(ref.store, path=parent or None, mode="a", zarr_format=3)
            except Exception:  # not creatable here: the create itself reports it
                return
        _refresh(ref, parents, leave_out=ref.path.strip("/") if replacing else None)


def _refresh(ref: ArrayRef, parents: list[str], leave_out: str | None = None) -> None:
    """Rewrite each parent group's listing in one write of its ``zarr.json``.

    The listing is built from a copy of the metadata documents of the
    complete members only, consolidated in memory: writing zarr's full
    listing first and filtering it after would, if the job were killed
    between the two writes, leave an incomplete member listed."""
    import warnings

    for parent in parents:
        key = f"{parent}/zarr.json" if parent else "zarr.json"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "not part of the Zarr v3 specification"
            try:
                mirror = zarr.storage.MemoryStore()
                _copy_complete_metadata(ref.store, parent, mirror, leave_out)
                zarr.consolidate_metadata(mirror)
                buf = sync(mirror.get("zarr.json", default_buffer_prototype()))
                doc = json.loads(buf.to_bytes())
                _drop_incomplete(doc.get("consolidated_metadata"))  # nested groups too
                out = default_buffer_prototype().buffer.from_bytes(
                    json.dumps(doc, indent=2).encode())
                sync(ref.store.set(key, out))
            except Exception:  # best effort: a read-only parent, a v2 group, ...
                pass


def _copy_complete_metadata(store, parent: str, mirror, leave_out: str | None = None) -> None:
    """Copy ``zarr.json`` of the group at ``parent`` and of every member below
    it that is not an incomplete tilearray output (nor ``leave_out``, a member
    about to be replaced) into ``mirror`` (paths relative to the group).
    Arrays are not descended into (chunks are not listed)."""

    proto = default_buffer_prototype()
    base = f"{parent}/" if parent else ""

    def copy(rel: str) -> None:
        if rel and f"{base}{rel}".rstrip("/") == leave_out:
            return
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
