"""TSQR tasks: the QR of a tall-skinny matrix as a reduction tree over row
blocks, and its Q (or an SVD's U) applied back down the tree and written.

Up the tree (one read of X): each leaf task reads its row block of
``[X | Y]`` and keeps only the R of its QR; each combine task stacks its
children's R factors and factors them again, keeping the stack's Q pieces
(``fan_in`` small ``r x r`` matrices) for the way down; the root task
normalises signs (``diag(R) >= 0``) and turns R into what was asked (R, the
singular values, Vt, a least-squares solution). Down the tree (a second
read of X, only for Q or U): each node multiplies its Q pieces by the slice
its parent handed down, and each leaf recomputes its block's QR -- the same
LAPACK call (blocked ``geqrt``) on the same data, so the same ``Q_i`` --
applies it to its slice (``gemqrt``, ``Q_i`` never formed) and writes its
rows of Q; or, when its R from the way up is well conditioned (float64,
``kappa_2(R_i) <= ~4500``), multiplies its block by ``R_i^-1`` times the
slice (one gemm, a quarter of the time). For such jobs a leaf whose Gram
matrix is well conditioned (``kappa_2(R_i) <= ~67``) takes R on the way up
from the Cholesky factor of ``X_i^T X_i`` (one syrk, no copy of the block)
instead of a Householder QR. Nothing of size ``m`` is ever
held whole.

Stats: every task counts itself once. The up tree merges its children's
figures into the root; the down tasks and the leaves report only their own
(the planner gathers the root and the down tasks for their stats).
"""

from __future__ import annotations

import numpy as np

from ..storage import IOStats, buffers, write_block
from . import blas
from . import linalg as kern
from .blocks import intervals
from .matmul import counted, merge_stats
from .progress import report
from .spec import evaluate, prefetch_next, unit_edges


def _block(specs, rows, widths, deps, stats, order="F") -> np.ndarray:
    """Row block ``rows`` of ``[X | Y]`` in the computing dtype, F-ordered
    (LAPACK's layout), or with ``order="C"`` as read when it can be (a
    single stored part already in that dtype: no copy). F-ordered, each part
    is read a column strip of I/O units at a time (:func:`strips`), copied
    in as it comes: a wide block holds one strip's read beside it, not all."""
    cuts = [strips(s, w) if order == "F" else [(0, w)]
            for s, w in zip(specs, widths, strict=True)]
    # each part's first strip read first (to check their dtypes); computed in float64
    # whatever they are, as NumPy's linalg does (a float32 X's small singular directions:
    # float32 reflectors had lost 4 digits more than NumPy at cond 1.6e6, helper-50)
    first = [np.asarray(evaluate(s, rows, c[0], list(deps), stats))
             for s, c in zip(specs, cuts, strict=True)]
    dtype = np.result_type(np.float64, *(blas.result_dtype(p.dtype) for p in first))
    if order == "C" and len(first) == 1 and first[0].dtype == dtype:
        return first[0]
    out = np.empty((rows[1] - rows[0], sum(widths)), dtype, order=order)
    lo = 0
    for i, (s, w, c) in enumerate(zip(specs, widths, cuts, strict=True)):
        blas.copy_rows(out[:, lo + c[0][0] : lo + c[0][1]], first[i])
        first[i] = None  # copied: released before the next strip is read
        for c0, c1 in c[1:]:
            blas.copy_rows(out[:, lo + c0 : lo + c1],
                           np.asarray(evaluate(s, rows, (c0, c1), list(deps), stats)))
        lo += w
    return out


def strips(spec, width: int) -> list[tuple[int, int]]:
    """The column strips ``_block`` reads a part in: its I/O unit columns
    (each unit read once, by one strip)."""
    return list(intervals(unit_edges(spec, 1, width)))


def _hint(specs, widths, ahead) -> None:
    if ahead is not None:
        prefetch_next(specs, [(ahead, (0, w)) for w in widths])


def leaf_r(specs, rows, widths, deps=(), ahead=None, gram: bool = False):
    """Read row block ``rows`` of ``[X | Y]`` and return the R of its QR
    (rows ``ahead``, a later leaf's, are hinted to the stores meanwhile).

    ``gram`` (a Q or U job whose pass down uses ``X_i R_i^-1``): a
    well-conditioned float64 block's R is the Cholesky factor of its Gram
    matrix (:func:`~.linalg.gram_leaf_r`), returned as ``("gram", R)`` so
    the pass down knows it must use ``R_i^-1`` (its reflectors were never
    made); other blocks take the Householder QR."""
    buffers.release(blocks_only=True)
    stats = IOStats()
    block = _block(specs, rows, widths, deps, stats, order="C" if gram else "F")
    _hint(specs, widths, ahead)
    report(1, 2)  # read; the QR is the other half
    r = kern.gram_leaf_r(block) if gram else None
    if r is not None:
        return ("gram", r), counted(stats.as_dict())
    # a block read as is (the Gram path's C order) may be a view of shared data: not
    # overwritten; the F-ordered copy is this task's own
    r = kern.qr_leaf_r(block, overwrite_block=not gram)
    del block
    return r, counted(stats.as_dict())


def combine(keep_q: bool, *children):
    """QR of the children's stacked R factors: ``((Q pieces or None, R), stats)``."""
    rs, stats = [], {}
    for value, st in children:
        rs.append(_r_of(value))  # a leaf's R, ("gram", R) or a combine's (pieces, R)
        stats = merge_stats(stats, st)
    if not keep_q:  # R alone: geqrf, no Q formed
        return (None, kern.qr_combine(rs, mode="r")), counted(stats)
    pieces, r = kern.qr_combine(rs)
    return (pieces, r), counted(stats)


def _r_of(value) -> np.ndarray:
    return value if isinstance(value, np.ndarray) else value[1]


def root(part: str, n: int, m: int, options: tuple, top):
    """The root: signs normalised so ``diag(R) >= 0``, then ``part`` of the
    factorization: "R" (``r x n``), "s" / "Vt" (thin SVD of R, as
    ``{"R": ..., part: ...}``: :func:`factor`), "lstsq"
    (NumPy's tuple from R of ``[X | Y]``), or "down": ``{"slice": ...,
    "R": ..., ["s": ..., "Vt": ...]}`` -- the slice handed down to the top
    node's children (``D``, or ``D @ U_R`` with ``options`` ``(("right",
    "U"),)``; with ``("align", Vt)``, U_R rotated to that Vt:
    :func:`~.linalg.align_svd`) and the small factors the same run gives
    for free."""
    value, st = top
    opts = dict(options)
    r = _r_of(value)
    d = kern.diag_signs(r)
    r = r * d[:, None]
    if part == "R":
        out = r
    elif part in ("s", "Vt"):  # with R, kept by the driver for the other parts
        s_vt = kern.svd_from_r(r[:, :n], compute_uv=part == "Vt")
        out = {"R": r, part: s_vt[2] if part == "Vt" else s_vt}
    elif part == "lstsq":
        out = kern.lstsq_from_r(r, n, m, rcond=opts.get("rcond"), vector=opts.get("vector"))
        if opts.get("result"):  # computed in float64 (NumPy's way), returned in X's dtype
            x, res, rank, s = out
            t = np.dtype(opts["result"])
            out = (x.astype(t), res.astype(t), rank, s.astype(t))
        return out, counted(st)
    else:  # "down": the top node's slice, and R (and s, Vt) on the way
        out = {"slice": np.diag(d), "R": r}
        if opts.get("right") == "U":
            u_r, out["s"], out["Vt"] = kern.svd_from_r(r)
            if opts.get("align") is not None:  # the Vt an earlier run gave: U to match it
                u_r, out["Vt"] = kern.align_svd(u_r, out["Vt"], np.asarray(opts["align"]))
            out["slice"] = out["slice"] @ u_r
    if opts.get("result"):  # computed in float64, returned in X's dtype; the slice and
        # the R kept with s or Vt stay float64 (the driver takes the other from that R)
        t = np.dtype(opts["result"])
        out = out.astype(t) if part == "R" else \
            {k: v if k in ("slice", "R") else v.astype(t) for k, v in out.items()}
    return out, counted(st)


def factor(part: str, root_):
    """``part`` of a root's ``{"R": ..., part: ...}``; the root's figures are
    counted through the root itself (the plan's "factors" output)."""
    return root_[0][part], counted({})


def down(node, slice_, index: int = 0):
    """Slices for a combine node's children: its Q pieces times the slice its
    parent handed down (``slice_``: the root's ``(slice, stats)`` or a list
    from the parent's own ``down`` task, of which this node is ``index``)."""
    pieces = node[0][0]
    s = _pick(slice_, index)
    return [kern.q_apply_down(p, s) for p in pieces], {"tasks": 1}


def _pick(slice_, index):
    value = slice_[0]
    if isinstance(value, dict):  # the root's
        return value["slice"]
    return value[index] if isinstance(value, list) else value


def leaf_store(specs, rows, widths, deps, out_ref, ncols: int, slice_, index: int = 0,
               ahead=None, leaf=None, dtype=None):
    """Rows ``rows`` of Q (or U) in ``dtype`` (computed in float64): ``Q_i``
    times its slice, written whole into ``out_ref`` (columns ``0:ncols``),
    or returned when ``out_ref`` is None (rows ``ahead`` hinted, as :func:`leaf_r`). ``Q_i @ slice`` is
    ``X_i @ (R_i^-1 slice)`` when ``leaf`` (the up leaf's ``(R_i, stats)``)
    has an R that is well conditioned (:func:`~.linalg.leaf_solve_weights`), else
    the block's QR again with its reflectors applied to the slice."""
    buffers.release(blocks_only=True)
    stats = IOStats()
    s = _pick(slice_, index)
    gram = leaf is not None and isinstance(leaf[0], tuple)  # ("gram", R_i): see leaf_r
    w = None if leaf is None else kern.leaf_solve_weights(_r_of(leaf[0]), s, rows[1] - rows[0],
                                                          trusted=gram)
    if gram and w is None:  # pragma: no cover - leaf_r's checks imply the solve's
        raise RuntimeError(f"TSQR leaf rows {rows}: a Gram R without its solve weights")
    # gemm takes the block as read; the reflectors want it F-ordered
    block = _block(specs, rows, widths, deps, stats, order="F" if w is None else "C")
    _hint(specs, widths, ahead)
    report(1, 3)  # read, then Q times the slice, then the write
    if w is not None:
        q = kern.leaf_times(block, w)
    else:
        q = kern.qr_leaf_apply(block, s, overwrite_block=True)
    del block
    block = np.ascontiguousarray(q[:, :ncols], dtype=dtype)
    del q
    report(2, 3)
    if out_ref is None:
        return block, counted(stats.as_dict())
    write_block(out_ref, rows, (0, ncols), block, stats)
    return None, counted(stats.as_dict())
