"""Client side of progress inside tasks: the fractions done of a run's
running tasks, from the :data:`~.plugins.PROGRESS_TOPIC` events workers send
(:class:`~.plugins.TaskProgress`).

A client has one handler per topic, so each client is subscribed once and
its events handed to every listener registered on it (:func:`listen`): runs
on the same client in several threads each see their own keys.
"""

from __future__ import annotations

import threading
import time

_LOCK = threading.Lock()


class RunProgress:
    """Fractions done of the running tasks among ``keys``, and the times
    at which the run's position moved (for the largest gap between them)."""

    def __init__(self, keys):
        self._names = {str(k): k for k in keys}
        self._lock = threading.Lock()
        self.running: dict = {}
        self.events = 0
        """Progress events received for this run's keys."""

    def on_event(self, event) -> None:
        _, msg = event
        key = self._names.get(msg.get("key")) if isinstance(msg, dict) else None
        if key is None:
            return
        with self._lock:
            self.running[key] = float(msg.get("fraction", 0.0))
            self.events += 1

    def finished(self, key) -> None:
        """``key``'s result is in: it counts whole from now on."""
        with self._lock:
            self.running.pop(key, None)

    def fraction(self) -> float:
        """Sum of the running tasks' fractions done."""
        with self._lock:
            return sum(self.running.values())


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


def listen(client, listener: RunProgress) -> None:
    """Hand ``client``'s progress events to ``listener`` (subscribing once)."""
    from .plugins import PROGRESS_TOPIC

    with _LOCK:
        hub = getattr(client, "_tilearray_progress", None)
        if hub is None:
            hub = client._tilearray_progress = []

            def dispatch(event, hub=hub):
                for one in list(hub):
                    one.on_event(event)

            client.subscribe_topic(PROGRESS_TOPIC, dispatch)
        hub.append(listener)


def unlisten(client, listener: RunProgress) -> None:
    with _LOCK:
        hub = getattr(client, "_tilearray_progress", None)
        if hub is not None and listener in hub:
            hub.remove(listener)


BAR_FORMAT = ("{desc}: {percentage:3.0f}%|{bar}| {n:.1f}/{total_fmt} {unit}s "
              "[{elapsed}<{remaining}{postfix}]")


class Bar:
    """A run's progress: finished keys plus the running ones' fractions, on
    a tqdm bar (``tqdm.auto``: the notebook widget in Jupyter) unless
    ``quiet``; its ETA follows the fractions. Also measures the largest gap
    between advances (:class:`Gaps`), bar or not."""

    def __init__(self, client, keys, description: str, quiet: bool):
        import logging
        import sys

        self.client, self.done, self.gaps = client, 0, Gaps()
        self.progress = RunProgress(keys)
        try:
            listen(client, self.progress)
        except Exception:  # a client without pub-sub: whole tasks only
            logging.getLogger("tilearray").debug("no progress events", exc_info=True)
        self.bar = None
        if not quiet:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=len(self.progress._names), desc=description, unit="block",
                            file=sys.stderr, leave=True, dynamic_ncols=True,
                            bar_format=BAR_FORMAT)

    def finished(self, key) -> None:
        self.done += 1
        self.progress.finished(key)

    def refresh(self) -> None:
        position = self.done + self.progress.fraction()
        self.gaps.update(position)
        if self.bar is not None and position != self.bar.n:
            self.bar.update(position - self.bar.n)

    def close(self) -> None:
        unlisten(self.client, self.progress)
        if self.bar is not None:
            self.bar.close()
