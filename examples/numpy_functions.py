"""Everyday NumPy functions on a tall matrix that is read from Zarr, never
loaded whole (issue 30): a correlation matrix, a boolean row filter stored to
Zarr, column picks, a cumulative sum, medians -- each checked against NumPy.

    python examples/numpy_functions.py [rows]      (default 400,000 x 64)
"""

import sys
import tempfile
from pathlib import Path

import numpy as np

import tilearray as ta

if __name__ == "__main__":
    rows = int(sys.argv[1]) if len(sys.argv) > 1 else 400_000
    d = Path(tempfile.mkdtemp())
    with ta.Engine(n_workers=2, memory_per_worker="512MiB"):
        X = ta.random((rows, 64), d / "X.zarr", tile=(16384, 64), seed=0)
        X = X + np.linspace(0, 1e3, 64)                      # columns with large means

        R = np.corrcoef(X, rowvar=False)                     # one pass over X
        print(R.plan())
        r = R.compute()
        kept = X[X[:, 0] > 1.0]                              # mask: one pass over column 0's units
        kept.to_zarr(d / "kept.zarr")                        # the gather: rows read once, stored
        picks = X[:, [0, 5, 9]].compute()                    # reads those columns' units only
        csum = np.cumsum(X[:, :4], axis=0).to_zarr(d / "csum.zarr")   # two passes (totals, scan)
        med = np.median(X, axis=0).compute()                 # exact: whole columns per task
        tr = float(np.trace(R))                              # reads R's diagonal units only

        x = np.asarray(ta.open(d / "X.zarr")) + np.linspace(0, 1e3, 64)   # the check, in memory
        np.testing.assert_allclose(r, np.corrcoef(x, rowvar=False), atol=1e-10)
        np.testing.assert_array_equal(np.asarray(ta.open(d / "kept.zarr")), x[x[:, 0] > 1.0])
        np.testing.assert_array_equal(picks, x[:, [0, 5, 9]])
        np.testing.assert_allclose(np.asarray(csum[...]), np.cumsum(x[:, :4], axis=0))
        np.testing.assert_allclose(med, np.median(x, axis=0))
        assert abs(tr - 64) < 1e-9
        print(f"all match NumPy: corrcoef {r.shape}, {len(kept)} rows kept, median, cumsum")
