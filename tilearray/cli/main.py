"""The ``tilearray`` command line (also ``python -m tilearray``).

Commands::

    tilearray info PATH [PATH ...] [--json]
    tilearray info --scheduler-address ADDR [--json]     # cluster health
    tilearray k8s-spec --name N --image IMG --workers N --memory-per-worker M [--job CMD]
    tilearray random PATH --shape M N [--tile R C] [--shard R C] [--dtype D] [--seed S]
    tilearray plan EXPR [-o OUT] [--tile R C] [--shard R C]
    tilearray matmul A B -o C [--transpose-a] [--transpose-b] [--tile R C] [--shard R C]
    tilearray reduce A --op mean [--axis 0|1|none] [-o OUT]

``plan`` takes a small expression over array paths: ``@``, ``+``, ``-``,
``*``, ``/``, a ``.T`` suffix for the transpose, parentheses and numbers,
e.g. ``"a.zarr.T @ a.zarr"`` or ``"(a.zarr - b.zarr) * 0.5"``. ``+ - * /``
must be separated from paths by spaces (paths contain ``-`` and ``/``);
quote a path that contains spaces, ``@`` or parentheses.

Exit status: 0 success, 1 the job failed (any error raised while opening,
planning or running), 2 bad usage (unknown options, malformed values or
expressions, conflicting options), 130 interrupted, 141 stdout closed by its
reader (``| head``). Errors print one line,
``tilearray: error: <message>``, on stderr; ``--debug`` adds the traceback.
Progress goes to stderr; results and the one-line summary to stdout (the
summary goes to stderr when ``reduce`` prints values on stdout).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import threading
import time
import traceback

from tilearray.cli import deploy, info, jobs
from tilearray.cli.common import PROG, UsageError, parents
from tilearray.cli.options import (
    cli_words,
    expression_not_option,
    join_option_values,
    option_strings,
    unknown_long_options,
    value_options,
)
from tilearray.errors import ArgumentError, PlanningAxisError

# -- the parser -------------------------------------------------------------------------


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("tilearray")
    except Exception:
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    common, budget, cluster = parents()

    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Out-of-core tiled matrix compute on Zarr v3 with dask.distributed.",
        epilog="Batch jobs on MPI ranks: 'tilearray mpirun -n N -- script.py' (see "
               "'tilearray mpirun --help'). Exit status: 0 success, 1 the job failed, "
               "2 bad usage, 130 interrupted, 143 terminated. See 'tilearray COMMAND --help'.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    for group in (info, jobs, deploy):  # in the order of the help
        group.add_parsers(sub, common, budget, cluster)
    return parser


def _subparser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices.get(command, parser)
    return parser


# -- entry point ------------------------------------------------------------------------


def _one_line(e: BaseException) -> str:
    from tilearray.errors import TilearrayError

    msg = cli_words(" ".join(str(e).split()))
    if not isinstance(e, TilearrayError):
        msg = f"{type(e).__name__}: {msg}" if msg else type(e).__name__
    return msg or type(e).__name__


_QUIET_ENV = {
    # distributed's own log lines (worker "Compute Failed" tracebacks, shutdown
    # chatter) would bury the one-line error; worker processes inherit this.
    "DASK_LOGGING__DISTRIBUTED": "critical",
}


@contextlib.contextmanager
def _logging(debug: bool):
    """Quiet by default: warnings only from tilearray, nothing from distributed
    (the error that stops a job is reported once, by us). ``--debug`` shows
    tilearray's debug log and distributed's own logging."""
    if debug:
        logging.basicConfig(level=logging.INFO, format=f"{PROG}: %(name)s: %(message)s")
        logging.getLogger("tilearray").setLevel(logging.DEBUG)
        yield
        return
    import dask

    saved = {k: os.environ.get(k) for k in _QUIET_ENV}
    for k, v in _QUIET_ENV.items():
        os.environ.setdefault(k, v)
    # the event loop's callback errors (Ctrl-C cancelling distributed's sync() logs a
    # NameError traceback there before our one-line "interrupted")
    tornado_log = logging.getLogger("tornado.application")
    level = tornado_log.level
    tornado_log.setLevel(logging.CRITICAL)
    try:
        # this process: applies if distributed is first imported below
        with dask.config.set({"logging.distributed": os.environ["DASK_LOGGING__DISTRIBUTED"]}):
            yield
    finally:
        tornado_log.setLevel(level)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class _Terminated(KeyboardInterrupt):
    """SIGTERM (a batch system's time limit, ``timeout``, ``kill``): ends the
    job as Ctrl-C does -- the run cancelled, the cluster and the output's lock
    released -- where Python's default would exit at once, silently."""


CLEANUP_SECONDS = 5.0
"""A Ctrl-C this long after the first interrupts again (the first was lost in
a destructor, or the cleanup is stuck); sooner, it is noted and ignored."""


@contextlib.contextmanager
def _signals():
    """Ctrl-C and SIGTERM stop the command through its cleanup. A second
    Ctrl-C during that cleanup (which takes a second or two) is ignored,
    with a note; a third exits at once (130), leaving what cleanup had left
    (a lock the next run reclaims, worker processes that exit with us)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    first = []  # when the first Ctrl-C came

    def on_int(signum, frame):
        if not first or time.monotonic() - first[0] > CLEANUP_SECONDS:
            # the first, or one long after it (that one was lost, or is stuck)
            first[:] = [time.monotonic()]
            raise KeyboardInterrupt
        if len(first) == 1:
            first.append(True)
            print(f"{PROG}: stopping (cleaning up); press Ctrl-C again to exit at once",
                  file=sys.stderr)
            return
        os._exit(130)

    def on_term(signum, frame):
        raise _Terminated

    handlers = {signal.SIGINT: on_int, signal.SIGTERM: on_term}
    # a signal the parent ignored (a shell's background job: SIGINT) stays ignored
    old = {sig: signal.getsignal(sig) for sig in handlers}
    for sig, handler in handlers.items():
        if old[sig] is not signal.SIG_IGN:
            signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status (0, 1, 2 or 130)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["mpirun"]:
        # `tilearray mpirun -n N -- script.py ...`: launch on MPI ranks, exit with
        # the client rank's status (a dead worker rank does not end the job)
        from tilearray.engine.mpi import main as mpirun_main

        return mpirun_main(argv[1:], prog=f"{PROG} mpirun")
    parser = build_parser()
    try:
        takes, options = value_options(parser), option_strings(parser)
        unknown = unknown_long_options(argv, options)
        sub = _subparser(parser, argv[0]) if argv else parser
        if unknown and sub is not parser:  # named before a missing required option
            sub.error(f"unrecognized arguments: {' '.join(unknown)}")
        argv = expression_not_option(argv, options, takes)
        args, extra = parser.parse_known_args(join_option_values(argv, takes))
        if extra:  # refused by the subcommand, with its usage (not the top level's)
            _subparser(parser, args.command).error(
                f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as e:  # --help, --version, or a usage error (already printed)
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    try:
        with _signals(), _logging(args.debug):
            return int(args.func(args) or 0)
    except (UsageError, ArgumentError, PlanningAxisError) as e:  # a flag's value, an axis
        if args.debug:
            traceback.print_exc()
        print(f"{PROG}: error: {cli_words(str(e))} (see '{PROG} {args.command} --help')",
              file=sys.stderr)
        return 2
    except BrokenPipeError:
        # whoever read stdout stopped (`tilearray reduce ... | head`): not a job error;
        # end quietly, as a command killed by SIGPIPE would, and keep Python's exit-time
        # flush of stdout from failing again
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except KeyboardInterrupt as e:
        if args.debug:
            traceback.print_exc()
        hint = " (rerun with --resume to continue)" if args.command == "matmul" else ""
        what = "terminated (SIGTERM)" if isinstance(e, _Terminated) else "interrupted"
        print(f"{PROG}: error: {what}{hint}", file=sys.stderr)
        return 128 + signal.SIGTERM if isinstance(e, _Terminated) else 130
    except Exception as e:
        if args.debug:
            traceback.print_exc()
        sys.stdout.flush()
        print(f"{PROG}: error: {_one_line(e)}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover - `python -m tilearray.cli`
    sys.exit(main())
