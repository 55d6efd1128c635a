"""Linear-algebra worker kernels and their in-memory references against
NumPy/SciPy (kernels called directly, no cluster).

Q and U are compared through reconstruction and orthogonality, R through
|R| (or R^T R when rank-deficient), never raw signs.
"""

import pickle
import threading

import numpy as np
import pytest
import scipy.linalg as sla
from hypothesis import given, settings
from hypothesis import strategies as st
from threadpoolctl import threadpool_info

from tilearray.errors import NotPositiveDefiniteError, SingularMatrixError, TilearrayError
from tilearray.graphs import blas
from tilearray.graphs import linalg as la
from tilearray.testing import assert_close

FLOATS = [np.float32, np.float64]
few = settings(max_examples=30, deadline=None)


@pytest.fixture(autouse=True)
def _one_blas_thread(request):
    """NumPy's reference calls on one BLAS thread too: idle OpenBLAS threads
    spinning on a loaded 2-core machine slowed this file several-fold."""
    if request.node.name.startswith("test_one_blas_thread"):
        yield
        return
    with blas.one_blas_thread():
        yield


def _row_blocks(x, rows):
    """Row blocks of ``rows`` each, the last one short."""
    return np.split(x, range(rows, x.shape[0], rows))


def _check_qr(x, q_blocks, r, dtype):
    q = np.vstack(q_blocks)
    k = min(x.shape)
    assert q.dtype == dtype and r.dtype == dtype
    assert q.shape == (x.shape[0], k) and r.shape == (k, x.shape[1])
    assert_close(q @ r, x, precision=dtype, err_msg="Q R != X")
    assert_close(q.T @ q, np.eye(k), precision=dtype, err_msg="Q^T Q != I")
    assert np.all(np.diagonal(r) >= 0)
    np.testing.assert_array_equal(np.tril(r, -1), 0)


# ---------------------------------------------------------------- TSQR


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("fan_in", [2, 4])
@pytest.mark.parametrize("rows", [130, 20])  # 20 < n: every block is shorter than wide
def test_tsqr_ragged_blocks(dtype, fan_in, rows):
    x = np.random.default_rng(0).standard_normal((1000, 37)).astype(dtype)
    q_blocks, r = la.tsqr(_row_blocks(x, rows), fan_in)
    assert [b.shape[0] for b in q_blocks] == [b.shape[0] for b in _row_blocks(x, rows)]
    _check_qr(x, q_blocks, r, dtype)
    assert_close(np.abs(r), np.abs(np.linalg.qr(x)[1]), precision=dtype)


@given(m=st.integers(1, 200), n=st.integers(1, 12), rows=st.integers(1, 60),
       fan_in=st.integers(2, 5), dtype=st.sampled_from(FLOATS), seed=st.integers(0, 2**16))
@few
def test_tsqr_any_tree_matches_numpy(m, n, rows, fan_in, dtype, seed):
    x = np.random.default_rng(seed).standard_normal((m, n)).astype(dtype)
    q_blocks, r = la.tsqr(_row_blocks(x, rows), fan_in)
    _check_qr(x, q_blocks, r, dtype)
    # R's forward error grows with cond(X) (random near-square X can reach 1e3+)
    want = np.abs(np.linalg.qr(x)[1])
    assert_close(np.abs(r), want, precision=dtype, scale=_cond_scale(x, want))


def _cond_scale(x, want):
    return float(np.abs(want).max() * np.linalg.cond(x.astype(np.float64)))


def test_tsqr_sign_normalised_r_does_not_depend_on_the_tree():
    x = np.random.default_rng(1).standard_normal((500, 9))
    _, r2 = la.tsqr(_row_blocks(x, 40), 2)
    _, r4 = la.tsqr(_row_blocks(x, 90), 4, compute_q=False)
    _, r1 = la.tsqr([x])
    assert_close(r2, r1)
    assert_close(r4, r1)


def test_tsqr_rank_deficient():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((300, 4)) @ rng.standard_normal((4, 10))  # rank 4 of 10
    x[:, 7] = x[:, 2]
    q_blocks, r = la.tsqr(_row_blocks(x, 25), 3)
    _check_qr(x, q_blocks, r, np.float64)
    # R is not unique past the rank; R^T R = X^T X is
    assert_close(r.T @ r, x.T @ x)


def test_tsqr_empty_block_and_integer_input():
    x = np.arange(60).reshape(12, 5) % 7 + np.eye(12, 5, dtype=int)
    blocks = [x[:4], x[4:4], x[4:]]
    q_blocks, r = la.tsqr(blocks, 2)
    assert r.dtype == np.float64 and q_blocks[1].shape == (0, 5)
    _check_qr(x, q_blocks, r, np.float64)


def test_kernels_refuse_what_numpy_linalg_refuses():
    with pytest.raises(TypeError, match="float16"):
        la.qr_leaf(np.ones((3, 2), np.float16))
    with pytest.raises(ValueError, match="fan_in"):
        la.tsqr([np.ones((3, 2))], 1)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
@pytest.mark.parametrize("shape", [(300, 7), (64, 64), (5, 9), (1, 4), (33, 1), (0, 3)])
def test_leaf_geqrt_r_and_apply_match_numpy(shape, dtype):
    """The TSQR leaf's blocked QR: |R| as NumPy's, and the Q it applies
    (never formed) is the Q behind that R: Q R = X, Q^T Q = I, and Q @ S."""
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * 10).astype(dtype)
    want = np.dtype(dtype) if dtype != np.int32 else np.dtype(np.float64)
    r = la.qr_leaf_r(x)
    k = min(shape)
    assert r.dtype == want and r.shape == (k, shape[1])
    q = la.qr_leaf_apply(x, None)
    assert q.dtype == want and q.shape == (shape[0], k)
    if x.size == 0:
        return
    assert_close(np.abs(r), np.abs(np.linalg.qr(x.astype(want), mode="r")), precision=want)
    assert_close(q @ r, x, precision=want, err_msg="Q R != X")
    assert_close(q.T @ q, np.eye(k), precision=want, err_msg="Q^T Q != I")
    s = rng.standard_normal((k, 3)).astype(want)
    assert_close(la.qr_leaf_apply(x, s), q @ s, precision=want)
    # overwrite_block destroys an F-ordered block of the computing dtype only
    y = np.asfortranarray(x)
    la.qr_leaf_r(y, overwrite_block=False)
    np.testing.assert_array_equal(y, x)
    with pytest.raises(ValueError, match="rows"):
        la.qr_leaf_apply(x, np.ones((k + 1, 2), want))


@pytest.mark.parametrize("shape", [(300, 7), (128, 48), (33, 1)])
def test_leaf_solve_is_the_reflectors_q_where_r_is_well_conditioned(shape):
    """X_i R_i^-1 S equals the reflectors' Q_i S for a well-conditioned
    float64 leaf; no weights (apply the reflectors) for float32, an
    ill-conditioned or singular R, a short leaf (R not square) and a slice
    of the wrong size."""
    rng = np.random.default_rng(sum(shape))
    x = rng.standard_normal(shape)
    m, k = shape
    s = rng.standard_normal((k, 3))
    w = la.leaf_solve_weights(la.qr_leaf_r(x), s, m)
    got = la.leaf_times(x, w)
    assert got.shape == (m, 3) and got.dtype == np.float64
    assert_close(got, la.qr_leaf_apply(x, s), scale=np.abs(s).sum(axis=0).max())
    x32 = x.astype(np.float32)
    assert la.leaf_solve_weights(la.qr_leaf_r(x32), s.astype(np.float32), m) is None
    assert la.leaf_solve_weights(la.qr_leaf_r(x), np.ones((k + 1, 3)), m) is None
    if k > 1:
        ill = x.copy()
        ill[:, 0] = ill[:, -1] * (1 + 1e-11)  # kappa ~ 1e11: X R^-1 would lose ~1e-5
        assert la.leaf_solve_weights(la.qr_leaf_r(ill), s, m) is None
        zero = x.copy()
        zero[:, 0] = 0.0  # R singular
        assert la.leaf_solve_weights(la.qr_leaf_r(zero), s, m) is None
    short = x[: k - 1] if k > 1 else x[:0]
    assert la.leaf_solve_weights(la.qr_leaf_r(short), s, len(short)) is None


@pytest.mark.parametrize("shape", [(300, 7), (128, 48), (33, 1)])
def test_gram_leaf_r_only_where_its_q_stays_orthogonal(shape):
    """A leaf's R from its Gram matrix: |R| of the Householder QR to rounding
    (C- or F-ordered block, positive diagonal), and ``X R^-1`` orthogonal to
    ~1e-13; None where CholeskyQR would lose more (kappa ~1000: the solve
    path still takes the Householder R: kappa_1 <= ~4500), for float32, a singular or
    non-finite block and a short one."""
    rng = np.random.default_rng(sum(shape) + 1)  # (the kappas below hold for these seeds)
    x = rng.standard_normal(shape)
    m, k = shape
    want = np.abs(la.qr_leaf_r(x))
    for block in (x, np.asfortranarray(x)):
        r = la.gram_leaf_r(block)
        assert r is not None and (np.diag(r) > 0).all()
        assert_close(np.abs(r), want, scale=np.abs(want).max())
        q = x @ np.linalg.inv(r)
        assert np.abs(q.T @ q - np.eye(k)).max() < 1e-13
    assert la.gram_leaf_r(x.astype(np.float32)) is None
    assert la.gram_leaf_r(x[: k - 1]) is None
    bad = x.copy()
    bad[0, 0] = np.nan
    assert la.gram_leaf_r(bad) is None
    if k > 1:
        u, _, vt = np.linalg.svd(x, full_matrices=False)
        mid = (u * np.geomspace(1, 1e-2, k)) @ vt  # kappa_1 200-500: Cholesky's Q loses ~1e-11
        assert la.gram_leaf_r(mid) is None
        s = rng.standard_normal((k, 2))
        assert la.leaf_solve_weights(la.qr_leaf_r(mid), s, m) is not None
        zero = x.copy()
        zero[:, 0] = 0.0
        assert la.gram_leaf_r(zero) is None
    if k >= 48:  # kappa_1 of R ~65 but kappa_2 ~n * 30: refused (X R^-1 would lose ~1e-12)
        q, _ = np.linalg.qr(x)
        r = np.eye(k)
        r[0] += 32.0
        assert np.linalg.cond(r, 1) < 70 < np.linalg.cond(r)
        assert la.gram_leaf_r(q @ r) is None


def test_qr_combine_splits_q_per_child():
    rng = np.random.default_rng(3)
    rs = [la.qr_leaf(rng.standard_normal((m, 6)))[1] for m in (10, 3, 6)]
    pieces, r = la.qr_combine(rs)
    assert [p.shape for p in pieces] == [(6, 6), (3, 6), (6, 6)]
    assert_close(np.vstack(pieces) @ r, np.vstack(rs))


# ---------------------------------------------------------------- SVD


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("fan_in", [2, 4])
def test_svd_tsqr(dtype, fan_in):
    x = np.random.default_rng(4).standard_normal((1000, 37)).astype(dtype)
    u_blocks, s, vt = la.svd_tsqr(_row_blocks(x, 130), fan_in)
    u = np.vstack(u_blocks)
    assert u.dtype == s.dtype == vt.dtype == dtype
    assert_close(s, np.linalg.svd(x, compute_uv=False), precision=dtype)
    assert_close((u * s) @ vt, x, precision=dtype)
    assert_close(u.T @ u, np.eye(37), precision=dtype)
    assert_close(vt @ vt.T, np.eye(37), precision=dtype)
    assert_close(la.svd_tsqr(_row_blocks(x, 130), fan_in, compute_uv=False), s)


# ---------------------------------------------------------------- least squares


def _lstsq_blocks(x, y, rows, fan_in=2, **kw):
    return la.lstsq_tsqr(_row_blocks(x, rows), _row_blocks(y, rows), fan_in, **kw)


def _assert_lstsq_equal(got, want, dtype, res_scale=None, x_scale=None):
    x, res, rank, s = got
    assert rank == want[2]
    assert x.shape == want[0].shape and res.shape == want[1].shape
    assert x.dtype == want[0].dtype and s.dtype == want[3].dtype
    assert_close(x, want[0], precision=dtype, scale=x_scale)
    assert_close(res, want[1], precision=dtype, scale=res_scale)
    assert_close(s, want[3], precision=dtype)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("ycols", [None, 3])
def test_lstsq_matches_numpy(dtype, ycols):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1000, 37)).astype(dtype)
    y = rng.standard_normal(1000 if ycols is None else (1000, ycols)).astype(dtype)
    _assert_lstsq_equal(_lstsq_blocks(x, y, 130, 4), np.linalg.lstsq(x, y), dtype)


def test_lstsq_ill_conditioned_beats_normal_equations():
    rng = np.random.default_rng(6)
    m, n = 1000, 20
    u, _ = np.linalg.qr(rng.standard_normal((m, n)))
    v, _ = np.linalg.qr(rng.standard_normal((n, n)))
    x = (u * np.logspace(0, -10, n)) @ v.T  # cond(X) = 1e10
    truth = rng.standard_normal(n)
    y = x @ truth
    err = lambda sol: np.linalg.norm(sol - truth) / np.linalg.norm(truth)  # noqa: E731
    tsqr_err = err(_lstsq_blocks(x, y, 130)[0])
    normal_err = err(np.linalg.solve(x.T @ x, x.T @ y))
    assert tsqr_err < 1e-5  # ~cond * eps
    assert normal_err > 1e-2  # ~cond^2 * eps: no correct digit left
    assert tsqr_err < 10 * max(err(np.linalg.lstsq(x, y)[0]), 1e-9)


def test_lstsq_rank_deficient_gives_numpys_minimum_norm_solution():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((400, 5)) @ rng.standard_normal((5, 12))  # rank 5 of 12
    y = rng.standard_normal((400, 2))
    got = _lstsq_blocks(x, y, 50, 3)
    assert got[2] == 5 and got[1].shape == (0,)
    _assert_lstsq_equal(got, np.linalg.lstsq(x, y), np.float64)


@given(m=st.integers(1, 120), n=st.integers(1, 10), p=st.sampled_from([None, 1, 3]),
       rows=st.integers(1, 40), fan_in=st.integers(2, 4), dtype=st.sampled_from(FLOATS),
       seed=st.integers(0, 2**16))
@few
def test_lstsq_any_shape_matches_numpy(m, n, p, rows, fan_in, dtype, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, n)).astype(dtype)
    y = rng.standard_normal(m if p is None else (m, p)).astype(dtype)
    got = _lstsq_blocks(x, y, rows, fan_in)
    want = np.linalg.lstsq(x, y)
    # squared residual norms cancel (|y|^2 - |Q^T y|^2): held to the scale of |y|^2
    _assert_lstsq_equal(got, want, dtype, res_scale=float(np.sum(y.astype(float) ** 2)),
                        x_scale=_cond_scale(x, want[0]))  # forward error ~ cond(X)


@pytest.mark.parametrize("rcond", [None, 1e-3, -1])
def test_lstsq_rcond_and_underdetermined(rcond):
    rng = np.random.default_rng(8)
    x = rng.standard_normal((15, 30)) * np.logspace(0, -6, 30)  # m < n
    y = rng.standard_normal(15)
    _assert_lstsq_equal(_lstsq_blocks(x, y, 4, 2, rcond=rcond),
                        np.linalg.lstsq(x, y, rcond=rcond), np.float64)


# ---------------------------------------------------------------- randomized SVD Omega


def test_omega_rows_any_split_gives_the_same_matrix():
    whole = la.omega_rows(11, 3000, 5, 0, 3000)
    parts = np.vstack([la.omega_rows(11, 3000, 5, a, b)
                       for a, b in [(0, 7), (7, 1024), (1024, 1025), (1025, 2900), (2900, 3000)]])
    np.testing.assert_array_equal(parts, whole)
    # rows do not depend on n, and seeds differ
    np.testing.assert_array_equal(la.omega_rows(11, 5000, 5, 100, 200), whole[100:200])
    assert not np.array_equal(la.omega_rows(12, 3000, 5, 0, 3000), whole)
    assert abs(whole.mean()) < 0.05 and abs(whole.std() - 1) < 0.05
    f32 = la.omega_rows(11, 3000, 5, 10, 20, np.float32)
    assert f32.dtype == np.float32 and f32.shape == (10, 5)
    with pytest.raises(ValueError, match="outside"):
        la.omega_rows(11, 3000, 5, 10, 3001)


# ---------------------------------------------------------------- Cholesky


def _spd(n, dtype, seed):
    m = np.random.default_rng(seed).standard_normal((n, n))
    return (m @ m.T + n * np.eye(n)).astype(dtype)


@given(n=st.integers(1, 60), tile=st.integers(1, 25), order=st.sampled_from(["left", "right"]),
       dtype=st.sampled_from(FLOATS), seed=st.integers(0, 2**16))
@few
def test_cholesky_tiled_matches_numpy(n, tile, order, dtype, seed):
    tile = max(tile, -(-n // 8))  # at most 8 x 8 tiles: bounds the cost
    a = _spd(n, dtype, seed)
    lo = la.cholesky_tiled(a, tile, order=order)
    assert lo.dtype == dtype
    assert_close(lo, np.linalg.cholesky(a), precision=dtype)


@pytest.mark.parametrize("order", ["left", "right"])
@pytest.mark.parametrize("bad", [0, 6, 13, 29])
def test_cholesky_not_spd_names_tile_and_column(order, bad):
    rng = np.random.default_rng(9)
    unit = np.tril(rng.standard_normal((30, 30)), -1) * 0.3 + np.eye(30)
    d = np.ones(30)
    d[bad] = -1.0  # A = L D L^T: the pivot of column `bad` is negative, those before positive
    a = (unit * d) @ unit.T
    with pytest.raises(NotPositiveDefiniteError) as info:
        la.cholesky_tiled(a, 7, order=order)
    err = info.value
    assert err.column == bad and err.tile == (bad // 7, bad // 7)
    assert f"column {bad}" in str(err) and str(err.tile) in str(err)
    assert isinstance(err, np.linalg.LinAlgError) and isinstance(err, TilearrayError)
    again = pickle.loads(pickle.dumps(err))
    assert (again.tile, again.column, str(again)) == (err.tile, err.column, str(err))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("rhs", [None, 8])
def test_solve_spd_tiled(dtype, rhs):
    a = _spd(70, dtype, 10)
    b = np.random.default_rng(10).standard_normal(70 if rhs is None else (70, rhs)).astype(dtype)
    x = la.solve_spd_tiled(a, b, 16)
    assert x.shape == b.shape and x.dtype == dtype
    assert_close(x, np.linalg.solve(a, b), precision=dtype)


def test_tile_kernels_update_fortran_tiles_in_place():
    rng = np.random.default_rng(11)
    c = np.asfortranarray(rng.standard_normal((6, 5)))
    a, b = rng.standard_normal((6, 3)), np.ascontiguousarray(rng.standard_normal((5, 3)))
    want = c - a @ b.T
    out = blas.gemm_update(c, a, b, trans_b=True)
    assert out is c or np.shares_memory(out, c)
    assert_close(out, want)
    s = np.asfortranarray(_spd(6, np.float64, 1))
    want = np.tril(s - a @ a.T)
    assert_close(np.tril(blas.syrk_update(s, a)), want)
    lo = np.linalg.cholesky(_spd(6, np.float64, 2))
    rhs = rng.standard_normal((6, 4))
    assert_close(blas.trsm_left_lower(lo, rhs.copy()), sla.solve_triangular(lo, rhs, lower=True))
    assert_close(blas.trsm_left_lower(lo, rhs.copy(), trans=True),
                 sla.solve_triangular(lo, rhs, lower=True, trans="T"))
    assert_close(blas.trsm_left_upper(lo.T, rhs.copy()), np.linalg.solve(lo.T, rhs))
    assert_close(blas.trsm(lo, rhs.T.copy()), rhs.T @ np.linalg.inv(lo).T)


def test_one_blas_thread_nests_and_restores():
    before = [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
    with blas.one_blas_thread():
        with blas.one_blas_thread():
            pass
        inside = [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
        blas.potrf(np.eye(3))  # a kernel inside does not restore the limit early
        assert [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"] == inside
    assert inside and set(inside) == {1}
    assert [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"] == before


def test_one_blas_thread_restores_from_another_thread():
    """The first thread in applies the limit and the last out restores it,
    here another thread: threadpoolctl (3.7 on) ignores OpenBLAS limits set
    by any thread but the one that first set one (here the main thread's
    ``threadpool_limits``) unless control is handed over. Without that the
    limit was never applied, or never restored (the driver's NumPy left on one
    thread in half the runs of 4 threads calling kernels)."""
    from threadpoolctl import threadpool_limits

    def counts():
        return [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]

    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    inside = []

    def first():
        with blas.one_blas_thread():
            first_in.set()
            second_in.wait(10)
        first_out.set()

    def second():
        first_in.wait(10)
        with blas.one_blas_thread():
            second_in.set()
            first_out.wait(10)
            inside.append(counts())
            blas.potrf(np.eye(3))

    with threadpool_limits(2, user_api="blas"):  # a count to come back to, on any machine
        before = counts()
        threads = [threading.Thread(target=first), threading.Thread(target=second)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        after = counts()
    assert set(before) == {2} and inside and set(inside[0]) == {1}
    assert after == before


# ---------------------------------------------------------------- LU


def _check_lu(a, perm, lower, upper, dtype, same_pivots=True):
    assert sorted(perm) == list(range(a.shape[0]))
    assert_close(lower @ upper, a[perm], precision=dtype)
    np.testing.assert_array_equal(np.diagonal(lower), 1)
    assert np.all(np.abs(lower) <= 1 + 1e-6)  # partial pivoting: |multipliers| <= 1
    if same_pivots:  # not asserted on random draws: near-ties may round either way
        assert_close(upper, sla.lu(a)[2], precision=dtype)


@given(n=st.integers(1, 50), tile=st.integers(1, 20), dtype=st.sampled_from(FLOATS),
       order=st.sampled_from(["left", "right"]), seed=st.integers(0, 2**16))
@few
def test_lu_tiled_matches_lapack(n, tile, dtype, order, seed):
    tile = max(tile, -(-n // 8))  # at most 8 x 8 tiles: bounds the cost
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((n, n)).astype(dtype)
    perm, lower, upper = la.lu_tiled(a, tile, order=order)
    assert lower.dtype == upper.dtype == dtype
    _check_lu(a, perm, lower, upper, dtype, same_pivots=False)
    b = rng.standard_normal((n, 3)).astype(dtype)
    assert_close(a @ la.solve_lu_tiled(a, b, tile, order=order), b, precision=dtype,
                 scale=float(np.abs(a).sum(1).max() * np.abs(np.linalg.solve(a, b)).max()))


@pytest.mark.parametrize("order", ["left", "right"])
@pytest.mark.parametrize("tile", [1, 3, 8])
def test_lu_pivots_where_no_pivoting_breaks_down(tile, order):
    rng = np.random.default_rng(12)
    a = rng.standard_normal((20, 20))
    a[0, 0] = 0.0  # no first pivot without a row interchange
    a[5, :5] = 0.0
    a[5, 5] = 1e-18  # a tiny pivot no-pivot elimination would divide by
    perm, lower, upper = la.lu_tiled(a, tile, order=order)
    assert perm[0] != 0
    _check_lu(a, perm, lower, upper, np.float64)
    b = rng.standard_normal(20)
    x = la.solve_lu_tiled(a, b, tile, order=order)
    assert x.shape == (20,)
    assert_close(x, np.linalg.solve(a, b))


@pytest.mark.parametrize("order", ["left", "right"])
@pytest.mark.parametrize("tile", [1, 2, 3, 8])
def test_singular_solve_names_the_column(tile, order):
    a = np.random.default_rng(13).standard_normal((12, 12))
    a[:, 9] = 0.0
    with pytest.raises(SingularMatrixError) as info:
        la.solve_lu_tiled(a, np.ones(12), tile, order=order)
    assert info.value.column == 9 and info.value.panel == 9 // tile
    assert isinstance(info.value, np.linalg.LinAlgError)
    assert "column 9" in str(info.value)
    # exact cancellation: column 1 = 2 * column 0 in the leading 2 x 2 block
    b = np.array([[1.0, 2.0, 0.0], [2.0, 4.0, 0.0], [0.0, 0.0, 1.0]])
    with pytest.raises(SingularMatrixError, match="column 1"):
        la.lu_tiled(b, tile, order=order)
    with pytest.raises(np.linalg.LinAlgError, match="square"):
        la.lu_tiled(np.ones((3, 4)), tile)
    err = pickle.loads(pickle.dumps(info.value))
    assert (err.column, err.panel) == (9, 9 // tile)


def test_slogdet_from_lu_and_cholesky():
    rng = np.random.default_rng(14)
    a = rng.standard_normal((25, 25))
    perm, _, upper = la.lu_tiled(a, 6)
    sign, logdet = blas.slogdet_from_lu(perm, np.diagonal(upper))
    want = np.linalg.slogdet(a)
    assert sign == want[0]
    assert_close(logdet, want[1])
    spd = _spd(25, np.float64, 14)
    got = blas.slogdet_from_lu(np.arange(25), np.diagonal(la.cholesky_tiled(spd, 6)) ** 2)
    assert got[0] == 1.0
    assert_close(got[1], np.linalg.slogdet(spd)[1])
    assert blas.slogdet_from_lu(np.arange(3), np.array([1.0, 0.0, 2.0])) == (0.0, -np.inf)


# ---------------------------------------------------------------- randomized SVD


@pytest.mark.parametrize("dtype", FLOATS)
def test_svd_compressed_ref_top_singular_values(dtype):
    rng = np.random.default_rng(15)
    u, _ = np.linalg.qr(rng.standard_normal((400, 120)))
    v, _ = np.linalg.qr(rng.standard_normal((300, 120)))
    a = ((u * 0.7 ** np.arange(120)) @ v.T).astype(dtype)
    uk, s, vt = la.svd_compressed_ref(a, 10, n_power_iter=2, seed=3, tile=70)
    assert uk.shape == (400, 10) and s.shape == (10,) and vt.shape == (10, 300)
    assert s.dtype == dtype
    want = np.linalg.svd(a.astype(np.float64), compute_uv=False)[:10]
    rel = 1e-6 if dtype == np.float64 else 1e-4
    np.testing.assert_allclose(s, want, rtol=rel)
    assert_close(uk.T @ uk, np.eye(10), precision=dtype)
    again = la.svd_compressed_ref(a, 10, n_power_iter=2, seed=3, tile=70)[1]
    np.testing.assert_array_equal(again, s)  # same seed, same answer


# ---------------------------------------------------------------- memory held, as documented


def _new_bytes(func, *args, **kwargs):
    """Peak bytes a call allocates beyond its inputs (NumPy and f2py arrays):
    the least of three calls, each on fresh copies of the array arguments
    (tracemalloc counts every thread's allocations, and a background
    thread's -- an engine's event loop under load -- can only add; one such
    run measured qr_leaf 10 % over its own)."""
    import tracemalloc

    peaks = []
    for _ in range(3):
        fresh = [a.copy(order="K") if isinstance(a, np.ndarray) else a for a in args]
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            func(*fresh, **kwargs)
            peaks.append(tracemalloc.get_traced_memory()[1] - base)
        finally:
            tracemalloc.stop()
    return min(peaks)


def test_kernels_allocate_what_their_docstrings_say():
    rng = np.random.default_rng(16)
    m, n, t, b = 4000, 32, 300, 8
    x = np.asfortranarray(rng.standard_normal((m, n)))
    work = 512 * n * b  # LAPACK's workspace
    assert _new_bytes(la.qr_leaf, x) <= 1.02 * m * n * b + n * n * b + work  # Q_i (+ R_i)
    assert _new_bytes(la.qr_leaf, x.copy(order="F"), overwrite_block=True) <= n * n * b + work
    rs = [la.qr_leaf(rng.standard_normal((rows, n)))[1] for rows in (100, 7, 50, 3)]
    s = sum(r.shape[0] for r in rs)  # 32 + 7 + 32 + 3: fan-in 4, two short children
    assert _new_bytes(la.qr_combine, rs) <= s * n * b + 2 * n * n * b + work
    r = np.triu(rng.standard_normal((300, 300)))  # the root's (memory.tsqr_root_peak)
    assert _new_bytes(la.svd_from_r, r, compute_uv=False) <= 3 * r.nbytes
    assert _new_bytes(la.svd_from_r, r, compute_uv=True) <= 7.2 * r.nbytes
    wide = np.triu(rng.standard_normal((40, 3000)))  # 3 r w + 5 r^2 with vectors
    assert _new_bytes(la.svd_from_r, wide, compute_uv=True) <= 3.1 * wide.nbytes + 5 * 40 * 40 * b
    for y in (wide, r):  # least squares: R11's singular values, then its SVD with vectors
        bound = 3.1 * y.nbytes + 5 * y.shape[0] ** 2 * b if y is wide else 8.2 * y.nbytes
        assert _new_bytes(la.lstsq_from_r, y, y.shape[1] - 1, 10**6) <= bound
    spd = np.asfortranarray(_spd(t, np.float64, 16))
    assert _new_bytes(blas.potrf, spd) <= 1.1 * t * t * b
    c = np.asfortranarray(rng.standard_normal((t, t)))
    lo = blas.potrf(spd)
    for call in (lambda: blas.gemm_update(c, spd, spd, trans_b=True),
                 lambda: blas.syrk_update(c, spd), lambda: blas.trsm(lo, c),
                 lambda: blas.trsm_left_lower(lo, c)):
        assert _new_bytes(call) <= 0.05 * t * t * b + 2**16  # in place on an F-ordered tile
    panel = np.asfortranarray(rng.standard_normal((4 * t, t // 4)))
    assert _new_bytes(blas.getrf_panel, panel) <= 1.1 * panel.nbytes + 4 * t * 8  # LU + perm


def test_kernels_pickle_by_reference():
    for func in (la.qr_leaf, la.qr_combine, la.q_apply_down, blas.potrf, blas.gemm_update,
                 blas.getrf_panel, la.lstsq_from_r, la.omega_rows):
        assert pickle.loads(pickle.dumps(func)) is func


@pytest.mark.parametrize("dtype", FLOATS)
def test_r_only_up_sweep_matches_full_tsqr(dtype):
    x = np.random.default_rng(17).standard_normal((700, 37)).astype(dtype)
    blocks = _row_blocks(x, 30)  # 30 < 37: short leaves
    r_only = la.tsqr_r(blocks, 3)
    assert r_only.dtype == dtype and r_only.shape == (37, 37)
    assert_close(r_only, la.tsqr(blocks, 3)[1], precision=dtype)
    assert la.qr_leaf(x[:10], mode="r").shape == (10, 37)
    assert_close(np.abs(la.qr_leaf(x, mode="r")), np.abs(np.linalg.qr(x, mode="r")),
                 precision=dtype)
    m, n, b = x.shape[0], x.shape[1], x.dtype.itemsize
    xf = np.asfortranarray(x)
    assert _new_bytes(la.qr_leaf, xf, mode="r") <= 1.02 * m * n * b + n * n * b + 512 * n * b
