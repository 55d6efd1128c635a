"""Worker plugins (imported lazily: this module imports distributed)."""

from __future__ import annotations

from distributed import WorkerPlugin


class BlasLimit(WorkerPlugin):
    """Cap BLAS threads so dask threads x BLAS threads <= the worker's cores.

    Registered with the client, so workers that (re)start later get it too.
    """

    name = "tilearray-blas-limit"

    def __init__(self, blas_threads: int):
        self.blas_threads = blas_threads

    def setup(self, worker):
        from threadpoolctl import threadpool_limits

        # kept on the worker so the limit stays in force for its lifetime
        worker._tilearray_blas_limit = threadpool_limits(limits=self.blas_threads)
