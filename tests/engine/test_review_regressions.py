"""Regressions for bugs found in review: identities, ties, empty arrays, data safety."""

import numpy as np
import pytest
import zarr

import tilearray as ta
from tilearray.testing import assert_close


@pytest.fixture
def ab(tmp_path, rng):
    x, y = rng.standard_normal((30, 30)), rng.standard_normal((30, 25))
    return x, y, ta.from_numpy(x, tmp_path / "a.zarr", tile=(8, 8)), \
        ta.from_numpy(y, tmp_path / "b.zarr", tile=(8, 8))


def test_distinct_slices_and_keepdims_are_distinct_expressions(engine, ab):
    x, y, a, b = ab
    p = a[0:10, 0:12] @ b[0:12]
    q = a[0:10, 0:20] @ b[0:20]
    assert_close(((p * 1) + (q * 1)).compute(), x[:10, :12] @ y[:12] + x[:10, :20] @ y[:20])
    e = ((a - a.mean(axis=1)) @ b) + ((a - a.mean(axis=1, keepdims=True)) @ b)
    want = ((x - x.mean(axis=1)) @ y) + ((x - x.mean(axis=1, keepdims=True)) @ y)
    assert_close(e.compute(), want)


def test_reductions_over_different_broadcasts(engine, ab):
    x, _, a, _ = ab
    e = (a - a.mean(axis=0)).sum(axis=0) - (a - a.max(axis=0)).sum(axis=0)
    want = (x - x.mean(0)).sum(0) - (x - x.max(0)).sum(0)
    assert_close(e.compute(), want)


def test_argmin_ties_across_blocks(engine, tmp_path, rng):
    import dask

    x = rng.integers(0, 3, size=(60, 200)).astype("f8")
    x[5, 150] = x[30, 3] = -1
    x[7, 190] = x[40, 2] = 9
    a = ta.from_numpy(x, tmp_path / "t.zarr", tile=(10, 10))
    with dask.config.set({"tilearray.map.block-bytes": "40KiB"}):
        assert a.argmin().compute() == np.argmin(x)
        assert a.argmax().compute() == np.argmax(x)
        np.testing.assert_array_equal(a.argmin(axis=1).compute(), np.argmin(x, axis=1))


def test_empty_arrays_match_numpy(engine, tmp_path):
    e = ta.from_numpy(np.zeros((0, 5)), tmp_path / "e.zarr", tile=(4, 4))
    o = ta.from_numpy(np.ones((5, 3)), tmp_path / "o.zarr", tile=(4, 4))
    assert (e @ o).compute().shape == (0, 3)
    assert e.sum().compute() == 0
    np.testing.assert_array_equal(e.sum(axis=0).compute(), np.zeros(5))
    assert e.sum(axis=1).compute().shape == (0,)


def test_np_matmul_routes_to_matmul(engine, ab):
    x, y, a, b = ab
    assert_close(np.matmul(a, b).compute(), x @ y)


def test_to_zarr_never_replaces_other_data(engine, tmp_path, ab):
    x, _, a, _ = ab
    g = zarr.open_group(tmp_path / "grp.zarr", mode="w")
    g.create_array("keep", data=np.ones((3, 3)))
    with pytest.raises(ta.StorageError, match="not a Zarr array"):
        (a * 2).to_zarr(tmp_path / "grp.zarr")
    assert (zarr.open_group(tmp_path / "grp.zarr")["keep"][:] == 1).all()
    d = tmp_path / "mydir"
    d.mkdir()
    (d / "important.txt").write_text("x")
    with pytest.raises(ta.StorageError, match="not a Zarr array"):
        (a * 2).to_zarr(d)
    assert (d / "important.txt").exists()
    gx = tmp_path / "g2.zarr"
    ta.from_numpy(x, tmp_path / "tmp_src.zarr", tile=(8, 8))
    g2 = zarr.open_group(gx, mode="w")
    g2.create_array("x", data=x, chunks=(8, 8))
    with pytest.raises(ta.StorageError, match="holds an input"):
        (ta.open(gx, "x") * 2).to_zarr(gx, overwrite=True)
    np.testing.assert_array_equal(zarr.open_group(gx)["x"][:], x)


def test_input_overwritten_after_open_is_detected(engine, tmp_path, rng):
    x = rng.standard_normal((10, 6))
    a = ta.from_numpy(x, tmp_path / "a.zarr", tile=(4, 4))
    ta.from_numpy(rng.standard_normal((5, 6)), tmp_path / "a.zarr", tile=(4, 4), overwrite=True)
    with pytest.raises(ta.StorageError, match=r"changed since it was opened.*\(5, 6\)"):
        (a + 1).compute()
    with pytest.raises(ta.StorageError, match="changed since it was opened"):
        (a * 2).to_zarr(tmp_path / "out.zarr")
    assert not (tmp_path / "out.zarr").exists()
    fresh = ta.open(tmp_path / "a.zarr")
    assert (fresh + 1).compute().shape == (5, 6)


def test_numpy_surface_review(engine, tmp_path, rng):
    """A user's review of the NumPy surface (each was wrong or crashed):
    fractional ddof, empty contractions (uninitialised memory before),
    nested index lists (silently flattened), np.average(returned=True),
    NumPy's positional order of reduction methods, ufunc where= / out= and
    multi-output ufuncs refused clearly, a lazy q, indexing small 1-D
    results, f-string formatting, np.where(cond), *_like, astype(copy=)."""
    x = rng.standard_normal((103, 27))
    a = ta.from_numpy(x, tmp_path / "x.zarr", tile=(20, 8))
    for ddof in (0.5, 1.5):
        assert_close(a.std(axis=0, ddof=ddof).compute(), x.std(axis=0, ddof=ddof))
        assert_close(np.nanvar(a, axis=1, ddof=ddof).compute(), np.nanvar(x, axis=1, ddof=ddof))
    empty = a[:, a[0] > 100]  # no columns
    for got, want in [(empty @ np.ones(0), x[:, :0] @ np.ones(0)),
                      (empty @ np.ones((0, 3)), np.zeros((103, 3))),
                      (np.ones(0) @ a[:0], np.zeros(27)), (a[0, :0] @ np.ones(0), 0.0)]:
        np.testing.assert_array_equal(got.compute(), want)
    stored = (empty @ np.ones((0, 3))).to_zarr(tmp_path / "zeros.zarr")
    np.testing.assert_array_equal(np.asarray(stored), np.zeros((103, 3)))
    for bad in (lambda: a[[[0, 1], [2, 3]]], lambda: a[:, [[0, 1]]], lambda: a[3, [[1, 2]]],
                lambda: np.take(a, [[0, 1]], axis=1), lambda: a[:, np.ones((1, 27), bool)]):
        with pytest.raises(IndexError):
            bad()
    w = np.arange(103.0)
    got, want = np.average(a, axis=0, weights=w, returned=True), \
        np.average(x, axis=0, weights=w, returned=True)
    assert_close(got[0].compute(), want[0])
    assert got[1].shape == want[1].shape and np.allclose(got[1], want[1])
    got = np.average(a, axis=1, returned=True)[1]
    assert got.dtype == np.float64 and got.shape == (103,) and np.all(got == 27)
    assert_close(a.mean(0, np.float32).compute(), x.mean(0, np.float32))
    assert_close(a.max(0, None, True).compute(), x.max(0, None, True))
    assert_close(a.var(0, None, None, 1).compute(), x.var(0, None, None, 1))
    for bad in (lambda: np.add(a, 1, where=a > 0), lambda: np.sqrt(a, out=np.empty(x.shape)),
                lambda: np.modf(a, out=(x, x)), lambda: a.sum(out=np.empty(1)), lambda: a.std(where=x > 0)):
        with pytest.raises(TypeError):
            bad()
    assert_close(np.quantile(a, a.mean(0)[:2] * 0 + 0.5, axis=0).compute(),
                 np.quantile(x, [0.5, 0.5], axis=0))
    with pytest.raises(TypeError, match="more than 1-D"):
        np.quantile(a, [[0.1, 0.2]], axis=0)
    m, mx = a.sum(0), x.sum(0)
    for got, want in [(m[3], mx[3]), (a[:, 0][-1], x[-1, 0]), (m[[1, 2]], mx[[1, 2]]),
                      (m[m > 0], mx[mx > 0]), (m[np.arange(27) % 2 == 0], mx[::2]),
                      (a[:, np.argsort(a.std(0))[-5:]], x[:, np.argsort(x.std(0))[-5:]]),
                      (a[:, a.std(0).argsort()[-5:]], x[:, x.std(0).argsort()[-5:]])]:
        assert_close(got.compute(), want)
    with pytest.raises(IndexError):
        m[27]
    assert f"{a.mean():.4f}" == f"{x.mean():.4f}" and a.mean().item() == pytest.approx(x.mean())
    with pytest.raises(TypeError, match="only size-1"):
        f"{a:.3f}"
    for got, want in zip(np.where(a > 1), np.where(x > 1), strict=True):
        np.testing.assert_array_equal(got, want)
    for f in (np.zeros_like, np.ones_like):
        np.testing.assert_array_equal(f(a).compute(), f(x))
        np.testing.assert_array_equal(f(m, dtype=np.int8).compute(), f(mx, dtype=np.int8))
    np.testing.assert_array_equal(np.full_like(a, 7.5).compute(), np.full_like(x, 7.5))
    assert np.zeros_like(a).plan().bytes_read == 0
    # shape= as NumPy's (it was refused): a lazy constant of that shape, nothing read
    for shape in [(50, 20), (300, 170), 7, (5,), (), (0, 3)]:
        for f, args in ((np.zeros_like, ()), (np.ones_like, ()), (np.full_like, (2.5,))):
            got = f(a, *args, shape=shape)
            assert got.plan().bytes_read == 0
            np.testing.assert_array_equal(got.compute(), f(x, *args, shape=shape))
    big = np.full_like(a, 3, shape=(300, 170), dtype=np.int16)
    assert big.to_zarr(tmp_path / "big.zarr").shape == (300, 170)
    np.testing.assert_array_equal(ta.open(tmp_path / "big.zarr").compute(), np.full((300, 170), 3, np.int16))
    assert int(big.sum().compute()) == 3 * 300 * 170
    with pytest.raises(ValueError, match=r"negative dimensions are not allowed, shape=\(-1, 3\)"):
        np.zeros_like(a, shape=(-1, 3))
    with pytest.raises(ValueError, match=r"at most 2 dimensions, shape=\(2, 3, 4\)"):
        np.ones_like(a, shape=(2, 3, 4))
    assert a.astype(np.float32, copy=False).dtype == np.float32 and a.itemsize == 8
    with pytest.raises(TypeError, match="according to the rule 'safe'"):
        a.astype(np.int32, casting="safe")


def test_numpy_surface_review_rows_and_initial(engine, tmp_path, rng):
    """np.vstack of a matrix and 1-D rows, np.nanprod, initial= of reductions,
    a[None, i] / a[i, None] / a[:, j, None] (rows and columns, as NumPy)."""
    x = rng.standard_normal((41, 13))
    x[3, 4] = np.nan
    a = ta.from_numpy(x, tmp_path / "x.zarr", tile=(10, 5))
    y = np.nan_to_num(x)
    b = ta.from_numpy(y, tmp_path / "y.zarr", tile=(10, 5))
    assert_close(np.vstack([b, b.mean(0), np.ones(13)]).compute(),
                 np.vstack([y, y.mean(0), np.ones(13)]))
    for axis in (None, 0, 1):
        assert_close(np.nanprod(a / 2 + 1, axis=axis).compute(), np.nanprod(x / 2 + 1, axis=axis))
    for f, init in [(np.max, 0.5), (np.min, -0.25), (np.sum, 10.0), (np.prod, 2.0)]:
        assert_close(f(b, axis=0, initial=init).compute(), f(y, axis=0, initial=init))
    assert_close(np.nanmax(a, axis=1, initial=1.0).compute(), np.nanmax(x, axis=1, initial=1.0))
    for key in [(None, 3), (3, None), (slice(None), 4, None), (slice(None), None, -1),
                (None, -2, slice(2, 9))]:
        assert_close(b[key].compute(), y[key])
    with pytest.raises(IndexError, match="out of bounds"):
        b[None, 41]


def test_lazy_column_and_row_broadcast(engine, tmp_path, rng):
    """A stored column a[:, 0:1] / row a[:1] (not a reduction) broadcasts
    against the matrix, as NumPy: held in memory like a[:, 0]."""
    x = rng.standard_normal((57, 23))
    a = ta.from_numpy(x, tmp_path / "x.zarr", tile=(10, 7))
    for got, want in [(a / a[:, 0:1], x / x[:, 0:1]), (a + a[:1], x + x[:1]),
                      (a[:, 3:4] * a - a[-1:, :], x[:, 3:4] * x - x[-1:, :]),
                      (np.maximum(a, a[5:6, :]), np.maximum(x, x[5:6, :]))]:
        assert_close(got.compute(), want)
    with pytest.raises(ta.PlanningError, match="broadcast"):
        a + a[:, 0:2]


def test_split_select_compress_and_friends(engine, tmp_path, rng):
    """np.split / array_split (lazy slices), isposinf / isneginf, fix, select,
    extract, compress against NumPy, with NumPy's errors."""
    x = rng.standard_normal((23, 11)) * 3
    x[2, 3], x[4, 5] = np.inf, -np.inf
    a = ta.from_numpy(x, tmp_path / "x.zarr", tile=(5, 4))
    for got, want in [(np.array_split(a, 4, axis=1), np.array_split(x, 4, axis=1)),
                      (np.split(a, [3, 10, 30]), np.split(x, [3, 10, 30])),
                      (np.split(a, [-5], axis=1), np.split(x, [-5], axis=1))]:
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g.compute(), w)
    with pytest.raises(ValueError, match="equal division"):
        np.split(a, 4)
    for got, want in [(np.isposinf(a), np.isposinf(x)), (np.isneginf(a), np.isneginf(x)),
                      (np.fix(a), np.fix(x)),
                      (np.select([a > 1, a < -1], [a, -a], 0.5),
                       np.select([x > 1, x < -1], [x, -x], 0.5)),
                      (np.extract(a > 0, a), np.extract(x > 0, x)),
                      (np.compress([True, False, True], a, axis=1),
                       np.compress([True, False, True], x, axis=1)),
                      (np.compress(a[:, 0] > 0, a, axis=0), np.compress(x[:, 0] > 0, x, axis=0))]:
        np.testing.assert_array_equal(got.compute(), want)
    with pytest.raises(ValueError, match="same length"):
        np.select([a > 0], [a, a])


@pytest.mark.parametrize("fmt", [3, 2])
def test_chunks_larger_than_the_array_are_planned_whole(tmp_path, rng, fmt):
    """Plain zarr stores a chunk larger than its array padded to the chunk's
    size and decodes it whole (a user's 600 x 600 in 8000 x 8000 chunks: a
    helper's 160 MiB workers were killed, the plan said 14 MiB a task).
    Planned with the decoded chunk: refused under a small budget naming the
    array, its chunks and their size; computed equal to NumPy's once the
    budget holds it. A vector in one huge chunk too."""
    x = rng.standard_normal((300, 200))
    v = rng.standard_normal(500)
    zx = zarr.create_array(str(tmp_path / "x.zarr"), shape=x.shape, chunks=(3000, 3000),
                           dtype="f8", zarr_format=fmt)
    zx[...] = x
    zv = zarr.create_array(str(tmp_path / "v.zarr"), shape=v.shape, chunks=(5_000_000,),
                           dtype="f8", zarr_format=fmt)
    zv[...] = v
    X, V = ta.open(tmp_path / "x.zarr"), ta.open(tmp_path / "v.zarr")
    small = ta.Budget(32 * 2**20, 1, 1, baseline=0, fraction=1.0)
    on_x = r"x\.zarr' is stored in chunks of \(3000, 3000\), larger than its \(300, 200\) shape"
    on_v = r"v\.zarr' is stored in chunks of \(5000000,\), larger than its \(500,\) shape"
    for expr, named in ((X.sum(axis=0), on_x), (X.T @ X, on_x), (ta.linalg.qr(X, mode="r"), on_x),
                        (X @ V[:200], on_v), (V.sum(), on_v)):
        with pytest.raises(ta.PlanningError, match=named + r"; Zarr decodes a chunk whole, "
                           r"(68\.66|38\.15) MiB each.*memory_per_worker >= "):
            expr.plan(budget=small)
    big = ta.Budget(512 * 2**20, 1, 1, baseline=0, fraction=1.0)
    plan = (X.T @ X).plan(budget=big)
    assert plan.peak_task_memory >= 3000 * 3000 * 8
    with ta.Engine(n_workers=1, processes=False, quiet=True, memory_per_worker="1GiB"):
        assert_close((X.T @ X).compute(), x.T @ x)
        assert_close(X.sum(axis=0).compute(), x.sum(axis=0))
        assert_close((X @ V[:200]).compute(), x @ v[:200])
        assert_close(V.sum().compute(), v.sum())


def test_stage_refusal_names_chunks_larger_than_the_array(tmp_path):
    """A stage over its budget by its own figures (a reduction's, a matmul's:
    they price the decoded chunk they read) says so when an input is stored in
    chunks larger than itself, as the padding's own refusal does; it gave
    only the task's size and "smaller tiles/shards" (helper-45: 3000 x 700 in
    5000 x 1000 chunks, at 200 MiB a worker)."""
    zarr.create_array(str(tmp_path / "x.zarr"), shape=(3000, 700), chunks=(5000, 1000),
                      dtype="f8")  # metadata only: refused before any read
    x = ta.open(tmp_path / "x.zarr")
    budget = ta.Budget.from_config("200MiB", 2, 1)
    for expr in (x.sum(axis=0), x.sum(), x @ x.T):
        with pytest.raises(ta.PlanningError, match=r"x\.zarr' is stored in chunks of \(5000, "
                           r"1000\), larger than its \(3000, 700\) shape.*rechunk it.*: the "
                           r"smallest (reduce|matmul) task needs"):
            expr.plan(budget=budget)


def test_operands_as_numpy_takes_them(engine, tmp_path):
    """A list operand is NumPy's ``np.asarray(list)`` (it was refused); an
    operand NumPy has no loop for is a TypeError, as NumPy's UFuncTypeError
    (it was a ValueError); a long double array is refused by name before
    Zarr's own message (a helper's user trial)."""
    x = np.arange(12.0).reshape(3, 4)
    a = ta.from_numpy(x, tmp_path / "a.zarr", tile=(2, 3))
    assert_close((a + [1.0, 2, 3, 4]).compute(), x + [1.0, 2, 3, 4])
    assert_close(([[1], [2], [3]] * a).compute(), [[1], [2], [3]] * x)
    assert_close(np.maximum(a, (0, 5, 5, 0)).compute(), np.maximum(x, (0, 5, 5, 0)))
    with pytest.raises(TypeError, match="add: unsupported for dtypes"):
        a + "x"
    with pytest.raises(TypeError, match="operands must be TiledArrays, scalars, NumPy arrays"):
        a + {"k": 1}
    with pytest.raises(ta.StorageError, match="unsupported dtype float128.*float16 to float64"):
        ta.from_numpy(np.zeros((2, 2), np.longdouble), tmp_path / "l.zarr")
