"""Batch scripts the MPI tests run on 4 ranks: ``python jobs.py JOB DIR``.

Every rank runs this file; ``ta.Engine.mpi()`` returns only on the client rank
(rank 1). Results and facts go to files in DIR for the test to check.
"""

import json
import os
import sys

import numpy as np

import tilearray as ta


def _write_json(path, obj):
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f)
    os.replace(path + ".tmp", path)


def e2e(d):
    """A matmul and reductions, checked against NumPy by the test."""
    with ta.Engine.mpi(memory_per_worker="1GiB") as engine:
        b = engine.budget()
        _write_json(os.path.join(d, "engine.json"), {
            "memory_per_worker": b.memory_per_worker, "n_workers": b.n_workers,
            "threads_per_worker": b.threads_per_worker,
            "worker_memory_limits": sorted(
                w["memory_limit"]
                for w in engine.client.scheduler_info(n_workers=-1)["workers"].values()),
            "is_default": ta.engine.current_engine(start=False) is engine,
        })
        a, bb = ta.open(os.path.join(d, "a.zarr")), ta.open(os.path.join(d, "b.zarr"))
        (a @ bb).to_zarr(os.path.join(d, "c.zarr"), overwrite=True)
        np.savez(os.path.join(d, "reductions.npz"), sum0=a.sum(axis=0).compute(),
                 std1=a.std(axis=1).compute())
        # linear algebra from a batch job: TSQR's R and lstsq, a stored Cholesky factor
        y = np.arange(a.shape[0], dtype=float)
        x, res, rank, s = np.linalg.lstsq(a, y)
        np.savez(os.path.join(d, "linalg.npz"), r=ta.linalg.qr(a, mode="r").compute(),
                 x=x, res=res, rank=rank, s=s)
        spd = a.T @ a + a.shape[0] * ta.eye(a.shape[1])
        ta.linalg.cholesky(spd).to_zarr(os.path.join(d, "l.zarr"), overwrite=True)


def fail(d):
    """The client code raises after the cluster is up."""
    ta.Engine.mpi(memory_per_worker="1GiB")
    raise ValueError("boom from the client rank")


def exit3(d):
    """The client code ends with sys.exit(3)."""
    with ta.Engine.mpi(memory_per_worker="1GiB"):
        pass
    sys.exit(3)


def kill(d):
    """A matmul of many small blocks; the test SIGKILLs a worker rank mid-way."""
    with ta.Engine.mpi(memory_per_worker="600MiB") as engine:
        client = engine.client
        # with Nanny workers the MPI rank is the worker process's parent
        _write_json(os.path.join(d, "pids.json"), {
            "ranks": sorted(client.run(os.getppid).values()),
            "workers": sorted(client.run(os.getpid).values()),
        })
        a, b = ta.open(os.path.join(d, "a.zarr")), ta.open(os.path.join(d, "b.zarr"))
        c = (a @ b).to_zarr(os.path.join(d, "c.zarr"), tile=(128, 128), overwrite=True)
        _write_json(os.path.join(d, "after.json"), {
            "workers_left": len(client.scheduler_info(n_workers=-1)["workers"]),
            "task_retries": c.stats.task_retries,
            "tasks": c.stats.tasks,
        })


def victim(d):
    """Writes every rank's pid, waits for the test to kill one, then a matmul."""
    import time

    # a short timeout: a lost client or scheduler ends the job within seconds
    # (30 s, not 10: on a loaded 2-core host -- the suite on 2 processes beside
    # a benchmark -- the worker ranks once took over 10 s to start)
    with ta.Engine.mpi(memory_per_worker="1GiB", timeout="30s") as engine:
        client = engine.client
        _write_json(os.path.join(d, "pids.json"), {
            "client": os.getpid(),
            "scheduler": client.run_on_scheduler(os.getpid),
            "workers": sorted(client.run(os.getppid).values()),  # the ranks, not the Nannies'
        })
        go = os.path.join(d, "go")
        deadline = time.monotonic() + 60
        while not os.path.exists(go) and time.monotonic() < deadline:
            time.sleep(0.02)
        a, b = ta.open(os.path.join(d, "a.zarr")), ta.open(os.path.join(d, "b.zarr"))
        (a @ b).to_zarr(os.path.join(d, "c.zarr"), overwrite=True)
    print("client rank done", flush=True)  # output after a kill: hydra's next event


if __name__ == "__main__":
    job, directory = sys.argv[1], sys.argv[2]
    globals()[job](directory)
