"""The Trio core of the Tidelog SDK.

    from tidelog.aio import AsyncProducer, AsyncConsumer, AsyncAdmin

Each client object runs its background tasks (metadata refresh, connection readers, the
producer's sender, the consumer's fetcher) in a nursery it owns: use it as an async context
manager, or start it in your own nursery with ``await nursery.start(obj.run)`` and end it
with ``await obj.close()``.
"""

from tidelog.aio.accumulator import RecordFuture, RecordFutures
from tidelog.aio.admin import (
                              AsyncAdmin,
                              ClusterDescription,
                              ConfigEntry,
                              ConsumerGroupDescription,
                              GroupOffsets,
                              ListedGroup,
                              MemberDescription,
                              NewTopic,
                              PartitionInfo,
                              TopicDescription,
)
from tidelog.aio.consumer import AsyncConsumer, OffsetAndTimestamp
from tidelog.aio.group import ConsumerRebalanceListener
from tidelog.aio.producer import AsyncProducer
from tidelog.records import Record, RecordMetadata, TopicPartition

__all__ = ["AsyncProducer", "AsyncConsumer", "AsyncAdmin", "RecordFuture", "RecordFutures", "Record",
           "RecordMetadata", "TopicPartition", "NewTopic", "TopicDescription", "PartitionInfo",
           "ClusterDescription", "ConfigEntry", "OffsetAndTimestamp", "ConsumerRebalanceListener",
           "ConsumerGroupDescription", "MemberDescription", "GroupOffsets", "ListedGroup"]
