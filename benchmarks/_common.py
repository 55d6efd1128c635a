"""Shared helpers for the side-by-side benchmarks (not part of the tilearray package).

- :class:`RSSSampler` samples the resident set size of a set of processes every
  0.2 s with psutil and keeps each one's peak;
- :func:`local_cluster` starts a plain dask ``LocalCluster`` shaped like a
  tilearray ``Engine`` (n workers x 1 thread, ``memory_limit`` per worker);
- :func:`worker_pids`, :func:`read_chars`, :func:`write_chars`,
  :func:`max_rss_of_workers` query
  worker processes (``client.run``);
- :func:`run_in_child` runs a function in a fresh spawned process while
  sampling its RSS (used for the NumPy and raw-zarr baselines);
- :func:`markdown_table` and :func:`log` for output (tables on stdout,
  progress on stderr).
"""

from __future__ import annotations

import contextlib
import logging
import math
import multiprocessing as mp
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import psutil

# Keep module-level imports light: spawned children (NumPy / raw-zarr baselines)
# import this module and their RSS is part of what is measured.


def parse_bytes(s: int | str) -> int:
    from dask.utils import parse_bytes as _pb

    return int(s) if isinstance(s, int | float) else int(_pb(s))


def format_bytes(n: int) -> str:
    from dask.utils import format_bytes as _fb

    return _fb(int(n))

__all__ = [
    "RSSSampler",
    "cubed_spec",
    "concurrent_dgemm_gflops",
    "dgemm_gflops",
    "dir_size",
    "fmt_bytes",
    "fmt_num",
    "local_cluster",
    "log",
    "markdown_table",
    "max_rss_of_workers",
    "parse_bytes",
    "read_chars",
    "run_in_child",
    "warm_workers",
    "worker_pids",
    "write_chars",
]

_T0 = time.perf_counter()

# The environment as the benchmark was started. distributed's Nanny writes its
# ``pre-spawn-environ`` (OMP/MKL/OPENBLAS_NUM_THREADS=1, MALLOC_TRIM_THRESHOLD_)
# into *this* process's os.environ when a LocalCluster starts, and it stays
# there; children spawned later would inherit single-threaded BLAS.
# run_in_child spawns with this original environment instead.
_INITIAL_ENV = dict(os.environ)


def log(msg: str) -> None:
    """Progress line on stderr, with seconds since start."""
    print(f"[{time.perf_counter() - _T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


def fmt_bytes(n: int | float | None) -> str:
    if n is None or (isinstance(n, float) and math.isnan(n)):
        return "—"
    return format_bytes(int(n))


def fmt_num(x: float | None, fmt: str = ".2f") -> str:
    if x is None or (isinstance(x, float) and (math.isnan(x) or math.isinf(x))):
        return "—"
    return format(x, fmt)


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    rows = [[("—" if c is None else str(c)) for c in r] for r in rows]
    widths = [len(h) for h in headers]
    for r in rows:
        for i, c in enumerate(r):
            widths[i] = max(widths[i], len(c))

    def line(cells):
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    out = [line(headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(r) for r in rows]
    return "\n".join(out)


def dir_size(path: str) -> int:
    """Bytes on disk under ``path`` (file sizes, not blocks)."""
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(dirpath, f)).st_size
    return total


def evict(*paths: str | None) -> None:
    """Drop the files under ``paths`` from the OS page cache
    (``POSIX_FADV_DONTNEED``; clean pages only, no privileges needed), so the
    next engine reads them from disk like the first did."""
    if not hasattr(os, "posix_fadvise"):
        return
    for path in paths:
        for dirpath, _, files in os.walk(path or ""):
            for f in files:
                with contextlib.suppress(OSError):
                    fd = os.open(os.path.join(dirpath, f), os.O_RDONLY)
                    try:
                        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    finally:
                        os.close(fd)


def dgemm_gflops(n: int = 2048, threads: int = 1, repeats: int = 3) -> float:
    """Best-of-``repeats`` GFLOP/s of an n x n dgemm in this process with
    ``threads`` BLAS threads: a machine-speed check (the host is shared)."""
    import numpy as np
    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((n, n)), rng.standard_normal((n, n))
    c = np.empty((n, n))
    best = math.inf
    with threadpool_limits(threads):
        for _ in range(repeats):
            t0 = time.perf_counter()
            np.matmul(a, b, out=c)
            best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best / 1e9


def _gemm_rate(barrier, seconds: float, n: int) -> float:
    """GFLOP/s of one-thread ``n x n x 512`` dgemm updates (a Cholesky tile
    update's shape) run for ``seconds`` after every process reached ``barrier``."""
    import numpy as np
    from scipy.linalg import blas
    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(0)
    p = np.asfortranarray(rng.standard_normal((n, 512)))
    c = np.zeros((n, n), order="F")
    calls = 0
    with threadpool_limits(1):
        barrier.wait()
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            c = blas.dgemm(-1.0, p, p, 1.0, c, trans_b=True, overwrite_c=True)
            calls += 1
        dt = time.perf_counter() - t0
    return 2 * n * n * 512 * calls / dt / 1e9


def concurrent_dgemm_gflops(procs: int = 2, seconds: float = 5.0, n: int = 4096) -> list[float]:
    """Each of ``procs`` fresh processes' one-thread dgemm GFLOP/s, all running
    at once for ``seconds``: the machine's gemm throughput as one-thread
    workers see it (two vCPUs of a shared host may be one physical core's
    hyperthreads, sharing its vector units: then the sum is one core's rate)."""
    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager:
        barrier = manager.Barrier(procs)
        with ctx.Pool(procs) as pool:
            return pool.starmap(_gemm_rate, [(barrier, seconds, n)] * procs)


# -- RSS sampling ----------------------------------------------------------------------


class RSSSampler:
    """Samples the RSS of ``pids`` every ``interval`` seconds in a thread.

    Use as a context manager; ``peaks`` maps pid -> largest RSS seen (bytes),
    ``peak`` is the largest over all pids. A process that exits keeps the
    peak it had while alive. ``pids`` may also be a callable returning pids
    (re-evaluated each tick, e.g. for a child process not started yet).
    """

    def __init__(self, pids: Iterable[int] | Callable[[], Iterable[int]], interval: float = 0.2):
        self._pids = pids
        self.interval = interval
        self.peaks: dict[int, int] = {}
        self.samples = 0
        self._procs: dict[int, psutil.Process] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="bench-rss")

    def _current_pids(self) -> list[int]:
        p = self._pids() if callable(self._pids) else self._pids
        return [int(x) for x in (p or ())]

    def sample(self) -> None:
        for pid in self._current_pids():
            proc = self._procs.get(pid)
            try:
                if proc is None:
                    proc = self._procs[pid] = psutil.Process(pid)
                rss = proc.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            self.peaks[pid] = max(self.peaks.get(pid, 0), rss)
        self.samples += 1

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def __enter__(self) -> RSSSampler:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sample()

    @property
    def peak(self) -> int:
        return max(self.peaks.values(), default=0)


# -- dask clusters -----------------------------------------------------------------------


def local_cluster(n_workers: int, memory_limit: int | str, *, threads_per_worker: int = 1):
    """A plain dask LocalCluster + Client with the Engine's shape.

    dask's own worker memory settings (spill at 60 %, pause at 80 %,
    terminate at 95 % of ``memory_limit``) are left at their defaults: this
    is what a dask user gets. The nanny sets OMP/MKL/OPENBLAS_NUM_THREADS=1 in
    the workers (dask's ``distributed.nanny.pre-spawn-environ``), so BLAS runs
    one thread per worker -- as tilearray's BlasLimit does with 1 thread per
    core.
    """
    from distributed import Client, LocalCluster

    cluster = LocalCluster(
        n_workers=n_workers,
        threads_per_worker=threads_per_worker,
        memory_limit=memory_limit,
        processes=True,
        dashboard_address=None,
        silence_logs=logging.ERROR,
    )
    client = Client(cluster, set_as_default=False)
    return cluster, client


def _import_modules(names):
    import importlib

    for n in names:
        importlib.import_module(n)
    return os.getpid()


def warm_workers(client, modules: Sequence[str]) -> None:
    """Import ``modules`` on every worker so that their file reads are not
    counted in a measured run."""
    client.run(_import_modules, list(modules))


def worker_pids(client) -> list[int]:
    return sorted(client.run(os.getpid).values())


def _io_chars(field: str) -> int:
    """This process's ``read_chars`` or ``write_chars``, or -1 where unknown."""
    try:
        return getattr(psutil.Process().io_counters(), field)
    except Exception:
        return -1


def read_chars(client=None) -> int:
    """Sum of ``read_chars`` (Linux rchar: bytes returned by read syscalls,
    page-cache hits included) over the workers, or this process if no client."""
    return _summed_chars("read_chars", client)


def write_chars(client=None) -> int:
    """Sum of ``write_chars`` (Linux wchar: bytes passed to write syscalls, to
    the page cache or not; dask's spill files included) over the workers, or
    this process if no client."""
    return _summed_chars("write_chars", client)


def _summed_chars(field: str, client) -> int:
    if client is None:
        return _io_chars(field)
    vals = client.run(_io_chars, field).values()
    return -1 if any(v < 0 for v in vals) else sum(vals)


def _ru_maxrss() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def max_rss_of_workers(client) -> int:
    """Largest lifetime peak RSS (getrusage ru_maxrss) over the worker processes."""
    return max(client.run(_ru_maxrss).values(), default=0)


# -- cubed on a dask cluster ------------------------------------------------------------


def patch_cubed_dask_memory_check(client, allowed_mem) -> None:
    """Work around cubed's DaskExecutor memory check on this distributed version.

    cubed 0.27 checks ``memory_limit // nthreads >= allowed_mem`` on a fresh
    *asynchronous* Client whose cached ``scheduler_info()`` has no workers yet
    (distributed 2026.x), so it always raises "Cluster has no workers running".
    Do the same check here with the synchronous client, then skip cubed's.
    """
    import cubed.runtime.executors.dask as cdask

    workers = client.scheduler_info(n_workers=-1)["workers"].values()
    runtime = min(w["memory_limit"] // w["nthreads"] for w in workers)
    if runtime < parse_bytes(allowed_mem):
        raise ValueError(f"runtime memory {runtime} < allowed_mem {allowed_mem}")
    cdask.check_runtime_memory = lambda spec, client: None


def cubed_spec(cluster, client, work_dir: str, allowed_mem):
    """A cubed Spec running on ``cluster`` (DaskExecutor) with ``allowed_mem``
    per task and intermediates under ``work_dir``."""
    import cubed
    from cubed.runtime.executors.dask import DaskExecutor

    patch_cubed_dask_memory_check(client, allowed_mem)
    return cubed.Spec(
        work_dir=work_dir, allowed_mem=parse_bytes(allowed_mem),
        executor=DaskExecutor(compute_kwargs={"address": cluster.scheduler_address}),
    )


# -- child processes --------------------------------------------------------------------


def _child_main(conn, fn, args, kwargs):
    try:
        rc0 = _io_chars("read_chars")
        out = fn(*args, **kwargs)
        out = dict(out or {})
        out["read_chars"] = _io_chars("read_chars") - rc0
        out["ru_maxrss"] = _ru_maxrss()
        conn.send(("ok", out))
    except BaseException as e:  # report, never hang the parent
        conn.send(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
    finally:
        conn.close()


def run_in_child(fn: Callable, *args, interval: float = 0.2, **kwargs) -> dict:
    """Run ``fn(*args, **kwargs)`` (which returns a dict) in a fresh spawned
    process, sampling its RSS every ``interval`` s from here.

    Returns fn's dict plus ``peak_rss`` (sampled), ``ru_maxrss`` (the child's
    exact lifetime peak), ``read_chars`` (its rchar during ``fn``) and
    ``wall_seconds`` (of the whole child, start-up included). Raises
    RuntimeError with the child's traceback if ``fn`` failed.
    """
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child_main, args=(child, fn, args, kwargs), daemon=False)
    t0 = time.perf_counter()
    with RSSSampler(lambda: [proc.pid] if proc.pid else [], interval) as sampler:
        saved = dict(os.environ)
        try:
            os.environ.clear()
            os.environ.update(_INITIAL_ENV)
            proc.start()
        finally:
            os.environ.clear()
            os.environ.update(saved)
        child.close()
        msg = None
        while msg is None:
            if parent.poll(0.5):
                try:
                    msg = parent.recv()
                except EOFError:
                    break
            elif not proc.is_alive():
                break
    proc.join(timeout=60)
    wall = time.perf_counter() - t0
    if msg is None:
        raise RuntimeError(f"child process died with exit code {proc.exitcode}")
    status, payload = msg
    if status != "ok":
        raise RuntimeError(payload)
    payload["peak_rss"] = sampler.peak
    payload["child_wall_seconds"] = wall
    return payload


def plain_inputs(data_dir: str, n: int, dtype: str = "float64", tile: int = 2048
                 ) -> tuple[str, str]:
    """Two n x n inputs ``a``, ``b`` written by plain Zarr (its default codecs:
    bytes + zstd level 0), standard normal, generated band by band under
    ``data_dir/inputs``; reused when present (shared by the benchmarks)."""
    import numpy as np
    import zarr

    d = os.path.join(data_dir, "inputs")
    os.makedirs(d, exist_ok=True)
    paths = []
    for name, seed in (("a", 0), ("b", 1)):
        p = os.path.join(d, f"{name}_n{n}_{dtype}_t{tile}_plainzarr.zarr")
        paths.append(p)
        try:
            x = zarr.open_array(p, mode="r")
            ok = (x.shape == (n, n) and x.dtype == np.dtype(dtype)
                  and tuple(x.chunks) == (tile, tile) and x.attrs.get("bench-seed") == seed)
        except Exception:
            ok = False
        if ok:
            log(f"reusing {p}")
            continue
        t0 = time.perf_counter()
        z = zarr.create_array(p, shape=(n, n), chunks=(tile, tile), dtype=dtype,
                              overwrite=True)
        for r0 in range(0, n, tile):
            r1 = min(r0 + tile, n)
            rng = np.random.default_rng([seed, r0])
            z[r0:r1, :] = rng.standard_normal((r1 - r0, n)).astype(dtype)
        z.attrs["bench-seed"] = seed  # written last: a killed generation is redone
        log(f"generated {p} (plain zarr, {z.compressors}) in {time.perf_counter() - t0:.1f} s")
    return paths[0], paths[1]
