"""The registry of NumPy functions on TiledArrays (``HANDLED``, which
:meth:`TiledArray.__array_function__` looks functions up in) and the helpers
the modules registering them share: :mod:`.npfuncs` (elementwise functions,
reductions, products, statistics), :mod:`.npshape` (joins, gathers,
reshapes, diagonals, scans), :mod:`.nporder` (sorting, counting, searching,
quantiles)."""

from __future__ import annotations

import numpy as np

from .lazy import LazyArray
from .ops import HANDLED


def implements(*funcs):
    """Register the decorated function for each NumPy function in ``funcs``."""

    def register(impl):
        for f in funcs:
            HANDLED[f] = impl
        return impl

    return register


def small_only(a, name: str, hint: str):
    """``a`` itself when small (in memory), a blocked vector (``x @ w``)
    computed first; a stored matrix is refused."""
    if not isinstance(a, LazyArray):
        raise TypeError(f"np.{name}: expected a TiledArray, got {type(a).__name__}")
    if a._node.small:
        return a
    if a.ndim == 1:
        return np.asarray(a.compute())
    raise TypeError(f"np.{name} of a stored {' x '.join(map(str, a.shape))} matrix is not "
                    f"supported on TiledArrays: {hint}")


def small_values(a, name: str, hint: str) -> np.ndarray:
    """The values of a small result (see :func:`small_only`), computed now."""
    a = small_only(a, name, hint)
    return a if isinstance(a, np.ndarray) else np.asarray(a.compute())


def given(**kwargs) -> dict:
    """The keywords a caller set (NumPy's newer ones, ``stable=`` 2.0,
    ``sorted=`` 2.3, passed only when set: older NumPy lacks them)."""
    return {k: v for k, v in kwargs.items() if v is not None}
