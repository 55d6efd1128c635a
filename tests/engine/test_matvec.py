"""Products with a small in-memory operand (``X @ w``, ``v @ X``, ``W.T @ X``,
``X.T @ (X @ w)``) and 1-D arrays (issue 30), against NumPy; the plan's
figures against the measured RunStats."""

from __future__ import annotations

import dask
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tilearray as ta
from tilearray.testing import assert_close

SMALL_BLOCKS = {"tilearray.map.block-bytes": 4096}
"""Blocks of a few hundred elements: many row blocks, and K split when a row is wide."""


def _check(expr, want, engine, precision=None):
    """``expr`` computes NumPy's ``want``; the plan's tasks and bytes read
    are the run's (the plan is made for the engine that runs it)."""
    plan = expr.plan(engine=engine)
    got = expr.compute(engine=engine)
    assert np.shape(got) == np.shape(want) and expr.shape == np.shape(want)
    assert_close(got, want, precision=precision)
    assert expr.stats.tasks == plan.tasks, str(plan)
    assert expr.stats.bytes_read == plan.bytes_read, str(plan)
    return plan


def test_products_with_numpy_operands_match_numpy(tmp_path, thread_engine, rng):
    """Ragged tiles (13 x 7 over 61 x 30), f64 / f32 / int32 matrices, NaNs,
    vector and k=3 operands on either side, through a transpose, with
    elementwise ops fused into the read, K split (small blocks) or not."""
    for dtype in ("float64", "float32", "int32"):
        x = (rng.standard_normal((61, 30)) * 10).astype(dtype)
        if dtype != "int32":
            x[3, 5] = np.nan
        X = ta.from_numpy(x, tmp_path / f"x-{dtype}.zarr", tile=(13, 7))
        w, W = rng.standard_normal(30).astype(dtype), rng.standard_normal((30, 3))
        v, V = rng.standard_normal(61), rng.standard_normal((61, 3)).astype(dtype)
        prec = np.float32 if dtype == "float32" else None
        cases = [
            (X @ w, x @ w), (X @ W, x @ W), (v @ X, v @ x), (V.T @ X, V.T @ x),
            (X.T @ v, x.T @ v), (X.T @ V, x.T @ V), (w @ X.T, w @ x.T),
            ((X - X.mean(0)) @ w, (x - x.mean(0)) @ w), (np.sqrt(abs(X)) @ W, np.sqrt(abs(x)) @ W),
            (X.T @ (X @ w), x.T @ (x @ w)), (X @ X.mean(axis=0), x @ x.mean(axis=0)),
            (X[10:50:2, 5:] @ w[5:], x[10:50:2, 5:] @ w[5:]),
        ]
        if dtype != "float64":  # the dtype matters to the kernel, not to the layout
            cases = cases[:4]
        with dask.config.set(SMALL_BLOCKS):
            for expr, want in cases:
                _check(expr, want, thread_engine, prec)
        if dtype == "float64":  # blocks of whole rows: no K split
            for expr, want in cases[:3]:
                _check(expr, want, thread_engine, prec)


def test_gram_products_read_x_once(tmp_path, thread_engine, rng):
    """``X.T @ (X @ W)`` and ``X @ (X.T @ W)``: one pass over whole row
    (column) panels, each multiplied by W and its transpose by that, the
    partials tree-summed (many panels with small blocks). Ragged tiles, f64
    and f32 (with an f64 operand: cast once per panel), vector and k=3
    operands, an elementwise op fused into the read; the plan's tasks and
    bytes are the run's."""
    for dtype in ("float64", "float32"):
        x = rng.standard_normal((203, 57)).astype(dtype)
        X = ta.from_numpy(x, tmp_path / f"x-{dtype}.zarr", tile=(31, 13))
        w, W = rng.standard_normal(57).astype(dtype), rng.standard_normal((57, 3))
        u, U = rng.standard_normal(203), rng.standard_normal((203, 3)).astype(dtype)
        prec = np.float32 if dtype == "float32" else None
        for blocks in ({}, SMALL_BLOCKS):
            with dask.config.set(blocks):
                for expr, want in [(X.T @ (X @ w), x.T @ (x @ w)), (X.T @ (X @ W), x.T @ (x @ W)),
                                   (X @ (X.T @ u), x @ (x.T @ u)), (X @ (X.T @ U), x @ (x.T @ U)),
                                   ((2 * X).T @ ((2 * X) @ w), 4 * (x.T @ (x @ w)))]:
                    plan = _check(expr, want, thread_engine, prec)
                    assert plan.bytes_read == x.nbytes, str(plan)
                    passes = [st for st in plan.stages if st.bytes_read]
                    assert len(passes) == 1 and "one pass" in passes[0].description
                    if blocks:
                        assert passes[0].tasks > 3, str(plan)  # panels, sums, the join


def test_gram_product_reads_twice_when_no_panel_fits(tmp_path, rng):
    """A row panel (one row of 16 KiB chunks, 16 x 16384 f64 = 2 MiB) over a
    1 MiB task budget: ``X @ w`` is joined first and X read a second time, as
    two passes of blocks that fit; the same plan with room reads X once."""
    import zarr

    zarr.create_array(tmp_path / "x.zarr", shape=(64, 16384), chunks=(16, 128), dtype="f8")
    X = ta.open(tmp_path / "x.zarr")
    w = np.ones(16384)
    tight = ta.Budget(2 * 2**20, 1, 1, baseline=2**19, fraction=0.8)
    plan = (X.T @ (X @ w)).plan(budget=tight)
    assert plan.peak_task_memory <= tight.task_memory
    assert plan.bytes_read == 2 * X.nbytes, str(plan)
    assert [st.bytes_read for st in plan.stages if st.bytes_read] == [X.nbytes] * 2
    roomy = (X.T @ (X @ w)).plan(budget=ta.Budget(2**30, 1, 1))
    assert roomy.bytes_read == X.nbytes and "one pass" in str(roomy), str(roomy)


def test_matrix_product_with_a_matrix_temporary(tmp_path, thread_engine, rng):
    """``(S.T @ S) @ v``: the matmul is computed into a temporary, then read once."""
    s = rng.standard_normal((60, 30))
    S = ta.from_numpy(s, tmp_path / "s.zarr", tile=(16, 11))
    v = rng.standard_normal(30)
    _check((S.T @ S) @ v, (s.T @ s) @ v, thread_engine)
    _check(v @ (S.T @ S), v @ (s.T @ s), thread_engine)


def test_x_at_w_reads_x_once(tmp_path, thread_engine, rng):
    x = rng.standard_normal((3000, 40))
    X = ta.from_numpy(x, tmp_path / "x.zarr", tile=(256, 40))
    w = rng.standard_normal(40)
    for blocks in ({}, SMALL_BLOCKS):
        with dask.config.set(blocks):
            plan = _check(X @ w, x @ w, thread_engine)
            assert plan.bytes_read == x.nbytes, str(plan)
            plan = _check(w @ X.T, x @ w, thread_engine)
            assert plan.bytes_read == x.nbytes, str(plan)
    # the operand is held by one task of the graph, never embedded in the block tasks
    graph = (X @ w).plan(engine=thread_engine).graph()
    holders = [k for k, t in graph.items()
               if any(isinstance(a, np.ndarray) and a.size == w.size for a in t[1:])]
    assert len(holders) == 1 and str(holders[0]).startswith("const-")


def test_an_operand_too_large_for_a_task_is_refused(tmp_path):
    X = ta.from_numpy(np.zeros((100, 1000)), tmp_path / "x.zarr", tile=(50, 500))
    big = np.zeros((1000, 20_000))  # 153 MiB, held by every task
    with pytest.raises(ta.PlanningError, match=r"in-memory operand, 152\.59 MiB.*store it "
                                               r"with ta\.from_numpy.*memory_per_worker >="):
        (X @ big).plan(budget=ta.Budget("256MiB"))
    assert (X @ big[:, :10]).plan(budget=ta.Budget("256MiB")).tasks > 0
    # a wide operand whose product blocks outweigh it, but itself over the
    # per-task budget (helper-48: only "memory_per_worker >= 692MiB, or with
    # smaller tiles/shards", which could not help)
    Z = ta.from_numpy(np.zeros((2000, 500)), tmp_path / "z.zarr", tile=(100, 100))
    wide = np.ones((500, 20_000))  # 76 MiB; the 2000 x 20000 product 305 MiB
    budget = ta.Budget("200MiB", 2, 1)
    assert budget.task_memory < wide.nbytes
    with pytest.raises(ta.PlanningError, match=r"in-memory operand, 76\.29 MiB.*store it with "
                                               r"ta\.from_numpy") as e:
        (Z @ wide).plan(budget=budget)
    assert "smaller tiles" not in str(e.value), str(e.value)


def test_operand_shapes_are_checked_as_numpy(tmp_path):
    X = ta.from_numpy(np.zeros((10, 4)), tmp_path / "x.zarr", tile=(5, 2))
    with pytest.raises(ta.PlanningError, match=r"not aligned: 4 \(dim 1\) != 5 \(dim 0\)"):
        X @ np.zeros(5)
    with pytest.raises(TypeError, match="operands must be TiledArrays or NumPy arrays"):
        X @ {"a": 1}
    with pytest.raises(ValueError, match="Input operand 1 does not have enough dimensions"):
        X @ 2.0
    assert (X @ [1, 2, 3, 4]).shape == (10,) and ([0.5] * 10 @ X).shape == (4,)  # as NumPy
    assert (X @ np.zeros((4, 2))).shape == (10, 2) and (np.zeros(10) @ X).shape == (4,)
    assert (X.mean(0) @ X.mean(0)).shape == ()


@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                 HealthCheck.too_slow])
@given(m=st.integers(1, 40), n=st.integers(1, 30), tr=st.integers(4, 16),
       tc=st.integers(3, 12), k=st.sampled_from([0, 1, 3]),
       form=st.sampled_from(["X @ w", "w @ X", "X.T @ w", "w @ X.T"]),
       dtype=st.sampled_from(["float64", "float32", "int16"]), small=st.booleans(),
       seed=st.integers(0, 2**16))
def test_products_property(tmp_path_factory, thread_engine, m, n, tr, tc, k, form, dtype,
                           small, seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((m, n)) * 5).astype(dtype)
    X = ta.from_numpy(x, tmp_path_factory.mktemp("p") / "x.zarr", tile=(tr, tc))
    inner = {"X @ w": n, "w @ X": m, "X.T @ w": m, "w @ X.T": n}[form]
    wshape = (inner,) if k == 0 else ((inner, k) if form.startswith("X") else (k, inner))
    w = rng.standard_normal(wshape)
    env = {"X": X, "w": w}
    want = eval(form, {}, {"X": x, "w": w})  # noqa: S307 -- the four forms above
    with dask.config.set(SMALL_BLOCKS if small else {}):
        _check(eval(form, {}, env), want, thread_engine,  # noqa: S307
               np.float32 if dtype == "float32" else None)


# -- 1-D arrays ------------------------------------------------------------------------


def test_vectors_open_store_broadcast_and_reduce(tmp_path, thread_engine, rng):
    x, v, u = rng.standard_normal((57, 23)), rng.standard_normal(23), rng.standard_normal(57)
    X = ta.from_numpy(x, tmp_path / "x.zarr", tile=(10, 6))
    V = ta.from_numpy(v, tmp_path / "v.zarr", tile=5)
    U = ta.from_numpy(u, tmp_path / "u.zarr", tile=(8,))
    assert ta.open(tmp_path / "v.zarr").shape == (23,) and V.ndim == 1 and len(U) == 57
    assert "shape=(23,)" in repr(V) and "tile=(5,)" in repr(V)
    cases = [
        (V, v), (X / V, x / v), (X - U[:, None], x - u[:, None]), (U[None, :] @ X, u[None, :] @ x),
        (V * 2 + X.sum(0), v * 2 + x.sum(0)), (V.sum(), v.sum()), (U.max(), u.max()),
        (V[3:20:2], v[3:20:2]), (X @ V, x @ v), (U @ X, u @ x), (X.T @ U, x.T @ u),
        ((X @ V) - U, x @ v - u), (((X @ V) - U).std(), (x @ v - u).std()),
    ]
    for expr, want in cases:
        _check(expr, want, thread_engine)
    # a blocked product indexed: computed now (on the current engine), then NumPy's indexing
    assert_close(np.asarray((X @ V)[:3]), (x @ v)[:3])


def test_big_vector_results_are_written_block_by_block(tmp_path, thread_engine, rng):
    """``(X @ w).to_zarr``: each row block's product written by its own task
    into a 1-D array (never through one task nor the driver), read back as a
    1-D TiledArray and used again."""
    x, w = rng.standard_normal((1000, 17)), rng.standard_normal(17)
    X = ta.from_numpy(x, tmp_path / "x.zarr", tile=(64, 17))
    with dask.config.set(SMALL_BLOCKS):
        y = X @ w
        plan = y.plan(tmp_path / "y.zarr", engine=thread_engine)
        Y = y.to_zarr(tmp_path / "y.zarr", engine=thread_engine)
    assert Y.shape == (1000,) and Y.grid.tile == (64, 1)
    assert y.stats.tasks == plan.tasks and y.stats.bytes_written == 1000 * 8
    assert sum(1 for s in plan.stages for t in s.work if "store" in str(t.key)) > 1
    assert_close(Y.compute(engine=thread_engine), x @ w)
    assert_close(ta.open(tmp_path / "y.zarr").compute(engine=thread_engine), x @ w)
    _check(X.T @ Y, x.T @ (x @ w), thread_engine)
    W = X @ rng.standard_normal((17, 3))
    Z = W.to_zarr(tmp_path / "z.zarr", tile=(100, 3), engine=thread_engine)
    assert Z.shape == (1000, 3) and Z.grid.tile == (100, 3)
    assert_close(Z.compute(engine=thread_engine), W.compute(engine=thread_engine))


def test_one_d_products_with_vectors_and_small_matrices(tmp_path, thread_engine, rng):
    """A 1-D product ``X @ w`` times another vector (NumPy, stored, itself) or
    a small matrix, on either side, and ``np.outer`` of it: joined in memory
    as in its other uses, NumPy's values, shapes and dtypes (int32 stays int32)."""
    x, w, y = rng.standard_normal((300, 11)), rng.standard_normal(11), rng.standard_normal(300)
    m = rng.standard_normal((300, 3))
    X = ta.from_numpy(x, tmp_path / "x.zarr", tile=(64, 5))
    Y = ta.from_numpy(y, tmp_path / "y.zarr", tile=70)
    v, xv = X @ w, x @ w
    for expr, want in [(v @ y, xv @ y), (np.dot(v, y), xv @ y), (y @ v, y @ xv),
                       (v @ v, xv @ xv), (v @ Y, xv @ y), (v @ m, xv @ m), (m.T @ v, m.T @ xv),
                       (np.outer(v, w), np.outer(xv, w)), (v @ X, xv @ x)]:
        got = expr.compute(engine=thread_engine)
        assert np.shape(got) == np.shape(want) and np.asarray(got).dtype == want.dtype
        assert_close(got, want)
    xi = rng.integers(-3, 4, (200, 7)).astype(np.int32)
    XI = ta.from_numpy(xi, tmp_path / "xi.zarr", tile=(64, 4))
    wi = np.arange(7, dtype=np.int32)
    got = ((XI @ wi) @ (XI @ wi)).compute(engine=thread_engine)
    assert got.dtype == np.int32 and got == (xi @ wi) @ (xi @ wi)
    with pytest.raises(ta.PlanningError, match="not aligned"):
        v @ np.ones(299)


# -- the user script of issue 30 (the pieces that are products) --------------------------


def test_user_script_pca_regression_power_iteration(tmp_path, engine):
    """On the shared 2-worker engine, with small blocks: PCA scores, regression
    predictions and residuals, and a power iteration on X.T @ (X @ v), with
    tilearray alone; every plan's largest task under the budget."""
    rng = np.random.default_rng(30)
    m, n = 6000, 24
    x = rng.standard_normal((m, n)) @ np.diag(np.linspace(3, 0.5, n))
    beta_true = rng.standard_normal(n)
    yv = x @ beta_true + 0.1 * rng.standard_normal(m)
    X = ta.from_numpy(x, tmp_path / "x.zarr", tile=(700, 10))
    y = ta.from_numpy(yv, tmp_path / "y.zarr", tile=2048)
    budget = engine.budget()
    with dask.config.set({"tilearray.map.block-bytes": 2**18}):
        # PCA scores
        Xc = X - X.mean(axis=0)
        cov = (Xc.T @ Xc).compute() / (m - 1)
        V = np.linalg.eigh(cov)[1][:, ::-1]
        scores = Xc @ V[:, :3]
        assert scores.plan().peak_task_memory <= budget.task_memory
        xc = x - x.mean(0)
        assert_close(scores.compute(), xc @ V[:, :3], scale=np.abs(xc).max() * 3)
        # regression predictions
        beta = np.linalg.solve((X.T @ X).compute(), (X.T @ y).compute())
        assert_close(beta, np.linalg.lstsq(x, yv, rcond=None)[0], scale=10)
        pred, resid = X @ beta, y - X @ beta
        assert_close(pred.compute(), x @ beta, scale=np.abs(x @ beta).max())
        assert_close(resid.compute(), yv - x @ beta, scale=np.abs(yv).max())
        # power iteration
        v, vn = np.ones(n), np.ones(n)
        for _ in range(3):
            v = (X.T @ (X @ v)).compute()
            v /= np.linalg.norm(v)
            vn = x.T @ (x @ vn)
            vn /= np.linalg.norm(vn)
        assert_close(v, vn, scale=1.0)
        p = (X.T @ (X @ v)).plan()
        assert p.peak_task_memory <= budget.task_memory and p.bytes_read == x.nbytes


@pytest.mark.parametrize("shape", [(0, 5), (3, 0), (0, 0)])
def test_products_with_an_empty_stored_side(shape, thread_engine, tmp_path):
    """An empty X gives NumPy's zeros (or empty) results: the one-pass Gram
    forms, left and right products (this raised IndexError / ValueError)."""
    x = np.zeros(shape)
    X = ta.from_numpy(x, tmp_path / "x.zarr", tile=(4, 5))
    w, v, W = np.ones(shape[1]), np.arange(shape[0], dtype=float), np.ones((shape[1], 2))
    for expr, want in [(X.T @ (X @ w), x.T @ (x @ w)), (X @ (X.T @ v), x @ (x.T @ v)),
                       (X.T @ v, x.T @ v), (v @ X, v @ x), (X @ w, x @ w), (X @ W, x @ W),
                       (X.T @ (X @ W), x.T @ (x @ W))]:
        got = expr.compute(engine=thread_engine)
        assert np.shape(got) == want.shape
        assert_close(got, want)
