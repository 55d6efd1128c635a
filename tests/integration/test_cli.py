"""End-to-end tests of the command line: `python -m tilearray ...` in a subprocess."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr

from tilearray.testing import assert_close

pytestmark = pytest.mark.timeout(120)

JOB = ["--workers", "1", "--memory-per-worker", "1GiB", "--quiet"]


def cli(*args, cwd, timeout=100):
    """Run `python -m tilearray ARGS` in ``cwd``; returns the CompletedProcess."""
    return subprocess.run(
        [sys.executable, "-m", "tilearray", *map(str, args)],
        cwd=cwd, capture_output=True, text=True, timeout=timeout,
    )


def cli_here(*args, cwd, capsys, monkeypatch):
    """Like :func:`cli` but in this process: for the many cases that fail before
    any cluster starts (a subprocess would spend its time importing)."""
    from tilearray.cli import main

    monkeypatch.chdir(cwd)
    capsys.readouterr()
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, out, err)


def ok(proc):
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert "Traceback" not in proc.stderr
    return proc


def one_line_error(proc, code=1):
    """Exit ``code`` with exactly one `tilearray: error:` line and no traceback."""
    assert proc.returncode == code, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("tilearray: error: ")]
    assert len(errors) == 1, proc.stderr
    return errors[0]


def read(path):
    return zarr.open_array(str(path), mode="r")[...]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """a.zarr 300x200 (tile 64), b.zarr 200x150 (tile 64, shard 128), made by the CLI."""
    d = tmp_path_factory.mktemp("cli")
    ok(cli("random", "a.zarr", "--shape", 300, 200, "--tile", 64, 64, "--seed", 0, cwd=d))
    ok(cli("random", "b.zarr", "--shape", 200, 150, "--tile", 64, 64, "--shard", 128, 128,
           "--seed", 1, cwd=d))
    return d


@pytest.fixture
def work(data, tmp_path):
    """A fresh directory holding links to the module's inputs."""
    for name in ("a.zarr", "b.zarr"):
        (tmp_path / name).symlink_to(data / name, target_is_directory=True)
    return tmp_path


# -- random and info -----------------------------------------------------------------


def test_random_writes_reproducible_values(data, tmp_path):
    a = read(data / "a.zarr")
    assert a.shape == (300, 200) and a.dtype == np.float64
    assert 0.8 < a.std() < 1.2  # standard normal
    p = ok(cli("random", "again.zarr", "--shape", 300, 200, "--tile", 64, 64, "--seed", 0,
               cwd=tmp_path))
    assert "random (300, 200) float64" in p.stdout
    np.testing.assert_array_equal(read(tmp_path / "again.zarr"), a)
    ok(cli("random", "other.zarr", "--shape", 300, 200, "--tile", 64, 64, "--seed", 7,
           "--dtype", "float32", cwd=tmp_path))
    other = read(tmp_path / "other.zarr")
    assert other.dtype == np.float32 and not np.allclose(other, a)


def test_random_refuses_existing_output_unless_overwrite(work):
    before = read(work / "a.zarr")
    err = one_line_error(cli("random", "a.zarr", "--shape", 10, 10, "--tile", 8, 8, cwd=work))
    assert "already exists" in err and "--overwrite" in err
    np.testing.assert_array_equal(read(work / "a.zarr"), before)

    ok(cli("random", "c.zarr", "--shape", 20, 20, "--tile", 8, 8, cwd=work))
    ok(cli("random", "c.zarr", "--shape", 30, 10, "--tile", 8, 8, "--overwrite", cwd=work))
    assert read(work / "c.zarr").shape == (30, 10)


def test_info(data):
    p = ok(cli("info", "a.zarr", "b.zarr", cwd=data))
    out = p.stdout
    assert "<TiledArray" in out
    assert "shape:       300 x 200" in out and "shape:       200 x 150" in out
    assert "tile:        64 x 64" in out
    assert "I/O unit:    128 x 128 (shard of 2 x 2 tiles)" in out
    assert "5 x 4 tiles, 5 x 4 = 20 I/O units" in out
    assert "complete:    yes" in out

    p = ok(cli("info", "--json", "a.zarr", "b.zarr", cwd=data))
    a, b = (json.loads(line) for line in p.stdout.splitlines())
    assert a["shape"] == [300, 200] and a["dtype"] == "float64" and a["zarr_format"] == 3
    assert a["tile"] == a["io_unit"] == [64, 64] and not a["sharded"]
    assert a["tile_grid"] == [5, 4] and a["units"] == 20 and a["nbytes"] == 300 * 200 * 8
    assert a["complete"] and a["units_done"] == 20 and a["stored_bytes"] > 0
    assert b["io_unit"] == [128, 128] and b["sharded"] and b["unit_grid"] == [2, 2]


def test_info_reports_incomplete_output(tmp_path):
    from tilearray.storage import create

    # what an interrupted to_zarr leaves: never completed, with its expression's fingerprint
    create(tmp_path / "half.zarr", (100, 100), "float64", (50, 50),
           attributes={"tilearray": {"fingerprint": "f" * 32}})
    p = ok(cli("info", "half.zarr", cwd=tmp_path))
    assert "complete:    NO: 0 of 4 I/O units written" in p.stdout and "--resume" in p.stdout
    info = json.loads(ok(cli("info", "--json", "half.zarr", cwd=tmp_path)).stdout)
    assert info["complete"] is False and info["units_done"] == 0
    assert info["being_written_by"] is None
    # a live job holds its lock: said so (with the pid), not "rerun with --resume"
    import socket

    import psutil

    me = psutil.Process(os.getpid())
    lock = {"host": socket.gethostname(), "pid": me.pid, "started": me.create_time(),
            "taken": "2026-01-01T00:00:00.000+00:00", "token": "other-job", "what": "output"}
    (tmp_path / "half.zarr.tilearray.lock").write_text(json.dumps(lock))
    p = ok(cli("info", "half.zarr", cwd=tmp_path))
    assert f"NO: being written right now by pid {me.pid}" in p.stdout, p.stdout
    assert "--resume" not in p.stdout
    info = json.loads(ok(cli("info", "--json", "half.zarr", cwd=tmp_path)).stdout)
    assert f"pid {me.pid}" in info["being_written_by"]


def test_incomplete_random_output_is_not_said_resumable(tmp_path):
    """What an interrupted `tilearray random` leaves cannot be resumed (random has
    no --resume and to_zarr(resume=True) refuses it): say --overwrite instead."""
    from tilearray.storage import create

    create(tmp_path / "r.zarr", (100, 100), "float64", (50, 50))  # no fingerprint
    p = ok(cli("info", "r.zarr", cwd=tmp_path))
    status = next(ln for ln in p.stdout.splitlines() if "complete:" in ln)
    assert "NO: 0 of 4" in status and "--overwrite" in status and "--resume" not in status
    err = one_line_error(cli("reduce", "r.zarr", "--op", "sum", *JOB, cwd=tmp_path))
    assert "--overwrite" in err and "--resume" not in err, err


def test_info_missing_path_fails(tmp_path):
    err = one_line_error(cli("info", "nope.zarr", cwd=tmp_path))
    assert "nope.zarr" in err


def test_info_reports_every_path_when_one_is_missing(data):
    """`tilearray info a.zarr nope.zarr b.zarr` shows a and b, then fails on nope (as ls)."""
    p = cli("info", "a.zarr", "nope.zarr", "b.zarr", cwd=data)
    err = one_line_error(p)
    assert "nope.zarr" in err
    assert "path:        a.zarr" in p.stdout and "path:        b.zarr" in p.stdout


def test_info_on_a_group_names_its_arrays(tmp_path):
    import tilearray as ta

    ta.from_numpy(np.ones((4, 4)), tmp_path / "g.zarr", name="X", tile=(2, 2))
    ta.from_numpy(np.ones((4, 4)), tmp_path / "g.zarr", name="Y", tile=(2, 2))
    err = one_line_error(cli("info", "g.zarr", cwd=tmp_path))
    assert "is a Zarr group" in err and "its arrays: X, Y" in err, err


# -- plan ----------------------------------------------------------------------------


def test_plan_prints_without_running(data, capsys, monkeypatch):
    def here(*args):  # planning starts no cluster: in this process past the first
        return cli_here(*args, cwd=data, capsys=capsys, monkeypatch=monkeypatch)

    p = ok(cli("plan", "a.zarr @ b.zarr", "--memory-per-worker", "1GiB", "--workers", 2,
               cwd=data))
    assert p.stdout.startswith("tilearray plan: (open(")
    assert "-> (300, 150) float64" in p.stdout
    assert "2 worker(s) x 1 thread(s), 1.00 GiB per worker" in p.stdout
    assert "matmul" in p.stdout and "total:" in p.stdout and "I/O lower bound" in p.stdout

    p = ok(here("plan", "a.zarr.T @ a.zarr", "-o", "gram.zarr"))
    assert "-> (200, 200) float64 into" in p.stdout and "note" not in p.stderr
    # an existing output: planned, with a note that a job would refuse it (helper-49)
    p = ok(here("plan", "a.zarr.T @ a.zarr", "-o", "b.zarr"))
    assert "'b.zarr' already exists: a job writing it needs --overwrite" in p.stderr
    p = ok(here("plan", "a.zarr.T @ a.zarr", "-o", "gram.zarr", "--tile", 64, 64))
    assert "-> (200, 200) float64 into" in p.stdout
    # the output's layout without an output: bad usage, not silently ignored
    err = one_line_error(here("plan", "a.zarr.T @ a.zarr", "--tile", 64, 64), code=2)
    assert "--tile describes the output's layout: give the output with -o PATH" in err
    # axis=none as reduce --axis none
    assert ok(here("plan", "a.zarr.sum(axis=none)")).stdout == \
        ok(here("plan", "a.zarr.sum(axis=None)")).stdout
    assert not (data / "gram.zarr").exists()  # planning writes nothing

    p = ok(here("plan", "(a.zarr - 1) * 2 / a.zarr"))
    assert "-> (300, 200) float64" in p.stdout and "map" in p.stdout
    p = ok(here("plan", "- 'a.zarr'.T @ (a.zarr / 2)"))
    assert "-> (200, 200)" in p.stdout


def test_plan_accepts_reductions_as_the_python_api(data, capsys, monkeypatch):
    """The plan text of a reduction is the one the Python API gives."""
    import tilearray as ta

    a, b = ta.open(data / "a.zarr"), ta.open(data / "b.zarr")
    budget = ta.Budget.from_config("1GiB", 2, 1)
    for text, expr in [
        ("(a.zarr - a.zarr * 2).sum(axis=0)", (a - a * 2).sum(axis=0)),
        ("a.zarr.mean()", a.mean()),
        ("(a.zarr - a.zarr.mean(axis=0)).std(axis=0)", (a - a.mean(axis=0)).std(axis=0)),
        ("a.zarr.T.var(axis=1)", a.T.var(axis=1)),
        ("(b.zarr.T @ b.zarr).max(axis = 1)", (b.T @ b).max(axis=1)),
        ("a.zarr.sum(1) / 2", a.sum(axis=1) / 2),
    ]:
        p = ok(cli_here("plan", text, "--memory-per-worker", "1GiB", "--workers", 2, cwd=data,
                        capsys=capsys, monkeypatch=monkeypatch))
        want = str(expr.plan(budget=budget)).replace(str(data) + "/", "")
        assert p.stdout.replace(str(data) + "/", "").strip() == want.strip(), text


@pytest.mark.parametrize("expr", [
    "", "a.zarr @", "(a.zarr @ b.zarr", "a.zarr b.zarr", "a.zarr)", "2 + 3", ".T",
    "a.zarr @ 2", "'a.zarr", "__import__('os').system('true')", "a.zarr.sum(axis=x)",
    "3.sum()", "a.zarr.sum(", "a.zarr.sum(keepdims=True)",
])
def test_plan_bad_expression_is_usage_error(data, expr, capsys, monkeypatch):
    err = one_line_error(cli_here("plan", expr, cwd=data, capsys=capsys,
                                  monkeypatch=monkeypatch), code=2)
    assert "bad expression" in err or "no Zarr array" in err


@pytest.mark.parametrize("expr, method", [
    ("a.zarr.summ()", "summ"), ("a.zarr.argmax(axis=1)", "argmax"),
    ("(a.zarr @ b.zarr).mean(axis=0).sqrt()", "sqrt"), ("'a.zarr'.avg(axis=0)", "avg"),
])
def test_plan_unknown_method_is_named(data, expr, method, capsys, monkeypatch):
    """A typo in a reduction's name is a usage error naming the method and the
    ones the language has, not 'unexpected (' or a missing path."""
    err = one_line_error(cli_here("plan", expr, cwd=data, capsys=capsys,
                                  monkeypatch=monkeypatch), code=2)
    assert f"unknown method .{method}()" in err and ".sum()" in err, err


def test_stdout_closed_by_its_reader_is_not_an_error(data):
    """`tilearray plan ... | head -1`: the reader goes away; no error line, no
    traceback, the status of a command ended by SIGPIPE."""
    p = subprocess.Popen([sys.executable, "-m", "tilearray", "plan", "a.zarr @ b.zarr"],
                         cwd=data, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    p.stdout.close()  # before anything is printed
    err = p.stderr.read()
    assert p.wait(timeout=100) == 141, err
    assert err == "", err


def test_plan_expression_is_not_evaluated_as_python(data):
    # Everything that is not an operator is a path: no code runs.
    err = one_line_error(cli("plan", "open('a.zarr') @ b.zarr", cwd=data), code=2)
    assert "bad expression" in err


def test_plan_errors_from_tilearray_exit_1(data, capsys, monkeypatch):
    def here(*args):
        return cli_here(*args, cwd=data, capsys=capsys, monkeypatch=monkeypatch)

    err = one_line_error(here("plan", "a.zarr @ a.zarr"), code=2)  # bad usage
    assert "not aligned" in err and "(300, 200)" in err and "tilearray plan --help" in err
    err = one_line_error(here("plan", "nope.zarr @ b.zarr"))
    assert "nope.zarr" in err
    err = one_line_error(here("plan", "a.zarr*2"))
    assert "spaces around the operators" in err


# -- matmul --------------------------------------------------------------------------


def test_matmul_matches_numpy(work):
    p = ok(cli("matmul", "a.zarr", "b.zarr", "-o", "c.zarr", *JOB, cwd=work))
    a, b = read(work / "a.zarr"), read(work / "b.zarr")
    assert_close(read(work / "c.zarr"), a @ b)
    summary = p.stdout.strip().splitlines()
    assert len(summary) == 1
    assert summary[0].startswith("tilearray: matmul a.zarr @ b.zarr -> c.zarr (300, 150) float64")
    assert "| plan " in summary[0] and "task(s), peak/task" in summary[0]
    assert "| ran " in summary[0] and "tasks in" in summary[0] and "peak worker memory" in summary[0]
    assert "task/s" not in p.stderr  # --quiet: no progress bar (it counts tasks)
    info = json.loads(ok(cli("info", "--json", "c.zarr", cwd=work)).stdout)
    assert info["complete"] and "@" in info["expression"]


def test_matmul_transposes_and_output_layout(work):
    a, b = read(work / "a.zarr"), read(work / "b.zarr")
    ok(cli("matmul", "a.zarr", "a.zarr", "--transpose-a", "-o", "gram.zarr",
           "--tile", 32, 32, "--shard", 64, 64, *JOB, cwd=work))
    assert_close(read(work / "gram.zarr"), a.T @ a)
    info = json.loads(ok(cli("info", "--json", "gram.zarr", cwd=work)).stdout)
    assert info["tile"] == [32, 32] and info["io_unit"] == [64, 64]

    ok(cli("matmul", "b.zarr", "b.zarr", "--transpose-b", "-o", "bbt.zarr", *JOB, cwd=work))
    assert_close(read(work / "bbt.zarr"), b @ b.T)


def test_matmul_existing_output_overwrite_and_resume(work, remote):
    ok(cli("matmul", "a.zarr", "b.zarr", "-o", "c.zarr", *remote, cwd=work))
    err = one_line_error(cli("matmul", "a.zarr", "b.zarr", "-o", "c.zarr", *remote, cwd=work))
    assert "already exists" in err and "--overwrite" in err and "--resume" in err

    p = ok(cli("matmul", "a.zarr", "b.zarr", "-o", "c.zarr", "--resume", *remote, cwd=work))
    assert "already complete" in p.stdout

    # a different job into the same output cannot be resumed into it
    err = one_line_error(cli("matmul", "b.zarr", "b.zarr", "--transpose-b", "-o", "c.zarr",
                             "--resume", *remote, cwd=work))
    assert "cannot resume" in err

    ok(cli("matmul", "b.zarr", "b.zarr", "--transpose-b", "-o", "c.zarr", "--overwrite", *remote,
           cwd=work))
    b = read(work / "b.zarr")
    assert_close(read(work / "c.zarr"), b @ b.T)


def test_matmul_mismatched_shapes_fails_with_one_line(work):
    p = cli("matmul", "a.zarr", "a.zarr", "-o", "bad.zarr", *JOB, cwd=work)
    err = one_line_error(p, code=2)  # bad usage, as the command's other argument errors
    assert "not aligned" in err and "(300, 200)" in err
    assert p.stderr.strip() == err  # nothing else: it fails before any cluster starts
    assert not (work / "bad.zarr").exists()


def test_debug_shows_the_traceback(work):
    p = cli("matmul", "a.zarr", "a.zarr", "-o", "bad.zarr", "--debug", *JOB, cwd=work)
    assert p.returncode == 2
    assert "Traceback" in p.stderr and "PlanningArgumentError" in p.stderr
    assert p.stderr.strip().splitlines()[-1].startswith("tilearray: error: matmul: shapes")


def test_matmul_missing_input_fails(work):
    err = one_line_error(cli("matmul", "a.zarr", "missing.zarr", "-o", "c.zarr", *JOB,
                             cwd=work))
    assert "missing.zarr" in err and "does not exist" in err


def test_failure_while_running_exits_1_and_leaves_output_incomplete(data, tmp_path):
    shutil.copytree(data / "a.zarr", tmp_path / "bad.zarr")
    chunk = tmp_path / "bad.zarr" / "c" / "1" / "1"
    assert chunk.is_file()
    raw = bytearray(chunk.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # flip bits: the crc32c check must catch it
    chunk.write_bytes(bytes(raw))
    os.symlink(data / "b.zarr", tmp_path / "b.zarr", target_is_directory=True)
    err = one_line_error(cli("matmul", "bad.zarr", "b.zarr", "-o", "c.zarr", *JOB,
                             cwd=tmp_path))
    assert "bad.zarr" in err
    info = json.loads(ok(cli("info", "--json", "c.zarr", cwd=tmp_path)).stdout)
    assert info["complete"] is False


# -- reduce --------------------------------------------------------------------------


def test_reduce_to_zarr_matches_numpy(work, remote):
    a = read(work / "a.zarr")
    p = ok(cli("reduce", "a.zarr", "--op", "mean", "--axis", 0, "-o", "m.zarr", *remote,
               cwd=work))
    assert p.stdout.startswith("tilearray: mean(axis=0) of a.zarr -> m.zarr (200,) float64")
    assert_close(read(work / "m.zarr"), a.mean(axis=0))

    ok(cli("reduce", "a.zarr", "--op", "std", "--axis", 1, "--ddof", 1, "-o", "s.zarr", *remote,
           cwd=work))
    assert_close(read(work / "s.zarr"), a.std(axis=1, ddof=1))

    err = one_line_error(cli("reduce", "a.zarr", "--op", "sum", "-o", "m.zarr", *remote,
                             cwd=work))
    assert "already exists" in err
    ok(cli("reduce", "a.zarr", "--op", "max", "--axis", "none", "-o", "m.zarr", "--overwrite",
           *remote, cwd=work))
    assert read(work / "m.zarr") == pytest.approx(a.max())


def test_reduce_summary_plan_is_the_plan_of_the_write(work, remote):
    """With -o the summary's plan is the plan of what runs (the write included):
    its task count is the run's, as the README promises for every expression."""
    p = ok(cli("reduce", "a.zarr", "--op", "mean", "--axis", 0, "-o", "m.zarr", *remote,
               cwd=work))
    planned = int(p.stdout.split("| plan ")[1].split(" task(s)")[0])
    ran = int(p.stdout.split("| ran ")[1].split(" tasks")[0])
    assert planned == ran, p.stdout
    assert "write" in p.stdout.split("| plan ")[1].split("|")[0], p.stdout


def test_reduce_prints_values(work, remote):
    a = read(work / "a.zarr")
    p = ok(cli("reduce", "a.zarr", "--op", "sum", *remote, cwd=work))
    assert float(p.stdout) == pytest.approx(a.sum(), rel=1e-12)
    assert "tilearray: sum(axis=none) of a.zarr" in p.stderr  # summary off stdout

    p = ok(cli("reduce", "a.zarr", "--op", "norm", "--axis", 1, *remote, cwd=work))
    values = np.array([float(v) for v in p.stdout.split()])
    assert_close(values, np.linalg.norm(a, axis=1))

    p = ok(cli("reduce", "a.zarr", "--op", "argmax", "--axis", 0, *remote, cwd=work))
    assert [int(v) for v in p.stdout.split()] == list(a.argmax(axis=0))


# -- usage ---------------------------------------------------------------------------


@pytest.mark.parametrize("args", [
    [],
    ["bogus"],
    ["matmul", "a.zarr", "b.zarr"],                                   # no -o
    ["reduce", "a.zarr", "--op", "median"],
    ["reduce", "a.zarr", "--op", "sum", "--axis", "2"],
    ["reduce", "a.zarr", "--op", "sum", "--ddof", "1"],
    ["matmul", "a.zarr", "b.zarr", "-o", "x.zarr", "--memory-per-worker", "lots"],
    ["matmul", "a.zarr", "b.zarr", "-o", "x.zarr", "--workers", "0"],
    ["matmul", "a.zarr", "b.zarr", "-o", "x.zarr", "--resume", "--overwrite"],
    ["matmul", "a.zarr", "b.zarr", "-o", "a.zarr", "--overwrite"],   # output is an input
    ["matmul", "b.zarr", "a.zarr", "-o", "x.zarr"],                  # 150 != 300
    ["plan", "a.zarr @ a.zarr"],                                      # 200 != 300
    ["plan", "a.zarr + b.zarr"],                                      # shapes do not broadcast
    ["plan", "a.zarr.sum(axis=2)"],                                   # no such axis (was 1)
    ["matmul", "a.zarr", "b.zarr", "-o", "x.zarr", "--mpi", "--workers", "2"],
    ["random", "r.zarr", "--shape", "10", "-1"],
    ["random", "r.zarr", "--shape", "10", "10", "--dtype", "nope"],
    ["random", "r.zarr", "--shape", "10", "10", "--dtype", "complex128"],  # unsupported
    ["random", "r.zarr", "--shape", "10", "10", "--dtype", "str"],
    ["random", "r.zarr"],                                             # no --shape
    ["info"],
])
def test_bad_usage_exits_2(work, args, capsys, monkeypatch):
    p = cli_here(*args, cwd=work, capsys=capsys, monkeypatch=monkeypatch)
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr
    assert "error:" in p.stderr.strip().splitlines()[-1]
    assert not (work / "x.zarr").exists() and not (work / "r.zarr").exists()
    assert read(work / "a.zarr").shape == (300, 200)  # the input survived


def test_help_and_version(tmp_path, capsys, monkeypatch):
    def here(*args):  # the console script itself: test_console_script
        return cli_here(*args, cwd=tmp_path, capsys=capsys, monkeypatch=monkeypatch)

    p = ok(here("--help"))
    for cmd in ("info", "random", "plan", "matmul", "reduce"):
        assert cmd in p.stdout
    p = ok(here("matmul", "--help"))
    assert "--memory-per-worker" in p.stdout and "--scheduler-address" in p.stdout
    assert "tilearray" in ok(here("--version")).stdout


def test_console_script(tmp_path):
    script = Path(sys.executable).parent / "tilearray"
    if not script.exists():
        pytest.skip("console script not installed in this environment")
    p = subprocess.run([str(script), "--version"], capture_output=True, text=True,
                       timeout=60, cwd=tmp_path)
    assert p.returncode == 0 and "tilearray" in p.stdout
    p = subprocess.run([str(script), "info", "nope.zarr"], capture_output=True, text=True,
                       timeout=60, cwd=tmp_path)
    assert p.returncode == 1 and p.stderr.startswith("tilearray: error: ")


def test_existing_scheduler(work, remote):
    p = ok(cli("matmul", "a.zarr", "b.zarr", "-o", "c.zarr", *remote, cwd=work))
    assert "| ran " in p.stdout
    a, b = read(work / "a.zarr"), read(work / "b.zarr")
    assert_close(read(work / "c.zarr"), a @ b)
    err = one_line_error(cli("reduce", "a.zarr", "--op", "sum", "--quiet",
                             "--scheduler-address", "tcp://127.0.0.1:1",
                             "--connect-timeout", 2, cwd=work))
    assert "could not connect" in err


def test_mpi_flag_uses_engine_mpi_and_exits_quietly_off_the_client_rank(work, monkeypatch,
                                                                         capsys):
    """In-process, with Engine.mpi faked: under mpirun only the client rank runs
    the job; on scheduler and worker ranks Engine.mpi() returns None."""
    import tilearray as ta
    from tilearray.cli import main

    calls = []

    def not_the_client(cls, **kwargs):
        calls.append(kwargs)
        return None

    monkeypatch.setattr(ta.Engine, "mpi", classmethod(not_the_client))
    out = work / "c.zarr"
    args = ["matmul", str(work / "a.zarr"), str(work / "b.zarr"), "-o", str(out), "--mpi",
            "--memory-per-worker", "1GiB", "--quiet"]
    assert main(args) == 0
    assert calls == [{"memory_per_worker": 2**30, "quiet": True}]
    assert not out.exists()
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""

    def the_client(cls, **kwargs):
        calls.append(kwargs)
        return ta.Engine(n_workers=1, threads_per_worker=1, memory_per_worker="1GiB",
                         processes=False, quiet=True)

    monkeypatch.setattr(ta.Engine, "mpi", classmethod(the_client))
    assert main([*args, "--threads-per-worker", "1"]) == 0
    assert calls[-1] == {"memory_per_worker": 2**30, "threads_per_worker": 1, "quiet": True}
    a, b = read(work / "a.zarr"), read(work / "b.zarr")
    assert_close(read(out), a @ b)
    assert capsys.readouterr().out.startswith("tilearray: matmul ")


@pytest.mark.mpi
def test_mpi_matmul_under_the_launcher(work):
    """`--mpi` for real: 3 ranks (scheduler, client, one worker) via tilearray's launcher."""
    pytest.importorskip("mpi4py")
    pytest.importorskip("dask_mpi")
    def mpi(*args):
        cmd = [sys.executable, "-m", "tilearray.engine.mpi", "-n", "3", "--timeout", "100",
               "--", sys.executable, "-m", "tilearray", *args, "--mpi",
               "--memory-per-worker", "1GiB", "--quiet"]
        return subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=110)

    p = mpi("matmul", "a.zarr", "b.zarr", "-o", "c.zarr")
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("tilearray: matmul a.zarr @ b.zarr -> c.zarr") == 1  # client rank only
    a, b = read(work / "a.zarr"), read(work / "b.zarr")
    assert_close(read(work / "c.zarr"), a @ b)

    # bad input: every rank fails the same check before booting the cluster, and exits 1
    p = mpi("reduce", "missing.zarr", "--op", "sum")
    assert p.returncode == 1, p.stderr
    assert "Traceback" not in p.stderr and "missing.zarr" in p.stderr


# -- scheduler address, non-2-D arrays in info, reduce --resume -----------------------------


def test_info_bad_scheduler_address_fails_at_once(tmp_path):
    import time

    for args, code, words in (
        (["--scheduler-address", "notanaddr"], 2, "missing port"),
        (["--scheduler-address", "foo://host:1"], 2, "unknown scheme"),
        (["--scheduler-address", "tcp://127.0.0.1:1"], 1, "connection refused"),
    ):
        start = time.monotonic()
        p = cli("info", *args, cwd=tmp_path, timeout=40)
        elapsed = time.monotonic() - start
        err = one_line_error(p, code)  # one line; no Client.__del__ traceback after it
        assert words in err and args[1] in err, err
        assert elapsed < 20, f"{args}: took {elapsed:.0f} s"


def test_bad_scheduler_address_is_usage_error_for_jobs(work, capsys, monkeypatch):
    p = cli_here("reduce", "a.zarr", "--op", "sum", "--scheduler-address", "host:99999",
                 cwd=work, capsys=capsys, monkeypatch=monkeypatch)
    assert "port between 1 and 65535" in one_line_error(p, 2)


def test_info_describes_1d_and_0d_arrays(tmp_path, capsys, monkeypatch):
    g = zarr.open_group(tmp_path / "r.zarr", mode="w")
    g.create_array("colmean", data=np.arange(7.0), chunks=(4,),
                   attributes={"tilearray": {"format": 1, "complete": True,
                                             "expression": "x.mean(axis=0)"}})
    zarr.create_array(tmp_path / "s.zarr", data=np.array(3.5))
    p = cli_here("info", "r.zarr/colmean", "s.zarr", cwd=tmp_path, capsys=capsys,
                 monkeypatch=monkeypatch)
    ok(p)
    assert "1-D Zarr array" in p.stdout and "0-D Zarr array" in p.stdout
    assert "shape:       7\n" in p.stdout and "chunks:      4\n" in p.stdout
    assert "complete:    yes" in p.stdout and "expression:  x.mean(axis=0)" in p.stdout
    assert "zarr.open_array(" in p.stdout
    p = ok(cli_here("info", "--json", "r.zarr/colmean", "s.zarr", cwd=tmp_path, capsys=capsys,
                    monkeypatch=monkeypatch))
    m, s = (json.loads(line) for line in p.stdout.splitlines())
    assert m["shape"] == [7] and m["chunks"] == [4] and m["dtype"] == "float64"
    assert m["complete"] is True and m["tilearray_output"] is True
    assert s["shape"] == [] and s["tilearray_output"] is False and s["complete"] is True


def test_reduce_resume_keeps_a_complete_output(work, remote):
    a = read(work / "a.zarr")
    ok(cli("reduce", "a.zarr", "--op", "mean", "--axis", 0, "-o", "m.zarr", *remote, cwd=work))
    p = ok(cli("reduce", "a.zarr", "--op", "mean", "--axis", 0, "-o", "m.zarr", "--resume",
               *remote, cwd=work))
    assert "already complete" in p.stdout
    assert_close(read(work / "m.zarr"), a.mean(axis=0))
    err = one_line_error(cli("reduce", "a.zarr", "--op", "sum", "--axis", 0, "-o", "m.zarr",
                             "--resume", *remote, cwd=work))
    assert "cannot resume" in err


@pytest.mark.parametrize("cmd", ["matmul", "random", "reduce"])
def test_existing_output_being_written_names_the_writer(tmp_path, capsys, monkeypatch, cmd):
    """A plain rerun while another live job writes the output says so and names
    it (OutputLockedError), not "already exists; pass --overwrite" (found: a
    second `tilearray matmul` started while the first was writing); an
    unfinished output left by a stopped job says it is unfinished."""
    import socket

    import psutil

    import tilearray as ta
    from tilearray.storage import create

    ta.from_numpy(np.ones((8, 8)), tmp_path / "a.zarr", tile=(4, 4))
    out, name = tmp_path / "g.zarr", "C"
    create(str(out), (8, 8), "f8", (4, 4), path=name)  # incomplete (output=True)
    args = {"matmul": ["matmul", "a.zarr", "a.zarr", "-o", "g.zarr"],
            "random": ["random", "g.zarr", "--shape", 8, 8],
            "reduce": ["reduce", "a.zarr", "--op", "sum", "--axis", 0, "-o", "g.zarr"]}[cmd]
    args += ["--name", name]
    p = cli_here(*args, cwd=tmp_path, capsys=capsys, monkeypatch=monkeypatch)
    err = one_line_error(p)
    assert "already exists (an unfinished output" in err and "--overwrite" in err, err

    me = psutil.Process(os.getpid())  # a live holder that is not this job's own lock
    lock = {"host": socket.gethostname(), "pid": me.pid, "started": me.create_time(),
            "taken": "2026-01-01T00:00:00.000+00:00", "token": "other-job", "what": "output"}
    (out / f"{name}.tilearray.lock").write_text(json.dumps(lock))
    p = cli_here(*args, cwd=tmp_path, capsys=capsys, monkeypatch=monkeypatch)
    err = one_line_error(p)
    assert "is being written by another job" in err and f"pid {me.pid}" in err, err
    assert "C.tilearray.lock" in err


def test_ctrl_c_presses_during_cleanup_and_ignored_signals(capsys):
    """The first Ctrl-C interrupts; a second during the cleanup is noted and
    ignored (it interrupted the cleanup: a 10 s stall); one long after the
    first interrupts again. A signal the parent ignored (a shell's background
    job) stays ignored."""
    import importlib
    import signal
    import threading
    import time

    cli_main = importlib.import_module("tilearray.cli.main")  # the module, not main()

    def press():
        # to the main thread, where Python runs handlers, then a moment for the
        # handler to run inside press() (os.kill may land on another thread of
        # this process, and the main thread see it only after the with-block)
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
        for _ in range(100):
            time.sleep(0.002)

    # Python's own handler, as a terminal leaves it: pytest run as a background
    # job (`make test &` from a script) inherits SIGINT ignored, which _signals keeps
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with cli_main._signals():
            with pytest.raises(KeyboardInterrupt):
                press()
            press()  # during the cleanup: a note, no exception
            assert "press Ctrl-C again to exit at once" in capsys.readouterr().err
            old = cli_main.CLEANUP_SECONDS
            cli_main.CLEANUP_SECONDS = 0.0
            try:
                with pytest.raises(KeyboardInterrupt):  # long after: the first was lost
                    press()
            finally:
                cli_main.CLEANUP_SECONDS = old
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        with cli_main._signals():
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            press()  # ignored, as before
    finally:
        signal.signal(signal.SIGINT, inherited)


@pytest.mark.parametrize("signals", [("SIGTERM",)])
def test_sigterm_stops_a_job_cleanly(tmp_path, signals):
    """SIGTERM (a batch time limit) stops a job as Ctrl-C does: one line,
    exit 143, the lock released, resumable (it exited silently, leaving the
    lock)."""
    import signal
    import time

    import tilearray as ta

    ta.random((4000, 3000), tmp_path / "A.zarr", tile=(500, 500), seed=1)
    ta.random((3000, 3000), tmp_path / "B.zarr", tile=(500, 500), seed=2)
    p = subprocess.Popen([sys.executable, "-m", "tilearray", "matmul", "A.zarr", "B.zarr", "-o",
                          "C.zarr", "--workers", "2", "--memory-per-worker", "200MiB",
                          "--quiet"], cwd=tmp_path, stderr=subprocess.PIPE, text=True)
    done = tmp_path / "C.zarr" / "tilearray.done"
    deadline = time.monotonic() + 90
    while not (done.is_dir() and any(done.iterdir())) and time.monotonic() < deadline:
        time.sleep(0.01)
    for name in signals:
        p.send_signal(getattr(signal, name))
        time.sleep(0.2)
    err = p.communicate(timeout=60)[1]
    term = signals[0] == "SIGTERM"
    assert p.returncode == (143 if term else 130), err
    assert f"tilearray: error: {'terminated (SIGTERM)' if term else 'interrupted'}" in err, err
    assert "Traceback" not in err
    if not term:
        assert "press Ctrl-C again to exit at once" in err
    assert not (tmp_path / "C.zarr.tilearray.lock").exists()  # free for a --resume
    info = json.loads(ok(cli("info", "--json", "C.zarr", cwd=tmp_path)).stdout)
    assert info["complete"] is False and info["being_written_by"] is None
