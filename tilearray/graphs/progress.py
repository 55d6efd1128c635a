"""Progress inside a task: kernels call :func:`report` as they work (a matmul
after each K panel, a TSQR leaf after its read), and whatever hook the
process installed passes it on.

No hook by default: :func:`report` does nothing, so kernels run the same in
a plain process, under dask's local schedulers or in tests. On a
dask.distributed worker the engine installs one
(:class:`tilearray.engine.runtime.plugins.TaskProgress`) that sends the
running task's fraction done to the client, whose progress bar counts
fractions of tasks. Worker code never imports the engine or distributed:
the hook is a plain callable put into this slot.
"""

from __future__ import annotations

from collections.abc import Callable

_hook: Callable[[int, int], None] | None = None


def set_hook(hook: Callable[[int, int], None] | None):
    """Install ``hook(done, total)`` (None removes it); returns the previous one."""
    global _hook
    previous, _hook = _hook, hook
    return previous


def report(done: int, total: int) -> None:
    """This task has done ``done`` of its ``total`` steps (never raises)."""
    hook = _hook
    if hook is None or total <= 0:
        return
    try:
        hook(done, total)
    except Exception:  # progress must never fail a task
        pass
