"""``tilearray.linalg``: norms built from fused elementwise ops and reductions."""

from __future__ import annotations

import numpy as np

from .engine.array import TiledArray
from .engine.expr.ops import HANDLED, _elemwise, _reduce
from .errors import PlanningArgumentTypeError, PlanningError


def norm(x: TiledArray, ord=None, axis=None, keepdims=False) -> TiledArray:
    """Matrix or vector norm, like :func:`numpy.linalg.norm` (lazy).

    Built from fused elementwise operations and tree reductions, so the
    matrix is read once. ``np.linalg.norm(x, ...)`` on a TiledArray calls it.

    Parameters
    ----------
    x : TiledArray
    ord : {None, "fro", 1, -1, inf, -inf, 0, 2, float}
        ``axis=None`` or two axes: Frobenius (``None``/``"fro"``), 1, -1,
        inf, -inf matrix norms (2, -2 and ``"nuc"`` need an SVD and are
        refused). ``axis=0|1``: vector norms of each column / row:
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
        return _elemwise("sqrt", _reduce("sum", x * x, None, keepdims, 0))
    axes = _norm_axes(axis, x.ndim)
    a = abs(x)
    if len(axes) == 2:  # a matrix norm over (row axis, column axis), as NumPy
        row, col = axes
        if ord in (None, "fro"):
            return _elemwise("sqrt", _reduce("sum", x * x, None, keepdims, 0))
        if ord in (1, -1, np.inf, -np.inf):
            # 1: the largest column sum (summed along the row axis); inf: row sums
            sums = _reduce("sum", a, row if ord in (1, -1) else col, True, 0)
            return _reduce("max" if ord > 0 else "min", sums, None, keepdims, 0)
        if ord in (2, -2, "nuc"):
            raise PlanningError(
                f"norm: ord={ord!r} with axis={axis!r} (a matrix norm) is not supported out "
                "of core (use None/'fro', 1, -1, inf or -inf)"
            )
        raise PlanningError(f"norm: invalid norm order {ord!r} for matrices")
    axis = axes[0]
    if ord in (None, 2):
        return _elemwise("sqrt", _reduce("sum", x * x, axis, keepdims, 0))
    if ord == 1:
        return _reduce("sum", a, axis, keepdims, 0)
    if ord == np.inf:
        return _reduce("max", a, axis, keepdims, 0)
    if ord == -np.inf:
        return _reduce("min", a, axis, keepdims, 0)
    if ord == 0:
        return _reduce("sum", (x != 0).astype(x.dtype), axis, keepdims, 0)
    if isinstance(ord, int | float):
        return _elemwise("power", _reduce("sum", a**ord, axis, keepdims, 0), 1.0 / ord)
    raise PlanningError(f"norm: invalid norm order {ord!r} for vectors")


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
