"""Fault injection: 8 randomised runs of every fault kind (tests/stress/fault_matrix.py;
``make stress`` runs more, on a bigger job). The seed is printed and in every
failure message, so a failing run can be replayed with ``--seed``."""

import os
import random
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "stress"))
import fault_matrix  # noqa: E402

RUNS = 8
#: Every kind, worker SIGKILLs included: their hang (a LocalCluster left with
#: no nannies) was distributed's lost-worker timer, fixed in
#: tilearray.engine.runtime.local (see the README's fault-injection section).
KINDS = fault_matrix.KINDS


@pytest.mark.timeout(900)
def test_every_fault_kind_survives_or_fails_clearly(tmp_path):
    seed = random.randrange(2**31)
    print(f"fault matrix seed {seed}")
    tallies = fault_matrix.run_matrix(str(tmp_path), RUNS, seed, KINDS)
    table = fault_matrix.table(tallies)
    print(table)
    why = f"seed {seed}\n{table}\n" + "\n".join(
        f"{k}: {n}" for k, t in tallies.items() for n in t.notes)
    for t in tallies.values():
        assert t.runs == RUNS, why
        assert t.lost == 0, why
        assert t.survived + t.clear_error == RUNS, why
    # the kinds whose outcome is known: killed jobs resume, a full disk is
    # reported and then resumed, racing writers end with one winner
    for kind in ("driver-compute", "driver-commit", "driver-refresh", "worker", "disk-full",
                 "transient-read"):
        assert tallies[kind].survived == RUNS, why
    assert tallies["race"].clear_error == RUNS, why
