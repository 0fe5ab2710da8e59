"""The Tidelog SDK, blocking facade.

    from client import Producer, Consumer, Admin, Record, TopicPartition

Each object runs the Trio core (``client.aio``) on its own background thread (see
``client._portal``). Every blocking call is bounded (its own timeout, or the client's
``max_block_ms`` / ``request_timeout_ms`` / ``default_api_timeout_ms``), raises
``RequestTimedOut`` instead of hanging when the cluster is down, and lets Ctrl-C through.
Use the objects as context managers, or call ``close()``.

``Producer.send`` appends straight to the shared accumulator from the calling thread (no
hop into the event loop per record); it returns a ``RecordFuture`` whose
``result(timeout)`` is the ``RecordMetadata``. ``Producer.send_many`` queues a list of
records under one lock, a batch-full at a time (the fastest way in), and returns their
futures as one ``RecordFutures``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from client._portal import GRACE_S, Portal
from client.aio.accumulator import RecordFuture, RecordFutures
from client.aio.admin import (AsyncAdmin, ClusterDescription, ConfigEntry, NewTopic, PartitionInfo,
                              TopicDescription)
from client.aio.consumer import AsyncConsumer, OffsetAndTimestamp
from client.aio.producer import _NEED_METADATA, AsyncProducer, partly_queued
from client.errors import (BrokerConnectionError, ClientClosedError, NoBrokersAvailable,
                           NoOffsetForPartitionError, RequestTimedOut, TidelogClientError,
                           TidelogError)
from client.records import Record, RecordMetadata, TopicPartition

__all__ = ["Producer", "Consumer", "Admin", "Record", "RecordMetadata", "RecordFuture", "RecordFutures",
           "TopicPartition", "NewTopic", "TopicDescription", "PartitionInfo", "ClusterDescription",
           "ConfigEntry", "OffsetAndTimestamp", "TidelogError", "TidelogClientError",
           "RequestTimedOut", "BrokerConnectionError", "NoBrokersAvailable", "ClientClosedError",
           "NoOffsetForPartitionError"]


class _Blocking:
    """Shared lifecycle: a portal thread running the async client's ``run``."""

    _aio: Any

    def _start(self, name: str) -> None:
        self._portal = Portal(name)
        try:
            self._portal.start(self._aio.run)
        except BaseException:
            self._portal.stop()
            raise
        self._closed = False

    def _call(self, afn: Any, *args: Any, timeout: float | None) -> Any:
        if self._closed:
            raise ClientClosedError(f"the {type(self).__name__.lower()} is closed")
        return self._portal.call(afn, *args, timeout=timeout)

    def _stop(self, afn: Any, *args: Any, timeout: float | None) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._portal.call(afn, *args, timeout=timeout)
        finally:
            self._portal.stop()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._closed


class Producer(_Blocking):
    """A blocking producer; options as ``client.aio.AsyncProducer`` (Kafka's names)."""

    def __init__(self, bootstrap_servers: str | Sequence[str] = "localhost:9092", **options: Any):
        self._aio = AsyncProducer(bootstrap_servers, **options)
        self._max_block_s = self._aio.config.max_block_ms / 1000
        self._delivery_s = self._aio.config.delivery_timeout_ms / 1000
        self._start("tidelog-producer")

    def send(self, topic: str, value: Any = None, key: Any = None,
             headers: Sequence[tuple[str, bytes | str | None]] | None = None,
             partition: int | None = None, timestamp_ms: int | None = None) -> RecordFuture:
        """Queue a record and return its future (``future.result(timeout)``). Blocks only
        for the topic's first metadata or for buffer memory, at most ``max_block_ms``."""
        # The per-record hot path: no clock read unless the record must wait.
        r = self._aio.try_send(topic, value, key, headers, partition, timestamp_ms)
        if type(r) is RecordFuture:
            return r
        return self._send_after_waiting(r, topic, value, key, headers, partition, timestamp_ms)

    def _send_after_waiting(self, r: Any, topic: str, value: Any, key: Any, headers: Any,
                            partition: int | None, timestamp_ms: int | None) -> RecordFuture:
        deadline = time.monotonic() + self._max_block_s
        aio = self._aio
        while True:
            if r is _NEED_METADATA:
                self._call(aio.wait_for_topic, topic, deadline,
                           timeout=max(0.0, deadline - time.monotonic()) + 1.0)
            else:
                aio._accumulator.wait_for_memory(r, deadline)
            r = aio.try_send(topic, value, key, headers, partition, timestamp_ms)
            if type(r) is RecordFuture:
                return r

    def send_many(self, topic: str, values: Sequence[Any], keys: Sequence[Any] | None = None,
                  partition: int | None = None, timestamp_ms: int | None = None) -> RecordFutures:
        """Queue many records at once: one per value, ``keys[i]`` (if given) the key of
        ``values[i]``; no headers. Returns a ``RecordFutures``: a sequence of the records'
        futures in call order, with ``result(timeout)`` for all their RecordMetadata.

        The records are what ``send`` would make of them one by one, appended in order under
        one lock, a batch-full at a time: to ``partition`` if given, else by key (Kafka's
        default partitioner, or the configured one), and keyless records to the topic's
        sticky batches. They all get one timestamp: ``timestamp_ms``, or the time of the
        call. Blocks like ``send`` (the topic's first metadata, buffer memory), at most
        ``max_block_ms``. Nothing is queued if it raises for a bad argument or a record over
        ``max_request_size``; if it gives up waiting for buffer memory part-way, the records
        queued so far are delivered as usual and the error's ``futures`` holds theirs."""
        aio = self._aio
        bulk = aio.prepare_many(topic, values, keys, partition, timestamp_ms)
        r = aio.try_append_many(bulk, partition)
        if r is None:
            return bulk.futures
        deadline = time.monotonic() + self._max_block_s
        while True:
            try:
                if r is _NEED_METADATA:
                    self._call(aio.wait_for_topic, topic, deadline,
                               timeout=max(0.0, deadline - time.monotonic()) + 1.0)
                else:
                    aio._accumulator.wait_for_memory(r, deadline)
            except TidelogError as e:
                raise partly_queued(e, bulk)
            r = aio.try_append_many(bulk, partition)
            if r is None:
                return bulk.futures

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every record sent so far is acknowledged or failed (bounded by the
        delivery timeout when ``timeout`` is None)."""
        limit = self._delivery_s + GRACE_S if timeout is None else timeout
        self._call(self._aio.flush, timeout, timeout=limit)

    def partitions_for(self, topic: str) -> list[int]:
        return self._call(self._aio.partitions_for, topic, timeout=self._max_block_s + 1.0)

    def close(self, timeout: float | None = None) -> None:
        """Deliver pending records within ``timeout`` seconds (None: the delivery timeout),
        fail the rest, and stop the background thread."""
        limit = (self._delivery_s if timeout is None else timeout) + GRACE_S
        self._stop(self._aio.close, timeout, timeout=limit)

    @property
    def metrics(self) -> dict[str, int]:
        return self._aio.metrics


class Consumer(_Blocking):
    """A blocking consumer with manual assignment; options as ``client.aio.AsyncConsumer``,
    plus ``consumer_timeout_ms`` (iteration stops after that long without records)."""

    def __init__(self, bootstrap_servers: str | Sequence[str] = "localhost:9092", *,
                 consumer_timeout_ms: float = float("inf"), **options: Any):
        self._aio = AsyncConsumer(bootstrap_servers, **options)
        self._api_timeout_s = self._aio.config.default_api_timeout_ms / 1000
        self.consumer_timeout_ms = consumer_timeout_ms
        self._start("tidelog-consumer")

    def _sync(self, fn: Any, *args: Any) -> Any:
        if self._closed:
            raise ClientClosedError("the consumer is closed")
        return self._portal.run_sync(fn, *args)

    def subscribe(self, topics: Sequence[str] | None = None, pattern: str | None = None) -> None:
        self._aio.subscribe(topics, pattern)

    def commit(self, offsets: dict[TopicPartition, int] | None = None) -> None:
        raise NotImplementedError("committing offsets needs consumer groups, which are not available yet")

    def committed(self, partition: TopicPartition) -> int | None:
        raise NotImplementedError("committed offsets need consumer groups, which are not available yet")

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        self._sync(self._aio.assign, list(partitions))

    def assignment(self) -> set[TopicPartition]:
        return self._sync(self._aio.assignment)

    def seek(self, partition: TopicPartition, offset: int) -> None:
        self._sync(self._aio.seek, partition, offset)

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        self._sync(self._aio.seek_to_beginning, *partitions)

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        self._sync(self._aio.seek_to_end, *partitions)

    def highwater(self, partition: TopicPartition) -> int | None:
        return self._sync(self._aio.highwater, partition)

    def position(self, partition: TopicPartition, timeout_ms: int | None = None) -> int:
        return self._call(self._aio.position, partition, timeout_ms, timeout=self._timeout(timeout_ms))

    def poll(self, timeout_ms: int = 0, max_records: int | None = None) -> list[Record]:
        """Up to ``max_records`` records, waiting at most ``timeout_ms`` for some."""
        return self._call(self._aio.poll, timeout_ms, max_records, timeout=timeout_ms / 1000 + GRACE_S)

    def beginning_offsets(self, partitions: Iterable[TopicPartition],
                          timeout_ms: int | None = None) -> dict[TopicPartition, int]:
        return self._call(self._aio.beginning_offsets, list(partitions), timeout_ms,
                          timeout=self._timeout(timeout_ms))

    def end_offsets(self, partitions: Iterable[TopicPartition],
                    timeout_ms: int | None = None) -> dict[TopicPartition, int]:
        return self._call(self._aio.end_offsets, list(partitions), timeout_ms,
                          timeout=self._timeout(timeout_ms))

    def offsets_for_times(self, timestamps: dict[TopicPartition, int], timeout_ms: int | None = None
                          ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        return self._call(self._aio.offsets_for_times, dict(timestamps), timeout_ms,
                          timeout=self._timeout(timeout_ms))

    def _timeout(self, timeout_ms: int | None) -> float:
        return (self._api_timeout_s if timeout_ms is None else timeout_ms / 1000) + 1.0

    def __iter__(self) -> Iterator[Record]:
        """Records as they arrive; stops after ``consumer_timeout_ms`` without any, or when
        the consumer is closed."""
        idle_since = time.monotonic()
        while not self._closed:
            records = self.poll(timeout_ms=500)
            if records:
                idle_since = time.monotonic()
                yield from records
            elif (time.monotonic() - idle_since) * 1000 >= self.consumer_timeout_ms:
                return

    def close(self, timeout: float = 10.0) -> None:
        self._stop(self._aio.close, timeout=timeout)


class Admin(_Blocking):
    """A blocking admin client; options as ``client.aio.AsyncAdmin``."""

    def __init__(self, bootstrap_servers: str | Sequence[str] = "localhost:9092", **options: Any):
        self._aio = AsyncAdmin(bootstrap_servers, **options)
        self._api_timeout_s = self._aio.default_api_timeout_ms / 1000
        self._start("tidelog-admin")

    def _timeout(self, timeout_ms: int | None) -> float:
        return (self._api_timeout_s if timeout_ms is None else timeout_ms / 1000) + GRACE_S

    def create_topics(self, new_topics: Iterable[NewTopic], timeout_ms: int | None = None,
                      validate_only: bool = False) -> dict[str, None]:
        return self._call(self._aio.create_topics, list(new_topics), timeout_ms, validate_only,
                          timeout=self._timeout(timeout_ms))

    def delete_topics(self, names: Iterable[str], timeout_ms: int | None = None) -> dict[str, None]:
        return self._call(self._aio.delete_topics, list(names), timeout_ms, timeout=self._timeout(timeout_ms))

    def create_partitions(self, new_counts: dict[str, int], timeout_ms: int | None = None,
                          validate_only: bool = False) -> dict[str, None]:
        return self._call(self._aio.create_partitions, dict(new_counts), timeout_ms, validate_only,
                          timeout=self._timeout(timeout_ms))

    def describe_topics(self, names: Iterable[str] | None = None,
                        timeout_ms: int | None = None) -> list[TopicDescription]:
        return self._call(self._aio.describe_topics, None if names is None else list(names), timeout_ms,
                          timeout=self._timeout(timeout_ms))

    def list_topics(self, include_internal: bool = False, timeout_ms: int | None = None) -> list[str]:
        return self._call(self._aio.list_topics, include_internal, timeout_ms, timeout=self._timeout(timeout_ms))

    def describe_cluster(self, timeout_ms: int | None = None) -> ClusterDescription:
        return self._call(self._aio.describe_cluster, timeout_ms, timeout=self._timeout(timeout_ms))

    def describe_configs(self, topic: str, keys: Sequence[str] | None = None,
                         timeout_ms: int | None = None) -> dict[str, ConfigEntry]:
        return self._call(self._aio.describe_configs, topic, keys, timeout_ms, timeout=self._timeout(timeout_ms))

    def alter_configs(self, topic: str, configs: dict[str, str | None], validate_only: bool = False,
                      timeout_ms: int | None = None) -> None:
        return self._call(self._aio.alter_configs, topic, dict(configs), validate_only, timeout_ms,
                          timeout=self._timeout(timeout_ms))

    def elect_leaders(self, partitions: Iterable[TopicPartition] | None = None,
                      timeout_ms: int | None = None) -> dict[TopicPartition, tuple[int, str | None]]:
        """Preferred leader election; see ``AsyncAdmin.elect_leaders``."""
        return self._call(self._aio.elect_leaders, None if partitions is None else list(partitions),
                          timeout_ms, timeout=self._timeout(timeout_ms))

    def close(self, timeout: float = 10.0) -> None:
        self._stop(self._aio.close, timeout=timeout)
