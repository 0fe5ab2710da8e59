"""The clients' keyword options as typed dictionaries, for IDEs and type checkers.

``Producer(bootstrap, **options: Unpack[ProducerOptions])`` lets an IDE complete
``linger_ms`` and lets mypy reject ``linger_ms="5"`` or an unknown option; at run time the
options are checked by the config dataclasses, which stay the one place that defines them
(``tidelog.aio.producer.ProducerConfig``, ``tidelog.aio.subscription.ConsumerConfig``,
``tidelog.security.SecurityConfig``). tests/unit/client/test_options.py checks that these
dictionaries name exactly those dataclasses' fields, with the same types (``acks`` also
takes "all", the config's parser turns it into -1), plus the keywords the constructors take
beside them (serializers, deserializers, the partitioner). Change both together.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypedDict

from tidelog.aio.producer import Partitioner

__all__ = ["SecurityOptions", "ProducerConfigOptions", "ProducerOptions", "ConsumerConfigOptions",
           "ConsumerOptions", "AdminOptions"]


class SecurityOptions(TypedDict, total=False):
    """``tidelog.security.SecurityConfig``'s fields."""

    security_protocol: str
    ssl_cafile: str | None
    ssl_certfile: str | None
    ssl_keyfile: str | None
    ssl_password: str | None
    ssl_check_hostname: bool
    sasl_mechanism: str
    sasl_plain_username: str | None
    sasl_plain_password: str | None


class ProducerConfigOptions(SecurityOptions, total=False):
    """``ProducerConfig``'s fields but ``bootstrap_servers``."""

    client_id: str | None
    acks: int | str
    linger_ms: int
    batch_size: int
    buffer_memory: int
    compression_type: str | None
    delivery_timeout_ms: int
    request_timeout_ms: int
    retries: int
    retry_backoff_ms: int
    retry_backoff_max_ms: int
    max_in_flight_requests_per_connection: int
    max_block_ms: int
    max_request_size: int
    metadata_max_age_ms: int
    enable_idempotence: bool | None


class ProducerOptions(ProducerConfigOptions, total=False):
    """What ``Producer`` takes: ``ProducerConfigOptions`` and the producer's callables."""

    key_serializer: Callable[[Any], bytes | None] | None
    value_serializer: Callable[[Any], bytes | None] | None
    partitioner: Partitioner | None


class ConsumerConfigOptions(SecurityOptions, total=False):
    """``ConsumerConfig``'s fields but ``bootstrap_servers``."""

    client_id: str | None
    group_id: str | None
    group_instance_id: str | None
    session_timeout_ms: int
    heartbeat_interval_ms: int
    max_poll_interval_ms: int
    rebalance_timeout_ms: int | None
    partition_assignment_strategy: tuple[str, ...] | str
    enable_auto_commit: bool
    auto_commit_interval_ms: int
    exclude_internal_topics: bool
    auto_offset_reset: str
    fetch_min_bytes: int
    fetch_max_wait_ms: int
    fetch_max_bytes: int
    max_partition_fetch_bytes: int
    max_poll_records: int
    request_timeout_ms: int
    default_api_timeout_ms: int
    retry_backoff_ms: int
    retry_backoff_max_ms: int
    metadata_max_age_ms: int
    check_crcs: bool
    allow_auto_create_topics: bool


class ConsumerOptions(ConsumerConfigOptions, total=False):
    """What ``Consumer`` takes: ``ConsumerConfigOptions`` and the deserializers."""

    key_deserializer: Callable[[Any], Any] | None  # given bytes, or None (no key, a tombstone)
    value_deserializer: Callable[[Any], Any] | None


class AdminOptions(SecurityOptions, total=False):
    """``AsyncAdmin``'s keywords."""

    client_id: str | None
    request_timeout_ms: int
    retry_backoff_ms: int
    retry_backoff_max_ms: int
    default_api_timeout_ms: int

