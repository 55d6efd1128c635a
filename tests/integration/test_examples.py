"""The user script of the README's NumPy section runs as a user runs it."""

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.timeout(300)
def test_numpy_functions_script_matches_numpy(tmp_path):
    """`examples/numpy_functions.py` (correlation matrix, boolean row filter
    stored to Zarr, column picks, cumulative sum, medians, trace) on 30,000
    rows with its own 2 x 512 MiB engine: it checks every result against
    NumPy itself and says so on its last line."""
    done = subprocess.run([sys.executable, str(EXAMPLES / "numpy_functions.py"), "30000"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "all match NumPy" in done.stdout.splitlines()[-1], done.stdout[-2000:]
