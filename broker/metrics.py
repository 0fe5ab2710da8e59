"""The broker's Prometheus endpoint: Kafka's key broker metrics under Tidelog names.

Theory of operation. Nothing here runs per record, and almost nothing per request:

* **Scrape-time state.** ``BrokerCollector.collect`` reads the broker's live state when
  Prometheus scrapes: the replica manager's partitions (under-replicated, under-min-ISR,
  at-min-ISR, leader and partition counts, per-partition log size and offsets), its ISR
  shrink/expand counters, the controller's view (active or not, offline partitions), the
  network's counters and the broker's readiness. The broker keeps these anyway; reading them
  costs the hot path nothing.
* **One observation per request.** ``RequestMetrics.instrument`` wraps the handler that the
  socket server calls (``Apis.handle``). Per request it takes two clock readings, bumps a
  plain integer histogram bucket, and for Produce and Fetch walks the *batch headers* of the
  request or response (one struct read per batch, never per record) to count bytes and
  records per topic. The counts are plain ints and dicts on the Trio thread; the collector
  turns them into Prometheus families at scrape time. No locks, no label lookups per request.
* **Purgatories.** The replica manager counts what waits in its purgatories (Kafka's
  DelayedProduce and DelayedFetch): acks=all produces waiting for the high watermark and
  fetches waiting for records, read at scrape time. A request awaited for anything else (a
  produce validated in a worker thread, an old client's throttle delay) is not counted.
* **The endpoint** is a small HTTP/1.0 server on the broker's Trio loop (``MetricsServer``):
  ``GET /metrics`` renders the registry with prometheus_client's encoder (the text format,
  or OpenMetrics when the scraper's Accept header asks for it) on the Trio thread, so a scrape
  sees a consistent snapshot and never races the broker's data structures; a rendering is
  served again for a second (longer when it took long), so scrapers at any rate and in any
  number render it once per period, and at most 16 connections are served at once;
  ``GET /ready`` answers 200 when the broker is ready (broker/health.py) and 503 with the
  failing checks otherwise; ``GET /live`` answers 200 while the loop runs.

Consumer group lag comes from the group coordinator (broker/groups): each broker exports
``tidelog_group_lag{group,topic,partition}`` for the groups it coordinates, read at scrape
time: the partition's high watermark (this broker's own when it leads the partition, else the
leader's answer to a ListOffsets refreshed every few seconds) minus the group's committed
offset; and ``tidelog_group_count{state}``, the groups it coordinates by state.

Request latency is measured from the moment the socket server hands the parsed request to
the handler until the handler's response is ready (Kafka's LocalTimeMs + RemoteTimeMs: for
acks=all produce it includes the wait for replication; for fetch, the long poll). Time spent
queued behind other requests of the connection and writing the response is not included:
the queue time (from a frame fully read to its handler's start: a decode in a worker thread,
or a wait for room under ``queued.max.requests``) is the socket server's, counted only on the
path that waits (``NetworkStats.request_queue_time_s``) and exported as a summary.

Failed requests: the wrapper walks each response's ``error_code`` fields (the top level and
two levels of lists: topics, then partitions), so every error code a response carries is
counted per request type and error name (Kafka's ErrorsPerSec); so is the code of a whole
request refused (its error body), and a handler that raised counts as the code it is answered
with (its TidelogError's, else UNKNOWN_SERVER_ERROR). The walk reads the message objects the
handler built anyway, one attribute per item, with each class's plan cached; a fetch is
answered with its body, whose partitions are read as maps.

Event-loop lag (``LoopLagProbe``): a task that sleeps ``LOOP_LAG_INTERVAL_S`` at a time and
records how late it woke past its deadline: how long a task that became ready waited for the
loop (a long synchronous step anywhere on the broker's Trio thread shows here). Ten
wake-ups a second; nothing on the request path.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import struct
import time
import typing
from bisect import bisect_left
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

import trio
from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.exposition import choose_encoder

from tidelog.broker.deferred import DeferredResponse, Throttled, is_awaitable, is_deferred
from tidelog.protocol.codec import ApiKey
from tidelog.protocol.errors import code_of, for_code
from tidelog.protocol.messages import FetchResponse, ProduceResponse, fetch_answer_parts
from tidelog.protocol.records import BATCH_LENGTH_AT, HEADER_SIZE, LOG_OVERHEAD

if TYPE_CHECKING:
    from tidelog.broker.controller.controller import Controller
    from tidelog.broker.groups.group_coordinator import GroupCoordinator
    from tidelog.broker.health import Readiness
    from tidelog.broker.log.cleaner import LogCleaner
    from tidelog.broker.log.manager import LogManager
    from tidelog.broker.network import NetworkStats
    from tidelog.broker.replication.replica_manager import ReplicaManager

logger = logging.getLogger("tidelog.metrics")

# Request latency buckets (seconds): sub-millisecond metadata calls up to long-polled fetches
# and acks=all produces waiting for slow followers.
LATENCY_BUCKETS_S: tuple[float, ...] = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                        0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# Event-loop lag buckets (seconds): a healthy loop wakes within a millisecond; a loop blocked
# by a long synchronous step (a large decode, a slow disk call) for a second or more.
LOOP_LAG_BUCKETS_S: tuple[float, ...] = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                         0.25, 0.5, 1.0, 2.5, 5.0)
LOOP_LAG_INTERVAL_S = 0.1
_I32 = struct.Struct(">i")
RECORDS_COUNT_AT = HEADER_SIZE - 4  # the batch header's last field
_REQUEST_NAMES = {int(k): "".join(w.capitalize() for w in k.name.split("_")) for k in ApiKey}
_FETCH = int(ApiKey.FETCH)
_PRODUCE = int(ApiKey.PRODUCE)

Handler = Callable[[Any, dict], Any]


def batch_stats(records: bytes | None) -> tuple[int, int]:
    """(bytes, records) of the whole batches in ``records``: one header read per batch. A
    trailing partial batch (a fetch may end with one) counts for neither."""
    if not records:
        return 0, 0
    n, pos, end = 0, 0, len(records)
    while pos + HEADER_SIZE <= end:
        size = LOG_OVERHEAD + _I32.unpack_from(records, pos + BATCH_LENGTH_AT)[0]
        if size < HEADER_SIZE or pos + size > end:
            break
        n += _I32.unpack_from(records, pos + RECORDS_COUNT_AT)[0]
        pos += size
    return pos, n


def request_name(api_key: int, body: Any = None) -> str:
    """Kafka's request names: ``Produce``, ``Metadata``, ...; fetches split into
    ``FetchConsumer`` and ``FetchFollower`` (by the request's replica id), as Kafka does."""
    if api_key == _FETCH:
        follower = isinstance(body, dict) and isinstance(body.get("replica_id"), int) and body["replica_id"] >= 0
        return "FetchFollower" if follower else "FetchConsumer"
    return _REQUEST_NAMES.get(api_key, f"ApiKey{api_key}")


# class -> (has an error_code field, names of its fields that are lists of messages), for
# ``count_errors``: built once per class from its type hints
_ERROR_PLANS: dict[type, tuple[bool, tuple[str, ...]]] = {}


def _error_plan(cls: type) -> tuple[bool, tuple[str, ...]]:
    plan = _ERROR_PLANS.get(cls)
    if plan is None:
        if not dataclasses.is_dataclass(cls):
            plan = (False, ())
        else:
            hints = typing.get_type_hints(cls)
            lists = tuple(f.name for f in dataclasses.fields(cls)
                          if typing.get_origin(hints[f.name]) is list
                          and dataclasses.is_dataclass(typing.get_args(hints[f.name])[0]))
            plan = (any(f.name == "error_code" for f in dataclasses.fields(cls)), lists)
        _ERROR_PLANS[cls] = plan
    return plan


def count_errors(response: Any, into: dict[int, int] | None = None, depth: int = 2) -> dict[int, int] | None:
    """Every non-zero ``error_code`` of ``response`` counted (None when there is none, the
    usual case, which allocates nothing): its own, and those of the messages in its list
    fields, ``depth`` levels down (topics, then partitions)."""
    has_code, lists = _error_plan(type(response))
    if has_code and (code := response.error_code):
        into = {} if into is None else into
        into[code] = into.get(code, 0) + 1
    if depth:
        for name in lists:
            for item in getattr(response, name):
                into = count_errors(item, into, depth - 1)
    return into


class _Histogram:
    """A latency histogram as plain ints: one bucket increment per observation."""

    __slots__ = ("bounds", "buckets", "count", "sum")

    def __init__(self, bounds: tuple[float, ...] = LATENCY_BUCKETS_S) -> None:
        self.bounds = bounds
        self.buckets = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.count = 0
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        self.buckets[bisect_left(self.bounds, seconds)] += 1
        self.count += 1
        self.sum += seconds

    def cumulative(self) -> list[tuple[str, int]]:
        out, total = [], 0
        for bound, n in zip((*map(str, self.bounds), "+Inf"), self.buckets):
            total += n
            out.append((bound, total))
        return out


class RequestMetrics:
    """What can only be seen per request: rates and latencies per API, bytes and records in
    and out per topic. Updated on the broker's Trio thread only."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self.clock = clock
        self.latency: dict[str, _Histogram] = {}
        self.errors: Counter[tuple[str, int]] = Counter()  # (request name, error code) -> responses' codes
        self.bytes_in: Counter[str] = Counter()
        self.messages_in: Counter[str] = Counter()
        self.bytes_out: Counter[str] = Counter()
        self.messages_out: Counter[str] = Counter()
        self.replication_bytes_out = 0

    def instrument(self, handler: Handler) -> Handler:
        """``handler`` (the socket server's: context, body -> response or awaitable) with one
        observation per request. The handler's order-sensitive synchronous part (the produce
        append) still runs before this returns, so request order is unchanged."""

        def handle(context, body):
            start = self.clock()
            api_key = context.header.api_key
            try:
                result = handler(context, body)
            except BaseException as e:
                self._observe(api_key, body, start)
                self.errors[request_name(api_key, body), code_of(e).code] += 1  # what is answered
                raise
            if is_awaitable(result):
                return self._complete_later(api_key, body, start, result)
            if is_deferred(result):  # a long poll or an acks=all wait: when answered
                return _ObservedDeferred(self, api_key, body, start, result)
            self._observe(api_key, body, start)
            self._account(api_key, body, result)
            return result

        return handle

    async def _complete_later(self, api_key: int, body: dict, start: float, result: Awaitable) -> Any:
        try:
            response = await result
        except BaseException as e:
            if isinstance(e, Exception):  # answered with its code (a cancellation: nothing is answered)
                self.errors[request_name(api_key, body), code_of(e).code] += 1
            self._observe(api_key, body, start)
            raise
        if is_deferred(response):  # its part done, what is left waits (acks=all): observed when answered
            return _ObservedDeferred(self, api_key, body, start, response)
        self._observe(api_key, body, start)
        self._account(api_key, body, response)
        return response

    def _completed(self, api_key: int, body: dict, start: float, response: Any, end: float) -> None:
        self._observe(api_key, body, start, end)
        self._account(api_key, body, response)

    def _observe(self, api_key: int, body: Any, start: float, end: float | None = None) -> None:
        name = request_name(api_key, body)
        hist = self.latency.get(name)
        if hist is None:
            hist = self.latency[name] = _Histogram()
        hist.observe((self.clock() if end is None else end) - start)

    def _account(self, api_key: int, body: dict, response: Any) -> None:
        if type(response) is Throttled:  # sent at once, the connection muted after it (KIP-219)
            response = response.response
        try:
            fetch_body = api_key == _FETCH and type(response) is dict and "responses" in response
            if fetch_body:
                codes = _fetch_body_errors(response)
            elif type(response) is dict:  # a whole request refused: its error body
                codes = {code: 1} if type(code := response.get("error_code")) is int and code else None
            else:
                codes = count_errors(response)
            if codes:
                name = request_name(api_key, body)
                for code, n in codes.items():
                    self.errors[name, code] += n
            if api_key == _PRODUCE:
                self._account_produce(body, response)
            elif fetch_body or (api_key == _FETCH and isinstance(response, FetchResponse)):
                self._account_fetch(body, response)
        except (KeyError, TypeError, IndexError, struct.error) as e:  # never fail a request over metrics
            logger.debug("request not accounted: %r", e)

    def _account_produce(self, body: dict | list, response: Any) -> None:
        """Bytes and records appended, per topic (Kafka counts BytesIn and MessagesIn after a
        successful local append): every partition whose append got an offset. acks=0 has no
        response: answered None, every partition was appended; answered ``CLOSE_CONNECTION``,
        some append failed and nothing is counted (a client naming made-up topics must not
        add series). A whole request refused, an error body, appended nothing. A partition
        with no bytes adds no label. ``body``: the request's, or its ``produce_parts`` (what a
        waiting produce keeps instead of its records)."""
        if isinstance(response, ProduceResponse):
            appended = {(t.name, p.index) for t in response.responses for p in t.partition_responses
                        if p.base_offset >= 0}
        elif response is None:  # acks=0, every append succeeded
            appended = None
        else:  # an error body, or an acks=0 produce that failed (CLOSE_CONNECTION)
            return
        for topic, index, size, count in body if type(body) is list else produce_parts(body):
            if size and (appended is None or (topic, index) in appended):
                self.bytes_in[topic] += size
                self.messages_in[topic] += count

    def forget_topics(self, topics: Iterable[str]) -> None:
        """Drop the per-topic series of deleted topics (as Kafka removes a deleted topic's
        BrokerTopicMetrics): a topic created again under the name starts from zero."""
        for topic in topics:
            for counts in (self.bytes_in, self.messages_in, self.bytes_out, self.messages_out):
                counts.pop(topic, None)

    def _account_fetch(self, body: dict, response: Any) -> None:
        """Bytes and records sent, per topic, of a fetch answer: its body (what the fetch
        handler answers, see ``Apis._fetch_response``) or the typed message."""
        follower = request_name(_FETCH, body) == "FetchFollower"
        for topic, _, records in fetch_answer_parts(response):
            if not records:
                continue
            size, count = batch_stats(records)
            if not size:  # a partial batch only: nothing sent, no label
                continue
            if follower:
                self.replication_bytes_out += size
            else:
                self.bytes_out[topic] += size
                self.messages_out[topic] += count


def produce_parts(body: dict) -> list[tuple[str, int, int, int]]:
    """(topic, partition, bytes, records) of each partition of a Produce request body."""
    return [(t["name"], p["index"], *batch_stats(p["records"]))
            for t in body["topic_data"] for p in t["partition_data"]]


def _fetch_body_errors(response: dict) -> dict[int, int] | None:
    """``count_errors`` of a fetch answer's body: its own code and its partitions'."""
    into = None
    for code in (response.get("error_code", 0), *(code for _, code, _ in fetch_answer_parts(response))):
        if code:
            into = {} if into is None else into
            into[code] = into.get(code, 0) + 1
    return into


class LoopLagProbe:
    """How long a ready task waits for the broker's Trio loop: a task sleeps until a deadline,
    then records how far past it it woke (``loop_lag`` histogram and the largest since the
    last scrape). Trio wakes a sleeper once its deadline passed and the loop comes round to
    it, so the delay is the time a runnable task spent waiting behind others."""

    def __init__(self, interval_s: float = LOOP_LAG_INTERVAL_S):
        self.interval_s = interval_s
        self.lag = _Histogram(LOOP_LAG_BUCKETS_S)
        self.max_since_scrape = 0.0

    def record(self, deadline: float, woke: float) -> None:
        lag = max(0.0, woke - deadline)
        self.lag.observe(lag)
        self.max_since_scrape = max(self.max_since_scrape, lag)

    def take_max(self) -> float:
        """The largest lag since the previous call (a scrape), then start over."""
        worst, self.max_since_scrape = self.max_since_scrape, 0.0
        return worst

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            deadline = trio.current_time() + self.interval_s
            await trio.sleep_until(deadline)
            self.record(deadline, trio.current_time())


# -- the collector --------------------------------------------------------------------------------


class MetricsSource(Protocol):
    """What the endpoint reads of a broker, at scrape time, on the broker's Trio thread: its
    components and two readings. The broker server provides it; tests pass small fakes."""

    broker_epoch: int
    replica_manager: ReplicaManager
    log_manager: LogManager
    controller: Controller | None
    group_coordinator: GroupCoordinator | None  # absent: no group families
    log_cleaner: LogCleaner | None  # absent: no cleaner families

    def readiness(self) -> Readiness: ...

    def socket_stats(self) -> NetworkStats | None: ...


class BrokerCollector:
    """Every family of the endpoint, built from the broker's state at scrape time."""

    def __init__(self, server: MetricsSource, requests: RequestMetrics, loop_lag: LoopLagProbe | None = None):
        self.server = server
        self.requests = requests
        self.loop_lag = loop_lag

    def collect(self) -> Iterator[Metric]:
        yield from self._broker()
        yield from self._event_loop()
        yield from self._replica_manager()
        yield from self._controller()
        yield from self._requests()
        yield from self._topics()
        yield from self._logs()
        yield from self._log_cleaner()
        yield from self._network()
        yield from self._groups()
        yield from self._quotas()

    def _quotas(self) -> Iterator[Metric]:
        """Kafka's quota metrics (type Produce, Fetch, Request: throttle-time), per quota
        sensor: the (user, client id) a quota is measured for (broker/security/quotas.py)."""
        quotas = getattr(self.server, "quotas", None)
        if quotas is None:
            return
        for quota_type, name, what in (("PRODUCE", "produce", "Produce requests"),
                                       ("FETCH", "fetch", "consumers' Fetch responses"),
                                       ("REQUEST", "request", "requests (request_percentage)")):
            sensors = next(s for t, s in quotas.sensors.items() if t.name == quota_type).sensors
            throttle = CounterMetricFamily(f"tidelog_{name}_throttle_time_ms",
                                           f"Time {what} were delayed by client quotas (ms), per quota sensor",
                                           labels=["user", "client_id"])
            throttled = CounterMetricFamily(f"tidelog_{name}_throttled_requests",
                                            f"{what[0].upper()}{what[1:]} delayed by client quotas, per quota sensor",
                                            labels=["user", "client_id"])
            for (user, client_id), sensor in sorted(sensors.items()):
                throttle.add_metric([user, client_id], float(sensor.throttle_time_ms))
                throttled.add_metric([user, client_id], float(sensor.throttled))
            yield throttle
            yield throttled

    def _groups(self) -> Iterator[Metric]:
        coordinator = getattr(self.server, "group_coordinator", None)
        if coordinator is None:
            return
        lag = GaugeMetricFamily("tidelog_group_lag",
                                "Records a consumer group has not committed yet: the partition's high "
                                "watermark minus the group's committed offset (groups coordinated here)",
                                labels=["group", "topic", "partition"])
        committed = GaugeMetricFamily("tidelog_group_committed_offset",
                                      "A consumer group's committed offset (groups coordinated here)",
                                      labels=["group", "topic", "partition"])
        for group, tp, offset, behind in coordinator.lag():
            labels = [group, tp.topic, str(tp.partition)]
            lag.add_metric(labels, float(behind))
            committed.add_metric(labels, float(offset))
        yield lag
        yield committed
        count = GaugeMetricFamily("tidelog_group_count", "Consumer groups coordinated by this broker, by state",
                                  labels=["state"])
        for state, n in sorted(coordinator.state_counts().items()):
            count.add_metric([state], float(n))
        yield count

    def _broker(self) -> Iterator[Metric]:
        s = self.server
        checks = s.readiness()
        ready = GaugeMetricFamily("tidelog_broker_ready",
                                  "1 when the broker is ready: logs loaded, registered in ZooKeeper, "
                                  "metadata received (GET /ready)")
        ready.add_metric([], float(checks.ready))
        yield ready
        zk = GaugeMetricFamily("tidelog_zookeeper_connected", "1 while the ZooKeeper session is connected")
        zk.add_metric([], float(checks.zookeeper_connected))
        yield zk
        epoch = GaugeMetricFamily("tidelog_broker_epoch",
                                  "The broker epoch (its registration's ZooKeeper zxid); changes on re-registration")
        epoch.add_metric([], float(getattr(s, "broker_epoch", -1)))
        yield epoch

    def _event_loop(self) -> Iterator[Metric]:
        probe = self.loop_lag
        if probe is None:
            return
        lag = HistogramMetricFamily("tidelog_event_loop_lag_seconds",
                                    f"How late a task woke past its deadline (sampled every {probe.interval_s:g} s): "
                                    "how long a ready task waits for the broker's event loop")
        lag.add_metric([], probe.lag.cumulative(), probe.lag.sum)
        yield lag
        worst = GaugeMetricFamily("tidelog_event_loop_lag_max_seconds",
                                  "The largest event-loop lag since the previous scrape")
        worst.add_metric([], probe.take_max())
        yield worst

    def _replica_manager(self) -> Iterator[Metric]:
        rm = self.server.replica_manager
        partitions = list(rm.partitions.values())
        leaders = [p for p in partitions if p.is_leader and p.log is not None]
        # a reassignment's adding replicas are not part of the replication factor yet (Kafka's
        # OngoingReassignmentState.replicationFactor)
        under = sum(1 for p in leaders if len(p.isr) < len(p.replicas) - len(p.adding_replicas))
        under_min = sum(1 for p in leaders if len(p.isr) < p.min_insync_replicas)
        at_min = sum(1 for p in leaders if len(p.isr) == p.min_insync_replicas)
        for name, doc, value in (
                ("tidelog_replica_manager_partitions", "Partition replicas hosted by this broker", len(partitions)),
                ("tidelog_replica_manager_leader_partitions", "Partitions this broker leads", len(leaders)),
                ("tidelog_replica_manager_under_replicated_partitions",
                 "Partitions led here whose ISR is smaller than their replica set (a reassignment's adding "
                 "replicas left out)", under),
                ("tidelog_replica_manager_under_min_isr_partitions",
                 "Partitions led here whose ISR is below min.insync.replicas (acks=all produce fails)", under_min),
                ("tidelog_replica_manager_at_min_isr_partitions",
                 "Partitions led here whose ISR is exactly min.insync.replicas (one more failure blocks acks=all)",
                 at_min),
                ("tidelog_replica_manager_replica_fetchers", "Follower fetchers (num.replica.fetchers per source broker)",
                 len(rm.fetchers)),
                ("tidelog_replica_fetcher_max_lag",
                 "Largest lag in records of a partition this broker follows: its leader's high watermark at "
                 "the last fetch minus this replica's log end offset (Kafka's ReplicaFetcherManager MaxLag)",
                 max([0, *(st.lag for f in rm.fetchers.values() for st in f.partitions.values())]))):
            g = GaugeMetricFamily(name, doc)
            g.add_metric([], float(value))
            yield g
        for name, doc, value in (("tidelog_replica_manager_isr_shrinks", "ISR shrinks on partitions led here",
                                  rm.isr_shrinks),
                                 ("tidelog_replica_manager_isr_expands", "ISR expansions on partitions led here",
                                  rm.isr_expands),
                                 ("tidelog_replica_manager_damaged_replicas",
                                  "Replicas here found damaged on disk (a stored batch failing its CRC check) and "
                                  "reported, to be re-fetched from a replica in sync", rm.damaged_replicas_found)):
            c = CounterMetricFamily(name, doc)
            c.add_metric([], float(value))
            yield c
        rate = GaugeMetricFamily("tidelog_replication_throttled_rate",
                                 "leader.replication.throttled.rate and follower.replication.throttled.rate in "
                                 "force here (bytes/s; -1: not set)", labels=["side"])
        copied = CounterMetricFamily("tidelog_replication_throttled_bytes",
                                     "Bytes copied for throttled replicas (not in sync, listed in the topic's "
                                     "*.replication.throttled.replicas), per side", labels=["side"])
        for side, quota in (("leader", rm.leader_quota), ("follower", rm.follower_quota)):
            rate.add_metric([side], float(-1 if quota.rate is None else quota.rate))
            copied.add_metric([side], float(quota.throttled_bytes))
        yield rate
        yield copied
        purgatory = GaugeMetricFamily("tidelog_produce_purgatory_size",
                                      "acks=all produce requests waiting for the high watermark")
        purgatory.add_metric([], float(rm.produce_purgatory_size))
        yield purgatory
        fetches = GaugeMetricFamily("tidelog_fetch_purgatory_size",
                                    "fetches waiting for records (long polls of consumers and followers)")
        fetches.add_metric([], float(rm.fetch_purgatory_size))
        yield fetches

    def _controller(self) -> Iterator[Metric]:
        controller = self.server.controller
        active = GaugeMetricFamily("tidelog_controller_active",
                                   "1 on the broker that is the active controller, 0 elsewhere "
                                   "(the sum over the cluster must be exactly 1)")
        active.add_metric([], float(controller.is_active))
        yield active
        offline = GaugeMetricFamily("tidelog_controller_offline_partitions",
                                    "Partitions whose leader cannot serve them: none, not registered, or "
                                    "its replica in a failed log dir (reported by the active controller only)")
        offline.add_metric([], float(offline_partitions(controller)))
        yield offline
        moving = GaugeMetricFamily("tidelog_controller_reassigning_partitions",
                                   "Partitions being reassigned (reported by the active controller only)")
        moving.add_metric([], float(len(controller.ctx.moves) if controller.ctx is not None else 0))
        yield moving

    def _requests(self) -> Iterator[Metric]:
        latency = HistogramMetricFamily("tidelog_request_duration_seconds",
                                        "Time from a parsed request to its response, per request type",
                                        labels=["request"])
        for name, hist in sorted(self.requests.latency.items()):
            latency.add_metric([name], hist.cumulative(), hist.sum)
        yield latency
        errors = CounterMetricFamily("tidelog_request_errors",
                                     "Error codes in responses, per request type and error (a handler that "
                                     "raised counts as the code it is answered with)", labels=["request", "error"])
        for (name, code), n in sorted(self.requests.errors.items()):
            errors.add_metric([name, for_code(code).name], float(n))
        yield errors

    def _topics(self) -> Iterator[Metric]:
        r = self.requests
        for name, doc, values in (
                ("tidelog_topic_bytes_in", "Bytes of record batches appended by producers", r.bytes_in),
                ("tidelog_topic_messages_in", "Records appended by producers", r.messages_in),
                ("tidelog_topic_bytes_out", "Bytes of record batches sent to consumers", r.bytes_out),
                ("tidelog_topic_messages_out", "Records sent to consumers", r.messages_out)):
            c = CounterMetricFamily(name, doc, labels=["topic"])
            for topic, value in sorted(values.items()):
                c.add_metric([topic], float(value))
            yield c
        rep = CounterMetricFamily("tidelog_replication_bytes_out", "Bytes of record batches sent to followers")
        rep.add_metric([], float(r.replication_bytes_out))
        yield rep

    def _logs(self) -> Iterator[Metric]:
        families = {
            "size": GaugeMetricFamily("tidelog_log_size_bytes", "Bytes of a partition's log on this broker",
                                      labels=["topic", "partition"]),
            "segments": GaugeMetricFamily("tidelog_log_segments", "Segments of a partition's log",
                                          labels=["topic", "partition"]),
            "start": GaugeMetricFamily("tidelog_log_start_offset", "First offset of a partition's log",
                                       labels=["topic", "partition"]),
            "end": GaugeMetricFamily("tidelog_log_end_offset", "Log end offset (next offset to write)",
                                     labels=["topic", "partition"]),
            "hw": GaugeMetricFamily("tidelog_log_high_watermark", "High watermark (end of committed records)",
                                    labels=["topic", "partition"]),
        }
        for tp, log in sorted(self.server.log_manager.logs.items()):
            labels = [tp.topic, str(tp.partition)]
            families["size"].add_metric(labels, float(log.size))
            families["segments"].add_metric(labels, float(len(log.segments)))
            families["start"].add_metric(labels, float(log.log_start_offset))
            families["end"].add_metric(labels, float(log.log_end_offset))
            families["hw"].add_metric(labels, float(log.high_watermark))
        yield from families.values()
        yield from self._log_dirs()

    def _log_dirs(self) -> Iterator[Metric]:
        """Each log dir's file system: one ``statvfs`` per dir per scrape (Kafka has no such
        gauge; node_exporter's ``node_filesystem_*`` is what Kafka deployments alert on)."""
        free = GaugeMetricFamily("tidelog_log_dir_free_bytes",
                                 "Bytes available to the broker on a log dir's file system", labels=["dir"])
        total = GaugeMetricFamily("tidelog_log_dir_total_bytes", "Size of a log dir's file system", labels=["dir"])
        for d in getattr(self.server.log_manager, "log_dirs", ()):
            try:
                st = os.statvfs(d)
            except OSError:  # a dir gone or unreadable: no sample (the broker reports it elsewhere)
                continue
            free.add_metric([d], float(st.f_bavail * st.f_frsize))
            total.add_metric([d], float(st.f_blocks * st.f_frsize))
        yield free
        yield total
        offline = GaugeMetricFamily("tidelog_log_manager_offline_log_dirs",
                                    "Log dirs taken offline after an I/O error on them, until the broker "
                                    "restarts (Kafka's OfflineLogDirectoryCount)")
        offline.add_metric([], float(len(getattr(self.server.log_manager, "offline_dirs", ()))))
        yield offline

    def _log_cleaner(self) -> Iterator[Metric]:
        """Kafka's LogCleaner / LogCleanerManager gauges (broker/log/cleaner.py)."""
        cleaner = getattr(self.server, "log_cleaner", None)
        if cleaner is None:
            return
        for name, doc, value in (
                ("tidelog_log_cleaner_max_dirty_ratio",
                 "Dirty ratio (cleanable / total bytes) of the dirtiest compacted log at the last check",
                 cleaner.max_dirty_ratio),
                ("tidelog_log_cleaner_last_clean_time_ms",
                 "Wall-clock time of the last completed cleaning (ms since the epoch; -1: none yet)",
                 cleaner.last_clean_ms),
                ("tidelog_log_cleaner_cleanings_in_progress", "Logs being cleaned now", len(cleaner.in_progress)),
                ("tidelog_log_cleaner_uncleanable_partitions",
                 "Partitions whose cleaning failed (see the log); not cleaned until restart or the log is deleted",
                 len(cleaner.uncleanable))):
            g = GaugeMetricFamily(name, doc)
            g.add_metric([], float(value))
            yield g
        for name, doc, value in (
                ("tidelog_log_cleaner_bytes_cleaned", "Bytes read by completed cleanings", cleaner.bytes_cleaned),
                ("tidelog_log_cleaner_bytes_written", "Bytes written by completed cleanings", cleaner.bytes_written),
                ("tidelog_log_cleaner_cleanings", "Completed cleanings", cleaner.cleanings)):
            c = CounterMetricFamily(name, doc)
            c.add_metric([], float(value))
            yield c

    def _network(self) -> Iterator[Metric]:
        stats = self.server.socket_stats()
        if stats is None:
            return
        g = GaugeMetricFamily("tidelog_network_connections", "Open client and broker connections")
        g.add_metric([], float(stats.connections_open))
        yield g
        for name, doc, value in (
                ("tidelog_network_connections_accepted", "Connections accepted", stats.connections_accepted),
                ("tidelog_network_invalid_requests",
                 "Frames answered with INVALID_REQUEST or closing their connection", stats.invalid_requests),
                ("tidelog_network_handler_errors", "Requests whose handler failed unexpectedly (see the log)",
                 stats.handler_errors)):
            c = CounterMetricFamily(name, doc)
            c.add_metric([], float(value))
            yield c
        requests = CounterMetricFamily("tidelog_network_requests", "Requests read, per API", labels=["request"])
        for key, n in sorted(stats.requests_handled.items()):
            requests.add_metric([_REQUEST_NAMES.get(key, f"ApiKey{key}")], float(n))
        yield requests
        queue = SummaryMetricFamily("tidelog_request_queue_time_seconds",
                                    "Time from a request fully read to its handler's start (a large frame's decode "
                                    "in a worker thread, or a wait under queued.max.requests); count: requests read")
        queue.add_metric([], float(sum(stats.requests_handled.values())), stats.request_queue_time_s)
        yield queue


def offline_partitions(controller: Any) -> int:
    """Partitions whose leader cannot serve them, by the controller's own rule
    (``ControllerContext.leader_offline``: no leader, a leader not registered, or its replica
    in a failed log dir; a broker in controlled shutdown still serves), as the active
    controller sees them (0 on every other broker, as Kafka's OfflinePartitionsCount)."""
    ctx = getattr(controller, "ctx", None)
    if ctx is None:
        return 0
    return sum(1 for tp, (st, _) in ctx.states.items() if st.leader < 0 or ctx.leader_offline(tp, st))


def build_registry(server: MetricsSource, requests: RequestMetrics, *, process: bool = True,
                   loop_lag: LoopLagProbe | None = None) -> CollectorRegistry:
    """A registry with the broker's collector (and the process's CPU, memory, fds)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BrokerCollector(server, requests, loop_lag))
    if process:
        ProcessCollector(namespace="tidelog", registry=registry)
    return registry


class BrokerMetrics:
    """What the broker server holds: the per-request hook and the endpoint."""

    def __init__(self, server: MetricsSource):
        self.server = server
        self.requests = RequestMetrics()
        self.loop_lag = LoopLagProbe()
        self.registry = build_registry(server, self.requests, loop_lag=self.loop_lag)

    def instrument(self, handler: Handler) -> Handler:
        return self.requests.instrument(handler)

    async def run(self, host: str | None, port: int, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Serve the endpoint and run the event-loop lag probe; ``task_status.started(port)``
        once listening."""
        async with trio.open_nursery() as nursery:
            await nursery.start(self.loop_lag.run)
            task_status.started(await nursery.start(MetricsServer(self.registry, self.server.readiness,
                                                                  host, port).run))


# -- the HTTP endpoint ------------------------------------------------------------------------------

MAX_REQUEST_HEAD_BYTES = 8192
REQUEST_TIMEOUT_S = 10.0
# a rendering of /metrics is served again for this long, and for at least this many times
# the time it took: scrapes at any rate cost the broker's loop at most a tenth of its time
RENDER_REUSE_S = 1.0
RENDER_REUSE_FACTOR = 10
# connections served at once; one more is closed at once (the scrape fails, and is retried at
# the next interval)
MAX_METRICS_CONNECTIONS = 16


class MetricsServer:
    """``GET /metrics``, ``/ready`` and ``/live`` over HTTP/1.0 on the broker's Trio loop.

    One response per connection (``Connection: close``); a request head larger than
    ``MAX_REQUEST_HEAD_BYTES`` or slower than ``REQUEST_TIMEOUT_S`` is dropped, and a connection
    beyond ``MAX_METRICS_CONNECTIONS`` open at once is closed unanswered. Rendering the registry runs on the
    loop (a consistent snapshot) and costs in proportion to the series (about a second for
    50,000): a rendering is served again to every scrape for ``RENDER_REUSE_S``, or
    ``RENDER_REUSE_FACTOR`` times the time it took if longer, so that any number of scrapers
    render it once per period."""

    def __init__(self, registry: CollectorRegistry, readiness: Callable[[], Any], host: str | None, port: int,
                 clock: Callable[[], float] = time.monotonic):
        self.registry = registry
        self.readiness = readiness
        self.host = host or None
        self.port = port
        self.clock = clock
        self.connections = 0
        self.renders = 0
        self._rendered: dict[str, tuple[float, bytes]] = {}  # content type -> (served until, body)

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(self.port, host=self.host)
        if self.port == 0:
            for extra in listeners[1:]:
                await extra.aclose()
            listeners = listeners[:1]
        self.port = listeners[0].socket.getsockname()[1]
        logger.info("metrics on http://%s:%d/metrics", self.host or "*", self.port)
        task_status.started(self.port)
        await trio.serve_listeners(self._serve, listeners)

    async def _serve(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        try:
            async with stream:
                if self.connections > MAX_METRICS_CONNECTIONS:  # closed at once: no task lingers for it
                    logger.debug("metrics connection closed: %d open already", MAX_METRICS_CONNECTIONS)
                    return
                with trio.move_on_after(REQUEST_TIMEOUT_S):
                    head = await _read_head(stream)
                    if head is None:
                        return
                    await stream.send_all(self.respond(head))
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as e:
            logger.debug("metrics connection closed: %r", e)
        finally:
            self.connections -= 1

    def respond(self, head: bytes) -> bytes:
        """The whole HTTP response to a request head (request line and headers)."""
        try:
            method, target, _ = head.split(b"\r\n", 1)[0].decode("ascii").split(" ", 2)
        except (UnicodeDecodeError, ValueError):
            return _http(400, b"bad request\n")
        path = target.split("?", 1)[0]
        if method not in ("GET", "HEAD"):
            return _http(405, b"method not allowed\n", extra=b"Allow: GET, HEAD\r\n")
        if path == "/metrics":  # the text format, or OpenMetrics when the scraper asks for it
            body, ctype = self.render(_header(head, b"accept"))
        elif path == "/ready":
            checks = self.readiness()
            text = ("ready\n" if checks.ready else "not ready: " + "; ".join(checks.problems()) + "\n")
            return _http(200 if checks.ready else 503, text.encode(), head_only=method == "HEAD")
        elif path in ("/live", "/"):
            body, ctype = b"ok\n", "text/plain; charset=utf-8"
        else:
            return _http(404, b"not found: try /metrics, /ready or /live\n")
        return _http(200, body, ctype, head_only=method == "HEAD")

    def render(self, accept: str) -> tuple[bytes, str]:
        """The registry in the format ``accept`` asks for: the last rendering while it is
        fresh (see the class), else a new one."""
        encoder, ctype = choose_encoder(accept)
        start = self.clock()
        rendered = self._rendered.get(ctype)
        if rendered is not None and start < rendered[0]:
            return rendered[1], ctype
        body = encoder(self.registry)
        self.renders += 1
        end = self.clock()
        self._rendered[ctype] = (end + max(RENDER_REUSE_S, RENDER_REUSE_FACTOR * (end - start)), body)
        return body, ctype


def _header(head: bytes, name: bytes) -> str:
    for line in head.split(b"\r\n")[1:]:
        key, sep, value = line.partition(b":")
        if sep and key.strip().lower() == name:
            return value.strip().decode("latin-1")
    return ""


async def _read_head(stream: trio.SocketStream) -> bytes | None:
    buf = bytearray()
    while b"\r\n\r\n" not in buf and b"\n\n" not in buf:
        if len(buf) > MAX_REQUEST_HEAD_BYTES:
            return None
        data = await stream.receive_some(4096)
        if not data:
            return bytes(buf) if buf else None
        buf += data
    return bytes(buf)


_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            503: "Service Unavailable"}


def _http(status: int, body: bytes, content_type: str = "text/plain; charset=utf-8", *,
          extra: bytes = b"", head_only: bool = False) -> bytes:
    head = (f"HTTP/1.0 {status} {_REASONS[status]}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n").encode() + extra + b"\r\n"
    return head if head_only else head + body


class _ObservedDeferred(DeferredResponse):
    """A deferred response observed when it is answered (its latency includes the long
    poll or the wait for replication, and the bytes it carries out are counted), or when it
    is cancelled. Counted after the answer is handed to the connection: a consumer's long
    poll is answered by the append that satisfies it, and its response waits for nothing
    that only counts it. Its latency still ends when the answer was ready, as every other
    request's does."""

    __slots__ = ("metrics", "api_key", "body", "start", "inner")

    def __init__(self, metrics: RequestMetrics, api_key: int, body: dict, start: float,
                 inner: DeferredResponse):
        if api_key == _PRODUCE:  # appended already: keep what is counted, not the records
            body = produce_parts(body)
        self.metrics, self.api_key, self.body, self.start, self.inner = metrics, api_key, body, start, inner

    def attach(self, complete: Callable[[Any], None]) -> None:
        def completed(response: Any) -> None:
            end = self.metrics.clock()
            try:
                complete(response)
            finally:
                self.metrics._completed(self.api_key, self.body, self.start, response, end)

        self.inner.attach(completed)

    def cancel(self) -> None:
        self.inner.cancel()
        self.metrics._observe(self.api_key, self.body, self.start)
