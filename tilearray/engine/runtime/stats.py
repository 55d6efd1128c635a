"""What a run measured (``x.stats``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from dask.utils import format_bytes


@dataclass
class RunStats:
    """Measured figures of one run (``x.stats`` after ``to_zarr``/``compute``).

    Summed over the run's tasks, as the tasks measured them; compare with the
    projections of :class:`Plan` (``x.plan()``).
    """

    bytes_read: int = 0
    """Decoded bytes read from Zarr stores, in bytes."""
    bytes_written: int = 0
    """Bytes written to the output (and temporaries), in bytes (uncompressed)."""
    read_requests: int = 0
    """Whole-I/O-unit read requests (one Zarr read each)."""
    store_gets: int = 0
    """Store requests those reads made (chunk or shard keys)."""
    read_retries: int = 0
    """Store reads retried after a transient error."""
    tasks: int = 0
    """Tasks that did work (reads, BLAS or writes)."""
    task_retries: int = 0
    """Tasks started again because the worker they were assigned to died
    (running, or queued on it); finished tasks are not rerun."""
    wall_seconds: float = 0.0
    """Wall-clock time of the run, in seconds, as seen by the client."""
    peak_worker_memory: int = 0
    """Largest RSS of any worker process seen during the run, in bytes."""
    io_wait_seconds: float = 0.0
    """Time matmul tasks waited for panel reads, summed over tasks, in seconds."""
    blas_seconds: float = 0.0
    """Time spent in BLAS gemm, summed over tasks, in seconds."""
    skipped_units: int = 0
    """Output units already done (resume) and not recomputed."""
    units_written: int = 0
    """Output (and temporary) I/O units written and marked done by this run."""
    progress_events: int = 0
    """Progress events received from inside running tasks (K panels of matmul
    tasks, TSQR leaves): the progress bar moved between task ends."""
    progress_max_gap: float = 0.0
    """Largest wall-clock gap between advances of the run's progress (whole
    tasks finished or fractions reported), in seconds."""
    per_worker_peak: dict = field(default_factory=dict)
    """Peak RSS of each worker process (address -> bytes)."""

    def __str__(self) -> str:
        return (
            f"{self.tasks} tasks in {self.wall_seconds:.1f} s, read "
            f"{format_bytes(self.bytes_read)} ({self.read_requests} requests), wrote "
            f"{format_bytes(self.bytes_written)}, peak worker memory "
            f"{format_bytes(self.peak_worker_memory)}, retries: {self.task_retries} task(s), "
            f"{self.read_retries} read(s)"
            + (f", {self.skipped_units} unit(s) already done (resumed)"
               if self.skipped_units else "")
        )
