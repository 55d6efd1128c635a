"""``tilearray.linalg``: norms built from fused elementwise ops and reductions."""

from __future__ import annotations

import numpy as np

from .engine.array import TiledArray
from .engine.expr.ops import HANDLED, _elemwise, _reduce
from .errors import PlanningError


def norm(x: TiledArray, ord=None, axis=None, keepdims=False) -> TiledArray:
    """Matrix or vector norm, like :func:`numpy.linalg.norm` (lazy).

    Built from fused elementwise operations and tree reductions, so the
    matrix is read once. ``np.linalg.norm(x, ...)`` on a TiledArray calls it.

    Parameters
    ----------
    x : TiledArray
    ord : {None, "fro", 1, -1, inf, -inf, 0, 2, float}
        ``axis=None``: Frobenius (``None``/``"fro"``), 1, -1, inf, -inf
        matrix norms (the spectral norm ``2`` needs an SVD and is refused).
        ``axis=0|1``: vector norms of each column / row: ``None``/2, 1, inf,
        -inf, 0 (count of non-zeros) and any other p.
    axis : {None, 0, 1}
    keepdims : bool

    Returns
    -------
    TiledArray
        A small lazy result (0-d for ``axis=None``): ``.compute()`` or
        ``float(...)``.

    Raises
    ------
    PlanningError
        An unsupported ``ord``.

    Examples
    --------
    >>> float(ta.linalg.norm(a))                       # doctest: +SKIP
    >>> ta.linalg.norm(a, axis=0).compute()            # column norms  # doctest: +SKIP
    """
    if x.dtype.kind != "f":  # as NumPy: integers and booleans are measured in float64
        x = x.astype("float64")
    a = abs(x)
    # real data (complex is refused): |x|^2 = x*x, without an abs temporary,
    # so a norm fits wherever (x * x).sum() does
    if axis is None:
        if ord in (None, "fro"):
            r = _elemwise("sqrt", _reduce("sum", x * x, None, keepdims, 0))
        elif ord in (1, -1, np.inf, -np.inf):
            along = 0 if ord in (1, -1) else 1
            sums = _reduce("sum", a, along, True, 0)
            r = _reduce("max" if ord > 0 else "min", sums, None, keepdims, 0)
        else:
            raise PlanningError(
                f"norm: ord={ord!r} with axis=None is not supported out of core "
                "(use None/'fro', 1, -1, inf or -inf)"
            )
        return r
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
    raise PlanningError(f"norm: invalid ord {ord!r}")


HANDLED[np.linalg.norm] = norm  # np.linalg.norm(a) on a TiledArray
