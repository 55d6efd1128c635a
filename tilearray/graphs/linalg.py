"""Worker-side linear-algebra kernels: TSQR, least squares, SVD from R, the
randomized-SVD test matrix, and the in-memory references of the tiled
Cholesky and LU.

Every kernel is a pure function of in-memory blocks (NumPy arrays in, NumPy
arrays out); the planner decides which blocks go in and where results are
written. The in-memory references (:func:`tsqr`, :func:`cholesky_tiled`,
:func:`lu_tiled`, ...) compose the kernels exactly as the out-of-core graphs
do, and are what the tests compare against NumPy/SciPy. Dtypes, memory
figures and the one-BLAS-thread rule are :mod:`.blas`'s, whose tile kernels
the references use.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from . import nogil
from .blas import (
    as_float,
    gemm_update,
    getrf_panel,
    permute_rows,
    potrf,
    result_dtype,
    single_threaded,
    syrk_update,
    tile_edges,
    trsm,
    trsm_left_lower,
    trsm_left_upper,
)

# --------------------------------------------------------------------------
# TSQR
# --------------------------------------------------------------------------

#: Block size of the compact-WY QR (``geqrt``) of a leaf's row block.
#: Measured here on a 65536 x 256 f64 block, one BLAS thread: R by ``geqrt``
#: 1.2 s vs ``geqrf`` 4.2-5.6 s (``geqrf``'s unblocked panels stream the whole
#: tall block from memory once per column); ``Q_i @ S`` by ``geqrt`` +
#: ``gemqrt`` 2.9 s vs ``geqrf`` + ``orgqr`` + gemm 5.7 s. 32 and 64 were
#: within 3 % of each other for R; 32 was faster for the apply.
QR_BLOCK = 32


@single_threaded

def _scipy():
    """``scipy.linalg``, imported when a kernel first needs it: the import
    costs about 0.3 s of CPU in every process (CLI, MPI ranks, workers),
    most of which never factor anything."""
    from scipy import linalg

    return linalg

def qr_leaf(block, *, overwrite_block: bool = False, mode: str = "reduced"):
    """Economic Householder QR of one row block (LAPACK ``geqrf``/``orgqr``).

    ``block`` is ``m_i x n``; returns ``Q_i`` (``m_i x r_i``, orthonormal
    columns) and ``R_i`` (``r_i x n``, upper triangular/trapezoidal) with
    ``r_i = min(m_i, n)``: a block shorter than ``n`` gives a short R, which
    stacks like any other. Dtype as :func:`result_dtype`. ``mode="r"``
    returns ``R_i`` alone, skipping ``orgqr`` (about half the flops): all an
    up-sweep for R, singular values or least squares needs.

    Memory: LAPACK works on an F-ordered copy that becomes ``Q_i`` (with
    ``mode="r"``, whose top is R), so the block and the copy: ``2 m_i n b``,
    plus ``R_i`` and LAPACK's workspace (at most about ``512 n b``). With
    ``overwrite_block`` and an F-ordered block of the computing dtype, the
    block's memory is used (``m_i n b``; the block is destroyed). NaN or inf
    in the block propagate, as in NumPy.

    A TSQR leaf's row block goes through :func:`qr_leaf_r` and
    :func:`qr_leaf_apply` instead (blocked ``geqrt``, several times faster
    on tall blocks); this is the combine nodes' small QR.
    """
    if mode not in ("reduced", "r"):
        raise ValueError(f"mode must be 'reduced' or 'r', got {mode!r}")
    a = as_float(block)
    m, n = a.shape
    if m == 0 or n == 0:
        r = np.zeros((min(m, n), n), a.dtype)
        return r if mode == "r" else (np.zeros((m, min(m, n)), a.dtype), r)
    if not overwrite_block and np.shares_memory(a, block):
        a = a.copy(order="F")
    if mode == "r":
        return _geqrf_r(a)
    q, r = _scipy().qr(a, mode="economic", overwrite_a=True, check_finite=False)
    return q, r


def _geqrf_r(a: np.ndarray) -> np.ndarray:
    """R of ``a`` (F-ordered, overwritten) by ``geqrf`` alone."""
    geqrf = _scipy().get_lapack_funcs("geqrf", (a,))
    lwork = int(geqrf(a, lwork=-1, overwrite_a=1)[2][0])  # a query: a is not touched
    qr, _, _, info = geqrf(a, lwork=max(lwork, 1), overwrite_a=1)
    if info < 0:  # pragma: no cover - a bug in the arguments
        raise ValueError(f"geqrf: illegal argument {-info}")
    return np.triu(qr[:min(a.shape)])


def _geqrt(block, overwrite_block: bool):
    """Compact-WY QR of ``block``: ``(V, T)`` (``V`` holds R in its upper
    triangle and the reflectors below), or None for an empty block."""
    a = as_float(block)
    m, n = a.shape
    if m == 0 or n == 0:
        return None
    if not overwrite_block and np.shares_memory(a, block):
        a = a.copy(order="F")
    geqrt = _scipy().get_lapack_funcs("geqrt", (a,))
    v, t, info = geqrt(min(QR_BLOCK, m, n), a, overwrite_a=1)
    if info < 0:  # pragma: no cover - a bug in the arguments
        raise ValueError(f"geqrt: illegal argument {-info}")
    return v, t


@single_threaded
def qr_leaf_r(block, *, overwrite_block: bool = False) -> np.ndarray:
    """``R_i`` (``min(m_i, n) x n``) of a TSQR leaf's row block by blocked
    ``geqrt``: the same Householder reflectors as :func:`qr_leaf`, so the
    same R up to rounding, and what :func:`qr_leaf_apply` recomputes.
    Memory as :func:`qr_leaf` with ``mode="r"`` (``T`` is ``32 n b``)."""
    f = _geqrt(block, overwrite_block)
    if f is None:
        m, n = np.shape(block)
        return np.zeros((min(m, n), n), result_dtype(np.asarray(block).dtype))
    v = f[0]
    return np.triu(v[:min(v.shape)])


@single_threaded
def qr_leaf_apply(block, parent_slice, *, overwrite_block: bool = False) -> np.ndarray:
    """``Q_i @ parent_slice`` for a TSQR leaf's row block, ``Q_i`` never
    formed: the block's ``geqrt`` again (the reflectors behind
    :func:`qr_leaf_r`'s R) applied by ``gemqrt`` to ``[slice; 0]``.

    ``parent_slice`` is ``r_i x k`` (``r_i = min(m_i, n)``) or None (the
    identity: ``Q_i`` itself). Returns ``m_i x k`` in the computing dtype.
    Memory: the block (which becomes ``V``; destroyed with
    ``overwrite_block``) and the ``m_i x k`` result.
    """
    m, n = np.shape(block)
    r = min(m, n)
    f = _geqrt(block, overwrite_block)
    dtype = result_dtype(np.asarray(block).dtype) if f is None else f[0].dtype
    s = np.eye(r, dtype=dtype) if parent_slice is None else parent_slice
    if s.shape[0] != r:
        raise ValueError(f"slice of {s.shape[0]} rows for a leaf whose Q has {r} columns")
    c = np.zeros((m, s.shape[1]), dtype, order="F")
    if f is None or c.size == 0:
        return c
    c[:r] = s
    v, t = f
    gemqrt = _scipy().get_lapack_funcs("gemqrt", (v,))
    # gemqrt reads the first min(m, n) reflectors of V (its k = T's columns)
    out, info = gemqrt(v[:, :r], t[:, :r], c, overwrite_c=1)
    if info < 0:  # pragma: no cover - a bug in the arguments
        raise ValueError(f"gemqrt: illegal argument {-info}")
    return out


SOLVE_MAX_LOSS = 1e-12
"""Orthogonality the leaf's ``X_i R_i^-1`` may lose at most: about ``eps
kappa(R_i)`` (R_i from the Householder QR of X_i, so ``X_i R_i^-1 = Q_i +
E R_i^-1`` with ``||E|| ~ eps ||X_i||``). float64 leaves with ``kappa_2(R_i)
<= 1e-12 / eps`` (about 4500) take it; float32 and worse-conditioned leaves
apply their reflectors (:func:`qr_leaf_apply`), whose loss does not grow
with kappa."""


GRAM_MIN_RCOND = (np.finfo(np.float64).eps / SOLVE_MAX_LOSS) ** 0.5
"""Least ``1 / kappa_2(R_i)`` (about 1 / 67: ``sigma_min / sigma_max``, from
R's singular values, 5 ms at 256 x 256) of a leaf's R taken from its Gram
matrix (:func:`gram_leaf_r`): ``X_i R_i^-1`` then loses about ``eps
kappa_2(R_i)^2 <= SOLVE_MAX_LOSS`` of orthogonality, the bound the solve
path keeps. (A 1-norm estimate would not do: ``kappa_2`` can be ``n`` times
``kappa_1``.)"""


@single_threaded
def gram_leaf_r(block) -> np.ndarray | None:
    """``R_i`` of a float64 TSQR leaf's row block as the Cholesky factor of
    its Gram matrix ``X_i^T X_i`` (one ``syrk`` on the block as read, no
    copy: about a quarter of ``geqrt``'s time at 65536 x 256), when that R
    is conditioned well enough (``1 / kappa_2 >= GRAM_MIN_RCOND``) that ``X_i
    R_i^-1`` is as orthogonal as the solve path promises; None otherwise (a
    float32, short, rank-deficient, ill-conditioned or non-finite block: the
    caller takes the Householder QR). ``R_i^T R_i = X_i^T X_i`` to rounding,
    positive diagonal. CholeskyQR's rule (Fukaya et al. 2014): its Q loses
    ``eps kappa^2`` of orthogonality, so only well-conditioned leaves use it."""
    a = np.asarray(block)
    m, n = a.shape
    if a.dtype != np.float64 or m < n or n == 0:
        return None
    if nogil.layout(a) is None:
        return None
    g = nogil.syrk(1.0, a, 0.0, np.zeros((n, n), order="F"), trans=True, lower=False)
    c, info = nogil.potrf(g, lower=False)
    c = np.triu(c)
    if info != 0 or not np.isfinite(c).all():
        return None
    return c if _rcond_2(c) >= GRAM_MIN_RCOND else None


def _rcond_2(r: np.ndarray) -> float:
    """``1 / kappa_2(r)`` of a finite square ``r``, from its singular values
    (LAPACK's 1-norm estimate can be ``n`` times off the 2-norm's)."""
    sv = _scipy().svdvals(r, check_finite=False)
    return float(sv[-1] / sv[0]) if sv[0] > 0 else 0.0


@single_threaded
def leaf_solve_weights(r, parent_slice, rows: int, trusted: bool = False) -> np.ndarray | None:
    """``R_i^-1 @ parent_slice`` for a leaf of ``rows`` rows whose R (from
    :func:`qr_leaf_r`) is square and conditioned well enough that ``X_i @``
    this loses at most :data:`SOLVE_MAX_LOSS` of orthogonality; None
    otherwise (the leaf then applies its reflectors, :func:`qr_leaf_apply`).
    ``X_i @ weights`` is ``Q_i @ parent_slice``: one gemm, about a quarter of
    :func:`qr_leaf_apply`'s time at 65536 x 256."""
    r = np.asarray(r)
    n = r.shape[1] if r.ndim == 2 else 0
    if r.shape != (n, n) or rows < n or n == 0 or np.shape(parent_slice)[0] != n:
        return None
    dtype = result_dtype(r.dtype)
    if not trusted:  # (a Gram leaf's R was checked when made, more strictly)
        if dtype != np.float64 or not np.isfinite(r).all() or \
                not _rcond_2(r) > np.finfo(dtype).eps / SOLVE_MAX_LOSS:
            return None
    return _scipy().solve_triangular(r, np.asarray(parent_slice, dtype), check_finite=False)


@single_threaded
def leaf_times(block, weights: np.ndarray) -> np.ndarray:
    """``block @ weights`` (C-ordered) in ``weights``' dtype, one BLAS thread."""
    return np.asarray(block).astype(weights.dtype, copy=False) @ weights


def qr_combine(r_list: Sequence[np.ndarray], *, mode: str = "reduced"):
    """QR of the children's R factors stacked on top of each other.

    Each ``R_c`` is ``r_c x n``; the stack is ``s x n`` with ``s = sum r_c``.
    Returns the stack's Q split back per child (``Q_c`` is ``r_c x r``, views
    of one array) and the combined ``R`` (``r x n``, ``r = min(s, n)``), or
    ``R`` alone with ``mode="r"``.
    Memory: the children's R factors and the stack, which becomes Q, plus
    R and LAPACK's workspace (at most about ``512 n b``): at most
    ``2 s n b + 2 n^2 b + 512 n b`` (``s <= fan_in * n``).
    """
    rows = [r.shape[0] for r in r_list]
    n = r_list[0].shape[1]
    dtype = np.result_type(*(result_dtype(r.dtype) for r in r_list))
    stack = np.empty((sum(rows), n), dtype, order="F")
    for r, lo in zip(r_list, np.cumsum([0] + rows[:-1]), strict=True):
        stack[lo:lo + r.shape[0]] = r
    if mode == "r":
        return qr_leaf(stack, overwrite_block=True, mode="r")
    q, r = qr_leaf(stack, overwrite_block=True)
    return np.split(q, np.cumsum(rows)[:-1]), r


@single_threaded
def q_apply_down(q_node: np.ndarray, parent_slice: np.ndarray | None) -> np.ndarray:
    """One step of applying the tree's Q factors back down: ``q_node @ slice``.

    ``q_node`` is a leaf's ``Q_i`` (``m_i x r_i``) or a combine node's piece
    ``Q_c`` (``r_c x r``); ``parent_slice`` is the ``r_i x k`` slice this
    node's parent handed down (the root's is the identity, passed as None,
    or the ``r x k`` matrix to apply on the right, e.g. ``U_R`` of an SVD).
    Returns ``m_i x k``: the node's rows of the final ``Q`` (or ``U``), or the
    slice it hands to its own children. Memory: ``(m_i r_i + r_i k + m_i k) b``.
    """
    if parent_slice is None:
        return q_node
    return q_node @ parent_slice.astype(q_node.dtype, copy=False)


def diag_signs(r: np.ndarray) -> np.ndarray:
    """``d`` with ``d * diag(R) >= 0`` (zeros and NaNs get +1), one entry per row of R."""
    d = np.sign(np.diagonal(r)).astype(r.dtype)
    d[(d == 0) | np.isnan(d)] = 1  # a NaN in X: R's NaNs stay where they are
    return d


def normalize_signs(q, r: np.ndarray):
    """Flip signs so ``diag(R) >= 0``: returns ``(Q D, D R)``, ``D = diag(d)``.

    ``Q D D R = Q R``, and for full-rank input R is then unique (the Cholesky
    factor of ``X^T X``), so a tree of any shape or fan-in gives the same R
    and Q up to rounding. ``q`` is one array (``m x r``) or a list of row
    pieces (the root's split Q), returned in kind. Apply at the root only.
    """
    d = diag_signs(r)
    r = r * d[:, None]
    if isinstance(q, (list, tuple)):
        return [p * d for p in q], r
    return q * d, r


def _tsqr_up(blocks, fan_in: int):
    """The up-sweep: leaf QRs, then combines of ``fan_in`` children per level."""
    if fan_in < 2:
        raise ValueError(f"fan_in must be >= 2, got {fan_in}")
    leaves = [qr_leaf(b) for b in blocks]
    if not leaves:
        raise ValueError("tsqr needs at least one row block")
    levels = []  # levels[l][g]: list of Q pieces of combine node g at level l
    rs = [r for _, r in leaves]
    while len(rs) > 1:
        nodes = [qr_combine(rs[i:i + fan_in]) for i in range(0, len(rs), fan_in)]
        levels.append([pieces for pieces, _ in nodes])
        rs = [r for _, r in nodes]
    return [q for q, _ in leaves], levels, rs[0]


def _tsqr_down(leaf_qs, levels, right=None) -> list[np.ndarray]:
    """The down-sweep: each node multiplies its Q pieces by its parent's slice."""
    slices = [right]
    for nodes in reversed(levels):
        slices = [q_apply_down(p, s) for pieces, s in zip(nodes, slices, strict=True)
                  for p in pieces]
    return [q_apply_down(q, s) for q, s in zip(leaf_qs, slices, strict=True)]


def _root_normalized(leaf_qs, levels, r):
    """Normalise signs on the root's Q factors (in the tree) and R."""
    if levels:
        levels[-1][0], r = normalize_signs(levels[-1][0], r)
    else:
        leaf_qs[0], r = normalize_signs(leaf_qs[0], r)
    return r


@single_threaded
def tsqr_r(blocks: Sequence, fan_in: int = 2, *, normalize: bool = True) -> np.ndarray:
    """In-memory reference R-only TSQR: leaves and combines in ``mode="r"``."""
    if fan_in < 2:
        raise ValueError(f"fan_in must be >= 2, got {fan_in}")
    rs = [qr_leaf_r(b) for b in blocks]
    if not rs:
        raise ValueError("tsqr needs at least one row block")
    while len(rs) > 1:
        rs = [qr_combine(rs[i:i + fan_in], mode="r") for i in range(0, len(rs), fan_in)]
    return normalize_signs([], rs[0])[1] if normalize else rs[0]


@single_threaded
def tsqr(blocks: Sequence, fan_in: int = 2, *, compute_q: bool = True,
         normalize: bool = True):
    """In-memory reference TSQR over row ``blocks`` with a tree of ``fan_in``.

    Returns ``(Q_blocks, R)``: ``Q_blocks[i]`` holds the rows of the reduced
    Q for ``blocks[i]`` (``m_i x r``), ``R`` is ``r x n`` with
    ``r = min(m, n)``, as ``numpy.linalg.qr(mode="reduced")``. With
    ``normalize``, ``diag(R) >= 0``. ``compute_q=False`` returns ``(None, R)``
    from :func:`tsqr_r`.
    """
    if not compute_q:
        return None, tsqr_r(blocks, fan_in, normalize=normalize)
    leaf_qs, levels, r = _tsqr_up(blocks, fan_in)
    if normalize:
        r = _root_normalized(leaf_qs, levels, r)
    return _tsqr_down(leaf_qs, levels), r


# --------------------------------------------------------------------------
# least squares and SVD from R
# --------------------------------------------------------------------------

@single_threaded
def svd_from_r(r: np.ndarray, compute_uv: bool = True):
    """Thin SVD of the small R of a TSQR (LAPACK ``gesdd``, as NumPy).

    ``R`` is ``r x n``; returns ``U_R`` (``r x r``), ``s`` (``r``, descending,
    real) and ``Vt`` (``r x n``), or ``s`` alone. ``X = Q R = (Q U_R) s Vt``:
    ``U = Q @ U_R`` is applied down the tree like Q, with ``U_R`` as the
    root's right factor (see :func:`q_apply_down`). Memory: about ``4 r n b``.
    """
    r = as_float(r)
    if r.size == 0:
        k = min(r.shape)
        s = np.zeros(k, r.dtype)
        return s if not compute_uv else (np.zeros((r.shape[0], k), r.dtype), s,
                                          np.zeros((k, r.shape[1]), r.dtype))
    try:
        return _scipy().svd(r, full_matrices=False, compute_uv=compute_uv,
                       check_finite=False, lapack_driver="gesdd")
    except ValueError:  # scipy's word for NaN / inf (in R: an inf in X is NaN there)
        raise np.linalg.LinAlgError("SVD did not converge: the matrix holds NaN or inf") \
            from None


def align_svd(u_r: np.ndarray, vt: np.ndarray, vt_given: np.ndarray) -> tuple:
    """``(U_R W, vt_given)`` with ``W = vt vt_given^T``: the SVD ``U_R s Vt``
    of one R expressed in the right singular vectors ``vt_given`` an earlier
    run computed from another R of the same X (other row blocks, another
    leaf method: equal to rounding). Where singular values repeat, the two
    runs may pick different bases of their singular spaces, and ``U`` from
    one with ``s, Vt`` from the other do not reconstruct X (helper-37: 136%
    off); ``W`` is orthogonal, block diagonal over equal singular values
    (signs elsewhere), so ``U_R W`` stays orthogonal and ``U s Vt`` is X to
    rounding."""
    w = vt @ vt_given.T
    return u_r @ w, vt_given


@single_threaded
def svd_tsqr(blocks: Sequence, fan_in: int = 2, compute_uv: bool = True):
    """In-memory reference thin SVD through TSQR: ``(U_blocks, s, Vt)`` or ``s``."""
    if not compute_uv:
        return svd_from_r(tsqr_r(blocks, fan_in, normalize=False), compute_uv=False)
    leaf_qs, levels, r = _tsqr_up(blocks, fan_in)
    u_r, s, vt = svd_from_r(r)
    return _tsqr_down(leaf_qs, levels, right=u_r), s, vt


def default_rcond(m: int, n: int, dtype) -> float:
    """NumPy's ``lstsq`` default: ``eps * max(m, n)`` of the computing dtype."""
    return float(np.finfo(result_dtype(dtype)).eps) * max(m, n)


@single_threaded
def lstsq_from_r(r_aug: np.ndarray, n: int, m: int, rcond: float | None = None,
                 vector: bool = False):
    """Least squares from the R of a TSQR of ``[X | Y]`` (``X`` is ``m x n``).

    ``R_aug = [[R11, R12], [0, R22]]``: ``R11`` (``n x n``) is X's R,
    ``R12 = Q^T Y`` and the column norms of ``R22`` are the residual norms.
    Returns NumPy's tuple ``(x, residuals, rank, s)``: ``x`` is ``n x p``
    (``n`` if ``vector``), ``residuals`` the squared residual norms (``p``;
    ``1`` if ``vector``), empty when ``rank < n`` or ``m <= n``, as
    ``numpy.linalg.lstsq``; ``s`` the singular values of X, which are
    R11's. Rank counts ``s > rcond * s[0]`` with ``rcond`` defaulting to
    :func:`default_rcond` (NumPy's ``eps * max(m, n)``); a negative rcond means machine epsilon.

    Full rank: ``x = R11^-1 R12`` by a triangular solve, forward error about
    ``cond(X) * eps`` (the normal equations give ``cond(X)^2 * eps``).
    Rank-deficient: the minimum-norm solution from the SVD of R11, singular
    values below the cutoff treated as zero, which is what NumPy's ``gelsd``
    returns. Memory: ``R_aug``, its copies and SVDs, about ``9 (n + p)^2 b``.
    """
    r_aug = as_float(r_aug)
    if rcond is None:
        rcond = default_rcond(m, n, r_aug.dtype)
    elif rcond < 0:  # LAPACK gelsd: machine precision
        rcond = float(np.finfo(r_aug.dtype).eps)
    r11, r12 = r_aug[:n, :n], r_aug[:n, n:]
    s = svd_from_r(r11, compute_uv=False)
    rank = int(np.count_nonzero(s > rcond * s[0])) if s.size else 0
    if rank == n:
        x = _scipy().solve_triangular(r11, r12, lower=False, check_finite=False)
    else:
        x = _min_norm(r11, r12, rank)
    res = np.zeros(0, r_aug.dtype)
    if rank == n and m > n:
        res = np.sum(r_aug[n:, n:] ** 2, axis=0)
    if vector:
        x = x[:, 0]
        res = res[:1]
    return x, res, np.int32(rank), s  # NumPy's (LAPACK's) integer


def _min_norm(r11: np.ndarray, r12: np.ndarray, rank: int) -> np.ndarray:
    """``pinv(R11) @ R12`` keeping the ``rank`` leading singular triplets."""
    u, s, vt = svd_from_r(r11)
    n = r11.shape[1]
    if rank == 0:
        return np.zeros((n, r12.shape[1]), r11.dtype)
    coef = (u[:, :rank].T @ r12) / s[:rank, None]
    return vt[:rank].T @ coef


@single_threaded
def lstsq_tsqr(x_blocks: Sequence, y_blocks: Sequence, fan_in: int = 2,
               rcond: float | None = None):
    """In-memory reference ``numpy.linalg.lstsq`` through TSQR of ``[X | Y]``."""
    vector = np.ndim(y_blocks[0]) == 1
    aug = [np.column_stack([xb, yb]) for xb, yb in zip(x_blocks, y_blocks, strict=True)]
    n = np.shape(x_blocks[0])[1]
    m = sum(np.shape(xb)[0] for xb in x_blocks)
    _, r_aug = tsqr(aug, fan_in, compute_q=False)
    return lstsq_from_r(r_aug, n, m, rcond=rcond, vector=vector)


# --------------------------------------------------------------------------
# randomized SVD: the Gaussian test matrix, built per task
# --------------------------------------------------------------------------

#: Rows drawn from one random stream. Omega's rows are generated in fixed
#: groups of this many, each group from its own seeded stream, so any row
#: range is reproducible without drawing the rows before it.
OMEGA_GROUP_ROWS = 1024


def omega_rows(seed: int, n: int, k: int, start: int, stop: int,
               dtype=np.float64) -> np.ndarray:
    """Rows ``start:stop`` of the ``n x k`` standard Gaussian test matrix Omega.

    Row ``i`` depends only on ``(seed, k, dtype, i)``: group ``i //
    OMEGA_GROUP_ROWS`` is drawn from ``SeedSequence(seed, spawn_key=(group,))``,
    so tasks build their own slices with no communication and any split of
    the rows gives the same Omega. Memory: the ``(stop - start) x k`` result
    plus at most one group, ``OMEGA_GROUP_ROWS * k * b``.
    """
    if not 0 <= start <= stop <= n:
        raise ValueError(f"row range {start}:{stop} is outside 0:{n}")
    dtype = result_dtype(dtype)
    out = np.empty((stop - start, k), dtype)
    g = OMEGA_GROUP_ROWS
    for group in range(start // g, -(-stop // g)):
        lo, hi = group * g, min(group * g + g, n)
        ss = np.random.SeedSequence(seed, spawn_key=(group,))
        a, b = max(lo, start), min(hi, stop)
        # row-major draws: the first rows of a group do not depend on how many follow
        rows = np.random.default_rng(ss).standard_normal((b - lo, k), dtype=dtype)
        out[a - start:b - start] = rows[a - lo:]
    return out


MIN_SUBSPACE = 20
"""Columns of a randomized SVD's test matrix at least (``max(k + oversample,
20)``, as dask's ``svd_compressed``): with k = 3 and 10 extra columns on a
5000 x 20 matrix of flat spectrum the top values were 1.4 % off (0.6 %
after 8 power iterations), exact with 20; past ``k + oversample`` >= 20 it
changes nothing."""


def subspace_width(k: int, oversample: int, m: int, n: int) -> int:
    """Columns ``l`` of the randomized SVD's test matrix Omega."""
    return min(max(int(k) + max(int(oversample), 0), MIN_SUBSPACE), m, n)


@single_threaded
def svd_compressed_ref(a, k: int, *, n_power_iter: int = 0, seed: int = 0,
                       oversample: int = 10, tile: int = 256, fan_in: int = 2):
    """In-memory reference of ``tilearray.linalg.svd_compressed``'s randomized
    truncated SVD (Halko, Martinsson, Tropp), in float64.

    Omega (``n x l``, ``l`` = :func:`subspace_width`) from :func:`omega_rows`; each
    power iteration ``V = orth(A^T (A V))`` by an in-memory QR; ``Q`` =
    :func:`tsqr`'s Q of ``A V`` over row tiles; ``B = Q^T A`` and ``U = Q
    U_B``. Returns ``(U, s, Vt)`` truncated to ``k``, cast to the dtype of
    ``a`` (as :func:`result_dtype`).
    """
    dtype = result_dtype(np.asarray(a).dtype)
    a = as_float(a, order="C").astype(np.float64, copy=False)
    m, n = a.shape
    lk = subspace_width(k, oversample, m, n)
    rows = tile_edges(m, tile)
    v = omega_rows(seed, n, lk, 0, n, np.float64)
    for _ in range(n_power_iter):
        v = np.linalg.qr(a.T @ (a @ v))[0]
    y = a @ v
    q = np.vstack(tsqr([y[r0:r1] for r0, r1 in rows], fan_in)[0])
    b = sum(q[r0:r1].T @ a[r0:r1] for r0, r1 in rows)
    u_b, s, vt = svd_from_r(b)
    return ((q @ u_b[:, :k]).astype(dtype), s[:k].astype(dtype), vt[:k].astype(dtype))


# --------------------------------------------------------------------------
# in-memory references composing the tile kernels as the out-of-core graphs will
# --------------------------------------------------------------------------

def _square(a, what: str) -> np.ndarray:
    a = as_float(a, copy=True)
    if a.ndim != 2 or a.shape[0] != a.shape[1]:
        raise np.linalg.LinAlgError(f"{what} needs a square matrix, got shape {a.shape}")
    return a


def _lower_tiles(a: np.ndarray, edges) -> dict:
    return {(i, j): np.asfortranarray(a[ri[0]:ri[1], rj[0]:rj[1]])
            for i, ri in enumerate(edges) for j, rj in enumerate(edges[:i + 1])}


def _assemble_lower(tiles: dict, edges, n: int, dtype) -> np.ndarray:
    out = np.zeros((n, n), dtype, order="F")
    for (i, j), t in tiles.items():
        out[edges[i][0]:edges[i][1], edges[j][0]:edges[j][1]] = t
    return out


@single_threaded
def cholesky_tiled(a, tile: int, *, order: str = "left") -> np.ndarray:
    """In-memory reference tiled Cholesky ``A = L L^T``; only A's lower triangle is read.

    ``order="left"`` (left-looking, the out-of-core choice: tile column j
    reads the finished columns to its left once and is written once) or
    ``"right"`` (right-looking: each step rewrites the trailing matrix). Both
    call the same kernels: :func:`potrf`, :func:`trsm`, :func:`syrk_update`,
    :func:`gemm_update`. Returns ``L`` (``n x n``, lower, F-ordered).
    """
    a = _square(a, "cholesky")
    edges = tile_edges(a.shape[0], tile)
    t, lo = _lower_tiles(a, edges), {}
    nt = len(edges)
    if order == "left":
        for j in range(nt):
            for k in range(j):
                t[j, j] = syrk_update(t[j, j], lo[j, k])
            lo[j, j] = potrf(t[j, j], tile=(j, j), col0=edges[j][0])
            for i in range(j + 1, nt):
                for k in range(j):
                    t[i, j] = gemm_update(t[i, j], lo[i, k], lo[j, k], trans_b=True)
                lo[i, j] = trsm(lo[j, j], t[i, j])
    elif order == "right":
        for k in range(nt):
            lo[k, k] = potrf(t[k, k], tile=(k, k), col0=edges[k][0])
            for i in range(k + 1, nt):
                lo[i, k] = trsm(lo[k, k], t[i, k])
            for j in range(k + 1, nt):
                t[j, j] = syrk_update(t[j, j], lo[j, k])
                for i in range(j + 1, nt):
                    t[i, j] = gemm_update(t[i, j], lo[i, k], lo[j, k], trans_b=True)
    else:
        raise ValueError(f"order must be 'left' or 'right', got {order!r}")
    return _assemble_lower(lo, edges, a.shape[0], a.dtype)


@single_threaded
def solve_triangular_tiled(t, b, tile: int, *, lower: bool,
                           unit_diagonal: bool = False) -> np.ndarray:
    """In-memory reference blocked substitution ``T X = B`` for many right-hand sides.

    Row tile ``i`` of X is ``trsm(T_ii, B_i - sum_k T_ik X_k)`` over the tiles
    already solved (above it if ``lower``, below it otherwise), with
    :func:`gemm_update` and :func:`trsm_left_lower`/:func:`trsm_left_upper`.
    ``b`` is ``n`` or ``n x p``; the result has its shape.
    """
    t = np.asarray(t)
    b2 = np.asarray(b).reshape(t.shape[0], -1)
    edges = tile_edges(t.shape[0], tile)
    order = range(len(edges)) if lower else reversed(range(len(edges)))
    solve = trsm_left_lower if lower else trsm_left_upper
    x, done = {}, []
    for i in order:
        i0, i1 = edges[i]
        c = as_float(b2[i0:i1], copy=True)
        for k in done:
            c = gemm_update(c, t[i0:i1, edges[k][0]:edges[k][1]], x[k])
        x[i] = solve(t[i0:i1, i0:i1], c, unit_diagonal=unit_diagonal)
        done.append(i)
    out = np.vstack([x[i] for i in range(len(edges))]) if edges else as_float(b2)
    return out.reshape(np.shape(b))


@single_threaded
def solve_spd_tiled(a, b, tile: int) -> np.ndarray:
    """In-memory reference ``solve(A, B, assume_a="pos")``: tiled Cholesky, then
    forward (``L Y = B``) and backward (``L^T X = Y``) blocked substitution."""
    lo = cholesky_tiled(a, tile)
    y = solve_triangular_tiled(lo, b, tile, lower=True)
    return solve_triangular_tiled(lo.T, y, tile, lower=False)


@single_threaded
def lu_tiled(a, tile: int, *, order: str = "left"):
    """In-memory reference blocked LU with partial pivoting: ``A[perm] = L @ U``.

    Column panels of width ``tile``; :func:`getrf_panel` factors all rows
    from a panel's diagonal down, choosing pivots over every row below as
    LAPACK's ``getrf`` does, so the pivots, L and U are LAPACK's (up to
    rounding). ``order="left"`` (the out-of-core choice) or ``"right"``, see
    :func:`_lu_left`, :func:`_lu_right`. Returns ``(perm, L, U)``, L unit lower,
    U upper; singular A raises :class:`~tilearray.errors.SingularMatrixError`.
    """
    a = _square(a, "lu")
    edges = tile_edges(a.shape[0], tile)
    if order == "left":
        return _lu_left(a, edges)
    if order == "right":
        return _lu_right(a, edges)
    raise ValueError(f"order must be 'left' or 'right', got {order!r}")


def _lu_right(a: np.ndarray, edges):
    """Right-looking (LAPACK ``getrf`` order): after factoring panel k,
    :func:`permute_rows` applies its interchanges to the columns left and
    right of it, :func:`trsm_left_lower` (unit) gives the U tiles to its right
    and :func:`gemm_update` rewrites every trailing tile."""
    n = a.shape[0]
    perm = np.arange(n)
    for k, (c0, c1) in enumerate(edges):
        lu, p = getrf_panel(a[c0:, c0:c1], col0=c0, index=k)
        a[c0:, c0:c1] = lu
        a[c0:, :c0] = permute_rows(a[c0:, :c0], p)
        a[c0:, c1:] = permute_rows(a[c0:, c1:], p)
        perm[c0:] = perm[c0:][p]
        for j0, j1 in edges[k + 1:]:
            a[c0:c1, j0:j1] = trsm_left_lower(a[c0:c1, c0:c1], a[c0:c1, j0:j1],
                                              unit_diagonal=True)
            for i0, i1 in edges[k + 1:]:
                a[i0:i1, j0:j1] = gemm_update(a[i0:i1, j0:j1], a[i0:i1, c0:c1],
                                              a[c0:c1, j0:j1])
    lower = np.tril(a, -1) + np.eye(n, dtype=a.dtype)
    return perm, lower, np.triu(a)


def _lu_left(a: np.ndarray, edges):
    """Left-looking: panel j reads its columns of A and the finished L panels
    to its left, and each panel of L and U is written once.

    Row interchanges are never applied to stored data: L's panels are kept
    with rows indexed by ORIGINAL row (``l_orig``), and a panel reads A and
    L gathered through the current permutation (``a[perm]``,
    ``l_orig[perm]``), which applies every earlier pivot. Panel j: for each
    k < j in order, ``U_kj = trsm_left_lower(L_kk, col_k)`` (unit) and
    ``gemm_update`` of the rows below; then :func:`getrf_panel` of the rest.
    The final ``L = l_orig[perm]`` is one gather (a pass over L when stored).
    """
    n = a.shape[0]
    perm = np.arange(n)
    l_orig = np.zeros_like(a)
    upper = np.zeros_like(a)
    for j, (c0, c1) in enumerate(edges):
        col = np.asfortranarray(a[perm, c0:c1])  # panel j, earlier pivots applied
        for k0, k1 in edges[:j]:
            lk = l_orig[perm[k0:], k0:k1]  # L panel k, rows k0: in current order
            col[k0:k1] = trsm_left_lower(lk[:k1 - k0], col[k0:k1], unit_diagonal=True)
            col[k1:] = gemm_update(col[k1:], lk[k1 - k0:], col[k0:k1])
        lu, p = getrf_panel(col[c0:], col0=c0, index=j)
        perm[c0:] = perm[c0:][p]
        w = c1 - c0
        upper[:c0, c0:c1] = col[:c0]
        upper[c0:c1, c0:c1] = np.triu(lu[:w])
        l_orig[perm[c0:], c0:c1] = np.tril(lu, -1) + np.eye(n - c0, w, dtype=a.dtype)
    return perm, l_orig[perm], upper


@single_threaded
def solve_lu_tiled(a, b, tile: int, *, order: str = "left") -> np.ndarray:
    """In-memory reference ``numpy.linalg.solve(A, B)``: :func:`lu_tiled`, then
    ``L Y = B[perm]`` (unit diagonal) and ``U X = Y`` by blocked substitution."""
    perm, lower, upper = lu_tiled(a, tile, order=order)
    y = solve_triangular_tiled(lower, np.asarray(b)[perm], tile, lower=True,
                               unit_diagonal=True)
    return solve_triangular_tiled(upper, y, tile, lower=False)
