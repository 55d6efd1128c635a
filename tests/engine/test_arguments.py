"""Arguments are checked where the user passes them: one clear error naming
the argument and the value, and nothing (no cluster, no array) created first.
Inputs users hold (zarr arrays, URLs, dask arrays) open or get a clear error."""

import os

import dask
import numpy as np
import pytest

import tilearray as ta
from tilearray._config import ConfigError
from tilearray.testing import assert_close

MiB = 2**20


@pytest.fixture
def no_cluster(monkeypatch):
    """Fail the test if an Engine gets as far as starting a LocalCluster."""
    import distributed

    def refuse(*args, **kwargs):
        raise AssertionError("a LocalCluster was started before the arguments were checked")

    monkeypatch.setattr(distributed, "LocalCluster", refuse)


def _minimum_mib(threads=1) -> int:
    return ta.Budget.from_config("1GiB", 1, threads).minimum_memory_per_worker // MiB


# -- Engine --------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, named", [
    ({"memory_per_worker": -5}, "memory_per_worker=-5"),
    ({"memory_per_worker": 0}, "memory_per_worker=0"),
    ({"memory_per_worker": "0"}, "memory_per_worker='0'"),
    ({"memory_per_worker": "-1GiB"}, "memory_per_worker='-1GiB'"),
    ({"memory_per_worker": "lots"}, "memory_per_worker='lots'"),
    ({"memory_per_worker": 2.5}, "memory_per_worker=2.5"),
    ({"memory_per_worker": [1]}, "memory_per_worker=[1]"),
    ({"n_workers": 0}, "n_workers=0"),
    ({"n_workers": -2}, "n_workers=-2"),
    ({"n_workers": 1.5}, "n_workers=1.5"),
    ({"threads_per_worker": 0}, "threads_per_worker=0"),
    ({"threads_per_worker": True}, "threads_per_worker=True"),
    ({"processes": "yes"}, "processes='yes'"),
    ({"adaptive": (1,)}, "adaptive=(1,)"),
])
def test_engine_refuses_bad_arguments_before_starting(no_cluster, kwargs, named):
    with pytest.raises(ta.ClusterError) as e:
        ta.Engine(quiet=True, **kwargs)
    assert named in str(e.value)


@pytest.mark.parametrize("kwargs, kind", [
    ({"memory_per_worker": -5}, ValueError),
    ({"memory_per_worker": "-1GiB"}, ValueError),
    ({"memory_per_worker": "64MiB"}, ValueError),  # below a worker process
    ({"memory_per_worker": [1]}, TypeError),
    ({"memory_per_worker": True}, TypeError),
    ({"n_workers": 0}, ValueError),
    ({"n_workers": 1.5}, TypeError),
    ({"threads_per_worker": True}, TypeError),
    ({"processes": "yes"}, TypeError),
    ({"adaptive": (1,)}, ValueError),
])
def test_engine_argument_errors_are_value_or_type_errors(no_cluster, kwargs, kind):
    """Issue 30: ta.Engine(memory_per_worker=-5) raised a ClusterError only (a
    RuntimeError): a bad argument is a ValueError / TypeError, as in Python,
    and still a ClusterError and an ArgumentError / ArgumentTypeError."""
    with pytest.raises(kind) as e:
        ta.Engine(n_workers=kwargs.pop("n_workers", 1), quiet=True, **kwargs)
    assert isinstance(e.value, ta.ClusterError)
    other = TypeError if kind is ValueError else ValueError
    assert not isinstance(e.value, other)
    assert isinstance(e.value, ta.ArgumentError if kind is ValueError else ta.ArgumentTypeError)
    with pytest.raises(ValueError):
        ta.Engine(client=object(), n_workers=2)  # sizing arguments with client=


def test_argument_errors_of_budget_constructors_to_zarr_and_linalg(thread_engine, tmp_path):
    """Issue 30, item 4: wherever the user passes a bad value, the error is a
    ValueError (or TypeError) and still its area's tilearray error."""
    a = ta.from_numpy(np.ones((8, 8)), tmp_path / "a.zarr", tile=(4, 4))
    p, eng = tmp_path / "o.zarr", thread_engine  # never a default engine started here
    cases = [
        (lambda: ta.Budget(-1), ValueError, ta.PlanningError),
        (lambda: ta.Budget([1]), TypeError, ta.PlanningError),
        (lambda: ta.random((8, 8), p, tile=(2.5, 4)), ValueError, ta.StorageError),
        (lambda: ta.random((8, -1), p), ValueError, ta.StorageError),
        (lambda: ta.random((8, 8), p, tile=(4, 4), shard=(6, 6)), ValueError, ta.StorageError),
        (lambda: ta.random((8, 8), p, dtype="complex128"), ValueError, ta.StorageError),
        (lambda: ta.random((8, 8), p, seed=-1), ValueError, ta.TilearrayError),
        (lambda: ta.from_numpy(np.ones((2, 2, 2)), p), ValueError, ta.StorageError),
        (lambda: ta.from_numpy(np.ones((3, 3)), p, name="/x"), ValueError, ta.StorageError),
        (lambda: ta.from_numpy(np.ones((3, 3)), p, name=5), TypeError, ta.StorageError),
        (lambda: ta.from_numpy(np.ones((3, 3)), p, dims=("r", "r")), ValueError,
         ta.StorageError),
        (lambda: (a * 2).to_zarr(p, name="a/../b", engine=eng), ValueError, ta.StorageError),
        (lambda: (a * 2).to_zarr(p, tile=(0, 4), engine=eng), ValueError, ta.PlanningError),
        (lambda: (a * 2).to_zarr(p, dims=("x",), engine=eng), ValueError, ta.StorageError),
        (lambda: ta.linalg.norm(a, axis="rows"), TypeError, ta.PlanningError),
        (lambda: ta.linalg.norm(a, axis=5), ValueError, ta.PlanningError),
        (lambda: ta.linalg.norm(a, ord="bad"), ValueError, ta.PlanningError),
    ]
    for i, (call, kind, area) in enumerate(cases):
        with pytest.raises(kind) as e:
            call()
        assert isinstance(e.value, area), (i, e.value)
        assert not p.exists(), i


@pytest.mark.parametrize("memory", ["64MiB", "128MiB", 140 * MiB])
def test_engine_memory_below_a_worker_process_names_the_minimum(no_cluster, memory):
    with pytest.raises(ta.ClusterError) as e:
        ta.Engine(n_workers=1, memory_per_worker=memory, quiet=True)
    msg = str(e.value)
    assert f"memory_per_worker={memory!r}" in msg
    assert "below what a worker process needs" in msg
    assert "tilearray.memory.worker-baseline" in msg
    assert f'"{_minimum_mib()}MiB"' in msg


def test_minimum_follows_the_configured_baseline_and_threads(no_cluster):
    with dask.config.set({"tilearray.memory.worker-baseline": "400MiB"}):
        need = _minimum_mib(threads=2)
        fraction = ta.Budget.from_config("1GiB", 1, 2).fraction
        assert need * MiB * fraction >= 400 * MiB + 2 * MiB  # the budget arithmetic
        with pytest.raises(ta.ClusterError, match=f'"{need}MiB"'):
            ta.Engine(n_workers=1, threads_per_worker=2, memory_per_worker=f"{need - 1}MiB")


@pytest.mark.timeout(120)
def test_engine_at_the_named_minimum_starts_and_runs(tmp_path):
    """The advice is true: a process worker with exactly the named minimum runs a job."""
    x = np.arange(12.0).reshape(3, 4)
    a = ta.from_numpy(x, tmp_path / "a.zarr", tile=(2, 2))
    with ta.Engine(n_workers=1, memory_per_worker=f"{_minimum_mib()}MiB", quiet=True) as eng:
        assert eng.budget().task_memory >= 2**20
        assert_close(a.sum(axis=0).compute(engine=eng), x.sum(axis=0))


def test_sizing_arguments_with_a_client_are_refused():
    with pytest.raises(ta.ClusterError, match="n_workers=2"):
        ta.Engine(client=object(), n_workers=2)


# -- Budget ---------------------------------------------------------------------------


def test_budget_takes_the_byte_strings_engine_takes():
    assert ta.Budget("1GiB") == ta.Budget(2**30)
    b = ta.Budget.from_config("512MiB", 2, 1)
    assert b.memory_per_worker == 512 * MiB and b.n_workers == 2
    assert ta.Budget("1e9").memory_per_worker == 10**9
    assert ta.Budget(2**30, baseline="100MiB").baseline == 100 * MiB


@pytest.mark.parametrize("args, kwargs, named", [
    ((-5,), {}, "memory_per_worker=-5"),
    (("0",), {}, "memory_per_worker='0'"),
    (("-1GiB",), {}, "memory_per_worker='-1GiB'"),
    (("abc",), {}, "memory_per_worker='abc'"),
    ((2**30,), {"n_workers": 0}, "n_workers=0"),
    ((2**30,), {"threads_per_worker": 0}, "threads_per_worker=0"),
    ((2**30,), {"fraction": 1.5}, "fraction=1.5"),
    ((2**30,), {"baseline": -1}, "baseline=-1"),
])
def test_budget_refuses_bad_values(args, kwargs, named):
    with pytest.raises(ta.PlanningError) as e:
        ta.Budget(*args, **kwargs)
    assert named in str(e.value)


# -- the one byte parser ---------------------------------------------------------------


@pytest.mark.parametrize("value, nbytes", [
    ("2GiB", 2 * 2**30), ("512MiB", 512 * MiB), ("1e9", 10**9), (" 5 MiB", 5 * MiB),
    (4096, 4096), (2.0**20, MiB), (np.int64(7), 7)])
def test_one_byte_parser_everywhere(value, nbytes):
    """Issue 28: bytes were parsed four ways (Budget/Engine, the MPI engine,
    the CLI, the configuration); one parser now, with each caller's message."""
    import argparse

    from tilearray._config import parse_bytes_arg
    from tilearray.cli.options import byte_size_arg
    from tilearray.engine.plan import parse_memory

    assert parse_bytes_arg(value) == parse_memory(value) == nbytes
    assert ta.Budget(value).memory_per_worker == nbytes
    if isinstance(value, str):
        assert byte_size_arg(value) == nbytes
        with dask.config.set({"tilearray.map.block-bytes": value}):
            from tilearray import _config

            assert _config.get_bytes("map.block-bytes") == nbytes
    with pytest.raises(argparse.ArgumentTypeError) as e:
        byte_size_arg("lots")
    assert str(e.value) == "not a byte size: 'lots' (use e.g. 1GiB, 512MiB, 2e9)"
    with pytest.raises(argparse.ArgumentTypeError) as e:
        byte_size_arg("-1GiB")
    assert str(e.value) == "must be positive, got '-1GiB' (use e.g. 1GiB, 512MiB, 2e9)"


@pytest.mark.parametrize("value, why", [
    ("lots", "is not a byte size"), ([1], "is not a byte size"), (True, "is not a byte size"),
    (2.5, "is not a whole number of bytes"), (float("inf"), "is not a whole number of bytes"),
    (0, "must be positive"), ("-1GiB", "must be positive")])
def test_byte_parser_refusals_name_argument_and_value(value, why):
    with pytest.raises(ta.PlanningError) as e:
        ta.Budget(value)
    assert str(e.value) == (f"memory_per_worker={value!r} {why}: give bytes as a positive "
                            "integer or a string such as '2GiB' or '512MiB'")


# -- configuration ---------------------------------------------------------------------


@pytest.mark.parametrize("key, value, shown", [
    ("memory.target-fraction", 1.5, "1.5"),
    ("memory.target-fraction", "half", "'half'"),
    ("reduction.split-every", "abc", "'abc'"),
    ("reduction.split-every", 1, "1"),
    ("memory.worker-baseline", "lots", "'lots'"),
    ("memory.worker-baseline", "-1GiB", "'-1GiB'"),
    ("map.block-bytes", -5, "-5"),
])
def test_bad_config_values_name_the_key(tmp_path, key, value, shown):
    a = ta.from_numpy(np.ones((4, 4)), tmp_path / "a.zarr", tile=(2, 2))
    with dask.config.set({f"tilearray.{key}": value}):
        with pytest.raises(ConfigError) as e:
            ta.Budget.from_config("1GiB", 1, 1)
            a.sum(axis=0).plan(budget=ta.Budget(2**30))
            (a + 1).plan(budget=ta.Budget(2**30))
    msg = str(e.value)
    assert f"tilearray.{key}={shown}" in msg
    assert "DASK_TILEARRAY__" in msg
    assert isinstance(e.value, ValueError) and isinstance(e.value, ta.TilearrayError)


def test_bad_config_refused_by_engine_before_starting(no_cluster):
    with dask.config.set({"tilearray.reduction.split-every": "abc"}):
        with pytest.raises(ConfigError, match="tilearray.reduction.split-every='abc'"):
            ta.Engine(n_workers=1, quiet=True)


def test_numeric_config_strings_are_read_as_numbers(tmp_path):
    x = np.arange(64.0).reshape(8, 8)
    a = ta.from_numpy(x, tmp_path / "a.zarr", tile=(1, 8))
    with dask.config.set({"tilearray.reduction.split-every": "2",
                          "tilearray.memory.target-fraction": "0.5"}):
        assert ta.Budget.from_config("1GiB", 1, 1).fraction == 0.5
        assert a.sum(axis=0).plan(budget=ta.Budget(2**30)).tasks > 0


# -- constructors and to_zarr ---------------------------------------------------------


@pytest.mark.parametrize("seed", [-1, 1.5, "3", True])
def test_random_bad_seed_creates_nothing(tmp_path, seed):
    p = tmp_path / "r.zarr"
    with pytest.raises(ValueError) as e:
        ta.random((8, 8), p, tile=(4, 4), seed=seed)
    assert f"seed={seed!r}" in str(e.value)
    assert not p.exists()


def test_random_bad_seed_leaves_an_existing_array_alone(tmp_path):
    p = tmp_path / "r.zarr"
    ta.random((8, 8), p, tile=(4, 4), seed=1)
    before = ta.open(p).to_dask().compute()
    with pytest.raises(ValueError, match="seed=-1"):
        ta.random((8, 8), p, tile=(4, 4), seed=-1, overwrite=True)
    np.testing.assert_array_equal(ta.open(p).to_dask().compute(), before)  # still complete


@pytest.mark.parametrize("kw, named", [
    (dict(tile=(2.5, 4)), "tile must be 2 positive integers, got (2.5, 4)"),   # not int(2.5)
    (dict(tile=4), "tile must be 2 positive integers, got 4"),               # not 'not iterable'
    (dict(tile=("a", 4)), "tile must be 2 positive integers"),
    (dict(tile=(4, 4), shard=8), "shard must be 2 positive integers, got 8"),
    (dict(shape=(8.5, 8)), "shape must be 2 non-negative integers (or one, for a vector), "
                           "got (8.5, 8)"),
    (dict(shape=8), "shape must be 2 non-negative integers (or one, for a vector), got 8"),
])
def test_constructor_layout_arguments_are_checked_not_truncated(tmp_path, kw, named):
    kw = {"shape": (8, 8), "tile": (4, 4), "shard": None, **kw}
    makers = [lambda p: ta.random(kw["shape"], p, tile=kw["tile"], shard=kw["shard"])]
    if "shape" not in named:
        makers.append(lambda p: ta.from_numpy(np.ones((8, 8)), p, tile=kw["tile"],
                                              shard=kw["shard"]))
    for make in makers:
        with pytest.raises(ta.StorageError) as e:
            make(tmp_path / "r.zarr")
        assert named in str(e.value)
        assert not (tmp_path / "r.zarr").exists()


def test_layout_arguments_take_numpy_and_integral_values(tmp_path):
    a = ta.random((np.int64(8), 8), tmp_path / "r.zarr", tile=(np.int32(4), 4.0))
    assert a.shape == (8, 8) and a.grid.tile == (4, 4)


@pytest.mark.parametrize("kw, named", [
    (dict(tile=(2.5, 4)), "tile must be 2 positive integers, got (2.5, 4)"),
    (dict(tile=4), "tile must be 2 positive integers, got 4"),
    (dict(tile=(4, 4), shard=8), "shard must be 2 positive integers, got 8"),
])
def test_to_zarr_layout_arguments_are_checked_not_truncated(tmp_path, kw, named):
    a = ta.from_numpy(np.ones((8, 8)), tmp_path / "a.zarr", tile=(4, 4))
    with pytest.raises(ta.PlanningError) as e:
        (a * 2).plan(tmp_path / "o.zarr", **kw)
    assert named in str(e.value)
    with pytest.raises(ta.PlanningError):
        (a * 2).to_zarr(tmp_path / "o.zarr", **kw)
    assert not (tmp_path / "o.zarr").exists()


def test_to_zarr_overwrite_with_resume_is_refused_before_anything(tmp_path):
    a = ta.from_numpy(np.ones((4, 4)), tmp_path / "a.zarr", tile=(2, 2))
    out = tmp_path / "o.zarr"
    with pytest.raises(ValueError, match="overwrite=True and resume=True"):
        (a * 2).to_zarr(out, overwrite=True, resume=True)
    assert not out.exists()


def test_outputs_in_a_memory_store_are_refused_before_running(thread_engine, tmp_path):
    """Tasks write in dask workers, which get a copy of a MemoryStore: a 1-D
    result came back as zeros (the fill value) and a matrix failed after the
    whole run with 'no done marker'. Refused up front; reading one still works."""
    import zarr

    x = np.arange(12.0).reshape(3, 4)
    a = ta.from_numpy(x, zarr.storage.MemoryStore(), tile=(2, 2))  # written here: fine
    assert_close(a.sum(axis=0).compute(), x.sum(axis=0))
    for write in (lambda s: a.sum(axis=0).to_zarr(s), lambda s: a.sum().to_zarr(s),
                  lambda s: (a * 2).to_zarr(s), lambda s: (a * 2).to_zarr(s, name="m"),
                  lambda s: ta.random((3, 4), s, tile=(2, 2), engine=thread_engine)):
        store = zarr.storage.MemoryStore()
        with pytest.raises(ta.StorageError,
                           match=r"MemoryStore \(or memory:// URL\) lives in this process only"):
            write(store)
        assert not store._store_dict  # nothing was created


def test_small_result_whose_write_never_arrives_is_not_marked_complete(thread_engine,
                                                                        monkeypatch):
    """The general case behind the MemoryStore one (e.g. a local path that
    remote workers do not share): a worker's write of a 1-D result that this
    process cannot see is an error, never a complete array of zeros."""
    import zarr

    from tilearray.engine import output

    monkeypatch.setattr(output, "check_task_writable", lambda ref: None)
    x = np.arange(12.0).reshape(3, 4) + 1
    a = ta.from_numpy(x, zarr.storage.MemoryStore(), tile=(2, 2))
    store = zarr.storage.MemoryStore()
    with pytest.raises(ta.IncompleteOutputError, match="filesystem they all share"):
        a.sum(axis=0).to_zarr(store, engine=thread_engine)
    assert not zarr.open_array(store).attrs["tilearray"]["complete"]


# -- inputs users hold -------------------------------------------------------------------


def test_open_a_zarr_array_and_group(thread_engine, tmp_path, rng):
    import zarr

    x = rng.standard_normal((10, 7))
    ta.from_numpy(x, tmp_path / "a.zarr", tile=(4, 4))
    ta.from_numpy(x * 2, tmp_path / "g.zarr", name="m", tile=(4, 4))
    z = zarr.open_array(str(tmp_path / "a.zarr"), mode="r")
    assert_close(ta.open(z).sum(axis=0).compute(engine=thread_engine), x.sum(axis=0))
    g = zarr.open_group(str(tmp_path / "g.zarr"), mode="r")
    assert_close(np.asarray(ta.open(g, "m")), x * 2)
    assert_close(np.asarray(ta.open(g["m"])), x * 2)
    # zarr's spelling of the place in the group, and the path alone as a keyword
    store = zarr.storage.LocalStore(str(tmp_path / "g.zarr"))
    assert_close(np.asarray(ta.open(store, path="m")), x * 2)
    assert_close(np.asarray(ta.open(str(tmp_path / "g.zarr"), path="m")), x * 2)
    assert_close(np.asarray(ta.open(path=str(tmp_path / "a.zarr"))), x)
    with pytest.raises(TypeError, match="name='m' and path='n'"):
        ta.open(store, "m", path="n")
    with pytest.raises(TypeError, match="store or path"):
        ta.open()


def test_open_and_write_file_urls(thread_engine, tmp_path, rng):
    x = rng.standard_normal((9, 6))
    url = (tmp_path / "a.zarr").as_uri()
    assert url.startswith("file://")
    a = ta.from_numpy(x, url, tile=(4, 4))
    assert (tmp_path / "a.zarr" / "zarr.json").exists()  # a local path, not mangled
    assert not any("file:" in p for p in os.listdir(os.getcwd()))
    assert_close(np.asarray(ta.open(url)), x)
    c = (a * 3).to_zarr((tmp_path / "c.zarr").as_uri(), engine=thread_engine)
    assert_close(np.asarray(ta.open(tmp_path / "c.zarr")), 3 * x)
    assert_close(np.asarray(c), 3 * x)


def test_open_fsspec_urls(thread_engine, rng):
    pytest.importorskip("fsspec")
    x = rng.standard_normal((9, 6))
    a = ta.from_numpy(x, "memory://tilearray-test/a.zarr", tile=(4, 4))
    b = ta.open("memory://tilearray-test/a.zarr")
    assert "memory://" in repr(b)
    assert_close((a + b).sum(axis=1).compute(engine=thread_engine), 2 * x.sum(axis=1))


def test_unusable_locations_say_what_to_pass():
    try:
        import s3fs  # noqa: F401
    except ImportError:
        with pytest.raises(ta.StorageError, match=r"s3://bucket/x\.zarr.*s3fs.*zarr Store"):
            ta.open("s3://bucket/x.zarr")
    with pytest.raises(ta.StorageError, match="nosuchscheme://x.*pass a zarr Store"):
        ta.open("nosuchscheme://x")
    with pytest.raises(TypeError, match=r"path=12 \(int\)"):
        ta.open(12)


def test_from_dask_numpy_and_unknown_chunks(thread_engine, tmp_path):
    import dask.array as da

    x = np.arange(48.0).reshape(8, 6)
    with pytest.raises(TypeError, match="from_numpy"):
        ta.from_dask(x, tmp_path / "n.zarr")
    assert not (tmp_path / "n.zarr").exists()
    d = da.from_array(x, chunks=(3, 4))
    assert_close(np.asarray(ta.from_dask(d, tmp_path / "d.zarr")), x)
    u = d[d[:, 0] > 10]
    with pytest.raises(ta.StorageError, match="unknown.*compute_chunk_sizes"):
        ta.from_dask(u, tmp_path / "u.zarr")
    assert not (tmp_path / "u.zarr").exists()
    u.compute_chunk_sizes()
    assert_close(np.asarray(ta.from_dask(u, tmp_path / "u.zarr")), x[x[:, 0] > 10])


def test_arrays_written_without_a_path_are_temporary(tmp_path):
    """``ta.from_numpy(x)``, ``ta.random(shape)``, ``ta.from_dask(d)`` with no
    path: a fresh directory under tilearray.temporary-directory, removed when
    the process exits."""
    import subprocess
    import sys

    script = (
        "import numpy as np, dask.array as da, tilearray as ta\n"
        "if __name__ == '__main__':\n"
        "    with ta.Engine(n_workers=1, processes=False):\n"
        "        x = ta.from_numpy(np.arange(12.0).reshape(4, 3))\n"
        "        r = ta.random((5, 4), seed=1)\n"
        "        d = ta.from_dask(da.ones((6, 5), chunks=3))\n"
        "        assert float(x.sum()) == 66.0 and float(d.sum()) == 30.0\n"
        "        assert np.asarray(r).shape == (5, 4)\n"
        f"        print(len(list(__import__('os').scandir({str(tmp_path)!r}))))\n")
    env = {**os.environ, "DASK_TILEARRAY__TEMPORARY_DIRECTORY": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "3"  # one directory each while running
    assert list(tmp_path.iterdir()) == []  # gone at exit


# -- the small API items ----------------------------------------------------------------


def test_to_xarray_is_named_after_the_array(tmp_path):
    x = np.ones((4, 3))
    assert ta.from_numpy(x, tmp_path / "c.zarr", tile=(2, 2)).to_xarray().name == "c"
    assert ta.from_numpy(x, tmp_path / "g.zarr", name="sub/C", tile=(2, 2)).to_xarray().name \
        == "C"
    assert ta.from_numpy(x, tmp_path / "plain", tile=(2, 2)).to_xarray().name == "plain"


_DTYPE_CASES = [
    (op, dt) for op in ("sum", "prod", "mean", "nansum", "nanmean", "var", "std", "nanvar",
                        "nanstd")
    for dt in ("int8", "int64", "float32", "float64", "bool")
    if not (op in ("var", "std", "nanvar", "nanstd") and dt not in ("float32", "float64"))
]


@pytest.mark.parametrize("op, dt", _DTYPE_CASES)
@pytest.mark.parametrize("src", ["int8", "float32"])
def test_reductions_take_dtype_like_numpy(thread_engine, tmp_path, rng, op, dt, src):
    x = (rng.integers(-60, 60, (7, 9)) if src == "int8" else
         rng.standard_normal((7, 9))).astype(src)
    a = ta.from_numpy(x, tmp_path / "a.zarr", tile=(3, 4))
    for axis in (None, 0, 1):
        try:
            want = getattr(np, op)(x, axis=axis, dtype=dt)
        except TypeError:  # NumPy refuses this combination: so do we
            with pytest.raises(ta.PlanningError, match=f"dtype={dt}"):
                getattr(a, op)(axis=axis, dtype=dt)
            continue
        methods = [getattr(a, op)(axis=axis, dtype=dt)] if hasattr(a, op) else []  # no a.nanvar
        for got in (*methods, getattr(np, op)(a, axis=axis, dtype=dt)):
            v = got.compute(engine=thread_engine)
            assert np.asarray(v).dtype == np.asarray(want).dtype, (op, dt, axis)
            # NumPy's nanvar subtracts the mean in place, in the input's dtype
            # (float32 here, whatever dtype=): ours is float64 throughout
            lossy = op in ("nanvar", "nanstd") and src == "float32"
            assert_close(np.asarray(v), np.asarray(want), precision="float32" if lossy else None)


def test_reduction_dtype_refusals(tmp_path):
    a = ta.from_numpy(np.ones((4, 4)), tmp_path / "a.zarr", tile=(2, 2))
    with pytest.raises(ta.PlanningError, match="dtype=int64"):
        a.var(dtype="int64")
    with pytest.raises(ta.PlanningError, match="dtype='nope'"):
        a.sum(dtype="nope")
    with pytest.raises(ta.PlanningError, match="complex128"):
        a.mean(dtype=complex)


def test_ellipsis_indexing(thread_engine, tmp_path, rng):
    x = rng.standard_normal((9, 7))
    a = ta.from_numpy(x, tmp_path / "a.zarr", tile=(4, 4))
    for key in [(Ellipsis, slice(None, 3)), (slice(1, 3), Ellipsis), Ellipsis,
                (Ellipsis, slice(None), slice(2, None, 2)), (slice(None, None, 2), Ellipsis,
                                                             slice(1, 6))]:
        got = a[key]
        assert got.shape == x[key].shape, key
        assert_close(got.compute(engine=thread_engine), x[key])
    with pytest.raises(ta.PlanningError, match="single ellipsis"):
        a[..., ...]
    with pytest.raises(IndexError, match="too many indices"):  # NumPy's error type too
        a[:, :, :]
