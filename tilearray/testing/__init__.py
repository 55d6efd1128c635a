"""Helpers shipped for tests: store wrappers that count, fail or slow reads.

Nothing in tilearray imports this package.
"""

from .stores import CountingStore, FailingStore, counts, reset_counts

__all__ = ["CountingStore", "FailingStore", "counts", "reset_counts"]
