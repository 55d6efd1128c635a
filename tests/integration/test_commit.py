"""The output commit protocol under concurrency: racing writers of one output,
writers of different members of one group, and readers during a write."""

import json
import os
import queue
import random
import secrets
import subprocess
import sys
import threading

import numpy as np
import pytest

import tilearray as ta
from tilearray.testing import assert_close

RACER = os.path.join(os.path.dirname(__file__), "racer.py")
N, TILE = 32, 8


class Racer:
    """One long-lived writer process (``racer.py``) and the events it prints."""

    def __init__(self, k, a_path):
        self.k = k
        self.proc = subprocess.Popen([sys.executable, RACER, str(k), a_path],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.events: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        assert self.next()["event"] == "ready"

    def _read(self):
        for line in self.proc.stdout:
            self.events.put(json.loads(line))
        self.events.put({"event": "exited", "rc": self.proc.wait()})

    def send(self, line):
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def next(self, timeout=120):
        return self.events.get(timeout=timeout)

    def close(self):
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@pytest.fixture(scope="module")
def racers(tmp_path_factory):
    d = tmp_path_factory.mktemp("race")
    x = np.arange(N * N, dtype="float64").reshape(N, N) / 7.0
    ta.from_numpy(x, d / "a.zarr", tile=(TILE, TILE))
    rs = [Racer(k, str(d / "a.zarr")) for k in (0, 1)]
    yield x, rs, d
    for r in rs:
        r.close()


def _seed():
    seed = int(os.environ.get("TILEARRAY_TEST_SEED", secrets.randbelow(2**31)))
    print(f"seed {seed} (rerun with TILEARRAY_TEST_SEED={seed})")
    return seed


def _reader_view(path):
    """What a reader opening the output now gets: 'incomplete', 'absent', or the values."""
    try:
        return _values(path)
    except ta.IncompleteOutputError:
        return "incomplete"
    except ta.StorageError:
        return "absent"


def _values(path):
    import zarr

    arr = ta.open(path)  # raises IncompleteOutputError for an unfinished output
    return zarr.open_array(str(path), mode="r")[...], arr


@pytest.mark.timeout(300)
def test_racing_writers_of_one_output_exactly_one_wins(racers):
    """Two jobs write the same output (new, or an existing one with overwrite=True)
    at random start offsets 0-200 ms; the winner's job is held at a random point
    of its commit (after the lock, after create, before marking complete) until
    the other has tried. Exactly one wins; the other gets OutputLockedError
    naming the path and the winner's pid; a reader meanwhile sees the old
    result or "incomplete", never partial data as complete; the output ends
    complete and equal to the winner's result, never a mix."""
    x, rs, d = racers
    seed = _seed()
    rng = random.Random(seed)
    trials = int(os.environ.get("TILEARRAY_RACE_TRIALS", 24))  # more for a stress run
    for trial in range(trials):
        out = str(d / f"out{trial}.zarr")
        existing = trial % 2 == 1
        if existing:
            ta.from_numpy(x * 10, out, tile=(TILE, TILE))
        point = rng.choice(["lock", "create", "commit"])
        for r in rs:
            r.send(json.dumps({"out": out, "overwrite": existing, "hold": point,
                               "delay": rng.uniform(0.0, 0.2)}))
        held, ends = [], {}
        while len(held) + len(ends) < 2:  # both have tried: one holds the lock (or both!)
            for r in rs:
                if r.k in ends or r in held:
                    continue
                try:
                    ev = r.events.get(timeout=0.01)
                except queue.Empty:
                    continue
                if ev["event"] == "held":
                    held.append(r)
                else:
                    ends[r.k] = ev
        ctx = (seed, trial, point, existing, held and held[0].k, ends)
        assert len(held) == 1, ctx
        # a reader during the write: the old complete result, or "incomplete"
        view = _reader_view(out)
        if point == "lock":
            assert (view == "absent") if not existing else np.array_equal(view[0], x * 10), ctx
        else:
            assert view == "incomplete", ctx
        winner = held[0]
        winner.send("go")
        ends[winner.k] = winner.next()
        loser = 1 - winner.k
        assert ends[winner.k] == {"event": "ok"}, ctx
        assert ends[loser].get("type") == "OutputLockedError", ctx
        msg = ends[loser]["message"]
        assert out in msg and f"pid {winner.proc.pid}" in msg and "started" in msg, ctx
        values, arr = _values(out)
        assert_close(values, x * (winner.k + 2), err_msg=str(ctx))
        assert arr.shape == (N, N)
        assert not os.path.exists(out + ".tilearray.lock"), ctx


@pytest.mark.timeout(300)
def test_racing_writers_of_group_members_lose_none(racers):
    """Two jobs write different members of one group at random offsets, several
    rounds per group; the group's consolidated listing (what xarray reads) ends
    with every member."""
    import xarray as xr
    import zarr

    x, rs, d = racers
    seed = _seed()
    rng = random.Random(seed)
    for trial in range(8):
        g = str(d / f"g{trial}.zarr")
        zarr.open_group(g, mode="w", zarr_format=3)
        names = []
        for rnd in range(3):
            for r in rs:
                name = f"m{r.k}_{rnd}"
                names.append(name)
                r.send(json.dumps({"out": g, "name": name, "delay": rng.uniform(0.0, 0.05)}))
            for r in rs:
                assert r.next() == {"event": "ok"}, (seed, trial)
        meta = zarr.open_group(g, mode="r", use_consolidated=True).metadata
        listed = set(meta.consolidated_metadata.metadata)
        assert listed >= set(names), (seed, trial, sorted(listed))
        ds = xr.open_zarr(g)
        assert set(ds.data_vars) == set(names), (seed, trial)
        assert_close(ds["m1_2"].values, x * 3)


def _live_lock(path):
    """A lock held by a live process of this host (the test's parent process)."""
    import socket

    import psutil

    parent = os.getppid()
    with open(path, "w") as f:
        json.dump({"host": socket.gethostname(), "pid": parent,
                   "started": psutil.Process(parent).create_time(), "token": "other"}, f)
    return parent


@pytest.mark.timeout(120)
def test_locked_output_refused_before_anything_is_created(engine, tmp_path):
    x = np.arange(64.0).reshape(8, 8)
    a = ta.from_numpy(x, tmp_path / "a.zarr", tile=(4, 4))
    for expr, out in ((a * 2, tmp_path / "c.zarr"), (a.sum(axis=0), tmp_path / "s.zarr")):
        pid = _live_lock(str(out) + ".tilearray.lock")
        with pytest.raises(ta.OutputLockedError, match=f"pid {pid} on host") as e:
            expr.to_zarr(out)
        assert str(out) in str(e.value) and "started" in str(e.value)
        assert not out.exists()  # nothing created
        with open(str(out) + ".tilearray.lock") as f:
            assert json.load(f)["token"] == "other"  # and the other job's lock kept
        os.unlink(str(out) + ".tilearray.lock")
        expr.to_zarr(out)  # free again


@pytest.mark.timeout(120)
def test_locked_existing_output_says_locked_not_already_exists(engine, tmp_path):
    """While another job writes it, an existing output is reported as locked
    (not "already exists"), whether or not overwrite= was passed, and left alone."""
    x = np.arange(64.0).reshape(8, 8)
    a = ta.from_numpy(x, tmp_path / "a.zarr", tile=(4, 4))
    out = tmp_path / "c.zarr"
    (a * 2).to_zarr(out)
    _live_lock(str(out) + ".tilearray.lock")
    for kw in ({}, {"overwrite": True}, {"resume": True}):
        with pytest.raises(ta.OutputLockedError):
            (a * 3).to_zarr(out, **kw)
    os.unlink(str(out) + ".tilearray.lock")
    assert_close(ta.open(out).compute(), 2 * x)


@pytest.mark.timeout(120)
def test_refused_job_creates_nothing(engine, tmp_path):
    x = np.arange(64.0).reshape(8, 8)
    a = ta.from_numpy(x, tmp_path / "a.zarr", tile=(4, 4))
    out = tmp_path / "new" / "c.zarr"
    with pytest.raises((ta.StorageError, ta.PlanningError)):
        (a * 2).to_zarr(out, tile=(4, 4), shard=(6, 6))  # not a multiple of the tile
    assert not (tmp_path / "new").exists()


def _dead_lock(path):
    """The lock a SIGKILLed job of this host leaves: its process is gone."""
    import socket

    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    with open(path, "w") as f:
        json.dump({"host": socket.gethostname(), "pid": p.pid, "started": 1.0,
                   "token": "dead"}, f)
    return p.pid


@pytest.mark.timeout(120)
@pytest.mark.parametrize("left", ["empty dir", "chunk dirs", "member"])
def test_killed_create_is_an_unfinished_output_resumed_or_replaced(engine, tmp_path, left):
    """A job killed inside Zarr's create leaves a directory without zarr.json
    next to its (now stale) lock. Readers get IncompleteOutputError naming the
    dead job; a plain rerun is refused with the same error unless the directory
    is empty, resume=True or overwrite=True replace it; a non-array directory
    with no lock beside it stays refused."""
    x = np.arange(120.0).reshape(12, 10)
    a = ta.from_numpy(x, tmp_path / "a.zarr", tile=(5, 4))
    if left == "member":
        ta.from_numpy(x, tmp_path / "g.zarr", name="other", tile=(5, 4))
        path, name, target = tmp_path / "g.zarr", "c", tmp_path / "g.zarr" / "c"
    else:
        path, name, target = tmp_path / "c.zarr", "", tmp_path / "c.zarr"
    target.mkdir()
    if left != "empty dir":
        (target / "c" / "0").mkdir(parents=True)
    pid = _dead_lock(str(target) + ".tilearray.lock")
    with pytest.raises(ta.IncompleteOutputError, match=f"pid {pid} .*was killed"):
        ta.open(path, name)
    if left == "empty dir":  # holds nothing: a plain rerun simply writes it
        assert_close((a * 2).to_zarr(path, name=name).compute(), x * 2)
        return
    with pytest.raises(ta.IncompleteOutputError, match="resume=True or overwrite=True"):
        (a * 2).to_zarr(path, name=name)
    for kw in ({"resume": True}, {"overwrite": True}):
        out = (a * 2).to_zarr(path, name=name, **kw)
        assert_close(out.compute(), x * 2)
        assert_close(ta.open(path, name).compute(), x * 2)
    if left == "member":
        assert_close(ta.open(path, "other").compute(), x)  # the group's other member kept
    # the same directory with no lock beside it is somebody's data: never replaced
    plain = tmp_path / "plain.zarr"
    (plain / "c" / "0").mkdir(parents=True)
    with pytest.raises(ta.StorageError, match="not a Zarr array") as e:
        (a * 2).to_zarr(plain, overwrite=True)
    assert not isinstance(e.value, ta.IncompleteOutputError)
    assert (plain / "c" / "0").is_dir()
