"""Beyond one machine: cluster health (`tilearray info --scheduler-address`),
Kubernetes manifests (`tilearray k8s-spec`) and the Slurm (dask-jobqueue) example.

Nothing here reaches Kubernetes or Slurm: manifests and job scripts are
generated and read back.
"""

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from dask.utils import parse_bytes
from helpers import in_process_workers

from tilearray.cli import main

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]


def run(*args, capsys):
    capsys.readouterr()
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, out, err)


def one_error_line(p, code):
    assert p.returncode == code, f"exit {p.returncode}\n{p.stdout}\n{p.stderr}"
    assert "Traceback" not in p.stderr
    errors = [ln for ln in p.stderr.splitlines() if "error:" in ln]
    assert len(errors) == 1, p.stderr
    return errors[0]


@pytest.fixture(scope="module")
def cluster():
    from distributed import LocalCluster

    with in_process_workers():
        c = LocalCluster(n_workers=2, threads_per_worker=1, processes=False, protocol="tcp",
                         dashboard_address=":0", memory_limit="1GiB")
    with c:
        yield c


# -- health ---------------------------------------------------------------------------


def test_info_cluster_health(cluster, capsys):
    p = run("info", "--scheduler-address", cluster.scheduler_address, capsys=capsys)
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert f"cluster {cluster.scheduler_address}: healthy" in out
    assert "workers:     2, 2 thread(s), 2.00 GiB memory limit in total" in out
    assert out.count("1 thread(s), memory ") == 2 and "of 1.00 GiB" in out
    assert "versions:    match (python 3.11" in out
    for pkg in ("dask", "distributed", "numpy", "zarr", "tilearray"):
        assert f" {pkg} " in out

    p = run("info", "--scheduler-address", cluster.scheduler_address, "--json", capsys=capsys)
    assert p.returncode == 0
    h = json.loads(p.stdout)
    assert h["healthy"] and h["n_workers"] == 2 and h["problems"] == []
    assert [w["memory_limit"] for w in h["workers"]] == [2**30, 2**30]
    assert all(w["nthreads"] == 1 and w["memory"] > 0 for w in h["workers"])
    assert isinstance(h["scheduler_http_port"], int)


def test_info_cluster_and_paths_together(cluster, tmp_path, capsys):
    import numpy as np

    import tilearray as ta

    ta.from_numpy(np.ones((8, 6)), str(tmp_path / "x.zarr"), tile=(4, 3))
    p = run("info", str(tmp_path / "x.zarr"), "--scheduler-address", cluster.scheduler_address,
            capsys=capsys)
    assert p.returncode == 0, p.stderr
    assert ": healthy" in p.stdout and "shape:       8 x 6" in p.stdout


def test_info_health_flags_version_mismatch(cluster, capsys, monkeypatch):
    from distributed import Client

    real = Client.get_versions

    def skewed(self, *a, **kw):
        v = real(self, *a, **kw)
        first = sorted(v["workers"])[0]
        v["workers"][first]["packages"]["zarr"] = "2.18.0"
        v["workers"][first]["packages"]["tilearray"] = None
        return v

    monkeypatch.setattr(Client, "get_versions", skewed)
    p = run("info", "--scheduler-address", cluster.scheduler_address, capsys=capsys)
    line = one_error_line(p, 1)
    assert "unhealthy" in line and "zarr versions differ" in line
    assert "tilearray versions differ" in line
    assert "versions:    MISMATCH" in p.stdout
    assert re.search(r"zarr: .* on client, scheduler, worker .*; 2\.18\.0 on worker", p.stdout)
    assert re.search(r"tilearray: \S+ on client, scheduler, worker .*; not installed on worker",
                     p.stdout)


def test_info_health_no_workers(capsys):
    from distributed import LocalCluster

    with LocalCluster(n_workers=0, processes=False, protocol="tcp",
                      dashboard_address=":0") as c:
        p = run("info", "--scheduler-address", c.scheduler_address, capsys=capsys)
    assert "no workers connected" in one_error_line(p, 1)


def test_info_health_unreachable_and_usage(capsys):
    p = run("info", "--scheduler-address", "tcp://127.0.0.1:9", "--connect-timeout", "1",
            capsys=capsys)
    assert "could not connect" in one_error_line(p, 1)
    assert "--scheduler-address" in one_error_line(run("info", capsys=capsys), 2)


def test_info_health_subprocess(cluster):
    p = subprocess.run(
        [sys.executable, "-m", "tilearray", "info", "--scheduler-address",
         cluster.scheduler_address, "--json"],
        capture_output=True, text=True, timeout=50)
    assert p.returncode == 0, p.stderr
    h = json.loads(p.stdout)
    assert h["healthy"] and h["n_workers"] == 2
    # a separate process is a separate client: its versions are compared too
    assert h["mismatches"] == [] and h["versions"]["tilearray"]


@pytest.mark.parametrize("role", ["scheduler", "worker"])
def test_health_endpoint_answers(cluster, role):
    """The route the probes use: GET /health -> 200 "ok" on both HTTP servers."""
    from urllib.request import urlopen

    if role == "scheduler":
        port = cluster.scheduler.http_server.port
    else:
        port = next(iter(cluster.workers.values())).http_server.port
    with urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as r:
        assert r.status == 200 and r.read() == b"ok"


# -- Kubernetes -----------------------------------------------------------------------


def k8s(*args, capsys, tmp_path=None):
    p = run("k8s-spec", *args, capsys=capsys)
    assert p.returncode == 0, p.stderr
    return yaml.safe_load(p.stdout)


def containers(pod):
    return {c["name"]: c for c in pod["containers"]}


def test_k8s_cluster_manifest(capsys):
    m = k8s("--name", "mm", "--image", "reg/tilearray:1", "--workers", 5,
            "--memory-per-worker", "6GiB", "--threads-per-worker", 3,
            "--data-pvc", "zarr-claim", "--data-path", "/zarr", capsys=capsys)
    assert m["apiVersion"] == "kubernetes.dask.org/v1" and m["kind"] == "DaskCluster"
    assert m["metadata"]["name"] == "mm"
    worker_group = m["spec"]["worker"]
    assert worker_group["replicas"] == 5
    w = containers(worker_group["spec"])["worker"]
    assert w["image"] == "reg/tilearray:1"
    # requests = limits = the budget, and the worker is told the same
    assert w["resources"]["requests"] == w["resources"]["limits"] == {"cpu": "3", "memory": "6Gi"}
    args = w["args"]
    assert args[:2] == ["dask", "worker"]
    assert args[args.index("--nthreads") + 1] == "3"
    assert parse_bytes(args[args.index("--memory-limit") + 1]) == 6 * 2**30
    assert parse_bytes(w["resources"]["limits"]["memory"]) == 6 * 2**30
    ports = {p["name"]: p["containerPort"] for p in w["ports"]}
    for probe in ("livenessProbe", "readinessProbe"):
        get = w[probe]["httpGet"]
        assert get["path"] == "/health" and ports[get["port"]] == 8788
    assert args[args.index("--dashboard-address") + 1] == "8788"

    s = containers(m["spec"]["scheduler"]["spec"])["scheduler"]
    assert s["args"][:2] == ["dask", "scheduler"]
    assert s["resources"]["requests"] == s["resources"]["limits"]
    sports = {p["name"]: p["containerPort"] for p in s["ports"]}
    for probe in ("livenessProbe", "readinessProbe"):
        assert s[probe]["httpGet"]["path"] == "/health"
        assert sports[s[probe]["httpGet"]["port"]] == 8787
    assert m["spec"]["scheduler"]["service"]["selector"]["dask.org/cluster-name"] == "mm"

    for pod, c in ((worker_group["spec"], w), (m["spec"]["scheduler"]["spec"], s)):
        assert pod["volumes"] == [{"name": "zarr-data",
                                   "persistentVolumeClaim": {"claimName": "zarr-claim"}}]
        assert c["volumeMounts"] == [{"name": "zarr-data", "mountPath": "/zarr"}]
        env = {e["name"]: e["value"] for e in c["env"]}
        assert env["DASK_TILEARRAY__TEMPORARY_DIRECTORY"].startswith("/zarr/")


def test_k8s_job_manifest_to_file(tmp_path, capsys):
    out = tmp_path / "job.yaml"
    cmd = ("tilearray matmul a.zarr b.zarr -o c.zarr --resume "
           "--scheduler-address '$(DASK_SCHEDULER_ADDRESS)'")
    p = run("k8s-spec", "--name", "job-1", "--workers", 2, "--memory-per-worker", "1536MiB",
            "--data-pvc", "data", "--job", cmd, "-o", out, capsys=capsys)
    assert p.returncode == 0 and p.stdout == "" and "kubectl apply -f" in p.stderr
    text = out.read_text()
    assert "&id" not in text and "*id" not in text  # no YAML aliases for kubectl
    m = yaml.safe_load(text)
    assert m["kind"] == "DaskJob" and m["metadata"]["name"] == "job-1"
    job_pod = m["spec"]["job"]["spec"]
    assert job_pod["restartPolicy"] == "Never"
    runner = containers(job_pod)["job"]
    assert runner["args"] == ["tilearray", "matmul", "a.zarr", "b.zarr", "-o", "c.zarr",
                              "--resume", "--scheduler-address", "$(DASK_SCHEDULER_ADDRESS)"]
    assert runner["volumeMounts"][0]["mountPath"] == "/data" and runner["workingDir"] == "/data"
    assert job_pod["volumes"][0]["persistentVolumeClaim"]["claimName"] == "data"
    cluster = m["spec"]["cluster"]["spec"]
    assert cluster["worker"]["replicas"] == 2
    w = containers(cluster["worker"]["spec"])["worker"]
    assert w["resources"]["limits"]["memory"] == "1536Mi"
    assert w["args"][w["args"].index("--memory-limit") + 1] == "1536MiB"


def test_k8s_without_volume(capsys):
    m = k8s(capsys=capsys)
    pod = m["spec"]["worker"]["spec"]
    assert "volumes" not in pod and "volumeMounts" not in pod["containers"][0]
    assert m["spec"]["worker"]["replicas"] == 2


@pytest.mark.parametrize("args, message", [
    (["--memory-per-worker", "lots"], "not a byte size"),
    (["--workers", "0"], "must be a positive integer (1 or more), got '0'"),
    (["--threads-per-worker", "-1"], "must be a positive integer (1 or more), got '-1'"),
    (["--name", "My_Cluster"], "not a valid cluster name"),
    (["--data-pvc", "d", "--data-path", "rel/dir"], "must be absolute"),
    (["--job", "tilearray 'unclosed"], "bad --job command"),
    (["--job", ""], "needs a command"),
])
def test_k8s_bad_input_exits_2(args, message, capsys):
    p = run("k8s-spec", *args, capsys=capsys)
    assert message in one_error_line(p, 2)
    assert p.stdout == ""


def test_k8s_without_deploy_extra(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "dask_kubernetes", None)  # import fails
    p = run("k8s-spec", capsys=capsys)
    assert "pip install 'tilearray[deploy]'" in one_error_line(p, 1)


def test_tilearray_does_not_import_deploy_extras():
    code = ("import sys, tilearray, tilearray.cli, tilearray.deploy; "
            "print(any(m.split('.')[0] in ('dask_kubernetes', 'dask_jobqueue', 'kr8s') "
            "for m in sys.modules))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50)
    assert p.returncode == 0 and p.stdout.strip() == "False", p.stderr


def test_deploy_files_parse():
    d = ROOT / "deploy" / "kubernetes"
    docker = (d / "Dockerfile").read_text()
    assert "FROM python:3.11-slim" in docker and '.[deploy]' in docker
    kinds = {yaml.safe_load((d / f).read_text())["kind"]
             for f in ("resourcequota.yaml", "limitrange.yaml", "pvc.yaml")}
    assert kinds == {"ResourceQuota", "LimitRange", "PersistentVolumeClaim"}


# -- Slurm ----------------------------------------------------------------------------


def _load_example():
    spec = importlib.util.spec_from_file_location("slurm_jobqueue",
                                                  ROOT / "examples" / "slurm_jobqueue.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_slurm_job_script_matches_budget():
    pytest.importorskip("dask_jobqueue")
    ex = _load_example()
    args = ex.parse_args(["--memory-per-worker", "6GiB", "--threads-per-worker", "3",
                          "--workers-per-job", "2", "--queue", "compute",
                          "--account", "proj", "--walltime", "00:30:00"])
    # starts a scheduler in this process; submits nothing (no sbatch here)
    with ex.make_cluster(args, scheduler_options={"dashboard_address": ":0",
                                                  "host": "127.0.0.1"}) as cluster:
        script = cluster.job_script()
    sbatch = dict(re.findall(r"^#SBATCH\s+(\S+?)[=\s](\S+)$", script, re.M))
    assert sbatch["--cpus-per-task"] == "6"          # 2 workers x 3 threads
    assert parse_bytes(sbatch["--mem"].replace("G", "GiB")) == 12 * 2**30
    assert sbatch["-p"] == "compute" and sbatch["-A"] == "proj" and sbatch["-t"] == "00:30:00"
    worker = next(ln for ln in script.splitlines() if "dask_worker" in ln or "dask worker" in ln)
    words = worker.split()
    assert words[words.index("--nthreads") + 1] == "3"
    assert parse_bytes(words[words.index("--memory-limit") + 1]) == 6 * 2**30
    assert words[words.index("--nworkers") + 1] == "2"
    assert words[0] == sys.executable  # same interpreter / venv on the nodes
