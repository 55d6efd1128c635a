"""The tilearray error tree. Imported from anywhere; imports nothing of ours."""

from __future__ import annotations


class TilearrayError(Exception):
    """Base of every error tilearray raises on purpose."""


class StorageError(TilearrayError, OSError):
    """A Zarr array is missing, unreadable, corrupt or incomplete."""


class CorruptChunkError(StorageError):
    """A stored chunk failed its checksum or could not be decoded."""

    def __init__(self, path: str, tile: tuple[int, ...], reason: str):
        self.path = path
        self.tile = tuple(tile)
        self.reason = reason
        super().__init__(
            f"corrupt chunk in {path!r} at tile index {self.tile}: {reason}"
        )

    def __reduce__(self):  # survives the trip from a worker process
        return (type(self), (self.path, self.tile, self.reason))


class IncompleteOutputError(StorageError):
    """An output array whose job did not finish writing every unit."""


class OutputLockedError(StorageError):
    """Another job is writing the same output."""


class PlanningError(TilearrayError, ValueError):
    """An expression or plan is invalid: shapes, dtypes, memory budget."""


class ClusterError(TilearrayError, RuntimeError):
    """The dask cluster could not be started, reached or used."""
