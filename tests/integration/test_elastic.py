"""Existing clusters and elastic workers: the budget comes from the workers
that are there; workers that join mid-job get tasks, retired ones hand theirs
back, and results stay right."""

import sys
import threading
import time
import warnings

import dask
import pytest
from distributed import Client, Event, Scheduler, SpecCluster, Worker
from helpers import in_process_workers, make

import tilearray as ta
from tilearray.testing import assert_close

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def uneven_cluster():
    """One roomy and one small worker, in this process."""
    spec = {
        "big": {"cls": Worker, "options": {"nthreads": 1, "memory_limit": "2GiB"}},
        "small": {"cls": Worker, "options": {"nthreads": 2, "memory_limit": "400MiB"}},
    }
    with in_process_workers():
        cluster = SpecCluster(workers=spec, silence_logs=False,
                              scheduler={"cls": Scheduler, "options": {"dashboard_address": ":0"}})
    with cluster, Client(cluster) as client:
        client.wait_for_workers(2)
        yield cluster, client


def test_existing_cluster_budget_is_set_by_the_smallest_worker(uneven_cluster, tmp_path, rng):
    cluster, client = uneven_cluster
    small = cluster.workers["small"].address
    with ta.Engine(client=client, quiet=True) as eng:
        b = eng.budget()
        assert b.worker == small
        assert b.memory_per_worker == 400 * 2**20 and b.threads_per_worker == 2
        assert b.n_workers == 2

        a = rng.standard_normal((300, 220))
        x = rng.standard_normal((220, 170))
        A, X = make(tmp_path, "a", a, (64, 50)), make(tmp_path, "x", x, (50, 64))
        out = (A @ X).to_zarr(tmp_path / "c.zarr")
        assert_close(out.compute(), a @ x)
        assert eng.budget().worker == small

        # one 4096² tile per task cannot fit 400 MiB / 2 threads: the refusal
        # names the small worker, and nothing is written
        big = ta.random((4096, 4096), tmp_path / "big.zarr", tile=(4096, 4096))
        with pytest.raises(ta.PlanningError, match=small.replace(".", r"\.")):
            (big @ big).to_zarr(tmp_path / "never.zarr")
        assert not (tmp_path / "never.zarr").exists()
        assert small in str((A @ X).plan())


def test_existing_cluster_without_workers_is_a_clear_error():
    with SpecCluster(workers={}, scheduler={"cls": Scheduler, "options": {"dashboard_address": ":0"}}
                     ) as cluster, Client(cluster) as client:
        with ta.Engine(client=client, quiet=True) as eng:
            with pytest.raises(ta.ClusterError, match="no workers"):
                eng.budget()


def _blocker(client, name):
    """Occupy one worker thread until the Event ``name`` is set; returns the future."""
    started = Event(name + "-started", client=client)

    def hold(name=name):
        Event(name + "-started").set()
        Event(name).wait(60)
        return "held"

    fut = client.submit(hold, pure=False)
    assert started.wait(30)
    return fut


def _tilearray_workers(client, since, prefix):
    """Workers that ran tasks whose key starts with ``prefix`` since ``since``."""
    out: dict = {}
    for rec in client.get_task_stream(start=since):
        if str(rec["key"]).strip("('").startswith(prefix):
            out[rec["worker"]] = out.get(rec["worker"], 0) + 1
    return out


def _wait(cond, timeout=60.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.fixture(autouse=True)
def _small_blocks():
    # one task per tile (hundreds of tasks), so workers can join or leave mid-job.
    # The blocking task's distributed.Event makes an in-process worker start its
    # own Client, which sets dask's global scheduler in this process; restore it.
    with dask.config.set({"tilearray.map.block-bytes": "40kB",
                          "scheduler": dask.config.get("scheduler", None)}):
        yield


def _job(tmp_path, rng):
    a = rng.standard_normal((1200, 700))
    b = rng.standard_normal((1200, 700))
    A = make(tmp_path, "a", a, (60, 70))
    B = make(tmp_path, "b", b, (60, 70))
    return (2 * A - B), 2 * a - b


def _run_in_thread(fn):
    box: dict = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as e:  # surfaced by the test
            box["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    return t, box


def test_worker_joining_mid_job_gets_tasks(tmp_path, rng):
    expr, expected = _job(tmp_path, rng)
    with ta.Engine(n_workers=1, threads_per_worker=1, memory_per_worker="1GiB",
                   processes=False, quiet=True) as eng:
        client = eng.client
        client.get_task_stream()  # installs the scheduler's task-stream plugin
        first = set(client.scheduler_info()["workers"])
        hold = _blocker(client, "join-hold")  # the only worker is busy: tasks queue
        since = time.time()
        job, box = _run_in_thread(lambda: expr.to_zarr(tmp_path / "out.zarr"))
        _wait(lambda: client.scheduler_info()["workers"], what="scheduler info")
        eng.cluster.scale(2)
        client.wait_for_workers(2, timeout=60)
        new = (set(client.scheduler_info()["workers"]) - first).pop()
        _wait(lambda: _tilearray_workers(client, since, "map").get(new, 0) >= 1,
              what="a task on the new worker")
        Event("join-hold", client=client).set()
        assert hold.result(timeout=60) == "held"
        job.join(90)
        assert not job.is_alive() and "error" not in box, box.get("error")
        ran = _tilearray_workers(client, since, "map")
        assert ran.get(new, 0) >= 1
        assert_close(box["value"].compute(), expected)


def test_worker_retired_mid_job_hands_its_work_back(tmp_path, rng):
    expr, expected = _job(tmp_path, rng)
    with ta.Engine(n_workers=2, threads_per_worker=1, memory_per_worker="1GiB",
                   processes=False, quiet=True) as eng:
        client = eng.client
        client.get_task_stream()
        w1, w2 = sorted(client.scheduler_info()["workers"])
        hold = _blocker(client, "retire-hold")  # lands on one worker; the other runs the job
        held_on = next(w for w, keys in client.processing().items() if hold.key in keys)
        other = w2 if held_on == w1 else w1
        since = time.time()
        job, box = _run_in_thread(lambda: expr.to_zarr(tmp_path / "out.zarr"))
        _wait(lambda: _tilearray_workers(client, since, "map").get(other, 0) >= 2,
              what="tasks on the worker to retire")
        assert job.is_alive()
        client.retire_workers([other], close_workers=True)
        _wait(lambda: other not in client.scheduler_info()["workers"], what="retirement")
        retired_at = time.time()
        Event("retire-hold", client=client).set()
        job.join(90)
        assert not job.is_alive() and "error" not in box, box.get("error")
        after = _tilearray_workers(client, retired_at, "map")
        assert set(after) <= {held_on} and after.get(held_on, 0) >= 1
        assert_close(box["value"].compute(), expected)


def test_adaptive_engine_scales_up_for_a_job(tmp_path, rng):
    expr, expected = _job(tmp_path, rng)
    with ta.Engine(adaptive=(1, 2), threads_per_worker=1, memory_per_worker="1GiB",
                   processes=False, quiet=True) as eng:
        client = eng.client
        assert len(client.scheduler_info()["workers"]) == 1
        assert eng.budget().n_workers == 2  # planned for the maximum
        client.get_task_stream()
        hold = _blocker(client, "adapt-hold")
        since = time.time()
        job, box = _run_in_thread(lambda: expr.to_zarr(tmp_path / "out.zarr"))
        # queued work makes dask's adaptive scaling add the second worker
        client.wait_for_workers(2, timeout=60)
        # the added worker was built after the engine started: it must still
        # not pause (at 80 % of this whole process's RSS it did, and hung)
        assert set(client.run(_memory_settings).values()) == {(False, False, False, False)}
        _wait(lambda: len(_tilearray_workers(client, since, "map")) >= 1, what="tasks")
        Event("adapt-hold", client=client).set()
        hold.result(timeout=60)
        job.join(90)
        assert not job.is_alive() and "error" not in box, box.get("error")
        assert_close(box["value"].compute(), expected)


def _memory_settings(dask_worker):
    m = dask_worker.memory_manager
    # distributed's statistical profiler can deadlock a Python 3.11 process
    # (CPython gh-106883): the engine's workers run without it there
    profiling = "profile" in dask_worker.periodic_callbacks
    return (m.memory_pause_fraction, m.memory_spill_fraction, m.memory_target_fraction,
            profiling == (sys.version_info[:2] == (3, 11)))


def _terminate(dask_worker):
    return dask_worker.memory_manager.memory_terminate_fraction


@pytest.mark.parametrize("processes", [False, True])
def test_workers_added_later_get_the_engines_memory_settings(processes):
    """Adaptive scaling builds workers after start_local returned, outside its
    dask.config.set: they must get the same settings as the first ones."""
    with dask.config.set({"distributed.worker.profile.enabled": True}), \
            ta.Engine(n_workers=1, threads_per_worker=1, memory_per_worker="512MiB",
                      processes=processes, quiet=True) as eng:
        eng.cluster.scale(2)
        eng.client.wait_for_workers(2, timeout=60)
        assert set(eng.client.run(_memory_settings).values()) == {(False, False, False, False)}
        if processes:  # the nanny's kill stays the safety net
            default = dask.config.get("distributed.worker.memory.terminate")
            assert set(eng.client.run(_terminate, nanny=True).values()) == {default}
            # a nanny restarting its worker (after a kill) hands it the same
            # settings: its config was a shallow copy that reverted
            eng.client.restart_workers(list(eng.client.scheduler_info()["workers"]))
            eng.client.wait_for_workers(2, timeout=60)
            assert set(eng.client.run(_memory_settings).values()) == {(False, False, False, False)}
        assert dask.config.get("distributed.worker.memory.pause") is not False


def test_adaptive_rejects_bad_bounds_and_existing_clients():
    with pytest.raises(ta.ClusterError, match="adaptive"):
        ta.Engine(adaptive=(3, 1), processes=False, quiet=True)
    with pytest.raises(ta.ClusterError, match="adaptive"):
        ta.Engine(client=object(), adaptive=(1, 2), quiet=True)


def test_a_paused_worker_is_named_when_a_job_waits_on_it(tmp_path, rng, monkeypatch):
    """A borrowed cluster's worker paused by dask's memory monitor (here at
    1 % of its limit) holds its tasks: the run says which worker and why,
    once, and finishes when the worker resumes."""
    from distributed.core import Status

    from tilearray.engine.runtime import gather as gather_mod

    monkeypatch.setattr(gather_mod._Stall, "SECONDS", 1.0)
    expr, expected = _job(tmp_path, rng)
    with dask.config.set({"distributed.worker.memory.pause": 0.01,
                          "distributed.worker.memory.spill": False,
                          "distributed.worker.memory.target": False,
                          "distributed.worker.memory.monitor-interval": "50ms"}):
        cluster = SpecCluster(
            workers={"w": {"cls": Worker, "options": {"nthreads": 1, "memory_limit": "1GiB"}}},
            scheduler={"cls": Scheduler, "options": {"dashboard_address": ":0"}})
    with cluster, Client(cluster) as client:
        _wait(lambda: {w["status"] for w in client.scheduler_info()["workers"].values()}
              == {"paused"}, what="the worker to pause")

        def resume(dask_worker):
            dask_worker.memory_manager.memory_pause_fraction = False
            dask_worker.status = Status.running

        def resume_after_warning(caught):
            _wait(lambda: any("paused" in str(w.message) for w in caught), what="the warning")
            client.run(resume)

        with ta.Engine(client=client, quiet=True), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            watcher = threading.Thread(target=resume_after_warning, args=(caught,), daemon=True)
            watcher.start()
            out = expr.to_zarr(tmp_path / "out.zarr")
            watcher.join(30)
        said = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)
                and "paused" in str(w.message)]
        assert len(said) == 1, said
        assert cluster.workers["w"].address in said[0]
        assert "distributed.worker.memory.pause" in said[0]
        assert_close(out.compute(), expected)
