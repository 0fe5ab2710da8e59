"""The integration tests' cluster fixtures (real ZooKeeper + broker processes through
``broker.devcluster.DevCluster``); the helpers they share with the Spark and system tests are
in ``tests.support``. Import what a test module needs explicitly (these are not conftest
fixtures)::

    from tests.integration.cluster_fixtures import FAST_FAILOVER, cluster_3
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.cluster import cluster_fixture
from tidelog.broker.devcluster import DevCluster

# Small timeouts so that hard kills are noticed quickly: a killed broker's ZooKeeper session
# expires after 6 s, a follower that stopped fetching leaves the ISR after 3 s, and a
# controlled shutdown that cannot move everything gives up after 3 x 0.5 s.
FAST_FAILOVER: dict[str, object] = {
    "zookeeper.session.timeout.ms": 6000,
    "replica.lag.time.max.ms": 3000,
    "controlled.shutdown.retry.backoff.ms": 500,
    "replica.fetch.backoff.ms": 200,
}


@pytest.fixture(scope="module")
def cluster_3(request, tmp_path_factory) -> Iterator[DevCluster]:
    """One 3-broker cluster shared by a module."""
    yield from cluster_fixture(request, tmp_path_factory.mktemp("cluster3"), 3, FAST_FAILOVER)


@pytest.fixture
def fresh_cluster_3(request, tmp_path_factory) -> Iterator[DevCluster]:
    """A 3-broker cluster of the test's own (for tests that kill brokers)."""
    yield from cluster_fixture(request, tmp_path_factory.mktemp("failover"), 3, FAST_FAILOVER)
