"""Budget, per-stage projections and the printable Plan (no I/O, no cluster)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from dask.utils import format_bytes

from .. import _config


@dataclass(frozen=True, slots=True)
class Budget:
    """Memory and parallelism the planner sizes tasks for.

    An :class:`Engine` gives its own (``engine.budget()``); build one to plan
    without a cluster, e.g. ``expr.plan(budget=ta.Budget.from_config(2**30,
    4, 1))``. Frozen: change it with :func:`dataclasses.replace`.
    """

    memory_per_worker: int
    """Whole worker process limit (dask's ``memory_limit``), in bytes."""
    n_workers: int = 1
    """Workers that run tasks in parallel."""
    threads_per_worker: int = 1
    """Tasks one worker runs at once; they share its memory."""
    baseline: int = 160 * 2**20
    """Resident memory of an idle worker, reserved first, in bytes."""
    fraction: float = 0.8
    """Share of ``memory_per_worker`` the planner may fill."""
    worker: str | None = None
    """On a cluster: the worker that sets the budget (least memory per thread)."""

    @classmethod
    def from_config(cls, memory_per_worker: int, n_workers: int, threads_per_worker: int,
                    worker: str | None = None):
        """A budget with the baseline and target fraction from ``tilearray.memory.*``."""
        return cls(
            int(memory_per_worker),
            int(n_workers),
            int(threads_per_worker),
            _config.get_bytes("memory.worker-baseline"),
            float(_config.get("memory.target-fraction")),
            worker,
        )

    @property
    def task_memory(self) -> int:
        """Bytes one task may use: what is left after the baseline, per thread."""
        return max(int(self.memory_per_worker * self.fraction) - self.baseline, 0) // max(
            self.threads_per_worker, 1
        )

    @property
    def total_threads(self) -> int:
        """Tasks the whole cluster runs at once."""
        return self.n_workers * self.threads_per_worker

    def worker_memory_for(self, task_memory: int) -> int:
        """Smallest ``memory_per_worker`` under which a task of this size fits."""
        return math.ceil((task_memory * self.threads_per_worker + self.baseline) / self.fraction)


@dataclass(frozen=True, slots=True)
class Stage:
    """One planned operation: a set of like tasks."""

    kind: str
    """matmul, map (elementwise), reduce, small."""
    description: str
    tasks: int
    peak_task_memory: int
    """Projected peak memory of the largest task, in bytes."""
    bytes_read: int
    bytes_written: int = 0
    flops: int = 0
    io_lower_bound: int | None = None
    """Hong-Kung lower bound on bytes read (matmul), in bytes."""
    reads: int = 0
    """Planned read requests (whole I/O units or runs of them)."""
    store_gets: int = 0
    """Store requests those reads make."""
    detail: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Plan:
    """What a run will do, projected before anything runs.

    Made by :meth:`TiledArray.plan` (and by every run, before it starts);
    printable, with an HTML table in notebooks. Totals are summed over the
    stages.

    Examples
    --------
    >>> print((a @ b).plan())                          # doctest: +SKIP
    """

    expression: str
    """The expression, as text."""
    shape: tuple
    """Result shape."""
    dtype: str
    """Result dtype."""
    budget: Budget
    """The budget the tasks were sized for."""
    stages: tuple[Stage, ...]
    """The planned operations, in run order."""
    output: str | None = None
    """Where the result is written (None: returned in memory)."""

    @property
    def tasks(self) -> int:
        """Number of tasks."""
        return sum(s.tasks for s in self.stages)

    @property
    def peak_task_memory(self) -> int:
        """Projected peak memory of the largest task, in bytes."""
        return max((s.peak_task_memory for s in self.stages), default=0)

    @property
    def bytes_read(self) -> int:
        """Bytes read from storage (decoded size), in bytes."""
        return sum(s.bytes_read for s in self.stages)

    @property
    def bytes_written(self) -> int:
        """Bytes written to storage (decoded size), in bytes."""
        return sum(s.bytes_written for s in self.stages)

    @property
    def flops(self) -> int:
        """Floating-point operations (2 per multiply-add in a matmul)."""
        return sum(s.flops for s in self.stages)

    @property
    def reads(self) -> int:
        """Planned read requests (whole I/O units or runs of them)."""
        return sum(s.reads for s in self.stages)

    @property
    def store_gets(self) -> int:
        """Store requests those reads make."""
        return sum(s.store_gets for s in self.stages)

    @property
    def io_lower_bound(self) -> int | None:
        """Hong-Kung lower bound on the matmul stages' reads, in bytes (None
        without a matmul)."""
        bounds = [s.io_lower_bound for s in self.stages if s.io_lower_bound]
        return sum(bounds) if bounds else None

    def _lines(self) -> list[str]:
        b = self.budget
        out = [
            f"tilearray plan: {self.expression} -> {self.shape} {self.dtype}"
            + (f" into {self.output}" if self.output else ""),
            f"  budget: {b.n_workers} worker(s) x {b.threads_per_worker} thread(s), "
            f"{format_bytes(b.memory_per_worker)} per worker -> "
            f"{format_bytes(b.task_memory)} per task"
            + (f" (set by worker {b.worker})" if b.worker else ""),
        ]
        for i, s in enumerate(self.stages, 1):
            line = (
                f"  [{i}] {s.kind:<7} {s.tasks:>6} tasks  peak/task "
                f"{format_bytes(s.peak_task_memory):>10}  read {format_bytes(s.bytes_read):>10}"
                f"  write {format_bytes(s.bytes_written):>10}"
            )
            if s.flops:
                line += f"  {s.flops / 1e9:,.1f} GFLOP"
            out.append(line)
            out.append(f"      {s.description}")
        out.append(
            f"  total: {self.tasks} tasks, peak/task {format_bytes(self.peak_task_memory)} "
            f"of {format_bytes(b.task_memory)}, read {format_bytes(self.bytes_read)} "
            f"in {self.reads} requests ({self.store_gets} store gets), "
            f"write {format_bytes(self.bytes_written)}"
            + (f", {self.flops / 1e9:,.1f} GFLOP" if self.flops else "")
        )
        if self.io_lower_bound:
            mm = sum(s.bytes_read for s in self.stages if s.io_lower_bound)
            out.append(
                f"  matmul I/O lower bound 2mnk/sqrt(M/itemsize): "
                f"{format_bytes(self.io_lower_bound)}; planned reads are "
                f"{mm / self.io_lower_bound:.2f}x that"
            )
        return out

    def __str__(self) -> str:
        return "\n".join(self._lines())

    __repr__ = __str__

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><td>{s.kind}</td><td>{s.tasks}</td><td>{format_bytes(s.peak_task_memory)}</td>"
            f"<td>{format_bytes(s.bytes_read)}</td><td>{format_bytes(s.bytes_written)}</td>"
            f"<td>{s.flops / 1e9:,.1f}</td><td>{s.description}</td></tr>"
            for s in self.stages
        )
        head = "</th><th>".join(
            ["stage", "tasks", "peak/task", "read", "write", "GFLOP", "what"]
        )
        lb = ""
        if self.io_lower_bound:
            lb = f"<p>I/O lower bound {format_bytes(self.io_lower_bound)}</p>"
        return (
            f"<div><b>tilearray plan</b>: <code>{self.expression}</code> &rarr; "
            f"{self.shape} {self.dtype}<br>budget {format_bytes(self.budget.task_memory)} "
            f"per task<table><tr><th>{head}</th></tr>{rows}</table>{lb}</div>"
        )
