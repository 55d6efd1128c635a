"""Batch job on MPI ranks: C = A @ B on Zarr, then the column sums of C.

    # plain MPI: 4 ranks = scheduler (rank 0) + this script's client code (rank 1)
    # + 2 dask workers (ranks 2, 3)
    mpiexec -n 4 python examples/batch_matmul.py

    # the same through tilearray's launcher: a worker rank that dies does not end
    # the job (its tasks are rerun on the others); exits with rank 1's status
    python -m tilearray.engine.mpi -n 4 examples/batch_matmul.py --n 4096

Every rank runs this file and parses the same arguments; ``Engine.mpi()``
returns only on rank 1 (the other ranks serve the cluster there, then exit 0).
Do nothing expensive before it: the other ranks wait for rank 1 to get there.
Inputs are made once (in parallel on the workers) and reused; the product is
written with ``resume=True``, so resubmitting a killed job finishes it without
redoing the blocks already written.
"""

import argparse
import os
import sys

import tilearray as ta


def _input(path, n, tile, seed):
    try:
        return ta.open(path)
    except ta.StorageError:  # missing, or left incomplete by a killed job
        return ta.random((n, n), path, tile=(tile, tile), seed=seed, overwrite=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dir", default="data/batch", help="where a.zarr, b.zarr, c.zarr live "
                   "(a filesystem every node sees)")
    p.add_argument("--n", type=int, default=2048, help="matrix side")
    p.add_argument("--tile", type=int, default=512, help="tile side")
    p.add_argument("--memory-per-worker", default="1GiB",
                   help="memory_limit of each worker rank; the planner fits tasks in it")
    p.add_argument("--threads-per-worker", type=int, default=1)
    args = p.parse_args(argv)

    with ta.Engine.mpi(memory_per_worker=args.memory_per_worker,
                       threads_per_worker=args.threads_per_worker) as engine:
        # from here on only rank 1 runs; leaving the block shuts the cluster down
        print(engine, file=sys.stderr)
        os.makedirs(args.dir, exist_ok=True)
        a = _input(os.path.join(args.dir, "a.zarr"), args.n, args.tile, seed=1)
        b = _input(os.path.join(args.dir, "b.zarr"), args.n, args.tile, seed=2)
        out = os.path.join(args.dir, "c.zarr")
        expr = a @ b
        print(expr.plan(out), file=sys.stderr)  # tasks, memory per task, bytes, FLOPs
        c = expr.to_zarr(out, resume=True)
        print(f"{out}: {c.stats or 'already complete'}", file=sys.stderr)
        colsums = c.sum(axis=0).compute()
        print(f"column sums of C: min {colsums.min():.6g}, max {colsums.max():.6g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
