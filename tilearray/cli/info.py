"""``tilearray info``: describe stored arrays (shape, tiling, completion,
bytes), or with ``--scheduler-address`` the health of a running cluster."""

from __future__ import annotations

import contextlib
import json
import sys

from tilearray.cli.cluster import check_address, connect_client
from tilearray.cli.common import PROG, UsageError, abs_path
from tilearray.cli.options import cli_words


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

    client = connect_client(args, probe=True)
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
    import tilearray as ta
    from tilearray.errors import StorageError, TilearrayError

    if not args.paths and not args.scheduler_address:
        raise UsageError("give array PATHs, or --scheduler-address for a cluster's health")
    if args.scheduler_address:
        check_address(args.scheduler_address)
    exit_code = 0
    failed: list[Exception] = []
    if args.scheduler_address:
        exit_code = _cluster_info(args)
        if args.paths and not args.json:
            print()
    for k, path in enumerate(args.paths):
        full = abs_path(path)
        other = _not_a_matrix(full)
        if other is not None:  # a reduction's vector or scalar: no TiledArray, just facts
            _info_other(path, full, other, args.json, first=not k)
            continue
        try:
            x = ta.open(full, allow_incomplete=True)
        except TilearrayError as e:  # report the other paths too, then fail (as ls does)
            failed.append(e)
            continue
        info, meta = _matrix_facts(path, full, x)
        if args.json:
            print(json.dumps(info))
            continue
        if k:
            print()
        _print_matrix(x, info, meta, full)
    if len(failed) == 1:
        raise failed[0]
    if failed:
        raise StorageError(f"{len(failed)} paths could not be read: "
                           + "; ".join(str(e) for e in failed))
    return exit_code


def _matrix_facts(path: str, full: str, x) -> tuple[dict, dict]:
    """``(info, tilearray attributes)`` of the stored matrix ``x`` (``--json``'s record)."""
    from tilearray.storage import ArrayRef, done_units, info_attrs
    from tilearray.storage.array import local_files_state

    g = x.grid
    ref = ArrayRef.from_location(full)
    z = ref.open()
    meta = info_attrs(z)
    complete = bool(meta.get("complete", True))
    state = local_files_state(ref)
    writer = None if complete else _writer(ref)
    return {
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
        "stored_bytes": state[1] if state else None,
        "tilearray_output": bool(meta),
        "complete": complete,
        "units_done": g.n_units if complete else len(done_units(ref)),
        "being_written_by": writer,
        "expression": meta.get("expression"),
    }, meta


def _writer(ref) -> str | None:
    """Who is writing the incomplete output ``ref`` right now (a live job
    holding its lock: pid and host), or None."""
    from tilearray.storage.array import describe_holder, live_writer

    holder = live_writer(ref)
    return None if holder is None else describe_holder(holder)


def _print_matrix(x, info: dict, meta: dict, full: str) -> None:
    """The text form of :func:`_matrix_facts`."""
    from dask.utils import format_bytes

    from tilearray.storage.array import unfinished

    g, stored, done = x.grid, info["stored_bytes"], info["units_done"]
    ratio = f", {x.nbytes / stored:.2f}x compression" if stored and info["complete"] else ""
    unit = (f"{g.unit[0]} x {g.unit[1]} (shard of {g.unit[0] // g.tile[0]} x "
            f"{g.unit[1] // g.tile[1]} tiles)" if g.sharded
            else f"{g.unit[0]} x {g.unit[1]} (one chunk, unsharded)")
    if info["complete"]:
        status = "yes" if meta else "yes (not written by tilearray)"
    elif info["being_written_by"]:
        status = (f"NO: being written right now by {info['being_written_by']}: {done} of "
                  f"{g.n_units} I/O units written; wait for that job to finish")
    else:
        what, how = unfinished(meta, g.n_units - done, g.n_units)
        how = cli_words(how[:1].lower() + how[1:])
        status = (f"NO: {what}; {how}" if done == g.n_units
                  else f"NO: {done} of {g.n_units} I/O units written; {how}")
    print(repr(x))
    print(f"  path:        {info['path']}")
    print(f"  shape:       {x.shape[0]} x {x.shape[1]}")
    print(f"  dtype:       {x.dtype} (Zarr v{info['zarr_format']})")
    print(f"  tile:        {g.tile[0]} x {g.tile[1]}")
    print(f"  I/O unit:    {unit}")
    print(f"  grids:       {g.tile_grid[0]} x {g.tile_grid[1]} tiles, "
          f"{g.unit_grid[0]} x {g.unit_grid[1]} = {g.n_units} I/O units")
    print(f"  bytes:       {format_bytes(x.nbytes)} in memory"
          + (f", {format_bytes(stored)} {_stored_where(full)}{ratio}"
             if stored is not None else ""))
    print(f"  complete:    {status}")
    if meta.get("expression"):
        print(f"  expression:  {meta['expression']}")


def _stored_where(full: str) -> str:
    from tilearray.storage.ref import is_local_url, is_url

    return "stored" if is_url(full) and not is_local_url(full) else "on disk"


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
    writer = None if complete else _writer(ArrayRef.from_location(full))
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
        "being_written_by": writer,
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
    elif writer:
        status = f"NO: being written right now by {writer}; wait for that job to finish"
    else:
        status = "NO: its job did not finish; rerun it"
    how = "a 1-D TiledArray with ta.open, or read it" if z.ndim == 1 else \
        "not a TiledArray: read it"
    print(f"{z.ndim}-D Zarr array ({how} with zarr.open_array({full!r})[...])")
    print(f"  path:        {path}")
    print(f"  shape:       {shape}")
    print(f"  dtype:       {z.dtype} (Zarr v{info['zarr_format']})")
    print(f"  chunks:      {chunks}")
    print(f"  bytes:       {format_bytes(nbytes)} in memory"
          + (f", {format_bytes(state[1])} {_stored_where(full)}" if state else ""))
    print(f"  complete:    {status}")
    if meta.get("expression"):
        print(f"  expression:  {meta['expression']}")


def add_parsers(sub, common, budget, cluster) -> None:
    """The ``info`` command."""
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
