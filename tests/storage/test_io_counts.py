import numpy as np
import pytest
from zarr.storage import LocalStore

import tilearray as ta
from tilearray.storage import ArrayRef, IOStats, grid_of, plan_reads, read_region
from tilearray.testing import CountingStore, FailingStore, counts, reset_counts


@pytest.mark.parametrize("shape,tile,shard,rows,cols", [
    ((100, 70), (16, 16), (32, 32), (0, 100), (0, 70)),
    ((100, 70), (16, 16), (32, 32), (40, 50), (10, 20)),
    ((100, 70), (16, 16), None, (5, 90), (3, 69)),
    ((64, 64), (8, 8), (32, 32), (0, 64), (32, 64)),
])
def test_one_store_request_per_unit(tmp_path, rng, shape, tile, shard, rows, cols):
    x = rng.standard_normal(shape)
    ta.from_numpy(x, tmp_path / "a.zarr", tile=tile, shard=shard)
    name = f"count-{tmp_path.name}"
    reset_counts(name)
    ref = ArrayRef(CountingStore(LocalStore(str(tmp_path / "a.zarr")), name))
    stats = IOStats()
    got = read_region(ref, rows, cols, stats)
    np.testing.assert_array_equal(got, x[rows[0]:rows[1], cols[0]:cols[1]])
    grid = grid_of(ref.open())
    planned = plan_reads(grid, rows, cols, 8)
    c = counts(name)
    assert c["gets"] == sum(r.store_gets for r in planned) == stats.store_gets
    assert stats.read_requests == len(planned)
    assert stats.bytes_read == sum(r.nbytes for r in planned)
    # every key fetched once (whole units, nothing read twice)
    per_key = [v for k, v in c.items() if k.startswith("gets:c/")]
    assert per_key
    assert set(per_key) == {1}  # ragged edge shards too: one GET each, not index + chunks


def test_transient_failures_are_retried(tmp_path, rng):
    x = rng.standard_normal((20, 20))
    ta.from_numpy(x, tmp_path / "a.zarr", tile=(10, 10))
    reset_counts("flaky")
    ref = ArrayRef(FailingStore(LocalStore(str(tmp_path / "a.zarr")), "flaky", "c/1/0", 2))
    stats = IOStats()
    np.testing.assert_array_equal(read_region(ref, (0, 20), (0, 20), stats), x)
    assert stats.read_retries == 2
    assert counts("flaky")["failures"] == 2


def test_permanent_failure_names_path(tmp_path, rng):
    ta.from_numpy(rng.standard_normal((20, 20)), tmp_path / "a.zarr", tile=(10, 10))
    ref = ArrayRef(FailingStore(LocalStore(str(tmp_path / "a.zarr")), "dead", "c/0/1", None))
    with pytest.raises(ta.StorageError, match="a.zarr"):
        read_region(ref, (0, 20), (0, 20))
