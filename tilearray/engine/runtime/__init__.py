"""The runtime: the Engine over a dask.distributed Client (an embedded
LocalCluster, an existing cluster, or dask-mpi under mpirun), its worker and
scheduler plugins and metrics. The only place that touches the cluster."""

from .engine import Engine, RunStats, current_engine
from .local import default_budget

__all__ = ["Engine", "RunStats", "current_engine", "default_budget"]
