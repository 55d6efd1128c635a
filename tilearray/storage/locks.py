"""Single-writer output locks and the group lock around consolidated metadata.

Where a lock lives
------------------
An output's lock sits *next to* the array, never inside it, so that
replacing the array (Zarr's ``overwrite`` deletes its whole directory) can
never delete the lock of the job doing the replacing:

- an array at the root of a local store ``/data/c.zarr``:
  the file ``/data/c.zarr.tilearray.lock``;
- a group member ``C`` (``name="C"``) of ``/data/g.zarr``:
  ``/data/g.zarr/C.tilearray.lock``;
- other stores: the key ``<member>.tilearray.lock``, or
  ``tilearray.lock`` for an array at the store's root (kept by
  :func:`tilearray.storage.create` when it replaces the array).

A lock is created exclusively (a hard link of a fully written temporary
file, which fails if the lock exists, like ``O_CREAT | O_EXCL``; where hard
links are not supported, ``O_CREAT | O_EXCL`` itself), so of two racing
jobs exactly one holds it, and a lock is never seen half written. It
records the holder: host, pid, the process's start time, when it was taken
and a random token; a job only ever removes a lock carrying its own token.

Stale locks (the documented rule)
---------------------------------
A lock is *stale* only when it was taken on this host (same hostname) and
its process is gone: no process has that pid, the pid is a zombie, or the
process now running under that pid started at a different time than the one
recorded (the pid was reused). A stale lock is reclaimed: the reclaimer
first takes ``<lock>.reclaim`` exclusively, re-reads the lock and replaces
it atomically only if it still carries the dead holder's token, so two jobs
reclaiming the same stale lock never both win. A lock taken on another host
is never guessed stale (its pid means nothing here): the error says which
file to remove once that job is known to be gone.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import time
import uuid
from datetime import UTC, datetime

from zarr.abc.store import Store
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync
from zarr.storage import LocalStore

from ..errors import OutputLockedError, StorageError
from .objects import fsspec_of, protocol_of, store_failure
from .ref import describe

LOCK_SUFFIX = ".tilearray.lock"
ROOT_LOCK_KEY = "tilearray.lock"
"""Lock key of an array at the root of a store that is not a local directory."""
GROUP_LOCK = "tilearray.consolidate.lock"
"""Lock (at the store's root) around refreshing a group's consolidated metadata."""
OWN_KEYS = frozenset({ROOT_LOCK_KEY, ROOT_LOCK_KEY + ".reclaim"})
"""Keys of an array's own lock, inside it on stores that are not directories."""


def local_root(store: Store) -> str | None:
    """Directory of a local store (seen through wrapper stores), else None."""
    seen = 0
    while store is not None and seen < 8:
        if isinstance(store, LocalStore):
            return str(store.root)
        store = getattr(store, "_store", None)
        seen += 1
    return None


def _exclusive_put(store: Store, key: str, value: bytes) -> bool | None:
    """Create ``key`` holding ``value`` by a conditional PUT (``If-None-Match:
    *``): True if created, False if it exists; None where the store offers no
    conditional create (then the caller's check-then-write, which two racing
    jobs can both pass, is all there is).

    s3fs sends the condition with ``pipe_file(mode="create")`` and maps the
    412 answer to FileExistsError; AWS S3, MinIO, Ceph RGW (recent) and moto
    honour it. An S3-compatible store that ignores the header overwrites the
    key instead: the read-back check then catches the loser of a race only
    when the other PUT came after it."""
    found = fsspec_of(store)
    if found is None:
        return None
    fs, root = found
    if protocol_of(fs) not in ("s3", "s3a") or not hasattr(fs, "_pipe_file"):
        return None
    path = "/".join(p for p in (root.rstrip("/"), key) if p)
    try:
        sync(fs._pipe_file(path, value, mode="create"))
    except FileExistsError:
        return False
    return True


def _cannot_create(slot: _Slot, target: str, e: Exception) -> StorageError:
    """Why the lock for writing ``target`` cannot be created: a read-only
    store or a directory this process may not write into is said so."""
    if getattr(slot.store, "read_only", False):
        return StorageError(f"cannot write {target!r}: the store {describe(slot.store)!r} was "
                            "opened read-only; write to a location this process can write to")
    code = getattr(e, "errno", None)  # None from an object store client's errors
    if isinstance(e, PermissionError) or code in (errno.EACCES, errno.EPERM, errno.EROFS):
        where = (f"the directory {os.path.dirname(slot.file)!r} is not writable"
                 if slot.file is not None else
                 f"the store {describe(slot.store)!r} is not writable")
    else:
        return StorageError(f"cannot write {target!r}: its lock {str(slot)!r} cannot be "
                            f"created: {type(e).__name__}: {e}")
    return StorageError(f"cannot write {target!r}: {where} ({type(e).__name__}: {e}); write "
                        "to a location this process can write to")


class _Slot:
    """One lock: a local file, or a key of a store."""

    def __init__(self, store: Store, key: str, file: str | None = None):
        self.store, self.key = store, key
        root = local_root(store)
        if file is None and root is not None:
            file = os.path.join(root, *key.split("/"))
        self.file = file

    def __str__(self) -> str:
        if self.file is not None:
            return self.file
        return describe(self.store, self.key)

    def create(self, value: bytes) -> bool:
        """Create the lock holding ``value`` if absent; False if it exists."""
        if getattr(self.store, "read_only", False):
            raise PermissionError("the store is read-only")
        if self.file is None:
            exclusive = _exclusive_put(self.store, self.key, value)
            if exclusive is not None:  # read back too: a store may ignore the condition
                return exclusive and self.read() == value
            buf = default_buffer_prototype().buffer.from_bytes(value)
            if sync(self.store.exists(self.key)):
                return False
            try:
                sync(self.store.set_if_not_exists(self.key, buf))
            except (FileExistsError, NotImplementedError):
                return False
            return self.read() == value  # best effort where a store has no exclusive create
        os.makedirs(os.path.dirname(self.file), exist_ok=True)
        tmp = f"{self.file}.{uuid.uuid4().hex}.tmp"
        with open(tmp, "wb") as f:
            f.write(value)
        try:
            os.link(tmp, self.file)  # atomic, exclusive, and never half written
            return True
        except FileExistsError:
            return False
        except OSError:  # no hard links here: O_CREAT | O_EXCL
            try:
                fd = os.open(self.file, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(fd, "wb") as f:
                f.write(value)
            return True
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)

    def read(self) -> bytes | None:
        if self.file is None:
            buf = sync(self.store.get(self.key, default_buffer_prototype()))
            return None if buf is None else buf.to_bytes()
        try:
            with open(self.file, "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def replace(self, value: bytes) -> None:
        """Overwrite the lock atomically (only under its ``.reclaim`` claim)."""
        if self.file is None:
            sync(self.store.set(self.key, default_buffer_prototype().buffer.from_bytes(value)))
            return
        tmp = f"{self.file}.{uuid.uuid4().hex}.tmp"
        with open(tmp, "wb") as f:
            f.write(value)
        os.replace(tmp, self.file)

    def delete(self) -> None:
        if self.file is None:
            sync(self.store.delete(self.key))
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.file)


def output_lock_key(path: str, local: bool) -> str:
    """Key (relative to the store's root) of the lock of the array at ``path``."""
    path = path.strip("/")
    if path:
        return path + LOCK_SUFFIX
    return "" if local else ROOT_LOCK_KEY


def _output_slot(ref) -> _Slot:
    root = local_root(ref.store)
    key = output_lock_key(ref.path, root is not None)
    if root is not None and not key:  # the store's root: a file next to its directory
        return _Slot(ref.store, ROOT_LOCK_KEY, file=os.path.normpath(root) + LOCK_SUFFIX)
    return _Slot(ref.store, key)


def lock_path(ref) -> str:
    """Where the lock of the output ``ref`` lives (a file path for local stores)."""
    return str(_output_slot(ref))


# -- holders ------------------------------------------------------------------------------

_HOST = socket.gethostname()


def _start_time(pid: int) -> float | None:
    """Start time of a running process (seconds since the epoch); None if it is gone."""
    import psutil

    try:
        p = psutil.Process(pid)
        if p.status() == psutil.STATUS_ZOMBIE:
            return None
        return p.create_time()
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return None
    except psutil.AccessDenied:  # alive, but not ours to inspect
        return -1.0


def _me(what: str, token: str | None = None) -> dict:
    return {"host": _HOST, "pid": os.getpid(), "started": _start_time(os.getpid()),
            "taken": datetime.now(UTC).isoformat(timespec="milliseconds"),
            "token": token or uuid.uuid4().hex, "what": what}


def _parse(raw: bytes | None) -> dict | None:
    if raw is None:
        return None
    try:
        owner = json.loads(raw)
    except ValueError:
        return {}
    return owner if isinstance(owner, dict) else {}


def is_stale(owner: dict) -> bool:
    """The documented rule: same host, and its process is gone (or its pid reused)."""
    if owner.get("host") != _HOST:
        return False
    pid = owner.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False  # unreadable: never guessed
    started = _start_time(pid)
    if started is None:
        return True
    recorded = owner.get("started")
    if isinstance(recorded, int | float) and started >= 0 and abs(started - recorded) > 0.05:
        return True  # another process now has that pid
    return False


def describe_holder(owner: dict) -> str:
    if not owner:
        return "an unknown holder (the lock file is unreadable)"
    started = owner.get("started")
    when = (datetime.fromtimestamp(started, UTC).isoformat(timespec="seconds")
            if isinstance(started, int | float) and started > 0 else "?")
    return (f"pid {owner.get('pid')} on host {owner.get('host')} (process started {when}, "
            f"lock taken {owner.get('taken', '?')})")


_UNWRITABLE = object()
"""What :func:`_acquire`'s create gives for a store it may not write."""


def _acquire(slot: _Slot, what: str, refuse, target: str,
             unwritable_ok: bool = False, token: str | None = None) -> str | None:
    """Take ``slot``; returns the token. ``refuse(owner)`` raises for a live holder.
    A lock that cannot be created (read-only store, no permission) is a
    :class:`StorageError` naming ``target``, what is written -- or, with
    ``unwritable_ok``, None."""
    me = _me(what, token)
    mine = json.dumps(me).encode()
    claim = _Slot(slot.store, slot.key + ".reclaim",
                  file=None if slot.file is None else slot.file + ".reclaim")

    def create(s: _Slot):
        """``s.create(mine)``; :data:`_UNWRITABLE` where the store cannot be
        written and ``unwritable_ok``, else that is a StorageError."""
        try:
            return s.create(mine)
        except Exception as e:  # OSError, or an object store client's (no credentials)
            if not store_failure(e):
                raise
            if unwritable_ok:
                return _UNWRITABLE
            raise _cannot_create(s, target, e) from None

    for _ in range(50):
        made = create(slot)
        if made is _UNWRITABLE:
            return None
        if made:
            return me["token"]
        owner = _parse(slot.read())
        if owner is None:  # released meanwhile: try again
            continue
        if not is_stale(owner):
            refuse(owner)
        # stale: reclaim it under an exclusive claim, only if it is still that lock
        claimed = create(claim)
        if claimed is _UNWRITABLE:
            return None
        if not claimed:
            other = _parse(claim.read())
            if other and is_stale(other):
                raise OutputLockedError(
                    f"the lock {str(slot)!r} is stale ({describe_holder(owner)} is gone) but "
                    f"a reclaim of it was interrupted ({describe_holder(other)}); remove "
                    f"{str(claim)!r} and {str(slot)!r} by hand")
            time.sleep(0.01)  # another job is reclaiming it right now
            continue
        try:
            current = _parse(slot.read())
            if current is not None and current.get("token") == owner.get("token") \
                    and current.get("pid") == owner.get("pid"):
                # the dead holder is remembered: what it left is its unfinished output
                slot.replace(json.dumps({**me, "reclaimed_from": owner}).encode())
                return me["token"]
        finally:
            claim.delete()
    raise OutputLockedError(f"could not take the lock {str(slot)!r}: it kept changing hands")


def _release(slot: _Slot, token: str | None) -> None:
    """Remove ``slot`` if it still carries ``token`` (never another job's lock)."""
    if token is None:
        return
    with contextlib.suppress(Exception):  # best effort; a stale lock is reclaimed later
        owner = _parse(slot.read())
        if owner and owner.get("token") == token:
            slot.delete()


# -- output locks -------------------------------------------------------------------------

_held: dict[str, str] = {}
"""Output -> token of the lock this process holds on it."""


def _refuse_output(ref, slot):
    def refuse(owner):
        raise OutputLockedError(
            f"{str(ref)!r} is being written by another job: {describe_holder(owner)}; wait "
            f"for it to finish. If that job is gone (a lock from another host is never "
            f"presumed dead), remove {str(slot)!r}")
    return refuse


def acquire_lock(ref) -> None:
    """Take the output's single-writer lock, before anything is created or replaced.

    Raises
    ------
    OutputLockedError
        Another live job holds it (the message names it: pid, host, start time).
    """
    slot = _output_slot(ref)
    _held[str(ref)] = _acquire(slot, "output", _refuse_output(ref, slot), str(ref),
                               token=getattr(ref, "run", "") or None)


def check_writer(ref, unit: tuple) -> None:
    """In a task, before it writes ``unit`` of a job's output (``ref.run``
    set): raise :class:`OutputLockedError` unless the output's lock still
    carries the job's token -- a task of a killed driver's job, still running
    on a cluster that outlived it, must not write into the output a new job
    took over (or one no job holds any more)."""
    if not getattr(ref, "run", ""):
        return
    owner = _parse(_output_slot(ref).read()) or {}
    if owner.get("token") != ref.run:
        raise OutputLockedError(
            f"{str(ref)!r}: a task of an earlier job stopped before writing I/O unit {unit}: "
            f"the output's lock is now {describe_holder(owner) if owner else 'absent'}")


def check_unlocked(ref) -> None:
    """Raise :class:`OutputLockedError` if a live job holds the output's lock now
    (a stale lock is left for :func:`acquire_lock` to reclaim)."""
    slot = _output_slot(ref)
    owner = _parse(slot.read())
    if owner is not None and _held.get(str(ref)) != owner.get("token") and not is_stale(owner):
        _refuse_output(ref, slot)(owner)


def live_writer(ref) -> dict | None:
    """The holder of the output's lock when another live job holds it now
    (not this process, not a stale lock), else None."""
    owner = _parse(_output_slot(ref).read())
    if not owner or owner.get("token") == _held.get(str(ref)) or is_stale(owner):
        return None
    return owner


def abandoned_by(ref) -> dict | None:
    """The holder of the output's lock if it is stale (the job that held it was
    killed: same host, process gone) -- or, once this process has reclaimed
    that lock, the killed holder it took it from -- else None. Whatever that job left at
    the target -- e.g. a directory whose ``zarr.json`` it never wrote -- is an
    unfinished output: before taking the lock, a job refuses targets that
    are not arrays, so only the dead holder can have made it so."""
    owner = _parse(_output_slot(ref).read())
    if owner is None:
        return None
    if owner.get("token") == _held.get(str(ref)):  # ours, reclaimed from a killed job
        dead = owner.get("reclaimed_from")
        return dead if isinstance(dead, dict) else None
    return owner if is_stale(owner) else None


def check_lock_held(ref) -> None:
    """Raise unless this process still holds the output's lock (checked before commit)."""
    slot = _output_slot(ref)
    owner = _parse(slot.read()) or {}
    token = _held.get(str(ref))
    if token is None or owner.get("token") != token:
        raise OutputLockedError(
            f"{str(ref)!r}: this job no longer holds the output's lock {str(slot)!r} (now "
            f"{describe_holder(owner) if owner else 'absent'}); not marking it complete")


def release_lock(ref) -> None:
    """Remove the output's lock if this process holds it (never another job's)."""
    _release(_output_slot(ref), _held.pop(str(ref), None))


@contextlib.contextmanager
def writing(ref):
    """``with writing(ref):`` hold the output's lock for the block."""
    acquire_lock(ref)
    try:
        yield
    finally:
        release_lock(ref)


# -- the group lock -----------------------------------------------------------------------


class _Busy(Exception):
    pass


@contextlib.contextmanager
def group_lock(store: Store, timeout: float = 60.0):
    """Hold the store's consolidated-metadata lock (waiting while another job
    refreshes it), so that concurrent writers of different members never
    lose one from the listing (a refresh reads every member, then writes).

    Yields True when held, False when the lock cannot be created at all (a
    read-only store, where there is nothing to refresh either).

    Raises
    ------
    StorageError
        Still held by a live job after ``timeout`` seconds (it names it).
    """
    slot = _Slot(store, GROUP_LOCK)
    deadline = time.monotonic() + timeout
    token = None

    def refuse(owner):
        raise _Busy(owner)

    while True:
        try:
            token = _acquire(slot, "group", refuse, describe(store), unwritable_ok=True)
            break  # held, or None: it cannot be created
        except _Busy as e:
            if time.monotonic() > deadline:
                raise StorageError(
                    f"timed out after {timeout:.0f} s waiting for {str(slot)!r}, held by "
                    f"{describe_holder(e.args[0])}; if that job is gone, remove it") from None
            time.sleep(0.002)
    try:
        yield token is not None
    finally:
        _release(slot, token)
