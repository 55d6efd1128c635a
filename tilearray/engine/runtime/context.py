"""Which engine runs work when none is passed: the stack of ``with Engine()``
blocks, the most recently created engine (until closed) and the default one
started lazily. State only; the Engine and the MPI boot both write it, so it
imports nothing."""

from __future__ import annotations

import threading

stack: list = []
"""Engines of the enclosing ``with Engine()`` blocks, innermost last."""
default = None
"""The engine started by ``current_engine()`` when there was none (or the MPI one)."""
active = None
"""The most recently created engine, until closed."""
lock = threading.Lock()
"""Held while the default engine is chosen."""
