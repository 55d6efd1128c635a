import os

import numpy as np
import pytest
from hypothesis import settings

import tilearray as ta

# make test (CI) draws the same Hypothesis examples every run, so a landing
# never depends on the draw; HYPOTHESIS_PROFILE=explore draws new ones
settings.register_profile("ci", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


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

    before = dask.config.get("scheduler", None)
    yield
    after = dask.config.get("scheduler", None)
    assert after == before, f"dask's global scheduler changed from {before!r} to {after!r}"
