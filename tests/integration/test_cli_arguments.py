"""Command-line arguments: values the help shows are accepted, bad ones get
one message that names the flag and the value, and errors speak CLI flags
(``--overwrite``, ``--name``), not Python arguments."""

import subprocess
import sys

import numpy as np
import pytest
import zarr

import tilearray as ta
from tilearray.testing import assert_close

pytestmark = pytest.mark.timeout(150)

def cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "tilearray", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def here(*args, cwd, capsys, monkeypatch):
    """In this process, for cases refused before any cluster starts."""
    from tilearray.cli import main

    monkeypatch.chdir(cwd)
    capsys.readouterr()
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, out, err)


def error_line(p) -> str:
    assert "Traceback" not in p.stderr, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if "error:" in ln]
    assert len(lines) == 1, p.stderr
    return lines[0]


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    d = tmp_path_factory.mktemp("cliargs")
    rng = np.random.default_rng(5)
    ta.from_numpy(rng.standard_normal((40, 30)), d / "a.zarr", tile=(16, 16))
    zarr.open_group(str(d / "grp.zarr"), mode="w")
    return d


ORDS = ["-inf", "inf", "-1", "1", "fro", "nuc", "2", "-2"]  # nuc was refused (helper-46)


@pytest.mark.parametrize("ord_", ORDS)
def test_reduce_norm_takes_every_ord_the_help_shows(work, remote, ord_):
    """Each order on a running scheduler (``remote``: the command's behaviour,
    not the embedded cluster's start-up, which test_cli.py covers)."""
    p = cli("reduce", "a.zarr", "--op", "norm", "--ord", ord_, *remote, cwd=work)
    assert p.returncode == 0, p.stderr
    a = zarr.open_array(str(work / "a.zarr"))[...]
    want = np.linalg.norm(a, ord=None if ord_ == "fro" else ord_ if ord_ == "nuc" else
                          float(ord_))
    assert_close(np.array(float(p.stdout)), np.array(want))
    assert f"norm(axis=none, ord={ord_}) of a.zarr" in p.stderr, p.stderr  # which norm (helper-49)


def test_reduce_help_shows_every_ord(work):
    shown = cli("reduce", "--help", cwd=work).stdout
    assert all(ord_ in shown for ord_ in ORDS), shown


@pytest.mark.parametrize("value", ["0", "-2", "x"])
def test_workers_messages_agree(work, value, capsys, monkeypatch):
    p = here("reduce", "a.zarr", "--op", "sum", "--workers", value, cwd=work, capsys=capsys,
             monkeypatch=monkeypatch)
    assert p.returncode == 2
    assert (f"argument --workers: must be a positive integer (1 or more), got {value!r}"
            in error_line(p))


@pytest.mark.parametrize("flag, value, said", [
    ("--memory-per-worker", "-1GiB", "must be positive, got '-1GiB' (use e.g. 1GiB, 512MiB, 2e9)"),
    ("--memory-per-worker", "-5", "must be positive, got '-5' (use e.g. 1GiB, 512MiB, 2e9)"),
    ("--memory-per-worker", "-.5GiB", "must be positive, got '-.5GiB' (use e.g. 1GiB, 512MiB, "
                                      "2e9)"),
    ("--workers", "-2", "must be a positive integer (1 or more), got '-2'"),
    ("--threads-per-worker", "-1", "must be a positive integer (1 or more), got '-1'"),
])
@pytest.mark.parametrize("joined", [False, True])
def test_negative_values_after_a_space_are_the_value(work, capsys, monkeypatch, flag, value,
                                                     said, joined):
    """Issue 30: `--memory-per-worker -1GiB` gave argparse's "expected one
    argument" instead of the range error that `--memory-per-worker=-1GiB` gives."""
    args = [f"{flag}={value}"] if joined else [flag, value]
    p = here("reduce", "a.zarr", "--op", "sum", *args, cwd=work, capsys=capsys,
             monkeypatch=monkeypatch)
    assert p.returncode == 2
    line = error_line(p)
    assert line == f"tilearray reduce: error: argument {flag}: {said}", line
    assert "expected one argument" not in p.stderr


def test_negative_looking_values_are_joined_only_after_options_that_take_one():
    from tilearray.cli.main import build_parser
    from tilearray.cli.options import join_option_values, value_options

    takes = value_options(build_parser())
    assert {"--memory-per-worker", "--workers", "--ord", "--seed"} <= takes
    assert "--quiet" not in takes and "--overwrite" not in takes
    assert "--shape" not in takes and "--tile" not in takes  # two values: argparse's own
    assert join_option_values(["--memory-per-worker", "-1GiB", "--quiet"], takes) == \
        ["--memory-per-worker=-1GiB", "--quiet"]
    assert join_option_values(["--ord", "-inf"], takes) == ["--ord=-inf"]
    # a flag without a value, an option before another option, "--": untouched
    assert join_option_values(["--quiet", "-1"], takes) == ["--quiet", "-1"]
    assert join_option_values(["--name", "--quiet"], takes) == ["--name", "--quiet"]
    assert join_option_values(["--name", "--", "-1"], takes) == ["--name", "--", "-1"]


@pytest.mark.parametrize("args, flag, said", [
    (["--shape", -5, 3], "--shape", "must be a non-negative integer (0 or more), got '-5'"),
    (["--shape", 5, 3, "--tile", -1, 2], "--tile", "must be a positive integer (1 or more), "
     "got '-1'"),
    (["--shape", 5, 3, "--tile", 1, 1, "--shard", 2, -2], "--shard",
     "must be a positive integer (1 or more), got '-2'"),
])
def test_negative_first_of_two_values_is_named(work, capsys, monkeypatch, args, flag, said):
    """helper-48: `--shape -5 3` said "expected 2 arguments" (the -5 was
    joined to the option as for one-value options), where `--shape 5 -3`
    named the value."""
    p = here("random", "r.zarr", *args, cwd=work, capsys=capsys, monkeypatch=monkeypatch)
    assert p.returncode == 2
    assert error_line(p) == f"tilearray random: error: argument {flag}: {said}", error_line(p)
    assert not (work / "r.zarr").exists()


def test_plan_of_an_expression_starting_with_minus(work, capsys, monkeypatch):
    """`tilearray plan "- a.zarr"` had said "the following arguments are
    required: EXPR" (argparse took the expression for an option)."""
    for expr, args in [("- a.zarr", ()), ("-1 * a.zarr", ("-q",)),
                       ("- a.zarr", ("--memory-per-worker", "1GiB"))]:
        p = here("plan", expr, *args, cwd=work, capsys=capsys, monkeypatch=monkeypatch)
        assert p.returncode == 0, p.stderr
        assert "negative(open(" in p.stdout or "* open(" in p.stdout, p.stdout
    p = here("plan", "-a.zarr", cwd=work, capsys=capsys, monkeypatch=monkeypatch)
    assert p.returncode == 1 and "put spaces around the operators" in error_line(p)
    # options keep their meaning, a negative value after one is its value
    p = here("plan", "- a.zarr", "--memory-per-worker", "-1GiB", cwd=work, capsys=capsys,
             monkeypatch=monkeypatch)
    assert p.returncode == 2 and "--memory-per-worker: must be positive" in error_line(p)


def test_a_misspelt_option_is_named_before_a_missing_required_one(work, capsys, monkeypatch):
    """helper-49: `--outptu q.zarr` read "the following arguments are
    required: -o/--output", never naming the typo. Abbreviations argparse
    accepts stay accepted."""
    p = here("matmul", "a.zarr", "a.zarr", "--outptu", "q.zarr", cwd=work, capsys=capsys,
             monkeypatch=monkeypatch)
    assert p.returncode == 2
    assert error_line(p) == "tilearray matmul: error: unrecognized arguments: --outptu"
    p = here("plan", "a.zarr", "--mem=1GiB", cwd=work, capsys=capsys, monkeypatch=monkeypatch)
    assert p.returncode == 0 and "1.00 GiB per worker" in p.stdout, p.stderr
    p = here("bogus", "--x", cwd=work, capsys=capsys, monkeypatch=monkeypatch)
    assert p.returncode == 2 and "invalid choice: 'bogus'" in error_line(p)
    assert not (work / "q.zarr").exists()


def test_random_negative_seed_is_usage_and_writes_nothing(work, capsys, monkeypatch):
    p = here("random", "r.zarr", "--shape", 4, 4, "--seed", -1, cwd=work, capsys=capsys,
             monkeypatch=monkeypatch)
    assert p.returncode == 2
    assert "--seed" in error_line(p) and "'-1'" in error_line(p)
    assert not (work / "r.zarr").exists()


def test_memory_below_a_worker_is_refused_before_starting(work, capsys, monkeypatch):
    import distributed

    monkeypatch.setattr(distributed, "LocalCluster", None)  # would fail if reached
    p = here("reduce", "a.zarr", "--op", "sum", "--memory-per-worker", "64MiB", cwd=work,
             capsys=capsys, monkeypatch=monkeypatch)
    assert p.returncode == 2
    line = error_line(p)
    need = ta.Budget.from_config("1GiB", 1, 1).minimum_memory_per_worker // 2**20
    assert "--memory-per-worker" in line and f"--memory-per-worker {need}MiB" in line
    assert "memory_per_worker" not in line


def test_errors_speak_cli_flags(work, remote):
    # a group at the target: the library says name=, the CLI says --name
    p = cli("random", "grp.zarr", "--shape", 4, 4, "--overwrite", cwd=work)
    assert p.returncode == 1
    line = error_line(p)
    assert "--name" in line and "name=" not in line
    # a resume that does not match: overwrite=True becomes --overwrite
    assert cli("reduce", "a.zarr", "--op", "sum", "--axis", 0, "-o", "s.zarr", *remote,
               cwd=work).returncode == 0
    p = cli("reduce", "a.zarr", "--op", "mean", "--axis", 0, "-o", "s.zarr", "--resume", *remote,
            cwd=work)
    assert p.returncode == 1
    line = error_line(p)
    assert "--overwrite" in line and "overwrite=True" not in line


def test_cli_words_translation():
    from tilearray.cli import cli_words as _cli_words

    assert _cli_words("pass overwrite=True to replace it (or resume=True to ...)") == \
        "pass --overwrite to replace it (or --resume to ...)"
    assert _cli_words("Rerun the same expression with to_zarr(..., resume=True) to finish it, "
                      "or open it with allow_incomplete=True to inspect it.") == \
        "Rerun the same expression with --resume to finish it, or inspect it with " \
        "'tilearray info'."
    assert _cli_words('pass memory_per_worker="202MiB" or more') == \
        "pass --memory-per-worker 202MiB or more"
    assert _cli_words("pass name= to write a member") == "pass --name to write a member"


def test_name_writes_members_of_the_output_group(work, remote):
    a = zarr.open_array(str(work / "a.zarr"))[...]
    p = cli("matmul", "a.zarr", "a.zarr", "--transpose-a", "-o", "grp.zarr", "--name", "G",
            *remote, cwd=work)
    assert p.returncode == 0, p.stderr
    assert "grp.zarr/G" in p.stdout
    assert_close(zarr.open_array(str(work / "grp.zarr"), path="G")[...], a.T @ a)
    p = cli("reduce", "a.zarr", "--op", "mean", "--axis", 0, "-o", "grp.zarr", "--name", "m",
            *remote, cwd=work)
    assert p.returncode == 0, p.stderr
    assert_close(zarr.open_array(str(work / "grp.zarr"), path="m")[...], a.mean(axis=0))
    p = cli("matmul", "a.zarr", "a.zarr", "--transpose-a", "-o", "grp.zarr", "--name", "G",
            *remote, cwd=work)
    assert p.returncode == 1 and "grp.zarr/G' already exists" in error_line(p)
    assert "--overwrite" in error_line(p)


def test_bad_flag_values_are_usage_errors_in_cli_words(work, capsys, monkeypatch):
    """A tile that does not divide the shard, a bad member name: exit 2 (bad
    usage) with the flags' spelling (it was 1, and 'tile=(75, 75)'); an
    option the subcommand lacks gets the subcommand's usage; a group given
    for an array names the CLI form of a member."""
    p = here("matmul", "a.zarr", "a.zarr", "--transpose-a", "-o", "x.zarr", "--tile", 16, 16,
             "--shard", 24, 24, cwd=work, capsys=capsys, monkeypatch=monkeypatch)
    assert p.returncode == 2 and "e.g. --tile 12 12" in error_line(p), p.stderr
    p = here("random", "r.zarr", "--shape", 10, 10, "--name", "../x", cwd=work, capsys=capsys,
             monkeypatch=monkeypatch)
    assert p.returncode == 2 and "'..'" in error_line(p)
    p = here("random", "r.zarr", "--shape", 10, 10, "--resume", cwd=work, capsys=capsys,
             monkeypatch=monkeypatch)
    assert p.returncode == 2 and "usage: tilearray random" in p.stderr
    assert "unrecognized arguments: --resume" in p.stderr
    assert not (work / "r.zarr").exists()
    p = here("info", "grp.zarr", cwd=work, capsys=capsys, monkeypatch=monkeypatch)
    assert "GROUP.zarr/NAME" in p.stderr and "ta.open" not in p.stderr
    p = here("--help", cwd=work, capsys=capsys, monkeypatch=monkeypatch)
    assert p.returncode == 0 and "tilearray mpirun -n N -- script.py" in p.stdout


def test_launcher_needs_three_ranks_before_starting_mpi(tmp_path):
    (tmp_path / "job.py").write_text("print('ran')\n")
    p = subprocess.run([sys.executable, "-m", "tilearray.engine.mpi", "-n", "2", "--", "job.py"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "-n must be at least 3" in p.stderr and "ran" not in p.stdout


def test_invalid_norm_order_is_a_usage_error(tmp_path):
    """``reduce --op norm --ord 3`` is bad usage (exit 2, the command's help
    named), as an unknown option is; it exited 1, "job failed"."""
    ta.from_numpy(np.ones((6, 5)), tmp_path / "a.zarr", tile=(4, 4))
    r = subprocess.run([sys.executable, "-m", "tilearray", "reduce", str(tmp_path / "a.zarr"),
                        "--op", "norm", "--ord", "3"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2, r.stderr
    assert "invalid norm order 3" in r.stderr and "tilearray reduce --help" in r.stderr
