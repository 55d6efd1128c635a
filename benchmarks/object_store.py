"""Object-store latency: requests and wall time of a column reduction (and a
matmul) when every store request costs 20-50 ms, as on a cloud bucket.

    python benchmarks/object_store.py [--n 4096] [--tile 256] [--shard 1024]
        [--latency-ms 20 50] [--threads 4] [--repeats 1] [--ops colsum,matmul]
        [--engines tilearray,dask,xarray]

The inputs are two sharded Zarr v3 arrays on local disk (``ta.random``,
written once into a temporary directory) as members ``a`` (dims ``i, k``)
and ``b`` (dims ``k, j``) of one Zarr group -- a group so that xarray can
open them -- read through ``tilearray.testing.stores.LatencyStore``: a zarr
store wrapper that sleeps a uniform 20-50 ms before every read request --
an asyncio sleep, so requests in flight overlap as they would on the
network -- and counts the requests (reads of data keys, and existence
checks; metadata reads are not counted). Every engine reads the same members
through the same wrapper, with the same thread count; opening (metadata) is
not timed, nor counted:

- tilearray: an in-process Engine (``processes=False``, ``--threads``
  threads) over ``ta.open(LatencyStore(...), "a")``; whole-unit reads, one
  GET per shard.
- dask: ``dask.array.from_zarr`` of the same zarr arrays (its chunks are the
  inner chunks), ``x.sum(axis=0)`` and ``x @ y``; the threaded scheduler
  with ``--threads`` workers.
- xarray: ``xr.open_zarr(LatencyStore(...))`` with its default chunks
  (``chunks={}``: the engine's preferred chunks, which for zarr are the
  inner chunks), ``ds.a.sum(dim="i")`` and ``ds.a @ ds.b`` (``xr.dot`` over
  the shared dimension ``k``), computed with ``.values`` on dask's threaded
  scheduler with ``--threads`` workers.

One Markdown table on stdout: requests, wall time (median of ``--repeats``),
and whether the result matches NumPy's on the same inputs (read from disk
without the latency wrapper; ``tilearray.testing.assert_close``).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np
from zarr.storage import LocalStore

import tilearray as ta
from tilearray.testing import assert_close
from tilearray.testing.stores import LatencyStore, counts, reset_counts

ENGINES = ("tilearray", "dask", "xarray")
OPS = ("colsum", "matmul")


def _requests(name):
    c = counts(name)
    return c["gets"] + c["exists"]


# Each runner opens the inputs (metadata only) and returns a function that
# computes the op to a NumPy array: what is timed and counted.

def _tilearray(op, store, args, eng):
    a, b = ta.open(store, "a"), ta.open(store, "b")
    expr = a.sum(axis=0) if op == "colsum" else a @ b
    return lambda: expr.compute(engine=eng)


def _dask(op, store, args, eng):
    import dask
    import dask.array as da
    import zarr

    x = da.from_zarr(zarr.open_array(store, path="a", mode="r"))
    y = da.from_zarr(zarr.open_array(store, path="b", mode="r"))
    expr = x.sum(axis=0) if op == "colsum" else x @ y

    def run():
        with dask.config.set(scheduler="threads", num_workers=args.threads):
            return expr.compute()
    return run


def _xarray(op, store, args, eng):
    import dask
    import xarray as xr

    ds = xr.open_zarr(store)  # chunks={} (the default): the zarr inner chunks
    expr = ds.a.sum(dim="i") if op == "colsum" else ds.a @ ds.b

    def run():
        with dask.config.set(scheduler="threads", num_workers=args.threads):
            return expr.values
    return run


RUNNERS = {"tilearray": _tilearray, "dask": _dask, "xarray": _xarray}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=4096)
    p.add_argument("--tile", type=int, default=256)
    p.add_argument("--shard", type=int, default=1024)
    p.add_argument("--latency-ms", type=float, nargs=2, default=[20.0, 50.0])
    p.add_argument("--threads", type=int, default=4)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--ops", default=",".join(OPS),
                   help="comma-separated subset of " + ",".join(OPS))
    p.add_argument("--engines", default=",".join(ENGINES),
                   help="comma-separated subset of " + ",".join(ENGINES))
    args = p.parse_args(argv)
    lo, hi = (x / 1000 for x in args.latency_ms)
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    if bad := [o for o in ops if o not in OPS]:
        p.error(f"unknown op(s) {bad}; choose from {OPS}")
    if bad := [e for e in engines if e not in RUNNERS]:
        p.error(f"unknown engine(s) {bad}; choose from {ENGINES}")

    import zarr

    tmp = tempfile.mkdtemp(prefix="ta-objbench-")
    path = f"{tmp}/inputs.zarr"
    try:
        n, t, s = args.n, (args.tile,) * 2, (args.shard,) * 2
        ta.random((n, n), path, name="a", dims=("i", "k"), tile=t, shard=s, seed=0)
        ta.random((n, n), path, name="b", dims=("k", "j"), tile=t, shard=s, seed=1)

        def store():
            return LatencyStore(LocalStore(path, read_only=True), "inputs", lo, hi)

        rows = []
        with ta.Engine(n_workers=1, threads_per_worker=args.threads, processes=False,
                       memory_per_worker="8GiB", quiet=True) as eng:
            for op in ops:
                plain = LocalStore(path, read_only=True)  # NumPy's reference: no latency
                a = zarr.open_array(plain, path="a", mode="r")[...]
                ref = a.sum(axis=0) if op == "colsum" else a @ zarr.open_array(
                    plain, path="b", mode="r")[...]
                del a
                times = {e: [] for e in engines}
                reqs, agree = {}, {}
                for _ in range(args.repeats):
                    for e in engines:  # interleaved: every engine once per round
                        run = RUNNERS[e](op, store(), args, eng)
                        reset_counts("inputs")
                        t0 = time.perf_counter()
                        result = run()
                        times[e].append(time.perf_counter() - t0)
                        reqs[e] = _requests("inputs")
                        try:
                            assert_close(np.asarray(result), ref)
                            agree[e] = agree.get(e, "yes")
                        except AssertionError:
                            agree[e] = "NO"
                        del result
                for e in engines:
                    rows.append((op, e, reqs[e], statistics.median(times[e]), agree[e]))
                del ref
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"n = {n}, float64, tile {args.tile}, shard {args.shard}, "
          f"latency {args.latency_ms[0]:g}-{args.latency_ms[1]:g} ms per request, "
          f"{args.threads} threads, median of {args.repeats}\n")
    print("| op | engine | requests | wall s | matches NumPy |")
    print("|---|---|---:|---:|---|")
    for op, e, r, w, ok in rows:
        print(f"| {op} | {e} | {r:,} | {w:.2f} | {ok} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
