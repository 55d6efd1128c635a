"""Batch jobs under mpiexec: dask-mpi boot, results vs NumPy, exit status, clean
stderr, a worker rank SIGKILLed mid-matmul, a script without a __main__ guard.

Each job runs 4 ranks (scheduler, client, 2 workers) of tests/mpi/jobs.py with
the venv's mpiexec (MPICH hydra from the ``mpich`` wheel), either plainly or
through the launcher ``python -m tilearray.engine.mpi``.
"""

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import tilearray as ta
from tilearray.testing import assert_close

pytest.importorskip("mpi4py")
pytest.importorskip("dask_mpi")

HERE = os.path.dirname(os.path.abspath(__file__))
JOBS = os.path.join(HERE, "jobs.py")
MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")
needs_mpiexec = pytest.mark.skipif(not os.access(MPIEXEC, os.X_OK),
                                   reason=f"no mpiexec next to {sys.executable}")


def _run(cmd, cwd, timeout, env=None, on_start=None):
    """Run ``cmd`` in its own session; kill the whole job if it outlives ``timeout``."""
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        if on_start is not None:
            on_start(proc)
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        sys.stderr.write(f"--- job stdout\n{out}\n--- job stderr\n{err}\n")
        raise
    return proc.returncode, out, err, time.monotonic() - t0


def mpiexec(job, d, timeout=120, **kw):
    return _run([MPIEXEC, "-n", "4", sys.executable, JOBS, job, str(d)], d, timeout, **kw)


def launcher(job, d, timeout=120, **kw):
    cmd = [sys.executable, "-m", "tilearray.engine.mpi", "-n", "4", "--timeout", str(timeout),
           JOBS, job, str(d)]
    return _run(cmd, d, timeout + 30, **kw)


def _stored(path):
    return ta.open(path).to_dask().compute(scheduler="threads")


@pytest.fixture
def small(tmp_path):
    rng = np.random.default_rng(7)
    a, b = rng.standard_normal((600, 500)), rng.standard_normal((500, 400))
    ta.from_numpy(a, tmp_path / "a.zarr", tile=(128, 128))
    ta.from_numpy(b, tmp_path / "b.zarr", tile=(128, 128))
    return tmp_path, a, b


@pytest.mark.mpi
@needs_mpiexec
@pytest.mark.timeout(150)
def test_matmul_and_reductions_vs_numpy(small):
    d, a, b = small
    rc, out, err, _ = mpiexec("e2e", d)
    assert rc == 0, err
    assert "Traceback" not in err, err
    # progress in the job's log (a rank's stderr is a pipe): whole lines, no carriage returns
    assert "-> c.zarr: 100%" in err and "compute: 100%" in err and "\r" not in err, err
    info = json.loads((d / "engine.json").read_text())
    assert info["memory_per_worker"] == 2**30  # the planner budgets with what was asked
    assert info["worker_memory_limits"] == [2**30, 2**30]
    assert info["n_workers"] == 2 and info["threads_per_worker"] == 1
    assert info["is_default"]
    assert_close(_stored(d / "c.zarr"), a @ b)
    r = np.load(d / "reductions.npz")
    assert_close(r["sum0"], a.sum(axis=0))
    assert_close(r["std1"], a.std(axis=1))
    r = np.load(d / "linalg.npz")
    assert_close(np.abs(r["r"]), np.abs(np.linalg.qr(a, mode="r")))
    y = np.arange(a.shape[0], dtype=float)
    for got, want in zip([r[k] for k in ("x", "res", "rank", "s")], np.linalg.lstsq(a, y),
                         strict=True):
        assert_close(got, want)
    assert_close(_stored(d / "l.zarr"), np.linalg.cholesky(a.T @ a + a.shape[0] * np.eye(500)))


@pytest.mark.mpi
@needs_mpiexec
@pytest.mark.timeout(150)
@pytest.mark.parametrize("how, job, expected", [
    ("mpiexec", "fail", 1),
    ("launcher", "fail", 1),
    ("launcher", "exit3", 3),
])
def test_client_status_is_the_job_status(tmp_path, how, job, expected):
    rc, out, err, elapsed = (mpiexec if how == "mpiexec" else launcher)(job, tmp_path)
    assert rc == expected, err
    if job == "fail":
        assert "ValueError: boom from the client rank" in err
        assert err.count("Traceback") == 1, err  # the client's, nothing from shutdown
    else:
        assert "Traceback" not in err, err
    assert elapsed < 90  # the cluster shut down at once, no waiting for a timeout


@pytest.mark.mpi
@needs_mpiexec
@pytest.mark.timeout(150)
def test_script_without_main_guard(small):
    d, a, _ = small
    cmd = [MPIEXEC, "-n", "4", sys.executable, os.path.join(HERE, "unguarded_job.py"), str(d)]
    rc, out, err, elapsed = _run(cmd, d, 120)
    assert rc == 0, err
    assert "Traceback" not in err, err
    assert elapsed < 60  # the client did not wait 60 s for workers that never came
    assert_close(np.load(d / "sum.npy"), a.sum(axis=0))


def _rank_killer(tmp_path, done_dir, killed: dict):
    """``on_start`` hook: SIGKILL the first worker rank once 4 output units are
    done (its pid from the job's pids.json); records the kill in ``killed``."""
    def done():
        return len(os.listdir(done_dir)) if done_dir.is_dir() else 0

    def kill_a_rank(proc):
        deadline = time.monotonic() + 120
        pids = tmp_path / "pids.json"
        while time.monotonic() < deadline and proc.poll() is None:
            if pids.exists() and done() >= 4:
                victim = json.loads(pids.read_text())["ranks"][0]
                killed["done"] = done()
                os.kill(victim, signal.SIGKILL)
                killed["pid"] = victim
                return
            time.sleep(0.01)

    return kill_a_rank, done


def _baseline_for_many_tasks(a, b, tile, lo=20, hi=200):
    """worker-baseline (MiB) for which ``a @ b`` under the kill job's budget
    (600 MiB x 2 workers x 1 thread) has ``lo..hi`` tasks."""
    import dask

    from tilearray.engine.plan import Budget

    for mib in range(300, 520):
        with dask.config.set({"tilearray.memory.worker-baseline": f"{mib}MiB"}):
            try:
                tasks = (a @ b).plan(budget=Budget.from_config(600 * 2**20, 2, 1),
                                     tile=(tile, tile)).stages[0].tasks
            except ta.PlanningError:
                break
        if lo <= tasks <= hi:
            return f"{mib}MiB"
    pytest.fail("no worker-baseline gives a matmul of many small blocks")


@pytest.mark.mpi
@needs_mpiexec
@pytest.mark.timeout(200)
def test_worker_rank_sigkilled_mid_matmul(tmp_path):
    n, tile = 1536, 128
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((n, n)), rng.standard_normal((n, n))
    ta.from_numpy(a, tmp_path / "a.zarr", tile=(tile, tile))
    ta.from_numpy(b, tmp_path / "b.zarr", tile=(tile, tile))
    # a baseline leaving little room per task: many small blocks, so that the
    # kill lands mid-way (the job plans with the same budget, so the same blocks)
    baseline = _baseline_for_many_tasks(ta.open(tmp_path / "a.zarr"),
                                        ta.open(tmp_path / "b.zarr"), tile)
    env = {**os.environ, "DASK_TILEARRAY__MEMORY__WORKER_BASELINE": baseline}
    done_dir = tmp_path / "c.zarr" / "tilearray.done"
    total = (n // tile) ** 2
    killed = {}

    kill_a_rank, done = _rank_killer(tmp_path, done_dir, killed)

    rc, out, err, _ = launcher("kill", tmp_path, timeout=150, env=env, on_start=kill_a_rank)
    assert "pid" in killed, f"no rank was killed\n{err}"
    assert killed["done"] < total, "the kill must land mid-matmul"
    assert rc == 0, err
    assert "mpiexec ended with status" in err  # the rank's death was seen, and survived
    after = json.loads((tmp_path / "after.json").read_text())
    assert after["workers_left"] == 1
    assert_close(_stored(tmp_path / "c.zarr"), a @ b)


@pytest.mark.mpi
@needs_mpiexec
@pytest.mark.timeout(60)
def test_too_few_ranks(tmp_path):
    code = "import tilearray as ta\nif __name__ == '__main__':\n    ta.Engine.mpi()\n"
    rc, out, err, _ = _run([MPIEXEC, "-n", "2", sys.executable, "-c", code], tmp_path, 45)
    assert rc != 0
    assert "needs at least 3 MPI ranks" in err


def test_launcher_flavor():
    from tilearray.engine.mpi import find_mpiexec, mpi_flavor

    if not os.access(MPIEXEC, os.X_OK):
        pytest.skip("no mpiexec")
    assert find_mpiexec() == MPIEXEC
    assert mpi_flavor(MPIEXEC) == "hydra"


def test_engine_mpi_in_a_reimporting_child_is_refused(monkeypatch):
    # what a multiprocessing child re-importing an unguarded script would hit
    monkeypatch.setattr(multiprocessing, "parent_process", lambda: object())
    with pytest.raises(ta.ClusterError, match='__name__ == "__main__"'):
        ta.Engine.mpi()


@pytest.mark.timeout(60)
def test_launcher_timeout_ends_the_job_with_124(tmp_path):
    """``--timeout``: the job ended as SIGTERM ends it, exit status 124 (as
    coreutils' timeout; helper-49 found it documented nowhere). An mpiexec
    stand-in that never returns, so no rank starts."""
    fake = tmp_path / "mpiexec"
    fake.write_text('#!/bin/sh\n[ "$1" = --version ] && exit 0\nexec sleep 300\n')
    fake.chmod(0o755)
    cmd = [sys.executable, "-m", "tilearray.engine.mpi", "-n", "4", "--mpiexec", str(fake),
           "--timeout", "2", JOBS, "e2e", str(tmp_path)]
    rc, _, err, _ = _run(cmd, tmp_path, 50)  # raises if the launcher itself outlives 50 s
    assert rc == 124, err
    assert "still running after 2.0 s; ending it" in err


@pytest.mark.mpi
@needs_mpiexec
@pytest.mark.timeout(150)
def test_launcher_sigterm_ends_every_rank(small):
    """SIGTERM to the launcher (a batch system's cancel, ``timeout``) ends the
    job: mpiexec runs in a session of its own, and the launcher had died at
    once leaving it and every rank running (a helper's review saw the job
    finish with nothing attached). Exit status 143; no rank left."""
    import psutil

    d, _, _ = small
    seen = {}

    def terminate(proc):
        deadline = time.monotonic() + 90
        while not (d / "pids.json").exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                return
            time.sleep(0.02)
        seen.update(json.loads((d / "pids.json").read_text()))
        proc.send_signal(signal.SIGTERM)

    rc, out, err, _ = launcher("victim", d, timeout=100, on_start=terminate)
    assert seen, f"the job never started\n{err}"
    assert rc == 128 + signal.SIGTERM, err
    assert "SIGTERM: ending the job" in err
    ranks = [seen["client"], seen["scheduler"], *seen["workers"]]
    gone, alive = psutil.wait_procs([psutil.Process(p) for p in ranks if psutil.pid_exists(p)],
                                    timeout=10)
    assert not alive, f"ranks left running: {alive}"
    assert "client rank done" not in out


def _kill_then_go(d, target, killed):
    """on_start: once the victim job wrote its pids, SIGKILL ``target`` (a role,
    ``_sh`` for that rank's wrapper shell), then let the job compute."""
    import psutil

    def run(proc):
        pids = d / "pids.json"
        deadline = time.monotonic() + 90
        while not pids.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                return
            time.sleep(0.02)
        info = json.loads(pids.read_text())
        role, _, shell = target.partition("_")
        pid = info["workers"][0] if role == "worker" else info[role]
        if shell:
            pid = psutil.Process(pid).ppid()
            assert psutil.Process(pid).cmdline()[:2] == ["sh", "-c"], "not the rank's wrapper"
        os.kill(pid, signal.SIGKILL)
        killed["pid"] = pid
        time.sleep(0.3)
        (d / "go").write_text("")

    return run


@pytest.mark.mpi
@needs_mpiexec
@pytest.mark.timeout(150)
@pytest.mark.parametrize("target, finishes", [
    ("worker", True), ("worker_sh", True),
    ("scheduler_sh", True), ("client_sh", True),
    ("client", False), ("scheduler", False),
])
def test_launcher_status_when_a_process_is_killed(small, target, finishes):
    """Kill one process the launcher starts (a rank, or its wrapper shell): the
    status is 0 with the right result whenever rank 1 finished, non-zero when
    rank 1 or the scheduler was killed; never 0 for an unfinished client."""
    d, a, b = small
    killed = {}
    rc, out, err, elapsed = launcher("victim", d, timeout=100,
                                     on_start=_kill_then_go(d, target, killed))
    assert "pid" in killed, f"nothing was killed\n{err}"
    assert elapsed < 100, err  # no wait for a timeout of its own (100 s)
    if finishes:
        assert rc == 0, err
        assert "client rank done" in out
        assert_close(_stored(d / "c.zarr"), a @ b)
    else:
        assert rc != 0, err
        assert "client rank done" not in out
        if target == "client":  # seen by its pid, not after the 30 s without a client
            assert "the client rank died without shutting down the cluster" in err, err
        else:  # the client's error says what happened (it said "no workers")
            assert "lost the connection to the scheduler" in err, err
        if (d / "c.zarr").exists():
            with pytest.raises(ta.StorageError, match="incomplete"):
                ta.open(d / "c.zarr")


@pytest.mark.parametrize("py, wrapper, mpiexec_rc, wrapped, expected", [
    (0, 0, 0, True, 0),        # a normal run
    (3, 3, 0, True, 3),        # sys.exit(3)
    (0, 137, 9, True, 0),      # killed by hydra after it had reported: it finished
    (0, 3, 0, True, 3),        # `raise SystemExit(3)`: the process's status wins
    (None, 137, 0, True, 137),  # rank 1 SIGKILLed: its wrapper saw it
    (0, None, 9, True, 0),     # rank 1's wrapper killed, the rank finished
    (None, None, 0, True, 1),  # no report at all: never 0
    (None, None, 9, True, 9),
    (None, None, 0, False, 0),  # unknown MPI, no wrapper: mpiexec's status
])
def test_launcher_decides_rank_1s_status(py, wrapper, mpiexec_rc, wrapped, expected):
    from tilearray.engine.runtime.mpirun import decide

    code, why = decide(py, wrapper, mpiexec_rc, wrapped)
    assert code == expected
    if (mpiexec_rc != 0 and code == 0) or (py is None and wrapper is None and wrapped):
        assert why  # the launcher says why it does not report mpiexec's failure


def test_status_channel_roundtrip(tmp_path):
    from tilearray.engine.runtime import mpirun as m

    path = str(tmp_path / "client-status")
    assert not m.reported(path) and not m.client_alive(path, stale=60)
    m.start_heartbeat(path, period=0.05)
    assert m.client_alive(path, stale=60)  # this process, on this host
    m.write_status(path, 7)
    assert m.reported(path) and m._read_int(path) == 7
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]
    (tmp_path / "client-status.alive").write_text(f"{2**22 + 12345} {os.uname().nodename}\n")
    assert not m.client_alive(path, stale=60)  # no such pid


def test_launcher_refuses_bad_n_before_creating_anything(tmp_path, monkeypatch):
    from tilearray.engine.runtime import mpirun as m

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="n must be at least 1, got 0"):
        m.mpirun(0, ["job.py"], mpiexec="/bin/true")
    assert os.listdir(tmp_path) == []


def test_tilearray_mpirun_missing_script_is_one_usage_error(tmp_path, capsys, monkeypatch):
    """`tilearray mpirun -n 4 -- nope.py`: one usage line naming the script and the
    command the user typed, not every rank's python complaining."""
    from tilearray.cli import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(["mpirun", "-n", "4", "--", "nope.py"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "tilearray mpirun: error: no such script: 'nope.py'" in err, err
    assert os.listdir(tmp_path) == []


def test_openmpi_without_recovery_is_said_plainly(tmp_path):
    """An Open MPI whose mpiexec lacks --enable-recovery: the launcher says the
    job cannot survive a lost rank, and still reports rank 1's status."""
    fake = tmp_path / "mpiexec"
    fake.write_text(
        "#!/bin/sh\n"
        'for a in "$@"; do [ "$a" = --version ] && { echo "mpiexec (Open MPI) 4.0.0"; '
        '[ "$1" = --enable-recovery ] && exit 213; exit 0; }; done\n'
        '[ "$1" = --enable-recovery ] && exit 213\n'
        'while [ "$1" != -n ]; do shift; done; shift 2\n'
        'OMPI_COMM_WORLD_RANK=1 "$@"\n'  # one "rank 1", under the launcher's wrapper
        "exit 0\n")
    fake.chmod(0o755)
    cmd = [sys.executable, "-m", "tilearray.engine.mpi", "-n", "3", "--mpiexec", str(fake),
           "--timeout", "60", "--", sys.executable, "-c", "import sys; sys.exit(3)"]
    rc, out, err, _ = _run(cmd, tmp_path, 90)
    assert rc == 3, err  # rank 1's status, from its wrapper (the fake mpiexec said 0)
    assert "cannot survive the loss of a rank" in err
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".tilearray-mpi-")]


def test_worker_rank_heartbeat_to_a_closed_scheduler_is_one_line():
    """Seen under load at shutdown: a worker's heartbeat traceback after the
    scheduler rank closed; worker ranks log it as one line."""
    import io
    import logging

    from tilearray.engine.runtime.plugins import QuietClosedScheduler

    QuietClosedScheduler().setup(None)
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    logger = logging.getLogger("distributed.worker")
    logger.addHandler(handler)
    try:
        try:
            raise OSError("Stream is closed")
        except OSError:
            logger.error("Failed to communicate with scheduler during heartbeat.", exc_info=True)
        logger.error("something else")
    finally:
        logger.removeHandler(handler)
    text = out.getvalue()
    assert "Traceback" not in text and "the scheduler has closed" in text
    assert "something else" in text
