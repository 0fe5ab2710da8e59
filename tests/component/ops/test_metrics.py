"""broker/metrics.py in-process: the collector over a real replica manager and log manager
(leader partitions with chosen ISRs, real logs), the per-request hook over a scripted
handler, and the HTTP endpoint over loopback."""

from __future__ import annotations

import dataclasses
import types

import pytest
import trio
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tidelog.broker.context import RequestContext
from tidelog.broker.controller.controller import ControllerContext
from tidelog.broker.deferred import CLOSE_CONNECTION, DeferredResponse, is_deferred
from tidelog.broker.health import Readiness
from tidelog.broker.log.cleaner import LogCleaner
from tidelog.broker.log.config import LogConfig
from tidelog.broker.log.manager import LogManager
from tidelog.broker.metrics import (
    LATENCY_BUCKETS_S,
    MAX_METRICS_CONNECTIONS,
    RENDER_REUSE_S,
    BrokerMetrics,
    LoopLagProbe,
    MetricsServer,
    RequestMetrics,
    batch_stats,
    build_registry,
    count_errors,
    offline_partitions,
    request_name,
)
from tidelog.broker.network import NetworkStats
from tidelog.broker.replication.fetcher import FetchState
from tidelog.broker.replication.replica_manager import ReplicaConfig, ReplicaManager
from tidelog.broker.zookeeper.layout import LeaderAndIsr
from tidelog.protocol.codec import ApiKey, RequestHeader
from tidelog.protocol.errors import (
    CLUSTER_AUTHORIZATION_FAILED,
    GROUP_ID_NOT_FOUND,
    INVALID_REQUEST,
    NOT_COORDINATOR,
    TidelogError,
    error_body,
)
from tidelog.protocol.messages import (
    FetchPartitionResponse,
    FetchResponse,
    FetchTopicResponse,
    LeaderAndIsrRequest,
    PartitionProduceResponse,
    PartitionState,
    ProduceResponse,
    TopicProduceResponse,
)
from tidelog.protocol.records import build_batch
from tidelog.protocol.topics import TopicPartition


def header(api_key: ApiKey) -> RequestContext:
    """The context the network layer passes a handler (the metrics hook reads its header)."""
    return RequestContext(RequestHeader(api_key, 0, 1, "test"))


class FakeServer:
    """The attributes of BrokerServer that the collector reads."""

    def __init__(self, replica_manager, log_manager, controller=None, ready=True):
        self.replica_manager = replica_manager
        self.log_manager = log_manager
        self.controller = controller or types.SimpleNamespace(is_active=False, ctx=None)
        self.broker_epoch = 42
        self._ready = ready
        self.stats = NetworkStats(2, 5, {0: 3, 3: 7}, 1, 0)
        self.quotas = _throttled_quotas()

    def readiness(self) -> Readiness:
        return Readiness(True, True, True, self._ready)

    def socket_stats(self):
        return self.stats


def _throttled_quotas():
    """Client quotas with one throttled producer (its sensor: client id "app")."""
    from tidelog.broker.security.quotas import ClientQuotas, Quota, QuotaType

    quotas = ClientQuotas(lambda: {}, lambda: 0, samples=2, sample_ms=1000)
    quotas.record(QuotaType.PRODUCE, Quota(100.0, ("", "app"), "clients/app"), 1000, 0)
    return quotas


def test_quota_throttle_time_is_exported():
    from tidelog.broker.metrics import BrokerCollector

    server = types.SimpleNamespace(quotas=_throttled_quotas())
    families = {f.name: f for f in BrokerCollector(server, RequestMetrics())._quotas()}
    (sample,) = families["tidelog_produce_throttle_time_ms"].samples
    assert sample.labels == {"user": "", "client_id": "app"} and sample.value == 9000  # 1000 B at 100 B/s over 1 s
    assert families["tidelog_produce_throttled_requests"].samples[0].value == 1
    assert families["tidelog_fetch_throttle_time_ms"].samples == []


def every_family(log_dir: str) -> CollectorRegistry:
    """A registry with every family the endpoint can export: a broker with a log cleaner, a
    group coordinator (one group's lag), the event-loop probe and the process collector (for
    the operations guide's and the dashboards' checks)."""
    lm = LogManager([log_dir], LogConfig())
    rm = ReplicaManager(ReplicaConfig(1), lm, lambda t: LogConfig(), lambda leader, fetcher=0: None)
    server = FakeServer(rm, lm)
    server.log_cleaner = LogCleaner(lm)
    server.group_coordinator = types.SimpleNamespace(lag=lambda: [("g", TopicPartition("t", 0), 5, 2)],
                                                     state_counts=lambda: {"Stable": 1})
    return build_registry(server, RequestMetrics(), loop_lag=LoopLagProbe())


def family_names(registry: CollectorRegistry) -> set[str]:
    """The names the families render under (counters without their ``_total``)."""
    return {f.name for f in text_string_to_metric_families(generate_latest(registry).decode())}


def test_every_family_has_the_optional_parts(tmp_path):
    names = family_names(every_family(str(tmp_path)))
    assert {"tidelog_log_cleaner_cleanings", "tidelog_group_lag", "tidelog_event_loop_lag_seconds",
            "tidelog_process_open_fds"} <= names


def leader_state(topic: str, p: int, isr: list[int], replicas: list[int]) -> PartitionState:
    return PartitionState(topic, p, 1, 1, 0, isr, 0, replicas)


@pytest.fixture
def broker(tmp_path):
    """Broker 1 leading orders-0 (ISR 1,2,3), orders-1 (ISR 1,2 of 1,2,3), orders-2 (ISR 1 of
    1,2,3; min ISR 2) and solo-0 (RF 1), with a few records in orders-0."""
    lm = LogManager([str(tmp_path)], LogConfig.from_props({"min.insync.replicas": 2}), broker_id=1)
    lm.startup()
    rm = ReplicaManager(ReplicaConfig(1), lm, lambda topic: LogConfig.from_props({"min.insync.replicas": 2}),
                        lambda leader, fetcher=0: None)
    rm.become_leader_or_follower(LeaderAndIsrRequest(0, 1, 1, [
        leader_state("orders", 0, [1, 2, 3], [1, 2, 3]),
        leader_state("orders", 1, [1, 2], [1, 2, 3]),
        leader_state("orders", 2, [1], [1, 2, 3]),
        leader_state("solo", 0, [1], [1]),
    ]))
    rm.partitions[TopicPartition("orders", 0)].log.append_as_leader(build_batch([b"a", b"b", b"c"]), 0)
    rm.isr_shrinks, rm.isr_expands = 4, 2
    yield FakeServer(rm, lm)
    lm.shutdown()


def samples(registry) -> dict[str, float]:
    out = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


def test_partition_gauges_are_read_from_the_replica_manager(broker):
    m = samples(build_registry(broker, RequestMetrics(), process=False))
    assert m["tidelog_replica_manager_partitions"] == 4
    assert m["tidelog_replica_manager_leader_partitions"] == 4
    assert m["tidelog_replica_manager_under_replicated_partitions"] == 2  # orders-1, orders-2
    assert m["tidelog_replica_manager_under_min_isr_partitions"] == 2  # orders-2, solo-0 (min ISR 2, RF 1)
    assert m["tidelog_replica_manager_at_min_isr_partitions"] == 1  # orders-1
    assert m["tidelog_replica_manager_isr_shrinks_total"] == 4
    assert m["tidelog_replica_manager_isr_expands_total"] == 2
    assert m["tidelog_broker_ready"] == 1 and m["tidelog_zookeeper_connected"] == 1
    assert m["tidelog_broker_epoch"] == 42


def test_a_follower_partition_is_not_counted_by_this_broker(broker):
    rm = broker.replica_manager
    rm._nursery = types.SimpleNamespace(start_soon=lambda *args: None)  # no fetcher tasks here
    rm.become_leader_or_follower(LeaderAndIsrRequest(0, 1, 1, [
        PartitionState("orders", 2, 1, 2, 1, [2], 0, [1, 2, 3])]))  # broker 2 leads now
    m = samples(build_registry(broker, RequestMetrics(), process=False))
    assert m["tidelog_replica_manager_leader_partitions"] == 3
    assert m["tidelog_replica_manager_under_replicated_partitions"] == 1


def test_a_reassignments_adding_replicas_do_not_make_a_partition_under_replicated(broker):
    """Kafka's replication factor during a move excludes the adding replicas
    (OngoingReassignmentState): a partition whose original replicas are all in sync is not
    under-replicated while the new ones catch up."""
    moving = dataclasses.replace(leader_state("moving", 0, [1, 2, 3], [1, 2, 3, 4]), adding_replicas=[4])
    broker.replica_manager.become_leader_or_follower(LeaderAndIsrRequest(0, 1, 1, [moving]))
    m = samples(build_registry(broker, RequestMetrics(), process=False))
    assert m["tidelog_replica_manager_under_replicated_partitions"] == 2  # orders-1, orders-2 as before


def test_log_gauges_per_partition(broker):
    m = samples(build_registry(broker, RequestMetrics(), process=False))
    assert m["tidelog_log_end_offset{partition=0,topic=orders}"] == 3
    assert m["tidelog_log_size_bytes{partition=0,topic=orders}"] > 0
    assert m["tidelog_log_size_bytes{partition=1,topic=orders}"] == 0
    assert m["tidelog_log_segments{partition=0,topic=solo}"] == 1
    assert m["tidelog_log_start_offset{partition=0,topic=orders}"] == 0
    assert "tidelog_log_high_watermark{partition=0,topic=orders}" in m


def test_log_dir_file_system_gauges(broker):
    m = samples(build_registry(broker, RequestMetrics(), process=False))
    (d,) = broker.log_manager.log_dirs
    assert 0 < m[f"tidelog_log_dir_free_bytes{{dir={d}}}"] <= m[f"tidelog_log_dir_total_bytes{{dir={d}}}"]
    assert m["tidelog_log_manager_offline_log_dirs"] == 0
    broker.log_manager.take_dir_offline(d, "an I/O error")
    assert samples(build_registry(broker, RequestMetrics(), process=False))["tidelog_log_manager_offline_log_dirs"] == 1


def test_network_counters(broker):
    m = samples(build_registry(broker, RequestMetrics(), process=False))
    assert m["tidelog_network_connections"] == 2
    assert m["tidelog_network_connections_accepted_total"] == 5
    assert m["tidelog_network_invalid_requests_total"] == 1
    assert m["tidelog_network_requests_total{request=Produce}"] == 3
    assert m["tidelog_network_requests_total{request=Metadata}"] == 7


def test_controller_gauges(broker):
    m = samples(build_registry(broker, RequestMetrics(), process=False))
    assert m["tidelog_controller_active"] == 0 and m["tidelog_controller_offline_partitions"] == 0
    states = {TopicPartition("t", 0): (LeaderAndIsr(1, 0, [1], 0), 0),
              TopicPartition("t", 1): (LeaderAndIsr(-1, 0, [2], 0), 0),
              TopicPartition("t", 2): (LeaderAndIsr(3, 0, [3], 0), 0)}
    ctx = ControllerContext(1, 0, brokers={1: None, 2: None}, states=states, moves={TopicPartition("t", 2): None})
    broker.controller = types.SimpleNamespace(is_active=True, ctx=ctx)
    m = samples(build_registry(broker, RequestMetrics(), process=False))
    assert m["tidelog_controller_active"] == 1
    assert m["tidelog_controller_offline_partitions"] == 2  # no leader; leader 3 not registered
    assert m["tidelog_controller_reassigning_partitions"] == 1
    assert offline_partitions(types.SimpleNamespace(ctx=None)) == 0


def test_a_leader_in_controlled_shutdown_is_not_offline():
    """The controller's own rule (``leader_offline``): a broker in controlled shutdown still
    serves what it leads (an RF 1 partition cannot move off it); a leader whose replica is in
    a failed log dir does not."""
    states = {TopicPartition("t", 0): (LeaderAndIsr(1, 0, [1], 0), 0),
              TopicPartition("t", 1): (LeaderAndIsr(2, 0, [2], 0), 0)}
    ctx = ControllerContext(1, 0, brokers={1: None, 2: None}, states=states, shutting_down={1})
    assert offline_partitions(types.SimpleNamespace(ctx=ctx)) == 0
    ctx.offline_replicas[2] = {TopicPartition("t", 1)}
    assert offline_partitions(types.SimpleNamespace(ctx=ctx)) == 1


def test_process_metrics_are_included(broker):
    m = samples(build_registry(broker, RequestMetrics()))
    assert m["tidelog_process_resident_memory_bytes"] > 0


# -- the per-request hook ------------------------------------------------------------------------------


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def produce_body(topic: str, batches: dict[int, bytes], acks: int = -1) -> dict:
    return {"acks": acks, "timeout_ms": 1000, "topic_data": [
        {"name": topic, "partition_data": [{"index": p, "records": r} for p, r in batches.items()]}]}


def test_batch_stats_reads_headers_only_and_ignores_a_partial_tail():
    one, two = build_batch([b"x"] * 3), build_batch([b"y"] * 5, base_offset=3)
    assert batch_stats(one + two) == (len(one) + len(two), 8)
    assert batch_stats(one + two[:-1]) == (len(one), 3)
    assert batch_stats(b"") == (0, 0) and batch_stats(None) == (0, 0)
    assert batch_stats(b"\x00" * 70) == (0, 0)  # a batch length below the header size


def test_request_names_are_kafkas():
    assert request_name(ApiKey.PRODUCE) == "Produce"
    assert request_name(ApiKey.OFFSETS_FOR_LEADER_EPOCH) == "OffsetsForLeaderEpoch"
    assert request_name(ApiKey.FETCH, {"replica_id": 2}) == "FetchFollower"
    assert request_name(ApiKey.FETCH, {"replica_id": -1}) == "FetchConsumer"
    assert request_name(ApiKey.FETCH, "garbage") == "FetchConsumer"
    assert request_name(999) == "ApiKey999"


def test_a_synchronous_response_is_observed_once():
    clock = Clock()
    rm = RequestMetrics(clock)

    def handler(h, body):
        clock.now += 0.003
        return {"ok": True}

    handle = rm.instrument(handler)
    assert handle(header(ApiKey.METADATA), {}) == {"ok": True}
    hist = rm.latency["Metadata"]
    assert hist.count == 1 and hist.sum == pytest.approx(0.003)
    assert dict(hist.cumulative())["0.0025"] == 0 and dict(hist.cumulative())["0.005"] == 1
    assert dict(hist.cumulative())["+Inf"] == 1


def test_a_handler_that_raises_is_observed_and_the_error_propagates():
    rm = RequestMetrics(Clock())

    def handler(h, body):
        raise ValueError("bad body")

    with pytest.raises(ValueError):
        rm.instrument(handler)(header(ApiKey.FETCH), {"replica_id": 1})
    assert rm.latency["FetchFollower"].count == 1


def test_acks_1_produce_counts_appended_partitions_only():
    rm = RequestMetrics(Clock())
    ok, rejected = build_batch([b"a", b"b"]), build_batch([b"c"])
    response = ProduceResponse([TopicProduceResponse("t", [PartitionProduceResponse(0, 0, 10),
                                                           PartitionProduceResponse(1, 6, -1)])])
    rm.instrument(lambda h, b: response)(header(ApiKey.PRODUCE), produce_body("t", {0: ok, 1: rejected}, acks=1))
    assert rm.bytes_in == {"t": len(ok)} and rm.messages_in == {"t": 2}


def test_a_produce_refused_whole_counts_no_bytes_in():
    # a request refused before its append (a malformed field, say) is answered with an error
    # body: its records were not appended, so they are not counted as taken in
    rm = RequestMetrics(Clock())
    refused = {"error_code": INVALID_REQUEST.code, "error_message": "ProduceRequest.acks: not an int"}
    rm.instrument(lambda h, b: refused)(header(ApiKey.PRODUCE), produce_body("t", {0: build_batch([b"a"])}))
    assert rm.bytes_in == {} and rm.messages_in == {}
    assert rm.errors == {("Produce", INVALID_REQUEST.code): 1}


def test_acks_0_produce_counts_everything_sent():
    rm = RequestMetrics(Clock())
    batch = build_batch([b"a"] * 4)
    rm.instrument(lambda h, b: None)(header(ApiKey.PRODUCE), produce_body("t", {0: batch, 1: batch}, acks=0))
    assert rm.messages_in == {"t": 8}


def test_a_failed_acks_0_produce_adds_no_topic_series():
    # acks=0 failed (unknown topics, refused, invalid): answered by closing the connection;
    # a client naming made-up topics must not add one series per name
    rm = RequestMetrics(Clock())
    body = {"acks": 0, "timeout_ms": 0, "topic_data": [
        {"name": f"made-up-{i}", "partition_data": [{"index": 0, "records": build_batch([b"x"])}]}
        for i in range(100)]}
    rm.instrument(lambda h, b: CLOSE_CONNECTION)(header(ApiKey.PRODUCE), body)
    assert rm.bytes_in == {} and rm.messages_in == {}


def test_a_partition_with_no_bytes_adds_no_label():
    rm = RequestMetrics(Clock())
    rm.instrument(lambda h, b: None)(header(ApiKey.PRODUCE), produce_body("empty", {0: b""}, acks=0))
    response = ProduceResponse([TopicProduceResponse("none", [PartitionProduceResponse(0, 0, 0)])])
    rm.instrument(lambda h, b: response)(header(ApiKey.PRODUCE), produce_body("none", {0: b""}, acks=1))
    fetched = FetchResponse([FetchTopicResponse("partial", [FetchPartitionResponse(0, 0, 5, records=b"\x00" * 10)])])
    rm.instrument(lambda h, b: fetched)(header(ApiKey.FETCH), {"replica_id": -1})
    assert rm.bytes_in == {} and rm.messages_in == {} and rm.bytes_out == {} and rm.messages_out == {}


def test_a_deleted_topics_series_are_dropped():
    rm = RequestMetrics(Clock())
    batch = build_batch([b"a"])
    for topic in ("gone", "kept"):
        rm.instrument(lambda h, b: None)(header(ApiKey.PRODUCE), produce_body(topic, {0: batch}, acks=0))
    rm.bytes_out["gone"] += 1
    rm.forget_topics(["gone"])
    assert set(rm.bytes_in) == set(rm.messages_in) == {"kept"} and rm.bytes_out == {}


def test_the_broker_drops_the_series_of_topics_an_update_metadata_deleted():
    from tidelog.broker.server import BrokerServer

    requests = RequestMetrics(Clock())
    requests.bytes_in.update({"gone": 10, "kept": 5})
    server = types.SimpleNamespace(ready=trio.Event(), broker_id=1, metadata=types.SimpleNamespace(brokers={}),
                                   metrics=types.SimpleNamespace(requests=requests))
    BrokerServer.metadata_updated(server, ["gone"])
    assert requests.bytes_in == {"kept": 5}


async def test_an_awaited_produce_is_observed_when_it_completes():
    # the purgatories are the replica manager's to count (tests/unit/replication/test_delayed_fetch.py):
    # an awaited produce may be waiting for a worker thread's validation, not for replication
    clock = Clock()
    rm = RequestMetrics(clock)
    replicated = trio.Event()
    batch = build_batch([b"a"] * 2)

    async def wait_for_hw():
        await replicated.wait()
        clock.now += 0.2
        return ProduceResponse([TopicProduceResponse("t", [PartitionProduceResponse(0, 0, 0)])])

    result = rm.instrument(lambda h, b: wait_for_hw())(header(ApiKey.PRODUCE), produce_body("t", {0: batch}))
    async with trio.open_nursery() as nursery:
        done = []

        async def run():
            done.append(await result)

        nursery.start_soon(run)
        await trio.sleep(0.01)
        assert "Produce" not in rm.latency
        replicated.set()
    assert done
    assert rm.messages_in == {"t": 2}
    assert rm.latency["Produce"].sum == pytest.approx(0.2)


async def test_a_cancelled_produce_is_observed():
    rm = RequestMetrics(Clock())

    async def forever():
        await trio.sleep_forever()

    result = rm.instrument(lambda h, b: forever())(header(ApiKey.PRODUCE), produce_body("t", {}))
    with trio.move_on_after(0.01):
        await result
    assert rm.latency["Produce"].count == 1 and not rm.errors


@pytest.mark.parametrize("as_body", [False, True], ids=["typed", "body"])
async def test_fetches_count_bytes_out_for_consumers_and_replication_for_followers(as_body):
    # the fetch handler answers with the response's body (Apis._fetch_response)
    rm = RequestMetrics(Clock())
    b1, b2 = build_batch([b"a"] * 3), build_batch([b"b"] * 2, base_offset=3)
    response = FetchResponse([FetchTopicResponse("t", [FetchPartitionResponse(0, 0, 5, 0, b1 + b2),
                                                       FetchPartitionResponse(1, 0, 0, 0, None),
                                                       FetchPartitionResponse(2, 6)])])
    response = response.to_body() if as_body else response

    async def fetch():
        return response

    handle = rm.instrument(lambda h, b: fetch())
    await handle(header(ApiKey.FETCH), {"replica_id": -1})
    await handle(header(ApiKey.FETCH), {"replica_id": 2})
    assert rm.bytes_out == {"t": len(b1) + len(b2)} and rm.messages_out == {"t": 5}
    assert rm.replication_bytes_out == len(b1) + len(b2)
    assert rm.latency["FetchConsumer"].count == rm.latency["FetchFollower"].count == 1
    assert rm.errors == {("FetchConsumer", 6): 1, ("FetchFollower", 6): 1}


class _Deferred(DeferredResponse):
    def __init__(self):
        self.complete = None
        self.cancelled = False

    def attach(self, complete):
        self.complete = complete

    def cancel(self):
        self.cancelled = True


@pytest.mark.parametrize("as_body", [False, True], ids=["typed", "body"])
def test_a_deferred_consumer_fetch_is_observed_and_counted_when_answered(as_body):
    """A consumer's long poll answered later (a DelayedFetch): its latency includes the wait
    and the bytes it carries out are counted, when it is answered, not when it was read."""
    clock = Clock()
    rm = RequestMetrics(clock)
    batch = build_batch([b"a"] * 3)
    response = FetchResponse([FetchTopicResponse("t", [FetchPartitionResponse(0, 0, 3, 0, batch)])])
    response = response.to_body() if as_body else response
    inner = _Deferred()
    result = rm.instrument(lambda h, b: inner)(header(ApiKey.FETCH), {"replica_id": -1})
    assert is_deferred(result) and "FetchConsumer" not in rm.latency
    answered = []
    result.attach(answered.append)
    clock.now += 0.25
    inner.complete(response)
    assert answered == [response]
    assert rm.latency["FetchConsumer"].count == 1 and rm.latency["FetchConsumer"].sum == pytest.approx(0.25)
    assert rm.bytes_out == {"t": len(batch)} and rm.messages_out == {"t": 3}
    cancelled = _Deferred()
    result = rm.instrument(lambda h, b: cancelled)(header(ApiKey.FETCH), {"replica_id": -1})
    result.attach(answered.append)
    result.cancel()
    assert cancelled.cancelled and rm.latency["FetchConsumer"].count == 2 and rm.messages_out == {"t": 3}


def test_a_deferred_acks_all_produce_is_observed_when_answered():
    """An acks=all produce answered later (a DelayedProduce): its latency includes the wait
    for replication."""
    clock = Clock()
    rm = RequestMetrics(clock)
    batch = build_batch([b"a"] * 2)
    inner = _Deferred()
    result = rm.instrument(lambda h, b: inner)(header(ApiKey.PRODUCE), produce_body("t", {0: batch}))
    answered = []
    result.attach(answered.append)
    assert result.body == [("t", 0, len(batch), 2)]  # appended already: its counts kept, not its records
    clock.now += 0.2
    response = ProduceResponse([TopicProduceResponse("t", [PartitionProduceResponse(0, 0, 0)])])
    inner.complete(response)
    assert answered == [response]
    assert rm.latency["Produce"].sum == pytest.approx(0.2) and rm.messages_in == {"t": 2}
    cancelled = _Deferred()
    result = rm.instrument(lambda h, b: cancelled)(header(ApiKey.PRODUCE), produce_body("t", {0: batch}))
    result.attach(answered.append)
    result.cancel()  # its connection closed
    assert cancelled.cancelled and rm.latency["Produce"].count == 2


def test_a_malformed_body_never_fails_the_request():
    rm = RequestMetrics(Clock())
    assert rm.instrument(lambda h, b: None)(header(ApiKey.PRODUCE), {"topic_data": [{"name": "t"}]}) is None
    assert rm.latency["Produce"].count == 1


def test_request_families_render(broker):
    rm = RequestMetrics(Clock())
    rm.instrument(lambda h, b: None)(header(ApiKey.PRODUCE), produce_body("t", {0: build_batch([b"a"])}, acks=0))
    m = samples(build_registry(broker, rm, process=False))
    assert m["tidelog_topic_messages_in_total{topic=t}"] == 1
    assert m["tidelog_request_duration_seconds_count{request=Produce}"] == 1
    assert m[f"tidelog_request_duration_seconds_bucket{{le={LATENCY_BUCKETS_S[0]},request=Produce}}"] == 1
    assert m["tidelog_produce_purgatory_size"] == m["tidelog_fetch_purgatory_size"] == 0
    broker.replica_manager.produce_purgatory_size, broker.replica_manager.fetch_purgatory_size = 2, 3
    m = samples(build_registry(broker, rm, process=False))  # the replica manager's counts
    assert (m["tidelog_produce_purgatory_size"], m["tidelog_fetch_purgatory_size"]) == (2, 3)


# -- failed requests, queue time, follower lag, event-loop lag ---------------------------------------


async def test_error_codes_in_responses_are_counted_per_request_and_error(broker):
    rm = RequestMetrics(Clock())
    response = ProduceResponse([TopicProduceResponse("t", [PartitionProduceResponse(0, 0, 10),
                                                           PartitionProduceResponse(1, 6, -1),
                                                           PartitionProduceResponse(2, 6, -1)])])
    rm.instrument(lambda h, b: response)(header(ApiKey.PRODUCE), produce_body("t", {0: build_batch([b"a"])}, acks=1))
    fetch = FetchResponse([FetchTopicResponse("t", [FetchPartitionResponse(0, 1), FetchPartitionResponse(1, 0)])])
    rm.instrument(lambda h, b: fetch)(header(ApiKey.FETCH), {"replica_id": -1})

    def broken(h, b):
        raise ValueError("bad body")

    with pytest.raises(ValueError):
        rm.instrument(broken)(header(ApiKey.METADATA), {})

    def refused(h, b):
        raise TidelogError("no such group", error=GROUP_ID_NOT_FOUND)

    async def refused_later():
        raise TidelogError("not the coordinator", error=NOT_COORDINATOR)

    with pytest.raises(TidelogError):
        rm.instrument(refused)(header(ApiKey.DESCRIBE_GROUPS), {})
    with pytest.raises(TidelogError):
        await rm.instrument(lambda h, b: refused_later())(header(ApiKey.DESCRIBE_GROUPS), {})
    rm.instrument(lambda h, b: error_body(CLUSTER_AUTHORIZATION_FAILED))(header(ApiKey.LEADER_AND_ISR), {})
    m = samples(build_registry(broker, rm, process=False))
    assert m["tidelog_request_errors_total{error=GROUP_ID_NOT_FOUND,request=DescribeGroups}"] == 1
    assert m["tidelog_request_errors_total{error=NOT_COORDINATOR,request=DescribeGroups}"] == 1
    assert m["tidelog_request_errors_total{error=CLUSTER_AUTHORIZATION_FAILED,request=LeaderAndIsr}"] == 1
    assert m["tidelog_request_errors_total{error=NOT_LEADER_OR_FOLLOWER,request=Produce}"] == 2
    assert m["tidelog_request_errors_total{error=OFFSET_OUT_OF_RANGE,request=FetchConsumer}"] == 1
    assert m["tidelog_request_errors_total{error=UNKNOWN_SERVER_ERROR,request=Metadata}"] == 1
    assert not any("request=Fetch" in k and "NONE" in k for k in m)


def test_count_errors_reads_the_top_level_and_two_levels_of_lists():
    response = FetchResponse([FetchTopicResponse("t", [FetchPartitionResponse(0, 3), FetchPartitionResponse(1, 3)])],
                             error_code=7)
    assert count_errors(response) == {7: 1, 3: 2}
    assert count_errors(FetchResponse([FetchTopicResponse("t", [FetchPartitionResponse(0, 0)])])) is None
    assert count_errors(None) is None
    assert count_errors({"error_code": 5}) is None  # not a message: nothing to read


def test_request_queue_time_is_a_summary_over_every_request_read(broker):
    broker.stats = NetworkStats(2, 5, {0: 3, 3: 7}, 1, 0, request_queue_time_s=0.25)
    m = samples(build_registry(broker, RequestMetrics(), process=False))
    assert m["tidelog_request_queue_time_seconds_count"] == 10
    assert m["tidelog_request_queue_time_seconds_sum"] == 0.25


def test_follower_max_lag_is_the_largest_over_the_fetchers(broker):
    rm = broker.replica_manager
    assert samples(build_registry(broker, RequestMetrics(), process=False))["tidelog_replica_fetcher_max_lag"] == 0
    rm.fetchers = {(2, 0): types.SimpleNamespace(partitions={TopicPartition("a", 0): FetchState(0, lag=3),
                                                             TopicPartition("a", 1): FetchState(0, lag=40)}),
                   (3, 0): types.SimpleNamespace(partitions={TopicPartition("b", 0): FetchState(0, lag=7)})}
    assert samples(build_registry(broker, RequestMetrics(), process=False))["tidelog_replica_fetcher_max_lag"] == 40


def test_the_loop_lag_probe_records_how_late_it_woke(broker):
    probe = LoopLagProbe()
    probe.record(10.0, 10.0004)
    probe.record(10.0, 9.9)  # early (clock granularity): no negative lag
    probe.record(20.0, 21.5)
    m = samples(build_registry(broker, RequestMetrics(), process=False, loop_lag=probe))
    assert m["tidelog_event_loop_lag_seconds_count"] == 3
    assert m["tidelog_event_loop_lag_seconds_bucket{le=0.0005}"] == 2
    assert m["tidelog_event_loop_lag_seconds_sum"] == pytest.approx(1.5004)
    assert m["tidelog_event_loop_lag_max_seconds"] == 1.5
    m = samples(build_registry(broker, RequestMetrics(), process=False, loop_lag=probe))
    assert m["tidelog_event_loop_lag_max_seconds"] == 0  # the largest since the previous scrape


async def test_the_loop_lag_probe_runs_with_the_endpoint(broker, nursery, autojump_clock):
    metrics = BrokerMetrics(broker)
    await nursery.start(metrics.run, "127.0.0.1", 0)
    await trio.sleep(1.05)
    assert metrics.loop_lag.lag.count == 10


# -- the HTTP endpoint ---------------------------------------------------------------------------------


async def http(port: int, request: bytes) -> bytes:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(request)
        chunks = []
        while data := await stream.receive_some(65536):
            chunks.append(data)
    return b"".join(chunks)


async def test_endpoint_serves_metrics_ready_and_live(broker, nursery):
    metrics = BrokerMetrics(broker)
    port = await nursery.start(metrics.run, "127.0.0.1", 0)
    response = await http(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    head, _, body = response.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200 OK")
    assert b"Content-Type: text/plain; version=0.0.4" in head
    openmetrics = await http(port, b"GET /metrics HTTP/1.1\r\nAccept: application/openmetrics-text; "
                                   b"version=1.0.0\r\n\r\n")
    assert b"Content-Type: application/openmetrics-text" in openmetrics and openmetrics.endswith(b"# EOF\n")
    assert int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0]) == len(body)
    assert b"tidelog_replica_manager_under_replicated_partitions 2.0" in body
    assert (await http(port, b"GET /ready HTTP/1.0\r\n\r\n")).endswith(b"\r\n\r\nready\n")
    assert (await http(port, b"GET /live HTTP/1.0\r\n\r\n")).startswith(b"HTTP/1.0 200")
    broker._ready = False
    not_ready = await http(port, b"GET /ready HTTP/1.0\r\n\r\n")
    assert not_ready.startswith(b"HTTP/1.0 503") and b"no cluster metadata" in not_ready
    head_only = await http(port, b"HEAD /metrics HTTP/1.0\r\n\r\n")
    assert head_only.startswith(b"HTTP/1.0 200") and head_only.endswith(b"\r\n\r\n")


async def test_endpoint_rejects_what_it_does_not_serve(broker, nursery):
    port = await nursery.start(BrokerMetrics(broker).run, "127.0.0.1", 0)
    assert (await http(port, b"GET /nope HTTP/1.0\r\n\r\n")).startswith(b"HTTP/1.0 404")
    assert (await http(port, b"POST /metrics HTTP/1.0\r\n\r\n")).startswith(b"HTTP/1.0 405")
    assert (await http(port, b"\xff\xfe\r\n\r\n")).startswith(b"HTTP/1.0 400")
    assert await http(port, b"GET /" + b"a" * 10000) == b""  # an oversized head: dropped
    assert (await http(port, b"GET /live HTTP/1.0\r\n\r\n")).startswith(b"HTTP/1.0 200")  # still serving


def test_respond_is_plain_bytes(broker):
    server = MetricsServer(build_registry(broker, RequestMetrics(), process=False), broker.readiness, None, 0)
    assert server.respond(b"GET /live?x=1 HTTP/1.1\r\n\r\n").endswith(b"ok\n")


class CountingCollector:
    """A registry's collector that counts its collections and takes ``cost_s`` of the clock."""

    def __init__(self, clock: Clock, cost_s: float = 0.0):
        self.clock, self.cost_s, self.collected = clock, cost_s, 0

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        self.collected += 1
        self.clock.now += self.cost_s
        g = GaugeMetricFamily("tidelog_test_collections", "collections so far")
        g.add_metric([], float(self.collected))
        yield g


def counting_server(cost_s: float = 0.0) -> tuple[MetricsServer, CountingCollector, Clock]:
    clock = Clock()
    collector = CountingCollector(clock, cost_s)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return MetricsServer(registry, lambda: None, "127.0.0.1", 0, clock=clock), collector, clock


async def test_concurrent_scrapes_render_the_registry_once(nursery):
    server, collector, clock = counting_server()
    port = await nursery.start(server.run)
    bodies = []

    async def scrape():
        bodies.append(await http(port, b"GET /metrics HTTP/1.0\r\n\r\n"))

    async with trio.open_nursery() as scrapes:
        for _ in range(8):
            scrapes.start_soon(scrape)
    assert collector.collected == 1 and len(set(bodies)) == 1
    clock.now += RENDER_REUSE_S
    assert b"tidelog_test_collections 2.0" in await http(port, b"GET /metrics HTTP/1.0\r\n\r\n")


def test_a_slow_rendering_is_reused_for_longer():
    server, collector, clock = counting_server(cost_s=0.5)  # 10 x 0.5 s: reused for 5 s
    server.respond(b"GET /metrics HTTP/1.0\r\n\r\n")
    clock.now += 4.9
    server.respond(b"GET /metrics HTTP/1.0\r\n\r\n")
    assert collector.collected == 1
    clock.now += 0.1
    server.respond(b"GET /metrics HTTP/1.0\r\n\r\n")
    assert collector.collected == 2
    # OpenMetrics is a rendering of its own
    server.respond(b"GET /metrics HTTP/1.0\r\nAccept: application/openmetrics-text; version=1.0.0\r\n\r\n")
    assert collector.collected == 3


async def test_connections_beyond_the_bound_are_closed_at_once(nursery):
    server, _, _ = counting_server()
    port = await nursery.start(server.run)
    idle = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(MAX_METRICS_CONNECTIONS)]
    with trio.fail_after(10):
        while server.connections < MAX_METRICS_CONNECTIONS:  # each waiting for its request head
            await trio.sleep(0.01)
    extra = await trio.open_tcp_stream("127.0.0.1", port)
    async with extra:
        with trio.fail_after(10):
            assert await extra.receive_some(100) == b""  # closed, unanswered, without waiting for its request
    for stream in idle:
        await stream.aclose()
    with trio.fail_after(10):
        while server.connections:
            await trio.sleep(0.01)
    assert (await http(port, b"GET /live HTTP/1.0\r\n\r\n")).startswith(b"HTTP/1.0 200")


def test_a_throttled_answer_sent_at_once_is_accounted_as_its_response():
    # KIP-219: the quota enforcer wraps the answer of a client that waits out its throttle
    from tidelog.broker.deferred import Throttled

    rm = RequestMetrics(Clock())
    batch = build_batch([b"a"] * 3)
    response = FetchResponse([FetchTopicResponse("t", [FetchPartitionResponse(0, 0, 3, 0, batch),
                                                       FetchPartitionResponse(1, 6)])]).to_body()
    answer = Throttled(response, 100)
    assert rm.instrument(lambda h, b: answer)(header(ApiKey.FETCH), {"replica_id": -1}) is answer
    assert rm.bytes_out == {"t": len(batch)} and rm.messages_out == {"t": 3}
    assert rm.errors == {("FetchConsumer", 6): 1}


async def test_a_produce_whose_task_hands_over_a_replication_wait_is_observed_when_answered():
    """A produce validated in a worker thread, then waiting for replication (its task returns
    the DelayedProduce): observed once answered, keeping its counts, not its records."""
    clock = Clock()
    rm = RequestMetrics(clock)
    batch = build_batch([b"a"] * 2)
    inner = _Deferred()

    async def validated_then_appended():
        return inner

    result = await rm.instrument(lambda h, b: validated_then_appended())(
        header(ApiKey.PRODUCE), produce_body("t", {0: batch}))
    assert is_deferred(result) and result.body == [("t", 0, len(batch), 2)] and "Produce" not in rm.latency
    answered = []
    result.attach(answered.append)
    clock.now += 0.2
    response = ProduceResponse([TopicProduceResponse("t", [PartitionProduceResponse(0, 0, 0)])])
    inner.complete(response)
    assert answered == [response] and rm.messages_in == {"t": 2}
    assert rm.latency["Produce"].count == 1 and rm.latency["Produce"].sum == pytest.approx(0.2)


def test_a_broker_without_the_log_cleaner_exports_no_cleaner_families(tmp_path):
    """``log.cleaner.enable=false``: the families are absent (operations guide), not a
    last-clean time of -1 that would never raise the stuck-cleaner alert."""
    from tidelog.broker.config import BrokerConfig
    from tidelog.broker.server import BrokerServer

    props = {"broker.id": 1, "zookeeper.connect": "127.0.0.1:1", "log.dirs": str(tmp_path)}
    off = BrokerServer(BrokerConfig.from_props({**props, "log.cleaner.enable": "false"}))
    on = BrokerServer(BrokerConfig.from_props(props))
    assert off.log_cleaner is None and on.log_cleaner is not None
    lm = LogManager([str(tmp_path)], LogConfig())
    server = FakeServer(ReplicaManager(ReplicaConfig(1), lm, lambda t: LogConfig(), lambda leader, fetcher=0: None), lm)
    server.log_cleaner = off.log_cleaner
    names = family_names(build_registry(server, RequestMetrics()))
    assert not any(name.startswith("tidelog_log_cleaner_") for name in names)
