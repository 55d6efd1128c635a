"""Worker-side BLAS/LAPACK layer: one BLAS thread per call, the dtypes the
kernels compute in, F-ordered copies, and the tile kernels of the tiled
Cholesky, triangular solves and LU (:mod:`.cholesky`, :mod:`.lu`), plus the
determinant from an LU.

Every kernel is a pure function of in-memory blocks (NumPy arrays in, NumPy
arrays out). Dtypes follow ``numpy.linalg``: float32 and float64 are kept,
integer and boolean inputs are computed in float64, float16 and complex are
refused (the kernels are real-only for now). Memory figures count the bytes
a call holds at its peak, inputs included, with ``b`` the itemsize.

Every BLAS/LAPACK call runs with ONE thread (:func:`one_blas_thread`):
multi-threaded OpenBLAS ``potrf`` segfaults on the reference machine, and a
worker thread must not oversubscribe the cores its siblings use. Setting the
limit costs about 0.1 ms per outermost call (nested calls about 1 us), small
against a tile kernel; the references hold it once for all their kernels.
"""

from __future__ import annotations

import functools

import numpy as np
import threadpoolctl
from threadpoolctl import ThreadpoolController

from .._config import SharedSetting
from ..errors import NotPositiveDefiniteError, SingularMatrixError
from . import nogil

# --------------------------------------------------------------------------
# one BLAS thread, dtypes
# --------------------------------------------------------------------------

_CONTROLLER: list = []  # threadpoolctl's view of the loaded BLAS, made once


def _release_openblas_control() -> None:
    """threadpoolctl (3.7 on) lets only the thread that first set OpenBLAS's
    process-wide thread count set it again; other threads' calls do nothing.
    The shared setting below applies from the first thread to enter and
    restores from the last to leave, often another one (which left OpenBLAS
    at one thread for good in the driver, in half the runs of 4 threads):
    each of its calls takes control, under the setting's lock."""
    clear = getattr(getattr(threadpoolctl, "OpenBLASController", None),
                    "clear_controlling_thread", None)
    if clear is not None:
        clear(force=True)


def _limit_blas():
    if not _CONTROLLER:
        _CONTROLLER.append(ThreadpoolController())
    _release_openblas_control()
    return _CONTROLLER[0].limit(limits=1, user_api="blas")


def _restore_blas(limiter) -> None:
    _release_openblas_control()
    limiter.restore_original_limits()
    _release_openblas_control()


one_blas_thread = SharedSetting(_limit_blas, _restore_blas)
"""``with one_blas_thread():`` runs the body with every loaded BLAS limited to
one thread. BLAS thread counts are process-wide, so nested and concurrent
users share one limit: the first to enter sets it, the last to leave
restores the original counts (a plain ``threadpool_limits(1)`` per call could
restore 2 threads while another worker thread is still inside ``potrf``)."""


def single_threaded(func):
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        with one_blas_thread():
            return func(*args, **kwargs)
    return wrapper


def result_dtype(dtype) -> np.dtype:
    """The dtype ``numpy.linalg`` computes ``dtype`` data in (f32 stays f32)."""
    dtype = np.dtype(dtype)
    if not dtype.isnative:  # big-endian data ('>f8', v2 arrays from netCDF): computed native
        dtype = dtype.newbyteorder("=")
    if dtype in (np.float32, np.float64):
        return dtype
    if dtype.kind in "biu":
        return np.dtype(np.float64)
    raise TypeError(f"array type {dtype} is unsupported by the linalg kernels "
                    "(float32 and float64; integers are computed in float64)")


COPY_BAND_BYTES = 128 * 1024
"""Bytes of source rows :func:`copy_rows` moves at a time (about an L2 cache)."""


def copy_rows(dst: np.ndarray, src) -> np.ndarray:
    """``dst[...] = src`` in bands of rows; returns ``dst``.

    Copying a C-ordered block into an F-ordered one (what LAPACK wants) in
    one assignment strides over the whole destination for every source row;
    bands of ~128 KiB keep both sides in cache: a 65536 x 256 float64 block
    took 0.075 s in 64-row bands against 0.29 s at once (measured here,
    one thread)."""
    src = np.asarray(src)
    h = max(COPY_BAND_BYTES // max(src.shape[1] * src.itemsize, 1), 16) if src.ndim == 2 \
        else len(src)
    for r0 in range(0, len(src), max(h, 1)):
        dst[r0:r0 + h] = src[r0:r0 + h]
    return dst


def as_fortran(x, dtype=None, *, copy: bool = False) -> np.ndarray:
    """``x`` F-ordered (LAPACK's layout) in ``dtype`` (default: the dtype
    :func:`result_dtype` computes it in): ``x`` itself when it already is
    and ``copy`` is False, as :func:`numpy.asfortranarray`, else copied in
    row bands (:func:`copy_rows`)."""
    x = np.asarray(x)
    dtype = result_dtype(x.dtype) if dtype is None else np.dtype(dtype)
    if not copy and x.flags.f_contiguous and x.dtype == dtype:
        return x
    if x.ndim != 2:
        return np.array(x, dtype=dtype, order="F")
    return copy_rows(np.empty(x.shape, dtype, order="F"), x)


def as_float(a, order="F", copy=False) -> np.ndarray:
    """``a`` in the dtype the kernels compute it in (:func:`result_dtype`),
    F-ordered as :func:`as_fortran` or in ``order``; a copy only when needed
    or ``copy``."""
    if order == "F":
        return as_fortran(a, copy=copy)
    a = np.asarray(a)
    return np.array(a, dtype=result_dtype(a.dtype), order=order, copy=copy or None)


def tile_edges(n: int, tile: int) -> list[tuple[int, int]]:
    """``[(0, tile), (tile, 2 tile), ..., (.., n)]``: the last tile may be short."""
    if tile < 1:
        raise ValueError(f"tile must be >= 1, got {tile}")
    return [(i, min(i + tile, n)) for i in range(0, n, tile)]


def slogdet_from_lu(perm: np.ndarray, diag_u: np.ndarray) -> tuple[float, float]:
    """``numpy.linalg.slogdet`` from an LU with ``A[perm] = L U``: ``(sign, log|det|)``.

    The sign is the parity of ``perm`` times the signs of U's diagonal
    (a zero pivot gives ``(0, -inf)``). For an SPD matrix's Cholesky factor
    pass ``perm = arange(n)`` and ``diag(L) ** 2``. Memory: ``O(n)``.
    """
    diag_u = np.asarray(diag_u)
    seen = np.zeros(len(perm), bool)
    swaps = 0
    for i in range(len(perm)):  # parity: n minus the number of cycles
        if not seen[i]:
            j = i
            while not seen[j]:
                seen[j] = True
                j = perm[j]
            swaps += 1
    parity = -1.0 if (len(perm) - swaps) % 2 else 1.0
    if np.any(diag_u == 0):
        return 0.0, -np.inf
    sign = parity * float(np.prod(np.sign(diag_u)))
    return sign, float(np.sum(np.log(np.abs(diag_u))))



# --------------------------------------------------------------------------
# tile kernels: Cholesky, triangular solves, LU panels
# --------------------------------------------------------------------------

def zero_upper(c: np.ndarray) -> np.ndarray:
    """Zero the strict upper triangle of a square ``c`` in place, column by
    column (no temporaries: about 1 us a column); returns ``c``."""
    for j in range(1, c.shape[1]):
        c[:j, j] = 0
    return c


@single_threaded
def potrf(a_kk: np.ndarray, *, tile: tuple[int, int] = (0, 0), col0: int = 0,
          overwrite: bool = False) -> np.ndarray:
    """Cholesky factor ``L_kk`` of a diagonal tile (LAPACK ``potrf``, lower).

    ``a_kk`` is ``t x t``; only its lower triangle is read. Returns a new
    ``t x t`` lower-triangular ``L_kk`` (upper triangle zeroed); with
    ``overwrite``, written over ``a_kk`` when it is F-ordered of the computing
    dtype (use the return value; memory ``t^2 b``). Raises
    :class:`~tilearray.errors.NotPositiveDefiniteError` naming ``tile`` and
    the global column ``col0 + j`` (``col0``: the tile's first column) whose
    pivot is not positive. NaN propagates without an error, as in
    ``numpy.linalg.cholesky``. Memory: ``2 t^2 b``.
    """
    a = as_float(a_kk)
    c, info = nogil.potrf(a if overwrite else np.array(a, order="F"), lower=True)
    zero_upper(c)
    if info > 0:
        raise NotPositiveDefiniteError(tile, col0 + info - 1)
    if info < 0:  # pragma: no cover - a bug in the arguments
        raise ValueError(f"potrf: illegal argument {-info}")
    return c


@single_threaded
def trsm(l_kk: np.ndarray, a_ik: np.ndarray) -> np.ndarray:
    """``L_ik = A_ik L_kk^-T``: an off-diagonal tile of a Cholesky panel.

    ``l_kk`` is ``t x t`` lower, ``a_ik`` is ``t_i x t``; returns ``t_i x t``,
    written over ``a_ik`` when it is F-ordered of the computing dtype (use the
    return value). Memory: ``(t^2 + t_i t) b``.
    """
    return _trsm(l_kk, a_ik, side=1, lower=True, trans=True, unit=False)


@single_threaded
def trsm_left_lower(lower: np.ndarray, b: np.ndarray, *, trans: bool = False,
                    unit_diagonal: bool = False) -> np.ndarray:
    """``X`` with ``L X = B`` (``L^T X = B`` if ``trans``); ``L`` lower ``t x t``.

    ``b`` is ``t x p`` (many right-hand sides), overwritten when F-ordered of
    the computing dtype (use the return value). ``unit_diagonal``: L's
    diagonal is taken as ones (the L of an LU). Memory: ``(t^2 + t p) b``.
    """
    return _trsm(lower, b, side=0, lower=True, trans=trans, unit=unit_diagonal)


@single_threaded
def trsm_left_upper(upper: np.ndarray, b: np.ndarray, *, trans: bool = False,
                    unit_diagonal: bool = False) -> np.ndarray:
    """``X`` with ``U X = B`` (``U^T X = B`` if ``trans``); as :func:`trsm_left_lower`."""
    return _trsm(upper, b, side=0, lower=False, trans=trans, unit=unit_diagonal)


def _trsm(a, b, *, side, lower, trans, unit):
    dtype = np.result_type(result_dtype(a.dtype), result_dtype(b.dtype))
    b = nogil.inout(b, dtype)[0]
    if b.size == 0:
        return b
    return nogil.trsm(a, b, left=side == 0, lower=lower, trans=trans, unit=unit)


@single_threaded
def syrk_update(c: np.ndarray, a: np.ndarray) -> np.ndarray:
    """``C - A A^T`` on the LOWER triangle of a diagonal tile (BLAS ``syrk``).

    ``c`` is ``t x t``, ``a`` is ``t x w``. The strict upper triangle of the
    result is left as it was (stale): :func:`potrf` reads only the lower one.
    Written over ``c`` when F-ordered of the computing dtype (use the return
    value). Memory: ``(t^2 + t w) b``.
    """
    dtype = np.result_type(result_dtype(c.dtype), result_dtype(a.dtype))
    c = nogil.inout(c, dtype)[0]
    if np.size(a) == 0:
        return c
    return nogil.syrk(-1.0, a, 1.0, c, lower=True)


@single_threaded
def gemm_update(c: np.ndarray, a: np.ndarray, b: np.ndarray, *, trans_a: bool = False,
                trans_b: bool = False) -> np.ndarray:
    """``C - op(A) op(B)`` (BLAS ``gemm``, alpha -1, beta 1); ``op`` transposes if asked.

    Cholesky uses ``gemm_update(A_ij, L_ik, L_jk, trans_b=True)``, LU
    ``gemm_update(A_ij, L_ik, U_kj)``. ``c`` is ``p x q``, ``op(a)`` ``p x w``,
    ``op(b)`` ``w x q``; written over ``c`` when F-ordered of the computing
    dtype (use the return value). Memory: ``(p q + p w + w q) b``.
    """
    dtype = np.result_type(*(result_dtype(x.dtype) for x in (c, a, b)))
    c = nogil.inout(c, dtype)[0]
    if np.size(a) == 0 or np.size(b) == 0:
        return c
    return nogil.gemm(-1.0, a, b, 1.0, c, trans_a=trans_a, trans_b=trans_b)


@single_threaded
def getrf_panel(panel: np.ndarray, *, col0: int = 0, index: int = 0,
                allow_singular: bool = False):
    """LU with partial pivoting of a column panel (LAPACK ``getrf``).

    ``panel`` is the ``h x w`` block of every row from the panel's diagonal
    down (``h >= w``) by the panel's ``w`` columns, already updated by the
    panels to its left. Returns ``(lu, perm)``: ``panel[perm] = L U`` with
    ``L`` unit lower (``h x w``, below lu's diagonal) and ``U`` (``w x w``, on
    and above it); ``perm`` (``h``) permutes the panel's rows, to be applied to
    the same rows of every other column (:func:`permute_rows`). An exactly zero
    pivot raises :class:`~tilearray.errors.SingularMatrixError` naming the
    global column ``col0 + j`` and panel ``index``, unless ``allow_singular``
    (a determinant: LAPACK finishes the factorization, U's diagonal holds
    the zero). Memory: ``2 h w b``.
    """
    a = as_float(panel)
    h, w = a.shape
    if h < w:
        raise ValueError(f"an LU panel needs at least as many rows as columns, got {a.shape}")
    lu, piv, info = nogil.getrf(np.array(a, order="F"))
    if info > 0 and not allow_singular:
        raise SingularMatrixError(col0 + info - 1, index)
    if info < 0:  # pragma: no cover - a bug in the arguments
        raise ValueError(f"getrf: illegal argument {-info}")
    perm = np.arange(h)
    for i, p in enumerate(piv[:w]):  # LAPACK's row swaps, 0-based, in order
        perm[[i, p]] = perm[[p, i]]
    return lu, perm


def permute_rows(block: np.ndarray, perm: np.ndarray) -> np.ndarray:
    """``block[perm]``: a panel's row interchanges applied to other columns."""
    return np.asarray(block)[perm]
