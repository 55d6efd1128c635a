"""The array handle: :class:`ArrayRef`, the small picklable (store, path)
pair that tasks carry, never the data; locations (paths, URLs, Stores) and
member names; the attribute key of tilearray's bookkeeping."""

from __future__ import annotations

import atexit
import os
import re
import weakref
from dataclasses import dataclass

import zarr
from zarr.abc.store import Store
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import collect_aiterator, sync
from zarr.errors import ArrayNotFoundError
from zarr.storage import LocalStore

from ..errors import StorageArgumentError, StorageArgumentTypeError, StorageError

ATTR_KEY = "tilearray"


DONE_DIR = "tilearray.done"


def unit_done_key(i: int, j: int) -> str:
    """Key of I/O unit ``(i, j)``'s done marker, relative to its array."""
    return f"{DONE_DIR}/{i}.{j}"


def unit_fill_key(i: int, j: int) -> str:
    """Key of I/O unit ``(i, j)``'s fill marker: done, deliberately not stored,
    it reads as the fill value (0), as Zarr reads a chunk it never stored.
    Not a done-marker name, so readers before format 3 take the unit as
    Zarr would (the fill value), not as lost data."""
    return f"{DONE_DIR}/{i}.{j}.fill"


FORMAT_VERSION = 3
"""Version 2: every I/O unit of a complete output is stored (empty chunks are
written too), so a missing chunk file is data loss, not the fill value.
Version 3: except the units with a fill marker (:func:`unit_fill_key`; the
zero tiles above a Cholesky factor's diagonal: at 32768² their 3.5 GiB of
writes took 14 s of worker time, blocked on the disk)."""


_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")

_FS_PACKAGES = {"s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs",
                "abfs": "adlfs", "abfss": "adlfs", "http": "aiohttp", "https": "aiohttp"}
"""The package fsspec needs for a URL scheme (named when it is missing)."""


def is_url(text) -> bool:
    """Whether ``text`` is a URL (``scheme://...``), not a local path."""
    return isinstance(text, str) and bool(_URL.match(text))


def is_local_url(text: str) -> bool:
    return is_url(text) and text.split("://", 1)[0].lower() == "file"


def _as_store(where: str | os.PathLike | Store, storage_options: dict | None = None) -> Store:
    """The store for a path, a URL (``file://`` as a local path; others through
    zarr's fsspec store, with ``storage_options``) or a Store (as is)."""
    if isinstance(where, Store):
        _no_options(storage_options, "a zarr Store (configure the store itself)")
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
        return _url_store(text, storage_options)
    _no_options(storage_options, f"the local path {text!r}")
    # absolute: workers (and resume fingerprints) must not depend on a cwd; ~ is home
    return LocalStore(os.path.abspath(os.path.expanduser(text)))


def _no_options(storage_options: dict | None, what: str) -> None:
    if storage_options:
        raise StorageError(f"storage_options={storage_options!r} apply to URLs of object "
                           f"stores ('s3://...'), not to {what}")


def fsspec_options(scheme: str, storage_options: dict | None) -> dict:
    """The fsspec options used for a URL: the caller's, plus for S3 no
    listings cache (keys written by worker processes -- done markers, units --
    must be seen by the next listing; s3fs caches listings by default)."""
    opts = dict(storage_options or {})
    if scheme in ("s3", "s3a"):
        opts.setdefault("use_listings_cache", False)
    return opts


def _url_store(url: str, storage_options: dict | None = None) -> Store:
    """A store for ``url``: ``file://`` is a local directory; any other scheme
    goes through zarr's ``FsspecStore`` (s3fs for ``s3://``), which reads the
    usual environment (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
    ``AWS_ENDPOINT_URL``, ``AWS_PROFILE``, ...) unless ``storage_options``
    say otherwise (e.g. ``{"endpoint_url": "http://127.0.0.1:9000", "key":
    ..., "secret": ...}``). The options travel with the store when tasks are
    pickled to workers."""
    from urllib.parse import unquote, urlparse

    scheme = url.split("://", 1)[0].lower()
    if scheme == "file":
        parts = urlparse(url)
        if parts.netloc not in ("", "localhost"):
            raise StorageError(f"{url!r}: a file:// URL must name a local path "
                               f"(file:///abs/path), not host {parts.netloc!r}")
        _no_options(storage_options, f"the file:// URL {url!r}")
        return LocalStore(os.path.abspath(unquote(parts.path)))
    if storage_options is not None and not isinstance(storage_options, dict):
        raise TypeError(f"storage_options must be a dict, got {type(storage_options).__name__}")
    package = _FS_PACKAGES.get(scheme)
    try:
        from zarr.storage import FsspecStore

        store = FsspecStore.from_url(url, storage_options=fsspec_options(scheme, storage_options),
                                     read_only=False)
        _closing_at_exit(store.fs)
        return store
    except ImportError as e:
        how = (f"the {package} package is missing: pip install {package} (or tilearray[s3])"
               if package else f"fsspec cannot load the {scheme}:// filesystem")
        raise StorageError(f"cannot open {url!r}: {how} ({e}); or pass a zarr Store") from None
    except (ValueError, TypeError, OSError) as e:
        raise StorageError(f"cannot open {url!r} through fsspec: {type(e).__name__}: {e}; "
                           "check the URL and storage_options, or pass a zarr Store") from None


_OPEN_FS: weakref.WeakSet = weakref.WeakSet()


def _stop_zarr_loop() -> None:
    """Stop zarr's I/O event loop at exit, waiting up to 10 s for its thread.
    zarr's own exit hook waits 0.2 s, then closes the loop anyway: on a
    loaded machine (4 MPI ranks on 2 cores) the thread was still running and
    the exit printed "Cannot close a running event loop" with a traceback.
    Registered at import, after zarr's hook, so it runs before it."""
    from zarr.core import sync as zarr_sync

    loop = getattr(zarr_sync, "loop", [None])[0]
    thread = getattr(zarr_sync, "iothread", [None])[0]
    if loop is None or thread is None or not thread.is_alive():
        return
    try:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
    except RuntimeError:  # the loop is already closed: nothing to wait for
        pass


atexit.register(_stop_zarr_loop)


def _closing_at_exit(fs) -> None:
    """Close ``fs``'s HTTP session when the process exits. s3fs closes it by
    a finalizer only for its synchronous instances; zarr's are asynchronous,
    and aiohttp then prints "Unclosed client session" at exit."""
    if not _OPEN_FS:
        atexit.register(_close_sessions)  # after zarr's: runs first, its loop still up
    _OPEN_FS.add(fs)


def _close_sessions() -> None:
    for fs in list(_OPEN_FS):
        client = getattr(fs, "_s3creator", None)
        if client is None:
            continue
        try:
            sync(client.__aexit__(None, None, None), timeout=2)
        except Exception:  # exiting anyway
            pass


def not_a_directory(path: str) -> str | None:
    """What stands at a local ``path`` that a Zarr array or group cannot be
    written into -- "a regular file", "a symbolic link to a missing target
    ('...')", ... -- or None (nothing there, or a directory)."""
    if os.path.islink(path) and not os.path.exists(path):
        return f"a symbolic link to a missing target ({os.readlink(path)!r})"
    if not os.path.lexists(path) or os.path.isdir(path):
        return None
    what = "a regular file" if os.path.isfile(path) else \
        "a special file (a socket, FIFO or device)"
    if os.path.islink(path):
        return f"a symbolic link to {what} ({os.path.realpath(path)!r})"
    return what


def refusal_of_non_directory(location: str, what: str, wanted: str) -> StorageError:
    """The refusal to write ``wanted`` (e.g. "a Zarr array") at ``location``
    where :func:`not_a_directory` found ``what``."""
    if what.startswith("a symbolic link"):
        return StorageError(
            f"{location!r} is {what}, not {wanted}; tilearray does not replace a link (also "
            "with overwrite=True) — write to its target's path itself, or remove the link")
    return StorageError(
        f"{location!r} is {what}, not {wanted}; refusing to replace it (also with "
        "overwrite=True) — choose another path or remove it first")


def process_local(store: Store) -> bool:
    """Whether ``store`` (or the store it wraps) keeps its data in this
    process's memory (a zarr ``MemoryStore``, or fsspec's ``memory://``):
    tasks that run in dask workers get a copy of it, or an empty one, so
    what they write never reaches this process."""
    seen = 0
    while store is not None and seen < 8:
        if isinstance(store, zarr.storage.MemoryStore) or memory_filesystem(store):
            return True
        store, seen = getattr(store, "_store", None), seen + 1
    return False


def fs_protocols(store: Store) -> tuple[str, ...]:
    """The fsspec protocols of ``store``'s filesystem (``("file", "local")``,
    ``("memory",)``, ``("s3", "s3a")``); empty for a store without one."""
    fs = getattr(store, "fs", None)
    fs = getattr(fs, "sync_fs", fs)  # zarr wraps synchronous filesystems
    protocol = getattr(fs, "protocol", ())
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)


def memory_filesystem(store: Store) -> bool:
    """Whether ``store`` is an fsspec store on ``memory://``: a filesystem of
    this process alone (another process, a dask worker, finds it empty)."""
    return "memory" in fs_protocols(store)


def check_task_writable(ref: ArrayRef) -> None:
    """Refuse, before any work, an output that tasks on a dask cluster cannot
    write: one in a process-local ``MemoryStore`` or ``memory://``."""
    if process_local(ref.store):
        raise StorageError(
            f"cannot write {str(ref)!r}: a zarr MemoryStore (or memory:// URL) lives in this "
            "process only, and the tasks that write the output run in dask workers, each on "
            "its own copy (the result would be lost); write to a path, a file:// URL or "
            "another shared store (keep in-memory data with ta.from_numpy, which writes "
            "from this process)")


def check_task_readable(ref: ArrayRef, in_process: bool) -> None:
    """Refuse, before any work, an input on ``memory://`` when the tasks run
    in other processes (``in_process`` False), where that filesystem is
    empty; a zarr ``MemoryStore`` goes to the workers with the tasks."""
    if not in_process and memory_filesystem(ref.store):
        raise StorageError(
            f"cannot read {str(ref)!r}: a memory:// filesystem lives in this process only, "
            "and the tasks that read it run in dask worker processes, where it is empty; "
            "store it at a path or file:// URL, or run the engine's workers as threads of "
            "this process (ta.Engine(processes=False))")


def describe(store: Store, path: str = "") -> str:
    """Human-readable location of an array: a file path for local stores, a URL
    for fsspec stores."""
    root = getattr(store, "root", None)
    if root is None and hasattr(store, "_store"):
        return describe(store._store, path)
    fs = getattr(store, "fs", None)
    if root is None and fs is not None and isinstance(getattr(store, "path", None), str):
        protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
        # a local path keeps its leading slash (file:///tmp/x, not file://tmp/x)
        base = f"{protocol}://" + (store.path if protocol in ("file", "local") else
                                   store.path.lstrip("/"))
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
        raise StorageArgumentTypeError(
            f"member name must be a string, got {type(name).__name__} {name!r}")
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
    raise StorageArgumentError(
        f"bad member name {name!r}: {why}; use a relative path such as 'x' or 'sub/x'"
    )


@dataclass(frozen=True, eq=False)
class ArrayRef:
    """Picklable reference to a Zarr array: what tasks carry instead of data."""

    store: Store
    """The Zarr store holding the array."""
    path: str = ""
    """Path of the array inside the store ("" for the store root)."""
    run: str = ""
    """For a job's output: the token of the job's lock. A task writes a unit
    only while the lock still carries it (a task of a killed job, still
    running on a cluster that outlived its driver, never writes into the
    output another job took over); "" for everything else."""

    @classmethod
    def from_location(cls, where: str | os.PathLike | Store, path: str = "",
                      storage_options: dict | None = None) -> ArrayRef:
        """The array at ``where``, or member ``path`` of the group there.

        ``where`` is a path, a URL (``file://`` is a local path; ``s3://``
        and other schemes go through zarr's fsspec store when fsspec and the
        scheme's package are installed), a zarr Store, or an opened
        ``zarr.Array`` / ``zarr.Group`` (its store and path).
        ``storage_options`` (URLs other than ``file://`` only) are passed to
        the fsspec filesystem: credentials, ``endpoint_url``, ...

        Raises
        ------
        StorageError
            ``path`` is not a relative member name (see :func:`check_name`),
            or a URL cannot be opened.
        TypeError
            ``where`` is none of these.
        """
        if isinstance(where, zarr.Array | zarr.Group):
            _no_options(storage_options, "an opened zarr.Array / zarr.Group")
            inner = "/".join(p for p in (where.path.strip("/"), check_name(path)) if p)
            return cls(where.store, check_name(inner))
        return cls(_as_store(where, storage_options), check_name(path))

    def __str__(self) -> str:
        return describe(self.store, self.path)

    @property
    def short_name(self) -> str | None:
        """A name for the array: its member name in a group (``"C"``), else the
        file name without ``.zarr`` (``"c.zarr"`` -> ``"c"``); None if neither."""
        name = self.path.strip("/").rsplit("/", 1)[-1]
        if not name:
            name = str(self).rstrip("/").rsplit("/", 1)[-1]
            name = name[: -len(".zarr")] if name.endswith(".zarr") and len(name) > 5 else name
        return name or None

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

    def has_key(self, key: str) -> bool:
        return sync(self.store.exists(self._key(key)))

    def list_keys(self, prefix: str) -> list[str]:
        full = self._key(prefix)
        full = full + "/" if full else ""  # the whole store: every key
        keys = collect_aiterator(self.store.list_prefix(full))
        return [k[len(full):] for k in keys]

    def delete_key(self, key: str) -> None:
        """Delete ``key`` (relative to the array); no error when it is absent."""
        if self.has_key(key):
            sync(self.store.delete(self._key(key)))

    def delete_prefix(self, prefix: str) -> None:
        sync(self.store.delete_dir(self._key(prefix)))


def info_attrs(arr: zarr.Array) -> dict:
    """The tilearray attributes of an array ({} for arrays we did not write)."""
    value = arr.attrs.get(ATTR_KEY)
    return dict(value) if isinstance(value, dict) else {}
