"""Left-looking LU with partial pivoting by column panels, as tasks (the
out-of-core form of :func:`tilearray.graphs.linalg.lu_tiled`, order "left").

Row interchanges are never applied to stored data: L's panels are stored
with rows indexed by ORIGINAL row, and each panel task gathers A's panel and
the L panels to its left through the current permutation, which applies
every earlier pivot. Panel ``j`` (one task, after panel ``j - 1``, whose
result is the permutation so far): for each ``k < j``, ``U_kj`` by a unit
lower ``trsm`` and the rows below updated by ``gemm``; then ``getrf`` of the
rest; its column of U (pivoted order) and of L (original order) written
whole. ``L y = P b`` is a forward sweep over L's panels (one task each,
carrying ``y``, small); ``U x = y`` is :func:`~.cholesky.substitute`.

Stats: every task reports only its own (the plan gathers them).
"""

from __future__ import annotations

import numpy as np

from ..storage import IOStats, read_region, write_block
from . import blas as kern
from .cholesky import SlogdetResult, stacked
from .matmul import counted
from .spec import evaluate


def panel(a_spec, a_deps, l_ref, u_ref, edges, j: int, n: int, band: int, dtype,
          allow_singular: bool, prev=None):
    """Column panel ``j`` of ``A[perm] = L U`` (A's panel read ``band`` rows at
    a time): returns ``((perm, diag of U_jj), stats)``. ``allow_singular``: a
    zero pivot is kept (a determinant), not raised."""
    stats = IOStats()
    perm = np.arange(n) if prev is None else prev[0][0].copy()
    c0, c1 = edges[j]
    w = c1 - c0
    a = np.empty((n, w), dtype)
    for r0 in range(0, n, band):
        r1 = min(r0 + band, n)
        a[r0:r1] = evaluate(a_spec, (r0, r1), (c0, c1), list(a_deps), stats)
    col = np.asfortranarray(a[perm])
    del a
    for k0, k1 in edges[:j]:
        lk = np.asarray(read_region(l_ref, (0, n), (k0, k1), stats))[perm[k0:]]
        col[k0:k1] = kern.trsm_left_lower(lk[:k1 - k0], col[k0:k1], unit_diagonal=True)
        col[k1:] = kern.gemm_update(col[k1:], lk[k1 - k0:], col[k0:k1])
        del lk
    lu, p = kern.getrf_panel(col[c0:], col0=c0, index=j, allow_singular=allow_singular)
    perm[c0:] = perm[c0:][p]
    out = np.zeros((n, w), dtype)
    out[:c0] = col[:c0]
    out[c0:c1] = np.triu(lu[:w])
    del col
    write_block(u_ref, (0, n), (c0, c1), out, stats)
    out[:] = 0
    out[perm[c0:]] = np.tril(lu, -1) + np.eye(n - c0, w, dtype=dtype)
    write_block(l_ref, (0, n), (c0, c1), out, stats)
    return (perm, np.diagonal(lu[:w]).copy()), counted(stats.as_dict())


def forward(l_ref, edges, k: int, n: int, b_spec, b_deps, cols: tuple, dtype, last, prev=None):
    """Step ``k`` of ``L y = P b`` for the right-hand sides' columns ``cols``:
    ``y`` (pivoted order) so far, updated by L's panel ``k``."""
    stats = IOStats()
    perm = last[0][0]
    if prev is None:
        b = np.asarray(evaluate(b_spec, (0, n), cols, list(b_deps), stats))
        c = np.asfortranarray(b[perm], dtype=dtype)
    else:
        c = np.array(prev[0], dtype=dtype, order="F")  # never the dependency's own array
    k0, k1 = edges[k]
    lk = np.asarray(read_region(l_ref, (0, n), (k0, k1), stats))[perm[k0:]]
    c[k0:k1] = kern.trsm_left_lower(lk[:k1 - k0], c[k0:k1], unit_diagonal=True)
    c[k1:] = kern.gemm_update(c[k1:], lk[k1 - k0:], c[k0:k1])
    return c, counted(stats.as_dict())


def join_columns(*parts):
    """The solutions of the right-hand sides' column groups side by side;
    merges their stats (as :func:`~.cholesky.gather` does its row tiles')."""
    return stacked(np.hstack, parts)


def slogdet(dtype, *panels):
    """NumPy's ``slogdet`` from the panels' results: the final permutation's
    parity and U's diagonal."""
    perm = panels[-1][0][0]
    diag = np.concatenate([p[0][1] for p in panels])
    sign, logabs = kern.slogdet_from_lu(perm, diag)
    t = np.dtype(dtype).type
    return SlogdetResult(t(sign), t(logabs)), {"tasks": 1}
