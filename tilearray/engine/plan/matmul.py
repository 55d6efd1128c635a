"""Lowering a matrix product: the block layout that reads least within the
budget (output blocks accumulating K panels, prefetched or read in place in
bands, a split and tree-summed contraction when blocks are too few) and its
graph of :mod:`tilearray.graphs.matmul` tasks. Pure, like the rest of the plan."""

from __future__ import annotations

import itertools
import math

import numpy as np
from dask.base import tokenize
from dask.utils import format_bytes

from ... import _config
from ...graphs import matmul as gmm
from ...graphs.blocks import compact, group_edges, intervals, max_interval, split_points, tree
from ...graphs.spec import Read, Trans, leaves, unit_edges
from ...storage import ArrayRef, Grid
from ...storage.stream import slab_plan
from ..expr.nodes import (
    MatMul,
)
from . import layout
from .sizing import (
    _all_done,
    _as_rss,
    _band_bytes,
    _leaf_itemsize,
    _op_temporaries,
    _panels,
    _short,
)
from .types import Stage


class MatmulLowering:
    """:meth:`matmul` of :class:`~.lower.Lowerer` (a mixin: it uses the
    Lowerer's ``spec``, ``budget``, ``graph``, ``stages`` and ``_check_fits``)."""

    # -- matmul -------------------------------------------------------------------
    def matmul(self, node: MatMul, out: ArrayRef | None, out_grid: Grid | None, skip):
        deps: list = []
        a_spec = self.spec(node.a, deps)
        b_spec = self.spec(node.b, deps)
        (m, k), n = node.a.shape, node.b.shape[1]
        dtype = np.dtype(node.dtype)
        a_units, b_units = unit_edges(a_spec, 1, k), unit_edges(b_spec, 0, k)
        a_k, b_k = _panels(a_units), _panels(b_units)
        ka, kb = max_interval(a_k), max_interval(b_k)
        # bytes per panel element of each fused temporary, cast to dtype
        ca = max(_leaf_itemsize(a_spec), dtype.itemsize)
        cb = max(_leaf_itemsize(b_spec), dtype.itemsize)
        ta, tb = _op_temporaries(a_spec), _op_temporaries(b_spec)
        band = _band_bytes(a_spec, b_spec, max(ka, kb), self.budget.task_memory)
        gram = (a_spec == Trans(b_spec) or b_spec == Trans(a_spec)) and a_k == b_k
        out_unit = (out_grid.unit[0] * out_grid.unit[1] if out_grid is not None else 0) \
            * dtype.itemsize
        a_panel_cache: dict = {}
        b_panel_cache: dict = {}

        def panel_bytes(rows_edges, cols_edges) -> tuple[int, int]:
            """Largest A panel (rows block x K panel) and B panel (K panel x
            cols block): the whole units read, or the region cast to dtype,
            plus fused temporaries."""
            if rows_edges not in a_panel_cache:
                c = layout.BlockCosts(a_spec, rows_edges, a_k)
                a_panel_cache[rows_edges] = c.max_read_bytes(exact=False), c.min_request_bytes()
            if cols_edges not in b_panel_cache:
                c = layout.BlockCosts(b_spec, b_k, cols_edges)
                b_panel_cache[cols_edges] = c.max_read_bytes(exact=False), c.min_request_bytes()
            (ra, qa), (rb, qb) = a_panel_cache[rows_edges], b_panel_cache[cols_edges]
            bm, bn = max_interval(rows_edges), max_interval(cols_edges)
            pa = max(ra, bm * ka * ca) + bm * ka * ca * ta
            pb = max(rb, kb * bn * cb) + kb * bn * cb * tb
            return pa, pb, max(qa, qb)

        # B streamed band by band (A and B share their K panels): one B band
        # -- a K panel by one of B's column I/O units -- resident, not a panel
        stream = a_k == b_k and k > 0
        b_cols = unit_edges(b_spec, 1, n)
        if stream:
            c = layout.BlockCosts(b_spec, b_k, b_cols)
            wb = max_interval(b_cols)
            b_band = max(c.max_read_bytes(exact=False), kb * wb * cb) + kb * wb * cb * tb
            b_band_request = c.min_request_bytes()

        # X.T @ X in one block, X's chunks decodable in row slabs: X streamed slab
        # by slab (slab buffer + zstd decoders, never a whole chunk)
        slabs = gram and k > 0 and m > 0 and a_spec == Trans(b_spec) \
            and isinstance(b_spec, Read) and b_spec.grid.row_slabs
        slab_rows = slab_mem = 0
        if slabs:
            slab_rows, slab_mem = slab_plan(b_spec.grid.tile, b_spec.dtype.itemsize, (0, n),
                                            self.budget.task_memory, b_spec.grid.row_slabs)

        def memory(re, ce, mode: str) -> int:
            """Peak of one task: the accumulator and the current panels, plus
            the panel in flight (compressed + decoded) when prefetching, or,
            reading in place, one band's buffers while a panel fills (a panel
            read in one request is its own decoded buffer); at the end the
            accumulator and one output unit copied and encoded at a time.
            Streaming B holds the accumulator, one A panel and one B band,
            each a single large buffer freed whole (so priced as allocated),
            plus one read's buffers."""
            bm, bn = max_interval(re), max_interval(ce)
            acc = bm * bn * dtype.itemsize
            if mode == "slabs":
                return _as_rss(acc + max(2 * out_unit, slab_mem))
            pa, pb, request = panel_bytes(re, ce)
            if gram and bm == m and bn == n:
                pa = 0  # X.T @ X in one block: each panel serves as both operands
            if mode == "stream":
                reading = min(2 * max(band, request, b_band_request), max(pa, b_band))
                return acc + max(2 * out_unit, pa + b_band + _as_rss(reading))
            if mode == "prefetch":
                reading = 2 * max(pa, pb)
            else:  # each request compressed + decoded, at most the panel twice
                reading = min(2 * max(band, request), max(pa, pb))
            return _as_rss(acc + max(2 * out_unit, pa + pb + reading))

        budget = self.budget.task_memory
        hard = (None, None) if out_grid is None else (out_grid.unit_edges(0),
                                                      out_grid.unit_edges(1))
        layouts = []  # every distinct layout that fits, for either read mode
        smallest = None
        for rows_c in layout.bases(a_spec, 0, m, hard[0]):
            for cols_c in layout.bases(b_spec, 1, n, hard[1]):
                step = max(min(max_interval(rows_c), max_interval(cols_c)), 1)
                # roughly square blocks (and 1:2 / 2:1), growing until they no longer fit
                modes = ("prefetch", "in-place") + (("stream",) if stream else ())
                # square blocks for a symmetric product: block pairs are computed once
                ratios = ((1, 1),) if gram and out is not None else ((1, 1), (1, 2), (2, 1))
                for mode, (fr, fc) in itertools.product(modes, ratios):
                    t, last = step, None
                    while True:
                        re, ce = group_edges(rows_c, t * fr), group_edges(cols_c, t * fc)
                        if (re, ce) != last:
                            mem = memory(re, ce, mode)
                            if mem <= budget:
                                layouts.append((re, ce, mem, mode))
                            elif smallest is None or mem < smallest[2]:
                                smallest = (re, ce, mem, mode)
                            last = (re, ce)
                        if mem > budget or t >= max(m, n):
                            break
                        t += step
                if not (gram and out is not None):
                    for mode in modes:
                        layouts += [(re, ce, mem, mode) for re, ce, mem in layout.widest_blocks(
                            rows_c, cols_c, m, n, lambda re, ce, mode=mode: memory(re, ce, mode),
                            budget)]
        if slabs:  # one block, whole: every task is a diagonal (syrk) block
            mem = memory((0, m), (0, n), "slabs")
            if mem <= budget:
                layouts.append(((0, m), (0, n), mem, "slabs"))
            elif smallest is None or mem < smallest[2]:
                smallest = ((0, m), (0, n), mem, "slabs")
        if not layouts:
            self._check_fits("matmul", smallest[2], str(node))

        def n_of(lay):
            return (len(lay[0]) - 1) * (len(lay[1]) - 1)

        def reads_of(lay):  # elements read: A once per block column, B once per block row
            return m * k * (len(lay[1]) - 1) + k * n * (len(lay[0]) - 1)

        def rank(lay):  # least read, then fewest tasks, then prefetch > stream > in place
            return (reads_of(lay), n_of(lay),
                    ("prefetch", "stream", "in-place", "slabs").index(lay[3]))

        best = min(layouts, key=rank)
        threads = self.budget.total_threads
        split_every = int(_config.get("reduction.split-every"))
        k_split = (0, k)
        if 0 < n_of(best) < threads and k > 0:
            # too few blocks for the workers: split K (tree-summing partial
            # blocks) if the sums fit, else use smaller blocks
            acc = max_interval(best[0]) * max_interval(best[1]) * dtype.itemsize
            parts = math.ceil(threads / n_of(best))
            combine = _as_rss((min(split_every, parts) + 2) * acc)
            if combine <= budget:
                k_split = split_points(a_units, b_units, parts)
                best = (*best[:2], max(best[2], combine), best[3])
            else:
                enough = [lay for lay in layouts if n_of(lay) >= threads]
                if enough:
                    best = min(enough, key=rank)
        row_edges, col_edges, peak, mode = best
        read_bytes = None if mode == "prefetch" else band
        slab = slab_rows if mode == "slabs" else None
        if len(k_split) > 2:  # panels never straddle a split point
            a_k = tuple(sorted(set(a_k) | set(k_split)))
            b_k = tuple(sorted(set(b_k) | set(k_split)))
        token = tokenize("matmul", a_spec, b_spec, row_edges, col_edges, k_split, str(out), deps)
        name = "matmul-" + token
        a_costs = layout.BlockCosts(a_spec, row_edges, a_k)
        # streaming reads B in bands split at its column units and the block edges
        b_edges = tuple(sorted(set(col_edges) | set(b_cols))) if mode == "stream" \
            else col_edges
        b_at = {e: q for q, e in enumerate(b_edges)}
        b_costs = layout.BlockCosts(b_spec, b_k, b_edges)
        a_iv, b_iv = intervals(a_k), intervals(b_k)
        segments = []  # per K segment: its A and B panels and their index ranges
        for k0, k1 in (intervals(k_split) if k > 0 else [(0, 0)]):
            qa = [q for q, p in enumerate(a_iv) if k0 <= p[0] < k1]
            qb = [q for q, p in enumerate(b_iv) if k0 <= p[0] < k1]
            segments.append((compact(a_iv[q] for q in qa), compact(b_iv[q] for q in qb),
                             (qa[0], qa[-1] + 1) if qa else (0, 0),
                             (qb[0], qb[-1] + 1) if qb else (0, 0)))
        keys, blocks = [], []
        nbytes = nreq = gets = written = 0
        # X.T @ X, X @ X.T into storage: the result is symmetric, so each pair of
        # blocks (i, j), (j, i) is computed once and written twice
        sym = gram and out is not None and len(k_split) <= 2 and row_edges == col_edges
        for i, rows in enumerate(intervals(row_edges)):
            for j, cols in enumerate(intervals(col_edges)):
                if sym and i > j:
                    continue
                if out_grid is not None and _all_done(out_grid, rows, cols, skip) and (
                        not sym or _all_done(out_grid, cols, rows, skip)):
                    continue
                parts = []
                j0, j1 = b_at[cols[0]], b_at[cols[1]]
                b_bands = compact(intervals(b_edges[j0 : j1 + 1])) if mode == "stream" else None
                for s, (pa, pb, qa, qb) in enumerate(segments):
                    if not gmm.is_gram(a_spec, b_spec, rows, cols, pa, pb):
                        b, r, g = a_costs.band(0, i, *qa)
                        nbytes, nreq, gets = nbytes + b, nreq + r, gets + g
                    for jj in range(j0, j1):
                        b, r, g = b_costs.band(1, jj, *qb)
                        nbytes, nreq, gets = nbytes + b, nreq + r, gets + g
                    args = (a_spec, b_spec, rows, cols, pa, pb, dtype)
                    if len(k_split) <= 2 and out is not None:
                        key = (name, i, j)
                        store = gmm.matmul_store_pair if sym and i < j else gmm.matmul_store
                        self.graph[key] = (store, *args, out, deps, read_bytes, b_bands, slab)
                    else:
                        key = (name + "-part", i, j, s)
                        self.graph[key] = (gmm.matmul_block, *args, deps, read_bytes, b_bands,
                                           slab)
                    parts.append(key)
                if len(parts) > 1 or (out is None and len(k_split) > 2):
                    root = tree(
                        parts, split_every,
                        lambda level, q, i=i, j=j: (name + "-sum", i, j, level, q),
                        lambda children: (gmm.sum_partials, *children), self.graph)
                    parts = [root]
                key = parts[0]
                if out is not None and len(k_split) > 2:
                    sk = (name, i, j)
                    self.graph[sk] = (gmm.store_partials, out, rows, cols, key)
                    key = sk
                if out is not None:
                    written += (rows[1] - rows[0]) * (cols[1] - cols[0]) * dtype.itemsize \
                        * (2 if sym and i < j else 1)
                keys.append(key)
                blocks.append((rows, cols))
        flops = 2 * m * n * k
        sym_txt = ", symmetric: each block pair computed once, diagonal blocks by syrk" \
            if gram else ""
        itemsize = max(np.dtype(node.a.dtype).itemsize, np.dtype(node.b.dtype).itemsize)
        lb = int(flops / math.sqrt(max(budget, 1) / itemsize) * itemsize) if flops else 0
        # and every input is read at least once (the bound's leading term is below
        # that for tall-skinny products)
        once = {tokenize(leaf): leaf.grid.shape[0] * leaf.grid.shape[1] * leaf.dtype.itemsize
                for leaf in leaves(a_spec) + leaves(b_spec)}
        lb = max(lb, sum(once.values())) if flops else 0
        ksplit_txt = f", K split in {len(k_split) - 1}" if len(k_split) > 2 else ""
        self._add_stage(Stage(
            "matmul", f"{_short(node)}: output blocks up to {max_interval(row_edges)}x"
            f"{max_interval(col_edges)}, K panels A {ka} / B {kb}{ksplit_txt}{sym_txt}, "
            + {"prefetch": "next panel prefetched",
               "stream": f"A panels read in place, B streamed in bands of {max_interval(b_cols)}"
                         " columns",
               "in-place": "panels read in place",
               "slabs": f"X decoded in row slabs of {slab} rows, never a whole chunk "
                        f"({format_bytes(slab_mem)} of slab and decoder buffers)"}[mode]
            + ("" if mode in ("prefetch", "slabs")
               else f" (requests <= {format_bytes(read_bytes)})"),
            len(keys) * max(len(k_split) - 1, 1), peak, nbytes, written, flops,
            io_lower_bound=lb or None, reads=nreq, store_gets=gets))
        return keys if out is not None else (keys, blocks)

