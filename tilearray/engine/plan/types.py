"""Budget, per-stage projections and the printable Plan (no I/O, no cluster)."""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
from dask.utils import format_bytes

from ... import _config
from ...errors import PlanningError

MIN_TASK_MEMORY = 2**20
"""The least memory per task (thread) a worker must leave after its baseline, in bytes."""


def parse_memory(value, argument: str = "memory_per_worker", error=PlanningError) -> int:
    """A positive byte count from an int or a string such as ``"2GiB"``
    (:func:`tilearray._config.parse_bytes_arg`, raising ``error``)."""
    return _config.parse_bytes_arg(value, argument, error)


def _positive_int(value, argument: str, error=PlanningError) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise error(f"{argument}={value!r} must be a positive integer (1 or more)")
    return int(value)


@dataclass(frozen=True, slots=True)
class Budget:
    """Memory and parallelism the planner sizes tasks for.

    An :class:`Engine` gives its own (``engine.budget()``); build one to plan
    without a cluster, e.g. ``expr.plan(budget=ta.Budget.from_config("1GiB",
    4, 1))``. ``memory_per_worker`` takes the byte strings ``Engine`` takes
    (``"2GiB"``) and is stored in bytes. Frozen: change it with
    :func:`dataclasses.replace`.

    Raises
    ------
    PlanningError
        A byte size that is not positive or not a byte size, ``n_workers`` /
        ``threads_per_worker`` below 1, a negative ``baseline`` or a
        ``fraction`` outside (0, 1]; the message names the argument and value.
    """

    memory_per_worker: int
    """Whole worker process limit (dask's ``memory_limit``), in bytes."""
    n_workers: int = 1
    """Workers that run tasks in parallel."""
    threads_per_worker: int = 1
    """Tasks one worker runs at once; they share its memory."""
    baseline: int = 120 * 2**20
    """Resident memory of an idle worker, reserved first, in bytes."""
    fraction: float = 0.85
    """Share of ``memory_per_worker`` the planner may fill."""
    worker: str | None = None
    """On a cluster: the worker that sets the budget (least memory per thread)."""

    def __post_init__(self):
        set_ = object.__setattr__  # frozen: normalise in place once, at construction
        set_(self, "memory_per_worker", parse_memory(self.memory_per_worker))
        set_(self, "n_workers", _positive_int(self.n_workers, "n_workers"))
        set_(self, "threads_per_worker",
             _positive_int(self.threads_per_worker, "threads_per_worker"))
        if isinstance(self.baseline, str):
            set_(self, "baseline", parse_memory(self.baseline, "baseline"))
        if isinstance(self.baseline, bool) or not isinstance(self.baseline, numbers.Integral) \
                or self.baseline < 0:
            raise PlanningError(f"baseline={self.baseline!r} must be a byte count >= 0")
        set_(self, "baseline", int(self.baseline))
        if isinstance(self.fraction, bool) or not isinstance(self.fraction, numbers.Real) \
                or not 0 < self.fraction <= 1:
            raise PlanningError(f"fraction={self.fraction!r} must be a number in (0, 1]")
        set_(self, "fraction", float(self.fraction))

    @classmethod
    def from_config(cls, memory_per_worker: int | str, n_workers: int, threads_per_worker: int,
                    worker: str | None = None):
        """A budget with the baseline and target fraction from ``tilearray.memory.*``."""
        return cls(
            memory_per_worker,
            n_workers,
            threads_per_worker,
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

    @property
    def minimum_memory_per_worker(self) -> int:
        """Least ``memory_per_worker`` a worker process needs: its idle baseline
        plus :data:`MIN_TASK_MEMORY` per thread within ``fraction``, rounded up
        to whole MiB (so it can be passed back as ``"<n>MiB"``), in bytes."""
        return -(-self.worker_memory_for(MIN_TASK_MEMORY) // 2**20) * 2**20


def check_worker_memory(memory_per_worker, threads_per_worker: int = 1,
                        argument: str = "memory_per_worker", error=PlanningError) -> int:
    """Parse a worker memory limit and refuse one a worker process cannot live
    in (below :attr:`Budget.minimum_memory_per_worker` under the configured
    ``tilearray.memory.worker-baseline`` and ``target-fraction``), before any
    worker is started. Returns bytes."""
    mem = parse_memory(memory_per_worker, argument, error)
    b = Budget.from_config(mem, 1, threads_per_worker)
    need = b.minimum_memory_per_worker
    if mem < need:
        raise error(
            f"{argument}={memory_per_worker!r} ({format_bytes(mem)}) is below what a worker process "
            f"needs: an idle worker takes {format_bytes(b.baseline)} "
            f"(tilearray.memory.worker-baseline) and tasks may fill {b.fraction:g} of the "
            f"limit (tilearray.memory.target-fraction), so with {b.threads_per_worker} "
            f"thread(s) per worker the minimum is {need // 2**20} MiB; pass "
            f"{argument}=\"{need // 2**20}MiB\" or more"
        )
    return mem


@dataclass(frozen=True, slots=True)
class Stage:
    """One planned operation: a set of like tasks, as data.

    Made by a lowering function from an expression node, its inputs' layouts
    and the budget; :func:`tilearray.graphs.emit.emit` turns the ``work`` of
    every stage of a :class:`Plan` into the dask graph."""

    kind: str
    """matmul, map (elementwise), reduce, small, store, result."""
    description: str
    tasks: int
    """Tasks of this stage (``len(work)``; 0 for a result brought back in memory)."""
    peak_task_memory: int
    """Projected peak memory of the largest task, in bytes."""
    bytes_read: int
    bytes_written: int = 0
    flops: int = 0
    io_lower_bound: int | None = None
    """Lower bound on bytes read, in bytes: Hong-Kung (matmul), Ballard et al.
    (Cholesky, :func:`~.cholesky.io_bound`)."""
    reads: int = 0
    """Planned read requests (whole I/O units or runs of them)."""
    store_gets: int = 0
    """Store requests those reads make."""
    work: tuple = ()
    """The stage's tasks (:class:`tilearray.graphs.emit.Task`), in order."""
    outputs: Mapping = field(default_factory=dict)
    """Named results of the stage: ``{name: Output}``."""


@dataclass(frozen=True, slots=True)
class Output:
    """A named result of a plan: where the run's keys leave it."""

    kind: str
    """"store" (its tasks wrote it into the target), "blocks" (2-D blocks to
    assemble in memory) or "value" (one in-memory value)."""
    keys: tuple
    """Keys of the tasks that produce it (each task returns ``(value, stats)``)."""
    blocks: tuple = ()
    """For "blocks": ``((r0, r1), (c0, c1))`` of each key."""


@dataclass(frozen=True, slots=True)
class Create:
    """An array the run creates before it starts (an output or a temporary)."""

    ref: object
    """Its :class:`~tilearray.storage.ArrayRef`."""
    shape: tuple
    dtype: np.dtype
    tile: tuple
    shard: tuple | None
    temporary: bool = False
    """Deleted after the run (a matmul used inside another expression)."""


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
    outputs: Mapping = field(default_factory=dict)
    """Named results (``{"result": Output}``; several for a factorization)."""
    creates: tuple = ()
    """Arrays the run creates first (:class:`Create`; temporaries are deleted after)."""
    stat_keys: tuple = ()
    """More keys gathered for their stats only: small results big tasks read as
    operands and matmul temporaries' barriers, whose figures no output's key
    carries (each counted once)."""

    def graph(self) -> dict:
        """The dask graph that runs this plan (the one emitter, :mod:`tilearray.graphs.emit`)."""
        from ...graphs.emit import emit

        return emit(self.stages)

    def priorities(self) -> dict:
        """``{key: priority}`` of the tasks that carry one (higher runs first
        among ready tasks; the rest keep dask's order)."""
        from ...graphs.emit import priorities

        return priorities(self.stages)

    def queued(self) -> frozenset:
        """Keys of the tasks the scheduler holds until a worker thread is free
        (see :class:`~tilearray.graphs.emit.Task`)."""
        from ...graphs.emit import queued

        return queued(self.stages)

    @property
    def result(self) -> Output:
        """The plan's (first) named output."""
        return next(iter(self.outputs.values()))

    def temporary_units(self) -> int:
        """I/O units of the run's temporaries (they are written like outputs)."""
        from ...storage import Grid

        return sum(Grid.regular(c.shape, c.tile, c.shard).n_units for c in self.creates)

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
            what = {"matmul": "matmul I/O lower bound max(2mnk/sqrt(M/itemsize), inputs once)",
                    "cholesky": "Cholesky I/O lower bound max(n^3/(3 sqrt(M/itemsize)), "
                                "lower triangle once)"}
            label = " + ".join(what.get(k, f"{k} I/O lower bound") for k in
                               sorted({s.kind for s in self.stages if s.io_lower_bound}))
            out.append(
                f"  {label}: "
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
