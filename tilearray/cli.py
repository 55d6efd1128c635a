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
expressions, conflicting options), 130 interrupted. Errors print one line,
``tilearray: error: <message>``, on stderr; ``--debug`` adds the traceback.
Progress goes to stderr; results and the one-line summary to stdout (the
summary goes to stderr when ``reduce`` prints values on stdout).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import sys
import time
import traceback

from tilearray.cli_args import (  # argument types, CLI wording
    _axis,
    _bytes,
    _cli_words,
    _dtype,
    _join_option_values,
    _nonneg_int,
    _ord,
    _pos_int,
)
from tilearray.cli_expr import ExpressionError, parse_expression

PROG = "tilearray"

REDUCTIONS = ("sum", "mean", "min", "max", "var", "std", "prod", "any", "all",
              "argmin", "argmax", "norm")
"""The usual ``--op`` choices, listed first; the engine's other reductions
(``nansum``, ``nanmean``, ``count_nonzero``, ...) are accepted too."""


def _reductions() -> tuple[str, ...]:
    try:
        from tilearray.graphs.reduction import OPS
    except ImportError:  # pragma: no cover
        OPS = ()
    return REDUCTIONS + tuple(op for op in OPS if op not in REDUCTIONS)


class UsageError(Exception):
    """Bad command-line input found after argparse (exit status 2)."""


def _open(path: str):
    import tilearray as ta
    from tilearray.errors import StorageError

    full = _abs(path)
    try:
        return ta.open(full)
    except StorageError as e:
        if not os.path.exists(full) and re.search(r"[-+*/]", path):
            raise StorageError(
                f"{e} (in expressions, put spaces around the operators + - * /)"
            ) from None
        raise


# -- shared helpers ---------------------------------------------------------------------


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
    if stats is None:
        return "nothing to run: the output was already complete"
    s = f"ran {stats}"
    if stats.skipped_units:
        s += f", {stats.skipped_units} unit(s) already done (resumed)"
    return s


def _summary(what: str, plan, stats) -> str:
    parts = [f"{PROG}: {what}"]
    if plan is not None:
        parts.append(_plan_summary(plan))
    parts.append(_run_summary(stats))
    return " | ".join(parts)


def _abs(path: str) -> str:
    """Absolute path: workers of an external (or MPI) cluster may run elsewhere
    than this process's working directory."""
    return os.path.abspath(os.path.expanduser(path))


def _same_path(a: str, b: str) -> bool:
    return os.path.realpath(_abs(a)) == os.path.realpath(_abs(b))


def _member(output: str, args) -> str:
    """The path of the output array: ``output``, or member ``--name`` inside it."""
    name = getattr(args, "name", None)
    return os.path.join(output, name) if name else output


def _check_output(args, output: str, inputs) -> None:
    """Refuse, before any work, outputs that exist (unless asked) or are inputs."""
    target = _member(output, args)
    for p in inputs:
        if _same_path(target, p):
            raise UsageError(f"output {target!r} is also an input; write to another path")
    if os.path.lexists(_abs(target)) and not (
        getattr(args, "overwrite", False) or getattr(args, "resume", False)
    ):
        from tilearray.errors import StorageError

        hint = " (or --resume to finish an interrupted run)" if hasattr(args, "resume") else ""
        raise StorageError(f"{target!r} already exists; pass --overwrite to replace it{hint}")


def _explicit_cluster(args) -> bool:
    return any(getattr(args, k, None) not in (None, False) for k in
               ("workers", "threads_per_worker", "memory_per_worker", "scheduler_address", "mpi"))


def _check_cluster_args(args) -> None:
    if args.mpi and args.scheduler_address:
        raise UsageError("--mpi and --scheduler-address cannot be used together")
    remote = "--mpi" if args.mpi else "--scheduler-address" if args.scheduler_address else None
    if remote and args.workers is not None:
        raise UsageError(f"--workers sizes a local cluster; it cannot be used with {remote}")
    if args.scheduler_address and args.threads_per_worker is not None:
        raise UsageError("--threads-per-worker sizes a local cluster; it cannot be used with "
                         "--scheduler-address")
    if args.scheduler_address:
        _check_address(args.scheduler_address)
    if args.memory_per_worker is not None:  # a worker process must fit: refused before any start
        from tilearray.engine.plan import check_worker_memory

        try:
            check_worker_memory(args.memory_per_worker, args.threads_per_worker or 1,
                                error=UsageError)
        except UsageError as e:
            raise UsageError(_cli_words(str(e))) from None


@contextlib.contextmanager
def _engine(args):
    """The Engine for a job: dask-mpi, an existing scheduler, or a LocalCluster.

    Yields None on MPI ranks that are not the client (they serve the cluster).
    """
    import tilearray as ta
    from tilearray.errors import ClusterError

    _check_cluster_args(args)
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
        client = _connect(args)
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


def _local_budget(args):
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


def _log(args, *lines) -> None:
    if args.debug:
        for line in lines:
            print(line, file=sys.stderr)


# -- commands -------------------------------------------------------------------------


_ADDRESS_HINT = "use [SCHEME://]HOST:PORT, e.g. tcp://host:8786"


def _check_address(address: str) -> None:
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


def _connect(args, *, probe: bool = False):
    """A Client for ``--scheduler-address``; a ClusterError within
    ``--connect-timeout`` when none can be had (``probe``: at once when the
    connection is refused, as a health check wants).

    A Client whose connection failed is closed here: left to the garbage
    collector it would block for a minute at exit and print a traceback."""
    from distributed import Client

    from tilearray.errors import ClusterError

    address = args.scheduler_address
    _check_address(address)
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


def _short_python(v) -> str:
    return ".".join(str(v).split(".")[:3]) if v else "not installed"


def _print_health(h) -> None:
    from dask.utils import format_bytes

    status = "healthy" if h["healthy"] else "UNHEALTHY: " + "; ".join(h["problems"])
    print(f"cluster {h['scheduler']}: {status}")
    port = h["scheduler_http_port"]
    http = f" (HTTP port {port}: /health, /metrics)" if port else ""
    print(f"  scheduler:   {h['scheduler']}{http}")
    print(f"  workers:     {h['n_workers']}, {h['threads']} thread(s), "
          f"{format_bytes(h['memory_limit'])} memory limit in total")
    for w in h["workers"]:
        limit = w["memory_limit"]
        mem = w["memory"]
        used = (f"memory {format_bytes(mem)}" if mem is not None else "memory ?")
        used += (f" of {format_bytes(limit)} ({100 * (mem or 0) / limit:.0f}%)" if limit
                 else ", no memory limit")
        name = f" ({w['name']})" if w["name"] != w["address"] else ""
        http = f", HTTP port {w['http_port']}" if w["http_port"] else ""
        print(f"    {w['address']}{name}: {w['nthreads']} thread(s), {used}{http}")
    if not h["mismatches"]:
        vs = ", ".join(f"{k} {_short_python(v) if k == 'python' else v or 'not installed'}"
                       for k, v in h["versions"].items())
        print(f"  versions:    match ({vs})")
        return
    print("  versions:    MISMATCH")
    for m in h["mismatches"]:
        parts = [f"{_short_python(v) if m['package'] == 'python' else v} on {', '.join(sides)}"
                 for v, sides in m["versions"].items()]
        print(f"    {m['package']}: " + "; ".join(parts))


def _cluster_info(args) -> int:
    from tilearray.deploy import cluster_health

    client = _connect(args, probe=True)
    try:
        h = cluster_health(client)
    finally:
        with contextlib.suppress(Exception):
            client.close()
    if args.json:
        print(json.dumps(h))
    else:
        _print_health(h)
    if h["healthy"]:
        return 0
    sys.stdout.flush()
    print(f"{PROG}: error: cluster at {args.scheduler_address} is unhealthy: "
          + "; ".join(h["problems"]), file=sys.stderr)
    return 1


def cmd_info(args) -> int:
    from dask.utils import format_bytes

    import tilearray as ta
    from tilearray.storage import ArrayRef, done_units, info_attrs
    from tilearray.storage.array import local_files_state

    if not args.paths and not args.scheduler_address:
        raise UsageError("give array PATHs, or --scheduler-address for a cluster's health")
    if args.scheduler_address:
        _check_address(args.scheduler_address)
    exit_code = 0
    if args.scheduler_address:
        exit_code = _cluster_info(args)
        if args.paths and not args.json:
            print()
    for k, path in enumerate(args.paths):
        full = _abs(path)
        other = _not_a_matrix(full)
        if other is not None:  # a reduction's vector or scalar: no TiledArray, just facts
            _info_other(path, full, other, args.json, first=not k)
            continue
        x = ta.open(full, allow_incomplete=True)
        g = x.grid
        ref = ArrayRef.from_location(full)
        z = ref.open()
        meta = info_attrs(z)
        complete = bool(meta.get("complete", True))
        done = g.n_units if complete else len(done_units(ref))
        state = local_files_state(ref)
        stored = state[1] if state else None
        info = {
            "path": path,
            "shape": list(x.shape),
            "dtype": str(x.dtype),
            "zarr_format": z.metadata.zarr_format,
            "tile": list(g.tile),
            "io_unit": list(g.unit),
            "sharded": g.sharded,
            "tile_grid": list(g.tile_grid),
            "unit_grid": list(g.unit_grid),
            "units": g.n_units,
            "nbytes": x.nbytes,
            "stored_bytes": stored,
            "tilearray_output": bool(meta),
            "complete": complete,
            "units_done": done,
            "expression": meta.get("expression"),
        }
        if args.json:
            print(json.dumps(info))
            continue
        if k:
            print()
        ratio = f", {x.nbytes / stored:.2f}x compression" if stored and complete else ""
        unit = (f"{g.unit[0]} x {g.unit[1]} (shard of {g.unit[0] // g.tile[0]} x "
                f"{g.unit[1] // g.tile[1]} tiles)" if g.sharded
                else f"{g.unit[0]} x {g.unit[1]} (one chunk, unsharded)")
        if complete:
            status = "yes" if meta else "yes (not written by tilearray)"
        else:
            status = (f"NO: {done} of {g.n_units} I/O units written; rerun the job that writes "
                      "it with --resume to finish it")
        print(repr(x))
        print(f"  path:        {path}")
        print(f"  shape:       {x.shape[0]} x {x.shape[1]}")
        print(f"  dtype:       {x.dtype} (Zarr v{info['zarr_format']})")
        print(f"  tile:        {g.tile[0]} x {g.tile[1]}")
        print(f"  I/O unit:    {unit}")
        print(f"  grids:       {g.tile_grid[0]} x {g.tile_grid[1]} tiles, "
              f"{g.unit_grid[0]} x {g.unit_grid[1]} = {g.n_units} I/O units")
        print(f"  bytes:       {format_bytes(x.nbytes)} in memory"
              + (f", {format_bytes(stored)} on disk{ratio}" if stored is not None else ""))
        print(f"  complete:    {status}")
        if meta.get("expression"):
            print(f"  expression:  {meta['expression']}")
    return exit_code


def _not_a_matrix(full: str):
    """The opened Zarr array at ``full`` if it is not 2-D, else None (also
    when nothing readable is there: ``ta.open`` then reports why)."""
    from tilearray.storage import ArrayRef

    try:
        z = ArrayRef.from_location(full).open()
    except Exception:
        return None
    return z if z.ndim != 2 else None


def _info_other(path: str, full: str, z, as_json: bool, first: bool) -> None:
    """``info`` for a 1-D / 0-d (or n-D) array: path, shape, dtype, chunks, completion."""
    from dask.utils import format_bytes

    from tilearray.storage import ArrayRef, info_attrs
    from tilearray.storage.array import local_files_state

    meta = info_attrs(z)
    complete = bool(meta.get("complete", True))
    state = local_files_state(ArrayRef.from_location(full))
    nbytes = int(z.nbytes)
    info = {
        "path": path,
        "shape": list(z.shape),
        "dtype": str(z.dtype),
        "zarr_format": z.metadata.zarr_format,
        "chunks": list(z.chunks),
        "nbytes": nbytes,
        "stored_bytes": state[1] if state else None,
        "tilearray_output": bool(meta),
        "complete": complete,
        "expression": meta.get("expression"),
    }
    if as_json:
        print(json.dumps(info))
        return
    if not first:
        print()
    shape = " x ".join(str(n) for n in z.shape) if z.ndim else "() (a scalar)"
    chunks = " x ".join(str(n) for n in z.chunks) if z.ndim else "()"
    if complete:
        status = "yes" if meta else "yes (not written by tilearray)"
    else:
        status = "NO: its job did not finish; rerun it"
    print(f"{z.ndim}-D Zarr array (not a TiledArray: read it with "
          f"zarr.open_array({full!r})[...])")
    print(f"  path:        {path}")
    print(f"  shape:       {shape}")
    print(f"  dtype:       {z.dtype} (Zarr v{info['zarr_format']})")
    print(f"  chunks:      {chunks}")
    print(f"  bytes:       {format_bytes(nbytes)} in memory"
          + (f", {format_bytes(state[1])} on disk" if state else ""))
    print(f"  complete:    {status}")
    if meta.get("expression"):
        print(f"  expression:  {meta['expression']}")


def cmd_random(args) -> int:
    import tilearray as ta

    target = _member(args.path, args)
    if os.path.lexists(_abs(target)) and not args.overwrite:
        from tilearray.errors import StorageError

        raise StorageError(f"{target!r} already exists; pass --overwrite to replace it")
    shape, tile = tuple(args.shape), tuple(args.tile)
    shard = tuple(args.shard) if args.shard else None
    t0 = time.perf_counter()
    kw = dict(tile=tile, shard=shard, dtype=args.dtype, seed=args.seed,
              overwrite=args.overwrite, name=args.name or "")
    if _explicit_cluster(args):
        with _engine(args) as engine:
            if engine is None:
                return 0
            x = ta.random(shape, _abs(args.path), engine=engine, **kw)
            stats = engine.last_run
    else:  # no cluster asked for: local threads, no cluster start-up
        _check_cluster_args(args)
        x = ta.random(shape, _abs(args.path), **kw)
        stats = None
    elapsed = time.perf_counter() - t0
    g = x.grid
    run = f"ran {stats}" if stats is not None else \
        f"wrote {g.n_units} I/O unit(s) in {elapsed:.1f} s"
    print(f"{PROG}: random {x.shape} {x.dtype} seed {args.seed} -> {target} "
          f"(tile {g.tile}, I/O unit {g.unit}) | {run}")
    return 0


def cmd_plan(args) -> int:
    from tilearray.engine.tiled import TiledArray

    _check_cluster_args(args)
    try:
        expr = parse_expression(args.expression, _open)
    except ExpressionError as e:
        raise UsageError(f"bad expression {args.expression!r}: {e}") from None
    if not isinstance(expr, TiledArray):  # defensive: the parser returns arrays only
        raise UsageError(f"bad expression {args.expression!r}")
    kw = dict(tile=tuple(args.tile) if args.tile else None,
              shard=tuple(args.shard) if args.shard else None)
    out = _abs(args.output) if args.output else None
    if args.scheduler_address:
        with _engine(args) as engine:
            plan = expr.plan(out, engine=engine, **kw)
    else:
        plan = expr.plan(out, budget=_local_budget(args), **kw)
    print(plan)
    return 0


def cmd_matmul(args) -> int:
    import tilearray as ta

    _check_cluster_args(args)
    _check_output(args, args.output, [args.a, args.b])
    a = _open(args.a)
    b = _open(args.b)
    if args.transpose_a:
        a = a.T
    if args.transpose_b:
        b = b.T
    expr = ta.matmul(a, b)
    kw = dict(tile=tuple(args.tile) if args.tile else None,
              shard=tuple(args.shard) if args.shard else None)
    out = _abs(args.output)
    with _engine(args) as engine:
        if engine is None:
            return 0
        plan = expr.plan(out, engine=engine, **kw)
        _log(args, str(plan))
        result = expr.to_zarr(out, args.name or "", overwrite=args.overwrite,
                              resume=args.resume, engine=engine, **kw)
        stats = getattr(result, "stats", None) or expr.stats
    ta_, tb_ = (".T" if args.transpose_a else ""), (".T" if args.transpose_b else "")
    lhs = f"{args.a}{ta_} @ {args.b}{tb_}"
    print(_summary(f"matmul {lhs} -> {_member(args.output, args)} {result.shape} "
                   f"{result.dtype}", plan, stats))
    return 0


def _reduction(x, args):
    import tilearray as ta

    if args.op == "norm":
        return ta.linalg.norm(x, ord=args.ord, axis=args.axis)
    if args.ord is not None:
        raise UsageError("--ord applies to --op norm only")
    if args.op in ("var", "std"):
        return getattr(x, args.op)(axis=args.axis, ddof=args.ddof)
    if args.ddof:
        raise UsageError("--ddof applies to --op var and std only")
    return x._reduce(args.op, axis=args.axis)


def _format_values(value) -> list[str]:
    import numpy as np

    v = np.asarray(value)
    return [str(e) for e in v.reshape(-1)] if v.ndim else [str(v[()])]


def cmd_reduce(args) -> int:
    _check_cluster_args(args)
    if args.name and not args.output:
        raise UsageError("--name names a member of the -o output group; give -o too")
    if args.output:
        _check_output(args, args.output, [args.a])
    x = _open(args.a)
    expr = _reduction(x, args)
    axis = "none" if args.axis is None else args.axis
    what = f"{args.op}(axis={axis}) of {args.a}"
    with _engine(args) as engine:
        if engine is None:
            return 0
        plan = expr.plan(engine=engine)
        _log(args, str(plan))
        if args.output:
            value = expr.to_zarr(_abs(args.output), args.name or "", overwrite=args.overwrite,
                                 resume=args.resume, engine=engine)
        else:
            value = expr.compute(engine=engine)
        stats = expr.stats
    import numpy as np

    v = np.asarray(value)
    if args.output:
        print(_summary(f"{what} -> {_member(args.output, args)} {v.shape} {v.dtype}", plan,
                       stats))
    else:
        print("\n".join(_format_values(v)))
        sys.stdout.flush()
        print(_summary(f"{what} = {v.shape} {v.dtype}", plan, stats), file=sys.stderr)
    return 0


def cmd_k8s_spec(args) -> int:
    import shlex

    from tilearray import _config, deploy

    memory = args.memory_per_worker or _config.get_bytes("memory.default-per-worker")
    try:
        spec = deploy.K8sSpec(
            name=args.name, image=args.image, workers=args.workers, memory_per_worker=memory,
            threads_per_worker=args.threads_per_worker, data_pvc=args.data_pvc,
            data_path=args.data_path, scheduler_memory=args.scheduler_memory,
            namespace=args.namespace)
        spec.validate()
        if args.job is not None:
            try:
                command = shlex.split(args.job)
            except ValueError as e:
                raise deploy.DeployError(f"bad --job command {args.job!r}: {e}") from None
            manifest = deploy.job_manifest(spec, command)
        else:
            manifest = deploy.cluster_manifest(spec)
    except deploy.DeployError as e:
        raise UsageError(str(e)) from None
    text = deploy.to_yaml(manifest)
    if args.output in (None, "-"):
        sys.stdout.write(text)
    else:
        with open(args.output, "w") as f:
            f.write(text)
        print(f"{PROG}: wrote {manifest['kind']} {spec.name!r} ({spec.workers} worker(s) x "
              f"{spec.threads_per_worker} CPU, {deploy.k8s_quantity(memory)}) to {args.output}; "
              f"apply with: kubectl apply -f {args.output}", file=sys.stderr)
    return 0


# -- the parser -------------------------------------------------------------------------


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("tilearray")
    except Exception:
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    g = common.add_argument_group("output and diagnostics")
    g.add_argument("--quiet", "-q", action="store_true",
                   help="no progress bar")
    g.add_argument("--debug", action="store_true",
                   help="show the full traceback of errors, the plan, and tilearray logs")

    budget = argparse.ArgumentParser(add_help=False)
    c = budget.add_argument_group("cluster")
    c.add_argument("--memory-per-worker", type=_bytes, metavar="BYTES",
                   help="memory limit of each worker process, e.g. 2GiB; tasks are planned "
                        "to fit (default: tilearray.memory.default-per-worker, capped by RAM)")
    c.add_argument("--workers", type=_pos_int, metavar="N",
                   help="workers of the local cluster (default: one per core)")
    c.add_argument("--threads-per-worker", type=_pos_int, metavar="N",
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
        p.add_argument("--tile", type=_pos_int, nargs=2, metavar=("R", "C"),
                       help=f"tile (Zarr chunk) of {what}")
        p.add_argument("--shard", type=_pos_int, nargs=2, metavar=("R", "C"),
                       help=f"shard (I/O unit) of {what}, a multiple of the tile")

    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Out-of-core tiled matrix compute on Zarr v3 with dask.distributed.",
        epilog="Exit status: 0 success, 1 the job failed, 2 bad usage. "
               "See 'tilearray COMMAND --help'.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("info", parents=[common], help="describe stored arrays or a cluster",
                       description="Shape, dtype, tile, I/O unit, grids, bytes and "
                                   "completion of Zarr arrays. With --scheduler-address: the "
                                   "cluster's health (workers, threads, memory, and whether "
                                   "python, dask, distributed, numpy, zarr and tilearray "
                                   "versions match on this client, the scheduler and every "
                                   "worker); exit status 1 when no worker is connected or "
                                   "versions differ.")
    p.add_argument("paths", nargs="*", metavar="PATH")
    p.add_argument("--scheduler-address", metavar="ADDR",
                   help="report the health of the dask cluster at this scheduler address")
    p.add_argument("--connect-timeout", type=float, default=30.0, metavar="SECONDS",
                   help="how long to wait for --scheduler-address (default 30)")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.set_defaults(func=cmd_info, parser=p)

    p = sub.add_parser("random", parents=[common, cluster], help="write a random matrix",
                       description="Write a reproducible random matrix (standard normal for "
                                   "floats). Uses local threads unless a cluster option is "
                                   "given.")
    p.add_argument("path", metavar="PATH")
    p.add_argument("--shape", type=_nonneg_int, nargs=2, metavar=("M", "N"), required=True)
    p.add_argument("--tile", type=_pos_int, nargs=2, metavar=("R", "C"), default=[1024, 1024],
                   help="tile (Zarr chunk), default 1024 1024")
    p.add_argument("--shard", type=_pos_int, nargs=2, metavar=("R", "C"),
                   help="shard (I/O unit), a multiple of the tile (default: unsharded)")
    p.add_argument("--dtype", type=_dtype, default="float64", help="default float64")
    p.add_argument("--seed", type=_nonneg_int, default=0, help="0 or more (default 0)")
    output_opts(p, resume=False)
    p.set_defaults(func=cmd_random, parser=p)

    p = sub.add_parser("plan", parents=[common, budget], help="plan an expression (no I/O)",
                       description="Print the plan of an expression over array paths without "
                                   "running it: tasks, peak memory per task, bytes, FLOPs. "
                                   "Operators: @ + - * /, suffix .T, reductions .sum() "
                                   ".mean() .var() .std() .min() .max() .prod() with "
                                   "axis=0|1|None, parentheses, numbers; put spaces "
                                   "around + - * /. No cluster is started unless "
                                   "--scheduler-address is given.",
                       epilog='examples: tilearray plan "a.zarr @ b.zarr"; '
                              'tilearray plan "(a.zarr - b.zarr).sum(axis=0)"; '
                              'tilearray plan "a.zarr.T @ a.zarr" --memory-per-worker 4GiB')
    p.add_argument("expression", metavar="EXPR")
    p.add_argument("-o", "--output", metavar="PATH",
                   help="plan writing to this path (nothing is written)")
    layout_opts(p, "the output")
    p.set_defaults(func=cmd_plan, parser=p, mpi=False)

    p = sub.add_parser("matmul", parents=[common, cluster], help="C = A @ B into Zarr",
                       description="Multiply two stored matrices out of core and write the "
                                   "product as a Zarr v3 array.")
    p.add_argument("a", metavar="A")
    p.add_argument("b", metavar="B")
    p.add_argument("-o", "--output", metavar="C", required=True)
    p.add_argument("--transpose-a", action="store_true", help="use A.T")
    p.add_argument("--transpose-b", action="store_true", help="use B.T")
    layout_opts(p, "C")
    output_opts(p)
    p.set_defaults(func=cmd_matmul, parser=p)

    p = sub.add_parser("reduce", parents=[common, cluster], help="reduce along an axis",
                       description="Reduce a stored matrix along axis 0 (per column), 1 (per "
                                   "row) or none (to a scalar). Writes a small Zarr array with "
                                   "-o, else prints the values, one per line.")
    p.add_argument("a", metavar="A")
    p.add_argument("--op", choices=_reductions(), required=True, metavar="OP",
                   help="one of: " + ", ".join(_reductions()))
    p.add_argument("--axis", type=_axis, default=None, metavar="{0,1,none}",
                   help="default none")
    p.add_argument("--ddof", type=_nonneg_int, default=0, help="for var and std (default 0)")
    p.add_argument("--ord", type=_ord, default=None,
                   help="for norm: fro (default), 1, -1, inf, -inf, or p along an axis")
    p.add_argument("-o", "--output", metavar="OUT")
    output_opts(p)
    p.set_defaults(func=cmd_reduce, parser=p)

    p = sub.add_parser(
        "k8s-spec", parents=[common], help="write a Kubernetes DaskCluster/DaskJob manifest",
        description="Write a DaskCluster (or, with --job, a DaskJob) manifest for the "
                    "dask-kubernetes operator, built with dask-kubernetes' own spec builder: "
                    "worker memory request = limit = --memory-per-worker = the worker's "
                    "--memory-limit, CPU request = limit = --threads-per-worker = its "
                    "--nthreads, /health liveness and readiness probes, and the Zarr data "
                    "volume (--data-pvc) mounted at --data-path in every pod. Needs the "
                    "deploy extra: pip install 'tilearray[deploy]'. Nothing is sent to a "
                    "cluster.",
        epilog="example: tilearray k8s-spec --name mm --image registry/tilearray:0.1.0 "
               "--workers 8 --memory-per-worker 8GiB --threads-per-worker 2 --data-pvc zarr "
               "--job 'tilearray matmul a.zarr b.zarr -o c.zarr --resume "
               "--scheduler-address $(DASK_SCHEDULER_ADDRESS)' -o job.yaml")
    p.add_argument("--name", default="tilearray", help="resource name (default tilearray)")
    p.add_argument("--image", default="tilearray:latest",
                   help="image with tilearray installed, for scheduler, workers and job "
                        "(default tilearray:latest; see deploy/kubernetes/Dockerfile)")
    p.add_argument("--workers", type=_pos_int, default=2, metavar="N",
                   help="worker pods (default 2)")
    p.add_argument("--memory-per-worker", type=_bytes, metavar="BYTES",
                   help="memory of each worker, e.g. 8GiB (default "
                        "tilearray.memory.default-per-worker)")
    p.add_argument("--threads-per-worker", type=_pos_int, default=1, metavar="N",
                   help="threads = CPU cores of each worker (default 1)")
    p.add_argument("--scheduler-memory", type=_bytes, default=2 * 2**30, metavar="BYTES",
                   help="memory of the scheduler and of the job runner (default 2GiB)")
    p.add_argument("--data-pvc", metavar="CLAIM",
                   help="PersistentVolumeClaim with the Zarr arrays (ReadWriteMany when "
                        "workers span nodes); default: no volume")
    p.add_argument("--data-path", default="/data", metavar="PATH",
                   help="mount path of --data-pvc in every container (default /data)")
    p.add_argument("--namespace", help="metadata.namespace (default: kubectl's)")
    p.add_argument("--job", metavar="CMD",
                   help="write a DaskJob whose runner pod runs this command (one shell-quoted "
                        "string; $(DASK_SCHEDULER_ADDRESS) is set by the operator)")
    p.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout")
    p.set_defaults(func=cmd_k8s_spec, parser=p)
    return parser


# -- entry point ------------------------------------------------------------------------


def _one_line(e: BaseException) -> str:
    from tilearray.errors import TilearrayError

    msg = _cli_words(" ".join(str(e).split()))
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
    try:
        # this process: applies if distributed is first imported below
        with dask.config.set({"logging.distributed": os.environ["DASK_LOGGING__DISTRIBUTED"]}):
            yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status (0, 1, 2 or 130)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["mpirun"]:
        # `tilearray mpirun -n N -- script.py ...`: launch on MPI ranks, exit with
        # the client rank's status (a dead worker rank does not end the job)
        from .engine.mpi import main as mpirun_main

        return mpirun_main(argv[1:])
    parser = build_parser()
    try:
        args = parser.parse_args(_join_option_values(argv))
    except SystemExit as e:  # --help, --version, or a usage error (already printed)
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    try:
        with _logging(args.debug):
            return int(args.func(args) or 0)
    except UsageError as e:
        print(f"{PROG}: error: {e} (see '{PROG} {args.command} --help')", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if args.debug:
            traceback.print_exc()
        hint = " (rerun with --resume to continue)" if args.command == "matmul" else ""
        print(f"{PROG}: error: interrupted{hint}", file=sys.stderr)
        return 130
    except Exception as e:
        if args.debug:
            traceback.print_exc()
        sys.stdout.flush()
        print(f"{PROG}: error: {_one_line(e)}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover - `python -m tilearray.cli`
    sys.exit(main())
