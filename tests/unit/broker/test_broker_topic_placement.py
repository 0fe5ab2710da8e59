"""The topics a broker creates itself (auto-created, ``__consumer_offsets``) are placed as
the controller places a created topic: over the racks when every live broker has one."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tidelog.broker.server import BrokerServer
from tidelog.protocol.messages import LiveBroker

RACKS = {1: "a", 2: "a", 3: "b", 4: "b"}


def broker(racks: dict[int, str | None]):
    created = {}

    async def create_topic(name, assignment, configs):
        created[name] = assignment

    b = SimpleNamespace(
        metadata=SimpleNamespace(brokers={i: LiveBroker(i, "127.0.0.1", 9000 + i, r) for i, r in racks.items()}),
        config=SimpleNamespace(num_partitions=40, default_replication_factor=2, min_insync_replicas=1),
        zk=SimpleNamespace(create_topic=create_topic))
    b._racks = lambda live: BrokerServer._racks(b, live)
    return b, created


def one_rack(assignment, racks):
    return {p: r for p, r in assignment.items() if len({racks[x] for x in r}) < len(r)}


@pytest.mark.parametrize("create", [
    lambda b: BrokerServer.auto_create_topics(b, ["t"]),
    lambda b: BrokerServer._create_internal_topic(b, "t", 40, 2, {}),
])
async def test_a_broker_created_topic_spreads_over_racks(create):
    b, created = broker(RACKS)
    await create(b)
    assert len(created["t"]) == 40 and one_rack(created["t"], RACKS) == {}


async def test_without_a_rack_on_every_broker_placement_ignores_racks():
    b, created = broker({**RACKS, 4: None})
    await BrokerServer.auto_create_topics(b, ["t"])
    assert len(created["t"]) == 40
