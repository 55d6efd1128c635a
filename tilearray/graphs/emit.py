"""Tasks as data, and the one emitter that turns a plan's stages into a dask graph.

A lowering (``tilearray.engine.plan``) describes each task it plans as a
:class:`Task` -- a key, the worker function it calls (from this package or
:mod:`tilearray.storage`) and its arguments -- collected in a :class:`Tasks`
list and frozen into its stage record. :func:`emit` is the only place that
turns those records into dask's graph format (the documented ``{key: (func,
*args)}`` task spec); nothing else builds a graph dict.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass

from .matmul import counted, merge_stats


@dataclass(frozen=True, slots=True)
class Task:
    """One planned task: ``fn(*args)`` run on a worker, its result under ``key``.

    An argument that is the key of another task of the same plan stands for
    that task's result (dask's task spec); tasks carry specs, ranges and
    paths, never large arrays."""

    key: Hashable
    fn: Callable
    args: tuple = ()
    priority: int = 0
    """Run before ready tasks of lower priority (dask's ``priority``
    annotation); 0 leaves the order to dask."""
    queued: bool = False
    """Held by the scheduler until a worker thread is free, then given to it
    highest priority first (dask's queuing of root tasks), not assigned to a
    worker as soon as it is ready: for long tasks of uneven length (a tiled
    factorization's), which behind a busy worker's running one leave
    another idle."""


class Tasks:
    """An ordered list of :class:`Task` a lowering fills, then freezes with
    :meth:`freeze`. ``tasks[key] = (fn, *args)`` adds one, so tree builders
    (:func:`~.blocks.tree`) can add combine tasks to it."""

    def __init__(self):
        self._tasks: dict = {}

    def add(self, key, fn: Callable, *args, priority: int = 0, queued: bool = False) -> Hashable:
        """Add ``fn(*args)`` as task ``key`` (``priority``, ``queued``: see
        :class:`Task`); returns ``key``."""
        self._tasks[key] = Task(key, fn, args, priority, queued)
        return key

    def __setitem__(self, key, task: tuple) -> None:
        self.add(key, task[0], *task[1:])

    def __contains__(self, key) -> bool:
        return key in self._tasks

    def __len__(self) -> int:
        return len(self._tasks)

    def freeze(self) -> tuple[Task, ...]:
        return tuple(self._tasks.values())


def emit(stages: Iterable) -> dict:
    """The dask graph of ``stages`` (objects with a ``work`` tuple of
    :class:`Task`), in dask's ``{key: (func, *args)}`` task format."""
    graph: dict = {}
    for stage in stages:
        for t in stage.work:
            graph[t.key] = (t.fn, *t.args)
    return graph


def priorities(stages: Iterable) -> dict:
    """``{key: priority}`` of the tasks of ``stages`` given one (see :class:`Task`)."""
    return {t.key: t.priority for stage in stages for t in stage.work if t.priority}


def queued(stages: Iterable) -> frozenset:
    """Keys of the tasks of ``stages`` the scheduler queues (see :class:`Task`)."""
    return frozenset(t.key for stage in stages for t in stage.work if t.queued)


# -- small worker functions the plan uses between stages ---------------------------------


def constant(value):
    """A small in-memory operand (a NumPy row, column or scalar) as a task result."""
    return value, {"tasks": 1}


def barrier(*args):
    """Wait for every task in ``args`` (a temporary's blocks); passes on their stats."""
    stats: dict = {}
    for a in args:
        st = a[1] if isinstance(a, tuple) else a
        stats = merge_stats(stats, st)
    return None, counted(stats)
