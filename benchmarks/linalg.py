"""Side-by-side linear algebra: tilearray vs dask.array vs NumPy in-core.

    python benchmarks/linalg.py --m 2000000 --n 256 --memory-per-worker 1GiB --workers 2 \
        [--chunk-rows 65536] [--square-n 16384] [--square-chunk 2048] [--rsvd-k 20] \
        [--rsvd-power-iter 2] [--spd-n 32768] [--spd-chunk 2048] [--repeats 3] \
        [--workdir DIR] [--engines tilearray,dask,numpy] [--cache cold|as-found] \
        [--ops qr_r,svd_values,svd_u,lstsq,rsvd,cholesky,solve_spd]

Before every engine's run of a job its inputs are dropped from the OS page
cache (``--cache cold``, the default): each engine reads them from disk, as a
first run on data at rest does, rather than whatever the previous engine
left cached.

Issue 29's "Measure" jobs on three inputs, each written once by plain Zarr
(default codecs: bytes + zstd 0) chunk by chunk from a fixed seed (never
whole in memory) and reused from ``--workdir`` when present with the same
shape; only the inputs of the jobs in ``--ops`` are made.

X, m x n float64 (default 2,000,000 x 256 = 4 GB; chunks ``--chunk-rows`` x n,
default 65536 x 256), with ``y = X @ beta + 0.01 * noise`` (m x 1, same row
chunks), for the tall-skinny jobs:

    qr_r        R of QR               ta.linalg.qr(X, mode="r")  | da.linalg.tsqr(X) R
    svd_values  singular values       ta.linalg.svd(X, compute_uv=False) | da.linalg.svd(X) s
    svd_u       thin SVD, U stored    U.to_zarr + s, Vt computed | da.to_zarr(u) + s, v in one compute
    lstsq       least squares         ta.linalg.lstsq(X, y)      | da.linalg.lstsq(X, y)

A, N x N float64 with a decaying spectrum (``--square-n``, default 16384 =
2 GiB; square chunks ``--square-chunk``, default 2048), written tile by tile
as ``U0 diag(s) V0^T + E``: U0, V0 orthonormal N x 64 (in memory while
writing, N x 64 each), ``s_i = N 10^(-i/10)`` and Gaussian noise E with
``||E||_2`` about ``1e-9 s_0``:

    rsvd        randomized SVD, top k (``--rsvd-k``, 20) with q (``--rsvd-power-iter``, 2)
                power iterations: ta.linalg.svd_compressed(A, k, n_power_iter=q, seed=)
                (s and Vt in memory, U left lazy) | da.linalg.svd_compressed(A, k,
                n_power_iter=q, seed=) s and v in one compute (u culled)
                | np.linalg.svd(A, compute_uv=False)[:k]

S, N x N float64 symmetric positive definite (``--spd-n``, default 32768 =
8 GiB; chunks ``--spd-chunk``, default 2048), written tile by tile: tile
(i, j), i > j, uniform in [-1, 1) from its own seed, also written transposed
as tile (j, i); diagonal tiles symmetric with N on the diagonal (strictly
diagonally dominant, hence SPD; well conditioned); and B, N x 8 standard
normal (chunks ``--spd-chunk`` x 8):

    cholesky    L stored              ta.linalg.cholesky(S).to_zarr (tilearray's default tile)
                                      | da.to_zarr(da.linalg.cholesky(S, lower=True))
                                      | scipy.linalg.cholesky(S, lower=True, overwrite_a=True)
                                      in place (L in memory, not stored; np.linalg.cholesky
                                      holds S, a working copy and L: 3 x 8 GiB at 32768²,
                                      killed for memory here)
    solve_spd   S x = B               ta.linalg.solve(S, B, assume_a="pos") (float64 in mixed
                                      precision: a float32 factor, then float64 refinement;
                                      its runs' plans and stats recorded; ``--spd-solve
                                      double`` for the float64 factor)
                                      | da.linalg.solve(S, B, assume_a="pos")
                                      | scipy.linalg.solve(S, B, assume_a="pos",
                                      overwrite_a=True) (NumPy has no SPD solve)

Engines: tilearray (``ta.Engine``, n workers x 1 thread x memory per worker),
dask.array (a plain LocalCluster of the same shape, dask's default spill and
pause thresholds) and NumPy in-core end-to-end (a fresh spawned process: load
the input -- and y / B -- with zarr, then numpy.linalg with every BLAS
thread it can use, except cholesky and solve_spd: ONE BLAS thread
(threadpoolctl), as multi-threaded OpenBLAS ``potrf`` crashes on this
machine; ``OPENBLAS_CORETYPE`` is left as found and reported). The NumPy
engine skips a job whose in-core need (about twice the input) is over 90 %
of the memory available when it starts: the cell says so, it is not a
failure. The clusters are started up front and the runs interleaved (each
round: each op: every engine in turn, order rotated) because the shared
host's speed drifts.

One Markdown table on stdout: median wall per engine (all rounds listed),
ratios dask/tilearray and numpy/tilearray (medians of the per-round ratios),
peak RSS per worker (psutil every 0.2 s; NumPy: its process), bytes read --
tilearray's plan figure and its measured ``RunStats.bytes_read``; rchar (the
bytes through read syscalls) for every engine -- against:

- the tall-skinny jobs: the I/O lower bound, one read of X (plus y for
  lstsq) for R, s and lstsq, two reads of X for U, as the issue states;
- rsvd: the ``2 + q`` passes over A that q power iterations need when each
  ``A.T @ (A @ V)`` is one pass (tilearray; dask's ``svd_compressed`` makes
  ``2 + 2 q``), not a proven lower bound;
- cholesky and solve_spd: the Cholesky I/O lower bound ``n^3 / (3 sqrt(M))``
  words, M the task's memory (``tilearray.engine.plan.cholesky.io_bound``,
  the figure tilearray's plan reports as ``io_lower_bound``), or the lower
  triangle once if more; solve_spd's two substitutions (about ``n^2``
  elements more) are not in it. Bytes written too: tilearray's plan and
  ``RunStats.bytes_written`` (solve_spd: its temporary L), wchar (write
  syscalls, dask's spill included) of the workers.

Checks of every result: the tall-skinny ones against NumPy's on the same
data (computed in the NumPy child, which also runs once untimed when
``numpy`` is not among the engines and X fits in memory) and tilearray's
against dask's: singular values within 1e-10 relative to s[0]; R up to row
signs; V^T up to signs; U on a sample of rows up to signs and ``U[rows] * s
@ Vt == X[rows]``; the lstsq solution (``tilearray.testing.assert_close``).
rsvd: the top-k singular values within 1e-6 relative, value by value, of
NumPy's (issue 29's goal; the same untimed reference when A fits), of the
designed spectrum (the noise moves them by at most ``||E||_2``, about 1e-7 of
s_k at the defaults) and tilearray's of dask's; the measured error shown.
cholesky: on sample rows R (bands of 64 rows: the first, the last, two
seeded), ``L[R]`` is exactly 0 above the diagonal and ``L[R] L[R]^T ==
S[R, R]``, and matches NumPy's and dask's. solve_spd: ``||S x - B||_F /
(||S||_F ||x||_F) < 1e-10`` (one pass over S here, tile by tile, every
engine's x at once), x matches NumPy's and dask's. No untimed NumPy run for
cholesky / solve_spd: their checks need none.
"""
from __future__ import annotations

import argparse
import contextlib
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
    concurrent_dgemm_gflops,
    dir_size,
    evict,
    fmt_bytes,
    local_cluster,
    log,
    markdown_table,
    max_rss_of_workers,
    parse_bytes,
    read_chars,
    run_in_child,
    warm_workers,
    worker_pids,
    write_chars,
)

ENGINES = ("tilearray", "dask", "numpy")
OPS = {
    "qr_r": "R of QR",
    "svd_values": "singular values",
    "svd_u": "thin SVD: U stored, s, Vt",
    "lstsq": "lstsq(X, y)",
    "rsvd": "randomized SVD of A: top-k s, Vt",
    "cholesky": "Cholesky of S: L stored",
    "solve_spd": "SPD solve S x = B",
}
TALL_OPS = ("qr_r", "svd_values", "svd_u", "lstsq")
SPD_OPS = ("cholesky", "solve_spd")
WRITES = ("svd_u", "cholesky", "solve_spd")  # jobs whose bytes written are reported
SHORT = {"tilearray": "ta", "dask": "da", "numpy": "np"}
SEED = 29
N_SAMPLE_ROWS = 2048  # rows of U (and X) compared
RSVD_RANK = 64  # rank of A's decaying part
RSVD_DECADE = 10  # s_i = N 10^(-i / RSVD_DECADE)
RSVD_NOISE = 1e-9  # ||E||_2 about RSVD_NOISE * s_0
RSVD_TOL = 1e-6  # issue 29: top-k singular values within 1e-6 relative
N_RHS = 8  # columns of B
SPD_BAND = 64  # rows per sampled band of L
SOLVE_TOL = 1e-10  # ||S x - B|| / (||S|| ||x||)


class Skipped(Exception):
    """A job an engine does not run here (NumPy: the input does not fit in memory)."""


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


def _reuse(path: str, shape: tuple, chunks: tuple, spec: str) -> bool:
    import zarr

    try:
        z = zarr.open_array(path, mode="r")
        return (z.shape == shape and tuple(z.chunks) == chunks and z.dtype == np.float64
                and z.attrs.get("bench-seed") == SEED and z.attrs.get("bench-spec") == spec)
    except Exception:
        return False


def rsvd_spectrum(n: int) -> np.ndarray:
    """The designed singular values of A (its rank-``RSVD_RANK`` part), descending."""
    return n * 10.0 ** (-np.arange(min(RSVD_RANK, n)) / RSVD_DECADE)


def ensure_square(args) -> str:
    """A = U0 diag(s) V0^T + E (N x N), written tile by tile; reused when present."""
    import zarr

    n, c = args.square_n, args.square_chunk
    d = os.path.join(args.workdir, "inputs")
    os.makedirs(d, exist_ok=True)
    spec = f"rank{RSVD_RANK} decade{RSVD_DECADE} noise{RSVD_NOISE:g}"
    path = os.path.join(d, f"linalg_A_n{n}_c{c}_r{RSVD_RANK}_float64_plainzarr.zarr")
    if _reuse(path, (n, n), (c, c), spec):
        log(f"reusing {path}")
        return path
    t0 = time.perf_counter()
    s = rsvd_spectrum(n)
    r = len(s)
    rng = np.random.default_rng([SEED, 4])
    u0 = np.linalg.qr(rng.standard_normal((n, r)))[0] * s  # N x r: U0 diag(s)
    v0 = np.linalg.qr(rng.standard_normal((n, r)))[0]
    eps = RSVD_NOISE * s[0] / (2 * math.sqrt(n))  # ||E||_2 ~ 2 eps sqrt(N)
    z = zarr.create_array(path, shape=(n, n), chunks=(c, c), dtype="float64", overwrite=True)
    for i0 in range(0, n, c):
        i1 = min(i0 + c, n)
        for j0 in range(0, n, c):
            j1 = min(j0 + c, n)
            tile = u0[i0:i1] @ v0[j0:j1].T
            tile += eps * np.random.default_rng([SEED, 5, i0, j0]).standard_normal(tile.shape)
            z[i0:i1, j0:j1] = tile
    z.attrs["bench-spec"] = spec
    z.attrs["bench-seed"] = SEED  # written last: a killed generation is redone
    log(f"generated {path} (plain zarr, {z.compressors}) in {time.perf_counter() - t0:.1f} s")
    return path


def ensure_spd(args) -> dict[str, str]:
    """S (N x N, symmetric, strictly diagonally dominant) and B (N x N_RHS),
    written tile by tile; ``||S||_F`` kept in S's attributes. Reused when present."""
    import zarr

    n, c = args.spd_n, args.spd_chunk
    d = os.path.join(args.workdir, "inputs")
    os.makedirs(d, exist_ok=True)
    spec = "uniform(-1,1) symmetric, diagonal N"
    paths = {"spd": os.path.join(d, f"linalg_S_n{n}_c{c}_float64_plainzarr.zarr"),
             "b": os.path.join(d, f"linalg_B_n{n}_c{c}_k{N_RHS}_float64_plainzarr.zarr")}
    if (_reuse(paths["spd"], (n, n), (c, c), spec)
            and _reuse(paths["b"], (n, N_RHS), (c, N_RHS), spec)):
        log(f"reusing {paths['spd']} and B")
        return paths
    t0 = time.perf_counter()
    z = zarr.create_array(paths["spd"], shape=(n, n), chunks=(c, c), dtype="float64",
                          overwrite=True)
    fro2 = 0.0
    for j0 in range(0, n, c):
        j1 = min(j0 + c, n)
        for i0 in range(j0, n, c):  # tile (i, j), i >= j, and its transpose
            i1 = min(i0 + c, n)
            tile = np.random.default_rng([SEED, 6, i0, j0]).uniform(-1.0, 1.0,
                                                                    (i1 - i0, j1 - j0))
            if i0 == j0:
                tile = (tile + tile.T) / 2
                np.fill_diagonal(tile, float(n))  # |off-diagonal| < 1: row sums < N - 1
                fro2 += float(np.sum(tile * tile))
            else:
                z[j0:j1, i0:i1] = tile.T
                fro2 += 2 * float(np.sum(tile * tile))
            z[i0:i1, j0:j1] = tile
    zb = zarr.create_array(paths["b"], shape=(n, N_RHS), chunks=(c, N_RHS), dtype="float64",
                           overwrite=True)
    zb[...] = np.random.default_rng([SEED, 7]).standard_normal((n, N_RHS))
    z.attrs["fro"] = math.sqrt(fro2)
    for a in (z, zb):  # written last: a killed generation is redone
        a.attrs["bench-spec"] = spec
        a.attrs["bench-seed"] = SEED
    log(f"generated {paths['spd']} and B (plain zarr, {z.compressors}) in "
        f"{time.perf_counter() - t0:.1f} s")
    return paths


def spd_sample_rows(n: int) -> np.ndarray:
    """Rows of L checked: bands of SPD_BAND rows (the first, the last, two seeded)."""
    b = min(SPD_BAND, n)
    starts = [0, n - b, *np.random.default_rng([SEED, 8]).integers(0, n - b + 1, 2)]
    return np.unique(np.concatenate([np.arange(s0, s0 + b) for s0 in starts]))


def spd_residuals(args, paths, xs: dict) -> dict[str, float]:
    """``||S x - B||_F / (||S||_F ||x||_F)`` of each engine's x: one pass over S,
    tile by tile, all of them at once."""
    import zarr

    z = zarr.open_array(paths["spd"], mode="r")
    rhs = zarr.open_array(paths["b"], mode="r")[...]
    names = list(xs)
    x = np.hstack([np.asarray(xs[k], dtype=np.float64).reshape(rhs.shape) for k in names])
    sx = np.zeros_like(x)
    n, c = z.shape[0], z.chunks[0]
    t0 = time.perf_counter()
    for i0 in range(0, n, c):
        for j0 in range(0, n, c):
            sx[i0:i0 + c] += z[i0:i0 + c, j0:j0 + c] @ x[j0:j0 + c]
    log(f"residuals of {names}: one pass over S in {time.perf_counter() - t0:.1f} s")
    k, fro = rhs.shape[1], float(z.attrs["fro"])
    return {name: float(np.linalg.norm(sx[:, i * k:(i + 1) * k] - rhs)
                        / (fro * np.linalg.norm(x[:, i * k:(i + 1) * k])))
            for i, name in enumerate(names)}


def op_inputs(args, paths, op) -> tuple[str, str | None, np.ndarray | None]:
    """(matrix, right-hand side or None, rows the NumPy child returns) of ``op``."""
    if op in TALL_OPS:
        return paths["x"], paths["y"], sample_rows(args.m)
    if op == "rsvd":
        return paths["sq"], None, None
    return paths["spd"], paths["b"], spd_sample_rows(args.spd_n)


def incore_need(args, op) -> int:
    """Bytes NumPy in-core holds at most (about): the input and a copy or result
    (the SPD jobs: the input, factored in place)."""
    if op in TALL_OPS:
        return 2 * args.m * args.n * 8 + args.m * 8
    if op == "rsvd":
        return 2 * args.square_n ** 2 * 8
    return args.spd_n ** 2 * 8 + 2 * args.spd_n * N_RHS * 8  # both SPD jobs work in place


# -- engines ---------------------------------------------------------------------------


class _Runner:
    name = ""
    pids: list[int] = []
    client = None

    def __init__(self, args, paths):
        self.args, self.paths = args, paths
        self.rows = sample_rows(args.m)
        self.spd_rows = spd_sample_rows(args.spd_n)
        self.u_path = os.path.join(args.workdir, "out", f"U_{self.name}.zarr")
        self.l_path = os.path.join(args.workdir, "out", f"L_{self.name}.zarr")
        os.makedirs(os.path.dirname(self.u_path), exist_ok=True)

    def run(self, op: str) -> dict:
        rc0, wc0 = read_chars(self.client), write_chars(self.client)
        with RSSSampler(self.pids) as rss:
            t0 = time.perf_counter()
            value, extra = self._once(op)
            wall = time.perf_counter() - t0
        rc, wc = read_chars(self.client) - rc0, write_chars(self.client) - wc0
        # the stored factor on the sample rows, read after the timing
        if op == "svd_u":
            value["U_rows"] = read_rows(self.u_path, self.rows)
        if op == "cholesky":
            value["L_rows"] = read_rows(self.l_path, self.spd_rows)
        return dict(value=value, wall=wall, peak_rss=rss.peak, rchar=rc, wchar=wc, **extra)

    def close(self) -> None:
        shutil.rmtree(self.u_path, ignore_errors=True)
        shutil.rmtree(self.l_path, ignore_errors=True)


@contextlib.contextmanager
def recording_runs(eng):
    """Every ``eng.run`` inside the block, as ``(plan, RunStats)``: for jobs that
    run inside a library call (``svd_compressed``) and hand back neither."""
    runs = []
    inner = eng.run

    def run(graph, keys, **kw):
        values, stats = inner(graph, keys, **kw)
        runs.append((kw.get("plan"), stats))
        return values, stats

    eng.run = run
    try:
        yield runs
    finally:
        del eng.run  # the class's method again


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
        warm_workers(self.client, ["tilearray.graphs.linalg", "tilearray.graphs.blas",
                                   "tilearray.graphs.tsqr", "tilearray.graphs.cholesky",
                                   "tilearray.storage.io", "scipy.linalg", "zarr", "numcodecs"])
        log(f"tilearray BLAS per worker: {self.eng.blas_report()}")
        self.pids = worker_pids(self.client)
        self.x, self.y, self.sq, self.spd, self.b = (
            ta.open(paths[k]) if k in paths else None for k in ("x", "y", "sq", "spd", "b"))
        self._planned: dict[str, dict] = {}

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
        if op == "cholesky":
            return [("L", la.cholesky(self.spd))]
        raise ValueError(op)

    def _log_plan(self, op, what, plan):
        bound = (f", I/O lower bound {fmt_bytes(plan.io_lower_bound)}"
                 if plan.io_lower_bound else "")
        log(f"tilearray {op} {what}: plan {plan.tasks} tasks, read "
            f"{fmt_bytes(plan.bytes_read)}, written {fmt_bytes(plan.bytes_written)}, "
            f"peak/task {fmt_bytes(plan.peak_task_memory)}{bound}")
        for st in plan.stages:
            if st.io_lower_bound:
                log(f"  {st.kind}: {st.description}")

    def _figures(self, op, stats) -> dict:
        p = self._planned[op]
        return dict(
            bytes_read=sum(st.bytes_read for st in stats),
            bytes_written=sum(st.bytes_written for st in stats),
            plan_bytes_read=p["read"], plan_bytes_written=p["written"], plan_io_bound=p["bound"],
            notes=(f"{sum(st.tasks for st in stats)} tasks in {len(stats)} run(s); "
                   f"engine's peak {fmt_bytes(max(st.peak_worker_memory for st in stats))}"))

    def _plan_totals(self, op, plans) -> None:
        bounds = [p.io_lower_bound for p in plans if p is not None and p.io_lower_bound]
        self._planned[op] = dict(read=sum(p.bytes_read for p in plans),
                                 written=sum(p.bytes_written for p in plans),
                                 bound=sum(bounds) if bounds else None)

    def _recorded(self, op, call):
        """Jobs that run their plans inside a library call (svd_compressed: each
        power iteration's A.T @ (A @ V), then B = Q^T A; the mixed-precision SPD
        solve: the float32 factor, substitutions, residuals): their plans and
        stats are taken from the engine's runs."""
        with recording_runs(self.eng) as runs:
            value = call()
        if not runs:
            raise RuntimeError(f"{op} ran nothing on the benchmark's engine")
        if op not in self._planned:
            for i, (plan, _) in enumerate(runs):
                self._log_plan(op, f"run {i + 1} of {len(runs)}", plan)
            self._plan_totals(op, [p for p, _ in runs])
        return value, self._figures(op, [st for _, st in runs])

    def _rsvd(self):
        a = self.args
        _, s, vt = self.ta.linalg.svd_compressed(self.sq, a.rsvd_k,
                                                  n_power_iter=a.rsvd_power_iter, seed=SEED)
        return {"s": np.asarray(s), "Vt": np.asarray(vt)}

    def _solve_spd(self):
        import dask

        with dask.config.set({"tilearray.linalg.spd-solve": self.args.spd_solve}):
            return {"x": self.ta.linalg.solve(self.spd, self.b, assume_a="pos")}

    def _once(self, op):
        if op == "rsvd":
            return self._recorded(op, self._rsvd)
        if op == "solve_spd":
            return self._recorded(op, self._solve_spd)
        exprs = self._exprs(op)
        stored = {"U": self.u_path, "L": self.l_path}
        if op not in self._planned:
            plans = []
            for what, e in exprs:
                plan = e.plan(stored[what], engine=self.eng) if what in stored \
                    else e.plan(engine=self.eng)
                self._log_plan(op, what, plan)
                plans.append(plan)
                if op == "svd_u":  # s and Vt are named outputs of U's plan: read nothing after
                    break
            self._plan_totals(op, plans)
        value, stats = {}, []
        for what, e in exprs:
            if what in stored:
                out = e.to_zarr(stored[what], overwrite=True, engine=self.eng)
                stats.append(out.stats)
            elif what == "lstsq":
                sol, res, rank, s = e.compute(engine=self.eng)
                value.update(b=np.asarray(sol).reshape(self.args.n, -1)[:, 0], s=s, rank=rank)
                stats.append(e.stats)
            else:
                value[what] = e.compute(engine=self.eng)
                stats.append(e.stats)
        return value, self._figures(op, stats)

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
        warm_workers(self.client, ["dask.array", "dask.array.linalg", "scipy.linalg", "zarr",
                                   "numcodecs", "numpy"])
        self.pids = worker_pids(self.client)
        self.x, self.y, self.sq, self.spd, self.b = (
            da.from_zarr(paths[k]) if k in paths else None for k in ("x", "y", "sq", "spd", "b"))
        if self.x is not None and len(self.x.chunks[1]) != 1:
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
            if op == "rsvd":
                a = self.args
                _, s, v = da.linalg.svd_compressed(self.sq, a.rsvd_k,
                                                   n_power_iter=a.rsvd_power_iter, seed=SEED)
                s, v = dask.compute(s, v)
                return {"s": s, "Vt": v}, dict(
                    notes="da.linalg.svd_compressed; s, v in one compute (u culled)")
            if op == "cholesky":
                low = da.linalg.cholesky(self.spd, lower=True)
                dask.compute(da.to_zarr(low, self.l_path, overwrite=True, compute=False))
                return {}, dict(notes="da.to_zarr(da.linalg.cholesky(S, lower=True))")
            if op == "solve_spd":
                sol = da.linalg.solve(self.spd, self.b, assume_a="pos").compute()
                return {"x": sol}, dict(notes='da.linalg.solve(S, B, assume_a="pos")')
        raise ValueError(op)

    def close(self):
        try:
            self.client.close()
            self.cluster.close()
        finally:
            super().close()


def _numpy_child(x_path, y_path, op, rows, k=0):
    """Fresh process: load X (and y) with zarr, then numpy.linalg, all BLAS threads
    (cholesky, solve_spd: one)."""
    import zarr
    from threadpoolctl import threadpool_info, threadpool_limits

    if op in SPD_OPS:  # scipy's own OpenBLAS, loaded before the limit so that it gets it
        import scipy.linalg  # noqa: F401

    # OpenBLAS's multi-threaded potrf crashes on this machine
    with threadpool_limits(1 if op in SPD_OPS else None, user_api="blas"):
        t0 = time.perf_counter()
        X = zarr.open_array(x_path, mode="r")[...]
        y = zarr.open_array(y_path, mode="r")[...] if op in ("lstsq", "solve_spd") else None
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
        elif op == "rsvd":
            out["s"] = np.linalg.svd(X, compute_uv=False)[:k]
        elif op == "cholesky":
            # in place: X is C-ordered and symmetric, so X.T is the same matrix F-ordered
            low = scipy.linalg.cholesky(X.T, lower=True, overwrite_a=True, check_finite=False)
            out["L_rows"] = low[rows]
        elif op == "solve_spd":
            out["x"] = scipy.linalg.solve(X.T, y, assume_a="pos", overwrite_a=True,
                                          check_finite=False)
        t2 = time.perf_counter()
        blas = [(i.get("internal_api"), i.get("num_threads"), i.get("architecture"))
                for i in threadpool_info()]
    return dict(value=out, load=t1 - t0, compute=t2 - t1, blas=blas,
                coretype=os.environ.get("OPENBLAS_CORETYPE"))


class NumpyRunner(_Runner):
    """Load + numpy.linalg in a fresh process per run; wall = load + compute
    (interpreter start-up excluded), RSS that process's."""

    name = "numpy"
    blas = coretype = None

    def run(self, op):
        import psutil

        need, avail = incore_need(self.args, op), psutil.virtual_memory().available
        if need > 0.9 * avail:
            raise Skipped(f"needs about {fmt_bytes(need)} in memory, {fmt_bytes(avail)} "
                          "available")
        x_path, y_path, rows = op_inputs(self.args, self.paths, op)
        r = run_in_child(_numpy_child, x_path, y_path, op, rows, self.args.rsvd_k)
        log(f"numpy {op}: load {r['load']:.2f} s + compute {r['compute']:.2f} s; BLAS "
            f"{r['blas']}; OPENBLAS_CORETYPE={r['coretype']!r}")
        if op not in SPD_OPS or self.blas is None:  # the header shows the unlimited BLAS
            self.blas = r["blas"]
        self.coretype = r["coretype"]
        threads = "; 1 BLAS thread" if op in SPD_OPS else ""
        return dict(value=r["value"], wall=r["load"] + r["compute"], load=r["load"],
                    compute=r["compute"], peak_rss=r["peak_rss"], rchar=r["read_chars"],
                    notes=f"load {r['load']:.1f} s + compute {r['compute']:.1f} s{threads}")


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
        gemm = [machine_check(args)]
        for rep in range(args.repeats):
            for k, op in enumerate(ops):
                j = (rep + k) % len(live) if live else 0
                for e in live[j:] + live[:j]:
                    prev = results[e].get(op)
                    if prev is not None and ("error" in prev or "skipped" in prev):
                        continue
                    if args.cache == "cold":
                        evict(*op_inputs(args, paths, op)[:2])
                    try:
                        r = runners[e].run(op)
                    except Skipped as ex:
                        results[e][op] = {"skipped": str(ex)}
                        log(f"{e} {op} skipped: {ex}")
                        continue
                    except Exception as ex:
                        traceback.print_exc(file=sys.stderr)
                        results[e][op] = {"error": f"{type(ex).__name__}: {ex}"[:160]}
                        log(f"{e} {op} FAILED: {results[e][op]['error']}")
                        continue
                    log(f"round {rep + 1} {op:10s} {e:9s} {r['wall']:7.2f} s  peak RSS "
                        f"{fmt_bytes(r['peak_rss'])}  {r.get('notes', '')}")
                    results[e].setdefault(op, {"runs": []})["runs"].append(r)
        extra = {"gemm": [*gemm, machine_check(args)]}
        if "numpy" in runners:
            extra.update(blas=runners["numpy"].blas, coretype=runners["numpy"].coretype)
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


def machine_check(args) -> float:
    """The machine's gemm GFLOP/s as the workers see it: ``args.workers``
    one-thread dgemms at once, summed (logged with each one's rate)."""
    rates = concurrent_dgemm_gflops(args.workers)
    log("machine check: " + " + ".join(f"{r:.1f}" for r in rates)
        + f" = {sum(rates):.1f} GFLOP/s ({args.workers} concurrent one-thread dgemms)")
    return sum(rates)


RSVD_REFERENCE_MAX_N = 8192
"""Largest square A whose untimed NumPy SVD serves as rsvd's reference."""


def numpy_reference(args, paths, ops, results) -> dict:
    """op -> NumPy's values: from the numpy engine's first run, else from one
    untimed child run when the input fits in memory (3 times it at most a third
    of RAM; never for cholesky / solve_spd, whose checks need no reference)."""
    import psutil

    ref = {}
    for op in ops:
        runs = results.get("numpy", {}).get(op, {}).get("runs")
        if runs:
            ref[op] = runs[0]["value"]
            continue
        if op in SPD_OPS:
            continue
        need = 3 * (args.square_n ** 2 if op == "rsvd" else args.m * args.n) * 8
        if need > psutil.virtual_memory().available / 3:
            log(f"no NumPy reference for {op}: its input does not fit in memory here")
            continue
        if op == "rsvd" and args.square_n > RSVD_REFERENCE_MAX_N:
            log(f"no NumPy reference for rsvd: a full SVD of {args.square_n}² is O(n³) "
                f"(it ran over 15 min at 16384² here); s is checked against the designed "
                f"spectrum and the engines against each other (--engines numpy runs it)")
            continue
        log(f"NumPy reference for {op} (untimed child)")
        x_path, y_path, rows = op_inputs(args, paths, op)
        try:
            ref[op] = run_in_child(_numpy_child, x_path, y_path, op, rows,
                                   args.rsvd_k)["value"]
        except RuntimeError as e:  # the timings already taken still get their table
            log(f"no NumPy reference for {op}: {e}")
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

    if op == "rsvd":  # randomized: value by value, to issue 29's 1e-6
        rel = s_rel(got["s"], want["s"])
        if rel > RSVD_TOL:
            ok = False
        msgs.append(f"s {'rel' if rel <= RSVD_TOL else 'MISMATCH rel'} {rel:.1e}")
    elif "s" in want and "s" in got:
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
    if op == "cholesky" and "L_rows" in got and "L_rows" in want:
        check("L[rows]", got["L_rows"], want["L_rows"],
              scale=float(np.abs(want["L_rows"]).max()))
    if op == "solve_spd":
        check("x", got["x"], want["x"], scale=float(np.abs(want["x"]).max()))
    return ok, ", ".join(msgs)


def s_rel(s, want) -> float:
    """Largest relative error value by value, ``max |s_i - w_i| / w_i``."""
    s, want = np.asarray(s).ravel(), np.asarray(want).ravel()
    return float(np.max(np.abs(s - want) / want)) if s.shape == want.shape else math.inf


def self_check(op: str, got: dict, ctx: dict, residual: float | None) -> tuple[bool, str] | None:
    """The checks a result passes on its own: rsvd's s against the designed
    spectrum, L's rows against S, the solve's residual."""
    from tilearray.testing import assert_close

    if op == "rsvd":
        rel = s_rel(got["s"], ctx["designed_s"])
        ok = rel <= RSVD_TOL
        return ok, f"s vs designed {'rel' if ok else 'MISMATCH rel'} {rel:.1e}"
    if op == "cholesky" and "L_rows" in got:
        low, rows, s_rr = np.asarray(got["L_rows"]), ctx["spd_rows"], ctx["s_rr"]
        upper = float(np.max(np.abs(low[np.arange(low.shape[1]) > rows[:, None]]), initial=0))
        llt = low @ low.T
        err = float(np.max(np.abs(llt - s_rr)) / np.max(np.abs(s_rr)))
        try:
            assert_close(llt, s_rr, scale=float(np.max(np.abs(s_rr))))
            ok = upper == 0
        except AssertionError:
            ok = False
        return ok, (f"{len(rows)} rows: above diagonal {'0' if upper == 0 else f'{upper:.1e}'}, "
                    f"L L^T vs S rel {err:.0e}")
    if op == "solve_spd" and residual is not None:
        ok = residual < SOLVE_TOL
        return ok, f"residual {residual:.1e}"
    return None


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


def io_bound(args, op, results) -> tuple[int, str]:
    """The figure a job's bytes read are set against, and its name."""
    m, n = args.m, args.n
    if op in TALL_OPS:
        bound = {"svd_u": 2 * m * n * 8, "lstsq": m * n * 8 + m * 8}.get(op, m * n * 8)
        return bound, "bound " + {"svd_u": "2 X", "lstsq": "X + y"}.get(op, "X")
    if op == "rsvd":
        passes = 2 + args.rsvd_power_iter
        return (passes * args.square_n ** 2 * 8,
                f"no bound: 2 + q = {passes} passes over A")
    last = results.get("tilearray", {}).get(op, {}).get("runs", [{}])[-1]
    if last.get("plan_io_bound"):
        bound = last["plan_io_bound"]
    else:  # the same figure, without the tilearray run
        from tilearray.engine.plan.cholesky import io_bound as chol_bound
        from tilearray.engine.plan.types import Budget

        budget = Budget.from_config(parse_bytes(args.memory_per_worker), args.workers, 1)
        bound = chol_bound(args.spd_n, 8, budget)
    return bound, "bound Cholesky n^3/(3 sqrt(M))" + (
        " (substitutions not in it)" if op == "solve_spd" else "")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--m", type=int, default=2_000_000, help="rows of X (2,000,000)")
    p.add_argument("--n", type=int, default=256, help="columns of X (256)")
    p.add_argument("--chunk-rows", type=int, default=65536,
                   help="rows per chunk of X and y (65536); a chunk holds all n columns")
    p.add_argument("--square-n", type=int, default=16384,
                   help="rsvd: A is N x N (16384, 2 GiB)")
    p.add_argument("--square-chunk", type=int, default=2048,
                   help="rsvd: side of A's square chunks (2048)")
    p.add_argument("--rsvd-k", type=int, default=20, help="rsvd: singular triplets (20)")
    p.add_argument("--rsvd-power-iter", type=int, default=2,
                   help="rsvd: power iterations q (2)")
    p.add_argument("--spd-n", type=int, default=32768,
                   help="cholesky, solve_spd: S is N x N (32768, 8 GiB), B N x 8")
    p.add_argument("--spd-chunk", type=int, default=2048,
                   help="cholesky, solve_spd: side of S's square chunks, rows of B's (2048)")
    p.add_argument("--spd-solve", choices=("auto", "mixed", "double"), default="auto",
                   help="solve_spd: tilearray.linalg.spd-solve (auto: mixed precision at "
                        "32768² with 8 right-hand sides)")
    p.add_argument("--memory-per-worker", default="1GiB")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--workdir", "--data-dir", dest="workdir", default=os.path.join(
        os.environ.get("TMPDIR", "/tmp"), "tilearray-bench"),
        help="inputs (reused) and the stored U's and L's go here")
    p.add_argument("--engines", default=",".join(ENGINES),
                   help="comma-separated subset of " + ",".join(ENGINES))
    p.add_argument("--ops", default=",".join(OPS), help="comma-separated subset of "
                   + ",".join(OPS))
    p.add_argument("--cache", choices=("cold", "as-found"), default="cold",
                   help="cold (default): the job's inputs are dropped from the OS page cache "
                        "before every engine's run, so each reads them from disk; as-found: "
                        "left as the previous run left them")
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
    if "rsvd" in ops and not 1 <= args.rsvd_k <= args.square_n:
        p.error(f"--rsvd-k {args.rsvd_k} must be in [1, --square-n]")

    m, n, sq, spd = args.m, args.n, args.square_n, args.spd_n
    tall, square, sym = (any(o in TALL_OPS for o in ops), "rsvd" in ops,
                         any(o in SPD_OPS for o in ops))
    x_bytes = m * n * 8
    coretype = os.environ.get("OPENBLAS_CORETYPE")
    inputs = ([f"X {m} x {n} float64 ({fmt_bytes(x_bytes)}), chunks {args.chunk_rows} x {n}"]
              * tall + [f"A {sq}^2 ({fmt_bytes(sq * sq * 8)}), chunks {args.square_chunk}^2"]
              * square + [f"S {spd}^2 ({fmt_bytes(spd * spd * 8)}), chunks {args.spd_chunk}^2"]
              * sym)
    log(f"linalg on {'; '.join(inputs)}; {args.workers} workers x {args.memory_per_worker}; "
        f"engines {engines}, ops {ops}; OPENBLAS_CORETYPE={coretype!r} (left as found)")
    paths = {}
    if tall:
        paths.update(ensure_inputs(args))
    if square:
        paths["sq"] = ensure_square(args)
    if sym:
        paths.update(ensure_spd(args))
    on_disk = {k: dir_size(v) for k, v in paths.items()}

    results, extra = run_all(args, paths, engines, ops)
    ref = numpy_reference(args, paths, ops, results)
    x_rows = read_rows(paths["x"], sample_rows(m)) if tall else None
    ctx = {}
    if square:
        ctx["designed_s"] = rsvd_spectrum(sq)[:args.rsvd_k]
    if "cholesky" in ops:
        import zarr

        ctx["spd_rows"] = spd_sample_rows(spd)
        ctx["s_rr"] = zarr.open_array(paths["spd"], mode="r").get_orthogonal_selection(
            (ctx["spd_rows"], ctx["spd_rows"]))
    residuals = {}
    if "solve_spd" in ops:
        xs = {e: results[e]["solve_spd"]["runs"][-1]["value"]["x"] for e in engines
              if "runs" in results.get(e, {}).get("solve_spd", {})}
        if xs:
            residuals = spd_residuals(args, paths, xs)

    table, failed = [], False
    for op in ops:
        bound, bound_txt = io_bound(args, op, results)

        def cell(eng, op=op):
            r = results.get(eng, {}).get(op)
            if r is None:
                return None
            if "error" in r:
                return "FAILED: " + r["error"]
            if "skipped" in r:
                return "skipped: " + r["skipped"]
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
        io_txt = f"{bound_txt} = {fmt_bytes(bound)}; " + "; ".join(io)
        if op in WRITES:
            wr = []
            if "runs" in ta_r:
                last = ta_r["runs"][-1]
                wr.append(f"ta plan {fmt_bytes(last['plan_bytes_written'])} / measured "
                          f"{fmt_bytes(last['bytes_written'])}")
            for eng in engines:
                r = results.get(eng, {}).get(op, {})
                if "runs" in r and r["runs"][-1].get("wchar", -1) >= 0:
                    wr.append(f"{SHORT[eng]} wchar {fmt_bytes(r['runs'][-1]['wchar'])}")
            if wr:
                io_txt += "; written: " + ", ".join(wr)

        checks = []
        for eng in engines:
            r = results.get(eng, {}).get(op, {})
            if "runs" not in r:
                continue
            got = r["runs"][-1]["value"]
            own = self_check(op, got, ctx, residuals.get(eng))
            if own is not None:
                ok, msg = own
                failed |= not ok
                checks.append(f"{eng}: {'ok' if ok else 'FAIL'} ({msg})")
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
        job = OPS[op]
        if op == "rsvd":
            job = f"randomized SVD of A: top-{args.rsvd_k} s, Vt (q = {args.rsvd_power_iter})"
        table.append([job, cell("tilearray"), cell("dask"), cell("numpy"),
                      _ratio_cell(results, "dask", "tilearray", op),
                      _ratio_cell(results, "numpy", "tilearray", op),
                      ", ".join(rss), io_txt, "; ".join(checks) or None])

    what = {"x": f"X {m:,} x {n} float64 ({fmt_bytes(x_bytes)}; chunks {args.chunk_rows} x {n})",
            "y": "y",
            "sq": f"A {sq:,}^2 float64 ({fmt_bytes(sq * sq * 8)}; chunks {args.square_chunk}^2; "
                  f"rank-{min(RSVD_RANK, sq)} s_i = N 10^(-i/{RSVD_DECADE}) + noise "
                  f"||E|| ~ {RSVD_NOISE:g} s_0)",
            "spd": f"S {spd:,}^2 float64 SPD ({fmt_bytes(spd * spd * 8)}; chunks "
                   f"{args.spd_chunk}^2; symmetric uniform(-1, 1) off the diagonal, N on it)",
            "b": f"B {spd:,} x {N_RHS}"}
    print(f"### Linear algebra (issue 29): tilearray vs dask.array vs NumPy in-core; "
          f"{args.workers} workers x 1 thread x {args.memory_per_worker}\n")
    print("- inputs, plain zarr (bytes + zstd 0), on disk: "
          + "; ".join(f"{what[k]} {fmt_bytes(v)}" for k, v in on_disk.items()))
    print(f"- wall: median of {args.repeats} interleaved round(s) (all rounds in brackets); "
          "ratios: median of the per-round ratios (> 1: tilearray faster)")
    print("- NumPy: a fresh process, load (zarr read of the input, and y / B) + numpy.linalg "
          f"compute, BLAS {extra.get('blas')}; cholesky / solve_spd (scipy.linalg.solve, "
          "assume_a='pos') with 1 BLAS thread (multi-threaded OpenBLAS potrf crashes here); "
          f"OPENBLAS_CORETYPE={extra.get('coretype', coretype)!r} (left as found). U and L "
          "are computed in memory, not stored")
    before, after = extra["gemm"]
    machine = (f"- machine check (shared host, its speed drifts): {args.workers} concurrent "
               f"one-thread dgemms (4096 x 4096 x 512 updates) {before:.1f} GFLOP/s in all "
               f"before the rounds, {after:.1f} after")
    if sym:
        flops = spd ** 3 / 3
        machine += (f"; the Cholesky's n^3/3 = {flops / 1e12:.2f} TFLOP take "
                    f"{flops / max(before, after) / 1e9:.1f}-{flops / min(before, after) / 1e9:.1f}"
                    " s at that rate")
        walls = {e: statistics.median(_walls(results[e]["cholesky"])) for e in engines
                 if "runs" in results.get(e, {}).get("cholesky", {})}
        if walls:
            machine += "; Cholesky GFLOP/s: " + ", ".join(
                f"{e} {flops / w / 1e9:.1f}" for e, w in walls.items())
    print(machine)
    print("- peak RSS: largest over the worker processes (ta = tilearray, da = dask) "
          "sampled every 0.2 s during the job; np = the NumPy process"
          + (f"; tilearray plans for {fmt_bytes(extra['ta_task_memory'])} per task, its "
             f"workers' lifetime ru_maxrss {fmt_bytes(extra['ta_ru_maxrss'])}"
             if "ta_task_memory" in extra else ""))
    print("- bytes read: against the I/O lower bound (one read of X for R / s / lstsq, two for "
          "U, as issue 29 states; cholesky / solve_spd: n^3/(3 sqrt(M)) words with M the task "
          "memory, the bound tilearray's plan reports, the substitutions not in it) or, for "
          "rsvd, 2 + q passes over A (one per power iteration); tilearray's plan and measured "
          "RunStats.bytes_read (decoded bytes, summed over the job's runs: svd_u runs "
          "U.to_zarr, s.compute() and Vt.compute() separately); rchar = bytes through read "
          "syscalls of the last round (compressed chunk files, page cache and dask's spill "
          "included). Written (U, L, solve_spd's temporary L): tilearray's plan and "
          "RunStats.bytes_written, wchar of the workers (write syscalls, spill included)")
    print("- check: against NumPy's result on the same data (s within 1e-10 relative to "
          "s[0]; R, Vt and U on sample rows up to signs; U s Vt on the sample rows == X; "
          f"lstsq solution; rsvd's top-k s within {RSVD_TOL:g} relative value by value, also "
          "of the designed spectrum; L on sample rows; the solve's x) with "
          "tilearray.testing.assert_close, max abs errors shown; L on sample rows: 0 above "
          f"the diagonal and L L^T == S there; the solve: ||S x - B|| / (||S|| ||x||) < "
          f"{SOLVE_TOL:g}\n")
    print(markdown_table(
        ["job", "tilearray median (rounds)", "dask", "NumPy (load + compute)",
         "dask / tilearray", "numpy / tilearray", "peak worker RSS",
         "bytes read (written) vs lower bound", "check"], table))
    sys.stdout.flush()
    shutil.rmtree(os.path.join(args.workdir, "out"), ignore_errors=True)
    errored = any("error" in results[e].get(op, {}) for e in engines for op in ops)
    return 1 if failed or errored else 0


if __name__ == "__main__":
    sys.exit(main())
