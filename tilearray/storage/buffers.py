"""Reused per-thread buffers for the read path, dropped when the thread idles.

A 2048² float64 chunk is 32 MiB: above glibc's largest mmap threshold, so a
fresh ``np.empty`` or ``bytearray`` of that size is a new mapping whose pages
the kernel faults in and zeroes on first touch, and unmaps again on free.
Measured on this project's 2-core machine, reading + decoding one such zstd
chunk from page cache: 56 ms with a fresh compressed buffer and a fresh
decoded block, 46 ms with the compressed buffer reused, 42 ms with both
reused (sys time 25 -> 9 ms per chunk).

:func:`scratch` is the calling thread's buffer for a chunk's compressed
bytes; :func:`take` / :func:`give` lend whole decoded blocks (the reduction
map tasks, whose blocks never outlive the task). Both are memory a task
holds anyway while it runs (the planner counts each read compressed and
decoded). Readers that do not pass a reused destination drop the scratch
after each read (:func:`drop_scratch`), so matmul and elementwise tasks hold
what they held before; a thread's buffers are dropped once it has not used
them for ``IDLE_SECONDS``, when the thread ends, or when a task planned
against the whole budget starts (:func:`release`).
"""

from __future__ import annotations

import threading
import time
import weakref

import numpy as np

IDLE_SECONDS = 2.0
"""A thread's buffers are dropped after this long unused, in seconds."""
MAX_POOLED_BYTES = 256 * 2**20
"""At most this many bytes of decoded blocks kept per thread, in bytes."""


class _Pool:
    __slots__ = ("lock", "scratch", "blocks", "nbytes", "used", "__weakref__")

    def __init__(self):
        self.lock = threading.Lock()
        self.scratch: np.ndarray | None = None
        self.blocks: dict[tuple, list[np.ndarray]] = {}
        self.nbytes = 0
        self.used = time.monotonic()

    def clear(self) -> None:
        self.scratch = None
        self.blocks = {}
        self.nbytes = 0


_local = threading.local()
_pools: weakref.WeakSet[_Pool] = weakref.WeakSet()  # a thread's pool goes with it
_pools_lock = threading.Lock()
_reaper: threading.Thread | None = None


def _pool() -> _Pool:
    pool = getattr(_local, "pool", None)
    if pool is None:
        pool = _local.pool = _Pool()
        with _pools_lock:
            _pools.add(pool)
            _start_reaper()
    pool.used = time.monotonic()
    return pool


def _start_reaper() -> None:
    global _reaper
    if _reaper is None or not _reaper.is_alive():
        _reaper = threading.Thread(target=_reap, daemon=True, name="tilearray-buffers")
        _reaper.start()


def _reap() -> None:
    while True:
        time.sleep(IDLE_SECONDS / 2)
        now = time.monotonic()
        with _pools_lock:
            pools = list(_pools)
        for pool in pools:
            if now - pool.used > IDLE_SECONDS and (pool.scratch is not None or pool.blocks):
                with pool.lock:
                    if now - pool.used > IDLE_SECONDS:
                        pool.clear()


def scratch(nbytes: int) -> np.ndarray:
    """This thread's uint8 buffer of at least ``nbytes`` (contents undefined).

    Valid until this thread's next call; not for values that outlive a read.
    """
    pool = _pool()
    with pool.lock:
        buf = pool.scratch
        if buf is None or buf.nbytes < nbytes:
            pool.scratch = None  # the old one is freed before the new one is made
            buf = pool.scratch = np.empty(nbytes, dtype=np.uint8)
        return buf


def drop_scratch() -> None:
    """Free this thread's compressed-bytes buffer (readers that do not reuse
    it across calls: their memory is then what it was without it)."""
    pool = getattr(_local, "pool", None)
    if pool is not None:
        with pool.lock:
            pool.scratch = None


def take(shape: tuple[int, ...], dtype) -> np.ndarray:
    """A C-ordered array of ``shape`` and ``dtype`` (contents undefined):
    one this thread gave back earlier, else a new one."""
    dtype = np.dtype(dtype)
    pool = _pool()
    with pool.lock:
        free = pool.blocks.get((tuple(shape), dtype.str))
        if free:
            arr = free.pop()
            pool.nbytes -= arr.nbytes
            return arr
    return np.empty(shape, dtype=dtype)


def give(arr: np.ndarray) -> None:
    """Hand ``arr`` (from :func:`take`, no longer referenced) back for reuse
    by this thread; dropped when the pool is full."""
    if arr.base is not None or not arr.flags.c_contiguous:
        return
    pool = _pool()
    with pool.lock:
        if pool.nbytes + arr.nbytes > MAX_POOLED_BYTES:
            return
        pool.blocks.setdefault((arr.shape, arr.dtype.str), []).append(arr)
        pool.nbytes += arr.nbytes


def release(blocks_only: bool = False) -> None:
    """Drop this thread's buffers now (``blocks_only``: keep the compressed
    scratch, which every read uses). Tasks planned against the whole budget
    (matmul, elementwise blocks) call it first, so that blocks a reduction
    left behind on this thread are not held while they run."""
    pool = getattr(_local, "pool", None)
    if pool is not None:
        with pool.lock:
            if blocks_only:
                pool.blocks, pool.nbytes = {}, 0
            else:
                pool.clear()
