"""Fixtures shared by the integration tests."""

import pytest


@pytest.fixture(scope="module")
def remote():
    """CLI options for a job on a running scheduler (``--scheduler-address``):
    one in-process worker of 1 GiB, 1 thread, as the tests' embedded
    clusters are sized. Tests about a command's behaviour use it, so each CLI
    run skips starting and stopping a cluster of its own (seconds of CPU on
    a 2-core machine); the embedded-cluster path keeps its own tests
    (``test_cli.py``: ``test_matmul_matches_numpy``,
    ``test_matmul_transposes_and_output_layout``, the failure and MPI tests)."""
    from distributed import LocalCluster
    from helpers import in_process_workers

    with in_process_workers():
        cluster = LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                               protocol="tcp", dashboard_address=":0", memory_limit="1GiB")
    with cluster:
        yield ["--scheduler-address", cluster.scheduler_address, "--quiet"]
