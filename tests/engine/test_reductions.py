import re
import warnings

import dask
import numpy as np
import pytest
from helpers import rand

import tilearray as ta
from tilearray.testing import assert_close

SIMPLE = ["sum", "mean", "min", "max", "prod", "var", "std", "any", "all", "argmin", "argmax"]


@pytest.fixture(scope="module")
def arrays(tmp_path_factory):
    rng = np.random.default_rng(7)
    d = tmp_path_factory.mktemp("red")
    out = {}
    for dtype in ["float32", "float64", "int64", "bool"]:
        x = rand(rng, (53, 37), dtype)
        if dtype == "float32":
            x = x * 0.5 + 1.0  # keep prod finite-ish
        out[dtype] = (x, ta.from_numpy(x, d / f"{dtype}.zarr", tile=(16, 10)))
    return out


def _np(op, x, axis, keepdims):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return getattr(np, op)(x, axis=axis, keepdims=keepdims)


@pytest.mark.parametrize("dtype", ["float32", "float64", "int64", "bool"])
@pytest.mark.parametrize("axis", [0, 1, None])
@pytest.mark.parametrize("keepdims", [False, True])
def test_reductions_match_numpy(engine, arrays, dtype, axis, keepdims):
    x, a = arrays[dtype]
    ops = [op for op in SIMPLE if not (dtype == "bool" and op in ("var", "std", "prod"))]
    exprs = [getattr(a, op)(axis=axis, keepdims=keepdims) for op in ops]
    for op, e in zip(ops, exprs, strict=True):
        want = _np(op, x, axis, keepdims)
        got = e.compute()
        assert np.shape(got) == np.shape(want), (op, axis, keepdims)
        assert np.asarray(got).dtype == np.asarray(want).dtype, (op, dtype)
        assert_close(got, want, err_msg=f"{op} axis={axis}")


@pytest.mark.parametrize("op", ["nansum", "nanmean", "nanmin", "nanmax", "count_nonzero"])
@pytest.mark.parametrize("axis", [0, 1, None])
def test_nan_variants(engine, tmp_path, rng, op, axis):
    x = rng.standard_normal((41, 29))
    x[rng.random(x.shape) < 0.2] = np.nan
    x[:, 3] = np.nan  # an all-NaN column
    a = ta.from_numpy(x, tmp_path / "n.zarr", tile=(10, 7))
    got = getattr(a, op)(axis=axis).compute()
    want = _np(op, x, axis, False)
    assert_close(got, want)


@pytest.mark.parametrize("op", ["nanargmin", "nanargmax"])
@pytest.mark.parametrize("dtype", ["float64", "float32", "int16"])
def test_nanargmin_nanargmax_like_numpy(thread_engine, tmp_path, rng, op, dtype):
    """NaNs are passed over across blocks and merges; a true +-inf after
    NaNs ties with them, as in NumPy (NaN read as inf); ties take the first
    index; a slice of NaNs only raises NumPy's ValueError, at compute."""
    x = rng.integers(-3, 4, (41, 29)).astype(dtype)  # many ties across blocks
    if dtype != "int16":
        x[rng.random(x.shape) < 0.3] = np.nan
        x[:, 3] = np.nan                        # an all-NaN column
        x[7, :20] = np.nan                      # a row NaN in its first blocks
        x[7, 25] = np.inf if op == "nanargmin" else -np.inf
        x[9, :] = np.inf if op == "nanargmin" else -np.inf
        x[9, :11] = np.nan                      # NaN ties with inf: NumPy takes the NaN
    a = ta.from_numpy(x, tmp_path / "n.zarr", tile=(10, 7))
    f = getattr(np, op)
    with dask.config.set({"tilearray.map.block-bytes": "256B",
                          "tilearray.reduction.split-every": 2}):
        assert f(a).compute() == f(x)
        rows = f(a, axis=1, keepdims=True).compute()
        np.testing.assert_array_equal(rows, f(x, axis=1, keepdims=True))
        assert rows.dtype == np.intp
        if dtype == "int16":
            np.testing.assert_array_equal(f(a, axis=0).compute(), f(x, axis=0))
            return
        np.testing.assert_array_equal(f(a[:, 4:], axis=0).compute(), f(x[:, 4:], axis=0))
        with pytest.raises(ValueError, match="All-NaN slice"):
            f(a, axis=0).compute()
        with pytest.raises(ValueError, match="All-NaN slice"):
            f(a[:, 3:4]).compute()
        with pytest.raises(ta.AllNaNSliceError):  # of a small in-memory result too
            f(a[:, 3:4].sum(axis=1)).compute()
    with pytest.raises(ta.PlanningError, match="axis"):
        f(a, axis=(0, 1))


@pytest.mark.parametrize("dtype", ["float64", "float32", "int32"])
@pytest.mark.parametrize("axis", [0, 1, None])
def test_nanvar_nanstd_like_numpy(engine, tmp_path, rng, dtype, axis):
    """Over the non-NaN elements, Chan's merge as var: an all-NaN column and
    a one-value column give NumPy's NaN (ddof 1), a 1e6 offset loses nothing
    in float64 (in float32 NumPy's own mean is off by ~eps * 1e6 there)."""
    offset = {"float64": 1e6, "float32": 10.0}.get(dtype, 0)
    x = (offset + rng.standard_normal((41, 29))).astype(dtype) if dtype != "int32" else \
        rng.integers(-50, 50, (41, 29)).astype(dtype)
    if dtype != "int32":
        x[rng.random(x.shape) < 0.2] = np.nan
        x[:, 3] = np.nan  # all NaN
        x[1:, 4] = np.nan  # one value
    a = ta.from_numpy(x, tmp_path / "n.zarr", tile=(10, 7))
    for f in (np.nanvar, np.nanstd):
        for ddof in (0, 1, 40):  # 40: more than most columns' non-NaN values: NaN there
            got = f(a, axis=axis, ddof=ddof).compute()
            want = _np_nan(f, x, axis, ddof)
            assert np.asarray(got).dtype == want.dtype, (f, dtype)
            assert_close(got, want, err_msg=f"{f.__name__} axis={axis} ddof={ddof}")
    got = np.nanstd(a, axis=axis, keepdims=True, dtype="float64").compute()
    # NumPy subtracts the mean in the input's dtype whatever dtype= says
    assert_close(got, _np_nan(np.nanstd, x, axis, 0, keepdims=True, dtype="float64"),
                 precision="float32" if dtype == "float32" else None)


def _np_nan(f, x, axis, ddof, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return np.asarray(f(x, axis=axis, ddof=ddof, **kw))


def test_nan_propagates_in_plain_sum(engine, tmp_path):
    x = np.ones((20, 20))
    x[5, 5] = np.nan
    a = ta.from_numpy(x, tmp_path / "n.zarr", tile=(8, 8))
    s = a.sum(axis=0).compute()
    assert np.isnan(s[5]) and np.isfinite(np.delete(s, 5)).all()
    assert np.argmax(x, axis=None) == a.argmax().compute()


@pytest.mark.parametrize("ddof", [0, 1])
def test_var_std_ddof_and_stability(engine, tmp_path, rng, ddof):
    x = 1e8 + rng.standard_normal((200, 13))  # catastrophic for sum-of-squares
    a = ta.from_numpy(x, tmp_path / "v.zarr", tile=(16, 13))
    assert_close(a.var(axis=0, ddof=ddof).compute(), x.var(0, ddof=ddof))
    assert_close(a.std(ddof=ddof).compute(), x.std(ddof=ddof))


def test_float32_column_sums_accurate(engine, tmp_path):
    rng = np.random.default_rng(0)
    x = (rng.random((1_000_000, 4)) + 0.5).astype("float32")
    a = ta.from_numpy(x, tmp_path / "f.zarr", tile=(65536, 4))
    got = a.sum(axis=0).compute()
    assert got.dtype == np.float32
    assert_close(got, x.astype("f8").sum(0))
    assert_close(a.mean(axis=0).compute(), x.astype("f8").mean(0))


def test_norms(engine, tmp_path, rng):
    x = rng.standard_normal((31, 17))
    a = ta.from_numpy(x, tmp_path / "n.zarr", tile=(8, 8))
    for ord_ in [None, "fro", 1, -1, np.inf, -np.inf]:
        assert_close(ta.linalg.norm(a, ord_).compute(), np.linalg.norm(x, ord_))
    for axis in (0, 1):
        for ord_ in [None, 2, 1, np.inf, -np.inf, 0, 3]:
            assert_close(ta.linalg.norm(a, ord_, axis=axis).compute(), np.linalg.norm(x, ord_, axis=axis))
    for ord_ in (2, -2, "nuc"):  # from the singular values (TSQR), no longer refused
        assert_close(ta.linalg.norm(a, ord_).compute(), np.linalg.norm(x, ord_))


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int32", "bool"])
def test_norms_of_integer_matrices_are_float_like_numpy(engine, tmp_path, dtype):
    # int8 -128 and squares of 100 overflow in the input dtype: NumPy measures in float64
    x = np.array([[100, -128, 3], [90, 7, -1], [0, 1, 127]], dtype=np.int64)
    x = (x % 2 == 1) if dtype == "bool" else x.astype(dtype)
    a = ta.from_numpy(x, tmp_path / "i.zarr", tile=(2, 2))
    for ord_ in [None, 1, -1, np.inf, -np.inf]:
        got, want = np.linalg.norm(a, ord_).compute(), np.linalg.norm(x, ord_)
        assert np.asarray(got).dtype == np.asarray(want).dtype == np.float64
        assert_close(got, want)
    for axis in (0, 1):
        for ord_ in [None, 1, np.inf, 0, 3]:
            assert_close(ta.linalg.norm(a, ord_, axis=axis).compute(), np.linalg.norm(x, ord_, axis=axis))


@pytest.mark.parametrize("axis", [(0, 1), (1, 0), (-2, -1), (1,), (-1,)])
@pytest.mark.parametrize("ord_", [None, "fro", 1, -1, np.inf, -np.inf])
def test_norm_axis_tuples_like_numpy(engine, tmp_path, axis, ord_):
    """A 2-tuple axis is a matrix norm over (row axis, column axis) -- (1, 0)
    with ord=1 is the largest row sum -- and a 1-tuple a vector norm; they
    were all the vector norm of the flattened matrix (ord=1: the sum of |x|)."""
    x = np.arange(-6, 6, dtype=np.float64).reshape(3, 4) ** 2 * np.array([1, -1, 2, 5])
    a = ta.from_numpy(x, tmp_path / "n.zarr", tile=(2, 3))
    if ord_ == "fro" and len(axis) == 1:
        with pytest.raises(ta.PlanningError, match="invalid norm order"):
            ta.linalg.norm(a, ord_, axis=axis)
        return
    for keepdims in (False, True):
        assert_close(ta.linalg.norm(a, ord_, axis=axis, keepdims=keepdims).compute(),
                     np.linalg.norm(x, ord_, axis=axis, keepdims=keepdims))
    assert_close(np.linalg.norm(a, ord_, axis).compute(), np.linalg.norm(x, ord_, axis))


def test_norm_matrix_orders_numpy_refuses_are_refused(thread_engine, tmp_path):
    a = ta.from_numpy(np.ones((3, 4)), tmp_path / "n.zarr", tile=(2, 3))
    for ord_ in (0, 3, 0.5):
        with pytest.raises(ta.PlanningError, match="for matrices"):
            ta.linalg.norm(a, ord_, axis=(0, 1))
    for ord_ in (2, -2, "nuc"):  # singular values: supported, as NumPy
        assert_close(ta.linalg.norm(a, ord_, axis=(1, 0)).compute(),
                     np.linalg.norm(np.ones((3, 4)), ord_, axis=(1, 0)), scale=4.0)
    with pytest.raises(ta.PlanningError, match="distinct"):
        ta.linalg.norm(a, axis=(0, 0))


def test_reduction_errors(tmp_path, rng):
    a = ta.from_numpy(rng.standard_normal((5, 4)), tmp_path / "a.zarr", tile=(2, 2))
    with pytest.raises(ta.PlanningError, match="axis 2"):
        a.sum(axis=2)
    e = ta.from_numpy(np.zeros((0, 4)), tmp_path / "e.zarr", tile=(2, 2))
    with pytest.raises(ta.PlanningError, match=r"zero-size.*\(0, 4\)"):
        e.min(axis=0)


def test_reduction_to_zarr(engine, tmp_path, rng):
    x = rng.standard_normal((30, 20))
    a = ta.from_numpy(x, tmp_path / "a.zarr", tile=(8, 8))
    v = a.mean(axis=0).to_zarr(tmp_path / "m.zarr")
    import zarr

    assert_close(zarr.open_array(tmp_path / "m.zarr")[:], x.mean(0))
    assert_close(v, x.mean(0))


def test_tuple_axes_like_numpy(engine, tmp_path, rng):
    x = rng.standard_normal((23, 17))
    a = ta.from_numpy(x, tmp_path / "t.zarr", tile=(8, 8))
    assert_close(a.sum(axis=(0, 1)).compute(), x.sum(axis=(0, 1)))
    assert_close(a.mean(axis=(1, 0), keepdims=True).compute(), x.mean(axis=(1, 0), keepdims=True))
    assert_close(np.std(a, axis=(-1,)).compute(), np.std(x, axis=(-1,)))
    with pytest.raises(ta.PlanningError, match="out of bounds or repeated"):
        a.sum(axis=(0, 0))
    with pytest.raises(ta.PlanningError, match="out of bounds"):
        a.sum(axis=(0, 2))


@pytest.mark.parametrize("axis", ["0", 1.0, True, np.float64(0)])
def test_axis_that_is_not_an_integer_is_named_as_such(tmp_path, axis):
    """NumPy refuses these with a TypeError; not 'out of bounds' for axis="0",
    and not a sum over axis 1 for axis=True."""
    a = ta.from_numpy(np.ones((4, 3)), tmp_path / "t.zarr", tile=(2, 2))
    with pytest.raises(ta.PlanningError, match="axis must be an integer") as e:
        a.sum(axis=axis)
    assert repr(axis) in str(e.value)
    with pytest.raises(ta.PlanningError):
        a.mean(axis=(0, True))


def test_sibling_reductions_share_one_pass(tmp_path):
    """Reductions over the same stored arrays are lowered into one pass: each
    array is read once, and the results equal NumPy's; a pass that needs an
    earlier pass's result says it reads the array again."""
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((301, 170)), rng.standard_normal((301, 170))
    with ta.Engine(n_workers=1, memory_per_worker="160MiB", processes=False, quiet=True):
        a = ta.from_numpy(x, tmp_path / "a.zarr", tile=(64, 48))
        b = ta.from_numpy(y, tmp_path / "b.zarr", tile=(50, 170))
        one_pass = x.nbytes
        cases = [
            ((a * a).sum() + a.sum(), (x * x).sum() + x.sum(), one_pass),
            (a.mean(axis=0) * a.std(axis=0) + a.max(axis=0), x.mean(0) * x.std(0) + x.max(0),
             one_pass),
            ((a - b).sum(axis=1) + a.var(axis=1) - (a * b).min(axis=1),
             (x - y).sum(1) + x.var(1) - (x * y).min(1), 2 * one_pass),
            ((a - a.mean(axis=0)) / a.std(axis=0), (x - x.mean(0)) / x.std(0), 2 * one_pass),
        ]
        for expr, want, reads in cases:
            plan = expr.plan()
            assert plan.bytes_read == reads, str(plan)
            got = expr.compute()
            assert_close(got, want)
            assert expr.stats.bytes_read == plan.bytes_read
        plan = ((a - a.mean(axis=0)) / a.std(axis=0)).plan()
        assert "in one pass (2 reductions read each block once)" in str(plan)
        assert "again: it needs the result of an earlier pass" in str(plan)


def test_equal_expressions_built_twice_are_planned_once(tmp_path):
    """A user writes the same reduction or product twice (``(a - a.mean(0)).T
    @ (a - a.mean(0))``): each is computed once -- one mean in the pass, one
    temporary for the product -- so the centred Gram is the symmetric product
    and the memory a pass needs is not doubled; results equal NumPy's, and
    the run's figures equal the plan's."""
    rng = np.random.default_rng(8)
    x, y = rng.standard_normal((230, 70)), rng.standard_normal((70, 50))
    with ta.Engine(n_workers=1, memory_per_worker="200MiB", processes=False, quiet=True):
        a = ta.from_numpy(x, tmp_path / "a.zarr", tile=(64, 32))
        b = ta.from_numpy(y, tmp_path / "b.zarr", tile=(32, 50))
        gram = (a - a.mean(axis=0)).T @ (a - a.mean(axis=0))
        plan = gram.plan()
        reduce_stages = [s for s in plan.stages if s.kind == "reduce"]
        assert len(reduce_stages) == 1 and "in one pass" not in reduce_stages[0].description
        assert "symmetric" in str(plan)
        assert_close(gram.compute(), (x - x.mean(0)).T @ (x - x.mean(0)))
        assert gram.stats.bytes_read == plan.bytes_read
        twice = (a @ b).sum(axis=0) + (a @ b).max(axis=0)
        plan = twice.plan()
        assert [s.kind for s in plan.stages].count("matmul") == 1, str(plan)
        assert_close(twice.compute(), (x @ y).sum(0) + (x @ y).max(0))
        assert twice.stats.tasks == plan.tasks


def test_run_stats_count_every_pass(tmp_path):
    """RunStats tasks and bytes equal the plan's for every expression kind,
    including a reduction feeding a map, sibling reductions sharing a pass and
    a matmul temporary read by a later stage: the plan counts every graph task
    (combine trees, picks, barriers, squeezes, the small result's store)."""
    rng = np.random.default_rng(5)
    x, y = rng.standard_normal((120, 90)), rng.standard_normal((90, 120))
    with ta.Engine(n_workers=1, memory_per_worker="200MiB", processes=False, quiet=True):
        a = ta.from_numpy(x, tmp_path / "a.zarr", tile=(32, 40))
        b = ta.from_numpy(y, tmp_path / "b.zarr", tile=(40, 32))
        cases = [
            (a - a.mean(axis=0), x - x.mean(0)),
            ((a - a.mean(axis=0)).std(axis=0), (x - x.mean(0)).std(0)),
            ((a @ b) + 1, x @ y + 1),
            ((a @ b).sum(axis=1), (x @ y).sum(1)),
            (a.sum() + (a / a.max()).sum(), x.sum() + (x / x.max()).sum()),
            ((a * a).sum(axis=1) + a.sum(axis=1), (x * x).sum(1) + x.sum(1)),
            ((a - a.mean(axis=0)) / a.std(axis=0), (x - x.mean(0)) / x.std(0)),
            (a.T @ a, x.T @ x),
        ]
        for i, (expr, want) in enumerate(cases):
            plan = expr.plan()
            assert plan.tasks == len(expr._lower().graph()), (i, str(plan))
            assert_close(expr.compute(), want)
            assert expr.stats.tasks == plan.tasks, (i, str(plan))
            assert expr.stats.bytes_read == plan.bytes_read, (i, str(plan))
            assert expr.stats.bytes_written == plan.bytes_written, (i, str(plan))
            out = tmp_path / f"o{i}.zarr"
            plan = expr.plan(out)
            expr.to_zarr(out)
            assert expr.stats.tasks == plan.tasks, (i, str(plan))
            assert expr.stats.bytes_read == plan.bytes_read, (i, str(plan))
            assert expr.stats.bytes_written == plan.bytes_written, (i, str(plan))


def test_large_vector_results_are_written_by_workers(tmp_path, monkeypatch):
    """A reduction's vector written with to_zarr is stored by a worker task (the
    plan says so, and what compute() would bring to the driver); above
    SMALL_RETURN the stored zarr.Array is returned, not a NumPy copy."""
    import zarr

    from tilearray.storage import commit

    rng = np.random.default_rng(9)
    x = rng.standard_normal((700, 60))
    with ta.Engine(n_workers=1, memory_per_worker="200MiB", processes=False, quiet=True):
        a = ta.from_numpy(x, tmp_path / "a.zarr", tile=(128, 60))
        expr = (a * 2).sum(axis=1)
        assert f"compute() brings {700 * 8 / 1024:.2f} kiB to the driver" in str(expr.plan())
        plan = expr.plan(tmp_path / "r.zarr")
        assert "a worker writes the (700,) result into" in str(plan)
        assert plan.bytes_written == 700 * 8
        monkeypatch.setattr(commit, "SMALL_RETURN", 1000)
        got = expr.to_zarr(tmp_path / "r.zarr")
        assert isinstance(got, zarr.Array) and got.read_only
        assert_close(got[...], (x * 2).sum(axis=1))
        assert expr.stats.bytes_written == 700 * 8 and expr.stats.bytes_read == x.nbytes
        small = a.sum().to_zarr(tmp_path / "s.zarr")  # under the limit: a NumPy value
        assert isinstance(small, np.ndarray) and small == pytest.approx(x.sum())


def test_var_of_mean_centred_input_reads_it_once(tmp_path):
    """``(a - a.mean(axis)).var(axis)`` / ``.std`` is lowered as ``a.var(axis)``
    (a shift along the reduced axis leaves the variance unchanged; the plan
    says so): ``a`` is read once, and the values equal NumPy's. Other shifts
    (another array's mean, a mean broadcast along the wrong axis) are left as
    written, read twice and still correct."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((90, 90)) * 3 + 7
    z = rng.standard_normal((90, 90))
    with ta.Engine(n_workers=1, memory_per_worker="200MiB", processes=False, quiet=True):
        a = ta.from_numpy(x, tmp_path / "a.zarr", tile=(32, 40))
        c = ta.from_numpy(z, tmp_path / "c.zarr", tile=(32, 40))
        once = [
            ((a - a.mean(axis=0)).std(axis=0), (x - x.mean(0)).std(0)),
            ((a - a.mean(axis=0)).var(axis=0, ddof=1), (x - x.mean(0)).var(0, ddof=1)),
            ((a - a.mean(axis=1, keepdims=True)).var(axis=1),
             (x - x.mean(1, keepdims=True)).var(1)),
            ((a - a.mean()).std(), (x - x.mean()).std()),
            (((a * 2) - (a * 2).mean(axis=0)).std(axis=0), (2 * x - (2 * x).mean(0)).std(0)),
        ]
        for expr, want in once:
            plan = expr.plan()
            assert plan.bytes_read == x.nbytes and "computed unshifted" in str(plan), str(plan)
            assert_close(expr.compute(), want)
            assert expr.stats.bytes_read == x.nbytes and expr.stats.tasks == plan.tasks
        twice = [
            ((a - c.mean(axis=0)).std(axis=0), (x - z.mean(0)).std(0)),
            # (90,) broadcasts as a row: not constant along axis 1, so not a shift of it
            ((a - a.mean(axis=1)).var(axis=1), (x - x.mean(1)).var(1)),
            ((a - a.max(axis=0)).var(axis=0), (x - x.max(0)).var(0)),
        ]
        for expr, want in twice:
            plan = expr.plan()
            assert "computed unshifted" not in str(plan), str(plan)
            assert plan.bytes_read == 2 * x.nbytes or plan.bytes_read == x.nbytes + z.nbytes
            assert_close(expr.compute(), want)


@pytest.mark.parametrize("axis", [0, -1, 1, (0,), ()])
@pytest.mark.parametrize("op", ["sum", "max", "argmin", "count_nonzero", "nanmean", "mean", "std"])
def test_reductions_of_a_0d_result_take_numpys_axes(engine, tmp_path, op, axis):
    """A reduction of a 0-d result (``a.sum()``) with axis 0 or -1: NumPy's
    ufunc reductions reduce the scalar, mean/var/std and tuples refuse; it
    was a ZeroDivisionError (axis 0) or an out-of-bounds error (axis -1)."""
    x = np.arange(12.0).reshape(3, 4) - 5
    a = ta.from_numpy(x, tmp_path / "z.zarr", tile=(2, 3))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            want = getattr(np, op)(x.sum(), axis=axis)
    except (ValueError, TypeError):
        with pytest.raises(ta.PlanningError, match="axis"):
            getattr(np, op)(a.sum(), axis=axis)
        return
    got = getattr(np, op)(a.sum(), axis=axis).compute()
    assert np.asarray(got).dtype == np.asarray(want).dtype
    assert_close(got, want)


@pytest.mark.timeout(300)
def test_fused_reductions_price_their_temporaries_by_strip(tmp_path):
    """Reductions sharing a pass evaluate their expressions strip by strip,
    so their temporaries are one strip's, not one block's. The census of
    ``np.percentile(a, q)`` over all elements (NaNs, infinities, finite min
    and max: five reductions of one pass) was planned at 128 MiB a task for
    a 4000 x 4000 matrix in 1000 x 1000 chunks, where its sum plans 27 MiB,
    and refused at 200 MiB a worker (helper-44). It plans under the budget,
    every worker's RSS stays under its limit and within its baseline plus the
    planned task, and the quantiles are NumPy's."""
    import zarr

    rng = np.random.default_rng(5)
    x = rng.standard_normal((4000, 4000))
    x[3, 7], x[2500, 3999] = np.inf, -np.inf
    zarr.create_array(str(tmp_path / "x.zarr"), data=x, chunks=(1000, 1000))
    with ta.Engine(n_workers=2, threads_per_worker=1, memory_per_worker="200MiB",
                   quiet=True) as eng:
        budget = eng.budget()
        a = ta.open(tmp_path / "x.zarr")
        finite = np.where(np.isfinite(a), a, np.nan)
        census = np.stack([np.isnan(a).sum(), (a == -np.inf).sum(), (a == np.inf).sum(),
                           np.nanmin(finite), np.nanmax(finite)])
        plan = census.plan()
        assert [s.kind for s in plan.stages][0] == "reduce" and plan.bytes_read == x.nbytes
        assert plan.peak_task_memory <= budget.task_memory, str(plan)
        got = census.compute()
        fin = x[np.isfinite(x)]
        assert_close(got, [0, 1, 1, fin.min(), fin.max()])
        assert 0 < census.stats.peak_worker_memory <= budget.memory_per_worker
        assert census.stats.peak_worker_memory <= budget.baseline + plan.peak_task_memory, \
            (census.stats, str(plan))
        assert_close(np.asarray(np.percentile(a, [5, 50, 95])), np.percentile(x, [5, 50, 95]))
        assert float(np.median(a)) == np.median(x)


@pytest.mark.parametrize("func", [np.var, np.std, np.nanvar, np.nanstd])
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.int32])
def test_variance_about_a_given_mean_like_numpy(thread_engine, func, dtype):
    """NumPy 2's ``mean=``: the spread about the mean given (any broadcasting
    array, a scalar, or a lazy result), with ``ddof`` (NaN where the
    nan-variants' slices have none left) and ``keepdims``; as NumPy's in
    value, shape and dtype (helper-44: refused as unsupported)."""
    rng = np.random.default_rng(9)
    x = (rng.standard_normal((130, 45)) * 10).astype(dtype)
    if x.dtype.kind == "f":
        x[5, 3], x[:, 9] = np.nan, np.nan
    a = ta.from_numpy(x, f"memory://var-about-{func.__name__}-{x.dtype}", tile=(50, 20))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        centre = [(None, 0.5), (0, np.nanmean(x, 0, keepdims=True)),
                  (1, np.nanmean(x, 1, keepdims=True)), (0, np.zeros(45, x.dtype))]
        for axis, mean in centre:
            for ddof, keepdims in [(0, False), (1, True), (130, False)]:
                want = func(x, axis=axis, mean=mean, ddof=ddof, keepdims=keepdims)
                got = np.asarray(func(a, axis=axis, mean=mean, ddof=ddof,
                                      keepdims=keepdims).compute(engine=thread_engine))
                assert got.shape == np.shape(want) and got.dtype == np.asarray(want).dtype
                tol = 1e-5 if x.dtype == np.float32 else 1e-12
                np.testing.assert_allclose(got, want, rtol=tol, equal_nan=True)
        lazy = a.mean(axis=0, keepdims=True)  # a lazy mean: the same as the data's own
        if x.dtype.kind != "f":
            assert_close(a.var(axis=0, mean=lazy).compute(engine=thread_engine), x.var(0))


@pytest.mark.parametrize("make", [
    lambda a: np.full_like(a, 3), lambda a: np.ones_like(a) * 2,
    lambda a: np.zeros_like(a) + 1, lambda a: np.full_like(a, 7, dtype=np.int32)],
    ids=["full_like", "ones_times_2", "zeros_plus_1", "full_like_int32"])
def test_constant_arrays_reduce_and_multiply_like_numpy(thread_engine, make):
    """A lazy constant (``np.full_like(a, 3)``, ``np.ones_like(a) * 2``) reads
    nothing; each block is its value broadcast over the block. A block used
    to be the bare scalar: ``np.full_like(a, 3).sum()`` gave 51 (one 3 per
    block) for 6,300,000, ``sum(axis=0)`` and ``std()`` failed (helper-45)."""
    x = np.zeros((3000, 700))
    a = ta.from_numpy(x, "memory://constant-reductions", tile=(1024, 300), overwrite=True)
    c, want = make(a), make(x)
    for f in (lambda v: v.sum(), lambda v: v.sum(axis=0), lambda v: v.sum(axis=1, keepdims=True),
              lambda v: v.prod(axis=0), lambda v: v.std(), lambda v: v.mean(axis=1),
              lambda v: np.count_nonzero(v, axis=0), lambda v: v.max(axis=0),
              lambda v: np.cumsum(v, axis=0)[-3:, :4], lambda v: v[:, :5].T @ v[:, :7],
              lambda v: v @ np.arange(700.0)):
        got, exp = f(c), f(want)
        got = np.asarray(got.compute(engine=thread_engine))
        assert got.shape == exp.shape and got.dtype == exp.dtype
        np.testing.assert_array_equal(got, exp)
    np.testing.assert_array_equal(c[:2, :3].compute(engine=thread_engine), want[:2, :3])


def test_blocked_vector_indexed_like_numpy(thread_engine):
    """``(a @ w)[:3]``, ``v[[5, 1]]``, ``v[v > 0]`` of a blocked 1-D product:
    computed, then indexed by NumPy's rules (it was refused: "a 1-D product
    is not held in memory", helper-45)."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3000, 70))
    a = ta.from_numpy(x, "memory://blocked-vector-index", tile=(1024, 30), overwrite=True)
    v, w = a @ np.ones(70), x @ np.ones(70)
    for key in (slice(None, 3), [5, 1], -1, slice(None, None, -7)):
        assert_close(np.asarray(v[key].compute(engine=thread_engine)), w[key])
    assert_close(np.asarray(v[v > 0].compute(engine=thread_engine)), w[w > 0])


def test_initial_on_methods_and_zero_size_like_numpy(thread_engine):
    """NumPy's ``initial=`` on the methods (keyword and positional) as on the
    functions; a zero-size reduction with it is ``initial`` itself, also
    for max / min, which have no identity (helper-45: the methods refused
    the keyword; ``np.max(a[5:5], axis=0, initial=-1.0)`` was refused)."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((300, 70))
    a = ta.from_numpy(x, "memory://initial-methods", tile=(128, 30), overwrite=True)
    cases = [(lambda v: v.sum(0, initial=10)), (lambda v: v.max(1, initial=1.5)),
             (lambda v: v.min(initial=-0.5)), (lambda v: v[:3].prod(0, None, None, False, 2.0)),
             (lambda v: v.max(0, None, True, 0.25)), (lambda v: v[5:5].max(0, initial=-1.0)),
             (lambda v: v[:, 3:3].min(1, initial=7.0)), (lambda v: v[5:5].sum(initial=3.0)),
             (lambda v: np.max(v[5:5], axis=0, initial=-1.0)),
             (lambda v: np.nansum(v, axis=1, initial=2.0)),
             (lambda v: v.astype(np.int32).sum(0, np.int64, initial=4))]
    for f in cases:
        want = f(x)
        got = np.asarray(f(a).compute(engine=thread_engine))
        assert got.shape == np.shape(want) and got.dtype == np.asarray(want).dtype
        assert_close(got, want)


def test_correction_is_numpys_ddof(thread_engine):
    """NumPy 2's ``correction=`` of np.var / np.std (and nan forms) is the
    ddof when given: it was ignored beside ``ddof=0`` (ddof 0 used) and
    taken over a nonzero ddof, which NumPy refuses (helper-46)."""
    x = np.random.default_rng(0).standard_normal((1000, 4))
    a = ta.from_numpy(x, "memory://correction", tile=(250, 4), overwrite=True)
    for f in (np.std, np.var, np.nanvar):
        for kw in ({"ddof": 0, "correction": 1}, {"correction": 2}, {"ddof": 1}):
            assert_close(f(a, axis=0, **kw).compute(engine=thread_engine), f(x, axis=0, **kw))
        with pytest.raises(ValueError, match="ddof and correction can't be provided"):
            f(a, axis=0, ddof=1, correction=0)


def test_reduction_to_zarr_keeps_the_tile_and_refuses_bad_ones(thread_engine, tmp_path):
    """``a.sum(0).to_zarr(p, tile=, shard=)`` stores the vector in those
    chunks and shards; a bad tile is refused before anything is created, as
    for a matrix or ``X @ w`` (helper-46: tile=100 was ignored, 0, -5, 2.5 and
    (10, 10) accepted)."""
    import zarr

    x = np.random.default_rng(0).standard_normal((400, 300))
    a = ta.from_numpy(x, tmp_path / "a.zarr", tile=(100, 100))
    for kw, chunks, shards in [({"tile": 100}, (100,), None), ({"tile": (64,)}, (64,), None),
                               ({"tile": 50, "shard": 150}, (50,), (150,))]:
        a.sum(0).to_zarr(tmp_path / "s.zarr", overwrite=True, engine=thread_engine, **kw)
        z = zarr.open_array(tmp_path / "s.zarr", mode="r")
        assert z.chunks == chunks and z.shards == shards
        assert_close(z[...], x.sum(0))
    for tile in (0, -5, 2.5, (10, 10)):
        with pytest.raises(ValueError, match=rf"tile of a 1-D result must be a positive integer "
                           rf"or \(t,\), got {re.escape(repr(tile))}"):
            a.sum(0).to_zarr(tmp_path / "bad.zarr", tile=tile, engine=thread_engine)
        assert not (tmp_path / "bad.zarr").exists()
    with pytest.raises(ValueError, match="shard 120 is not a positive multiple of the tile 50"):
        a.sum(0).to_zarr(tmp_path / "bad.zarr", tile=50, shard=120, engine=thread_engine)
    with pytest.raises(ValueError, match="given for a 0-d result"):
        a.sum().to_zarr(tmp_path / "bad.zarr", tile=10, engine=thread_engine)
    assert not (tmp_path / "bad.zarr").exists()
