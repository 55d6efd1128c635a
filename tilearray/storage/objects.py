"""Object stores (S3 and other fsspec filesystems behind zarr's
``FsspecStore``): what tilearray does there in place of its local-file paths.

- :func:`fsspec_of`: the filesystem and root path under a store (through
  wrapper stores), for the calls zarr's Store API does not offer: a listing
  with sizes and ETags, a conditional create.
- :func:`objects_state`: the counterpart of a local array's file state
  (newest mtime, bytes, files) -- a digest of every object's key, size and
  ETag, from one listing -- so an input rewritten under a running job is
  noticed on S3 as on disk (its ``zarr.json`` alone may not change).
- :func:`close_sessions`: the HTTP sessions of this process's S3
  filesystems closed before it exits.
"""

from __future__ import annotations

import hashlib
import sys

from zarr.abc.store import Store
from zarr.core.sync import sync

from ..errors import StorageError

_LOCK_MARK = "tilearray.lock"


def fsspec_of(store: Store):
    """``(filesystem, root path)`` of a zarr ``FsspecStore`` (seen through
    wrapper stores), else None."""
    seen = 0
    while store is not None and seen < 8:
        fs, path = getattr(store, "fs", None), getattr(store, "path", None)
        if fs is not None and isinstance(path, str):
            return fs, path
        store, seen = getattr(store, "_store", None), seen + 1
    return None


_CLIENT_LIBRARIES = ("botocore", "aiobotocore", "aiohttp", "s3fs", "gcsfs", "adlfs", "azure",
                     "google")


def store_failure(e: BaseException) -> bool:
    """Whether ``e`` is a store refusing or not answering -- an OSError
    (PermissionError: Forbidden, a connection refused) or an error of an
    object store's client library (botocore's NoCredentialsError,
    EndpointConnectionError) -- rather than a bug to let through."""
    return isinstance(e, OSError) or \
        type(e).__module__.split(".")[0] in _CLIENT_LIBRARIES


def store_refused(doing: str, loc: str, e: BaseException) -> StorageError | None:
    """The StorageError for ``doing`` (open, create) ``loc`` when ``e`` is a
    store refusing or not answering (:func:`store_failure`), else None: the
    caller re-raises ``e``."""
    if not store_failure(e):
        return None
    return StorageError(f"cannot {doing} {loc!r}: its store refused or did not answer "
                        f"({type(e).__name__}: {e}); check the endpoint, the credentials and "
                        "storage_options")


def missing_bucket(store: Store) -> str | None:
    """Why nothing is found at ``store`` when its bucket (the first segment of
    an object store's path) does not exist or cannot be seen with these
    credentials, else None (any store, any failure of the check)."""
    found = fsspec_of(store)
    if found is None or protocol_of(found[0]) in ("file", "local", "memory"):
        return None
    fs, root = found
    bucket = root.strip("/").split("/", 1)[0]
    try:
        if bucket and not sync(fs._exists(bucket)):
            return (f"the bucket {bucket!r} does not exist (or is not visible with these "
                    "credentials)")
    except Exception:
        return None
    return None


def refused_options(e: BaseException) -> StorageError | None:
    """The StorageError for a filesystem refusing its ``storage_options`` (an
    unknown keyword reaching the client's constructor), else None."""
    if isinstance(e, TypeError) and "unexpected keyword argument" in str(e):
        return StorageError(f"the storage_options are not accepted by the store's filesystem "
                            f"({e}): check their names (s3fs: key, secret, endpoint_url, "
                            "client_kwargs, ...)")
    return None


def protocol_of(fs) -> str:
    return fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]


def objects_state(ref) -> tuple[str, int, int] | None:
    """``(digest of every object's key, size and ETag, total bytes, object
    count)`` of the array at ``ref`` on an fsspec store (None for other
    stores, or when the listing fails -- credentials that may read but not
    list, a store down: the caller falls back to the metadata; a deleted
    array lists empty, 0 objects). Locks are left out: on object stores
    an array's own lock lives inside its prefix. The ETag is the content's
    (not the time's): an object rewritten with the same bytes is unchanged."""
    found = fsspec_of(ref.store)
    if found is None:
        return None
    fs, root = found
    prefix = "/".join(p for p in (root.rstrip("/"), ref.path.strip("/")) if p)
    try:
        listing = sync(fs._find(prefix, detail=True))
    except Exception:  # not listable (no s3:ListBucket) or not answering
        return None
    digest, total, count = hashlib.sha256(), 0, 0
    for path in sorted(listing):
        if _LOCK_MARK in path.rsplit("/", 1)[-1]:
            continue
        info = listing[path]
        size = int(info.get("size") or 0)
        tag = info.get("ETag") or info.get("etag") or info.get("md5Hash") or \
            info.get("LastModified") or info.get("mtime") or ""
        digest.update(f"{path[len(prefix):]}\0{size}\0{tag}\n".encode())
        total, count = total + size, count + 1
    return digest.hexdigest(), total, count


def close_sessions() -> int:
    """Close the HTTP clients of the S3 filesystems this process opened
    (s3fs's, cached by fsspec; reopened on their next request), each on the
    event loop it was made on: Zarr's for the stores it opened, the
    filesystem's own otherwise. Left to the interpreter's exit, aiohttp
    reports each as "Unclosed client session" (every worker of an S3 run
    did). Returns how many were closed."""
    s3fs = sys.modules.get("s3fs")
    if s3fs is None:  # never imported: no filesystem of it to close
        return 0
    from fsspec.asyn import sync as fs_sync

    closed = 0
    for fs in list(s3fs.S3FileSystem._cache.values()):
        client = getattr(fs, "_s3", None)
        if client is None:
            continue
        try:
            if fs.asynchronous:  # made by Zarr's FsspecStore, on Zarr's loop
                sync(client.__aexit__(None, None, None), timeout=10)
            elif fs.loop is not None and fs.loop.is_running():
                fs_sync(fs.loop, client.__aexit__, None, None, None, timeout=10)
            else:
                continue
        except Exception:  # a session already gone: nothing to close
            continue
        fs._s3 = None  # s3fs makes a new client at its next request
        closed += 1
    return closed
