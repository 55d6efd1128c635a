"""Streaming decode of chunks in row slabs: a chunk's rows without ever
holding the chunk, compressed or decoded.

A Gram product ``X.T @ X`` needs one row slab of X at a time (``out += Xs.T
@ Xs`` for each slab ``Xs``), so a worker whose budget cannot hold one
chunk twice (its file and its decoded copy: 1.08 GiB for a 65536 x 1000
float64 chunk) can still compute it slab by slab. :class:`RowStreamer` reads
the chunk files of a row panel through one reused slab buffer per chunk
column: the file is read in pieces of :data:`READ_SIZE` bytes and, for zstd,
decompressed by python-zstandard's ``stream_reader`` into the slab buffer
(``readinto``); a raw chunk is read straight into it.

Supported, and nothing else (:func:`row_streamer` returns None, callers read
whole chunks instead): a local (``LocalStore``), unsharded, 2-D, C-ordered
array of a native-endian bool / integer / float dtype whose chunks are

- Zarr v3: ``bytes`` [+ ``zstd``] [+ ``crc32c``] (the crc32c of the stored
  bytes before it, verified incrementally as they are read);
- Zarr v2: no filters and either no compressor or one ``zstd`` compressor.

A zstd stream decoder holds its frame's window (and a few hundred KiB of
state): the window is known from the array's metadata without reading a
chunk -- the compression level and the chunk size fix it (zstd's parameter
table, ``ZstdCompressionParameters.from_level``; a frame no larger than its
window is one segment, decoded into a window of its size) -- so the planner
charges it (:attr:`~tilearray.storage.Grid.row_slabs`) and the decoder is
told to refuse any frame that needs more (written with other parameters than
the metadata says, or a corrupt frame header): a
:class:`~tilearray.errors.CorruptChunkError` (the chunk does not match its
array's metadata), not a silent overrun. Levels whose window exceeds
:data:`MAX_WINDOW` (``--ultra``) are not streamed.

Semantics are Zarr's and :mod:`.chunks`'s: a missing chunk reads as the fill
value; zarr stores edge chunks full size, and only their valid rows and
columns are yielded; a chunk that fails to decode, has the wrong size or
fails its checksum raises :class:`~tilearray.errors.CorruptChunkError`
naming the array and tile. The checksum covers the whole file, so it is
known only once a chunk's last slab has been decoded: the error is raised
before the generator moves past that chunk (and before it finishes), so a
caller that uses its result only after the generator is exhausted never
uses numbers from a corrupt chunk. An ``OSError`` opening or reading a file
is retried like any store read (``tilearray.storage.read-retries``, with
backoff, counted in ``read_retries``), resuming at the same file offset;
one that persists is a :class:`~tilearray.errors.StorageError` naming the
array and tile. ``tilearray.storage.direct-reads: false`` turns streaming
off (the planner then plans whole-chunk reads).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import zarr
from zarr.codecs import BytesCodec, Crc32cCodec, ZstdCodec
from zarr.storage import LocalStore

from .. import _config
from ..errors import CorruptChunkError, StorageError
from .geometry import Range
from .ref import unit_done_key

log = logging.getLogger(__name__)

READ_SIZE = 131075
"""Compressed bytes read from a chunk file at a time (zstd's recommended
decompression input size), in bytes."""
MAX_WINDOW = 2**23
"""Largest zstd window the streaming decoder accepts, in bytes: 8 MiB, what
zstd levels up to 19 use; arrays whose level needs more (``--ultra``, 20-22)
are not streamed."""
DECODER_STATE = 2**19
"""A zstd stream decoder's memory beyond its window (block buffers and
context), in bytes (measured: 0.49 MiB over the window with
python-zstandard 0.25, ``ZstdDecompressor.memory_size``)."""


SLAB_BYTES = 32 * 2**20
"""Default slab size (all chunk columns together), in bytes: enough rows for
BLAS to run near its peak (4096 rows of 1000 float64), small beside a chunk."""


def slab_memory(chunks: tuple[int, int], itemsize: int, cols: Range, slab_rows: int,
                per_stream: int) -> int:
    """Bytes :meth:`RowStreamer.slabs` holds streaming ``cols`` of an array
    with ``chunks`` in slabs of ``slab_rows`` rows: one slab buffer per chunk
    column (chunk-wide), the joined slab when there are several, and each
    chunk's stream of ``per_stream`` bytes (:func:`stream_memory`)."""
    (ch, cw) = chunks
    n_cols = -(-cols[1] // cw) - cols[0] // cw
    s = max(1, min(slab_rows, ch))
    own = n_cols * s * cw * itemsize
    joined = 0 if n_cols <= 1 else s * (cols[1] - cols[0]) * itemsize
    return own + joined + n_cols * per_stream


def slab_plan(chunks: tuple[int, int], itemsize: int, cols: Range, task_memory: int,
              per_stream: int, target: int = SLAB_BYTES) -> tuple[int, int]:
    """``(slab_rows, bytes held)`` for streaming ``cols`` within a task of
    ``task_memory`` bytes: slabs of about ``min(target, task_memory / 8)``
    bytes, at least one row (pure; the planner's sizing)."""
    (ch, cw) = chunks
    n_cols = max(-(-cols[1] // cw) - cols[0] // cw, 1)
    row = n_cols * cw * itemsize
    rows = max(1, min(ch, max(min(target, task_memory // 8), 1) // max(row, 1)))
    return rows, slab_memory(chunks, itemsize, cols, rows, per_stream)


RAW_STREAM = 4096
"""What streaming a raw (uncompressed) chunk holds besides the slab, in bytes
(a file descriptor and a few small objects; nonzero: "can stream")."""


def stream_memory(window: int | None) -> int:
    """Memory one chunk's stream holds besides the slab buffer, in bytes: its
    zstd ``window`` and decoder state and the compressed pieces read from the
    file, or :data:`RAW_STREAM` for a raw chunk (``window=None``)."""
    if window is None:
        return RAW_STREAM
    return window + DECODER_STATE + 2 * READ_SIZE


def zstd_window(level: int, chunk_bytes: int) -> int | None:
    """The window of a zstd frame of ``chunk_bytes`` compressed at ``level``
    (0: zstd's default, 3), in bytes; None above :data:`MAX_WINDOW` or when
    python-zstandard is missing."""
    try:
        import zstandard
    except ImportError:  # pragma: no cover - a declared dependency
        return None
    params = zstandard.ZstdCompressionParameters.from_level(int(level) or 3,
                                                           source_size=max(chunk_bytes, 1))
    window = min(1 << params.window_log, max(chunk_bytes, 1))
    return window if window <= MAX_WINDOW else None


@dataclass(frozen=True)
class RowStreamer:
    """Yields row slabs of chunk-row-aligned regions of one array (see module doc)."""

    name: str
    """The array, for error messages."""
    root: str
    """Directory the array's chunk keys are relative to."""
    meta: object
    """The array's Zarr metadata (encodes chunk keys)."""
    shape: tuple[int, int]
    chunks: tuple[int, int]
    dtype: np.dtype
    window: int | None
    """Chunks are zstd frames decoded with at most this window, in bytes
    (larger frames are refused); None: stored raw."""
    crc32c: bool
    """Chunks end with a little-endian crc32c of the bytes before it."""
    fill_value: object
    missing_is_error: bool = False
    """A missing chunk file whose done marker is present is lost data (a
    complete tilearray output), not the fill value."""

    @property
    def chunk_bytes(self) -> int:
        """Decoded size of one (full-size) chunk, in bytes."""
        return self.chunks[0] * self.chunks[1] * self.dtype.itemsize

    def memory(self, cols: Range, slab_rows: int) -> int:
        """Bytes :meth:`slabs` holds for ``cols`` in slabs of ``slab_rows``."""
        return slab_memory(self.chunks, self.dtype.itemsize, cols, slab_rows,
                           stream_memory(self.window))

    def path(self, i: int, j: int) -> str:
        return os.path.join(self.root, *self.meta.encode_chunk_key((i, j)).split("/"))

    def slabs(self, rows: Range, cols: Range, slab_rows: int, stats=None) -> Iterator[np.ndarray]:
        """Yield ``rows x cols`` as consecutive row slabs of at most
        ``slab_rows`` rows (a chunk's last slab may be shorter).

        ``rows`` must start on a chunk row edge and end on one or at the
        array's end. Each slab is a view of a buffer reused for the next one:
        use it before asking for the next. ``stats`` (an
        :class:`~tilearray.storage.IOStats`) counts decoded bytes, one
        request per chunk row and one store get per chunk.
        """
        (ch, cw), (m, n) = self.chunks, self.shape
        if rows[0] % ch or (rows[1] % ch and rows[1] != m) or not 0 <= rows[0] <= rows[1] <= m:
            raise ValueError(f"rows {rows} are not aligned to chunk rows of {ch} in {self.name!r}")
        if not 0 <= cols[0] <= cols[1] <= n:
            raise ValueError(f"cols {cols} outside the {n} columns of {self.name!r}")
        s_max = max(1, min(int(slab_rows), ch))
        js = range(cols[0] // cw, -(-cols[1] // cw))
        if rows[0] == rows[1] or not js:
            return
        bufs = [np.empty((s_max, cw), dtype=self.dtype) for _ in js]
        joined = None if len(js) == 1 else np.empty((s_max, cols[1] - cols[0]), self.dtype)
        decoders: dict = {}
        for i in range(rows[0] // ch, -(-rows[1] // ch)):
            valid = min(ch, m - i * ch)
            streams = []
            try:
                for j in js:
                    streams.append(_ChunkStream(self, i, j, decoders, stats))
            except BaseException:
                for stream in streams:
                    stream.close()
                raise
            try:
                for r in range(0, ch, s_max):  # the padding rows of an edge chunk are decoded too
                    s = min(s_max, ch - r)
                    for stream, buf in zip(streams, bufs, strict=True):
                        stream.read_rows(buf[:s])
                    use = min(s, valid - r)
                    if use <= 0:
                        continue
                    if joined is None:
                        j = js[0]
                        out = bufs[0][:use, cols[0] - j * cw : cols[1] - j * cw]
                    else:
                        for j, buf in zip(js, bufs, strict=True):
                            lo, hi = max(cols[0], j * cw), min(cols[1], (j + 1) * cw)
                            joined[:use, lo - cols[0] : hi - cols[0]] = buf[:use, lo - j * cw :
                                                                           hi - j * cw]
                        out = joined[:use]
                    if r + s >= ch:  # the chunk's last slab: verify before handing it over
                        for stream in streams:
                            stream.finish()
                    yield out
                for stream in streams:
                    stream.finish()
            finally:
                for stream in streams:
                    stream.close()
            if stats is not None:
                stats.bytes_read += valid * (cols[1] - cols[0]) * self.dtype.itemsize
                stats.read_requests += 1
                stats.store_gets += len(js)


PERMANENT_OS_ERRORS = (IsADirectoryError, NotADirectoryError, PermissionError)
"""Store errors a retry cannot cure: reported at once, naming the path."""


class _ChunkStream:
    """One chunk file, decoded row by row into caller buffers."""

    def __init__(self, owner: RowStreamer, i: int, j: int, decoders: dict, stats=None):
        self.owner, self.tile, self.stats = owner, (i, j), stats
        self.retries = int(_config.get("storage.read-retries"))
        self.fd = None
        self.reader = None
        self.done = False
        self.decoded = 0
        try:
            self.fd = self._retrying(lambda: os.open(owner.path(i, j), os.O_RDONLY), "open")
        except FileNotFoundError:  # not stored: the fill value, as Zarr reads it
            if owner.missing_is_error and os.path.exists(
                    os.path.join(owner.root, *unit_done_key(i, j).split("/"))):
                self._corrupt("its chunk file is missing, but the array is a complete "
                              "tilearray output (every unit was written): the data was lost")
            return
        try:
            size = os.fstat(self.fd).st_size
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
            self.body = size - 4 if owner.crc32c else size
            if self.body < 0:
                self._corrupt("chunk shorter than its crc32c")
            if owner.window is None and self.body != owner.chunk_bytes:
                self._corrupt(f"{self.body} bytes stored, a chunk has {owner.chunk_bytes}")
            self.consumed = 0
            self.crc = 0
            if owner.window is not None:
                import zstandard

                dec = decoders.get(j)
                if dec is None:
                    dec = decoders[j] = zstandard.ZstdDecompressor(
                        max_window_size=max(owner.window, 1 << 10))  # zstd's least window
                self.reader = dec.stream_reader(self, read_size=READ_SIZE,
                                                read_across_frames=True, closefd=False)
        except BaseException:
            self.close()
            raise

    def _retrying(self, op, what: str):
        """``op()``, retried on a transient ``OSError`` (not a missing file)."""
        retries = self.retries
        for attempt in range(retries + 1):
            try:
                return op()
            except (FileNotFoundError, StorageError):
                raise
            except OSError as e:
                if isinstance(e, PERMANENT_OS_ERRORS):
                    raise StorageError(f"{what} of chunk {self.tile} of {self.owner.name!r} "
                                       f"failed: {e}") from e
                if attempt == retries:
                    raise StorageError(
                        f"{what} of chunk {self.tile} of {self.owner.name!r} failed after "
                        f"{retries + 1} attempts: {e}") from e
                if self.stats is not None:
                    self.stats.read_retries += 1
                log.warning("retrying %s of chunk %s of %s (%s)", what, self.tile,
                            self.owner.name, e)
                time.sleep(0.1 * 2**attempt)

    # -- the compressed side: a file object for zstandard, checksummed as read --
    def read(self, n: int = -1) -> bytes:
        left = self.body - self.consumed
        n = left if n is None or n < 0 else min(n, left)
        if n <= 0:
            return b""
        at = self.consumed  # positioned reads: a retry resumes where it failed
        data = self._retrying(lambda: os.pread(self.fd, n, at), "read")
        self.consumed += len(data)
        if self.owner.crc32c:
            from crc32c import crc32c  # incremental: crc32c(data, value=previous)

            self.crc = crc32c(data, self.crc)
        return data

    def _corrupt(self, reason: str):
        key = self.owner.meta.encode_chunk_key(self.tile)
        raise CorruptChunkError(self.owner.name, self.tile, f"{reason} (chunk file {key!r})")

    def read_rows(self, buf: np.ndarray) -> None:
        """Fill ``buf`` (C-ordered rows of the chunk's width) with the next rows."""
        if self.fd is None:
            buf[...] = self.owner.fill_value
            return
        flat = memoryview(buf.reshape(-1).view(np.uint8))
        got = 0
        try:
            while got < len(flat):
                if self.reader is not None:
                    k = self.reader.readinto(flat[got:])
                else:
                    view, at = flat[got:], self.consumed
                    k = self._retrying(lambda v=view, o=at: os.preadv(self.fd, [v], o), "read")
                    if k and self.owner.crc32c:
                        from crc32c import crc32c

                        self.crc = crc32c(flat[got : got + k], self.crc)
                    self.consumed += k
                if k == 0:
                    break
                got += k
        except StorageError:  # corrupt, or a read that failed for good
            raise
        except Exception as e:
            if "too much memory" in str(e):
                self._corrupt(
                    f"its zstd frame needs a window of {self._frame_window()} bytes, above the "
                    f"{self.owner.window} its metadata's zstd level gives (a corrupt frame "
                    "header, or written with other zstd parameters; streaming decode would "
                    "need more memory than planned)")
            self._corrupt(f"{type(e).__name__}: {e}")
        self.decoded += got
        if got < len(flat):
            self._corrupt(f"decoded to {self.decoded} bytes, a chunk has "
                          f"{self.owner.chunk_bytes} (truncated?)")

    def _frame_window(self) -> str:
        try:
            import zstandard

            return str(zstandard.get_frame_parameters(os.pread(self.fd, 18, 0)).window_size)
        except Exception:
            return "?"

    def finish(self) -> None:
        """After the last row: nothing may follow, and the checksum must hold."""
        if self.fd is None or self.done:
            return
        self.done = True
        if self.reader is not None:
            try:
                extra = self.reader.read(1)
            except Exception as e:
                self._corrupt(f"{type(e).__name__}: {e}")
            if extra:
                self._corrupt(f"decodes to more than the {self.owner.chunk_bytes} bytes of a chunk")
            while self.read(1 << 20):  # bytes past the frame still count in the checksum
                pass
            if self.consumed != self.body:
                self._corrupt(f"{self.body - self.consumed} stored bytes past its zstd frame")
        if self.owner.crc32c:
            at = self.body
            want = self._retrying(lambda: os.pread(self.fd, 4, at), "read")
            if len(want) != 4 or int.from_bytes(want, "little") != self.crc:
                self._corrupt("crc32c checksum mismatch")

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()
            self.reader = None
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def streams_rows(arr: zarr.Array) -> int:
    """Bytes one chunk's stream holds (:func:`stream_memory`) when
    :func:`row_streamer` supports ``arr``, else 0 (no I/O: its metadata and
    store type only)."""
    got = _layout(arr)
    return 0 if got is None else stream_memory(got[0])


def raw_streams(dtype) -> int:
    """:func:`streams_rows` of a local unsharded 2-D array of ``dtype`` stored
    raw (bytes + crc32c, as the planner's temporaries are), known before it
    exists."""
    return stream_memory(None) if _streamable(np.dtype(dtype)) else 0


def _streamable(dtype: np.dtype) -> bool:
    """Direct reads on, and a native-endian bool / integer / float dtype."""
    return bool(_config.get("storage.direct-reads")) and dtype.isnative and \
        dtype.kind in "biuf"


def row_streamer(arr: zarr.Array, name: str, store, path: str) -> RowStreamer | None:
    """A :class:`RowStreamer` for ``arr`` (in ``store`` at ``path``), or None
    when its layout or store is not supported (see module doc)."""
    got = _layout(arr, store)
    if got is None:
        return None
    window, crc = got
    meta = arr.metadata
    dtype = np.dtype(arr.dtype)
    root = os.path.join(str(store.root), *path.split("/")) if path else str(store.root)
    fill = meta.fill_value if meta.fill_value is not None else 0
    return RowStreamer(name, root, meta, tuple(arr.shape), tuple(arr.chunks), dtype, window,
                       crc, dtype.type(fill))


def _layout(arr: zarr.Array, store=None) -> tuple[int | None, bool] | None:
    """``(zstd window or None for raw, crc32c)`` of a supported array, else None."""
    dtype = np.dtype(arr.dtype)
    store = arr.store if store is None else store
    if not _streamable(dtype) or type(store) is not LocalStore or arr.ndim != 2 \
            or arr.shards is not None:
        return None
    meta = arr.metadata
    chunk_bytes = int(np.prod(arr.chunks)) * dtype.itemsize

    def zstd(level):
        window = zstd_window(level, chunk_bytes)
        return None if window is None else (window, crc)

    crc = False
    if meta.zarr_format == 3:
        if getattr(meta, "chunk_key_encoding", None) is None:
            return None
        codecs = list(meta.codecs)
        if not codecs or not isinstance(codecs[0], BytesCodec):
            return None
        endian = codecs[0].endian
        if dtype.itemsize > 1 and endian is not None and endian.value != sys.byteorder:
            return None
        crc = isinstance(codecs[-1], Crc32cCodec)
        middle = codecs[1 : len(codecs) - crc]
        if not middle:
            return None, crc
        if len(middle) == 1 and type(middle[0]) is ZstdCodec:
            return zstd(middle[0].level)
        return None
    if meta.filters or meta.order != "C":
        return None
    comp = meta.compressor
    if comp is None:
        return None, False
    if getattr(comp, "codec_id", None) == "zstd":
        return zstd(getattr(comp, "level", 0))
    return None
