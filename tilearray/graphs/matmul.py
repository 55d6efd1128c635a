"""Streaming tiled matmul: kernels that run on workers and the graph builder.

One task per output block accumulates over the contraction dimension K,
streaming K-panels of A (``rows x K-range``) and B (``K-range x cols``)
through the aggregated reader. A and B keep their own panel edges (their I/O
units along K may differ); the task walks both edge lists together, so each
panel is read once. The next panel is read on a background thread while BLAS
multiplies the current pair, into the accumulator in place (gemm, beta=1).
Resident at once: the accumulator, one A panel, one B panel and the one
panel being prefetched.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..storage import IOStats, buffers, write_block
from ..storage.geometry import Range
from ..storage.io import open_row_streamer
from . import nogil
from .progress import report
from .spec import Read, evaluate, prefetch

log = logging.getLogger(__name__)


def gemm_accumulate(acc: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    """``acc += a @ b`` in place, without temporaries for BLAS dtypes, the GIL
    released while BLAS runs (:mod:`.nogil`).

    ``acc`` must be Fortran-ordered. Contiguous operands (either order) are
    passed to BLAS with a transpose flag instead of being copied.
    """
    if nogil.routine("gemm", acc.dtype) is None or not acc.flags.f_contiguous:
        np.add(acc, np.matmul(a, b).astype(acc.dtype, copy=False), out=acc)
        return
    out = nogil.gemm(1.0, a, b, 1.0, acc)
    if out is not acc:  # pragma: no cover - defensive (a read-only acc)
        acc[...] = out


def load_order(a_panels: tuple[Range, ...], b_panels: tuple[Range, ...]) -> list[tuple[str, int]]:
    """The order in which a task needs its panels (pure; used for prefetching)."""
    order = [("a", 0), ("b", 0)]
    ia = ib = 0
    while True:
        hi = min(a_panels[ia][1], b_panels[ib][1])
        if a_panels[ia][1] == hi:
            ia += 1
            if ia < len(a_panels):
                order.append(("a", ia))
        if b_panels[ib][1] == hi:
            ib += 1
            if ib < len(b_panels):
                order.append(("b", ib))
        if ia == len(a_panels) or ib == len(b_panels):
            return order


def matmul_block(
    a_spec, b_spec, rows: Range, cols: Range, a_panels, b_panels, dtype, deps=(),
    read_bytes: int | None = None, b_bands: tuple[Range, ...] | None = None,
    slab_rows: int | None = None,
) -> tuple[np.ndarray, dict]:
    """Compute output block ``rows x cols`` of ``A @ B`` over the given K panels.

    With ``read_bytes=None`` the next panel is read on a background thread
    while BLAS works (one panel in flight). With a byte bound, panels are read
    in place of the previous one, unit band by unit band, so only one band's
    decode buffers exist at a time: less memory, so larger blocks and fewer
    bytes read, for no overlap within the task (on a machine whose cores are
    all busy with BLAS, decode and BLAS do not overlap anyway).

    With ``b_bands`` (column ranges covering ``cols``; A and B share their K
    panels) B is streamed: per K panel the A panel is read once, then B is
    read band by band and each band's product accumulates into its columns
    of the block, so only one B band is resident instead of a whole panel --
    the memory that lets the planner choose larger blocks, which read less.

    With ``slab_rows`` (a diagonal block of ``X.T @ X``, X stored with
    :attr:`~tilearray.storage.Grid.row_slabs`) each K panel of X is decoded
    in row slabs of that many rows and accumulated slab by slab
    (:func:`gram_stream_accumulate`): no chunk is ever held whole.

    Returns the block (Fortran-ordered) and the task's measured I/O stats.
    """
    buffers.release(blocks_only=True)  # no reduction's blocks held under this budget
    dtype = np.dtype(dtype)
    stats = IOStats()
    acc = np.zeros((rows[1] - rows[0], cols[1] - cols[0]), dtype=dtype, order="F")
    if not a_panels:
        return acc, stats.as_dict()
    deps = list(deps)
    if is_gram(a_spec, b_spec, rows, cols, a_panels, b_panels):
        return _gram_block(a_spec, b_spec, rows, b_panels, acc, deps, stats, read_bytes,
                           slab_rows)
    if b_bands is not None and tuple(a_panels) == tuple(b_panels):
        return _streamed_block(a_spec, b_spec, rows, cols, a_panels, b_bands, acc, deps,
                               stats, read_bytes)
    return _paired_block(a_spec, b_spec, rows, cols, a_panels, b_panels, acc, deps, stats,
                         read_bytes)


def _paired_block(a_spec, b_spec, rows, cols, a_panels, b_panels, acc, deps, stats, read_bytes):
    """:func:`matmul_block` over pairs of A and B panels, in :func:`load_order`:
    the next panel read on a thread while BLAS works (``read_bytes=None``),
    else read in place, band by band."""
    def load(item):
        side, i = item
        if side == "a":
            return evaluate(a_spec, rows, a_panels[i], deps, stats, max_bytes=read_bytes)
        return evaluate(b_spec, b_panels[i], cols, deps, stats, max_bytes=read_bytes)

    order = iter(load_order(a_panels, b_panels))
    k0, k1 = a_panels[0][0], a_panels[-1][1]  # progress: K covered so far
    t_wait = t_blas = 0.0
    with ThreadPoolExecutor(1, thread_name_prefix="tilearray-prefetch") as pool:
        if read_bytes is not None:
            pool = _Inline()
        pending = [None]

        def take():
            t0 = time.perf_counter()
            item, fut = pending[0]
            value = fut.result()
            nxt = next(order, None)
            pending[0] = None if nxt is None else (nxt, pool.submit(load, nxt))
            nonlocal t_wait
            t_wait += time.perf_counter() - t0
            return value

        first = next(order)
        pending[0] = (first, pool.submit(load, first))
        a_cur = take()
        b_cur = take()
        ia = ib = 0
        while True:
            lo = max(a_panels[ia][0], b_panels[ib][0])
            hi = min(a_panels[ia][1], b_panels[ib][1])
            a0, b0 = a_panels[ia][0], b_panels[ib][0]
            t0 = time.perf_counter()
            gemm_accumulate(acc, a_cur[:, lo - a0 : hi - a0], b_cur[lo - b0 : hi - b0, :])
            t_blas += time.perf_counter() - t0
            report(hi - k0, k1 - k0)
            adv_a, adv_b = a_panels[ia][1] == hi, b_panels[ib][1] == hi
            if adv_a:
                ia += 1
                del a_cur  # free before the next panel arrives
                a_cur = take() if ia < len(a_panels) else None
            if adv_b:
                ib += 1
                del b_cur
                b_cur = take() if ib < len(b_panels) else None
            if ia == len(a_panels) or ib == len(b_panels):
                break
    out = stats.as_dict()
    out.update(io_wait_seconds=t_wait, blas_seconds=t_blas, tasks=1)
    return acc, out


def is_gram(a_spec, b_spec, rows, cols, a_panels, b_panels) -> bool:
    """``X.T @ X`` or ``X @ X.T`` on a diagonal block: both operands are the
    same panels of X."""
    from .spec import Trans

    same = (isinstance(a_spec, Trans) and a_spec.x == b_spec) or \
        (isinstance(b_spec, Trans) and b_spec.x == a_spec)
    return same and tuple(rows) == tuple(cols) and tuple(a_panels) == tuple(b_panels)


def syrk_accumulate(acc: np.ndarray, p: np.ndarray, transposed: bool) -> bool:
    """``acc += p.T @ p`` (``transposed``) or ``acc += p @ p.T``, symmetric:
    BLAS syrk updates the upper triangle only, for half the FLOPs of a gemm.
    Returns False when it ran a full gemm instead (other dtypes, or ``acc``
    not Fortran-ordered); then ``acc`` is whole and needs no mirroring."""
    if nogil.routine("syrk", acc.dtype) is None or not acc.flags.f_contiguous:
        gemm_accumulate(acc, p.T, p) if transposed else gemm_accumulate(acc, p, p.T)
        return False
    out = nogil.syrk(1.0, p, 1.0, acc, trans=transposed, lower=False)
    if out is not acc:  # pragma: no cover - defensive (a read-only acc)
        acc[...] = out
    return True


def mirror_upper(acc: np.ndarray, step: int = 1024) -> None:
    """Copy the upper triangle of a square ``acc`` onto its lower one, band by
    band (no n x n temporaries)."""
    n = acc.shape[0]
    for c0 in range(0, n, step):
        c1 = min(c0 + step, n)
        d = acc[c0:c1, c0:c1]
        d[...] = np.triu(d) + np.triu(d, 1).T
        if c1 < n:
            acc[c1:, c0:c1] = acc[c0:c1, c1:].T


def gram_stream_accumulate(acc: np.ndarray, x: Read, panels, cols: Range, slab_rows: int,
                           stats: IOStats, times: list | None = None) -> bool | None:
    """``acc += X[p, cols].T @ X[p, cols]`` for each K panel ``p`` (row
    ranges of X on its chunk rows), decoding each panel's chunks in row slabs
    of ``slab_rows`` (:class:`~tilearray.storage.stream.RowStreamer`) and
    updating ``acc`` by syrk slab by slab. Resident: ``acc``, one slab buffer
    per chunk column and the zstd decoders -- never a chunk.

    Returns whether ``acc`` holds its upper triangle only (see
    :func:`syrk_accumulate`), or None when X cannot be streamed (nothing
    done; the caller reads whole panels). ``times``, if given, gets
    ``[decode seconds, BLAS seconds]`` added. A corrupt chunk raises
    :class:`~tilearray.errors.CorruptChunkError` before its last slab is
    used; ``acc`` then holds a partial sum and must be dropped.
    """
    streamer = open_row_streamer(x.ref)
    if streamer is None:
        return None
    symmetric = False
    t_dec = t_blas = 0.0
    for q, p in enumerate(panels):
        if q + 1 < len(panels):  # the OS loads the next panel's files meanwhile
            prefetch(x, panels[q + 1], cols)
        slabs = streamer.slabs(p, cols, slab_rows, stats)
        while True:
            t0 = time.perf_counter()
            slab = next(slabs, None)
            t1 = time.perf_counter()
            t_dec += t1 - t0
            if slab is None:
                break
            symmetric = syrk_accumulate(acc, slab, True)
            t_blas += time.perf_counter() - t1
        report(q + 1, len(panels))
    stats.read_seconds += t_dec
    if times is not None:
        times[0] += t_dec
        times[1] += t_blas
    return symmetric


def _gram_block(a_spec, b_spec, rows, panels, acc, deps, stats, read_bytes, slab_rows=None):
    """Diagonal block of ``X.T @ X`` / ``X @ X.T``: each panel of X is read
    once and used as both operands, in a symmetric (syrk) update."""
    from .spec import Trans

    transposed = isinstance(a_spec, Trans) and a_spec.x == b_spec
    x_spec = b_spec if transposed else a_spec
    t_wait = t_blas = 0.0
    symmetric = False
    if slab_rows is not None and transposed and isinstance(x_spec, Read):
        times = [0.0, 0.0]
        symmetric = gram_stream_accumulate(acc, x_spec, panels, rows, slab_rows, stats, times)
        if symmetric is not None:
            if symmetric:
                mirror_upper(acc)
            out = stats.as_dict()
            out.update(io_wait_seconds=times[0], blas_seconds=times[1], tasks=1)
            return acc, out
        log.warning("%s cannot be decoded in row slabs (changed since planning?): reading "
                    "whole panels, above the planned memory", x_spec.ref)
        symmetric = False
    with ThreadPoolExecutor(1, thread_name_prefix="tilearray-prefetch") as pool:
        def load(i):
            if transposed:  # X[panel, cols]
                return evaluate(x_spec, panels[i], rows, deps, stats, max_bytes=read_bytes)
            return evaluate(x_spec, rows, panels[i], deps, stats, max_bytes=read_bytes)

        nxt = pool.submit(load, 0) if read_bytes is None else None
        for i in range(len(panels)):
            t0 = time.perf_counter()
            p = nxt.result() if nxt is not None else load(i)
            if read_bytes is None and i + 1 < len(panels):
                nxt = pool.submit(load, i + 1)
            elif i + 1 < len(panels):
                prefetch(x_spec, *((panels[i + 1], rows) if transposed else (rows, panels[i + 1])))
            t_wait += time.perf_counter() - t0
            t0 = time.perf_counter()
            symmetric = syrk_accumulate(acc, p, transposed)
            t_blas += time.perf_counter() - t0
            del p
            report(i + 1, len(panels))
    if symmetric:
        mirror_upper(acc)
    out = stats.as_dict()
    out.update(io_wait_seconds=t_wait, blas_seconds=t_blas, tasks=1)
    return acc, out


def _streamed_block(a_spec, b_spec, rows, cols, panels, bands, acc, deps, stats, read_bytes):
    """``acc += A[rows, p] @ B[p, band]`` for each K panel ``p`` and B band."""
    t_wait = t_blas = 0.0
    c0 = cols[0]
    a = None
    # the reads in order; while BLAS works on one band, the OS loads the next
    bands = tuple(bands)
    steps = [(q, band) for q in range(len(panels)) for band in bands]
    for s, (q, band) in enumerate(steps):
        p = panels[q]
        t0 = time.perf_counter()
        if s % len(bands) == 0:
            del a  # the previous panel goes before the next is read
            a = evaluate(a_spec, rows, p, deps, stats, max_bytes=read_bytes)
        b = evaluate(b_spec, p, band, deps, stats, max_bytes=read_bytes)
        if s + 1 < len(steps):
            nq, nband = steps[s + 1]
            if nq != q:
                prefetch(a_spec, rows, panels[nq])
            prefetch(b_spec, panels[nq], nband)
        t1 = time.perf_counter()
        gemm_accumulate(acc[:, band[0] - c0 : band[1] - c0], a, b)
        t_wait, t_blas = t_wait + t1 - t0, t_blas + time.perf_counter() - t1
        del b
        report(s + 1, len(steps))
    out = stats.as_dict()
    out.update(io_wait_seconds=t_wait, blas_seconds=t_blas, tasks=1)
    return acc, out


class _Inline:
    """A stand-in executor that runs a load only when its result is taken."""

    def submit(self, fn, *args):
        return _Deferred(fn, args)


class _Deferred:
    def __init__(self, fn, args):
        self.fn, self.args = fn, args

    def result(self):
        return self.fn(*self.args)


def matmul_store(a_spec, b_spec, rows, cols, a_panels, b_panels, dtype, out_ref, deps=(),
                 read_bytes=None, b_bands=None, slab_rows=None):
    """Compute one output block and write it whole; return ``(None, stats)``."""
    acc, st = matmul_block(a_spec, b_spec, rows, cols, a_panels, b_panels, dtype, deps,
                           read_bytes, b_bands, slab_rows)
    io = IOStats()
    write_block(out_ref, rows, cols, acc, io)
    st["bytes_written"] = io.bytes_written
    st["units_written"] = io.units_written
    return None, st


def matmul_store_pair(a_spec, b_spec, rows, cols, a_panels, b_panels, dtype, out_ref,
                      deps=(), read_bytes=None, b_bands=None, slab_rows=None):
    """Block ``rows x cols`` of a symmetric product (``X.T @ X``, ``X @ X.T``):
    computed once, written there and, transposed, at ``cols x rows``."""
    acc, st = matmul_block(a_spec, b_spec, rows, cols, a_panels, b_panels, dtype, deps,
                           read_bytes, b_bands, slab_rows)
    io = IOStats()
    write_block(out_ref, rows, cols, acc, io)
    write_block(out_ref, cols, rows, acc.T, io)
    st["bytes_written"] = io.bytes_written
    st["units_written"] = io.units_written
    return None, st


def sum_partials(*parts):
    """Tree-combine partial ``(block, stats)`` results of a K-split."""
    acc = None
    stats: dict = {}
    for block, st in parts:
        if acc is None:
            acc = np.array(block, order="F", copy=True)
        else:
            np.add(acc, block, out=acc)
        stats = merge_stats(stats, st)
    return acc, counted(stats)


def store_partials(out_ref, rows, cols, *parts):
    acc, st = sum_partials(*parts)
    io = IOStats()
    write_block(out_ref, rows, cols, acc, io)
    for k in ("bytes_written", "units_written"):
        v = getattr(io, k)
        st[k] = st.get(k, 0) + v
        st[OWN + k] = v  # this task's own writes, apart from the partials' figures
    return None, st


MERGED = "merged"
"""Stats key set by tasks that pass on other tasks' figures (tree combines):
their totals are not their own I/O, only the ``own_*`` keys are."""
OWN = "own_"


def counted(stats: dict) -> dict:
    """``stats`` plus this task itself: every task counts 1 in ``tasks``,
    so a run's RunStats.tasks is the number of graph tasks it ran."""
    return {**stats, "tasks": stats.get("tasks", 0) + 1}


def merge_stats(a: dict, b: dict) -> dict:
    """Sum two tasks' stats (marked :data:`MERGED`; ``own_*`` keys stay behind)."""
    out = dict(a)
    for k, v in b.items():
        if not k.startswith(OWN) and k != MERGED:
            out[k] = out.get(k, 0) + v
    out[MERGED] = 1
    return out
