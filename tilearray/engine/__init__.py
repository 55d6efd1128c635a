"""What users touch: lazy TiledArray expressions, the planner and the Engine."""

from . import npfuncs  # noqa: F401  (registers NumPy functions for __array_function__)
from .cluster import Engine, RunStats, current_engine
from .constructors import from_dask, from_numpy, open, random
from .plan import Budget, Plan, Stage
from .tiled import TiledArray, matmul

__all__ = [
    "Budget",
    "Engine",
    "Plan",
    "RunStats",
    "Stage",
    "TiledArray",
    "current_engine",
    "from_dask",
    "from_numpy",
    "matmul",
    "open",
    "random",
]
