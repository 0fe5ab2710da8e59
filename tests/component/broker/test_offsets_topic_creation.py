"""``__consumer_offsets`` is created on the first FindCoordinator, never with fewer replicas
than ``offsets.topic.replication.factor`` (Kafka's rule): while fewer brokers are alive,
FindCoordinator answers COORDINATOR_NOT_AVAILABLE naming both numbers, and nothing is
created; once enough are up, the topic is created with the full factor."""

from __future__ import annotations

import pytest

from tidelog.broker.groups.group_coordinator import (
    OFFSETS_TOPIC,
    CoordinatorConfig,
    GroupCoordinator,
    offsets_topic_shortfall,
)
from tidelog.broker.metadata_cache import MetadataCache
from tidelog.protocol.errors import COORDINATOR_NOT_AVAILABLE
from tidelog.protocol.messages import FindCoordinatorRequest, LiveBroker, UpdateMetadataRequest


@pytest.mark.parametrize("live, rf, refused", [(1, 3, True), (2, 3, True), (3, 3, False), (4, 3, False),
                                                (1, 1, False), (0, 1, True)])
def test_shortfall(live, rf, refused):
    why = offsets_topic_shortfall(live, rf)
    assert (why is not None) == refused
    if refused:
        assert f"{live} broker(s) alive" in why and f"the {rf} that offsets.topic.replication.factor" in why


def coordinator(live: int, created: list) -> tuple[GroupCoordinator, MetadataCache]:
    metadata = MetadataCache(1)
    metadata.update(UpdateMetadataRequest(1, 1, 0, [], [LiveBroker(i, "127.0.0.1", 9091 + i)
                                                        for i in range(1, live + 1)]))

    async def create_topic(name, partitions, replication_factor, configs):
        created.append((name, partitions, replication_factor))

    return GroupCoordinator(CoordinatorConfig(1, offsets_topic_num_partitions=5), None, metadata,
                            create_topic=create_topic), metadata


async def test_not_created_while_too_few_brokers_are_alive(caplog):
    created: list = []
    c, metadata = coordinator(1, created)
    for _ in range(3):  # clients retry: refused each time, warned once per live count
        r = await c.find_coordinator(FindCoordinatorRequest("g"))
        assert r.error_code == COORDINATOR_NOT_AVAILABLE.code
        assert "1 broker(s) alive, fewer than the 3" in r.error_message
    assert created == []
    assert sum("not creating __consumer_offsets" in m for m in caplog.messages) == 1
    metadata.update(UpdateMetadataRequest(1, 1, 0, [], [LiveBroker(i, "127.0.0.1", 9091 + i) for i in (1, 2, 3)]))
    r = await c.find_coordinator(FindCoordinatorRequest("g"))
    assert r.error_code == COORDINATOR_NOT_AVAILABLE.code and "being created" in r.error_message
    assert created == [(OFFSETS_TOPIC, 5, 3)]
