"""The broker's view of the cluster, as the controller last described it (UpdateMetadata).

Every broker answers Metadata requests from this cache, so any broker can bootstrap a
client. The cache is replaced partition by partition; a request from an older controller
epoch than the newest one seen is ignored (the sender was deposed).
"""

from __future__ import annotations

from tidelog.protocol.errors import LEADER_NOT_AVAILABLE, NONE, UNKNOWN_TOPIC_OR_PARTITION
from tidelog.protocol.messages import (
    NO_LEADER,
    BrokerMetadata,
    LiveBroker,
    PartitionMetadata,
    PartitionState,
    TopicMetadata,
    UpdateMetadataRequest,
)
from tidelog.protocol.topics import TopicPartition, is_internal_topic


class MetadataCache:
    def __init__(self, broker_id: int):
        self.broker_id = broker_id
        self.controller_id = -1
        self.controller_epoch = -1
        self.cluster_id: str | None = None
        self.brokers: dict[int, LiveBroker] = {}
        self._partitions: dict[str, dict[int, PartitionState]] = {}

    def update(self, req: UpdateMetadataRequest) -> bool:
        """Apply an UpdateMetadata request; False (ignored) if it comes from a stale controller."""
        if req.controller_epoch < self.controller_epoch:
            return False
        self.controller_id, self.controller_epoch = req.controller_id, req.controller_epoch
        if req.cluster_id:
            self.cluster_id = req.cluster_id
        self.brokers = {b.broker_id: b for b in req.live_brokers}
        for topic in req.deleted_topics:
            self._partitions.pop(topic, None)
        for st in req.partition_states:
            self._partitions.setdefault(st.topic_name, {})[st.partition_index] = st
        return True

    def remove_topic(self, topic: str) -> None:
        self._partitions.pop(topic, None)

    # -- queries -------------------------------------------------------------------------------

    @property
    def topics(self) -> list[str]:
        return sorted(self._partitions)

    def contains_topic(self, topic: str) -> bool:
        return topic in self._partitions

    def partition_state(self, tp: TopicPartition) -> PartitionState | None:
        return self._partitions.get(tp.topic, {}).get(tp.partition)

    def partition_count(self, topic: str) -> int:
        return len(self._partitions.get(topic, {}))

    def leader_of(self, tp: TopicPartition) -> int:
        st = self.partition_state(tp)
        return NO_LEADER if st is None else st.leader

    def broker_metadata(self) -> list[BrokerMetadata]:
        return [BrokerMetadata(b.broker_id, b.host, b.port, b.rack) for _, b in sorted(self.brokers.items())]

    def topic_metadata(self, topics: list[str] | None) -> list[TopicMetadata]:
        names = self.topics if topics is None else topics
        return [self._one_topic(name) for name in names]

    def _one_topic(self, name: str) -> TopicMetadata:
        parts = self._partitions.get(name)
        if parts is None:
            return TopicMetadata(UNKNOWN_TOPIC_OR_PARTITION.code, name,
                                 error_message=f"topic {name!r} does not exist")
        return TopicMetadata(NONE.code, name, [self._one_partition(p) for _, p in sorted(parts.items())],
                             is_internal=is_internal_topic(name))

    def _one_partition(self, st: PartitionState) -> PartitionMetadata:
        offline = [r for r in st.replicas if r not in self.brokers]
        leader_alive = st.leader in self.brokers
        return PartitionMetadata(
            error_code=NONE.code if leader_alive else LEADER_NOT_AVAILABLE.code,
            partition_index=st.partition_index,
            leader_id=st.leader if leader_alive else NO_LEADER,
            leader_epoch=st.leader_epoch,
            replica_nodes=list(st.replicas),
            isr_nodes=list(st.isr),
            offline_replicas=offline,
        )
