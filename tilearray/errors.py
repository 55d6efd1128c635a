"""The tilearray error tree. Imported from anywhere; imports nothing of ours
(NumPy only, for ``LinAlgError``)."""

from __future__ import annotations

import numpy as np
from numpy.linalg import LinAlgError


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


class PlanningAxisError(PlanningError, np.exceptions.AxisError):
    """An axis out of bounds for the array (NumPy's ``AxisError``)."""

    def __init__(self, message: str):
        PlanningError.__init__(self, message)

    def __str__(self) -> str:
        return str(self.args[0])


class PlanningIndexError(PlanningError, IndexError):
    """An index NumPy would refuse with ``IndexError`` (too many indices, out of range)."""


class ClusterError(TilearrayError, RuntimeError):
    """The dask cluster could not be started, reached or used."""


class NotPositiveDefiniteError(TilearrayError, LinAlgError):
    """A Cholesky factorisation met a leading minor that is not positive.

    ``column`` is the global column (0-based) whose pivot was not positive:
    the leading minor of order ``column + 1`` is not positive definite.
    ``tile`` is the diagonal tile ``(k, k)`` holding it: the I/O unit of the
    stored factor (``to_zarr(tile=...)``), or of a kernel's own tiles.
    """

    def __init__(self, tile: tuple[int, int], column: int):
        self.tile = tuple(tile)
        self.column = int(column)
        super().__init__(
            f"Matrix is not positive definite: the pivot of column {self.column} "
            f"(diagonal tile {self.tile}) is not positive, so the leading minor of "
            f"order {self.column + 1} is not positive definite. Check that the "
            "matrix is symmetric and positive definite, or solve with a general "
            "(LU) method instead of assume_a='pos'."
        )

    def __reduce__(self):  # survives the trip from a worker process
        return (type(self), (self.tile, self.column))


class SingularMatrixError(TilearrayError, LinAlgError):
    """An LU factorisation met an exactly zero pivot: the matrix is singular.

    ``column`` is the global column (0-based) with no nonzero pivot candidate;
    ``panel`` is the index of the column panel being factored. With
    ``triangular``: a triangular solve met a zero at diagonal ``column``.
    """

    def __init__(self, column: int, panel: int = 0, triangular: bool = False):
        self.column = int(column)
        self.panel = int(panel)
        self.triangular = bool(triangular)
        if triangular:  # SciPy's solve_triangular words it so
            super().__init__(f"singular matrix: resolution failed at diagonal {self.column} "
                             "(the triangular matrix has a zero there)")
            return
        super().__init__(
            f"Singular matrix: column {self.column} (panel {self.panel}) has no "
            "nonzero pivot after eliminating the columns to its left, so it is a "
            "linear combination of them. A least-squares solution (lstsq) or "
            "a regularised system may be what you need."
        )

    def __reduce__(self):  # survives the trip from a worker process
        return (type(self), (self.column, self.panel, self.triangular))
class AllNaNSliceError(TilearrayError, ValueError):
    """``np.nanargmin`` / ``np.nanargmax`` over a slice holding only NaNs
    (NumPy's ``ValueError("All-NaN slice encountered")``)."""


# -- bad arguments: ValueError / TypeError, as Python's own, and still the error of
#    their area (``except ClusterError`` keeps catching a bad Engine argument) --------


class ArgumentError(TilearrayError, ValueError):
    """A value passed to tilearray is out of range or malformed."""


class ArgumentTypeError(TilearrayError, TypeError):
    """A value passed to tilearray has the wrong type."""


class ClusterArgumentError(ClusterError, ArgumentError):
    """A bad value for an :class:`~tilearray.Engine` argument."""


class ClusterArgumentTypeError(ClusterError, ArgumentTypeError):
    """An :class:`~tilearray.Engine` argument of the wrong type."""


class StorageArgumentError(StorageError, ArgumentError):
    """A bad value for where or how an array is stored (shape, tile, shard, name, ...)."""


class StorageArgumentTypeError(StorageError, ArgumentTypeError):
    """A storage argument of the wrong type."""


class PlanningArgumentError(PlanningError, ArgumentError):
    """A bad value for an output's layout or the budget (``tile``, ``shard``),
    or operands whose shapes the operation cannot take (a matmul's inner
    dimensions, shapes that do not broadcast)."""


class PlanningArgumentTypeError(PlanningError, ArgumentTypeError):
    """An expression or budget argument of the wrong type (``PlanningError`` is
    already a ``ValueError``)."""


_TYPE_ERROR_OF = {
    ArgumentError: ArgumentTypeError,
    ClusterArgumentError: ClusterArgumentTypeError,
    StorageArgumentError: StorageArgumentTypeError,
    PlanningError: PlanningArgumentTypeError,
    ValueError: TypeError,
}


def type_error_of(error: type) -> type:
    """The class to raise for a value of the wrong type where ``error`` is
    raised for a bad value (``error`` itself when it has no such twin)."""
    return _TYPE_ERROR_OF.get(error, error)
