"""The mixed-precision SPD solve (``tilearray.linalg.spd-solve``): a float32
factor and float64 iterative refinement, falling back to a float64 factor.
Each case is compared with NumPy's float64 solve on the same matrix, to
within what a float64 solve itself achieves there (``cond * eps``)."""

from __future__ import annotations

import os
import re

import dask
import numpy as np
import pytest
import zarr

import tilearray as ta
from tilearray import linalg as tla
from tilearray.engine.plan.types import Budget
from tilearray.errors import NotPositiveDefiniteError
from tilearray.testing import assert_close


@pytest.fixture(scope="module")
def eng():
    with ta.Engine(n_workers=2, threads_per_worker=1, memory_per_worker="512MiB",
                   processes=False, quiet=True) as e:
        yield e


def spd_with_condition(rng, n, cond):
    q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    x = (q * np.logspace(0, np.log10(cond), n)) @ q.T
    return (x + x.T) / 2


def stored(tmp_path, x, tile):
    z = zarr.create_array(tmp_path / "a.zarr", shape=x.shape, chunks=tile, dtype=x.dtype)
    z[...] = x
    return ta.open(tmp_path / "a.zarr")


def rel_err(got, want):
    return np.abs(got - want).max() / np.abs(want).max()


def runs(monkeypatch):
    """Counts the graphs each solve submits (``Engine.run``)."""
    calls = []
    inner = ta.Engine.run

    def run(self, *a, **kw):
        calls.append(kw.get("plan"))
        return inner(self, *a, **kw)

    monkeypatch.setattr(ta.Engine, "run", run)
    return calls


def factor_runs(plans):
    """The first line (``... -> shape dtype``) of each plan with a Cholesky stage."""
    return [str(p).splitlines()[0] for p in plans
            if p is not None and any(st.kind == "cholesky" for st in p.stages)]


@pytest.mark.parametrize("cond", [1.0, 1e3, 1e6])
@pytest.mark.parametrize("n, tile", [(300, (64, 64)), (517, (100, 90))])
def test_refined_solution_is_as_accurate_as_float64(eng, tmp_path, rng, monkeypatch, cond,
                                                    n, tile):
    x = spd_with_condition(rng, n, cond)
    b = rng.standard_normal((n, 3))
    a = stored(tmp_path, x, tile)
    want = np.linalg.solve(x, b)
    calls = runs(monkeypatch)
    with dask.config.set({"tilearray.linalg.spd-solve": "mixed"}):
        got = ta.linalg.solve(a, b, assume_a="pos")
    assert got.dtype == np.float64 and got.shape == (n, 3)
    # float64's own forward error on this matrix: about cond * eps
    assert rel_err(got, want) < 50 * cond * np.finfo(np.float64).eps, rel_err(got, want)
    # the float32 factor and a run of its two substitutions, then at least
    # one refinement step (a residual, a run of two substitutions) and the
    # residual that ends it -- never a float64 factor
    assert len(calls) >= 3, len(calls)  # (identity-like a: x0 may be exact)
    factors = factor_runs(calls)
    assert len(factors) == 1 and "float32" in factors[0]


@pytest.mark.parametrize("mode", ["double", "mixed"])
def test_float32_systems_computed_in_float64_as_numpy(eng, tmp_path, rng, mode):
    """NumPy's linalg computes float32 in float64 and returns float32: so do
    the Cholesky factor, the solves, inv and slogdet (at condition 1e5 the
    float32 factor had left L 200x NumPy's error and the SPD solve 16,000x:
    7.5e-4 against 4.6e-8); a float64 right-hand side gives float64."""
    n = 517
    s = spd_with_condition(rng, n, 1e5).astype(np.float32)
    s = (s + s.T) / 2
    g = (s @ np.linalg.qr(rng.standard_normal((n, n)))[0]).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    a = stored(tmp_path, s, (100, 90))
    z = zarr.create_array(tmp_path / "g.zarr", shape=g.shape, chunks=(100, 90), dtype="f4")
    z[...] = g
    ag = ta.open(tmp_path / "g.zarr")
    s64, g64 = s.astype(np.float64), g.astype(np.float64)
    with dask.config.set({"tilearray.linalg.spd-solve": mode}):
        cases = [(ta.linalg.cholesky(a).compute(), np.linalg.cholesky(s),
                  np.linalg.cholesky(s64)),
                 (ta.linalg.solve(a, b, assume_a="pos"), np.linalg.solve(s, b),
                  np.linalg.solve(s64, b)),
                 (ta.linalg.solve(ag, b), np.linalg.solve(g, b), np.linalg.solve(g64, b)),
                 (ta.linalg.inv(a, assume_a="pos"), np.linalg.inv(s), np.linalg.inv(s64)),
                 (ta.linalg.inv(ag), np.linalg.inv(g), np.linalg.inv(g64))]
        for got, numpy32, truth in cases:
            got = np.asarray(got)
            assert got.dtype == numpy32.dtype == np.float32
            assert rel_err(got, truth) <= 2 * rel_err(numpy32, truth) + 1e-7, \
                (rel_err(got, truth), rel_err(numpy32, truth))
        x64 = ta.linalg.solve(a, b.astype(np.float64), assume_a="pos")
        assert x64.dtype == np.float64
        assert rel_err(x64, np.linalg.solve(s64, b)) < 1e5 * 50 * np.finfo(np.float64).eps
        sign, logdet = ta.linalg.slogdet(a, assume_a="pos")
        assert logdet.dtype == np.float32 and sign == 1
        assert_close(np.float64(logdet), np.linalg.slogdet(s64)[1], precision=np.float32)


def test_vector_and_stored_right_hand_sides(eng, tmp_path, rng):
    n = 300
    x = spd_with_condition(rng, n, 100.0)
    a = stored(tmp_path, x, (64, 64))
    b = rng.standard_normal(n)
    z = zarr.create_array(tmp_path / "b.zarr", shape=(n, 2), chunks=(64, 2), dtype="f8")
    z[...] = np.stack([b, 2 * b], axis=1)
    with dask.config.set({"tilearray.linalg.spd-solve": "mixed"}):
        got = ta.linalg.solve(a, b, assume_a="pos")
        two = ta.linalg.solve(a, ta.open(tmp_path / "b.zarr"), assume_a="pos")
        col = ta.linalg.solve(a, ta.open(tmp_path / "b.zarr")[:, 1], assume_a="pos")
    want = np.linalg.solve(x, b)
    assert got.shape == (n,) and rel_err(got, want) < 1e-12
    assert two.shape == (n, 2) and rel_err(two[:, 1], 2 * want) < 1e-12
    assert col.shape == (n,) and rel_err(col, 2 * want) < 1e-12


def test_solve_plan_shows_the_mixed_precision_run(eng, tmp_path, rng, monkeypatch):
    """``solve_plan`` plans what ``solve`` runs: in mixed precision, the
    float32 factor (half the bytes written), its two substitutions and one
    residual pass over A's lower triangle, each stage planned as the run
    submits it; ``plan(precision="double")`` is the fallback's float64 plan."""
    n = 400
    x = spd_with_condition(rng, n, 100.0)
    b = rng.standard_normal(n)
    a = stored(tmp_path, x, (96, 96))
    with dask.config.set({"tilearray.linalg.spd-solve": "mixed"}):
        lazy = ta.linalg.solve_plan(a, b, assume_a="pos")
        assert isinstance(lazy, tla.MixedSolve), lazy
        plan = lazy.plan()
        calls = runs(monkeypatch)
        got = lazy.compute()
    kinds = [st.kind for st in plan.stages]
    assert kinds[:3] == ["cholesky", "trsolve", "trsolve"] and "refine" in kinds, kinds
    assert plan.shape == (n,) and plan.dtype == "float64" and "mixed precision" in str(plan)
    double = lazy.plan(precision="double")
    assert [st.kind for st in double.stages][:3] == ["cholesky", "trsolve", "trsolve"]
    assert plan.stages[0].bytes_written * 2 == double.stages[0].bytes_written
    # the run's factor, first substitutions and residual were planned as shown
    # (task counts aside: the plan's substitutions wait on a factor it writes)
    ran = [st for p in calls if p is not None for st in p.stages if st.kind != "result"]
    assert [(st.kind, st.bytes_read, st.bytes_written) for st in ran[:4]] == \
        [(st.kind, st.bytes_read, st.bytes_written) for st in plan.stages[:4]]
    assert rel_err(got, np.linalg.solve(x, b)) < 1e-12
    with pytest.raises(ValueError, match="precision='single'"):
        lazy.plan(precision="single")
    with dask.config.set({"tilearray.linalg.spd-solve": "mixed"}):  # A a product first
        g = ta.linalg.solve_plan(a.T @ a, b, assume_a="pos").plan()
        kinds = [st.kind for st in g.stages]
        first = kinds.index("cholesky") + 2
        assert kinds[0] == "matmul" and f"stages {first}-" in g.stages[kinds.index("refine")].description
    with dask.config.set({"tilearray.linalg.spd-solve": "double"}):  # one lazy expression
        assert isinstance(ta.linalg.solve_plan(a, b, assume_a="pos"), ta.TiledArray)


@pytest.mark.parametrize("mode", ["mixed", "double"])
def test_only_the_lower_triangle_is_read(eng, tmp_path, rng, mode):
    """As numpy.linalg.cholesky: the upper triangle never enters the answer,
    not in the factor nor in the refinement's residuals."""
    n = 333
    x = spd_with_condition(rng, n, 1e3)
    stored_x = np.tril(x) + np.triu(rng.uniform(-9, 9, (n, n)), 1)  # garbage above
    b = rng.standard_normal((n, 2))
    with dask.config.set({"tilearray.linalg.spd-solve": mode}):
        got = ta.linalg.solve(stored(tmp_path, stored_x, (50, 70)), b, assume_a="pos")
    assert rel_err(got, np.linalg.solve(x, b)) < 50 * 1e3 * np.finfo(np.float64).eps


def test_beyond_float32_it_factors_in_float64(eng, tmp_path, rng, monkeypatch):
    """cond 1e12: float32 cannot factor it (or the refinement would stall):
    the float64 factor answers, as accurate as NumPy's."""
    n = 300
    x = spd_with_condition(rng, n, 1e12)
    b = rng.standard_normal((n, 2))
    a = stored(tmp_path, x, (64, 64))
    calls = runs(monkeypatch)
    with dask.config.set({"tilearray.linalg.spd-solve": "mixed"}):
        got = ta.linalg.solve(a, b, assume_a="pos")
    direct = ta.linalg.solve_plan(a, b, assume_a="pos").compute()
    want = np.linalg.solve(x, b)
    assert rel_err(got, want) <= 10 * max(rel_err(direct, want), 1e-6)
    assert any("float64" in head for head in factor_runs(calls))


def test_not_positive_definite_is_still_refused(eng, tmp_path, rng):
    n = 300
    x = spd_with_condition(rng, n, 10.0)
    x[150, 150] = -5.0  # indefinite
    with dask.config.set({"tilearray.linalg.spd-solve": "mixed"}), \
            pytest.raises(NotPositiveDefiniteError):
        ta.linalg.solve(stored(tmp_path, x, (64, 64)), np.ones(n), assume_a="pos")


def test_when_it_applies_and_what_it_leaves(eng, tmp_path, rng, monkeypatch):
    n = 300
    x = spd_with_condition(rng, n, 10.0)
    a = stored(tmp_path, x, (64, 64))
    b = rng.standard_normal((n, 2))
    with dask.config.set({"tilearray.temporary-directory": str(tmp_path / "tmp")}):
        os.makedirs(tmp_path / "tmp")
        # auto: n < 10240 is factored in float64 (one run: factor and substitutions)
        calls = runs(monkeypatch)
        got = ta.linalg.solve(a, b, assume_a="pos")
        assert rel_err(got, np.linalg.solve(x, b)) < 1e-12 and len(calls) == 1
        with dask.config.set({"tilearray.linalg.spd-solve": "mixed"}):
            ta.linalg.solve(a, b, assume_a="pos")
            assert os.listdir(tmp_path / "tmp") == []  # the float32 factor is removed
            # float32 input: solved in float32 as before
            a32 = ta.from_numpy(x.astype(np.float32), tile=(64, 64))
            got32 = ta.linalg.solve(a32, b.astype(np.float32), assume_a="pos")
            assert got32.dtype == np.float32
    with dask.config.set({"tilearray.linalg.spd-solve": "fast"}), \
            pytest.raises(ValueError, match="spd-solve"):
        ta.linalg.solve(a, b, assume_a="pos")
    assert tla._mixed_precision(a, 16384, 256, np.float64)
    assert not tla._mixed_precision(a, 16384, 257, np.float64)
    assert not tla._mixed_precision(a, 8192, 1, np.float64)  # the float64 factor is as fast


def test_beyond_float32_range_lists_and_nan(eng, tmp_path, rng, monkeypatch):
    """Entries past float32's range (the float32 factor overflows) fall back
    to float64 and give NumPy's answer, not zeros; a list b works; a NaN in
    b ends the refinement at once (NaN, as in float64), not after its cap."""
    n = 64
    x = np.eye(n) * 4e38 + 1e36
    a = stored(tmp_path, x, (32, 32))
    with dask.config.set({"tilearray.linalg.spd-solve": "mixed"}):
        got = ta.linalg.solve(a, np.ones(n), assume_a="pos")
        assert rel_err(got, np.linalg.solve(x, np.ones(n))) < 1e-12
        y = spd_with_condition(rng, n, 10.0)
        a2 = ta.from_numpy(y, tile=(32, 32))
        listed = ta.linalg.solve(a2, [1.0] * n, assume_a="pos")
        assert rel_err(listed, np.linalg.solve(y, np.ones(n))) < 1e-12
        two = ta.linalg.solve(a2, [[1.0, 2.0]] * n, assume_a="pos")
        assert two.shape == (n, 2)
        calls = runs(monkeypatch)
        nan = np.ones(n)
        nan[3] = np.nan
        assert np.isnan(ta.linalg.solve(a2, nan, assume_a="pos")).all()
        assert len(calls) <= 4, len(calls)  # factor, substitutions, then float64's one run


@pytest.mark.timeout(300)
def test_inverse_of_spd_many_right_hand_sides_stays_under_budget(tmp_path):
    """``inv(A, assume_a="pos")`` of a 2200 x 2200 SPD A in 500 x 500 chunks
    (as plain zarr writes it): 2200 right-hand sides of 2200 rows. The
    substitutions of a 3000 x 3000 A had been planned at 134 MiB a task of
    135 on 300 MiB workers, while each row tile held a term per solved tile
    and the workers holding them were all killed (helper-47). Now a row tile
    holds one partial sum, the plan prices the held solution, partial sums
    and in-memory right-hand side: refused at 300 MiB naming what fits, and
    at that budget every worker's RSS stays under its limit and within its
    baseline plus the planned task; the inverse is NumPy's. Where only the
    LU's column groups fit (300 MiB), inv takes them."""
    rng = np.random.default_rng(0)
    n = 2200
    g = rng.standard_normal((n, n))
    a = g @ g.T / n + np.eye(n)
    zarr.create_array(str(tmp_path / "a.zarr"), data=a, chunks=(500, 500))
    x = ta.open(tmp_path / "a.zarr")
    with pytest.raises(ta.PlanningError, match=r"triangular solve .* memory_per_worker >= "
                                               r"(\d+)MiB") as refused:
        tla.solve_plan(x, np.eye(n), assume_a="pos").plan(
            budget=Budget(300 * 2**20, n_workers=2))
    need = re.search(r"memory_per_worker >= (\d+)MiB", str(refused.value)).group(1)
    with ta.Engine(n_workers=2, threads_per_worker=1, memory_per_worker=f"{need}MiB",
                   quiet=True) as eng:
        budget = eng.budget()
        inverse = tla.solve_plan(x, np.eye(n), assume_a="pos")
        plan = inverse.plan()
        assert plan.peak_task_memory <= budget.task_memory, str(plan)
        got = inverse.compute()
        assert_close(got, np.linalg.inv(a))
        assert 0 < inverse.stats.peak_worker_memory <= budget.memory_per_worker
        assert inverse.stats.peak_worker_memory <= budget.baseline + plan.peak_task_memory, \
            (inverse.stats, str(plan))
    # where the SPD substitutions do not fit and the LU's column groups do, inv takes the LU
    with ta.Engine(n_workers=2, threads_per_worker=1, memory_per_worker="300MiB",
                   quiet=True) as eng:
        with pytest.raises(ta.PlanningError):
            tla.solve_plan(x, np.eye(n), assume_a="pos").plan()
        assert_close(tla.inv(x, assume_a="pos"), np.linalg.inv(a))
        assert eng.last_run.peak_worker_memory <= eng.budget().memory_per_worker


def test_inverse_of_spd_through_the_lu_keeps_the_cholesky_rules(tmp_path):
    """Where ``inv(A, assume_a="pos")`` takes the LU (the SPD substitutions
    do not fit), it still reads A's lower triangle only and refuses a matrix
    that is not positive definite, as it does at a larger budget: at 200 MiB
    a non-SPD A had been inverted and a non-symmetric one's upper triangle
    used (helper-50)."""
    rng = np.random.default_rng(1)
    n = 1500
    g = rng.standard_normal((n, n))
    a = g @ g.T / n + np.eye(n)
    not_spd, lower_spd = a.copy(), a.copy()
    not_spd[700, 700] = -5.0
    lower_spd[np.triu_indices(n, 1)] += 0.5  # only the lower triangle is the SPD matrix's
    with ta.Engine(n_workers=2, threads_per_worker=1, memory_per_worker="200MiB",
                   processes=False, quiet=True):
        x = ta.from_numpy(not_spd, tmp_path / "n.zarr", tile=(333, 333))
        with pytest.raises(ta.PlanningError):  # so inv takes the LU
            tla.solve_plan(x, np.eye(n), assume_a="pos").plan()
        with pytest.raises(ta.NotPositiveDefiniteError, match="700"):
            tla.inv(x, assume_a="pos")
        y = ta.from_numpy(lower_spd, tmp_path / "l.zarr", tile=(333, 333))
        assert_close(tla.inv(y, assume_a="pos"), np.linalg.inv(a))
