"""What a task holds at its peak, one function per kind of task (pure).

Every projection the planner compares with the budget comes from here:
:func:`block_peak` for a task that evaluates one block of a fused expression
(a map, or a reduction's map side), :func:`matmul_peak` for a matmul
output-block task in each read mode, :func:`combine_peak` for a tree-sum of
partial blocks. The pieces they share (what a read holds, zarr's buffers in
flight, the allocator's overhead) are the small functions below. A chunk
decoded in row slabs is priced by :func:`tilearray.storage.stream.slab_plan`,
next to the decoder it sizes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ... import _config
from ...graphs.blocks import max_interval
from ...graphs.spec import leaves, made_arrays


def as_rss(allocated: int) -> int:
    """Resident memory for ``allocated`` bytes of buffers: the allocator keeps
    some freed memory (measured here: worker RSS 10-20% above traced peaks)."""
    return int(allocated * float(_config.get("memory.allocator-overhead")))


def op_temporaries(spec) -> int:
    """Arrays a region evaluation makes beyond the reads themselves."""
    return made_arrays(spec)


def leaf_itemsize(spec) -> int:
    return max((leaf.dtype.itemsize for leaf in leaves(spec)), default=8)


def per_element(spec, dtype: np.dtype) -> int:
    """Projected bytes per output element of evaluating a region of ``spec``:
    each read twice (compressed + decoded), plus every temporary."""
    reads_ = sum(2 * leaf.dtype.itemsize for leaf in leaves(spec))
    arrays = made_arrays(spec) + len(leaves(spec))
    return reads_ + (arrays * max(dtype.itemsize, 8) if dtype.itemsize > 1 else 0)


def read_flight(spec) -> int:
    """Zarr's own read buffers: up to ``async.concurrency`` chunks in flight,
    each held compressed and decoded."""
    tiles = [leaf.grid.tile[0] * leaf.grid.tile[1] * leaf.dtype.itemsize for leaf in leaves(spec)]
    return chunk_flight(max(tiles, default=0))


def chunk_flight(chunk_bytes: int) -> int:
    """Zarr's read buffers for chunks of ``chunk_bytes``: ``async.concurrency`` in flight."""
    import zarr

    return int(zarr.config.get("async.concurrency")) * chunk_bytes


def write_flight(out_grid, itemsize: int) -> int:
    """Writing a block: one output I/O unit copied and encoded at a time, in bytes."""
    if out_grid is None:
        return 0
    return 2 * out_grid.unit[0] * out_grid.unit[1] * max(itemsize, 1)


def band_bytes(a_spec, b_spec, panel_width: int, task_memory: int) -> int:
    """Read request bound when panels are read in place, band by band: one
    unit deep across the panel's width, at most an eighth of the task's
    memory, and never less than one whole unit (units are never split)."""
    out = 0
    for leaf in leaves(a_spec) + leaves(b_spec):
        u0, u1 = leaf.grid.unit
        unit = u0 * u1 * leaf.dtype.itemsize
        wide = max(u0, u1) * max(panel_width, min(u0, u1)) * leaf.dtype.itemsize
        out = max(out, unit, min(wide, task_memory // 8))
    return out


@dataclass(frozen=True, slots=True)
class BlockTask:
    """The per-task memory terms of evaluating one block of a fused expression."""

    temp_per_elem: int
    """Bytes per block element of the ops' temporaries."""
    out_itemsize: int = 0
    """Bytes per element of the block kept as the task's result (0: none)."""
    read_flight: int = 0
    """Zarr's read buffers in flight, at most (:func:`read_flight`), in bytes."""
    write_flight: int = 0
    """One output unit copied + encoded while the block is written (:func:`write_flight`)."""
    strip_temp_per_elem: int = 0
    """Bytes per element of the temporaries made strip by strip (a reduction's
    expression over a block read whole: :func:`~tilearray.graphs.reduction.strip_bound`),
    priced over one strip, not the block."""


def block_peak(task: BlockTask, read_bytes, size, strip=None) -> int:
    """Peak of a block task reading ``read_bytes`` for a block of ``size``
    elements (scalars or NumPy arrays of them; ``strip``: the elements of its
    largest strip, if its expression is evaluated strip by strip), the larger
    of its two phases:

    - evaluating: its reads (each stored array's region is fetched in one
      request, decoded into one array: :func:`~tilearray.storage.io.read_region`),
      zarr's chunk buffers in flight (never more than the reads), the ops'
      temporaries (a strip's, strip by strip) and the result block;
    - writing: the result block and one output unit copied and encoded at a
      time (the reads are freed by then, unless the result is a view of them:
      a block with no op).

    (Until 2026-12-05 the two phases were summed and every read counted
    twice, compressed and decoded: a map writing 900 x 1300 shards was
    projected at 108 MiB where tracemalloc measured about a third of that.)"""
    out = size * task.out_itemsize
    strip = size if strip is None else np.minimum(size, strip)
    evaluating = (read_bytes + np.minimum(task.read_flight, read_bytes)
                  + size * task.temp_per_elem + strip * task.strip_temp_per_elem + out)
    writing = out + np.minimum(task.write_flight, out) + (read_bytes if not task.temp_per_elem
                                                          else 0)
    return as_rss(int(np.max(np.maximum(evaluating, writing), initial=0)))


@dataclass(frozen=True, slots=True)
class MatmulTask:
    """The per-task memory terms of a matmul output-block task."""

    itemsize: int
    """Bytes per accumulator element."""
    out_unit: int
    """Bytes of one output I/O unit written at the end (0: not written)."""
    band: int
    """Read request bound for panels read in place (:func:`band_bytes`)."""
    b_band: int = 0
    """Bytes of one B band (streaming B)."""
    b_band_request: int = 0
    """Least request of a B band."""
    slab_mem: int = 0
    """Slab and decoder buffers of an ``X.T @ X`` decoded in row slabs."""


def matmul_peak(t: MatmulTask, rows_edges, cols_edges, mode: str, panels) -> int:
    """Peak of one task: the accumulator and the current panels, plus the
    panel in flight (compressed + decoded) when prefetching, or, reading in
    place, one band's buffers while a panel fills (a panel read in one
    request is its own decoded buffer); at the end the accumulator and one
    output unit copied and encoded at a time. Streaming B holds the
    accumulator, one A panel and one B band, each a single large buffer
    freed whole (so priced as allocated), plus one read's buffers.
    ``panels`` is ``(A panel bytes, B panel bytes, least request)`` of the
    block (0 for A's when one panel serves both operands of ``X.T @ X``)."""
    acc = max_interval(rows_edges) * max_interval(cols_edges) * t.itemsize
    if mode == "slabs":
        return as_rss(acc + max(2 * t.out_unit, t.slab_mem))
    pa, pb, request = panels
    if mode == "stream":
        reading = min(2 * max(t.band, request, t.b_band_request), max(pa, t.b_band))
        return acc + max(2 * t.out_unit, pa + t.b_band + as_rss(reading))
    if mode == "prefetch":
        reading = 2 * max(pa, pb)
    else:  # each request compressed + decoded, at most the panel twice
        reading = min(2 * max(t.band, request), max(pa, pb))
    return as_rss(acc + max(2 * t.out_unit, pa + pb + reading))


def combine_peak(block_bytes: int, fan_in: int) -> int:
    """A tree-sum of ``fan_in`` partial blocks: its children, its sum and the
    block it returns."""
    return as_rss((fan_in + 2) * block_bytes)


def tsqr_leaf_peak(read_bytes: int, rows: int, width: int, itemsize: int, out_cols: int = 0,
                   write_flight_bytes: int = 0, read_flight_bytes: int = 0) -> int:
    """A TSQR leaf (:mod:`tilearray.graphs.tsqr`), the largest of its phases:
    reading (its reads held compressed and decoded, zarr's buffers in flight,
    never more than the reads, and the block copied into LAPACK's F-ordered
    working array); factoring (that array, which becomes the reflectors,
    ``T`` and R or, writing Q or U, the rows times the slice handed down);
    writing Q or U (those rows, their C-ordered copy, then the copy and one
    output unit in flight). The reads are released before the factorization
    and the reflectors before the write."""
    block = rows * width * itemsize
    out = rows * out_cols * itemsize
    reading = 2 * read_bytes + min(read_flight_bytes, read_bytes) + block
    factoring = block + 2 * min(rows, width) * width * itemsize + out  # R: min(rows, n) x n
    writing = out + max(out, min(write_flight_bytes, out))
    return as_rss(max(reading, factoring, writing))


def tsqr_combine_peak(stacked: int, width: int, itemsize: int) -> int:
    """A TSQR combine: its children's R factors, ``stacked`` rows of
    ``width`` in all, their stack (which becomes the Q pieces) and its R
    (``min(stacked, width)`` rows)."""
    return as_rss((2 * stacked + min(stacked, width)) * width * itemsize)


def tsqr_root_peak(rows: int, width: int, itemsize: int, part: str) -> int:
    """The TSQR root: R (``rows x width``), its sign-normalised copy, ``diag(d)``
    (Q's slice) and what ``part`` computes from it, as measured with
    tracemalloc (``graphs.linalg``): singular values alone (gesdd without
    vectors) a copy and its work, ``2 r w``; with vectors (Vt, U, least
    squares) ``3 r w + 5 r^2`` -- 7-8 r^2 for a square R, 3 r w for a wide
    one (until 2026-12-07 ``9 r w`` for both: a 40 x 30000 X's lstsq planned
    110 MiB where it holds 28, helper-45)."""
    area = rows * width
    extra = {"R": 0, "s": 2 * area}.get(part, 3 * area + 5 * rows * rows)
    return as_rss((2 * area + extra + rows * rows) * itemsize)


def cholesky_peak(b: int, panel: int, strip_read: int, a_flight: int, itemsize: int,
                  l_itemsize: int) -> int:
    """A left-looking Cholesky tile task over ``b x b`` tiles, the largest of
    its three phases: reading ``A_ij`` strip by strip into the tile (the
    tile, and one strip's ``strip_read`` bytes held compressed and decoded
    with zarr's buffers in flight); the updates (the tile, one ``L_ik`` and
    one ``L_jk`` column panel ``panel`` wide of ``l_itemsize``, the next
    read held compressed and decoded); the factor (the tile, ``L_jj`` read
    unit by unit -- ``panel x panel``, one held compressed and decoded --
    and one output unit copied and encoded)."""
    tile, ltile, lpanel = b * b * itemsize, b * b * l_itemsize, b * panel * l_itemsize
    unit = panel * panel * l_itemsize
    reading = tile + 2 * strip_read + min(a_flight, strip_read)
    updating = tile + 4 * lpanel
    factoring = tile + ltile + 2 * unit + 2 * unit  # L_jj's unit read; an output unit written
    return as_rss(max(reading, updating, factoring))


def trsolve_peak(b: int, rhs_cols: int, n: int, t_read: int, itemsize: int,
                 whole_rhs: bool = False) -> int:
    """A blocked triangular-substitution task: one ``b x b`` tile of T (read
    held compressed and decoded, then in the computing dtype); an
    elimination's partial sum, the solved row tile it multiplies, their product and the
    new sum (``4 b x rhs_cols``); held on its worker meanwhile, the solved
    row tiles waiting for the gather (up to ``n x rhs_cols``; the gather
    holds them and their stack, ``2 n``) and the other row tiles' partial
    sums (up to ``n - b``) and, when the right-hand side is an in-memory
    value (``whole_rhs``: a NumPy B, or the solution of the substitution
    before it), all of it. Priced at ``2 b + n`` rows, the inverse of a
    3000 x 3000 SPD matrix had been planned at 134 MiB of 135 and killed
    every 300 MiB worker (each row tile then held a term per solved tile)."""
    held = (3 * b + 2 * n + (n if whole_rhs else 0)) * rhs_cols
    return as_rss(2 * t_read + b * b * itemsize + held * itemsize)


def symv_peak(area: int, sides: int, k: int, n: int, read: int, itemsize: int,
              norm: bool) -> int:
    """A symmetric-product block task: the block (``area`` elements; its
    read, ``read`` bytes, held compressed and decoded), its copy in the
    computing dtype, a masked copy where it crosses the diagonal (``|A|``
    for the norm is taken in place), the whole operand (``n x k``) and the
    block's pieces of it and partial products (``sides`` = its rows +
    columns)."""
    tiles = 3
    return as_rss(2 * read + tiles * area * itemsize + (n + 2 * sides) * k * itemsize)


def incore_peak(read_bytes: int, n: int, itemsize: int, work: int = 4) -> int:
    """One task holding a whole ``n x n`` matrix: its read held compressed and
    decoded, and ``work`` matrices of LAPACK copies, workspace and results."""
    return as_rss(2 * read_bytes + work * n * n * max(itemsize, 8))
