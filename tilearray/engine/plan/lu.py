"""Lowering a general solve or slogdet by left-looking LU with partial
pivoting over column panels (:mod:`tilearray.graphs.lu` tasks). Pure.

Panel ``j`` is one task holding the whole ``n x b`` column panel, reading
A's panel and every L panel to its left (``j n b`` elements); the panels run
in order (each needs the permutation so far), so this is sequential in the
panels. Reads are about ``n^3 / (2 b)`` elements, writes ``2 n^2`` (L and U).
"""

from __future__ import annotations

import numpy as np
from dask.base import tokenize

from ...graphs import lu as glu
from ...graphs.blas import tile_edges
from ...graphs.emit import Tasks
from ...graphs.spec import Read, leaves
from . import layout
from .cholesky import MIN_TILE, fetched_bytes, fit_tile, input_unit_side
from .map import check_fits
from .memory import as_rss
from .memory import read_flight as zarr_flight
from .sizing import short
from .types import Budget, Output, Stage


def lu_panel_peak(n: int, b: int, a_read: int, flight: int, itemsize: int) -> int:
    """A panel task: A's panel read band by band (``a_read``: one band
    compressed and decoded, zarr's buffers) into the panel, then gathered;
    then the panel, one L panel read and gathered (and its next read); then
    the panel, getrf's copy and one L/U panel being written."""
    nb = n * b * itemsize
    reading = 2 * a_read + min(flight, a_read) + 2 * nb
    updating = nb + 4 * nb
    factoring = 2 * nb + 2 * nb + 2 * b * b * itemsize
    return as_rss(max(reading, updating, factoring))


def band_rows(spec, n: int) -> int:
    """Rows of A read at a time into a panel: the tallest I/O unit of its arrays."""
    return max(min(max((lf.grid.unit[0] for lf in leaves(spec)), default=n), n), 1)


def _a_read(spec, n, b):
    """Bytes one band of A's panel fetches (whole units), at most."""
    rows = band_rows(spec, n)
    return sum(fetched_bytes(rows, lf.grid.unit[0], n) * fetched_bytes(b, lf.grid.unit[1], n)
               * lf.dtype.itemsize for lf in leaves(spec))


def lu_width(node, spec, budget: Budget) -> int:
    """The panel width: the largest that fits, at most ``n / 4`` (at least
    :data:`~.cholesky.MIN_TILE`)."""
    n, item = node.x.shape[0], np.dtype(node.dtype).itemsize
    cap = max(MIN_TILE, -(-n // 4))
    flight = zarr_flight(spec)
    return fit_tile(n, input_unit_side(spec), cap,
                    lambda b: lu_panel_peak(n, b, _a_read(spec, n, b), flight, item), budget)


def lower_lu(node, spec, deps: list, budget: Budget, b: int, l_ref, u_ref, grid) -> Stage:
    """The chain of panel tasks writing L (original row order) and U."""
    n, dtype = node.x.shape[0], np.dtype(node.dtype)
    peak = lu_panel_peak(n, b, _a_read(spec, n, b), zarr_flight(spec), dtype.itemsize)
    check_fits("LU panel", peak, f"{short(node)} in panels of {b} columns", budget)
    edges = tuple(tile_edges(n, b))
    cuts = [0, *(e[1] for e in edges)]
    band = band_rows(spec, n)
    a_costs = layout.BlockCosts(spec, [*range(0, n, band), n], cuts)
    l_costs = layout.BlockCosts(Read(l_ref, grid, dtype), [0, n], cuts)
    singular_ok = dict(node.options).get("op") == "slogdet"  # det 0: NumPy's (0, -inf)
    name = "lu-" + tokenize(spec, deps, edges, str(l_ref), str(u_ref), singular_ok)
    work, prev, tot = Tasks(), None, layout.ReadTotals()
    for j in range(len(edges)):
        args = (spec, deps, l_ref, u_ref, edges, j, n, band, dtype, singular_ok) + \
            ((prev,) if prev else ())
        prev = work.add((name, j), glu.panel, *args)
        a_reads = [a_costs.at(r, j) for r in range(a_costs.shape[0])]
        tot.add(*a_reads, *(l_costs.at(0, k) for k in range(j)))
    keys = tuple(t.key for t in work.freeze())
    return Stage(
        "lu", f"{short(node)}: left-looking LU with partial pivoting by {len(edges)} column "
        f"panels of {b} (in order; each reads A's panel and the L panels to its left, writes "
        "its columns of L and U)", len(work), peak, tot.nbytes, 2 * n * n * dtype.itemsize,
        flops=2 * n**3 // 3, reads=tot.reads, store_gets=tot.gets, work=work.freeze(),
        outputs={"panels": Output("stats", keys), "last": Output("value", (keys[-1],))})


def lu_forward_peak(n: int, b: int, ncols: int, itemsize: int) -> int:
    """A step of ``L y = P b``: one L panel (read, pivoted, its rows) and the
    whole right-hand side (``n x ncols``: read, pivoted, updated)."""
    return as_rss(3 * n * b * itemsize + 3 * n * ncols * max(itemsize, 8))


def rhs_group(n: int, b: int, ncols: int, itemsize: int, budget: Budget) -> int:
    """Right-hand sides a forward sweep holds at once: all ``ncols``, or the
    most that fit beside a panel (each group of columns then sweeps the L
    panels on its own, reading them again); at least 1."""
    lo, hi = 1, max(ncols, 1)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if lu_forward_peak(n, b, mid, itemsize) <= budget.task_memory \
            else (lo, mid - 1)
    return lo


def lower_lu_forward(node, b_spec, deps: list, l_ref, grid, panels: tuple, b: int,
                     budget: Budget, cols: tuple | None = None) -> Stage:
    """``L y = P b`` for the right-hand sides' columns ``cols`` (all when
    None) by a chain of tasks, one per L panel; its output "last" is ``y``.
    Refused (before the LU runs) when a step cannot hold one right-hand side
    with a panel."""
    n = node.x.shape[0]
    cols = (0, node.y.shape[1]) if cols is None else tuple(cols)
    ncols = cols[1] - cols[0]
    dtype = np.dtype(node.dtype)
    peak = lu_forward_peak(n, b, ncols, dtype.itemsize)
    check_fits("LU forward substitution", peak,
               f"{short(node)}: {ncols} right-hand sides of {n} rows held whole, with a panel "
               f"of {b} columns", budget)
    edges = tuple(tile_edges(n, b))
    cuts = [0, *(e[1] for e in edges)]
    l_costs = layout.BlockCosts(Read(l_ref, grid, dtype), [0, n], cuts)
    tot = layout.ReadTotals(*layout.BlockCosts(b_spec, [0, n], list(cols)).at(0, 0))
    name = "lu-forward-" + tokenize(b_spec, deps, edges, str(l_ref), panels[-1], cols)
    work, prev = Tasks(), None
    for k in range(len(edges)):
        args = (l_ref, edges, k, n, b_spec, deps, cols, dtype, panels[-1])
        prev = work.add((name, k), glu.forward, *args + ((prev,) if prev else ()))
        tot.add(l_costs.at(0, k))
    keys = tuple(t.key for t in work.freeze())
    what = "" if ncols == node.y.shape[1] else f" (right-hand sides {cols[0]}:{cols[1]})"
    return Stage("lu-fwd", f"L y = P b: forward sweep over the {len(edges)} L panels{what}",
                 len(work), peak, tot.nbytes, flops=n * n * ncols, reads=tot.reads,
                 store_gets=tot.gets, work=work.freeze(),
                 outputs={"steps": Output("stats", keys), "last": Output("value", (keys[-1],))})


def lower_lu_slogdet(node, panels: tuple) -> Stage:
    """One small task: ``slogdet`` from the panels' permutation and U's diagonal."""
    key = "lu-slogdet-" + tokenize(panels)
    work = Tasks()
    work.add(key, glu.slogdet, np.dtype(node.dtype), *panels)
    return Stage("small", "slogdet from the LU's pivots and U's diagonal", 1, 0, 0,
                 work=work.freeze(), outputs={"0": Output("value", (key,))})
