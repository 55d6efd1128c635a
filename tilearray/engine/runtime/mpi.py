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
client rank dies, the scheduler closes after ``timeout`` without a client (at
once under the launcher, which tells it the client's process is gone) and
every rank exits; if the scheduler rank dies, the workers lose it and exit and
the client's run fails.

mpi4py, dask_mpi and distributed are imported lazily, inside functions.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
import threading
import time

from ...errors import ClusterArgumentError, ClusterError
from . import context
from .mpi_ranks import (
    deadline_after,
    flush_streams,
    ignore_sigusr1,
    in_spawned_child,
    local_facts,
    main_hidden,
    quiet_logs,
    rank_barrier,
    seconds_arg,
    shutdown_ranks,
)
from .mpirun import (  # noqa: F401  (the launcher's public names live here too)
    CLIENT_RANK,
    FINALIZE_ENV,
    SHELL_WRAPPER,
    STATUS_ENV,
    await_client,
    client_alive,
    find_mpiexec,
    leave_launcher_group,
    main,
    mark_abort,
    mpi_flavor,
    mpirun,
    start_heartbeat,
    write_status,
)

log = logging.getLogger("tilearray")

SCHEDULER_RANK = 0

# per-process state
_watch: dict | None = None  # scheduler rank: settings of the client watchdog
_client_exit: _ClientExit | None = None
_finalize_disabled = False  # mpi4py.rc.finalize set False by us before MPI_Init


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
            flush_streams()
            os._exit(code)

    threading.Thread(target=watchdog, daemon=True, name="tilearray-finalize").start()
    MPI.Finalize()
    done.set()


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
    status = os.environ.get(STATUS_ENV)

    async def shutdown(reason: str) -> None:
        import asyncio

        nannies = [ws.nanny for ws in scheduler.workers.values() if ws.nanny]

        async def one(addr):  # as in shutdown_ranks: Nannies stop their workers first
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
        elif status and os.path.exists(status + ".alive") and \
                not client_alive(status, cfg["grace"]):
            # under the launcher: the client rank's process is gone (its pid on
            # this host, else its heartbeat): no reason to wait out the grace
            close("the client rank died without shutting down the cluster")
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
        shutdown_ranks(self.engine.client, self.timeout)

    def at_exit(self) -> None:
        code = 0 if self.code is None else self.code
        if self.status_path:  # first: the cluster's shutdown may end this process
            write_status(self.status_path, code)
        self.shutdown_cluster()
        flush_streams()
        if os.environ.get(FINALIZE_ENV) == "skip" and not _finalize_disabled:
            # mpi4py was imported before us and would MPI_Finalize (and hang
            # on a dead rank) after this handler: leave now
            logging.shutdown()
            flush_streams()
            os._exit(code)
        _finalize(None)


_engine_classes: dict = {}


def _mpi_engine_class(engine_cls):
    """``engine_cls`` whose close() shuts down the whole MPI cluster."""
    cls = _engine_classes.get(engine_cls)
    if cls is None:

        def close(self) -> None:
            if context.default is self:
                context.default = None
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
        No progress. Default False: a rank's stderr is mpiexec's pipe, not a
        terminal, so progress is written as lines, one every 30 s at most
        (and at the end of each run), into the job's log.
    """
    booted = _booted_engine()
    if booted is not None:
        return booted  # already booted: the same engine
    wait = seconds_arg(timeout, 60)
    threads = int(threads_per_worker or 1)
    comm = _init_mpi(wait)
    size, rank = comm.Get_size(), comm.Get_rank()
    import distributed  # noqa: F401  (configures its logging at import: quiet it after)

    quiet_logs(log_level)
    rank_barrier(comm, wait, "tilearray.Engine.mpi()")
    local_workers, blas = local_facts(comm, rank, threads)
    from ... import _config
    from .local import default_memory
    from .plugins import BlasLimit, QuietClosedScheduler

    mem = _config.parse_bytes_arg(memory_per_worker, "memory_per_worker",
                                  ClusterArgumentError) \
        if memory_per_worker is not None else default_memory(local_workers)
    _configure_dask(rank, wait, blas)
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
        return _serve(comm, rank, kwargs, nanny, exit, wait)
    client = _connect_client(kwargs, size, wait)
    quiet = bool(quiet)  # a rank's stderr is a pipe: progress as lines in the job's log
    engine = _mpi_engine_class(engine_cls)(
        client=client, memory_per_worker=memory_per_worker, quiet=quiet)
    engine.blas_threads = blas
    engine.mpi_size = size
    _register_client_exit(engine, wait)
    with context.lock:
        if context.default is None:
            context.default = engine
    log.info("tilearray.mpi: %d workers x %d threads, %s per worker", size - 2, threads, mem)
    return engine


def _booted_engine():
    """This job's engine if :func:`start` already booted it (else None); a
    second boot after its shutdown, or from a re-imported main module, is refused."""
    if _client_exit is not None and _client_exit.engine is not None:
        if not _client_exit._closed:
            return _client_exit.engine
        raise ClusterError("this job's MPI cluster was already shut down; Engine.mpi() boots "
                           "one cluster per mpiexec job")
    if in_spawned_child():
        raise ClusterError(
            "tilearray.Engine.mpi() was called in a multiprocessing child process that is "
            "re-importing the main script. Put the script's work under "
            "`if __name__ == \"__main__\":` so that importing it has no side effects.")
    return None


def _init_mpi(wait: float):
    """``MPI_Init`` (bounded by ``wait``) and ``COMM_WORLD``, checked to have 3 ranks or more."""
    global _finalize_disabled
    # under the launcher: out of hydra's reach when a rank's wrapper is killed
    leave_launcher_group(os.environ.get(STATUS_ENV))

    import mpi4py

    if "mpi4py.MPI" not in sys.modules and os.environ.get(FINALIZE_ENV) == "skip":
        mpi4py.rc.finalize = False
        _finalize_disabled = True
    with deadline_after(wait, "MPI_Init (it waits for every rank)"):
        from mpi4py import MPI  # MPI_Init: MPICH installs a SIGUSR1 handler, which spawned

    ignore_sigusr1()  # children would reset to "terminate": ignore it instead
    comm = MPI.COMM_WORLD
    if comm.Get_size() < 3:
        raise ClusterError(
            f"tilearray.Engine.mpi() needs at least 3 MPI ranks (scheduler, client, one worker), "
            f"got {comm.Get_size()}; run with e.g. `mpiexec -n 4 python script.py`")
    return comm


def _configure_dask(rank: int, wait: float, blas: int) -> None:
    """dask's config on every rank: retries, no spilling, no worker profiler
    on Python 3.11 (:func:`~.local.no_profiler`), the workers' BLAS threads;
    the scheduler rank preloads this module (the lost-client watch)."""
    global _watch
    import dask

    from ... import _config
    from .local import no_profiler

    blas_env = {k: blas for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
    dask.config.set({
        "distributed.scheduler.allowed-failures": _config.get("scheduler.allowed-failures"),
        "distributed.worker.memory.spill": False,
        "distributed.worker.memory.target": False,
        **no_profiler(),
        "distributed.nanny.pre-spawn-environ": {
            **dask.config.get("distributed.nanny.pre-spawn-environ", {}), **blas_env},
    })
    if rank == SCHEDULER_RANK:
        _watch = {"first": wait, "grace": wait}
        preload = list(dask.config.get("distributed.scheduler.preload", []) or [])
        dask.config.set({"distributed.scheduler.preload": [*preload, __name__]})


def _serve(comm, rank: int, kwargs: dict, nanny: bool, exit: bool, wait: float):
    """The scheduler or a worker on this rank until the cluster closes; then
    the process exits (returns None with ``exit=False``)."""
    from dask_mpi import initialize

    hide = main_hidden() if (nanny and rank != SCHEDULER_RANK) else contextlib.nullcontext()
    try:
        with hide:
            initialize(**kwargs)
    except BaseException as e:  # noqa: BLE001 - report, then end this rank
        role = "scheduler" if rank == SCHEDULER_RANK else "worker"
        sys.stderr.write(f"tilearray.mpi: the {role} on rank {rank} failed: "
                         f"{type(e).__name__}: {e}\n")
        flush_streams()
        if rank == SCHEDULER_RANK:  # every other rank waits for the scheduler's address
            mark_abort(os.environ.get(STATUS_ENV))
            comm.Abort(1)
        os._exit(1)
    flush_streams()
    if not exit:
        return None
    # under the launcher: leave only once the client rank has reported its
    # status (or is gone); see tilearray.engine.mpirun
    await_client(os.environ.get(STATUS_ENV), stale=max(wait, 10.0))
    if os.environ.get(FINALIZE_ENV) == "skip":
        if not _finalize_disabled:
            flush_streams()
            os._exit(0)  # mpi4py would MPI_Finalize at exit, and wait for a dead rank
    else:
        _finalize(None)
    # a normal exit: with os._exit right after MPI_Finalize, hydra took the rank
    # for one that died and SIGKILLed the others, the client rank included (measured)
    sys.exit(0)


def _connect_client(kwargs: dict, size: int, wait: float):
    """The client rank's Client, once all ``size - 2`` worker ranks joined."""
    import dask
    from dask_mpi import initialize
    from distributed import Client

    if os.environ.get(STATUS_ENV):
        start_heartbeat(os.environ[STATUS_ENV])  # the launcher waits while it beats
    initialize(**kwargs)
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
    return client


def _register_client_exit(engine, wait: float) -> None:
    """The client rank's exit hook (reports status, shuts the cluster down), once per job."""
    global _client_exit
    if _client_exit is None:
        _client_exit = _ClientExit(os.environ.get(STATUS_ENV), wait)
        atexit.register(_client_exit.at_exit)
    _client_exit.engine = engine
    _client_exit._closed = False

if __name__ == "__main__":
    sys.exit(main())
