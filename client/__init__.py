"""Tidelog: the SDK's import name.

    from tidelog import Producer, Consumer, Admin, Record, TopicPartition   # blocking
    from tidelog.aio import AsyncProducer, AsyncConsumer, AsyncAdmin          # Trio

The names below live in ``tidelog.blocking`` and are loaded on first use (PEP 562): the
broker (``tidelog.broker``), the protocol and the command line share this package and do not
pay for the client's import when they do not use it (``tidelog --help``, a broker process).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = ["Producer", "Consumer", "Admin", "Record", "RecordMetadata", "RecordFuture", "RecordFutures",
           "TopicPartition", "NewTopic", "TopicDescription", "PartitionInfo", "ClusterDescription", "PartitionReassignment",
           "ConfigEntry", "OffsetAndTimestamp", "TidelogError", "TidelogClientError",
           "RequestTimedOut", "BrokerConnectionError", "NoBrokersAvailable", "ClientClosedError",
           "AuthenticationFailedError", "SaslAuthenticationError", "SslAuthenticationError",
           "NoOffsetForPartitionError", "CommitFailedError", "RebalanceInProgressError", "WakeupError",
           "ConsumerRebalanceListener", "ConsumerGroupDescription", "MemberDescription", "GroupOffsets",
           "ListedGroup", "AclBinding", "AclBindingFilter", "ResourceType", "ResourcePatternType", "AclOperation",
           "AclPermissionType", "OffsetAndMetadata", "RecordDeserializationError", "ConsumerRecords"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        value = getattr(importlib.import_module("tidelog.blocking"), name)
        globals()[name] = value  # later lookups do not come back here
        return value
    raise AttributeError(f"module 'tidelog' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # what type checkers and IDEs see
    from tidelog.blocking import (
        AclBinding,
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        Admin,
        AuthenticationFailedError,
        BrokerConnectionError,
        ClientClosedError,
        ClusterDescription,
        CommitFailedError,
        ConfigEntry,
        Consumer,
        ConsumerGroupDescription,
        ConsumerRebalanceListener,
        ConsumerRecords,
        GroupOffsets,
        ListedGroup,
        MemberDescription,
        NewTopic,
        NoBrokersAvailable,
        NoOffsetForPartitionError,
        OffsetAndMetadata,
        OffsetAndTimestamp,
        PartitionInfo,
        PartitionReassignment,
        Producer,
        RebalanceInProgressError,
        Record,
        RecordDeserializationError,
        RecordFuture,
        RecordFutures,
        RecordMetadata,
        RequestTimedOut,
        ResourcePatternType,
        ResourceType,
        SaslAuthenticationError,
        SslAuthenticationError,
        TidelogClientError,
        TidelogError,
        TopicDescription,
        TopicPartition,
        WakeupError,
    )
