"""``tilearray.linalg``: norms built from fused elementwise ops and reductions,
the QR, thin SVD, least squares, rank and condition number of tall-skinny
matrices (or wide ones with few rows) by TSQR, and for
square matrices a tiled out-of-core Cholesky with the solves, inverse and
determinants built on it (plus one-task dense routines for matrices a task
holds: general solve, eigh)."""

from __future__ import annotations

import dataclasses
import logging
import warnings

import numpy as np
from dask.base import tokenize

from .engine.array import TiledArray
from .engine.expr.nodes import TSQR, Constant, Elemwise, Factor
from .engine.expr.ops import HANDLED, build_reduction, elemwise
from .engine.expr.selection import held
from .engine.plan.lower import result_stage
from .engine.plan.types import Stage
from .errors import PlanningArgumentError, PlanningArgumentTypeError, PlanningError
from .graphs.blas import result_dtype

log = logging.getLogger("tilearray")

QRResult = type(np.linalg.qr(np.eye(1)))
SVDResult = type(np.linalg.svd(np.eye(1)))
SlogdetResult = type(np.linalg.slogdet(np.eye(1)))

# -- TSQR: QR, SVD, least squares of tall-skinny matrices -------------------------------------


def _tall(x, what: str, empty: bool = False) -> TiledArray:
    if not isinstance(x, TiledArray):
        raise TypeError(f"{what}: expected a TiledArray, got {type(x).__name__} (NumPy arrays: "
                        f"use numpy.linalg, or store it with ta.from_numpy first)")
    if x.ndim != 2:  # NumPy's LinAlgError (a ValueError)
        raise np.linalg.LinAlgError(f"{what}: {x.ndim}-dimensional array given (shape "
                                    f"{x.shape}). Array must be two-dimensional")
    if x.size == 0 and not empty:
        raise ValueError(f"{what}: the array of shape {x.shape} is empty")
    try:
        result_dtype(x.dtype)
    except TypeError as e:
        raise TypeError(f"{what}: {e}") from None
    return x


def _part(x: TiledArray, part: str, y=None, **options) -> TiledArray:
    m, n = x.shape
    r = min(m, n)
    dtype = result_dtype(x.dtype if y is None else np.result_type(x.dtype, y.dtype))
    shape = {"R": (r, n), "Q": (m, r), "s": (r,), "U": (m, r), "Vt": (r, n)}.get(part, ())
    node = TSQR(shape, dtype, x._node, part, y, tuple(sorted(options.items())))
    return TiledArray(node)


def qr(x: TiledArray, mode: str = "reduced"):
    """QR of a tall-skinny matrix by TSQR, like :func:`numpy.linalg.qr` (lazy).

    Row blocks as tall as a task holds are factored by LAPACK, their R
    factors combined up a tree (fan-in ``tilearray.reduction.split-every``),
    signs normalised so ``diag(R) >= 0``. ``R`` reads X once. ``Q`` is the
    tree's Q factors applied back down (orthogonal to rounding, whatever
    X's conditioning -- never ``X @ inv(R)``): writing it reads X a second
    time, each row block factored again, and writes ``m x min(m, n)``.
    ``Q`` and ``R`` are lazy and planned separately: ``R.compute()`` is one
    pass, ``Q.to_zarr(path)`` two.

    Parameters
    ----------
    x : TiledArray
        ``m x n``; its n columns must fit a task (a combine holds
        ``fan_in`` R factors of ``min(m, n) x n``: a wide X with few rows
        works too); any row tiling.
    mode : {"reduced", "r"}
        "reduced": ``(Q, R)``; "r": ``R`` alone.

    Returns
    -------
    (Q, R) or R : TiledArray
        NumPy's ``QRResult`` (``.Q``, ``.R``) or R alone: ``Q`` (``m x r``,
        stored by ``to_zarr``) and ``R`` (``r x n``, small:
        ``compute()``), ``r = min(m, n)``; float32 stays float32, integers
        are computed in float64.

    Raises
    ------
    ValueError
        An unknown mode, or not a 2-D array.
    PlanningError
        X has too many columns for a task to combine its R factors.
    """
    x = _tall(x, "qr", empty=True)
    if mode not in ("reduced", "r"):
        raise ValueError(f"qr: mode={mode!r} is not supported (use 'reduced' or 'r')")
    if x.size == 0:  # NumPy's empty factors
        got = np.linalg.qr(np.empty(x.shape, result_dtype(x.dtype)), mode=mode)
        return held(x, got) if mode == "r" else QRResult(*(held(x, v) for v in got))
    if mode == "r":
        return _part(x, "R")
    return QRResult(_part(x, "Q"), _part(x, "R"))


def svd(x: TiledArray, full_matrices: bool = False, compute_uv: bool = True,
        hermitian: bool = False, *, k=None, **randomized):
    """Thin SVD of a tall-skinny matrix through TSQR, like :func:`numpy.linalg.svd` (lazy).

    ``X = Q R`` by TSQR, then the SVD of the small R: ``s`` and ``Vt`` read
    X once; ``U = Q @ U_R`` is applied down the tree and written like
    :func:`qr`'s Q (a second read of X).

    With ``k=``, the randomized truncated SVD of any shape instead
    (:func:`svd_compressed`, which takes ``n_power_iter``, ``seed``,
    ``oversample``): ``(U, s, Vt)`` or ``s``.

    Parameters
    ----------
    x : TiledArray
        ``m x n`` with n columns a task can combine (see :func:`qr`).
    full_matrices : bool
        Must be False (a full ``m x m`` U is never built out of core).
    compute_uv : bool
        False: the singular values alone (one read of X).
    hermitian : bool
        Accepted as NumPy does; the SVD is computed the same way.

    Returns
    -------
    (U, s, Vt) or s : TiledArray
        NumPy's ``SVDResult`` (``.U``, ``.S``, ``.Vh``) or s alone: ``U``
        (``m x r``, stored by ``to_zarr``), ``s`` (``r``, descending)
        and ``Vt`` (``r x n``) small; ``r = min(m, n)``.
    """
    if k is not None:
        u, s, vt = svd_compressed(x, k, **randomized)
        return SVDResult(u, s, vt) if compute_uv else s
    if randomized:
        raise TypeError(f"svd: {sorted(randomized)} apply with k= (the randomized SVD)")
    x = _tall(x, "svd", empty=True)
    if full_matrices:
        raise ValueError("svd: full_matrices=True would build an m x m U; tilearray computes "
                         "the thin SVD (full_matrices=False)")
    if x.size == 0:  # NumPy's empty factors
        got = np.linalg.svd(np.empty(x.shape, result_dtype(x.dtype)), full_matrices=False,
                            compute_uv=compute_uv)
        return SVDResult(*(held(x, v) for v in got)) if compute_uv else held(x, got)
    if x.shape[0] < x.shape[1]:  # wide: the SVD of its tall transpose, U and Vt swapped
        t = x.T  # (TSQR of the wide X stacked R factors as wide as X: a 77 x 6001 X
        if not compute_uv:  # was refused at 150 MiB a worker where X.T ran; helper-52)
            return _part(t, "s")
        return SVDResult(_part(t, "Vt").T, _part(t, "s"), _part(t, "U").T)
    if not compute_uv:
        return _part(x, "s")
    return SVDResult(_part(x, "U"), _part(x, "s"), _part(x, "Vt"))


def svd_compressed(x: TiledArray, k: int, *, n_power_iter: int = 0, seed: int = 0,
                   oversample: int = 10):
    """Randomized truncated SVD (Halko, Martinsson, Tropp 2011) of any shape.

    A Gaussian ``n x l`` test matrix Omega (``l = max(k + oversample, 20)``
    up to ``min(m, n)``, as dask's; drawn
    from ``seed`` in the driver and sent to the workers once) is refined by
    ``n_power_iter`` subspace iterations on ``X.T @ X``: ``V = qr(X.T @ (X @
    V)).Q``, each ``X.T @ (X @ V)`` one pass over X (a task reads a whole row
    panel, multiplies it by V and its transpose by that) and its ``n x l``
    QR in memory. Then ``Q`` = TSQR's Q of ``X @ V``, ``B = Q.T @ X`` (``l x
    n``, in memory) and the SVD of B. X is read ``2 + n_power_iter`` times
    (``2 + 2 * n_power_iter`` when no row panel of X fits a task: each
    iteration then reads X twice, or, when ``V`` itself does not fit a task,
    goes through ``m x l`` temporaries re-orthonormalised by TSQR).
    Nothing of size ``m x n`` is held.

    Each iteration re-orthonormalises after ``X.T @ X`` (not after each of X
    and X.T), so singular values below about ``sqrt(eps) * s[0]`` of the
    working precision are not resolved by the power iterations; the work is
    done in float64 (float32 input included: results are cast back), where
    that is about ``1e-8 * s[0]``. Accuracy improves with power iterations
    when the spectrum decays slowly.

    Parameters
    ----------
    x : TiledArray
        ``m x n``.
    k : int
        Singular triplets wanted (``1 <= k <= min(m, n)``).
    n_power_iter : int
        Power iterations (0, 1, 2 are usual).
    seed : int
        Seed of Omega: the same seed gives the same result.
    oversample : int
        Extra columns of Omega (10 by default, as dask's).

    Returns
    -------
    U : TiledArray
        ``m x k``, lazy: storing or computing it reads X once more (``X @
        V`` and its TSQR; the power iterations are not run again).
    s : numpy.ndarray
        ``k`` singular values, descending.
    Vt : numpy.ndarray
        ``k x n``.
    """
    from .graphs.linalg import omega_rows, subspace_width

    if not isinstance(x, TiledArray) or x.ndim != 2:
        raise TypeError(f"svd_compressed: expected a 2-D TiledArray, got {type(x).__name__}")
    m, n = x.shape
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or not 1 <= k <= min(m, n):
        raise ValueError(f"svd_compressed: k={k!r} must be an integer in [1, {min(m, n)}] "
                         f"for a {m} x {n} matrix")
    if isinstance(n_power_iter, bool) or not isinstance(n_power_iter, int) or n_power_iter < 0:
        raise ValueError(f"svd_compressed: n_power_iter={n_power_iter!r} must be an integer >= 0")
    dtype = result_dtype(x.dtype)
    width = subspace_width(k, oversample, m, n)
    v = omega_rows(int(seed), n, width, 0, n, np.float64)
    if n_power_iter and _plans(x.T @ (x @ v)):
        for _ in range(n_power_iter):
            v = np.linalg.qr((x.T @ (x @ v)).compute())[0]
        q = qr(x @ v)[0]
    else:  # V too wide for a task: m x l temporaries, each re-orthonormalised by TSQR
        q = qr(x @ v)[0]
        for _ in range(n_power_iter):
            q = qr(x @ qr(x.T @ q)[0])[0]
    u_b, s, vt = np.linalg.svd((q.T @ x).compute(), full_matrices=False)
    u = q @ np.ascontiguousarray(u_b[:, :k])
    return (u if u.dtype == dtype else u.astype(dtype)), s[:k].astype(dtype), \
        vt[:k].astype(dtype)


def _plans(expr: TiledArray) -> bool:
    """Whether ``expr`` plans under the current engine's budget."""
    try:
        expr.plan()
    except PlanningError:
        return False
    return True


def lstsq(x: TiledArray, y, rcond=None):
    """Least squares ``min ||X b - y||`` through TSQR, like :func:`numpy.linalg.lstsq`.

    One pass over X: the TSQR of ``[X | y]`` gives R and ``Q^T y`` together,
    then a triangular solve. The error grows like ``cond(X) * eps`` (the
    normal equations ``X^T X b = X^T y`` square it: at ``cond(X) = 1e8``
    they lose every digit in float64; TSQR keeps about 8). A rank-deficient
    X (singular values below ``rcond * s[0]``) gets the minimum-norm
    solution, as NumPy's ``gelsd``.

    Runs now and returns NumPy's tuple, as :func:`numpy.linalg.lstsq`; its
    plan is ``lstsq_plan(x, y).plan()``.

    Parameters
    ----------
    x : TiledArray
        ``m x n``, n columns a task can combine.
    y : TiledArray or numpy.ndarray
        ``m`` (a vector) or ``m x k`` right-hand sides: stored, in memory
        (sent to the workers once, each task taking its rows), or a lazy
        vector (a column ``b[:, j]``; a product ``b @ w`` is computed first,
        outside :func:`lstsq_plan`'s plan).
    rcond : float, optional
        Cut-off for small singular values; default ``eps * max(m, n)`` as NumPy.

    Returns
    -------
    x : numpy.ndarray
        ``n`` or ``n x k``.
    residuals : numpy.ndarray
        Squared residual norms (empty when rank < n or m <= n).
    rank : int
    s : numpy.ndarray
        Singular values of X.
    """
    if _tall(x, "lstsq", empty=True).size == 0:  # NumPy's minimum-norm answer: zeros
        y = _computed_if_blocked(y)
        y = np.asarray(y.compute() if isinstance(y, TiledArray) else y)
        return np.linalg.lstsq(np.empty(x.shape, result_dtype(np.result_type(x.dtype, y.dtype))),
                               y, rcond=rcond)
    return lstsq_plan(x, y, rcond).compute()


def lstsq_plan(x: TiledArray, y, rcond=None) -> TiledArray:
    """The lazy form of :func:`lstsq`: ``.plan()`` shows its tasks and bytes,
    ``.compute()`` returns NumPy's tuple."""
    x = _tall(x, "lstsq")
    m = x.shape[0]
    vector = np.ndim(y) == 1
    y = _computed_if_blocked(y)
    if isinstance(y, TiledArray):
        if y.ndim not in (1, 2) or y.shape[0] != m:
            raise np.linalg.LinAlgError(f"lstsq: Incompatible dimensions: y of shape {y.shape}, "
                                        f"X of shape {x.shape} (y must be (m,) or (m, k))")
        ynode = _column(y)
    else:
        arr = np.asarray(y)
        if arr.ndim not in (1, 2) or arr.shape[0] != m:
            raise np.linalg.LinAlgError(f"lstsq: Incompatible dimensions: y of shape "
                                        f"{arr.shape}, X of shape {x.shape} (y must be (m,) or "
                                        "(m, k))")
        if arr.dtype.kind not in "biuf":
            raise TypeError(f"lstsq: y of dtype {arr.dtype} is not supported")
        arr = np.array(arr.reshape(m, -1), copy=True)
        ynode = Constant(tuple(arr.shape), arr.dtype, arr, tokenize(arr))
    options = {"vector": bool(vector)}
    if rcond is not None:
        options["rcond"] = float(rcond)
    t = result_dtype(np.result_type(x.dtype, ynode.dtype))
    if t != np.float64:  # NumPy's lstsq computes in float64, its rank cutoff too (float32's
        # eps * max(m, n) dropped 8 of 40 columns scaled 1 to 100: helper-37), returns float32
        x = x.astype(np.float64)
        ynode = TiledArray(ynode).astype(np.float64)._node
        options["result"] = t.str
    return _part(x, "lstsq", ynode, **options)



# -- square matrices: tiled Cholesky, solves, determinants, eigh ------------------------------


def _square(a, what: str, empty: bool = False) -> TiledArray:
    """``a``, checked square (NumPy's LinAlgError); a 0 x 0 one only where
    ``empty`` (the caller gives NumPy's answer for it)."""
    a = _tall(a, what, empty=True)
    if a.shape[0] != a.shape[1]:
        raise np.linalg.LinAlgError(f"{what}: expected a square matrix, got shape {a.shape}")
    return _tall(a, what, empty)


def _numpy_of_empty(fn, a: TiledArray, *args, **kwargs):
    """NumPy's ``fn`` of the 0 x 0 matrix ``a`` (in its result dtype): an
    empty factor, a determinant of 1, no eigenvalues."""
    return fn(np.empty((0, 0), result_dtype(a.dtype)), *args, **kwargs)


def cholesky(a: TiledArray, upper: bool = False) -> TiledArray:
    """Cholesky factor of a symmetric positive definite matrix, like
    :func:`numpy.linalg.cholesky` (lazy; any size, out of core).

    Left-looking by square tiles kept in Zarr: the task of tile ``(i, j)``
    (``i >= j``) reads ``A_ij`` and streams the finished L tiles ``(i, k)``,
    ``(j, k)``, ``k < j``, back from the output (one pair held at a time),
    then ``potrf`` (diagonal) or ``trsm`` with ``L_jj``, and writes ``L_ij``
    whole; the tiles above the diagonal are marked as zeros, not stored
    (Zarr reads them as its fill value, 0). Only A's lower triangle is read.
    ``L.to_zarr(path, tile=(b, b))`` sets the tile (by default a multiple of
    A's tile of at least 1024, at most 64 MiB); ``compute()`` and the solves
    use the largest tile a task holds under the budget. Reads are about
    ``n^3 / (3 b)`` elements (``plan()`` shows them against the ``n^3 / (3
    sqrt(M))`` lower bound); about ``n^2 / 2`` are written.
    Resume (``to_zarr(..., resume=True)``) recomputes only the tiles
    without their done marker, reading the done ones back.

    Parameters
    ----------
    a : TiledArray
        ``n x n``, symmetric positive definite (float32, float64; integers in float64).
    upper : bool
        Return the upper factor ``U`` (``U.T @ U == a``) from ``a``'s upper
        triangle, as NumPy's ``upper=True``: the lower factor of ``a.T``,
        transposed (the lower one's transpose differs where a stored ``a``
        is not exactly symmetric).

    Returns
    -------
    TiledArray
        L, lower triangular (``L @ L.T == a``); ``U`` with ``upper``.

    Raises
    ------
    NotPositiveDefiniteError
        When run: a pivot is not positive; names the diagonal tile and the
        column. The output is left incomplete.
    """
    a = _square(a, "cholesky", empty=True)
    if a.size == 0:
        return held(a, _numpy_of_empty(np.linalg.cholesky, a))
    source = a.T if upper else a  # NumPy's upper=True reads the upper triangle
    low = TiledArray(Factor(tuple(a.shape), np.dtype(np.float64), _float64(source)._node, "L"))
    dtype = result_dtype(a.dtype)
    if dtype != np.float64:  # computed in float64 as NumPy's, returned in float32
        low = low.astype(dtype)
    return low.T if upper else low


def _float64(a: TiledArray) -> TiledArray:
    """``a`` in float64, the precision NumPy's linalg computes in (a float32
    factor or solve had kept float32's accuracy only: a 600² SPD system of
    condition 1e5 solved to 7.5e-4 where NumPy's float32 answer is right to
    4.6e-8; a float32 result is cast back from the float64 one)."""
    return a if a.dtype == np.float64 else a.astype(np.float64)


def _computed_if_blocked(v):
    """A lazy vector computed by blocks (``a @ w``) as its NumPy values, now
    (so its reads are not in the caller's plan); anything else as it is."""
    if isinstance(v, TiledArray) and v.ndim == 1 and not v._node.small:
        return np.asarray(v.compute())
    return v


def _column(v: TiledArray):
    """The node of right-hand sides ``v``: a matrix as it is, a small lazy
    vector (a column ``b[:, j]``, ``X.T @ y``) as its ``(n, 1)`` column."""
    if v.ndim == 2:
        return v._node
    return Elemwise((v.shape[0], 1), v.dtype, "reshape", (v._node, (v.shape[0], 1)))


def _rhs(b, n: int, what: str):
    """The right-hand sides as a node (``n x k``) and whether they were a vector."""
    b = _computed_if_blocked(b)
    if isinstance(b, TiledArray):
        if b.ndim not in (1, 2) or b.shape[0] != n:
            raise ValueError(f"{what}: b of shape {b.shape} does not match a {n} x {n} matrix "
                             "(b must be (n,) or (n, k))")
        return _column(b), b.ndim == 1
    arr = np.asarray(b)
    if isinstance(b, str | bytes) or arr.dtype.kind not in "biufc":  # "abc", {1: 2}
        raise TypeError(f"{what}: b must be a numeric array (NumPy, a list or a TiledArray), "
                        f"got {type(b).__name__}")
    if arr.ndim not in (1, 2) or arr.shape[0] != n:
        raise ValueError(f"{what}: b of shape {arr.shape} does not match a {n} x {n} matrix "
                         "(b must be (n,) or (n, k))")
    if arr.dtype.kind not in "biuf":
        raise TypeError(f"{what}: b of dtype {arr.dtype} is not supported")
    vector = arr.ndim == 1
    arr = np.array(arr.reshape(n, 1 if vector else arr.shape[1]), copy=True)
    return Constant(tuple(arr.shape), arr.dtype, arr, tokenize(arr)), vector


def _trsolve(t_node, ynode, dtype, *, lower: bool, trans: bool, unit=False, vector=False):
    n, k = ynode.shape
    opts = {"lower": bool(lower), "trans": bool(trans), "unit": bool(unit),
            "vector": bool(vector)}
    shape = (n,) if vector else (n, k)
    return Factor(shape, dtype, t_node, "trsolve", ynode, tuple(sorted(opts.items())))


def _symmetric_product(a: TiledArray, x: np.ndarray, norm: bool = False):
    """``(a @ x, ||a||_inf or None)`` for a symmetric ``a`` read from its lower
    triangle only (half the bytes; the triangle a Cholesky factor of ``a``
    uses), ``x`` an ``n x k`` float64 array in memory; ``norm``: also the
    infinity norm, from the same pass."""
    n, k = x.shape
    out = np.asarray(_symmetric_product_plan(a, x, norm).compute())
    return out[:, :k], (float(out[:, k].max(initial=0.0)) if norm else None)


def _symmetric_product_plan(a: TiledArray, x: np.ndarray, norm: bool) -> TiledArray:
    """The lazy ``n x (k + norm)`` result of :func:`_symmetric_product`."""
    xnode, _ = _rhs(x, a.shape[0], "solve")
    return TiledArray(Factor((a.shape[0], xnode.shape[1] + int(norm)), np.dtype(np.float64),
                             a._node, "symv", xnode, (("norm", bool(norm)),)))


def _incore(a: TiledArray, op: str, shape, y=None, **options) -> TiledArray:
    dtype = result_dtype(a.dtype if y is None else np.result_type(a.dtype, y.dtype))
    return TiledArray(Factor(tuple(shape), dtype, a._node, "incore", y,
                             tuple(sorted({"op": op, **options}.items()))))


_ASSUME = {"gen": "gen", "general": "gen", "sym": "gen", "symmetric": "gen", "her": "gen",
           "hermitian": "gen", "pos": "pos", "positive definite": "pos"}
"""``assume_a`` as SciPy spells it: a symmetric (real: Hermitian) matrix is
solved as a general one (LU with partial pivoting), an SPD one by Cholesky."""


def _assume(assume_a, what: str) -> str:
    """``"gen"`` or ``"pos"`` for SciPy's ``assume_a`` spellings, else ValueError."""
    kind = _ASSUME.get(assume_a) if isinstance(assume_a, str) else None
    if kind is None:
        raise ValueError(f"{what}: assume_a={assume_a!r} is not supported: 'gen' (also "
                         "'general', 'sym', 'symmetric') or 'pos' ('positive definite')")
    return kind


def solve_plan(a: TiledArray, b, assume_a: str = "gen"):
    """The lazy form of :func:`solve`: ``.plan()`` shows its stages, ``.compute()``
    runs it. Where :func:`solve` would run in mixed precision, a
    :class:`MixedSolve` (its plan: the float32 factor, the first correction
    and residual, and what each refinement step repeats); otherwise a lazy
    TiledArray."""
    assume_a = _assume(assume_a, "solve")
    if assume_a == "pos":
        a = _square(a, "solve")
        ynode, _ = _rhs(_computed_if_blocked(b), a.shape[0], "solve")
        dtype = result_dtype(np.result_type(a.dtype, ynode.dtype))
        if _mixed_precision(a, a.shape[0], ynode.shape[1], dtype):
            return MixedSolve(a, b)
    return _solve_plan(a, b, assume_a)


def _solve_plan(a: TiledArray, b, assume_a: str) -> TiledArray:
    """The float64 (or the input's precision) solve as one lazy expression."""
    a = _square(a, "solve")
    n = a.shape[0]
    ynode, vector = _rhs(b, n, "solve")
    dtype = result_dtype(np.result_type(a.dtype, ynode.dtype))
    f64 = np.dtype(np.float64)  # computed in float64, as NumPy; returned in its dtype
    if assume_a == "pos":  # (f32 A, f32 b: f32; f32 A, f64 b: f64)
        low = Factor(tuple(a.shape), f64, _float64(a)._node, "L")
        y = _trsolve(low, ynode, f64, lower=True, trans=False)
        x = TiledArray(_trsolve(low, y, f64, lower=True, trans=True, vector=vector))
    else:
        shape = (n,) if vector else tuple(ynode.shape)
        x = _incore(_float64(a), "solve", shape, ynode, vector=bool(vector))
    return x if dtype == f64 else x.astype(dtype)


class MixedSolve:
    """An SPD solve :func:`solve` runs in mixed precision (``solve_plan(a, b,
    assume_a="pos")`` for a float64 system it takes that way): ``plan()``
    shows the float32 factor (after what A itself needs) with the first
    correction, one residual pass, and what each further step repeats; ``compute()``
    runs :func:`solve` (the float64 factor where float32 cannot do it: that
    plan is ``plan(precision="double")``)."""

    def __init__(self, a: TiledArray, b):
        self.a, self.b = a, b

    def plan(self, *, engine=None, budget=None, precision: str = "mixed"):
        """The run's plan (``precision="double"``: the float64 fallback's)."""
        if precision not in ("mixed", "double"):
            raise ValueError(f"precision={precision!r}: 'mixed' or 'double'")
        double = _solve_plan(self.a, self.b, "pos")
        if precision == "double":
            return double.plan(engine=engine, budget=budget)
        n = self.a.shape[0]
        ynode, vector = _rhs(_computed_if_blocked(self.b), n, "solve")
        k = ynode.shape[1]
        r32, _ = _rhs(np.zeros((n, k), np.float32), n, "solve")  # r / max|r|, as the run's
        low = Factor(tuple(self.a.shape), np.dtype(np.float32),
                     self.a.astype(np.float32)._node, "L")
        y = _trsolve(low, r32, np.float32, lower=True, trans=False)
        first = TiledArray(_trsolve(low, y, np.float32, lower=True, trans=True)).plan(
            engine=engine, budget=budget)
        try:
            residual = _symmetric_product_plan(self.a, np.zeros((n, k)), True).plan(
                engine=engine, budget=budget)
        except PlanningError:  # solve() factors in float64 then
            return double.plan(engine=engine, budget=budget)
        work = [s for p in (first, residual) for s in p.stages if s.kind != "result"]
        factor = next(i for i, s in enumerate(work) if s.kind == "cholesky")  # after A's own
        note = Stage("refine", f"each refinement step: stages {factor + 2}-{len(work)} again (a "
                     "correction from the float32 factor, then a float64 residual), until "
                     "LAPACK dsposv's test holds (2 steps for a well-conditioned A), at most "
                     f"{REFINE_MAX_ITER}; where float32 cannot factor A or the refinement "
                     "stalls, A is factored in float64: plan(precision='double')", 0, 0, 0)
        d = double._node  # compute() brings x back, as the float64 plan's last line says
        result = [result_stage(d)] if d.small or d.ndim != 2 else []
        return dataclasses.replace(
            first, expression=f"solve({self.a._node}, b, assume_a='pos') in mixed precision",
            shape=(n,) if vector else (n, k), dtype="float64",
            stages=(*work, note, *result))

    def compute(self):
        """Run :func:`solve`; the result in memory, as NumPy."""
        return solve(self.a, self.b, assume_a="pos")

    def __repr__(self) -> str:
        return f"MixedSolve(solve({self.a._node}, b, assume_a='pos'))"


def solve(a: TiledArray, b, assume_a: str = "gen"):
    """Solve ``a x = b``, like :func:`numpy.linalg.solve` / :func:`scipy.linalg.solve`.

    ``assume_a="pos"`` (symmetric positive definite, any size): the tiled
    Cholesky of :func:`cholesky` into a temporary, then forward and backward
    blocked substitution (each reads L's lower triangle once). A float64
    system of ``n >= 10240`` with at most ``n / 64`` right-hand sides is
    solved in mixed precision, as LAPACK's ``dsposv``: the factor is
    computed and stored in float32 (half the bytes, twice the flop rate),
    then iterative refinement -- float64 residual ``b - a x`` (one pass over
    the lower triangle of ``a``, the one the factor used; the first also
    gives ``||a||_inf``), a correction solved in float32 from the float32
    factor as ``dsposv`` does (``r`` first scaled by its largest entry; a
    correction past float32's range falls back as below) -- until the
    residual is ``dsposv``'s ``sqrt(n) eps ||a||_inf ||x||_inf`` or the
    correction no longer changes ``x`` in float64 (two residuals for a
    well-conditioned ``a`` of 16384² or 32768²); where float32 cannot factor
    ``a`` or the refinement stalls (condition number beyond a few million), ``a`` is
    factored in float64 as above (``tilearray.linalg.spd-solve``: ``auto``,
    ``mixed`` or ``double``). Either way only the lower triangle of ``a``
    is used, as :func:`numpy.linalg.cholesky` (SciPy's ``lower=False``
    default reads the upper one). The default
    ``"gen"`` (general A): a matrix one task holds is read whole into one
    task (LAPACK ``gesv``); a larger one is factored out of core by
    left-looking LU with partial pivoting over column panels (each panel
    task holds ``n x b``; the panels run one after another, reading about
    ``n^3 / (2 b)`` elements), then ``L y = P b`` and ``U x = y`` over the
    stored factors. Runs now; the plan is ``solve_plan(a, b, assume_a).plan()``.

    Parameters
    ----------
    a : TiledArray
        ``n x n``.
    b : numpy.ndarray or TiledArray
        ``(n,)`` or ``(n, k)``: in memory, stored, or a lazy vector (``X.T @
        y``, ``A.sum(0)``); the result is returned in memory (as NumPy).
    assume_a : {"gen", "pos"}

    Raises
    ------
    SingularMatrixError
        A general A is singular (exactly zero pivot): names the column.
    PlanningError
        A panel of ``n x 256`` columns (or the Cholesky tile) does not fit a task.
    NotPositiveDefiniteError
        ``assume_a="pos"`` and A is not positive definite (names the tile and column).
    """
    assume_a = _assume(assume_a, "solve")
    if _square(a, "solve", empty=True).size == 0:
        ynode, vector = _rhs(b, 0, "solve")
        rhs = np.empty(((0,) if vector else (0, ynode.shape[1])), ynode.dtype)
        return _numpy_of_empty(np.linalg.solve, a, rhs)
    if assume_a == "pos":
        x = _solve_spd_mixed(a, b)
        if x is not None:
            return x
    return _solve_plan(a, b, assume_a).compute()


LAPACK_EPS = np.finfo(np.float64).eps / 2
"""LAPACK's ``dlamch('Epsilon')``, the unit roundoff ``2**-53`` that
``dsposv``'s test uses (NumPy's ``eps`` is the spacing at 1, twice it: with
it a 4200² system of condition 100 stopped at 1.39x dsposv's bound, a
forward error 350x NumPy's; helper-47)."""
REFINE_MAX_ITER = 10
"""Refinement steps at most (LAPACK ``dsposv`` allows 30 in core; here each
step is a pass over ``a`` and two over the factor, and at 32768² ten of them
cost about what the float64 factor does)."""
REFINE_STALL = 0.25
"""A correction at least this fraction of the one before stalls the
refinement (at that rate, float32's 1e-7 takes over ten steps to reach
float64's 1e-16)."""
REFINE_FLOOR = 1e-8
"""A stalled correction below this fraction of ``x`` is the float64 floor (the
residual's own rounding, about ``cond * eps``), far below float32's: ``x``
is kept; above it, ``a`` is factored in float64."""


def _mixed_precision(a: TiledArray, n: int, k: int, dtype) -> bool:
    from . import _config

    mode = str(_config.get("linalg.spd-solve"))
    if mode not in ("auto", "mixed", "double"):
        raise ValueError(f"tilearray.linalg.spd-solve is {mode!r}: 'auto', 'mixed' or 'double'")
    if mode == "double" or np.dtype(dtype).kind != "f" or n == 0 or k == 0:
        return False
    # auto: a factor that takes longer than the refinement's passes, and the
    # n x k arrays the driver holds (x, a x, r, d) small beside a result
    small = 4 * n * k * 8 <= _config.get_bytes("compute.max-result-size")
    return mode == "mixed" or (n >= MIXED_MIN_N and k <= n // 64 and small)


MIXED_MIN_N = 10240
"""``auto``'s smallest order solved in mixed precision: measured
(``benchmarks/linalg.py --ops solve_spd``, 2 x 1 GiB, 2026-12-07) at 8192
9.2 / 9.2 s mixed against 8.6 / 9.3 s in float64, at 12288 21.2 against
27.1 s, and at 4200 4.8 against 2.5 s; below it the factor costs less than
the refinement's extra runs and passes over ``a`` (it was 4096)."""


def _solve_spd_mixed(a: TiledArray, b):
    """``x`` of the SPD system by a float32 factor and float64 iterative
    refinement (see :func:`solve`); None when it does not apply or does not
    converge (the caller then factors in float64)."""
    import os
    import shutil

    from .engine.constructors import scratch_path
    from .errors import NotPositiveDefiniteError

    a = _square(a, "solve")
    n = a.shape[0]
    b = _computed_if_blocked(b)
    ynode, vector = _rhs(b, n, "solve")
    k = ynode.shape[1]
    dtype = result_dtype(np.result_type(a.dtype, ynode.dtype))
    if not _mixed_precision(a, n, k, dtype):
        return None
    rhs = np.asarray(b.compute() if isinstance(b, TiledArray) else b, dtype=np.float64)
    rhs = rhs.reshape(n, k)
    tiny = np.finfo(np.float64).tiny
    try:  # the residual's pass must fit the budget, or the float64 factor answers
        _symmetric_product_plan(a, rhs, True).plan()
    except PlanningError:
        return None
    path = scratch_path("cholesky32")
    try:
        try:
            low = TiledArray(Factor(tuple(a.shape), np.dtype(np.float32),
                                    a.astype(np.float32)._node, "L")).to_zarr(path)
        except NotPositiveDefiniteError:
            return None  # SPD perhaps, but not in float32: factored in float64

        def correction(r):  # L^-T L^-1 r in float32, as dsposv, in one run
            size = np.abs(r).max(axis=0)
            size[~(size > 0) | ~np.isfinite(size)] = 1.0  # NaN / inf go through, and show
            rnode, _ = _rhs((r / size).astype(np.float32), n, "solve")  # within float32's range
            y = _trsolve(low._node, rnode, np.float32, lower=True, trans=False)
            x = _trsolve(low._node, y, np.float32, lower=True, trans=True)
            return np.asarray(TiledArray(x).compute()).reshape(n, k).astype(np.float64) * size

        x = correction(rhs)
        if not np.all(np.isfinite(x)):  # a beyond float32's range, or NaN / inf in b
            return None
        prev = np.abs(x).max(axis=0)
        tol = np.sqrt(n) * LAPACK_EPS
        anorm = None  # ||a||_inf, from the first residual's pass
        for step in range(1, REFINE_MAX_ITER + 1):
            ax, first = _symmetric_product(a, x, norm=anorm is None)
            anorm = first if anorm is None else anorm
            r, scale = rhs - ax, np.abs(x).max(axis=0)
            residual = np.abs(r).max(axis=0)
            log.info("solve: refinement step %d, residual %.3g of dsposv's bound", step,
                     float(np.max(residual / np.maximum(tol * anorm * scale, tiny))))
            # dsposv's test: x is done
            if np.all(residual <= tol * anorm * scale):
                return (x[:, 0] if vector else x).astype(dtype, copy=False)
            d = correction(r)
            size = np.abs(d).max(axis=0)
            if not np.all(np.isfinite(d)) or np.any((size == 0) & (residual > 0)):
                return None  # the float32 factor cannot correct x (a overflowed it)
            x += d
            scale = np.abs(x).max(axis=0)
            rho = np.minimum(size / np.maximum(prev, tiny), 0.99)
            left = size * rho / (1 - rho)  # the error still in x, by the rate so far
            stalled = rho >= REFINE_STALL
            log.info("solve: correction %d changed x by %.3g of it, error left %.3g of the "
                     "stopping bound", step, float(np.max(size / np.maximum(scale, tiny))),
                     float(np.max(left / np.maximum(tol * scale, tiny))))
            if np.any(stalled & (size > REFINE_FLOOR * scale)):
                return None
            if np.all((left <= tol * scale) | stalled | (residual == 0)):
                return (x[:, 0] if vector else x).astype(dtype, copy=False)
            prev = size
        return None
    finally:
        shutil.rmtree(os.path.dirname(path), ignore_errors=True)


def solve_triangular(a: TiledArray, b, lower: bool = False, trans=0,
                     unit_diagonal: bool = False):
    """Solve ``a x = b`` (``a.T x = b`` with ``trans``) for triangular ``a``, like
    :func:`scipy.linalg.solve_triangular`: blocked substitution over row
    tiles (each task reads its row of tiles of ``a`` once, only on ``a``'s
    triangle), any size of ``a``; ``b`` ``(n,)`` or ``(n, k)``, the result in
    memory. Runs now."""
    a = _square(a, "solve_triangular", empty=True)
    ynode, vector = _rhs(b, a.shape[0], "solve_triangular")
    t = {0: False, "N": False, 1: True, "T": True, 2: True, "C": True}.get(trans)
    if t is None:
        raise ValueError(f"solve_triangular: trans={trans!r} is not 0/'N', 1/'T' or 2/'C'")
    if a.size == 0:
        return np.empty((0,) if vector else (0, ynode.shape[1]),
                        result_dtype(np.result_type(a.dtype, ynode.dtype)))
    dtype = result_dtype(np.result_type(a.dtype, ynode.dtype))
    return TiledArray(_trsolve(a._node, ynode, dtype, lower=lower, trans=t,
                               unit=unit_diagonal, vector=vector)).compute()


def inv(a: TiledArray, assume_a: str = "gen") -> np.ndarray:
    """Inverse, like :func:`numpy.linalg.inv`: :func:`solve` with the identity,
    so only when the ``n x n`` result fits ``tilearray.compute.max-result-size``
    (it is returned in memory); ``assume_a="pos"`` for an SPD matrix of any
    size whose inverse fits."""
    from . import _config

    a = _square(a, "inv", empty=True)
    assume_a = _assume(assume_a, "inv")
    if a.size == 0:
        return _numpy_of_empty(np.linalg.inv, a)
    n = a.shape[0]
    nbytes = n * n * result_dtype(a.dtype).itemsize
    if nbytes > _config.get_bytes("compute.max-result-size"):
        raise PlanningError(f"inv: the {n} x {n} inverse would be {nbytes} bytes, over "
                            "tilearray.compute.max-result-size; solve for the right-hand "
                            "sides you need with ta.linalg.solve instead")
    eye = np.eye(n, dtype=result_dtype(a.dtype))
    if assume_a == "pos":  # n right-hand sides held whole: the LU's column groups may fit
        try:
            _solve_plan(a, eye, "pos").plan()
        except PlanningError:
            # the LU of the symmetric matrix of A's lower triangle, as the Cholesky
            # reads it; A checked positive definite first (by the Cholesky's pivots,
            # as slogdet): whatever the budget, a non-SPD A raises and A's upper
            # triangle is never read (helper-50: both had depended on the budget)
            sym = np.tril(a) + np.tril(a, -1).T
            general = _solve_plan(sym, eye, "gen")
            general.plan()  # or its refusal: the smaller need, from which the call runs
            slogdet(a, assume_a="pos")
            return general.compute()
    return solve(a, eye, assume_a)


def matrix_power(a: TiledArray, n: int):
    """``a`` raised to the integer power ``n``, like
    :func:`numpy.linalg.matrix_power`: for ``n >= 1`` a lazy product of
    ``a`` by repeated squaring (about ``log2(n)`` stored products); for
    ``n < 0`` the power of :func:`inv` (in memory, when it fits)."""
    import operator

    a = _square(a, "matrix_power", empty=True)
    if a.size == 0:  # NumPy: the empty matrix, whatever the power
        return held(a, np.empty((0, 0), a.dtype))
    try:
        k = operator.index(n)
    except TypeError:
        raise TypeError(f"matrix_power: exponent must be an integer, got {n!r}") from None
    if k == 0:  # the identity, lazily (NumPy: of a's dtype)
        from .engine.constructors import eye

        return eye(a.shape[0], dtype=a.dtype)
    if k < 0:
        return np.linalg.matrix_power(inv(a), -k)
    result, base = None, a
    while k:
        if k & 1:
            result = base if result is None else result @ base
        k >>= 1
        if k:
            base = base @ base
    return result


def slogdet(a: TiledArray, assume_a: str = "gen"):
    """Sign and log of the absolute determinant, like :func:`numpy.linalg.slogdet`.

    ``assume_a="pos"``: from the diagonal of the tiled Cholesky factor (any
    size; sign 1). Default: LU with partial pivoting, of the whole matrix in
    one task when it fits, else by column panels out of core (as
    :func:`solve`): the pivots' parity and U's diagonal. Runs now."""
    a = _square(a, "slogdet", empty=True)
    if _assume(assume_a, "slogdet") == "pos" and a.size:
        low = Factor(tuple(a.shape), np.dtype(np.float64), _float64(a)._node, "L")
        sign, logabs = TiledArray(Factor((), low.dtype, low, "logdiag")).compute()
        dtype = result_dtype(a.dtype)  # NumPy's: float32's in float32
        return SlogdetResult(dtype.type(sign), dtype.type(logabs))
    if a.size == 0:  # NumPy: sign 1, log 0 (the determinant of 0 x 0 is 1)
        return _numpy_of_empty(np.linalg.slogdet, a)
    return _incore(a, "slogdet", ()).compute()


def det(a: TiledArray, assume_a: str = "gen"):
    """Determinant, like :func:`numpy.linalg.det`, from :func:`slogdet`."""
    _square(a, "det", empty=True)  # refused in its own name
    sign, logabs = slogdet(a, assume_a)
    return sign * np.exp(logabs)


def eigh(a: TiledArray, UPLO: str = "L"):
    """Eigenvalues and eigenvectors of a symmetric matrix one task can hold (a
    covariance, a Gram), like :func:`numpy.linalg.eigh`: the matrix is read
    whole into one task; a larger one is refused with a PlanningError
    naming the sizes. Runs now."""
    a = _square(a, "eigh", empty=True)
    if a.size == 0:
        return _numpy_of_empty(np.linalg.eigh, a, UPLO=UPLO)
    return _incore(a, "eigh", (), UPLO=UPLO).compute()


def eigvalsh(a: TiledArray, UPLO: str = "L"):
    """Eigenvalues of a symmetric matrix one task can hold, like
    :func:`numpy.linalg.eigvalsh` (see :func:`eigh`)."""
    a = _square(a, "eigvalsh", empty=True)
    if a.size == 0:
        return _numpy_of_empty(np.linalg.eigvalsh, a, UPLO=UPLO)
    return _incore(a, "eigvalsh", (a.shape[0],), UPLO=UPLO).compute()


def eig(a: TiledArray):
    """Eigenvalues and right eigenvectors of a general square matrix one task
    can hold, like :func:`numpy.linalg.eig` (complex when the spectrum is):
    the matrix is read whole into one task; a larger one is refused with a
    PlanningError naming the sizes. For a symmetric matrix :func:`eigh` is
    faster and real. Runs now."""
    a = _square(a, "eig", empty=True)
    if a.size == 0:
        return _numpy_of_empty(np.linalg.eig, a)
    return _incore(a, "eig", ()).compute()


def eigvals(a: TiledArray):
    """Eigenvalues of a general square matrix one task can hold, like
    :func:`numpy.linalg.eigvals` (see :func:`eig`). Runs now."""
    a = _square(a, "eigvals", empty=True)
    if a.size == 0:
        return _numpy_of_empty(np.linalg.eigvals, a)
    return _incore(a, "eigvals", (a.shape[0],)).compute()


def norm(x: TiledArray, ord=None, axis=None, keepdims=False) -> TiledArray:
    """Matrix or vector norm, like :func:`numpy.linalg.norm` (lazy).

    Built from fused elementwise operations and tree reductions, so the
    matrix is read once. ``np.linalg.norm(x, ...)`` on a TiledArray calls it.

    Parameters
    ----------
    x : TiledArray
    ord : {None, "fro", 1, -1, inf, -inf, 0, 2, float}
        ``axis=None`` or two axes: Frobenius (``None``/``"fro"``), 1, -1,
        inf, -inf matrix norms, and 2, -2, ``"nuc"`` from the singular
        values (:func:`svd` of the tall side: its short side must fit a
        task). ``axis=0|1``: vector norms of each column / row:
        ``None``/2, 1, inf, -inf, 0 (count of non-zeros) and any other p.
    axis : {None, 0, 1, (0, 1), (1, 0)}
        As NumPy: one axis (negative allowed) for vector norms, two for a
        matrix norm with that (row, column) order.
    keepdims : bool

    Returns
    -------
    TiledArray
        A small lazy result (0-d for ``axis=None``): ``.compute()`` or
        ``float(...)``.

    Raises
    ------
    PlanningError
        An unsupported ``ord`` or a bad ``axis`` (a ``ValueError``; an
        ``axis`` that is not integers is a ``TypeError`` too).

    Examples
    --------
    >>> float(ta.linalg.norm(a))                       # doctest: +SKIP
    >>> ta.linalg.norm(a, axis=0).compute()            # column norms  # doctest: +SKIP
    """
    if x.dtype.kind != "f":  # as NumPy: integers and booleans are measured in float64
        x = x.astype("float64")
    # real data (complex is refused): |x|^2 = x*x, without an abs temporary,
    # so a norm fits wherever (x * x).sum() does
    if axis is None and ord is None:  # any ndim: the 2-norm of the flattened array
        return elemwise("sqrt", build_reduction("sum", x * x, None, keepdims, 0))
    axes = _norm_axes(axis, x.ndim)
    a = abs(x)
    if len(axes) == 2:  # a matrix norm over (row axis, column axis), as NumPy
        row, col = axes
        if ord in (None, "fro"):
            return elemwise("sqrt", build_reduction("sum", x * x, None, keepdims, 0))
        if ord in (1, -1, np.inf, -np.inf):
            # 1: the largest column sum (summed along the row axis); inf: row sums
            sums = build_reduction("sum", a, row if ord in (1, -1) else col, True, 0)
            return build_reduction("max" if ord > 0 else "min", sums, None, keepdims, 0)
        if ord in (2, -2, "nuc"):  # from the singular values (TSQR of the tall side)
            if x.size == 0 and ord != -2:  # NumPy: 0 (-2: the min of none, refused)
                zero = np.zeros((1, 1) if keepdims else (), result_dtype(x.dtype))
                return held(x, zero)
            s = svd(_tall_side(x), compute_uv=False)
            s = build_reduction({2: "max", -2: "min", "nuc": "sum"}[ord], s, None, False, 0)
            if keepdims:
                s = TiledArray(Elemwise((1, 1), s.dtype, "reshape", (s._node, (1, 1))))
            return s
        raise PlanningArgumentError(f"norm: invalid norm order {ord!r} for matrices")
    return _vector_norm(x, ord, axes[0], keepdims)


def _vector_norm(x: TiledArray, ord, axis, keepdims: bool) -> TiledArray:
    """The vector norm of order ``ord`` along ``axis`` (None: of all elements)."""
    a = elemwise("absolute", x)
    if ord in (None, 2):
        return elemwise("sqrt", build_reduction("sum", x * x, axis, keepdims, 0))
    if ord == 1:
        return build_reduction("sum", a, axis, keepdims, 0)
    if ord == np.inf:
        return build_reduction("max", a, axis, keepdims, 0)
    if ord == -np.inf:
        return build_reduction("min", a, axis, keepdims, 0)
    if ord == 0:
        return build_reduction("sum", (x != 0).astype(x.dtype), axis, keepdims, 0)
    if isinstance(ord, int | float):
        return elemwise("power", build_reduction("sum", a**ord, axis, keepdims, 0), 1.0 / ord)
    raise PlanningArgumentError(f"norm: invalid norm order {ord!r} for vectors")


def _tall_side(x: TiledArray) -> TiledArray:
    """``x`` or ``x.T``, whichever has at least as many rows as columns (the
    same singular values; TSQR factors it)."""
    return x if x.shape[0] >= x.shape[1] else x.T


def _singular_values(x: TiledArray, what: str) -> np.ndarray:
    """All singular values of a 2-D ``x``, descending: TSQR of its tall side
    (one read; the short side must fit a task, see :func:`svd`)."""
    return np.asarray(svd(_tall_side(_tall(x, what, empty=True)), compute_uv=False).compute())


def matrix_rank(a: TiledArray, tol=None, hermitian: bool = False, *, rtol=None) -> int:
    """Rank from the singular values, like :func:`numpy.linalg.matrix_rank`.

    The singular values above ``tol`` (default ``s.max() * rtol``, ``rtol``
    default ``max(m, n) * eps`` of their dtype) are counted; they come from
    the TSQR of the tall side, which reads the matrix once. A 1-D array's
    rank is 1 unless it is all zeros. ``hermitian`` changes nothing here (the
    SVD serves both). Runs now."""
    if not isinstance(a, TiledArray):
        raise TypeError(f"matrix_rank: expected a TiledArray, got {type(a).__name__}")
    if a.ndim < 2:
        return int(bool((a != 0).any().compute()))
    if tol is not None and rtol is not None:
        raise ValueError("matrix_rank: `tol` and `rtol` can't be both set.")
    s = _singular_values(a, "matrix_rank")
    if s.size == 0:
        return np.int64(0)
    if tol is None:
        rtol = max(a.shape) * np.finfo(s.dtype).eps if rtol is None else rtol
        tol = s.max() * rtol
    return np.int64(np.count_nonzero(s > tol))  # NumPy's type


_NO_RTOL = object()


def pinv(a: TiledArray, rcond=None, hermitian: bool = False, *, rtol=_NO_RTOL) -> TiledArray:
    """Moore-Penrose pseudo-inverse, like :func:`numpy.linalg.pinv` (lazy).

    From the thin SVD of the tall side (TSQR): ``pinv(X) = V diag(1/s) U^T``
    with singular values at or below ``rcond * s.max()`` dropped (NumPy's
    default ``rcond`` 1e-15; ``rtol=None`` for ``max(m, n) * eps``). ``s``
    and ``Vt`` come from one read of X, now (R of the TSQR in one run, kept
    with its SVD); the result is lazy, ``n x m`` for an ``m x n`` X:
    ``(U @ (diag(1/s) Vt)).T``, whose storing or use reads X twice more (U
    applied down the TSQR tree). ``hermitian`` (a square symmetric X one
    task holds, its lower triangle used): from :func:`eigh`, as NumPy, in
    one run and in memory, ``U diag(1/w) U^T`` over the eigenvalues ``w``
    whose ``|w|`` passes the cut-off; else as above."""
    x = _tall(a, "pinv", empty=True)
    if x.size == 0:  # NumPy's empty n x m (of x's own dtype, as NumPy)
        return held(x, np.linalg.pinv(np.empty(x.shape, x.dtype)))
    if rcond is None:
        rcond = 1e-15 if rtol is _NO_RTOL else (
            max(x.shape) * np.finfo(result_dtype(x.dtype)).eps if rtol is None else rtol)
    elif rtol is not _NO_RTOL:
        raise ValueError("pinv: `rtol` and `rcond` can't be both set.")
    if hermitian and x.shape[0] == x.shape[1]:
        by_eigh = _pinv_hermitian(x, rcond)
        if by_eigh is not None:
            return by_eigh
    wide = x.shape[0] < x.shape[1]
    tall = _tall(_tall_side(x), "svd", empty=True)
    # U's pass down needs the most: refused now, before the s run, naming the
    # budget the whole pinv fits (s's refusal had named one that U then refused)
    _part(tall, "U").plan()
    s = np.asarray(_part(tall, "s").compute())  # one run, one read: it keeps R,
    vt = np.asarray(_part(tall, "Vt").compute())  # whose SVD in the driver gives Vt
    u = _part(tall, "U", align=vt)  # U to match this Vt (its run's R is another R)
    large = s > rcond * (s.max() if s.size else 0)
    inv_s = np.zeros_like(s)
    inv_s[large] = 1.0 / s[large]
    p = u @ np.ascontiguousarray(inv_s[:, None] * vt)  # pinv(tall).T, m x n
    return p if wide else p.T


def _pinv_hermitian(x: TiledArray, rcond) -> TiledArray | None:
    """NumPy's ``pinv(x, hermitian=True)`` from ``eigh`` (held in memory),
    or None when ``eigh``'s one task does not fit the budget."""
    decomposition = _incore(x, "eigh", (), UPLO="L")
    try:
        decomposition.plan()
    except PlanningError:
        return None
    w, u = decomposition.compute()
    large = np.abs(w) > rcond * (np.abs(w).max() if w.size else 0)
    inv_w = np.zeros_like(w)
    inv_w[large] = 1.0 / w[large]
    return held(x, ((u * inv_w) @ u.T).astype(result_dtype(x.dtype), copy=False))


def cond(x: TiledArray, p=None):
    """Condition number, like :func:`numpy.linalg.cond`.

    ``p`` None, 2 or -2: the ratio of the extreme singular values (any
    shape; the TSQR of the tall side, one read; ``inf`` when the smallest is
    zero). Otherwise (``"fro"``, ``"nuc"``, 1, -1, inf, -inf) ``norm(x, p) *
    norm(inv(x), p)`` for a square matrix whose inverse fits in memory (see
    :func:`inv`); ``inf`` for a singular one. As NumPy, a NaN result is
    ``inf`` unless ``x`` holds a NaN. Runs now."""
    x = _tall(x, "cond", empty=True)
    if 0 in x.shape:
        raise np.linalg.LinAlgError("cond is not defined on empty arrays")
    if p in (None, 2, -2):
        s = _singular_values(x, "cond")
        with np.errstate(all="ignore"):
            r = s[-1] / s[0] if p == -2 else s[0] / s[-1]
        return _nan_as_inf(x, s.dtype.type(r))
    if p not in ("fro", "nuc", 1, -1, np.inf, -np.inf):
        raise ValueError(f"cond: invalid norm order {p!r} for matrices")
    from .errors import SingularMatrixError

    x = _square(x, "cond")
    t = result_dtype(x.dtype).type
    try:
        inverse = inv(x)
    except (SingularMatrixError, ValueError) as e:
        # a NaN entry stops LU (a NaN pivot, or LAPACK's refusal): NumPy's cond is NaN
        if _has_nan(x):
            return t(np.nan)
        if isinstance(e, SingularMatrixError):
            return t(np.inf)
        raise
    with np.errstate(all="ignore"):
        r = np.asarray(norm(x, p).compute()) * np.linalg.norm(inverse, p)
    return _nan_as_inf(x, t(r))


def _has_nan(x: TiledArray) -> bool:
    """Whether ``x`` holds a NaN (one pass; integers never do)."""
    return x.dtype.kind == "f" and bool(np.isnan(x).any().compute())


def _nan_as_inf(x: TiledArray, r):
    """NumPy's rule for a condition number: NaN becomes inf unless ``x`` holds
    a NaN (checked only then: one more pass)."""
    return r if not np.isnan(r) or _has_nan(x) else type(r)(np.inf)


def _norm_axes(axis, ndim: int) -> tuple:
    """NumPy's ``axis`` of a norm as a tuple of axes: one (a vector norm along
    it) or two (a matrix norm, row axis first); None is every axis."""
    if axis is None:
        axis = tuple(range(ndim))
        if ndim not in (1, 2):
            raise PlanningError(f"norm: improper number of dimensions ({ndim}) for ord= "
                                "with axis=None")
    if not isinstance(axis, tuple | list):
        axis = (axis,)
    if not all(isinstance(i, int | np.integer) and not isinstance(i, bool) for i in axis):
        raise PlanningArgumentTypeError(f"norm: axis must be None, an integer or a tuple of "
                                        f"integers, got {axis!r}")
    if not all(-ndim <= i < ndim for i in axis):
        raise PlanningError(f"norm: axis {axis!r} is out of bounds for a {ndim}-D array")
    axes = tuple(int(i) % ndim for i in axis)
    if len(axes) not in (1, 2) or len(set(axes)) != len(axes):
        raise PlanningError(f"norm: axis {axis!r} must be one axis (vector norms) or two "
                            "distinct axes (a matrix norm)")
    return axes


HANDLED[np.linalg.norm] = norm  # np.linalg.norm(a) on a TiledArray
HANDLED[np.linalg.qr] = qr


def _numpy_svd(a, *args, **kwargs):
    """``np.linalg.svd(X)`` on a TiledArray: :func:`svd`. NumPy's default
    ``full_matrices=True`` would give an ``m x m`` U (or ``n x n`` Vt) for a
    non-square X, never built out of core: the thin SVD, with a warning
    naming the shapes, where they differ (an explicit True is refused)."""
    if args or "full_matrices" in kwargs:
        return svd(a, *args, **kwargs)
    shape = np.shape(a)
    if kwargs.get("compute_uv", True) and len(shape) == 2 and shape[0] != shape[1]:
        m, n = shape
        r = min(m, n)
        warnings.warn(
            f"np.linalg.svd of a {m} x {n} TiledArray: NumPy's default full_matrices=True "
            f"gives U {m} x {m} and Vt {n} x {n}; tilearray returns the thin SVD (U {m} x {r}, "
            f"Vt {r} x {n}), as full_matrices=False, which silences this", UserWarning,
            stacklevel=3)
    return svd(a, full_matrices=False, **kwargs)


HANDLED[np.linalg.svd] = _numpy_svd
HANDLED[np.linalg.lstsq] = lstsq
HANDLED[np.linalg.cholesky] = cholesky
HANDLED[np.linalg.solve] = solve
HANDLED[np.linalg.inv] = inv
HANDLED[np.linalg.det] = det
HANDLED[np.linalg.slogdet] = slogdet
HANDLED[np.linalg.eigh] = eigh
HANDLED[np.linalg.eigvalsh] = eigvalsh
HANDLED[np.linalg.matrix_rank] = matrix_rank
HANDLED[np.linalg.cond] = cond
HANDLED[np.linalg.pinv] = pinv
HANDLED[np.linalg.eig] = eig
HANDLED[np.linalg.eigvals] = eigvals
HANDLED[np.linalg.matrix_power] = matrix_power


# -- NumPy 2's array-API functions of numpy.linalg ---------------------------------------------


def svdvals(x: TiledArray) -> TiledArray:
    """``np.linalg.svdvals``: the singular values (lazy; one read of X, see :func:`svd`)."""
    return svd(x, compute_uv=False)


def matrix_norm(x: TiledArray, /, *, keepdims: bool = False, ord="fro") -> TiledArray:
    """``np.linalg.matrix_norm``: :func:`norm` of the matrix."""
    return norm(_tall(x, "matrix_norm", empty=True), ord=ord, keepdims=keepdims)


def vector_norm(x: TiledArray, /, *, axis=None, keepdims: bool = False, ord=2) -> TiledArray:
    """``np.linalg.vector_norm``: the vector norm along ``axis``; ``None`` (or
    both axes) takes all the elements as one vector (lazy)."""
    if axis is not None:
        axes = _norm_axes(axis, x.ndim)
        axis = None if len(axes) == x.ndim else axes if len(axes) > 1 else axes[0]
        if isinstance(axis, tuple):
            raise PlanningError(f"vector_norm: axis {axis!r} must be one axis or all of them")
    if ord is None or (isinstance(ord, str)):
        raise ValueError(f"vector_norm: invalid norm order {ord!r} for vectors")
    return _vector_norm(x, ord, axis, keepdims)


def multi_dot(arrays, *, out=None):
    """``np.linalg.multi_dot``: the chain of products in the cheapest order
    (NumPy's dynamic programme over the shapes), lazy."""
    if out is not None:
        raise TypeError("multi_dot: out= is not supported on TiledArrays")
    arrays = list(arrays)
    if len(arrays) < 2:
        raise ValueError("Expecting at least two arrays.")
    first_1d, last_1d = np.ndim(arrays[0]) == 1, np.ndim(arrays[-1]) == 1
    dims = [1 if first_1d else arrays[0].shape[0]] + [a.shape[-1] for a in arrays[:-1]] + \
        [1 if last_1d else arrays[-1].shape[-1]]
    n = len(arrays)
    cost = [[0] * n for _ in range(n)]
    split = [[0] * n for _ in range(n)]
    for length in range(1, n):
        for i in range(n - length):
            j = i + length
            cost[i][j] = float("inf")
            for k in range(i, j):
                c = cost[i][k] + cost[k + 1][j] + dims[i] * dims[k + 1] * dims[j + 1]
                if c < cost[i][j]:
                    cost[i][j], split[i][j] = c, k

    def chain(i, j):
        if i == j:
            return arrays[i]
        k = split[i][j]
        return chain(i, k) @ chain(k + 1, j)

    return chain(0, n - 1)


HANDLED[np.linalg.svdvals] = svdvals
HANDLED[np.linalg.matrix_norm] = matrix_norm
HANDLED[np.linalg.vector_norm] = vector_norm
HANDLED[np.linalg.multi_dot] = multi_dot
HANDLED[np.linalg.matrix_transpose] = lambda x, /: x.T
HANDLED[np.linalg.matmul] = lambda x1, x2, /: x1 @ x2
HANDLED[np.linalg.diagonal] = lambda x, /, *, offset=0: np.diagonal(x, offset)
HANDLED[np.linalg.trace] = lambda x, /, *, offset=0, dtype=None: np.trace(x, offset, dtype=dtype)
HANDLED[np.linalg.vecdot] = lambda x1, x2, /, *, axis=-1: (x1 * x2).sum(axis=axis)
HANDLED[np.linalg.outer] = lambda x1, x2, /: np.outer(x1, x2)
