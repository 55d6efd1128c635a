"""The output lock is exclusive across processes, and a job never removes
another job's lock."""

import multiprocessing as mp

import pytest

from tilearray.errors import OutputLockedError
from tilearray.storage import ArrayRef
from tilearray.storage import array as sarray


def _contend(path, barrier, q):
    ref = ArrayRef.from_location(path)
    barrier.wait()
    try:
        sarray.acquire_lock(ref)
        q.put("locked")
    except OutputLockedError:
        q.put("refused")


@pytest.mark.timeout(120)
def test_two_processes_never_both_hold_the_lock(tmp_path):
    ctx = mp.get_context("fork")  # the test module is not importable by name in a child
    for trial in range(6):
        path = str(tmp_path / f"o{trial}.zarr")
        barrier, q = ctx.Barrier(2), ctx.Queue()
        ps = [ctx.Process(target=_contend, args=(path, barrier, q)) for _ in range(2)]
        for p in ps:
            p.start()
        got = sorted(q.get(timeout=60) for _ in ps)
        for p in ps:
            p.join(30)
        # the winner exits without releasing: its lock stays, the loser was refused
        assert got == ["locked", "refused"], (trial, got)


def test_release_never_removes_another_jobs_lock(tmp_path):
    import json
    import os

    ref = ArrayRef.from_location(str(tmp_path / "o.zarr"))
    sarray.acquire_lock(ref)
    other = {"host": "elsewhere", "pid": os.getpid(), "token": "theirs"}
    ref.set_key(sarray.LOCK_KEY, json.dumps(other).encode())  # e.g. taken over meanwhile
    sarray.release_lock(ref)
    assert json.loads(ref.get_key(sarray.LOCK_KEY))["token"] == "theirs"
    ref.delete_key(sarray.LOCK_KEY)
    sarray.acquire_lock(ref)
    sarray.release_lock(ref)
    assert ref.get_key(sarray.LOCK_KEY) is None
