"""Zarr store wrappers for tests.

Counts live in a process-global registry keyed by the wrapper's ``name``,
so they survive the pickling a task graph goes through (use an in-process
cluster, ``Engine(processes=False)``, to read them from the test).
"""

from __future__ import annotations

import threading
from collections import Counter, defaultdict

from zarr.abc.store import ByteRequest, Store
from zarr.core.buffer import Buffer, BufferPrototype
from zarr.storage import WrapperStore

_lock = threading.Lock()
_counts: dict[str, Counter] = defaultdict(Counter)
_failures: dict[str, Counter] = defaultdict(Counter)


def _is_data_key(key: str) -> bool:
    """Chunk/shard keys; not metadata (zarr.json, .zarray, ...) nor our markers."""
    last = key.rsplit("/", 1)[-1]
    return not (last.startswith(".z") or last == "zarr.json" or "tilearray.done" in key)


def counts(name: str) -> Counter:
    """Counters of the wrapper called ``name``: gets, bytes, sets, per-key gets."""
    with _lock:
        return Counter(_counts[name])


def reset_counts(name: str) -> None:
    with _lock:
        _counts.pop(name, None)
        _failures.pop(name, None)


class CountingStore(WrapperStore):
    """Counts store reads of data keys (``gets``, ``bytes``) and writes (``sets``)."""

    def __init__(self, store: Store, name: str = "default") -> None:
        super().__init__(store)
        self.name = name

    def __reduce__(self):
        return (type(self), (self._store, self.name))

    def _with_store(self, store):
        return type(self)(store, self.name)

    def __eq__(self, other: object) -> bool:
        return (
            type(self) is type(other) and self.name == other.name and self._store == other._store
        )

    def _count(self, key: str, value: Buffer | None, what: str) -> None:
        if not _is_data_key(key):
            return
        with _lock:
            c = _counts[self.name]
            c[what] += 1
            c[f"{what}:{key}"] += 1
            if value is not None:
                c[f"{what}_bytes"] += len(value)

    async def get(
        self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        value = await self._store.get(key, prototype, byte_range)
        self._count(key, value, "gets")
        return value

    async def get_partial_values(self, prototype, key_ranges):
        values = await self._store.get_partial_values(prototype, key_ranges)
        for (key, _), value in zip(key_ranges, values, strict=True):
            self._count(key, value, "gets")
        return values

    async def set(self, key: str, value: Buffer) -> None:
        await self._store.set(key, value)
        self._count(key, value, "sets")


class FailingStore(CountingStore):
    """Raises ``OSError`` on reads of data keys matching ``match``.

    The first ``fail_times`` reads of each matching key fail (``None``: every
    read fails, a permanent fault); later reads succeed.
    """

    def __init__(
        self, store: Store, name: str = "failing", match: str = "", fail_times: int | None = 2
    ) -> None:
        super().__init__(store, name)
        self.match = match
        self.fail_times = fail_times

    def __reduce__(self):
        return (type(self), (self._store, self.name, self.match, self.fail_times))

    def _with_store(self, store):
        return type(self)(store, self.name, self.match, self.fail_times)

    def _maybe_fail(self, key: str) -> None:
        if not _is_data_key(key) or self.match not in key:
            return
        with _lock:
            n = _failures[self.name][key]
            _failures[self.name][key] += 1
            fail = self.fail_times is None or n < self.fail_times
            if fail:
                _counts[self.name]["failures"] += 1
        if fail:
            raise OSError(f"injected read failure of {key!r} ({n + 1})")

    async def get(self, key, prototype, byte_range=None):
        self._maybe_fail(key)
        return await super().get(key, prototype, byte_range)

    async def get_partial_values(self, prototype, key_ranges):
        for key, _ in key_ranges:
            self._maybe_fail(key)
        return await super().get_partial_values(prototype, key_ranges)


class LatencyStore(CountingStore):
    """Sleeps a uniform ``lo``-``hi`` seconds before every read request (an
    asyncio sleep: requests in flight overlap, as on a network) -- the
    per-request latency of a cloud object store -- and counts them like
    :class:`CountingStore` (``gets``; also ``exists``). For benchmarks."""

    def __init__(self, store: Store, name: str = "latency", lo: float = 0.02,
                 hi: float = 0.05) -> None:
        super().__init__(store, name)
        self.lo, self.hi = lo, hi

    def __reduce__(self):
        return (type(self), (self._store, self.name, self.lo, self.hi))

    def _with_store(self, store):
        return type(self)(store, self.name, self.lo, self.hi)

    async def _delay(self) -> None:
        import asyncio
        import random

        await asyncio.sleep(random.uniform(self.lo, self.hi))

    async def get(self, key, prototype, byte_range=None):
        await self._delay()
        value = await self._store.get(key, prototype, byte_range)
        self._count(key, value, "gets")
        return value

    async def get_partial_values(self, prototype, key_ranges):
        import asyncio

        return list(await asyncio.gather(*(self.get(k, prototype, r) for k, r in key_ranges)))

    async def exists(self, key: str) -> bool:
        await self._delay()
        with _lock:
            _counts[self.name]["exists"] += 1
        return await self._store.exists(key)
