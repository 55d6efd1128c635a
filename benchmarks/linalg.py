"""Side-by-side tall-skinny linear algebra: tilearray vs dask.array vs NumPy in-core.

    python benchmarks/linalg.py --m 2000000 --n 256 --memory-per-worker 1GiB --workers 2 \
        [--chunk-rows 65536] [--repeats 3] [--workdir DIR] [--engines tilearray,dask,numpy] \
        [--ops qr_r,svd_values,svd_u,lstsq]

Issue 29's "Measure" jobs on X, m x n float64 (default 2,000,000 x 256 = 4 GB),
written once by plain Zarr (default codecs: bytes + zstd 0; chunks
``--chunk-rows`` x n, default 65536 x 256) chunk by chunk from a fixed seed
(never whole in memory), with ``y = X @ beta + 0.01 * noise`` (m x 1, same row
chunks); both reused from ``--workdir`` when present with the same shape:

    qr_r        R of QR               ta.linalg.qr(X, mode="r")  | da.linalg.tsqr(X) R
    svd_values  singular values       ta.linalg.svd(X, compute_uv=False) | da.linalg.svd(X) s
    svd_u       thin SVD, U stored    U.to_zarr + s, Vt computed | da.to_zarr(u) + s, v in one compute
    lstsq       least squares         ta.linalg.lstsq(X, y)      | da.linalg.lstsq(X, y)

Engines: tilearray (``ta.Engine``, n workers x 1 thread x memory per worker),
dask.array (a plain LocalCluster of the same shape, dask's default spill and
pause thresholds) and NumPy in-core end-to-end (a fresh spawned process: load
X -- and y -- with zarr, then numpy.linalg with every BLAS thread it can use;
``OPENBLAS_CORETYPE`` is left as found and reported). The clusters are
started up front and the runs interleaved (each round: each op: every engine
in turn, order rotated) because the shared host's speed drifts.

One Markdown table on stdout: median wall per engine (all rounds listed),
ratios dask/tilearray and numpy/tilearray (medians of the per-round ratios),
peak RSS per worker (psutil every 0.2 s; NumPy: its process), bytes read
against the I/O lower bound (one read of X -- plus y for lstsq -- for R, s and
lstsq; two reads of X for U, as the issue states) -- tilearray's plan figure
and its measured ``RunStats.bytes_read``; dask's from its graph (rchar, the
bytes through read syscalls, for every engine), and a check of every result
against NumPy's on the same data (computed in the NumPy child, which also
runs once untimed when ``numpy`` is not among the engines and X fits in
memory) and of tilearray's against dask's: singular values within 1e-10
relative to s[0]; R up to row signs; V^T up to signs; U on a sample of rows up
to signs and ``U[rows] * s @ Vt == X[rows]``; the lstsq solution
(``tilearray.testing.assert_close``).

Cholesky / SPD solve (issue 29's third job) and the randomized SVD are not
measured here. TODO: add them beside these jobs once ``ta.linalg.cholesky``
and ``svd_compressed`` exist.
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

# heavy imports stay lazy: the NumPy baseline runs in a spawned child that
# re-imports this file, and its RSS is measured.
from _common import (
    RSSSampler,
    dir_size,
    fmt_bytes,
    local_cluster,
    log,
    markdown_table,
    max_rss_of_workers,
    read_chars,
    run_in_child,
    warm_workers,
    worker_pids,
)

ENGINES = ("tilearray", "dask", "numpy")
OPS = {
    "qr_r": "R of QR",
    "svd_values": "singular values",
    "svd_u": "thin SVD: U stored, s, Vt",
    "lstsq": "lstsq(X, y)",
}
SHORT = {"tilearray": "ta", "dask": "da", "numpy": "np"}
SEED = 29
N_SAMPLE_ROWS = 2048  # rows of U (and X) compared


# -- inputs ---------------------------------------------------------------------------


def _beta(n: int) -> np.ndarray:
    return np.random.default_rng([SEED, 1]).standard_normal(n)


def ensure_inputs(args) -> dict[str, str]:
    """X (m x n) and y (m x 1) written by plain zarr, chunk by chunk; reused when present."""
    import zarr

    m, n, c = args.m, args.n, args.chunk_rows
    d = os.path.join(args.workdir, "inputs")
    os.makedirs(d, exist_ok=True)
    tag = f"m{m}_n{n}_c{c}_float64_plainzarr"
    paths = {"x": os.path.join(d, f"linalg_X_{tag}.zarr"),
             "y": os.path.join(d, f"linalg_y_{tag}.zarr")}
    ok = True
    for k, shape, chunks in (("x", (m, n), (c, n)), ("y", (m, 1), (c, 1))):
        try:
            z = zarr.open_array(paths[k], mode="r")
            ok &= (z.shape == shape and tuple(z.chunks) == chunks and z.dtype == np.float64
                   and z.attrs.get("bench-seed") == SEED)
        except Exception:
            ok = False
    if ok:
        log(f"reusing {paths['x']} and y")
        return paths
    t0 = time.perf_counter()
    beta = _beta(n)
    zx = zarr.create_array(paths["x"], shape=(m, n), chunks=(c, n), dtype="float64",
                           overwrite=True)
    zy = zarr.create_array(paths["y"], shape=(m, 1), chunks=(c, 1), dtype="float64",
                           overwrite=True)
    for r0 in range(0, m, c):
        r1 = min(r0 + c, m)
        rng = np.random.default_rng([SEED, 2, r0])
        xb = rng.standard_normal((r1 - r0, n))
        zx[r0:r1, :] = xb
        zy[r0:r1, :] = (xb @ beta + 0.01 * rng.standard_normal(r1 - r0))[:, None]
    # written last: a killed generation is redone
    zx.attrs["bench-seed"] = SEED
    zy.attrs["bench-seed"] = SEED
    log(f"generated {paths['x']} and y (plain zarr, {zx.compressors}) in "
        f"{time.perf_counter() - t0:.1f} s")
    return paths


def sample_rows(m: int) -> np.ndarray:
    rng = np.random.default_rng([SEED, 3])
    k = min(m, N_SAMPLE_ROWS)
    return np.unique(np.r_[np.arange(min(m, k // 2)), rng.choice(m, k // 2, replace=False)])


def read_rows(path: str, rows: np.ndarray) -> np.ndarray:
    import zarr

    z = zarr.open_array(path, mode="r")
    return z.get_orthogonal_selection((rows, slice(None)))


# -- engines ---------------------------------------------------------------------------


class _Runner:
    name = ""
    pids: list[int] = []
    client = None

    def __init__(self, args, paths):
        self.args, self.paths = args, paths
        self.rows = sample_rows(args.m)
        self.u_path = os.path.join(args.workdir, "out", f"U_{self.name}.zarr")
        os.makedirs(os.path.dirname(self.u_path), exist_ok=True)

    def run(self, op: str) -> dict:
        rc0 = read_chars(self.client)
        with RSSSampler(self.pids) as rss:
            t0 = time.perf_counter()
            value, extra = self._once(op)
            wall = time.perf_counter() - t0
        rc = read_chars(self.client) - rc0
        if op == "svd_u":  # the stored U on the sample rows, read after the timing
            value["U_rows"] = read_rows(self.u_path, self.rows)
        return dict(value=value, wall=wall, peak_rss=rss.peak, rchar=rc, **extra)

    def close(self) -> None:
        shutil.rmtree(self.u_path, ignore_errors=True)


class TilearrayRunner(_Runner):
    name = "tilearray"

    def __init__(self, args, paths):
        super().__init__(args, paths)
        import tilearray as ta

        log(f"tilearray from {ta.__file__}")
        self.ta = ta
        self.eng = ta.Engine(n_workers=args.workers, threads_per_worker=1,
                             memory_per_worker=args.memory_per_worker, quiet=True)
        self.client = self.eng.client
        warm_workers(self.client, ["tilearray.graphs.linalg", "tilearray.graphs.tsqr",
                                   "tilearray.storage.io", "scipy.linalg", "zarr", "numcodecs"])
        log(f"tilearray BLAS per worker: {self.eng.blas_report()}")
        self.pids = worker_pids(self.client)
        self.x, self.y = ta.open(paths["x"]), ta.open(paths["y"])
        self._planned: dict[str, int] = {}

    def _exprs(self, op):
        la = self.ta.linalg
        if op == "qr_r":
            return [("R", la.qr(self.x, mode="r"))]
        if op == "svd_values":
            return [("s", la.svd(self.x, compute_uv=False))]
        if op == "svd_u":
            u, s, vt = la.svd(self.x)
            return [("U", u), ("s", s), ("Vt", vt)]
        if op == "lstsq":
            return [("lstsq", la.lstsq_plan(self.x, self.y))]
        raise ValueError(op)

    def _once(self, op):
        exprs = self._exprs(op)
        if op not in self._planned:
            total = 0
            for what, e in exprs:
                plan = e.plan(self.u_path) if what == "U" else e.plan(engine=self.eng)
                total += plan.bytes_read
                log(f"tilearray {op} {what}: plan {plan.tasks} tasks, read "
                    f"{fmt_bytes(plan.bytes_read)}, written {fmt_bytes(plan.bytes_written)}, "
                    f"peak/task {fmt_bytes(plan.peak_task_memory)}")
            self._planned[op] = total
        value, stats = {}, []
        for what, e in exprs:
            if what == "U":
                out = e.to_zarr(self.u_path, overwrite=True, engine=self.eng)
                stats.append(out.stats)
            elif what == "lstsq":
                sol, res, rank, s = e.compute(engine=self.eng)
                value.update(b=np.asarray(sol).reshape(self.args.n, -1)[:, 0], s=s, rank=rank)
                stats.append(e.stats)
            else:
                value[what] = e.compute(engine=self.eng)
                stats.append(e.stats)
        br = sum(st.bytes_read for st in stats)
        return value, dict(
            bytes_read=br, plan_bytes_read=self._planned[op],
            notes=(f"{sum(st.tasks for st in stats)} tasks in {len(stats)} run(s); "
                   f"engine's peak {fmt_bytes(max(st.peak_worker_memory for st in stats))}"))

    def close(self):
        try:
            self.eng.close()
        finally:
            super().close()


class DaskRunner(_Runner):
    name = "dask"

    def __init__(self, args, paths):
        super().__init__(args, paths)
        import dask.array as da

        self.cluster, self.client = local_cluster(args.workers, args.memory_per_worker)
        warm_workers(self.client, ["dask.array", "dask.array.linalg", "zarr", "numcodecs",
                                   "numpy"])
        self.pids = worker_pids(self.client)
        self.x, self.y = da.from_zarr(paths["x"]), da.from_zarr(paths["y"])
        if len(self.x.chunks[1]) != 1:
            raise ValueError("dask's tsqr needs X in one column of chunks")

    def _once(self, op):
        import dask
        import dask.array as da

        x = self.x
        with dask.config.set(scheduler=self.client):
            if op == "qr_r":
                _, r = da.linalg.tsqr(x, compute_svd=False)
                return {"R": r.compute()}, dict(notes="da.linalg.tsqr, R only (Q culled)")
            if op == "svd_values":
                _, s, _ = da.linalg.svd(x)
                return {"s": s.compute()}, dict(notes="da.linalg.svd, s only (U culled)")
            if op == "svd_u":
                u, s, v = da.linalg.svd(x)
                store = da.to_zarr(u, self.u_path, overwrite=True, compute=False)
                _, s, v = dask.compute(store, s, v)
                return {"s": s, "Vt": v}, dict(
                    notes="da.linalg.svd; da.to_zarr(u) + s, v in one compute")
            if op == "lstsq":
                sol, res, rank, s = da.linalg.lstsq(x, self.y)
                sol, res, rank, s = dask.compute(sol, res, rank, s)
                return {"b": np.asarray(sol).reshape(self.args.n, -1)[:, 0], "s": s,
                        "rank": rank}, dict(notes="da.linalg.lstsq (tsqr), all 4 outputs")
        raise ValueError(op)

    def close(self):
        try:
            self.client.close()
            self.cluster.close()
        finally:
            super().close()


def _numpy_child(x_path, y_path, op, rows):
    """Fresh process: load X (and y) with zarr, then numpy.linalg, all BLAS threads."""
    import zarr
    from threadpoolctl import threadpool_info

    t0 = time.perf_counter()
    X = zarr.open_array(x_path, mode="r")[...]
    y = zarr.open_array(y_path, mode="r")[...] if op == "lstsq" else None
    t1 = time.perf_counter()
    out = {}
    if op == "qr_r":
        out["R"] = np.linalg.qr(X, mode="r")
    elif op == "svd_values":
        out["s"] = np.linalg.svd(X, compute_uv=False)
    elif op == "svd_u":
        U, s, Vt = np.linalg.svd(X, full_matrices=False)
        out.update(s=s, Vt=Vt, U_rows=U[rows])
    elif op == "lstsq":
        sol, res, rank, s = np.linalg.lstsq(X, y, rcond=None)
        out.update(b=sol[:, 0], s=s, rank=rank)
    t2 = time.perf_counter()
    blas = [(i.get("internal_api"), i.get("num_threads"), i.get("architecture"))
            for i in threadpool_info()]
    return dict(value=out, load=t1 - t0, compute=t2 - t1, blas=blas,
                coretype=os.environ.get("OPENBLAS_CORETYPE"))


class NumpyRunner(_Runner):
    """Load + numpy.linalg in a fresh process per run; wall = load + compute
    (interpreter start-up excluded), RSS that process's."""

    name = "numpy"

    def run(self, op):
        r = run_in_child(_numpy_child, self.paths["x"], self.paths["y"], op, self.rows)
        log(f"numpy {op}: load {r['load']:.2f} s + compute {r['compute']:.2f} s; BLAS "
            f"{r['blas']}; OPENBLAS_CORETYPE={r['coretype']!r}")
        self.blas, self.coretype = r["blas"], r["coretype"]
        return dict(value=r["value"], wall=r["load"] + r["compute"], load=r["load"],
                    compute=r["compute"], peak_rss=r["peak_rss"], rchar=r["read_chars"],
                    notes=f"load {r['load']:.1f} s + compute {r['compute']:.1f} s")


RUNNERS = {"tilearray": TilearrayRunner, "dask": DaskRunner, "numpy": NumpyRunner}


def run_all(args, paths, engines, ops) -> tuple[dict, dict]:
    """results[engine][op] = {"runs": [run dicts], ...} or {"error": ...}."""
    runners, results = {}, {e: {} for e in engines}
    try:
        for e in engines:
            log(f"starting {e}")
            try:
                runners[e] = RUNNERS[e](args, paths)
            except Exception as ex:
                traceback.print_exc(file=sys.stderr)
                results[e] = {op: {"error": f"{type(ex).__name__}: {ex}"[:160]} for op in ops}
        live = [e for e in engines if e in runners]
        for rep in range(args.repeats):
            for k, op in enumerate(ops):
                j = (rep + k) % len(live) if live else 0
                for e in live[j:] + live[:j]:
                    prev = results[e].get(op)
                    if prev is not None and "error" in prev:
                        continue
                    try:
                        r = runners[e].run(op)
                    except Exception as ex:
                        traceback.print_exc(file=sys.stderr)
                        results[e][op] = {"error": f"{type(ex).__name__}: {ex}"[:160]}
                        log(f"{e} {op} FAILED: {results[e][op]['error']}")
                        continue
                    log(f"round {rep + 1} {op:10s} {e:9s} {r['wall']:7.2f} s  peak RSS "
                        f"{fmt_bytes(r['peak_rss'])}  {r.get('notes', '')}")
                    results[e].setdefault(op, {"runs": []})["runs"].append(r)
        extra = {}
        if "numpy" in runners:
            extra = {"blas": runners["numpy"].blas, "coretype": runners["numpy"].coretype}
        if "tilearray" in runners:
            extra["ta_task_memory"] = runners["tilearray"].eng.budget().task_memory
            extra["ta_ru_maxrss"] = max_rss_of_workers(runners["tilearray"].client)
        return results, extra
    finally:
        for r in runners.values():
            try:
                r.close()
            except Exception:
                traceback.print_exc(file=sys.stderr)


def numpy_reference(args, paths, ops, results) -> dict:
    """op -> NumPy's values: from the numpy engine's first run, else from one
    untimed child run when X fits in memory (3 X at most a third of RAM)."""
    import psutil

    ref = {}
    for op in ops:
        runs = results.get("numpy", {}).get(op, {}).get("runs")
        if runs:
            ref[op] = runs[0]["value"]
            continue
        need = 3 * args.m * args.n * 8
        if need > psutil.virtual_memory().available / 3:
            log(f"no NumPy reference for {op}: X does not fit in memory here")
            continue
        log(f"NumPy reference for {op} (untimed child)")
        ref[op] = run_in_child(_numpy_child, paths["x"], paths["y"], op,
                               sample_rows(args.m))["value"]
    return ref


# -- verification ----------------------------------------------------------------------


def compare(op: str, got: dict, want: dict, x_rows: np.ndarray | None) -> tuple[bool, str]:
    """Sign-insensitive comparison of one engine's values with the reference's."""
    from tilearray.testing import assert_close

    msgs, ok = [], True

    def check(name, a, b, **kw):
        nonlocal ok
        a, b = np.asarray(a), np.asarray(b)
        err = float(np.max(np.abs(a - b))) if a.shape == b.shape else math.inf
        try:
            assert_close(a, b, **kw)
            msgs.append(f"{name} {err:.0e}")
        except AssertionError:
            ok = False
            msgs.append(f"{name} MISMATCH {err:.1e}")

    if "s" in want and "s" in got:
        s, sw = np.asarray(got["s"]).ravel(), np.asarray(want["s"]).ravel()
        rel = float(np.max(np.abs(s - sw)) / sw[0]) if s.shape == sw.shape else math.inf
        if rel > 1e-10:
            ok = False
            msgs.append(f"s MISMATCH rel {rel:.1e}")
        else:
            msgs.append(f"s rel {rel:.0e}")
    if op == "qr_r":
        r, rw = np.asarray(got["R"]), np.asarray(want["R"])
        check("|R|", np.abs(r), np.abs(rw), scale=float(np.abs(rw).max()))
    if op == "svd_u":
        check("|Vt|", np.abs(got["Vt"]), np.abs(want["Vt"]), scale=1.0)
        if "U_rows" in got and "U_rows" in want:
            check("|U[rows]|", np.abs(got["U_rows"]), np.abs(want["U_rows"]),
                  scale=float(np.abs(want["U_rows"]).max()))
        if "U_rows" in got and x_rows is not None:
            check("U s Vt[rows]", (got["U_rows"] * np.asarray(got["s"])) @ got["Vt"], x_rows,
                  scale=float(np.abs(x_rows).max()) * 4)
    if op == "lstsq":
        check("b", got["b"], want["b"], scale=float(np.abs(want["b"]).max()))
    return ok, ", ".join(msgs)


# -- report ----------------------------------------------------------------------------


def _walls(r: dict) -> list[float]:
    return [x["wall"] for x in r["runs"]]


def _ratio_cell(results, num: str, den: str, op: str) -> str | None:
    a, b = results.get(num, {}).get(op, {}), results.get(den, {}).get(op, {})
    if "runs" not in a or "runs" not in b:
        return None
    per_round = [x / y for x, y in zip(_walls(a), _walls(b), strict=False)]
    return (f"{statistics.median(per_round):.2f}x ("
            + ", ".join(f"{v:.2f}" for v in per_round) + ")")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--m", type=int, default=2_000_000, help="rows of X (2,000,000)")
    p.add_argument("--n", type=int, default=256, help="columns of X (256)")
    p.add_argument("--chunk-rows", type=int, default=65536,
                   help="rows per chunk of X and y (65536); a chunk holds all n columns")
    p.add_argument("--memory-per-worker", default="1GiB")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--workdir", "--data-dir", dest="workdir", default=os.path.join(
        os.environ.get("TMPDIR", "/tmp"), "tilearray-bench"),
        help="inputs (reused) and the stored U's go here")
    p.add_argument("--engines", default=",".join(ENGINES),
                   help="comma-separated subset of " + ",".join(ENGINES))
    p.add_argument("--ops", default=",".join(OPS), help="comma-separated subset of "
                   + ",".join(OPS))
    p.add_argument("--repeats", type=int, default=3,
                   help="rounds of (every op x every engine), interleaved; the table shows "
                        "medians (default 3)")
    args = p.parse_args(argv)
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    if bad := [e for e in engines if e not in RUNNERS]:
        p.error(f"unknown engine(s) {bad}; choose from {ENGINES}")
    if bad := [o for o in ops if o not in OPS]:
        p.error(f"unknown op(s) {bad}; choose from {tuple(OPS)}")

    m, n = args.m, args.n
    x_bytes, y_bytes = m * n * 8, m * 8
    coretype = os.environ.get("OPENBLAS_CORETYPE")
    log(f"linalg on X {m} x {n} float64 ({fmt_bytes(x_bytes)}), chunks {args.chunk_rows} x "
        f"{n}; {args.workers} workers x {args.memory_per_worker}; engines {engines}, ops {ops}; "
        f"OPENBLAS_CORETYPE={coretype!r} (left as found)")
    paths = ensure_inputs(args)
    on_disk = dir_size(paths["x"])

    results, extra = run_all(args, paths, engines, ops)
    ref = numpy_reference(args, paths, ops, results)
    rows = sample_rows(m)
    x_rows = read_rows(paths["x"], rows)

    table, failed = [], False
    for op in ops:
        bound = {"svd_u": 2 * x_bytes, "lstsq": x_bytes + y_bytes}.get(op, x_bytes)
        bound_txt = {"svd_u": "2 X"}.get(op, "X + y" if op == "lstsq" else "X")

        def cell(eng, op=op):
            r = results.get(eng, {}).get(op)
            if r is None:
                return None
            if "error" in r:
                return "FAILED: " + r["error"]
            w = _walls(r)
            txt = f"{statistics.median(w):.2f} s (" + ", ".join(f"{v:.1f}" for v in w) + ")"
            if eng == "numpy":
                ld = statistics.median(x["load"] for x in r["runs"])
                cp = statistics.median(x["compute"] for x in r["runs"])
                txt = f"{ld:.2f} + {cp:.2f} = " + txt
            return txt

        rss = []
        for eng in engines:
            r = results.get(eng, {}).get(op, {})
            if "runs" in r:
                rss.append(f"{SHORT[eng]} {fmt_bytes(max(x['peak_rss'] for x in r['runs']))}")
        io = []
        ta_r = results.get("tilearray", {}).get(op, {})
        if "runs" in ta_r:
            last = ta_r["runs"][-1]
            io.append(f"ta plan {fmt_bytes(last['plan_bytes_read'])} / measured "
                      f"{fmt_bytes(last['bytes_read'])} = "
                      f"{last['bytes_read'] / bound:.2f}x")
        for eng in engines:
            r = results.get(eng, {}).get(op, {})
            if "runs" in r and r["runs"][-1].get("rchar", -1) >= 0:
                io.append(f"{SHORT[eng]} rchar {fmt_bytes(r['runs'][-1]['rchar'])}")
        io_txt = f"bound {bound_txt} = {fmt_bytes(bound)}; " + "; ".join(io)

        checks = []
        for eng in engines:
            r = results.get(eng, {}).get(op, {})
            if "runs" not in r:
                continue
            got = r["runs"][-1]["value"]
            if op in ref and eng != "numpy":
                ok, msg = compare(op, got, ref[op], x_rows)
                failed |= not ok
                checks.append(f"{eng} vs NumPy: {'ok' if ok else 'FAIL'} ({msg})")
            elif eng == "numpy" and x_rows is not None and op == "svd_u":
                ok, msg = compare(op, got, got, x_rows)
                failed |= not ok
                checks.append(f"numpy: {'ok' if ok else 'FAIL'} ({msg})")
        if all("runs" in results.get(e, {}).get(op, {}) for e in ("tilearray", "dask")):
            ok, msg = compare(op, results["tilearray"][op]["runs"][-1]["value"],
                              results["dask"][op]["runs"][-1]["value"], x_rows)
            failed |= not ok
            checks.append(f"tilearray vs dask: {'ok' if ok else 'FAIL'} ({msg})")
        table.append([OPS[op], cell("tilearray"), cell("dask"), cell("numpy"),
                      _ratio_cell(results, "dask", "tilearray", op),
                      _ratio_cell(results, "numpy", "tilearray", op),
                      ", ".join(rss), io_txt, "; ".join(checks) or None])

    print(f"### Tall-skinny linear algebra: X {m:,} x {n} float64 ({fmt_bytes(x_bytes)}; "
          f"chunks {args.chunk_rows} x {n}, plain zarr (bytes + zstd 0), on disk "
          f"{fmt_bytes(on_disk)}); {args.workers} workers x 1 thread x "
          f"{args.memory_per_worker}\n")
    print(f"- wall: median of {args.repeats} interleaved round(s) (all rounds in brackets); "
          "ratios: median of the per-round ratios (> 1: tilearray faster)")
    print("- NumPy: a fresh process, load (zarr read of X, and y) + numpy.linalg compute, "
          f"BLAS {extra.get('blas')}; OPENBLAS_CORETYPE={extra.get('coretype', coretype)!r} "
          "(left as found). U is computed in memory, not stored")
    print("- peak RSS: largest over the worker processes (ta = tilearray, da = dask) "
          "sampled every 0.2 s during the job; np = the NumPy process"
          + (f"; tilearray plans for {fmt_bytes(extra['ta_task_memory'])} per task, its "
             f"workers' lifetime ru_maxrss {fmt_bytes(extra['ta_ru_maxrss'])}"
             if "ta_task_memory" in extra else ""))
    print("- bytes read: the I/O lower bound (one read of X for R / s / lstsq, two for U, "
          "as issue 29 states); tilearray's plan and measured RunStats.bytes_read (decoded "
          "bytes, summed over the job's runs: svd_u runs U.to_zarr, s.compute() and "
          "Vt.compute() separately); rchar = bytes through read syscalls of the last "
          "round (compressed chunk files, page cache included)")
    print("- check: against NumPy's result on the same data (s within 1e-10 relative to "
          "s[0]; R, Vt and U on sample rows up to signs; U s Vt on the sample rows == X; "
          "lstsq solution) with tilearray.testing.assert_close, max abs errors shown\n")
    print(markdown_table(
        ["job", "tilearray median (rounds)", "dask", "NumPy (load + compute)",
         "dask / tilearray", "numpy / tilearray", "peak worker RSS",
         "bytes read vs lower bound", "check"], table))
    sys.stdout.flush()
    shutil.rmtree(os.path.join(args.workdir, "out"), ignore_errors=True)
    errored = any("error" in results[e].get(op, {}) for e in engines for op in ops)
    return 1 if failed or errored else 0


if __name__ == "__main__":
    sys.exit(main())
