"""NumPy's statistics and comparisons on TiledArrays, built from the lazy
operations (matmul, joins, gathers, reductions, elementwise ops): ``cov``,
``corrcoef``, ``average``, ``isclose``, ``allclose``, ``outer``, exact
``median`` / ``quantile`` / ``percentile``. Nothing is read here."""

from __future__ import annotations

import operator
import warnings

import numpy as np

from ...errors import PlanningError
from . import routines, selection
from .nodes import Elemwise, Full, Outer, Quantile, Unique, is_big_vector
from .ops import ExprBase, as_constant, as_node, elemwise, reduce_as, wrap_like


def var_about(op: str, a, mean, axis=None, keepdims=False, ddof=0, dtype=None) -> ExprBase:
    """NumPy 2's ``mean=`` of ``var`` / ``std`` / ``nanvar`` / ``nanstd``
    (``op``): the spread about the given ``mean`` (a NumPy array, scalar or
    lazy result broadcasting against ``a`` as NumPy's ``keepdims`` mean), not
    about the data's own: ``sum(|a - mean|**2) / (N - ddof)`` over ``axis``,
    the NaNs of ``a`` left out (and not counted in N) by the nan-variants,
    whose slices with ``N - ddof <= 0`` give NaN. One pass over ``a``."""
    nan = op.startswith("nan") and a.dtype.kind == "f"  # no NaN in others: NumPy's var
    dev = a - mean
    total = reduce_as("nansum" if nan else "sum", dev * dev, axis, keepdims, 0, dtype)
    if nan:  # NumPy's count of the elements that are not NaN
        dof = reduce_as("sum", ~np.isnan(a), axis, keepdims) - ddof
        var = np.where(dof > 0, total / np.maximum(dof, 1), np.nan)
        var = var.astype(total.dtype) if var.dtype != total.dtype else var
    else:
        n = a.size // max(total.size, 1)
        with np.errstate(divide="ignore", invalid="ignore"):
            var = total / max(n - ddof, 0)
    return np.sqrt(var) if op.endswith("std") else var


def cov(m, y=None, rowvar=True, bias=False, ddof=None, fweights=None, aweights=None,
        *, dtype=None) -> ExprBase:
    """``np.cov``: the covariance of the variables of ``m`` (and ``y``): rows
    of a 2-D array when ``rowvar``, else columns; a 1-D array is one
    variable. ``fweights`` / ``aweights``: NumPy vectors over the
    observations. A lazy matrix (a lazy scalar for one variable, as NumPy's
    squeeze), or NumPy's own ``cov`` on a worker when every operand is a
    small result or NumPy.

    One pass over ``X`` (observations x variables): ``Y = [X - s, 1]``, with
    ``s`` the first observation (a shift against cancellation: it reads only
    the I/O units of that one observation), weighted ``Y * sqrt(w)``, and
    ``G = Y.T @ Y`` by the symmetric matmul, which gives the shifted cross
    products and, in its last column, the (weighted) column sums ``c``; then
    ``cov = (G[:n, :n] - c c^T / sum(w)) / fact``, a map over the small n x n
    temporary (``fact`` NumPy's degrees of freedom). A ``dtype`` narrower
    than float64 is the result's: the sums are taken in float64 (their
    cancellation cost float32 ~2x NumPy's error, corrcoef ~7x).
    """
    return _cast(_cov(m, y, rowvar, bias, ddof, fweights, aweights, dtype), dtype)


def _cast(x: ExprBase, dtype) -> ExprBase:
    """``x`` as ``dtype`` (the caller's ``dtype=``, None: as it is)."""
    return x if dtype is None or x.dtype == dtype else x.astype(dtype)


def _cov(m, y, rowvar, bias, ddof, fweights, aweights, dtype) -> ExprBase:
    """:func:`cov` in at least float64 (``dtype``'s precision when wider)."""
    if ddof is not None and ddof != int(ddof):
        raise ValueError("ddof must be integer")
    lazy = [v for v in (m, y) if isinstance(v, ExprBase)]
    if not lazy:
        raise TypeError("np.cov: one operand must be a TiledArray")
    if all(as_node(v).small for v in lazy):
        return _small_call("cov", dict(m=m, y=y), rowvar=rowvar, bias=bias, ddof=ddof,
                           fweights=fweights, aweights=aweights, dtype=dtype)
    pieces = _observations(m, rowvar) + ([] if y is None else _observations(y, rowvar, True))
    x = pieces[0] if len(pieces) == 1 else routines.concatenate(pieces, axis=1)
    n = as_node(x)
    obs, nvar = n.shape
    if ddof is None:
        ddof = 0 if bias else 1
    ddof = operator.index(int(ddof))
    w, fact = _weights(fweights, aweights, obs, ddof)
    dt = np.result_type(n.dtype if dtype is None else dtype, np.float64)
    if obs == 0:  # NumPy's NaNs (after its warning on the degrees of freedom)
        return np.full_like(x, np.nan, dtype=dt, shape=(nvar, nvar) if nvar > 1 else ())
    xf = x.astype(dt)
    ones = wrap_like(x, Full((obs, 1), dt, 1))
    y_aug = routines.concatenate([xf - xf[0], ones], axis=1)
    if w is not None:  # sqrt(w) on both sides of the Gram: sum_i w_i y_i y_i^T
        y_aug = y_aug * np.sqrt(w).astype(dt)[:, None]
    gram = y_aug.T @ y_aug
    total = obs if w is None else float(w.sum())
    colsum = gram[:nvar, nvar]  # a small vector: the last column's units only
    c = (gram[:nvar, :nvar] - outer(colsum, colsum) / total) / fact
    return c[0, 0] if nvar == 1 else c


def _observations(v, rowvar: bool, row_is_variable: bool = False) -> list:
    """``v`` as observations x variables pieces for a join along axis 1: a
    1-D array is one variable; a 2-D one has its variables in rows when
    ``rowvar`` (NumPy 2.4's rule for ``y``, ``row_is_variable``: or when it
    is a single row); a NumPy matrix one column at a time."""
    nd = np.ndim(v)
    if nd > 2:
        raise ValueError("m has more than 2 dimensions")
    if nd == 0:
        raise ValueError("np.cov: a variable needs at least one observation, got a scalar")
    if not isinstance(v, ExprBase):
        a = np.asarray(v)
        cols = a.reshape(-1, 1) if nd == 1 else \
            (a.T if rowvar or (row_is_variable and a.shape[0] == 1) else a)
        return [np.ascontiguousarray(cols[:, j:j + 1]) for j in range(cols.shape[1])]
    if nd == 1:
        return [v[:, None]]
    return [v.T if rowvar or (row_is_variable and v.shape[0] == 1) else v]


def _weights(fweights, aweights, obs: int, ddof: int):
    """NumPy's checks of ``fweights`` / ``aweights``; ``(w or None, fact)``
    with ``fact`` the divisor (0 with NumPy's warning when not positive)."""
    w = None
    for name, given in (("fweights", fweights), ("aweights", aweights)):
        if given is None:
            continue
        if isinstance(given, ExprBase):
            raise TypeError(f"np.cov: {name} must be a NumPy vector on TiledArrays; "
                            "compute() it first")
        arr = np.asarray(given, dtype=float)
        if name == "fweights" and not np.all(arr == np.around(arr)):
            raise TypeError("fweights must be integer")
        if arr.ndim > 1:
            raise RuntimeError(f"cannot handle multidimensional {name}")
        if arr.shape[0] != obs:
            raise RuntimeError(f"incompatible numbers of samples and {name}")
        if np.any(arr < 0):
            raise ValueError(f"{name} cannot be negative")
        w = arr if w is None else w * arr
    if w is not None and w.sum() == 0:
        raise ZeroDivisionError("Weights sum to zero, can't be normalized")
    if w is None:
        fact = obs - ddof
    elif ddof == 0:
        fact = w.sum()
    elif aweights is None:
        fact = w.sum() - ddof
    else:
        fact = w.sum() - ddof * np.sum(w * np.asarray(aweights, dtype=float)) / w.sum()
    if fact <= 0:
        warnings.warn("Degrees of freedom <= 0 for slice", RuntimeWarning, stacklevel=3)
        fact = 0.0
    return w, float(fact)


def _small_call(name: str, operands: dict, **kw) -> ExprBase:
    """NumPy's ``name`` on small results (and NumPy operands, carried in the
    node), in memory on a worker: a lazy small result of NumPy's shape and dtype."""
    lazy = {k: v for k, v in operands.items() if isinstance(v, ExprBase)}
    kw = {**kw, **{k: v for k, v in operands.items() if k not in lazy}}
    nodes = tuple(as_node(v) for v in lazy.values())
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        sample = np.asarray(getattr(np, name)(
            **{k: np.ones(n.shape, n.dtype) for k, n in zip(lazy, nodes, strict=True)}, **kw))
    kwargs = (("names", tuple(lazy)), ("numpy", name)) + tuple(sorted(kw.items()))
    return wrap_like(next(iter(lazy.values())),
                     Elemwise(sample.shape, sample.dtype, "call", nodes, kwargs))


def corrcoef(x, y=None, rowvar=True, *, dtype=None) -> ExprBase:
    """``np.corrcoef``: :func:`cov` (one pass over ``X``) divided by the outer
    product of the standard deviations (its diagonal: only the diagonal's
    units of the small temporary), clipped to [-1, 1] like NumPy (one
    variable: ``c / c``, as NumPy)."""
    lazy = [v for v in (x, y) if isinstance(v, ExprBase)]
    if lazy and all(as_node(v).small for v in lazy):
        return _small_call("corrcoef", dict(x=x, y=y), rowvar=rowvar, dtype=dtype)
    c = _cov(x, y, rowvar, False, None, None, None, dtype)
    if c.ndim == 0:
        r = c / c
    else:
        d = np.sqrt(routines.diagonal(c))
        r = (c / outer(d, d)).clip(-1, 1)
    return _cast(r, dtype)


def outer(a, b) -> ExprBase:
    """``np.outer`` of two vectors (small results, 1-D products joined in
    memory, or NumPy vectors): a lazy matrix, each block computed from the two
    vectors (nothing is read)."""
    na, nb = (_vector(v) for v in (a, b))
    if isinstance(a, ExprBase) or isinstance(b, ExprBase):
        like = a if isinstance(a, ExprBase) else b
    else:
        raise TypeError("np.outer: one operand must be a TiledArray")
    dtype = np.result_type(na.dtype, nb.dtype)
    return wrap_like(like, Outer((na.shape[0], nb.shape[0]), dtype, na, nb))


def _vector(v):
    n = as_node(v) if isinstance(v, ExprBase) else as_constant(np.asarray(v).reshape(-1))
    if not (getattr(n, "small", False) or is_big_vector(n)) or n.ndim != 1:
        raise PlanningError(f"np.outer: the operands must be vectors (1-D results or "
                            f"NumPy vectors), got shape {n.shape}")
    return n


def isclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=False) -> ExprBase:
    """``np.isclose``: where both are finite ``|a - b| <= atol + rtol * |b|``,
    elsewhere ``a == b`` (infinities equal only themselves); NaNs equal each
    other when ``equal_nan``. Lazy and elementwise, fused into the reads."""
    absb = elemwise("absolute", b) if isinstance(b, ExprBase) else np.abs(b)
    near = elemwise("less_equal", elemwise("absolute", elemwise("subtract", a, b)),
                     atol + rtol * absb)
    finite = elemwise("logical_and", _u("isfinite", a), _u("isfinite", b))
    close = elemwise("where", finite, near, elemwise("equal", a, b))
    if equal_nan:
        both = elemwise("logical_and", _u("isnan", a), _u("isnan", b))
        close = elemwise("logical_or", close, both)
    return close


def _u(name: str, v):
    """A unary ufunc of a TiledArray (lazy) or of a scalar / NumPy operand (now)."""
    return elemwise(name, v) if isinstance(v, ExprBase) else getattr(np, name)(v)


def allclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=False) -> ExprBase:
    """``np.allclose``: :func:`isclose` reduced with ``all`` (one pass; a
    lazy 0-d result, ``bool()`` computes it)."""
    return isclose(a, b, rtol, atol, equal_nan).all()


def average(a, axis=None, weights=None, returned=False, *, keepdims=False):
    """``np.average``: the mean, or with NumPy ``weights`` -- a vector along
    ``axis``, or an array of ``a``'s shape -- ``(a * w).sum(axis) /
    w.sum(axis)``, fused in one pass over ``a``."""
    if weights is None:
        avg = a.mean(axis=axis, keepdims=keepdims)
        scl = avg.dtype.type(a.size / max(avg.size, 1))
    else:
        w = np.asarray(weights)
        if axis is None and a.ndim == 1:  # a vector's weighted mean: its only axis
            axis = 0
        if w.shape == tuple(a.shape) and w.ndim == 2:  # a weight per element, in memory
            wsum = w.sum(axis=axis, keepdims=keepdims)
            if np.any(wsum == 0):
                raise ZeroDivisionError("Weights sum to zero, can't be normalized")
            avg = (a * w).sum(axis=axis, keepdims=keepdims) / wsum
            if not returned:
                return avg
            return avg, np.broadcast_to(wsum, avg.shape).astype(
                np.result_type(avg.dtype, wsum.dtype))
        if axis is None or w.ndim != 1:
            raise TypeError("np.average: weights must be a 1-D NumPy vector along an axis "
                            "(axis=0 or 1) on TiledArrays")
        ax = routines.axis_index(axis, "average")
        if w.shape[0] != a.shape[ax]:
            raise ValueError("Length of weights not compatible with specified axis.")
        wsum = w.sum(dtype=np.result_type(a.dtype, w.dtype, np.float64))
        if wsum == 0:
            raise ZeroDivisionError("Weights sum to zero, can't be normalized")
        wb = w if a.ndim == 1 else w.reshape(-1, 1) if ax == 0 else w.reshape(1, -1)
        avg = (a * wb).sum(axis=ax, keepdims=keepdims) / wsum
        scl = wsum
    if not returned:
        return avg
    return avg, np.full(avg.shape, scl, dtype=np.result_type(avg.dtype, np.asarray(scl).dtype))


def quantile(op: str, a, q, axis=None, method="linear", keepdims=False,
             dtype=None) -> ExprBase:
    """Exact ``np.quantile`` / ``np.nanquantile`` along axis 0 or 1 (``q`` in
    [0, 1]): one pass; a task holds whole lines along ``axis`` (a column for
    ``axis=0``: the column read plus NumPy's partitioned float64 copy, about
    ``N * (3 * itemsize + 16)`` bytes for N rows) in bands as wide as fit the
    budget; refused when one line does not fit. ``axis=None``: over all
    elements, computed now (:func:`.selection.quantile`); a tuple of axes as
    the one it names, or None when it names both."""
    n = as_node(a)
    axis = routines.axes_as_one(axis, f"np.{op}", n.ndim)
    if keepdims:  # NumPy's shape: q's, then the input's with the axis (or all) as 1
        res = quantile(op, a, q, axis, method, False, dtype)
        ax = None if axis is None else routines.axis_index(axis, op, n.ndim)
        kept = np.shape(q) + tuple(1 if ax in (None, i) else s for i, s in enumerate(n.shape))
        if len(kept) > 2:
            raise TypeError(f"np.{op}: keepdims=True with {np.size(q)} quantiles of a "
                            f"{n.ndim}-D array makes a {len(kept)}-D result; tilearray arrays "
                            "are 1-D or 2-D (pass keepdims=False, or one q)")
        return res.reshape(kept)
    qa = np.asarray(q, dtype=np.float64)
    if qa.ndim > 1:
        raise TypeError(f"np.{op}: q of shape {qa.shape} (more than 1-D) is not supported on "
                        "TiledArrays; pass a scalar or a 1-D sequence")
    if np.any((qa < 0) | (qa > 1)) or np.any(np.isnan(qa)):
        raise ValueError("Quantiles must be in the range [0, 1]")
    if 0 in n.shape and op.endswith("median") and axis is None:  # NumPy: nan, warned
        warnings.warn("Mean of empty slice.", RuntimeWarning, stacklevel=3)
        return selection.held(a, np.full((), np.nan, dtype or np.float64))
    if 0 in n.shape and axis is not None:  # NumPy: NaN for each empty line, warned
        ax = routines.axis_index(axis, op, n.ndim)
        lines = n.shape[1 - ax] if n.ndim == 2 else 1
        # NumPy's nan-quantiles of an empty array drop q's axis (its fallback is a mean)
        shape = ((lines,) if n.ndim == 2 else ()) if qa.ndim == 0 or op.startswith("nan") \
            else (qa.size,) + ((lines,) if n.ndim == 2 else ())
        if op.endswith("median") or op.startswith("nan") or 0 in shape:
            if n.shape[ax] == 0 and lines:
                warnings.warn("Mean of empty slice.", RuntimeWarning, stacklevel=3)
            return selection.held(a, np.full(shape, np.nan, dtype or np.float64))
    if 0 in n.shape:
        raise PlanningError(f"{op}: an empty array (shape {n.shape}) has no quantile")
    if dtype is None:
        dtype = np.asarray(np.quantile(np.ones((2, 2), n.dtype), q, axis=0, method=method)).dtype
    if n.ndim == 1:  # a vector: its only axis
        if axis is not None:
            routines.axis_index(axis, op, 1)  # 0 or -1, else NumPy's AxisError
            axis = None
        if not n.small:  # a blocked product (x @ w): computed first
            a = wrap_like(a, as_constant(np.asarray(a.compute())))
            n = as_node(a)
    if axis is None and not n.small:
        return selection.quantile(op, a, qa, method, dtype)
    scalar = qa.ndim == 0
    qs = tuple(float(v) for v in qa.reshape(-1))
    if axis is None:  # a small result: NumPy's quantile of it, in memory
        shape = () if scalar else (qa.size,)
        return wrap_like(a, Quantile(shape, np.dtype(dtype), op, n, None, qs, scalar, method))
    ax = routines.axis_index(axis, op, n.ndim)
    other = n.shape[1 - ax]
    shape = (other,) if scalar else (len(qs), other)
    node = Quantile(shape, np.dtype(dtype), op, n, ax, qs, scalar, method)
    return wrap_like(a, node)


def unique(a, axis=None, equal_nan=True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``np.unique`` of all the elements of a matrix, computed now: ``(the
    sorted distinct values (NaNs as NumPy's equal_nan), the flat index of
    each one's first occurrence, its count)``."""
    if axis is not None:
        raise TypeError("np.unique of a matrix along an axis (unique rows or columns) is not "
                        "supported on TiledArrays; axis=None gives its distinct elements")
    n = as_node(a)
    if 0 in n.shape:
        return np.empty(0, n.dtype), np.empty(0, np.intp), np.empty(0, np.intp)
    values, counts, first = wrap_like(a, Unique((a.size,), n.dtype, n, bool(equal_nan))).compute()
    return values, first.astype(np.intp), counts.astype(np.intp)
