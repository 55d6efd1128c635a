"""The embedded LocalCluster of ``Engine()``: its arguments checked before
anything starts, and its start (sized to the machine, BLAS threads per
worker, dask's memory settings for planned tasks)."""

from __future__ import annotations

import copy
import logging
import os
import sys
import time

import dask
import psutil
from dask.utils import format_bytes

from ... import _config
from ...errors import ClusterArgumentError, ClusterArgumentTypeError, ClusterError
from ..plan.types import Budget, check_worker_memory
from .spawn import GUARD, choose_processes


def check_arguments(n_workers, threads_per_worker, memory_per_worker, client, processes,
                    adaptive):
    """Refuse a bad argument before anything starts; returns ``(threads,
    memory_per_worker in bytes or None, (minimum, maximum) or None)``."""
    lo = hi = None
    if client is not None:
        for arg, v in (("n_workers", n_workers), ("threads_per_worker", threads_per_worker),
                       ("adaptive", adaptive)):
            if v is not None:
                raise ClusterArgumentError(
                    f"{arg}={v!r} sizes the embedded LocalCluster; it cannot be used with "
                    "client= (scale an existing cluster with its own tools, e.g. "
                    "cluster.adapt())")
    if processes not in (None, True, False):
        raise ClusterArgumentTypeError(f"processes={processes!r} must be True, False or None (default: "
                           "worker processes where this script allows them)")
    threads = 1 if threads_per_worker is None else \
        _config.positive_int_arg(threads_per_worker, "threads_per_worker", ClusterArgumentError)
    if n_workers is not None:
        _config.positive_int_arg(n_workers, "n_workers", ClusterArgumentError)
    if memory_per_worker is not None:
        memory_per_worker = check_worker_memory(memory_per_worker, threads,
                                                error=ClusterArgumentError)
    if adaptive is not None:
        try:
            lo, hi = (int(v) for v in adaptive)
        except (TypeError, ValueError):
            lo, hi = -1, -1
        if not 0 <= lo <= hi or hi < 1:
            raise ClusterArgumentError(f"adaptive=(minimum, maximum) needs 0 <= minimum <= maximum "
                               f"and maximum >= 1, got adaptive={adaptive!r}")
    return threads, memory_per_worker, (None if adaptive is None else (lo, hi))


def start_local(n_workers, threads, memory_per_worker, processes, adaptive, span):
    """Start the LocalCluster and a Client on it; returns ``(cluster, client,
    (memory, threads, max workers), BLAS threads per worker, saved environment)``."""
    lo, hi = span if span is not None else (None, None)
    from distributed import Client, LocalCluster, Nanny, Worker

    cores = os.cpu_count() or 1
    n = int(n_workers or max(cores // threads, 1))
    if adaptive is not None:
        n = hi if n_workers is None else int(n_workers)
    processes = choose_processes(processes, n)
    mem = memory_per_worker if memory_per_worker is not None else default_memory(n)
    blas = max(cores // (n * threads), 1)
    # distributed's nanny writes its pre-spawn settings (OMP/MKL/OPENBLAS
    # threads = 1, ...) into this process's environment; keep ours
    environ = dict(os.environ)
    settings = _worker_settings(processes)
    try:
        with dask.config.set(settings):
            cluster = LocalCluster(
                n_workers=n if adaptive is None else lo,
                threads_per_worker=threads,
                memory_limit=mem,
                processes=processes,
                worker_class=_with_settings(Nanny if processes else Worker, settings),
                dashboard_address=":0",
                silence_logs=logging.ERROR,
            )
            client = Client(cluster, set_as_default=False)
    except Exception as e:
        hint = ""
        if processes and "Nanny failed" in str(e):
            hint = (f" (worker processes re-run the main script: if it starts the engine "
                    f"outside {GUARD!r}, add the guard, or pass processes=False)")
        raise ClusterError(f"could not start a LocalCluster ({n} x {threads}): "
                           f"{e}{hint}") from e
    if processes:
        _keep_nannies(cluster)
    if adaptive is not None:
        cluster.adapt(minimum=lo, maximum=hi)
    from .plugins import BlasLimit, IgnoreInterrupt, QuietKnownErrors

    try:
        client.register_plugin(BlasLimit(blas), name=BlasLimit.name)
        client.register_plugin(QuietKnownErrors(), name=QuietKnownErrors.name)
        if processes:
            client.register_plugin(IgnoreInterrupt(), name=IgnoreInterrupt.name)
    except OSError as e:  # distributed's CommClosedError is one
        client.close()
        cluster.close()
        restore_environ(environ)
        raise ClusterError(f"the LocalCluster's workers died while starting ({e}); "
                           + dying_hint(format_bytes(mem))) from e
    restore_environ(environ)
    return cluster, client, (mem, threads, n), blas, environ


def _worker_settings(processes: bool) -> dict:
    """dask's settings for the embedded cluster's workers."""
    return {
        "distributed.scheduler.allowed-failures": _config.get("scheduler.allowed-failures"),
        "distributed.worker.memory.spill": False,
        "distributed.worker.memory.target": False,
        # tasks are sized to fit before they run; pausing a worker whose
        # freed memory is slow to leave RSS could stall a run, while the
        # nanny's kill at 95% stays the safety net
        "distributed.worker.memory.pause": False,
        # in-process workers have no nanny: measuring this whole process
        # against the limit would make them close themselves
        **({} if processes else {"distributed.worker.memory.terminate": False}),
        **no_profiler(),
    }


def no_profiler() -> dict:
    """dask's setting that stops a worker's statistical profiler on Python
    3.11, where its ``sys._current_frames()`` every 10 ms can deadlock the
    whole process: a garbage collection inside it runs Python code (a
    finalizer, a ``gc.callbacks`` hook) and waits for the GIL while holding
    the interpreter's thread-list lock, which an exiting thread holding the
    GIL waits for (CPython gh-106883, fixed in 3.12 and never in 3.11;
    distributed already keeps its event-loop profiler off on 3.11, dask
    distributed #8616). A test run here hung that way, every thread waiting.
    The dashboard's Profile page stays empty."""
    return {"distributed.worker.profile.enabled": False} if sys.version_info[:2] == (3, 11) \
        else {}


def _with_settings(cls, settings: dict):
    """A worker factory that builds ``cls`` under ``settings``.

    Workers and nannies read dask's memory settings when they are built; a
    worker that adaptive scaling adds mid-job is built long after
    ``start_local`` returned, and would otherwise get dask's defaults (an
    in-process worker then paused at 80 % of this whole process's RSS and
    the job never finished). A nanny's worker process gets the config the
    nanny keeps, a shallow copy of dask's that leaving ``dask.config.set``
    would revert: it gets a deep copy."""
    from distributed import Nanny

    def make(*args, **kwargs):
        with dask.config.set(settings):
            if issubclass(cls, Nanny):
                kwargs["config"] = copy.deepcopy(dask.config.config)
            return cls(*args, **kwargs)
    return make


NO_WORKERS_SECONDS = 60.0
"""A run whose embedded cluster has had no worker for this long stops:
nannies restarting workers that die as they start (a memory limit the main
script's module-level code already exceeds) would otherwise leave it
waiting at 0 % for ever."""


def dying_hint(memory: str) -> str:
    """Why workers of the embedded cluster die as they start, and what to do."""
    return (f"a worker process that dies as it starts most often exceeds its memory "
            f"limit ({memory}) before running any task: every worker process re-runs "
            f"the main script's module-level code -- arrays it makes there count "
            f"against each worker's memory: make them under {GUARD!r}, or pass a "
            "larger memory_per_worker (or processes=False)")


def check_alive(cluster, description: str, state: dict | None = None,
                memory: int | None = None) -> None:
    """Raise a ClusterError if every worker of an embedded, fixed-size
    LocalCluster has stopped for good: tasks would queue forever.

    A nanny restarts a worker process that dies, but a nanny that closed
    (its worker asked it to, or the restart failed) is never replaced by
    LocalCluster. With ``state`` (one dict a run), also raise when the
    scheduler has had no worker for :data:`NO_WORKERS_SECONDS`: workers
    dying as they start, restarted for ever (``memory``: their limit, named).
    (Borrowed and adaptive clusters are not checked.)"""
    if cluster is None:
        return
    from distributed.core import Status

    workers = list(getattr(cluster, "workers", {}).values())
    gone = (Status.closing, Status.closed, Status.closing_gracefully, Status.failed)
    if all(getattr(w, "status", None) in gone for w in workers):  # or none left
        raise ClusterError(
            f"{description}: all {len(workers)} worker(s) of the embedded LocalCluster "
            f"have stopped and will not be restarted (nanny status: "
            f"{sorted({w.status.name for w in workers})}); the run cannot finish. Close "
            "this engine, start a new one and rerun with resume=True")
    if state is None:
        return
    scheduler = getattr(cluster, "scheduler", None)  # in this process for a LocalCluster
    if scheduler is None or getattr(scheduler, "workers", None) is None:
        return
    now = time.monotonic()
    if scheduler.workers:
        state.pop("empty_since", None)
        return
    since = state.setdefault("empty_since", now)
    if now - since >= NO_WORKERS_SECONDS:
        raise ClusterError(
            f"{description}: no worker of the embedded LocalCluster has been alive for "
            f"{NO_WORKERS_SECONDS:.0f} s (their nannies keep restarting them); "
            + dying_hint(format_bytes(memory) if memory else "memory_per_worker"))


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


def default_memory(n_workers: int) -> int:
    """Memory per worker of a cluster started without one (a LocalCluster, or
    the worker ranks of an MPI job on one node): the configured default, at
    most 0.8 of this machine's memory shared by ``n_workers``."""
    mem = _config.get_bytes("memory.default-per-worker")
    return min(mem, int(psutil.virtual_memory().total * 0.8 / n_workers))


def default_budget() -> Budget:
    """The budget of the engine :func:`current_engine` would start here (one
    single-threaded worker per core), computed without starting it."""
    n = max(os.cpu_count() or 1, 1)
    return Budget.from_config(default_memory(n), n, 1)


def restore_environ(saved: dict) -> None:
    for k in set(os.environ) - set(saved):
        del os.environ[k]
    os.environ.update(saved)
