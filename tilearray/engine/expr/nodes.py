"""Expression nodes: what a lazy TiledArray stands for. Pure; nothing is read."""

from __future__ import annotations

import dataclasses
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...storage import ArrayRef, Grid


@dataclass(frozen=True, eq=False)
class Node:
    shape: tuple
    dtype: np.dtype

    def __format__(self, spec: str) -> str:
        """As ``str``, or the name :func:`describe` gave this sub-expression."""
        names = _NAMES.get()
        return names[id(self)] if names and id(self) in names else str(self)

    @property
    def small(self) -> bool:
        """True for in-memory results (reductions and ops on them)."""
        return False

    @property
    def ndim(self) -> int:
        return len(self.shape)


@dataclass(frozen=True, eq=False)
class Source(Node):
    ref: ArrayRef = None
    grid: Grid = None
    dims: tuple | None = None
    """Stored dimension names (None when the array has none)."""
    incomplete: bool = False
    """Opened with ``allow_incomplete=True`` while its job had not finished."""

    @property
    def small(self) -> bool:
        """A stored 1-D array is read whole by one task, like a reduction's result."""
        return len(self.shape) == 1

    def __str__(self) -> str:
        return f"open({str(self.ref)!r})"


@dataclass(frozen=True, eq=False)
class Constant(Node):
    """An in-memory NumPy operand of an elementwise expression: a row or a
    column broadcast, or a matrix of the expression's shape sliced block by
    block; held in the graph like a reduction's result."""

    value: Any = None
    token: str = ""
    """Content hash of ``value`` (its identity in graph keys and fingerprints)."""

    @property
    def small(self) -> bool:
        return True

    def __str__(self) -> str:
        return f"array{tuple(self.shape)}"


@dataclass(frozen=True, eq=False)
class Transpose(Node):
    x: Node = None

    @property
    def small(self) -> bool:
        return self.x.small

    def __str__(self) -> str:
        return f"{_paren(self.x)}.T"


@dataclass(frozen=True, eq=False)
class SliceNode(Node):
    x: Node = None
    start: tuple = (0, 0)
    step: tuple = (1, 1)

    @property
    def small(self) -> bool:
        return self.x.small

    def __str__(self) -> str:
        (r0, c0), (rs, cs) = self.start, self.step
        return (f"{_paren(self.x)}[{r0}:{r0 + self.shape[0] * rs}:{rs}, "
                f"{c0}:{c0 + self.shape[1] * cs}:{cs}]")


@dataclass(frozen=True, eq=False)
class Elemwise(Node):
    name: str = ""
    args: tuple = ()
    kwargs: tuple = ()

    @property
    def small(self) -> bool:
        return all(not isinstance(a, Node) or a.small for a in self.args)

    def __str__(self) -> str:
        if self.name == "tri":  # triu / tril: the row and column numbers are implied
            kw = dict(self.kwargs)
            return f"{'triu' if kw['upper'] else 'tril'}({_fmt(self.args[0])}, k={kw['k']})"
        if self.name == "eye":
            return f"eye({self.shape[0]}, {self.shape[1]}, k={dict(self.kwargs)['k']})"
        if self.name == "output":  # np.divmod(a, 3)[0]
            kw = dict(self.kwargs)
            name, index = kw.pop("ufunc"), kw.pop("index")
            inner = ", ".join([_fmt(a) for a in self.args] + [f"{k}={v!r}" for k, v in kw.items()])
            return f"{name}({inner})[{index}]"
        sym = _SYMBOLS.get(self.name)
        if sym and len(self.args) == 2:
            return f"({_fmt(self.args[0])} {sym} {_fmt(self.args[1])})"
        inner = ", ".join(_fmt(a) for a in self.args)
        kw = "".join(f", {k}={v!r}" for k, v in self.kwargs)
        return f"{self.name}({inner}{kw})"


@dataclass(frozen=True, eq=False)
class MatMul(Node):
    a: Node = None
    b: Node = None

    def __str__(self) -> str:
        return f"({_fmt(self.a)} @ {_fmt(self.b)})"


@dataclass(frozen=True, eq=False)
class MatVec(Node):
    """A product with one small in-memory operand ``w`` (a NumPy array, a
    reduction's result): ``a @ w`` (``side="right"``: ``a`` is p x q, ``w``
    (q,) or q x k) or ``w @ a`` (``side="left"``: ``w`` (p,) or k x p).

    Read as a pass over the blocks of ``a``: a right product is a map over
    ``a``'s row blocks (a big result, p rows), a left product a reduction
    over them (a small result); ``a.T @ w`` is ``(w.T @ a).T``, so a
    product over a transpose is the other kind."""

    a: Node = None
    w: Node = None
    side: str = "right"

    @property
    def small(self) -> bool:
        return (self.side == "left") != isinstance(self.a, Transpose)

    def __str__(self) -> str:
        if self.side == "right":
            return f"({_fmt(self.a)} @ {_fmt(self.w)})"
        return f"({_fmt(self.w)} @ {_fmt(self.a)})"


@dataclass(frozen=True, eq=False)
class Reduce(Node):
    op: str = ""
    x: Node = None
    axis: int | None = None
    keepdims: bool = False
    ddof: int | float = 0

    @property
    def small(self) -> bool:
        return True

    def __str__(self) -> str:
        extra = f", ddof={self.ddof}" if self.ddof else ""
        extra += ", keepdims=True" if self.keepdims else ""
        return f"{_paren(self.x)}.{self.op}(axis={self.axis}{extra})"


@dataclass(frozen=True, eq=False)
class TSQR(Node):
    """A result of the TSQR of a tall-skinny ``x`` (or of ``[x | y]``):
    ``part`` "R", "Q" (stored, ``m x r``), "s", "U" (stored), "Vt" of the thin
    SVD, or "lstsq" (NumPy's tuple, ``y`` the right-hand sides). Every part
    but Q and U is small (in memory)."""

    x: Node = None
    part: str = "R"
    y: Node | None = None
    options: tuple = ()
    """Sorted ``(name, value)`` pairs: ``rcond``, ``vector`` (lstsq)."""

    @property
    def small(self) -> bool:
        return self.part not in ("Q", "U")

    def __str__(self) -> str:
        what = {"R": "qr(%s).R", "Q": "qr(%s).Q", "s": "svd(%s).s", "U": "svd(%s).U",
                "Vt": "svd(%s).Vt", "lstsq": "lstsq(%s)"}[self.part]
        arg = f"{self.x}" if self.y is None else f"{self.x}, {self.y}"
        return what % arg


@dataclass(frozen=True, eq=False)
class Factor(Node):
    """A result about a square ``x`` from its tiled factorization or a
    triangular solve: ``part`` "L" (the Cholesky factor of an SPD ``x``,
    stored), "trsolve" (``x`` triangular, ``y`` the right-hand sides: small,
    ``options`` ``lower`` / ``trans`` / ``unit`` / ``vector``), "symv" (``x
    @ y`` with ``x`` symmetric, read from its lower triangle; ``y`` small;
    option ``norm``: one more column, the row sums of ``|x|``), "logdiag"
    (``x`` a stored Cholesky factor: NumPy's ``slogdet`` of ``x @ x.T``) or
    "incore" (``options`` ``op``: a NumPy/SciPy routine on the whole ``x``,
    and ``y``, in one task). Every part but "L" is small (in memory)."""

    x: Node = None
    part: str = "L"
    y: Node | None = None
    options: tuple = ()
    """Sorted ``(name, value)`` pairs."""

    @property
    def small(self) -> bool:
        return self.part != "L"

    def __str__(self) -> str:
        opts = dict(self.options)
        if self.part == "L":
            return f"cholesky({self.x})"
        if self.part == "trsolve":
            t = f"{self.x}.T" if opts.get("trans") else f"{self.x}"
            return f"solve_triangular({t}, {self.y}, lower={opts.get('lower') != opts.get('trans')})"
        if self.part == "logdiag":
            return f"slogdet({self.x} @ {self.x}.T)"
        if self.part == "symv":
            return f"symmetric({self.x}, lower=True) @ {self.y}"
        arg = f"{self.x}" if self.y is None else f"{self.x}, {self.y}"
        return f"{opts.get('op')}({arg})"


_SYMBOLS = {
    "add": "+", "subtract": "-", "multiply": "*", "true_divide": "/", "divide": "/",
    "floor_divide": "//", "power": "**", "mod": "%", "less": "<", "less_equal": "<=",
    "greater": ">", "greater_equal": ">=", "equal": "==", "not_equal": "!=",
    "left_shift": "<<", "right_shift": ">>",
    "logical_and": "&", "bitwise_and": "&", "bitwise_or": "|", "bitwise_xor": "^",
}


def _fmt(x: Any) -> str:
    return format(x) if isinstance(x, Node) else repr(x)


def _paren(x: Node) -> str:
    return format(x)


_NAMES: ContextVar[dict | None] = ContextVar("tilearray_node_names", default=None)


def describe(node: Node, limit: int = 300) -> str:
    """``str(node)``, or, when longer than ``limit``, with each longer
    sub-expression it uses more than once written once and named (``t1``,
    ``t2``, ...): ``np.corrcoef(X)`` names its Gram instead of repeating it
    eight times (5.6 kB for one stored X)."""
    text = str(node)
    if len(text) <= limit:
        return text
    uses: dict[int, int] = {}
    order: list[Node] = []  # each node after the nodes it uses

    def visit(n: Node) -> None:
        uses[id(n)] = uses.get(id(n), 0) + 1
        if uses[id(n)] == 1:
            for c in _operands(n):
                visit(c)
            order.append(n)

    visit(node)
    shared = [n for n in order if n is not node and uses[id(n)] > 1 and len(str(n)) > 40]
    if not shared:
        return text
    names = {id(n): f"t{i}" for i, n in enumerate(shared, 1)}
    token = _NAMES.set(names)
    try:
        lets = [f"{names[id(n)]} = {n!s}" for n in shared]  # !s: not its own name
        return f"{node!s}, where " + "; ".join(lets)
    finally:
        _NAMES.reset(token)


def _operands(n: Node):
    """The nodes ``n`` is built on (its Node fields, and those in tuples)."""
    for f in dataclasses.fields(n):
        v = getattr(n, f.name)
        if isinstance(v, Node):
            yield v
        elif isinstance(v, tuple):
            yield from (a for a in v if isinstance(a, Node))


def derive_dims(x, leaf=lambda src: src.dims, partial: bool = False) -> tuple | None:
    """Dimension names of an expression's result, carried from what ``leaf``
    gives each stored array: ``.T`` swaps them, ``a @ b`` takes a's rows and
    b's columns, a reduction (a median, a quantile along an axis too) drops
    its axis, a sort or a scan keeps them. None where no name is sound (a
    slice or a gather changes sizes, ``keepdims`` leaves a length-1 axis);
    with ``partial``, None for that axis alone (``X[:, :3]`` keeps X's rows:
    a name for the other, new axis is the caller's)."""

    def of(n):
        return derive_dims(n, leaf, partial)

    def axes_kept(d, shape):  # the names of the axes whose size did not change
        if d is None or not partial:
            return d if d is not None and tuple(shape) == tuple(x.x.shape) else None
        kept = tuple(n if a == b else None for n, a, b in zip(d, shape, x.x.shape, strict=True))
        return kept if any(n is not None for n in kept) else None

    if isinstance(x, Source):
        return leaf(x)
    if isinstance(x, Transpose):
        d = of(x.x)
        return None if d is None else d[::-1]
    if isinstance(x, SliceNode | Take):
        return axes_kept(of(x.x), x.shape)
    if isinstance(x, Sort | Scan):
        return of(x.x)
    if isinstance(x, MatMul):
        da, db = of(x.a), of(x.b)
        return None if da is None or db is None else (da[0], db[1])
    if isinstance(x, MatVec):
        da = of(x.a)
        if da is None or len(x.shape) != 1:
            return None
        return (da[0],) if x.side == "right" else (da[1],)
    if isinstance(x, Reduce | Quantile):
        d = of(x.x)
        if d is None or getattr(x, "keepdims", False):
            return None
        kept = () if x.axis is None else tuple(n for i, n in enumerate(d) if i != x.axis)
        if isinstance(x, Quantile) and not x.scalar_q:  # q's own axis first: no name
            return (None, *kept) if partial and any(n is not None for n in kept) else None
        return kept
    if isinstance(x, Elemwise):
        for a in x.args:
            if isinstance(a, Node) and tuple(a.shape) == tuple(x.shape) and (x.small or not a.small):
                return of(a)
    return None


def is_big_vector(node) -> bool:
    """A 1-D result written block by block (``x @ w``), not held in memory."""
    return isinstance(node, MatVec) and not node.small and len(node.shape) == 1


def sources(node):
    """The stored arrays an expression reads (``Source`` leaves; repeats kept)."""
    if isinstance(node, Source):
        yield node
    for child in ("x", "a", "b", "y", "w"):
        c = getattr(node, child, None)
        if isinstance(c, Node):
            yield from sources(c)
    for a in getattr(node, "args", ()):
        if isinstance(a, Node):
            yield from sources(a)


def structure(x):
    """A hashable description of every field of an expression tree: the
    identity used for temporaries, graph keys and resume fingerprints."""
    if isinstance(x, Node):
        fields = [type(x).__name__, tuple(x.shape), str(np.dtype(x.dtype))]
        for name in ("ref", "start", "step", "name", "op", "axis", "keepdims", "ddof", "token",
                     "part", "options", "side", "offset", "q", "scalar_q", "method",
                     "fill"):
            if hasattr(x, name):
                v = getattr(x, name)
                fields.append((name, str(v) if name == "ref" else v))
        for name in ("x", "a", "b", "y", "w"):
            if isinstance(getattr(x, name, None), Node):
                fields.append(structure(getattr(x, name)))
        if isinstance(x, Elemwise):
            fields.append(tuple(structure(a) for a in x.args))
            fields.append(tuple((k, repr(v)) for k, v in x.kwargs))
        if isinstance(x, Concat):
            fields.append(tuple(structure(a) for a in x.args))
        return tuple(fields)
    return ("const", type(x).__name__, repr(x))


# -- NumPy functions (issue 30): joins, gathers, diagonals, scans, quantiles ------------


@dataclass(frozen=True, eq=False)
class Concat(Node):
    """``np.concatenate(args, axis)`` of 2-D expressions: read in place, never copied."""

    args: tuple = ()
    axis: int = 0

    def __str__(self) -> str:
        return f"concatenate([{', '.join(_fmt(a) for a in self.args)}], axis={self.axis})"


@dataclass(frozen=True, eq=False)
class Take(Node):
    """``np.take(x, index, axis)``: rows or columns of ``x`` at integer positions."""

    x: Node = None
    axis: int = 0
    index: Any = None
    """The positions (a read-only NumPy int64 vector, in range)."""
    token: str = ""

    @property
    def small(self) -> bool:
        return self.x.small

    def __str__(self) -> str:
        return f"take({_fmt(self.x)}, {_shown(self.index)}, axis={self.axis})"


@dataclass(frozen=True, eq=False)
class Points(Node):
    """NumPy's pointwise ``x[rows, cols]`` (and ``np.take(x, flat)``): the
    elements of a matrix at flat (C order) positions ``index``, in that order,
    repeats allowed; a small 1-D result read from the I/O units holding them."""

    x: Node = None
    index: Any = None
    """The flat positions (a read-only NumPy int64 vector, in range)."""
    token: str = ""

    @property
    def small(self) -> bool:
        return True

    def __str__(self) -> str:
        return f"{_fmt(self.x)}.flat[{_shown(self.index)}]"


def _shown(index) -> str:
    """Positions as an expression shows them: the first four and the count."""
    n = len(index)
    return "[" + ", ".join(str(int(i)) for i in index[:4]) + (", ..." if n > 4 else "") + \
        f"] ({n})"


@dataclass(frozen=True, eq=False)
class Diagonal(Node):
    """``np.diagonal(x, offset)`` of a 2-D expression: a small 1-D result
    computed from the blocks the diagonal crosses only."""

    x: Node = None
    offset: int = 0

    @property
    def small(self) -> bool:
        return True

    def __str__(self) -> str:
        return f"diagonal({_fmt(self.x)}, offset={self.offset})"


@dataclass(frozen=True, eq=False)
class Scan(Node):
    """``np.cumsum`` / ``np.cumprod`` of a 2-D expression along ``axis``."""

    op: str = "cumsum"
    x: Node = None
    axis: int = 0

    def __str__(self) -> str:
        return f"{self.op}({_fmt(self.x)}, axis={self.axis})"


@dataclass(frozen=True, eq=False)
class Sort(Node):
    """``np.sort`` / ``np.argsort`` (``op``) of a 2-D expression along
    ``axis``: whole lines in one task each."""

    op: str = "sort"
    x: Node = None
    axis: int = 1
    kind: str | None = None

    def __str__(self) -> str:
        return f"{self.op}({_fmt(self.x)}, axis={self.axis})"


@dataclass(frozen=True, eq=False)
class Unique(Node):
    """The distinct values of all of ``x`` (``np.unique``) with their counts
    and first flat indices: three vectors whose length the data decide
    (``shape`` is the largest it can be, ``x.size``); computed when made."""

    x: Node = None
    equal_nan: bool = True

    @property
    def small(self) -> bool:
        return True

    def __str__(self) -> str:
        return f"unique({_fmt(self.x)})"


@dataclass(frozen=True, eq=False)
class Select(Node):
    """``x[mask]`` for a boolean ``mask`` of ``x``'s shape: the selected
    elements in C order (shape: their count, known from a pass before); with
    ``positions``, their flat (C order) indices instead (``np.flatnonzero``)."""

    x: Node = None
    mask: Node = None
    positions: bool = False

    @property
    def small(self) -> bool:
        return True

    def __str__(self) -> str:
        return f"{_fmt(self.x)}[{_fmt(self.mask)}]"


@dataclass(frozen=True, eq=False)
class Quantile(Node):
    """Exact ``np.quantile(x, q, axis, method=...)`` (``op``: quantile or
    nanquantile; median or nanmedian: NumPy's median, ``q`` 0.5), whole
    lines along ``axis`` in one task each."""

    op: str = "quantile"
    x: Node = None
    axis: int = 0
    q: tuple = ()
    """The quantiles in [0, 1]; ``scalar_q``: a single one (no leading axis)."""
    scalar_q: bool = True
    method: str = "linear"

    @property
    def small(self) -> bool:
        return True

    def __str__(self) -> str:
        q = self.q[0] if self.scalar_q else list(self.q)
        return f"{self.op}({_fmt(self.x)}, q={q}, axis={self.axis})"


@dataclass(frozen=True, eq=False)
class Outer(Node):
    """``np.outer(a, b)`` of two small vectors: a big lazy matrix."""

    a: Node = None
    b: Node = None

    def __str__(self) -> str:
        return f"outer({_fmt(self.a)}, {_fmt(self.b)})"


@dataclass(frozen=True, eq=False)
class Full(Node):
    """A matrix of one value (``np.full``): nothing is read (the ones column
    appended to ``X`` so that ``X.T @ X`` also gives the column sums)."""

    fill: Any = 0

    def __str__(self) -> str:
        return f"full({tuple(self.shape)}, {self.fill!r})"


@dataclass(frozen=True, eq=False)
class Positions(Node):
    """Every element's row (``axis`` 0) or column (``axis`` 1) number: the
    masks of ``np.triu`` / ``np.tril``; nothing is read."""

    axis: int = 0

    def __str__(self) -> str:
        return f"{'row' if self.axis == 0 else 'col'}_numbers{tuple(self.shape)}"


@dataclass(frozen=True, eq=False)
class Values(Node):
    """The elements of ``x`` whose float64 value lies in ``[lo, hi)``
    (``[lo, hi]`` when ``closed``; NaNs never), over all of ``x``: with
    ``edges``, their histogram and smallest and largest value (shape
    ``(len(edges) + 1,)``, float64); without, the elements themselves in
    block order (shape: their count, known from an earlier histogram)."""

    x: Node = None
    lo: Any = 0.0
    """The interval's bounds (Python ints for integers: compared exactly)."""
    hi: Any = 0.0
    closed: bool = True
    edges: tuple = ()

    @property
    def small(self) -> bool:
        return True

    def __str__(self) -> str:
        what = f"histogram of {len(self.edges) - 1} bins" if self.edges else "values"
        return f"{what}({_fmt(self.x)} in [{self.lo}, {self.hi}{']' if self.closed else ')'})"
