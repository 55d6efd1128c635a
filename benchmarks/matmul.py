"""Side-by-side out-of-core matmul: tilearray vs dask.array vs NumPy vs cubed.

    python benchmarks/matmul.py --n 8192 --dtype float64 --memory-per-worker 1GiB \
        --workers 2 [--repeats 3] [--data-dir DIR] [--engines tilearray,dask,numpy,cubed]

Generates two n x n inputs once with plain Zarr (chunks 2048x2048, Zarr's
default codecs: bytes + zstd level 0) under ``--data-dir`` (reused when present with the same shape, dtype
and tile), then runs C = A @ B -> Zarr with each engine, each on its own
cluster (closed after), and prints one Markdown table on stdout:

* wall time (s) and GFLOP/s (2 n^3 / wall) of read + multiply + write;
* ratio to NumPy's multiply-only time (both operands in RAM, all cores);
* peak RSS per worker, sampled every 0.2 s with psutil over the worker
  processes (for NumPy: the process doing the work), plus getrusage's exact
  lifetime peak (``ru_maxrss``) of the same processes;
* bytes read: tilearray's measured ``RunStats.bytes_read`` (decoded bytes);
  for the others a model from chunk counts (decoded bytes, stated in the row),
  and its ratio to the I/O lower bound 2 m n k / sqrt(M / itemsize) *
  itemsize with M = memory per worker;
* rchar: bytes the workers really pulled through read syscalls (Linux
  ``/proc/<pid>/io`` rchar, i.e. compressed chunk files, page-cache hits
  included), a cross-check of the model;
* check: the result matches ``A[rows, :] @ B[:, cols]`` computed with NumPy on
  sampled blocks (and, for tilearray, NumPy's stored result on those blocks).

The inputs mostly sit in the page cache (RAM >> data), but this machine's
kernel pages out cold page-cache pages (DAMON "pageout"): chunks not read for
a while come from disk again, for every engine alike.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import sys
import time
import traceback

import numpy as np

# heavy modules (tilearray, dask, distributed, cubed, zarr) are imported
# lazily: the NumPy baseline runs in a spawned child that re-imports this file.
from _common import (
    RSSSampler,
    cubed_spec,
    dgemm_gflops,
    dir_size,
    fmt_bytes,
    fmt_num,
    local_cluster,
    log,
    markdown_table,
    max_rss_of_workers,
    parse_bytes,
    plain_inputs,
    read_chars,
    run_in_child,
    warm_workers,
    worker_pids,
)

ENGINES = ("tilearray", "tilearray-fewest-read", "dask", "numpy", "cubed")


# -- inputs ---------------------------------------------------------------------------


def ensure_inputs(args) -> tuple[str, str]:
    return plain_inputs(args.data_dir, args.n, args.dtype, args.tile)


# -- engines --------------------------------------------------------------------------


def run_tilearray(args, a_path, b_path, out_path, margin=None) -> dict:
    """tilearray's run (``margin``: ``tilearray.planner.read-margin`` for it)."""
    import dask

    import tilearray as ta

    with dask.config.set({} if margin is None else {"tilearray.planner.read-margin": margin}):
        return _run_tilearray(ta, args, a_path, b_path, out_path)


def run_tilearray_fewest_read(args, a_path, b_path, out_path) -> dict:
    """tilearray on the layout that reads least (read margin 0), next to the
    default's (more tasks within the margin); skipped when they are the same."""
    import dask

    import tilearray as ta

    budget = ta.Budget.from_config(args.memory_per_worker, args.workers, 1)
    expr = ta.open(a_path) @ ta.open(b_path)
    chosen = expr.plan(out_path, budget=budget)
    with dask.config.set({"tilearray.planner.read-margin": 0}):
        fewest = expr.plan(out_path, budget=budget)
    if (chosen.tasks, chosen.bytes_read) == (fewest.tasks, fewest.bytes_read):
        return {"skipped": f"same layout as tilearray ({chosen.tasks} tasks): nothing traded "
                           "within the read margin"}
    return run_tilearray(args, a_path, b_path, out_path, margin=0)


def _run_tilearray(ta, args, a_path, b_path, out_path) -> dict:
    with ta.Engine(n_workers=args.workers, memory_per_worker=args.memory_per_worker,
                   quiet=True) as eng:
        warm_workers(eng.client, ["tilearray.graphs.matmul", "tilearray.storage.io",
                                  "scipy.linalg", "zarr", "numcodecs"])
        log(f"tilearray BLAS per worker: {eng.blas_report()}")
        pids = worker_pids(eng.client)
        expr = ta.open(a_path) @ ta.open(b_path)
        plan = expr.plan(out_path)
        log("tilearray plan:\n" + str(plan))
        rc0 = read_chars(eng.client)
        with RSSSampler(pids) as rss:
            t0 = time.perf_counter()
            c = expr.to_zarr(out_path, overwrite=True)
            wall = time.perf_counter() - t0
        rc = read_chars(eng.client) - rc0
        st = c.stats
        log(f"tilearray stats: {st}; io_wait {st.io_wait_seconds:.1f} s, "
            f"blas {st.blas_seconds:.1f} s (summed over tasks); engine's own peak "
            f"{fmt_bytes(st.peak_worker_memory)}")
        return dict(
            wall=wall, peak_rss=rss.peak, ru_maxrss=max_rss_of_workers(eng.client),
            bytes_read=st.bytes_read, bytes_src="measured, RunStats", rchar=rc,
            task_memory=plan.budget.task_memory,
            notes=(f"plan: {plan.tasks} tasks, {fmt_bytes(plan.bytes_read)} read, peak/task "
                   f"{fmt_bytes(plan.peak_task_memory)}; io_wait {st.io_wait_seconds:.0f} s, "
                   f"BLAS {st.blas_seconds:.0f} s (task sums); progress bar: "
                   f"{st.progress_events} in-task events, largest gap "
                   f"{st.progress_max_gap:.1f} s"),
        )


def _dask_getters_fused(x) -> bool:
    """True if dask fused the zarr getters into the matmul tasks (each chunk is
    then read once per task that uses it, instead of once and shared)."""
    import dask

    (opt,) = dask.optimize(x)
    names = {k[0] if isinstance(k, tuple) else k for k in dict(opt.__dask_graph__())}
    return not any("from-zarr" in n and not n.startswith("original-") for n in names)


def run_dask(args, a_path, b_path, out_path) -> dict:
    import dask
    import dask.array as da

    cluster, client = local_cluster(args.workers, args.memory_per_worker)
    try:
        warm_workers(client, ["dask.array", "zarr", "numcodecs", "numpy"])
        pids = worker_pids(client)
        A, B = da.from_zarr(a_path), da.from_zarr(b_path)
        C = A @ B
        fused = _dask_getters_fused(C)
        n, c = args.n, args.tile
        s = np.dtype(args.dtype).itemsize
        passes = math.ceil(n / c) if fused else 1
        model = 2 * n * n * s * passes
        log(f"dask: {len(dict(C.__dask_graph__()))} tasks before optimisation; getters "
            f"{'fused into the per-(i,j,k) products' if fused else 'separate'} -> "
            f"each input read {passes}x")
        rc0 = read_chars(client)
        with RSSSampler(pids) as rss, dask.config.set(scheduler=client):
            t0 = time.perf_counter()
            C.to_zarr(out_path, overwrite=True)
            wall = time.perf_counter() - t0
        rc = read_chars(client) - rc0
        return dict(
            wall=wall, peak_rss=rss.peak, ru_maxrss=max_rss_of_workers(client),
            bytes_read=model,
            bytes_src=f"model: 2n²·s × {passes} (getters {'fused' if fused else 'shared'})",
            rchar=rc, notes=f"chunks {c}x{c}, dask default spill/pause thresholds",
        )
    finally:
        client.close()
        cluster.close()


def _numpy_child(a_path, b_path, out_path, tile, repeats=1):
    """Runs in a fresh process: load both with zarr, multiply, store with zarr.
    The multiply is repeated ``repeats`` times into the same output (no extra
    memory); ``mul`` is the fastest, ``wall`` counts the first."""
    import zarr
    from threadpoolctl import threadpool_info

    t0 = time.perf_counter()
    A = zarr.open_array(a_path, mode="r")[...]
    B = zarr.open_array(b_path, mode="r")[...]
    t1 = time.perf_counter()
    C = A @ B
    t2 = time.perf_counter()
    muls = [t2 - t1]
    for _ in range(repeats - 1):
        t = time.perf_counter()
        np.matmul(A, B, out=C)
        muls.append(time.perf_counter() - t)
    t2b = time.perf_counter()
    z = zarr.create_array(out_path, shape=C.shape, dtype=C.dtype, chunks=(tile, tile),
                          overwrite=True)
    z[...] = C
    t3 = time.perf_counter()
    blas = [(i.get("internal_api"), i.get("num_threads")) for i in threadpool_info()]
    return dict(load=t1 - t0, mul=min(muls), muls=muls, store=t3 - t2b,
                wall=(t1 - t0) + muls[0] + (t3 - t2b), blas=blas)


def run_numpy(args, a_path, b_path, out_path) -> dict:
    r = run_in_child(_numpy_child, a_path, b_path, out_path, args.tile, args.numpy_repeats)
    s = np.dtype(args.dtype).itemsize
    log(f"numpy: load {r['load']:.1f} s, multiply {[round(m, 1) for m in r['muls']]} s, "
        f"store {r['store']:.1f} s;"
        f" BLAS {r['blas']}")
    return dict(
        wall=r["wall"], mul=r["mul"], peak_rss=r["peak_rss"], ru_maxrss=r["ru_maxrss"],
        bytes_read=2 * args.n * args.n * s, bytes_src="model: 2n²·s (one pass)",
        rchar=r["read_chars"],
        notes=(f"1 process, all cores; load {r['load']:.1f} s + multiply {r['muls'][0]:.1f} s"
               f" + store {r['store']:.1f} s"),
    )


def run_cubed(args, a_path, b_path, out_path) -> dict:
    import cubed
    import cubed.array_api as xp

    work = os.path.join(args.data_dir, "cubed-work")
    shutil.rmtree(work, ignore_errors=True)
    cluster, client = local_cluster(args.workers, args.memory_per_worker)
    try:
        warm_workers(client, ["cubed", "zarr", "numcodecs", "numpy"])
        pids = worker_pids(client)
        spec = cubed_spec(cluster, client, work, args.memory_per_worker)
        A = cubed.from_zarr(a_path, spec=spec)
        B = cubed.from_zarr(b_path, spec=spec)
        store = cubed.to_zarr(xp.matmul(A, B), out_path, compute=False)
        fp = store.plan()
        ops = [(d.get("op_name"), d["primitive_op"].num_tasks,
                fmt_bytes(d["primitive_op"].projected_mem))
               for _, d in fp.dag.nodes(data=True)
               if d.get("type") == "op" and d.get("primitive_op") is not None]
        inter = fp.total_intermediate_nbytes
        log(f"cubed plan: {fp.num_tasks} tasks, max projected mem "
            f"{fmt_bytes(fp.max_projected_mem)}, intermediates {fmt_bytes(inter)}; ops {ops}")
        n, c = args.n, args.tile
        s = np.dtype(args.dtype).itemsize
        passes = math.ceil(n / c)
        # blockwise partial products read each input chunk n/c times; partials
        # not fused into the sum are written to work_dir and read back once
        model = 2 * n * n * s * passes + inter
        rc0 = read_chars(client)
        with RSSSampler(pids) as rss:
            t0 = time.perf_counter()
            store.compute(_return_in_memory_array=False)
            wall = time.perf_counter() - t0
        rc = read_chars(client) - rc0
        return dict(
            wall=wall, peak_rss=rss.peak, ru_maxrss=max_rss_of_workers(client),
            bytes_read=model,
            bytes_src=f"model: 2n²·s × {passes} + intermediates {fmt_bytes(inter)}",
            rchar=rc, notes=(f"allowed_mem {args.memory_per_worker}, dask executor, "
                             f"{fp.num_tasks} tasks, projected {fmt_bytes(fp.max_projected_mem)}"
                             "/task"),
        )
    finally:
        client.close()
        cluster.close()
        shutil.rmtree(work, ignore_errors=True)


RUNNERS = {"tilearray": run_tilearray, "tilearray-fewest-read": run_tilearray_fewest_read,
           "dask": run_dask, "numpy": run_numpy, "cubed": run_cubed}


# -- verification -----------------------------------------------------------------------


def verify(args, a_path, b_path, outs: dict, n_blocks: int = 4, bs: int = 256) -> dict:
    """Compare each engine's stored C with NumPy ``A[r,:] @ B[:,c]`` on sampled
    blocks; tilearray is also compared with NumPy's stored result. Tolerance: the
    project's one comparison helper, relative to the result's scale."""
    import zarr

    from tilearray.testing import assert_close

    n = args.n
    bs = min(bs, n)
    rng = np.random.default_rng(12345)
    A = zarr.open_array(a_path, mode="r")
    B = zarr.open_array(b_path, mode="r")
    blocks = [(int(rng.integers(0, n - bs + 1)), int(rng.integers(0, n - bs + 1)))
              for _ in range(n_blocks)]
    blocks[0] = (n - bs, n - bs)  # include the last (possibly ragged) corner
    refs = [A[r:r + bs, :] @ B[:, c:c + bs] for r, c in blocks]
    res = {}
    stored = {}
    for eng, path in outs.items():
        try:
            z = zarr.open_array(path, mode="r")
            stored[eng] = [z[r:r + bs, c:c + bs] for r, c in blocks]
        except Exception as e:
            res[eng] = f"cannot open result: {type(e).__name__}"
    def close(got, want) -> bool:
        try:
            for g, w in zip(got, want, strict=True):
                assert_close(g, w)
            return True
        except AssertionError:
            return False

    for eng, got in stored.items():
        err = max(float(np.max(np.abs(g - ref))) for g, ref in zip(got, refs, strict=True))
        txt = f"{'ok' if close(got, refs) else 'MISMATCH'} (max err {err:.1e})"
        if eng == "tilearray" and "numpy" in stored:
            txt += f"; vs NumPy {'ok' if close(got, stored['numpy']) else 'MISMATCH'}"
        res[eng] = txt
    log(f"verified {n_blocks} blocks of {bs}x{bs} (tilearray.testing.assert_close): {res}")
    return res


# -- summary ----------------------------------------------------------------------------


def _summary(rs: list[dict]) -> dict:
    """One engine's rounds as one row: median wall (and multiply), the worst peak
    memory, the first round's figures otherwise; an error if any round failed."""
    bad = [r for r in rs if "error" in r or "skipped" in r]
    if bad:
        return bad[0]
    out = dict(rs[-1])
    out["walls"] = [r["wall"] for r in rs]
    out["wall"] = statistics.median(out["walls"])
    if all("mul" in r for r in rs):
        out["muls"] = [r["mul"] for r in rs]
        out["mul"] = statistics.median(out["muls"])
    for k in ("peak_rss", "ru_maxrss"):
        out[k] = max(r[k] for r in rs)
    return out


def _ratio(runs: dict, num: str, den: str, key: str) -> str | None:
    """Median over rounds of runs[num].wall / runs[den][key], with the per-round ratios."""
    if num not in runs or den not in runs:
        return None
    pairs = [(a["wall"], b.get(key)) for a, b in zip(runs[num], runs[den], strict=True)
             if "error" not in a and "error" not in b and b.get(key)]
    if not pairs:
        return None
    ratios = [a / b for a, b in pairs]
    each = ", ".join(f"{r:.2f}" for r in ratios)
    return f"{statistics.median(ratios):.2f}" + (f" ({each})" if len(ratios) > 1 else "")


# -- main -------------------------------------------------------------------------------


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=8192, help="matrix side (default 8192)")
    p.add_argument("--dtype", default="float64", choices=["float32", "float64"])
    p.add_argument("--memory-per-worker", default="1GiB")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--tile", type=int, default=2048, help="input tile/chunk side (2048)")
    p.add_argument("--data-dir", default=os.path.join(
        os.environ.get("TMPDIR", "/tmp"), "tilearray-bench"))
    p.add_argument("--engines", default=",".join(ENGINES),
                   help="comma-separated subset of " + ",".join(ENGINES))
    p.add_argument("--numpy-repeats", type=int, default=2,
                   help="time NumPy's multiply this many times, report the fastest "
                        "as multiply-only (default 2; the machine is noisy)")
    p.add_argument("--repeats", type=int, default=1,
                   help="interleaved rounds of every engine; the table shows medians (1)")
    p.add_argument("--keep-outputs", action="store_true", help="keep the result arrays")
    args = p.parse_args(argv)
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    bad = [e for e in engines if e not in RUNNERS]
    if bad:
        p.error(f"unknown engine(s) {bad}; choose from {ENGINES}")

    n = args.n
    s = np.dtype(args.dtype).itemsize
    M = parse_bytes(args.memory_per_worker)
    flops = 2 * n**3

    def bound(mem: int) -> float:
        return 2 * n**3 / math.sqrt(mem / s) * s

    lower_bound = bound(M)
    log(f"matmul {n}x{n} {args.dtype}, {args.workers} workers x {args.memory_per_worker}, "
        f"engines {engines}; data dir {args.data_dir}")

    a_path, b_path = ensure_inputs(args)
    cal_before = dgemm_gflops()
    log(f"machine check: 1-thread dgemm 2048³ at {cal_before:.1f} GFLOP/s")
    logical = 2 * n * n * s
    on_disk = dir_size(a_path) + dir_size(b_path)
    out_dir = os.path.join(args.data_dir, "out")
    os.makedirs(out_dir, exist_ok=True)

    runs: dict[str, list[dict]] = {e: [] for e in engines}
    outs = {}
    for rnd in range(args.repeats):
        for eng in engines:  # interleaved: round 1 of every engine, then round 2, ...
            out_path = os.path.join(out_dir, f"c_{eng}_n{n}_{args.dtype}.zarr")
            shutil.rmtree(out_path, ignore_errors=True)
            log(f"--- {eng} (round {rnd + 1} of {args.repeats}) ---")
            try:
                r = RUNNERS[eng](args, a_path, b_path, out_path)
                if "skipped" not in r:
                    outs[eng] = out_path
                log(f"{eng}: " + (r["skipped"] if "skipped" in r else f"{r['wall']:.1f} s"))
            except Exception as e:
                traceback.print_exc(file=sys.stderr)
                first = str(e).strip().splitlines()[0] if str(e).strip() else ""
                r = {"error": f"{type(e).__name__}: {first}"[:160]}
                outs.pop(eng, None)
                log(f"{eng} FAILED: {r['error']}")
            runs[eng].append(r)
    results = {e: _summary(rs) for e, rs in runs.items()}

    checks = verify(args, a_path, b_path, outs) if outs else {}
    cal_after = dgemm_gflops()
    log(f"machine check: 1-thread dgemm 2048³ at {cal_after:.1f} GFLOP/s")
    numpy_mul = results.get("numpy", {}).get("mul")

    rows = []
    for eng in engines:
        r = results[eng]
        if "skipped" in r:
            rows.append([eng, "skipped", None, None, None, None, None, None, None, None, None,
                         None, r["skipped"]])
            continue
        if "error" in r:
            rows.append([eng, "FAILED", None, None, None, None, None, None, None, None, None,
                         None, r["error"]])
            continue
        rows.append([
            eng,
            f"{r['wall']:.1f} ({', '.join(f'{w:.1f}' for w in r['walls'])})",
            fmt_num(flops / r["wall"] / 1e9, ".2f"),
            _ratio(runs, eng, "numpy", "wall"),
            _ratio(runs, eng, "numpy", "mul"),
            _ratio(runs, "dask", eng, "wall") if eng != "dask" else None,
            fmt_bytes(r["peak_rss"]),
            fmt_bytes(r["ru_maxrss"]),
            f"{fmt_bytes(r['bytes_read'])} ({r['bytes_src']})",
            fmt_num(r["bytes_read"] / lower_bound, ".2f"),
            (fmt_num(r["bytes_read"] / bound(r["task_memory"]), ".2f")
             if r.get("task_memory") else None),
            checks.get(eng),
            r.get("notes", ""),
        ])
    if numpy_mul:
        rows.append(["numpy (multiply only)",
                     f"{numpy_mul:.1f} ({', '.join(f'{w:.1f}' for w in results['numpy']['muls'])})",
                     fmt_num(flops / numpy_mul / 1e9, ".2f"), None, "1.00", None, None, None,
                     None, None, None, None, f"operands already in RAM; fastest of "
                     f"{args.numpy_repeats} multiplies per round, all cores"])

    print(f"### matmul {n}x{n} @ {n}x{n} {args.dtype}: {args.workers} workers x 1 thread, "
          f"{args.memory_per_worker} per worker, tiles {args.tile}x{args.tile}; median of "
          f"{args.repeats} interleaved round(s)\n")
    print(f"- FLOPs 2n³ = {flops / 1e9:,.1f} G; inputs {fmt_bytes(logical)} logical, "
          f"{fmt_bytes(on_disk)} on disk (zstd); I/O lower bound 2n³/√(M/s)·s with M = "
          f"{args.memory_per_worker}: {fmt_bytes(lower_bound)}")
    print(f"- machine check (shared host): 1-thread dgemm 2048³ at {cal_before:.1f} GFLOP/s "
          f"before the runs, {cal_after:.1f} after")
    print("- peak RSS: max over worker processes sampled every 0.2 s (NumPy: its own "
          "process); ru_maxrss: exact lifetime peak of the same processes")
    print("- bytes read are decoded bytes; rchar = bytes through read syscalls (compressed "
          "files, page cache included); read / LB uses M = memory per worker, read / LB(task) "
          "M = the memory a task may fill (the plan's per-task budget)")
    print("- ratios are medians of the per-round ratios (engines of one round ran back to "
          "back); × dask = dask's wall / this engine's\n")
    print(markdown_table(
        ["engine", "wall (s), median (runs)", "GFLOP/s", "× NumPy end-to-end", "× NumPy mul",
         "× dask", "peak RSS/worker", "ru_maxrss", "bytes read", "read / LB",
         "read / LB(task)", "check", "notes"], rows))
    sys.stdout.flush()

    if not args.keep_outputs:
        for path in outs.values():
            shutil.rmtree(path, ignore_errors=True)
    failed = [e for e in engines if "error" in results[e] and e != "cubed"]
    bad_check = [e for e, t in checks.items() if "MISMATCH" in t or "cannot" in t]
    return 1 if failed or bad_check else 0


if __name__ == "__main__":
    sys.exit(main())
