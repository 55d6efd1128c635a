"""NumPy functions on TiledArrays (issue 30) against NumPy: joins, gathers,
integer and boolean indexing, diagonals, scans -- on ragged tilings, several
dtypes, NaNs and empty selections; plan figures (tasks, bytes read and
written) equal to the measured RunStats."""

import itertools
import re
import warnings

import dask
import numpy as np
import pytest
import zarr
from helpers import rand
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tilearray as ta
from tilearray.testing import assert_close

SMALL_BLOCKS = {"tilearray.map.block-bytes": 4096}  # many blocks on small arrays
HYP = settings(max_examples=10, deadline=None,
               suppress_health_check=[HealthCheck.function_scoped_fixture,
                                      HealthCheck.too_slow])
_counter = itertools.count()


def check(expr, want, tmp_path=None, exact=False):
    """Compute (and, with ``tmp_path``, store) ``expr``: equal to ``want``,
    the plan's tasks and bytes equal to the run's."""
    plan = expr.plan()
    got = expr.compute()
    assert np.shape(got) == np.shape(want)
    assert np.asarray(got).dtype == np.asarray(want).dtype, (np.asarray(got).dtype,
                                                             np.asarray(want).dtype)
    if exact:
        np.testing.assert_array_equal(got, want)
    else:
        assert_close(got, want)
    st_ = expr.stats
    if st_ is None:  # nothing to run (an empty result)
        assert plan.tasks == 0, str(plan)
    else:
        assert (st_.tasks, st_.bytes_read) == (plan.tasks, plan.bytes_read), str(plan)
    if tmp_path is not None and np.ndim(want) == 2:
        out = tmp_path / f"out{next(_counter)}.zarr"
        plan = expr.plan(out)
        stored = expr.to_zarr(out)
        np.testing.assert_array_equal(np.asarray(stored[...]), np.asarray(got))
        st_ = expr.stats
        assert (st_.tasks, st_.bytes_read, st_.bytes_written) == \
            (plan.tasks, plan.bytes_read, plan.bytes_written), str(plan)
    return plan


def traced_tasks(stage):
    """``(task, its value, its traced peak)`` of each of a stage's tasks, run here."""
    import tracemalloc

    for task in stage.work:
        tracemalloc.start()
        try:
            value, _ = task.fn(*task.args)
            traced = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        yield task, value, traced


@pytest.fixture(scope="module")
def mats(tmp_path_factory):
    """Ragged tilings (tiles never divide the shapes), three dtypes, NaNs."""
    rng = np.random.default_rng(11)
    d = tmp_path_factory.mktemp("npf")
    out = {}
    for dtype in ["float64", "float32", "int32", "bool"]:
        x = rand(rng, (45, 31), dtype)
        if dtype == "float64":
            x[rng.random(x.shape) < 0.05] = np.nan
        out[dtype] = (x, ta.from_numpy(x, d / f"x_{dtype}.zarr", tile=(8, 7)))
    y = rng.standard_normal((45, 13))
    out["y"] = (y, ta.from_numpy(y, d / "y.zarr", tile=(11, 5)))
    z = rng.standard_normal((9, 31)).astype("float32")
    out["z"] = (z, ta.from_numpy(z, d / "z.zarr", tile=(4, 10)))
    return out


# -- concatenate / stack -------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float64", "bool"])
def test_concatenate_matches_numpy(thread_engine, mats, tmp_path, dtype):
    x, a = mats[dtype]
    y, b = mats["y"]
    z, c = mats["z"]
    with dask.config.set(SMALL_BLOCKS):
        check(np.hstack([a, b, a]), np.hstack([x, y, x]), tmp_path, exact=True)
        check(np.vstack([a, c]), np.vstack([x, z]), tmp_path, exact=True)
        check(np.concatenate([c, a[3:9], a[:0]], axis=0), np.concatenate([z, x[3:9], x[:0]]),
              exact=True)
        check(np.hstack([a, b]).T * 2, np.hstack([x, y]).T * 2, tmp_path)
        # axis=None: each flattened, NumPy parts and dtype= too (helper-48: refused)
        check(np.concatenate([a, c[:2], y[:1]], axis=None),
              np.concatenate([x, z[:2], y[:1]], axis=None), exact=True)
        check(np.concatenate([y[0], a[:, 1]], axis=None, dtype=np.float32),
              np.concatenate([y[0], x[:, 1]], axis=None, dtype=np.float32), exact=True)


def test_concatenate_sum_reads_each_piece_once(thread_engine, mats):
    x, a = mats["float32"]
    y, b = mats["y"]
    for e, want, reads in [(np.hstack([a, b]).sum(0), np.hstack([x, y]).sum(0),
                            a.nbytes + b.nbytes),
                           (np.vstack([a, a * 2]).mean(axis=1), np.vstack([x, x * 2]).mean(1),
                            2 * a.nbytes)]:  # each piece once (a is two pieces)
        with dask.config.set(SMALL_BLOCKS):
            plan = check(e, want)
        assert plan.bytes_read == reads, str(plan)


def test_concatenate_in_products_and_refusals(thread_engine, mats):
    x, a = mats["float64"]
    y, b = mats["y"]
    h = np.hstack([b, b])
    check(h.T @ h, np.hstack([y, y]).T @ np.hstack([y, y]))
    with pytest.raises(TypeError, match="3-D"):
        np.stack([b, b])
    with pytest.raises(ValueError, match="must match"):
        np.hstack([a, mats["z"][1]])
    rows = np.arange(26.0).reshape(2, 13)  # a NumPy matrix: sliced in memory
    check(np.vstack([b, rows, b]), np.vstack([y, rows, y]), exact=True)
    ones = np.ones((45, 1))  # an intercept column (NumPy), a reduction's row
    check(np.hstack([b, ones]), np.hstack([y, ones]), exact=True)
    check(np.hstack([ones * 2, b]).T @ np.hstack([ones * 2, b]),
          np.hstack([ones * 2, y]).T @ np.hstack([ones * 2, y]))
    check(np.vstack([b, b.mean(axis=0, keepdims=True)]),
          np.vstack([y, y.mean(axis=0, keepdims=True)]))


@HYP
@given(shapes=st.lists(st.integers(0, 12), min_size=1, max_size=4), width=st.integers(1, 9),
       axis=st.integers(0, 1), tile=st.integers(1, 6), seed=st.integers(0, 99))
def test_concatenate_hypothesis(thread_engine, tmp_path_factory, shapes, width, axis, tile,
                                seed):
    rng = np.random.default_rng(seed)
    d = tmp_path_factory.mktemp("cat")
    xs, ts = [], []
    for i, n in enumerate(shapes):
        x = rng.standard_normal((n, width) if axis == 0 else (width, n))
        xs.append(x)
        ts.append(ta.from_numpy(x, d / f"p{i}.zarr", tile=(tile, tile + i)))
    with dask.config.set(SMALL_BLOCKS):
        check(np.concatenate(ts, axis=axis), np.concatenate(xs, axis=axis), exact=True)
        if sum(shapes):
            check(np.concatenate(ts, axis=axis).sum(axis=1 - axis),
                  np.concatenate(xs, axis=axis).sum(axis=1 - axis))


# -- take / integer and boolean indexing ------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float64", "int32", "bool"])
def test_integer_indexing(thread_engine, mats, tmp_path, dtype):
    x, a = mats[dtype]
    with dask.config.set(SMALL_BLOCKS):
        check(a[:, [0, 5, 9]], x[:, [0, 5, 9]], tmp_path, exact=True)
        check(a[[1, 3, 44, -1, 3], :], x[[1, 3, 44, -1, 3], :], tmp_path, exact=True)
        check(a[2:40:3, [30, 0, 7]], x[2:40:3, [30, 0, 7]], exact=True)
        check(np.take(a, np.array([4, 4, 0]), axis=0), np.take(x, [4, 4, 0], axis=0),
              exact=True)
        check(a.take([], axis=1), x.take([], axis=1), exact=True)
        check(a.sum(0)[[]], x.sum(0)[[]], exact=True)  # an empty list: positions, as NumPy
        check(a.sum(0)[[2, -1]], x.sum(0)[[2, -1]], exact=True)
        check(a[:, 3], x[:, 3], exact=True)
        check(a[7], x[7], exact=True)
        check(a[7, 30], x[7, 30], exact=True)
        check(a[3, [1, 2]], x[3, [1, 2]], exact=True)
    with pytest.raises(IndexError, match="out of bounds"):
        a[:, [31]]
    check(a[[1, 2], [3, 4]], x[[1, 2], [3, 4]], exact=True)  # pointwise: see below
    check(a[[1, 2]][:, [3, 4]], x[np.ix_([1, 2], [3, 4])], exact=True)
    check(np.diagonal(a[[1, 2]][:, [3, 4]]), x[[1, 2], [3, 4]], exact=True)
    mask = np.arange(x.shape[0]) % 3 == 0
    for key in (np.ix_([1, 2], [3, 4]), np.ix_([44, -1, 0, 0], [30]), np.ix_(mask, [2, 0]),
                np.ix_([], [])):  # NumPy's open mesh, as the hint names it (helper-44)
        check(a[key], x[key], exact=True)
    with pytest.raises(IndexError, match="out of bounds"):
        a[np.ix_([1], [31])]


@pytest.mark.parametrize("dtype", ["float64", "float32", "int32", "bool"])
def test_pointwise_indexing_and_flat_take(thread_engine, mats, dtype):
    """NumPy's pointwise ``a[rows, cols]`` (lists, masks, broadcast, repeats,
    negative positions) and ``np.take(a, flat)``: the elements at the
    points, read from the I/O units holding them (a few points read few
    units); NumPy's errors. (Both had been refused, helper-51.)"""
    x, a = mats[dtype]
    rows, cols = np.arange(45), np.argmax(np.nan_to_num(x), axis=1)
    mask = np.arange(45) % 9 == 0
    for key in [([1, 2], [3, 4]), ([44, -1, 0, 0], [30, 0, -31, -31]), (rows, cols),
                ([5], [0, 1, 2]), (mask, [0, 1, 2, 3, 4]), ([], []), (np.array([7]), 30)]:
        check(a[key], x[key], exact=True)
    check((a.T * 2)[[3, 1], [40, 2]], (x.T * 2)[[3, 1], [40, 2]], exact=True)
    for idx in ([0, 5, -1, 5], np.arange(1394, -1, -97), []):
        check(np.take(a, idx), np.take(x, idx), exact=True)
    assert np.asarray(np.take(a, 33)) == np.take(x, 33)
    with pytest.raises(IndexError, match=r"could not be broadcast together with shapes \(2,\) "
                       r"\(3,\)"):
        a[[1, 2], [3, 4, 5]]
    with pytest.raises(IndexError, match="index 45 is out of bounds for axis 0 with size 45"):
        a[[1, 45], [0, 0]]
    with pytest.raises(IndexError, match="index 1395 is out of bounds for size 1395"):
        np.take(a, [1395])


def test_few_points_read_their_units(thread_engine, tmp_path):
    """A few points read the I/O units holding them; points in every unit
    read the matrix once, in fewer, larger blocks."""
    x = np.random.default_rng(5).standard_normal((2000, 300))
    a = ta.from_numpy(x, tmp_path / "x.zarr", tile=(500, 100))
    corners = a[[0, -1], [0, -1]]
    assert corners.plan().bytes_read == 2 * 500 * 100 * 8, str(corners.plan())
    check(corners, x[[0, -1], [0, -1]], exact=True)
    rows, cols = np.arange(2000), np.arange(2000) % 300
    every = a[rows, cols]
    plan = check(every, x[rows, cols], exact=True)
    assert plan.bytes_read == x.nbytes and plan.tasks < 12, str(plan)


@HYP
@given(m=st.integers(1, 40), n=st.integers(1, 40), tile=st.tuples(st.integers(1, 9),
       st.integers(1, 9)), data=st.data())
def test_pointwise_hypothesis(thread_engine, tmp_path_factory, m, n, tile, data):
    rng = np.random.default_rng(m * 37 + n)
    x = rng.standard_normal((m, n))
    a = ta.from_numpy(x, tmp_path_factory.mktemp("pw") / "x.zarr", tile=tile)
    k = data.draw(st.integers(0, 30))
    rows = data.draw(st.lists(st.integers(-m, m - 1), min_size=k, max_size=k))
    cols = data.draw(st.lists(st.integers(-n, n - 1), min_size=k, max_size=k))
    with dask.config.set(SMALL_BLOCKS):
        check(a[rows, cols], x[rows, cols], exact=True)
        flat = [r % m * n + c % n for r, c in zip(rows, cols, strict=True)]
        check(np.take(a[:, ::-1], flat), np.take(x[:, ::-1], flat), exact=True)


@pytest.mark.parametrize("dtype", ["float64", "int32"])
def test_pad(thread_engine, mats, tmp_path, dtype):
    """np.pad: constant blocks joined (nothing read for them); edge /
    reflect / symmetric / wrap as gathers of NumPy's own padded positions
    (pads wider than the axis too)."""
    x, a = mats[dtype]
    with dask.config.set(SMALL_BLOCKS):
        for args, kw in [((2,), {}), (((1, 3),), {}), ((((1, 2), (0, 4)),), {}),
                         ((3,), {"constant_values": 7.6}),
                         ((((2, 0), (1, 1)),), {"constant_values": ((1, 2), (3, 4))}),
                         ((2, "edge"), {}), (((((3, 60), (2, 1))), "reflect"), {}),
                         ((((3, 60), (2, 1)), "symmetric"), {}), ((((3, 1), (40, 5)), "wrap"), {})]:
            plan = check(np.pad(a, *args, **kw), np.pad(x, *args, **kw),
                         tmp_path if args == (2,) else None, exact=True)
            if len(args) == 1:  # constant: the matrix read once, nothing for the pads
                assert plan.bytes_read == a.nbytes, str(plan)
    check(np.pad(a.sum(axis=0), 2, "edge"), np.pad(x.sum(axis=0), 2, "edge"))  # small
    z = ta.from_numpy(np.zeros((5, 0), x.dtype), tile=(3, 3))  # nothing along the other axis
    for w in [((2, 3), (0, 0)), ((2, 3), (1, 0))]:
        assert np.asarray(np.pad(z, w)).shape == np.pad(np.zeros((5, 0)), w).shape
    xb, ab = mats["bool"]  # NaN into bool: True, as NumPy's cast
    check(np.pad(ab, 1, constant_values=np.nan), np.pad(xb, 1, constant_values=np.nan), exact=True)
    if dtype == "int32":  # NumPy's cast of the value: 7.6 -> 7, NaN refused
        check(np.pad(a, 1, constant_values=7.6), np.pad(x, 1, constant_values=7.6), exact=True)
        with pytest.raises(ValueError):
            np.pad(a, 1, constant_values=np.nan)
    with pytest.raises(TypeError, match="integral"):
        np.pad(a, 1.5)
    with pytest.raises(ValueError, match="unsupported keyword"):
        np.pad(a, 1, reflect_type="even")
    with pytest.raises(TypeError, match="mode='mean'"):
        np.pad(a, 1, "mean")
    with pytest.raises(TypeError, match="reflect_type"):
        np.pad(a, 1, "reflect", reflect_type="odd")
    with pytest.raises(ValueError, match="negative"):
        np.pad(a, -1)
    with pytest.raises(ValueError, match="empty axis"):
        np.pad(a[:0], 1, "edge")


def test_gather_reads_only_the_units_it_needs(thread_engine, mats):
    x, a = mats["float64"]  # tiles of 8 x 7
    plan = check(a[:, [0, 5, 29]], x[:, [0, 5, 29]], exact=True)
    assert plan.bytes_read == 45 * (7 + 3) * 8  # column units [0, 7) and [28, 31)


def test_unsorted_gathers_read_each_unit_once(thread_engine, tmp_path):
    """Consecutive positions of an unsorted index meet most source units:
    blocks span the gathered axis, so each unit is read once, as for the
    sorted index (400 random rows of a 4000² matrix in 1000² chunks at
    180 MiB read 9.09 GiB in 1,220 tasks, against 0.12 GiB sorted)."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((300, 260))
    a = ta.from_numpy(x, tmp_path / "g.zarr", tile=(50, 40))
    rows, cols = rng.choice(300, 60, replace=False), rng.choice(260, 30, replace=False)
    assert set(rows // 50) == set(range(6)) and set(cols // 40) == set(range(7))
    with dask.config.set(SMALL_BLOCKS):
        for got, want, ordered in [
                (a[rows], x[rows], a[np.sort(rows)]), (a[:, cols], x[:, cols], a[:, np.sort(cols)]),
                (a[rows].sum(axis=0), x[rows].sum(axis=0), a[np.sort(rows)].sum(axis=0)),
                (a[rows][:, cols] * 2, x[rows][:, cols] * 2, a[np.sort(rows)][:, np.sort(cols)] * 2),
                (np.cumsum(a[rows], axis=1), np.cumsum(x[rows], axis=1), None)]:
            plan = check(got, want, tmp_path if np.ndim(want) == 2 else None)
            passes = 2 if ordered is None else 1  # a scan's totals, then its blocks
            assert plan.bytes_read <= passes * x.nbytes, str(plan)  # every unit once a pass
            if ordered is not None:
                assert ordered.plan().bytes_read == plan.bytes_read


def test_gathers_inside_expressions_plan_under_tight_budgets(tmp_path):
    """A gather's block counts once (as a temporary), its spans one at a
    time: flips, pads, rot90 and repeats of two 4000 x 1500 arrays in
    1000 x 500 chunks plan at 200 MiB a worker as they did before gathers
    held their spans apart (counting the block twice refused them, helper-36);
    an unsorted permutation in an expression reads a few times the sorted
    one (bands of all rows cut inside units), not 400 times. Metadata only."""
    import zarr

    for name in ("a", "b"):
        zarr.create_array(str(tmp_path / f"{name}.zarr"), shape=(4000, 1500),
                          chunks=(1000, 500), dtype="f8")
    a, b = ta.open(tmp_path / "a.zarr"), ta.open(tmp_path / "b.zarr")
    budget = ta.Budget.from_config("200MiB", 2, 1)
    perm = np.random.default_rng(3).permutation(4000)
    for expr in [a[::-1] * 2 + b[::-1], np.pad(a, 3, mode="reflect"), np.rot90(a) + np.rot90(b),
                 a[np.arange(4000)] * 2 + b]:
        plan = expr.plan(budget=budget)
        assert plan.peak_task_memory <= budget.task_memory
        assert plan.bytes_read <= a.nbytes + b.nbytes, str(plan)  # each unit once
    # each row twice: blocks of 2000 output rows (one unit) do not fit; bands of
    # all rows cut inside units plan (it was refused, naming 217MiB)
    plan = (np.repeat(a, 2, 0) * 2 + np.repeat(b, 2, 0)).plan(budget=budget)
    assert plan.peak_task_memory <= budget.task_memory
    shuffled = (a[perm] * 2 + b[perm]).plan(budget=budget)
    ordered = (a[np.sort(perm)] * 2 + b[np.sort(perm)]).plan(budget=budget)
    assert shuffled.bytes_read <= 8 * ordered.bytes_read, (str(shuffled), str(ordered))


def test_unsorted_gathers_in_expressions_run_under_a_tight_budget(tmp_path):
    """Bands of all rows cut inside units for ``compute()``; written to Zarr,
    only on the output's unit edges (a band across an output unit was
    refused by the write: helper-36's ``to_zarr`` of ``A[perm] * 2 + B[perm]``)."""
    rng = np.random.default_rng(9)
    x, y = rng.standard_normal((2000, 750)), rng.standard_normal((2000, 750))
    perm = rng.permutation(2000)
    mem = ta.Budget(memory_per_worker="1GiB", threads_per_worker=1).worker_memory_for(16 << 20)
    with ta.Engine(n_workers=1, threads_per_worker=1, memory_per_worker=mem, processes=False,
                   quiet=True):  # 16 MiB tasks: bands of 2000 x 104 for compute()
        a = ta.from_numpy(x, tmp_path / "a.zarr", tile=(500, 250))
        b = ta.from_numpy(y, tmp_path / "b.zarr", tile=(500, 250))
        expr = a[perm] * 2 + b[perm]
        plan = expr.plan()
        assert plan.bytes_read <= 8 * (x.nbytes + y.nbytes), str(plan)
        check(expr, x[perm] * 2 + y[perm], tmp_path)


def test_a_gather_holds_one_span_at_a_time(thread_engine, tmp_path):
    """A block of an unsorted gather reads its spans one at a time, each
    freed before the next is read (a view of a partial read holds its whole
    decoded chunk): the traced peak of every planned task is under the
    plan's, which counts the largest span and the gathered block."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((2400, 600))
    a = ta.from_numpy(x, tmp_path / "s.zarr", tile=(400, 200))
    idx = rng.choice(2400, 300, replace=False)
    mem = ta.Budget(memory_per_worker="1GiB", threads_per_worker=1).worker_memory_for(4 << 20)
    budget = ta.Budget(memory_per_worker=mem, threads_per_worker=1)  # 4 MiB tasks
    for k, expr in enumerate([a[idx], a[idx] * 2 + 1, a[idx][:, ::-1]]):
        plan = expr.plan(budget=budget)
        (stage,) = [s for s in plan.stages if s.kind == "map"]
        if k == 0:  # all rows, a column unit a task: every unit read once
            assert stage.bytes_read == x.nbytes and stage.tasks == 3, str(plan)
        for task, value, traced in traced_tasks(stage):
            rows, cols = task.args[1], task.args[2]
            want = (x[idx] * 2 + 1 if k == 1 else x[idx][:, ::-1] if k == 2 else x[idx])
            np.testing.assert_array_equal(value, want[rows[0]:rows[1], cols[0]:cols[1]])
            assert traced <= stage.peak_task_memory, (traced, str(plan))


def test_boolean_masks(thread_engine, mats, tmp_path):
    x, a = mats["float64"]
    y, b = mats["y"]
    with dask.config.set(SMALL_BLOCKS):
        check(b[b[:, 0] > 0], y[y[:, 0] > 0], tmp_path, exact=True)
        check(a[np.isnan(a[:, 2])], x[np.isnan(x[:, 2])], exact=True)  # NaN rows
        check(b[b[:, 0] > 1e9], y[y[:, 0] > 1e9], tmp_path, exact=True)  # empty selection
        cols = np.arange(13) % 3 == 0
        check(b[:, cols], y[:, cols], exact=True)
        check(b[y[:, 1] < 0][:, cols].sum(0), y[y[:, 1] < 0][:, cols].sum(0))
    with pytest.raises(IndexError, match="did not match"):
        b[np.ones(3, bool)]


@pytest.mark.parametrize("dtype", ["float64", "int32", "bool"])
def test_2d_masks(thread_engine, mats, dtype):
    """``a[mask]`` of a lazy 2-D mask: the selected elements in C order (a
    pass counting them, one gathering them: a stored array both read, read
    once a pass), a small 1-D result usable in expressions."""
    x, a = mats[dtype]
    y, b = mats["y"]
    with dask.config.set(SMALL_BLOCKS):
        cases = [(a[a > 0], x[x > 0]), (a.T[a.T != 1], x.T[x.T != 1]),
                 (a[a > 1e9], x[x > 1e9]), ((a * 2)[a > 0], (x * 2)[x > 0])]
        if dtype == "float64":
            cases += [(a[np.isnan(a)], x[np.isnan(x)]), (b[b > b.mean(axis=0)], y[y > y.mean(axis=0)]),
                      (a[:, 3:4][a[:, 3:4] > 0], x[:, 3:4][x[:, 3:4] > 0]),  # one column
                      (a[2:3][a[2:3] > 0], x[2:3][x[2:3] > 0])]  # one row
        for got, want in cases:
            g = np.asarray(got)
            assert g.dtype == want.dtype and g.shape == want.shape, (g.dtype, g.shape, want.shape)
            np.testing.assert_array_equal(g, want)
        if dtype != "bool":
            check(a[a > 0].sum(), x[x > 0].sum())  # a small result, usable as any other
    from tilearray.engine.expr.nodes import Select
    from tilearray.engine.expr.ops import as_node, wrap_like

    budget = ta.Budget(memory_per_worker="1GiB", threads_per_worker=1)
    many = wrap_like(b, Select((10**9,), b.dtype, as_node(b), as_node(b > 0)))
    with pytest.raises(ta.PlanningError, match="joining the 1000000000 selected elements"):
        many.plan(budget=budget)  # more selected than a task holds: refused before running
    with pytest.raises(IndexError, match="did not match"):
        a[b[:, :5] > 0]
    with pytest.raises(IndexError, match="axis 1"):  # a column mask of a matrix: NumPy's error
        b[b[:, :1] > 0]
    np.testing.assert_array_equal(np.asarray(b[y > 0.5]), y[y > 0.5])  # a NumPy 2-D mask
    for key in [(b > 0, ...), (b > 0,)]:  # a[mask, ...] and a[(mask,)] are a[mask]
        np.testing.assert_array_equal(np.asarray(b[key]), y[y > 0])
    with pytest.raises(IndexError, match="boolean mask"):
        b[np.ones(y.shape, int)]
    with pytest.raises(IndexError, match="boolean mask"):
        b[b.astype("int64")]


@HYP
@given(m=st.integers(1, 30), n=st.integers(1, 20), tile=st.tuples(st.integers(1, 9),
       st.integers(1, 9)), axis=st.integers(0, 1), data=st.data())
def test_take_hypothesis(thread_engine, tmp_path_factory, m, n, tile, axis, data):
    rng = np.random.default_rng(m * 31 + n)
    x = rng.standard_normal((m, n))
    a = ta.from_numpy(x, tmp_path_factory.mktemp("tk") / "x.zarr", tile=tile)
    size = x.shape[axis]
    idx = data.draw(st.lists(st.integers(-size, size - 1), max_size=12))
    lo = data.draw(st.integers(0, x.shape[1 - axis] - 1))
    sl = (slice(lo, None), slice(None)) if axis == 1 else (slice(None), slice(lo, None))
    with dask.config.set(SMALL_BLOCKS):
        check(np.take(a[sl], idx, axis=axis), np.take(x[sl], idx, axis=axis), exact=True)
        if idx:
            check(np.take(a, idx, axis=axis).max(axis=axis),
                  np.take(x, idx, axis=axis).max(axis=axis))


# -- diagonal / trace ------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float64", "float32", "int32", "bool"])
def test_diagonal_and_trace(thread_engine, mats, dtype):
    x, a = mats[dtype]
    for k in (0, 3, -5, 30, -44, 31, -45):
        check(np.diagonal(a, k), np.diagonal(x, k), exact=True)
        check(np.diag(a.T, k), np.diag(x.T, k), exact=True)
    check(a.diagonal(), x.diagonal(), exact=True)
    want = np.trace(x)
    check(np.trace(a), want)
    check(a.trace(offset=2), x.trace(offset=2))
    check(np.diag(a.sum(0)), np.diag(x.sum(0)))  # 1-D small: in memory


def test_diagonal_reads_only_diagonal_units(thread_engine, tmp_path):
    x = np.arange(100 * 100, dtype="float64").reshape(100, 100)
    a = ta.from_numpy(x, tmp_path / "d.zarr", tile=(10, 10))
    plan = check(np.trace(a), np.trace(x))
    assert plan.bytes_read == 10 * 10 * 10 * 8  # the 10 diagonal tiles of 100
    plan = check(np.diag(a + a.T, 15), np.diag(x + x.T, 15))


@pytest.mark.parametrize("dtype", ["float64", "float32", "int32", "bool"])
def test_triu_tril(thread_engine, mats, tmp_path, dtype):
    """Lazy masks by element position, fused into the reads: any offset,
    through transposes, slices and joins (each part numbered in its own
    frame), of small results in memory; NumPy's dtype kept."""
    x, a = mats[dtype]
    z, c = mats["z"]
    for k in (0, 1, -1, 7, -20, 31, -45, 100):
        check(np.triu(a, k), np.triu(x, k), exact=True)
        check(np.tril(a, k), np.tril(x, k), exact=True)
    check(np.triu(a.T, 2), np.triu(x.T, 2), tmp_path, exact=True)
    check(np.tril(a[3:40:3, 5:], -1), np.tril(x[3:40:3, 5:], -1), tmp_path, exact=True)
    joined = np.concatenate([a.astype("float32"), c])
    want = np.concatenate([x.astype("float32"), z])
    check(np.tril(joined, 4), np.tril(want, 4), exact=True)
    check(np.triu(np.tril(joined, 4), -2), np.triu(np.tril(want, 4), -2), exact=True)
    check(np.triu(a, 3) + np.tril(a, 2), np.triu(x, 3) + np.tril(x, 2))
    check(np.triu(a.sum(axis=0)), np.triu(x.sum(axis=0)))  # 1-D small: n x n in memory
    check(np.tril(a.T @ a if dtype != "bool" else a.astype("f8").T @ a.astype("f8")),
          np.tril(x.T @ x if dtype != "bool" else x.astype("f8").T @ x.astype("f8")))
    assert str(np.triu(a, 3)).startswith("<TiledArray lazy triu(open(")
    # a mask reads only what its input reads
    assert np.triu(a, 3).plan().bytes_read == a.plan().bytes_read


def test_triu_tril_of_a_factor_and_bad_inputs(thread_engine, tmp_path, rng):
    x = rng.standard_normal((300, 6))
    r = ta.linalg.qr(ta.from_numpy(x, tmp_path / "x.zarr", tile=(70, 4)), mode="r")
    assert_close(np.asarray(np.triu(r)), np.asarray(r))  # R is upper triangular already
    with pytest.raises(TypeError, match="NumPy array"):
        ta.engine.expr.routines.tri(np.ones((2, 2)))
    with pytest.raises(TypeError):
        np.triu(ta.from_numpy(x, tmp_path / "y.zarr"), 1.5)


# -- cumsum / cumprod -------------------------------------------------------------------------


@pytest.mark.parametrize(("dtype", "axis"), [("float64", 0), ("float32", 1), ("int32", 0),
                                             ("bool", 1)])
def test_scans(thread_engine, mats, tmp_path, dtype, axis):
    x, a = mats[dtype]
    with dask.config.set(SMALL_BLOCKS):
        plan = check(np.cumsum(a, axis=axis), np.cumsum(x, axis=axis),
                     tmp_path if dtype == "float64" else None)
        assert "first pass" in str(plan)
        check(a.cumsum(axis=axis, dtype="float64"), x.cumsum(axis=axis, dtype="float64"))
        if dtype != "bool":
            small = (a / 20 + 1) if dtype != "int32" else (a % 3 + 1)
            smallx = (x / 20 + 1) if dtype != "int32" else (x % 3 + 1)
            check(np.cumprod(small, axis=axis), np.cumprod(smallx, axis=axis))
    with dask.config.set(SMALL_BLOCKS):  # axis=None: the flattened matrix, gathered now
        check(np.cumsum(a), np.cumsum(x))


def test_scan_passes_and_use_in_expressions(thread_engine, mats, tmp_path):
    x, a = mats["float32"]
    with dask.config.set(SMALL_BLOCKS):
        plan = check(a.cumsum(axis=0), x.cumsum(axis=0))
        last = next(s for s in plan.stages if s.kind == "map")
        assert plan.bytes_read < 2 * a.nbytes and last.bytes_read == a.nbytes
        check((a.cumsum(axis=1) - 1).sum(axis=0), (x.cumsum(axis=1) - 1).sum(axis=0))
        c = a.cumsum(axis=1)  # two reductions of a temporary: they wait for it
        check(c.sum(axis=0) + c.max(axis=0), x.cumsum(axis=1).sum(0) + x.cumsum(axis=1).max(0))
        check(a.sum(0).cumsum(), x.sum(0).cumsum())  # small: in memory


@HYP
@given(m=st.integers(1, 25), n=st.integers(1, 25), tile=st.tuples(st.integers(1, 8),
       st.integers(1, 8)), axis=st.integers(0, 1),
       op=st.sampled_from(["cumsum", "cumprod", "maximum", "minimum", "fmax", "fmin"]),
       dtype=st.sampled_from(["float64", "int64"]))
def test_scan_hypothesis(thread_engine, tmp_path_factory, m, n, tile, axis, op, dtype):
    rng = np.random.default_rng(m * 29 + n)
    x = (rng.random((m, n)) + 0.5).astype(dtype) if op == "cumprod" else \
        rand(rng, (m, n), dtype)
    if dtype == "int64" and op == "cumprod":
        x = rng.integers(-2, 3, size=(m, n))
    if op in ("maximum", "minimum", "fmax", "fmin") and dtype == "float64":
        x[rng.random((m, n)) < 0.1] = np.nan  # NaN propagates (maximum) or is skipped (fmax)
    a = ta.from_numpy(x, tmp_path_factory.mktemp("scan") / "x.zarr", tile=tile)
    fn = getattr(np, op) if op.startswith("cum") else getattr(np, op).accumulate
    with dask.config.set(SMALL_BLOCKS), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check(fn(a, axis=axis), fn(x, axis=axis), exact=not op.startswith("cum"))


@pytest.mark.parametrize("dtype", ["float64", "int32", "bool"])
def test_running_max_min(thread_engine, mats, tmp_path, dtype):
    """``np.maximum.accumulate`` (a running max) and friends: the scans'
    two passes with the ufunc's reduce for the totals; NumPy's dtype (the
    input's: int8 stays int8), NaNs propagated by maximum, skipped by fmax."""
    x, a = mats[dtype]
    with dask.config.set(SMALL_BLOCKS):
        for uf in [np.maximum, np.minimum, np.fmax, np.fmin]:
            for axis in [0, 1]:
                plan = check(uf.accumulate(a, axis=axis), uf.accumulate(x, axis=axis),
                             tmp_path if uf is np.maximum else None, exact=True)
                if dtype != "bool":  # 4 KiB blocks: bool rows fit in one band (no carries)
                    assert "first pass" in str(plan), str(plan)
        if dtype == "int32":
            check(np.add.accumulate(a.astype("int8"), axis=1),
                  np.add.accumulate(x.astype("int8"), axis=1), exact=True)
            check(np.maximum.accumulate(a, axis=1, dtype="float64"),
                  np.maximum.accumulate(x, axis=1, dtype="float64"), exact=True)
    check(np.maximum.accumulate(a.max(axis=1)), np.maximum.accumulate(x.max(axis=1)),
          exact=True)  # small: in memory
    if dtype != "float64":  # dtype= in memory too: int8 wraps, bool stays bool
        for kw in [{"dtype": np.int8}, {"dtype": bool}]:
            check(np.cumsum(a.max(axis=1) * 9, **kw), np.cumsum(x.max(axis=1) * 9, **kw),
                  exact=True)
    if dtype == "int32":  # dtype= is the accumulator's, as NumPy's (int8 wraps around)
        with dask.config.set(SMALL_BLOCKS):
            for kw in [{"dtype": np.int8}, {"dtype": bool}, {"dtype": np.uint8}, {}]:
                check(np.add.accumulate(a * 7, axis=0, **kw), np.add.accumulate(x * 7, axis=0, **kw),
                      exact=True)
                check(np.cumprod(a % 3, axis=1, **kw), np.cumprod(x % 3, axis=1, **kw), exact=True)


@pytest.mark.parametrize("dtype", ["float64", "float32", "int32", "bool"])
def test_rot90_delete_append_nan_scans_partition(thread_engine, mats, tmp_path, dtype):
    """np.rot90 / delete / append / atleast_2d / nancumsum / nancumprod /
    partition / argpartition and the .nonzero() method, against NumPy on ragged
    tiles (NaNs in float64); a partition is checked by its kth element and
    the order around it, which is all NumPy promises."""
    x, a = mats[dtype]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for k in range(-1, 5):
            check(np.rot90(a, k), np.rot90(x, k), tmp_path, exact=True)
        check(np.rot90(a, 1, axes=(1, 0)), np.rot90(x, 1, axes=(1, 0)), exact=True)
        for obj, axis in [([1, 3, 44], 0), (slice(2, 20, 3), 1), (-1, 1),
                          (np.arange(45) % 3 == 0, 0), (np.arange(0, 31, 2), 1)]:
            check(np.delete(a, obj, axis=axis), np.delete(x, obj, axis=axis), tmp_path,
                  exact=True)
        check(np.append(a, a[:3], axis=0), np.append(x, x[:3], axis=0), exact=True)
        check(np.append(a[:, 0], a[:, 1]), np.append(x[:, 0], x[:, 1]), exact=True)
        check(np.atleast_2d(a[:, 0]), np.atleast_2d(x[:, 0]), exact=True)
        assert np.atleast_2d(a) is a
        for got, want in zip(a.nonzero(), x.nonzero(), strict=True):
            np.testing.assert_array_equal(got, want)
        if dtype != "bool":
            for axis in (0, 1, None):
                check(np.nancumsum(a, axis=axis), np.nancumsum(x, axis=axis))
            if dtype != "int32":
                check(np.nancumprod(a / 4, axis=1), np.nancumprod(x / 4, axis=1))
        for axis, kth in [(0, 5), (1, -2), (1, [0, 30])]:
            part = np.partition(a, kth, axis=axis).compute()
            want = np.partition(x, kth, axis=axis)
            for k in np.atleast_1d(kth):
                line = [slice(None)] * 2
                line[axis] = k
                np.testing.assert_array_equal(part[tuple(line)], want[tuple(line)])
            idx = np.argpartition(a, kth, axis=axis).compute()
            np.testing.assert_array_equal(np.take_along_axis(x, idx, axis), part)
    with pytest.raises(IndexError, match="index 45 is out of bounds for axis 0 with size 45"):
        np.delete(a, 45, axis=0)
    with pytest.raises(TypeError, match="axis=0"):
        np.delete(a, 1)
    with pytest.raises(ValueError, match=r"kth\(=31\) out of bounds \(31\)"):
        np.partition(a, 31, axis=1)
    with pytest.raises(ValueError, match="Axes must be different"):
        np.rot90(a, axes=(1, 1))


# -- cov / corrcoef ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float64", "int32"])
def test_cov_corrcoef_one_pass(thread_engine, tmp_path, dtype):
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((203, 9)) * 0.01 + 1e4).astype(dtype) if dtype != "int32" else \
        rng.integers(-1000, 1000, size=(203, 9)).astype(dtype)
    a = ta.from_numpy(x, tmp_path / "x.zarr", tile=(40, 4))
    plan = check(np.cov(a, rowvar=False), np.cov(x, rowvar=False), tmp_path)
    mm = next(s for s in plan.stages if s.kind == "matmul")
    assert mm.bytes_read == a.nbytes  # X read once (its first row's units again, for the shift)
    row0 = sum(s.bytes_read for s in plan.stages if s.kind == "reduce" and s is plan.stages[0])
    assert row0 == 40 * 9 * x.dtype.itemsize
    check(np.cov(a.T), np.cov(x.T))
    check(np.cov(a, rowvar=False, bias=True), np.cov(x, rowvar=False, bias=True))
    check(np.cov(a, rowvar=False, ddof=3), np.cov(x, rowvar=False, ddof=3))
    check(np.cov(a.T, a.T * 2), np.cov(x.T, x.T * 2))
    check(np.corrcoef(a, rowvar=False), np.corrcoef(x, rowvar=False))
    check(np.corrcoef(a.T), np.corrcoef(x.T))
    # the plan's header writes the Gram once, named, not eight times (5.6 kB)
    header = str(np.corrcoef(a, rowvar=False).plan()).splitlines()[0]
    assert ", where t1 = " in header and header.count(".T @ ") == 1, header
    assert header.count("open(") <= 2 and len(header) < 900, header
    assert "where" not in str((a.T @ a).plan()).splitlines()[0]


def test_cov_corrcoef_float32_dtype_as_accurate_as_numpy(thread_engine, tmp_path):
    """``dtype=np.float32``: a float32 result no further from the float64
    answer than NumPy's own (the Gram's cancellation in float32 had made
    cov's error 2x NumPy's, corrcoef's 7x)."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((5000, 30)) * 3 + 100).astype(np.float32)
    a = ta.from_numpy(x, tmp_path / "x.zarr", tile=(700, 13))
    for f in (np.cov, np.corrcoef):
        exact = f(x.astype(np.float64), rowvar=False)
        got = f(a, rowvar=False, dtype=np.float32).compute()
        want = f(x, rowvar=False, dtype=np.float32)
        assert got.dtype == want.dtype == np.float32
        assert np.abs(got - exact).max() <= np.abs(want - exact).max(), f.__name__
    got = np.cov(a[:, 0], dtype=np.float32).compute()
    assert got.dtype == np.float32 and got.shape == ()
    assert_close(got, np.cov(x[:, 0], dtype=np.float32))


@pytest.mark.parametrize("dtype", ["float64", "float32", "int64"])
def test_cov_corrcoef_of_vectors_pairs_and_weights(thread_engine, tmp_path, dtype):
    """NumPy 2.4's cov / corrcoef rules as an analyst uses them: two columns
    (small results, lazy big vectors, NumPy), a 1-D variable (a 0-d result),
    a NumPy y beside a TiledArray, fweights / aweights, and NumPy's errors."""
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((61, 5)) * 10).astype(dtype)
    a = ta.from_numpy(x, tmp_path / "x.zarr", tile=(16, 3))
    lazy = a * 1  # its columns are lazy vectors over the stored matrix
    fw = rng.integers(0, 4, 61)
    aw = rng.uniform(0.1, 2, 61)
    cases = [
        lambda m, c: np.cov(m[:, 0], m[:, 1]),
        lambda m, c: np.corrcoef(m[:, 0], m[:, 1]),
        lambda m, c: np.cov(m[:, 2]),  # one variable: 0-d
        lambda m, c: np.corrcoef(m[:, 2]),
        lambda m, c: np.corrcoef(m[:, 0], c[:, 1]),  # NumPy y
        lambda m, c: np.cov(m, c[:, :2], rowvar=False),
        lambda m, c: np.cov(m[:, :1], rowvar=False),  # one column: 0-d
        lambda m, c: np.cov(m[:1], rowvar=False),  # one row, rowvar=False: 5 variables
        lambda m, c: np.cov(m.T, m[:, 0]),  # y a 1-D variable
        lambda m, c: np.corrcoef(m[:, 0], m[:, 1:3], rowvar=False),
        lambda m, c: np.cov(m, rowvar=False, fweights=fw),
        lambda m, c: np.cov(m, rowvar=False, aweights=aw, bias=True),
        lambda m, c: np.cov(m.T, fweights=fw, aweights=aw, ddof=2),
        lambda m, c: np.cov(m[:, 0], m[:, 3], aweights=aw),
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # NumPy's own, on one observation
        for i, case in enumerate(cases):
            want = case(x, x)
            for m in (a, lazy):
                got = case(m, x)
                res = got.compute()
                assert np.shape(res) == np.shape(want), (i, np.shape(res), np.shape(want))
                assert_close(res, want, err_msg=f"case {i}")
    with pytest.raises(TypeError, match="fweights must be integer"):
        np.cov(a, rowvar=False, fweights=aw)
    with pytest.raises(ValueError, match="aweights cannot be negative"):
        np.cov(a, rowvar=False, aweights=-aw)
    with pytest.raises(RuntimeError, match="incompatible numbers of samples and fweights"):
        np.cov(a, rowvar=False, fweights=fw[:10])
    with pytest.raises(TypeError, match="compute"):
        np.cov(a, rowvar=False, fweights=a[:, 0].astype(int))
    with pytest.raises(ValueError, match="must match exactly"):
        np.cov(a[:, 0], x[:10, 1])
    with pytest.raises(ValueError, match="ddof must be integer"):
        np.cov(a, ddof=1.5)
    with pytest.raises(ZeroDivisionError, match="Weights sum to zero"):
        np.cov(a, rowvar=False, fweights=np.zeros(61, int))
    # no observations: NumPy's NaNs, after its warning (it was a ValueError; helper-47)
    for f, kw in [(np.cov, dict(rowvar=False)), (np.corrcoef, dict(rowvar=False)),
                  (np.cov, dict(rowvar=False, bias=True)), (np.cov, {})]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            want = f(x[:0], **kw)
        with pytest.warns(RuntimeWarning, match="Degrees of freedom <= 0") if kw else \
                warnings.catch_warnings():
            got = f(a[:0], **kw).compute()
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


# -- isclose / allclose / average / outer ------------------------------------------------------


def test_isclose_allclose_average_outer(thread_engine, mats, tmp_path):
    x, a = mats["float64"]  # with NaNs
    y, b = mats["y"]
    xi = x.copy()
    xi[0, :3] = [np.inf, -np.inf, np.inf]
    ai = ta.from_numpy(xi, tmp_path / "inf.zarr", tile=(8, 7))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check(np.isclose(ai, a), np.isclose(xi, x), exact=True)
        check(np.isclose(ai, ai, equal_nan=True), np.isclose(xi, xi, equal_nan=True), exact=True)
        check(np.isclose(b, b + 1e-7, rtol=0, atol=1e-6), np.isclose(y, y + 1e-7, rtol=0,
                                                                     atol=1e-6), exact=True)
        check(np.isclose(b, 0.5), np.isclose(y, 0.5), exact=True)
    assert bool(np.allclose(b, b * (1 + 1e-9))) and not bool(np.allclose(b, b + 1))
    assert not bool(np.allclose(a, a)) and bool(np.allclose(a, a, equal_nan=True))
    w0, w1 = np.linspace(0, 1, 45), np.arange(13.0)
    check(np.average(b, axis=0, weights=w0), np.average(y, axis=0, weights=w0))
    check(np.average(b, axis=1, weights=w1), np.average(y, axis=1, weights=w1))
    check(np.average(b), np.average(y))
    got, scl = np.average(b, axis=1, weights=w1, returned=True)
    assert scl.shape == (45,) and np.all(scl == w1.sum())  # NumPy's: broadcast to the result
    with pytest.raises(ValueError, match="Length of weights"):
        np.average(b, axis=0, weights=w1)
    with dask.config.set(SMALL_BLOCKS):
        check(np.outer(b.sum(0), w0), np.outer(y.sum(0), w0), tmp_path)
        check(np.outer(w0, b.mean(0)) + 1, np.outer(w0, y.mean(0)) + 1)


# -- median / quantile / percentile -------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float64", "float32", "int32"])
def test_quantiles(thread_engine, mats, dtype):
    x, a = mats[dtype]
    with dask.config.set(SMALL_BLOCKS), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for axis in (0, 1):
            check(np.median(a, axis=axis), np.median(x, axis=axis))
            check(np.quantile(a, [0.1, 0.5, 1.0], axis=axis, method="nearest"),
                  np.quantile(x, [0.1, 0.5, 1.0], axis=axis, method="nearest"))
            check(np.percentile(a * 2, 37.5, axis=axis), np.percentile(x * 2, 37.5, axis=axis))
            if dtype == "float64":  # NaNs
                check(np.nanmedian(a, axis=axis), np.nanmedian(x, axis=axis))
                check(np.nanpercentile(a, [5, 95], axis=axis),
                      np.nanpercentile(x, [5, 95], axis=axis))
    with warnings.catch_warnings():  # all elements (see test_quantile_of_all_elements...)
        warnings.simplefilter("ignore")
        np.testing.assert_array_equal(np.asarray(np.median(a)), np.median(x))
        for axes in [(0, 1), (1, -2), (1,), [0]]:  # a tuple of axes, as NumPy
            check(np.median(a, axis=axes), np.median(x, axis=axes))
            check(np.quantile(a, [0.3, 0.6], axis=axes), np.quantile(x, [0.3, 0.6], axis=axes))
    with pytest.raises(ValueError, match="range"):
        np.quantile(a, 1.5, axis=0)
    with pytest.raises(ValueError, match="repeated axis"):
        np.median(a, axis=(0, 0))
    with pytest.raises(np.exceptions.AxisError):
        np.median(a, axis=(2,))


def test_quantiles_keepdims_and_empty_lines_like_numpy(thread_engine, mats, tmp_path):
    """keepdims=True gives NumPy's shape (a 3-D one, from several q, is
    refused naming it); the median of empty lines is NaN, as NumPy's."""
    x, a = mats["float64"]
    with dask.config.set(SMALL_BLOCKS), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for axis in (None, 0, 1, -1):
            for f in (np.median, np.nanmedian, lambda u, **k: np.percentile(u, 30, **k)):
                got = f(a, axis=axis, keepdims=True)
                want = f(x, axis=axis, keepdims=True)
                assert got.shape == want.shape
                check(got, want)
        v = ta.from_numpy(x[:, 1].copy(), tmp_path / "v.zarr", tile=(7,))
        check(np.median(v, keepdims=True), np.median(x[:, 1], keepdims=True))
    with pytest.raises(TypeError, match="3-D result"):
        np.quantile(a, [0.1, 0.9], axis=0, keepdims=True)
    for shape in [(0, 5), (5, 0)]:
        e = ta.from_numpy(np.empty(shape), tmp_path / f"e{shape[0]}.zarr", tile=(2, 2))
        for f in (np.median, np.nanmedian, lambda u, axis: np.nanquantile(u, 0.3, axis=axis),
                  lambda u, axis: np.nanpercentile(u, [10, 90], axis=axis)):
            for axis in (0, 1):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)
                    want = f(np.empty(shape), axis=axis)
                    got = np.asarray(f(e, axis=axis).compute())
                assert got.shape == want.shape
                np.testing.assert_array_equal(got, want)


def test_quantiles_of_narrow_bands_read_a_copy_once(tmp_path):
    """Bands of whole columns narrower than a unit read each unit once per
    band; above 4 reads of the input, the quantiles read a copy in units
    one band wide instead (a 2M x 256 median along rows in 65536 x 256
    chunks at 1 GiB a worker: 122 GiB read, now 7.6 GiB and 3.8 written)."""
    rng = np.random.default_rng(8)
    x = rng.standard_normal((60000, 64))
    with ta.Engine(n_workers=1, threads_per_worker=1, memory_per_worker="160MiB",
                   processes=False, quiet=True):
        a = ta.from_numpy(x, tmp_path / "x.zarr", tile=(5000, 64))
        for expr, want in [(np.median(a, axis=0), np.median(x, axis=0)),
                           (np.percentile(a, [5, 50], axis=0), np.percentile(x, [5, 50], axis=0))]:
            plan = expr.plan()
            assert [s.kind for s in plan.stages][:2] == ["map", "reduce"], str(plan)
            assert plan.bytes_read == 2 * x.nbytes, str(plan)  # the input, then the copy
            check(expr, want)


def test_flattening_refusal_names_the_call_and_the_axis(tmp_path):
    """A matrix flattened into one task (NumPy's axis=None, ravel, reshape)
    and refused there is named by the user's call, with the axis that would
    not gather it, not by the internal selection of every element
    (helper-44: ``open(...)[full((4000, 4000), True)]``)."""
    import zarr

    zarr.create_array(str(tmp_path / "x.zarr"), shape=(3000, 3000), chunks=(500, 500),
                      dtype="float64")  # metadata only: refused before any read
    with ta.Engine(n_workers=1, threads_per_worker=1, memory_per_worker="160MiB",
                   processes=False, quiet=True):
        a = ta.open(tmp_path / "x.zarr")
        for call, name, axis_hint in [(lambda: np.cumsum(a), r"np\.cumsum\(a\)", True),
                                      (lambda: np.sort(a, axis=None), r"np\.sort\(a\)", True),
                                      (lambda: a.ravel(), r"a\.ravel\(\)", False),
                                      (lambda: a.reshape(1000, 9000),
                                       r"a\.reshape\(\(1000, 9000\)\)", False)]:
            with pytest.raises(ta.PlanningError, match=name + " .*gathers all 9000000 elements "
                               r"of the 3000 x 3000 matrix into one task") as err:
                call()
            assert ("pass axis=0 or axis=1" in str(err.value)) == axis_hint
            assert "memory_per_worker >=" in str(err.value)
        assert_close(np.asarray(np.cumsum(a, axis=0)[:2, :3]), np.zeros((2, 3)))


def test_whole_array_quantile_refusal_names_the_call(tmp_path):
    """A quantile over all elements refused under the budget is named by the
    user's call, before the internal pass that did not fit (the census's
    fused reductions: helper-44 saw only ``isnan(open(...)).sum(...)``)."""
    import zarr

    zarr.create_array(str(tmp_path / "x.zarr"), shape=(4000, 4000), chunks=(1000, 1000),
                      dtype="float64")  # metadata only: refused before any read
    with ta.Engine(n_workers=1, threads_per_worker=1, memory_per_worker="150MiB",
                   processes=False, quiet=True):
        a = ta.open(tmp_path / "x.zarr")
        for call, name in [(lambda: np.percentile(a, [5, 50]), "percentile"),
                           (lambda: np.nanmedian(a), "nanmedian"),
                           (lambda: np.quantile(a, 0.3), "quantile")]:
            with pytest.raises(ta.PlanningError, match=rf"^np\.{name}\(a\) over all 16000000 "
                               r"elements \(axis=None\): .*memory_per_worker >= \d+MiB"):
                call()


@pytest.fixture
def tall(tmp_path):
    """A 200,000,000 x 4 float64 array (6 GiB) with only its metadata written."""
    import zarr

    zarr.create_array(str(tmp_path / "big.zarr"), shape=(200_000_000, 4), chunks=(1_000_000, 4),
                      dtype="float64")
    return ta.open(tmp_path / "big.zarr")


def test_quantile_refused_when_a_column_does_not_fit(tall):
    a = tall
    budget = ta.Budget(memory_per_worker="1GiB", threads_per_worker=1)
    with pytest.raises(ta.PlanningError, match="whole lines along axis 0"):
        np.median(a, axis=0).plan(budget=budget)
    plan = np.median(a, axis=1).plan(budget=budget)  # rows of 4: fine
    assert plan.bytes_read == a.nbytes


def test_quantile_bands_inside_units_and_refusals_that_plan(tmp_path):
    """Planned on metadata alone (helper-35's cases). Bands cut inside a unit
    are a divisor of it wide (a band across a unit's edge reads two units, so
    the suggested memory used never to plan: 145 -> 153 -> refused -> 176 ->
    211 -> refused); a band whose unit reads are most of its peak is not
    narrowed to one line per task (a 2M x 256 median along rows in 100,000-row
    chunks ran many minutes building 2M blocks before its refusal)."""
    import time

    import zarr

    zarr.create_array(str(tmp_path / "f4.zarr"), shape=(4000, 4000), chunks=(1024, 1024),
                      dtype="float32")
    a = ta.open(tmp_path / "f4.zarr")
    with pytest.raises(ta.PlanningError, match=r"memory_per_worker >= (\d+)MiB") as e:
        np.median(a, axis=0).plan(budget=ta.Budget.from_config("145MiB", 2, 1))
    need = re.search(r"memory_per_worker >= (\d+)MiB", str(e.value)).group(1)
    plan = np.median(a, axis=0).plan(budget=ta.Budget.from_config(f"{need}MiB", 2, 1))
    width = int(plan.stages[0].description.split(" bands")[0].rsplit(" ", 1)[1])
    assert plan.peak_task_memory <= plan.budget.task_memory and width >= 4000 // 1024
    zarr.create_array(str(tmp_path / "tall.zarr"), shape=(2_000_000, 256),
                      chunks=(100_000, 256), dtype="float64")
    t = time.process_time()
    with pytest.raises(ta.PlanningError, match="whole lines along axis 1") as e:
        np.median(ta.open(tmp_path / "tall.zarr"), axis=1).plan(
            budget=ta.Budget.from_config("180MiB", 2, 1))
    assert time.process_time() - t < 30  # was many minutes (not a timing test: a hang)
    need = re.search(r"memory_per_worker >= (\d+)MiB", str(e.value)).group(1)
    plan = np.median(ta.open(tmp_path / "tall.zarr"), axis=1).plan(
        budget=ta.Budget.from_config(f"{need}MiB", 2, 1))
    assert plan.tasks < 1000, plan


def test_quantile_along_rows_of_a_square_matrix_plans_its_reads(thread_engine, tmp_path):
    """A band of a square matrix spanning all rows, read strip by strip along
    axis 1: the plan costs the strips the worker reads (it had costed row
    strips: 32,000,000 bytes planned, 1,280,000 read)."""
    x = np.random.default_rng(3).standard_normal((400, 400))
    a = ta.from_numpy(x, tmp_path / "x.zarr", tile=(100, 4))
    for q in (None, [0.1, 0.9]):
        expr = np.median(a, axis=1) if q is None else np.quantile(a, q, axis=1)
        check(expr, np.median(x, axis=1) if q is None else np.quantile(x, q, axis=1))


# -- sort / argsort along an axis ----------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float64", "float32", "int32", "bool"])
def test_sort_along_an_axis(thread_engine, mats, tmp_path, dtype):
    """np.sort / np.argsort of a matrix along axis 0 or 1 (NaNs last, ties
    as NumPy's kind): whole lines per task, each band read once and written
    whole, stored and computed; inside expressions (a temporary)."""
    x, a = mats[dtype]
    with dask.config.set(SMALL_BLOCKS):
        for axis in [0, 1, -1]:
            plan = check(np.sort(a, axis=axis), np.sort(x, axis=axis), tmp_path, exact=True)
            assert plan.bytes_read == a.nbytes, str(plan)  # units never split between bands
            assert plan.tasks > 1, str(plan)
            check(np.argsort(a, axis=axis, kind="stable"), np.argsort(x, axis=axis, kind="stable"),
                  tmp_path, exact=True)
        check(np.sort(a.T * 2, stable=True), np.sort(x.T * 2, kind="stable"), exact=True)
        check(np.sort(a, axis=0)[-3:].sum(axis=0), np.sort(x, axis=0)[-3:].sum(axis=0))
    check(np.sort(a[:0], axis=0), np.sort(x[:0], axis=0), exact=True)
    check(np.sort(a.max(axis=1)), np.sort(x.max(axis=1)), exact=True)  # small: in memory
    with dask.config.set(SMALL_BLOCKS):  # all elements: gathered now, then NumPy's
        check(np.sort(a, axis=None), np.sort(x, axis=None), exact=True)
        check(np.argsort(a.T, axis=None, kind="stable"), np.argsort(x.T, axis=None, kind="stable"),
              exact=True)
    with pytest.raises(np.exceptions.AxisError):
        np.argsort(a, axis=2)
    with pytest.raises(TypeError, match="order="):
        np.sort(a, order="f0")


def test_lines_of_odd_chunks_under_a_small_budget(tmp_path):
    """Bands narrower than the output's units (inherited from X's 1999 x 37
    chunks) are never cut inside them: the tile shrinks until whole units
    fit (helper-51: bands of 501 rows into 1000-row units, refused by the
    store as the job wrote, an incomplete output left)."""
    import zarr

    x = np.random.default_rng(0).standard_normal((6002, 77))
    zarr.create_array(str(tmp_path / "x.zarr"), shape=x.shape, chunks=(1999, 37),
                      dtype="f8")[...] = x
    with ta.Engine(n_workers=2, threads_per_worker=1, memory_per_worker="150MiB",
                   processes=False, quiet=True):
        a = ta.open(tmp_path / "x.zarr")
        for k, (expr, want) in enumerate([(np.sort(a, axis=1), np.sort(x, axis=1)),
                                          (np.argsort(a, axis=1), np.argsort(x, axis=1))]):
            out = tmp_path / f"s{k}.zarr"
            plan = expr.plan(out)
            np.testing.assert_array_equal(np.asarray(expr.to_zarr(out)[...]), want)
            assert expr.stats.tasks == plan.tasks > 1, str(plan)
        # lines along axis 0 read in strips a small task holds beside its band: X read
        # once (the whole X had been one strip: bands of a column, X read 36 times)
        for expr, want in [(np.median(a, axis=0), np.median(x, axis=0)),
                           (np.percentile(a, [5, 95], axis=0), np.percentile(x, [5, 95], axis=0))]:
            plan = expr.plan()
            assert plan.bytes_read <= 1.1 * x.nbytes, str(plan)
            assert_close(np.asarray(expr.compute()), want)
            assert expr.stats.bytes_read == plan.bytes_read
        # over all elements: the census pass's 5 reductions priced one at a time, as
        # they run (their sum, 9.48 MiB a task, had been refused at 7.5 MiB)
        assert float(np.median(a)) == np.median(x)
        assert_close(np.asarray(np.percentile(a, [1, 99])), np.percentile(x, [1, 99]))


@HYP
@given(m=st.integers(1, 30), n=st.integers(1, 30), tile=st.tuples(st.integers(1, 9),
       st.integers(1, 9)), axis=st.integers(0, 1), op=st.sampled_from(["sort", "argsort"]),
       block=st.sampled_from([64, 4096, 1 << 20]))
def test_sort_hypothesis(thread_engine, tmp_path_factory, m, n, tile, axis, op, block):
    rng = np.random.default_rng(m * 31 + n)
    x = rng.integers(-4, 4, size=(m, n)).astype("float64")  # many ties
    x[rng.random((m, n)) < 0.1] = np.nan
    a = ta.from_numpy(x, tmp_path_factory.mktemp("sort") / "x.zarr", tile=tile)
    with dask.config.set({"tilearray.map.block-bytes": block}):
        check(getattr(np, op)(a, axis=axis, kind="stable"),
              getattr(np, op)(x, axis=axis, kind="stable"), exact=True)


def test_flattening_refused_when_it_does_not_fit(thread_engine, tall):
    a = tall  # nothing written: refused before any read
    for flatten in [lambda: a.ravel(), lambda: a.reshape(4, -1), lambda: np.sort(a, axis=None)]:
        with pytest.raises(ta.PlanningError, match="800000000"):  # the compute limit
            flatten()


def test_sort_refused_when_a_line_does_not_fit(tall, tmp_path):
    a = tall
    budget = ta.Budget(memory_per_worker="1GiB", threads_per_worker=1)
    with pytest.raises(ta.PlanningError, match="whole lines along axis 0"):
        np.sort(a, axis=0).plan(budget=budget)
    plan = np.argsort(a, axis=1).plan(tmp_path / "out.zarr", budget=budget)  # rows of 4: fine
    assert plan.bytes_read == a.nbytes and plan.bytes_written == a.size * 8
    assert plan.peak_task_memory <= budget.task_memory


# -- unique of a matrix -------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float64", "int32", "bool"])
def test_unique_of_a_matrix(thread_engine, tmp_path, dtype):
    """np.unique of all the elements of a matrix: blocks' distinct values
    merged up a tree; counts, first flat indices and NaNs as NumPy's."""
    rng = np.random.default_rng(5)
    x = rng.integers(-3, 4, size=(97, 23)).astype(dtype)
    if dtype == "float64":
        x[rng.random(x.shape) < 0.05] = np.nan
    a = ta.from_numpy(x, tmp_path / "x.zarr", tile=(10, 6))
    with dask.config.set(SMALL_BLOCKS):
        for e, y in [(a, x), (a.T, x.T), (a[5:, 3:] * 2, x[5:, 3:] * 2)]:
            for kw in [{}, {"return_counts": True}, {"return_index": True, "return_counts": True},
                       {"equal_nan": False, "return_counts": True}]:
                got, want = np.unique(e, **kw), np.unique(y, **kw)
                for g, w in zip(*((got, want) if kw else ((got,), (want,))), strict=True):
                    assert g.dtype == w.dtype, (g.dtype, w.dtype)
                    np.testing.assert_array_equal(g, w)
    np.testing.assert_array_equal(np.unique(a[:0]), np.unique(x[:0]))
    if dtype != "float64":  # np.bincount of a column, weighted by another
        col, w = (a[:, 2] + 3).astype("int64"), a[:, 4] * 0.5
        np.testing.assert_array_equal(np.bincount(col), np.bincount((x[:, 2] + 3).astype("int64")))
        np.testing.assert_array_equal(np.bincount(col, weights=w, minlength=9),
                                      np.bincount((x[:, 2] + 3).astype("int64"),
                                                  weights=x[:, 4] * 0.5, minlength=9))
        with pytest.raises(ValueError, match="too deep"):
            np.bincount(a)
    with dask.config.set(SMALL_BLOCKS):  # the inverse: a lazy matrix of codes, as NumPy's
        for e, y in [(a, x), (a.T[3:], x.T[3:])]:
            got = np.unique(e, return_index=True, return_inverse=True, return_counts=True)
            want = np.unique(y, return_index=True, return_inverse=True, return_counts=True)
            for g, w in zip(got, want, strict=True):
                g = np.asarray(g)
                assert g.dtype == w.dtype and g.shape == w.shape
                np.testing.assert_array_equal(g, w)
    if dtype == "float64":
        with pytest.raises(TypeError, match="equal_nan=True"):
            np.unique(a, return_inverse=True, equal_nan=False)
    with pytest.raises(TypeError, match="axis"):
        np.unique(a, axis=0)


def test_unique_first_positions_and_signed_zeros_across_blocks(thread_engine):
    """Merged by value then first flat position, as NumPy's stable sort: NaNs
    (equal_nan=False) in flat order, and of -0.0 / 0.0 the first one kept."""
    x = np.array([[1.0, 1.0, np.nan, 5.0], [np.nan, 2.0, 3.0, 4.0]])
    z = np.array([[1.0, 1.0, 0.0, 5.0], [-0.0, 2.0, 3.0, 4.0]])
    with dask.config.set({"tilearray.map.block-bytes": 32}):  # 2 x 2 blocks
        for y, kw in [(x, {"equal_nan": False}), (x, {}), (z, {}), (z[::-1], {})]:
            a = ta.from_numpy(y, tile=(2, 2))
            for g, w in zip(np.unique(a, return_index=True, return_counts=True, **kw),
                            np.unique(y, return_index=True, return_counts=True, **kw),
                            strict=True):
                np.testing.assert_array_equal(g, w)
                assert np.array_equal(np.signbit(g), np.signbit(w))


def test_unique_inverse_codes_in_the_values_dtype(thread_engine):
    """The inverse searches the distinct values in their own dtype: one value
    and NaN (NaN last), uint64 beyond 2**63 (no float64 rounding), bool."""
    for x in [np.array([[1.0, np.nan], [1.0, 1.0]]),
              np.array([[7, 2**60], [2**60 + 1, 2**60 + 2]], np.uint64),
              np.array([[0, 2**64 - 2], [2**64 - 1, 5]], np.uint64),
              np.array([[True, False], [True, True]])]:
        got = np.unique(ta.from_numpy(x, tile=(1, 1)), return_inverse=True)
        want = np.unique(x, return_inverse=True)
        for g, w in zip(got, want, strict=True):
            g = np.asarray(g)
            assert g.dtype == w.dtype
            np.testing.assert_array_equal(g, w)


def test_unique_stops_on_too_many_values(thread_engine, tmp_path, monkeypatch):
    from tilearray.engine.plan import npfuncs as pnp

    x = np.arange(600.0).reshape(30, 20)
    a = ta.from_numpy(x, tmp_path / "x.zarr", tile=(8, 8))
    monkeypatch.setattr(pnp, "UNIQUE_LIMIT", 100)
    with dask.config.set(SMALL_BLOCKS), pytest.raises(ValueError, match="more than 100 distinct"):
        np.unique(a)
    np.testing.assert_array_equal(np.unique(a % 7), np.unique(x % 7))


def test_gather_positions_travel_compactly():
    """A gather's spec is in every task: a mask's increasing positions are
    pickled as the mask's bits (1 bit a row, not 8 bytes a position)."""
    import pickle

    from tilearray.graphs.spec import Index

    rng = np.random.default_rng(0)
    for v in [np.flatnonzero(rng.random(100_000) > 0.5), np.array([5, 3, 9, 3]),
              np.arange(1000) * 100, np.array([], dtype=np.int64), np.arange(99_999, -1, -1),
              np.arange(7, 100_000, 3), np.r_[np.arange(100), 5]]:
        i = Index(v)
        j = pickle.loads(pickle.dumps(i))
        assert j == i and np.array_equal(j.values, v)
    assert len(pickle.dumps(Index(np.flatnonzero(rng.random(100_000) > 0.5)))) < 13_000
    # a reversed or strided slice's positions (a[::-1]) travel as their range
    assert len(pickle.dumps(Index(np.arange(99_999, -1, -1)))) < 200


def test_joins_of_small_results_in_memory(thread_engine, mats):
    x, a = mats["float64"]
    y, b = mats["y"]
    check(np.stack([b.mean(0), b.std(0)]), np.stack([y.mean(0), y.std(0)]))
    check(np.stack([b.mean(0), b.max(0)], axis=1), np.stack([y.mean(0), y.max(0)], axis=1))
    check(np.hstack([b.sum(0), b.min(1)]), np.hstack([y.sum(0), y.min(1)]))
    check(np.vstack([b.sum(0), b.max(0)]), np.vstack([y.sum(0), y.max(0)]))
    check(np.concatenate([b.sum(0), b.sum(1)]), np.concatenate([y.sum(0), y.sum(1)]))


# -- round, nan_to_num, ptp, diff --------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float64", "float32", "int32", "bool"])
def test_round_nan_to_num_ptp(thread_engine, mats, tmp_path, dtype):
    x, a = mats[dtype]
    if dtype != "bool":
        for d in (0, 2, -1):
            check(np.round(a, d), np.round(x, d), tmp_path, exact=True)
        check(np.around(a), np.around(x), exact=True)
        check(a.round(1), x.round(1), exact=True)
        for axis in (None, 0, 1):
            with warnings.catch_warnings():  # NaN columns: NumPy warns nothing for max - min
                warnings.simplefilter("ignore")
                check(np.ptp(a, axis=axis), np.ptp(x, axis=axis), exact=True)
        check(np.ptp(a, axis=0, keepdims=True), np.ptp(x, axis=0, keepdims=True), exact=True)
    else:
        with pytest.raises(TypeError, match="boolean subtract"):
            np.ptp(a)
    check(np.nan_to_num(a), np.nan_to_num(x), tmp_path, exact=True)
    with pytest.raises(TypeError, match="decimals"):
        a.round(1.5)


def test_nan_to_num_replacements(thread_engine, tmp_path):
    x = np.array([[np.nan, np.inf, -np.inf, 1.5]] * 5)
    a = ta.from_numpy(x, tmp_path / "x.zarr", tile=(2, 3))
    check(np.nan_to_num(a, nan=-1.0, posinf=9.0, neginf=-9.0),
          np.nan_to_num(x, nan=-1.0, posinf=9.0, neginf=-9.0), exact=True)
    check(np.nan_to_num(a.astype("float32")), np.nan_to_num(x.astype("float32")), exact=True)


@pytest.mark.parametrize("dtype", ["float64", "int32", "bool"])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_diff_matches_numpy(thread_engine, mats, tmp_path, dtype, axis):
    x, a = mats[dtype]
    for n in (0, 1, 2, 3, 9, 31, 60):  # n >= the length along the axis: empty, as NumPy
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # int32 wraps, as NumPy's repeated differences
            want = np.diff(x, n=n, axis=axis)
        plan = check(np.diff(a, n=n, axis=axis), want, tmp_path, exact=n <= 1 or dtype != "float64")
        if 0 < n < 9:  # n + 1 shifted slices: a read n + 1 times at most (was 2^n)
            assert plan.bytes_read <= (n + 1) * (a * 1).plan().bytes_read, (n, plan)
    v, want = a[:, 3], x[:, 3]  # a 1-D result
    check(np.diff(v), np.diff(want), exact=True)
    with pytest.raises(ValueError, match="order"):
        np.diff(a, n=-1)
    with pytest.raises(TypeError, match="integer"):
        np.diff(a, n=1.0)
    if dtype == "int32":  # C(70, 35) does not fit int64: reduced modulo 2^32 first
        col = a[:, 0]
        check(np.diff(col, n=40), np.diff(x[:, 0], n=40), exact=True)
    for kw in [dict(prepend=0), dict(append=7, axis=0), dict(prepend=1, append=2, n=2),
               dict(prepend=x[:1], axis=0), dict(append=x[:, :1])]:
        check(np.diff(a, **kw), np.diff(x, **kw), exact=dtype != "float64")
    check(np.diff(v, prepend=0), np.diff(want, prepend=0), exact=True)
    with pytest.raises(np.exceptions.AxisError):
        np.diff(a, axis=2)


def test_a_small_result_shared_by_two_ops_is_counted_once(thread_engine, mats):
    """``m + m`` and ``m[1:] - m[:-1]`` read ``a`` once for ``m``: the run's
    figures equal the plan's (each small op used to carry its operand's
    stats, so a shared operand was counted twice: 9 tasks for 5)."""
    x, a = mats["float64"]
    m = np.nanmax(a, axis=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = np.nanmax(x, axis=1)
    once = check(m, want).bytes_read
    for expr, value in ((m + m, want + want), (m[1:] - m[:-1], want[1:] - want[:-1]),
                        ((m + 1) * (m - 1), (want + 1) * (want - 1))):
        plan = check(expr, value)
        assert plan.bytes_read == once and expr.stats.bytes_read == once


# -- sort, argsort, unique, histogram of small results ---------------------------------------


@pytest.mark.parametrize("dtype", ["float64", "int32", "bool"])
def test_sort_unique_histogram_of_columns(thread_engine, mats, dtype):
    x, a = mats[dtype]
    col, want = a[:, 5], x[:, 5]
    check(np.sort(col), np.sort(want), exact=True)
    check(np.argsort(col, kind="stable"), np.argsort(want, kind="stable"), exact=True)
    check(np.sort(a.sum(axis=0)), np.sort(x.sum(axis=0)), exact=dtype != "float64")
    for got, ref in zip(np.unique(col, return_counts=True, return_inverse=True),
                        np.unique(want, return_counts=True, return_inverse=True), strict=True):
        np.testing.assert_array_equal(got, ref)
    if dtype != "bool":
        finite = np.nan_to_num(col)
        for kw in ({}, {"bins": 4, "range": (-1, 1)}, {"bins": [-2, 0, 0.5, 3], "density": True}):
            got, edges = np.histogram(finite, **kw)
            ref, ref_edges = np.histogram(np.nan_to_num(want), **kw)
            assert_close(got, ref)
            assert_close(edges, ref_edges)
    for f in (np.sort, np.argsort):  # a matrix: test_sort_along_an_axis
        np.testing.assert_array_equal(np.asarray(f(a, axis=None, kind="stable")),
                                      f(x, axis=None, kind="stable"))
    got, want = np.unique(a, return_counts=True), np.unique(x, return_counts=True)
    for g, w in zip(got, want, strict=True):  # a matrix: test_unique_of_a_matrix
        np.testing.assert_array_equal(g, w)
    w = np.arange(x.shape[1]) % 3  # a blocked vector a @ w: computed first
    product = np.nan_to_num(x).astype("f8") @ w
    np.testing.assert_array_equal(np.sort(np.nan_to_num(a) @ w), np.sort(product))
    np.testing.assert_array_equal(np.histogram(np.nan_to_num(a) @ w)[0],
                                  np.histogram(product)[0])


# -- einsum ------------------------------------------------------------------------------------


@pytest.mark.parametrize("sub, names", [
    ("ij->ji", "x"), ("ij->", "x"), ("ij->i", "x"), ("ij->j", "x"), ("ji", "x"), ("ii->", "s"),
    ("ii->i", "s"), ("ii", "s"), ("ij,ij->ij", "xy"), ("ij,ij->i", "xy"), ("ij,ij->j", "xy"),
    ("ij,ij->", "xy"), ("ij,ij->ji", "xy"), ("ij,jk->ik", "xs"), ("ij,kj->ik", "xy"),
    ("ij,ik->jk", "xy"), ("ij,ik->kj", "xy"), ("ji,jk->ik", "xy"), ("ij,j->i", "xv"),
    ("ij,j", "xv"), ("i,ij->j", "ux"), ("ij,i->j", "xu"), ("i,i->", "vv"), ("i,j->ij", "uv"),
    ("i,j->ji", "uv"), ("ij,jk", "xs"), ("ij,j->i", "xw")])
def test_einsum_matches_numpy(thread_engine, tmp_path_factory, sub, names):
    rng = np.random.default_rng(20)
    d = tmp_path_factory.mktemp("einsum")
    data = {"x": rng.standard_normal((45, 31)), "y": rng.standard_normal((45, 31)),
            "s": rng.standard_normal((31, 31)), "v": rng.standard_normal(31),
            "u": rng.standard_normal(45)}
    tiles = {"x": (8, 7), "y": (11, 5), "s": (7, 9), "v": (7,), "u": (16,)}
    stored = {k: ta.from_numpy(a, d / f"{k}.zarr", tile=tiles[k]) for k, a in data.items()}
    stored["w"] = data["w"] = data["v"]  # a NumPy operand
    got = np.einsum(sub, *(stored[n] for n in names))
    want = np.einsum(sub, *(data[n] for n in names))
    assert_close(np.asarray(got.compute() if hasattr(got, "compute") else got), want)


@pytest.mark.parametrize("dtype", ["int8", "bool", "float32"])
def test_einsum_keeps_the_operands_dtype(thread_engine, tmp_path, dtype):
    """As NumPy's einsum: int8 sums wrap, bool sums are ors (sum would widen)."""
    rng = np.random.default_rng(7)
    x = (rng.integers(-100, 100, (9, 9)) if dtype == "int8" else rng.standard_normal((9, 9))
         if dtype == "float32" else rng.random((9, 9)) < 0.3).astype(dtype)
    a = ta.from_numpy(x, tmp_path / "x.zarr", tile=(4, 3))
    for sub, ops, nops in [("ij->i", (a,), (x,)), ("ij->", (a,), (x,)), ("ii", (a,), (x,)),
                           ("ij,ij->j", (a, a), (x, x)), ("ij,jk", (a, a), (x, x))]:
        got = np.einsum(sub, *ops)
        got = np.asarray(got.compute() if hasattr(got, "compute") else got)
        want = np.einsum(sub, *nops)
        assert got.dtype == want.dtype, (sub, got.dtype, want.dtype)
        assert_close(got, want)


def test_einsum_refusals(thread_engine, mats):
    _, a = mats["float64"]
    for sub, ops, err in [("ij,jk,kl->il", (a, a.T, a), TypeError), ("...j->j", (a,), TypeError),
                          ("ij,jk->ijk", (a, a.T), TypeError), ("ijk->i", (a,), ValueError),
                          ("ij->ik", (a,), ValueError), ("ij->ii", (a,), ValueError),
                          ("ii", (a,), ValueError), ("i1", (a,), ValueError)]:  # 45 x 31
        with pytest.raises(err):
            np.einsum(sub, *ops)
    with pytest.raises(TypeError, match="out"):
        np.einsum("ij->j", a, out=np.zeros(31))


# -- flips, negative steps, axes, products as NumPy spells them ----------------------------


@pytest.mark.parametrize("dtype", ["float64", "int32", "bool"])
def test_negative_steps_and_flips(thread_engine, mats, tmp_path, dtype):
    """``a[::-1]`` and friends gather the positions in that order: exact
    values, stored and computed, with the plan's figures."""
    x, a = mats[dtype]
    for key in [np.s_[::-1], np.s_[::-2, ::3], np.s_[40:3:-7, 30:2:-5], np.s_[::-1, ::-1],
                np.s_[-2::-3, 5], np.s_[5, ::-1], np.s_[[3, 1], ::-1], np.s_[..., ::-1],
                np.s_[x.shape[0] // 2::-1, 1::2]]:
        check(a[key], x[key], tmp_path, exact=True)
    check(np.flip(a), np.flip(x), exact=True)
    check(np.flip(a, 1), np.flip(x, 1), exact=True)
    check(np.flip(a, (0, -1)), np.flip(x, (0, -1)), exact=True)
    check(np.flipud(a), np.flipud(x), exact=True)
    check(np.fliplr(a), np.fliplr(x), tmp_path, exact=True)
    assert np.asarray(a[0:5:-1]).shape == x[0:5:-1].shape == (0, x.shape[1])
    if dtype == "float64":
        y, b = mats["y"]
        check(a[::-1].T @ b[::-1], x.T @ y)  # the same rows, both reversed
        check(np.flip(b.sum(axis=1)), np.flip(y.sum(axis=1)))  # a small 1-D result
        check(b.mean(axis=0)[::-2], y.mean(axis=0)[::-2])
    with pytest.raises(ValueError, match="step cannot be zero"):
        a[::0]
    with pytest.raises(np.exceptions.AxisError):
        np.flip(a, 2)
    with pytest.raises(ValueError, match=">= 2-d"):
        np.fliplr(a.sum(axis=0))


def test_reversed_positions_read_each_unit_once(thread_engine, mats):
    """A reversed read reads what the forward one does (each unit once)."""
    _, a = mats["float64"]
    assert a[::-1].plan().bytes_read == a[:, :].plan().bytes_read
    assert a[::-1, ::-1].sum(axis=0).plan().bytes_read == a.sum(axis=0).plan().bytes_read


def test_ufunc_reduce_and_accumulate(thread_engine, mats):
    """``np.add.reduce`` and the like are the reductions they name, with
    NumPy's default ``axis=0``; ``accumulate`` the scans."""
    x, a = mats["float64"]
    xi, ai = mats["int32"]
    for uf in [np.add, np.multiply, np.maximum, np.minimum, np.fmax, np.fmin]:
        for axis in [0, 1, None]:
            check(uf.reduce(ai, axis=axis), uf.reduce(xi, axis=axis))
        check(uf.reduce(a), uf.reduce(x))
    check(np.add.reduce(ai, axis=1, keepdims=True, dtype="int64"),
          np.add.reduce(xi, axis=1, keepdims=True, dtype="int64"))
    xb, ab = mats["bool"]
    check(np.logical_and.reduce(ab, axis=1), np.logical_and.reduce(xb, axis=1))
    check(np.logical_or.reduce(ab), np.logical_or.reduce(xb))
    check(np.add.accumulate(ai), np.add.accumulate(xi))
    check(np.multiply.accumulate(a[:6], axis=1), np.multiply.accumulate(x[:6], axis=1))
    with pytest.raises(TypeError, match="np.subtract.reduce is not supported"):
        np.subtract.reduce(a)
    with pytest.raises(TypeError, match="initial"):
        np.add.reduce(a, initial=1.0)
    with pytest.raises(ValueError, match="axis=None"):
        np.add.accumulate(a, axis=None)
    for bad in [lambda: np.add.reduce(a, 2), lambda: a.sum(axis=2), lambda: a.max(axis=-3)]:
        with pytest.raises(np.exceptions.AxisError):  # NumPy's error (a PlanningError too)
            bad()


def test_products_axes_and_small_helpers(thread_engine, mats):
    x, a = mats["float64"]
    x = np.nan_to_num(x)
    a = np.nan_to_num(a)
    y, b = mats["y"]
    check(np.tensordot(a, b, axes=([0], [0])), np.tensordot(x, y, axes=([0], [0])))
    check(np.tensordot(a.T, b, axes=1), np.tensordot(x.T, y, axes=1))
    check(np.tensordot(a, a, axes=2), np.tensordot(x, x, axes=2))
    check(np.tensordot(a, a, axes=([1, 0], [1, 0])), np.tensordot(x, x, axes=([1, 0], [1, 0])))
    check(np.inner(a, a[:5]), np.inner(x, x[:5]))
    check(np.inner(b.sum(0), b.max(0)), np.inner(y.sum(0), y.max(0)))
    check(np.vdot(a, a), np.vdot(x, x))
    check(a.T.dot(b), x.T.dot(y))
    for f in [lambda u: np.swapaxes(u, 0, 1), lambda u: np.swapaxes(u, 1, 1),
              lambda u: np.moveaxis(u, 0, -1), lambda u: np.moveaxis(u, [0, 1], [0, 1]),
              lambda u: u.swapaxes(1, 0), lambda u: np.squeeze(u[:, 2:3]),
              lambda u: np.squeeze(u[4:5], axis=0), lambda u: u[:, :1].squeeze(),
              lambda u: np.expand_dims(u.sum(0), 0), lambda u: np.expand_dims(u.sum(0), -1),
              lambda u: np.column_stack([u.sum(1), u[:, 3]]),
              lambda u: np.column_stack([u, u.max(1)]), lambda u: np.real(u), lambda u: u.copy()]:
        check(f(a), f(x))
    assert a.tolist() == x.tolist()
    assert np.array_equal(a, a) and not np.array_equal(a, a[:, ::-1])
    assert not np.array_equal(a, a[1:])
    assert np.array_equal(a, x) and np.array_equal(x, a)  # a NumPy operand
    xn, an = mats["float64"]
    assert not np.array_equal(an, an) and np.array_equal(an, an, equal_nan=True)
    with pytest.raises(ValueError, match="shape-mismatch"):
        np.tensordot(a, b, axes=([1], [1]))
    with pytest.raises(ValueError, match="differ"):
        np.vdot(a, a.T)
    with pytest.raises(ValueError, match="size not equal to one"):
        np.squeeze(a, axis=0)
    with pytest.raises(TypeError, match="3-D"):
        np.expand_dims(a, 0)
    with pytest.raises(ta.PlanningError, match="3-D"):
        a[None]
    with pytest.raises(ta.PlanningError, match="3-D"):
        a[:, None]


def test_matrix_power(thread_engine, mats, tmp_path):
    rng = np.random.default_rng(3)
    s = rng.standard_normal((31, 31)) / 6
    a = ta.from_numpy(s, tmp_path / "s.zarr", tile=(7, 9))
    for k in [1, 2, 3, 6, 7]:
        assert_close(np.asarray(np.linalg.matrix_power(a, k)), np.linalg.matrix_power(s, k))
    assert_close(np.linalg.matrix_power(a + 0, -2), np.linalg.matrix_power(s, -2))
    one = np.linalg.matrix_power(a, 0)  # the lazy identity, of a's dtype
    np.testing.assert_array_equal(np.asarray(one), np.linalg.matrix_power(s, 0))
    assert one.dtype == s.dtype
    with pytest.raises(np.linalg.LinAlgError, match="square"):
        np.linalg.matrix_power(mats["y"][1], 2)
    with pytest.raises(TypeError, match="integer"):
        np.linalg.matrix_power(a, 1.5)


@pytest.mark.parametrize("dtype", ["float64", "int32", "bool"])
def test_roll_tile_repeat(thread_engine, mats, tmp_path, dtype):
    """Joins and gathers of the array itself: exact, stored and computed."""
    x, a = mats[dtype]
    for f in [lambda u: np.roll(u, 3, axis=0), lambda u: np.roll(u, -50, axis=1),
              lambda u: np.roll(u, 45, axis=0), lambda u: np.roll(u, (2, -3), axis=(0, 1)),
              lambda u: np.roll(u, 1, axis=-1), lambda u: np.tile(u, 2),
              lambda u: np.tile(u, (2, 3)), lambda u: np.tile(u, (1, 1)),
              lambda u: np.repeat(u, 2, axis=0), lambda u: np.repeat(u, 3, axis=-1),
              lambda u: np.repeat(u[:4], [1, 0, 2, 3], axis=0)]:
        check(f(a), f(x), tmp_path, exact=True)
    y, b = mats["y"]
    check(np.roll(b.sum(axis=1), 5), np.roll(y.sum(axis=1), 5))
    with dask.config.set(SMALL_BLOCKS):  # axis=None: the flattened matrix, gathered now
        for f in [lambda u: np.roll(u, 7), lambda u: np.roll(u.T, -3), lambda u: np.repeat(u, 2)]:
            np.testing.assert_array_equal(np.asarray(f(a)), f(x))
    with pytest.raises(TypeError, match="reps"):
        np.tile(a, (2, 1, 1))
    with pytest.raises(ValueError):
        np.repeat(a, [1, 2], axis=0)  # NumPy's own: repeats of the wrong length
    check(np.repeat(a[:, 0], 2), np.repeat(x[:, 0], 2), exact=True)  # a vector (lazy)
    check(np.repeat(a.max(axis=0), np.arange(x.shape[1]) % 3),
          np.repeat(x.max(axis=0), np.arange(x.shape[1]) % 3), exact=True)


def test_searchsorted_and_positions_of_small_results(thread_engine, mats):
    y, b = mats["y"]
    col, ycol = np.sort(b[:, 2]), np.sort(y[:, 2])
    for v in [0.1, [-1.0, 0.0, 2.0]]:
        for side in ["left", "right"]:
            np.testing.assert_array_equal(np.searchsorted(col, v, side=side),
                                          np.searchsorted(ycol, v, side=side))
    np.testing.assert_array_equal(np.searchsorted(ycol, b[:5, 1]),
                                  np.searchsorted(ycol, y[:5, 1]))
    for name in ["nonzero", "flatnonzero", "argwhere"]:
        got, want = getattr(np, name)(b[:, 0] > 0), getattr(np, name)(y[:, 0] > 0)
        for g, w in zip(np.atleast_1d(got) if name != "nonzero" else got,
                        np.atleast_1d(want) if name != "nonzero" else want, strict=True):
            np.testing.assert_array_equal(g, w)
    x, a = mats["float64"]  # of a matrix: flat indices gathered now (NaN is nonzero)
    with dask.config.set(SMALL_BLOCKS):
        for e, y in [(a, x), (a.T > 0, x.T > 0), (a[:0], x[:0]), (a * 0, x * 0)]:
            for f in (np.flatnonzero, np.argwhere):
                got, want = f(e), f(y)
                assert got.dtype == want.dtype and got.shape == want.shape
                np.testing.assert_array_equal(got, want)
            for g, w in zip(np.nonzero(e), np.nonzero(y), strict=True):
                assert g.dtype == w.dtype
                np.testing.assert_array_equal(g, w)


def test_reshape_ravel(thread_engine, mats):
    """A small result takes any shape; a matrix gains or loses a unit axis
    (a column, a row) lazily; other reshapes of a matrix gather its elements
    now (C or F order), refused by the planner when they do not fit a task."""
    y, b = mats["y"]
    for f in [lambda u: u.sum(0).reshape(-1, 1), lambda u: u.sum(0).reshape(1, 13),
              lambda u: u[:, 2:3].reshape(-1), lambda u: u[:, :1].ravel(),
              lambda u: u[3:4].flatten(), lambda u: np.ravel(u.mean(1)),
              lambda u: np.reshape(u.sum(0), (13, 1)), lambda u: u.reshape(45, 13),
              lambda u: u[:6, :6].T.mean(0).reshape(2, 3, order="F"),
              lambda u: u[:6, :6].mean(0).reshape((3, -1)), lambda u: u.sum(1).reshape(-1),
              lambda u: u[:, 4:5].reshape(1, -1), lambda u: u[2:3].reshape(13, 1)]:
        check(f(b), f(y))
    with dask.config.set(SMALL_BLOCKS):
        for f in [lambda u: u.reshape(13, 45), lambda u: u.ravel(), lambda u: np.ravel(u.T),
                  lambda u: u.flatten(), lambda u: u.reshape(5, -1, order="F"),
                  lambda u: (u * 2).reshape(-1, 5)]:
            np.testing.assert_array_equal(np.asarray(f(b)), f(y))
    w = np.arange(13.0)  # a blocked product (b @ w): computed first, then any shape
    np.testing.assert_array_equal(np.asarray((b @ w).reshape(5, 9)), (y @ w).reshape(5, 9))
    for bad, err in [(lambda: b.reshape(-1, -1), "one unknown"),
                     (lambda: b.reshape(4, -1), "cannot reshape array of size 585"),
                     (lambda: b.reshape(45, 13, order="K"), "order")]:
        with pytest.raises((ValueError, ta.PlanningError), match=err):
            bad()


# -- quantiles and histograms over all elements (computed now, in passes) ------------------

METHODS_ALL = ["linear", "lower", "higher", "midpoint", "nearest"]


@pytest.fixture
def narrow(monkeypatch):
    """Few bins and small selections: several narrowing passes on small data."""
    from tilearray.engine.expr import selection

    monkeypatch.setattr(selection, "BINS", 16)
    monkeypatch.setattr(selection, "SELECT_LIMIT", 30)
    return selection


@HYP
@given(m=st.integers(1, 40), n=st.integers(1, 12), tile=st.tuples(st.integers(1, 9),
                                                                   st.integers(1, 9)),
       kind=st.sampled_from(["normal", "ties", "int", "special", "bigint", "f32"]),
       q=st.one_of(st.floats(0, 1), st.lists(st.floats(0, 1), min_size=1, max_size=2)),
       method=st.sampled_from(METHODS_ALL), nan=st.booleans(),
       name=st.sampled_from(["quantile", "nanquantile", "median", "nanmedian"]),
       data=st.data())
def test_quantile_of_all_elements_hypothesis(thread_engine, tmp_path_factory, narrow, m, n, tile,
                                             kind, q, method, nan, name, data):
    """Exactly NumPy's value and dtype, through several histogram passes
    (16 bins, at most 30 elements gathered): ties, integers (int64 beyond
    2**53: compared as integers), float32 (NumPy's dtype rules for a q list),
    infinities, -0.0, a range wider than the largest float; medians as
    NumPy's (the mean of the middle two, not the 0.5 quantile's lerp)."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    x = {"normal": lambda: rng.standard_normal((m, n)),
         "ties": lambda: rng.integers(-2, 3, (m, n)) * 0.5,
         "int": lambda: rng.integers(-1000, 1000, (m, n)).astype("int32"),
         "special": lambda: rng.choice([-np.inf, np.inf, 0.0, -0.0, 1e300, -1e-300, 7.0,
                                        1.7e308, -1.7e308], (m, n)),
         "bigint": lambda: (2**60 + rng.integers(0, 5, (m, n))).astype("int64"),
         "f32": lambda: rng.standard_normal((m, n)).astype("float32")}[kind]()
    if nan and x.dtype.kind == "f":
        x[rng.random(x.shape) < 0.2] = np.nan
    a = ta.from_numpy(x, tmp_path_factory.mktemp("q") / "x.zarr", tile=tile)
    args, kw = ((), {}) if name.endswith("median") else ((q,), {"method": method})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        want = getattr(np, name)(x, *args, **kw)
        got = np.asarray(getattr(np, name)(a, *args, **kw).compute())
    assert got.dtype == np.asarray(want).dtype and got.shape == np.shape(want)
    np.testing.assert_array_equal(got, want)


def test_median_percentile_histogram_of_all_elements(thread_engine, mats, narrow, tmp_path):
    """np.median(X), np.percentile(X, 99), np.histogram(X) as a user writes
    them; the passes read X (each block once per pass), nothing held whole."""
    y, b = mats["y"]
    assert_close(np.median(b).compute(), np.median(y))
    assert float(np.percentile(b, 99)) == np.percentile(y, 99)
    w = np.arange(13.0)  # vectors: a blocked product (computed first), a small result
    assert_close(np.asarray(np.percentile(b @ w, [5, 95])), np.percentile(y @ w, [5, 95]))
    assert_close(np.asarray(np.median(b.sum(0), axis=0)), np.median(y.sum(0), axis=0))
    narrow.SELECT_LIMIT = 10_000  # all 585 elements gathered at once: any method
    for method in ["hazen", "weibull", "inverted_cdf"]:
        np.testing.assert_array_equal(np.asarray(np.quantile(b, [0.1, 0.5], method=method)),
                                      np.quantile(y, [0.1, 0.5], method=method))
    narrow.SELECT_LIMIT = 30
    with pytest.raises(ta.PlanningError, match="method='weibull'"):
        np.quantile(b, 0.3, method="weibull")
    xi, ai = mats["int32"]
    for bins, rng_ in [(10, None), (7, (-3.0, 50.0)), ([-100, 0, 5, 1000], None)]:
        got, edges = np.histogram(ai, bins=bins, range=rng_)
        want, wedges = np.histogram(xi, bins=bins, range=rng_)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(edges, wedges)
    got, edges = np.histogram(b, bins=5, density=True)
    want, wedges = np.histogram(y, bins=5, density=True)
    assert_close(got, want)
    x, a = mats["float64"]  # with NaNs: NumPy's error without a range, counted with one
    with pytest.raises(ValueError, match="not finite"):
        np.histogram(a)
    np.testing.assert_array_equal(np.histogram(a, range=(-1, 1))[0],
                                  np.histogram(x, range=(-1, 1))[0])
    with pytest.raises(ta.PlanningError, match="bins='auto'"):
        np.histogram(b, bins="auto")
    # float32 data: NumPy's float32 edges (an element on an edge binned as NumPy)
    f = np.array([[np.float32(-0.71428573), 0.5, 1.0, -1.0]], dtype=np.float32)
    af = ta.from_numpy(f, tmp_path / "f.zarr", tile=(1, 3))
    for got, want in zip(np.histogram(af, 7, range=(-1, 1)), np.histogram(f, 7, range=(-1, 1)),
                         strict=True):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
    e = ta.from_numpy(np.zeros((0, 4)), tmp_path / "e.zarr", tile=(2, 3))  # empty: as NumPy
    for kw in [{}, {"bins": 3, "range": (0, 1)}, {"bins": [0, 1]}]:
        for got, want in zip(np.histogram(e, **kw), np.histogram(np.zeros((0, 4)), **kw),
                             strict=True):
            np.testing.assert_array_equal(got, want)
    with pytest.warns(RuntimeWarning):
        assert np.isnan(float(np.median(e)))
    big = np.array([[1e308, 1.5e308], [np.inf, np.inf]])  # the mean overflows, as NumPy's
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert float(np.median(ta.from_numpy(big, tmp_path / "big.zarr", tile=(1, 1)))) == \
            np.median(big)
    bools = ta.from_numpy(np.eye(3, dtype=bool), tmp_path / "bool.zarr", tile=(2, 2))
    assert float(np.median(bools)) == np.median(np.eye(3, dtype=bool))
    with pytest.raises(ValueError, match="range"):
        np.quantile(b, 1.5)


@pytest.mark.parametrize("dtype", ["float64", "int32"])
def test_isin_digitize(thread_engine, mats, tmp_path, dtype):
    """Elementwise with a small table, fused into the reads: exact."""
    x, a = mats[dtype]
    y, b = mats["y"]
    for f in [lambda u: np.isin(u, [0, 1, 5, -3]), lambda u: np.isin(u, [1.5, 2], invert=True),
              lambda u: np.digitize(u, [-1.0, 0.0, 0.5, 2.0]),
              lambda u: np.digitize(u, [3, 1, -1], right=True),
              lambda u: np.isin(u, np.arange(-20, 20))]:
        check(f(a), f(x), tmp_path, exact=True)
    check(np.isin(a, b[:3, 0]), np.isin(x, y[:3, 0]), exact=True)  # a small result's values
    np.testing.assert_array_equal(np.isin(y[:3, 0], b[:3, 0]), [True, True, True])
    with pytest.raises(ValueError, match="monotonically"):
        np.digitize(a, [1, 0, 2])
    with pytest.raises(ta.PlanningError, match="at most"):
        np.isin(a, np.arange(100_000))
    with pytest.raises(TypeError, match="not modified in place"):
        a[0, 0] = 1
    np.testing.assert_array_equal(np.asarray(a[a > 0]), x[x > 0])  # test_2d_masks


def test_lines_of_thin_chunks_are_read_in_few_strips(engine, tmp_path):
    """A median or sort along the rows of X in 1-row chunks reads its lines in
    strips of many units (about 4 MiB across the width), not unit by unit:
    10,000 reads of 1.6 kB took 16.2-17.2 s against 0.9-1.0 s now. Results
    equal NumPy's; the run's bytes the plan's."""
    x = np.random.default_rng(5).standard_normal((3000, 200))
    z = zarr.create_array(str(tmp_path / "x.zarr"), shape=x.shape, chunks=(1, 200), dtype="f8")
    z[...] = x
    a = ta.open(tmp_path / "x.zarr")
    for expr, want in ((np.median(a, axis=0), np.median(x, axis=0)),
                       (np.sort(a, axis=0), np.sort(x, axis=0))):
        plan = expr.plan()
        strips = int(re.search(r"in (\d+) strips", str(plan)).group(1)) \
            if "strips" in str(plan) else 1
        assert strips <= 2, str(plan)
        assert np.array_equal(expr.compute(), want)
        assert expr.stats.bytes_read == plan.bytes_read


def test_unique_of_an_image_plans_under_small_workers(tmp_path):
    """np.unique of a 3000 x 2100 uint8 image in 1000 x 700 chunks at 200 MiB
    a worker was refused: a block planned 83 bytes an element (NumPy's
    unique takes 12 here) and the merges' value limit was sized without the
    allocator's overhead, so any budget-bound limit planned over the budget
    (helper-45). It runs; values, first indices, inverse and counts are
    NumPy's, for floats with NaNs too (both equal_nan)."""
    import zarr

    rng = np.random.default_rng(5)
    img = rng.integers(0, 256, (3000, 2100), dtype=np.uint8)
    zarr.create_array(str(tmp_path / "img.zarr"), data=img, chunks=(1000, 700))
    f = rng.integers(0, 40, (900, 700)).astype(np.float64)
    f[rng.random(f.shape) < 0.01] = np.nan
    zarr.create_array(str(tmp_path / "f.zarr"), data=f, chunks=(256, 300))
    with ta.Engine(n_workers=1, threads_per_worker=1, memory_per_worker="200MiB",
                   processes=False, quiet=True):
        got = np.unique(ta.open(tmp_path / "img.zarr"), return_index=True, return_inverse=True,
                        return_counts=True)
        for g, w in zip(got, np.unique(img, return_index=True, return_inverse=True,
                                       return_counts=True), strict=True):
            np.testing.assert_array_equal(np.asarray(g), w)
        for equal_nan in (True, False):
            got = np.unique(ta.open(tmp_path / "f.zarr"), return_index=True, return_counts=True,
                            equal_nan=equal_nan)
            want = np.unique(f, return_index=True, return_counts=True, equal_nan=equal_nan)
            for g, w in zip(got, want, strict=True):
                np.testing.assert_array_equal(np.asarray(g), w)


# -- np.gradient, np.block, ufuncs of two outputs, NumPy's own functions on small results --


@pytest.mark.parametrize("dtype", ["float64", "float32", "int32"])
def test_gradient_matches_numpy(thread_engine, mats, dtype):
    """Every axis, both edge orders, a scalar spacing or coordinates per
    axis; the result in f's float dtype (int: float64), as NumPy's."""
    x, a = mats[dtype]
    x = np.nan_to_num(x)
    a = np.nan_to_num(a)
    rng = np.random.default_rng(3)
    rows, cols = np.cumsum(rng.random(x.shape[0]) + 0.1), np.cumsum(rng.random(x.shape[1]))
    with dask.config.set(SMALL_BLOCKS):
        for args, kw in [((), {}), ((), dict(axis=0)), ((0.5,), dict(axis=-1, edge_order=2)),
                         ((2.0,), dict(edge_order=2)), ((rows, cols), {}),
                         ((rows, cols), dict(edge_order=2)), ((cols,), dict(axis=1))]:
            got, want = np.gradient(a, *args, **kw), np.gradient(x, *args, **kw)
            got, want = (got, want) if isinstance(want, tuple) else ((got,), (want,))
            assert len(got) == len(want)
            for g, w in zip(got, want, strict=True):
                check(g, w)
        check(np.gradient(a[:, 2]), np.gradient(x[:, 2]))  # a 1-D result
        check(np.gradient(a[:2], axis=0), np.gradient(x[:2], axis=0))  # two lines: no inside
    with pytest.raises(ValueError, match="too small"):
        np.gradient(a[:2], axis=0, edge_order=2)
    with pytest.raises(ValueError, match="length 45"):
        np.gradient(a, rows[:-1], axis=0)
    with pytest.raises(TypeError, match="invalid number of arguments"):
        np.gradient(a, 1.0, 2.0, 3.0)
    with pytest.raises(TypeError, match="boolean subtract"):
        np.gradient(mats["bool"][1])


def test_gradient_plans_its_parts_one_at_a_time(thread_engine, tmp_path):
    """A join evaluates its parts one at a time (their reads and results
    freed as each is copied in): np.gradient, three parts, plans about
    np.diff's memory (it had planned 2-5x, every part's arrays at once, and
    was refused where diff ran, helper-50); every task's traced peak is
    under the plan's."""
    rng = np.random.default_rng(8)
    x = rng.standard_normal((2400, 300))
    a = ta.from_numpy(x, tmp_path / "g.zarr", tile=(199, 37))
    mem = ta.Budget(memory_per_worker="1GiB", threads_per_worker=1).worker_memory_for(2 << 20)
    budget = ta.Budget(memory_per_worker=mem, threads_per_worker=1)  # 2 MiB tasks
    diff = np.diff(a, axis=0).plan(budget=budget).peak_task_memory
    for axis, args in [(0, ()), (1, (np.cumsum(rng.random(300)),)), (0, (0.5,))]:
        expr = np.gradient(a, *args, axis=axis, edge_order=2 if args else 1)
        want = np.gradient(x, *args, axis=axis, edge_order=2 if args else 1)
        plan = expr.plan(budget=budget)
        assert plan.peak_task_memory <= 1.5 * diff, (diff, str(plan))
        assert_close(np.asarray(expr.compute()), want)
        (stage,) = plan.stages
        if args and np.ndim(args[0]):  # the coordinates' coefficients: tasks' dependencies
            continue
        for task, value, traced in traced_tasks(stage):
            rows, cols = task.args[1], task.args[2]
            assert_close(value, want[rows[0]:rows[1], cols[0]:cols[1]])
            assert traced <= stage.peak_task_memory, (traced, str(plan))


def test_block_matches_numpy(thread_engine, mats):
    x, a = mats["float64"]
    y, b = mats["y"]
    ones = np.ones((3, 31 + 13))
    with dask.config.set(SMALL_BLOCKS):
        check(np.block([[a, b], [ones[:, :31], np.zeros((3, 13))]]),
              np.block([[x, y], [ones[:, :31], np.zeros((3, 13))]]), exact=True)
        check(np.block([[a], [a[:4]]]), np.block([[x], [x[:4]]]), exact=True)
        check(np.block([a, b]), np.block([x, y]), exact=True)
        check(np.block([a[0], a[:, 1], 7.0]), np.block([x[0], x[:, 1], 7.0]), exact=True)
        check(np.block([[a[0]], [a[1]]]), np.block([[x[0]], [x[1]]]), exact=True)
    with pytest.raises(ValueError, match="depths are mismatched"):
        np.block([[a], a])
    with pytest.raises(TypeError, match="tuple"):
        np.block([(a, a)])
    with pytest.raises(ValueError, match="3-D"):
        np.block([[[a]]])
    with pytest.raises(ValueError, match="must match"):
        np.block([[a, b[:5]]])


@pytest.mark.parametrize("dtype", ["float64", "int32"])
def test_ufuncs_of_two_outputs_and_round(thread_engine, mats, dtype):
    """divmod(a, 3), np.modf, np.frexp: one lazy array per output (refused
    before); round() of a size-1 result is the NumPy scalar's."""
    x, a = mats[dtype]
    x = np.nan_to_num(x)
    a = np.nan_to_num(a)
    with np.errstate(all="ignore"):
        for got, want in [(divmod(a, 3), divmod(x, 3)), (divmod(7, a + 100), divmod(7, x + 100)),
                          (np.divmod(a, a[0] + 1000), np.divmod(x, x[0] + 1000)),
                          (np.modf(a / 7), np.modf(x / 7)), (np.frexp(a), np.frexp(x))]:
            assert isinstance(got, tuple) and len(got) == 2
            for g, w in zip(got, want, strict=True):
                check(g, w, exact=True)
    assert str(divmod(a, 3)[1]).startswith("<TiledArray lazy divmod(")
    m, want = a.mean() / 7, x.mean() / 7
    assert round(m, 4) == round(want, 4) and round(m) == round(want)
    assert isinstance(round(m), int)
    check(round(a / 7, 2), np.round(x / 7, 2), exact=True)  # a matrix: np.round, lazy


def test_numpy_functions_of_small_results_run_numpys_own(thread_engine, mats):
    """A NumPy function tilearray lacks, given small results (vectors, a
    reduction's values), computes them and returns NumPy's own result, as
    dask does; given a stored matrix it is refused, naming its shape."""
    x, a = mats["float64"]
    x = np.nan_to_num(x)
    a = np.nan_to_num(a)
    np.testing.assert_array_equal(np.ediff1d(a[:, 0], to_end=[9.0]),
                                  np.ediff1d(x[:, 0], to_end=[9.0]))
    np.testing.assert_array_equal(np.convolve(a[0], [1.0, -1.0]), np.convolve(x[0], [1.0, -1.0]))
    np.testing.assert_array_equal(np.lexsort((a[:, 0], a[:, 1] > 0)),
                                  np.lexsort((x[:, 0], x[:, 1] > 0)))
    xp = np.sort(x[:, 2])
    np.testing.assert_array_equal(np.interp(a.mean(0), np.sort(a[:, 2]), a[:, 3]),
                                  np.interp(x.mean(0), xp, x[:, 3]))
    assert_close(np.asarray(a.mean(0)[:3].repeat(2)), x.mean(0)[:3].repeat(2))  # the method too
    np.testing.assert_array_equal(np.asarray(a[:4].repeat(2, axis=0)), x[:4].repeat(2, axis=0))
    with pytest.raises(TypeError, match=r"numpy\.kron of a 45 x 31 TiledArray is not supported"):
        np.kron(a, np.eye(2))


def test_matrix_functions_take_vectors_as_numpy(thread_engine, mats):
    """Functions tilearray implements for matrices take vectors as NumPy
    does (np.average with weights, np.tile: lazy); a form they refuse of
    small operands is NumPy's own (helper-50's np.average refusal named
    the 1-D weights it had been given)."""
    x, a = mats["float64"]
    x = np.nan_to_num(x)
    a = np.nan_to_num(a)
    v, w = a.mean(0), np.arange(1.0, x.shape[1] + 1)
    assert_close(np.asarray(np.average(v, weights=w)), np.average(x.mean(0), weights=w))
    avg, scl = np.average(v, weights=w, returned=True)
    assert_close(np.asarray(avg), np.average(x.mean(0), weights=w))
    assert float(scl) == w.sum()
    for reps in (1, 3, (2, 3), (2, 2, 2), 0, (0, 2)):
        got = np.tile(a[:5, 0], reps)
        assert isinstance(got, ta.TiledArray) == (np.ndim(reps) == 0 or len(reps) < 3)
        np.testing.assert_array_equal(np.asarray(got), np.tile(x[:5, 0], reps))
    with pytest.raises(ValueError, match="Length of weights"):
        np.average(v, weights=w[:-1])
    ww = np.random.default_rng(2).random(x.shape)  # a weight per element (helper-52)
    for axis in (None, 0, 1):
        assert_close(np.asarray(np.average(a, axis=axis, weights=ww)),
                     np.average(x, axis=axis, weights=ww))
    avg, scl = np.average(a, axis=1, weights=ww, returned=True)
    want, wscl = np.average(x, axis=1, weights=ww, returned=True)
    assert_close(np.asarray(avg), want)
    assert_close(scl, wscl)
    for reps in ((0, 2), (3, 0)):
        assert np.tile(a, reps).shape == np.tile(x, reps).shape
    with pytest.raises(TypeError, match=r"np\.tile: reps=\(2, 2, 2\) of shape \(45, 31\)"):
        np.tile(a, (2, 2, 2))
