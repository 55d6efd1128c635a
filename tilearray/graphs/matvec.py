"""Products with a small in-memory operand: ``A @ W`` and ``W @ A`` where A
is read block by block (a fused spec) and W (a vector or a thin matrix)
arrives whole, once per worker, as the result of one graph task.

Partials are 2-D in the product's own orientation -- ``A[rows, cols] @
W[cols]`` is ``(rows, k)``, ``W[:, rows] @ A[rows, cols]`` is ``(k, cols)``
-- and are summed by :func:`~.matmul.sum_partials`; the last task returns
them, writes them whole (:func:`~.matmul.store_partials`) or joins them
into one value (:func:`join`). BLAS runs with one thread per worker thread
(:func:`~.linalg.one_blas_thread`).
"""

from __future__ import annotations

import numpy as np

from ..storage import IOStats
from .blas import one_blas_thread
from .matmul import counted, merge_stats
from .spec import evaluate, prefetch_next


def operand(w, side: str, transposed: bool) -> np.ndarray:
    """The operand as a 2-D array in the product's orientation: ``(q, k)``
    for ``A @ W`` (``"right"``), ``(k, p)`` for ``W @ A`` (``"left"``);
    ``transposed``: W is given for the transposed product (``A.T @ W`` read
    as ``(W.T @ A).T``)."""
    if isinstance(w, tuple):  # (value, stats) of the task that holds it
        w = w[0]
    w = np.asarray(w)
    if transposed:
        w = w.T
    if w.ndim == 1:
        return w.reshape(-1, 1) if side == "right" else w.reshape(1, -1)
    return w


def _read(spec, rows, cols, deps, stats, ahead) -> np.ndarray:
    """Block ``rows x cols`` of ``spec`` (broadcast to its shape), then the
    region ``ahead`` (a later task's, or None) hinted to the stores."""
    x = np.asarray(evaluate(spec, rows, cols, list(deps), stats))
    prefetch_next([spec], None if ahead is None else [ahead])
    return np.broadcast_to(x, (rows[1] - rows[0], cols[1] - cols[0]))


def block_product(spec, rows, cols, side, transposed, dtype, w_index, deps=(), ahead=None):
    """Partial product of block ``rows x cols`` of ``spec`` with the operand
    ``deps[w_index]``: ``(block @ W[cols], stats)`` or ``(W[:, rows] @ block,
    stats)``, in ``dtype`` (NumPy's result dtype of the product); the
    region ``ahead`` (a later block) is hinted to the stores meanwhile."""
    stats = IOStats()
    w = operand(deps[w_index], side, transposed)
    x = _read(spec, rows, cols, deps, stats, ahead)
    with one_blas_thread():
        if side == "right":
            part = np.matmul(x, w[cols[0] : cols[1]], dtype=dtype)
        else:
            part = np.matmul(w[:, rows[0] : rows[1]], x, dtype=dtype)
    del x
    st = stats.as_dict()
    st["tasks"] = 1
    return part, st


def join(shape, axis: int, transposed: bool, dtype, *parts):
    """One value from the summed partials of consecutive blocks along
    ``axis``, transposed back when the product was, in ``shape`` (with no
    parts -- an empty stored side -- zeros of ``dtype``, as NumPy's)."""
    if not parts:
        return np.zeros(shape, dtype), counted({})
    stats: dict = {}
    for _, st in parts:
        stats = merge_stats(stats, st)
    value = np.concatenate([p for p, _ in parts], axis=axis)
    if transposed:
        value = value.T
    return np.ascontiguousarray(value).reshape(shape), counted(stats)


def gram_block(spec, rows, cols, axis, dtype, w_index, deps=(), ahead=None):
    """One panel's share of a Gram product in one read: for a row panel
    (``axis`` 0, ``cols`` every column) ``P.T @ (P @ W)``, ``(n, k)``; for a
    column panel (``axis`` 1, ``rows`` every row) ``P @ (P.T @ W)``, ``(m,
    k)``. The panel is read once and used twice; the thin ``P @ W`` never
    leaves the task; the region ``ahead`` (a later panel) is hinted to the
    stores meanwhile. ``(part, stats)`` in ``dtype``."""
    stats = IOStats()
    w = operand(deps[w_index], "right", False)
    x = _read(spec, rows, cols, deps, stats, ahead)
    if axis == 1:
        x = x.T
    with one_blas_thread():
        if x.dtype != dtype:  # BLAS multiplies in one dtype: one cast copy, used twice
            x = x.astype(dtype)
        thin = np.matmul(x, w, dtype=dtype)
        part = np.matmul(x.T, thin, dtype=dtype)
    del x, thin
    st = stats.as_dict()
    st["tasks"] = 1
    return part, st
