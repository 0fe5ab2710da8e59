"""A log dir failing under a real broker process (3 brokers, one ZooKeeper): its partitions'
leadership moves to the other replicas while producers go on, the broker's other log dir
carries on, and no acknowledged record is lost; a broker whose only log dir fails stops (exit
status 1), its session closed, and its partitions move the same way.

The failure is a real one from the file system, without patching the broker: directories are
planted in a partition's directory under the names of its next segments, so the roll that
creates one fails with IsADirectoryError (an OSError, as ENOSPC would be).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.integration.cluster_fixtures import FAST_FAILOVER
from tests.support.cluster import broker_metadata, consume_range, partitions_of, shut_down, wait_topic_ready
from tests.support.waiting import wait_until
from tidelog import Admin, NewTopic, Producer, TopicPartition
from tidelog.broker.devcluster import DevCluster
from tidelog.broker.log.segment import LOG_SUFFIX, filename_prefix
from tidelog.protocol.errors import KAFKA_STORAGE_ERROR

TOPIC = "dirfail"
SEGMENT_BYTES = 1024


@pytest.fixture
def cluster(request, tmp_path_factory):
    """Three brokers, broker 1 with two log dirs; segments of 1 KiB allowed."""
    directory = tmp_path_factory.mktemp("dirfail")
    c = DevCluster(directory, brokers=3, zk_port=0, base_port=0,
                   extra_config={**FAST_FAILOVER, "log.segment.min.bytes": SEGMENT_BYTES})
    config = c.brokers[1].config_path
    dirs = [directory / "broker-1" / "d1", directory / "broker-1" / "d2"]
    config.write_text(re.sub(r'"log.dirs" = \[[^]]*\]', '"log.dirs" = [%s]' % ", ".join(f'"{d}"' for d in dirs),
                             config.read_text()))
    c.dirs_of_1 = dirs
    failed_before, started = request.session.testsfailed, False
    try:
        c.start(60.0)
        started = True
        yield c
    finally:
        shut_down(c, failed=not started or request.session.testsfailed > failed_before)


def plant_failing_rolls(partition_dir: Path, upto: int = 5000) -> None:
    """The next segments of the replica cannot be created: a directory holds each name."""
    for offset in range(upto):
        path = partition_dir / (filename_prefix(offset) + LOG_SUFFIX)
        if not path.exists():
            path.mkdir()


def produce(cluster: DevCluster, partition: int, n: int) -> list:
    with Producer(cluster.bootstrap, acks="all", linger_ms=0, batch_size=600, retry_backoff_ms=100,
                  request_timeout_ms=15000, delivery_timeout_ms=90000) as producer:
        futures = [producer.send(TOPIC, b"x" * 100, key=b"%d" % i, partition=partition) for i in range(n)]
        return [f.result(timeout=120) for f in futures]


def test_a_failed_log_dir_moves_its_partitions_leadership_and_the_other_dir_carries_on(cluster):
    with Admin(cluster.bootstrap, default_api_timeout_ms=30000) as admin:
        admin.create_topics([NewTopic(TOPIC, replica_assignment={0: [1, 2, 3], 1: [1, 2, 3]},
                                      config={"segment.bytes": str(SEGMENT_BYTES), "min.insync.replicas": "2"})])
    parts = wait_topic_ready(cluster, TOPIC, 2, 3)
    assert {p.leader_id for p in parts.values()} == {1}
    where = {p: next(d for d in cluster.dirs_of_1 if (d / f"{TOPIC}-{p}").is_dir()) for p in (0, 1)}
    assert where[0] != where[1]  # a new partition goes to the dir with the fewest
    assert len(produce(cluster, 0, 5)) == 5

    plant_failing_rolls(where[0] / f"{TOPIC}-0")
    acked = produce(cluster, 0, 100)  # 10 KiB: broker 1 fails its first roll, the others roll on
    assert [m.offset for m in acked] == list(range(5, 105))

    def moved():
        p = partitions_of(broker_metadata(cluster, 2), TOPIC)
        return p[0].leader_id != 1 and 1 not in p[0].isr_nodes and p
    parts = wait_until(moved, 30, "leadership of partition 0 off broker 1, and broker 1 out of its ISR")
    assert parts[1].leader_id == 1 and 1 in parts[1].isr_nodes  # the other dir's partition stays
    assert len(produce(cluster, 1, 20)) == 20
    assert cluster.brokers[1].running
    tp = TopicPartition(TOPIC, 0)
    read = consume_range(cluster.bootstrap, {tp: 105})[tp]
    assert [r.offset for r in read] == list(range(105))  # every acknowledged record
    with Admin(cluster.bootstrap, default_api_timeout_ms=30000) as admin:
        dirs = admin.describe_log_dirs()[1]
    assert dirs[str(where[0])].replicas == {} and dirs[str(where[0])].total_bytes == -1  # offline
    assert dirs[str(where[0])].error.code == KAFKA_STORAGE_ERROR.code and dirs[str(where[1])].error is None
    assert TopicPartition(TOPIC, 1) in dirs[str(where[1])].replicas
    with open(cluster.brokers[1].log_path, errors="replace") as f:
        assert f"log dir {where[0]} failed while rolling {TOPIC}-0" in f.read()
    assert not os.path.exists(where[0] / ".tidelog_cleanshutdown")


def test_a_broker_whose_only_log_dir_fails_stops_and_its_partitions_move(cluster):
    with Admin(cluster.bootstrap, default_api_timeout_ms=30000) as admin:
        admin.create_topics([NewTopic(TOPIC, replica_assignment={0: [2, 1, 3]},
                                      config={"segment.bytes": str(SEGMENT_BYTES), "min.insync.replicas": "2"})])
    assert wait_topic_ready(cluster, TOPIC, 1, 3)[0].leader_id == 2
    assert len(produce(cluster, 0, 5)) == 5
    broker = cluster.brokers[2]
    plant_failing_rolls(cluster.dir / "broker-2" / "logs" / f"{TOPIC}-0")
    acked = produce(cluster, 0, 100)  # broker 2 fails its first roll: its only log dir
    assert [m.offset for m in acked] == list(range(5, 105))
    assert broker.proc.wait(timeout=60) == 1  # stopped by itself, its session closed

    def moved():
        p = partitions_of(broker_metadata(cluster, 1), TOPIC)[0]
        return p.leader_id in (1, 3) and 2 not in p.isr_nodes and p
    wait_until(moved, 30, "leadership of the partition off broker 2, and broker 2 out of its ISR")
    tp = TopicPartition(TOPIC, 0)
    assert [r.offset for r in consume_range(cluster.bootstrap, {tp: 105})[tp]] == list(range(105))
    with open(broker.log_path, errors="replace") as f:
        assert "broker 2 is stopping: every log dir has failed" in f.read()
    assert not (cluster.dir / "broker-2" / "logs" / ".tidelog_cleanshutdown").exists()


def test_a_dir_that_fails_while_the_broker_starts_is_offline_and_the_others_serve(cluster):
    """Broker 1 restarts with one of its two dirs unreadable: it starts with the other (as
    Kafka's loadLogs), the partition in the failed dir stays off it, the other is back in sync."""
    with Admin(cluster.bootstrap, default_api_timeout_ms=30000) as admin:
        admin.create_topics([NewTopic(TOPIC, replica_assignment={0: [1, 2, 3], 1: [1, 2, 3]},
                                      config={"min.insync.replicas": "2"})])
    wait_topic_ready(cluster, TOPIC, 2, 3)
    where = {p: next(d for d in cluster.dirs_of_1 if (d / f"{TOPIC}-{p}").is_dir()) for p in (0, 1)}
    assert where[0] != where[1]
    assert len(produce(cluster, 0, 5)) == 5 and len(produce(cluster, 1, 5)) == 5
    broker = cluster.brokers[1]
    assert broker.stop() == 0
    index = where[0] / f"{TOPIC}-0" / (filename_prefix(0) + ".index")
    if index.exists():
        index.unlink()
    index.mkdir()  # opening it fails (IsADirectoryError) while the logs load
    broker.start()
    cluster.wait_ready(60)

    def settled():
        p = partitions_of(broker_metadata(cluster, 2), TOPIC)
        return (p[0].leader_id in (2, 3) and 1 not in p[0].isr_nodes and p[0].offline_replicas == [1]
                and 1 in p[1].isr_nodes and p)
    wait_until(settled, 60, "broker 1 in partition 1's ISR, out of partition 0's and offline there")
    assert len(produce(cluster, 0, 5)) == 5 and len(produce(cluster, 1, 5)) == 5
    read = consume_range(cluster.bootstrap, {TopicPartition(TOPIC, 0): 10, TopicPartition(TOPIC, 1): 10})
    assert {tp.partition: [r.offset for r in rs] for tp, rs in read.items()} == {0: list(range(10)),
                                                                                  1: list(range(10))}
    with Admin(cluster.bootstrap, default_api_timeout_ms=30000) as admin:
        dirs = admin.describe_log_dirs()[1]
    assert dirs[str(where[0])].error.code == KAFKA_STORAGE_ERROR.code and dirs[str(where[1])].error is None
    assert TopicPartition(TOPIC, 1) in dirs[str(where[1])].replicas
    assert broker.running
    with open(broker.log_path, errors="replace") as f:
        assert f"log dir {where[0]} failed while loading its logs" in f.read()


def test_a_new_controller_learns_the_replicas_of_a_failed_dir_from_its_broker(cluster):
    """The controller that handled broker 1's report of its failed dir is replaced (its
    ``/controller`` deleted: an election, a new epoch, a failover that reads everything
    again). The report is gone, and broker 1, neither leader nor in the ISR, has nothing to
    report again: the new controller learns the offline replica from broker 1's answer to its
    LeaderAndIsr (KAFKA_STORAGE_ERROR), and the metadata keeps naming it offline."""
    from kazoo.client import KazooClient

    with Admin(cluster.bootstrap, default_api_timeout_ms=30000) as admin:
        admin.create_topics([NewTopic(TOPIC, replica_assignment={0: [1, 2, 3]},
                                      config={"segment.bytes": str(SEGMENT_BYTES), "min.insync.replicas": "2"})])
    wait_topic_ready(cluster, TOPIC, 1, 3)
    where = next(d for d in cluster.dirs_of_1 if (d / f"{TOPIC}-0").is_dir())
    plant_failing_rolls(where / f"{TOPIC}-0")
    assert len(produce(cluster, 0, 100)) == 100

    def offline_on_1():
        p = partitions_of(broker_metadata(cluster, 2), TOPIC)[0]
        return p.leader_id != 1 and 1 not in p.isr_nodes and p.offline_replicas == [1]
    wait_until(offline_on_1, 30, "broker 1's replica out of the ISR and offline in the metadata")

    zk = KazooClient(hosts=cluster.zookeeper.connect_string, timeout=10)
    zk.start(timeout=10)
    try:
        epoch = int(zk.get("/tidelog/controller_epoch")[0])
        zk.delete("/tidelog/controller")
        wait_until(lambda: int(zk.get("/tidelog/controller_epoch")[0]) > epoch and zk.exists("/tidelog/controller"),
                   30, "a controller elected again")
    finally:
        zk.stop()
        zk.close()

    def learned():
        return any("broker 1 answered KAFKA_STORAGE_ERROR for 1 replicas" in b.log_path.read_text(errors="replace")
                   for b in cluster.brokers.values())
    wait_until(learned, 30, "the new controller learning broker 1's offline replica from its LeaderAndIsr answer")
    wait_until(offline_on_1, 30, "broker 1's replica still offline in the new controller's metadata")
    assert cluster.brokers[1].running
