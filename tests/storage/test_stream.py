"""Streaming decode in row slabs (storage/stream.py) yields exactly what Zarr
decodes, refuses layouts it does not support, and reports corrupt chunks."""

from __future__ import annotations

import os
import tempfile

import numcodecs
import numpy as np
import pytest
import zarr
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from zarr.codecs import BloscCodec, Crc32cCodec, GzipCodec, ZstdCodec

from tilearray.errors import CorruptChunkError, StorageError
from tilearray.storage import IOStats, grid_of
from tilearray.storage.stream import (
    DECODER_STATE,
    MAX_WINDOW,
    READ_SIZE,
    row_streamer,
    slab_plan,
    stream_memory,
    zstd_window,
)

LAYOUTS = {
    "v3-zstd-default": {},
    "v3-zstd-crc32c": {"compressors": [ZstdCodec(level=1), Crc32cCodec()]},
    "v3-zstd-checksum": {"compressors": ZstdCodec(level=5, checksum=True)},
    "v3-raw": {"compressors": None},
    "v3-raw-crc32c": {"compressors": Crc32cCodec()},
    "v2-zstd": {"zarr_format": 2, "compressors": numcodecs.Zstd(level=3)},
    "v2-raw": {"zarr_format": 2, "compressors": None},
}
UNSUPPORTED = {
    "v3-blosc": {"compressors": BloscCodec()},
    "v3-gzip": {"compressors": GzipCodec()},
    "v3-sharded": {"shards": (600, 64)},
    "v3-big-endian": {"serializer": {"name": "bytes", "configuration": {"endian": "big"}}},
    "v2-zlib": {"zarr_format": 2, "compressors": numcodecs.Zlib()},
    "v2-filters": {"zarr_format": 2, "filters": [numcodecs.Delta(dtype="f8")]},
    "v2-F-order": {"zarr_format": 2, "order": "F"},
}


def _make(path, dtype="f8", chunks=(300, 32), shape=(1000, 70), **kw):
    rng = np.random.default_rng(11)
    x = (rng.standard_normal(shape) * 50).astype(dtype)
    z = zarr.create_array(str(path), shape=shape, chunks=chunks, dtype=dtype, **kw)
    z[...] = x
    return zarr.open_array(str(path), mode="r"), x


def _streamed(r, rows, cols, slab_rows, stats=None):
    slabs = [s.copy() for s in r.slabs(rows, cols, slab_rows, stats)]
    assert all(len(s) <= slab_rows for s in slabs)
    return np.concatenate(slabs) if slabs else np.empty((0, cols[1] - cols[0]), r.dtype)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("dtype", ["float64", "float32", "int32"])
def test_slabs_equal_zarr(tmp_path, layout, dtype):
    z, x = _make(tmp_path / "a.zarr", dtype, **LAYOUTS[layout])
    assert grid_of(z).row_slabs > 0
    r = row_streamer(z, "a", z.store, "")
    assert r is not None
    want = z[...]
    np.testing.assert_array_equal(want, x)
    # slab sizes that do not divide the chunk (300 rows), ragged last chunk row (100 rows)
    for rows, cols, slab in [((0, 1000), (0, 70), 77), ((300, 1000), (5, 70), 300),
                             ((900, 1000), (32, 64), 1), ((0, 600), (40, 41), 1000),
                             ((600, 1000), (0, 32), 128)]:
        stats = IOStats()
        got = _streamed(r, rows, cols, slab, stats)
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want[slice(*rows), slice(*cols)])
        assert stats.bytes_read == got.nbytes


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(m=st.integers(1, 300), n=st.integers(1, 40), ch=st.integers(1, 120), cw=st.integers(1, 40),
       slab=st.integers(1, 130), layout=st.sampled_from(sorted(LAYOUTS)),
       dtype=st.sampled_from(["float64", "float32", "int32"]), data=st.data())
def test_slabs_equal_zarr_property(m, n, ch, cw, slab, layout, dtype, data):
    ch, cw = min(ch, m), min(cw, n)
    i0 = data.draw(st.integers(0, (m - 1) // ch), label="first chunk row")
    i1 = data.draw(st.integers(i0, -(-m // ch)), label="end chunk row")
    c0 = data.draw(st.integers(0, n - 1), label="c0")
    c1 = data.draw(st.integers(c0 + 1, n), label="c1")
    rows = (i0 * ch, min(i1 * ch, m))
    with tempfile.TemporaryDirectory() as d:
        z, _ = _make(os.path.join(d, "a.zarr"), dtype, (ch, cw), (m, n), **LAYOUTS[layout])
        r = row_streamer(z, "a", z.store, "")
        np.testing.assert_array_equal(_streamed(r, rows, (c0, c1), slab),
                                      z[rows[0] : rows[1], c0:c1])


@pytest.mark.parametrize("layout", sorted(UNSUPPORTED))
def test_unsupported_layouts_are_refused(tmp_path, layout):
    z, _ = _make(tmp_path / "a.zarr", **UNSUPPORTED[layout])
    assert row_streamer(z, "a", z.store, "") is None
    assert grid_of(z).row_slabs == 0


def test_other_stores_are_refused():
    z = zarr.create_array(zarr.storage.MemoryStore(), shape=(10, 10), chunks=(5, 5), dtype="f8")
    assert row_streamer(z, "a", z.store, "") is None and grid_of(z).row_slabs == 0


def test_ultra_levels_are_not_streamed():
    assert zstd_window(22, 2**30) is None  # a 128 MiB window
    assert zstd_window(3, 2**30) == 2**21
    assert zstd_window(3, 1000) == 1000  # one segment: a window of the frame's size
    assert stream_memory(2**21) == 2**21 + DECODER_STATE + 2 * READ_SIZE


def test_missing_chunk_is_the_fill_value(tmp_path):
    z, x = _make(tmp_path / "a.zarr", fill_value=-3.0)
    os.remove(tmp_path / "a.zarr" / "c" / "1" / "1")
    r = row_streamer(z, "a", z.store, "")
    want = x.copy()
    want[300:600, 32:64] = -3.0
    np.testing.assert_array_equal(_streamed(r, (0, 1000), (0, 70), 64), want)


def _chunk(tmp_path, key="c/1/0"):
    return tmp_path / "a.zarr" / key


@pytest.mark.parametrize("layout", ["v3-zstd-crc32c", "v3-raw-crc32c", "v3-zstd-checksum"])
def test_flipped_byte_is_corrupt_chunk(tmp_path, layout):
    z, _ = _make(tmp_path / "a.zarr", **LAYOUTS[layout])
    key = "1.0" if layout.startswith("v2") else "c/1/0"
    p = _chunk(tmp_path, key)
    raw = bytearray(p.read_bytes())
    raw[len(raw) // 2] ^= 0x5A
    p.write_bytes(bytes(raw))
    r = row_streamer(z, "a", z.store, "")
    with pytest.raises(CorruptChunkError) as e:
        _streamed(r, (0, 1000), (0, 70), 50)
    assert e.value.tile == (1, 0) and e.value.path == "a"
    assert f"chunk file {key!r}" in str(e.value)


@pytest.mark.parametrize("layout", ["v3-zstd-default", "v2-zstd"])
@pytest.mark.parametrize("where", [0, 7, "half"])
def test_flipped_byte_without_checksum_reads_as_zarr_does(tmp_path, layout, where):
    """Without a checksum a flipped byte may decode to other numbers (Zarr
    returns them too): the stream raises where Zarr's decode fails, naming
    the tile, and otherwise yields what Zarr yields."""
    z, _ = _make(tmp_path / "a.zarr", **LAYOUTS[layout])
    p = _chunk(tmp_path, "1.0" if layout.startswith("v2") else "c/1/0")
    raw = bytearray(p.read_bytes())
    raw[len(raw) // 2 if where == "half" else where] ^= 0x5A
    p.write_bytes(bytes(raw))
    r = row_streamer(z, "a", z.store, "")
    try:
        want = zarr.open_array(str(tmp_path / "a.zarr"), mode="r")[300:600, 0:32]
    except Exception:
        with pytest.raises(CorruptChunkError) as e:
            _streamed(r, (300, 600), (0, 32), 50)
        assert e.value.tile == (1, 0)
    else:
        np.testing.assert_array_equal(_streamed(r, (300, 600), (0, 32), 50), want)


@pytest.mark.parametrize("layout", ["v3-zstd-default", "v3-zstd-crc32c", "v3-raw", "v2-zstd",
                                    "v2-raw"])
@pytest.mark.parametrize("cut", [1, 5, "half"])
def test_truncated_chunk_is_corrupt_chunk(tmp_path, layout, cut):
    z, _ = _make(tmp_path / "a.zarr", **LAYOUTS[layout])
    key = "2.1" if layout.startswith("v2") else "c/2/1"
    p = _chunk(tmp_path, key)
    raw = p.read_bytes()
    p.write_bytes(raw[: len(raw) // 2 if cut == "half" else len(raw) - cut])
    r = row_streamer(z, "a", z.store, "")
    with pytest.raises(CorruptChunkError) as e:
        _streamed(r, (600, 900), (0, 70), 64)
    assert e.value.tile == (2, 1)


@pytest.mark.parametrize("layout", ["v3-zstd-default", "v3-raw"])
def test_trailing_bytes_are_corrupt_chunk(tmp_path, layout):
    z, _ = _make(tmp_path / "a.zarr", **LAYOUTS[layout])
    p = _chunk(tmp_path, "c/0/0")
    p.write_bytes(p.read_bytes() + b"\0\1\2")
    r = row_streamer(z, "a", z.store, "")
    with pytest.raises(CorruptChunkError) as e:
        _streamed(r, (0, 300), (0, 32), 64)
    assert e.value.tile == (0, 0)


def test_checksum_is_verified_before_the_last_slab(tmp_path):
    """A crc32c mismatch (the frame still decodes) is raised before the
    chunk's last slab is handed over."""
    z, _ = _make(tmp_path / "a.zarr", **LAYOUTS["v3-raw-crc32c"])
    p = _chunk(tmp_path, "c/0/0")
    raw = bytearray(p.read_bytes())
    raw[-1] ^= 1  # the stored checksum itself
    p.write_bytes(bytes(raw))
    r = row_streamer(z, "a", z.store, "")
    seen = 0
    with pytest.raises(CorruptChunkError, match="crc32c"):
        for s in r.slabs((0, 300), (0, 32), 100):
            seen += len(s)
    assert seen == 200  # two of three slabs


def test_frame_with_a_larger_window_than_planned_is_refused(tmp_path):
    """A chunk written with other zstd parameters than the metadata's level
    (here a 2 MiB window where level 1 gives 512 KiB) would need more memory
    than planned: refused, not decoded."""
    shape, chunks = (2048, 256), (2048, 256)  # one 4 MiB chunk
    x = np.arange(np.prod(shape), dtype="f8").reshape(shape)
    z = zarr.create_array(str(tmp_path / "a.zarr"), shape=shape, chunks=chunks, dtype="f8",
                          compressors=ZstdCodec(level=1))
    z[...] = x
    params = zstandard.ZstdCompressionParameters.from_level(1, window_log=21)
    frame = zstandard.ZstdCompressor(compression_params=params).compress(x.tobytes())
    assert zstandard.get_frame_parameters(frame).window_size == 2**21
    _chunk(tmp_path, "c/0/0").write_bytes(frame)
    r = row_streamer(z, "a", z.store, "")
    assert r.window == 2**19 <= MAX_WINDOW
    with pytest.raises(CorruptChunkError, match="window of 2097152 bytes") as e:
        _streamed(r, (0, 2048), (0, 256), 256)
    assert e.value.tile == (0, 0)


def test_slab_plan_sizes():
    rows, mem = slab_plan((65536, 1000), 8, (0, 1000), 750 * 2**20, stream_memory(2**21))
    assert rows == 4194 and mem == rows * 8000 + stream_memory(2**21)
    rows, mem = slab_plan((100, 10), 8, (0, 10), 2**30, 4096)
    assert rows == 100  # never more than a chunk
    # several chunk columns: one buffer each plus the joined slab
    rows, mem = slab_plan((64, 10), 8, (5, 25), 8 * 64 * 30 * 8, 4096)
    assert rows == 64 and mem == 3 * 64 * 10 * 8 + 64 * 20 * 8 + 3 * 4096


class _Flaky:
    """Makes the first ``n`` calls of ``os.<name>`` raise EIO."""

    def __init__(self, monkeypatch, name, n):
        self.real, self.left = getattr(os, name), n
        monkeypatch.setattr(os, name, self)

    def __call__(self, *args, **kw):
        if self.left:
            self.left -= 1
            raise OSError(5, "Input/output error (injected)")
        return self.real(*args, **kw)


_READ_CALLS = [  # which os calls each layout reads through
    (layout, call)
    for layout in ("v3-zstd-crc32c", "v3-raw-crc32c", "v2-zstd", "v2-raw")
    for call in ("open",
                 *(("preadv",) if "raw" in layout else ()),  # raw data
                 *(("pread",) if "zstd" in layout or "crc32c" in layout else ()))  # zstd / crc
]


@pytest.mark.parametrize(("layout", "call"), _READ_CALLS)
def test_transient_os_errors_are_retried_where_they_failed(tmp_path, monkeypatch, layout, call):
    z, x = _make(tmp_path / "a.zarr", **LAYOUTS[layout])
    r = row_streamer(z, "a", z.store, "")
    stats = IOStats()
    flaky = _Flaky(monkeypatch, call, 2)
    np.testing.assert_array_equal(_streamed(r, (0, 1000), (0, 70), 64, stats), x)
    assert flaky.left == 0 and stats.read_retries == 2


def test_persistent_os_error_is_a_storage_error_naming_the_tile(tmp_path, monkeypatch):
    from tilearray.errors import StorageError

    z, _ = _make(tmp_path / "a.zarr", **LAYOUTS["v3-zstd-crc32c"])
    r = row_streamer(z, "a", z.store, "")
    _Flaky(monkeypatch, "pread", 10**6)
    with pytest.raises(StorageError, match=r"read of chunk \(0, 0\) of 'a' failed after") as e:
        _streamed(r, (0, 1000), (0, 70), 64)
    assert not isinstance(e.value, CorruptChunkError)


def test_direct_reads_off_turns_streaming_off(tmp_path):
    import dask

    z, _ = _make(tmp_path / "a.zarr")
    assert row_streamer(z, "a", z.store, "") is not None and grid_of(z).row_slabs > 0
    with dask.config.set({"tilearray.storage.direct-reads": False}):
        assert row_streamer(z, "a", z.store, "") is None and grid_of(z).row_slabs == 0


def _copy_with_zarr(src_path, dst_path):
    """Copy an array as zarr users do: data and attributes (tilearray's
    ``complete`` bookkeeping included), all-fill chunks not stored (zarr's
    default), no done markers."""
    src = zarr.open_array(str(src_path), mode="r")
    dst = zarr.create_array(str(dst_path), shape=src.shape, chunks=src.chunks, dtype=src.dtype,
                            compressors=src.compressors, fill_value=0,
                            attributes=dict(src.attrs))
    dst[...] = src[...]
    return dst


def test_zarr_copy_of_an_output_streams_its_unstored_chunks_as_fill(tmp_path):
    """A zarr copy of a complete tilearray output keeps its attributes but not
    its done markers, and zarr skips its all-zero chunks: those read as the
    fill value, not as lost data. A chunk deleted from the output itself
    (its done marker present) still is."""
    import tilearray as ta
    from tilearray.storage import ArrayRef
    from tilearray.storage.io import open_row_streamer

    x = np.random.default_rng(1).standard_normal((300, 40))
    x[100:200] = 0.0  # chunk row 1 all zeros
    import dask

    with dask.config.set({"tilearray.storage.compressor": "zstd"}):  # streamable
        ta.from_numpy(x, tmp_path / "out.zarr", tile=(100, 40))
    copy = _copy_with_zarr(tmp_path / "out.zarr", tmp_path / "copy.zarr")
    assert not os.path.exists(tmp_path / "copy.zarr" / "c" / "1" / "0")
    assert copy.attrs["tilearray"]["complete"] is True
    r = open_row_streamer(ArrayRef.from_location(tmp_path / "copy.zarr"))
    assert r is not None and r.missing_is_error
    np.testing.assert_array_equal(_streamed(r, (0, 300), (0, 40), 64), x)

    os.remove(tmp_path / "out.zarr" / "c" / "1" / "0")
    r = open_row_streamer(ArrayRef.from_location(tmp_path / "out.zarr"))
    with pytest.raises(CorruptChunkError, match=r"\(1, 0\).*missing"):
        _streamed(r, (0, 300), (0, 40), 64)


def test_units_marked_as_the_fill_value_stream_as_zeros(tmp_path):
    """Format 3: a unit whose done marker says it is the fill value has no
    chunk (write_fill deletes one a job left) and streams as zeros; the other
    units' lost chunks are still lost data."""
    import dask

    import tilearray as ta
    from tilearray.storage import ArrayRef, done_units, write_fill
    from tilearray.storage.io import open_row_streamer
    from tilearray.storage.ref import unit_done_key, unit_fill_key

    x = np.random.default_rng(2).standard_normal((300, 40))
    with dask.config.set({"tilearray.storage.compressor": "zstd"}):  # streamable
        ta.from_numpy(x, tmp_path / "out.zarr", tile=(100, 40))
    ref = ArrayRef.from_location(tmp_path / "out.zarr")
    write_fill(ref, (100, 200), (0, 40))
    write_fill(ref, (100, 200), (0, 40))  # idempotent
    assert not os.path.exists(tmp_path / "out.zarr" / "c" / "1" / "0")
    # no done marker, a fill marker: readers before format 3 see Zarr's fill value
    assert not ref.has_key(unit_done_key(1, 0)) and ref.has_key(unit_fill_key(1, 0))
    assert (1, 0) in done_units(ref)
    x[100:200] = 0.0
    r = open_row_streamer(ref)
    assert r is not None and r.missing_is_error
    np.testing.assert_array_equal(_streamed(r, (0, 300), (0, 40), 64), x)
    np.testing.assert_array_equal(np.asarray(ta.open(tmp_path / "out.zarr")), x)
    with pytest.raises(StorageError, match="not aligned"):
        write_fill(ref, (50, 100), (0, 40))
    os.remove(tmp_path / "out.zarr" / "c" / "2" / "0")
    with pytest.raises(CorruptChunkError, match=r"\(2, 0\).*missing"):
        _streamed(open_row_streamer(ref), (0, 300), (0, 40), 64)
