"""Batch jobs under ``mpiexec``: boot an Engine across MPI ranks with dask-mpi.

Rank 0 runs the dask scheduler, rank 1 runs your script (the *client rank*),
ranks 2.. run one dask worker each. Every rank runs the same script; only the
client rank gets past :func:`start` (``tilearray.Engine.mpi()``), the others
serve the cluster and exit with status 0 once the client rank is done::

    import tilearray as ta

    if __name__ == "__main__":
        with ta.Engine.mpi(memory_per_worker="4GiB") as engine:
            (ta.open("a.zarr") @ ta.open("b.zarr")).to_zarr("c.zarr", overwrite=True)

Run it with the launcher (``python -m tilearray.engine.mpi -n 8 job.py``, or
:func:`mpirun`), which passes the right recovery flags to the installed MPI and
exits with the *client rank's* status, or with a plain ``mpiexec -n 8 python
job.py``, where a worker rank that dies takes the whole job down with it. The
launcher and the status channel it reads are in :mod:`tilearray.engine.mpirun`.

Measured facts this module is built on (MPICH 5.0 hydra from the ``mpich``
wheel, dask-mpi 2026.3, distributed 2026.8):

* A worker rank killed by a signal makes hydra SIGKILL every other rank, *even
  with* ``-disable-auto-cleanup``: the proxy kills the job whenever a rank
  terminates by a signal. With ``-disable-auto-cleanup`` and a rank that exits
  (not signalled), hydra only sends SIGUSR1 to the other ranks' process groups,
  whose default action is to terminate. The launcher therefore runs each rank
  under ``sh -c 'trap "" USR1; ...'``: a killed Python rank becomes an exit
  status 137 of its shell and SIGUSR1 is ignored, so the job goes on and dask
  reruns the lost tasks elsewhere. MPICH's MPI_Init installs its own SIGUSR1
  handler, which spawned children (the Nanny's worker, multiprocessing's
  resource tracker) reset to "terminate": every rank ignores SIGUSR1 after
  MPI_Init, and ignored signals stay ignored in children.
* When a rank's *wrapper* shell is SIGKILLed, hydra's proxy, at its next event
  (any rank's output), SIGKILLs the process group of every rank, the client
  included, whose work may be done but not yet reported. Under the launcher
  every rank therefore moves to a process group of its own at :func:`start`;
  the job's end is then the launcher's: it removes its status directory, and
  every rank watches that directory (and an abort mark) and ends itself.
  Non-client ranks leave only once the client rank has reported its status.
* After a rank was killed, ``MPI_Finalize`` hung on the surviving ranks, so
  under the launcher (hydra) finalization is skipped, which hydra accepts when
  auto-cleanup is disabled. Under a plain ``mpiexec`` ranks finalize as usual.
* Left to the scheduler's close, a Nanny's worker process closes itself and
  races its Nanny ("Worker process died unexpectedly" traceback); shutdown
  asks the Nannies to stop their workers first, then closes the scheduler.
* With ``distributed.Nanny`` workers (the default) the worker process is a
  *spawned* child of the rank; a plain spawn re-imports the main script, and a
  script without an ``if __name__ == "__main__":`` guard then calls
  ``MPI_Init`` in the child, which fails ("PMI_Init failed"), the Nanny gives
  up, and the client waits for workers that never come. Worker ranks here
  spawn the Nanny's child with the main module hidden, like the ``dask
  worker`` command does, so the child never re-imports the script: a script
  works with or without the guard (the guard is still good practice). A
  multiprocessing child of your own that re-imports an unguarded script and
  reaches :func:`start` gets a :class:`~tilearray.errors.ClusterError` at once.
* dask-mpi's ``nanny=True`` raises a DeprecationWarning *after* the worker
  class was chosen; ``worker_class="distributed.Nanny"`` is used instead.

The scheduler rank and the client rank are single points of failure: if the
client rank dies, the scheduler closes after ``timeout`` without a client and
every rank exits; if the scheduler rank dies, the workers lose it and exit and
the client's run fails.

mpi4py, dask_mpi and distributed are imported lazily, inside functions.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import sys
import threading
import time
import types

from ...errors import ClusterError

log = logging.getLogger("tilearray")

from .mpirun import (  # noqa: F401  (the launcher's public names live here too)
    _SHELL_WRAPPER,
    CLIENT_RANK,
    FINALIZE_ENV,
    STATUS_ENV,
    await_client,
    find_mpiexec,
    leave_launcher_group,
    main,
    mark_abort,
    mpi_flavor,
    mpirun,
    start_heartbeat,
    write_status,
)

SCHEDULER_RANK = 0

# per-process state
_watch: dict | None = None  # scheduler rank: settings of the client watchdog
_client_exit: _ClientExit | None = None
_finalize_disabled = False  # mpi4py.rc.finalize set False by us before MPI_Init


# ----------------------------------------------------------------------------- helpers
def _seconds(value, default: float) -> float:
    if value is None:
        return float(default)
    if isinstance(value, int | float):
        return float(value)
    from dask.utils import parse_timedelta

    return float(parse_timedelta(value))


def _nbytes(value) -> int:
    from dask.utils import parse_bytes

    return parse_bytes(value) if isinstance(value, str) else int(value)


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


def _default_memory(local_workers: int) -> int:
    import psutil

    from ... import _config

    mem = _config.get_bytes("memory.default-per-worker")
    return min(mem, int(psutil.virtual_memory().total * 0.8 / local_workers))


def _finalize(wait: float | None) -> None:
    """MPI_Finalize, or not: see the module docstring."""
    mode = os.environ.get(FINALIZE_ENV, "")
    if mode == "skip":
        return  # mpi4py.rc.finalize is False, or the caller leaves by os._exit
    from mpi4py import MPI

    if MPI.Is_finalized():
        return
    if wait is None and mode:
        with contextlib.suppress(ValueError):
            wait = float(mode)
    if wait is None:
        MPI.Finalize()
        return
    done = threading.Event()
    code = _client_exit.code if _client_exit is not None else 0

    def watchdog():
        if not done.wait(wait):
            sys.stderr.write(f"tilearray.mpi: MPI_Finalize did not return within {wait:.0f} s "
                             "(a rank died?); exiting\n")
            _flush()
            os._exit(code)

    threading.Thread(target=watchdog, daemon=True, name="tilearray-finalize").start()
    MPI.Finalize()
    done.set()


def _quiet_logs(level) -> None:
    """No INFO chatter (and its CommClosedError tracebacks at shutdown)."""
    if level is None:
        return
    name = logging.getLevelName(level) if isinstance(level, int) else str(level).upper()
    logging.getLogger("distributed").setLevel(name)
    # spawned worker processes configure logging from the environment at import
    os.environ["DASK_LOGGING__DISTRIBUTED"] = name.lower()


# ------------------------------------------------------------ scheduler-rank watchdog
def dask_setup(scheduler) -> None:
    """Scheduler preload: close the cluster when the client rank is gone.

    Without it a client rank killed by a signal would leave the scheduler and
    worker ranks (and so the job) running forever.
    """
    cfg = _watch
    if cfg is None:
        return
    from tornado.ioloop import PeriodicCallback

    t0 = time.monotonic()
    state = {"seen": False, "gone": None, "closing": False}

    async def shutdown(reason: str) -> None:
        import asyncio

        nannies = [ws.nanny for ws in scheduler.workers.values() if ws.nanny]

        async def one(addr):  # as in _shutdown: Nannies stop their workers first
            with contextlib.suppress(Exception):
                await asyncio.wait_for(scheduler.rpc(addr).terminate(reason=reason), cfg["grace"])

        await asyncio.gather(*map(one, nannies))
        # the Nanny may drop the comm before its worker has left: wait (bounded)
        # until the workers have unregistered, so none heartbeats a closed scheduler
        deadline = time.monotonic() + cfg["grace"]
        while scheduler.workers and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await scheduler.close(reason=reason)

    def close(reason: str) -> None:
        state["closing"] = True
        sys.stderr.write(f"tilearray.mpi scheduler: {reason}; shutting down\n")
        scheduler._ongoing_background_tasks.call_soon(shutdown, reason)

    def check() -> None:
        if state["closing"]:
            return
        now = time.monotonic()
        if any(c != "fire-and-forget" for c in scheduler.clients):
            state["seen"], state["gone"] = True, None
        elif not state["seen"]:
            if now - t0 > cfg["first"]:
                close(f"no client connected within {cfg['first']:.0f} s")
        elif state["gone"] is None:
            state["gone"] = now
        elif now - state["gone"] > cfg["grace"]:
            close(f"the client rank left without shutting down the cluster "
                  f"({cfg['grace']:.0f} s ago)")

    pc = PeriodicCallback(check, 1000)
    scheduler.periodic_callbacks["tilearray-mpi-client-watch"] = pc
    pc.start()


# ----------------------------------------------------------------- client-rank exit
class _ClientExit:
    """Records the client rank's exit status and shuts the cluster down at exit."""

    def __init__(self, status_path: str | None, timeout: float):
        self.status_path = status_path
        self.timeout = timeout
        self.code: int | None = None
        self.engine = None
        self._closed = False
        self._prev_hook = sys.excepthook
        sys.excepthook = self._excepthook
        if status_path:
            self._real_exit = sys.exit
            sys.exit = self._exit

    def _excepthook(self, etype, value, tb):
        if self.code is None:
            self.code = 130 if issubclass(etype, KeyboardInterrupt) else 1
        self._prev_hook(etype, value, tb)

    def _exit(self, arg=None):
        if arg is None:
            self.code = 0
        elif isinstance(arg, int):
            self.code = arg & 0xFF
        else:
            self.code = 1
        self._real_exit(arg)

    def shutdown_cluster(self) -> None:
        if self._closed or self.engine is None:
            return
        self._closed = True
        _shutdown(self.engine.client, self.timeout)

    def at_exit(self) -> None:
        code = 0 if self.code is None else self.code
        if self.status_path:  # first: the cluster's shutdown may end this process
            write_status(self.status_path, code)
        self.shutdown_cluster()
        _flush()
        if os.environ.get(FINALIZE_ENV) == "skip" and not _finalize_disabled:
            # mpi4py was imported before us and would MPI_Finalize (and hang
            # on a dead rank) after this handler: leave now
            logging.shutdown()
            _flush()
            os._exit(code)
        _finalize(None)


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


_engine_classes: dict = {}


def _mpi_engine_class(engine_cls):
    """``engine_cls`` whose close() shuts down the whole MPI cluster."""
    cls = _engine_classes.get(engine_cls)
    if cls is None:

        def close(self) -> None:
            from . import cluster

            if cluster._default is self:
                cluster._default = None
            if _client_exit is not None and _client_exit.engine is self:
                _client_exit.shutdown_cluster()

        cls = type(f"MPI{engine_cls.__name__}", (engine_cls,), {
            "close": close,
            "__doc__": f"{engine_cls.__name__} on a dask-mpi cluster; close() shuts it down.",
            "__module__": engine_cls.__module__,
        })
        _engine_classes[engine_cls] = cls
    return cls


# ---------------------------------------------------------------------------- start
def start(engine_cls, memory_per_worker=None, threads_per_worker=1, nanny=True,
          local_directory=None, interface=None, exit=True, *, timeout="60s",
          log_level="warning", dashboard=False, quiet=None):
    """Boot a dask cluster across the MPI ranks and return the Engine on rank 1.

    Called by ``tilearray.Engine.mpi(**kwargs)`` on every rank of an
    ``mpiexec`` job (at least 3 ranks). Rank 0 becomes the scheduler, ranks
    2.. the workers: there this call serves the cluster until the client rank
    finishes, then exits the process with status 0 (with ``exit=False`` it
    returns ``None`` instead). On rank 1 it returns an ``engine_cls`` over a
    Client connected to the cluster, made the default engine; closing it (or
    the end of the script, or an exception) shuts the whole cluster down.

    Parameters
    ----------
    memory_per_worker : int or str, optional
        Each worker's ``memory_limit``; the planner budgets with it. Default:
        ``tilearray.memory.default-per-worker``, capped by 80 % of the node's
        memory shared among the worker ranks on that node.
    threads_per_worker : int
        dask threads per worker rank. BLAS threads per worker are set so that
        dask threads x BLAS threads fit the cores of the rank (its affinity
        mask if the launcher binds ranks, else the node's cores shared among
        its worker ranks).
    nanny : bool
        Run each worker in a Nanny-supervised child process (restarted if it
        dies, e.g. killed for memory) rather than in the rank process.
    local_directory, interface : str, optional
        Worker scratch directory; network interface (``"ib0"``) to bind.
    exit : bool
        Non-client ranks exit the process when the cluster closes.
    timeout : str or float
        Bound of every wait: all ranks reaching this call, the workers
        joining, the shutdown, the scheduler's wait for a lost client rank.
    log_level : str or None
        Level of distributed's logs on every rank (``None``: leave as configured).
    dashboard : bool
        Serve the dask dashboard from the scheduler rank.
    quiet : bool, optional
        No progress bar; default: quiet unless stderr is a terminal.
    """
    global _watch, _client_exit, _finalize_disabled
    if _client_exit is not None and _client_exit.engine is not None:
        if not _client_exit._closed:
            return _client_exit.engine  # already booted: the same engine
        raise ClusterError("this job's MPI cluster was already shut down; Engine.mpi() boots "
                           "one cluster per mpiexec job")
    if _in_spawned_child():
        raise ClusterError(
            "tilearray.Engine.mpi() was called in a multiprocessing child process that is "
            "re-importing the main script. Put the script's work under "
            "`if __name__ == \"__main__\":` so that importing it has no side effects.")
    wait = _seconds(timeout, 60)
    threads = int(threads_per_worker or 1)
    # under the launcher: out of hydra's reach when a rank's wrapper is killed
    leave_launcher_group(os.environ.get(STATUS_ENV))

    import mpi4py

    if "mpi4py.MPI" not in sys.modules and os.environ.get(FINALIZE_ENV) == "skip":
        mpi4py.rc.finalize = False
        _finalize_disabled = True
    with _deadline(wait, "MPI_Init (it waits for every rank)"):
        from mpi4py import MPI  # MPI_Init: MPICH installs a SIGUSR1 handler, which spawned

    _ignore_sigusr1()  # children would reset to "terminate": ignore it instead
    comm = MPI.COMM_WORLD
    size, rank = comm.Get_size(), comm.Get_rank()
    if size < 3:
        raise ClusterError(
            f"tilearray.Engine.mpi() needs at least 3 MPI ranks (scheduler, client, one worker), "
            f"got {size}; run with e.g. `mpiexec -n 4 python script.py`")
    import distributed  # noqa: F401  (configures its logging at import: quiet it after)

    _quiet_logs(log_level)
    _barrier(comm, wait, "tilearray.Engine.mpi()")
    local_workers, blas = _local_facts(comm, rank, threads)

    import dask
    from dask_mpi import initialize

    from ... import _config
    from .plugins import BlasLimit, QuietClosedScheduler

    mem = _nbytes(memory_per_worker) if memory_per_worker is not None \
        else _default_memory(local_workers)
    blas_env = {k: blas for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
    dask.config.set({
        "distributed.scheduler.allowed-failures": _config.get("scheduler.allowed-failures"),
        "distributed.worker.memory.spill": False,
        "distributed.worker.memory.target": False,
        "distributed.nanny.pre-spawn-environ": {
            **dask.config.get("distributed.nanny.pre-spawn-environ", {}), **blas_env},
    })
    if rank == SCHEDULER_RANK:
        _watch = {"first": wait, "grace": wait}
        preload = list(dask.config.get("distributed.scheduler.preload", []) or [])
        dask.config.set({"distributed.scheduler.preload": [*preload, __name__]})

    kwargs = dict(
        interface=interface,
        nthreads=threads,
        local_directory=local_directory,
        memory_limit=mem,
        dashboard=bool(dashboard),
        dashboard_address=":8787" if dashboard else ":0",
        worker_class="distributed.Nanny" if nanny else "distributed.Worker",
        worker_options={"death_timeout": wait,
                        "plugins": (BlasLimit(blas), QuietClosedScheduler())},
        exit=False,
    )
    if rank != CLIENT_RANK:
        hide = _main_hidden() if (nanny and rank != SCHEDULER_RANK) else contextlib.nullcontext()
        try:
            with hide:
                initialize(**kwargs)
        except BaseException as e:  # noqa: BLE001 - report, then end this rank
            role = "scheduler" if rank == SCHEDULER_RANK else "worker"
            sys.stderr.write(f"tilearray.mpi: the {role} on rank {rank} failed: "
                             f"{type(e).__name__}: {e}\n")
            _flush()
            if rank == SCHEDULER_RANK:  # every other rank waits for the scheduler's address
                mark_abort(os.environ.get(STATUS_ENV))
                comm.Abort(1)
            os._exit(1)
        _flush()
        if not exit:
            return None
        # under the launcher: leave only once the client rank has reported its
        # status (or is gone); see tilearray.engine.mpirun
        await_client(os.environ.get(STATUS_ENV), stale=max(wait, 10.0))
        if os.environ.get(FINALIZE_ENV) == "skip":
            if not _finalize_disabled:
                _flush()
                os._exit(0)  # mpi4py would MPI_Finalize at exit, and wait for a dead rank
        else:
            _finalize(None)
        # a normal exit: with os._exit right after MPI_Finalize, hydra took the rank
        # for one that died and SIGKILLed the others, the client rank included (measured)
        sys.exit(0)

    # -- client rank
    if os.environ.get(STATUS_ENV):
        start_heartbeat(os.environ[STATUS_ENV])  # the launcher waits while it beats
    initialize(**kwargs)
    from distributed import Client

    address = dask.config.get("scheduler_address")
    try:
        client = Client(address, timeout=wait)
    except Exception as e:
        raise ClusterError(f"could not connect to the scheduler at {address}: {e}") from e
    n_workers = size - 2
    try:
        client.wait_for_workers(n_workers, timeout=wait)
    except Exception as e:
        got = len(client.scheduler_info(n_workers=-1).get("workers", {}))
        client.shutdown()
        raise ClusterError(
            f"only {got} of {n_workers} dask workers (MPI ranks 2..{size - 1}) joined within "
            f"{wait:.0f} s; see those ranks' stderr") from e

    if quiet is None:
        quiet = not (hasattr(sys.stderr, "isatty") and sys.stderr.isatty())
    engine = _mpi_engine_class(engine_cls)(
        client=client, memory_per_worker=memory_per_worker, quiet=quiet)
    engine.blas_threads = blas
    engine.mpi_size = size
    if _client_exit is None:
        _client_exit = _ClientExit(os.environ.get(STATUS_ENV), wait)
        atexit.register(_client_exit.at_exit)
    _client_exit.engine = engine
    _client_exit._closed = False

    from . import engine as cluster

    with cluster._lock:
        if cluster._default is None:
            cluster._default = engine
    log.info("tilearray.mpi: %d workers x %d threads, %s per worker", n_workers, threads,
             mem)
    return engine


if __name__ == "__main__":
    sys.exit(main())
