"""Slurm through dask-jobqueue: C = A @ B on Zarr, then the column means of C.

Run this on a login node (or in a small sbatch job of its own): it starts the
dask scheduler here and submits Slurm jobs that each run dask workers, which
connect back to it. Unlike ``examples/slurm.sbatch`` (one MPI job holding the
scheduler, the client and the workers for its whole length), workers come and
go as separate jobs: the computation starts with the first worker, keeps
going when more are granted, and survives a worker job ending (dask reruns
its tasks elsewhere).

    pip install 'tilearray[deploy]'     # dask-jobqueue
    python examples/slurm_jobqueue.py --dir /shared/data --jobs 4 \\
        --memory-per-worker 8GiB --threads-per-worker 4 --workers-per-job 2 \\
        --queue compute --account myproject --walltime 02:00:00

    # see the job script without submitting anything
    python examples/slurm_jobqueue.py --dry-run --memory-per-worker 8GiB --workers-per-job 2

Each Slurm job asks for ``workers-per-job x threads-per-worker`` CPUs and
``workers-per-job x memory-per-worker`` memory and runs that many worker
processes with ``--nthreads threads-per-worker --memory-limit
memory-per-worker``: the budget tilearray plans every task against is the one
Slurm enforces. ``--dir`` must be on a filesystem every node sees. Killed or
out of time? Run it again: inputs are reused and c.zarr resumes where it
stopped.
"""

from __future__ import annotations

import argparse
import os
import sys

from dask.utils import format_bytes, parse_bytes
from distributed import Client

import tilearray as ta


def cluster_options(memory_per_worker, threads_per_worker: int = 1, workers_per_job: int = 1,
                    *, queue=None, account=None, walltime="01:00:00",
                    local_directory=None, python=None, **extra) -> dict:
    """SLURMCluster keywords for ``workers_per_job`` dask workers per Slurm job,
    each with ``threads_per_worker`` threads and ``memory_per_worker`` memory."""
    mem = parse_bytes(memory_per_worker) if isinstance(memory_per_worker, str) \
        else int(memory_per_worker)
    opts = dict(
        cores=threads_per_worker * workers_per_job,      # -> #SBATCH --cpus-per-task
        memory=format_bytes(mem * workers_per_job).replace(" ", ""),  # -> #SBATCH --mem
        processes=workers_per_job,                       # worker processes per job
        queue=queue,
        account=account,
        walltime=walltime,
        # the same interpreter (and venv) on the compute nodes as here
        python=python or sys.executable,
        # worker scratch space on the node (expanded by the job script's shell)
        local_directory=local_directory or "${TMPDIR:-/tmp}",
        job_name="tilearray-worker",
    )
    opts.update(extra)
    return opts


def make_cluster(args, **extra):
    """The SLURMCluster: a scheduler in this process, no job submitted yet."""
    try:
        from dask_jobqueue import SLURMCluster
    except ImportError:
        sys.exit("this example needs dask-jobqueue: pip install 'tilearray[deploy]'")
    return SLURMCluster(**cluster_options(
        args.memory_per_worker, args.threads_per_worker, args.workers_per_job,
        queue=args.queue, account=args.account, walltime=args.walltime, **extra))


def _input(path, n, tile, seed):
    try:
        return ta.open(path)
    except ta.StorageError:  # missing, or left incomplete by a killed run
        return ta.random((n, n), path, tile=(tile, tile), seed=seed, overwrite=True)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dir", default="data/slurm",
                   help="where a.zarr, b.zarr, c.zarr live (a filesystem every node sees)")
    p.add_argument("--n", type=int, default=8192, help="matrix side")
    p.add_argument("--tile", type=int, default=1024, help="tile side")
    p.add_argument("--jobs", type=int, default=2, help="Slurm jobs to keep running")
    p.add_argument("--workers-per-job", type=int, default=1)
    p.add_argument("--memory-per-worker", default="4GiB",
                   help="memory_limit of each worker; the planner fits tasks in it")
    p.add_argument("--threads-per-worker", type=int, default=1)
    p.add_argument("--queue", help="Slurm partition (-p)")
    p.add_argument("--account", help="Slurm account (-A)")
    p.add_argument("--walltime", default="01:00:00")
    p.add_argument("--adapt", action="store_true",
                   help="let dask add and remove jobs (1..--jobs) instead of a fixed count")
    p.add_argument("--dry-run", action="store_true",
                   help="print the worker job script and exit (submits nothing)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    with make_cluster(args) as cluster:
        if args.dry_run:
            print(cluster.job_script())
            return 0
        if args.adapt:
            cluster.adapt(minimum_jobs=1, maximum_jobs=args.jobs)
        else:
            cluster.scale(jobs=args.jobs)
        with Client(cluster) as client:
            # the queue decides when jobs start; begin once one worker is up,
            # the others join the running computation when Slurm starts them
            client.wait_for_workers(1, timeout=3600)
            with ta.Engine(client=client, memory_per_worker=args.memory_per_worker) as engine:
                print(engine, file=sys.stderr)
                os.makedirs(args.dir, exist_ok=True)
                a = _input(os.path.join(args.dir, "a.zarr"), args.n, args.tile, seed=1)
                b = _input(os.path.join(args.dir, "b.zarr"), args.n, args.tile, seed=2)
                out = os.path.join(args.dir, "c.zarr")
                expr = a @ b
                print(expr.plan(out), file=sys.stderr)
                c = expr.to_zarr(out, resume=True)
                print(f"{out}: {c.stats or 'already complete'}", file=sys.stderr)
                means = c.mean(axis=0).compute()
                print(f"column means of C: min {means.min():.6g}, max {means.max():.6g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
