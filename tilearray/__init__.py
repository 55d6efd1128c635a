"""tilearray: out-of-core tiled matrix compute on Zarr with dask.distributed."""

from . import (
    _config,  # noqa: F401  (registers the tilearray.* dask config defaults)
    linalg,
)
from .engine import (
    Budget,
    Engine,
    Plan,
    RunStats,
    TiledArray,
    eye,
    from_dask,
    from_numpy,
    matmul,
    open,
    random,
)
from .errors import (
    AllNaNSliceError,
    ArgumentError,
    ArgumentTypeError,
    ClusterError,
    CorruptChunkError,
    IncompleteOutputError,
    NotPositiveDefiniteError,
    OutputLockedError,
    PlanningError,
    SingularMatrixError,
    StorageError,
    TilearrayError,
)

__version__ = "0.1.0"

__all__ = [
    "AllNaNSliceError",
    "ArgumentError",
    "ArgumentTypeError",
    "Budget",
    "ClusterError",
    "CorruptChunkError",
    "Engine",
    "IncompleteOutputError",
    "NotPositiveDefiniteError",
    "OutputLockedError",
    "Plan",
    "PlanningError",
    "SingularMatrixError",
    "RunStats",
    "StorageError",
    "TiledArray",
    "TilearrayError",
    "__version__",
    "eye",
    "from_dask",
    "from_numpy",
    "linalg",
    "matmul",
    "open",
    "random",
]
