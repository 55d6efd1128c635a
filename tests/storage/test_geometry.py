import pytest

from tilearray.storage import Grid, plan_reads
from tilearray.storage.geometry import boundaries


def test_boundaries_ragged():
    assert boundaries(10, 4) == (0, 4, 8, 10)
    assert boundaries(8, 4) == (0, 4, 8)
    assert boundaries(0, 4) == (0,)
    with pytest.raises(ValueError):
        boundaries(5, 0)


def test_grid_counts_and_ranges():
    g = Grid.regular((100, 70), (16, 16), (32, 32))
    assert g.tile_grid == (7, 5)
    assert g.unit_grid == (4, 3)
    assert g.unit_range(0, 3) == (96, 100)
    assert g.unit_range(1, 2) == (64, 70)
    assert list(g.units_touching(0, (31, 33))) == [0, 1]
    assert list(g.tiles_touching(1, (0, 70))) == list(range(5))
    assert g.expand_to_units(0, (40, 50)) == (32, 64)
    assert g.is_aligned(0, (32, 100)) and not g.is_aligned(0, (32, 90))
    assert g.tiles_in_unit(3, 2) == 1  # 4 x 6 corner: one ragged tile
    assert g.transpose().shape == (70, 100)


def test_unit_must_be_multiple_of_tile():
    with pytest.raises(ValueError, match="multiple"):
        Grid.regular((10, 10), (4, 4), (6, 8))


def test_range_outside_raises():
    g = Grid.regular((10, 10), (4, 4))
    with pytest.raises(IndexError, match="axis 0"):
        g.units_touching(0, (5, 11))


def test_plan_reads_whole_units():
    g = Grid.regular((100, 70), (16, 16), (32, 32))
    (req,) = plan_reads(g, (40, 50), (10, 20), itemsize=8)
    assert req.rows == (32, 64) and req.cols == (0, 32)
    assert req.nbytes == 32 * 32 * 8
    assert req.store_gets == 1  # one whole, interior shard


def test_plan_reads_ragged_shard_and_bands():
    g = Grid.regular((100, 70), (16, 16), (32, 32))
    reqs = plan_reads(g, (0, 100), (0, 70), itemsize=8, max_bytes=32 * 70 * 8)
    assert [r.rows for r in reqs] == [(0, 32), (32, 64), (64, 96), (96, 100)]
    # the last shard column is ragged (64..70): Zarr would read its index plus
    # each chunk by range; io.WholeObjectReads makes that one GET per shard
    assert reqs[0].store_gets == 3
    assert sum(r.nbytes for r in reqs) == 100 * 70 * 8
