"""Aggregated reads and whole-unit writes (the two-phase I/O idea of MPI-IO).

Reading: :func:`plan_reads` (pure) turns a requested region into requests
that cover whole I/O units -- a shard, or a chunk when unsharded, or a
contiguous rectangle of them -- and :func:`read_region` performs one Zarr
read per request, so every unit is fetched whole, once, and tiles are handed
to compute from memory. Writing: :func:`write_block` writes a unit-aligned
block whole, then the done marker of each unit in it.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field

import numpy as np
from zarr.storage import WrapperStore

from .. import _config
from ..errors import CorruptChunkError, OutputLockedError, StorageError
from .array import (
    ArrayRef,
    every_unit_stored,
    grid_of,
    mark_unit_done,
    mark_unit_fill,
    unit_done_key,
)
from .chunks import DirectReader, direct_reader
from .geometry import Grid, Range
from .locks import check_writer, local_root
from .objects import fsspec_of
from .stream import PERMANENT_OS_ERRORS, RowStreamer, row_streamer

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ReadRequest:
    """One Zarr read covering a rectangle of whole I/O units."""

    rows: Range
    """Unit-aligned row range, in elements."""
    cols: Range
    """Unit-aligned column range, in elements."""
    store_gets: int
    """Store requests Zarr makes for it (one per unit, more for a ragged shard)."""
    nbytes: int
    """Decoded size, in bytes."""


def plan_reads(
    grid: Grid, rows: Range, cols: Range, itemsize: int, max_bytes: int | None = None
) -> list[ReadRequest]:
    """Plan the reads that fetch ``rows x cols`` of an array as whole I/O units.

    The region is widened to unit boundaries (a unit is never split between
    reads). One request covers it, or, when ``max_bytes`` is given, bands of
    whole units no larger than that (at least one unit each): bands of
    unit-rows when the region spans several, else bands of unit-columns.
    Bounding a request bounds the decode buffers alive while it is read.
    """
    r_units = grid.units_touching(0, rows)
    c_units = grid.units_touching(1, cols)
    if not r_units or not c_units:
        return []
    axis = 0 if len(r_units) > 1 else 1
    along, across = (r_units, c_units) if axis == 0 else (c_units, r_units)
    a0 = grid.unit_range(1 - axis, across[0])[0]
    a1 = grid.unit_range(1 - axis, across[-1])[1]
    bands: list[list[int]] = [[]]
    band_bytes = 0
    for i in along:
        lo, hi = grid.unit_range(axis, i)
        b = (hi - lo) * (a1 - a0) * itemsize
        if max_bytes is not None and bands[-1] and band_bytes + b > max_bytes:
            bands.append([])
            band_bytes = 0
        bands[-1].append(i)
        band_bytes += b
    out = []
    for band in bands:
        lo, hi = grid.unit_range(axis, band[0])[0], grid.unit_range(axis, band[-1])[1]
        if axis == 0:
            rr, cc = (lo, hi), (a0, a1)
            gets = sum(grid.store_gets_per_unit(i, j) for i in band for j in across)
        else:
            rr, cc = (a0, a1), (lo, hi)
            gets = sum(grid.store_gets_per_unit(i, j) for i in across for j in band)
        out.append(ReadRequest(rr, cc, gets, (rr[1] - rr[0]) * (cc[1] - cc[0]) * itemsize))
    return out


@dataclass
class IOStats:
    """Measured I/O of one task; tasks return ``as_dict()`` and the engine sums."""

    bytes_read: int = 0
    """Decoded bytes fetched from stores."""
    bytes_written: int = 0
    read_requests: int = 0
    store_gets: int = 0
    read_retries: int = 0
    read_seconds: float = 0.0
    units_written: int = 0
    """Output I/O units written whole and marked done."""
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {
            "bytes_read": self.bytes_read,
            "bytes_written": self.bytes_written,
            "read_requests": self.read_requests,
            "store_gets": self.store_gets,
            "read_retries": self.read_retries,
            "read_seconds": self.read_seconds,
            "units_written": self.units_written,
        }


class WholeObjectReads(WrapperStore):
    """The store one read request goes through: one GET per object.

    Zarr's sharding codec reads a shard it needs only part of -- at a ragged
    edge of the array, where some inner chunks lie outside it -- as its index
    (a suffix range) and then one ranged GET per inner chunk. tilearray reads
    whole units only, so here the first ranged request of a key fetches the
    whole object (once, however many ranges are asked for concurrently) and
    every range is served from it: one request per shard on every store
    (tens of milliseconds each on an object store), and the bytes are what
    that shard holds. Keys found missing are recorded (``missing``), which
    is what :func:`check_units_stored` needs -- no existence request per unit.
    Made per read attempt; its objects live as long as that read.

    ``object_bytes``: the most an object of the array holds decoded (a shard
    or chunk). An object no larger than s3fs's block size is fetched as the
    range from byte 0, one GET: a whole-object read first asks for the
    object's size (a HEAD, one more round trip per object) to split objects
    over the block size into concurrent ranged GETs, which these never are.
    """

    def __init__(self, store, object_bytes: int | None = None):
        super().__init__(store)
        self._objects: dict = {}
        self.missing: set[str] = set()
        self._object_bytes = object_bytes
        fs = (fsspec_of(store) or (None,))[0]
        block = getattr(fs, "default_block_size", None)
        self._one_get = isinstance(block, int) and object_bytes is not None \
            and object_bytes <= block

    def _with_store(self, store):
        return type(self)(store, self._object_bytes)

    async def _get_whole(self, key: str, prototype):
        if self._one_get:
            from zarr.abc.store import OffsetByteRequest

            return await self._store.get(key, prototype, OffsetByteRequest(0))
        return await self._store.get(key, prototype)

    async def _whole(self, key: str, prototype):
        import asyncio

        task = self._objects.get(key)
        if task is None:
            task = self._objects[key] = asyncio.ensure_future(self._get_whole(key, prototype))
        return await task

    async def get(self, key, prototype, byte_range=None):
        if byte_range is None:
            value = await self._get_whole(key, prototype)
        else:
            whole = await self._whole(key, prototype)
            value = None if whole is None else _slice(whole, byte_range)
        if value is None:
            self.missing.add(key)
        return value

    async def get_partial_values(self, prototype, key_ranges):
        import asyncio

        return list(await asyncio.gather(*(self.get(k, prototype, r) for k, r in key_ranges)))


def _slice(buf, byte_range):
    from zarr.abc.store import OffsetByteRequest, RangeByteRequest, SuffixByteRequest

    n = len(buf)
    if isinstance(byte_range, RangeByteRequest):
        return buf[byte_range.start : min(byte_range.end, n)]
    if isinstance(byte_range, OffsetByteRequest):
        return buf[byte_range.offset : n]
    if isinstance(byte_range, SuffixByteRequest):
        return buf[max(n - byte_range.suffix, 0) : n]
    raise TypeError(f"unknown byte range {byte_range!r}")


def _over(arr, store):
    """``arr`` read through ``store`` (its metadata reused: no request)."""
    import zarr
    from zarr.core.array import AsyncArray
    from zarr.storage import StorePath

    a = arr._async_array
    return zarr.Array(AsyncArray(metadata=a.metadata, store_path=StorePath(store, a.store_path.path),
                                 config=a.config))


def _read_request(arr, ref: ArrayRef, grid: Grid, req: ReadRequest, stats: IOStats,
                  direct: DirectReader | None = None, out: np.ndarray | None = None,
                  missing: set | None = None) -> np.ndarray:
    retries = int(_config.get("storage.read-retries"))
    sel = (slice(*req.rows), slice(*req.cols))
    for attempt in range(retries + 1):
        try:
            t0 = time.perf_counter()
            if direct is not None:
                data = direct.read(req.rows, req.cols, out)
            elif grid.within:  # inner chunks: Zarr's sharding codec reads them by range
                data = arr[sel]
            else:
                whole = WholeObjectReads(arr.store_path.store,
                                         grid.unit[0] * grid.unit[1] * arr.dtype.itemsize)
                data = _over(arr, whole)[sel]
                if missing is not None:
                    missing.update(whole.missing)
            stats.read_seconds += time.perf_counter() - t0
            break
        except StorageError:  # a corrupt chunk found by the direct reader: no retry
            raise
        except OSError as e:  # transient store errors: retry with backoff
            if isinstance(e, PERMANENT_OS_ERRORS):  # a directory / no permission: as it is
                raise StorageError(f"reading {str(ref)!r} rows {req.rows} cols {req.cols} "
                                   f"failed: {e}") from e
            if attempt == retries:
                raise StorageError(
                    f"reading {str(ref)!r} rows {req.rows} cols {req.cols} failed after "
                    f"{retries + 1} attempts: {e}"
                ) from e
            stats.read_retries += 1
            log.warning("retrying read of %s (%s)", ref, e)
            time.sleep(0.1 * 2**attempt)
        except Exception as e:  # a decode / checksum failure: find the tile
            raise _locate_corruption(arr, ref, grid, req, e) from e
    stats.bytes_read += req.nbytes
    stats.read_requests += 1
    stats.store_gets += req.store_gets
    return data


def check_units_stored(arr, ref: ArrayRef, grid: Grid, rows: Range, cols: Range,
                       missing: set | None = None) -> None:
    """After a read of a complete tilearray output: every unit it covered that
    has its done marker must still be stored (checked after the read, so a
    chunk deleted before or during the read is caught); Zarr would have
    returned the fill value. ``missing``: the keys the read itself found
    missing (:class:`WholeObjectReads`), when it went through Zarr -- then no
    other request is made."""
    units = [(i, j) for i in grid.units_touching(0, rows) for j in grid.units_touching(1, cols)]
    keys = {u: ref._key(arr.metadata.encode_chunk_key(u)) for u in units}
    root = local_root(ref.store)
    if missing is not None:
        present = {u: k not in missing for u, k in keys.items()}
    elif root is not None:
        present = {u: os.path.exists(os.path.join(root, k)) for u, k in keys.items()}
    else:
        import asyncio

        from zarr.core.sync import sync

        async def exists():
            return await asyncio.gather(*(ref.store.exists(k) for k in keys.values()))

        present = dict(zip(keys, sync(exists()), strict=True))
    for (i, j), ok in present.items():
        # a unit without its done marker was not written by the job that made the
        # array complete: a zarr / xarray copy of it, whose all-fill chunks zarr
        # did not store (attributes are copied, markers are not): the fill value;
        # so is a unit marked as the fill value (unit_fill_key), never stored
        if not ok and ref.has_key(unit_done_key(i, j)):
            tile = (i * grid.unit[0] // grid.tile[0], j * grid.unit[1] // grid.tile[1])
            raise CorruptChunkError(
                str(ref), tile,
                f"its chunk file {keys[(i, j)]!r} is missing, but the array is a complete "
                "tilearray output (every unit was written): the data was deleted or lost")


def _locate_corruption(arr, ref, grid: Grid, req: ReadRequest, err: Exception) -> StorageError:
    for ti in grid.tiles_touching(0, req.rows):
        for tj in grid.tiles_touching(1, req.cols):
            t0, t1 = ti * grid.tile[0], min((ti + 1) * grid.tile[0], grid.shape[0])
            u0, u1 = tj * grid.tile[1], min((tj + 1) * grid.tile[1], grid.shape[1])
            try:
                arr[t0:t1, u0:u1]
            except Exception as e:
                return CorruptChunkError(str(ref), (ti, tj), f"{type(e).__name__}: {e}"
                                         + _chunk_file(arr, grid, ti, tj))
    return CorruptChunkError(str(ref), (-1, -1), f"{type(err).__name__}: {err}")


def _chunk_file(arr, grid: Grid, ti: int, tj: int) -> str:
    """`` (chunk file 'c/1/0')``: the store key holding tile ``(ti, tj)`` (its
    shard's, for a sharded array), or "" if zarr cannot name it."""
    try:
        shard = grid.within or grid.unit  # read by inner chunks: still its shard's key
        per = (shard[0] // grid.tile[0], shard[1] // grid.tile[1])
        return f" (chunk file {arr.metadata.encode_chunk_key((ti // per[0], tj // per[1]))!r})"
    except Exception:  # a message detail only
        return ""


def read_region(
    ref: ArrayRef,
    rows: Range,
    cols: Range,
    stats: IOStats | None = None,
    *,
    arr=None,
    max_bytes: int | None = None,
    out: np.ndarray | None = None,
    inner: bool = False,
) -> np.ndarray:
    """Read ``rows x cols`` of the array at ``ref`` through whole-unit requests.

    The units covering the region are fetched whole, once; the requested
    region is returned (a view into them when it is not unit-aligned).
    ``out``, a C-ordered array of the region's shape and the array's dtype,
    is decoded into when the region is unit-aligned and read directly (see
    :mod:`.chunks`); check ``result is out`` -- otherwise it is untouched.
    ``inner``: a sharded array is read by its inner chunks (byte ranges of
    its shards, :meth:`~.geometry.Grid.inner`), as the planner chose for
    shards larger than a task holds.
    """
    stats = stats if stats is not None else IOStats()
    arr = arr if arr is not None else ref.open()
    stored_grid = grid = grid_of(arr)
    if inner and grid.sharded:
        grid = grid.inner()
    reqs = plan_reads(grid, rows, cols, arr.dtype.itemsize, max_bytes)
    if not reqs:
        return np.empty((rows[1] - rows[0], cols[1] - cols[0]), dtype=arr.dtype)
    stored = every_unit_stored(arr)
    direct = (direct_reader(arr, str(ref), ref.store, ref.path)
              if _config.get("storage.direct-reads") and not grid.within else None)
    if len(reqs) > 1 and direct is not None:
        # one pass: the direct reader's buffers are one chunk whatever the size,
        # so the bands (a bound for Zarr's buffers) would only add a copy
        stats.read_requests += len(reqs) - 1  # as planned: counted per band
        reqs = [ReadRequest((reqs[0].rows[0], reqs[-1].rows[1]),
                            (reqs[0].cols[0], reqs[-1].cols[1]),
                            sum(q.store_gets for q in reqs), sum(q.nbytes for q in reqs))]
    # keys Zarr's reads found missing (whole objects only)
    missing = set() if direct is None and not grid.within else None
    if len(reqs) == 1:
        aligned = (reqs[0].rows, reqs[0].cols) == (tuple(rows), tuple(cols))
        data = _read_request(arr, ref, grid, reqs[0], stats, direct,
                             out if aligned else None, missing)
    else:
        r0, c0 = reqs[0].rows[0], reqs[0].cols[0]
        data = np.empty((reqs[-1].rows[1] - r0, reqs[-1].cols[1] - c0), dtype=arr.dtype)
        for req in reqs:
            data[req.rows[0] - r0 : req.rows[1] - r0, req.cols[0] - c0 : req.cols[1] - c0] = \
                _read_request(arr, ref, grid, req, stats, direct, missing=missing)
    if stored:  # by shard: what is stored, and marked done
        check_units_stored(arr, ref, stored_grid, (reqs[0].rows[0], reqs[-1].rows[1]),
                           (reqs[0].cols[0], reqs[-1].cols[1]), missing)
    r0, c0 = reqs[0].rows[0], reqs[0].cols[0]
    if data.shape == (rows[1] - rows[0], cols[1] - cols[0]):
        return data  # unit-aligned: the read itself (``out`` when it was used)
    return data[rows[0] - r0 : rows[1] - r0, cols[0] - c0 : cols[1] - c0]


def open_row_streamer(ref: ArrayRef) -> RowStreamer | None:
    """A :class:`~tilearray.storage.stream.RowStreamer` over the array at
    ``ref`` (a missing chunk of a complete tilearray output is an error), or
    None when its layout or store cannot be streamed."""
    import dataclasses

    arr = ref.open()
    streamer = row_streamer(arr, str(ref), ref.store, ref.path)
    if streamer is not None and every_unit_stored(arr):
        streamer = dataclasses.replace(streamer, missing_is_error=True)
    return streamer


def store_small(ref: ArrayRef, result) -> tuple[None, dict]:
    """Worker task: write a small result ``(value, stats)`` (a reduction's
    vector or scalar) into the existing array at ``ref``; the driver marks it
    complete. Returns ``(None, stats)`` with the write counted."""
    value, st = result
    value = np.asarray(value)
    arr = ref.open(mode="r+")
    if tuple(arr.shape) != value.shape:
        raise StorageError(f"result of shape {value.shape} does not fit {str(ref)!r} of shape "
                           f"{tuple(arr.shape)}")
    try:
        arr[...] = value
        mark_unit_done(ref, 0, 0)  # after the data: the driver checks it before completing
    except OSError as e:
        raise StorageError(f"writing {str(ref)!r} failed: {e}") from e
    st = dict(st)
    st["bytes_written"] = int(st.get("bytes_written", 0)) + value.nbytes
    st["own_bytes_written"] = value.nbytes  # its own write (graphs.matmul.OWN), for /metrics
    st["tasks"] = int(st.get("tasks", 0)) + 1
    return None, st


def read_vector(ref: ArrayRef, shape: tuple):
    """Worker task: a stored 1-D array read whole, as ``(value, stats)`` (one
    request per I/O unit, counted as :func:`plan_vector_read` plans it)."""
    arr = ref.open()
    if arr.ndim != 1 or tuple(arr.shape) != tuple(shape):
        raise StorageError(f"{str(ref)!r} changed: shape {tuple(arr.shape)}, was {tuple(shape)}")
    try:
        value = np.asarray(arr[...])
    except OSError as e:
        raise StorageError(f"reading {str(ref)!r} failed: {e}") from e
    stats = IOStats(bytes_read=value.nbytes, read_requests=1,
                    store_gets=grid_of(arr).n_units).as_dict()
    stats["tasks"] = 1
    return value, stats


def prefetch_region(ref: ArrayRef, rows: Range, cols: Range) -> None:
    """Hint that ``rows x cols`` of the array at ``ref`` will be read soon: its
    chunk files are loaded into the OS page cache in the background (local,
    directly read arrays; a no-op otherwise). Never fails."""
    if not _config.get("storage.direct-reads"):
        return
    try:
        arr = ref.open()
        direct = direct_reader(arr, str(ref), ref.store, ref.path)
        if direct is not None:
            direct.prefetch(rows, cols)
    except Exception:  # a hint only: the read itself reports problems
        log.debug("prefetch hint for %s failed", ref, exc_info=True)


def _each_unit(ref: ArrayRef, grid: Grid, rows: Range, cols: Range, doing: str,
               action) -> None:
    """``action(i, j)`` on each I/O unit of the unit-aligned block ``rows x
    cols``, each checked first as still this job's (one small read). A
    misaligned block is refused (a partial shard write could lose data); an
    OS error becomes a :class:`StorageError` saying what was ``doing``."""
    where = f"{str(ref)!r} rows {rows} cols {cols}"
    if not (grid.is_aligned(0, rows) and grid.is_aligned(1, cols)):
        raise StorageError(f"not {doing} {where}: the block is not aligned to its I/O units "
                           f"{grid.unit} (a partial shard write could lose data)")
    try:
        for i in grid.units_touching(0, rows):
            for j in grid.units_touching(1, cols):
                check_writer(ref, (i, j))
                action(i, j)
    except OutputLockedError:
        raise
    except OSError as e:
        raise StorageError(f"{doing} {where} failed: {e}") from e


def write_fill(ref: ArrayRef, rows: Range, cols: Range, stats: IOStats | None = None,
               *, arr=None) -> IOStats:
    """Mark a unit-aligned block as the fill value (0) without storing it:
    each unit's done marker and chunk are deleted if present, then its fill
    marker is set (:func:`~.ref.unit_fill_key`, format 3). Zarr reads it as
    zeros; so do tilearray's readers, old ones included (a missing chunk is
    lost data only for a unit with its done marker). Idempotent; nothing is
    written but the markers."""
    stats = stats if stats is not None else IOStats()
    arr = arr if arr is not None else ref.open(mode="r+")

    def mark(i: int, j: int) -> None:
        mark_unit_fill(ref, i, j, arr.metadata.encode_chunk_key((i, j)))
        stats.units_written += 1

    _each_unit(ref, grid_of(arr), rows, cols, "marking the fill value in", mark)
    return stats


def write_block(
    ref: ArrayRef, rows: Range, cols: Range, data: np.ndarray, stats: IOStats | None = None,
    *, arr=None,
) -> IOStats:
    """Write a unit-aligned block whole, then mark each of its units done.

    Idempotent: writing the same block twice leaves the same bytes.
    """
    stats = stats if stats is not None else IOStats()
    arr = arr if arr is not None else ref.open(mode="r+")
    arr = arr.with_config({"write_empty_chunks": True})  # every unit stored (format 2)
    grid = grid_of(arr)
    expected = (rows[1] - rows[0], cols[1] - cols[0])
    if data.shape != expected:
        raise StorageError(f"block for {str(ref)!r} has shape {data.shape}, expected {expected}")

    def write(i: int, j: int) -> None:
        # unit by unit: zarr copies and encodes what it is given at once, so
        # this bounds the write's extra memory to about two units
        (r0, r1), (c0, c1) = grid.unit_range(0, i), grid.unit_range(1, j)
        block = data[r0 - rows[0] : r1 - rows[0], c0 - cols[0] : c1 - cols[0]]
        if arr.ndim == 1:  # a vector, written as the column (n, 1)
            arr[r0:r1] = block[:, 0]
        else:
            arr[r0:r1, c0:c1] = block
        mark_unit_done(ref, i, j)
        stats.units_written += 1

    _each_unit(ref, grid, rows, cols, "writing", write)
    stats.bytes_written += data.nbytes
    return stats
