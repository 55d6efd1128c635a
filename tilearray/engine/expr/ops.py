"""Building expression nodes: operands checked, shapes broadcast, result
dtypes inferred as NumPy would, with a clear error naming the operands.
Nothing is read. The builders take lazy arrays (any :class:`ExprBase`),
scalars or small NumPy operands and return a lazy array of the type of
their first array operand (a TiledArray)."""

from __future__ import annotations

import warnings

import numpy as np
from dask.base import tokenize
from dask.utils import format_bytes

from ...errors import (
    PlanningArgumentError,
    PlanningArgumentTypeError,
    PlanningAxisError,
    PlanningError,
)
from ...graphs.reduction import NO_IDENTITY, OPS, VARIANCES
from ...graphs.spec import func
from .nodes import Constant, Elemwise, Full, MatMul, MatVec, Node, Reduce, is_big_vector


class ExprBase:
    """A lazy array: the wrapper of one expression node (``as_node``)."""

    __array_priority__ = 100

    def __init__(self, node: Node):
        self._node = node


def wrap_like(x, node: Node):
    """``node`` wrapped like the lazy array ``x`` (the same type)."""
    return type(x)(node)


def _wrap(args, node: Node):
    """``node`` wrapped like the first lazy array among ``args``."""
    for a in args:
        if isinstance(a, ExprBase):
            return wrap_like(a, node)
    raise TypeError("an expression needs at least one TiledArray operand")


def as_node(x):
    if isinstance(x, ExprBase):
        return x._node
    if isinstance(x, np.ndarray):
        return as_constant(x)
    return x


MATRIX_OPERAND_BYTES = 32 * 2**20
"""A NumPy matrix operand (``G + lam * np.eye(p)``) is held whole by every
task that uses it: up to this size (a 2048² float64 matrix); a larger one
must be stored (``ta.from_numpy(x, path)``)."""


def as_constant(x: np.ndarray):
    """A NumPy operand: a 0-d array is a scalar; a row or column vector is
    broadcast like a reduction's result; a matrix of the expression's shape
    (up to :data:`MATRIX_OPERAND_BYTES`) is sliced like the expression."""
    if x.ndim == 0:
        return x[()]
    if x.ndim > 2:
        raise TypeError(
            f"a NumPy array of shape {x.shape} cannot be an operand of a TiledArray "
            "expression: tilearray arrays are 1-D or 2-D")
    if x.ndim == 2 and 1 not in x.shape and x.nbytes > MATRIX_OPERAND_BYTES:
        raise TypeError(
            f"a NumPy matrix of shape {x.shape} ({format_bytes(x.nbytes)}) is too large to "
            "be an in-memory operand of a TiledArray expression (every task using it would "
            f"hold it whole; the limit is {format_bytes(MATRIX_OPERAND_BYTES)}): store it "
            "with ta.from_numpy(x, path) first")
    if x.dtype.kind not in "biuf":
        raise TypeError(f"a NumPy operand of dtype {x.dtype} is not supported; tilearray "
                        "handles bool, integer and floating-point values")
    value = np.array(x, copy=True)  # later changes to the caller's array do not leak in
    return Constant(tuple(value.shape), value.dtype, value, tokenize(value))


def _sample(x):
    if isinstance(x, Node):
        return np.ones((1,) * x.ndim, dtype=x.dtype)
    return x


def elemwise(name: str, *args, **kwargs) -> ExprBase:
    # a list operand is NumPy's np.asarray(list)
    nodes = [as_node(np.asarray(a) if isinstance(a, list | tuple) else a) for a in args]
    for a in nodes:
        _check_operand(a, name)
        if isinstance(a, complex | np.complexfloating):
            raise PlanningError(
                f"{name}: complex values are not supported (got {a!r}); tilearray handles "
                "bool, integer and floating-point matrices"
            )
    shapes = [a.shape for a in nodes if isinstance(a, Node)]
    try:
        shape = np.broadcast_shapes(*shapes)
    except ValueError:
        raise PlanningArgumentError(
            f"{name}: operands could not be broadcast together with shapes "
            + " and ".join(str(s) for s in shapes)
        ) from None
    for i, a in enumerate(nodes):  # a lazy column (m, 1) / row (1, n) against a matrix:
        if isinstance(a, Node) and not a.small and a.ndim == 2 == len(shape) and \
                a.shape != shape and 1 in a.shape:  # held in memory, like a[:, j]
            ax = 1 if a.shape[1] == 1 else 0
            nodes[i] = as_node(build_reduction("max", _wrap(args, a), ax, True, 0))
    tiled = [a for a in nodes if isinstance(a, Node) and not a.small]
    for a in tiled:
        if a.shape != shape:
            raise PlanningArgumentError(
                f"{name}: cannot broadcast stored array of shape {a.shape} to {shape}; "
                "only reductions (vectors, scalars) broadcast against matrices"
            )
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            dtype = np.asarray(func(name)(*[_sample(a) for a in nodes], **kwargs)).dtype
        except TypeError as e:
            raise PlanningArgumentTypeError(f"{name}: unsupported for dtypes "
                                f"{[str(a.dtype) for a in nodes if isinstance(a, Node)]}: {e}") from None
    if dtype.kind not in "biuf":
        raise PlanningError(f"{name}: the result dtype {dtype} is not supported; tilearray "
                            "handles bool, integer and floating-point matrices")
    return _wrap(args, Elemwise(shape, dtype, name, tuple(nodes), tuple(sorted(kwargs.items()))))


def nan_as(a, fill):
    """``a`` with its NaNs replaced by ``fill`` (lazy, fused into the reads);
    ``a`` itself when its dtype has no NaNs."""
    if np.dtype(a.dtype).kind not in "fc":
        return a
    return elemwise("where", elemwise("isnan", a), np.asarray(fill, a.dtype)[()], a)


def _check_operand(a, name: str) -> None:
    """Refuse what cannot be an elementwise operand, with a TypeError like NumPy's."""
    if not isinstance(a, Node) and not np.isscalar(a) and not isinstance(a, np.dtype | type):
        raise TypeError(f"{name}: operands must be TiledArrays, scalars, NumPy arrays or "
                        f"lists (a matrix up to {format_bytes(MATRIX_OPERAND_BYTES)}), got "
                        f"{type(a).__name__}")


HANDLED: dict = {}
"""NumPy function -> ExprBase implementation, for ``__array_function__``
(filled by :mod:`.npfuncs` and ``tilearray.linalg``)."""


DTYPE_OPS = frozenset({"sum", "prod", "mean", "var", "std", "nansum", "nanmean", "nanvar",
                       "nanstd"})
"""Reductions that take NumPy's ``dtype=`` (the accumulator and result type)."""


INITIAL = {"sum": "add", "prod": "multiply", "max": "maximum", "min": "minimum",
           "nansum": "add", "nanmax": "fmax", "nanmin": "fmin"}
"""Reductions taking NumPy's ``initial=``: the ufunc combining their value with it."""


def held(a, value) -> ExprBase:
    """``value`` (computed) as a small TiledArray like ``a``."""
    value = np.asarray(value)
    return wrap_like(a, Constant(tuple(value.shape), value.dtype, value, tokenize(value)))


def with_correction(ddof, correction):
    """NumPy 2's ``correction=`` (the Array API's name of ``ddof``): it is the
    ddof when given, and refused beside a nonzero ``ddof``, as NumPy does."""
    if correction is None:
        return ddof
    if ddof != 0:
        raise ValueError("ddof and correction can't be provided simultaneously.")
    return correction


def reduce_initial(op, x, axis=None, keepdims=False, dtype=None, initial=None) -> ExprBase:
    """``op`` over ``axis`` with NumPy's ``initial=`` (``op`` in :data:`INITIAL`):
    the reduction combined with ``initial`` elementwise; a zero-size array's,
    which reads nothing, is NumPy's own (``initial`` itself where max / min
    have no identity)."""
    if initial is None:
        return reduce_as(op, x, axis, keepdims, 0, dtype)
    n = as_node(x)
    if 0 in n.shape:
        kw = {} if dtype is None else {"dtype": dtype}
        return held(x, getattr(np, op)(np.empty(n.shape, n.dtype), axis=axis,
                                       keepdims=keepdims, initial=initial, **kw))
    res = reduce_as(op, x, axis, keepdims, 0, dtype)
    return elemwise(INITIAL[op], res, np.asarray(initial).astype(res.dtype)[()])


def reduce_as(op, x, axis=None, keepdims=False, ddof=0, dtype=None) -> ExprBase:
    """``op`` over ``axis`` with NumPy's ``dtype=``: the elements are cast to
    ``dtype`` and the result is of ``dtype`` (``mean(dtype=int)`` truncates,
    ``sum(dtype=int8)`` wraps, like NumPy)."""
    if dtype is None:
        return build_reduction(op, x, axis, keepdims, ddof)
    if op not in DTYPE_OPS:
        raise PlanningError(f"{op}: dtype= is not an argument of numpy.{op}")
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise PlanningError(f"{op}: dtype={dtype!r} is not a NumPy dtype") from None
    if dt.kind not in "biuf":
        raise PlanningError(f"{op}: dtype={dt} is not supported; tilearray handles bool, "
                            "integer and floating-point dtypes")
    if op in VARIANCES and dt.kind != "f":
        raise PlanningError(f"{op}: dtype={dt} is not supported; use a floating-point dtype "
                            "(NumPy computes integer variances from truncated means)")
    if op == "nanmean" and dt.kind != "f" and as_node(x).dtype.kind == "f":
        raise PlanningError(f"nanmean: dtype={dt} is not floating-point while the input is "
                            f"{as_node(x).dtype} (NumPy refuses it too)")
    if op in ("mean", "nanmean") and dt.kind != "f":
        # NumPy: the sum accumulates in dtype (wrapping), then is divided and cast back
        total = reduce_as("sum", x, axis, keepdims, 0, dt)
        count = int(np.prod(as_node(x).shape)) // max(int(np.prod(total.shape)), 1)
        if not count:
            raise PlanningError(f"{op}: mean of an empty selection with dtype={dt} (NumPy "
                                "gives NaN, which dtype cannot hold)")
        return (total / count).astype(dt)
    res = build_reduction(op, wrap_like(x, as_node(x)).astype(dt), axis, keepdims, ddof)
    return res if res.dtype == dt else res.astype(dt)


def build_reduction(op, x, axis, keepdims, ddof) -> ExprBase:
    n = as_node(x)
    if op not in OPS:
        raise PlanningError(f"unknown reduction {op!r}; choose from {', '.join(OPS)}")
    if op in ("nanvar", "nanstd", "nanargmin", "nanargmax") and n.dtype.kind != "f":
        op = op[3:]  # no NaN to skip: NumPy's nanvar is var there (inf where dof <= 0)
    if n.ndim == 0 and isinstance(axis, int | np.integer) and not isinstance(axis, bool) \
            and axis in (0, -1) and op not in ("mean", "var", "std"):
        axis = None  # NumPy's ufunc reductions accept axis 0 / -1 of a 0-d array
    if isinstance(axis, tuple | list) and "arg" not in op:  # NumPy's tuple of axes
        axes = {int(a) % n.ndim if isinstance(a, int | np.integer) and
                not isinstance(a, bool) and -n.ndim <= a < n.ndim else None
                for a in axis}
        if None in axes or len(axes) != len(axis):
            raise PlanningAxisError(f"{op}: axis {tuple(axis)!r} is out of bounds or repeated for "
                                f"shape {n.shape}")
        axis = None if len(axes) == n.ndim else (axes.pop() if axes else "none")
        if axis == "none":
            raise PlanningError(f"{op}: axis=() (reduce nothing) is not supported")
    if axis is not None:
        if isinstance(axis, bool) or not isinstance(axis, int | np.integer):
            # NumPy: TypeError; not 'out of bounds' for axis="0", nor axis 1 for True
            raise PlanningError(f"{op}: axis must be an integer, a tuple of them or None, "
                                f"got {axis!r} ({type(axis).__name__})")
        if not -n.ndim <= axis < n.ndim:
            raise PlanningAxisError(f"{op}: axis {axis!r} is out of bounds for shape {n.shape}")
        axis = int(axis) % n.ndim
    if op in NO_IDENTITY:
        red = n.shape if axis is None else (n.shape[axis],)
        if 0 in red:
            raise PlanningError(
                f"{op}: zero-size array of shape {n.shape} along axis {axis} has no identity"
            )
    sample = np.ones((2,) * n.ndim, dtype=n.dtype)
    kw = {"ddof": ddof} if op in VARIANCES else {}
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = np.asarray(getattr(np, op)(sample, axis=axis, keepdims=keepdims, **kw))
    if axis is None:
        shape = (1,) * n.ndim if keepdims else ()
    else:
        shape = tuple(1 if i == axis else s for i, s in enumerate(n.shape)) if keepdims else \
            tuple(s for i, s in enumerate(n.shape) if i != axis)
    ddof = int(ddof) if float(ddof).is_integer() else float(ddof)  # NumPy takes ddof=0.5
    return wrap_like(x, Reduce(shape, res.dtype, op, n, axis, bool(keepdims), ddof))


def matmul(a, b) -> ExprBase:
    """Matrix product ``a @ b`` (lazy).

    Two 2-D TiledArrays: planned as streaming output blocks that accumulate
    K-panels, sized to the budget; the contraction is split and tree-summed
    when the output has too few blocks (``x.T @ x``). With one small operand
    -- a NumPy vector or thin matrix, a reduction's result, a 1-D array, a
    product of that kind (``x.T @ (x @ w)``) -- one pass over the blocks of
    the other (:class:`~.nodes.MatVec`): ``x @ w`` maps over x's row
    blocks, ``v @ x`` sums partial products over them. The small operand
    goes to the workers once and must fit in a task with its block (else
    the plan refuses: store it with ``ta.from_numpy``). Same as ``a @ b``,
    ``np.matmul(a, b)`` and ``np.dot(a, b)``.

    Parameters
    ----------
    a, b : TiledArray or numpy.ndarray
        Shapes ``(m, k)`` and ``(k, n)``, or a 1-D operand (``(k,)``) on
        either side, as NumPy.

    Returns
    -------
    TiledArray
        NumPy's result shape and dtype.

    Raises
    ------
    TypeError
        An operand is neither a TiledArray nor a NumPy array.
    PlanningError
        The shapes do not align (the message names both), or an operand is
        not 1-D or 2-D.
    """
    a, b = (np.asarray(x) if isinstance(x, list | tuple) else x for x in (a, b))
    for i, x in enumerate((a, b)):
        if isinstance(x, int | float | np.number | np.bool_) or \
                (isinstance(x, np.ndarray) and x.ndim == 0):  # NumPy's words
            raise ValueError(f"matmul: Input operand {i} does not have enough dimensions "
                             "(a scalar: use *)")
        if not isinstance(x, ExprBase | np.ndarray):
            raise TypeError(f"matmul: operands must be TiledArrays or NumPy arrays, got "
                            f"{type(x).__name__}")
    na, nb = _operand(a), _operand(b)
    if na.ndim not in (1, 2) or nb.ndim not in (1, 2):
        raise PlanningError(f"matmul needs 1-D or 2-D operands; got shapes {na.shape} and "
                            f"{nb.shape}")
    ka, kb = na.shape[-1], nb.shape[0]
    if ka != kb:
        raise PlanningArgumentError(
            f"matmul: shapes {na.shape} and {nb.shape} are not aligned: "
            f"{ka} (dim {na.ndim - 1}) != {kb} (dim 0)"
        )
    shape = na.shape[:-1] + nb.shape[1:]
    dtype = np.matmul(np.ones((1, 1), na.dtype), np.ones((1, 1), nb.dtype)).dtype
    if ka == 0:  # an empty contraction: NumPy's zeros, nothing read
        if len(shape) == 2:
            return _wrap((a, b), Full(shape, dtype, 0))
        return _wrap((a, b), Elemwise(shape, dtype, "zeros", (), (("shape", shape),
                                                                   ("dtype", dtype))))
    if na.small and nb.small:  # both in memory: one small task
        return _wrap((a, b), Elemwise(shape, dtype, "matmul", (na, nb)))
    if na.ndim == 2 and nb.ndim == 2 and not na.small and not nb.small \
            and not isinstance(nb, MatVec) and not isinstance(na, MatVec):
        return _wrap((a, b), MatMul(shape, dtype, na, nb))
    # one operand is small (or a vector, or a product with a small operand):
    # it is held in memory, the other read in one pass
    if not na.small and na.ndim == 2 and (nb.small or nb.ndim == 1 or isinstance(nb, MatVec)):
        return _wrap((a, b), MatVec(shape, dtype, na, nb, "right"))
    if not nb.small and nb.ndim == 2:
        return _wrap((a, b), MatVec(shape, dtype, nb, na, "left"))
    if is_big_vector(na) or is_big_vector(nb):  # the rest in memory: joined, as elsewhere
        return _wrap((a, b), Elemwise(shape, dtype, "matmul", (na, nb)))
    raise PlanningError(f"matmul: {na.shape} @ {nb.shape} needs one 2-D TiledArray operand "
                        "read from storage and one small (in-memory) operand")


def _operand(x) -> Node:
    """A matmul operand's node: a NumPy array becomes a small constant (of
    any shape: whether a task can hold it is the plan's decision)."""
    if isinstance(x, ExprBase):
        return x._node
    if x.dtype.kind not in "biuf":
        raise TypeError(f"matmul: a NumPy operand of dtype {x.dtype} is not supported; "
                        "tilearray handles bool, integer and floating-point values")
    value = np.array(x, copy=True)
    return Constant(tuple(value.shape), value.dtype, value, tokenize(value))
