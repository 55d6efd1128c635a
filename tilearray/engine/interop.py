"""A TiledArray handed to NumPy, Python scalars, dask and xarray: the
conversions that compute (``np.asarray(a)``, ``float(a.sum())``) or wrap the
stored data (``a.to_dask()``, ``a.to_xarray()``)."""

from __future__ import annotations

import numpy as np

from ..errors import PlanningError
from .expr.nodes import Source


class Interop:
    """Conversions of :class:`~tilearray.engine.array.TiledArray` (a mixin: it
    relies on ``compute()``, ``shape``, ``size``, ``dtype``, ``dims`` and ``_node``)."""

    def __array__(self, dtype=None, copy=None):
        x = np.asarray(self.compute())
        return x.astype(dtype, copy=False) if dtype is not None else x

    def _scalar(self, kind):
        if self.size != 1:
            raise TypeError(f"only size-1 arrays can be converted to Python scalars; this "
                            f"TiledArray has shape {self.shape}")
        return kind(np.asarray(self.compute()).reshape(()))

    def __float__(self):
        return self._scalar(float)

    def __int__(self):
        return self._scalar(int)

    def __complex__(self):
        return self._scalar(complex)

    def __index__(self):
        if self.dtype.kind not in "biu":
            raise TypeError(f"only integer arrays can be used as an index, not {self.dtype}")
        return self._scalar(int)

    def __round__(self, ndigits=None):
        """``round(a.mean(), 3)``: a size-1 result computed and rounded as
        NumPy's scalar (an int without ``ndigits``); a larger array's round
        is ``np.round(a, ndigits)``, lazy, as dask's."""
        if self.size != 1:
            return np.round(self, 0 if ndigits is None else ndigits)
        return self._scalar(lambda v: round(v[()], ndigits))

    def __format__(self, spec: str) -> str:
        """``f"{a.mean():.3f}"``: a size-1 result computed and formatted as NumPy's scalar."""
        if not spec:
            return str(self)
        if self.size != 1:
            raise TypeError(f"unsupported format string {spec!r} for a TiledArray of shape "
                            f"{self.shape} (only size-1 results format as numbers)")
        return format(np.asarray(self.compute()).reshape(())[()], spec)

    def item(self, *args):
        """The single element as a Python scalar, like :meth:`numpy.ndarray.item` (computes)."""
        if args:
            return np.asarray(self.compute()).item(*args)
        return self._scalar(lambda v: v.item())

    def __bool__(self):
        if self.size != 1:
            raise ValueError(
                f"the truth value of a TiledArray of shape {self.shape} is ambiguous; use "
                ".any() or .all() (and float()/bool() on their result)"
            )
        return self._scalar(bool)

    def to_dask(self):
        """A dask array over the stored data (stored arrays only).

        Raises
        ------
        PlanningError
            For an expression: call :meth:`to_zarr` first.
        """
        return self._stored_dask("to_dask")

    def _stored_dask(self, what: str):
        import dask.array as da

        if not isinstance(self._node, Source):
            raise PlanningError(f"{what}() needs a stored array, not an expression: store it "
                                f"first (x.to_zarr(path).{what}())")
        return da.from_zarr(self._node.ref.open())

    def to_xarray(self):
        """An :class:`xarray.DataArray` over the stored data (lazy, dask-backed),
        with the stored dimension names and the array's name: the member name
        in a group (``"C"``), else the file name without ``.zarr``
        (``"c.zarr"`` -> ``"c"``).

        Raises
        ------
        PlanningError
            For an expression: call :meth:`to_zarr` first.
        """
        import xarray as xr

        x = self._stored_dask("to_xarray")
        dims = self.dims or tuple(f"dim_{i}" for i in range(self.ndim))
        return xr.DataArray(x, dims=dims, name=self._node.ref.short_name)
