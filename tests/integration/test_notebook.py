"""Executes notebooks/analytics.ipynb at a small size; every cell must pass.
And a small matmul in a Jupyter kernel: its progress shows as tqdm's notebook
widget, which moves inside running tasks and ends at its total (issue 32)."""

import json
import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NB = Path(__file__).resolve().parents[2] / "notebooks" / "analytics.ipynb"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


@pytest.mark.timeout(600)
def test_analytics_notebook_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEARRAY_NB_ROWS", "200000")
    monkeypatch.setenv("TILEARRAY_NB_DIR", str(tmp_path))
    nb = nbformat.read(NB, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    out = tmp_path / "analytics.executed.ipynb"
    nbformat.write(nb, out)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    pngs = [o for o in outputs if "image/png" in o.get("data", {})]
    assert pngs, "the plots must render"
    html = [o for o in outputs if "text/html" in o.get("data", {})]
    assert html, "TiledArray / Plan rich reprs must show"
    assert os.path.getsize(out) > 10_000


# a small matmul (the shapes of tests/engine/test_long_jobs.py): K split in 2, two
# matmul tasks of 8 K panels each, which report progress from inside as they go
SETUP = """\
import json
import numpy as np
import tilearray as ta
from tilearray.graphs import matmul as gmm

engine = ta.Engine(n_workers=1, threads_per_worker=2, memory_per_worker="2GiB",
                   processes=False)
rng = np.random.default_rng(0)
x, y = rng.standard_normal((128, 8192)), rng.standard_normal((8192, 96))
a = ta.from_numpy(x, "a.zarr", tile=(128, 512))
b = ta.from_numpy(y, "b.zarr", tile=(512, 96))
expr = a @ b
kernels = (gmm.matmul_block, gmm.matmul_store, gmm.matmul_store_pair)
plan = expr.plan("c.zarr")
matmul_tasks = sum(t.fn in kernels for s in plan.stages for t in s.work)
"""
# The workers run in the kernel (processes=False), so the kernel can wrap their
# progress hook: the first task half done waits (30 s at most) until the bar shows
# part of a task -- which only progress from inside a task can make it show.
HOLD = """\
import threading
import time
from tqdm.notebook import tqdm as notebook_bar
from tilearray.graphs import progress

send = progress.set_hook(None)  # the engine's hook (TaskProgress): sends the events
assert send is not None
holding, shown = threading.Lock(), threading.Event()

def shows_part_of_a_task():
    return any(bar.container.children[1].value % 1
               for bar in list(notebook_bar._instances) if hasattr(bar, "container"))

def send_and_hold(done, total):
    send(done, total)
    if total > done >= total / 2 and holding.acquire(blocking=False):
        for _ in range(300):
            if shows_part_of_a_task():
                shown.set()
                break
            time.sleep(0.1)

progress.set_hook(send_and_hold)
"""
RUN = 'c = expr.to_zarr("c.zarr")'
REPORT = """\
progress.set_hook(send)
print(json.dumps({"matmul_tasks": matmul_tasks, "progress_events": c.stats.progress_events,
                  "held": holding.locked(), "shown": shown.is_set(),
                  "correct": bool(np.allclose(c.compute(), x @ y))}))
engine.close()
"""


class _WatchingClient(NotebookClient):
    """Executes a notebook and keeps, in order, every ``value`` the kernel
    sent to each widget (``values[comm_id]``)."""

    def __init__(self, nb, **kw):
        super().__init__(nb, **kw)
        self.values: dict = {}

    def handle_comm_msg(self, outs, msg, cell_index):
        state = msg["content"]["data"].get("state", {})
        if "value" in state:
            self.values.setdefault(msg["content"]["comm_id"], []).append(state["value"])
        super().handle_comm_msg(outs, msg, cell_index)


@pytest.mark.timeout(120)
def test_notebook_progress_is_a_widget_that_moves_inside_tasks(tmp_path, monkeypatch):
    """The run's bar in a Jupyter kernel is tqdm's notebook widget (not the
    text bar on stderr); it showed part of a task done (progress from inside
    a running task), only moved forward and ended at its total with the
    success style; the run counted at least two in-task progress events per
    matmul task. Counts, not times."""
    # tqdm shows every advance (no 0.1 s or dynamic step throttle): the held
    # task's fraction is on the widget as soon as the bar counts it
    monkeypatch.setenv("TQDM_MININTERVAL", "0")
    monkeypatch.setenv("TQDM_MINITERS", "0")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in (SETUP, HOLD, RUN, REPORT)]
    client = _WatchingClient(nb, timeout=90, kernel_name="python3",
                             resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    outputs = [c.get("outputs", []) for c in nb.cells]
    errors = [o for out in outputs for o in out if o.get("output_type") == "error"]
    assert not errors, errors

    run = outputs[2]
    text_bars = [o for o in run if o.get("output_type") == "stream" and "task" in o["text"]]
    assert not text_bars, f"the text bar was shown, not the widget: {text_bars}"
    views = [o["data"][WIDGET_VIEW]["model_id"] for o in run if WIDGET_VIEW in o.get("data", {})]
    assert len(views) == 1, run  # the bar: an HBox of label, progress bar, label
    models = nb.metadata["widgets"][WIDGET_STATE]["state"]
    children = [ref.removeprefix("IPY_MODEL_") for ref in models[views[0]]["state"]["children"]]
    bars = [c for c in children if models[c]["model_name"] == "FloatProgressModel"]
    assert len(bars) == 1, [models[c]["model_name"] for c in children]
    bar = models[bars[0]]["state"]
    assert bar["bar_style"] == "success" and bar["max"] > 0
    assert bar["value"] == bar["max"], bar  # completed: every task of the graph counted
    values = client.values[bars[0]]
    assert values == sorted(values) and values[-1] == bar["max"], values
    assert [v for v in values if v % 1], f"never part of a task on the widget: {values}"

    report = json.loads("".join(o["text"] for o in outputs[3] if o.get("output_type") == "stream"))
    assert report["correct"] and report["matmul_tasks"] > 0
    assert report["held"] and report["shown"], report
    assert report["progress_events"] >= 2 * report["matmul_tasks"], report
