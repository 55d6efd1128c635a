"""tilearray on an S3-protocol object store: the loopback moto server of
``conftest.py``, reached through s3fs and zarr's FsspecStore as a user's
bucket would be (URLs ``s3://bucket/...``, credentials and endpoint from
``storage_options`` or the ``AWS_*`` environment). Results are compared with
NumPy; the objects themselves are looked at through s3fs."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading

import dask
import numpy as np
import pytest
import zarr
from zarr.storage import FsspecStore

import tilearray as ta
from tilearray import _config
from tilearray.storage import ArrayRef, locks
from tilearray.testing import assert_close

pytestmark = pytest.mark.timeout(120)


def _keys(fs, url: str) -> list[str]:
    """Every object under ``url``, relative to it."""
    root = url.split("://", 1)[1].rstrip("/")
    return sorted(p[len(root) + 1:] for p in fs.find(root))


def _zarr_read(url: str, storage_options: dict) -> np.ndarray:
    """The stored values, read by zarr alone (not through tilearray)."""
    store = FsspecStore.from_url(url, storage_options=storage_options, read_only=True)
    return zarr.open_array(store, mode="r")[...]


@pytest.mark.parametrize("shard", [None, (64, 64)], ids=["unsharded", "sharded"])
def test_create_open_read_round_trip(engine, s3_url, storage_options, s3fs_fs, rng, shard,
                                     tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a URL taken as a path would land here
    x = rng.standard_normal((70, 96))
    url = f"{s3_url}/x.zarr"
    a = ta.from_numpy(x, url, tile=(32, 32), shard=shard, storage_options=storage_options)
    assert os.listdir(tmp_path) == []
    assert str(a._node.ref) == url
    stored = _keys(s3fs_fs, url)
    units = 3 * 3 if shard is None else 2 * 2
    assert "zarr.json" in stored
    assert len([k for k in stored if k.startswith("tilearray.done/")]) == units
    assert len([k for k in stored if k.startswith("c/")]) == units  # whole units, as objects
    assert not any("lock" in k for k in stored)  # released
    meta = json.loads(s3fs_fs.cat(url.removeprefix("s3://") + "/zarr.json"))
    assert meta["zarr_format"] == 3 and meta["attributes"]["tilearray"]["complete"] is True
    np.testing.assert_array_equal(_zarr_read(url, storage_options), x)

    b = ta.open(url, storage_options=storage_options)  # read back by the engine's workers
    assert b.shape == x.shape and b.grid.sharded == (shard is not None)
    np.testing.assert_array_equal(b.compute(engine=engine), x)
    np.testing.assert_array_equal(b[10:60, 5:90:3].compute(engine=engine), x[10:60, 5:90:3])


def test_ref_reopens_without_environment(s3_url, storage_options, tmp_path):
    """storage_options travel with the store: a process with no AWS_* variable
    (a worker elsewhere) unpickles the ArrayRef a task carries and reads."""
    import pickle

    x = np.arange(12.0).reshape(3, 4)
    url = f"{s3_url}/p.zarr"
    ta.from_numpy(x, url, tile=(2, 2), storage_options=storage_options)
    ref = ArrayRef.from_location(url, storage_options=storage_options)
    (tmp_path / "ref.pkl").write_bytes(pickle.dumps(ref))
    code = ("import pickle, sys\n"
            "ref = pickle.loads(open(sys.argv[1], 'rb').read())\n"
            "print(ref, ref.open()[...].sum())\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "ref.pkl")], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [url, "66.0"]


def test_random_on_s3_equals_random_on_disk(s3_url, storage_options, tmp_path):
    url = f"{s3_url}/r.zarr"
    ta.random((70, 50), url, tile=(32, 16), shard=(64, 32), seed=3,
              storage_options=storage_options)
    local = ta.random((70, 50), tmp_path / "r.zarr", tile=(32, 16), shard=(64, 32), seed=3)
    np.testing.assert_array_equal(_zarr_read(url, storage_options),
                                  zarr.open_array(str(tmp_path / "r.zarr"))[...])
    assert local.shape == (70, 50)
    with pytest.raises(ta.StorageError, match="already exists"):
        ta.random((70, 50), url, tile=(32, 16), storage_options=storage_options)


def test_matmul_and_reductions_s3_to_s3(engine, s3_url, storage_options, rng):
    x, y = rng.standard_normal((150, 120)), rng.standard_normal((120, 90))
    a = ta.from_numpy(x, f"{s3_url}/a.zarr", tile=(40, 40), storage_options=storage_options)
    b = ta.from_numpy(y, f"{s3_url}/b.zarr", tile=(40, 30), shard=(80, 60),
                      storage_options=storage_options)
    c = (a @ b).to_zarr(f"{s3_url}/c.zarr", shard=(80, 60), tile=(40, 30),
                        storage_options=storage_options)
    assert c.stats.tasks > 0
    assert_close(_zarr_read(f"{s3_url}/c.zarr", storage_options), x @ y)
    assert_close(ta.open(f"{s3_url}/c.zarr", storage_options=storage_options)
                 .compute(engine=engine), x @ y)
    c2 = (a[:, :80] @ b[:80, :60]).to_zarr(f"{s3_url}/c.zarr", overwrite=True,
                                           storage_options=storage_options)  # replaced
    assert c2.shape == (150, 60)
    assert_close(_zarr_read(f"{s3_url}/c.zarr", storage_options), x[:, :80] @ y[:80, :60])
    assert_close((a.T @ a).compute(engine=engine), x.T @ x)  # syrk on the diagonal
    # reductions: computed, and written as a small array by a worker task
    assert_close((a - a.mean(axis=0)).std(axis=1).compute(engine=engine),
                 (x - x.mean(axis=0)).std(axis=1))
    s = a.sum(axis=0).to_zarr(f"{s3_url}/s.zarr", storage_options=storage_options)
    assert_close(s, x.sum(axis=0))
    assert_close(_zarr_read(f"{s3_url}/s.zarr", storage_options), x.sum(axis=0))


def _corrupt(fs, url: str, key: str) -> bytes:
    path = url.removeprefix("s3://") + "/" + key
    good = fs.cat(path)
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0x55
    fs.pipe(path, bytes(bad))
    return good


def _small_tasks():
    """A per-task budget that plans one task per 32 x 32 float64 unit (60 KiB)."""
    small = int(2**30 * float(_config.get("memory.target-fraction"))) - 60 * 1024
    return dask.config.set({"tilearray.memory.worker-baseline": small})


def test_corrupt_chunk_detected(engine, s3_url, storage_options, s3fs_fs, rng):
    x = rng.standard_normal((64, 64))
    a = ta.from_numpy(x, f"{s3_url}/a.zarr", tile=(32, 32), storage_options=storage_options)
    _corrupt(s3fs_fs, f"{s3_url}/a.zarr", "c/1/0")
    out = f"{s3_url}/out.zarr"
    with _small_tasks(), pytest.raises(ta.CorruptChunkError, match=r"a\.zarr.*\(1, 0\)") as e:
        (a * 2 + 1).to_zarr(out, storage_options=storage_options)
    assert e.value.tile == (1, 0) and f"{s3_url}/a.zarr" in str(e.value)
    assert "tilearray.done/1.0" not in _keys(s3fs_fs, out)
    with pytest.raises(ta.IncompleteOutputError):
        ta.open(out, storage_options=storage_options)


def test_killed_job_resumes_from_done_marker_objects(engine, s3_url, storage_options,
                                                     s3fs_fs, rng):
    """What a job killed half-way leaves on S3 -- half the units and their
    done-marker objects, an incomplete array, the lock object of a process
    that is gone -- is finished by resume=True writing only the missing units."""
    import pickle

    from tilearray.storage.ref import ATTR_KEY

    x = rng.standard_normal((64, 96))
    a = ta.from_numpy(x, f"{s3_url}/a.zarr", tile=(32, 32), storage_options=storage_options)
    out = f"{s3_url}/out.zarr"
    expr = a * 2 + 1
    with _small_tasks():
        assert expr.plan(out, engine=engine).tasks == 6
        expr.to_zarr(out, storage_options=storage_options, engine=engine)
    # the state a killed job leaves: the second row of units never written
    z = zarr.open_array(FsspecStore.from_url(out, storage_options=storage_options), mode="r+")
    z.attrs[ATTR_KEY] = {**z.attrs[ATTR_KEY], "complete": False}
    root = out.removeprefix("s3://")
    for i in (1,):
        for j in range(3):
            s3fs_fs.rm([f"{root}/c/{i}/{j}", f"{root}/tilearray.done/{i}.{j}"])
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, timeout=60)
    holder = {**locks._me("output"), "pid": int(dead.stdout)}
    s3fs_fs.pipe(f"{root}/tilearray.lock", json.dumps(holder).encode())
    kept = {k: s3fs_fs.info(f"{root}/{k}")["ETag"] for k in ("c/0/0", "c/0/2")}
    stamp = {k: s3fs_fs.info(f"{root}/{k}")["LastModified"] for k in kept}

    with pytest.raises(ta.IncompleteOutputError, match="resume=True"):
        ta.open(out, storage_options=storage_options)
    with pytest.raises(ta.StorageError, match="already exists"):
        expr.to_zarr(out, storage_options=storage_options)
    with _small_tasks():
        # engine= given: the session's current engine may be another fixture's
        c = expr.to_zarr(out, resume=True, storage_options=storage_options, engine=engine)
    assert c.stats.skipped_units == 3 and c.stats.tasks == 3
    assert_close(c.compute(engine=engine), x * 2 + 1)
    after = _keys(s3fs_fs, out)
    assert len([k for k in after if k.startswith("tilearray.done/")]) == 6
    assert "tilearray.lock" not in after  # the dead holder's lock reclaimed, then released
    assert {k: s3fs_fs.info(f"{root}/{k}")["LastModified"] for k in kept} == stamp
    assert pickle.loads(pickle.dumps(c._node.ref)) == c._node.ref


def test_output_lock_is_a_conditional_create(s3_url, storage_options, s3fs_fs):
    """The lock object is created with If-None-Match: * -- of racing creators
    exactly one wins (a check-then-write lets several through), and a second
    writer is refused naming the holder."""
    ref = ArrayRef.from_location(f"{s3_url}/c.zarr", storage_options=storage_options)
    slot = locks._output_slot(ref)
    assert str(slot) == f"{s3_url}/c.zarr/tilearray.lock"
    wins, start = [], threading.Barrier(8)

    def race(k):
        start.wait(timeout=30)
        if locks._Slot(ref.store, slot.key).create(f"holder {k}".encode()):
            wins.append(k)

    threads = [threading.Thread(target=race, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(wins) == 1
    assert s3fs_fs.cat(f"{s3_url}/c.zarr/tilearray.lock".removeprefix("s3://")) \
        == f"holder {wins[0]}".encode()
    slot.delete()

    locks.acquire_lock(ref)
    try:
        assert "c.zarr/tilearray.lock" in s3fs_fs.find(s3_url.removeprefix("s3://"))[0]
        with pytest.raises(ta.OutputLockedError, match=f"pid {os.getpid()}"):
            locks._acquire(slot, "output", locks._refuse_output(ref, slot), str(ref))
    finally:
        locks.release_lock(ref)
    assert not s3fs_fs.exists(f"{s3_url}/c.zarr/tilearray.lock".removeprefix("s3://"))


def _cli(*args, cwd, timeout=100):
    """``python -m tilearray ARGS`` in a subprocess (the AWS_* environment of conftest)."""
    return subprocess.run([sys.executable, "-m", "tilearray", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


def _cli_here(*args, capsys):
    """The command line in this process (no interpreter start-up)."""
    from tilearray.cli import main

    capsys.readouterr()
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, out, err)


def _ok(proc):
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert "Traceback" not in proc.stderr
    return proc


@pytest.mark.timeout(300)  # a subprocess and four jobs: slow on a loaded machine
def test_cli_random_matmul_reduce_info_on_s3(engine, s3_url, storage_options, tmp_path,
                                            capsys, monkeypatch):
    """The command line as a user runs it against their endpoint (AWS_* and
    AWS_ENDPOINT_URL in the environment): URLs are not local paths."""
    monkeypatch.chdir(tmp_path)
    a, b, c, s = (f"{s3_url}/{n}.zarr" for n in "abcs")
    cluster = ["--scheduler-address", engine.client.scheduler.address, "--quiet"]
    out = _ok(_cli("random", a, "--shape", 300, 200, "--tile", 100, 100, "--seed", 0,
                   cwd=tmp_path)).stdout
    assert f"-> {a}" in out
    _ok(_cli_here("random", b, "--shape", 200, 150, "--tile", 100, 50, "--shard", 200, 100,
                  "--seed", 1, capsys=capsys))
    assert os.listdir(tmp_path) == []  # no ./s3:/bucket/... directory
    x, y = _zarr_read(a, storage_options), _zarr_read(b, storage_options)
    assert x.shape == (300, 200) and np.isfinite(x).all() and x.std() > 0.5

    plan = _ok(_cli_here("plan", f"{a}.T @ {a}", "-o", c, capsys=capsys)).stdout
    assert f"into {c}" in plan
    out = _ok(_cli_here("matmul", a, b, "-o", c, *cluster, capsys=capsys)).stdout
    assert f"-> {c} (300, 150)" in out
    assert_close(_zarr_read(c, storage_options), x @ y)
    err = _cli_here("matmul", a, b, "-o", c, *cluster, capsys=capsys)
    assert err.returncode == 1 and "already exists" in err.stderr

    _ok(_cli_here("reduce", a, "--op", "mean", "--axis", 0, "-o", s, *cluster, capsys=capsys))
    assert_close(_zarr_read(s, storage_options), x.mean(axis=0))
    meta = json.loads(_ok(_cli_here("info", c, "--json", capsys=capsys)).stdout)
    assert meta["path"] == c and meta["shape"] == [300, 150] and meta["complete"] is True
    assert meta["stored_bytes"] > 0  # from the listing of its objects
    text = _ok(_cli_here("info", c, s, capsys=capsys)).stdout
    assert "complete:    yes" in text and " stored" in text and "on disk" not in text
    assert os.listdir(tmp_path) == []


@pytest.mark.timeout(300)
def test_s3_job_closes_its_sessions(s3_url, storage_options, tmp_path):
    """A job on its own worker processes: each closes its S3 clients as it
    closes (aiohttp had printed "Unclosed client session" once a worker at
    the end of every S3 run)."""
    a = f"{s3_url}/sessions.zarr"
    _ok(_cli("random", a, "--shape", 200, 100, "--tile", 50, 50, "--seed", 0, cwd=tmp_path))
    proc = _ok(_cli("reduce", a, "--op", "sum", "--axis", 0, "--workers", 2,
                    "--memory-per-worker", "400MiB", "--quiet", cwd=tmp_path))
    assert len(proc.stdout.split()) == 100
    assert "Unclosed" not in proc.stderr, proc.stderr


def test_missing_s3fs_is_a_clear_error(tmp_path):
    code = ("import sys; sys.modules['s3fs'] = None\n"
            "import tilearray as ta\n"
            "try:\n    ta.open('s3://some-bucket/x.zarr')\n"
            "except ta.StorageError as e:\n    print(e)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "'s3://some-bucket/x.zarr'" in proc.stdout and "pip install s3fs" in proc.stdout


def test_storage_options_refused_where_they_mean_nothing(tmp_path, storage_options):
    with pytest.raises(ta.StorageError, match="not to the local path"):
        ta.open(tmp_path / "x.zarr", storage_options=storage_options)
    with pytest.raises(ta.StorageError, match="file://"):
        ta.from_numpy(np.eye(2), f"file://{tmp_path}/x.zarr", storage_options={"anon": True})


def test_one_get_per_shard_also_at_ragged_edges(s3_url, storage_options, rng):
    """Whole-unit reads on S3: one GET per shard -- also for the ragged edge
    shards, which Zarr alone reads as index + one ranged GET per chunk -- and
    the plan's store requests are the requests made (a counting store)."""
    from tilearray.storage import IOStats, grid_of, plan_reads, read_region
    from tilearray.testing import CountingStore, counts, reset_counts

    x = rng.standard_normal((200, 180))  # shards 128 x 128 of 32 x 32 chunks: 3 of 4 ragged
    url = f"{s3_url}/sh.zarr"
    ta.from_numpy(x, url, tile=(32, 32), shard=(128, 128), storage_options=storage_options)
    base = ArrayRef.from_location(url, storage_options=storage_options)
    name = f"s3-count-{s3_url[-12:]}"
    reset_counts(name)
    ref = ArrayRef(CountingStore(base.store, name))
    stats = IOStats()
    np.testing.assert_array_equal(read_region(ref, (0, 200), (0, 180), stats), x)
    c = counts(name)
    assert c["gets"] == 4 == stats.store_gets
    assert sorted(k for k in c if k.startswith("gets:")) == \
        ["gets:c/0/0", "gets:c/0/1", "gets:c/1/0", "gets:c/1/1"]
    planned = plan_reads(grid_of(ref.open()), (0, 200), (0, 180), 8)
    assert sum(r.store_gets for r in planned) == 4
    plan = ta.open(url, storage_options=storage_options).sum(axis=0).plan(
        budget=ta.Budget.from_config(2**30, 1, 1))
    assert plan.store_gets == 4


@pytest.mark.parametrize("block", [None, 1024], ids=["objects-under-block", "over-block"])
@pytest.mark.parametrize("shard", [None, (64, 64)], ids=["unsharded", "sharded"])
def test_whole_object_read_is_one_get_without_a_size_request(s3_url, storage_options, rng,
                                                              monkeypatch, block, shard):
    """s3fs asks an object's size (a HEAD: one more round trip) before a
    whole-object GET, to split objects over its block size into concurrent
    ranged GETs. tilearray's objects under the block size are read as the
    range from byte 0: one GET, no HEAD. Objects over it (``block`` 1 KiB)
    keep s3fs's concurrent path. Same values either way, sharded or not."""
    import s3fs

    from tilearray.storage import IOStats, read_region

    x = rng.standard_normal((150, 130))
    url = f"{s3_url}/w.zarr"
    opts = dict(storage_options, **({} if block is None else {"default_block_size": block}))
    ta.from_numpy(x, url, tile=(32, 32), shard=shard, storage_options=opts)
    sizes, info = [], s3fs.S3FileSystem._info

    async def counted_info(self, path, *args, **kwargs):
        if "/c/" in path:
            sizes.append(path)
        return await info(self, path, *args, **kwargs)

    monkeypatch.setattr(s3fs.S3FileSystem, "_info", counted_info)
    ref = ArrayRef.from_location(url, storage_options=opts)
    np.testing.assert_array_equal(read_region(ref, (0, 150), (0, 130), IOStats()), x)
    objects = 9 if shard else 25  # 3 x 3 shards, 5 x 5 chunks
    assert len(sizes) == (0 if block is None else objects), sizes


def test_missing_object_of_complete_output_is_an_error(engine, s3_url, storage_options,
                                                       s3fs_fs, rng):
    x = rng.standard_normal((64, 64))
    url = f"{s3_url}/m.zarr"
    a = ta.from_numpy(x, url, tile=(16, 16), shard=(32, 32), storage_options=storage_options)
    s3fs_fs.rm(f"{url}/c/1/0".removeprefix("s3://"))
    with pytest.raises(ta.CorruptChunkError, match=r"m\.zarr.*tile index \(2, 0\).*missing"):
        a.sum(axis=0).compute(engine=engine)


def test_input_rewritten_on_s3_is_noticed(s3_url, storage_options, s3fs_fs, rng):
    """An input's state on an object store: every object's key, size and ETag
    (its zarr.json alone does not change when its chunks are rewritten)."""
    from tilearray.storage.commit import input_state

    x = rng.standard_normal((32, 32))
    url = f"{s3_url}/i.zarr"
    ta.from_numpy(x, url, tile=(16, 16), storage_options=storage_options)
    ref = ArrayRef.from_location(url, storage_options=storage_options)
    before = input_state(ref)
    assert before[2] == 4 + 4 + 1  # chunks, done markers, zarr.json
    key = f"{url}/c/0/0".removeprefix("s3://")
    good = s3fs_fs.cat(key)
    s3fs_fs.pipe(key, good)  # the same bytes again: unchanged
    assert input_state(ref) == before
    zarr.open_array(FsspecStore.from_url(url, storage_options=storage_options),
                    mode="r+")[:16, :16] = 1.0  # another writer, same metadata
    after = input_state(ref)
    assert after != before and after[2] == before[2]


def test_refused_resume_names_the_s3_input_that_changed(engine, s3_url, storage_options, rng):
    """A job on an S3 input stops (a non-SPD matrix), the input is rewritten,
    and the resume is refused naming that input as modified (the stopped
    job recorded its objects' state in the output, as for local files)."""
    x = rng.standard_normal((40, 40))
    url, out = f"{s3_url}/a.zarr", f"{s3_url}/L.zarr"
    kw = {"storage_options": storage_options}
    a = ta.from_numpy(x, url, tile=(16, 16), **kw)
    with pytest.raises(ta.NotPositiveDefiniteError):
        ta.linalg.cholesky(a).to_zarr(out, engine=engine, **kw)
    a = ta.from_numpy(x @ x.T + 40 * np.eye(40), url, tile=(16, 16), overwrite=True, **kw)
    with pytest.raises(ta.StorageError, match=r"inputs changed since its job started: "
                                              r"'s3://.*a\.zarr' was modified"):
        ta.linalg.cholesky(a).to_zarr(out, resume=True, engine=engine, **kw)
    got = ta.linalg.cholesky(a).to_zarr(out, overwrite=True, engine=engine, **kw)
    assert_close(got.compute(), np.linalg.cholesky(x @ x.T + 40 * np.eye(40)))


def test_store_not_answering_is_not_a_deleted_input(s3_url, storage_options, rng):
    """An input whose store does not answer when a job checks it (a server
    down, refused credentials) is named as such -- its state unknown, never
    equal to the one taken before, and resumable -- not as "deleted"
    (which advised overwriting the output); a deleted one still is."""
    import s3fs

    from tilearray.storage.commit import Unreachable, changed_input, input_state

    url = f"{s3_url}/gone.zarr"
    ta.from_numpy(rng.standard_normal((8, 8)), url, tile=(4, 4), storage_options=storage_options)
    ref = ArrayRef.from_location(url, storage_options=storage_options)
    states = {url: (ref, input_state(ref))}
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    down = {**storage_options, "endpoint_url": dead,
            "config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 2}}
    down_ref = ArrayRef.from_location(url, storage_options=down)
    now = input_state(down_ref)  # neither a listing nor the metadata answers
    assert isinstance(now, Unreachable) and now != now
    gone = changed_input({url: (ref, Unreachable("no answer at the start"))}, None)
    assert "could not be checked" in str(gone) and "no answer at the start" in str(gone)
    err = changed_input({url: (down_ref, states[url][1])}, ArrayRef.from_location(
        f"{s3_url}/out.zarr", storage_options=storage_options))
    assert "could not be checked: its store did not answer" in str(err), err
    assert "resume=True" in str(err) and "deleted" not in str(err)
    s3fs.S3FileSystem(**storage_options).rm(url.removeprefix("s3://"), recursive=True)
    assert "was deleted while compute() read it" in str(changed_input(states, None))


def test_store_refusing_or_not_answering_is_a_storage_error(storage_options, rng):
    """Opening or writing an array whose store does not answer (or refuses the
    credentials) is a StorageError naming the array, not the client library's
    raw exception (botocore's EndpointConnectionError, NoCredentialsError)."""
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    down = {**storage_options, "endpoint_url": dead,
            "config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 2}}
    with pytest.raises(ta.StorageError, match=r"cannot open 's3://nowhere/a.zarr': its store "
                                              r"refused or did not answer \(EndpointConnection"):
        ta.open("s3://nowhere/a.zarr", storage_options=down)
    with pytest.raises(ta.StorageError, match=r"cannot write 's3://nowhere/w.zarr'"):
        ta.from_numpy(rng.standard_normal((4, 4)), "s3://nowhere/w.zarr", storage_options=down)


def test_credentials_that_read_but_cannot_list(s3_url, storage_options, rng, monkeypatch,
                                               thread_engine):
    """Credentials allowed to read objects but not to list the bucket (no
    s3:ListBucket, common for shared read-only buckets): an input's state is
    its metadata, and a job on it runs (a failed listing is not an
    unreachable store)."""
    import s3fs

    from tilearray.storage.commit import input_state

    x = rng.standard_normal((12, 10))
    url = f"{s3_url}/nolist.zarr"
    ta.from_numpy(x, url, tile=(5, 4), storage_options=storage_options)

    async def refused(*args, **kwargs):
        raise PermissionError("Access Denied (s3:ListBucket)")

    monkeypatch.setattr(s3fs.S3FileSystem, "_find", refused)
    a = ta.open(url, storage_options=storage_options)
    assert isinstance(input_state(ArrayRef.from_location(url, storage_options=storage_options)),
                      bytes)
    assert_close(a.sum(axis=0).compute(engine=thread_engine), x.sum(axis=0))


def test_missing_bucket_and_unknown_options_are_named(s3_url, storage_options):
    """``ta.open`` of a bucket that does not exist says so (it said "No array
    found in store"); a misspelt storage option is named as one (it was
    reported as damaged metadata, "a copy that ran out of space?")."""
    with pytest.raises(ta.StorageError, match="the bucket 'no-such-bucket-45' does not exist"):
        ta.open("s3://no-such-bucket-45/x.zarr", storage_options=storage_options)
    with pytest.raises(ta.StorageError, match=r"no Zarr array at 's3://.*nothing-here\.zarr': "
                                              "no zarr.json or .zarray is stored there"):
        ta.open(f"{s3_url}/nothing-here.zarr", storage_options=storage_options)
    with pytest.raises(ta.StorageError,
                       match="storage_options are not accepted.*endpoint_urll"):
        ta.open(f"{s3_url}/x.zarr", storage_options={**storage_options, "endpoint_urll": "x"})
