"""The job commands: ``random``, ``plan``, ``matmul`` and ``reduce``."""

from __future__ import annotations

import sys
import time

from tilearray.cli.cluster import check_cluster_args, engine_from_args, explicit_cluster, local_budget
from tilearray.cli.common import (
    PROG,
    UsageError,
    abs_path,
    check_output,
    job_summary,
    layout_opts,
    log_to_stderr,
    member_arg,
    open_input,
    output_exists,
    output_opts,
)
from tilearray.cli.expr import ExpressionError, parse_expression
from tilearray.cli.options import axis_arg, dtype_arg, nonneg_int, ord_arg, pos_int

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


def cmd_random(args) -> int:
    import tilearray as ta

    target = member_arg(args.path, args)
    check_output(args, args.path, [])
    shape, tile = tuple(args.shape), tuple(args.tile)
    shard = tuple(args.shard) if args.shard else None
    t0 = time.perf_counter()
    kw = dict(tile=tile, shard=shard, dtype=args.dtype, seed=args.seed,
              overwrite=args.overwrite, name=args.name or "")
    if explicit_cluster(args):
        with engine_from_args(args) as engine:
            if engine is None:
                return 0
            x = ta.random(shape, abs_path(args.path), engine=engine, **kw)
            stats = engine.last_run
    else:  # no cluster asked for: local threads, no cluster start-up
        check_cluster_args(args)
        x = ta.random(shape, abs_path(args.path), **kw)
        stats = None
    elapsed = time.perf_counter() - t0
    g = x.grid
    run = f"ran {stats}" if stats is not None else \
        f"wrote {g.n_units} I/O unit(s) in {elapsed:.1f} s"
    print(f"{PROG}: random {x.shape} {x.dtype} seed {args.seed} -> {target} "
          f"(tile {g.tile}, I/O unit {g.unit}) | {run}")
    return 0


def cmd_plan(args) -> int:
    from tilearray.engine.array import TiledArray

    check_cluster_args(args)
    try:
        expr = parse_expression(args.expression, open_input)
    except ExpressionError as e:
        raise UsageError(f"bad expression {args.expression!r}: {e}") from None
    if not isinstance(expr, TiledArray):  # defensive: the parser returns arrays only
        raise UsageError(f"bad expression {args.expression!r}")
    if (args.tile or args.shard) and not args.output:
        raise UsageError(f"--{'tile' if args.tile else 'shard'} describes the output's "
                         "layout: give the output with -o PATH (without it the plan is "
                         "of a result computed in memory)")
    kw = dict(tile=tuple(args.tile) if args.tile else None,
              shard=tuple(args.shard) if args.shard else None)
    out = abs_path(args.output) if args.output else None
    if args.scheduler_address:
        with engine_from_args(args) as engine:
            plan = expr.plan(out, engine=engine, **kw)
    else:
        plan = expr.plan(out, budget=local_budget(args), **kw)
    print(plan)
    if args.output and output_exists(args.output, args):  # a job would refuse it as it is
        print(f"{PROG} plan: note: {member_arg(args.output, args)!r} already exists: a job "
              "writing it needs --overwrite (or --resume to finish an interrupted run)",
              file=sys.stderr)
    return 0


def cmd_matmul(args) -> int:
    import tilearray as ta

    check_cluster_args(args)
    check_output(args, args.output, [args.a, args.b])
    a = open_input(args.a)
    b = open_input(args.b)
    if args.transpose_a:
        a = a.T
    if args.transpose_b:
        b = b.T
    expr = ta.matmul(a, b)
    kw = dict(tile=tuple(args.tile) if args.tile else None,
              shard=tuple(args.shard) if args.shard else None)
    out = abs_path(args.output)
    with engine_from_args(args) as engine:
        if engine is None:
            return 0
        plan = expr.plan(out, name=args.name or "", engine=engine, **kw)
        log_to_stderr(args, str(plan))
        result = expr.to_zarr(out, args.name or "", overwrite=args.overwrite,
                              resume=args.resume, engine=engine, **kw)
        stats = getattr(result, "stats", None) or expr.stats
    ta_, tb_ = (".T" if args.transpose_a else ""), (".T" if args.transpose_b else "")
    lhs = f"{args.a}{ta_} @ {args.b}{tb_}"
    print(job_summary(f"matmul {lhs} -> {member_arg(args.output, args)} {result.shape} "
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
    return x.build_reduction(args.op, axis=args.axis)


def _format_values(value) -> list[str]:
    import numpy as np

    v = np.asarray(value)
    return [str(e) for e in v.reshape(-1)] if v.ndim else [str(v[()])]


def cmd_reduce(args) -> int:
    check_cluster_args(args)
    if args.name and not args.output:
        raise UsageError("--name names a member of the -o output group; give -o too")
    if args.output:
        check_output(args, args.output, [args.a])
    x = open_input(args.a)
    expr = _reduction(x, args)
    axis = "none" if args.axis is None else args.axis
    extra = (f", ord={args.ord}" if args.ord is not None else "") + \
        (f", ddof={args.ddof}" if args.ddof else "")  # the summary says which norm / var
    what = f"{args.op}(axis={axis}{extra}) of {args.a}"
    out = abs_path(args.output) if args.output else None
    with engine_from_args(args) as engine:
        if engine is None:
            return 0
        # the plan of what runs: with -o, the write (a worker task) is part of it
        plan = expr.plan(out, name=args.name or "", engine=engine)
        log_to_stderr(args, str(plan))
        if args.output:
            value = expr.to_zarr(out, args.name or "", overwrite=args.overwrite,
                                 resume=args.resume, engine=engine)
        else:
            value = expr.compute(engine=engine)
        stats = expr.stats
    import numpy as np

    v = np.asarray(value)
    if args.output:
        print(job_summary(f"{what} -> {member_arg(args.output, args)} {v.shape} {v.dtype}", plan,
                       stats))
    else:
        print("\n".join(_format_values(v)))
        sys.stdout.flush()
        print(job_summary(f"{what} = {v.shape} {v.dtype}", plan, stats), file=sys.stderr)
    return 0


def add_parsers(sub, common, budget, cluster) -> None:
    """The ``random``, ``plan``, ``matmul`` and ``reduce`` commands."""
    p = sub.add_parser("random", parents=[common, cluster], help="write a random matrix",
                       description="Write a reproducible random matrix (standard normal for "
                                   "floats). Uses local threads unless a cluster option is "
                                   "given.")
    p.add_argument("path", metavar="PATH")
    p.add_argument("--shape", type=nonneg_int, nargs=2, metavar=("M", "N"), required=True)
    p.add_argument("--tile", type=pos_int, nargs=2, metavar=("R", "C"), default=[1024, 1024],
                   help="tile (Zarr chunk), default 1024 1024")
    p.add_argument("--shard", type=pos_int, nargs=2, metavar=("R", "C"),
                   help="shard (I/O unit), a multiple of the tile (default: unsharded)")
    p.add_argument("--dtype", type=dtype_arg, default="float64", help="default float64")
    p.add_argument("--seed", type=nonneg_int, default=0, help="0 or more (default 0)")
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
    p.add_argument("--axis", type=axis_arg, default=None, metavar="{0,1,none}",
                   help="default none")
    p.add_argument("--ddof", type=nonneg_int, default=0, help="for var and std (default 0)")
    p.add_argument("--ord", type=ord_arg, default=None,
                   help="for norm: fro (default), nuc, 1, -1, 2, -2, inf, -inf, or p along an "
                   "axis")
    p.add_argument("-o", "--output", metavar="OUT")
    output_opts(p)
    p.set_defaults(func=cmd_reduce, parser=p)
