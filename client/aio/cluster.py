"""Cluster metadata and the connection pool every client object shares.

Theory of operation.

* ``ClusterMetadata`` is an immutable snapshot (brokers, topics -> partitions -> leader,
  leader epoch, replicas, ISR, offline replicas, controller id, cluster id), built from
  MetadataResponses by pure code. ``Cluster.metadata`` is replaced as a whole on every update,
  so any thread may read it without a lock (the blocking producer does, to partition records
  without a hop into Trio).
* The cluster fetches metadata for the topics it has been told about (``add_topics``), not
  for every topic, like Kafka's producer and consumer. ``refresh`` asks a broker and retries
  through the known brokers and the bootstrap servers in turn, with exponential backoff
  (``retry_backoff_ms`` doubling up to ``retry_backoff_max_ms``) until its timeout, then raises
  NoBrokersAvailable naming the last failure. Concurrent refreshes are coalesced.
* ``request_update`` marks the metadata stale (a NOT_LEADER_OR_FOLLOWER, a lost connection):
  the background task refreshes it soon, at most once per ``retry_backoff_ms``; it also
  refreshes every ``metadata_max_age_ms``. Listeners registered with ``add_listener`` are called
  after every update (the producer's sender wakes up on it).
* Connections are pooled by node id and opened lazily; a failed or closed connection is
  replaced on the next use, after a per-node reconnect backoff. Bootstrap servers get
  negative node ids (-1, -2, ...) as in Kafka.

Everything but ``metadata`` and ``parse_bootstrap`` must be used from the Trio thread, inside
``run`` (``await nursery.start(cluster.run)``), which owns every connection's reader task.
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import trio

from tidelog.aio.connection import BrokerConnection
from tidelog.errors import BrokerConnectionError, NoBrokersAvailable, RequestTimedOut, broker_error
from tidelog.protocol.address import parse_host_port
from tidelog.protocol.codec import ApiKey, Message
from tidelog.protocol.errors import LEADER_NOT_AVAILABLE, NONE, UNKNOWN_TOPIC_OR_PARTITION, TidelogError, for_code
from tidelog.protocol.messages import (
    NO_LEADER,
    BrokerMetadata,
    ListOffsetsPartition,
    ListOffsetsRequest,
    ListOffsetsTopic,
    MetadataRequest,
    MetadataResponse,
)
from tidelog.protocol.topics import TopicPartition
from tidelog.security import SecurityConfig

__all__ = ["parse_bootstrap", "PartitionInfo", "TopicInfo", "ClusterMetadata", "Cluster", "Backoff"]

log = logging.getLogger(__name__)


def parse_bootstrap(servers: str | Sequence[str]) -> list[tuple[str, int]]:
    """``"host:port[,host:port]"`` (or a list of ``"host:port"``) -> ``[(host, port), ...]``.
    IPv6 literals go in brackets (``[::1]:9092``). Raises ValueError naming the bad entry."""
    items = servers.split(",") if isinstance(servers, str) else list(servers)
    out = []
    for raw in items:
        item = raw.strip()
        if not item:
            continue
        host, port = "", 0
        with contextlib.suppress(ValueError):
            host, port = parse_host_port(item, min_port=1)
        if not host:
            raise ValueError(f"invalid bootstrap server {item!r}: expected host:port")
        out.append((host, port))
    if not out:
        raise ValueError(f"no bootstrap servers in {servers!r}")
    return out


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    """One partition as the metadata describes it. ``leader`` is -1 when there is none."""

    topic: str
    partition: int
    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    offline: tuple[int, ...] = ()
    error_code: int = 0


@dataclass(frozen=True, slots=True)
class TopicInfo:
    name: str
    error_code: int
    partitions: dict[int, PartitionInfo]
    is_internal: bool = False
    partition_ids: tuple[int, ...] = ()  # sorted
    available: tuple[int, ...] = ()  # partitions with a leader, sorted

    @classmethod
    def build(cls, name: str, error_code: int, partitions: Iterable[PartitionInfo],
              is_internal: bool = False) -> "TopicInfo":
        parts = {p.partition: p for p in partitions}
        ids = tuple(sorted(parts))
        available = tuple(p for p in ids if parts[p].leader != NO_LEADER)
        return cls(name, error_code, parts, is_internal, ids, available)


@dataclass(frozen=True, slots=True)
class ClusterMetadata:
    """An immutable snapshot of what the cluster said; ``merge`` returns a new one."""

    brokers: dict[int, BrokerMetadata] = field(default_factory=dict)
    topics: dict[str, TopicInfo] = field(default_factory=dict)
    controller_id: int = -1
    cluster_id: str | None = None
    topic_errors: dict[str, int] = field(default_factory=dict)  # topics a broker refused, by name
    version: int = 0  # increases with every update

    def leader_for(self, tp: TopicPartition) -> int | None:
        """The leader's node id, or None when unknown, leaderless or not a live broker."""
        topic = self.topics.get(tp.topic)
        if topic is None:
            return None
        p = topic.partitions.get(tp.partition)
        if p is None or p.leader == NO_LEADER or p.leader not in self.brokers:
            return None
        return p.leader

    def partition(self, tp: TopicPartition) -> PartitionInfo | None:
        topic = self.topics.get(tp.topic)
        return None if topic is None else topic.partitions.get(tp.partition)

    def partitions_for(self, topic: str) -> tuple[int, ...] | None:
        """The topic's partition ids, or None when the topic is not (yet) known."""
        t = self.topics.get(topic)
        return None if t is None else t.partition_ids

    def available_partitions_for(self, topic: str) -> tuple[int, ...]:
        t = self.topics.get(topic)
        return () if t is None else t.available

    def merge(self, response: MetadataResponse, requested: Sequence[str] | None) -> "ClusterMetadata":
        """The snapshot after ``response`` to a request for ``requested`` topics (None: all).

        Brokers and controller are replaced. Topics: for an all-topics request the listing is
        replaced; otherwise the requested topics are replaced and the others kept. A topic
        answered with an error (UNKNOWN_TOPIC_OR_PARTITION, LEADER_NOT_AVAILABLE while it is
        being created, ...) leaves ``topics`` and is recorded in ``topic_errors``."""
        topics = {} if requested is None else {k: v for k, v in self.topics.items() if k not in requested}
        errors = {} if requested is None else {k: v for k, v in self.topic_errors.items() if k not in requested}
        for t in response.topics:
            if t.error_code != NONE.code or not t.partitions:
                errors[t.name] = t.error_code if t.error_code != NONE.code else UNKNOWN_TOPIC_OR_PARTITION.code
                continue
            parts = (PartitionInfo(t.name, p.partition_index, p.leader_id, p.leader_epoch,
                                   tuple(p.replica_nodes), tuple(p.isr_nodes),
                                   tuple(p.offline_replicas), p.error_code) for p in t.partitions)
            topics[t.name] = TopicInfo.build(t.name, t.error_code, parts, t.is_internal)
        brokers = {b.node_id: b for b in response.brokers}
        return ClusterMetadata(brokers, topics, response.controller_id, response.cluster_id,
                               errors, self.version + 1)


class Backoff:
    """Exponential backoff: ``initial_s`` doubling (with +-20 % jitter) up to ``max_s``."""

    __slots__ = ("initial_s", "max_s", "attempts")

    def __init__(self, initial_s: float, max_s: float):
        self.initial_s = initial_s
        self.max_s = max_s
        self.attempts = 0

    def next_delay(self) -> float:
        delay = min(self.max_s, self.initial_s * (2 ** min(self.attempts, 30)))
        self.attempts += 1
        return delay * random.uniform(0.8, 1.2) if delay < self.max_s else delay

    def reset(self) -> None:
        self.attempts = 0


class Cluster:
    """Metadata cache and connection pool. Run it with ``await nursery.start(cluster.run)``."""

    def __init__(self, bootstrap_servers: str | Sequence[str], *, client_id: str | None = None,
                 request_timeout_ms: int = 30000, max_in_flight_requests_per_connection: int = 5,
                 retry_backoff_ms: int = 100, retry_backoff_max_ms: int = 1000,
                 reconnect_backoff_ms: int = 50, reconnect_backoff_max_ms: int = 1000,
                 metadata_max_age_ms: int = 300000, connect_timeout_ms: int = 10000,
                 allow_auto_topic_creation: bool = False, security: SecurityConfig | None = None):
        self.bootstrap = parse_bootstrap(bootstrap_servers)
        self.security = security
        self.client_id = client_id
        self.request_timeout_s = request_timeout_ms / 1000
        self.max_in_flight = max_in_flight_requests_per_connection
        self.retry_backoff_s = retry_backoff_ms / 1000
        self.retry_backoff_max_s = retry_backoff_max_ms / 1000
        self.reconnect_backoff_s = reconnect_backoff_ms / 1000
        self.reconnect_backoff_max_s = reconnect_backoff_max_ms / 1000
        self.metadata_max_age_s = metadata_max_age_ms / 1000
        self.connect_timeout_s = connect_timeout_ms / 1000
        self.allow_auto_topic_creation = allow_auto_topic_creation
        self.metadata = ClusterMetadata()
        self._topics: set[str] = set()
        self._conns: dict[int, BrokerConnection] = {}
        self._extra_nodes: dict[int, tuple[str, int]] = {}  # node id -> address, outside the metadata
        self._connect_locks: dict[int, trio.Lock] = {}
        self._reconnect: dict[int, tuple[Backoff, float, BaseException]] = {}  # node -> (backoff, not before, why)
        self._refresh_lock = trio.Lock()
        self._update_requested = trio.Event()
        self._updated = trio.Event()  # a fresh event per metadata generation
        self._last_refresh = -float("inf")
        self._last_refreshed_topics: frozenset[str] = frozenset()
        self._refresh_seq = 0  # refreshes started
        self._completed_seq = 0  # the seq of the last refresh that completed
        self._listeners: list[Callable[[ClusterMetadata], None]] = []
        self._nursery: trio.Nursery | None = None
        self._closed = False
        self.last_error: BaseException | None = None  # of the latest failed request to any broker

    # -- lifecycle ------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the connections' reader tasks and the background metadata refresh until
        ``aclose`` (or cancellation)."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._metadata_loop)
                task_status.started()
        finally:
            self._closed = True
            for conn in list(self._conns.values()):
                conn.abort("client closed")

    async def aclose(self) -> None:
        self._closed = True
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()
        await trio.lowlevel.checkpoint()

    def add_listener(self, listener: Callable[[ClusterMetadata], None]) -> None:
        self._listeners.append(listener)

    # -- metadata -------------------------------------------------------------------------------

    @property
    def topics(self) -> frozenset[str]:
        return frozenset(self._topics)

    def leader_for(self, tp: TopicPartition) -> int | None:
        """The partition's leader in the current snapshot (None: unknown or leaderless)."""
        return self.metadata.leader_for(tp)

    def partitions_for(self, topic: str) -> tuple[int, ...] | None:
        """The topic's partition ids in the current snapshot (None: not known yet)."""
        return self.metadata.partitions_for(topic)

    def add_topics(self, topics: Iterable[str]) -> bool:
        """Track these topics' metadata; True if any was new (the caller may refresh)."""
        new = set(topics) - self._topics
        self._topics |= new
        return bool(new)

    def set_topics(self, topics: Iterable[str]) -> None:
        self._topics = set(topics)

    def request_update(self) -> None:
        """Mark the metadata stale; the background task refreshes it soon."""
        self._update_requested.set()

    async def wait_for_update(self, timeout: float) -> bool:
        """Wait for the next metadata update (True) or ``timeout`` seconds (False)."""
        event = self._updated
        with trio.move_on_after(timeout):
            await event.wait()
            return True
        return False

    async def refresh(self, topics: Iterable[str] | None = None, *,
                      timeout: float | None = None) -> ClusterMetadata:
        """Fetch metadata for the tracked topics (plus ``topics``, which become tracked).
        Coalesced: a caller that waited for another refresh started after it asked reuses it.
        Raises NoBrokersAvailable if no broker answered within ``timeout``."""
        if topics is not None:
            self.add_topics(topics)
        ticket = self._refresh_seq + 1
        wanted = frozenset(self._topics)
        timeout = self.request_timeout_s if timeout is None else timeout
        deadline = trio.current_time() + timeout
        acquired = False
        with trio.move_on_at(deadline):
            await self._refresh_lock.acquire()  # may wait for a refresh already under way
            acquired = True
        if not acquired:
            raise NoBrokersAvailable(f"metadata refresh did not complete within {timeout:g} s "
                                     f"(bootstrap {self._bootstrap_text()}; last error: {self.last_error or 'none'})")
        try:
            if self._completed_seq >= ticket and wanted <= self._last_refreshed_topics:
                return self.metadata  # a refresh that started after we asked covers us
            self._refresh_seq += 1
            seq = self._refresh_seq
            # not under a cancel scope of the same deadline: request_any bounds itself, and a
            # request that times out must do so in its own scope, which closes the connection
            # (else a broker that accepts but never answers would be picked again and again)
            await self.fetch_metadata(sorted(self._topics), timeout=max(0.0, deadline - trio.current_time()))
            self._completed_seq = seq
            return self.metadata
        finally:
            self._refresh_lock.release()

    async def fetch_metadata(self, topics: list[str] | None, *, timeout: float | None = None,
                             allow_auto_topic_creation: bool | None = None) -> MetadataResponse:
        """One MetadataRequest for ``topics`` (None: every topic), sent to any reachable
        broker with retries and backoff; the response also updates the cache."""
        auto = self.allow_auto_topic_creation if allow_auto_topic_creation is None else allow_auto_topic_creation
        request = MetadataRequest(topics=topics, allow_auto_topic_creation=auto)
        response = await self.request_any(request, api_key=ApiKey.METADATA, timeout=timeout)
        self._apply(response, topics)
        return response

    def _apply(self, response: MetadataResponse, requested: list[str] | None) -> None:
        self.metadata = self.metadata.merge(response, requested)
        self._last_refresh = time.monotonic()
        self._last_refreshed_topics = frozenset(requested) if requested is not None else frozenset(self._topics)
        updated, self._updated = self._updated, trio.Event()
        updated.set()
        for listener in self._listeners:
            listener(self.metadata)

    async def _metadata_loop(self) -> None:
        backoff = Backoff(self.retry_backoff_s, self.retry_backoff_max_s)
        while True:
            age = time.monotonic() - self._last_refresh
            with trio.move_on_after(max(0.0, self.metadata_max_age_s - age)):
                await self._update_requested.wait()
            since = time.monotonic() - self._last_refresh
            new_topics = not self._topics <= self._last_refreshed_topics  # as Kafka: no wait for those
            if since < self.retry_backoff_s and not new_topics:  # else one refresh per retry_backoff_ms
                await trio.sleep(self.retry_backoff_s - since)
            self._update_requested = trio.Event()
            try:
                await self.refresh(timeout=self.request_timeout_s)
                backoff.reset()
            except TidelogError as e:
                log.debug("metadata refresh failed: %s", e)
                self._update_requested.set()
                await trio.sleep(backoff.next_delay())

    # -- requests -------------------------------------------------------------------------------

    async def request_any(self, message: Message, *, api_key: ApiKey,
                          timeout: float | None = None) -> Message:
        """Send ``message`` to any reachable broker (known brokers first, then bootstrap
        servers), retrying with backoff until ``timeout``; raises NoBrokersAvailable."""
        timeout = self.request_timeout_s if timeout is None else timeout
        deadline = trio.current_time() + timeout
        backoff = Backoff(self.retry_backoff_s, self.retry_backoff_max_s)
        last: BaseException | None = None
        while True:
            for node_id in self._candidates():
                remaining = deadline - trio.current_time()
                if remaining <= 0:
                    break
                try:
                    conn = await self.connection(node_id)
                    return await conn.request(message, api_key=api_key,
                                              timeout=min(remaining, self.request_timeout_s))
                except (BrokerConnectionError, RequestTimedOut) as e:
                    last = self.last_error = e
            delay = backoff.next_delay()
            if trio.current_time() + delay >= deadline:
                raise NoBrokersAvailable(
                    f"no broker answered a {api_key.name} request within {timeout:g} s "
                    f"(bootstrap {self._bootstrap_text()}; last error: {last or 'none'})")
            await trio.sleep(delay)

    async def request(self, node_id: int, message: Message, *, api_key: ApiKey,
                      timeout: float | None = None, early: Callable[[Any], None] | None = None) -> Message:
        """``BrokerConnection.request`` on the connection to ``node_id`` (see ``early`` there)."""
        conn = await self.connection(node_id)
        return await conn.request(message, api_key=api_key, timeout=timeout, early=early)

    def _candidates(self) -> list[int]:
        """Node ids to try for a metadata-like request: connected brokers (least loaded
        first), other known brokers in random order, then the bootstrap servers."""
        known = list(self.metadata.brokers)
        random.shuffle(known)
        connected = sorted((n for n in known if self._is_connected(n)), key=lambda n: self._conns[n].in_flight)
        others = [n for n in known if n not in connected]
        return connected + others + [-(i + 1) for i in range(len(self.bootstrap))]

    def _is_connected(self, node_id: int) -> bool:
        conn = self._conns.get(node_id)
        return conn is not None and not conn.closed

    def _bootstrap_text(self) -> str:
        return ",".join(f"{h}:{p}" for h, p in self.bootstrap)

    async def controller_connection(self, *, timeout: float | None = None) -> BrokerConnection:
        """A connection to the controller (refreshing metadata when it is unknown)."""
        if self.metadata.controller_id not in self.metadata.brokers:
            await self.refresh(timeout=timeout)
        controller = self.metadata.controller_id
        if controller not in self.metadata.brokers:
            raise BrokerConnectionError(f"the cluster reports no live controller (controller id {controller})")
        return await self.connection(controller)

    # -- connection pool ------------------------------------------------------------------------

    def add_node(self, node_id: int, host: str, port: int) -> None:
        """Address a node the metadata does not list under that id: the group coordinator gets
        a connection of its own (id ``COORDINATOR_ID_BASE - broker id``, as in Kafka), so its
        requests never queue behind long-polling fetches to the same broker."""
        if self._extra_nodes.get(node_id) != (host, port):
            self._extra_nodes[node_id] = (host, port)
            self.close_connection(node_id)

    def close_connection(self, node_id: int) -> None:
        """Drop the pooled connection to ``node_id`` (its pending requests fail)."""
        conn = self._conns.pop(node_id, None)
        if conn is not None:
            conn.abort("closed by the client")

    def address_of(self, node_id: int) -> tuple[str, int]:
        if node_id in self._extra_nodes:
            return self._extra_nodes[node_id]
        if node_id < 0:
            index = -node_id - 1
            if index < len(self.bootstrap):
                return self.bootstrap[index]
        broker = self.metadata.brokers.get(node_id)
        if broker is None:
            raise BrokerConnectionError(f"node {node_id} is not in the cluster metadata")
        return broker.host, broker.port

    def throttled(self) -> dict[int, float]:
        """Nodes whose connection is throttled (KIP-219): node -> seconds until it may be sent
        to again. Kafka's NetworkClient does not count such a node ready, so nothing is drained
        or planned for it before then: what waits meanwhile goes in the first request after."""
        now = trio.current_time()
        return {node: conn.throttled_until - now for node, conn in self._conns.items()
                if conn.throttled_until > now and not conn.closed}

    def open_connection(self, node_id: int) -> BrokerConnection | None:
        """The open connection to ``node_id`` if there is one (no connecting, no waiting)."""
        conn = self._conns.get(node_id)
        return conn if conn is not None and not conn.closed else None

    async def connection(self, node_id: int) -> BrokerConnection:
        """The open connection to ``node_id``, connecting if needed. Raises
        BrokerConnectionError when it cannot connect or is in reconnect backoff."""
        conn = self._conns.get(node_id)
        if conn is not None and not conn.closed:
            return conn
        lock = self._connect_locks.setdefault(node_id, trio.Lock())
        async with lock:
            conn = self._conns.get(node_id)
            if conn is not None and not conn.closed:
                return conn
            if conn is not None and node_id >= 0 and self._conns.pop(node_id, None) is conn:
                # lost: the broker may have moved leadership away, or closed it to say so (a
                # failed acks=0 produce has no response): the metadata is asked again, as
                # Kafka's client does on a disconnection
                self.request_update()
            return await self._connect(node_id)

    async def _connect(self, node_id: int) -> BrokerConnection:
        if self._closed or self._nursery is None:
            raise BrokerConnectionError("the client is not running (closed, or run() not started)")
        host, port = self.address_of(node_id)
        backoff, not_before, failure = self._reconnect.get(node_id, (None, 0.0, None))
        if time.monotonic() < not_before:
            raise BrokerConnectionError(f"node {node_id} is in reconnect backoff after: {failure}")
        conn = BrokerConnection(host, port, node_id=node_id, client_id=self.client_id,
                                max_in_flight=self.max_in_flight,
                                request_timeout_s=self.request_timeout_s,
                                connect_timeout_s=self.connect_timeout_s, security=self.security)
        try:
            await self._nursery.start(conn.run)
        except BrokerConnectionError as e:
            backoff = backoff or Backoff(self.reconnect_backoff_s, self.reconnect_backoff_max_s)
            self._reconnect[node_id] = (backoff, time.monotonic() + backoff.next_delay(), e)
            if node_id >= 0:
                self.request_update()
            raise
        self._reconnect.pop(node_id, None)
        self._conns[node_id] = conn
        return conn


async def list_offsets(cluster: "Cluster", wanted: dict[TopicPartition, int], deadline: float, *,
                       backoff: Backoff, refetch_metadata: bool = False,
                       tolerate_missing: bool = False) -> dict[TopicPartition, tuple[int, int]]:
    """ListOffsets for each partition (-2 earliest, -1 latest, i.e. the high watermark, else a
    timestamp in ms) -> (offset, timestamp), from its leader, with the leader epoch the
    metadata knows it by (see ``to_leaders`` for retries, metadata and ``tolerate_missing``)."""
    return await to_leaders(cluster, wanted, deadline, backoff=backoff, api_key=ApiKey.LIST_OFFSETS,
                            request_for=lambda timestamps, metadata, _timeout_s: list_offsets_request(timestamps, metadata),
                            answer_of=lambda p: (p.offset, p.timestamp), what="offsets",
                            refetch_metadata=refetch_metadata, tolerate_missing=tolerate_missing)


def list_offsets_request(timestamps: dict[TopicPartition, int], metadata: ClusterMetadata) -> ListOffsetsRequest:
    by_topic: dict[str, list[ListOffsetsPartition]] = {}
    for tp, ts in timestamps.items():
        info = metadata.partition(tp)
        epoch = info.leader_epoch if info is not None else -1
        by_topic.setdefault(tp.topic, []).append(ListOffsetsPartition(tp.partition, ts, epoch))
    return ListOffsetsRequest(topics=[ListOffsetsTopic(t, ps) for t, ps in by_topic.items()])


async def to_leaders(cluster: "Cluster", wanted: dict[TopicPartition, Any], deadline: float, *,
                     backoff: Backoff, api_key: ApiKey,
                     request_for: Callable[[dict[TopicPartition, Any], ClusterMetadata, float], Message],
                     answer_of: Callable[[Any], Any], what: str, refetch_metadata: bool = False,
                     tolerate_missing: bool = False,
                     errors: dict[TopicPartition, TidelogError] | None = None,
                     leaderless_rounds: int | None = None, partial: bool = False) -> dict[TopicPartition, Any]:
    """Ask each partition's leader (ListOffsets, DeleteRecords: one request per leader, built by
    ``request_for(its partitions' values, metadata, request timeout in s)``, whose response
    lists ``topics`` of ``partitions`` with ``partition_index``, ``error_code`` and
    ``error_message``) and return ``answer_of(partition result)`` per partition. Retriable
    errors are retried with ``backoff`` until monotonic ``deadline`` (with one last attempt),
    then RequestTimedOut names what is missing and the last error. The leaders are asked
    at the same time; a partition's non-retriable error is raised once the round is over,
    or, with ``errors``, stored there (the other partitions are still answered).

    Metadata: a consumer's cluster tracks the wanted topics and refreshes them only when a
    leader is unknown (an error that invalidates them asks for a refresh in the background);
    an admin's (``refetch_metadata``), which tracks no topics, fetches theirs every round.
    ``tolerate_missing``: partitions of topics that do not exist are left out of the result
    (an admin's lag of a deleted topic) instead of failing the call.

    An admin's partition that its topic does not have (``orders:7`` of a topic of 3) fails
    with UNKNOWN_TOPIC_OR_PARTITION when the next metadata (fetched in case partitions were
    just added) still does not list it, as Kafka's admin client fails it at once.
    ``leaderless_rounds`` (with ``errors``): a partition still without a leader after that many
    rounds is stored in ``errors`` with the reason, rather than waited for until ``deadline``.
    ``partial`` (with ``errors``): at ``deadline`` the partitions still unanswered (a leader
    known but unreachable) are stored in ``errors`` with the RequestTimedOut, and the answered
    ones returned, rather than the call failing as a whole. No round outlasts ``deadline``
    (a connection that takes longer to open is given up)."""
    topics = sorted({tp.topic for tp in wanted})
    if not refetch_metadata:
        cluster.add_topics(topics)
    remaining = dict(wanted)
    found: dict[TopicPartition, Any] = {}
    last: BaseException | None = None
    absent: set[TopicPartition] = set()  # not in their topic's partitions in the last metadata
    absent_in = -1  # the version of that metadata
    rounds = 0
    while True:
        timeout = max(0.001, deadline - time.monotonic())
        try:
            if refetch_metadata:
                await cluster.fetch_metadata(topics, timeout=timeout)
            elif any(cluster.metadata.leader_for(tp) is None for tp in remaining):
                await cluster.refresh(timeout=timeout)
        except TidelogError as e:
            last = e
        rounds += 1
        failed: dict[TopicPartition, TidelogError] = {}
        if refetch_metadata and cluster.metadata.version != absent_in:  # judged once per metadata answer
            absent, absent_in = _fail_absent(cluster.metadata, remaining, absent, failed), cluster.metadata.version
        by_node, unknown = _by_leader(cluster.metadata, remaining, tolerate_missing)
        last = unknown or last
        if errors is not None and leaderless_rounds is not None and rounds >= leaderless_rounds:
            for tp in [tp for tp in remaining if cluster.metadata.leader_for(tp) is None]:
                failed[tp] = broker_error(LEADER_NOT_AVAILABLE.code, f"partition {tp}",
                                          f"no leader known after {rounds} attempts")
                del remaining[tp]
        retriable: list[BaseException] = []

        async def ask(node: int, values: dict[TopicPartition, Any]) -> None:
            timeout = max(0.001, min(deadline - time.monotonic(), cluster.request_timeout_s))
            try:
                response = await cluster.request(node, request_for(values, cluster.metadata, timeout),
                                                 api_key=api_key, timeout=timeout)
            except (BrokerConnectionError, RequestTimedOut) as e:
                retriable.append(e)
                cluster.request_update()
                return
            except TidelogError as e:  # the whole request refused: its partitions share the answer
                if e.retriable:
                    retriable.append(e)
                    cluster.request_update()
                    return
                for tp in values:
                    remaining.pop(tp, None)
                    failed[tp] = e
                return
            _absorb_answers(cluster, response, remaining, found, answer_of, failed, retriable)

        with trio.move_on_after(max(0.001, deadline - time.monotonic())):  # as ask's own timeout
            async with trio.open_nursery() as nursery:
                for node, values in by_node.items():
                    nursery.start_soon(ask, node, values)
        last = retriable[-1] if retriable else last
        if failed and errors is None:
            raise next(iter(failed.values()))
        if failed:
            errors.update(failed)
        if not remaining:
            return found
        if time.monotonic() + backoff.initial_s >= deadline:
            timed_out = RequestTimedOut(f"{what} of {sorted(map(str, remaining))} not found in time "
                                        f"(last error: {last or 'none'})")
            if not partial or errors is None:
                raise timed_out
            errors.update(dict.fromkeys(remaining, timed_out))
            return found
        await trio.sleep(min(backoff.next_delay(), max(0.0, deadline - time.monotonic())))


def _fail_absent(metadata: ClusterMetadata, remaining: dict[TopicPartition, Any],
                 absent_before: set[TopicPartition], failed: dict[TopicPartition, TidelogError]
                 ) -> set[TopicPartition]:
    """Move the partitions their known topic did not list in the last two metadata answers
    from ``remaining`` to ``failed`` (UNKNOWN_TOPIC_OR_PARTITION); returns those it did not
    list for the first time."""
    absent: set[TopicPartition] = set()
    for tp in list(remaining):
        ids = metadata.partitions_for(tp.topic)
        if ids is None or tp.partition in ids:
            continue
        if tp not in absent_before:
            absent.add(tp)
            continue
        failed[tp] = broker_error(UNKNOWN_TOPIC_OR_PARTITION.code, f"partition {tp}",
                                  f"topic {tp.topic!r} has no partition {tp.partition} "
                                  f"(it has {len(ids)}: {_id_ranges(ids)})")
        del remaining[tp]
    return absent


def _id_ranges(ids: Sequence[int]) -> str:
    return f"{min(ids)}-{max(ids)}" if sorted(ids) == list(range(min(ids), max(ids) + 1)) else \
        ", ".join(map(str, sorted(ids)))


def _by_leader(metadata: ClusterMetadata, remaining: dict[TopicPartition, Any], tolerate_missing: bool
               ) -> tuple[dict[int, dict[TopicPartition, Any]], BaseException | None]:
    """``remaining`` grouped by leader, and why some partition has none (retriable); raises
    when a topic's error is not retriable (or drops its partitions with ``tolerate_missing``)."""
    by_node: dict[int, dict[TopicPartition, Any]] = {}
    last: BaseException | None = None
    for tp, value in list(remaining.items()):
        leader = metadata.leader_for(tp)
        if leader is not None:
            by_node.setdefault(leader, {})[tp] = value
            continue
        code = metadata.topic_errors.get(tp.topic)
        if code is not None and not for_code(code).retriable:
            if not tolerate_missing:
                raise broker_error(code, f"topic {tp.topic!r}")
            del remaining[tp]
        else:
            last = broker_error(code, f"topic {tp.topic!r}") if code else \
                BrokerConnectionError(f"no leader known for partition {tp}")
    return by_node, last


def _absorb_answers(cluster: "Cluster", response: Any, remaining: dict[TopicPartition, Any],
                    found: dict[TopicPartition, Any], answer_of: Callable[[Any], Any],
                    failed: dict[TopicPartition, TidelogError], retriable: list[BaseException]) -> None:
    """Move the partitions a response answered from ``remaining`` to ``found``, or, for a
    non-retriable error, to ``failed``; a retriable error stays for the caller's retry (in
    ``retriable``, asking for fresh metadata when it says ours is stale)."""
    for t in response.topics:
        for p in t.partitions:
            tp = TopicPartition(t.name, p.partition_index)
            if tp not in remaining:
                continue
            if p.error_code == NONE.code:
                found[tp] = answer_of(p)
                del remaining[tp]
                continue
            err = broker_error(p.error_code, f"partition {tp}", p.error_message)
            if not err.retriable:
                failed[tp] = err
                del remaining[tp]
                continue
            if err.invalid_metadata:
                cluster.request_update()
            retriable.append(err)
