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
