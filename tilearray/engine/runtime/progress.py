"""Client side of progress inside tasks: the fractions done of a run's
running tasks, from the :data:`~.plugins.PROGRESS_TOPIC` events workers send
(:class:`~.plugins.TaskProgress`), and its finished tasks, from the
:data:`~.metrics.TASK_TOPIC` events of :class:`~.metrics.TaskReporter`.

A client has one handler per topic, so each client is subscribed once and
its events handed to every listener registered on it (:func:`listen`): runs
on the same client in several threads each see their own keys.
"""

from __future__ import annotations

import threading
import time

_LOCK = threading.Lock()


class RunProgress:
    """Where a run is, in tasks: those finished (their results gathered, or
    their worker's task-finished event seen) plus the running ones' fractions
    done, for the tasks among ``keys`` (the run's graph)."""

    def __init__(self, keys):
        self._names = {str(k): k for k in keys}
        self._lock = threading.Lock()
        self._done: set = set()
        self.running: dict = {}
        self.events = 0
        """Progress events received for this run's tasks."""

    def on_event(self, event) -> None:
        """A :data:`~.plugins.PROGRESS_TOPIC` event."""
        _, msg = event
        name = msg.get("key") if isinstance(msg, dict) else None
        if name not in self._names:
            return
        with self._lock:
            self.events += 1
            if name not in self._done:
                self.running[name] = float(msg.get("fraction", 0.0))

    def on_task(self, event) -> None:
        """A :data:`~.metrics.TASK_TOPIC` event: a task of the graph finished."""
        _, msg = event
        name = msg.get("key") if isinstance(msg, dict) else None
        if name in self._names:
            self.finished(name)

    def finished(self, key) -> None:
        """``key`` finished: it counts whole from now on."""
        name = str(key)
        with self._lock:
            self.running.pop(name, None)
            self._done.add(name)

    def position(self) -> float:
        """Tasks finished plus the running tasks' fractions."""
        with self._lock:
            return len(self._done) + sum(self.running.values())


class Gaps:
    """Largest wall-clock gap between advances of a run's position."""

    def __init__(self):
        self.start = self.last = time.perf_counter()
        self.position = 0.0
        self.largest = 0.0

    def update(self, position: float) -> None:
        now = time.perf_counter()
        if position > self.position:
            self.largest = max(self.largest, now - self.last)
            self.position, self.last = position, now


def listen(client, listener) -> None:
    """Hand ``client``'s progress and task-finished events to ``listener``
    (its ``on_event`` and ``on_task``), subscribing the client once."""
    from .metrics import TASK_TOPIC
    from .plugins import PROGRESS_TOPIC

    with _LOCK:
        hub = getattr(client, "_tilearray_progress", None)
        if hub is None:
            hub = client._tilearray_progress = []

            def dispatch(method):
                def handler(event):
                    for one in list(hub):
                        getattr(one, method)(event)
                return handler

            client.subscribe_topic(PROGRESS_TOPIC, dispatch("on_event"))
            client.subscribe_topic(TASK_TOPIC, dispatch("on_task"))
        hub.append(listener)


def unlisten(client, listener: RunProgress) -> None:
    with _LOCK:
        hub = getattr(client, "_tilearray_progress", None)
        if hub is not None and listener in hub:
            hub.remove(listener)


BAR_FORMAT = ("{desc}: {percentage:3.0f}%|{bar}| {n:.1f}/{total_fmt} {unit}s "
              "[{elapsed}<{remaining}, {rate_fmt}{postfix}]")


LOG_INTERVAL = 30.0
"""Seconds between progress lines written to a log (stderr not a terminal)."""


class _Lines:
    """The process's stderr when it is not a terminal (a batch job's log, an
    MPI rank's pipe, ``make run > log``): each refresh of the bar becomes a
    line of its own, not a carriage return rewriting one line."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text: str) -> None:
        line = text.replace("\r", "").strip()
        if line:
            self.stream.write(line + "\n")

    def flush(self) -> None:
        self.stream.flush()


def _bar_stream(stream) -> tuple:
    """``(file, tqdm options)`` for a bar on ``stream``: the stream itself on
    a terminal, in a notebook or under a test's capture; a process stderr
    that is a pipe or file gets :class:`_Lines`, one every
    :data:`LOG_INTERVAL` seconds at most."""
    import sys

    tty = hasattr(stream, "isatty") and stream.isatty()
    if tty or stream is not sys.__stderr__:
        return stream, {"dynamic_ncols": True}
    return _Lines(stream), {"ncols": 100, "mininterval": LOG_INTERVAL, "ascii": True}


class Bar:
    """A run's progress in tasks (:class:`RunProgress`), on a tqdm bar
    (``tqdm.auto``: the notebook widget in Jupyter; lines in a log, see
    :func:`_bar_stream`) unless ``quiet``; its ETA follows the fractions.
    Also measures the largest gap between advances (:class:`Gaps`), bar or
    not."""

    def __init__(self, client, graph, description: str, quiet: bool):
        import logging
        import sys

        self.client, self.gaps = client, Gaps()
        self.progress = RunProgress(graph)
        try:
            listen(client, self.progress)
        except Exception:  # a client without pub-sub: whole tasks only
            logging.getLogger("tilearray").debug("no progress events", exc_info=True)
        self.bar, self.lines = None, False
        if not quiet:
            from tqdm.auto import tqdm

            stream, options = _bar_stream(sys.stderr)
            self.lines = isinstance(stream, _Lines)
            self.bar = tqdm(total=len(self.progress._names), desc=description, unit="task",
                            file=stream, leave=True, bar_format=BAR_FORMAT, **options)

    def finished(self, key) -> None:
        self.progress.finished(key)

    def refresh(self, position: float | None = None) -> None:
        if position is None:
            position = self.progress.position()
        self.gaps.update(position)
        if self.bar is not None and position != self.bar.n:
            self.bar.update(position - self.bar.n)
            if self.bar.last_print_n != self.bar.n and not self.lines:  # tqdm skipped it
                self.bar.refresh()  # (mininterval): the bar must not show an old value

    def close(self, ok: bool = False) -> None:
        """Stop listening; a run that succeeded ends at its total (tasks that
        send no finished event, e.g. constants, counted here)."""
        unlisten(self.client, self.progress)
        if ok:
            self.refresh(float(len(self.progress._names)))
        if self.bar is not None:
            self.bar.close()
