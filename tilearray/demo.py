"""The main job behind ``make run``: out-of-core matmul, reductions and linear
algebra, verified.

Generates two matrices in Zarr, plans and runs ``A @ B`` and column / row
reductions on an embedded LocalCluster under a per-worker memory budget,
verifies sampled tiles and reductions against NumPy, then factors a
tall-skinny matrix (QR, SVD, least squares) and a square SPD one (Cholesky,
solve), and prints the plans, progress and measured figures.

    python -m tilearray.demo [--n 4096] [--memory-per-worker 768MiB] [--workers 2]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
from dask.utils import format_bytes

import tilearray as ta


def _sampled_matmul_check(a, b, c, rng, samples=3, width=256):
    """Compare random output blocks of C with NumPy on panels read back from Zarr."""
    za, zb, zc = a.to_dask(), b.to_dask(), c.to_dask()
    worst = 0.0
    for _ in range(samples):
        i = int(rng.integers(0, max(a.shape[0] - width, 1)))
        j = int(rng.integers(0, max(b.shape[1] - width, 1)))
        want = za[i : i + width].compute() @ zb[:, j : j + width].compute()
        got = zc[i : i + width, j : j + width].compute()
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)
        worst = max(worst, float(np.max(np.abs(got - want))))
    return worst


def _tall_skinny(n: int, d: str, rng) -> None:
    """QR, singular values, the thin SVD (U stored) and least squares of a
    tall-skinny X by TSQR."""
    x = ta.random((32 * n, 64), f"{d}/X.zarr", tile=(4 * n, 64), seed=3, overwrite=True)
    x_np = x.compute()
    beta = np.linspace(-1, 1, 64)
    y = x_np @ beta + 0.01 * rng.standard_normal(x.shape[0])
    print(f"tall-skinny X {x}")
    r = ta.linalg.qr(x, mode="r")
    print(r.plan(), flush=True)
    got = r.compute()
    np.testing.assert_allclose(np.abs(got), np.abs(np.linalg.qr(x_np, mode="r")), atol=1e-8)
    print(f"R of QR(X): {got.shape}, diag >= 0  [{r.stats}] verified against NumPy\n")
    s = ta.linalg.svd(x, compute_uv=False).compute()
    np.testing.assert_allclose(s, np.linalg.svd(x_np, compute_uv=False), rtol=1e-9)
    print(f"singular values of X: {np.array2string(s[:4], precision=4)} ... verified\n")
    u, s_u, vt = ta.linalg.svd(x)  # thin SVD: U written to Zarr, row block by row block
    print(u.plan(f"{d}/U.zarr"), flush=True)
    u_np = np.asarray(u.to_zarr(f"{d}/U.zarr", overwrite=True))
    orth = np.abs(u_np.T @ u_np - np.eye(u_np.shape[1])).max()
    recon = np.abs((u_np * s_u.compute()) @ vt.compute() - x_np).max()
    assert orth < 1e-12 and recon < 1e-9, (orth, recon)
    print(f"U of the thin SVD: {u_np.shape} stored, |U^T U - I| {orth:.1e}, "
          f"|U s Vt - X| {recon:.1e}  [{u.stats}] verified\n")
    print(ta.linalg.lstsq_plan(x, y).plan(), flush=True)
    sol, res, rank, _ = ta.linalg.lstsq(x, y)
    np.testing.assert_allclose(sol, np.linalg.lstsq(x_np, y, rcond=None)[0], atol=1e-9)
    print(f"lstsq(X, y): rank {rank}, residual {float(res[0]):.4f}, max |b - beta| "
          f"{np.abs(sol - beta).max():.2e}; verified against NumPy\n", flush=True)


def _square(a, b, d: str) -> None:
    """Cholesky factor (stored) and an SPD solve of the Gram matrix of the
    stacked inputs, ``S = [A; B]^T [A; B] / 2n`` (well conditioned: the
    inputs are standard normal)."""
    n = a.shape[1]
    stacked = np.vstack([a, b])
    s = (stacked.T @ stacked / (2 * n)).to_zarr(f"{d}/S.zarr", overwrite=True)
    s_np = s.compute()
    print(f"SPD S = [A; B]^T [A; B] / 2n: {s}  [{s.stats}]")
    f = ta.linalg.cholesky(s)
    print(f.plan(f"{d}/L.zarr"), flush=True)
    l_np = np.asarray(f.to_zarr(f"{d}/L.zarr", overwrite=True))
    err = np.abs(l_np - np.linalg.cholesky(s_np)).max()
    assert err < 1e-9, err
    print(f"L = cholesky(S) stored, max |L - NumPy's| {err:.1e}  [{f.stats}] verified\n")
    rhs = np.linspace(-1.0, 1.0, n)
    print(ta.linalg.solve_plan(s, rhs, assume_a="pos").plan(), flush=True)
    x = ta.linalg.solve(s, rhs, assume_a="pos")  # float32 factor, refined in float64
    np.testing.assert_allclose(x, np.linalg.solve(s_np, rhs), rtol=1e-10, atol=1e-12)
    print(f"solve(S, b, assume_a='pos'): |S x - b| {np.abs(s_np @ x - rhs).max():.1e}; "
          "verified against NumPy\n", flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tilearray.demo", description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=4096, help="matrix side (default 4096)")
    p.add_argument("--tile", type=int, default=1024, help="Zarr chunk side (default 1024)")
    p.add_argument("--memory-per-worker", default="768MiB")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--data-dir", default="data")
    args = p.parse_args(argv)
    n, t, d = args.n, args.tile, args.data_dir
    os.makedirs(d, exist_ok=True)
    rng = np.random.default_rng(0)

    print(f"tilearray {ta.__version__}: out-of-core demo, n={n}, tile={t}, "
          f"{args.workers} workers x {args.memory_per_worker}", flush=True)
    with ta.Engine(n_workers=args.workers, threads_per_worker=1,
                   memory_per_worker=args.memory_per_worker) as engine:
        print(engine, flush=True)
        t0 = time.perf_counter()
        a = ta.random((n, n), f"{d}/A.zarr", tile=(t, t), seed=1, overwrite=True)
        b = ta.random((n, n), f"{d}/B.zarr", tile=(t, t), shard=(2 * t, 2 * t), seed=2,
                      overwrite=True)
        print(f"\ninputs written in {time.perf_counter() - t0:.1f} s:\n  A {a}\n  B {b}")
        print(f"  each input is {format_bytes(a.nbytes)}; a worker may hold "
              f"{args.memory_per_worker} in all\n", flush=True)

        expr = a @ b
        print(expr.plan(), "\n", flush=True)
        c = expr.to_zarr(f"{d}/C.zarr", overwrite=True)
        s = c.stats
        gflops = 2 * n**3 / s.wall_seconds / 1e9
        print(f"C = A @ B: {s}\n  {gflops:.1f} GFLOP/s, BLAS {s.blas_seconds:.1f} s, "
              f"waiting for reads {s.io_wait_seconds:.1f} s (task-seconds)")
        err = _sampled_matmul_check(a, b, c, rng)
        print(f"  verified 3 sampled {256}x{256} blocks against NumPy (max abs err {err:.2e})\n")

        reductions = {
            "A.mean(axis=0)": (a.mean(axis=0), lambda x, y: x.mean(0)),
            "A.std(axis=1)": (a.std(axis=1), lambda x, y: x.std(1)),
            "(A - B).sum(axis=0)": ((a - b).sum(axis=0), lambda x, y: (x - y).sum(0)),
            "norm(A)": (ta.linalg.norm(a), lambda x, y: np.linalg.norm(x)),
        }
        x_np, y_np = a.compute(), b.compute()  # small enough here to check everything
        for name, (e, ref) in reductions.items():
            print(e.plan(), flush=True)
            got = e.compute()
            np.testing.assert_allclose(got, ref(x_np, y_np), rtol=1e-9)
            shown = (f"{float(got):.4f}" if np.ndim(got) == 0 else
                     np.array2string(np.asarray(got)[:4], precision=4))
            print(f"{name} = {shown}{' ...' if np.size(got) > 4 else ''}  "
                  f"[{e.stats}] verified against NumPy\n", flush=True)
        _tall_skinny(n, d, rng)
        _square(a, b, d)
    print("all results verified against NumPy.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
