import dask.array as da
import numpy as np
import pytest

import tilearray as ta


def test_dask_round_trip_and_asarray(engine, tmp_path, rng):
    x = rng.standard_normal((50, 30))
    a = ta.from_dask(da.from_array(x, chunks=(16, 10)), tmp_path / "d.zarr")
    assert a.grid.tile == (16, 10)
    np.testing.assert_array_equal(np.asarray(a), x)
    np.testing.assert_array_equal(a.to_dask().compute(), x)
    np.testing.assert_allclose(np.asarray(a * 2), 2 * x)
    with pytest.raises(ta.PlanningError, match="stored array"):
        (a * 2).to_dask()


def test_compute_refuses_large_results(tmp_path, rng):
    import dask

    a = ta.from_numpy(rng.standard_normal((40, 40)), tmp_path / "a.zarr", tile=(10, 10))
    with dask.config.set({"tilearray.compute.max-result-size": "1kiB"}):
        with pytest.raises(ta.PlanningError, match="to_zarr"):
            (a + 1).compute()


def test_config_from_environment(monkeypatch):
    import dask

    monkeypatch.setenv("DASK_TILEARRAY__REDUCTION__SPLIT_EVERY", "3")
    dask.config.refresh()
    try:
        from tilearray import _config

        assert _config.get("reduction.split-every") == 3
    finally:
        monkeypatch.delenv("DASK_TILEARRAY__REDUCTION__SPLIT_EVERY")
        dask.config.refresh()


def test_repr_html(tmp_path, rng):
    a = ta.from_numpy(rng.standard_normal((40, 40)), tmp_path / "a.zarr", tile=(10, 10),
                      shard=(20, 20))
    html = a._repr_html_()
    assert "<svg" in html and "(20, 20)" in html
    assert "shape=(40, 40)" in repr(a)
