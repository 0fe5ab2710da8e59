"""DescribeLogDirs through the broker's API layer over a real ReplicaManager and LogManager
(``test_authorization.Broker``, leading its partitions alone): every local replica with its
size and offsets, only the partitions asked for, and Describe on the Cluster required."""

from __future__ import annotations

from tests.component.broker.test_authorization import ADMIN, ALICE, CLUSTER, OPS, OTHER, TP, broker, ctx, produce
from tidelog.broker.cli import installed_version
from tidelog.protocol.acls import CLUSTER_NAME
from tidelog.protocol.errors import CLUSTER_AUTHORIZATION_FAILED, NONE
from tidelog.protocol.messages import DescribableLogDirTopic, DescribeLogDirsRequest

__all__ = ["broker"]  # the fixture, shared with test_authorization


def replicas(r) -> dict:
    return {(t.name, p.partition_index): p for d in r.results for t in d.topics for p in t.partitions}


async def test_each_local_replica_is_described_with_its_offsets_and_size(broker):
    broker.apis.produce(produce("orders"), ctx(ADMIN))  # acks=1: answered when appended
    r = await broker.apis.describe_log_dirs(DescribeLogDirsRequest(), ctx(ADMIN))
    assert r.error_code == NONE.code
    (d,) = r.results
    assert d.error_code == NONE.code and d.log_dir == broker.log_manager.log_dirs[0] and d.total_bytes > 0
    found = replicas(r)
    assert set(found) == {(TP.topic, 0), (OTHER.topic, 0)}
    orders = found[(TP.topic, 0)]
    assert (orders.log_start_offset, orders.log_end_offset, orders.high_watermark, orders.offset_lag) == (0, 1, 1, 0)
    assert orders.partition_size == broker.log_manager.get_log(TP).size > 0
    assert found[(OTHER.topic, 0)].log_end_offset == 0


async def test_only_the_partitions_asked_for_are_described(broker):
    r = await broker.apis.describe_log_dirs(DescribeLogDirsRequest([DescribableLogDirTopic("orders", [0, 7])]),
                                            ctx(ADMIN))
    assert set(replicas(r)) == {(TP.topic, 0)}


async def test_describe_on_the_cluster_is_required(broker):
    r = await broker.apis.describe_log_dirs(DescribeLogDirsRequest(), ctx(ALICE))
    assert (r.error_code, r.results) == (CLUSTER_AUTHORIZATION_FAILED.code, [])
    broker.allow(CLUSTER, CLUSTER_NAME, OPS.DESCRIBE)
    r = await broker.apis.describe_log_dirs(DescribeLogDirsRequest(), ctx(ALICE))
    assert r.error_code == NONE.code and replicas(r)


async def test_api_versions_says_the_brokers_software_version(broker):
    r = await broker.apis.api_versions(None, ctx(ALICE))
    assert r.software_version == installed_version() and r.api_keys
