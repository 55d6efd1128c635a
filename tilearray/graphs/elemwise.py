"""Map tasks over output blocks: evaluate a fused spec, write or return it."""

from __future__ import annotations

import numpy as np

from ..storage import IOStats, buffers, write_block
from .spec import evaluate


def block_store(spec, rows, cols, dtype, out_ref, deps=()):
    """Evaluate block ``rows x cols`` of ``spec`` and write it whole."""
    buffers.release(blocks_only=True)  # no reduction's blocks held under this budget
    stats = IOStats()
    x = np.asarray(evaluate(spec, rows, cols, list(deps), stats)).astype(dtype, copy=False)
    x = np.broadcast_to(x, (rows[1] - rows[0], cols[1] - cols[0]))
    write_block(out_ref, rows, cols, x, stats)
    out = stats.as_dict()
    out["tasks"] = 1
    return None, out


def block_compute(spec, rows, cols, dtype, deps=()):
    """Evaluate block ``rows x cols`` of ``spec`` and return it with stats."""
    buffers.release(blocks_only=True)
    stats = IOStats()
    x = np.asarray(evaluate(spec, rows, cols, list(deps), stats)).astype(dtype, copy=False)
    x = np.broadcast_to(x, (rows[1] - rows[0], cols[1] - cols[0]))
    out = stats.as_dict()
    out["tasks"] = 1
    return np.ascontiguousarray(x), out


def small_op(name, kwargs, *args, merge: bool = True):
    """Apply a NumPy function to small in-memory operands (vectors, scalars).

    Operands that come from other tasks arrive as ``(value, stats)`` pairs;
    their stats are merged into this task's (``merge``), or left for the
    planner to gather on their own: an operand that two small ops share
    would otherwise be counted twice (``v[1:] - v[:-1]``).
    """
    from .matmul import counted, merge_stats
    from .spec import func

    values, stats = [], {}
    for a in args:
        if isinstance(a, tuple) and len(a) == 2 and isinstance(a[1], dict):
            values.append(a[0])
            if merge:
                stats = merge_stats(stats, a[1])
        else:
            values.append(a)
    try:
        return func(name)(*values, **dict(kwargs)), counted(stats)
    except ValueError as e:  # as the blocked reductions raise it (no worker traceback)
        if name in ("nanargmin", "nanargmax") and "All-NaN" in str(e):
            from ..errors import AllNaNSliceError

            raise AllNaNSliceError(f"np.{name}: All-NaN slice encountered") from None
        raise


def small_op_alone(name, kwargs, *args):
    """:func:`small_op` counting itself only (its operands' stats are gathered apart)."""
    return small_op(name, kwargs, *args, merge=False)


def random_block(out_ref, rows, cols, dtype, seed, tile):
    """Fill block ``rows x cols`` with reproducible random values and write it.

    Each tile draws from its own stream seeded by ``(seed, tile row, tile col)``,
    so the values depend on the seed and tiling, not on how blocks are grouped.
    """
    dtype = np.dtype(dtype)
    x = np.empty((rows[1] - rows[0], cols[1] - cols[0]), dtype=dtype)
    for r0 in range(rows[0], rows[1], tile[0]):
        for c0 in range(cols[0], cols[1], tile[1]):
            r1, c1 = min(r0 + tile[0], rows[1]), min(c0 + tile[1], cols[1])
            rng = np.random.default_rng([seed, r0 // tile[0], c0 // tile[1]])
            shape = (r1 - r0, c1 - c0)
            if dtype.kind == "f":
                v = rng.standard_normal(shape, dtype=dtype if dtype.itemsize >= 4 else None)
            elif dtype.kind == "b":
                v = rng.random(shape) < 0.5
            else:
                info = np.iinfo(dtype)
                lo, hi = max(info.min, -100), min(info.max, 100)
                v = rng.integers(lo, hi, size=shape, endpoint=True)
            x[r0 - rows[0] : r1 - rows[0], c0 - cols[0] : c1 - cols[0]] = v
    stats = IOStats()
    write_block(out_ref, rows, cols, x, stats)
    out = stats.as_dict()
    out["tasks"] = 1
    return None, out
