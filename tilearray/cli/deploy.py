"""``tilearray k8s-spec``: a dask-kubernetes DaskCluster/DaskJob manifest
(the ``deploy`` extra)."""

from __future__ import annotations

import sys

from tilearray.cli.common import PROG, UsageError
from tilearray.cli.options import byte_size_arg, pos_int


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


def add_parsers(sub, common, budget, cluster) -> None:
    """The ``k8s-spec`` command."""
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
    p.add_argument("--workers", type=pos_int, default=2, metavar="N",
                   help="worker pods (default 2)")
    p.add_argument("--memory-per-worker", type=byte_size_arg, metavar="BYTES",
                   help="memory of each worker, e.g. 8GiB (default "
                        "tilearray.memory.default-per-worker)")
    p.add_argument("--threads-per-worker", type=pos_int, default=1, metavar="N",
                   help="threads = CPU cores of each worker (default 1)")
    p.add_argument("--scheduler-memory", type=byte_size_arg, default=2 * 2**30, metavar="BYTES",
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
