"""Object-store latency: requests and wall time of a column reduction (and a
matmul) when every store request costs 20-50 ms, as on a cloud bucket.

    python benchmarks/object_store.py [--n 4096] [--tile 256] [--shard 1024]
        [--latency-ms 20 50] [--threads 4] [--repeats 1] [--ops colsum,matmul]

The inputs are sharded Zarr v3 arrays on local disk (``ta.random``, written
once into a temporary directory), read through
``tilearray.testing.stores.LatencyStore``: a zarr store wrapper that sleeps
a uniform 20-50 ms before every read request -- an asyncio sleep, so
requests in flight overlap as they would on the network -- and counts the
requests (data reads; metadata reads are not counted). Same inputs, same thread count:

- tilearray: an in-process Engine (``processes=False``, ``--threads``
  threads) over ``ta.open(LatencyStore(...))``; whole-unit reads, one GET
  per shard.
- dask: ``dask.array.from_zarr`` of the same zarr array (its chunks are the
  inner chunks), the threaded scheduler with ``--threads`` workers.

One Markdown table on stdout: requests, wall time (median of ``--repeats``),
and whether the results agree (``tilearray.testing.assert_close``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time

from zarr.storage import LocalStore

import tilearray as ta
from tilearray.testing import assert_close
from tilearray.testing.stores import LatencyStore, counts, reset_counts


def _reset(*names):
    for name in names:
        reset_counts(name)


def _count(*names):
    return sum(counts(name)["gets"] + counts(name)["exists"] for name in names)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=4096)
    p.add_argument("--tile", type=int, default=256)
    p.add_argument("--shard", type=int, default=1024)
    p.add_argument("--latency-ms", type=float, nargs=2, default=[20.0, 50.0])
    p.add_argument("--threads", type=int, default=4)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--ops", default="colsum,matmul")
    args = p.parse_args(argv)
    lo, hi = (x / 1000 for x in args.latency_ms)
    ops = args.ops.split(",")

    import dask
    import dask.array as da
    import zarr

    tmp = tempfile.mkdtemp(prefix="ta-objbench-")
    n, t, s = args.n, (args.tile,) * 2, (args.shard,) * 2
    ta.random((n, n), f"{tmp}/a.zarr", tile=t, shard=s, seed=0)
    ta.random((n, n), f"{tmp}/b.zarr", tile=t, shard=s, seed=1)

    def store(name):
        return LatencyStore(LocalStore(f"{tmp}/{name}.zarr", read_only=True), name, lo, hi)

    rows = []
    with ta.Engine(n_workers=1, threads_per_worker=args.threads, processes=False,
                   memory_per_worker="8GiB", quiet=True) as eng:
        for op in ops:
            results, times, reqs = {}, {"tilearray": [], "dask": []}, {}
            for _ in range(args.repeats):
                a, b = ta.open(store("a")), ta.open(store("b"))
                expr = a.sum(axis=0) if op == "colsum" else a @ b
                _reset("a", "b")
                t0 = time.perf_counter()
                results["tilearray"] = expr.compute(engine=eng)
                times["tilearray"].append(time.perf_counter() - t0)
                reqs["tilearray"] = _count("a", "b")

                za = zarr.open_array(store("a"), mode="r")
                zb = zarr.open_array(store("b"), mode="r")
                x, y = da.from_zarr(za), da.from_zarr(zb)
                dexpr = x.sum(axis=0) if op == "colsum" else x @ y
                _reset("a", "b")
                t0 = time.perf_counter()
                with dask.config.set(scheduler="threads", num_workers=args.threads):
                    results["dask"] = dexpr.compute()
                times["dask"].append(time.perf_counter() - t0)
                reqs["dask"] = _count("a", "b")
            try:
                assert_close(results["tilearray"], results["dask"])
                agree = "yes"
            except AssertionError:
                agree = "NO"
            for eng_name in ("tilearray", "dask"):
                rows.append((op, eng_name, reqs[eng_name], statistics.median(times[eng_name]),
                             agree))
    print(f"n = {n}, float64, tile {args.tile}, shard {args.shard}, "
          f"latency {args.latency_ms[0]:g}-{args.latency_ms[1]:g} ms per request, "
          f"{args.threads} threads, median of {args.repeats}\n")
    print("| op | engine | requests | wall s | agrees |")
    print("|---|---|---:|---:|---|")
    for op, e, r, w, ok in rows:
        print(f"| {op} | {e} | {r:,} | {w:.2f} | {ok} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
