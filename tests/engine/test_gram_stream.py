"""``X.T @ X`` whose chunk does not fit a task decoded whole is planned with X
streamed in row slabs (storage/stream.py) instead of being refused."""

from __future__ import annotations

import dask
import numpy as np
import psutil
import pytest
import zarr
from zarr.codecs import Crc32cCodec, GzipCodec, ZstdCodec

import tilearray as ta
from tilearray.errors import CorruptChunkError, PlanningError
from tilearray.testing import assert_close

TALL = (10**8, 1000)
TALL_CHUNKS = (65536, 1000)  # 0.5 GiB float64 chunks


def _write(path, x, chunks, **kw):
    z = zarr.create_array(str(path), shape=x.shape, chunks=chunks, dtype=x.dtype, **kw)
    z[...] = x
    return ta.open(path)


def test_tall_skinny_gram_plans_at_1gib_from_metadata(tmp_path):
    """Issue 16 point 4: 10^8 x 1000 float64 in 65536 x 1000 chunks plans at
    2 workers x 1 GiB (no chunk is written: planning reads metadata only)."""
    zarr.create_array(str(tmp_path / "t.zarr"), shape=TALL, chunks=TALL_CHUNKS, dtype="f8")
    t = ta.open(tmp_path / "t.zarr")
    budget = ta.Budget.from_config("1GiB", 2, 1)
    plan = (t.T @ t).plan(budget=budget)
    assert "row slabs" in str(plan)
    assert plan.peak_task_memory <= budget.task_memory
    assert plan.bytes_read == TALL[0] * TALL[1] * 8  # X read once
    # with room for a whole chunk, the plan is the one it was (whole chunks in place)
    big = (t.T @ t).plan(budget=ta.Budget.from_config("2GiB", 2, 1))
    assert "row slabs" not in str(big) and big.bytes_read == plan.bytes_read


@pytest.mark.parametrize("dtype", ["float64", "float32", "int32"])
def test_streamed_plan_where_whole_chunks_are_refused(tmp_path, dtype):
    # a ragged last chunk row; repeating values: small files
    x = (np.arange(9000 * 256) % 17 - 8).astype(dtype).reshape(9000, 256)
    xs = _write(tmp_path / "x.zarr", x, (4096, 256))  # 4-8 MiB chunks (zstd windows: 2 MiB)
    xg = _write(tmp_path / "g.zarr", x, (4096, 256), compressors=GzipCodec())  # not streamable
    chunk = 4096 * 256 * x.dtype.itemsize
    budget = ta.Budget(int(1.6 * chunk), 1, 1, baseline=0, fraction=1.0)
    with pytest.raises(PlanningError, match="smallest matmul task needs"):
        (xg.T @ xg).plan(budget=budget)
    plan = (xs.T @ xs).plan(budget=budget)
    assert "row slabs" in str(plan) and plan.peak_task_memory <= budget.task_memory
    assert plan.bytes_read == x.nbytes
    # run the planned graph (no cluster: dask's synchronous scheduler)
    low = (xs.T @ xs)._lower(budget=budget)
    (rows, cols), = low.result.blocks
    (value, stats), = dask.get(low.graph(), list(low.result.keys))
    assert (rows, cols) == ((0, 256), (0, 256)) and stats["bytes_read"] == x.nbytes
    assert_close(value, x.T @ x)


@pytest.mark.timeout(300)
def test_streamed_gram_matches_numpy_within_worker_memory(tmp_path):
    """End to end on 2 x 256 MiB workers (~98 MiB per task): a 48 MiB chunk
    decoded whole (file + decoded copy) does not fit, its slabs do. The
    result equals NumPy's, each worker's RSS stays within its baseline plus
    the planned task, and grows by less than one chunk."""
    rng = np.random.default_rng(5)
    # small integers as floats: exact sums, and zstd keeps the files small on disk
    x = rng.integers(-4, 5, size=(70000, 192)).astype("f8")  # 2 chunk rows + a ragged one
    with ta.Engine(n_workers=2, threads_per_worker=1, memory_per_worker="256MiB",
                   quiet=True) as eng:
        a = _write(tmp_path / "x.zarr", x, (32768, 192))  # v3, bytes + zstd (zarr's default)
        idle = max(eng.client.run(lambda: psutil.Process().memory_info().rss).values())
        expr = a.T @ a
        plan = expr.plan()
        assert "row slabs" in str(plan), str(plan)
        got = expr.to_zarr(tmp_path / "c.zarr")
        st = got.stats
        assert st.bytes_read == plan.bytes_read == x.nbytes
        assert 0 < st.peak_worker_memory <= eng.budget().memory_per_worker
        # the planner's contract: a worker holds its baseline plus the planned task
        # (the first run also loads code, e.g. zstandard: the baseline covers it) ...
        assert st.peak_worker_memory <= eng.budget().baseline + plan.peak_task_memory, \
            (st, plan)
        # ... and never a whole 48 MiB chunk, let alone its file and decoded copies
        assert st.peak_worker_memory - idle < 32768 * 192 * 8, (st, idle, plan)
        assert_close(got.compute(), x.T @ x)


def test_streamed_gram_reports_a_corrupt_chunk(tmp_path):
    """A flipped byte in a crc32c-checked chunk fails the streamed task with
    the array and tile, never a result."""
    x = (np.arange(9000 * 256) % 17 - 8).astype("f8").reshape(9000, 256)
    xs = _write(tmp_path / "x.zarr", x, (4096, 256), compressors=[ZstdCodec(), Crc32cCodec()])
    p = tmp_path / "x.zarr" / "c" / "1" / "0"
    raw = bytearray(p.read_bytes())
    raw[len(raw) // 3] ^= 0x10
    p.write_bytes(bytes(raw))
    budget = ta.Budget(int(1.6 * 4096 * 256 * 8), 1, 1, baseline=0, fraction=1.0)
    low = (xs.T @ xs)._lower(budget=budget)
    assert "row slabs" in str(low)
    with pytest.raises(CorruptChunkError) as e:
        dask.get(low.graph(), list(low.result.keys))
    assert e.value.tile == (1, 0) and "x.zarr" in e.value.path


@pytest.mark.parametrize("dtype", ["f8", "f4"])
def test_gram_of_an_expression_through_a_copy(tmp_path, dtype, monkeypatch):
    """``np.cov(X)`` and ``(X - X.mean(0)).T @ (X - X.mean(0))`` under a budget
    whose product blocks are small beside X's units: the Gram of the centred
    expression is computed from a raw temporary copy of it (a map stage
    before the matmul), reading several times less than the product of the
    expression itself, with NumPy's result and the plan's figures."""
    import tilearray.engine.plan.lower as lowering

    rng = np.random.default_rng(1)
    x = (rng.standard_normal((1203, 805)) + 5).astype(dtype)
    with ta.Engine(n_workers=1, processes=False, quiet=True, memory_per_worker="150MiB"):
        X = _write(tmp_path / "x.zarr", x, (400, 400))
        cases = [(lambda: np.cov(X, rowvar=False), np.cov(x.astype("f8"), rowvar=False)),
                 (lambda: (X - X.mean(0)).T @ (X - X.mean(0)),
                  (x - x.mean(0, dtype="f8")).T.astype("f8") @ (x - x.mean(0, dtype="f8")))]
        for build, want in cases:
            expr = build()
            plan = expr.plan()
            kinds = [s.kind for s in plan.stages]
            with monkeypatch.context() as m:
                m.setattr(lowering.Planner, "_gram_copy", lambda *a: None)  # no copy
                try:
                    direct = build().plan().bytes_read
                except PlanningError:
                    direct = None  # refused without the copy
            if dtype == "f8":  # (float32 halves the units: the product of X - mean fits)
                assert kinds[kinds.index("matmul") - 1] == "map", str(plan)  # the copy
                assert direct is None or plan.bytes_read * 3 < direct, (plan.bytes_read, direct)
            else:
                assert direct is None or plan.bytes_read <= direct
            got = expr.compute()
            assert_close(got, want, scale=np.abs(want).max(), precision=dtype)
            assert expr.stats.bytes_read == plan.bytes_read
            assert expr.stats.tasks == plan.tasks


@pytest.mark.parametrize("task_mib", [5.0, 5.8, 7.0])
def test_gram_copy_units_stay_inside_the_input_tiles(tmp_path, task_mib):
    """``np.cov`` / ``np.corrcoef`` of X 1203 x 805 in 400² tiles, a task
    holding 4-6 tiles: the copy of ``[X.T - X.T[0], 1]`` (1204 columns) is
    cut in units inside one tile of X each -- halving 1204 never lines up
    with 400, and every unit across two tiles decoded both: these budgets
    were refused or read X 136-202 times, the copy's minimum over the
    task. Now a few reads of X; one case computed equals NumPy's."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1203, 805))
    X = _write(tmp_path / "x.zarr", x, (400, 400))
    budget = ta.Budget(int(task_mib * 2**20), 1, 1, baseline=0, fraction=1.0)
    for build in (np.cov, lambda a: np.cov(a, rowvar=False), np.corrcoef):
        plan = build(X).plan(budget=budget)
        assert plan.peak_task_memory <= budget.task_memory
        assert plan.bytes_read <= 12 * x.nbytes, str(plan)
    with ta.Engine(n_workers=1, processes=False, quiet=True, memory_per_worker="148MiB"):
        expr = np.cov(X)
        assert expr.plan().bytes_read <= 12 * x.nbytes
        assert_close(expr.compute(), np.cov(x), scale=np.abs(np.cov(x)).max())
