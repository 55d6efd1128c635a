"""The output lock: exclusive across processes, kept next to (never inside) the
array, never removed by another job, and stale only by the documented rule."""

import json
import multiprocessing as mp
import os
import socket
import subprocess
import sys

import psutil
import pytest
from zarr.storage import MemoryStore

import tilearray as ta
from tilearray.errors import OutputLockedError
from tilearray.storage import ArrayRef, create, locks
from tilearray.storage import array as sarray


def _contend(path, barrier, q, leave):
    ref = ArrayRef.from_location(path)
    barrier.wait()
    try:
        sarray.acquire_lock(ref)
        q.put("locked")
    except OutputLockedError:
        q.put("refused")
    leave.wait(60)


@pytest.mark.timeout(120)
def test_two_processes_never_both_hold_the_lock(tmp_path):
    ctx = mp.get_context("fork")  # the test module is not importable by name in a child
    for trial in range(6):
        path = str(tmp_path / f"o{trial}.zarr")
        barrier, q, leave = ctx.Barrier(2), ctx.Queue(), ctx.Event()
        ps = [ctx.Process(target=_contend, args=(path, barrier, q, leave)) for _ in range(2)]
        for p in ps:
            p.start()
        got = sorted(q.get(timeout=60) for _ in ps)
        leave.set()
        for p in ps:
            p.join(30)
        # the loser was refused while the winner held the lock
        assert got == ["locked", "refused"], (trial, got)


def _write_lock(path, owner):
    with open(path, "w") as f:
        json.dump(owner, f)


def test_lock_sits_next_to_the_array_and_survives_its_replacement(tmp_path):
    ref = ArrayRef.from_location(tmp_path / "o.zarr")
    assert sarray.lock_path(ref) == str(tmp_path / "o.zarr.tilearray.lock")
    member = ArrayRef.from_location(tmp_path / "g.zarr", "sub/C")
    assert sarray.lock_path(member) == str(tmp_path / "g.zarr" / "sub" / "C.tilearray.lock")
    sarray.acquire_lock(ref)
    try:
        create(tmp_path / "o.zarr", (4, 4), "f8", (2, 2), overwrite=True)
        create(tmp_path / "o.zarr", (4, 4), "f8", (2, 2), overwrite=True)  # replaces it
        assert os.path.exists(sarray.lock_path(ref))
        sarray.check_lock_held(ref)
    finally:
        sarray.release_lock(ref)
    assert not os.path.exists(sarray.lock_path(ref))


def test_lock_of_a_store_root_array_survives_overwrite_in_memory_store():
    store = MemoryStore()
    ref = ArrayRef(store, "")
    sarray.acquire_lock(ref)
    try:
        create(store, (4, 4), "f8", (2, 2))
        create(store, (4, 4), "f8", (2, 2), overwrite=True)  # the old keys go, the lock stays
        assert ref.get_key("tilearray.lock") is not None
        sarray.check_lock_held(ref)
    finally:
        sarray.release_lock(ref)
    assert ref.get_key("tilearray.lock") is None


def test_release_never_removes_another_jobs_lock(tmp_path):
    ref = ArrayRef.from_location(str(tmp_path / "o.zarr"))
    lock = sarray.lock_path(ref)
    sarray.acquire_lock(ref)
    other = {"host": "elsewhere", "pid": os.getpid(), "token": "theirs"}
    _write_lock(lock, other)  # e.g. taken over meanwhile
    with pytest.raises(OutputLockedError, match="no longer holds"):
        sarray.check_lock_held(ref)
    sarray.release_lock(ref)
    with open(lock) as f:
        assert json.load(f)["token"] == "theirs"
    os.unlink(lock)
    sarray.acquire_lock(ref)
    sarray.release_lock(ref)
    assert not os.path.exists(lock)


def _dead_pid():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_stale_rule(tmp_path):
    """Same host and pid gone (or reused: another start time) -> stale, taken over;
    a live holder or another host -> refused, naming pid, host and start time."""
    ref = ArrayRef.from_location(tmp_path / "o.zarr")
    lock = sarray.lock_path(ref)
    host = socket.gethostname()
    parent = os.getppid()
    parent_start = psutil.Process(parent).create_time()
    live = {"host": host, "pid": parent, "started": parent_start, "token": "t1"}
    _write_lock(lock, live)
    with pytest.raises(OutputLockedError) as e:
        sarray.acquire_lock(ref)
    assert f"pid {parent} on host {host}" in str(e.value) and "o.zarr" in str(e.value)
    assert "process started 20" in str(e.value) and lock in str(e.value)
    # another host: never presumed dead, even with a pid that does not exist here
    _write_lock(lock, {"host": "elsewhere.example", "pid": _dead_pid(), "token": "t2"})
    with pytest.raises(OutputLockedError, match="elsewhere.example"):
        sarray.acquire_lock(ref)
    # the pid is alive but belongs to a process started at another time: reused
    _write_lock(lock, {**live, "started": parent_start - 1000, "token": "t3"})
    sarray.acquire_lock(ref)
    sarray.release_lock(ref)
    # the pid is gone
    _write_lock(lock, {"host": host, "pid": _dead_pid(), "started": 1.0, "token": "t4"})
    sarray.acquire_lock(ref)
    with open(lock) as f:
        assert json.load(f)["pid"] == os.getpid()
    sarray.release_lock(ref)
    assert not os.path.exists(lock) and not os.path.exists(lock + ".reclaim")


def _reclaim(path, barrier, q, leave):
    ref = ArrayRef.from_location(path)
    barrier.wait()
    try:
        sarray.acquire_lock(ref)
        q.put("locked")
    except OutputLockedError:
        q.put("refused")
    leave.wait(60)  # a winner that exited would leave a lock that is rightly stale


@pytest.mark.timeout(120)
def test_two_processes_reclaiming_one_stale_lock_never_both_win(tmp_path):
    ctx = mp.get_context("fork")
    for trial in range(6):
        path = str(tmp_path / f"o{trial}.zarr")
        ref = ArrayRef.from_location(path)
        _write_lock(sarray.lock_path(ref), {"host": socket.gethostname(), "pid": _dead_pid(),
                                           "started": 1.0, "token": "dead"})
        barrier, q, leave = ctx.Barrier(3), ctx.Queue(), ctx.Event()
        ps = [ctx.Process(target=_reclaim, args=(path, barrier, q, leave)) for _ in range(3)]
        for p in ps:
            p.start()
        got = sorted(q.get(timeout=60) for _ in ps)
        leave.set()
        for p in ps:
            p.join(30)
        assert got == ["locked", "refused", "refused"], (trial, got)


def test_interrupted_reclaim_is_reported_not_ignored(tmp_path):
    ref = ArrayRef.from_location(tmp_path / "o.zarr")
    lock = sarray.lock_path(ref)
    dead = {"host": socket.gethostname(), "pid": _dead_pid(), "started": 1.0, "token": "d"}
    _write_lock(lock, dead)
    _write_lock(lock + ".reclaim", {**dead, "token": "r"})
    with pytest.raises(OutputLockedError, match="reclaim"):
        sarray.acquire_lock(ref)


def test_member_named_like_a_lock_refused(tmp_path):
    with pytest.raises(ta.StorageError, match="bad member name"):
        ArrayRef.from_location(tmp_path / "g.zarr", "x.tilearray.lock")


def test_stale_helpers():
    assert not locks.is_stale({})
    assert not locks.is_stale({"host": socket.gethostname(), "pid": os.getpid()})


@pytest.mark.parametrize("make", ["from_numpy", "random", "from_dask"])
def test_constructors_take_the_output_lock(tmp_path, make):
    """from_numpy / random / from_dask hold the output lock as to_zarr does: while
    another live job holds it they are refused (naming path and holder) and
    create nothing; their own lock is gone once they return."""
    import dask.array as da
    import numpy as np

    x = np.arange(64.0).reshape(8, 8)
    build = {"from_numpy": lambda p, **kw: ta.from_numpy(x, p, tile=(4, 4), **kw),
             "random": lambda p, **kw: ta.random((8, 8), p, tile=(4, 4), seed=3, **kw),
             "from_dask": lambda p, **kw: ta.from_dask(da.from_array(x, chunks=4), p, **kw)}[make]
    path = str(tmp_path / "o.zarr")
    ref = ArrayRef.from_location(path)
    lock = sarray.lock_path(ref)
    host, parent = socket.gethostname(), os.getppid()
    _write_lock(lock, {"host": host, "pid": parent,
                       "started": psutil.Process(parent).create_time(), "token": "other"})
    with pytest.raises(OutputLockedError) as e:
        build(path)
    assert "o.zarr" in str(e.value) and f"pid {parent} on host {host}" in str(e.value)
    assert not os.path.exists(path), "nothing may be created under another job's lock"
    os.remove(lock)
    build(path)
    assert not os.path.exists(lock)
    build(path, overwrite=True)  # the lock was released: a second write is not refused
    assert ta.open(path).shape == (8, 8)


def test_a_superseded_jobs_task_never_writes(tmp_path):
    """A task of a job whose lock was taken over (its driver killed, the
    cluster still running its tasks) refuses to write any unit: the new
    job's output keeps the new job's data and markers."""
    import dataclasses

    import numpy as np

    from tilearray.storage.io import write_block

    path = tmp_path / "out.zarr"
    create(path, (4, 4), "float64", (2, 2))
    old = dataclasses.replace(ArrayRef.from_location(path), run="a" * 32)
    new = dataclasses.replace(ArrayRef.from_location(path), run="b" * 32)
    sarray.acquire_lock(old)
    write_block(old, (0, 2), (0, 2), np.ones((2, 2)))  # its own lock: writes
    sarray.release_lock(old)  # the old driver gone; a new job holds the output now
    sarray.acquire_lock(new)
    try:
        write_block(new, (2, 4), (0, 2), np.full((2, 2), 2.0))
        with pytest.raises(OutputLockedError, match=r"earlier job stopped before writing I/O "
                                                    r"unit \(0, 1\)"):
            write_block(old, (0, 2), (2, 4), np.full((2, 2), 7.0))
        assert sarray.done_units(new) == {(0, 0), (1, 0)}
        import zarr

        assert not np.any(zarr.open_array(path)[0:2, 2:4] == 7.0)  # never written
    finally:
        sarray.release_lock(new)
    with pytest.raises(OutputLockedError, match="lock is now absent"):
        write_block(new, (0, 2), (2, 4), np.zeros((2, 2)))  # no job holds it any more


def test_home_in_paths(tmp_path, monkeypatch):
    """~ is the home directory in Python paths, as on the command line."""
    import numpy as np

    monkeypatch.setenv("HOME", str(tmp_path))
    a = ta.from_numpy(np.arange(6.0).reshape(2, 3), "~/x.zarr")
    assert (tmp_path / "x.zarr").is_dir()
    np.testing.assert_array_equal(np.asarray(ta.open("~/x.zarr")), np.arange(6.0).reshape(2, 3))
    assert a.shape == (2, 3)
