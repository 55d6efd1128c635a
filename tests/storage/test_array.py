import os
import shutil

import numpy as np
import pytest
import zarr
from helpers import rand
from zarr.storage import LocalStore, WrapperStore

import tilearray as ta
from tilearray.storage import ArrayRef, create, grid_of, open_array, read_region, write_block
from tilearray.storage.array import done_units, is_complete, mark_complete


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64", "bool"])
@pytest.mark.parametrize("shape,tile,shard", [
    ((50, 37), (16, 16), None),
    ((50, 37), (8, 8), (16, 24)),
    ((1, 9), (4, 4), None),
    ((64, 64), (64, 64), None),
])
def test_round_trip(tmp_path, rng, dtype, shape, tile, shard):
    x = rand(rng, shape, dtype)
    a = ta.from_numpy(x, tmp_path / "a.zarr", tile=tile, shard=shard)
    assert a.shape == shape and a.dtype == x.dtype
    np.testing.assert_array_equal(a.compute(), x)
    z = zarr.open_array(tmp_path / "a.zarr", mode="r")
    assert z.metadata.zarr_format == 3
    assert z.metadata.dimension_names == ("row", "col")
    codecs = [type(c).__name__ for c in (z.compressors or ())]
    assert "Crc32cCodec" in codecs
    assert z.attrs["tilearray"]["complete"] is True


def test_random_is_deterministic(tmp_path):
    a = ta.random((40, 30), tmp_path / "a.zarr", tile=(16, 16), seed=3)
    b = ta.random((40, 30), tmp_path / "b.zarr", tile=(16, 16), seed=3)
    c = ta.random((40, 30), tmp_path / "c.zarr", tile=(16, 16), seed=4)
    np.testing.assert_array_equal(a.compute(), b.compute())
    assert not np.array_equal(a.compute(), c.compute())


def test_open_v2_array(tmp_path, rng):
    x = rng.standard_normal((33, 21))
    z = zarr.create_array(tmp_path / "v2.zarr", shape=x.shape, chunks=(10, 8), dtype="f8",
                          zarr_format=2)
    z[:] = x
    a = ta.open(tmp_path / "v2.zarr")
    assert a.grid.tile == (10, 8) and a.grid.unit == (10, 8)
    np.testing.assert_array_equal(a.compute(), x)


def test_open_user_sharded_v3_in_group(tmp_path, rng):
    x = rng.standard_normal((45, 30)).astype("float32")
    g = zarr.open_group(tmp_path / "g.zarr", mode="w")
    z = g.create_array("m", shape=x.shape, chunks=(5, 10), shards=(15, 30), dtype="f4")
    z[:] = x
    a = ta.open(tmp_path / "g.zarr", "m")
    assert a.grid.unit == (15, 30)
    np.testing.assert_array_equal(a.compute(), x)
    with pytest.raises(ta.StorageError, match="group"):
        ta.open(tmp_path / "g.zarr")


def test_open_missing_path_names_it(tmp_path):
    with pytest.raises(ta.StorageError, match="nothere.zarr"):
        ta.open(tmp_path / "nothere.zarr")


@pytest.mark.parametrize("cut", [0, 0.5])
@pytest.mark.parametrize("name", ["", "sub/x"])
def test_damaged_metadata_names_the_array(tmp_path, rng, cut, name):
    """A zarr.json emptied or cut short (a copy that ran out of space) is a
    StorageError naming the array, not a bare JSONDecodeError."""
    ta.from_numpy(rng.standard_normal((8, 8)), tmp_path / "a.zarr", name=name, tile=(4, 4))
    meta = tmp_path / "a.zarr" / name / "zarr.json"
    raw = meta.read_bytes()
    meta.write_bytes(raw[: int(len(raw) * cut)])
    where = str(tmp_path / "a.zarr")
    with pytest.raises(ta.StorageError, match="damaged or cut short") as e:
        ta.open(where, name)
    assert where in str(e.value)


@pytest.mark.parametrize("fmt", [2, 3])
def test_codec_not_installed_is_named_as_such_not_as_damage(tmp_path, fmt):
    """Arrays from other tools name codecs this machine may lack (zfpy,
    blosc2, imagecodecs): said so, not "the file is damaged"."""
    import json

    p = tmp_path / "z.zarr"
    zarr.create_array(str(p), shape=(4, 4), chunks=(2, 2), dtype="f8", zarr_format=fmt)
    meta = p / (".zarray" if fmt == 2 else "zarr.json")
    m = json.loads(meta.read_text())
    if fmt == 2:
        m["compressor"] = {"id": "no-such-codec"}
    else:
        m["codecs"].append({"name": "no-such-codec", "configuration": {}})
    meta.write_text(json.dumps(m))
    with pytest.raises(ta.StorageError, match="codec that is not installed here") as e:
        ta.open(p)
    assert str(p) in str(e.value) and "no-such-codec" in str(e.value)
    assert "damaged" not in str(e.value)


def test_open_not_1d_or_2d_names_shape(tmp_path):
    zarr.create_array(tmp_path / "v.zarr", shape=(10, 2, 3), chunks=(5, 2, 3), dtype="f8")
    with pytest.raises(ta.StorageError, match=r"\(10, 2, 3\).*1-D or 2-D"):
        ta.open(tmp_path / "v.zarr")


def test_open_bad_dtype_names_it(tmp_path):
    zarr.create_array(tmp_path / "c.zarr", shape=(4, 4), chunks=(2, 2), dtype="complex128")
    with pytest.raises(ta.StorageError, match="complex128"):
        ta.open(tmp_path / "c.zarr")


@pytest.mark.parametrize("kwargs,match", [
    ({"tile": (0, 4)}, "tile"),
    ({"tile": (4, 4), "shard": (6, 8)}, "multiple"),
    ({"tile": (4, 4), "dtype": "U3"}, "dtype"),
])
def test_create_bad_input(tmp_path, kwargs, match):
    kw = {"dtype": "f8", **kwargs}
    with pytest.raises(ta.StorageError, match=match):
        create(tmp_path / "x.zarr", (10, 10), kw.pop("dtype"), kw.pop("tile"), **kw)


def test_create_refuses_existing(tmp_path):
    create(tmp_path / "x.zarr", (10, 10), "f8", (4, 4))
    with pytest.raises(ta.StorageError, match="overwrite"):
        create(tmp_path / "x.zarr", (10, 10), "f8", (4, 4))


def test_half_written_output_is_not_complete(tmp_path, rng):
    ref = ArrayRef.from_location(tmp_path / "o.zarr")
    z = create(ref.store, (40, 40), "f8", (16, 16), shard=(32, 32))
    x = rng.standard_normal((40, 40))
    write_block(ref, (0, 32), (0, 32), x[:32, :32])
    assert done_units(ref) == {(0, 0)}
    assert not is_complete(ref)
    with pytest.raises(ta.IncompleteOutputError, match="3 of 4"):
        mark_complete(ref)
    with pytest.raises(ta.IncompleteOutputError, match="overwrite=True") as e:
        ta.open(tmp_path / "o.zarr")  # no expression's fingerprint: not resumable
    assert "resume=True" not in str(e.value)
    part = ta.open(tmp_path / "o.zarr", allow_incomplete=True)
    assert part.shape == (40, 40)
    assert grid_of(z).n_units == 4


def test_incomplete_output_being_written_names_its_writer(tmp_path):
    """ta.open of an output another live job is writing says so and names the
    job, not "the job that wrote it stopped early" (found: readers polling
    an output during `tilearray random --overwrite`)."""
    import json
    import socket

    import psutil

    ref = ArrayRef.from_location(tmp_path / "o.zarr")
    create(ref.store, (8, 8), "f8", (4, 4))
    me = psutil.Process(os.getpid())  # live, and not this process's own lock
    lock = {"host": socket.gethostname(), "pid": me.pid, "started": me.create_time(),
            "taken": "2026-01-01T00:00:00.000+00:00", "token": "other-job", "what": "output"}
    (tmp_path / "o.zarr.tilearray.lock").write_text(json.dumps(lock))
    with pytest.raises(ta.IncompleteOutputError, match="being written right now") as e:
        ta.open(tmp_path / "o.zarr")
    assert f"pid {me.pid}" in str(e.value) and "stopped early" not in str(e.value)
    lock["pid"], lock["started"] = 2**22 + 12345, 1.0  # a dead holder: stopped early
    (tmp_path / "o.zarr.tilearray.lock").write_text(json.dumps(lock))
    with pytest.raises(ta.IncompleteOutputError, match="stopped early"):
        ta.open(tmp_path / "o.zarr")


def test_incomplete_output_of_an_expression_says_resume(tmp_path):
    create(tmp_path / "o.zarr", (40, 40), "f8", (16, 16),
           attributes={"tilearray": {"fingerprint": "f" * 32}})
    with pytest.raises(ta.IncompleteOutputError, match="resume=True"):
        ta.open(tmp_path / "o.zarr")


def test_incomplete_output_whose_input_changed_says_overwrite_not_resume(tmp_path, rng):
    """A half-written output whose recorded input changed since its job
    started: a resume would be refused (the fingerprint covers the inputs),
    so the advice is overwrite=True, naming the input; with the input
    unchanged it stays resume=True."""
    from tilearray.storage.array import files_state, mark_unit_done, record_inputs

    x = ta.from_numpy(rng.standard_normal((8, 8)), tmp_path / "x.zarr", tile=(4, 4))
    ref = ArrayRef.from_location(tmp_path / "o.zarr")
    create(ref.store, (40, 40), "f8", (16, 16),
           attributes={"tilearray": {"fingerprint": "f" * 32}})
    xp = str(tmp_path / "x.zarr")
    record_inputs(ref, {xp: (xp, files_state(xp))})
    mark_unit_done(ref, 0, 0)
    with pytest.raises(ta.IncompleteOutputError) as e:
        ta.open(tmp_path / "o.zarr")
    assert str(e.value) == (
        f"{str(ref)!r} is an incomplete tilearray output: 8 of 9 I/O units were never written "
        "(the job that wrote it stopped early). Rerun the same expression with "
        "to_zarr(..., resume=True) to finish it, or open it with allow_incomplete=True to "
        "inspect it.")
    ta.from_numpy(np.ones((8, 8)), tmp_path / "x.zarr", tile=(4, 4), overwrite=True)
    with pytest.raises(ta.IncompleteOutputError) as e:
        ta.open(tmp_path / "o.zarr")
    assert str(e.value) == (
        f"{str(ref)!r} is an incomplete tilearray output: 8 of 9 I/O units were never written "
        f"(the job that wrote it stopped early). Its input {xp!r} was modified since the job "
        "started, so a resume would be refused: rerun the expression with overwrite=True to "
        "compute it again, or open it with allow_incomplete=True to inspect it.")
    shutil.rmtree(xp)
    with pytest.raises(ta.IncompleteOutputError, match=f"Its input {xp!r} was deleted"):
        ta.open(tmp_path / "o.zarr")
    assert x.shape == (8, 8)


def test_misaligned_write_refused(tmp_path):
    ref = ArrayRef.from_location(tmp_path / "o.zarr")
    create(ref.store, (40, 40), "f8", (16, 16), shard=(32, 32))
    with pytest.raises(ta.StorageError, match="not aligned"):
        write_block(ref, (0, 16), (0, 32), np.zeros((16, 32)))


def test_write_twice_is_harmless(tmp_path, rng):
    ref = ArrayRef.from_location(tmp_path / "o.zarr")
    create(ref.store, (20, 20), "f8", (10, 10))
    x = rng.standard_normal((10, 10))
    write_block(ref, (0, 10), (10, 20), x)
    write_block(ref, (0, 10), (10, 20), x)
    np.testing.assert_array_equal(read_region(ref, (0, 10), (10, 20)), x)


def _chunk_files(root):
    out = []
    for d, _, files in os.walk(root):
        out += [os.path.join(d, f) for f in files if "/c/" in os.path.join(d, f) + "/"]
    return sorted(p for p in out if os.sep + "c" + os.sep in p)


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_corrupt_chunk_names_path_and_tile(tmp_path, rng, damage):
    x = rng.standard_normal((30, 30))
    ta.from_numpy(x, tmp_path / "a.zarr", tile=(10, 10))
    victim = tmp_path / "a.zarr" / "c" / "1" / "2"
    data = bytearray(victim.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0xFF
    else:
        data = data[: len(data) // 2]
    victim.write_bytes(bytes(data))
    a = ta.open(tmp_path / "a.zarr")
    with pytest.raises(ta.CorruptChunkError) as e:
        read_region(a._node.ref, (0, 30), (0, 30))
    assert e.value.tile == (1, 2)
    assert "a.zarr" in str(e.value) and "(1, 2)" in str(e.value)
    assert "chunk file 'c/1/2'" in str(e.value)
    # untouched tiles still read fine
    np.testing.assert_array_equal(read_region(a._node.ref, (0, 10), (0, 30)), x[:10])


def test_open_array_validates(tmp_path, rng):
    ta.from_numpy(rng.standard_normal((5, 5)), tmp_path / "a.zarr", tile=(2, 2))
    z = open_array(tmp_path / "a.zarr")
    assert z.shape == (5, 5)


# -- member names, parents that cannot hold a member, consolidated listing ---------------


@pytest.mark.parametrize("bad", ["/abs", "x/", "sub//w", "./x", "a/../b", "..",
                                 "tilearray.done", "g/zarr.json"])
def test_bad_member_names_refused_before_writing(tmp_path, bad):
    g = tmp_path / "g.zarr"
    ta.from_numpy(np.ones((4, 4)), g, name="A", tile=(2, 2))
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    with pytest.raises(ta.StorageError, match=f"bad member name {bad!r}"):
        ta.from_numpy(np.ones((4, 4)), g, name=bad, tile=(2, 2))
    with pytest.raises(ta.StorageError, match="bad member name"):
        ta.random((4, 4), g, name=bad, tile=(2, 2))
    with pytest.raises(ta.StorageError, match="bad member name"):
        ta.open(g, bad)
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_absolute_member_name_writes_nothing_outside_the_store(tmp_path):
    outside = tmp_path / "outside"
    with pytest.raises(ta.StorageError, match="starts with '/'"):
        ta.from_numpy(np.ones((8, 8)), tmp_path / "g.zarr", name=str(outside), tile=(4, 4))
    assert not outside.exists() and not (tmp_path / "g.zarr").exists()


def test_nested_member_name_allowed(tmp_path, rng):
    x = rng.standard_normal((6, 5))
    g = tmp_path / "g.zarr"
    a = ta.from_numpy(x, g, name="sub/x", tile=(3, 3))
    np.testing.assert_array_equal(np.asarray(ta.open(g, "sub/x").compute()), x)
    assert sorted(done_units(a._node.ref)) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert (g / "sub" / "x" / "tilearray.done").is_dir()


def _v2_group(path, x):
    g = zarr.open_group(path, mode="w", zarr_format=2)
    g.attrs["title"] = "survey"
    g.create_array("old", data=x, chunks=(3, 4))
    return g


@pytest.mark.parametrize("name", ["new", "sub/new", "old"])
def test_member_of_a_zarr_v2_group_refused_and_group_untouched(tmp_path, rng, name):
    x = rng.standard_normal((3, 4))
    p = tmp_path / "v2g.zarr"
    _v2_group(p, x)
    before = sorted(q.relative_to(p) for q in p.rglob("*"))
    for write in (lambda: ta.from_numpy(np.ones((3, 4)), p, name=name, tile=(3, 4),
                                        overwrite=True),
                  lambda: ta.random((3, 4), p, name=name, tile=(3, 4), overwrite=True)):
        with pytest.raises(ta.StorageError, match=r"v2g\.zarr'? is a Zarr format 2 group.*"
                                                  r"format 3"):
            write()
    assert sorted(q.relative_to(p) for q in p.rglob("*")) == before  # nothing written
    g = zarr.open_group(p, mode="r")
    assert sorted(g.keys()) == ["old"] and g.attrs["title"] == "survey"
    # its format 2 arrays still open
    np.testing.assert_array_equal(ta.open(p, "old").compute(), x)


@pytest.mark.parametrize("inner", ["x.zarr", "c/0/x.zarr", "sub/deeper/x.zarr"])
@pytest.mark.parametrize("how", ["random", "from_numpy", "to_zarr"])
def test_store_inside_an_array_directory_refused(tmp_path, thread_engine, inner, how):
    """An output *path* inside an existing array's directory (not name=) was
    written as a store of its own there: replacing the enclosing array
    (overwrite) then deleted it, and the array's file state changed."""
    outer = tmp_path / "bare.zarr"
    a = ta.from_numpy(np.ones((4, 4)), outer, tile=(2, 2))
    target = outer / inner
    with pytest.raises(ta.StorageError, match=r"inside the Zarr array .*bare\.zarr"):
        if how == "random":
            ta.random((4, 4), target, tile=(2, 2))
        elif how == "from_numpy":
            ta.from_numpy(np.ones((4, 4)), target, tile=(2, 2))
        else:
            (a * 2).to_zarr(target, engine=thread_engine)
    assert not target.exists() and not os.path.exists(str(target) + ".tilearray.lock")
    zarr.open_group(tmp_path / "g.zarr", mode="w", zarr_format=3)
    ta.from_numpy(np.ones((4, 4)), tmp_path / "g.zarr" / "m.zarr", tile=(2, 2))  # in a group: fine


@pytest.mark.parametrize("name", ["", "X"])
@pytest.mark.parametrize("how", ["random", "from_numpy"])
def test_regular_file_target_refused_also_with_overwrite(tmp_path, how, name):
    """random/from_numpy onto a regular file said "already exists; pass
    overwrite=True" even with overwrite=True (and, with name=, "cannot create
    the lock ...: File exists"); now as to_zarr: a regular file, kept."""
    f = tmp_path / "notes.zarr"
    f.write_text("keep me")
    with pytest.raises(ta.StorageError, match="is a regular file, not a Zarr") as e:
        if how == "random":
            ta.random((4, 4), f, name=name, tile=(2, 2), overwrite=True)
        else:
            ta.from_numpy(np.ones((4, 4)), f, name=name, tile=(2, 2), overwrite=True)
    assert "already exists" not in str(e.value) and "lock" not in str(e.value)
    assert f.read_text() == "keep me"


@pytest.mark.parametrize("how", ["random", "from_numpy", "from_dask"])
def test_existing_format_2_array_refused_without_overwrite(tmp_path, how):
    """zarr refuses to create over a format 3 node but writes zarr.json beside
    a format 2 array's .zarray, after which readers of either format see
    different arrays: refused as an existing output, replaced with overwrite."""
    import dask.array as da

    p = tmp_path / "v2.zarr"
    old = np.arange(16.0).reshape(4, 4)
    zarr.create_array(str(p), shape=(4, 4), chunks=(2, 2), dtype="f8", zarr_format=2)[...] = old
    make = {"random": lambda **k: ta.random((3, 3), p, tile=(2, 2), **k),
            "from_numpy": lambda **k: ta.from_numpy(np.full((3, 3), 7.0), p, tile=(2, 2), **k),
            "from_dask": lambda **k: ta.from_dask(da.full((3, 3), 7.0, chunks=2), p, **k)}[how]
    before = sorted(os.listdir(p))
    with pytest.raises(ta.StorageError, match="already exists.*format 2 array.*overwrite=True"):
        make()
    assert sorted(os.listdir(p)) == before
    np.testing.assert_array_equal(zarr.open_array(str(p), mode="r")[...], old)
    x = make(overwrite=True)
    assert x.shape == (3, 3) and not (p / ".zarray").exists()


def test_member_inside_an_array_refused(tmp_path):
    p = tmp_path / "bare.zarr"
    ta.from_numpy(np.ones((4, 4)), p, tile=(2, 2))
    with pytest.raises(ta.StorageError, match=r"bare\.zarr' is a Zarr array, not a group"):
        ta.from_numpy(np.ones((4, 4)), p, name="in", tile=(2, 2))
    assert not (p / "in").exists()


def test_incomplete_member_is_not_in_the_consolidated_listing(tmp_path, rng):
    import xarray as xr

    x = rng.standard_normal((4, 4))
    g = tmp_path / "g.zarr"
    ta.from_numpy(x, g, name="A", tile=(2, 2))
    ta.from_numpy(x, g, name="B", tile=(2, 2))
    create(g, (6, 6), "float64", (3, 3), path="P")  # a job that has not finished
    create(g, (2, 2), "float64", (2, 2), path="B", overwrite=True)  # B being rewritten
    create(g, (2, 2), "float64", (2, 2), path="sub/Q")
    for ds in (xr.open_zarr(g), xr.open_zarr(g, consolidated=True)):
        assert set(ds.data_vars) == {"A"}
        np.testing.assert_array_equal(ds.A.values, x)
    assert sorted(zarr.open_group(g, mode="r").keys()) == ["A", "sub"]
    ref = ArrayRef.from_location(g, "P")
    for i in range(2):
        for j in range(2):
            write_block(ref, (3 * i, 3 * i + 3), (3 * j, 3 * j + 3), np.full((3, 3), 1.0))
    mark_complete(ref)
    ds = xr.open_zarr(g)
    assert set(ds.data_vars) == {"A", "P"}
    np.testing.assert_array_equal(ds.P.values, np.ones((6, 6)))


def _copy_if_there(src, dst):
    try:
        shutil.copy2(src, dst)
    except FileNotFoundError:  # Zarr's temporary, renamed meanwhile
        pass


class _SnapshotStore(WrapperStore):
    """Copies the whole store directory (plain files) right after ``key`` is
    written: what a reader opening the group at that moment would see."""

    def __init__(self, store, key, snap):
        super().__init__(store)
        self.key, self.snap = key, snap

    def _with_store(self, store):
        return type(self)(store, self.key, self.snap)

    async def set(self, key, value):
        await self._store.set(key, value)
        if key == self.key and not os.path.exists(self.snap):
            shutil.copytree(str(self._store.root), self.snap, copy_function=_copy_if_there,
                            ignore=shutil.ignore_patterns("*.partial"))


@pytest.mark.parametrize("case", ["new group", "member replaced"])
def test_member_never_listed_while_created_or_replaced(tmp_path, rng, case):
    """Right after Zarr writes a member's zarr.json -- before tilearray's
    refresh -- xarray must not list it: a new group had no consolidated
    listing yet (xarray fell back to listing the incomplete member; found
    with `tilearray matmul --name` while xr.open_zarr polled the group), and
    a member being replaced stayed listed while its chunks were deleted."""
    import warnings

    import xarray as xr

    x = rng.standard_normal((4, 4))
    g = tmp_path / "g.zarr"
    if case == "member replaced":
        ta.from_numpy(x, g, name="A", tile=(2, 2))
        ta.from_numpy(x, g, name="C", tile=(2, 2))
    snap = str(tmp_path / "snap.zarr")
    store = _SnapshotStore(LocalStore(str(g)), "C/zarr.json", snap)
    ta.from_numpy(2 * x, store, name="C", tile=(2, 2), overwrite=True)
    assert os.path.exists(snap)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "failed to open consolidated metadata"
        ds = xr.open_zarr(snap)
    assert "C" not in ds.data_vars
    assert set(xr.open_zarr(g).data_vars) == ({"C"} if case == "new group" else {"A", "C"})
    np.testing.assert_array_equal(xr.open_zarr(g).C.values, 2 * x)
    with pytest.raises(ta.StorageError, match="already exists"):  # refused: stays listed
        create(str(g), (4, 4), "f8", (2, 2), path="C")
    np.testing.assert_array_equal(xr.open_zarr(g).C.values, 2 * x)


def test_open_1d_and_0d_say_how_to_read_them(tmp_path):
    g = zarr.open_group(tmp_path / "g.zarr", mode="w")
    g.create_array("colmean", shape=(10,), chunks=(5,), dtype="f8")
    g.create_array("total", shape=(), dtype="f8")
    v = ta.open(tmp_path / "g.zarr", "colmean")  # a 1-D array is a TiledArray (issue 30)
    assert v.shape == (10,) and v.ndim == 1
    with pytest.raises(ta.StorageError, match=r"0-D array of shape \(\).*zarr\.open_array"
                                              r".*xarray\.open_zarr"):
        ta.open(tmp_path / "g.zarr", "total")


def test_done_units_ignore_a_killed_writers_temporary_file(tmp_path):
    """A job killed while writing a done marker leaves LocalStore's
    ``<name>.<uuid>.partial``; it is not a marker (found by the fault matrix)."""
    from tilearray.storage import ArrayRef, done_units
    from tilearray.storage.array import DONE_DIR, mark_unit_done

    ref = ArrayRef.from_location(tmp_path / "o.zarr")
    mark_unit_done(ref, 1, 2)
    d = tmp_path / "o.zarr" / DONE_DIR
    (d / "3.4.abf307e889a84fc780e08f6979db6b9f.partial").write_bytes(b"")
    assert done_units(ref) == {(1, 2)}


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_open_group_without_member_says_group(tmp_path, zarr_format):
    """A path to a group (format 2 too: zarr only says "no array found") is
    reported as a group, with the member names that would open."""
    g = zarr.open_group(tmp_path / "g.zarr", mode="w", zarr_format=zarr_format)
    g.create_array("X", shape=(4, 3), chunks=(2, 2), dtype="f8")
    g.create_group("sub").create_array("Y", shape=(4, 3), chunks=(2, 2), dtype="f8")
    for where, name in ((tmp_path / "g.zarr", ""), (g, ""), (tmp_path / "g.zarr", "sub")):
        with pytest.raises(ta.StorageError, match=r"is a Zarr group, not an array.*its arrays: (X|Y)\b"):
            ta.open(where, name)
    with pytest.raises(ta.StorageError, match=r"no Zarr array at .*g\.zarr/nope"):
        ta.open(tmp_path / "g.zarr", "nope")
    nested = zarr.open_group(tmp_path / "n.zarr", mode="w", zarr_format=zarr_format)
    nested.create_group("sub").create_array("Z", shape=(4, 3), chunks=(2, 2), dtype="f8")
    with pytest.raises(ta.StorageError, match=r"its arrays: sub/Z\)"):  # not "holds none"
        ta.open(tmp_path / "n.zarr")
    import warnings

    with warnings.catch_warnings():  # zarr warns that consolidated metadata is not in v3
        warnings.simplefilter("ignore")
        zarr.consolidate_metadata(str(tmp_path / "g.zarr"))
    zarr.open_group(tmp_path / "g.zarr", mode="a", use_consolidated=False).create_array(
        "W", shape=(2, 2), dtype="f8")  # after consolidating: the listing is stale
    # arrays of subgroups too, by their paths (helper-49: `info` left out sub/x)
    with pytest.raises(ta.StorageError, match=r"its arrays: W, X, sub/Y\)"):
        ta.open(tmp_path / "g.zarr")


def test_tile_larger_than_the_array_is_clipped_to_it(tmp_path):
    """A 10 x 3000 array with the default 1024^2 tile is stored in 10 x 1024
    chunks (not 1024^2 ones, 99 % fill); sharded arrays keep the tile given."""
    x = np.arange(30_000, dtype="f8").reshape(10, 3000)
    a = ta.from_numpy(x, tmp_path / "a.zarr")
    assert zarr.open_array(tmp_path / "a.zarr").chunks == (10, 1024)
    assert a.grid.tile == (10, 1024)
    np.testing.assert_array_equal(np.asarray(a), x)
    z = create(tmp_path / "s.zarr", (10, 3000), "f8", (1024, 1024), shard=(2048, 2048))
    assert z.chunks == (1024, 1024)
    e = create(tmp_path / "e.zarr", (0, 5), "f8", (16, 16))
    assert e.chunks == (1, 5)


def test_corrupt_shard_and_directory_chunk_name_the_file(tmp_path, rng):
    """A damaged shard is named by its file (tile index and shard key); a chunk
    path that is a directory fails at once, not after retries as if transient."""
    from tilearray.storage import IOStats

    x = rng.standard_normal((64, 50))
    z = zarr.create_array(tmp_path / "s.zarr", shape=x.shape, chunks=(8, 10), shards=(32, 20),
                          dtype="f8")
    z[...] = x
    victim = tmp_path / "s.zarr" / "c" / "1" / "1"
    victim.write_bytes(victim.read_bytes()[:-7])  # the shard index cut: always detected
    ref = ta.open(tmp_path / "s.zarr")._node.ref
    with pytest.raises(ta.CorruptChunkError) as e:
        read_region(ref, (32, 64), (20, 40))
    assert "chunk file 'c/1/1'" in str(e.value)
    y = rng.standard_normal((20, 20))
    zarr.create_array(tmp_path / "d.zarr", shape=y.shape, chunks=(10, 10), dtype="f8")[...] = y
    chunk = tmp_path / "d.zarr" / "c" / "1" / "0"
    chunk.unlink()
    chunk.mkdir()
    stats = IOStats()
    with pytest.raises(ta.StorageError, match="Is a directory") as e:
        read_region(ta.open(tmp_path / "d.zarr")._node.ref, (0, 20), (0, 20), stats)
    assert "after" not in str(e.value) and stats.read_retries == 0
    shutil.rmtree(chunk)
