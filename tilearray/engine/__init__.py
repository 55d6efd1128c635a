"""What users touch: lazy TiledArray expressions, the planner and the Engine."""

from .array import TiledArray
from .constructors import eye, from_dask, from_numpy, open, random
from .expr import npfuncs  # noqa: F401  (registers NumPy functions for __array_function__)
from .expr.ops import matmul
from .plan import Budget, Plan, Stage
from .runtime import Engine, RunStats, current_engine

__all__ = [
    "Budget",
    "Engine",
    "Plan",
    "RunStats",
    "Stage",
    "TiledArray",
    "current_engine",
    "eye",
    "from_dask",
    "from_numpy",
    "matmul",
    "open",
    "random",
]
