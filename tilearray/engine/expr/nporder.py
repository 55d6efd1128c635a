"""NumPy's sorting, counting, searching and order statistics on TiledArrays:
``np.sort`` / ``np.argsort`` (a matrix along an axis: lazy, whole lines per
task), ``np.unique`` / ``np.bincount`` / ``np.histogram`` (computed now),
``np.isin`` / ``np.digitize`` (fused into the reads), ``np.searchsorted`` /
``np.nonzero`` of small results, and exact quantiles / medians."""

from __future__ import annotations

import warnings

import numpy as np

from ...errors import PlanningError
from . import routines, selection, statistics
from .lazy import LazyArray
from .npbase import given, implements, small_only, small_values
from .ops import HANDLED, elemwise


def _ordering(name: str, a, axis, kind, order, stable):
    """np.sort / np.argsort: of a matrix along axis 0 or 1, lazy (whole
    lines in a task, :func:`.routines.sort`); with ``axis=None``, of its
    elements gathered now (:func:`.selection.flat`, when they fit a task);
    of a small result, lazy too (elemwise over the in-memory value); a
    blocked vector is computed first."""
    if order is not None:
        raise TypeError(f"np.{name}: order= (structured arrays) is not supported on TiledArrays")
    if stable is not None and kind is not None:
        raise ValueError(f"np.{name}: `kind` and `stable` parameters can't both be specified.")
    if stable:
        kind = "stable"
    if isinstance(a, LazyArray) and not a._node.small and a.ndim == 2:
        if axis is not None:
            return routines.sort(name, a, axis, kind)
        # all elements in one vector: gathered now, when they fit
        a = selection.flat(a, f"np.{name}(a) (axis=None)", along_axis=True)
    a = small_only(a, name, "")
    kw = given(kind=kind)
    if isinstance(a, np.ndarray):
        return getattr(np, name)(a, axis=axis, **kw)
    return elemwise(name, a, axis=axis, **kw)


@implements(np.sort)
def sort(a, axis=-1, kind=None, order=None, *, stable=None):
    """Sorted copy, as :func:`numpy.sort`: a matrix along axis 0 or 1 (lazy;
    a task holds whole lines), a small result (a column, a reduction's
    vector) in memory; a blocked vector such as ``x @ w`` is computed first."""
    return _ordering("sort", a, axis, kind, order, stable)


@implements(np.argsort)
def argsort(a, axis=-1, kind=None, order=None, *, stable=None):
    """Indices that sort along an axis, as :func:`numpy.argsort` (see :func:`sort`)."""
    return _ordering("argsort", a, axis, kind, order, stable)


def _partition(name: str):
    def impl(a, kth, axis=-1, kind="introselect", order=None):
        if order is not None:
            raise TypeError(f"np.{name}: order= (structured arrays) is not supported on "
                            "TiledArrays")
        size = int(np.prod(a.shape)) if axis is None else \
            a.shape[routines.axis_index(axis, f"np.{name}", a.ndim)]
        for k in np.atleast_1d(kth):
            if not -size <= int(k) < size:
                raise ValueError(f"kth(={int(k)}) out of bounds ({size})")
        return _ordering(name.replace("partition", "sort"), a, axis, None, None, None)

    impl.__name__ = name
    impl.__doc__ = (f"np.{name}: the whole line sorted (one of the arrangements NumPy "
                    "allows: every element before ``kth`` is no larger); see :func:`sort`.")
    return impl


HANDLED[np.partition], HANDLED[np.argpartition] = _partition("partition"), \
    _partition("argpartition")


@implements(np.unique)
def unique(ar, return_index=False, return_inverse=False, return_counts=False, axis=None,
           *, equal_nan=True, sorted=None):  # noqa: A002
    """:func:`numpy.unique`, computed now (its size depends on the data): of
    a small result in memory; of a matrix (``axis=None``: all its elements)
    in one pass, each block's distinct values merged up a tree, with
    ``return_counts`` and ``return_index`` (flat, C order) as NumPy's, and
    ``return_inverse``: the lazy matrix of each element's code (the index of
    its value: a search in them), fused into the reads like ``np.digitize``. Meant for few
    distinct values (labels, codes): a task that would hold more than its
    memory allows stops the run with a clear error."""
    if isinstance(ar, LazyArray) and not ar._node.small and ar.ndim == 2:
        values, first, counts = statistics.unique(ar, axis, equal_nan)
        out = [values] + [first] * bool(return_index)
        if return_inverse:
            out.append(_codes(ar, values))
        out += [counts] * bool(return_counts)
        return out[0] if len(out) == 1 else tuple(out)
    ar = small_values(ar, "unique", "take the unique values of a column (np.unique(a[:, j]))")
    return np.unique(ar, return_index=return_index, return_inverse=return_inverse,
                     return_counts=return_counts, axis=axis, equal_nan=equal_nan,
                     **given(sorted=sorted))


def _codes(ar, values: np.ndarray):
    """Each element's index in the sorted distinct ``values`` (a lazy matrix
    of intp): ``np.searchsorted(values, x)`` against the values in their own
    dtype; NaN finds the first NaN, NumPy's code when NaNs are one value."""
    if len(values) > 1 and np.isnan(values[-2:].astype(float)).all():
        raise TypeError("np.unique(..., return_inverse=True, equal_nan=False) of a matrix with "
                        "several NaNs is not supported on TiledArrays (each NaN would get its "
                        "own code, in flat order): use equal_nan=True")
    table = _table(values, "unique", "distinct values")
    return elemwise("codes", ar, values=table, dtype=str(values.dtype)).astype(np.intp)


@implements(np.bincount)
def bincount(x, weights=None, minlength=0):
    """:func:`numpy.bincount` of a vector (a column ``a[:, j]``, a
    reduction's result), computed now; NumPy's 1-D rule for matrices."""
    hint = ("count a column (np.bincount(a[:, j])), or all elements with "
            "np.unique(a, return_counts=True)")
    if isinstance(x, LazyArray) and x.ndim != 1:
        raise ValueError(f"np.bincount: object too deep for desired array (a {x.ndim}-D "
                         f"TiledArray of shape {x.shape}): {hint}")
    x = small_values(x, "bincount", hint)
    if isinstance(weights, LazyArray):
        weights = small_values(weights, "bincount", hint)
    return np.bincount(x, weights=weights, minlength=minlength)


@implements(np.histogram)
def histogram(a, bins=10, range=None, density=None, weights=None):  # noqa: A002
    """:func:`numpy.histogram` of a small result (a column ``a[:, j]``, a
    vector) or of all elements of a matrix (see :mod:`.selection`),
    computed now: ``(counts, bin_edges)`` as NumPy."""
    if isinstance(a, LazyArray) and not a._node.small and a.ndim == 2 and weights is None:
        if isinstance(bins, LazyArray):
            bins = np.asarray(bins.compute())
        return selection.histogram(a, bins, range, density)
    a = small_values(a, "histogram", "histogram a column (np.histogram(a[:, j])) or a vector")
    if isinstance(weights, LazyArray):
        weights = np.asarray(weights.compute())
    if isinstance(bins, LazyArray):
        bins = np.asarray(bins.compute())
    return np.histogram(a, bins=bins, range=range, density=density, weights=weights)


_TABLE_LIMIT = 65_536
"""Elements of the table ``np.isin`` / ``np.digitize`` carry into every task."""


def _table(values, name: str, what: str) -> tuple:
    """A small NumPy table of an elementwise op (a small result computed
    first), as a tuple (it travels in the op, hashed with it)."""
    if isinstance(values, LazyArray):
        values = small_values(values, name, f"give the {what} as a NumPy array")
    values = np.asarray(values)
    if values.dtype.kind not in "biuf":
        raise TypeError(f"np.{name}: {what} of dtype {values.dtype} are not supported")
    if values.size > _TABLE_LIMIT:
        raise PlanningError(f"np.{name}: {values.size} {what} (every task carries them; at "
                            f"most {_TABLE_LIMIT})")
    return tuple(values.reshape(-1).tolist())


@implements(np.isin)
def isin(element, test_elements, assume_unique=False, invert=False, *, kind=None):
    """Elementwise membership in a small set (NumPy's values; fused into the reads)."""
    if not isinstance(element, LazyArray):  # a NumPy element against a small result
        return np.isin(element, small_values(test_elements, "isin", ""), invert=invert)
    table = tuple(np.unique(np.asarray(_table(test_elements, "isin", "test elements"))).tolist())
    return elemwise("isin", element, test_elements=table, invert=bool(invert))


@implements(np.digitize)
def digitize(x, bins, right=False):
    """Elementwise bin numbers against monotonic ``bins`` (fused into the reads)."""
    table = _table(bins, "digitize", "bins")
    b = np.asarray(table)
    if b.ndim != 1 or not (np.all(np.diff(b) >= 0) or np.all(np.diff(b) <= 0)):
        raise ValueError("bins must be monotonically increasing or decreasing")
    return elemwise("digitize", x, bins=table, right=bool(right))


@implements(np.searchsorted)
def searchsorted(a, v, side="left", sorter=None):
    """On a small sorted 1-D result (computed now): NumPy's answer."""
    values = a if not isinstance(a, LazyArray) else \
        small_values(a, "searchsorted", "search a column's sorted values")
    if isinstance(v, LazyArray):
        v = small_values(v, "searchsorted", "search for a small result's values")
    srt = small_values(sorter, "searchsorted", "") if isinstance(sorter, LazyArray) else sorter
    return np.searchsorted(values, v, side=side, sorter=srt)


def _positions(name: str):
    """np.nonzero / np.flatnonzero / np.argwhere: of a matrix, its nonzero
    elements' flat indices gathered now (:func:`.selection.flat_positions`);
    of a small result, NumPy's in memory."""
    np_func = getattr(np, name)

    def impl(a):
        if isinstance(a, LazyArray) and not a._node.small and a.ndim == 2:
            flat = selection.flat_positions(a)
            if name == "flatnonzero":
                return flat
            rows, cols = np.divmod(flat, a.shape[1])
            return (rows, cols) if name == "nonzero" else np.stack([rows, cols], axis=1)
        return np_func(small_values(a, name, ""))

    impl.__name__ = name
    return impl


for _name in ("nonzero", "flatnonzero", "argwhere"):
    HANDLED[getattr(np, _name)] = _positions(_name)


def _named(name: str, a, axis, run):
    """``run()``; a refusal under the budget of a quantile over all elements
    names the user's call, not its internal passes (the census's fused
    reductions, a histogram); an axis's refusal names the call already."""
    if axis is not None:
        return run()
    with selection.refusal_named(f"np.{name}(a) over all {a.size} elements (axis=None)"):
        return run()


def _quantile(name: str, op: str, scale: float):
    def impl(a, q=None, axis=None, out=None, overwrite_input=False, method="linear",
             keepdims=False, *, weights=None, interpolation=None):
        if out is not None or weights is not None or interpolation is not None:
            raise TypeError(f"np.{name}: out=, weights= and interpolation= are not supported "
                            "on TiledArrays")
        if isinstance(q, LazyArray):  # a small result: its values, now
            q = small_values(q, name, "")
        qv = np.asarray(q, dtype=np.float64) / scale
        # NumPy's result dtype (NEP 50: a Python float q keeps float32 data float32)
        dtype = np.asarray(np_func(np.ones((2, 2), a.dtype), q, axis=0, method=method)).dtype
        return _named(name, a, axis, lambda: statistics.quantile(op, a, qv, axis, method,
                                                                  keepdims, dtype))

    np_func = getattr(np, name)
    impl.__name__ = name
    return impl


for _f, _op, _scale in [(np.quantile, "quantile", 1.0), (np.nanquantile, "nanquantile", 1.0),
                        (np.percentile, "quantile", 100.0),
                        (np.nanpercentile, "nanquantile", 100.0)]:
    HANDLED[_f] = _quantile(_f.__name__, _op, _scale)


def _median(name: str):
    np_func = getattr(np, name)

    def impl(a, axis=None, out=None, overwrite_input=False, keepdims=False):
        """NumPy's median: the mean of the middle one or two (not the 0.5 quantile's lerp)."""
        if out is not None:
            raise TypeError(f"np.{name}: out= is not supported on TiledArrays")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            dtype = np.asarray(np_func(np.ones((2, 2), a.dtype), axis=0)).dtype
        return _named(name, a, axis, lambda: statistics.quantile(name, a, 0.5, axis, "linear",
                                                                  keepdims, dtype))

    impl.__name__ = name
    return impl


HANDLED[np.median], HANDLED[np.nanmedian] = _median("median"), _median("nanmedian")
