"""Helpers shipped for tests: store wrappers that count, fail or slow reads, and
the one float comparison against NumPy (:func:`assert_close`).

Nothing in tilearray imports this package.
"""

from .compare import assert_close, tolerance
from .stores import CountingStore, FailingStore, LatencyStore, counts, reset_counts

__all__ = ["assert_close", "tolerance", "CountingStore", "FailingStore", "LatencyStore", "counts",
           "reset_counts"]
