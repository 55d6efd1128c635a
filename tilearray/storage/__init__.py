"""Zarr-backed tiled matrices: geometry, create/open/validate, aggregated reads,
whole-unit writes, completion markers. Knows nothing of dask graphs."""

from .array import (
    ArrayRef,
    create,
    done_units,
    grid_of,
    info_attrs,
    is_complete,
    mark_complete,
    open_array,
)
from .geometry import Grid, boundaries, int_pair
from .io import (
    IOStats,
    ReadRequest,
    plan_reads,
    prefetch_region,
    read_region,
    write_block,
    write_fill,
)

__all__ = [
    "ArrayRef",
    "Grid",
    "IOStats",
    "ReadRequest",
    "boundaries",
    "int_pair",
    "create",
    "done_units",
    "grid_of",
    "info_attrs",
    "is_complete",
    "mark_complete",
    "open_array",
    "plan_reads",
    "prefetch_region",
    "read_region",
    "write_block",
    "write_fill",
]
