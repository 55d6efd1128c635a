"""Submitting one graph and gathering its results: progress bar, results
released as they arrive, a lost result computed again, the measured figures
summed into :class:`~.stats.RunStats`, job events for the scheduler's metrics."""

from __future__ import annotations

import ast
import collections
import contextlib
import itertools
import math
import re
import time
import warnings

import dask
from dask.utils import format_bytes

from ..._config import SharedSetting
from .stats import RunStats

LARGE_GRAPH_WARNING = "512MiB"
"""dask's threshold for its "Sending large graph" warning, raised while
tilearray submits (its own default, 10 MB, is met by a NumPy operand alone)."""


_GRAPH_WARNING_KEY = "distributed.admin.large-graph-warning-threshold"


def _raise_graph_warning():
    saved = dask.config.get(_GRAPH_WARNING_KEY, None)
    dask.config.set({_GRAPH_WARNING_KEY: LARGE_GRAPH_WARNING})
    return saved


_large_graphs = SharedSetting(_raise_graph_warning,
                              lambda saved: dask.config.set({_GRAPH_WARNING_KEY: saved}))
"""``with _large_graphs():`` -- dask's large-graph threshold at
:data:`LARGE_GRAPH_WARNING` while any run submits, restored when the last one
is done (runs of several threads interleave: a ``dask.config.set`` block each
could leave it raised)."""


def _submitted(graph: dict, plan, queued=frozenset()):
    """``graph`` as submitted: the tasks ``queued`` (the plan's) marked as
    such (:func:`_as_queued`), the plan's task priorities as dask's
    ``priority`` annotation (one HighLevelGraph layer; higher runs first
    among ready tasks, unannotated tasks 0) when it has any, else as it is."""
    if plan is None:
        return graph
    graph = _as_queued(graph, queued)
    prio = plan.priorities()
    if not prio:
        return graph
    from dask.highlevelgraph import HighLevelGraph, MaterializedLayer

    lookup = collections.defaultdict(int, prio).__getitem__  # picklable for the scheduler
    layer = MaterializedLayer(graph, annotations={"priority": lookup})
    return HighLevelGraph({"tilearray": layer}, {"tilearray": set()})


def _as_queued(graph: dict, keys) -> dict:
    """``graph`` with the tasks ``keys`` marked as data producers, which
    dask's scheduler queues as it does root tasks: each waits on the
    scheduler until a worker thread is free, highest priority first, instead
    of going to a worker as soon as it is ready (see :func:`_one_a_thread`).
    As it is where this dask has no such mark (its task spec is dask's own)."""
    if not keys:
        return graph
    try:
        from dask._task_spec import convert_legacy_task
    except ImportError:
        return graph
    out = dict(graph)
    for key in keys:
        task = convert_legacy_task(key, graph[key], graph)  # what dask would make of it
        if not hasattr(task, "_data_producer"):
            return graph
        task._data_producer = True
        out[key] = task
    return out


def _one_a_thread(dask_scheduler=None, enter: bool = True) -> None:
    """On the scheduler: while a run with queued tasks is in flight, give a
    worker one queued task per thread (``worker-saturation`` 1.0). dask's
    default 1.1 rounds up to two on a one-thread worker, the second waiting
    there behind the first while another worker idles: a Cholesky at 32768²
    on 2 one-thread workers left them idle 11-16% of the run that way, 6-7%
    with one each. Not for every run: short tasks then wait for a round trip each
    (reductions of 30 ms tasks ran 3-6% slower). Counted on the scheduler,
    so concurrent runs and clients share it; the last to leave restores it.
    A scheduler without queuing (``inf``, which cannot be changed while tasks
    are queued) is left alone."""
    s = dask_scheduler
    users, saved = getattr(s, "_tilearray_one_a_thread", (0, None))
    saturation = getattr(s, "WORKER_SATURATION", None)
    if enter:
        if users == 0:
            saved = saturation
            if isinstance(saturation, float) and 1.0 < saturation < math.inf:
                s.WORKER_SATURATION = 1.0
        s._tilearray_one_a_thread = (users + 1, saved)
    elif users:
        if users == 1 and saved is not None:
            s.WORKER_SATURATION = saved
        s._tilearray_one_a_thread = (users - 1, saved)


@contextlib.contextmanager
def _queuing(client, queued):
    """``with _queuing(client, queued):`` the run, one queued task per worker
    thread when it has any ``queued`` (:func:`_one_a_thread`)."""
    entered = False
    if queued:
        with contextlib.suppress(Exception):  # a scheduler refusing functions: its own then
            client.run_on_scheduler(_one_a_thread, enter=True)
            entered = True
    try:
        yield
    finally:
        if entered:
            with contextlib.suppress(Exception):  # a scheduler gone takes its setting with it
                client.run_on_scheduler(_one_a_thread, enter=False)


def gather(client, graph: dict, keys: list, *, description: str, quiet: bool, plan=None,
           units_total: int = 0, units_skipped: int = 0, stat_keys=(), alive=None):
    """Run ``graph`` on ``client`` and gather ``keys``: ``(values, RunStats)``
    (see :meth:`Engine.run <tilearray.engine.runtime.engine.Engine.run>`).

    ``stat_keys`` are gathered too, for their stats only (small results whose
    figures no key in ``keys`` carries). ``alive()``, if given, is called
    between polls and raises when the run can never finish."""
    from distributed import wait

    from .metrics import job_event
    from .progress import Bar

    t0 = time.perf_counter()
    _worker_peaks(client)  # reset the in-worker peaks (PeakMemory plugin)
    retries0 = _retries(client)
    job_event(client, "start", name=description, tasks=len(graph),
              units_total=int(units_total), units_skipped=int(units_skipped),
              **(_plan_figures(plan) if plan is not None else {}))
    ok, futures = False, []
    n_keys = len(keys)
    keys = list(keys) + [k for k in stat_keys if k not in set(keys)]
    # tasks finished plus running tasks' fractions (progress events from inside tasks)
    bar = Bar(client, graph, description, quiet)
    queued = plan.queued() if plan is not None else frozenset()
    queuing = contextlib.ExitStack()  # closed after the run, in the finally below
    try:
        queuing.enter_context(_queuing(client, queued))
        # NumPy operands (a right-hand side, a matrix under 32 MiB) travel
        # inside the graph once (pickled once, however many tasks use them):
        # dask's advice at 10 MB, scatter the data, is what that already is
        with _large_graphs():
            futures = client.get(_submitted(graph, plan, queued), keys, sync=False)
        keep: set = set()  # keys listed twice must not be released early
        seen: set = set()
        for f in futures:
            (keep if f.key in seen else seen).add(f.key)
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
        stall = _Stall(client)
        while pending:
            with contextlib.suppress(TimeoutError), client.as_current():
                wait(list(itertools.islice(pending.values(), 1000)), timeout=1,
                     return_when="FIRST_COMPLETED")
            if alive is not None:
                alive()
            stall.check(len(pending))
            for fut in [f for f in pending.values() if f.done()]:
                try:
                    value = fut.result()  # raises the task's exception
                except Exception as e:
                    rebuilt = _restored(e)
                    if rebuilt is None:
                        _note_killed(e, plan)
                        raise  # as it came, its cause kept
                    raise rebuilt from None
                for i in index[fut.key]:
                    values[i] = value
                del pending[fut.key]
                bar.finished(fut.key)
                if fut.key not in keep:
                    # free the result on its worker now (a compute() block, or a
                    # written block's stats): a worker lost later then takes no
                    # finished task with it, so only its running tasks rerun
                    fut.release()
            bar.refresh()
        ok = True
    except BaseException:
        # release, not cancel: the scheduler forgets every task no one wants,
        # so none still queued runs. client.cancel() of a key released above
        # while a sibling still needs it fails an assertion in distributed's
        # scheduler (stimulus_cancel), which drops this client's connection
        for f in futures:
            f.release()
        raise
    finally:
        queuing.close()
        job_event(client, "end", ok=ok)
        bar.close(ok)
        peaks = {addr: rss for addr, rss in _worker_peaks(client).items()
                 if isinstance(rss, int)}
    stats = _run_stats(values, time.perf_counter() - t0, bar, peaks)
    stats.task_retries = max(0, _retries(client) - retries0)
    for f in futures:  # release, not cancel: a later run may reuse these keys
        f.release()
    return [v for v, _ in values[:n_keys]], stats


def _run_stats(values, wall: float, bar, peaks: dict) -> RunStats:
    """The run's figures: every gathered ``(value, stats)`` summed (each
    task's figures reach exactly one of them), the progress bar's and the
    workers' peaks."""
    stats = RunStats(wall_seconds=wall)
    stats.progress_events, stats.progress_max_gap = bar.progress.events, bar.gaps.largest
    for _, st in values:
        for k in ("bytes_read", "bytes_written", "read_requests", "store_gets",
                  "read_retries", "tasks", "units_written"):
            setattr(stats, k, getattr(stats, k) + int(st.get(k, 0)))
        stats.io_wait_seconds += st.get("io_wait_seconds", 0.0)
        stats.blas_seconds += st.get("blas_seconds", 0.0)
    stats.per_worker_peak = peaks
    stats.peak_worker_memory = max(peaks.values(), default=0)
    return stats


class _Stall:
    """Warns once per run when no result has come for :attr:`SECONDS` while
    some worker is paused by dask's memory monitor: a worker of a cluster
    tilearray did not start (``Engine(client=...)``) pauses at
    ``distributed.worker.memory.pause`` of its memory limit (80 %), measured
    on its whole process -- for in-process workers, the client's too -- and
    its tasks then wait for as long as it stays paused."""

    SECONDS = 10.0

    def __init__(self, client):
        self.client, self.left, self.since, self.warned = client, None, time.monotonic(), False

    def check(self, left: int) -> None:
        now = time.monotonic()
        if left != self.left:
            self.left, self.since = left, now
            return
        if self.warned or now - self.since < self.SECONDS:
            return
        self.since = now
        try:
            workers = self.client.scheduler_info().get("workers", {})
        except Exception:
            return
        paused = sorted(a for a, w in workers.items() if w.get("status") == "paused")
        if paused:
            self.warned = True
            warnings.warn(
                f"no result has come for {self.SECONDS:.0f} s and {len(paused)} of "
                f"{len(workers)} worker(s) are paused by dask's memory monitor "
                f"({', '.join(paused)}): their tasks wait until they resume. Workers "
                "pause at distributed.worker.memory.pause of their memory limit, measured "
                "on the whole worker process (for processes=False workers, this process "
                "too); tilearray sizes its tasks to the budget itself: start the cluster "
                "with that setting False, or give its workers more memory",
                RuntimeWarning, stacklevel=2)


def _retries(client) -> int:
    """Reruns counted so far by the scheduler's Metrics plugin (a key that
    started processing again: worker lost while running it or holding its
    result); the sum of ``suspicious`` counts if the plugin is missing."""
    def count(dask_scheduler):
        plugin = dask_scheduler.plugins.get("tilearray-metrics")
        if plugin is not None:
            return plugin.task_retries
        return sum(ts.suspicious for ts in dask_scheduler.tasks.values())

    try:
        return int(client.run_on_scheduler(count))
    except Exception:
        return 0


def _plan_figures(plan) -> dict:
    b = plan.budget
    return {
        "projected_task_memory": max((s.peak_task_memory for s in plan.stages), default=0),
        "task_memory_budget": b.task_memory,
        "memory_per_worker": b.memory_per_worker,
    }


def _worker_peaks(client) -> dict:
    from .plugins import take_peak

    try:
        return client.run(take_peak, on_error="ignore")
    except Exception:
        return {}


def _note_killed(e: Exception, plan) -> None:
    """Add to distributed's ``KilledWorker`` (each worker that ran the task
    died) what tilearray knows: the plan's memory per task against the
    workers' limit, and the usual causes."""
    if type(e).__name__ != "KilledWorker" or not hasattr(e, "add_note"):
        return
    figures = ""
    if plan is not None:
        f = _plan_figures(plan)
        figures = (f" The plan projected at most {format_bytes(f['projected_task_memory'])} "
                   f"a task ({format_bytes(f['task_memory_budget'])} allowed, "
                   f"{format_bytes(f['memory_per_worker'])} a worker).")
    e.add_note("tilearray: every worker that ran this task died while running it." + figures
               + " A worker is restarted when its memory passes its limit (its log says so: "
               "'Worker exceeded ... memory budget'), or dies on a crash in native code: "
               "rerun with a larger memory_per_worker; nothing half-written is marked done.")


def _restored(e: Exception) -> Exception | None:
    """The tilearray error a task raised, where distributed could only return
    a plain ``Exception(repr)``: tblib pickles an error's ``__context__`` too,
    and one raised while handling, say, zarr's ``ArrayNotFoundError`` (which
    does not unpickle) then arrives as ``Exception('StorageError("...")')``,
    which ``except ta.StorageError`` would not catch. None when ``e`` is not
    such a stand-in."""
    from ... import errors

    if type(e) is not Exception or len(e.args) != 1 or not isinstance(e.args[0], str):
        return None
    m = re.fullmatch(r"(\w+)\((.*)\)", e.args[0], re.S)
    cls = getattr(errors, m.group(1), None) if m else None
    if not (isinstance(cls, type) and issubclass(cls, errors.TilearrayError)
            and cls.__module__ == errors.__name__):
        return None
    try:
        args = ast.literal_eval(f"({m.group(2)},)" if m.group(2) else "()")
    except (ValueError, SyntaxError):
        return None
    try:  # an error whose __init__ takes other arguments (a tile, a column) stays the stand-in
        return cls(*args)
    except Exception:
        return None
