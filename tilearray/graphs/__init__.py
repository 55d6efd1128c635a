"""Pure functions that turn planned work into dask graph layers, and the task
functions (math kernels) those graphs run on workers. No cluster access."""

from . import elemwise, matmul, reduction, spec
from .blocks import group_edges, split_points

__all__ = ["elemwise", "group_edges", "matmul", "reduction", "spec", "split_points"]
