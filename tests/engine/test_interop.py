import dask.array as da
import numpy as np
import pytest

import tilearray as ta
from tilearray.testing import assert_close


def test_dask_round_trip_and_asarray(engine, tmp_path, rng):
    x = rng.standard_normal((50, 30))
    a = ta.from_dask(da.from_array(x, chunks=(16, 10)), tmp_path / "d.zarr")
    assert a.grid.tile == (16, 10)
    np.testing.assert_array_equal(np.asarray(a), x)
    np.testing.assert_array_equal(a.to_dask().compute(), x)
    assert_close(np.asarray(a * 2), 2 * x)
    with pytest.raises(ta.PlanningError, match="stored array"):
        (a * 2).to_dask()


def test_from_dask_writes_tile_aligned_blocks_without_dask_warnings(tmp_path, rng):
    """The README's ta.from_dask(x, path) on a dask array whose chunks do not
    divide its shape: written in the array's own tiles (no rechunk to dask's
    128 MiB "auto" chunks), and no PerformanceWarning about 'risk of data loss'."""
    import warnings

    x = rng.standard_normal((1000, 64))
    d = da.from_array(x, chunks=(256, 64)) * 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        a = ta.from_dask(d, tmp_path / "d.zarr")
    assert a.grid.tile == (256, 64)
    assert_close(np.asarray(a), 2 * x)
    s = ta.from_dask(d, tmp_path / "s.zarr", shard=(512, 64))
    assert s.grid.unit == (512, 64)
    assert_close(np.asarray(s), 2 * x)


@pytest.mark.parametrize("how", ["to_dask", "from_zarr", "from_zarr_v2", "inline"])
def test_from_dask_refuses_to_replace_what_its_graph_reads(tmp_path, rng, how):
    """ta.from_dask(x, path, overwrite=True) where x reads path: the target
    was cleared before x was computed, leaving zeros; refused as to_zarr is,
    nothing touched."""
    import zarr

    x = rng.standard_normal((6, 8))
    p = tmp_path / "a.zarr"
    if how == "from_zarr_v2":
        zarr.create_array(str(p), shape=x.shape, chunks=(4, 4), dtype="f8",
                          zarr_format=2)[...] = x
    else:
        ta.from_numpy(x, p, tile=(4, 4))
    d = {"to_dask": lambda: ta.open(p).to_dask(), "from_zarr": lambda: da.from_zarr(str(p)),
         "from_zarr_v2": lambda: da.from_zarr(str(p)),
         "inline": lambda: da.from_array(zarr.open_array(str(p)), inline_array=True)}[how]()
    with pytest.raises(ta.StorageError, match="holds an input of the dask array"):
        ta.from_dask(d * 2, p, overwrite=True)
    np.testing.assert_array_equal(zarr.open_array(str(p), mode="r")[...], x)
    out = ta.from_dask(d * 2, tmp_path / "b.zarr")  # elsewhere: fine
    assert_close(np.asarray(out), 2 * x)


def test_memory_urls_are_refused_where_worker_processes_cannot_see_them(engine, thread_engine,
                                                                       tmp_path):
    """fsspec's memory:// is this process's alone: tasks in worker processes
    found it empty and failed with a bare Exception saying "(deleted?)".
    Refused before any work, naming it; threads of this process read it."""
    import uuid

    import zarr

    url = f"memory://{uuid.uuid4().hex}/m.zarr"
    z = zarr.create_array(url, shape=(4, 4), chunks=(2, 2), dtype="f8", fill_value=1.5)
    for a in (ta.open(z), ta.open(url)):
        with pytest.raises(ta.StorageError, match="memory:// filesystem lives in this process"):
            a.sum().compute(engine=engine)
        with pytest.raises(ta.StorageError, match="memory://"):
            (a * 2).to_zarr(tmp_path / "out.zarr", engine=engine)
        assert not (tmp_path / "out.zarr").exists()
        assert float(a.sum().compute(engine=thread_engine)) == 24.0
    x = ta.from_numpy(np.ones((3, 3)), tmp_path / "x.zarr")
    with pytest.raises(ta.StorageError, match="cannot write.*memory://"):
        (x * 2).to_zarr(f"memory://{uuid.uuid4().hex}/out.zarr", engine=thread_engine)


def test_from_dask_of_a_vector_and_an_unwritable_scratch_directory(thread_engine, tmp_path, rng):
    """1-D dask arrays are stored as from_numpy stores 1-D arrays (to_dask()
    of a vector came back refused), ragged shards too; a scratch directory
    that cannot be made is a StorageError naming the config key."""
    import dask

    v = rng.standard_normal(1000)
    a = ta.from_dask(da.from_array(v, chunks=300), tmp_path / "v.zarr")
    assert a.shape == (1000,) and a.grid.tile[:1] == (300,)
    np.testing.assert_array_equal(a.compute(), v)
    s = ta.from_dask(da.from_array(v, chunks=100), tmp_path / "s.zarr", shard=300)
    assert s.grid.unit[:1] == (300,)
    np.testing.assert_array_equal(np.asarray(ta.from_dask(s.to_dask() * 2)), 2 * v)
    with pytest.raises(ta.StorageError, match="1-D or 2-D"):
        ta.from_dask(da.zeros((2, 2, 2)), tmp_path / "c.zarr")
    blocked = tmp_path / "file"
    blocked.write_text("")
    with dask.config.set({"tilearray.temporary-directory": str(blocked / "sub")}), \
            pytest.raises(ta.StorageError, match="tilearray.temporary-directory"):
        ta.from_numpy(v)


def test_compute_refuses_large_results(tmp_path, rng):
    import dask

    a = ta.from_numpy(rng.standard_normal((40, 40)), tmp_path / "a.zarr", tile=(10, 10))
    with dask.config.set({"tilearray.compute.max-result-size": "1kiB"}):
        with pytest.raises(ta.PlanningError, match="to_zarr"):
            (a + 1).compute()


def test_config_from_environment(monkeypatch):
    import dask

    monkeypatch.setenv("DASK_TILEARRAY__REDUCTION__SPLIT_EVERY", "3")
    dask.config.refresh()
    try:
        from tilearray import _config

        assert _config.get("reduction.split-every") == 3
    finally:
        monkeypatch.delenv("DASK_TILEARRAY__REDUCTION__SPLIT_EVERY")
        dask.config.refresh()


def test_repr_html(tmp_path, rng):
    a = ta.from_numpy(rng.standard_normal((40, 40)), tmp_path / "a.zarr", tile=(10, 10),
                      shard=(20, 20))
    html = a._repr_html_()
    assert "<svg" in html and "(20, 20)" in html
    assert "shape=(40, 40)" in repr(a)


# -- xarray: outputs as members of a Zarr group ---------------------------------------


def test_group_members_open_in_xarray(engine, tmp_path, rng):
    import warnings

    import xarray as xr

    x, y = rng.standard_normal((40, 30)), rng.standard_normal((30, 20))
    g = tmp_path / "results.zarr"
    a = ta.from_numpy(x, g, name="A", tile=(16, 16))
    b = ta.random((30, 20), g, name="B", tile=(16, 16), seed=3)
    y = np.asarray(b)
    assert a.dims == ("A_row", "A_col") and b.dims == ("B_row", "B_col")
    c = (a @ b).to_zarr(g, name="C")
    m = a.mean(axis=0).to_zarr(g, name="colmean")
    gram = (a.T @ a).to_zarr(g, name="G", tile=(10, 10))
    assert c.dims == ("A_row", "B_col") and gram.dims == ("G_row", "G_col")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # consolidated: no fallback warning
        ds = xr.open_zarr(g)
    assert set(ds.data_vars) == {"A", "B", "C", "colmean", "G"}
    assert ds.C.dims == ("A_row", "B_col") and ds.colmean.dims == ("A_col",)
    assert_close(ds.C.values, x @ y)
    assert_close(ds.colmean.values, x.mean(axis=0))
    assert_close(m, x.mean(axis=0))
    assert_close(ds.G.values, x.T @ x)
    np.testing.assert_array_equal(ds.A.values, x)  # zeros are not masked as fill values
    # each member still opens with ta.open, and as a DataArray
    assert_close(np.asarray(ta.open(g, "C")), x @ y)
    da_ = ta.open(g, "C").to_xarray()
    assert da_.name == "C" and da_.dims == ("A_row", "B_col")
    assert_close(da_.values, x @ y)


def test_group_member_resume_overwrite_and_guards(engine, tmp_path, rng):
    import xarray as xr
    import zarr

    x = rng.standard_normal((24, 24))
    g = tmp_path / "g.zarr"
    zarr.open_group(str(g), mode="w").attrs["owner"] = "me"
    a = ta.from_numpy(x, g, name="A", tile=(8, 8))
    c = (a * 2).to_zarr(g, name="C")
    with pytest.raises(ta.StorageError, match="already exists"):
        (a * 2).to_zarr(g, name="C")
    again = (a * 2).to_zarr(g, name="C", resume=True)  # complete: nothing rerun
    assert_close(np.asarray(again), 2 * x)
    (a + 1).to_zarr(g, name="C", overwrite=True)  # replaces C only
    ds = xr.open_zarr(g)
    assert_close(ds.C.values, x + 1)
    np.testing.assert_array_equal(ds.A.values, x)
    assert ds.attrs["owner"] == "me"
    b = ta.from_numpy(x, tmp_path / "b.zarr", tile=(8, 8))
    for expr in (b * 2, b.sum(axis=0)):
        with pytest.raises(ta.StorageError, match="not a Zarr array"):
            expr.to_zarr(g, overwrite=True)  # the group itself is never wiped
    with pytest.raises(ta.StorageError, match="holds an input"):
        (a * 2).to_zarr(g, overwrite=True)
    with pytest.raises(ta.StorageError, match="not a Zarr array"):
        ta.from_numpy(x, g, overwrite=True)
    with pytest.raises(ta.StorageError, match="is a Zarr group"):
        ta.open(g)
    assert ta.open(g, "A").shape == (24, 24) and c.path.endswith("C")


def test_dims_choice_and_conflicts(engine, tmp_path, rng):
    g = tmp_path / "g.zarr"
    a = ta.from_numpy(rng.standard_normal((12, 8)), g, name="A", tile=(4, 4),
                      dims=("time", "sensor"))
    assert a.dims == ("time", "sensor") and a.T.dims == ("sensor", "time")
    assert a.sum(axis=1).dims == ("time",) and a[:4].dims is None
    # derived names are kept when sizes agree with the group ...
    assert (a - a.mean(axis=0)).to_zarr(g, name="Z").dims == ("time", "sensor")
    # ... and replaced by name-prefixed ones when not (sensor x sensor repeats a name)
    assert (a.T @ a).to_zarr(g, name="cov").dims == ("cov_row", "cov_col")
    with pytest.raises(ta.StorageError, match="'time'.*size 8.*size 12"):
        ta.from_numpy(np.ones((8, 8)), g, name="B", dims=("time", "lag"))
    with pytest.raises(ta.StorageError, match="distinct"):
        ta.from_numpy(np.ones((8, 8)), g, name="B", dims=("x", "x"))
    # a bare array (no group) keeps the plain names
    assert ta.from_numpy(np.ones((3, 3)), tmp_path / "bare.zarr").dims == ("row", "col")


def test_outputs_of_a_plain_zarr_input_share_its_dims(engine, tmp_path, rng):
    """An input written by plain zarr has no dimension names: outputs name
    its axes after it (``X_row``, ``X_col``), so a centred X and its column
    means line up in xarray (each member had got its own names, helper-50)."""
    import xarray as xr
    import zarr

    x = rng.standard_normal((50, 6))
    z = zarr.create_array(tmp_path / "X.zarr", shape=x.shape, chunks=(13, 4), dtype="f8")
    z[...] = x
    v2 = zarr.create_array(tmp_path / "data.zarr", shape=(50,), chunks=(7,), dtype="f8",
                           zarr_format=2)
    v2[...] = x[:, 0]
    a, y = ta.open(tmp_path / "X.zarr"), ta.open(tmp_path / "data.zarr")
    assert a.dims is None and y.dims is None  # nothing stored: nothing claimed
    g = tmp_path / "res.zarr"
    for name, expr, dims in [("Z", a - a.mean(0), ("X_row", "X_col")), ("mean", a.mean(0),
                             ("X_col",)), ("y2", y * 2, ("data_row",)),
                             ("G", a.T @ a, ("G_row", "G_col")),  # G: X_col twice
                             ("med", np.median(a, axis=0), ("X_col",)),
                             ("q", np.percentile(a, [5, 95], axis=0), ("q_row", "X_col")),
                             ("s", np.sort(a, axis=0), ("X_row", "X_col")),
                             ("c", np.cumsum(a, axis=1), ("X_row", "X_col")),
                             ("first3", a[:, :3], ("X_row", "first3_col")),
                             ("picked", a[[0, 5, 7]], ("picked_row", "X_col"))]:
        expr.to_zarr(g, name=name)
        assert ta.open(g, name).dims == dims
    ds = xr.open_zarr(g)
    assert ds.Z.dims == ("X_row", "X_col") and ds["mean"].dims == ("X_col",)
    assert_close((ds.Z + ds["mean"]).values, x)  # aligned by name, as xarray does


def test_incomplete_member_and_lock_do_not_confuse_xarray(engine, tmp_path, rng):
    import xarray as xr

    from tilearray.storage import ArrayRef
    from tilearray.storage import array as sarray

    x = rng.standard_normal((16, 16))
    g = tmp_path / "g.zarr"
    ta.from_numpy(x, g, name="A", tile=(8, 8))
    ref = ArrayRef.from_location(g, "A")
    sarray.acquire_lock(ref)  # a live writer: its lock beside A/ (A.tilearray.lock), done markers in A/
    try:
        ds = xr.open_zarr(g, consolidated=False)
        np.testing.assert_array_equal(ds.A.values, x)
    finally:
        sarray.release_lock(ref)


# -- NumPy protocols --------------------------------------------------------------------


@pytest.fixture
def small(tmp_path, rng):
    x = rng.standard_normal((30, 20))
    return x, ta.from_numpy(x, tmp_path / "a.zarr", tile=(8, 8))


def test_numpy_functions_are_lazy_and_match(engine, small):
    x, a = small
    cases = [
        (np.sum(a), np.sum(x)), (np.mean(a, axis=0), np.mean(x, axis=0)),
        (np.std(a, axis=1, ddof=1), np.std(x, axis=1, ddof=1)),
        (np.var(a, 0, keepdims=True), np.var(x, 0, keepdims=True)),
        (np.max(a, axis=0), np.max(x, axis=0)), (np.amin(a), np.amin(x)),
        (np.argmax(a, axis=1), np.argmax(x, axis=1)),
        (np.count_nonzero(a > 0, axis=0), np.count_nonzero(x > 0, axis=0)),
        (np.sum(a, dtype="float32"), np.sum(x, dtype="float32")),
        (np.matmul(a.T, a), x.T @ x), (np.dot(a, a.T), x @ x.T),
        (np.transpose(a), x.T), (np.clip(a, -1, 1), np.clip(x, -1, 1)),
        (np.linalg.norm(a), np.linalg.norm(x)),
        (np.linalg.norm(a, axis=0), np.linalg.norm(x, axis=0)),
        (np.mean(a - np.mean(a, axis=0), axis=0), np.mean(x - np.mean(x, axis=0), axis=0)),
    ]
    for got, want in cases:
        assert isinstance(got, ta.TiledArray), got
        v = got.compute()
        assert np.shape(v) == np.shape(want)
        assert_close(v, want, scale=np.abs(x).max())  # the last case cancels to ~1e-17
    assert np.shape(a) == (30, 20) and np.ndim(a) == 2 and np.size(a) == 600
    with pytest.raises(TypeError,
                       match=r"numpy\.kron of a 30 x 20 TiledArray is not supported.*README.*asarray"):
        np.kron(a, a)
    np.testing.assert_array_equal(np.sort(a).compute(), np.sort(x))  # along the last axis
    assert_close(np.asarray(np.cumsum(a)), np.cumsum(x))  # the flattened array, gathered now
    with pytest.raises(TypeError, match="out= is not supported"):
        np.sum(a, out=np.empty(()))


def test_scalar_conversions(engine, small):
    x, a = small
    assert float(a.sum()) == pytest.approx(x.sum())
    assert float(np.mean(a)) == pytest.approx(x.mean())
    assert int((a > 0).sum()) == int((x > 0).sum())
    assert bool(a.max() > 0) is True and bool((a > 100).any()) is False
    assert complex(a.min()) == pytest.approx(complex(x.min()))
    assert [0, 1, 2][(a > 100).sum()] == 0  # __index__ on an integer result
    assert float(a[3:4, 5:6]) == pytest.approx(x[3, 5])
    with pytest.raises(TypeError, match="size-1"):
        float(a.sum(axis=0))
    with pytest.raises(ValueError, match="ambiguous"):
        bool(a > 0)
    with pytest.raises(TypeError, match="integer"):
        [0][a.sum()]
    rows = [r for _, r in zip(range(3), a, strict=False)]  # iteration: the rows, lazily
    assert [r.shape for r in rows] == [(x.shape[1],)] * 3
    np.testing.assert_array_equal(np.stack([np.asarray(r) for r in rows]), x[:3])
    assert_close(np.array(list(a.sum(axis=1))), x.sum(axis=1))  # a vector: its values


def test_complex_values_refused(small):
    x, a = small
    for make in (lambda: a * 1j, lambda: a + np.complex64(1), lambda: 1j - a,
                 lambda: a.astype("complex128"), lambda: a.mean(axis=0) * 2j):
        with pytest.raises(ta.PlanningError, match="complex|not supported"):
            make()


def test_shard_without_tile_is_a_clear_error(engine, small, tmp_path):
    x, a = small  # tile (8, 8)
    with pytest.raises(ta.PlanningError, match=r"shard \(12, 12\).*tile \(8, 8\).*tile=\(6, 6\)"):
        (a + 1).to_zarr(tmp_path / "o.zarr", shard=(12, 12))
    with pytest.raises(ta.PlanningError, match="inherited"):
        (a + 1).plan(shard=(12, 12))
    out = (a + 1).to_zarr(tmp_path / "o.zarr", shard=(16, 16))  # a multiple: fine
    assert out.grid.unit == (16, 16)
    assert_close(np.asarray(out), x + 1)


def test_resume_with_other_tiling_is_refused(engine, small, tmp_path):
    x, a = small
    (a * 3).to_zarr(tmp_path / "o.zarr", tile=(10, 10))
    with pytest.raises(ta.StorageError, match=r"tile=\(5, 5\).*tile=\(10, 10\)"):
        (a * 3).to_zarr(tmp_path / "o.zarr", tile=(5, 5), resume=True)
    with pytest.raises(ta.StorageError, match=r"shard=\(20, 20\).*shard=None"):
        (a * 3).to_zarr(tmp_path / "o.zarr", shard=(20, 20), resume=True)
    same = (a * 3).to_zarr(tmp_path / "o.zarr", tile=(10, 10), resume=True)
    assert_close(np.asarray(same), 3 * x)


# -- config schema -------------------------------------------------------------------------


def _schema():
    import importlib.resources

    import yaml

    text = importlib.resources.files("tilearray").joinpath("tilearray-schema.yaml").read_text()
    return yaml.safe_load(text)


def test_config_schema_validates_defaults_and_reports_errors():
    import copy

    import dask
    import jsonschema
    import yaml

    from tilearray import _config

    schema = _schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    with open(_config._fn) as f:
        shipped = yaml.safe_load(f)
    validator.validate(shipped)
    validator.validate({"tilearray": dask.config.get("tilearray")})  # what is in effect
    # every shipped key is described (no key without a schema entry)
    props = schema["properties"]["tilearray"]["properties"]
    for section, values in shipped["tilearray"].items():
        assert section in props
        if isinstance(values, dict):
            assert set(values) <= set(props[section]["properties"]), section
    bad = copy.deepcopy(shipped)
    bad["tilearray"]["reduction"]["split-every"] = "fast"
    bad["tilearray"]["memory"]["worker-baseline"] = "lots"
    bad["tilearray"]["storage"]["read-retrys"] = 3
    errors = {"/".join(map(str, e.absolute_path)) for e in validator.iter_errors(bad)}
    assert errors == {"tilearray/reduction/split-every", "tilearray/memory/worker-baseline",
                      "tilearray/storage"}  # the typo is an unknown key of storage


def test_member_added_to_an_xarray_written_group(engine, tmp_path, rng):
    import xarray as xr

    g = tmp_path / "xr.zarr"
    t = np.arange(5.0)
    xr.Dataset({"temp": ("time", t)}, attrs={"title": "t"}).to_zarr(g, zarr_format=3)
    x = rng.standard_normal((5, 4))
    a = ta.from_numpy(x, g, name="A", tile=(2, 2), dims=("time", "sensor"))
    (a * 2).to_zarr(g, name="B", tile=(3, 3))
    (a[:, :3] + 0).to_zarr(g, name="B", overwrite=True)  # new shape, consolidated listing follows
    ds = xr.open_zarr(g)  # xarray consolidated the group; our members are listed too
    assert ds.attrs["title"] == "t"
    np.testing.assert_array_equal(ds.temp.values, t)
    assert ds.A.dims == ("time", "sensor")
    assert ds.B.dims == ("time", "B_col")  # A's rows, its own 3 columns
    np.testing.assert_array_equal(ds.A.values, x)
    np.testing.assert_array_equal(ds.B.values, x[:, :3])


# -- reduction (small) outputs: resume, refusals, listing -------------------------------


def test_reduction_output_resume_returns_stored_result(engine, tmp_path, rng, monkeypatch):
    import xarray as xr
    import zarr

    from tilearray.engine.array import TiledArray

    x = rng.standard_normal((20, 12))
    g = tmp_path / "g.zarr"
    a = ta.from_numpy(x, g, name="X", tile=(8, 8))
    assert_close(a.mean(axis=0).to_zarr(g, name="m"), x.mean(axis=0))
    assert_close(a.sum().to_zarr(g, name="s"), x.sum())
    meta = zarr.open_array(g, path="m", mode="r").attrs["tilearray"]
    assert meta["complete"] is True and meta["fingerprint"]
    with pytest.raises(ta.StorageError, match="already exists"):
        a.mean(axis=0).to_zarr(g, name="m")

    def boom(self, **kw):
        raise AssertionError("recomputed")

    with monkeypatch.context() as mp:
        mp.setattr(TiledArray, "compute", boom)
        assert_close(a.mean(axis=0).to_zarr(g, name="m", resume=True), x.mean(axis=0))
        assert a.sum().to_zarr(g, name="s", resume=True) == pytest.approx(x.sum())
        for other in (a.sum(axis=0), (a * 2).mean(axis=0)):
            with pytest.raises(ta.StorageError, match="cannot resume.*different expression"):
                other.to_zarr(g, name="m", resume=True)
        with pytest.raises(ta.StorageError, match=r"cannot resume.*holds a \(12,\) float64 "
                                                  r"array, the expression gives \(20,\)"):
            a.mean(axis=1).to_zarr(g, name="m", resume=True)
    # an interrupted small write of the same expression is written again
    z = zarr.open_array(g, path="m", mode="r+")
    z.attrs["tilearray"] = {**meta, "complete": False}
    z[...] = 0
    assert_close(a.mean(axis=0).to_zarr(g, name="m", resume=True), x.mean(axis=0))
    ds = xr.open_zarr(g)
    assert_close(ds.m.values, x.mean(axis=0))
    assert ds.m.attrs["tilearray"]["complete"] is True


def test_reduction_output_refused_inside_an_array_or_a_v2_group(engine, tmp_path, rng):
    import zarr

    x = rng.standard_normal((6, 4))
    a = ta.from_numpy(x, tmp_path / "in.zarr", tile=(3, 4))
    bare = tmp_path / "bare.zarr"
    ta.from_numpy(x, bare, tile=(3, 4))
    for write in (lambda: a.mean(axis=0).to_zarr(bare, name="m"),
                  lambda: ta.from_numpy(x, bare, name="m")):
        with pytest.raises(ta.StorageError, match=r"bare\.zarr' is a Zarr array, not a group"):
            write()
    v2 = tmp_path / "v2.zarr"
    g = zarr.open_group(v2, mode="w", zarr_format=2)
    g.attrs["title"] = "t"
    g.create_array("old", data=x, chunks=(3, 4))
    before = sorted(q.relative_to(v2) for q in v2.rglob("*"))
    for write in (lambda: a.mean(axis=0).to_zarr(v2, name="m"),
                  lambda: a.mean(axis=0).to_zarr(v2, name="old", overwrite=True),
                  lambda: (a * 2).to_zarr(v2, name="Y"),
                  lambda: (a * 2).to_zarr(v2, name="old", overwrite=True),
                  lambda: ta.from_dask(a.to_dask(), v2, name="D")):
        with pytest.raises(ta.StorageError, match="Zarr format 2 group"):
            write()
    assert sorted(q.relative_to(v2) for q in v2.rglob("*")) == before
    np.testing.assert_array_equal(ta.open(v2, "old").compute(), x)


def test_failed_job_leaves_no_member_for_xarray(engine, tmp_path, rng):
    import xarray as xr

    x = rng.standard_normal((16, 8))
    g = tmp_path / "g.zarr"
    a = ta.from_numpy(x, g, name="X", tile=(8, 8))
    (a + 1).to_zarr(g, name="Y")
    chunk = sorted(p for p in (g / "X" / "c").rglob("*") if p.is_file())[-1]
    raw = bytearray(chunk.read_bytes())
    raw[10:20] = b"\0garbage\0\0"
    chunk.write_bytes(bytes(raw))
    with pytest.raises(ta.CorruptChunkError):
        (a * 2).to_zarr(g, name="Z")
    with pytest.raises(ta.CorruptChunkError):
        (a * 2).to_zarr(g, name="Y", overwrite=True)  # the old Y is gone: not listed either
    ds = xr.open_zarr(g)
    assert set(ds.data_vars) == {"X"}


def test_dask_and_xarray_views_of_an_expression_name_themselves(tmp_path, rng):
    x = rng.standard_normal((20, 10))
    a = ta.from_numpy(x, tmp_path / "a.zarr", tile=(8, 8))
    for what in ("to_dask", "to_xarray"):
        with pytest.raises(ta.PlanningError, match=rf"{what}\(\) needs a stored array.*"
                                                    rf"to_zarr\(path\)\.{what}\(\)"):
            getattr(a[:10, :4], what)()
    np.testing.assert_array_equal(a.to_xarray().values, x)
    np.testing.assert_array_equal(np.asarray(a.to_dask()), x)


def test_operators_with_xarray_on_either_side(thread_engine):
    """``X + DataArray`` as ``DataArray + X``: xarray's operator keeps the
    TiledArray lazy as its data (NumPy arrays defer to xarray the same way);
    it was a TypeError on the left only (helper-46)."""
    import xarray as xr
    x = np.arange(12.0).reshape(3, 4)
    X = ta.from_numpy(x, "memory://xarray-operands", tile=(2, 2), overwrite=True)
    d = xr.DataArray(np.full((3, 4), 2.0), dims=("row", "col"))
    for got, want in [(X + d, x + 2), (d + X, x + 2), (X - d, x - 2), (X / d, x / 2),
                      (X * d, x * 2), (X > d, x > 2)]:
        assert isinstance(got, xr.DataArray) and isinstance(got.data, ta.TiledArray)
        np.testing.assert_array_equal(got.data.compute(engine=thread_engine), want)
