"""The Engine: owns (or borrows) a dask.distributed Client and runs graphs.

``Engine()`` starts an embedded LocalCluster sized to the machine;
``Engine(client=...)`` uses any running cluster; ``Engine.mpi()`` boots one
across MPI ranks with dask-mpi. Only this package touches the cluster.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import logging
import os
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field

import dask
import psutil
from dask.utils import format_bytes

from .. import _config
from ..errors import ClusterError
from .plan import Budget, _positive_int, check_worker_memory

log = logging.getLogger("tilearray")

_current: list[Engine] = []
_default: Engine | None = None
_active: Engine | None = None  # the most recently created engine, until closed
_lock = threading.Lock()


def _blas_info():
    from threadpoolctl import threadpool_info

    return [(i.get("internal_api"), i.get("num_threads")) for i in threadpool_info()]


@dataclass
class RunStats:
    """Measured figures of one run (``x.stats`` after ``to_zarr``/``compute``).

    Summed over the run's tasks, as the tasks measured them; compare with the
    projections of :class:`Plan` (``x.plan()``).
    """

    bytes_read: int = 0
    """Decoded bytes read from Zarr stores, in bytes."""
    bytes_written: int = 0
    """Bytes written to the output (and temporaries), in bytes (uncompressed)."""
    read_requests: int = 0
    """Whole-I/O-unit read requests (one Zarr read each)."""
    store_gets: int = 0
    """Store requests those reads made (chunk or shard keys)."""
    read_retries: int = 0
    """Store reads retried after a transient error."""
    tasks: int = 0
    """Tasks that did work (reads, BLAS or writes)."""
    task_retries: int = 0
    """Tasks rerun because the worker running them died."""
    wall_seconds: float = 0.0
    """Wall-clock time of the run, in seconds, as seen by the client."""
    peak_worker_memory: int = 0
    """Largest RSS of any worker process seen during the run, in bytes."""
    io_wait_seconds: float = 0.0
    """Time matmul tasks waited for panel reads, summed over tasks, in seconds."""
    blas_seconds: float = 0.0
    """Time spent in BLAS gemm, summed over tasks, in seconds."""
    skipped_units: int = 0
    """Output units already done (resume) and not recomputed."""
    units_written: int = 0
    """Output (and temporary) I/O units written and marked done by this run."""
    per_worker_peak: dict = field(default_factory=dict)
    """Peak RSS of each worker process (address -> bytes)."""

    def __str__(self) -> str:
        return (
            f"{self.tasks} tasks in {self.wall_seconds:.1f} s, read "
            f"{format_bytes(self.bytes_read)} ({self.read_requests} requests), wrote "
            f"{format_bytes(self.bytes_written)}, peak worker memory "
            f"{format_bytes(self.peak_worker_memory)}, retries: {self.task_retries} task(s), "
            f"{self.read_retries} read(s)"
        )


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
        with ``client=``), or ``processes=True`` where worker processes
        cannot start (see ``processes``). Later: the LocalCluster could not
        start.
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
        if client is not None:
            for arg, v in (("n_workers", n_workers), ("threads_per_worker", threads_per_worker),
                           ("adaptive", adaptive)):
                if v is not None:
                    raise ClusterError(
                        f"{arg}={v!r} sizes the embedded LocalCluster; it cannot be used with "
                        "client= (scale an existing cluster with its own tools, e.g. "
                        "cluster.adapt())")
        if processes not in (None, True, False):
            raise ClusterError(f"processes={processes!r} must be True, False or None (default: "
                               "worker processes where this script allows them)")
        threads = 1 if threads_per_worker is None else \
            _positive_int(threads_per_worker, "threads_per_worker", ClusterError)
        if n_workers is not None:
            _positive_int(n_workers, "n_workers", ClusterError)
        if memory_per_worker is not None:
            memory_per_worker = check_worker_memory(memory_per_worker, threads,
                                                    error=ClusterError)
        if adaptive is not None:
            try:
                lo, hi = (int(v) for v in adaptive)
            except (TypeError, ValueError):
                lo, hi = -1, -1
            if not 0 <= lo <= hi or hi < 1:
                raise ClusterError(f"adaptive=(minimum, maximum) needs 0 <= minimum <= maximum "
                                   f"and maximum >= 1, got adaptive={adaptive!r}")
        self.quiet = quiet
        self._owns = client is None
        self.cluster = None
        self.last_run: RunStats | None = None
        self._memory_override = memory_per_worker
        self._spec = None  # (memory, threads, max workers) of a cluster we start
        self._adaptive = adaptive is not None
        if client is None:
            from distributed import Client, LocalCluster

            cores = os.cpu_count() or 1
            n = int(n_workers or max(cores // threads, 1))
            if adaptive is not None:
                n = hi if n_workers is None else int(n_workers)
            processes = _choose_processes(processes, n)
            mem = memory_per_worker if memory_per_worker is not None else _default_memory(n)
            blas = max(cores // (n * threads), 1)
            # distributed's nanny writes its pre-spawn settings (OMP/MKL/OPENBLAS
            # threads = 1, ...) into this process's environment; keep ours
            self._environ = dict(os.environ)
            try:
                with dask.config.set({
                    "distributed.scheduler.allowed-failures": _config.get("scheduler.allowed-failures"),
                    "distributed.worker.memory.spill": False,
                    "distributed.worker.memory.target": False,
                    # tasks are sized to fit before they run; pausing a worker
                    # whose freed memory is slow to leave RSS could stall a
                    # run, while the nanny's kill at 95% stays the safety net
                    "distributed.worker.memory.pause": False,
                    # in-process workers have no nanny: measuring this whole
                    # process against the limit would make them close themselves
                    **({} if processes else {"distributed.worker.memory.terminate": False}),
                }):
                    self.cluster = LocalCluster(
                        n_workers=n if adaptive is None else lo,
                        threads_per_worker=threads,
                        memory_limit=mem,
                        processes=processes,
                        dashboard_address=":0",
                        silence_logs=logging.ERROR,
                    )
                    client = Client(self.cluster, set_as_default=False)
            except Exception as e:
                hint = ""
                if processes and "Nanny failed" in str(e):
                    hint = (f" (worker processes re-run the main script: if it starts the engine "
                            f"outside {_GUARD!r}, add the guard, or pass processes=False)")
                raise ClusterError(f"could not start a LocalCluster ({n} x {threads}): "
                                   f"{e}{hint}") from e
            self._spec = (mem, threads, n)
            if processes:
                _keep_nannies(self.cluster)
            if adaptive is not None:
                self.cluster.adapt(minimum=lo, maximum=hi)
            from ._plugins import BlasLimit, IgnoreInterrupt

            client.register_plugin(BlasLimit(blas), name=BlasLimit.name)
            if processes:
                client.register_plugin(IgnoreInterrupt(), name=IgnoreInterrupt.name)
            self.blas_threads = blas
            _restore_environ(self._environ)
        else:
            self.blas_threads = None
        self.client = client
        self._closed = False
        try:
            from . import metrics
            from ._plugins import PeakMemory

            client.register_plugin(PeakMemory(), name=PeakMemory.name)
            metrics.register(client)
        except Exception:  # a cluster that refuses plugins runs without them
            log.warning("could not register tilearray's worker/scheduler plugins "
                        "(no peak-memory figures or metrics)", exc_info=True)
        if set_as_default:
            global _active
            _active = self
        if dashboard and getattr(client, "dashboard_link", None):
            log.info("dask dashboard: %s", client.dashboard_link)

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
        _current.append(self)
        return self

    def __exit__(self, *exc) -> None:
        if _current and _current[-1] is self:
            _current.pop()
        self.close()

    def close(self) -> None:
        """Shut down the cluster if this engine started it."""
        global _active
        self._closed = True
        if _active is self:
            _active = None
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
                _restore_environ(self._environ)
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
        from distributed import wait

        from .metrics import job_event

        quiet = self.quiet if quiet is None else quiet
        t0 = time.perf_counter()
        _worker_peaks(self.client)  # reset the in-worker peaks (PeakMemory plugin)
        job_event(self.client, "start", name=description, tasks=len(graph),
                  units_total=int(units_total), units_skipped=int(units_skipped),
                  **(_plan_figures(plan) if plan is not None else {}))
        ok, futures, bar = False, [], None
        n_keys = len(keys)
        keys = list(keys) + [k for k in stat_keys if k not in set(keys)]
        try:
            futures = self.client.get(graph, keys, sync=False)
            keep: set = set()  # keys listed twice must not be released early
            seen: set = set()
            for f in futures:
                (keep if f.key in seen else seen).add(f.key)
            if not quiet:
                from tqdm.auto import tqdm

                bar = tqdm(total=len(seen), desc=description, unit="block",
                           file=sys.stderr, leave=True, dynamic_ncols=True)
            index: dict = {}
            for i, f in enumerate(futures):
                index.setdefault(f.key, []).append(i)
            values = [None] * len(futures)
            # gather each result as it completes and release it, so results
            # (blocks of a compute()) never pile up in worker memory. Futures
            # are polled with wait(), not as_completed(): a result lost with a
            # worker right after it finished is computed again, and wait()
            # sees it pending again where as_completed() would wait forever.
            pending = {f.key: f for f in futures}
            while pending:
                with contextlib.suppress(TimeoutError), self.client.as_current():
                    wait(list(itertools.islice(pending.values(), 1000)), timeout=2,
                         return_when="FIRST_COMPLETED")
                self._check_workers_alive(description)
                for fut in [f for f in pending.values() if f.done()]:
                    value = fut.result()  # raises the task's exception
                    for i in index[fut.key]:
                        values[i] = value
                    del pending[fut.key]
                    if bar is not None:
                        bar.update(1)
                    if fut.key not in keep and value[0] is not None:
                        # a data-carrying result (a compute() block): free it on the
                        # worker now; stats-only results stay until retries are counted
                        fut.release()
            ok = True
        except BaseException:
            if futures:
                self.client.cancel(futures)
            raise
        finally:
            job_event(self.client, "end", ok=ok)
            if bar is not None:
                bar.close()
            peaks = {addr: rss for addr, rss in _worker_peaks(self.client).items()
                     if isinstance(rss, int)}
        stats = RunStats(wall_seconds=time.perf_counter() - t0)
        for _, st in values:
            for k in ("bytes_read", "bytes_written", "read_requests", "store_gets",
                      "read_retries", "tasks", "units_written"):
                setattr(stats, k, getattr(stats, k) + int(st.get(k, 0)))
            stats.io_wait_seconds += st.get("io_wait_seconds", 0.0)
            stats.blas_seconds += st.get("blas_seconds", 0.0)
        stats.per_worker_peak = peaks
        stats.peak_worker_memory = max(peaks.values(), default=0)
        stats.task_retries = self._suspicious()
        for f in futures:  # release, not cancel: a later run may reuse these keys
            f.release()
        self.last_run = stats
        return [v for v, _ in values[:n_keys]], stats

    def _check_workers_alive(self, description: str) -> None:
        """Raise a ClusterError if every worker of the embedded (fixed-size)
        LocalCluster has stopped for good: tasks would queue forever.

        A nanny restarts a worker process that dies, but a nanny that closed
        (its worker asked it to, or the restart failed) is never replaced by
        LocalCluster. Borrowed and adaptive clusters are not checked."""
        if not self._owns or self._adaptive or self.cluster is None:
            return
        from distributed.core import Status

        workers = list(getattr(self.cluster, "workers", {}).values())
        gone = (Status.closing, Status.closed, Status.closing_gracefully, Status.failed)
        if all(getattr(w, "status", None) in gone for w in workers):  # or none left
            raise ClusterError(
                f"{description}: all {len(workers)} worker(s) of the embedded LocalCluster "
                f"have stopped and will not be restarted (nanny status: "
                f"{sorted({w.status.name for w in workers})}); the run cannot finish. Close "
                "this engine, start a new one and rerun with resume=True")

    def _suspicious(self) -> int:
        def count(dask_scheduler):
            return sum(ts.suspicious for ts in dask_scheduler.tasks.values())

        try:
            return int(self.client.run_on_scheduler(count))
        except Exception:
            return 0

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


_GUARD = 'if __name__ == "__main__":'


def _spawn_problem() -> str | None:
    """Why worker processes cannot be spawned from this process, or None.

    A spawned worker process re-runs the main script (multiprocessing's
    ``spawn``/``forkserver``, distributed's default): a script read from
    standard input cannot be re-read, and a script whose top-level code starts
    the engine would start it again in every worker (which multiprocessing
    refuses: "Nanny failed to start"). ``python -c``, the REPL, notebooks and
    ``python -m package`` have nothing to re-run.
    """
    import multiprocessing

    if dask.config.get("distributed.worker.multiprocessing-method", "spawn") == "fork":
        return None
    main = sys.modules.get("__main__")
    if _bootstrapping():
        return (f"this is a worker process re-running the main script; the script starts an "
                f"engine outside the {_GUARD!r} guard")
    spec = getattr(main, "__spec__", None)
    name = getattr(spec, "name", None)
    if name is not None:  # python -m module: re-imported by name, except a package's __main__
        if name == "__main__" or name.endswith(".__main__"):
            return None
        path = getattr(spec, "origin", None) or getattr(main, "__file__", None)
    else:
        path = getattr(main, "__file__", None)
        if path is None:
            return None
        if os.path.splitext(os.path.basename(path))[0] == "ipython":
            return None  # multiprocessing skips it too
        full = os.path.join(multiprocessing.process.ORIGINAL_DIR or "", path)
        if not os.path.isfile(full):
            return (f"the main script {path!r} is not a file (code read from standard input, "
                    "`python -`), so worker processes cannot re-run it")
    line = _unguarded_line(main, path)
    if line is None:
        return None
    return (f"{path} starts the engine from line {line}, outside an {_GUARD!r} block, and every "
            "worker process re-runs the main script")


def _bootstrapping() -> bool:
    """True while a spawned child re-runs the main script (before its target runs)."""
    import multiprocessing

    return bool(getattr(multiprocessing.current_process(), "_inheriting", False))


def _unguarded_line(main, path: str | None) -> int | None:
    """The line of the main script's top-level code that is (indirectly) starting
    the engine now, if it is not inside an ``if __name__ == "__main__":`` block."""
    import ast

    if path is None or main is None:
        return None
    try:
        target = os.path.realpath(path)
    except (TypeError, ValueError):
        return None
    frame, line = sys._getframe(1), None
    while frame is not None:
        code = frame.f_code
        if (frame.f_globals is main.__dict__ and code.co_name == "<module>"
                and os.path.realpath(code.co_filename) == target):
            line = frame.f_lineno
        frame = frame.f_back
    if line is None:
        return None
    try:
        with open(target, "rb") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_main_test(node.test) and node.body and \
                node.body[0].lineno <= line <= (node.body[-1].end_lineno or line):
            return None
    return line


def _is_main_test(test) -> bool:
    import ast

    if not (isinstance(test, ast.Compare) and len(test.ops) == 1
            and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    names = [s for s in sides if isinstance(s, ast.Name) and s.id == "__name__"]
    consts = [s for s in sides if isinstance(s, ast.Constant) and s.value == "__main__"]
    return len(names) == 1 and len(consts) == 1


def _choose_processes(processes: bool | None, n: int) -> bool:
    """Worker processes unless the main script cannot be re-run by them: then
    in-process (thread) workers with a warning, or a ClusterError when
    ``processes=True`` was asked for. Decided before anything starts."""
    if processes is False:
        return False
    why = _spawn_problem()
    if why is None:
        return True
    guard = f"put the script's code in a file, under {_GUARD!r}"
    if processes or _bootstrapping():
        raise ClusterError(f"cannot start worker processes: {why}; {guard}, or pass "
                           "processes=False for workers that are threads of this process")
    warnings.warn(
        f"tilearray: running {n} worker(s) as threads of this process, not as processes: "
        f"{why}. For worker processes {guard}; pass processes=False to silence this warning",
        RuntimeWarning, stacklevel=3)
    return False


def _plan_figures(plan) -> dict:
    b = plan.budget
    return {
        "projected_task_memory": max((s.peak_task_memory for s in plan.stages), default=0),
        "task_memory_budget": b.task_memory,
        "memory_per_worker": b.memory_per_worker,
    }


def _keep_nannies(cluster) -> None:
    """Stop SpecCluster closing a nanny whose worker is restarting.

    On every worker removal SpecCluster arms a timer
    (``distributed.deploy.lost-worker-timeout``, 15 s) that closes the
    removed worker's nanny and drops it from ``cluster.workers`` if, when
    it fires, no worker of that *name* is registered. The timer of an old,
    long-recovered removal therefore closes the nanny when the same-named
    worker happens to be mid-restart 15 s later (killed again), and
    LocalCluster never replaces it: with every nanny gone, tasks queue
    forever. A nanny restarts its own worker, so for an embedded cluster of
    nannies only the base class's bookkeeping is kept.
    """
    from distributed.deploy.cluster import Cluster

    cluster._update_worker_status = lambda op, msg: Cluster._update_worker_status(
        cluster, op, msg)


def _restore_environ(saved: dict) -> None:
    for k in set(os.environ) - set(saved):
        del os.environ[k]
    os.environ.update(saved)


def _worker_peaks(client) -> dict:
    from ._plugins import take_peak

    try:
        return client.run(take_peak, on_error="ignore")
    except Exception:
        return {}


def _default_memory(n_workers: int) -> int:
    """Memory per worker of a LocalCluster started without one: the configured
    default, at most 0.8 of this machine's memory shared by the workers."""
    mem = _config.get_bytes("memory.default-per-worker")
    return min(mem, int(psutil.virtual_memory().total * 0.8 / n_workers))


def default_budget() -> Budget:
    """The budget of the engine :func:`current_engine` would start here (one
    single-threaded worker per core), computed without starting it."""
    n = max(os.cpu_count() or 1, 1)
    return Budget.from_config(_default_memory(n), n, 1)


def current_engine(start: bool = True) -> Engine | None:
    """The innermost ``with Engine()``, else the default engine (started lazily)."""
    global _default
    if _current:
        return _current[-1]
    if _active is not None:
        return _active
    if not start:
        return _default
    with _lock:
        if _default is None:
            _default = Engine(set_as_default=False)
            atexit.register(_close_default)
            log.info("started default %r", _default)
    return _default


def _close_default() -> None:
    global _default
    if _default is not None:
        _default.close()
        _default = None
