"""What users touch: lazy TiledArray expressions, the planner and the Engine."""

from .cluster import Engine, RunStats, current_engine
from .plan import Budget, Plan, Stage
from .tiled import TiledArray, from_dask, from_numpy, matmul, open, random

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
