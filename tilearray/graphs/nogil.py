"""BLAS/LAPACK calls that release the GIL while they compute.

SciPy's ``scipy.linalg.blas.dgemm`` and its siblings (f2py wrappers) hold the
GIL for the whole call. A tile kernel runs for seconds, and all that time
the worker's event loop waits: a dependency the other worker asks for, a
"task finished" message and the prefetch threads' reads wait with it. Here
the kernels measured gaps of 0.2-0.5 s between a tile task and the next at
2048² tiles (a dependency fetched from a worker in the middle of a gemm),
about a tenth of each worker's time.

The same routines are called here through the C function pointers SciPy
exports for Cython (``scipy.linalg.cython_blas`` / ``cython_lapack``: the
BLAS SciPy links, the one threadpoolctl limits), with ctypes, which releases
the GIL for the duration of a foreign call. Arguments follow the Fortran
interface: everything by reference, column-major matrices with a leading
dimension. Operands are taken as they lie when their layout is a BLAS
matrix (F-ordered, a row/column slice of one, or C-ordered as the transpose);
the others are copied.
"""

from __future__ import annotations

import ctypes
import functools

import numpy as np

_P = ctypes.c_void_p
_SIGNATURES = {  # argument count of each routine; all are pointers
    "gemm": 13, "syrk": 10, "trsm": 11, "potrf": 5, "getrf": 6,
}
_PREFIX = {np.dtype("float32"): "s", np.dtype("float64"): "d"}


# private prototypes: setting restype/argtypes on ctypes.pythonapi's own
# function objects would change them for every other user in the process
_capsule_name = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.py_object)(
    ("PyCapsule_GetName", ctypes.pythonapi))
_capsule_address = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))


def _capsule_pointer(capsule) -> int:
    return _capsule_address(capsule, _capsule_name(capsule))


def routine(name: str, dtype):
    """The ctypes function of ``name`` (``"gemm"``, ``"syrk"``, ``"trsm"``,
    ``"potrf"``, ``"getrf"``) for ``dtype`` (float32 or float64); None for other dtypes."""
    prefix = _PREFIX.get(np.dtype(dtype).newbyteorder("="))
    return None if prefix is None else _routine(prefix + name)


@functools.cache
def _routine(name: str):
    # imported here: scipy.linalg costs ~0.3 s of start-up where no kernel runs
    from scipy.linalg import cython_blas, cython_lapack

    module = cython_lapack if name[1:] in ("potrf", "getrf") else cython_blas
    address = _capsule_pointer(module.__pyx_capi__[name])
    return ctypes.CFUNCTYPE(None, *[_P] * _SIGNATURES[name[1:]])(address)


def _char(c: str):
    return ctypes.byref(ctypes.c_char(c.encode()))


_INT_MAX = 2**31 - 1  # SciPy's BLAS takes 32-bit ints (LP64)


def _int(i: int):
    if not 0 <= i <= _INT_MAX:
        raise ValueError(f"a BLAS dimension or leading dimension of {i} is outside "
                         f"0..{_INT_MAX} (32-bit BLAS)")
    return ctypes.byref(ctypes.c_int(int(i)))


def _check(name: str, **shapes) -> None:
    """Raise ValueError unless the named extents agree pairwise, as SciPy's
    wrappers did: BLAS itself would read or write past the arrays."""
    for what, (got, want) in shapes.items():
        if got != want:
            raise ValueError(f"{name}: {what} is {got}, expected {want}")


def _scalar(x: float, dtype):
    return ctypes.byref((ctypes.c_float if dtype == np.float32 else ctypes.c_double)(x))


def layout(x: np.ndarray) -> tuple[int, bool] | None:
    """``(ld, transposed)`` when ``x`` (2-D) is a BLAS matrix as it lies:
    column-major with leading dimension ``ld`` (``transposed`` False), or
    row-major, i.e. its transpose is (True); None when neither holds."""
    if not (x.dtype.isnative and x.flags.aligned):
        return None
    b = x.itemsize
    (m, n), (s0, s1) = x.shape, x.strides
    if s0 == b and s1 % b == 0 and s1 // b >= max(m, 1):
        return s1 // b, False
    if s1 == b and s0 % b == 0 and s0 // b >= max(n, 1):
        return s0 // b, True
    if x.flags.f_contiguous:
        return max(m, 1), False
    if x.flags.c_contiguous:
        return max(n, 1), True
    return None


def operand(x: np.ndarray, trans: bool, dtype) -> tuple[np.ndarray, int, bool]:
    """``(matrix, ld, trans)``: ``op(x)`` as a column-major matrix of
    ``dtype`` and the transpose flag that gives it (``x`` itself when it lies
    as one)."""
    x = np.asarray(x, dtype=dtype)
    lay = layout(x)
    if lay is None:
        x = np.array(x, dtype=np.dtype(dtype).newbyteorder("="), order="F")  # aligned
        lay = (max(x.shape[0], 1), False)
    ld, flipped = lay
    return x, ld, trans != flipped


def inout(c: np.ndarray, dtype) -> tuple[np.ndarray, int]:
    """``(c, ld)``: ``c`` itself when the routine can write it in place
    (column-major, ``dtype``, writeable), else a column-major copy."""
    if c.dtype == dtype and c.flags.writeable:
        lay = layout(c)
        if lay is not None and not lay[1]:
            return c, lay[0]
    c = np.array(c, dtype=dtype, order="F")
    return c, max(c.shape[0], 1)


def gemm(alpha, a, b, beta, c, *, trans_a=False, trans_b=False) -> np.ndarray:
    """``c = alpha op(a) op(b) + beta c`` in place when ``c`` allows (see
    :func:`inout`); returns ``c``. ``c`` is float32 or float64, the operands
    are taken in its dtype."""
    dtype = c.dtype.newbyteorder("=")
    c, ldc = inout(c, dtype)
    a, lda, ta = operand(a, trans_a, dtype)
    b, ldb, tb = operand(b, trans_b, dtype)
    m, n = c.shape
    (am, k), (bk, bn) = a.shape[::-1] if trans_a else a.shape, b.shape[::-1] if trans_b else b.shape
    _check("gemm", rows_of_op_a=(am, m), rows_of_op_b=(bk, k), columns_of_op_b=(bn, n))
    routine("gemm", dtype)(_char("T" if ta else "N"), _char("T" if tb else "N"),
                           _int(m), _int(n), _int(k), _scalar(alpha, dtype),
                           a.ctypes.data, _int(lda), b.ctypes.data, _int(ldb),
                           _scalar(beta, dtype), c.ctypes.data, _int(ldc))
    return c


def syrk(alpha, a, beta, c, *, trans=False, lower=True) -> np.ndarray:
    """``c = alpha op(a) op(a)^T + beta c`` on one triangle of ``c``
    (``op(a) = a.T`` if ``trans``); the other triangle is left as it was."""
    dtype = c.dtype.newbyteorder("=")
    c, ldc = inout(c, dtype)
    a, lda, t = operand(a, trans, dtype)
    n = c.shape[0]
    an, k = a.shape[::-1] if trans else a.shape
    _check("syrk", columns_of_c=(c.shape[1], n), rows_of_op_a=(an, n))
    routine("syrk", dtype)(_char("L" if lower else "U"), _char("T" if t else "N"),
                           _int(n), _int(k), _scalar(alpha, dtype), a.ctypes.data,
                           _int(lda), _scalar(beta, dtype), c.ctypes.data, _int(ldc))
    return c


def trsm(a, b, *, left, lower, trans, unit) -> np.ndarray:
    """``b = op(a)^-1 b`` (``left``) or ``b op(a)^-1``, ``a`` triangular."""
    dtype = b.dtype.newbyteorder("=")
    b, ldb = inout(b, dtype)
    a, lda, t = operand(a, trans, dtype)
    if t != trans:  # a lies transposed: its lower triangle is the stored upper one
        lower = not lower
    m, n = b.shape
    _check("trsm", shape_of_a=(a.shape, (m, m) if left else (n, n)))
    routine("trsm", dtype)(_char("L" if left else "R"), _char("L" if lower else "U"),
                           _char("T" if t else "N"), _char("U" if unit else "N"),
                           _int(m), _int(n), _scalar(1.0, dtype), a.ctypes.data, _int(lda),
                           b.ctypes.data, _int(ldb))
    return b


def potrf(a: np.ndarray, *, lower=True) -> tuple[np.ndarray, int]:
    """Cholesky of ``a`` in place when it allows (:func:`inout`), one triangle
    read and written, the other left as it was; returns ``(a, info)``
    (LAPACK's: ``info > 0`` is the 1-based column whose pivot failed)."""
    _check("potrf", columns_of_a=(a.shape[1], a.shape[0]))
    a, lda = inout(a, a.dtype.newbyteorder("="))
    info = ctypes.c_int(0)
    routine("potrf", a.dtype)(_char("L" if lower else "U"), _int(a.shape[0]), a.ctypes.data,
                              _int(lda), ctypes.byref(info))
    return a, info.value


def getrf(a: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """LU with partial pivoting of ``a`` (``m x n``) in place when it allows
    (:func:`inout`); returns ``(lu, piv, info)``: row ``i`` was swapped with
    row ``piv[i]`` (0-based, in order), ``info > 0`` the 1-based column of an
    exactly zero pivot (LAPACK's)."""
    a, lda = inout(a, a.dtype.newbyteorder("="))
    m, n = a.shape
    piv = np.zeros(min(m, n), dtype=np.intc)
    info = ctypes.c_int(0)
    routine("getrf", a.dtype)(_int(m), _int(n), a.ctypes.data, _int(lda), piv.ctypes.data,
                              ctypes.byref(info))
    return a, piv - 1, info.value
