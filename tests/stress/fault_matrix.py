"""Fault injection: many runs per fault kind, each at a random kill point.

    python tests/stress/fault_matrix.py [--runs 100] [--seed S] [--kinds a,b] [--dir D]

(``make stress`` runs it with more runs and a bigger job.) Every run checks:
the result equals NumPy's, or the job failed with a clear tilearray error;
no output is marked complete (or listed in its group's consolidated
metadata) unless its data is the right result; no input was modified. It
prints one Markdown table, ``fault | runs | survived | clear error | lost
data``, and the seed, so any run can be replayed.

- survived: the job finished right, or after the fault a rerun with
  ``resume=True`` finished right;
- clear error: the job stopped with a ``TilearrayError`` naming the problem
  and left nothing wrong behind (a racing second writer refused, a full
  disk);
- lost data: a complete-looking output with wrong data, a modified input,
  or any other failure.

Driver kills run the job in a child process (forkserver, tilearray
preloaded, in-process workers) that the harness SIGKILLs: at a random time
during compute, or when the child reaches the output's commit (marking it
complete) or its group's metadata refresh, which the child instruments to
tell the harness and linger a random few ms.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import hashlib
import multiprocessing as mp
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

import numpy as np

#: Each task's budget: small, so a job has many blocks to be cut between.
TASK_BYTES = 1 << 20

KINDS = ("driver-compute", "driver-commit", "driver-refresh", "worker", "race", "disk-full",
         "transient-read")


@dataclass
class Tally:
    runs: int = 0
    survived: int = 0
    clear_error: int = 0
    lost: int = 0
    notes: list = field(default_factory=list)
    extra: list = field(default_factory=list)
    """seconds a job took beyond an undisturbed run's, one per kill that
    struck while the job ran (worker kills)"""
    clean: float = 0.0
    """an undisturbed run's length, the median of a few (worker kills)"""
    tasks: int = 0
    """the job's planned tasks (worker kills)"""

    def add(self, outcome: str, note: str = "") -> None:
        self.runs += 1
        name = {"survived": "survived", "clear": "clear_error", "lost": "lost"}[outcome]
        setattr(self, name, getattr(self, name) + 1)
        if outcome == "lost":
            self.notes.append(note)


@dataclass
class Setup:
    dir: str
    a: str
    b: str
    b2: str
    want: np.ndarray
    """a @ b"""
    want2: np.ndarray
    """a @ b2"""
    tile: int
    digests: dict


def small_tasks(memory_per_worker: int, threads: int) -> dict:
    """dask config for tasks of about :data:`TASK_BYTES` on such workers."""
    return {"tilearray.memory.worker-baseline":
            int(memory_per_worker * 0.8) - TASK_BYTES * threads}


def _digest(path: str) -> str:
    h = hashlib.sha256()
    for root, _, files in sorted(os.walk(path)):
        for f in sorted(files):
            p = os.path.join(root, f)
            h.update(p.encode())
            with open(p, "rb") as fh:
                h.update(fh.read())
    return h.hexdigest()


def make_inputs(d: str, n: int, tile: int) -> Setup:
    import tilearray as ta

    rng = np.random.default_rng(0)
    x, y, z = (rng.standard_normal((n, n)) for _ in range(3))
    paths = []
    for name, arr in (("a", x), ("b", y), ("b2", z)):
        p = os.path.join(d, f"{name}.zarr")
        ta.from_numpy(arr, p, tile=(tile, tile))
        paths.append(p)
    digests = {p: _digest(p) for p in paths}
    return Setup(d, *paths, x @ y, x @ z, tile, digests)


def inputs_intact(s: Setup) -> bool:
    return all(_digest(p) == h for p, h in s.digests.items())


# -- the child job (runs in a forkserver process) -----------------------------------


def _child(a: str, b: str, out: str, name: str, started: str, hook: str, linger: float,
           fsize: int | None = None) -> None:
    import dask

    import tilearray as ta
    from tilearray.engine import output as toutput
    from tilearray.storage import array as sarray

    dask.config.set(small_tasks(2**30, 2))
    # a writer still running after 30 s (a run takes well under 1 s) leaves
    # its threads' stacks for the report
    stack = open(started + ".stack", "w")  # noqa: SIM115 - open until the process ends
    faulthandler.dump_traceback_later(30, file=stack)

    if fsize is not None:  # a small disk: writes past it fail with EFBIG
        import resource

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    def instrument(owner, attr):
        orig = getattr(owner, attr)

        def slow(*args, **kw):
            open(started + "." + hook, "w").close()
            time.sleep(linger)
            return orig(*args, **kw)

        setattr(owner, attr, slow)

    if hook == "commit":
        instrument(toutput, "mark_complete")
    elif hook == "refresh":
        instrument(sarray, "refresh_consolidated")
    with ta.Engine(n_workers=1, threads_per_worker=2, memory_per_worker=2**30,
                   processes=False, quiet=True):
        x, y = ta.open(a), ta.open(b)
        open(started, "w").close()
        try:
            (x @ y).to_zarr(out, name=name)
        except ta.TilearrayError as e:
            with open(started + ".error", "w") as fh:
                fh.write(f"{type(e).__name__}: {e}")
            raise SystemExit(3) from None


def _ctx():
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["tilearray", "numpy", "zarr", "distributed"])
    return ctx


def _wait_for(path: str, proc, timeout: float = 60) -> bool:
    deadline = time.time() + timeout
    while not os.path.exists(path):
        if not proc.is_alive() or time.time() > deadline:
            return False
        time.sleep(0.002)
    return True


# -- checks --------------------------------------------------------------------------


def judge(s: Setup, out: str, name: str, want: np.ndarray, engine, resume: bool = True,
          other: np.ndarray | None = None) -> tuple[str, str]:
    """Outcome of a run that may have been cut short: read the output as a
    user would; finish it (resume, or a first run when the fault struck
    before it existed) unless ``resume`` is False; compare with NumPy."""
    import tilearray as ta
    from tilearray.testing import assert_close

    if not inputs_intact(s):
        return "lost", "an input was modified"
    exists = os.path.exists(os.path.join(out, name) if name else out)
    try:
        got = ta.open(out, name) if name else ta.open(out)
    except ta.IncompleteOutputError:
        if _listed_complete(out, name):
            return "lost", "an incomplete member is listed in the consolidated metadata"
        if not resume:
            return "lost", "no writer finished the output"
        got = (ta.open(s.a) @ ta.open(s.b)).to_zarr(out, name=name, resume=True, engine=engine)
    except ta.TilearrayError as e:
        if exists:
            return "lost", f"an unreadable output: {type(e).__name__}: {e}"
        if not resume:
            return "lost", "no writer finished the output"
        got = (ta.open(s.a) @ ta.open(s.b)).to_zarr(out, name=name, engine=engine)
    value = got.compute(engine=engine)
    for candidate in [want] + ([other] if other is not None else []):
        try:
            assert_close(value, candidate)
            return "survived", ""
        except AssertionError:
            pass
    return "lost", "a complete output with wrong data"


def _listed_complete(group: str, name: str) -> bool:
    """Is ``name`` listed in the group's consolidated metadata?"""
    import json

    if not name:
        return False
    meta = os.path.join(group, "zarr.json")
    try:
        with open(meta) as fh:
            doc = json.load(fh)
    except (OSError, ValueError):
        return False
    cm = doc.get("consolidated_metadata") or {}
    return name in (cm.get("metadata") or {})


# -- the fault kinds -----------------------------------------------------------------


def driver_kill(s: Setup, engine, rnd: random.Random, tally: Tally, hook: str, i: int,
                span: float) -> None:
    ctx = _ctx()
    out = os.path.join(s.dir, f"drv-{hook}-{i}.zarr")
    name = "c" if hook == "refresh" else ""
    started = os.path.join(s.dir, f"started-{hook}-{i}")
    linger = rnd.uniform(0.0, 0.05)
    p = ctx.Process(target=_child, args=(s.a, s.b, out, name, started, hook, linger))
    p.start()
    if _wait_for(started, p):
        if hook == "compute":
            time.sleep(rnd.uniform(0, span))
        elif _wait_for(started + "." + hook, p):
            time.sleep(rnd.uniform(0, linger * 1.5))
    with contextlib.suppress(ProcessLookupError):
        os.kill(p.pid, signal.SIGKILL)
    p.join(30)
    tally.add(*judge(s, out, name, s.want, engine))


def worker_kill(s: Setup, proc_engine, rnd: random.Random, tally: Tally, i: int,
                span: float) -> None:
    import tilearray as ta

    out = os.path.join(s.dir, f"wk-{i}.zarr")
    pids = list(proc_engine.client.run(os.getpid).values())
    victim = rnd.choice(pids)

    def kill():
        time.sleep(rnd.uniform(0, span))
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGKILL)
            box["killed"] = time.time()

    t = threading.Thread(target=kill)
    box = {}

    def job():
        try:
            (ta.open(s.a) @ ta.open(s.b)).to_zarr(out, engine=proc_engine)
        except ta.TilearrayError as e:
            box["error"] = e  # judged below: resumed or a clear error
        box["end"] = time.time()

    j = threading.Thread(target=job, daemon=True)
    start = time.time()
    t.start()
    j.start()
    j.join(90)
    t.join()
    killed_at, job_end, failed = box.get("killed"), box.get("end"), "error" in box
    if j.is_alive():
        print("HUNG", proc_engine.client.run_on_scheduler(_scheduler_states), _nannies(proc_engine),
              file=sys.stderr)
        tally.add("lost", "a job hung after a worker was killed")
        raise _Hung
    # the killed worker replaced (its nanny restarts it) before judging; a
    # job submitted while the scheduler still lists a dead worker was seen
    # to hang in distributed (see the README's reliability section)
    deadline = time.time() + 60
    while time.time() < deadline:
        now = proc_engine.client.run(os.getpid, on_error="ignore").values()
        if victim not in now and len(now) == len(pids):
            break
        time.sleep(0.2)
    done = threading.Event()

    def watchdog():
        if not done.wait(60):
            print("HUNG", proc_engine.client.run_on_scheduler(_scheduler_states),
                  _nannies(proc_engine), file=sys.stderr, flush=True)

    threading.Thread(target=watchdog, daemon=True).start()
    box = {}
    j = threading.Thread(target=lambda: box.setdefault(
        "outcome", judge(s, out, "", s.want, proc_engine)), daemon=True)
    j.start()
    j.join(120)
    done.set()
    if "outcome" not in box:
        tally.add("lost", "a job hung after a worker was killed (no workers left)")
        raise _Hung
    tally.add(*box["outcome"])
    if killed_at is not None and not failed and killed_at < job_end:
        # the kill struck mid-job and the job finished by itself: its cost
        tally.extra.append(job_end - start - tally.clean)


def clean_runs(s: Setup, engine, n: int = 3) -> float:
    """The median length of ``n`` undisturbed runs of the job on ``engine``."""
    import tilearray as ta

    times = []
    for i in range(n):
        t = time.time()
        (ta.open(s.a) @ ta.open(s.b)).to_zarr(os.path.join(s.dir, f"clean-{i}.zarr"),
                                              engine=engine)
        times.append(time.time() - t)
    return float(np.median(times))


def _nannies(engine) -> dict:
    """Each nanny's status and worker pid (the harness kills worker pids only)."""
    return {name: (getattr(n.status, "name", n.status), getattr(n, "pid", None))
            for name, n in getattr(engine.cluster, "workers", {}).items()}


class _Hung(Exception):
    """The cluster is unusable: stop this fault kind, report what was seen."""


def _scheduler_states(dask_scheduler):
    from collections import Counter

    return (Counter(ts.state for ts in dask_scheduler.tasks.values()),
            {w.address: (w.status.name, len(w.processing), len(w.has_what))
             for w in dask_scheduler.workers.values()},
            [(str(ts.key)[:50], ts.state, ts.processing_on and ts.processing_on.address,
              [w.address for w in (ts.who_has or ())])
             for ts in dask_scheduler.tasks.values() if ts.state != "memory"][:8])


def race(s: Setup, engine, rnd: random.Random, tally: Tally, i: int) -> None:
    """Two writers of one new output (different results) at offsets 0-200 ms:
    the output ends complete with exactly one of them, the other refused."""
    ctx = _ctx()
    out = os.path.join(s.dir, f"race-{i}.zarr")
    procs = []
    for j, b in enumerate((s.b, s.b2)):
        started = os.path.join(s.dir, f"race-{i}-{j}")
        procs.append((ctx.Process(target=_child, args=(s.a, b, out, "", started, "", 0.0)),
                      started))
    first, second = (procs if rnd.random() < 0.5 else procs[::-1])
    first[0].start()
    time.sleep(rnd.uniform(0, 0.2))
    second[0].start()
    for p, _ in procs:
        p.join(120)
    hung = [j for j, (p, _) in enumerate(procs) if p.is_alive()]
    for p, _ in procs:
        if p.is_alive():
            p.kill()
            p.join()
    codes = [p.exitcode for p, _ in procs]
    outcome, note = judge(s, out, "", s.want, engine, resume=False, other=s.want2)
    if outcome == "lost":  # say what each writer did
        note += f"; exit codes {codes}" + (f", writers {hung} still running after 120 s"
                                           if hung else "")
        for j, (_, started) in enumerate(procs):
            for what in ("error", "stack"):
                if os.path.exists(f"{started}.{what}") and os.path.getsize(f"{started}.{what}"):
                    with open(f"{started}.{what}") as fh:
                        note += f"; writer {j}'s {what}: {fh.read()[-6000:]}"
    if outcome == "survived" and sorted(codes) != [0, 3]:
        outcome, note = ("lost", f"exit codes {codes}: both won or one failed unclearly") \
            if codes != [0, 0] else ("lost", "both writers reported success")
    elif outcome == "survived":
        outcome = "clear"  # one wrote the output, the other was refused clearly
    tally.add(outcome, note)


def disk_full(s: Setup, engine, rnd: random.Random, tally: Tally, i: int, mounted: str | None,
              out_bytes: int) -> None:
    """A disk too small for the output: clear error, output incomplete; after
    space is freed, resume finishes."""
    import tilearray as ta

    if mounted is not None:
        size = rnd.randint(out_bytes // 8, out_bytes * 3 // 4)
        subprocess.run(["mount", "-o", f"remount,size={size}", mounted], check=True)
        d = tempfile.mkdtemp(dir=mounted)
        out = os.path.join(d, "c.zarr")
        err = None
        try:
            (ta.open(s.a) @ ta.open(s.b)).to_zarr(out, engine=engine)
        except ta.TilearrayError as e:
            err = e
        if err is None or "space" not in str(err).lower() and "No space" not in str(err):
            tally.add("lost", f"no clear disk-full error: {err!r}")
            shutil.rmtree(d, ignore_errors=True)
            return
        subprocess.run(["mount", "-o", f"remount,size={out_bytes * 4}", mounted], check=True)
        outcome = judge(s, out, "", s.want, engine)
        shutil.rmtree(d, ignore_errors=True)
        tally.add(*outcome)
        return
    # no mount rights: a per-file size limit in a child process
    ctx = _ctx()
    out = os.path.join(s.dir, f"full-{i}.zarr")
    started = os.path.join(s.dir, f"full-{i}")
    p = ctx.Process(target=_child, args=(s.a, s.b, out, "", started, "", 0.0, 4096))
    p.start()
    p.join(120)
    if p.exitcode != 3:
        tally.add("lost", f"no clear error under a full disk (exit {p.exitcode})")
        return
    tally.add(*judge(s, out, "", s.want, engine))


def transient_reads(s: Setup, engine, rnd: random.Random, tally: Tally, i: int) -> None:
    from zarr.storage import LocalStore

    import tilearray as ta
    from tilearray.engine.expr.nodes import Source
    from tilearray.storage import ArrayRef
    from tilearray.testing import FailingStore

    x = ta.open(s.a)
    row = rnd.randrange(x.grid.unit_grid[0])
    store = FailingStore(LocalStore(s.a), f"flaky-{i}", f"c/{row}/", rnd.randint(1, 2))
    flaky = ta.TiledArray(Source(x.shape, x.dtype, ArrayRef(store), x.grid))
    out = os.path.join(s.dir, f"flaky-{i}.zarr")
    try:
        (flaky @ ta.open(s.b)).to_zarr(out, engine=engine)
    except ta.TilearrayError:
        pass
    tally.add(*judge(s, out, "", s.want, engine))


# -- the matrix -------------------------------------------------------------------------


@contextlib.contextmanager
def _small_disk(base: str):
    """A tmpfs mounted for the disk-full runs (root only), else None."""
    mnt = os.path.join(base, "small-disk")
    os.makedirs(mnt, exist_ok=True)
    ok = os.geteuid() == 0 and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1M", "tmpfs", mnt],
        capture_output=True).returncode == 0
    try:
        yield mnt if ok else None
    finally:
        if ok:
            subprocess.run(["umount", "-l", mnt], capture_output=True)


def run_matrix(base: str, runs: int, seed: int, kinds=KINDS, n: int = 384, tile: int = 64,
               log=print) -> dict[str, Tally]:
    import tilearray as ta

    rnd = random.Random(seed)
    s = make_inputs(base, n, tile)
    tallies = {k: Tally() for k in kinds}
    out_bytes = n * n * 8
    import dask

    with ta.Engine(n_workers=1, threads_per_worker=2, memory_per_worker=2**30,
                   processes=False, quiet=True) as eng, \
            dask.config.set(small_tasks(2**30, 2)):
        t0 = time.time()
        (ta.open(s.a) @ ta.open(s.b)).to_zarr(os.path.join(base, "clean.zarr"), engine=eng)
        span = max(time.time() - t0, 0.05)  # a clean run's length: kill points within it
        for kind in kinds:
            t = time.time()
            if kind == "worker":
                with ta.Engine(n_workers=2, threads_per_worker=1, memory_per_worker=2**30,
                               quiet=True) as peng, dask.config.set(small_tasks(2**30, 1)):
                    tallies[kind].clean = clean_runs(s, peng)
                    tallies[kind].tasks = (ta.open(s.a) @ ta.open(s.b)).plan(engine=peng).tasks
                    with contextlib.suppress(_Hung):
                        for i in range(runs):
                            worker_kill(s, peng, rnd, tallies[kind], i, tallies[kind].clean)
            elif kind == "disk-full":
                with _small_disk(base) as mnt:
                    for i in range(runs):
                        disk_full(s, eng, rnd, tallies[kind], i, mnt, out_bytes)
            else:
                for i in range(runs):
                    if kind.startswith("driver-"):
                        driver_kill(s, eng, rnd, tallies[kind], kind.split("-")[1], i,
                                    span * 2 + 0.5)
                    elif kind == "race":
                        race(s, eng, rnd, tallies[kind], i)
                    elif kind == "transient-read":
                        transient_reads(s, eng, rnd, tallies[kind], i)
            log(f"{kind}: {runs} runs in {time.time() - t:.1f} s")
    return tallies


def table(tallies: dict[str, Tally]) -> str:
    rows = ["| fault | runs | survived | clear error | lost data |", "|---|---|---|---|---|"]
    for kind, t in tallies.items():
        rows.append(f"| {kind} | {t.runs} | {t.survived} | {t.clear_error} | {t.lost} |")
    for kind, t in tallies.items():
        if t.extra:
            med = float(np.median(t.extra))
            rows.append(f"\n{kind}: extra time per kill that struck mid-job, median of "
                        f"{len(t.extra)}: {med:+.2f} s on an undisturbed {t.clean:.2f} s run "
                        f"({med / t.clean:+.0%}); max {max(t.extra):+.2f} s; the job has "
                        f"{t.tasks} tasks on 2 worker threads, "
                        f"~{2 * t.clean / max(t.tasks, 1):.2f} s each")
    return "\n".join(rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=100)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--n", type=int, default=768, help="matrix side (768)")
    p.add_argument("--tile", type=int, default=64)
    p.add_argument("--dir", default=None)
    args = p.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(2**31)
    base = args.dir or tempfile.mkdtemp(prefix="tilearray-faults-")
    print(f"seed {seed}, data in {base}", file=sys.stderr)
    tallies = run_matrix(base, args.runs, seed, tuple(args.kinds.split(",")), args.n, args.tile,
                         log=lambda m: print(m, file=sys.stderr))
    print(table(tallies))
    for kind, t in tallies.items():
        for note in t.notes:
            print(f"lost data ({kind}): {note}", file=sys.stderr)
    if args.dir is None:
        shutil.rmtree(base, ignore_errors=True)
    return 1 if any(t.lost for t in tallies.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
