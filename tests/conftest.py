import os

import dask
import numpy as np
import pytest
from hypothesis import settings

import tilearray as ta
from tilearray.engine.runtime.local import no_profiler

# make test (CI) draws the same Hypothesis examples every run, so a landing
# never depends on the draw; HYPOTHESIS_PROFILE=explore draws new ones
settings.register_profile("ci", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# The clusters tests build themselves (SpecCluster, plain Workers) run without
# distributed's worker profiler, as the engine's do on Python 3.11: its
# sys._current_frames() deadlocked a test process there (CPython gh-106883;
# Hypothesis's gc callback is Python code run inside that call's collection)
dask.config.set(no_profiler())


@pytest.fixture(scope="session")
def engine():
    """A 2-worker process LocalCluster shared by the end-to-end tests."""
    with ta.Engine(n_workers=2, threads_per_worker=1, memory_per_worker="1GiB", quiet=True) as e:
        yield e


@pytest.fixture(scope="session")
def thread_engine():
    """In-process workers: counting store wrappers can be read from the test."""
    with ta.Engine(n_workers=1, threads_per_worker=2, memory_per_worker="4GiB",
                   processes=False, quiet=True) as e:
        yield e


@pytest.fixture
def rng():
    return np.random.default_rng(42)


@pytest.fixture(autouse=True)
def _no_leaked_dask_scheduler():
    """A test must not leave dask's global scheduler pointing at a closed
    distributed Client (later dask/xarray computes would fail)."""
    import dask
    from distributed import Worker
    from distributed.client import _global_clients

    before = dask.config.get("scheduler", None)
    clients = set(map(id, _global_clients.values()))
    yield
    after = dask.config.get("scheduler", None)
    assert after == before, f"dask's global scheduler changed from {before!r} to {after!r}"
    # A task that calls get_client() (distributed.Event, Lock, ...) on an
    # in-process worker makes that worker a Client, registered as dask's
    # default; distributed closes it only when the process's last worker
    # closes, so with a session engine alive it outlives its cluster and a
    # later dask/xarray compute picks it up (and fails). Close those; any
    # other Client a test leaves open is a test bug.
    left = [c for c in list(_global_clients.values())
            if id(c) not in clients and c.status not in ("closing", "closed")]
    for c in left:
        if c in Worker._initialized_clients:
            c.close(timeout=10)
    leaked = [c for c in left if c not in Worker._initialized_clients]
    assert not leaked, f"the test left distributed Clients open: {leaked}"
