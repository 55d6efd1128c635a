"""Tiled Cholesky, triangular solves and one-task dense routines, as tasks.

Cholesky is left-looking by tile: task ``(i, j)`` (``i >= j``) reads
``A_ij`` strip by strip, subtracts ``L_ik L_jk^T`` for the columns left of
the tile streaming one pair of L column panels at a time (read back from the
output array, written earlier by the tasks it depends on), then factors
(``potrf``, ``i == j``) or solves with ``L_jj`` (``trsm``, ``i > j``) in
place and writes ``L_ij`` unit by unit, with their done markers. A tile is
several of the output's I/O units: the planner makes it as large as a task
holds, since the L reads fall as the tile grows. Each row's tiles above the
diagonal are marked as zeros by one task, and not stored (Zarr reads a chunk
it did not store as the fill value, 0): half the factor's disk and writes.

Triangular solves (``T X = B``) are blocked substitution: task ``i`` reads
row tile ``i`` of T (the tiles left of the diagonal, or right of it going
backwards), the right-hand sides' rows and the solved row tiles before it.

Stats: every task counts itself once; a substitution's gather task merges
its row tasks' figures (a small right-hand side's are gathered by the plan
on their own), the tile tasks report only their own.
"""

from __future__ import annotations

import numpy as np

from ..errors import NotPositiveDefiniteError, SingularMatrixError
from ..storage import IOStats, buffers, prefetch_region, read_region, write_block, write_fill
from . import blas as kern
from .matmul import counted, merge_stats
from .spec import Read, evaluate, prefetch, prefetch_next, unit_edges

SlogdetResult = type(np.linalg.slogdet(np.eye(1)))


def _c(spec, rows, cols, deps, stats, dtype) -> np.ndarray:
    """Region ``rows x cols`` of ``spec``, F-ordered in ``dtype`` (LAPACK's layout)."""
    return kern.as_fortran(evaluate(spec, rows, cols, list(deps), stats), dtype)


def _read_a(a_spec, a_deps, rows, cols, strips, dtype, stats) -> np.ndarray:
    """``A_ij`` read strip by strip (rows cut at ``strips``, global row
    positions: each strip inside one I/O unit row of every input), a strip
    unit column by unit column (a whole stored chunk decodes straight into
    the block read, not through a chunk buffer), into one F-ordered tile of
    the computing dtype."""
    c = np.empty((rows[1] - rows[0], cols[1] - cols[0]), dtype=kern.result_dtype(dtype),
                 order="F")
    prefetch(a_spec, rows, cols)  # the OS loads later strips while the first are copied
    cuts = [rows[0], *(s for s in strips if rows[0] < s < rows[1]), rows[1]]
    col_cuts = unit_edges(a_spec, 1, cols[1])
    col_cuts = [cols[0], *(s for s in col_cuts if cols[0] < s < cols[1]), cols[1]]
    for s0, s1 in zip(cuts, cuts[1:], strict=False):
        for t0, t1 in zip(col_cuts, col_cuts[1:], strict=False):
            kern.copy_rows(c[s0 - rows[0]:s1 - rows[0], t0 - cols[0]:t1 - cols[0]],
                           evaluate(a_spec, (s0, s1), (t0, t1), list(a_deps), stats))
    return c


def _subtract_panels(c, l_ref, rows, cols, k_range: tuple, panel: int, diagonal: bool,
                     stats) -> np.ndarray:
    """``c - sum_k L_ik L_jk^T`` over the L column panels ``panel`` wide in
    ``k_range``, streamed back from the output one pair at a time (the next
    pair loads while this one multiplies)."""
    if k_range[0] >= k_range[1]:
        return c
    arr = l_ref.open()
    sides = [rows] if diagonal else [rows, cols]
    # one buffer a side for the whole task, read into in place: a fresh 64 MiB
    # panel a step is a new mapping, faulted in and zeroed by the kernel each time
    bufs = [np.empty((r[1] - r[0]) * panel, arr.dtype) for r in sides]

    def read_panel(r, buf, k):
        h, w = r[1] - r[0], k[1] - k[0]
        return read_region(l_ref, r, k, stats, arr=arr, out=buf[:h * w].reshape(h, w))

    for k0 in range(k_range[0], k_range[1], panel):
        k = (k0, min(k0 + panel, k_range[1]))
        lik, *ljk = (read_panel(r, buf, k) for r, buf in zip(sides, bufs, strict=True))
        if k[1] < k_range[1]:
            nxt = (k[1], min(k[1] + panel, k_range[1]))
            for r in set(sides):
                prefetch_region(l_ref, r, nxt)
        c = kern.syrk_update(c, lik) if diagonal else \
            kern.gemm_update(c, lik, ljk[0], trans_b=True)
    return c


def _read_lower(l_ref, rng: tuple, unit: int, stats) -> np.ndarray:
    """Diagonal tile ``rng x rng`` of the factor, its units on and below the
    diagonal (all ``trsm`` reads of it; those above stay zero) read one at a
    time into one F-ordered tile: one unit's buffers at once, where a read of
    the whole tile held Zarr's buffers for all its units (the task's largest
    phase)."""
    arr = l_ref.open()
    h = rng[1] - rng[0]
    out = np.zeros((h, h), dtype=arr.dtype, order="F")
    cuts = [*range(rng[0], rng[1], unit), rng[1]]
    for r0, r1 in zip(cuts, cuts[1:], strict=False):
        for c0, c1 in zip(cuts, cuts[1:], strict=False):
            if c0 <= r0:
                kern.copy_rows(out[r0 - rng[0]:r1 - rng[0], c0 - rng[0]:c1 - rng[0]],
                               read_region(l_ref, (r0, r1), (c0, c1), stats, arr=arr))
    return out


def update(a_spec, a_deps, l_ref, edges, strips: tuple, panel: int, i: int, j: int,
           k_stop: int, dtype, *after):
    """The first part of a split tile task: ``A_ij - sum_k L_ik L_jk^T`` for the
    L columns left of ``k_stop`` (those whose tiles are finished early), as
    ``(F-ordered partial tile, stats, k_stop)`` in worker memory (never in
    the output: a marked unit always holds final values, and the tile task
    can run again from it); :func:`tile` adds the rest. ``after``: the tasks
    that wrote the L tiles it reads."""
    buffers.release(blocks_only=True)
    stats = IOStats()
    rows, cols = edges[i], edges[j]
    c = _read_a(a_spec, a_deps, rows, cols, strips, dtype, stats)
    c = _subtract_panels(c, l_ref, rows, cols, (0, k_stop), panel, i == j, stats)
    return c, counted(stats.as_dict()), k_stop


def tile(a_spec, a_deps, l_ref, edges, strips: tuple, panel: int, i: int, j: int, dtype,
         partial, *after):
    """``L_ij`` of the Cholesky factor, written into ``l_ref`` unit by unit.

    ``A_ij`` is read strip by strip into one F-ordered tile (or, given
    ``partial``, the result of :func:`update` -- the tile with the L columns
    left of its ``k_stop`` subtracted -- is copied); the L tiles to its left
    (from there) are streamed back from the output in column panels
    ``panel`` wide (its I/O unit), one pair at a time. The tile is factored
    (``potrf``) or solved against ``L_jj`` (``trsm``) in place. Returns the
    diagonal of ``L_jj`` (``i == j``) or None: results stay small, as every later task of its row and column
    receives them. ``after``: the tasks that wrote the L tiles it reads
    (their results unused)."""
    buffers.release(blocks_only=True)
    stats = IOStats()
    rows, cols = edges[i], edges[j]
    merged: dict = {}
    if partial is None:
        c, k0 = _read_a(a_spec, a_deps, rows, cols, strips, dtype, stats), 0
    else:  # never the dependency's own array: a rerun must find it unchanged
        merged, k0 = partial[1], partial[2]
        c = np.array(partial[0], order="F")
    c = _subtract_panels(c, l_ref, rows, cols, (k0, cols[0]), panel, i == j, stats)
    if i == j:
        try:
            c = kern.potrf(c, col0=cols[0], overwrite=True)
        except NotPositiveDefiniteError as e:  # named by the stored factor's unit
            raise NotPositiveDefiniteError((e.column // panel,) * 2, e.column) from None
    else:
        c = kern.trsm(_read_lower(l_ref, cols, panel, stats), c)
    write_block(l_ref, rows, cols, c if c.dtype == dtype else c.astype(dtype), stats)
    value = np.diagonal(c).copy() if i == j else None
    own = counted(stats.as_dict())
    return value, (merge_stats(merged, own) if merged else own)


def zeros(l_ref, edges, i: int, cols: tuple, dtype):
    """Row tile ``i``'s tiles above the diagonal (column tiles ``cols``): their
    units marked as the fill value, zero, and not stored (:func:`write_fill`)."""
    stats, arr = IOStats(), l_ref.open(mode="r+")
    for j in cols:
        write_fill(l_ref, edges[i], edges[j], stats, arr=arr)
    return None, counted(stats.as_dict())


def read_back(l_ref, rows: tuple, cols: tuple, after=None):
    """Tile ``rows x cols`` of a finished factor read back (``compute()``)."""
    stats = IOStats()
    block = np.asarray(read_region(l_ref, rows, cols, stats))
    return block, counted(stats.as_dict())


def eliminate(t_spec, t_deps, b_spec, b_deps, edges, i: int, k: int, trans: bool, ncols: int,
           dtype, acc, solved):
    """Row tile ``i``'s right-hand side less the term of the solved row tile
    ``k``: ``C - T_ik X_k``, with ``C`` the previous elimination's result
    (``acc``) or, for the first, B's rows ``i`` read here. One elimination per
    solved row tile, in the order they are solved: a row tile waiting for
    its turn holds one partial sum, not a term per row tile solved."""
    stats = IOStats()
    if acc is None:
        c, merged = _c(b_spec, edges[i], (0, ncols), b_deps, stats, dtype), {}
    else:
        c, merged = acc
    rows, cols = (edges[k], edges[i]) if trans else (edges[i], edges[k])
    t_ik = np.asarray(evaluate(t_spec, rows, cols, list(t_deps), stats))
    t_ik = t_ik.astype(dtype, copy=False)  # any order: a product, not LAPACK
    with kern.one_blas_thread():
        c = c - (t_ik.T if trans else t_ik) @ solved[0]  # new: acc stays as it was
    return c, merge_stats(merged, counted(stats.as_dict()))


def substitute(t_spec, t_deps, b_spec, b_deps, edges, i: int, ncols: int, options: tuple,
               dtype, acc=None):
    """Row tile ``i`` of X in ``T X = B``: ``B_i - sum_k T_ik X_k`` (``acc``,
    the last :func:`eliminate` of the row tile, or B's rows ``i`` read here for
    the first row tile solved), then the diagonal tile's triangular solve.
    ``options``: ``lower`` (of the stored S), ``trans`` (T = S^T), ``unit``
    (unit diagonal). Merges the eliminations' figures."""
    opts = dict(options)
    stats = IOStats()
    rows = edges[i]
    if acc is None:
        c, merged = _c(b_spec, rows, (0, ncols), b_deps, stats, dtype), {}
    else:  # a copy: the solve overwrites it, and acc may be read again by a retry
        c, merged = np.array(acc[0], dtype=dtype, order="F"), acc[1]
    s_ii = _c(t_spec, rows, rows, t_deps, stats, dtype)
    if not opts.get("unit"):
        zero = np.flatnonzero(np.diagonal(s_ii) == 0)
        if zero.size:  # BLAS trsm would divide by it: inf / nan, as SciPy refuses
            raise SingularMatrixError(rows[0] + int(zero[0]), triangular=True)
    solve = kern.trsm_left_lower if opts["lower"] else kern.trsm_left_upper
    x = solve(s_ii, c, trans=bool(opts["trans"]), unit_diagonal=bool(opts.get("unit")))
    return np.asarray(x), counted(merge_stats(merged, stats.as_dict()))


def gather(vector: bool, *parts):
    """The solved row tiles stacked (``n`` or ``n x k``); merges their stats
    (a small right-hand side's are gathered by the plan on their own)."""
    x, stats = stacked(np.vstack, parts)
    return (x[:, 0] if vector else x), stats


def stacked(stack, parts) -> tuple:
    """``(stack(values), merged stats)`` of ``(value, stats)`` task results:
    a task joining others' results counts their figures and itself."""
    stats: dict = {}
    for _, st in parts:
        stats = merge_stats(stats, st)
    return stack([p for p, _ in parts]), counted(stats)


def symv_tile(a_spec, a_deps, w_spec, w_deps, rows: tuple, cols: tuple, k: int, norm: bool,
              dtype, ahead=None):
    """Block ``rows x cols`` of a symmetric A, taken from its lower triangle,
    times W: ``(rows, cols, A_ij W_j, A_ij^T W_i, row sums of |A_ij|, column
    sums, stats)``, the sums None without ``norm``. A block crossing the
    diagonal counts its elements on or below it (``A_ij W_j``) and strictly
    below it (the transposed term); the elements above never enter. The
    block ``ahead`` (a later task's) is hinted to the stores after the read."""
    stats = IOStats()
    read = np.asarray(evaluate(a_spec, rows, cols, list(a_deps), stats))
    prefetch_next([a_spec], None if ahead is None else [ahead])
    t = read.astype(kern.result_dtype(dtype), copy=False)
    w_j = np.asarray(evaluate(w_spec, cols, (0, k), list(w_deps), stats), dtype=dtype)
    w_i = np.asarray(evaluate(w_spec, rows, (0, k), list(w_deps), stats), dtype=dtype)
    off = rows[0] - cols[0]  # element (r, c) of the block is on or below the diagonal iff c <= r + off
    crossing = cols[1] > rows[0]  # an element on or above the diagonal
    diag = r = None
    if crossing:
        t = np.tril(t, off)
    with kern.one_blas_thread():
        down = t @ w_j
        if crossing:  # the diagonal counts once: in the rows' term, not the transposed one
            r = np.arange(max(0, -off), min(t.shape[0], t.shape[1] - off))
            diag = t[r, r + off].copy()
            t[r, r + off] = 0
        across = t.T @ w_i
    row_sums = col_sums = None
    if norm:  # t is not needed any more: |t| in place
        if t is read and not isinstance(a_spec, Read):  # may be a dependency's value
            t = t.copy()
        t = np.abs(t, out=t)
        col_sums, row_sums = t.sum(axis=0), t.sum(axis=1)
        if diag is not None:
            row_sums[r] += np.abs(diag)
    return rows, cols, down, across, row_sums, col_sums, counted(stats.as_dict())


def symv_sum(n: int, k: int, norm: bool, dtype, *parts):
    """Block products (:func:`symv_tile`) and sums of them added into one
    ``A W`` (``n x k``; with ``norm``, one more column holding the row sums
    of ``|A|``): ``(value, stats)``, the parts' stats merged."""
    out, stats = np.zeros((n, k + int(norm)), dtype=dtype), {}
    for part in parts:
        if len(part) == 2:  # a sum of parts
            out += part[0]
            stats = merge_stats(stats, part[1])
            continue
        (r0, r1), (c0, c1), down, across, row_sums, col_sums, st = part
        out[r0:r1, :k] += down
        out[c0:c1, :k] += across
        if norm:
            out[r0:r1, k] += row_sums
            out[c0:c1, k] += col_sums
        stats = merge_stats(stats, st)
    return out, counted(stats)


def logdiag(l_spec, l_deps, edges, dtype):
    """NumPy's ``slogdet`` of ``L @ L.T`` from the diagonal tiles of a stored
    Cholesky factor L: ``(1, 2 sum log diag(L))``."""
    stats = IOStats()
    total = 0.0
    for r in edges:
        d = np.diagonal(np.asarray(evaluate(l_spec, r, r, list(l_deps), stats)))
        total += float(np.sum(np.log(d.astype(np.float64))))
    t = np.dtype(dtype).type
    return SlogdetResult(t(1.0), t(2.0 * total)), counted(stats.as_dict())


def incore(op: str, options: tuple, x_spec, x_deps, n: int, y_spec=None, y_deps=(),
           ycols: int = 0, dtype=np.float64):
    """NumPy / SciPy ``op`` on the whole ``n x n`` matrix (and right-hand
    sides ``y``) read into this one task."""
    stats = IOStats()
    a = _c(x_spec, (0, n), (0, n), x_deps, stats, dtype)
    opts = dict(options)
    with kern.one_blas_thread():
        if op == "eigh":
            value = np.linalg.eigh(a, UPLO=opts.get("UPLO", "L"))
        elif op == "eigvalsh":
            value = np.linalg.eigvalsh(a, UPLO=opts.get("UPLO", "L"))
        elif op == "eig":  # complex when the spectrum is, as NumPy
            value = np.linalg.eig(a)
        elif op == "eigvals":
            value = np.linalg.eigvals(a)
        elif op == "slogdet":
            value = np.linalg.slogdet(a)
        else:  # "solve"
            b = _c(y_spec, (0, n), (0, ycols), y_deps, stats, dtype)
            try:
                value = np.linalg.solve(a, b)
            except np.linalg.LinAlgError:
                raise SingularMatrixError(_zero_pivot(a)) from None
            value = value[:, 0] if opts.get("vector") else value
    return value, counted(stats.as_dict())


def _zero_pivot(a: np.ndarray) -> int:
    """The first column LAPACK's ``getrf`` finds no nonzero pivot in."""
    from scipy.linalg import lapack

    _, _, info = lapack.get_lapack_funcs("getrf", (a,))(a)
    return max(int(info) - 1, 0)
