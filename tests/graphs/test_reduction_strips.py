"""Reduction map kernels: strip-mined partials and reused read buffers give
NumPy's answers (kernels called directly, no cluster)."""

import numpy as np
import pytest
import zarr

from tilearray.graphs import reduction as gred
from tilearray.graphs.spec import Op, Read, Trans
from tilearray.storage import buffers
from tilearray.storage.array import ArrayRef, grid_of
from tilearray.testing import assert_close


def _leaf(path, x, chunks):
    z = zarr.create_array(str(path), shape=x.shape, chunks=chunks, dtype=x.dtype)
    z[...] = x
    ref = ArrayRef.from_location(str(path))
    return Read(ref, grid_of(ref.open()), np.dtype(x.dtype))


@pytest.fixture
def leaves(tmp_path):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((96, 40)) + 3.0
    y = rng.standard_normal((96, 40))
    # b's chunks are not a's: its reads are not aligned to the block and go the other way
    return x, y, _leaf(tmp_path / "a.zarr", x, (32, 20)), _leaf(tmp_path / "b.zarr", y, (30, 40))


def _finish(op, part, dtype):
    return gred.finalize(op, part, dtype)


@pytest.mark.parametrize("strip_rows", [1, 7, 32, 1000])
@pytest.mark.parametrize("op", ["sum", "mean", "var", "std", "min", "argmax"])
@pytest.mark.parametrize("axis", [0, 1, None])
def test_strips_match_numpy(monkeypatch, leaves, strip_rows, op, axis):
    x, y, a, b = leaves
    monkeypatch.setattr(gred, "STRIP_BYTES", strip_rows * 8 * x.shape[1])
    rows, cols = (0, x.shape[0]), (0, x.shape[1])
    cases = [(a, x), (Op("subtract", (a, b)), x - y), (Op("multiply", (a, a)), x * x),
             (Trans(Op("add", (Trans(a), Trans(b)))), x + y)]
    for spec, want_x in cases:
        for _ in range(2):  # the second run reuses the first one's buffers
            part, st = gred.reduce_map(spec, rows, cols, op, axis, x.shape[1])
            got = _finish(op, part, np.dtype("intp") if op == "argmax" else x.dtype)
            want = getattr(np, op)(want_x, axis=axis, keepdims=True)
            if op == "argmax" and axis is None:
                got = got.reshape(())
                want = np.asarray(want).reshape(())
            assert_close(got, want)
            assert st["bytes_read"] >= x.nbytes


def test_shared_pass_reads_each_leaf_once(leaves):
    x, y, a, b = leaves
    rows, cols = (0, 64), (0, 40)
    parts, st = gred.reduce_map_many((Op("subtract", (a, b)), a, a), rows, cols,
                                     ("sum", "var", "max"), (0, 1, None), x.shape[1])
    blk, yb = x[:64], y[:64]
    assert_close(gred.finalize("sum", parts[0], x.dtype), (blk - yb).sum(0, keepdims=True))
    assert_close(gred.finalize("var", parts[1], x.dtype), blk.var(1, keepdims=True))
    assert_close(gred.finalize("max", parts[2], x.dtype), blk.max(keepdims=True))
    assert st["read_requests"] == 2  # a once (shared by three), b once


def test_partials_do_not_alias_pooled_buffers(leaves):
    x, _, a, _ = leaves
    part, _ = gred.reduce_map(a, (0, 32), (0, 40), "sum", 0, 40)
    before = part[0].copy()
    gred.reduce_map(a, (32, 64), (0, 40), "sum", 0, 40)  # reuses the pooled block
    np.testing.assert_array_equal(part[0], before)


def test_buffers_pool_reuses_and_releases():
    buffers.release()
    b1 = buffers.take((8, 8), "f8")
    buffers.give(b1)
    assert buffers.take((8, 8), "f8") is b1
    assert buffers.take((8, 8), "f8") is not b1  # lent out: a new one
    buffers.give(b1[:4])  # a view is never pooled
    s = buffers.scratch(100)
    assert s.nbytes >= 100 and buffers.scratch(50) is s
    buffers.release()
    assert buffers.scratch(50) is not s
