"""Exact quantiles and histograms over all the elements of a matrix
(``np.median(X)``, ``np.percentile(X, 99)``, ``np.histogram(X)``): computed
now, in a few passes over the matrix, never holding it.

One pass finds the NaN and infinity counts and the finite range. A
histogram of :data:`BINS` bins over an interval (a pass, each block binned
by NumPy against the same edges) tells which bin holds the order statistic
of rank ``r`` and its rank inside that bin; the bin becomes the interval,
until it holds at most :data:`SELECT_LIMIT` elements, which one more pass
gathers and NumPy sorts. Binning compares each element's float64 value with
the edges exactly, so every pass puts an element on the same side of every
edge: the counts add up and the rank found is exact. Continuous data take
one histogram pass (a billion values spread over 4096 bins leave a few
hundred thousand); ties stop early (a bin whose smallest and largest values
are equal holds the answer).
"""

from __future__ import annotations

import contextlib
import warnings

import numpy as np

from ...errors import PlanningError
from ...graphs.npfuncs import counts_dtype
from .nodes import Full, Select, Values
from .ops import ExprBase, as_node, held, wrap_like

BINS = 4096
"""Bins of each histogram pass."""
SELECT_LIMIT = 1 << 22
"""At most this many elements (32 MiB of float64) are gathered in one task."""
METHODS = ("linear", "lower", "higher", "midpoint", "nearest")
"""The ``method=`` of quantiles over more than :data:`SELECT_LIMIT` elements
(at most that many: every method, NumPy on the gathered elements)."""


def _compute(node) -> np.ndarray:
    return np.asarray(node.compute())


def _values(a, lo, hi, closed: bool, edges=(), count: int = 0) -> np.ndarray:
    """One pass over ``a``: the histogram of its elements in the interval
    over ``edges``, or (no edges) those ``count`` elements."""
    n = as_node(a)
    shape, dtype = ((len(edges) + 1,), counts_dtype(n.dtype, lo, hi)) if edges else \
        ((count,), n.dtype)
    return _compute(wrap_like(a, Values(shape, dtype, n, lo, hi, closed, tuple(edges))))


def _exact_ints(dtype) -> bool:
    """Integers are binned as integers (int64 beyond 2**53 has no exact float)."""
    return np.dtype(dtype).kind in "iu"


def _edges(lo, hi, ints: bool) -> tuple:
    """At most :data:`BINS` bins from ``lo`` to ``hi``: integer edges for
    integers, else ``np.linspace`` (split at 0 when ``hi - lo`` overflows)."""
    if ints:  # [lo, hi) half open: bins at least 1 wide, the last ends at hi
        return tuple(sorted({lo + (hi - lo) * k // BINS for k in range(BINS + 1)}))
    if np.isfinite(hi - lo):
        return tuple(np.linspace(lo, hi, BINS + 1).tolist())
    half = BINS // 2
    return tuple(np.linspace(lo, 0.0, half + 1).tolist()[:-1] +
                 np.linspace(0.0, hi, half + 1).tolist())


class _Ranks:
    """Order statistics of the elements of ``a`` (NaNs and infinities left
    out: counted apart) by rank, with the passes shared between ranks."""

    def __init__(self, a, n_neg_inf: int, n_finite: int, lo, hi):
        self.a, self.n_neg_inf, self.n_finite = a, n_neg_inf, n_finite
        self.lo, self.hi = lo, hi
        self.ints = _exact_ints(a.dtype)
        self._passes: dict = {}

    def run(self, lo, hi, closed, edges=(), count=0):
        """:func:`_values`, each pass once (ranks share them)."""
        key = (lo, hi, closed, edges)
        if key not in self._passes:
            self._passes[key] = _values(self.a, lo, hi, closed, edges, count)
        return self._passes[key]

    def __call__(self, r: int):
        """The element of rank ``r`` (0-based, in sorted order: -inf first,
        +inf after the finite ones)."""
        if r < self.n_neg_inf:
            return -np.inf
        r -= self.n_neg_inf
        if r >= self.n_finite:
            return np.inf
        lo, hi, closed, count = self.lo, self.hi, True, self.n_finite
        if self.ints:  # integers: [lo, hi + 1), every bin of a split strictly narrower
            hi, closed = hi + 1, False
        for _ in range(4096):  # each split narrows: a bound, never met
            if count <= SELECT_LIMIT:
                break
            edges = _edges(lo, hi, self.ints)
            res = self.run(lo, hi, closed, edges)
            counts, smallest, largest = res[:-2], res[-2], res[-1]
            if smallest == largest:  # every element of the interval is equal
                return smallest
            cum = np.cumsum(counts)
            t = int(np.searchsorted(cum, r, side="right"))
            r -= int(cum[t - 1]) if t else 0
            count = int(counts[t])
            # NumPy's bins are [e_t, e_t+1), the last one closed
            lo, hi, closed = edges[t], edges[t + 1], closed and t == len(edges) - 2
        else:
            raise PlanningError(f"quantile: rank {r} not isolated in [{lo}, {hi}] ({count} "
                                "elements) after 4096 histogram passes")
        values = self.run(lo, hi, closed, count=count)
        if len(values) != count:
            raise PlanningError(f"quantile: the interval [{lo}, {hi}] held {len(values)} "
                                f"elements, the histogram counted {count}: did the array "
                                "change while it was read?")
        return np.partition(values, r)[r]


def _census(a):
    """``(NaNs, -infs, +infs, finite count, finite min, finite max)``: one
    pass (integers: their exact min and max)."""
    if _exact_ints(a.dtype) or a.dtype == np.bool_:
        lo, hi = _compute(np.stack([a.min(), a.max()])).tolist()
        return 0, 0, 0, a.size, lo, hi
    finite = np.where(np.isfinite(a), a, np.nan)
    parts = [np.isnan(a).sum(), (a == -np.inf).sum(), (a == np.inf).sum(),
             np.nanmin(finite), np.nanmax(finite)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all NaN: nanmin warns
        n_nan, n_neg, n_pos, lo, hi = _compute(np.stack(parts)).tolist()
    n_nan, n_neg, n_pos = int(n_nan), int(n_neg), int(n_pos)
    return n_nan, n_neg, n_pos, a.size - n_nan - n_neg - n_pos, lo, hi


def quantile(op: str, a, q: np.ndarray, method: str, dtype) -> ExprBase:
    """Exact ``np.quantile(a, q)`` / ``np.nanquantile`` (``op``; ``median``
    and ``nanmedian``: NumPy's median, the mean of the two middle elements)
    over all elements of a stored matrix (``q`` in [0, 1], scalar or 1-D),
    computed now; the result wraps NumPy's value (``float()``,
    ``.compute()`` give it)."""
    median = op.endswith("median")
    n_nan, n_neg, n_pos, n_fin, lo, hi = _census(a)
    skip_nan = op.startswith("nan")
    n = a.size - (n_nan if skip_nan else 0)
    qs = np.atleast_1d(q)
    in_dtype = as_node(a).dtype
    if (not skip_nan and n_nan) or n == 0:
        if n == 0:
            warnings.warn("All-NaN slice encountered", RuntimeWarning, stacklevel=4)
        out = np.full(qs.shape, np.nan, dtype=dtype)
    elif n <= SELECT_LIMIT:  # the elements gathered: NumPy's answer, for any method
        every = (lo, hi) if _exact_ints(a.dtype) else (-np.inf, np.inf)  # NaNs never
        values = _values(a, *every, True, count=n)
        if median:
            out = np.asarray([np.median(values)], dtype=dtype)
        else:
            out = np.asarray(np.quantile(values, qs if np.ndim(q) else qs[0], method=method),
                             dtype=dtype).reshape(-1)
    else:
        if method not in METHODS:
            raise PlanningError(f"np.{op}: method={method!r} over all {a.size} elements is not "
                                f"supported (more than {SELECT_LIMIT}): use one of {METHODS}, "
                                "or an axis")
        ranks = _Ranks(a, n_neg, n_fin, lo, hi)
        if median:  # NumPy's mean of the middle one or two, in its dtype rules
            mid = [ranks(n // 2)] if n % 2 else [ranks(n // 2 - 1), ranks(n // 2)]
            out = np.asarray([np.median(np.asarray(mid).astype(in_dtype))], dtype=dtype)
        else:
            out = np.asarray([_one(ranks, n, float(p), method, in_dtype, np.ndim(q) > 0)
                              for p in qs], dtype=dtype)
    return held(a, out if np.ndim(q) and not median else out[0])


def _one(ranks, n: int, p: float, method: str, in_dtype, q_array: bool):
    """Quantile ``p`` of ``n`` sorted elements from their order statistics:
    NumPy's own ``np.quantile`` of the two around its virtual index (``q``
    given as an array or a scalar, as NumPy's result dtype depends on it)."""
    h = (n - 1) * p
    if method == "nearest":
        return ranks(int(np.around(h)))
    prev = int(np.floor(h))
    pair = np.asarray([ranks(prev), ranks(min(prev + 1, n - 1))]).astype(in_dtype)
    frac = h - prev
    return np.quantile(pair, np.asarray([frac]) if q_array else frac, method=method).reshape(-1)[0]


def histogram(a, bins=10, range=None, density=None):  # noqa: A002
    """``np.histogram`` of all elements of a stored matrix, computed now:
    ``(counts, bin_edges)`` as NumPy (``bins`` a count or edges; the range,
    when not given, from a first pass; edges in the data's float dtype, as
    NumPy's)."""
    if isinstance(bins, str):
        raise PlanningError(f"np.histogram: bins={bins!r} (estimated from the data) is not "
                            "supported on a stored matrix; give a number of bins or edges")
    dt = as_node(a).dtype
    sample = np.empty(0, dtype=dt if dt.kind == "f" else np.float64)
    if a.size == 0:
        return np.histogram(sample, bins=bins, range=range, density=density)
    if range is None and np.ndim(bins) == 0:
        n_nan, n_neg, n_pos, _, lo, hi = _census(a)
        if n_nan or n_neg or n_pos or not np.isfinite(lo):  # NumPy's message, its min / max
            lo = np.nan if n_nan or not np.isfinite(lo) else -np.inf if n_neg else lo
            hi = np.nan if n_nan or not np.isfinite(hi) else np.inf if n_pos else hi
            raise ValueError(f"autodetected range of [{lo}, {hi}] is not finite")
        sample = np.asarray([lo, hi], dtype=sample.dtype)
    edges = np.histogram_bin_edges(sample, bins=bins, range=range)
    counts = _values(a, edges[0].item(), edges[-1].item(), True,
                     tuple(edges.tolist()))[:-2].astype(np.intp)
    if density:
        db = np.diff(edges).astype(np.float64)
        return counts / db / counts.sum(), edges
    return counts, edges


def masked(a, mask) -> ExprBase:
    """``a[mask]`` for a boolean ``mask`` (lazy, or a NumPy array sent to
    the tasks) of ``a``'s shape, computed now: a pass counting the selected
    elements, then one reading both (a stored array read by both, once) and
    gathering them in C order. A small 1-D result (refused by the planner
    when it does not fit in a task); NumPy's IndexError for another shape
    or dtype."""
    if np.dtype(getattr(mask, "dtype", None)) != np.bool_:
        raise IndexError(f"a 2-D index must be a boolean mask, got dtype {mask.dtype} (integer "
                         "positions: a[rows][:, cols] gives the block of those rows and "
                         "columns, np.ix_'s)")
    for ax, (size, msize) in enumerate(zip(a.shape, np.shape(mask), strict=True)):
        if size != msize:
            raise IndexError(f"boolean index did not match indexed array along axis {ax}; "
                             f"size of axis is {size} but size of corresponding boolean axis "
                             f"is {msize}")
    if isinstance(mask, np.ndarray):  # in memory: an operand of the pass, as a Constant
        mask = held(a, mask)
    return held(a, _selected(a, mask, as_node(a).dtype))


def _selected(a, mask, dtype, positions: bool = False) -> np.ndarray:
    """The elements of ``a`` where the boolean ``mask`` (of its shape) is
    True in C order, or with ``positions`` their flat indices: a pass
    counting them, then the :class:`Select` pass (none for an empty one)."""
    if 0 in a.shape:
        return np.empty(0, dtype)
    count = int(_compute(mask.sum()))
    if count == 0:
        return np.empty(0, dtype)
    return _compute(wrap_like(a, Select((count,), np.dtype(dtype), as_node(a), as_node(mask),
                                        positions)))


def flat(a, what: str = "a.ravel()", along_axis: bool = False) -> ExprBase:
    """All the elements of a matrix in C order (``a.ravel()``), computed now:
    one pass, joined in one task (refused by the planner when they do not
    fit it); a small 1-D result. A refusal names ``what`` flattened the
    matrix (the user's call, not the internal selection) and, for an
    operation that also works along an axis (``along_axis``), that axis=0
    or 1 would not gather it."""
    n = as_node(a)
    if 0 in n.shape:
        return held(a, np.empty(0, n.dtype))
    every = Full(tuple(n.shape), np.dtype(bool), True)  # every element: no count pass
    hint = "; pass axis=0 or axis=1 to work along its columns or rows instead" \
        if along_axis else ""
    with refusal_named(f"{what} gathers all {a.size} elements of the {n.shape[0]} x "
                       f"{n.shape[1]} matrix into one task (NumPy's flattened array){hint}"):
        return held(a, _compute(wrap_like(a, Select((a.size,), n.dtype, n, every))))


@contextlib.contextmanager
def refusal_named(call: str):
    """A refusal under the budget (a plain :class:`PlanningError`) of the work
    inside, named by the user's ``call`` before its own message: the
    internal passes it names (a selection of every element, a fused census)
    are not what the user wrote."""
    try:
        yield
    except PlanningError as e:
        if type(e) is not PlanningError:  # not a refusal under the budget
            raise
        raise PlanningError(f"{call}: {e}") from None


def flat_positions(a) -> np.ndarray:
    """``np.flatnonzero(a)`` of a matrix, computed now: a pass counting the
    nonzero (True) elements, then one gathering their flat indices in C
    order (refused by the planner when they do not fit a task)."""
    mask = a if as_node(a).dtype == np.bool_ else a != 0
    return _selected(mask, mask, np.intp, positions=True)
