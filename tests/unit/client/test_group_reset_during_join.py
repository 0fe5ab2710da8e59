"""A member reset while it rejoins (JoinGroup answered UNKNOWN_MEMBER_ID, a heartbeat's reset)
owns partitions it can no longer commit for: as Kafka's onJoinPrepare does, they are lost
(``on_partitions_lost``, dropped) before it joins again, not claimed as owned by a member
without a generation."""

from __future__ import annotations

import trio

from tidelog.aio.cluster import Cluster
from tidelog.aio.group import ConsumerCoordinator
from tidelog.aio.membership import Generation
from tidelog.aio.subscription import ConsumerConfig, SubscriptionState
from tidelog.protocol.codec import ApiKey
from tidelog.protocol.errors import UNKNOWN_MEMBER_ID
from tidelog.protocol.messages import JoinGroupResponse
from tidelog.protocol.topics import TopicPartition

T0 = TopicPartition("t", 0)


class Link:
    """The coordinator's link, answering JoinGroup with UNKNOWN_MEMBER_ID and recording each."""

    def __init__(self) -> None:
        self.joins: list = []

    async def ensure(self, *args, **kwargs) -> None:
        await trio.lowlevel.checkpoint()

    async def request(self, request, api_key, timeout=None):
        assert api_key == ApiKey.JOIN_GROUP
        self.joins.append(request)
        if len(self.joins) > 1:
            raise AssertionError("joined again, still claiming the partitions of a lost generation")
        return JoinGroupResponse(UNKNOWN_MEMBER_ID.code, -1, None, None, "", "")


async def test_a_cooperative_member_reset_mid_join_loses_its_partitions_before_joining_again():
    config = ConsumerConfig(bootstrap_servers="127.0.0.1:1", group_id="g", partition_assignment_strategy=["cooperative-sticky"])
    subscriptions = SubscriptionState(None)
    subscriptions.assign([T0])
    coordinator = ConsumerCoordinator(Cluster("127.0.0.1:1"), config, subscriptions, invoke=None,
                                      wake_fetcher=lambda: None)
    coordinator.subscribed_topics = {"t"}
    coordinator._apply(coordinator.member.joined(Generation(5, "m-1", "cooperative-sticky")))
    coordinator._apply(coordinator.member.synced())
    coordinator.link = Link()
    assert await coordinator._join_and_sync() is None  # the join ends: the next poll prepares again
    [join] = coordinator.link.joins
    assert not coordinator.generation.valid and coordinator.rejoin_needed
