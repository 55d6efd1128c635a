"""Operating tilearray beyond one machine: Kubernetes manifests and cluster health.

Two small, side-effect-free pieces used by the command line:

- :func:`cluster_manifest` / :func:`job_manifest` build a ``DaskCluster`` or
  ``DaskJob`` resource for the dask-kubernetes operator from a
  :class:`K8sSpec`, through dask-kubernetes' own spec builders
  (``make_cluster_spec``, ``make_worker_spec``, ``make_scheduler_spec``),
  then add what tilearray needs: Guaranteed-QoS resources (requests =
  limits) matching the worker's ``--memory-limit`` and ``--nthreads``, HTTP
  ``/health`` probes, and a volume for the Zarr data. dask-kubernetes is
  imported only here, only when a manifest is built (the ``deploy`` extra).
- :func:`cluster_health` summarises a running cluster from a connected
  ``distributed.Client``: workers, their threads and memory, and whether the
  versions of the packages that must agree do agree.

Nothing here talks to Kubernetes.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass

from tilearray.errors import ClusterError, TilearrayError

INSTALL_HINT = "pip install 'tilearray[deploy]'"

SCHEDULER_PORT = 8786
"""dask's comm port, the one the operator's scheduler Service exposes."""
SCHEDULER_HTTP_PORT = 8787
"""The scheduler's HTTP server: dashboard, ``/health``, ``/metrics``."""
WORKER_HTTP_PORT = 8788
"""The worker's HTTP server (dask-kubernetes' choice): ``/health``, ``/metrics``."""

DATA_VOLUME = "zarr-data"

HEALTH_PACKAGES = ("python", "dask", "distributed", "numpy", "zarr", "tilearray")
"""Packages whose versions must agree between this client, the scheduler and
every worker (graphs are pickled by the client and unpickled on the scheduler
and workers, and tasks import tilearray, numpy and zarr there)."""

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_MAX_NAME = 63 - len("-scheduler")  # the operator names the Service <name>-scheduler


class DeployError(TilearrayError, ValueError):
    """An invalid deployment request (a bad name, size or count)."""


@dataclass(frozen=True, slots=True)
class K8sSpec:
    """What a tilearray cluster on Kubernetes looks like."""

    name: str
    """Name of the DaskCluster / DaskJob (a DNS label, at most 53 characters)."""
    image: str
    """Container image for the scheduler, the workers and the job runner; it
    must have tilearray installed (``deploy/kubernetes/Dockerfile``)."""
    workers: int
    """Worker pods (one dask worker process each)."""
    memory_per_worker: int
    """Memory of each worker, in bytes: container request = limit = the
    worker's ``--memory-limit``, so the planner's budget is what the kubelet
    enforces."""
    threads_per_worker: int = 1
    """Threads of each worker = its CPU request and limit, in cores."""
    data_pvc: str | None = None
    """PersistentVolumeClaim holding the Zarr arrays (ReadWriteMany when
    workers span nodes); None mounts nothing."""
    data_path: str = "/data"
    """Where the claim is mounted in every container."""
    scheduler_memory: int = 2 * 2**30
    """Memory of the scheduler (and of the job runner), in bytes."""
    scheduler_cpu: int = 1
    """CPU of the scheduler (and of the job runner), in cores."""
    namespace: str | None = None
    """Namespace to put in the manifest's metadata; None leaves it to kubectl."""

    def validate(self) -> K8sSpec:
        if not (_DNS_LABEL.fullmatch(self.name) and len(self.name) <= _MAX_NAME):
            raise DeployError(
                f"name {self.name!r} is not a valid cluster name: use lowercase letters, "
                f"digits and '-', starting and ending with a letter or digit, at most "
                f"{_MAX_NAME} characters")
        if self.workers < 1:
            raise DeployError(f"workers must be at least 1, got {self.workers}")
        if self.threads_per_worker < 1:
            raise DeployError(f"threads per worker must be at least 1, got "
                              f"{self.threads_per_worker}")
        for what, v in (("memory per worker", self.memory_per_worker),
                        ("scheduler memory", self.scheduler_memory)):
            if v < 2**20:
                raise DeployError(f"{what} must be at least 1MiB, got {v} bytes")
        if self.scheduler_cpu < 1:
            raise DeployError(f"scheduler CPU must be at least 1, got {self.scheduler_cpu}")
        if not self.image:
            raise DeployError("an image is required")
        if not self.data_path.startswith("/"):
            raise DeployError(f"data path must be absolute, got {self.data_path!r}")
        return self


def k8s_quantity(nbytes: int) -> str:
    """Bytes as a Kubernetes quantity: ``4Gi``, ``512Mi``, else plain bytes."""
    for suffix, scale in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if nbytes % scale == 0:
            return f"{nbytes // scale}{suffix}"
    return str(int(nbytes))


def dask_size(nbytes: int) -> str:
    """Bytes as dask writes them on a command line: ``4GiB``, else plain bytes."""
    for suffix, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes % scale == 0:
            return f"{nbytes // scale}{suffix}"
    return str(int(nbytes))


def _operator():
    try:
        from dask_kubernetes import operator
    except ImportError as e:
        raise ClusterError(
            f"building Kubernetes manifests needs dask-kubernetes ({e}); "
            f"install it with: {INSTALL_HINT}") from None
    return operator


def _resources(memory: int, cpu: int) -> dict:
    # requests = limits: Guaranteed QoS, so a worker is neither throttled below
    # its threads nor OOM-killed below its planned memory
    r = {"cpu": str(cpu), "memory": k8s_quantity(memory)}
    return {"requests": dict(r), "limits": dict(r)}


def _probes(port: str) -> dict:
    """dask's ``/health`` route (``distributed.http.health``): 200 "ok" while
    the server's event loop answers."""
    get = {"httpGet": {"port": port, "path": "/health"}}
    return {
        "readinessProbe": {**copy.deepcopy(get), "initialDelaySeconds": 5, "periodSeconds": 10,
                           "timeoutSeconds": 5},
        "livenessProbe": {**copy.deepcopy(get), "initialDelaySeconds": 15, "periodSeconds": 20,
                          "timeoutSeconds": 10, "failureThreshold": 6},
    }


def _mount_data(pod_spec: dict, spec: K8sSpec) -> None:
    if spec.data_pvc is None:
        return
    pod_spec.setdefault("volumes", []).append(
        {"name": DATA_VOLUME, "persistentVolumeClaim": {"claimName": spec.data_pvc}})
    for c in pod_spec["containers"]:
        c.setdefault("volumeMounts", []).append(
            {"name": DATA_VOLUME, "mountPath": spec.data_path})


def _env(spec: K8sSpec) -> dict[str, str]:
    if not spec.data_pvc:
        return {}
    return {
        # lets a job's args name arrays as $(TILEARRAY_DATA)/a.zarr
        "TILEARRAY_DATA": spec.data_path,
        # intermediate results (a matmul inside a larger expression) must be
        # where every worker sees them: on the shared volume, not in /tmp
        "DASK_TILEARRAY__TEMPORARY_DIRECTORY": spec.data_path.rstrip("/") + "/.tilearray-tmp",
    }


def cluster_manifest(spec: K8sSpec) -> dict:
    """A ``DaskCluster`` resource (apiVersion ``kubernetes.dask.org/v1``)."""
    spec.validate()
    op = _operator()
    worker_command = ["dask", "worker",
                      "--nthreads", str(spec.threads_per_worker),
                      "--memory-limit", dask_size(spec.memory_per_worker)]
    m = op.make_cluster_spec(
        name=spec.name, image=spec.image, n_workers=spec.workers,
        resources=_resources(spec.memory_per_worker, spec.threads_per_worker),
        env=_env(spec) or None, worker_command=worker_command)

    worker_pod = m["spec"]["worker"]["spec"]
    (worker,) = worker_pod["containers"]
    worker.update(_probes("http-dashboard"))
    _mount_data(worker_pod, spec)

    scheduler_pod = m["spec"]["scheduler"]["spec"]
    (scheduler,) = scheduler_pod["containers"]
    # the builder gives scheduler and workers one resources dict: the
    # scheduler gets its own (the workers' is the planned budget)
    scheduler["resources"] = _resources(spec.scheduler_memory, spec.scheduler_cpu)
    # dask-kubernetes still writes the `dask-scheduler` script, which
    # distributed no longer installs; `dask scheduler` is the same command
    args = scheduler["args"]
    if args and args[0] == "dask-scheduler":
        scheduler["args"] = ["dask", "scheduler", *args[1:]]
    # the builder's own probes poll every second with a 300 s timeout; use
    # the same /health route at the workers' pace
    scheduler.update(_probes("http-dashboard"))
    _mount_data(scheduler_pod, spec)

    for c in (worker, scheduler):
        if c.get("env") is None:
            del c["env"]
    if spec.namespace:
        m["metadata"]["namespace"] = spec.namespace
    return m


def job_manifest(spec: K8sSpec, command: list[str]) -> dict:
    """A ``DaskJob``: the cluster of :func:`cluster_manifest` plus a job-runner
    pod running ``command``. The operator sets ``DASK_SCHEDULER_ADDRESS`` in
    the runner; Kubernetes expands ``$(DASK_SCHEDULER_ADDRESS)`` in its args,
    e.g. ``tilearray matmul ... --scheduler-address $(DASK_SCHEDULER_ADDRESS)``.
    The runner does not restart: rerun a failed job with ``--resume``.
    """
    if not command:
        raise DeployError("the job needs a command")
    cluster = cluster_manifest(spec)
    runner = {
        "name": "job",
        "image": spec.image,
        "args": list(command),
        "env": [{"name": k, "value": v} for k, v in _env(spec).items()] or None,
        "resources": _resources(spec.scheduler_memory, spec.scheduler_cpu),
        "workingDir": spec.data_path if spec.data_pvc else None,
    }
    runner = {k: v for k, v in runner.items() if v is not None}
    job_pod = {"restartPolicy": "Never", "containers": [runner]}
    _mount_data(job_pod, spec)
    m = {
        "apiVersion": cluster["apiVersion"],
        "kind": "DaskJob",
        "metadata": dict(cluster["metadata"]),
        "spec": {
            "job": {"spec": job_pod},
            "cluster": {"spec": cluster["spec"]},
        },
    }
    return m


def to_yaml(manifest: dict) -> str:
    """YAML for kubectl, written out in full (no ``&id`` anchors where the
    builders share an object between scheduler and workers)."""
    import yaml

    class Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data):
            return True

    return yaml.dump(manifest, Dumper=Dumper, sort_keys=False, default_flow_style=False)


# -- health of a running cluster --------------------------------------------------------


def _version_key(pkg: str, v):
    if v is None:
        return None
    if pkg == "python":  # "3.11.9.final.0": pickled code is compatible within 3.11
        return ".".join(str(v).split(".")[:2])
    return str(v)


def cluster_health(client) -> dict:
    """Workers, their threads and memory, and version agreement of a cluster.

    Returns a JSON-able dict; ``healthy`` is true when at least one worker is
    connected and every package of :data:`HEALTH_PACKAGES` has the same
    version (Python: the same minor version) on this client, the scheduler
    and every worker. A package missing somewhere counts as a mismatch.
    """
    info = client.scheduler_info(n_workers=-1)
    versions = client.get_versions(check=False, packages=["numpy", "zarr", "tilearray"])
    http = info.get("services", {}).get("dashboard")
    workers = []
    for addr, w in sorted(info.get("workers", {}).items()):
        metrics = w.get("metrics", {})
        workers.append({
            "address": addr,
            "name": str(w.get("name", addr)),
            "host": w.get("host"),
            "nthreads": w.get("nthreads"),
            "memory_limit": w.get("memory_limit") or None,
            "memory": metrics.get("memory"),
            "http_port": (w.get("services") or {}).get("dashboard"),
        })

    sides = {"client": versions.get("client"), "scheduler": versions.get("scheduler")}
    sides.update({f"worker {a}": v for a, v in sorted(versions.get("workers", {}).items())})
    mismatches = []
    reported: dict[str, dict[str, str | None]] = {}
    for pkg in HEALTH_PACKAGES:
        seen = {}
        for side, v in sides.items():
            pkgs = (v or {}).get("packages") or {}
            seen[side] = pkgs.get(pkg)
        reported[pkg] = seen
        if len({_version_key(pkg, v) for v in seen.values()}) > 1:
            by_version: dict[str, list[str]] = {}
            for side, v in seen.items():
                by_version.setdefault(v if v is not None else "not installed", []).append(side)
            mismatches.append({"package": pkg, "versions": by_version})

    problems = []
    if not workers:
        problems.append("no workers connected")
    problems += [f"{m['package']} versions differ" for m in mismatches]
    return {
        "scheduler": info.get("address") or client.scheduler.address,
        "scheduler_http_port": http,
        "workers": workers,
        "n_workers": len(workers),
        "threads": sum(w["nthreads"] or 0 for w in workers),
        "memory_limit": sum(w["memory_limit"] or 0 for w in workers),
        "versions": {pkg: reported[pkg]["client"] for pkg in HEALTH_PACKAGES},
        "mismatches": mismatches,
        "problems": problems,
        "healthy": not problems,
    }
