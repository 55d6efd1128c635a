"""The cluster a command runs on, from its flags: an embedded LocalCluster,
``--scheduler-address`` (checked, probed, connected) or ``--mpi``; and the
budget a local engine would plan with, without starting one."""

from __future__ import annotations

import contextlib
import os

from tilearray.cli.common import UsageError
from tilearray.cli.options import cli_words


def explicit_cluster(args) -> bool:
    return any(getattr(args, k, None) not in (None, False) for k in
               ("workers", "threads_per_worker", "memory_per_worker", "scheduler_address", "mpi"))


def check_cluster_args(args) -> None:
    if args.mpi and args.scheduler_address:
        raise UsageError("--mpi and --scheduler-address cannot be used together")
    remote = "--mpi" if args.mpi else "--scheduler-address" if args.scheduler_address else None
    if remote and args.workers is not None:
        raise UsageError(f"--workers sizes a local cluster; it cannot be used with {remote}")
    if args.scheduler_address and args.threads_per_worker is not None:
        raise UsageError("--threads-per-worker sizes a local cluster; it cannot be used with "
                         "--scheduler-address")
    if args.scheduler_address:
        check_address(args.scheduler_address)
    if args.memory_per_worker is not None:  # a worker process must fit: refused before any start
        from tilearray.engine.plan import check_worker_memory

        try:
            check_worker_memory(args.memory_per_worker, args.threads_per_worker or 1,
                                error=UsageError)
        except UsageError as e:
            raise UsageError(cli_words(str(e))) from None


@contextlib.contextmanager
def engine_from_args(args):
    """The Engine for a job: dask-mpi, an existing scheduler, or a LocalCluster.

    Yields None on MPI ranks that are not the client (they serve the cluster).
    """
    import tilearray as ta
    from tilearray.errors import ClusterError

    check_cluster_args(args)
    if args.mpi:
        try:
            kw = {k: v for k, v in (("memory_per_worker", args.memory_per_worker),
                                    ("threads_per_worker", args.threads_per_worker),
                                    ("quiet", args.quiet or None))
                  if v is not None}
            engine = ta.Engine.mpi(**kw)
        except ImportError as e:
            raise ClusterError(f"--mpi is not available: {e}") from e
        if engine is None:  # scheduler or worker rank: its part is done
            yield None
            return
        if args.quiet:
            engine.quiet = True
        with engine:
            yield engine
    elif args.scheduler_address:
        client = connect_client(args)
        try:
            with ta.Engine(client=client, memory_per_worker=args.memory_per_worker,
                           quiet=args.quiet) as engine:
                yield engine
        finally:
            with contextlib.suppress(Exception):
                client.close()
    else:
        with ta.Engine(n_workers=args.workers, threads_per_worker=args.threads_per_worker,
                       memory_per_worker=args.memory_per_worker, quiet=args.quiet) as engine:
            yield engine


def local_budget(args):
    """The Budget a default local Engine would plan with, without starting it."""
    import psutil

    from tilearray import Budget, _config

    threads = args.threads_per_worker or 1
    n = args.workers or max((os.cpu_count() or 1) // threads, 1)
    mem = args.memory_per_worker
    if mem is None:
        mem = min(_config.get_bytes("memory.default-per-worker"),
                  int(psutil.virtual_memory().total * 0.8 / n))
    return Budget.from_config(mem, n, threads)


_ADDRESS_HINT = "use [SCHEME://]HOST:PORT, e.g. tcp://host:8786"


def check_address(address: str) -> None:
    """Refuse a malformed scheduler address before any connection is tried
    (a usage error, exit status 2)."""
    from distributed.comm.addressing import parse_address, parse_host_port
    from distributed.comm.registry import backends

    try:
        scheme, loc = parse_address(address)
    except (TypeError, ValueError) as e:
        raise UsageError(f"bad --scheduler-address {address!r}: {e}; {_ADDRESS_HINT}") from None
    if scheme not in backends:
        raise UsageError(f"bad --scheduler-address {address!r}: unknown scheme {scheme!r} "
                         f"(known: {', '.join(sorted(backends))}); {_ADDRESS_HINT}")
    if scheme in ("inproc", "ucx"):
        return
    try:
        host, port = parse_host_port(loc)
    except (TypeError, ValueError) as e:
        raise UsageError(f"bad --scheduler-address {address!r}: {e}; {_ADDRESS_HINT}") from None
    if not host or not 0 < int(port) < 65536:
        raise UsageError(f"bad --scheduler-address {address!r}: needs a host and a port "
                         f"between 1 and 65535; {_ADDRESS_HINT}")


def _refused(address: str, timeout: float) -> str | None:
    """One quick TCP connection attempt: a reason when the scheduler's host
    refuses it or does not resolve (nothing will answer there), else None (up,
    or slow: the client's own connection then waits up to its timeout)."""
    import socket

    from distributed.comm.addressing import parse_address, parse_host_port

    scheme, loc = parse_address(address)
    if scheme not in ("tcp", "tls", "ws", "wss"):
        return None
    host, port = parse_host_port(loc)
    try:
        with socket.create_connection((host, int(port)), timeout=min(timeout, 5.0)):
            return None
    except ConnectionRefusedError:
        return "connection refused (is the scheduler running?)"
    except socket.gaierror as e:
        return f"cannot resolve host {host!r}: {e}"
    except OSError:
        return None


def connect_client(args, *, probe: bool = False):
    """A Client for ``--scheduler-address``; a ClusterError within
    ``--connect-timeout`` when none can be had (``probe``: at once when the
    connection is refused, as a health check wants).

    A Client whose connection failed is closed here: left to the garbage
    collector it would block for a minute at exit and print a traceback."""
    from distributed import Client

    from tilearray.errors import ClusterError

    address = args.scheduler_address
    check_address(address)
    reason = _refused(address, args.connect_timeout) if probe else None
    if reason:
        raise ClusterError(f"could not connect to the dask scheduler at {address!r}: {reason}")
    client = Client.__new__(Client)
    try:
        client.__init__(address, timeout=args.connect_timeout, set_as_default=False)
    except Exception as e:
        with contextlib.suppress(Exception):
            client.close(timeout=2)
        raise ClusterError(
            f"could not connect to the dask scheduler at {address!r}: {e}"
        ) from e
    return client
