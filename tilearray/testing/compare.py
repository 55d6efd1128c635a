"""One comparison of tilearray results against NumPy, correct for floating point.

A relative tolerance alone fails on entries near zero: a recovered or resumed
run sums K-panels in another order, so a near-zero entry of a matrix whose
entries are ~50 differs in its last bits by ~1e-14 absolute, which is a huge
*relative* error. The tolerance here is relative to the **scale of the
result** (its largest finite magnitude), so every entry is held to the same
absolute precision, ``rtol * max|desired|``, plus ``rtol`` relative.
"""

from __future__ import annotations

import numpy as np

#: rtol by the precision of the data that was computed on: a few hundred ulps
#: of accumulated rounding, generous for sums over ~10^4 terms, far below any
#: real error (a wrong tile, a lost K panel, a missing chunk read as zeros).
RTOL = {2: 1e-2, 4: 1e-4, 8: 1e-9}


def tolerance(dtype) -> float:
    """The rtol :func:`assert_close` uses for data of ``dtype``."""
    dtype = np.dtype(dtype)
    return RTOL.get(dtype.itemsize, 1e-9) if dtype.kind in "fc" else 0.0


def assert_close(actual, desired, *, precision=None, scale=None, err_msg: str = "") -> None:
    """Assert ``actual`` equals NumPy's ``desired`` up to floating-point rounding.

    Parameters
    ----------
    actual, desired : array_like
        Shapes must be equal (no broadcasting). NaNs must sit at the same places.
    precision : dtype, optional
        The least precise dtype the result was computed from, when it is lower
        than the result's own (``float32`` inputs of a ``float64`` result).
        Defaults to the less precise of the two arrays' dtypes.
    scale : float, optional
        The magnitude rounding errors are relative to, for results that cancel
        (``(x - x.mean(0)).mean(0)`` is ~1e-17 with entries ~1: pass
        ``max|x|``). The result's own scale, ``max|desired|``, when larger.
    err_msg : str
        Added to the failure message.

    Integer and boolean results are compared exactly. Floating results pass
    when ``|actual - desired| <= rtol * (|desired| + max|desired|)`` with
    ``rtol = tolerance(precision)``.
    """
    actual, desired = np.asarray(actual), np.asarray(desired)
    assert actual.shape == desired.shape, (
        f"shape {actual.shape} != expected {desired.shape}. {err_msg}")
    kinds = {actual.dtype.kind, desired.dtype.kind}
    if not kinds & set("fc"):
        np.testing.assert_array_equal(actual, desired, err_msg=err_msg)
        return
    if precision is None:
        floats = [d for d in (actual.dtype, desired.dtype) if d.kind in "fc"]
        precision = min(floats, key=lambda d: d.itemsize)
    rtol = tolerance(precision)
    finite = np.abs(desired[np.isfinite(desired)]) if desired.size else np.zeros(0)
    scale = max(float(finite.max()) if finite.size else 0.0, scale or 0.0)
    np.testing.assert_allclose(actual, desired, rtol=rtol, atol=rtol * scale,
                               equal_nan=True, err_msg=err_msg)
