"""``tidelog topics describe``'s partition flags (``describe_lines``), by table: which
partitions are under-replicated, under min ISR, or have a high watermark that cannot move
(their ISR below min.insync.replicas capped at their replica count)."""

from __future__ import annotations

import pytest

from tidelog.aio import TopicDescription
from tidelog.aio.cluster import PartitionInfo
from tidelog.commands.topics import describe_lines

HELD = "(HW held"


def lines_for(replicas, isr, min_isr, leader=1, **filters):
    d = TopicDescription("t", [PartitionInfo("t", 0, leader, 3, tuple(replicas), tuple(isr))])
    return describe_lines(d, {}, {("t", 0): (5, 2)}, min_isr=min_isr, **filters)


@pytest.mark.parametrize("replicas, isr, min_isr, under_min, held", [
    ((1, 2, 3), (1, 2, 3), 2, False, False),
    ((1, 2, 3), (1, 2), 2, False, False),  # at min ISR: acks=all works, the HW moves
    ((1, 2, 3), (1,), 2, True, True),  # below it: acks=all fails, the HW waits for the ISR
    ((1,), (1,), 2, True, False),  # rf 1 < min ISR: acks=all never works, but the HW follows the replica
    ((1, 2), (1,), 3, True, True),  # the HW needs both replicas (min ISR capped at 2)
    ((1, 2), (1, 2), 3, True, False),
    ((1, 2, 3), (1,), 1, False, False),
])
def test_flags(replicas, isr, min_isr, under_min, held):
    (line,) = lines_for(replicas, isr, min_isr)[1:]
    assert ("(under-min-isr)" in line) == under_min
    assert (HELD in line) == held
    assert line.split("\t")[6:9] == ["Epoch: 3", "LEO: 5", "HW: 2"]


def test_held_names_the_isr_size_the_hw_needs():
    (line,) = lines_for((1, 2, 3), (1,), 3)[1:]
    assert line.endswith("\t(under-replicated)\t(under-min-isr)\t(HW held: ISR 1 < 3 needed for it to advance)")


def test_an_offline_partition_is_not_also_called_held():
    (line,) = lines_for((1, 2), (1,), 2, leader=-1)[1:]
    assert "(offline)" in line and HELD not in line


def test_the_under_min_isr_filter_keeps_only_those_partitions():
    assert lines_for((1, 2, 3), (1, 2), 2, under_min_isr=True) == []
    (line,) = lines_for((1, 2, 3), (1,), 2, under_min_isr=True)  # no header when filtering
    assert line.startswith("\tTopic: t\tPartition: 0\t")


def test_a_moving_partition_shows_kafkas_adding_and_removing_replicas_and_racks():
    from tidelog import PartitionReassignment, TopicPartition

    moves = {TopicPartition("t", 0): PartitionReassignment((4, 2, 3, 1), (4,), (1,))}
    d = TopicDescription("t", [PartitionInfo("t", 0, 1, 3, (4, 2, 3, 1), (1, 2, 3))])
    (_, line) = describe_lines(d, {}, {}, moves=moves, racks={1: "a", 2: "b", 4: "a"})
    assert "Replicas: 4,2,3,1\tIsr: 1,2,3\tAdding Replicas: 4\tRemoving Replicas: 1\t" in line
    assert "Racks: a,b,-,a" in line
    (_, line) = describe_lines(d, {}, {})
    assert "Adding" not in line and "Racks" not in line


def test_a_moving_partition_counts_its_replication_factor_without_the_replicas_being_added():
    """As Kafka's TopicCommand: while a move runs, the replication factor is the replicas
    minus those being added, so a partition whose new replica is still catching up is not
    called under-replicated."""
    from tidelog import PartitionReassignment, TopicPartition

    moves = {TopicPartition("t", 0): PartitionReassignment((4, 2, 3, 1), (4,), (1,))}
    d = TopicDescription("t", [PartitionInfo("t", 0, 1, 3, (4, 2, 3, 1), (1, 2, 3))])
    header, line = describe_lines(d, {}, {}, moves=moves)
    assert "\tReplicationFactor: 3\t" in header and "(under-replicated)" not in line
    assert describe_lines(d, {}, {}, moves=moves, under_replicated=True) == []
    (line,) = describe_lines(TopicDescription("t", [PartitionInfo("t", 0, 1, 3, (4, 2, 3, 1), (1, 2))]), {}, {},
                             moves=moves)[1:]
    assert "(under-replicated)" in line
    # a move that completed since it was listed no longer counts
    done = TopicDescription("t", [PartitionInfo("t", 0, 4, 3, (4, 2, 3), (4, 2, 3))])
    assert "\tReplicationFactor: 3\t" in describe_lines(done, {}, {}, moves=moves)[0]
