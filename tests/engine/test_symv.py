"""The symmetric product from the lower triangle (``Factor`` part "symv"),
which the mixed-precision SPD solve uses for its residuals: ``A @ x`` with
``A`` taken as the symmetric matrix of its lower triangle (what a Cholesky
factor of ``A`` solves), and ``||A||_inf`` from the same pass. Compared with
NumPy on the mirrored lower triangle; the stored upper triangle holds
unrelated numbers, so reading it would show."""

from __future__ import annotations

import numpy as np
import pytest
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
    b = int(stage.description.split(" tiles of ")[1].split()[0])
    # the lower triangle by whole tiles: n^2 / 2 + n b / 2 elements
    assert stage.bytes_read == (n * n // 2 + n * b // 2) * 8
    assert stage.bytes_read < 0.6 * n * n * 8
    assert stage.peak_task_memory <= plan.budget.task_memory


def test_nan_in_the_lower_triangle_propagates(thread_engine, tmp_path, rng):
    a_np = rng.standard_normal((200, 200))
    a_np[150, 20] = np.nan
    a = ta.from_numpy(a_np, tmp_path / "a.zarr", tile=(64, 64))
    got, anorm = tla._symmetric_product(a, np.ones((200, 1)), norm=True)
    assert np.isnan(got[150, 0]) and np.isnan(got[20, 0]) and np.isnan(anorm)
    assert np.isfinite(np.delete(got, [20, 150], axis=0)).all()


@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(n=st.integers(1, 600), tr=st.integers(5, 300), tc=st.integers(5, 300),
       k=st.integers(1, 3), dtype=st.sampled_from(["float64", "float32"]),
       seed=st.integers(0, 2**16))
def test_any_tiling(tmp_path_factory, thread_engine, n, tr, tc, k, dtype, seed):
    rng = np.random.default_rng(seed)
    a_np = rng.uniform(-1, 1, (n, n)).astype(dtype)
    a = ta.from_numpy(a_np, tmp_path_factory.mktemp("s") / "a.zarr", tile=(tr, tc))
    check(a_np, a, rng.standard_normal((n, k)))
