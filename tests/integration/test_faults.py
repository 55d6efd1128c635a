"""Faults on purpose: corrupt inputs, failing stores, locked and read-only outputs."""

import json
import logging
import os
import socket
import time

import dask
import numpy as np
import pytest
from zarr.storage import LocalStore

import tilearray as ta
from tilearray.engine.expr.nodes import Source
from tilearray.storage import ArrayRef
from tilearray.testing import FailingStore, assert_close, counts, reset_counts


def _wrapped(path, store):
    a = ta.open(path)
    return ta.TiledArray(Source(a.shape, a.dtype, ArrayRef(store), a.grid))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_corrupt_input_fails_job_cleanly(engine, tmp_path, rng, damage):
    x = rng.standard_normal((64, 64))
    a = ta.from_numpy(x, tmp_path / "a.zarr", tile=(16, 16))
    victim = tmp_path / "a.zarr" / "c" / "2" / "1"
    data = bytearray(victim.read_bytes())
    if damage == "flip":
        data[len(data) // 3] ^= 0x55
    else:
        data = data[: len(data) // 3]
    victim.write_bytes(bytes(data))
    with pytest.raises(ta.CorruptChunkError) as e:
        (a @ a).to_zarr(tmp_path / "c.zarr")
    assert e.value.tile == (2, 1) and "a.zarr" in str(e.value)
    with pytest.raises(ta.IncompleteOutputError):
        ta.open(tmp_path / "c.zarr")
    with pytest.raises(ta.CorruptChunkError, match=r"\(2, 1\)"):
        a.sum(axis=0).compute()


@pytest.mark.timeout(120)
def test_transient_read_failures_retried_in_job(thread_engine, tmp_path, rng):
    x = rng.standard_normal((60, 50))
    ta.from_numpy(x, tmp_path / "a.zarr", tile=(20, 25))
    reset_counts("job-flaky")
    store = FailingStore(LocalStore(str(tmp_path / "a.zarr")), "job-flaky", "c/1/", 2)
    a = _wrapped(tmp_path / "a.zarr", store)
    gram = a.T @ a
    assert_close(gram.compute(engine=thread_engine), x.T @ x)
    assert counts("job-flaky")["failures"] >= 2
    assert gram.stats.read_retries >= 1
    s = a.sum(axis=1)
    reset_counts("job-flaky")
    assert_close(s.compute(engine=thread_engine), x.sum(1))
    # concurrent chunk reads of one request may fail together and share a retry
    assert 1 <= s.stats.read_retries <= counts("job-flaky")["failures"]


@pytest.mark.timeout(120)
def test_permanent_read_failure_names_key(thread_engine, tmp_path, rng):
    ta.from_numpy(rng.standard_normal((40, 40)), tmp_path / "a.zarr", tile=(20, 20))
    store = FailingStore(LocalStore(str(tmp_path / "a.zarr")), "job-dead", "c/1/1", None)
    a = _wrapped(tmp_path / "a.zarr", store)
    with pytest.raises(ta.StorageError, match="c/1/1"):
        a.sum().compute(engine=thread_engine)


@pytest.mark.timeout(120)
def test_second_writer_refused_stale_lock_taken_over(engine, tmp_path, rng):
    x = rng.standard_normal((30, 30))
    a = ta.from_numpy(x, tmp_path / "a.zarr", tile=(10, 10))
    out = tmp_path / "c.zarr"
    (a * 2).to_zarr(out)
    lock = tmp_path / "c.zarr.tilearray.lock"  # next to the array: an overwrite keeps it
    # a live writer (this very process stands in for another job)
    lock.write_text(json.dumps({"host": socket.gethostname(), "pid": os.getppid()}))
    with pytest.raises(ta.OutputLockedError, match=str(os.getppid())):
        (a * 3).to_zarr(out, overwrite=True)
    assert_close(ta.open(out).compute(), 2 * x)  # untouched
    # a dead writer's lock is stale
    lock.write_text(json.dumps({"host": socket.gethostname(), "pid": 2**22 + 12345}))
    c = (a * 3).to_zarr(out, overwrite=True)
    assert_close(c.compute(), 3 * x)
    assert not lock.exists()


@pytest.mark.timeout(120)
def test_read_only_output_store_clear_error(engine, tmp_path, rng):
    x = rng.standard_normal((20, 20))
    a = ta.from_numpy(x, tmp_path / "a.zarr", tile=(10, 10))
    ro = LocalStore(str(tmp_path / "ro.zarr"), read_only=True)
    with pytest.raises(ta.StorageError, match="ro.zarr") as e:
        (a + 1).to_zarr(ro)
    assert type(e.value) is ta.StorageError  # not a private subclass (issue 28)
    where = str(tmp_path / "ro.zarr")
    assert str(e.value) == (f"cannot write {where!r}: the store {where!r} was opened "
                            "read-only; write to a location this process can write to")
    np.testing.assert_array_equal(ta.open(tmp_path / "a.zarr").compute(), x)  # inputs intact


def _block(x):
    return np.full(4, x), {"tasks": 1}


def _fails_later(dep):
    time.sleep(0.3)  # long after dep's result was gathered and released
    raise ValueError("task failed on purpose")


def _slow(dep):
    time.sleep(2.0)  # still running, holding dep, when its sibling fails
    return dep, {}


def test_engine_usable_after_a_failure_whose_inputs_were_gathered(thread_engine, caplog):
    """A task fails after a result it depends on was gathered and released,
    while a sibling still holds that result: the run raises the task's error
    and the next job runs on the same connection (the failed run used to
    cancel the released key, and distributed's scheduler failed an assertion
    and dropped the client's connection: a job started right after then
    failed with "scheduler-connection-lost")."""
    graph = {"x": (_block, 1.0), "y": (_fails_later, "x"), "w": (_slow, "x")}
    with caplog.at_level(logging.ERROR, logger="distributed"):
        with pytest.raises(ValueError, match="on purpose"):
            thread_engine.run(graph, ["x", "y", "w"], quiet=True)
        values, _ = thread_engine.run({"z": (_block, 2.0)}, ["z"], quiet=True)
    assert np.array_equal(values[0], np.full(4, 2.0))
    handler_errors = [r.getMessage() for r in caplog.records if "while handling" in r.getMessage()]
    assert not handler_errors, handler_errors


def test_error_raised_while_handling_a_zarr_error_keeps_its_class(engine, tmp_path):
    """A tilearray error a worker raises while handling an exception that does
    not unpickle (zarr's ArrayNotFoundError, pickled as its context by tblib)
    reaches the caller as itself, not distributed's stand-in ``Exception(repr)``
    that ``except ta.StorageError`` would miss."""
    from tilearray.engine.runtime.gather import _restored

    a = ta.from_numpy(np.ones((400, 400)), tmp_path / "a.zarr", tile=(100, 100))
    plan = a.sum(axis=0)._lower()
    os.remove(tmp_path / "a.zarr" / "zarr.json")  # gone after planning: each task's open fails
    with pytest.raises(ta.StorageError, match=r"no Zarr array at .*a\.zarr.* \(deleted\?\)"):
        engine.run(plan.graph(), list(plan.result.keys), quiet=True)
    err = _restored(Exception(repr(ta.StorageError("no Zarr array at 'p'"))))
    assert type(err) is ta.StorageError and str(err) == "no Zarr array at 'p'"
    # an error whose __init__ takes a tile and a column cannot be rebuilt whole: left as it came
    assert _restored(Exception(repr(ta.NotPositiveDefiniteError((2, 2), 17)))) is None
    assert _restored(Exception("ValueError('x')")) is None and _restored(Exception("x")) is None


def _die():
    os._exit(1)  # a worker process dying inside a task (memory killer, native crash)


@pytest.mark.timeout(120)
def test_task_that_kills_every_worker_says_what_tilearray_knows(tmp_path, rng):
    """distributed's KilledWorker (every worker that ran a task died) keeps
    its type and gains a note: the plan's memory per task against the
    workers' limit, and what to do."""
    from distributed.scheduler import KilledWorker

    x = rng.standard_normal((64, 64))
    with dask.config.set({"distributed.scheduler.allowed-failures": 0}), \
            ta.Engine(n_workers=1, threads_per_worker=1, memory_per_worker="512MiB",
                      quiet=True) as eng:
        a = ta.from_numpy(x, tmp_path / "a.zarr", tile=(32, 32))
        plan = (a @ a)._lower(engine=eng)
        graph = dict(plan.graph())
        key = next(iter(plan.result.keys))
        graph[key] = (_die,)
        with pytest.raises(KilledWorker) as e:
            eng.run(graph, [key], plan=plan)
    note = "\n".join(getattr(e.value, "__notes__", []))
    assert "every worker that ran this task died" in note
    assert "512.00 MiB a worker" in note and "memory_per_worker" in note
