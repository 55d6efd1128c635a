"""tilearray's Prometheus metrics, served on the scheduler's ``/metrics``.

Two plugins, registered by every :class:`~tilearray.Engine`:

- :class:`TaskReporter` (worker): when a tilearray task finishes, it sends the
  task's measured I/O (the ``(value, stats)`` result every tilearray task
  returns) and the worker's peak RSS to the scheduler as a ``tilearray-task``
  event (``Worker.log_event``, batched with the worker's other messages).
- :class:`Metrics` (scheduler): adds those events up, counts task retries from
  the scheduler's own ``suspicious`` counts, keeps the current job's plan
  figures (sent by the client as ``tilearray-job`` events), and exports them
  through ``prometheus_client`` next to dask's metrics.

Counters are cumulative over the scheduler's life, as Prometheus expects;
``tilearray_job_*`` gauges describe the most recent job.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict

from distributed import SchedulerPlugin, WorkerPlugin

from ...graphs.matmul import MERGED, OWN

log = logging.getLogger("tilearray")

TASK_TOPIC = "tilearray-task"
JOB_TOPIC = "tilearray-job"
_COUNTED = ("bytes_read", "bytes_written", "read_requests", "store_gets", "read_retries",
            "units_written")


def task_stats(value) -> dict | None:
    """The stats dict of a tilearray task result ``(value, stats)``, else None."""
    if (isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], dict)
            and "bytes_read" in value[1]):
        return value[1]
    return None


class TaskReporter(WorkerPlugin):
    """Report each finished tilearray task's I/O figures to the scheduler."""

    name = "tilearray-task-reporter"
    idempotent = True

    def setup(self, worker):
        self.worker = worker

    def transition(self, key, start, finish, **kwargs):
        if finish != "memory" or start != "executing":
            return
        worker = self.worker
        try:
            st = task_stats(worker.data.get(key))
        except Exception:  # a spilled or evicted value: nothing to report
            return
        if st is None:
            return
        if st.get(MERGED):  # a tree combine: only what it did itself (a K-split's write)
            msg = {k: int(st.get(OWN + k, 0)) for k in _COUNTED}
        else:
            msg = {k: int(st.get(k, 0)) for k in _COUNTED}
        msg["tasks"] = 1  # every graph task counts once, as in RunStats and the plan
        rss = getattr(worker, "_tilearray_rss", None)  # the PeakMemory plugin's sampler
        msg["worker"] = worker.address
        msg["key"] = str(key)  # after the task's progress events (same worker stream)
        msg["worker_peak_rss"] = int(rss[0]["peak"]) if rss is not None else 0
        worker.log_event(TASK_TOPIC, msg)


class Metrics(SchedulerPlugin):
    """Accumulate tilearray's figures on the scheduler and export them."""

    name = "tilearray-metrics"
    idempotent = True  # a second Engine on the same cluster keeps the counters

    def __init__(self):
        self.totals: dict[str, int] = defaultdict(int)
        self.task_retries = 0
        self.worker_peak: dict[str, int] = {}
        self.job: dict = {}
        self.job_units_done = 0
        self._started: dict = {}  # key -> times it started processing

    async def start(self, scheduler):
        self.scheduler = scheduler
        self._lock = threading.Lock()  # made here: the plugin is pickled to the scheduler
        _collector().use(self)

    async def close(self):
        _collector().drop(self)

    # -- events ---------------------------------------------------------------
    def log_event(self, topic, msg):
        if topic == TASK_TOPIC:
            with self._lock:
                for k in (*_COUNTED, "tasks"):
                    self.totals[k] += int(msg.get(k, 0))
                self.job_units_done += int(msg.get("units_written", 0))
                w = msg.get("worker")
                if w:
                    self.worker_peak[w] = max(self.worker_peak.get(w, 0), int(msg.get("worker_peak_rss", 0)))
        elif topic == JOB_TOPIC:
            with self._lock:
                if msg.get("event") == "start":
                    self.totals["jobs"] += 1
                    self.job = dict(msg)
                    self.job_units_done = int(msg.get("units_skipped", 0))
                    self.worker_peak = {}
                elif msg.get("event") == "end":
                    self.job["finished"] = 1
                    self.job["failed"] = int(not msg.get("ok", False))
                    self.totals["jobs_failed"] += int(not msg.get("ok", False))

    def transition(self, key, start, finish, *args, **kwargs):
        # a key that starts processing a second time is a rerun: its worker
        # died while running it, or died holding its finished result (which
        # the scheduler then computes again). Both count as a retry.
        if finish == "forgotten":
            self._started.pop(key, None)
            return
        if finish != "processing":
            return
        n = self._started.get(key, 0)
        self._started[key] = n + 1
        if n:
            with self._lock:
                self.task_retries += 1

    def snapshot(self) -> dict:
        """The current figures, as a plain dict (also what ``/metrics`` shows)."""
        with self._lock:
            return {
                "totals": dict(self.totals),
                "task_retries": self.task_retries,
                "worker_peak": dict(self.worker_peak),
                "job": dict(self.job),
                "job_units_done": self.job_units_done,
            }


class _Collector:
    """One prometheus collector per process, reading the live Metrics plugin.

    dask does the same for its own collectors: several schedulers started in
    one process (tests, notebooks) share the global registry, and the newest
    one is reported.
    """

    def __init__(self):
        self.plugins: list[Metrics] = []

    def use(self, plugin: Metrics) -> None:
        self.plugins.append(plugin)

    def drop(self, plugin: Metrics) -> None:
        if plugin in self.plugins:
            self.plugins.remove(plugin)

    def describe(self):
        return []  # names are only known from collect(); skips the registry's duplicate check

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        if not self.plugins:
            return
        s = self.plugins[-1].snapshot()
        t, job = s["totals"], s["job"]
        for name, doc in (
            ("bytes_read", "Decoded bytes read from Zarr stores by tilearray tasks."),
            ("bytes_written", "Bytes written to Zarr outputs by tilearray tasks."),
            ("read_requests", "Whole-I/O-unit read requests made by tilearray tasks."),
            ("store_gets", "Store requests those reads made."),
            ("read_retries", "Store reads retried after a transient error."),
            ("units_written", "Output I/O units (chunks or shards) written and marked done."),
            ("tasks", "tilearray tasks finished."),
            ("jobs", "tilearray jobs started on this scheduler."),
            ("jobs_failed", "tilearray jobs that ended with an error."),
        ):
            c = CounterMetricFamily(f"tilearray_{name}", doc)
            c.add_metric([], t.get(name, 0))
            yield c
        c = CounterMetricFamily("tilearray_task_retries", "Tasks rerun because their worker died.")
        c.add_metric([], s["task_retries"])
        yield c
        units = int(job.get("units_total", 0))
        for name, doc, value in (
            ("job_units_total", "Output units of the current job.", units),
            ("job_units_done", "Output units of the current job done (resumed ones included).",
             s["job_units_done"]),
            ("job_units_remaining", "Output units of the current job still to write.",
             max(units - s["job_units_done"], 0)),
            ("job_tasks", "Tasks in the current job's graph.", int(job.get("tasks", 0))),
            ("job_running", "1 while the current job runs.",
             int(bool(job) and not job.get("finished", 0))),
            ("task_memory_projected_bytes", "Planned peak memory of the current job's largest task.",
             int(job.get("projected_task_memory", 0))),
            ("task_memory_budget_bytes", "Memory one task may use under the current budget.",
             int(job.get("task_memory_budget", 0))),
            ("worker_memory_limit_bytes", "The budget's memory per worker.",
             int(job.get("memory_per_worker", 0))),
        ):
            g = GaugeMetricFamily(f"tilearray_{name}", doc)
            g.add_metric([], value)
            yield g
        g = GaugeMetricFamily(
            "tilearray_worker_peak_memory_bytes",
            "Peak RSS of each worker process during the current job (measured while tasks run).",
            labels=["worker"],
        )
        for w, v in sorted(s["worker_peak"].items()):
            g.add_metric([w], v)
        yield g


_the_collector: _Collector | None = None
_collector_lock = threading.Lock()


def _collector() -> _Collector:
    global _the_collector
    with _collector_lock:
        if _the_collector is None:
            _the_collector = _Collector()
            try:
                from prometheus_client import REGISTRY

                REGISTRY.register(_the_collector)
            except ImportError:
                log.debug("prometheus_client is not installed: no tilearray metrics on /metrics")
        return _the_collector


def register(client) -> None:
    """Install both plugins on ``client``'s cluster (idempotent)."""
    client.register_plugin(Metrics(), name=Metrics.name)
    client.register_plugin(TaskReporter(), name=TaskReporter.name)


def job_event(client, event: str, **fields) -> None:
    """Tell the scheduler's Metrics plugin that a job starts or ends."""
    try:
        client.log_event(JOB_TOPIC, {"event": event, **fields})
    except Exception:  # metrics must never fail a job
        log.debug("could not log a tilearray job event", exc_info=True)
