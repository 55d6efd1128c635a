import numpy as np
import pytest

import tilearray as ta
from tilearray.testing import assert_close


@pytest.fixture
def pair(tmp_path, rng):
    x = rng.standard_normal((45, 38)) + 3
    y = rng.standard_normal((45, 38)) + 3
    a = ta.from_numpy(x, tmp_path / "a.zarr", tile=(16, 16))
    b = ta.from_numpy(y, tmp_path / "b.zarr", tile=(10, 20), shard=(20, 40))  # other tiling
    return x, y, a, b


def test_binary_ops_mismatched_tilings(engine, pair):
    x, y, a, b = pair
    cases = [
        (a + b, x + y), (a - b, x - y), (a * b, x * y), (a / b, x / y),
        (a // b, x // y), (a ** 2, x ** 2), (2 - a, 2 - x), (-a, -x), (abs(a - b), abs(x - y)),
        (a < b, x < y), (np.sqrt(a), np.sqrt(x)), (np.exp(a / 10), np.exp(x / 10)),
        (np.log(a), np.log(x)), (np.log1p(a), np.log1p(x)), (a.clip(2, 4), x.clip(2, 4)),
        (a.astype("float32"), x.astype("float32")),
    ]
    for expr, want in cases:
        got = expr.compute()
        assert got.dtype == want.dtype, str(expr)
        assert_close(got, want, err_msg=str(expr))


def test_where_and_maximum(engine, pair):
    x, y, a, b = pair
    assert_close(np.where(x > y, x, y), np.maximum(a, b).compute())


def test_np_where_is_elementwise_like_numpy(engine, pair):
    """np.where(cond, x, y) with stored arrays of different tilings, scalars,
    broadcast reductions and a stored (non-bool) condition: NumPy's values and
    result dtype; the one-argument form is refused (its size is data-dependent)."""
    x, y, a, b = pair
    cases = [
        (np.where(a > b, a, b), np.where(x > y, x, y)),
        (np.where(a > 3, 1.0, 0), np.where(x > 3, 1.0, 0)),
        (np.where(a > a.mean(axis=0), a - a.mean(axis=0), 0).sum(axis=0),
         np.where(x > x.mean(axis=0), x - x.mean(axis=0), 0).sum(axis=0)),
        (np.where((a * 0).astype("int16"), a, b.astype("float32")),
         np.where((x * 0).astype("int16"), x, y.astype("float32"))),
    ]
    for expr, want in cases:
        got = expr.compute()
        assert got.dtype == want.dtype, str(expr)
        assert_close(got, want, err_msg=str(expr))
    for got, want in zip(np.where(a > 0), np.where(a.compute() > 0), strict=True):
        np.testing.assert_array_equal(got, want)  # np.nonzero, as NumPy
    with pytest.raises(ValueError, match="both or neither"):
        np.where(a > 0, a)


def test_broadcast_centering_and_scaling(engine, pair):
    x, _, a, _ = pair
    assert_close((a - a.mean(axis=0)).compute(), x - x.mean(0))
    assert_close((a / a.std(axis=0, keepdims=True)).compute(), x / x.std(0, keepdims=True))
    assert_close((a - a.mean(axis=1, keepdims=True)).compute(), x - x.mean(1, keepdims=True))
    assert_close((a - a.mean()).compute(), x - x.mean())


def test_slices_and_transpose(engine, pair):
    x, y, a, b = pair
    assert_close(a[10:30, :].compute(), x[10:30, :])
    assert_close(a[:, ::2].compute(), x[:, ::2])
    assert_close(a[3:40:3, 5:].T.compute(), x[3:40:3, 5:].T)
    assert_close((a.T + b.T).compute(), (x + y).T)
    assert_close(a[5:20].sum(axis=0).compute(), x[5:20].sum(0))


def test_covariance_fused(engine, tmp_path, pair):
    x, _, a, _ = pair
    c = a - a.mean(axis=0)
    cov = (c.T @ c) / (x.shape[0] - 1)
    assert_close(cov.compute(), np.cov(x, rowvar=False))
    out = (c.T @ c).to_zarr(tmp_path / "cov.zarr")
    xc = x - x.mean(0)
    assert_close(out.compute(), xc.T @ xc)


def test_matmul_inside_expression(engine, pair):
    x, y, a, b = pair
    assert_close(((a @ b.T) * 2).sum(axis=0).compute(), ((x @ y.T) * 2).sum(0))


def test_elementwise_to_zarr(engine, tmp_path, pair):
    x, y, a, b = pair
    out = (a - b).to_zarr(tmp_path / "d.zarr", tile=(8, 8))
    assert out.grid.tile == (8, 8)
    assert_close(out.compute(), x - y)


def test_incompatible_shapes_name_both(tmp_path, rng, pair):
    _, _, a, _ = pair
    c = ta.from_numpy(rng.standard_normal((45, 5)), tmp_path / "c.zarr", tile=(8, 5))
    with pytest.raises(ta.PlanningError, match=r"\(45, 38\).*\(45, 5\)"):
        a + c
    with pytest.raises(ta.PlanningError, match=r"broadcast.*\(45, 38\) and \(2,\)"):
        a + [1, 2]  # a list is np.asarray(list), as in NumPy
    with pytest.raises(TypeError, match="TiledArrays, scalars"):
        a + None


def test_numpy_vectors_broadcast_like_reduction_results(engine, pair):
    x, y, a, b = pair
    mu = x.mean(axis=0)                       # a row computed in NumPy
    col = np.arange(x.shape[0], dtype=np.float32)[:, None]
    assert_close((a - mu).compute(), x - mu)
    assert_close((mu - a).compute(), mu - x)
    assert_close((a * col + np.array(2.0)).compute(), x * col + 2.0)
    assert_close(np.add(mu[None, :], a).compute(), mu[None, :] + x)
    assert_close(((a - mu) ** 2).sum(axis=0).compute(), ((x - mu) ** 2).sum(axis=0))
    kept = mu.copy()
    e = a - kept
    kept[:] = 0  # the expression holds its own copy
    assert_close(e.compute(), x - mu)
    assert_close((a + x).compute(), 2 * x)    # a NumPy matrix: sliced like the expression
    # a NumPy matrix in a product is an in-memory operand (sent to the workers once)
    assert_close((a @ y.T).compute(), x @ y.T)
    assert_close((x.T @ b).compute(), x.T @ y)
    with pytest.raises(ta.PlanningError, match="broadcast"):
        a - np.ones(x.shape[1] + 1)


@pytest.mark.parametrize("dtype", ["float64", "float32", "int32"])
def test_numpy_matrix_operands(engine, tmp_path, rng, monkeypatch, dtype):
    """A NumPy matrix of the expression's shape is an operand as in NumPy
    (``G + lam * np.eye(p)``, ``x - m``): sliced block by block under
    transposes, slices, reductions, products, joins and stored outputs, over
    ragged tilings; one past the size a task should hold whole is refused
    naming ``from_numpy``."""
    x = (rng.standard_normal((61, 47)) * 10).astype(dtype)
    m = (rng.standard_normal((61, 47)) * 10).astype(dtype)
    a = ta.from_numpy(x, tmp_path / "a.zarr", tile=(16, 13), shard=(32, 26))
    cases = [
        (a + m, x + m), (m - a, m - x), ((a * m).T, (x * m).T),
        ((m - a)[3:50:3, 5:], (m - x)[3:50:3, 5:]),
        (np.where(a > m, a, m), np.where(x > m, x, m)), ((a - m).sum(axis=0), (x - m).sum(axis=0)),
        ((a + m).T @ a, (x + m).T @ x), (np.vstack([a, m]), np.vstack([x, m])),
        (np.hstack([m, a]), np.hstack([m, x])), (np.maximum(a.T, m.T), np.maximum(x.T, m.T)),
        (a.mT @ m, x.mT @ m),  # NumPy 2's matrix transpose
    ]
    for expr, want in cases:
        got = expr.compute()
        assert got.dtype == want.dtype, str(expr)
        assert_close(got, want, err_msg=str(expr))
    stored = (a - m).to_zarr(tmp_path / "d.zarr", tile=(20, 20))
    assert_close(np.asarray(stored), x - m)
    g = a.T @ a                                     # ridge regression, as in NumPy
    y = rng.standard_normal(61)
    ridge = np.linalg.solve(g + 0.5 * np.eye(47), a.T @ y)
    assert_close(ridge, np.linalg.solve(x.T @ x + 0.5 * np.eye(47), x.T @ y),
                 precision=np.result_type(dtype, np.float32),
                 scale=1e3 * np.abs(ridge).max() if dtype == "float32" else None)
    # every task holds the operands whole: counted in its peak
    budget = ta.Budget.from_config("512MiB", 2, 1)
    bare, held = (a + 1).plan(budget=budget), (a + m + 2 * m[::-1]).plan(budget=budget)
    assert held.peak_task_memory >= bare.peak_task_memory + 2 * m.nbytes
    from tilearray.engine.expr import ops

    monkeypatch.setattr(ops, "MATRIX_OPERAND_BYTES", m.nbytes - 1)
    with pytest.raises(TypeError, match=r"shape \(61, 47\).*ta.from_numpy"):
        a + m
    with pytest.raises(TypeError, match="1-D or 2-D"):
        a + np.ones((2, 61, 47))


def test_clip_with_one_bound_and_transposed_small_results(engine, pair):
    x, _, a, _ = pair
    assert_close(a.clip(None, 0.5).compute(), np.clip(x, None, 0.5))
    assert_close(np.clip(a, -0.5, None).compute(), np.clip(x, -0.5, None))
    assert_close(np.clip(a, max=0.1).compute(), np.clip(x, max=0.1))
    with pytest.raises(TypeError, match="min or max"):
        a.clip()
    m = a.mean(axis=0, keepdims=True)
    assert_close(m.T.compute(), x.mean(axis=0, keepdims=True).T)
    assert_close((a.T - m.T).compute(), (x - x.mean(axis=0)).T)
    assert_close(m[:, 1::2].compute(), x.mean(axis=0, keepdims=True)[:, 1::2])


@pytest.mark.parametrize("dtype", ["bool", "int8", "float32"])
@pytest.mark.parametrize("p", [2, 2.0, np.int64(2), 3])
def test_power_dtype_like_ndarray_operator(engine, tmp_path, dtype, p):
    """``x ** 2`` (a Python int 2) is ``np.square`` for an ndarray: bool gives
    int8 there, not np.power's int64."""
    x = (np.arange(12).reshape(3, 4) % 3).astype(dtype)
    a = ta.from_numpy(x, tmp_path / "p.zarr", tile=(2, 3))
    want = x**p
    assert (a**p).dtype == want.dtype
    assert_close((a**p).compute(), want)


@pytest.mark.parametrize("n, m, k, dtype", [(7, None, 0, float), (50, 70, 2, "float32"),
                                            (61, 45, -7, int), (5, 5, 9, bool), (0, 3, 0, float)])
def test_eye_is_numpys_and_reads_nothing(engine, n, m, k, dtype):
    e = ta.eye(n, m, k, dtype=dtype)
    want = np.eye(n, m, k, dtype=dtype)
    got = e.compute()
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(e.T[::2].compute(), want.T[::2])
    assert e.plan().bytes_read == 0


def test_eye_shifts_a_stored_matrix_at_any_size(engine, tmp_path, rng):
    """``G + lam * ta.eye(p)`` (``np.eye(p, like=G)`` too) in a Cholesky, an
    SPD solve and a product, as NumPy; a huge identity is planned in blocks
    that fit, reading nothing."""
    x = rng.standard_normal((130, 90))
    a = ta.from_numpy(x, tmp_path / "x.zarr", tile=(40, 25))
    g, want_g = a.T @ a, x.T @ x + 2 * np.eye(90)
    assert_close(np.asarray(ta.linalg.cholesky(g + 2 * ta.eye(90)).compute()),
                 np.linalg.cholesky(want_g))
    assert_close(ta.linalg.solve(g + 2 * np.eye(90, like=a), np.ones(90), assume_a="pos"),
                 np.linalg.solve(want_g, np.ones(90)))
    assert_close((a @ ta.eye(90, 40, 3)).compute(), x @ np.eye(90, 40, 3))
    budget = ta.Budget.from_config("512MiB", 2, 1)
    assert "plan: eye(3, 4, k=1) -> (3, 4) float64" in str(ta.eye(3, 4, k=1).plan(budget=budget))
    plan = (ta.eye(10**6) * 3).plan(budget=budget)
    assert plan.bytes_read == 0 and plan.peak_task_memory <= budget.task_memory
    with pytest.raises(ValueError, match="negative"):
        ta.eye(-1)
    with pytest.raises(TypeError, match="complex128"):
        ta.eye(3, dtype=complex)


def test_integer_bit_operators(engine, tmp_path, rng):
    x = rng.integers(-1000, 1000, (37, 29)).astype("int32")
    y = rng.integers(0, 5, (37, 29)).astype("int64")
    a = ta.from_numpy(x, tmp_path / "x.zarr", tile=(10, 8))
    b = ta.from_numpy(y, tmp_path / "y.zarr", tile=(16, 16))
    for expr, want in [(a >> 2, x >> 2), (a << b, x << y), (3 << b, 3 << y), (1024 >> b, 1024 >> y),
                       (a & b, x & y), (a | 7, x | 7), (a ^ b, x ^ y), (~a, ~x)]:
        got = expr.compute()
        assert got.dtype == want.dtype, str(expr)
        np.testing.assert_array_equal(got, want, err_msg=str(expr))
