"""Plan figures of a fixed corpus of expressions, pinned to a recorded fixture.

Every case plans one expression (``expr.plan(budget=...)``: pure, no store
reads, no cluster) over a module-wide set of small stored inputs (ragged
tiles, one sharded input, float64 / float32 / int32 / bool) and compares the
plan's totals and per-stage figures exactly to ``plan_corpus.json``. Only
numbers (and stage kinds) are recorded, never paths or descriptions, so the
figures depend on the array metadata and the budgets alone. A change in the
planner that moves any figure fails here; if the change is intended, look at
the diff of the JSON after re-recording:

    TILEARRAY_RECORD_CORPUS=1 pytest tests/engine/test_plan_corpus.py

rewrites ``tests/engine/plan_corpus.json`` from the current code (every case
passes while recording). Matmul stages also record the read mode and K split
parsed from their description (``mode``, ``k_split``).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
import zarr
from zarr.codecs import ZstdCodec

import tilearray as ta

FIXTURE = Path(__file__).with_name("plan_corpus.json")
RECORD = os.environ.get("TILEARRAY_RECORD_CORPUS", "") not in ("", "0")

MiB = 2**20
B64 = ta.Budget(64 * MiB, 2, 1, baseline=MiB, fraction=0.8)
B1G = ta.Budget(2**30, 4, 1, baseline=MiB, fraction=0.8)
B2T = ta.Budget(256 * MiB, 2, 2, baseline=MiB, fraction=0.8)
TINY = ta.Budget(6 * MiB, 2, 1, baseline=MiB, fraction=0.8)
# a task fits 1.6 of h's 8 MiB chunks: too little to decode one whole next to the result
SLAB = ta.Budget(int(1.6 * 4096 * 256 * 8), 1, 1, baseline=0, fraction=1.0)
BUDGETS = {"b64": B64, "b1g": B1G, "b2t": B2T, "tiny": TINY, "slab": SLAB}

# name: (shape, dtype, tile, shard)
INPUTS = {
    "a": ((500, 300), "f8", (96, 70), None),
    "b": ((300, 220), "f8", (64, 50), None),
    "c": ((500, 220), "f8", (100, 100), None),
    "s": ((600, 400), "f8", (64, 64), (128, 128)),
    "f": ((500, 300), "f4", (120, 90), None),
    "i": ((500, 300), "i4", (96, 70), None),
    "m": ((500, 300), "?", (50, 50), None),
    "x": ((1500, 40), "f8", (100, 40), None),
    "g": ((1500, 1100), "f8", (256, 256), None),
    "w": ((1100, 300), "f8", (1100, 64), None),  # tall tiles: g @ w reads panels in place
    # written by zarr with zstd (streamable in row slabs; from_numpy's blosc is not)
    "h": ((9000, 256), "f8", (4096, 256), "zstd"),
}


@pytest.fixture(scope="module")
def arrays(tmp_path_factory):
    root = tmp_path_factory.mktemp("plan-corpus")
    rng = np.random.default_rng(0)
    out = {}
    for name, (shape, dtype, tile, shard) in INPUTS.items():
        if shard == "zstd":  # repeating values: small files
            data = (np.arange(np.prod(shape)) % 17 - 8).astype(dtype).reshape(shape)
            z = zarr.create_array(str(root / f"{name}.zarr"), shape=shape, chunks=tile,
                                  dtype=dtype, compressors=ZstdCodec())
            z[...] = data
            out[name] = ta.open(root / f"{name}.zarr")
            continue
        if dtype == "?":
            data = rng.standard_normal(shape) > 0
        elif dtype == "i4":
            data = rng.integers(-1000, 1000, shape).astype(np.int32)
        else:
            data = rng.standard_normal(shape).astype(dtype)
        out[name] = ta.from_numpy(data, root / f"{name}.zarr", tile=tile, shard=shard)
    return root, out


# id -> (budget name, build(A) -> expression, plan() keywords; "path" is made per case)
def _c(budget, expr, **kw):
    return budget, expr, kw


CORPUS = {
    # elementwise maps
    "map/add": _c("b64", lambda A: A["a"] + A["a"] * 0.5),
    "map/scalar-mul": _c("b64", lambda A: 2 * A["a"]),
    "map/sqrt-abs": _c("b64", lambda A: np.sqrt(abs(A["a"]))),
    "map/astype-f4": _c("b64", lambda A: A["a"].astype(np.float32)),
    "map/int-bool-mixed": _c("b64", lambda A: A["i"] * A["m"] + A["f"]),
    "map/mixed-tilings": _c("b64", lambda A: A["a"] - A["f"]),
    "map/slice-steps": _c("b64", lambda A: A["a"][10:490:3, ::2] * 2),
    "map/transpose-add": _c("b64", lambda A: A["b"].T + A["a"][:220]),
    "map/sharded": _c("b2t", lambda A: A["s"] * A["s"] + 1),
    "map/big-tiny-budget": _c("tiny", lambda A: A["g"] + 1),
    # broadcast with reductions
    "bcast/centre": _c("b64", lambda A: A["a"] - A["a"].mean(axis=0)),
    "bcast/row-normalise": _c("b64", lambda A: A["a"] / A["a"].sum(axis=1, keepdims=True)),
    "bcast/standardise-sharded": _c(
        "b2t", lambda A: (A["s"] - A["s"].mean(axis=0)) / A["s"].std(axis=0)),
    # reductions
    "reduce/sum-0": _c("b64", lambda A: A["a"].sum(axis=0)),
    "reduce/mean-1": _c("b64", lambda A: A["a"].mean(axis=1)),
    "reduce/var-none": _c("b64", lambda A: A["a"].var()),
    "reduce/std-0-f4": _c("b64", lambda A: A["f"].std(axis=0)),
    "reduce/min-max": _c("b64", lambda A: A["i"].min(axis=1) + A["i"].max(axis=1)),
    "reduce/argmax-0": _c("b64", lambda A: A["a"].argmax(axis=0)),
    "reduce/any-bool": _c("b64", lambda A: A["m"].any(axis=0)),
    "reduce/fused-siblings": _c("b64", lambda A: (A["a"] * A["a"]).sum() + A["a"].sum()),
    "reduce/centred-std": _c("b64", lambda A: (A["a"] - A["a"].mean(0)).std(0)),
    "reduce/sum-sharded-1g": _c("b1g", lambda A: A["s"].sum(axis=1)),
    "reduce/sum-big-tiny": _c("tiny", lambda A: A["g"].sum(axis=0)),
    # norms
    "norm/fro": _c("b64", lambda A: ta.linalg.norm(A["a"])),
    "norm/axis0": _c("b64", lambda A: ta.linalg.norm(A["a"], axis=0)),
    "norm/ord1-axis1": _c("b64", lambda A: ta.linalg.norm(A["f"], ord=1, axis=1)),
    "norm/inf-matrix": _c("b64", lambda A: ta.linalg.norm(A["s"], ord=np.inf)),
    # matmul
    "matmul/a@b": _c("b64", lambda A: A["a"] @ A["b"]),
    "matmul/a@b-2threads": _c("b2t", lambda A: A["a"] @ A["b"]),
    "matmul/gram-aTa": _c("b64", lambda A: A["a"].T @ A["a"]),
    "matmul/outer-aaT": _c("b64", lambda A: A["a"] @ A["a"].T),
    "matmul/tall-skinny-xTx": _c("b1g", lambda A: A["x"].T @ A["x"]),
    "matmul/fused-operand": _c("b64", lambda A: (A["a"] + 1) @ A["b"]),
    "matmul/inside-add": _c("b64", lambda A: (A["a"] @ A["b"]) + A["c"]),
    "matmul/then-sum": _c("b64", lambda A: (A["a"] @ A["b"]).sum(0)),
    "matmul/sharded-gram": _c("b2t", lambda A: A["s"].T @ A["s"]),
    "matmul/f4-f8": _c("b64", lambda A: A["f"] @ A["b"]),
    "matmul/big-tiny": _c("tiny", lambda A: A["g"] @ A["g"].T),
    "matmul/big-gram-tiny": _c("tiny", lambda A: A["g"].T @ A["g"]),
    "matmul/in-place-tiny": _c("tiny", lambda A: A["g"] @ A["w"]),
    "matmul/in-place-2threads": _c("b2t", lambda A: A["g"] @ A["w"]),
    "matmul/slabs": _c("slab", lambda A: A["h"].T @ A["h"]),
    "matmul/slabs-roomy": _c("b64", lambda A: A["h"].T @ A["h"]),
    "matmul/covariance": _c("b64", lambda A: (A["a"] - A["a"].mean(0)).T @ (A["a"] - A["a"].mean(0))),
    # with an output
    "out/map-tile-shard": _c("b64", lambda A: A["a"] * 2, path="o.zarr", tile=(100, 60),
                             shard=(200, 120)),
    "out/matmul-tile": _c("b64", lambda A: A["a"] @ A["b"], path="o.zarr", tile=(128, 64)),
    "out/gram-path": _c("b2t", lambda A: A["s"].T @ A["s"], path="o.zarr"),
    "out/small-sum": _c("b64", lambda A: A["a"].sum(0), path="o.zarr"),
    "out/small-norm": _c("b64", lambda A: ta.linalg.norm(A["a"]), path="o.zarr"),
    "out/slabs": _c("slab", lambda A: A["h"].T @ A["h"], path="o.zarr"),
    "out/big-gram-tiny": _c("tiny", lambda A: A["g"].T @ A["g"], path="o.zarr"),
}

TOTALS = ("tasks", "peak_task_memory", "bytes_read", "bytes_written", "flops",
          "io_lower_bound", "reads", "store_gets")
STAGE = ("kind", "tasks", "peak_task_memory", "bytes_read", "bytes_written", "flops",
         "io_lower_bound", "reads", "store_gets")
# description phrase -> read mode, first match wins ("stream" also reads A in place)
MODES = (("next panel prefetched", "prefetch"), ("B streamed in bands", "stream"),
         ("panels read in place", "in-place"), ("decoded in row slabs", "slabs"))


def figures(plan) -> dict:
    """The plan's numbers only (no paths, no descriptions)."""
    stages = []
    for s in plan.stages:
        st = {k: getattr(s, k) for k in STAGE}
        if s.kind == "matmul":
            st["mode"] = next((m for phrase, m in MODES if phrase in s.description), None)
            k = re.search(r"K split in (\d+)", s.description)
            st["k_split"] = int(k.group(1)) if k else 1
        stages.append(st)
    return {"shape": list(plan.shape), "dtype": str(plan.dtype),
            "totals": {k: getattr(plan, k) for k in TOTALS}, "stages": stages}


def plan_case(case_id, arrays):
    root, A = arrays
    budget, build, kw = CORPUS[case_id]
    kw = dict(kw)
    if "path" in kw:
        kw["path"] = root / "out" / case_id.replace("/", "-") / kw["path"]
    return figures(build(A).plan(budget=BUDGETS[budget], **kw))


_recorded: dict = {}


@pytest.fixture(scope="module")
def expected():
    if RECORD:
        yield None
        # merge, so recording a subset (-k) keeps the other cases; drop cases
        # no longer in the corpus
        old = json.loads(FIXTURE.read_text()) if FIXTURE.exists() else {}
        merged = {k: v for k, v in {**old, **_recorded}.items() if k in CORPUS}
        FIXTURE.write_text(json.dumps(merged, indent=1, sort_keys=True) + "\n")
    else:
        yield json.loads(FIXTURE.read_text())


@pytest.mark.parametrize("case_id", list(CORPUS))
def test_plan_figures_unchanged(case_id, arrays, expected):
    got = plan_case(case_id, arrays)
    if RECORD:
        _recorded[case_id] = got
        return
    assert case_id in expected, f"{case_id} not recorded: re-record with TILEARRAY_RECORD_CORPUS=1"
    assert got == expected[case_id]


def test_corpus_and_fixture_agree():
    """Every recorded case is still in the corpus (a dropped case is noticed)."""
    if RECORD:
        pytest.skip("recording")
    assert sorted(json.loads(FIXTURE.read_text())) == sorted(CORPUS)


@pytest.mark.parametrize("case_id", list(CORPUS))
def test_plan_is_data_its_graph_runs_only_worker_code(case_id, arrays):
    """Every case's plan is a value: its stages hold every task of the graph
    (the task count is the graph's size, each key once), its named result's
    keys are tasks of the graph, and every task calls a function of
    ``tilearray.graphs`` or ``tilearray.storage`` -- a worker never needs the
    planner (``tilearray.engine``)."""
    root, A = arrays
    budget, build, kw = CORPUS[case_id]
    kw = dict(kw)
    if "path" in kw:
        kw["path"] = root / "out" / case_id.replace("/", "-") / kw["path"]
    plan = build(A).plan(budget=BUDGETS[budget], **kw)
    graph = plan.graph()
    keys = [t.key for s in plan.stages for t in s.work]
    assert len(keys) == len(set(keys)) == len(graph) == plan.tasks
    assert all(s.tasks == len(s.work) for s in plan.stages)
    assert set(plan.result.keys) <= set(graph)
    assert set(plan.stat_keys) <= set(graph)
    for key, task in graph.items():
        module = task[0].__module__
        assert module.startswith(("tilearray.graphs.", "tilearray.storage.")), (key, module)
