"""Helpers of the MPI boot (:mod:`.mpi`) that hold no state: bounded waits
where MPI has none (a deadline, a barrier that gives up), signals and the
hidden main module of spawned children, each node's share of cores and
memory, distributed's log level, and the Nanny-first shutdown of the cluster.
mpi4py is imported lazily, inside functions."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
import types

from .mpirun import CLIENT_RANK, STATUS_ENV, mark_abort


# ----------------------------------------------------------------------------- helpers
def _seconds(value, default: float) -> float:
    if value is None:
        return float(default)
    if isinstance(value, int | float):
        return float(value)
    from dask.utils import parse_timedelta

    return float(parse_timedelta(value))


def _flush() -> None:
    for f in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            f.flush()


def _in_spawned_child() -> bool:
    import multiprocessing

    main = sys.modules.get("__main__")
    return (getattr(main, "__name__", None) == "__mp_main__"
            or multiprocessing.parent_process() is not None)


def _ignore_sigusr1() -> None:
    """hydra sends SIGUSR1 to every rank's process group when a rank dies (or
    leaves without MPI_Finalize) under -disable-auto-cleanup. Its default
    action terminates the Nanny's worker process and multiprocessing's
    resource tracker; an ignored signal stays ignored in spawned children."""
    if hasattr(signal, "SIGUSR1") and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)


@contextlib.contextmanager
def _main_hidden():
    """Spawned children of this block do not re-import the main script.

    multiprocessing's spawn re-imports ``sys.modules["__main__"]`` in the
    child by ``__spec__.name`` or ``__file__``; a stub without either is
    skipped. Only used on worker ranks, which run no user code meanwhile.
    """
    real = sys.modules.get("__main__")
    stub = types.ModuleType("__main__")
    stub.__spec__ = None
    sys.modules["__main__"] = stub
    try:
        yield
    finally:
        if real is not None:
            sys.modules["__main__"] = real


@contextlib.contextmanager
def _deadline(seconds: float, what: str):
    """End this process (status 1) if the block outlives ``seconds``: for waits
    that cannot time out by themselves, like MPI_Init waiting for every rank."""
    done = threading.Event()

    def watchdog():
        if not done.wait(seconds):
            sys.stderr.write(f"tilearray.mpi: {what} did not finish within {seconds:.0f} s "
                             "(a rank failed or never started); exiting\n")
            _flush()
            os._exit(1)

    threading.Thread(target=watchdog, daemon=True, name="tilearray-mpi-deadline").start()
    try:
        yield
    finally:
        done.set()


def _barrier(comm, timeout: float, what: str) -> None:
    """A barrier that gives up: MPI collectives never time out by themselves."""
    req = comm.Ibarrier()
    deadline = time.monotonic() + timeout
    delay = 0.001
    while not req.Test():
        if time.monotonic() > deadline:
            sys.stderr.write(
                f"tilearray.mpi: rank {comm.Get_rank()}: not every rank reached {what} within "
                f"{timeout:.0f} s (a rank failed before it, or ranks run different scripts); "
                "aborting the job\n")
            _flush()
            mark_abort(os.environ.get(STATUS_ENV))
            comm.Abort(1)
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


def _local_facts(comm, rank: int, threads: int) -> tuple[int, int]:
    """(worker ranks on this node, cores this rank may use)."""
    from mpi4py import MPI

    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
    try:
        ranks = node.allgather(rank)
    finally:
        node.Free()
    local_workers = max(sum(r > CLIENT_RANK for r in ranks), 1)
    cpus = os.cpu_count() or 1
    try:
        mine = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        mine = cpus
    # bound by the MPI launcher to some cores: use them; else share the node
    cores = mine if mine < cpus else max(cpus // local_workers, 1)
    return local_workers, max(cores // max(threads, 1), 1)


def _quiet_logs(level) -> None:
    """No INFO chatter (and its CommClosedError tracebacks at shutdown)."""
    if level is None:
        return
    name = logging.getLevelName(level) if isinstance(level, int) else str(level).upper()
    logging.getLogger("distributed").setLevel(name)
    # spawned worker processes configure logging from the environment at import
    os.environ["DASK_LOGGING__DISTRIBUTED"] = name.lower()


def _shutdown(client, timeout: float) -> None:
    """Close the whole cluster from the client rank, quietly and in bounded time."""
    done = threading.Event()

    def run():
        try:
            if client.status == "running":
                # Nannies first: each stops its worker process through its stop
                # queue. Left to the scheduler's close, a worker process closes
                # itself and races its Nanny ("Worker process died unexpectedly").
                with contextlib.suppress(Exception):
                    workers = client.scheduler_info(n_workers=-1).get("workers", {})
                    nannies = [w["nanny"] for w in workers.values() if w.get("nanny")]
                    client.sync(_terminate_nannies, client, nannies, timeout)
                client.shutdown()  # scheduler -> workers close; closes the client too
            else:
                client.close(timeout=5)
        except Exception:  # scheduler already gone: nothing left to close
            with contextlib.suppress(Exception):
                client.close(timeout=5)
        finally:
            done.set()

    t = threading.Thread(target=run, daemon=True, name="tilearray-mpi-shutdown")
    t.start()
    if not done.wait(timeout):
        sys.stderr.write(f"tilearray.mpi: cluster shutdown did not finish within {timeout:.0f} s\n")


async def _terminate_nannies(client, nannies, timeout: float) -> None:
    import asyncio

    async def one(addr):
        # the Nanny closes its comm before it could answer: no reply expected
        with contextlib.suppress(Exception):
            await asyncio.wait_for(
                client.rpc(addr).terminate(reason="tilearray-mpi-shutdown"), timeout)

    await asyncio.gather(*map(one, nannies))
    # a Nanny drops the comm before its worker has left: wait (bounded) until
    # the workers have unregistered, so none heartbeats a closed scheduler
    deadline = time.monotonic() + timeout

    def count(dask_scheduler):
        return len(dask_scheduler.workers)

    while nannies and time.monotonic() < deadline:
        try:
            if not await client.run_on_scheduler(count):
                break
        except Exception:
            break
        await asyncio.sleep(0.05)
