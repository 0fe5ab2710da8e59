"""broker/log_dirs.py: DescribeLogDirs' answer as a pure function of the local replicas."""

from __future__ import annotations

import pytest

from tidelog.broker.log_dirs import LocalReplica, describe_log_dirs, log_dir_of, wanted_partitions
from tidelog.protocol.errors import KAFKA_STORAGE_ERROR, NONE
from tidelog.protocol.messages import DescribableLogDirTopic
from tidelog.protocol.topics import TopicPartition

pytestmark = pytest.mark.unit

A, B = TopicPartition("a", 0), TopicPartition("b", 1)


def test_every_dir_is_listed_and_each_replica_is_in_its_own():
    local = {B: LocalReplica("/d2", 10, 0, 5, 5), A: LocalReplica("/d1", 20, 2, 9, 7)}
    results = describe_log_dirs(["/d1", "/d2", "/d3"], local, None, {"/d1": (100, 50)})
    assert [r.log_dir for r in results] == ["/d1", "/d2", "/d3"]
    (t,) = results[0].topics
    (p,) = t.partitions
    assert (t.name, p.partition_index, p.partition_size, p.log_start_offset, p.log_end_offset,
            p.high_watermark) == ("a", 0, 20, 2, 9, 7)
    assert p.offset_lag == 0  # Kafka's: the HW minus the LEO, never negative
    assert (results[0].total_bytes, results[0].usable_bytes) == (100, 50)
    assert (results[1].total_bytes, results[2].topics) == (-1, [])


def test_a_request_naming_partitions_gets_only_those():
    local = {A: LocalReplica("/d", 1, 0, 1, 1), B: LocalReplica("/d", 1, 0, 1, 1)}
    wanted = wanted_partitions([DescribableLogDirTopic("b", [1, 2])])
    (r,) = describe_log_dirs(["/d"], local, wanted, {})
    assert [(t.name, [p.partition_index for p in t.partitions]) for t in r.topics] == [("b", [1])]
    assert wanted_partitions(None) is None


def test_a_partition_dir_belongs_to_its_parent_log_dir():
    assert log_dir_of("/var/tidelog/orders-0") == "/var/tidelog"


def test_an_offline_dir_answers_storage_error_with_nothing_in_it():
    local = {A: LocalReplica("/d2", 1, 0, 1, 1)}
    results = describe_log_dirs(["/d1", "/d2"], local, None, {"/d2": (100, 50)}, offline={"/d1": "I/O error"})
    assert [(r.log_dir, r.error_code, r.topics, r.total_bytes) for r in results][0] == \
        ("/d1", KAFKA_STORAGE_ERROR.code, [], -1)
    assert results[1].error_code == NONE.code and results[1].topics
