"""Worker plugins (imported lazily: this module imports distributed)."""

from __future__ import annotations

import threading

from distributed import WorkerPlugin


class BlasLimit(WorkerPlugin):
    """Cap BLAS threads so dask threads x BLAS threads <= the worker's cores.

    Registered with the client, so workers that (re)start later get it too.
    """

    name = "tilearray-blas-limit"

    def __init__(self, blas_threads: int):
        self.blas_threads = blas_threads

    def setup(self, worker):
        from threadpoolctl import threadpool_limits

        # kept on the worker so the limit stays in force for its lifetime
        worker._tilearray_blas_limit = threadpool_limits(limits=self.blas_threads)


class IgnoreInterrupt(WorkerPlugin):
    """Worker processes of an embedded cluster ignore SIGINT.

    Ctrl-C in a terminal reaches the whole process group: the client handles
    it (cancels the run, closes the cluster, says how to resume) and the
    nannies stop their workers, instead of every worker process printing its
    own KeyboardInterrupt traceback.
    """

    name = "tilearray-ignore-interrupt"

    def setup(self, worker):
        import signal
        import threading

        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, signal.SIG_IGN)


class QuietKnownErrors(WorkerPlugin):
    """A task failing with one of tilearray's own errors -- a matrix not
    positive definite or singular, a ``nanargmin`` slice all NaN, a corrupt
    chunk, a changed input -- fails without the worker's "Compute Failed"
    log record (a traceback on the user's terminal beside the error itself):
    the client raises the same error, whose message names the tile, chunk or
    path. Other failures keep distributed's log."""

    name = "tilearray-quiet-known-errors"
    _users = 0  # workers of this process using the filter (in-process workers share it)
    _lock = threading.Lock()

    def setup(self, worker):
        import logging

        with QuietKnownErrors._lock:
            if QuietKnownErrors._users == 0:
                logging.getLogger("distributed.worker").addFilter(_keep_record)
            QuietKnownErrors._users += 1

    def teardown(self, worker):
        import logging

        with QuietKnownErrors._lock:
            QuietKnownErrors._users -= 1
            if QuietKnownErrors._users == 0:
                logging.getLogger("distributed.worker").removeFilter(_keep_record)


def _known_errors() -> tuple:
    """``"Name("`` of every tilearray error class, and NumPy's LinAlgError:
    how distributed's record shows the exception (``repr``)."""
    from ... import errors

    names, todo = {"LinAlgError"}, [errors.TilearrayError]
    while todo:
        cls = todo.pop()
        names.add(cls.__name__)
        todo += cls.__subclasses__()
    return tuple(n + "(" for n in sorted(names))


def _keep_record(record) -> bool:
    """False for distributed's "Compute Failed" record of a known error."""
    if not str(record.msg).startswith("Compute Failed") or len(record.args or ()) < 4:
        return True
    return not str(record.args[3]).startswith(_known_errors())


class PeakMemory(WorkerPlugin):
    """Samples the worker process's RSS every few milliseconds and keeps the
    peak, so short spikes (a block being encoded and written) are not missed
    by a sampler polling from the client."""

    name = "tilearray-peak-memory"

    def __init__(self, interval: float = 0.01):
        self.interval = interval

    def setup(self, worker):
        import threading

        import psutil

        proc = psutil.Process()
        state = {"peak": proc.memory_info().rss}
        stop = threading.Event()

        def sample():
            while not stop.wait(self.interval):
                rss = proc.memory_info().rss
                if rss > state["peak"]:
                    state["peak"] = rss

        threading.Thread(target=sample, daemon=True, name="tilearray-rss").start()
        worker._tilearray_rss = (state, stop, proc)

    def teardown(self, worker):
        rss = getattr(worker, "_tilearray_rss", None)
        if rss is not None:
            rss[1].set()


class CloseSessions(WorkerPlugin):
    """A worker closing closes its S3 filesystems' HTTP clients first
    (:func:`~tilearray.storage.objects.close_sessions`): left to its exit,
    every worker of an S3 run printed aiohttp's "Unclosed client session"."""

    name = "tilearray-close-sessions"

    def teardown(self, worker):
        from ...storage.objects import close_sessions

        close_sessions()


def take_peak(dask_worker) -> int:
    """Peak RSS since the last call (0 without the plugin); resets the peak."""
    rss = getattr(dask_worker, "_tilearray_rss", None)
    if rss is None:
        return 0
    state, _, proc = rss
    peak, state["peak"] = state["peak"], proc.memory_info().rss
    return peak


class QuietClosedScheduler(WorkerPlugin):
    """Under mpirun, a worker rank whose scheduler rank has closed (the job is
    over, or rank 0 died) logs one line, not a heartbeat traceback: the
    scheduler is the job's single point of failure, and a batch job's stderr
    should show the client's error alone."""

    name = "tilearray-quiet-closed-scheduler"

    def setup(self, worker):
        import logging

        class _OneLine(logging.Filter):
            def filter(self, record):
                if record.getMessage().startswith("Failed to communicate with scheduler"):
                    record.exc_info = record.exc_text = None
                    record.msg, record.args = ("%s (the scheduler has closed)",
                                               (record.getMessage(),))
                return True

        logging.getLogger("distributed.worker").addFilter(_OneLine())


PROGRESS_TOPIC = "tilearray-progress"
"""Events ``{"key": str(task key), "fraction": done / total}`` from running tasks."""
PROGRESS_STEP = 0.01
"""A task's progress is sent when it moved by at least this fraction (or finished):
at most about 100 events per task, however many panels it has."""


class TaskProgress(WorkerPlugin):
    """Installs :func:`send_progress` as the hook of
    :func:`tilearray.graphs.progress.report`: tasks' progress goes to the
    scheduler as :data:`PROGRESS_TOPIC` events, which it forwards to
    subscribed clients (the progress bar of
    :func:`~tilearray.engine.runtime.gather.gather`)."""

    name = "tilearray-task-progress"
    idempotent = True

    def setup(self, worker):
        from ...graphs import progress

        progress.set_hook(send_progress)


_last = threading.local()  # (key, fraction) last sent by this thread


def send_progress(done: int, total: int) -> None:
    """Send the running task's fraction done (called inside tasks on a
    worker; elsewhere, e.g. under a local dask scheduler, it does nothing)."""
    from distributed import get_worker
    from distributed.worker import thread_state

    try:
        worker = get_worker()
    except ValueError:
        return
    key = getattr(thread_state, "key", None)
    if key is None:
        return
    fraction = min(max(done / total, 0.0), 1.0)
    last = getattr(_last, "sent", None)
    if last is not None and last[0] == key and (
            fraction <= last[1] or fraction < min(last[1] + PROGRESS_STEP, 1.0)):
        return
    _last.sent = (key, fraction)
    worker.log_event(PROGRESS_TOPIC, {"key": str(key), "fraction": fraction})
