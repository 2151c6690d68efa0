"""One multi-node cluster (``tests/fixtures/multinode.py``) for every test here, and the
single-node local-disk run their results must equal bit for bit (``_local.py``). The default
and causal-LM jobs on the cluster are checked by hand (benchmarks/remote_checks/: each costs
minutes, over CI's budget)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fixtures.multinode import Cluster
from tests.multinode._jobs import FAULTS
from tests.multinode._local import LocalRuns, cluster_with


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, LocalRuns]]:
    """The cluster, and the local run of the fault tests' job (beside the first cluster job)."""
    yield from cluster_with(tmp_path_factory, {"faults": FAULTS})


@pytest.fixture
def s3_client(cluster, monkeypatch) -> Cluster:
    """The cluster, whole again (``Cluster.heal``: a test may end with nodes lost), with its S3
    server's credentials in this process's environment (to read the stores of the jobs)."""
    c, _ = cluster
    c.heal()
    for k, v in c.s3_env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    return c
