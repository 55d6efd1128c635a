"""BLAS/LAPACK through SciPy's Cython pointers (tilearray.graphs.nogil):
the same numbers as NumPy over every operand layout a kernel meets, the
output written in place when it can be, and the GIL released during a call."""

import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.linalg import blas as scipy_blas
from threadpoolctl import threadpool_limits

from tilearray.graphs import blas, nogil
from tilearray.testing import assert_close

LAYOUTS = ["F", "C", "F-view", "C-view", "strided", "big-endian"]


def _lay(x: np.ndarray, how: str) -> np.ndarray:
    """``x`` (values kept) stored as ``how``: a whole array in either order, a
    block inside a larger one (a leading dimension above its rows), every
    other column of a larger one (no BLAS layout: copied), or big-endian."""
    m, n = x.shape
    if how in ("F", "C"):
        return np.array(x, order=how)
    if how in ("F-view", "C-view"):
        big = np.zeros((m + 3, n + 2), dtype=x.dtype, order=how[0])
        big[2:2 + m, 1:1 + n] = x
        return big[2:2 + m, 1:1 + n]
    if how == "strided":
        big = np.zeros((m, 2 * n), dtype=x.dtype)
        big[:, ::2] = x
        return big[:, ::2]
    return x.astype(x.dtype.newbyteorder(">"))


shapes = st.tuples(st.integers(1, 40), st.integers(1, 40), st.integers(1, 40))


@settings(max_examples=60, deadline=None)
@given(shapes, st.sampled_from(LAYOUTS), st.sampled_from(LAYOUTS), st.sampled_from(LAYOUTS),
       st.booleans(), st.booleans(), st.sampled_from([np.float32, np.float64]))
def test_gemm_matches_numpy_in_every_layout(mnk, lay_a, lay_b, lay_c, ta, tb, dtype):
    m, n, k = mnk
    rng = np.random.default_rng(m * 1600 + n * 40 + k)
    a = rng.standard_normal((k, m) if ta else (m, k)).astype(dtype)
    b = rng.standard_normal((n, k) if tb else (k, n)).astype(dtype)
    c = rng.standard_normal((m, n)).astype(dtype)
    want = c - (a.T if ta else a) @ (b.T if tb else b)
    c_in = _lay(c, lay_c)
    got = nogil.gemm(-1.0, _lay(a, lay_a), _lay(b, lay_b), 1.0, c_in, trans_a=ta, trans_b=tb)
    assert got.dtype == dtype
    assert_close(got, want, precision=dtype, scale=np.abs(want).max() + k)
    if lay_c in ("F", "F-view"):  # written in place when c lies column-major
        assert got is c_in
    elif got is not c_in:  # else a copy, c left as it was
        np.testing.assert_array_equal(c_in, c)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 40), st.integers(1, 40), st.sampled_from(LAYOUTS), st.booleans(),
       st.booleans(), st.sampled_from([np.float32, np.float64]))
def test_syrk_matches_numpy_on_its_triangle(n, k, lay_a, trans, lower, dtype):
    rng = np.random.default_rng(n * 40 + k)
    a = rng.standard_normal((k, n) if trans else (n, k)).astype(dtype)
    c = rng.standard_normal((n, n)).astype(dtype)
    op = a.T if trans else a
    want = 2 * c + 0.5 * op @ op.T
    got = nogil.syrk(0.5, _lay(a, lay_a), 2.0, c.copy(order="F"), trans=trans, lower=lower)
    tri = np.tril if lower else np.triu
    assert_close(tri(got), tri(want), precision=dtype, scale=np.abs(want).max())
    other = np.triu if lower else np.tril  # the other triangle is left as it was
    np.testing.assert_array_equal(other(got, 1 if lower else -1), other(c, 1 if lower else -1))


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 30), st.integers(1, 30), st.sampled_from(LAYOUTS), st.booleans(),
       st.booleans(), st.booleans(), st.booleans(), st.sampled_from([np.float32, np.float64]))
def test_trsm_solves_in_every_layout(t, p, lay_a, left, lower, trans, unit, dtype):
    rng = np.random.default_rng(t * 30 + p)
    tri = np.tril if lower else np.triu
    a = tri(rng.standard_normal((t, t)) + 4 * np.eye(t)).astype(dtype)
    # the other triangle holds garbage: trsm must not read it
    a_stored = a + (np.triu if lower else np.tril)(np.full((t, t), 7.0), 1 if lower else -1)
    if unit:
        a = a - np.diag(np.diag(a)) + np.eye(t)
    b = rng.standard_normal((t, p) if left else (p, t)).astype(dtype)
    x = nogil.trsm(_lay(a_stored.astype(dtype), lay_a), b.copy(order="F"), left=left,
                   lower=lower, trans=trans, unit=unit)
    op = a.T if trans else a
    assert_close(op @ x if left else x @ op, b, precision=dtype, scale=np.abs(b).max() * t)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("lower", [True, False])
def test_potrf_and_its_pivot(dtype, lower):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((30, 30))
    s = (x @ x.T + 30 * np.eye(30)).astype(dtype)
    c, info = nogil.potrf(np.asfortranarray(s), lower=lower)
    want = np.linalg.cholesky(s.astype(np.float64))
    assert info == 0
    assert_close(np.tril(c) if lower else np.triu(c), want if lower else want.T, precision=dtype,
                 scale=np.abs(want).max())
    s[12, 12] = -1.0  # the 13th leading minor is not positive
    assert nogil.potrf(np.asfortranarray(s), lower=lower)[1] == 13


def test_potrf_kernel_zeroes_the_other_triangle_in_place():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((700, 700))
    s = np.asfortranarray(x @ x.T + 700 * np.eye(700))
    want = np.linalg.cholesky(s)
    got = blas.potrf(s, overwrite=True)
    assert np.shares_memory(got, s)
    np.testing.assert_array_equal(np.triu(got, 1), 0)
    assert_close(got, want, scale=np.abs(want).max())


def test_unsupported_dtypes_have_no_routine():
    assert nogil.routine("gemm", np.float16) is None
    assert nogil.routine("potrf", np.complex128) is None
    assert nogil.routine("gemm", np.float64) is nogil.routine("gemm", np.dtype("<f8"))


def _main_thread_turns(call) -> int:
    """How many times this thread ran (1 ms sleeps) while ``call`` ran in
    another thread: a few if ``call`` held the GIL throughout."""
    done = threading.Event()
    worker = threading.Thread(target=lambda: (call(), done.set()))
    turns = 0
    worker.start()
    while not done.is_set():
        done.wait(0.001)
        turns += 1
    worker.join()
    return turns


def test_kernels_release_the_gil():
    """The reason for the module: SciPy's f2py dgemm holds the GIL for the
    whole call (the control), so a worker's event loop stalled for each tile
    kernel; through the Cython pointer the other threads run meanwhile. Each
    call runs ~0.1-1 s here; the count is of turns, not of seconds."""
    rng = np.random.default_rng(5)
    n = 1500
    a = np.asfortranarray(rng.standard_normal((n, n)))
    c = np.asfortranarray(rng.standard_normal((n, n)))
    with threadpool_limits(1, user_api="blas"):
        held = _main_thread_turns(lambda: scipy_blas.dgemm(1.0, a, a, 1.0, c, overwrite_c=1))
        released = {
            "gemm": _main_thread_turns(lambda: nogil.gemm(1.0, a, a, 1.0, c)),
            "syrk": _main_thread_turns(lambda: nogil.syrk(1.0, a, 1.0, c)),
            "trsm": _main_thread_turns(
                lambda: nogil.trsm(np.tril(a) + n * np.eye(n), c, left=True, lower=True,
                                   trans=False, unit=False)),
        }
    # The control is counted on a shared machine: the thread's start and the
    # interpreter's switch interval (5 ms) around the call give the main
    # thread a few turns even when the call holds the GIL (3 were seen in CI).
    # A call that releases it gives one turn a millisecond: ~100-1000.
    assert held <= 6, held
    assert all(turns >= 5 * max(held, 4) for turns in released.values()), (held, released)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(40, 40), (57, 13), (1, 1)])
def test_getrf_pivots_as_lapack(dtype, shape):
    import scipy.linalg as sla

    a = np.random.default_rng(6).standard_normal(shape).astype(dtype)
    lu, piv, info = nogil.getrf(a.copy(order="F"))
    want_lu, want_piv, _ = sla.lapack.get_lapack_funcs("getrf", (a,))(a)
    assert info == 0
    np.testing.assert_array_equal(piv, want_piv)  # 0-based, as SciPy's
    assert_close(lu, want_lu, precision=dtype)
    a[:, 0] = 0  # an exactly zero first column: LAPACK's info names it
    assert nogil.getrf(a.copy(order="F"))[2] == 1


def test_mismatched_shapes_raise_before_blas_touches_memory():
    """BLAS trusts the extents it is given: a mismatch would read or write
    past an array (the review's repros: a potrf of a 4 x 2 view wrote outside
    it), so each routine checks them first, as SciPy's wrappers did."""
    big = np.zeros((4, 6), order="F")
    big[:, :4] = 4 * np.eye(4) + 1
    before = big.copy()
    calls = {
        "potrf": lambda: nogil.potrf(big[:, :2]),
        "syrk": lambda: nogil.syrk(1.0, np.ones((3, 1)), 0.0, big[:3, :2]),
        "gemm k": lambda: nogil.gemm(1.0, np.eye(2), big[:1, :1], 0.0, big[:2, :2]),
        "gemm m": lambda: nogil.gemm(1.0, np.ones((3, 2)), np.ones((2, 2)), 1.0, big[:2, :2]),
        "gemm n": lambda: nogil.gemm(1.0, np.ones((2, 2)), np.ones((2, 3)), 1.0, big[:2, :2]),
        "trsm": lambda: nogil.trsm(np.eye(3), big[:2, :2], left=True, lower=True, trans=False,
                                   unit=False),
        "gemm_update": lambda: blas.gemm_update(big[:2, :2], np.ones((2, 3)), np.ones((2, 2))),
    }
    for name, call in calls.items():
        with pytest.raises(ValueError, match="expected"):
            call()
        np.testing.assert_array_equal(big, before, err_msg=name)
    with pytest.raises(ValueError, match="32-bit BLAS"):
        nogil._int(2**31)
