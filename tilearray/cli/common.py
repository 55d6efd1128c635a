"""What every command of the ``tilearray`` command line shares: the usage
error, paths, the one-line summaries, and the option groups written once
(output and diagnostics, cluster, output array, tile/shard layout)."""

from __future__ import annotations

import argparse
import os
import re
import sys

from tilearray.cli.options import byte_size_arg, pos_int

PROG = "tilearray"


class UsageError(Exception):
    """Bad command-line input found after argparse (exit status 2)."""


def open_input(path: str):
    import tilearray as ta
    from tilearray.errors import StorageError

    full = abs_path(path)
    try:
        return ta.open(full)
    except StorageError as e:
        if not _is_url(full) and not os.path.exists(full) and re.search(r"[-+*/]", path):
            raise StorageError(
                f"{e} (in expressions, put spaces around the operators + - * /)"
            ) from None
        raise


def _flops(n: int) -> str:
    for unit, scale in (("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n} FLOP"


def _plan_summary(plan) -> str:
    from dask.utils import format_bytes

    s = (f"plan {plan.tasks} task(s), peak/task {format_bytes(plan.peak_task_memory)}, "
         f"read {format_bytes(plan.bytes_read)}")
    if plan.bytes_written:
        s += f", write {format_bytes(plan.bytes_written)}"
    if plan.flops:
        s += f", {_flops(plan.flops)}"
    return s


def _run_summary(stats) -> str:
    if stats is None or (not stats.tasks and stats.skipped_units):
        return "nothing to run: the output was already complete"
    return f"ran {stats}"


def job_summary(what: str, plan, stats) -> str:
    parts = [f"{PROG}: {what}"]
    if plan is not None:
        parts.append(_plan_summary(plan))
    parts.append(_run_summary(stats))
    return " | ".join(parts)


def _is_url(path: str) -> bool:
    from tilearray.storage.ref import is_url

    return is_url(path)


def abs_path(path: str) -> str:
    """Absolute path: workers of an external (or MPI) cluster may run elsewhere
    than this process's working directory. URLs (``s3://bucket/a.zarr``,
    ``file:///data/a.zarr``) are left as they are: tilearray opens them
    through their store (credentials and endpoint from the environment)."""
    if _is_url(path):
        return path
    return os.path.abspath(os.path.expanduser(path))


def _canonical(path: str) -> str:
    from tilearray.storage.ref import is_local_url

    if is_local_url(path):
        from urllib.parse import unquote, urlparse

        path = unquote(urlparse(path).path)
    elif _is_url(path):
        scheme, rest = path.split("://", 1)
        return scheme.lower() + "://" + "/".join(p for p in rest.split("/") if p)
    return os.path.realpath(abs_path(path))


def _same_path(a: str, b: str) -> bool:
    return _canonical(a) == _canonical(b)


def member_arg(output: str, args) -> str:
    """The path of the output array: ``output``, or member ``--name`` inside it."""
    name = getattr(args, "name", None)
    if name and _is_url(output):
        return output.rstrip("/") + "/" + name
    return os.path.join(output, name) if name else output


def _exists(target: str) -> bool:
    """Whether anything is stored at ``target``: a path, or a URL's keys."""
    if not _is_url(target):
        return os.path.lexists(abs_path(target))
    from tilearray.storage import ArrayRef
    from tilearray.storage.commit import has_data

    return has_data(ArrayRef.from_location(target))


def output_exists(output: str, args) -> bool:
    """Whether the output (member ``--name`` inside it) holds anything already."""
    return _exists(member_arg(output, args))


def check_output(args, output: str, inputs) -> None:
    """Refuse, before any work, outputs that exist (unless asked) or are inputs."""
    target = member_arg(output, args)
    for p in inputs:
        if _same_path(target, p):
            raise UsageError(f"output {target!r} is also an input; write to another path")
    if _exists(target) and not (
        getattr(args, "overwrite", False) or getattr(args, "resume", False)
    ):
        from tilearray.errors import StorageError

        note = _existing_output_note(output, args)  # a live writer: OutputLockedError
        hint = " (or --resume to finish an interrupted run)" if hasattr(args, "resume") else ""
        raise StorageError(
            f"{target!r} already exists{note}; pass --overwrite to replace it{hint}")


def _existing_output_note(output: str, args) -> str:
    """Before refusing an existing target: raise :class:`OutputLockedError`
    naming the holder when another live job is writing it right now (not
    "already exists"), else say when it is an unfinished tilearray output."""
    from tilearray.storage import ArrayRef, info_attrs
    from tilearray.storage.array import check_unlocked
    from tilearray.storage.commit import existing_array

    try:
        ref = ArrayRef.from_location(abs_path(output), getattr(args, "name", None) or "")
    except Exception:  # a bad --name: reported by the job itself
        return ""
    check_unlocked(ref)
    arr = existing_array(ref)
    if arr is not None and info_attrs(arr).get("complete") is False:
        return " (an unfinished output: the job writing it stopped early)"
    return ""


def log_to_stderr(args, *lines) -> None:
    if args.debug:
        for line in lines:
            print(line, file=sys.stderr)


def parents():
    """The option groups commands take as argparse parents: ``(common,
    budget, cluster)`` -- output and diagnostics; the cluster to plan for or
    run on; that and ``--mpi``."""
    common = argparse.ArgumentParser(add_help=False)
    g = common.add_argument_group("output and diagnostics")
    g.add_argument("--quiet", "-q", action="store_true",
                   help="no progress bar")
    g.add_argument("--debug", action="store_true",
                   help="show the full traceback of errors, the plan, and tilearray logs")

    budget = argparse.ArgumentParser(add_help=False)
    c = budget.add_argument_group("cluster")
    c.add_argument("--memory-per-worker", type=byte_size_arg, metavar="BYTES",
                   help="memory limit of each worker process, e.g. 2GiB; tasks are planned "
                        "to fit (default: tilearray.memory.default-per-worker, capped by RAM)")
    c.add_argument("--workers", type=pos_int, metavar="N",
                   help="workers of the local cluster (default: one per core)")
    c.add_argument("--threads-per-worker", type=pos_int, metavar="N",
                   help="threads per worker (default 1)")
    c.add_argument("--scheduler-address", metavar="ADDR",
                   help="use the running dask cluster at this scheduler address "
                        "(e.g. tcp://host:8786) instead of starting one")
    c.add_argument("--connect-timeout", type=float, default=30.0, metavar="SECONDS",
                   help="how long to wait for --scheduler-address (default 30)")

    cluster = argparse.ArgumentParser(add_help=False, parents=[budget])
    cluster.add_argument("--mpi", action="store_true",
                         help="boot the cluster over the MPI ranks with dask-mpi "
                              "(run under mpirun; rank 0 scheduler, rank 1 client, "
                              "others workers)")

    return common, budget, cluster


def output_opts(p, resume=True):
    p.add_argument("--name", metavar="MEMBER",
                   help="write the array as member MEMBER ('x' or 'sub/x') of the Zarr "
                        "group at the output path (created if needed; other members are "
                        "left alone)")
    m = p.add_mutually_exclusive_group()
    m.add_argument("--overwrite", action="store_true",
                   help="replace the output if it exists")
    if resume:
        m.add_argument("--resume", action="store_true",
                       help="finish an interrupted run of the same job into the same "
                            "output, skipping I/O units already written")


def layout_opts(p, what):
    p.add_argument("--tile", type=pos_int, nargs=2, metavar=("R", "C"),
                   help=f"tile (Zarr chunk) of {what}")
    p.add_argument("--shard", type=pos_int, nargs=2, metavar=("R", "C"),
                   help=f"shard (I/O unit) of {what}, a multiple of the tile")

