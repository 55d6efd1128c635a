"""tilearray's Prometheus metrics on the scheduler's /metrics, scraped over
loopback while a job runs, and checked against the run's own figures."""

import threading
import time

import dask
import pytest
from helpers import make, scrape

import tilearray as ta
from tilearray.testing import assert_close

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def engine():
    """A fresh cluster: its scheduler's counters start at zero, and no task
    left over from another test's cancelled job can report into them."""
    with ta.Engine(n_workers=2, threads_per_worker=1, memory_per_worker="1GiB", quiet=True) as e:
        yield e


def test_metrics_move_during_a_run_and_match_the_run(tmp_path, rng, engine):
    a = rng.standard_normal((1000, 900))
    b = rng.standard_normal((1000, 900))
    A, B = make(tmp_path, "a", a, (100, 90)), make(tmp_path, "b", b, (100, 90), shard=(200, 180))
    before = scrape(engine)
    assert {"tilearray_bytes_read_total", "tilearray_units_written_total",
            "tilearray_task_retries_total", "tilearray_job_units_remaining"} <= set(before)
    seen_running = []
    box = {}
    with dask.config.set({"tilearray.map.block-bytes": "80kB"}):  # many small tasks
        t = threading.Thread(target=lambda: box.update(out=(A * B - 1).to_zarr(tmp_path / "c.zarr")))
        t.start()
        while t.is_alive():
            m = scrape(engine)
            if m["tilearray_job_running"] == 1 and m["tilearray_units_written_total"] > \
                    before["tilearray_units_written_total"]:
                seen_running.append(m)
            time.sleep(0.05)
        t.join()
    out = box["out"]
    st = out.stats
    after = scrape(engine)
    assert_close(out.compute(), a * b - 1)
    # the counters moved while the job was still running ...
    assert seen_running, "no scrape saw the job running with units written"
    mid = seen_running[0]
    assert 0 < mid["tilearray_job_units_done"] < mid["tilearray_job_units_total"] == 100
    assert mid["tilearray_job_units_remaining"] == 100 - mid["tilearray_job_units_done"]
    # ... and end equal to what the run measured
    delta = {k: after[k] - before.get(k, 0) for k in after if k.endswith("_total")}
    assert delta["tilearray_bytes_read_total"] == st.bytes_read == 2 * a.nbytes
    assert delta["tilearray_bytes_written_total"] == st.bytes_written == a.nbytes
    assert delta["tilearray_units_written_total"] == st.units_written == 100
    assert delta["tilearray_tasks_total"] == st.tasks
    assert delta["tilearray_jobs_total"] == 1 and delta["tilearray_jobs_failed_total"] == 0
    assert after["tilearray_job_units_remaining"] == 0 and after["tilearray_job_running"] == 0
    assert 0 < after["tilearray_task_memory_projected_bytes"] <= after["tilearray_task_memory_budget_bytes"]
    peaks = {k: v for k, v in after.items() if k.startswith("tilearray_worker_peak_memory_bytes")}
    assert peaks and all(0 < v <= 2**30 for v in peaks.values())
    held = engine.metrics()
    assert held["totals"]["units_written"] == scrape(engine)["tilearray_units_written_total"]
    assert held["task_retries"] == 0
    assert held["totals"]["jobs"] == before["tilearray_jobs_total"] + 2  # the job, then compute()


def test_failed_job_is_counted(tmp_path, rng, engine):
    a = make(tmp_path, "a", rng.standard_normal((200, 100)), (50, 50))
    before = scrape(engine)
    (tmp_path / "a" / "c" / "0" / "0").write_bytes(b"garbage")  # a corrupt chunk
    with pytest.raises(ta.CorruptChunkError):
        (a + 1).to_zarr(tmp_path / "out.zarr")
    after = scrape(engine)
    assert after["tilearray_jobs_failed_total"] == before["tilearray_jobs_failed_total"] + 1
    assert after["tilearray_job_running"] == 0


def test_grafana_dashboard_uses_exported_series(engine):
    import json
    import pathlib
    import re

    path = pathlib.Path(__file__).parents[2] / "deploy" / "grafana" / "tilearray.json"
    dash = json.loads(path.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"\btilearray_[a-z_]+", e)}
    import urllib.request

    with urllib.request.urlopen(engine.metrics_url, timeout=10) as r:
        text = r.read().decode()
    exported = set(re.findall(r"^# TYPE (\S+) ", text, re.M))
    assert used and used <= exported, used - exported


def test_tree_combines_are_not_counted_twice(tmp_path, rng, engine):
    """Reductions' combine/final tasks and a K-split's partial sums pass on their
    children's figures: /metrics must count each byte and task once."""
    x = rng.standard_normal((3000, 40))
    a = make(tmp_path, "a", x, (250, 40))
    cases = [
        ("sum", lambda: a.sum(), x.sum()),
        ("colmean", lambda: a.mean(axis=0), x.mean(axis=0)),
        ("rowvar", lambda: a.var(axis=1, ddof=1), x.var(axis=1, ddof=1)),
    ]
    for what, expr, want in cases:
        before = scrape(engine)
        e = expr()
        assert_close(e.compute(), want, err_msg=what)
        after = scrape(engine)
        st = e.stats
        assert after["tilearray_bytes_read_total"] - before["tilearray_bytes_read_total"] \
            == st.bytes_read == x.nbytes, what
        assert after["tilearray_tasks_total"] - before["tilearray_tasks_total"] == st.tasks, what
    # a.T @ a: a 40 x 40 output from 3000-long panels is split along K, and the
    # partial sums are tree-combined before the write
    with dask.config.set({"tilearray.map.block-bytes": "80kB"}):
        before = scrape(engine)
        g = (a.T @ a)
        plan = g.plan(tmp_path / "g.zarr", tile=(20, 20))
        assert "K split" in str(plan), plan
        out = g.to_zarr(tmp_path / "g.zarr", tile=(20, 20))
        after = scrape(engine)
    st = out.stats
    assert_close(out.compute(), x.T @ x)
    d = {k: after[k] - before[k] for k in after if k.endswith("_total")}
    assert d["tilearray_bytes_read_total"] == st.bytes_read
    assert d["tilearray_units_written_total"] == st.units_written == 4
    assert d["tilearray_bytes_written_total"] == st.bytes_written == 40 * 40 * 8
    assert after["tilearray_job_units_done"] == after["tilearray_job_units_total"] == 4
