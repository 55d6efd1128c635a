import numpy as np
import pytest
import zarr
from helpers import rand

import tilearray as ta
from tilearray.testing import assert_close


def _arr(tmp_path, name, x, tile, shard=None, v2=False):
    if v2:
        z = zarr.create_array(tmp_path / name, shape=x.shape, chunks=tile, dtype=x.dtype,
                              zarr_format=2)
        z[:] = x
        return ta.open(tmp_path / name)
    return ta.from_numpy(x, tmp_path / name, tile=tile, shard=shard)


CASES = [
    # m, k, n, tile_a, tile_b, shard_a, shard_b
    (64, 64, 64, (16, 16), (16, 16), None, None),          # square, aligned
    (70, 45, 33, (16, 16), (16, 16), None, None),          # ragged everywhere
    (50, 90, 40, (20, 30), (25, 16), None, None),          # K tilings misaligned
    (1, 37, 9, (8, 8), (8, 8), None, None),                # one row
    (37, 20, 1, (8, 8), (8, 8), None, None),               # mat-vec (one column)
    (60, 48, 52, (8, 8), (8, 8), (16, 24), (24, 16)),      # sharded inputs
]


@pytest.mark.parametrize("dtype", ["float64", "float32", "int64"])
@pytest.mark.parametrize("case", CASES)
def test_matmul_matches_numpy(engine, tmp_path, rng, case, dtype):
    m, k, n, ta_, tb_, sa, sb = case
    x, y = rand(rng, (m, k), dtype), rand(rng, (k, n), dtype)
    a = _arr(tmp_path, "a.zarr", x, ta_, sa)
    b = _arr(tmp_path, "b.zarr", y, tb_, sb)
    expr = a @ b
    assert expr.shape == (m, n) and expr.dtype == (x @ y).dtype
    got = expr.compute()
    assert_close(got, x @ y)
    c = expr.to_zarr(tmp_path / "c.zarr", tile=(16, 16), shard=(32, 32))
    assert_close(c.compute(), x @ y)
    assert c.stats.tasks >= 1 and c.stats.bytes_read > 0


def test_mixed_dtypes_promote(engine, tmp_path, rng):
    x, y = rand(rng, (30, 20), "float32"), rand(rng, (20, 10), "int32")
    a, b = _arr(tmp_path, "a.zarr", x, (8, 8)), _arr(tmp_path, "b.zarr", y, (8, 8))
    expr = a @ b
    assert expr.dtype == np.float64
    assert_close(expr.compute(), x.astype("f8") @ y)


def test_transposed_gram_and_v2_input(engine, tmp_path, rng):
    x = rng.standard_normal((300, 24))
    a = _arr(tmp_path, "a.zarr", x, (50, 10), v2=True)
    assert_close((a.T @ a).compute(), x.T @ x)
    assert_close((a @ a.T).compute(), x @ x.T)


def test_k_split_path(engine, tmp_path, rng):
    """Tall-skinny X.T @ X has one output block: K is split and tree-summed."""
    x = rng.standard_normal((4000, 16))
    a = _arr(tmp_path, "a.zarr", x, (250, 16))
    expr = a.T @ a
    plan = expr.plan(budget=ta.Budget(2**30, n_workers=2, threads_per_worker=2))
    assert "K split" in str(plan)
    with ta.Engine(n_workers=1, threads_per_worker=4, memory_per_worker="2GiB",
                   processes=False, quiet=True):
        c = expr.to_zarr(tmp_path / "g.zarr")
        assert_close(c.compute(), x.T @ x)
        assert_close(expr.compute(), x.T @ x)


def test_shape_mismatch_names_both_shapes(tmp_path, rng):
    a = _arr(tmp_path, "a.zarr", rng.standard_normal((100, 50)), (10, 10))
    with pytest.raises(ta.PlanningError, match=r"\(100, 50\) and \(100, 50\)"):
        a @ a


def test_matmul_rejects_non_arrays(tmp_path, rng):
    """A NumPy matrix is an in-memory operand now (issue 30), a nested list
    too (as NumPy); what is neither a TiledArray nor array-like is refused."""
    x = rng.standard_normal((10, 10))
    a = _arr(tmp_path, "a.zarr", x, (5, 5))
    with pytest.raises(TypeError, match="TiledArrays or NumPy arrays"):
        a @ "x"
    np.testing.assert_allclose((a @ ([[1.0] * 10] * 10)).compute(), x @ np.ones((10, 10)))
    plan = (a @ np.ones((10, 10))).plan(budget=ta.Budget("64MiB", 1, 1, baseline=0))
    assert plan.bytes_read == 800


@pytest.mark.parametrize("shape,tile,dtype", [
    ((1500, 1300, 1100), (256, 256), "float64"),   # ragged: no tile divides a side
    ((1000, 1024, 900), (200, 128), "float32"),
])
def test_streamed_b_under_a_small_budget(tmp_path, rng, shape, tile, dtype):
    """Under a tight budget the planner streams B band by band (larger blocks,
    fewer bytes read than holding both panels); inputs written by plain Zarr
    (read directly) and by tilearray give NumPy's product."""
    m, k, n = shape
    x, y = rand(rng, (m, k), dtype), rand(rng, (k, n), dtype)
    za = zarr.create_array(tmp_path / "a.zarr", shape=x.shape, chunks=tile, dtype=dtype)
    za[...] = x
    a = ta.open(tmp_path / "a.zarr")
    with ta.Engine(n_workers=1, memory_per_worker="150MiB", processes=False, quiet=True) as e:
        b = ta.from_numpy(y, tmp_path / "b.zarr", tile=tile[::-1])
        expr = a @ b
        plan = expr.plan(tmp_path / "c.zarr")
        assert "B streamed" in str(plan), str(plan)
        assert plan.peak_task_memory <= e.budget().task_memory
        c = expr.to_zarr(tmp_path / "c.zarr")
        stats = c.stats
        assert_close(c.compute(), x @ y)
        assert stats.bytes_read == plan.bytes_read and stats.tasks == plan.tasks


def test_1gib_workers_stream_8192_blocks_at_n16384(tmp_path):
    """The n=16384 float64 job of the benchmark, planned on metadata only: at
    2 x 1 GiB it reads 8 GiB in 4 tasks of 8192^2 (holding both panels allowed
    only 4096 x 8192 blocks and 12 GiB)."""
    for name in "ab":
        zarr.create_array(tmp_path / f"{name}.zarr", shape=(16384, 16384), chunks=(2048, 2048),
                          dtype="f8")
    expr = ta.open(tmp_path / "a.zarr") @ ta.open(tmp_path / "b.zarr")
    plan = expr.plan(tmp_path / "c.zarr", budget=ta.Budget.from_config("1GiB", 2, 1))
    assert plan.tasks == 4 and plan.bytes_read == 8 * 2**30
    assert "8192x8192" in str(plan) and "B streamed" in str(plan)


@pytest.mark.parametrize("dtype", ["float64", "float32", "int32"])
@pytest.mark.parametrize("memory", ["150MiB", "1GiB"])
def test_same_operand_products_are_symmetric(tmp_path, rng, dtype, memory):
    """X.T @ X and X @ X.T read each panel of X once on diagonal blocks and
    update them symmetrically (syrk); written to Zarr, each off-diagonal pair
    of blocks is computed once: the stored result equals NumPy's, is exactly
    symmetric, and reads / writes what its plan says."""
    x = rand(rng, (1300, 700), dtype)
    with ta.Engine(n_workers=1, memory_per_worker=memory, processes=False, quiet=True):
        a = ta.from_numpy(x, tmp_path / "x.zarr", tile=(256, 192))
        for expr, want in ((a.T @ a, x.T @ x), (a @ a.T, x @ x.T)):
            assert_close(expr.compute(), want)
            plan = expr.plan(tmp_path / "g.zarr")
            c = expr.to_zarr(tmp_path / "g.zarr", overwrite=True)
            stats, got = c.stats, c.compute()
            assert_close(got, want)
            np.testing.assert_array_equal(got, got.T)
            assert stats.bytes_read == plan.bytes_read and stats.tasks == plan.tasks
            assert stats.bytes_written == plan.bytes_written == got.nbytes


def test_gram_of_one_block_reads_x_once(tmp_path, rng):
    x = rng.standard_normal((2000, 64))
    with ta.Engine(n_workers=1, memory_per_worker="1GiB", processes=False, quiet=True):
        a = ta.from_numpy(x, tmp_path / "x.zarr", tile=(250, 64))
        c = (a.T @ a).to_zarr(tmp_path / "g.zarr")
        assert c.stats.bytes_read == x.nbytes
        assert_close(c.compute(), x.T @ x)


def test_inherited_output_tile_is_capped_so_the_job_fits(tmp_path):
    """A's 8192-row tiles x B's 8192-column tiles would make 512 MiB output
    chunks whose encode buffer alone sank every layout at 1 GiB workers: the
    inherited tile is halved to <= 64 MiB (still aligned with the inputs), and
    the job plans; a tile the user gives is kept as given."""
    zarr.create_array(tmp_path / "a.zarr", shape=(16384, 16384), chunks=(8192, 512), dtype="f8")
    zarr.create_array(tmp_path / "b.zarr", shape=(16384, 16384), chunks=(512, 8192), dtype="f8")
    expr = ta.open(tmp_path / "a.zarr") @ ta.open(tmp_path / "b.zarr")
    budget = ta.Budget.from_config("1GiB", 2, 1)
    plan = expr.plan(tmp_path / "c.zarr", budget=budget)
    assert plan.peak_task_memory <= budget.task_memory and plan.bytes_read == 8 * 2**30
    from tilearray.engine.plan.sizing import MAX_INHERITED_TILE, output_grid

    grid = output_grid(expr._node, None, None)
    assert grid.tile[0] * grid.tile[1] * 8 <= MAX_INHERITED_TILE
    assert 8192 % grid.tile[0] == 0 and 8192 % grid.tile[1] == 0
    assert output_grid(expr._node, (8192, 8192), None).tile == (8192, 8192)


@pytest.mark.parametrize("chunks", [(600, 1), (1, 90)])
def test_products_of_thin_chunks_store_reasonable_tiles(engine, tmp_path, chunks):
    """A product's tile inherited from thin operands (A's row tile by B's
    column tile: 1 x 1 for ``X.T @ X`` of X in (m, 1) chunks) holds 64 KiB
    at least: a 100 x 100 Gram was stored in 20,001 files in 24 s. Results
    equal NumPy's; ``np.cov`` (a product inside) too."""
    rng = np.random.default_rng(9)
    x = rng.standard_normal((600, 90))
    z = zarr.create_array(str(tmp_path / "x.zarr"), shape=x.shape, chunks=chunks, dtype="f8")
    z[...] = x
    a = ta.open(tmp_path / "x.zarr")
    gram = a.T @ a if chunks[1] == 1 else a @ a.T
    want = x.T @ x if chunks[1] == 1 else x @ x.T
    out = gram.to_zarr(tmp_path / "g.zarr")
    tile = zarr.open_array(str(tmp_path / "g.zarr")).chunks
    assert tile[0] * tile[1] * 8 >= min(64 * 2**10, want.nbytes), tile
    assert_close(out.compute(), want)
    c = np.cov(a, rowvar=chunks[0] == 1).to_zarr(tmp_path / "c.zarr")
    stored = zarr.open_array(str(tmp_path / "c.zarr"))
    tile = stored.chunks
    assert tile[0] * tile[1] * 8 >= min(64 * 2**10, stored.nbytes), tile
    assert_close(c.compute(), np.cov(x, rowvar=chunks[0] == 1))
