"""Shared test helpers (data generators)."""

import dask
import numpy as np

import tilearray as ta


def make(tmp_path, name, arr, tile, shard=None):
    return ta.from_numpy(arr, tmp_path / name, tile=tile, shard=shard)


def rand(rng, shape, dtype):
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    if dtype.kind == "b":
        return rng.random(shape) < 0.5
    return rng.integers(-50, 50, size=shape).astype(dtype)


def scrape(engine) -> dict:
    """Scrape the scheduler's ``/metrics`` over HTTP: ``{series: value}``
    for tilearray's series (labels kept in the series name)."""
    import urllib.request

    with urllib.request.urlopen(engine.metrics_url, timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("tilearray_"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def in_process_workers():
    """dask's settings for the clusters tests build with in-process workers
    (``processes=False``, ``SpecCluster`` of ``Worker``): such a worker
    measures the whole pytest process's RSS, several hundred MiB after many
    tests, against its own limit; at 80 % it pauses and a job waits forever.
    Build the cluster inside ``with in_process_workers():`` and use it after:
    the workers read the settings when they are built."""
    return dask.config.set({"distributed.worker.memory.pause": False,
                            "distributed.worker.memory.spill": False,
                            "distributed.worker.memory.target": False,
                            "distributed.worker.memory.terminate": False})
