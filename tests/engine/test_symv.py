"""The symmetric product from the lower triangle (``Factor`` part "symv"),
which the mixed-precision SPD solve uses for its residuals: ``A @ x`` with
``A`` taken as the symmetric matrix of its lower triangle (what a Cholesky
factor of ``A`` solves), and ``||A||_inf`` from the same pass. Compared with
NumPy on the mirrored lower triangle; the stored upper triangle holds
unrelated numbers, so reading it would show."""

from __future__ import annotations

import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tilearray as ta
from tilearray import linalg as tla
from tilearray.testing import assert_close


def lower_mirrored(a: np.ndarray) -> np.ndarray:
    return np.tril(a) + np.tril(a, -1).T


def want(a: np.ndarray, x: np.ndarray):
    s = lower_mirrored(a.astype(np.float64))
    return s @ x, float(np.abs(s).sum(axis=1).max(initial=0.0))


def check(a_np, a, x, norm=True):
    got, anorm = tla._symmetric_product(a, x, norm=norm)
    ax, wnorm = want(a_np, x)
    assert got.shape == x.shape and got.dtype == np.float64
    assert_close(got, ax)
    if norm:
        assert anorm == pytest.approx(wnorm, rel=1e-12)
    else:
        assert anorm is None


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("n, tile, k", [(1, (1, 1), 1), (257, (64, 64), 3), (601, (100, 90), 1),
                                        (700, (700, 7), 2), (517, (33, 517), 4)])
def test_product_and_norm_match_numpy(thread_engine, tmp_path, rng, dtype, n, tile, k):
    a_np = rng.uniform(-1, 1, (n, n)).astype(dtype)  # the upper triangle is unrelated
    a = ta.from_numpy(a_np, tmp_path / "a.zarr", tile=tile)
    x = rng.standard_normal((n, k))
    check(a_np, a, x)
    check(a_np, a, x, norm=False)


def test_a_lazy_expression_is_read_fused(thread_engine, tmp_path, rng):
    a_np = rng.standard_normal((300, 300))
    a = ta.from_numpy(a_np, tmp_path / "a.zarr", tile=(64, 48))
    x = rng.standard_normal((300, 2))
    check(2 * a_np + 1, 2 * a + 1, x)


def test_reads_about_half_of_a(thread_engine, tmp_path, rng):
    n = 2048
    a = ta.from_numpy(rng.standard_normal((n, n)), tmp_path / "a.zarr", tile=(128, 128))
    plan = tla._symmetric_product_plan(a, rng.standard_normal((n, 2)), norm=True).plan()
    stage = next(s for s in plan.stages if "symmetric product" in s.description)
    b = int(stage.description.split(" blocks of up to ")[1].split()[0])
    # the lower triangle by whole blocks: n^2 / 2 + n b / 2 elements
    assert stage.bytes_read == (n * n // 2 + n * b // 2) * 8
    assert stage.bytes_read < 0.6 * n * n * 8
    assert stage.peak_task_memory <= plan.budget.task_memory


@pytest.mark.parametrize("chunks", [(64, 1500), (1500, 48), (1500, 1500), (100, 700)])
def test_units_spanning_rows_or_columns_are_read_once(thread_engine, tmp_path, rng, chunks):
    """Blocks are whole I/O units: a unit is never read twice, whatever its
    shape (row or column strips, one unit for all, units wider than tall)."""
    n = 1500
    a_np = rng.standard_normal((n, n))
    a = ta.from_numpy(a_np, tmp_path / "a.zarr", tile=chunks)
    x = rng.standard_normal((n, 2))
    plan = tla._symmetric_product_plan(a, x, norm=False).plan()
    assert plan.bytes_read <= n * n * 8
    check(a_np, a, x)
    if chunks == (n, n):
        return  # one unit: one block (refused under the small budget below, as it must be)
    # blocks smaller than a whole row strip: still each unit once
    with ta.Engine(n_workers=1, threads_per_worker=1, memory_per_worker="200MiB",
                   processes=False, quiet=True):
        small = tla._symmetric_product_plan(a, x, norm=True).plan()
        assert small.bytes_read <= n * n * 8 and small.stages[0].tasks > 2
        assert small.stages[0].peak_task_memory <= small.budget.task_memory
        check(a_np, a, x)


def test_nan_in_the_lower_triangle_propagates(thread_engine, tmp_path, rng):
    a_np = rng.standard_normal((200, 200))
    a_np[150, 20] = np.nan
    a = ta.from_numpy(a_np, tmp_path / "a.zarr", tile=(64, 64))
    got, anorm = tla._symmetric_product(a, np.ones((200, 1)), norm=True)
    assert np.isnan(got[150, 0]) and np.isnan(got[20, 0]) and np.isnan(anorm)
    assert np.isfinite(np.delete(got, [20, 150], axis=0)).all()


@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(n=st.integers(1, 600), tr=st.integers(16, 300), tc=st.integers(16, 300),
       k=st.integers(1, 3), dtype=st.sampled_from(["float64", "float32"]),
       seed=st.integers(0, 2**16))
def test_any_tiling(tmp_path_factory, thread_engine, n, tr, tc, k, dtype, seed):
    rng = np.random.default_rng(seed)
    a_np = rng.uniform(-1, 1, (n, n)).astype(dtype)
    a = ta.from_numpy(a_np, tmp_path_factory.mktemp("s") / "a.zarr", tile=(tr, tc))
    check(a_np, a, rng.standard_normal((n, k)))


@pytest.mark.parametrize("layout", ["v2 big-endian", "sharded", "int32"])
def test_layouts_users_bring(thread_engine, tmp_path, rng, layout):
    """Arrays written by plain Zarr: a v2 big-endian array (as from netCDF),
    a sharded v3 one with shards that do not divide the shape, integers."""
    n = 450
    a_np = rng.uniform(-1, 1, (n, n))
    kw = {"v2 big-endian": dict(chunks=(70, 70), dtype=">f8", zarr_format=2),
          "sharded": dict(chunks=(32, 48), shards=(96, 144), dtype="f8"),
          "int32": dict(chunks=(100, 100), dtype="i4")}[layout]
    if layout == "int32":
        a_np = (a_np * 1000).astype("i4")
    z = zarr.create_array(tmp_path / "a.zarr", shape=(n, n), **kw)
    z[...] = a_np
    check(a_np, ta.open(tmp_path / "a.zarr"), rng.standard_normal((n, 3)))


def test_the_sum_of_many_right_hand_sides_fits_or_is_refused(tmp_path, rng):
    """Planned from metadata: the sums of ``n x k`` partials are trees whose
    fan-in fits the budget; past it, a PlanningError naming the product."""
    n, k = 16384, 512
    zarr.create_array(tmp_path / "a.zarr", shape=(n, n), chunks=(2048, 2048), dtype="f8")
    a = ta.open(tmp_path / "a.zarr")
    x = np.zeros((n, k))
    budget = ta.Budget.from_config("1GiB", 2, 1)
    plan = tla._symmetric_product_plan(a, x, True).plan(budget=budget)
    assert plan.stages[0].peak_task_memory <= budget.task_memory
    assert "fan-in 7" in plan.stages[0].description  # 9 sums of 64 MiB fit, not 10
    with pytest.raises(ta.PlanningError, match="symmetric"):
        tla._symmetric_product_plan(a, x, True).plan(budget=ta.Budget.from_config("400MiB", 1, 1))
