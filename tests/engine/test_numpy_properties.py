"""Property-based tests: random expressions (elementwise ops with Python and
NumPy scalars, rows and columns, slices, transposes, matmul, reductions with
any axis / keepdims) over random dtypes, shapes and tilings that do not
divide them, run with tiny blocks and fan-in 2 (many tasks, combine trees)
and compared with NumPy: value, dtype and shape, or both refuse."""

import warnings

import dask
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tilearray as ta
from tilearray.testing import assert_close

DTYPES = ["int8", "uint8", "int32", "int64", "float32", "float64", "bool"]
REDUCTIONS = ["sum", "prod", "mean", "var", "std", "min", "max", "argmin", "argmax", "any",
              "all", "nansum", "nanmean", "nanmin", "nanmax", "nanargmin", "nanargmax",
              "count_nonzero"]
BINARY = ["+", "-", "*", "/", "//", "%", "**", "<", "==", "&"]


def _data(rng, shape, dtype):
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype.startswith("float"):
        x = rng.standard_normal(shape).astype(dtype)
        x[rng.random(shape) < 0.1] = np.nan
        return x
    return rng.integers(0, 9, shape).astype(dtype)  # ties: argmin/argmax take the first


def _numpy(f):
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        try:
            return f(), None
        except (ValueError, TypeError, ArithmeticError) as e:
            return None, e


class Refused(Exception):
    """NumPy refused a step; tilearray must refuse it too (now or at compute)."""

    def __init__(self, err, lazy):
        super().__init__(repr(err))
        self.lazy = lazy


def _step(x, a, fx, fa):
    want, err = _numpy(lambda: fx(x))
    if err is not None:
        try:
            lazy = fa(a)
        except (ValueError, TypeError, ArithmeticError):
            lazy = None
        raise Refused(err, lazy)
    return want, fa(a)


@st.composite
def expressions(draw, x, a, scalars):
    """(NumPy result, tilearray expression) of a few random steps from ``x``/``a``."""
    steps = draw(st.lists(st.sampled_from(["binop", "scalar", "row", "col", "slice", "T",
                                           "abs", "neg", "astype"]), max_size=3))
    for s in steps:
        if s == "binop":
            op = draw(st.sampled_from(BINARY))
            f = eval(f"lambda u: u {op} u")  # noqa: S307 (fixed operator strings)
        elif s == "scalar":
            op = draw(st.sampled_from(BINARY[:7]))
            c = draw(st.sampled_from(scalars))
            f = eval(f"lambda u: u {op} c" if draw(st.booleans()) else  # noqa: S307
                     f"lambda u: c {op} u", {"c": c})
        elif s in ("row", "col"):
            shape = (x.shape[1],) if s == "row" else (x.shape[0], 1)
            v = np.arange(1, np.prod(shape) + 1).reshape(shape).astype(
                draw(st.sampled_from(["int8", "float32", "float64"])))
            f = lambda u, v=v: u * v  # noqa: E731
        elif s == "slice":
            rs, cs = (draw(st.sampled_from([1, 2, 3, -1, -2, -3])) for _ in "rc")
            r0, c0 = ((k if step > 0 else -1 - k) for k, step in
                      ((draw(st.integers(0, 3)), rs), (draw(st.integers(0, 3)), cs)))
            f = lambda u, k=(slice(r0, None, rs), slice(c0, None, cs)): u[k]  # noqa: E731
        elif s == "T":
            f = lambda u: u.T  # noqa: E731
        elif s == "abs":
            f = abs
        elif s == "neg":
            f = lambda u: -u  # noqa: E731
        else:
            # floats with NaN cast to integers are platform-defined in NumPy
            dt = draw(st.sampled_from(DTYPES if x.dtype.kind != "f" else
                                      ["float32", "float64", "bool"]))
            f = lambda u, dt=dt: u.astype(dt)  # noqa: E731
        x, a = _step(x, a, f, f)
    return x, a


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data(), dtype=st.sampled_from(DTYPES), m=st.integers(1, 23),
       n=st.integers(1, 17), tile=st.tuples(st.integers(1, 9), st.integers(1, 9)))
def test_random_expressions_match_numpy(thread_engine, tmp_path_factory, data, dtype, m, n, tile):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    x = _data(rng, (m, n), dtype)
    a = ta.from_numpy(x, tmp_path_factory.mktemp("p") / "x.zarr", tile=tile)
    scalars = [2, 3.5, True, np.int8(3), np.float32(1.5), np.int64(2), np.uint8(2)]
    try:
        x, a = data.draw(expressions(x, a, scalars))
    except Refused as r:
        if r.lazy is not None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with pytest.raises((ValueError, TypeError, ArithmeticError)):
                    r.lazy.compute()
        return
    final = data.draw(st.sampled_from(["none", "reduce", "reduce2", "matmul", "centre"]))
    if final == "reduce" or final == "reduce2":
        op = data.draw(st.sampled_from(REDUCTIONS))
        axis = data.draw(st.sampled_from([None, 0, 1, -1, (0, 1), (1,)] if "arg" not in op
                                         else [None, 0, 1, -1]))
        kd = data.draw(st.booleans())
        want, err = _numpy(lambda: getattr(np, op)(x, axis=axis, keepdims=kd))
        got = lambda: getattr(np, op)(a, axis=axis, keepdims=kd)  # noqa: E731
        if final == "reduce2" and err is None:
            op2 = data.draw(st.sampled_from(["sum", "max", "argmax", "mean"]))
            want, err = _numpy(lambda: getattr(np, op2)(want))
            got0 = got
            got = lambda: getattr(np, op2)(got0())  # noqa: E731
    elif final == "matmul":
        want, err = _numpy(lambda: x.T @ x)
        got = lambda: a.T @ a  # noqa: E731
    elif final == "centre":
        want, err = _numpy(lambda: x - x.mean(axis=0))
        got = lambda: a - a.mean(axis=0)  # noqa: E731
    else:
        want, err = x, None
        got = lambda: a  # noqa: E731
    with dask.config.set({"tilearray.map.block-bytes": "512B",
                          "tilearray.reduction.split-every": 2}), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if err is not None:
            try:
                result = got()
                result = result.compute() if hasattr(result, "compute") else result
            except (ValueError, TypeError, ArithmeticError):
                return
            raise AssertionError(f"NumPy refused ({err!r}), tilearray gave {result!r}")
        result = got()
        result = result.compute() if hasattr(result, "compute") else result
    want = np.asarray(want)
    assert np.shape(result) == want.shape
    assert np.asarray(result).dtype == want.dtype, (np.asarray(result).dtype, want.dtype)
    with np.errstate(over="ignore"):  # 1e161 ** 2: inf (any difference passes), not an error
        scale = np.float64(np.nanmax(np.abs(np.nan_to_num(
            np.asarray(x, dtype=np.float64), posinf=0, neginf=0)), initial=0)) ** 2
    assert_close(result, want, scale=float(scale))
