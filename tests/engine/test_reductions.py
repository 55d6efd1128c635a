import warnings

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
        rtol = 1e-5 if dtype == "float32" or op == "prod" else 1e-10
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
    with pytest.raises(ta.PlanningError, match="ord=2"):
        ta.linalg.norm(a, 2)


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
