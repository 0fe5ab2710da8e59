"""The Trio admin client: topics, partitions, configs, cluster description.

Routing follows Kafka's ZooKeeper era: CreateTopics, DeleteTopics, CreatePartitions,
AlterConfigs (and, for read-your-writes, DescribeConfigs) go to the controller
(``MetadataResponse.controller_id``). A NOT_CONTROLLER answer, a lost connection or a timeout
refreshes the metadata and retries the affected topics, with backoff, until the call's
timeout. Metadata reads (describe_topics, list_topics, describe_cluster) go to any broker.

Per-topic error codes become exceptions in one place (``client.errors.broker_error``), whose
message names the topic and the cause. A call over several topics raises the first topic's
error, with ``.results`` (topic -> None or exception) attached so the others are not lost.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import trio

from client.aio._lifecycle import RunsInOwnNursery
from client.aio.cluster import Backoff, Cluster, PartitionInfo
from client.errors import BrokerConnectionError, RequestTimedOut, TidelogError, broker_error
from protocol.errors import NONE, NOT_CONTROLLER
from protocol.messages import (TOPIC_RESOURCE, AlterConfigsRequest, AlterConfigsResource, ApiKey,
                               BrokerMetadata, ConfigEntry, CreatableTopic, CreatePartitionsRequest,
                               CreatePartitionsTopic, CreateTopicsRequest, DeleteTopicsRequest,
                               DescribeConfigsRequest, DescribeConfigsResource, ElectLeadersRequest,
                               ElectLeadersResponse, Message, MetadataResponse, TopicPartitionRef)
from protocol.topics import TopicPartition, validate_topic_name

__all__ = ["AsyncAdmin", "NewTopic", "TopicDescription", "PartitionInfo", "ClusterDescription",
           "ConfigEntry", "BrokerMetadata"]


@dataclass(frozen=True, slots=True)
class NewTopic:
    """A topic to create. -1 means the broker's default (num.partitions,
    default.replication.factor); ``replica_assignment`` (partition -> broker ids) overrides both."""

    name: str
    num_partitions: int = -1
    replication_factor: int = -1
    replica_assignment: dict[int, list[int]] | None = None
    config: dict[str, str] = field(default_factory=dict)

    def to_creatable(self) -> CreatableTopic:
        assignments = None
        if self.replica_assignment is not None:
            assignments = {str(p): list(replicas) for p, replicas in self.replica_assignment.items()}
        return CreatableTopic(self.name, self.num_partitions, self.replication_factor, assignments,
                              {k: str(v) for k, v in self.config.items()})


@dataclass(frozen=True, slots=True)
class TopicDescription:
    name: str
    partitions: list[PartitionInfo]
    is_internal: bool = False


@dataclass(frozen=True, slots=True)
class ClusterDescription:
    cluster_id: str | None
    controller_id: int
    brokers: list[BrokerMetadata]


Outcomes = dict[str, tuple[int, str | None]]  # name -> (error code, message)


class AsyncAdmin(RunsInOwnNursery):
    """Use ``async with AsyncAdmin(...) as admin:`` or ``await nursery.start(admin.run)``."""

    def __init__(self, bootstrap_servers: str | Sequence[str] = "localhost:9092", *,
                 client_id: str | None = None, request_timeout_ms: int = 30000,
                 retry_backoff_ms: int = 100, retry_backoff_max_ms: int = 1000,
                 default_api_timeout_ms: int = 60000):
        self.request_timeout_ms = request_timeout_ms
        self.default_api_timeout_ms = default_api_timeout_ms
        self._backoff = (retry_backoff_ms / 1000, retry_backoff_max_ms / 1000)
        self._cluster = Cluster(bootstrap_servers, client_id=client_id,
                                request_timeout_ms=request_timeout_ms,
                                retry_backoff_ms=retry_backoff_ms,
                                retry_backoff_max_ms=retry_backoff_max_ms)
        self._nursery: trio.Nursery | None = None
        self._started = False
        self._stopped = trio.Event()

    # -- lifecycle ------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        if self._started:
            raise RuntimeError("this admin client was already started")
        self._started = True
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                await nursery.start(self._cluster.run)
                task_status.started()
        finally:
            self._stopped.set()

    async def close(self) -> None:
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()
        if self._started:
            with trio.CancelScope(shield=True):
                await self._stopped.wait()

    # -- topics ---------------------------------------------------------------------------------

    async def create_topics(self, new_topics: Iterable[NewTopic], timeout_ms: int | None = None,
                            validate_only: bool = False) -> dict[str, None]:
        """Create topics on the controller; returns ``{name: None}`` or raises the first
        failure (e.g. TOPIC_ALREADY_EXISTS) naming its topic."""
        topics = {t.name: t for t in new_topics}
        for name in topics:
            validate_topic_name(name)
        timeout_ms = self._timeout_ms(timeout_ms)

        def build(names: list[str]) -> Message:
            return CreateTopicsRequest([topics[n].to_creatable() for n in names], timeout_ms, validate_only)

        outcomes = await self._to_controller(list(topics), build, ApiKey.CREATE_TOPICS,
                                             lambda r: {t.name: (t.error_code, t.error_message) for t in r.topics},
                                             timeout_ms)
        return _raise_for(outcomes, "create")

    async def delete_topics(self, names: Iterable[str], timeout_ms: int | None = None) -> dict[str, None]:
        names = list(dict.fromkeys(names))
        timeout_ms = self._timeout_ms(timeout_ms)
        outcomes = await self._to_controller(
            names, lambda ns: DeleteTopicsRequest(ns, timeout_ms), ApiKey.DELETE_TOPICS,
            lambda r: {t.name: (t.error_code, t.error_message) for t in r.responses}, timeout_ms)
        return _raise_for(outcomes, "delete")

    async def create_partitions(self, new_counts: dict[str, int], timeout_ms: int | None = None,
                                validate_only: bool = False) -> dict[str, None]:
        """Grow each topic to the given total number of partitions."""
        timeout_ms = self._timeout_ms(timeout_ms)

        def build(names: list[str]) -> Message:
            return CreatePartitionsRequest([CreatePartitionsTopic(n, new_counts[n]) for n in names],
                                           timeout_ms, validate_only)

        outcomes = await self._to_controller(
            list(new_counts), build, ApiKey.CREATE_PARTITIONS,
            lambda r: {t.name: (t.error_code, t.error_message) for t in r.results}, timeout_ms)
        return _raise_for(outcomes, "add partitions to")

    async def describe_topics(self, names: Iterable[str] | None = None,
                              timeout_ms: int | None = None) -> list[TopicDescription]:
        """Partition, leader, leader epoch, replicas, ISR and offline replicas of each topic
        (every topic when ``names`` is None). Raises for a topic that does not exist."""
        wanted = None if names is None else list(dict.fromkeys(names))
        response = await self._metadata(wanted, timeout_ms)
        out = []
        for t in response.topics:
            if t.error_code != NONE.code:
                raise broker_error(t.error_code, f"topic {t.name!r}", t.error_message)
            parts = sorted((PartitionInfo(t.name, p.partition_index, p.leader_id, p.leader_epoch,
                                          tuple(p.replica_nodes), tuple(p.isr_nodes),
                                          tuple(p.offline_replicas), p.error_code)
                            for p in t.partitions), key=lambda p: p.partition)
            out.append(TopicDescription(t.name, parts, t.is_internal))
        return sorted(out, key=lambda d: d.name)

    async def list_topics(self, include_internal: bool = False, timeout_ms: int | None = None) -> list[str]:
        response = await self._metadata(None, timeout_ms)
        return sorted(t.name for t in response.topics
                      if t.error_code == NONE.code and (include_internal or not t.is_internal))

    async def describe_cluster(self, timeout_ms: int | None = None) -> ClusterDescription:
        response = await self._metadata([], timeout_ms)
        return ClusterDescription(response.cluster_id, response.controller_id,
                                  sorted(response.brokers, key=lambda b: b.node_id))

    async def _metadata(self, topics: list[str] | None, timeout_ms: int | None) -> MetadataResponse:
        return await self._cluster.fetch_metadata(topics, timeout=self._timeout_ms(timeout_ms) / 1000,
                                                  allow_auto_topic_creation=False)

    # -- configs --------------------------------------------------------------------------------

    async def describe_configs(self, topic: str, keys: Sequence[str] | None = None,
                               timeout_ms: int | None = None) -> dict[str, ConfigEntry]:
        """The topic's configuration: ``name -> ConfigEntry(name, value, read_only,
        is_default, is_sensitive)``."""
        timeout_ms = self._timeout_ms(timeout_ms)
        found: dict[str, list[ConfigEntry]] = {}

        def extract(r: Any) -> Outcomes:
            out = {}
            for res in r.results:
                out[res.resource_name] = (res.error_code, res.error_message)
                found[res.resource_name] = res.configs
            return out

        outcomes = await self._to_controller(
            [topic], lambda ns: DescribeConfigsRequest([DescribeConfigsResource(TOPIC_RESOURCE, topic,
                                                                                 list(keys) if keys else None)]),
            ApiKey.DESCRIBE_CONFIGS, extract, timeout_ms)
        _raise_for(outcomes, "describe the configuration of")
        return {c.name: c for c in found.get(topic, [])}

    async def alter_configs(self, topic: str, configs: dict[str, str | None],
                            validate_only: bool = False, timeout_ms: int | None = None) -> None:
        """Set each key of the topic's configuration; a None value removes the override."""
        timeout_ms = self._timeout_ms(timeout_ms)
        values = {k: None if v is None else str(v) for k, v in configs.items()}
        outcomes = await self._to_controller(
            [topic], lambda ns: AlterConfigsRequest([AlterConfigsResource(TOPIC_RESOURCE, topic, values)],
                                                    validate_only),
            ApiKey.ALTER_CONFIGS,
            lambda r: {res.resource_name: (res.error_code, res.error_message) for res in r.responses},
            timeout_ms)
        _raise_for(outcomes, "alter the configuration of")

    async def elect_leaders(self, partitions: Iterable[TopicPartition] | None = None,
                            timeout_ms: int | None = None) -> dict[TopicPartition, tuple[int, str | None]]:
        """Preferred leader election (like kafka-leader-election --election-type preferred):
        move leadership of ``partitions`` (None: all) back to their first assigned replica.
        Returns each partition's (error code, message); ELECTION_NOT_NEEDED (84) means the
        preferred replica already leads."""
        timeout_ms = self._timeout_ms(timeout_ms)
        refs = None if partitions is None else [TopicPartitionRef(tp.topic, tp.partition) for tp in partitions]
        answers: list[ElectLeadersResponse] = []

        def extract(r: ElectLeadersResponse) -> Outcomes:
            answers.append(r)
            return {"partitions": (r.error_code, None)}
        outcomes = await self._to_controller(
            ["partitions"], lambda ns: ElectLeadersRequest(refs, timeout_ms=timeout_ms), ApiKey.ELECT_LEADERS,
            extract, timeout_ms)
        _raise_for(outcomes, "elect leaders for")
        return {TopicPartition(x.topic_name, x.partition_index): (x.error_code, x.error_message)
                for x in answers[-1].results}

    # -- routing --------------------------------------------------------------------------------

    def _timeout_ms(self, timeout_ms: int | None) -> int:
        return self.default_api_timeout_ms if timeout_ms is None else timeout_ms

    async def _to_controller(self, names: list[str], build: Callable[[list[str]], Message],
                             api_key: ApiKey, extract: Callable[[Any], Outcomes],
                             timeout_ms: int) -> Outcomes:
        """Send ``build(names)`` to the controller; retry the names answered NOT_CONTROLLER
        (and everything after a connection failure) after a metadata refresh, until
        ``timeout_ms``. Returns every name's final (code, message)."""
        deadline = time.monotonic() + timeout_ms / 1000
        backoff = Backoff(*self._backoff)
        outcomes: Outcomes = {}
        pending = list(names)
        last: BaseException | None = None
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RequestTimedOut(f"{api_key.name} for {pending} did not complete within "
                                      f"{timeout_ms} ms (last error: {last or 'none'})")
            try:
                conn = await self._cluster.controller_connection(timeout=remaining)
                response = await conn.request(build(pending), api_key=api_key, timeout=remaining + 1.0)
            except (BrokerConnectionError, RequestTimedOut) as e:
                last = e
                self._cluster.request_update()
                await self._backoff_then_refresh(backoff, deadline)
                continue
            answered = extract(response)
            retry = []
            for name in pending:
                code, message = answered.get(name, (NOT_CONTROLLER.code, "no result for this topic"))
                if code == NOT_CONTROLLER.code:
                    retry.append(name)
                    last = broker_error(code, f"topic {name!r}", message)
                else:
                    outcomes[name] = (code, message)
            pending = retry
            if pending:
                await self._backoff_then_refresh(backoff, deadline)
        return outcomes

    async def _backoff_then_refresh(self, backoff: Backoff, deadline: float) -> None:
        await trio.sleep(min(backoff.next_delay(), max(0.0, deadline - time.monotonic())))
        with contextlib.suppress(TidelogError):
            await self._cluster.refresh(timeout=max(0.001, deadline - time.monotonic()))


def _raise_for(outcomes: Outcomes, verb: str) -> dict[str, None]:
    results: dict[str, TidelogError | None] = {}
    for name, (code, message) in outcomes.items():
        results[name] = None if code == NONE.code else broker_error(
            code, f"cannot {verb} topic {name!r}", message)
    failures = [e for e in results.values() if e is not None]
    if failures:
        error = failures[0]
        error.results = results
        raise error
    return {name: None for name in results}
