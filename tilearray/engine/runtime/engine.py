"""The Engine: owns (or borrows) a dask.distributed Client and runs graphs.

``Engine()`` starts an embedded LocalCluster sized to the machine;
``Engine(client=...)`` uses any running cluster; ``Engine.mpi()`` boots one
across MPI ranks with dask-mpi. Only this package touches the cluster.
"""

from __future__ import annotations

import atexit
import contextlib
import logging

from dask.utils import format_bytes

from ... import _config
from ...errors import ClusterError
from ..plan.types import Budget
from . import context
from .gather import gather
from .local import check_alive, check_arguments, restore_environ, start_local
from .stats import RunStats

log = logging.getLogger("tilearray")


def _blas_info():
    from threadpoolctl import threadpool_info

    return [(i.get("internal_api"), i.get("num_threads")) for i in threadpool_info()]


class Engine:
    """Where tilearray work runs: a dask.distributed cluster and its budget.

    Parameters
    ----------
    n_workers, threads_per_worker : int, optional
        Size of the embedded LocalCluster; default: one single-threaded
        worker per core.
    memory_per_worker : int or str, optional
        The whole worker process limit (dask's ``memory_limit``), e.g.
        ``"1GiB"``. Tasks are planned to fit inside it. Default:
        ``tilearray.memory.default-per-worker``, capped by the machine.
    client : distributed.Client, optional
        Use this running cluster instead of starting one; the budget is read
        from its workers (the one with the least memory per thread sets it).
    adaptive : (int, int), optional
        ``(minimum, maximum)`` workers: the embedded LocalCluster scales with
        the work through dask's adaptive scaling (``cluster.adapt``); tasks
        are planned for ``maximum`` workers of the same size.
    processes : bool, optional
        Workers as processes (True) or threads of this process (False).
        Default (None): processes, unless the main script cannot be re-run
        by spawned worker processes — code read from standard input
        (``python - <<EOF``), or a script that starts the engine outside an
        ``if __name__ == "__main__":`` block — then threads, with a
        RuntimeWarning saying why. ``processes=True`` there is a
        ClusterError; ``python -c``, the REPL and notebooks get processes.
    quiet : bool
        No progress bar.
    set_as_default : bool
        Like a dask ``Client``, a new engine is used by every later
        ``compute()`` / ``to_zarr()`` until it is closed (a ``with`` block
        nests its engine on top).
    dashboard : bool
        Log the dask dashboard's address once.

    Raises
    ------
    ClusterError
        Before anything starts: an invalid argument (``n_workers`` or
        ``threads_per_worker`` below 1, a ``memory_per_worker`` that is not
        a positive byte size or is below what a worker process needs — the
        message names the minimum —, a bad ``adaptive``, sizing arguments
        with ``client=``) -- also a ``ValueError``, or a ``TypeError`` for
        a value of the wrong type (:class:`~tilearray.errors.ArgumentError`)
        --, or ``processes=True`` where worker processes cannot start (see
        ``processes``). Later: the LocalCluster could not start.
    tilearray._config.ConfigError
        A ``tilearray.*`` config value outside its schema (checked first).

    Examples
    --------
    >>> with ta.Engine(n_workers=4, memory_per_worker="4GiB") as engine:   # doctest: +SKIP
    ...     (a @ b).to_zarr("c.zarr")
    >>> engine = ta.Engine(client=Client("tcp://scheduler:8786"))          # doctest: +SKIP
    >>> engine.budget()                                                     # doctest: +SKIP
    >>> engine.metrics_url                                                  # doctest: +SKIP
    """

    def __init__(
        self,
        n_workers: int | None = None,
        threads_per_worker: int | None = None,
        memory_per_worker: int | str | None = None,
        client=None,
        *,
        processes: bool | None = None,
        adaptive: tuple[int, int] | None = None,
        quiet: bool = False,
        dashboard: bool = False,
        set_as_default: bool = True,
    ):
        # every argument, and the tilearray.* config, is checked before anything starts
        _config.check_all()
        threads, memory_per_worker, span = check_arguments(
            n_workers, threads_per_worker, memory_per_worker, client, processes, adaptive)
        self.quiet = quiet
        self._owns = client is None
        self.cluster = None
        self.last_run: RunStats | None = None
        self._memory_override = memory_per_worker
        self._spec = None  # (memory, threads, max workers) of a cluster we start
        self._adaptive = adaptive is not None
        if client is None:
            self.cluster, client, self._spec, self.blas_threads, self._environ = start_local(
                n_workers, threads, memory_per_worker, processes, adaptive, span)
        else:
            self.blas_threads = None
        self.client = client
        self._address = getattr(client.scheduler, "address", None)  # gone once closed
        self._closed = False
        try:
            from . import metrics
            from .plugins import CloseSessions, PeakMemory, TaskProgress

            client.register_plugin(PeakMemory(), name=PeakMemory.name)
            client.register_plugin(TaskProgress(), name=TaskProgress.name)
            metrics.register(client)
            client.register_plugin(CloseSessions(), name=CloseSessions.name)
        except Exception:  # a cluster that refuses plugins runs without them
            log.warning("could not register tilearray's worker/scheduler plugins "
                        "(no peak-memory figures, progress inside tasks or metrics)", exc_info=True)
        if set_as_default:
            context.active = self
        if dashboard and getattr(client, "dashboard_link", None):
            log.info("dask dashboard: %s", client.dashboard_link)

    @property
    def in_process(self) -> bool:
        """Whether the workers are threads of this process (a LocalCluster
        started with ``processes=False``); False for any cluster given as
        ``client=``, whose workers may be anywhere."""
        return self.cluster is not None and not getattr(self.cluster, "processes", True)

    # -- budget -----------------------------------------------------------------
    def budget(self) -> Budget:
        """The planning budget, read from the cluster's workers.

        Every task must fit any worker, so the worker with the least memory
        per thread sets it (``Budget.worker`` names it). Workers without a
        memory limit count as ``tilearray.memory.default-per-worker``.
        """
        workers = self.client.scheduler_info(n_workers=-1).get("workers", {})
        if self._spec is not None:  # our LocalCluster, possibly scaled down to none
            mem, threads, n = self._spec
            if len(workers) <= n:
                return Budget.from_config(mem, n, threads)
        if not workers and self.client.status != "running":  # reconnecting failed
            raise self._lost_scheduler()
        if not workers:
            raise ClusterError(
                f"the cluster at {self.client.scheduler.address} has no workers; start some "
                "(or wait for them) before planning")
        override = self._memory_override  # bytes, checked by __init__
        default = _config.get_bytes("memory.default-per-worker")
        candidates = []
        for addr, w in workers.items():
            mem = override or w.get("memory_limit") or default
            b = Budget.from_config(mem, len(workers), w.get("nthreads") or 1, worker=addr)
            candidates.append((b.task_memory, addr, b))
        return min(candidates, key=lambda c: (c[0], c[1]))[2]

    # -- context ----------------------------------------------------------------
    def __enter__(self) -> Engine:
        context.stack.append(self)
        return self

    def __exit__(self, *exc) -> None:
        if context.stack and context.stack[-1] is self:
            context.stack.pop()
        self.close()

    def close(self) -> None:
        """Shut down the cluster if this engine started it."""
        self._closed = True
        if context.active is self:
            context.active = None
        if self._owns:
            # in-process workers log their comms closing ("Batched Comm Closed",
            # at INFO, once LocalCluster has restored the log level): not news
            quiet = logging.getLogger("distributed.batched")
            level = quiet.level
            quiet.setLevel(logging.ERROR)
            try:
                with contextlib.suppress(Exception):
                    self.client.close()
                with contextlib.suppress(Exception):
                    if self.cluster is not None:
                        self.cluster.close()
            finally:
                quiet.setLevel(level)
            if getattr(self, "_environ", None) is not None:
                restore_environ(self._environ)
        self._owns = False

    def __repr__(self) -> str:
        b = self.budget()
        return (
            f"<tilearray.Engine {b.n_workers} workers x {b.threads_per_worker} threads, "
            f"{format_bytes(b.memory_per_worker)} per worker>"
        )

    # -- running ----------------------------------------------------------------
    def run(self, graph: dict, keys: list, *, description: str = "tilearray", quiet=None,
            plan=None, units_total: int = 0, units_skipped: int = 0, stat_keys=()):
        """Run ``graph`` and gather ``keys`` (each a ``(value, stats)`` task).

        ``stat_keys`` are gathered too, for their stats only (small results
        whose figures no key in ``keys`` carries).

        Shows progress, samples worker memory, and returns ``(values, RunStats)``.
        On failure every pending task is cancelled and the first error raised.
        ``plan`` and the unit counts are reported to the scheduler's metrics.
        """
        from concurrent.futures import CancelledError as FutureCancelled

        from distributed.client import ClosedClientError

        quiet = self.quiet if quiet is None else quiet
        watch: dict = {}  # since when the embedded cluster has had no worker
        try:
            values, stats = gather(
                self.client, graph, keys, description=description, quiet=quiet, plan=plan,
                units_total=units_total, units_skipped=units_skipped, stat_keys=stat_keys,
                alive=None if not self._owns or self._adaptive else
                lambda: check_alive(self.cluster, description, watch, self._spec[0]))
        except (ClosedClientError, FutureCancelled) as e:
            if isinstance(e, ClosedClientError) or self.client.status != "running":
                # the scheduler is gone: futures cancelled, the client closed
                raise self._lost_scheduler() from e
            raise
        self.last_run = stats
        return values, stats

    def _lost_scheduler(self) -> ClusterError:
        return ClusterError(
            f"lost the connection to the scheduler at {self._address} (client "
            f"{self.client.status}): the scheduler process exited or died (under MPI: the "
            "scheduler rank, 0); rerun the job (resume=True keeps finished output blocks)")

    @property
    def metrics_url(self) -> str | None:
        """The scheduler's Prometheus endpoint (dask's and tilearray's metrics)."""
        from urllib.parse import urlparse

        port = self.client.scheduler_info(n_workers=0).get("services", {}).get("dashboard")
        if port is None:
            return None
        host = urlparse(self.client.scheduler.address).hostname or "127.0.0.1"
        return f"http://{host}:{port}/metrics"

    def metrics(self) -> dict:
        """tilearray's figures as the scheduler holds them (what ``/metrics`` exports)."""
        from .metrics import Metrics

        def snap(dask_scheduler):
            p = dask_scheduler.plugins.get(Metrics.name)
            return p.snapshot() if p is not None else {}

        return self.client.run_on_scheduler(snap)

    def blas_report(self) -> dict:
        """BLAS libraries and thread counts on each worker (threadpoolctl)."""
        return self.client.run(_blas_info)

    @classmethod
    def mpi(cls, **kwargs) -> Engine:
        """Boot a cluster across MPI ranks with dask-mpi, for scripts run under
        ``mpirun``/``tilearray mpirun``: rank 0 runs the scheduler, rank 1 this
        script (and gets the engine), ranks 2+ the workers.

        Parameters
        ----------
        memory_per_worker : int or str, optional
            Each worker's ``memory_limit`` (the planning budget).
        threads_per_worker : int
            Threads of each worker (default 1).
        nanny : bool
            Run workers under a nanny (restarts a worker process that dies).
        local_directory, interface : str, optional
            Passed to dask-mpi (worker scratch space, network interface).
        timeout : float, optional
            Seconds to wait for every worker rank to join.

        Returns
        -------
        Engine
            On the client rank; scheduler and worker ranks exit when the
            client is done. See :mod:`tilearray.engine.mpi`.

        Raises
        ------
        ClusterError
            Fewer than 3 ranks, workers that never join, or a call from a
            process that is not an MPI rank.
        """
        from .mpi import start

        return start(cls, **kwargs)


def current_engine(start: bool = True) -> Engine | None:
    """The innermost ``with Engine()``, else the default engine (started lazily)."""
    if context.stack:
        return context.stack[-1]
    if context.active is not None:
        return context.active
    if not start:
        return context.default
    with context.lock:
        if context.default is None:
            context.default = Engine(set_as_default=False)
            atexit.register(_close_default)
            log.info("started default %r", context.default)
    return context.default


def _close_default() -> None:
    if context.default is not None:
        context.default.close()
        context.default = None
