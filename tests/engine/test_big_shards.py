"""Sharded arrays whose shards are larger than a task holds (as plain zarr
writes them: shards of tens or hundreds of MiB, small inner chunks): read by
their inner chunks, by byte range through the shard's index, where a whole
shard does not fit or would read twice the bytes; by whole shards otherwise.
Every result is compared with NumPy on the same data."""

from __future__ import annotations

import numpy as np
import pytest
import zarr
from zarr.codecs import Crc32cCodec

import tilearray as ta
from tilearray.storage import read_region
from tilearray.testing import assert_close

SMALL = ta.Budget.from_config("220MiB", 2, 1)  # 67 MiB a task: one shard is 92 MiB
LARGE = ta.Budget.from_config("2GiB", 2, 1)


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """20003 x 601 float64 (92 MiB), chunks 1000 x 200, shards 20000 x 600:
    ragged edge shards and chunks."""
    d = tmp_path_factory.mktemp("shards")
    x = np.random.default_rng(7).standard_normal((20003, 601))
    z = zarr.create_array(d / "x.zarr", shape=x.shape, chunks=(1000, 200), shards=(20000, 600),
                          dtype="f8")
    z[...] = x
    return x, ta.open(d / "x.zarr")


def test_plans_fit_by_inner_chunks_and_read_each_once(sharded):
    x, a = sharded
    v = np.linspace(-1, 1, x.shape[1])
    for expr in [a.sum(axis=0), a @ v, a.T @ a, a * 2, np.sort(a[:, :5], axis=0)]:
        plan = expr.plan(budget=SMALL)  # a whole shard does not fit: refused before
        assert plan.peak_task_memory <= SMALL.task_memory, str(expr)
    assert a.sum(axis=0).plan(budget=SMALL).bytes_read == x.nbytes
    # a few rows: one band of inner chunks, not the shard (1000 x 601 of 20003 x 601)
    rows = a[5:7].plan(budget=LARGE)
    assert rows.bytes_read == 1000 * 601 * 8, rows
    # a whole pass where shards fit: whole shards, one request each (the I/O unit)
    whole = a.sum(axis=0).plan(budget=LARGE)
    assert whole.bytes_read == x.nbytes and whole.reads <= 4, whole


def test_stored_factor_units_of_a_sharded_input(tmp_path):
    """``cholesky(A).to_zarr()`` without a tile picks its square unit as
    the run reads A (by inner chunks where shards do not fit): not the tiny
    units a whole-shard read would leave room for."""
    zarr.create_array(tmp_path / "a.zarr", shape=(16384, 16384), chunks=(512, 512),
                      shards=(4096, 4096), dtype="f8")  # metadata only
    a = ta.open(tmp_path / "a.zarr")
    stage = ta.linalg.cholesky(a).plan(tmp_path / "l.zarr", budget=SMALL).stages[0]
    assert "by 1024 x 1024 tiles" in stage.description, stage.description
    assert stage.peak_task_memory <= SMALL.task_memory


def test_results_match_numpy(sharded, tmp_path):
    x, a = sharded
    v = np.linspace(-1, 1, x.shape[1])
    with ta.Engine(n_workers=1, threads_per_worker=1, memory_per_worker="220MiB",
                   processes=False, quiet=True):
        rows = a[5:7]
        for expr, want in [(rows, x[5:7]), (a.sum(axis=0), x.sum(axis=0)), (a @ v, x @ v),
                           (a.T @ a, x.T @ x), (a[::7, 3:].max(axis=1), x[::7, 3:].max(axis=1))]:
            plan = expr.plan()
            assert_close(expr.compute(), want, err_msg=str(expr))
            assert expr.stats.bytes_read == plan.bytes_read, str(expr)
            assert expr.stats.store_gets == plan.store_gets, str(expr)
        assert rows.stats.bytes_read == 1000 * 601 * 8  # one band of inner chunks
        out = (a * 2 - 1).to_zarr(tmp_path / "y.zarr")
        assert_close(np.asarray(out), x * 2 - 1)


def test_a_corrupt_inner_chunk_is_named(tmp_path, rng):
    x = rng.standard_normal((4000, 300))
    z = zarr.create_array(tmp_path / "s.zarr", shape=x.shape, chunks=(500, 100),
                          shards=(4000, 300), dtype="f8", compressors=Crc32cCodec())
    z[...] = x  # each inner chunk checksummed (zstd alone would not see zeroed bytes)
    shard = tmp_path / "s.zarr" / "c" / "0" / "0"
    data = bytearray(shard.read_bytes())
    data[100:140] = b"\x00" * 40  # inside the first inner chunk
    shard.write_bytes(bytes(data))
    ref = ta.open(tmp_path / "s.zarr")._node.ref
    with pytest.raises(ta.CorruptChunkError) as e:
        read_region(ref, (0, 2), (0, 300), inner=True)
    assert e.value.tile == (0, 0) and "chunk file 'c/0/0'" in str(e.value), str(e.value)
    assert_close(read_region(ref, (500, 502), (0, 300), inner=True), x[500:502])


def test_median_of_narrow_bands_reads_shards_by_inner_chunk(tmp_path):
    """A median along the rows of 40000 x 400 in 20000 x 400 shards of 1000 x
    100 chunks at 256 MiB a worker: bands of lines narrower than a shard are
    read by inner chunk, the array about once (by whole shards, through a
    copy, it read 854 MiB: 7x); the same as unsharded."""
    budget = ta.Budget.from_config("256MiB", 2, 1)
    plans = {}
    for name, shards in (("sharded", (20000, 400)), ("plain", None)):
        zarr.create_array(str(tmp_path / f"{name}.zarr"), shape=(40000, 400), chunks=(1000, 100),
                          shards=shards, dtype="f8")
        plans[name] = np.median(ta.open(tmp_path / f"{name}.zarr"), axis=0).plan(budget=budget)
    assert plans["sharded"].bytes_read == plans["plain"].bytes_read == 40000 * 400 * 8
