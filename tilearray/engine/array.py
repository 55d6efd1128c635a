"""TiledArray: the lazy, NumPy-like array users touch. Its expression half is
:class:`.expr.lazy.LazyArray`; here it is planned (:mod:`.plan`), run
(:mod:`.runtime`) and written (:mod:`.output`)."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
from dask.utils import format_bytes

from .. import _config
from ..errors import PlanningError
from ..storage import ArrayRef
from . import output, runtime
from .expr.lazy import LazyArray
from .expr.nodes import Node, Source, describe, is_big_vector
from .interop import Interop
from .plan.lower import fitted_output_grid, lower
from .plan.types import Output, Plan, Stage

log = logging.getLogger("tilearray")


def _remembered_plan(node: Node, budget) -> Plan:
    """The plan of a factor (R, s, Vt) an earlier run of the same
    factorization on unchanged inputs computed: :meth:`TiledArray.compute`
    returns it with nothing run."""
    stage = Stage("small", f"{node}: computed by an earlier run of the same factorization "
                  "(its Q or U, or another part), on unchanged inputs: nothing to run", 0, 0, 0,
                  outputs={"result": Output("value", ())})
    return Plan(describe(node), tuple(node.shape), str(np.dtype(node.dtype)), budget, (stage,),
                outputs=stage.outputs)


class TiledArray(Interop, LazyArray):
    """A lazy 2-D array over Zarr storage (or an expression of such arrays).

    Build expressions with NumPy syntax (``a @ b``, ``a - a.mean(axis=0)``,
    ``np.sqrt(a)``, ``np.sum(a, axis=0)``); nothing is read until
    :meth:`compute` or :meth:`to_zarr`. Make one with :func:`open`,
    :func:`from_numpy`, :func:`random` or :func:`from_dask`.

    Attributes
    ----------
    shape, dtype, ndim, size, nbytes
        As for a NumPy array (``nbytes`` is the logical size, in bytes).
    stats : RunStats or None
        Measured figures of the last run that produced or computed this array.

    Examples
    --------
    >>> a = ta.open("a.zarr")                        # doctest: +SKIP
    >>> centred = a - a.mean(axis=0)                 # doctest: +SKIP
    >>> cov = (centred.T @ centred).compute()        # doctest: +SKIP
    """

    def __init__(self, node: Node):
        super().__init__(node)
        self.stats: runtime.RunStats | None = None

    # -- running ----------------------------------------------------------------------
    @staticmethod
    def _budget(budget=None, engine=None):
        """``budget``, else the engine's: the current one, or with none
        running, the one compute() would start (planned for without starting it)."""
        if budget is not None:
            return budget
        engine = engine or runtime.current_engine(start=False)
        return engine.budget() if engine is not None else runtime.default_budget()

    def _lower(self, out=None, out_grid=None, skip=(), budget=None, engine=None) -> Plan:
        return lower(self._node, self._budget(budget, engine), out, out_grid, set(skip))

    def plan(self, path=None, *, name="", tile=None, shard=None, engine=None, budget=None):
        """Plan the run without running it (no I/O, no cluster if ``budget`` given).

        Parameters
        ----------
        path, name, tile, shard
            The output :meth:`to_zarr` would write (optional).
        engine : Engine, optional
            Whose budget to plan for; default: the current engine, or, when
            none is running, the default engine :meth:`compute` would start
            (planned for without starting it).
        budget : Budget, optional
            Plan for this budget instead of an engine's.

        Returns
        -------
        Plan
            Stages with tasks, projected peak memory per task, bytes read
            and written, FLOPs and the matmul I/O lower bound.

        Raises
        ------
        PlanningError
            A task cannot fit the budget (the message names the smallest
            budget that would), or ``shard`` is not a multiple of the tile.
        """
        out_grid = None
        out = ArrayRef.from_location(path, name) if path else None
        small = self._node.small or (self.ndim != 2 and not is_big_vector(self._node))
        budget = self._budget(budget, engine)
        if not small and (path or tile or shard):
            out_grid = fitted_output_grid(self._node, tile, shard, budget, out)
        if out is None and output.cached_factor(self._node) is not None:
            return _remembered_plan(self._node, budget)
        # a small result: a worker writes it into ``out``, or compute() brings it back
        return self._lower(out, out_grid, budget=budget)

    def compute(self, *, engine=None) -> np.ndarray | Any:
        """Run and return the result in memory.

        Parameters
        ----------
        engine : Engine, optional
            Where to run; default: the current engine (started if none).

        Returns
        -------
        numpy.ndarray or scalar
            A NumPy scalar for 0-d results (``a.sum()``).

        Raises
        ------
        PlanningError
            The result is larger than ``tilearray.compute.max-result-size``
            (write it with :meth:`to_zarr`), or the plan does not fit.
        """
        n = self._node
        if isinstance(n, Source) and n.grid.n_units == 0:
            return np.zeros(n.shape, n.dtype)
        limit = _config.get_bytes("compute.max-result-size")
        if self.nbytes > limit:
            raise PlanningError(
                f"result of shape {self.shape} {self.dtype} is {format_bytes(self.nbytes)}, "
                f"over the compute limit {format_bytes(limit)}; write it with "
                ".to_zarr(path) (or raise tilearray.compute.max-result-size)"
            )
        cached = output.cached_factor(n)  # computed by the run that wrote its Q / U
        if cached is not None:
            self.stats = runtime.RunStats()
            return cached
        ran = output.commit(n, engine or runtime.current_engine())
        self.stats, values, result = ran.stats, ran.values, ran.plan.result
        if result.kind == "value":
            v = values[0]
            return v[()] if isinstance(v, np.ndarray) and v.ndim == 0 else v
        out = np.empty(self.shape, dtype=self.dtype)
        view = out.reshape(-1, 1) if out.ndim == 1 else out  # a vector: the column (m, 1)
        for (rows, cols), v in zip(result.blocks, values, strict=True):
            view[rows[0] : rows[1], cols[0] : cols[1]] = v
        return out

    def to_zarr(self, path, name="", *, dims=None, tile=None, shard=None, overwrite=False,
                resume=False, engine=None, storage_options=None) -> TiledArray:
        """Run and write the result as a Zarr v3 array.

        Each output I/O unit is written whole by one task and then marked
        done; the array is marked complete only when all are.

        Parameters
        ----------
        path : str, os.PathLike or zarr Store
            Where to write: the array itself, or (with ``name``) the group
            that holds it.
        name : str, optional
            Write the array as member ``name`` of the Zarr group at ``path``
            (created if needed; other members are left alone), so that
            ``xarray.open_zarr(path)`` gives a Dataset with variable ``name``
            once it is complete. Nested names (``"sub/x"``) are allowed;
            absolute names, empty or ``.``/``..`` segments are refused. The
            group must be Zarr format 3 (a format 2 group is refused).
        dims : tuple of str, optional
            Dimension names (``dimension_names``). Default: the names the
            expression carries from its inputs (``a @ b``: a's rows, b's
            columns; ``a.mean(axis=0)``: a's columns) when they fit the
            group, else ``(f"{name}_row", f"{name}_col")`` (``("row",
            "col")`` without a name).
        tile, shard : tuple of int, optional
            Output chunk and I/O unit (shard); ``shard`` must be a multiple
            of ``tile``. Default tile: the tiling of the inputs.
        overwrite : bool
            Replace whatever array is at the target (never a group).
        resume : bool
            Finish an interrupted run of the *same* expression on unchanged
            inputs, skipping units already done (a complete output, matrix
            or reduction, is returned as stored).
        engine : Engine, optional
            Where to run; default: the current engine.
        storage_options : dict, optional
            For an object-store URL (``s3://...``): options of its fsspec
            filesystem (see :func:`tilearray.open`); they travel to the workers.

        Returns
        -------
        TiledArray or numpy.ndarray
            A TiledArray over the output; for a reduction's vector or scalar
            (computed in memory) its NumPy value, also stored.

        Raises
        ------
        StorageError
            Something is already at the target (without ``overwrite`` /
            ``resume``), the target is a group or one of the expression's
            inputs, a resume does not match the stored output (expression,
            inputs, tiling), ``dims`` conflict with the group, an input was
            overwritten since it was opened, or ``name`` is invalid or
            inside a Zarr format 2 group or an array.
        OutputLockedError
            Another live job is writing the same output.
        PlanningError
            The plan does not fit the budget, or ``shard`` is not a multiple
            of the tile.
        ValueError
            Both ``overwrite`` and ``resume`` (refused before anything).

        Examples
        --------
        >>> (a @ b).to_zarr("results.zarr", name="C")      # doctest: +SKIP
        >>> xr.open_zarr("results.zarr").C                 # doctest: +SKIP
        """
        if overwrite and resume:
            raise ValueError("to_zarr: overwrite=True and resume=True contradict each other "
                             "(overwrite starts again, resume keeps what is done); pass one")
        if storage_options is not None:  # the URL's store, configured
            path = ArrayRef.from_location(path, storage_options=storage_options).store
        value, stats = output.write(self, path, tile, shard, overwrite, resume, engine, name,
                                    dims)
        if not isinstance(value, Source):  # a reduction's vector or scalar, also stored
            return value
        out = TiledArray(value)
        out.stats = self.stats = stats  # no task, every unit skipped: already complete
        return out

    # -- display -------------------------------------------------------------------------
    def __repr__(self) -> str:
        n = self._node
        if isinstance(n, Source):
            g, k = n.grid, len(n.shape)  # a vector's grid is the column (n, 1)
            return (f"<TiledArray {str(n.ref)!r} shape={self.shape} dtype={n.dtype} "
                    f"tile={g.tile[:k]} unit={g.unit[:k]} grid={g.tile_grid[:k]} "
                    f"({format_bytes(self.nbytes)})>")
        return f"<TiledArray lazy {n} shape={self.shape} dtype={self.dtype}>"

    def _repr_html_(self) -> str:
        from .display import tiled_html

        return tiled_html(self)



__all__ = ["TiledArray"]
