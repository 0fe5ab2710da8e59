"""Client quotas, pure: Kafka's windowed rate, the throttle time, which entity's quota applies
(and which requests share a budget), entity paths, and kafka-configs' bracket syntax."""

from __future__ import annotations

import pytest

from tidelog.broker.security.entity_configs import quota_change, quota_components, quota_entity_path, scram_change
from tidelog.broker.security.quotas import (
    PRODUCER_BYTE_RATE,
    REQUEST_PERCENTAGE,
    ClientQuotas,
    Quota,
    QuotaSensors,
    QuotaType,
    Rate,
    fetch_bytes,
    quota_entities,
    resolve,
    throttle_time_ms,
    user_of,
    with_throttle,
)
from tidelog.broker.zookeeper.layout import (
    config_change_sequence,
    decode_config_change,
    encode_config_change,
    entity_path,
    parse_entity_path,
    sanitize,
)
from tidelog.commands.common import UsageError
from tidelog.commands.configs import parse_add_config, parse_delete_config, parse_scram
from tidelog.protocol.errors import DUPLICATE_RESOURCE, INVALID_REQUEST, RESOURCE_NOT_FOUND, TidelogError
from tidelog.protocol.messages import (
    AlterClientQuotasEntry,
    ClientQuotaEntityData,
    ClientQuotaOp,
    FetchPartitionResponse,
    FetchResponse,
    FetchTopicResponse,
    ProduceResponse,
    ScramCredentialDeletion,
)

# -- the rate ----------------------------------------------------------------------------------


def test_a_young_rate_is_measured_over_all_but_one_sample_window():
    rate = Rate(11, 1000)
    rate.record(5000, 0)
    assert rate.window_ms(0) == 10_000  # padded to num - 1 windows: no burst looks infinite
    assert rate.measure(0) == 500.0


def test_the_window_grows_with_the_samples_then_old_samples_expire():
    rate = Rate(3, 1000)
    rate.record(3000, 0)
    assert rate.window_ms(500) == 2500  # 500 ms, padded with the 2 windows still to come
    rate.record(3000, 2500)  # a second sample
    assert rate.window_ms(2500) == 2500
    assert rate.measure(2500) == 6000 / 2.5
    # the first sample (started at 0) is obsolete at 3000: only the second counts
    assert rate.measure(3000) == 3000 / 2.5


def test_samples_are_reused_in_turn():
    rate = Rate(2, 1000)
    for t in range(0, 10_000, 100):
        rate.record(10, t)
    assert rate.measure(9_999) == pytest.approx(100, rel=0.2)  # 10 every 100 ms


def test_throttle_time_brings_the_rate_back_to_the_quota():
    assert throttle_time_ms(100, 100, 10_000, 60_000) == 0
    assert throttle_time_ms(150, 100, 10_000, 60_000) == 5_000  # (150-100)/100 * 10 s
    assert throttle_time_ms(1e9, 100, 10_000, 1_000) == 1_000  # capped (request time)


def test_only_request_time_throttles_are_bounded_as_kafkas():
    """Kafka's ClientQuotaManager: a byte-rate throttle is whatever brings the rate back to
    the quota (a cap let a client twice its quota through, large request after large
    request); ClientRequestQuotaManager caps a request-time throttle at one sample window."""
    quota = Quota(1000.0, ("", "app"), "clients/app")
    produce = QuotaSensors(QuotaType.PRODUCE, samples=11, sample_ms=1000)
    assert produce.record(quota, 50_000, 0) == 40_000  # 50 kB over the minimum 10 s window
    request = QuotaSensors(QuotaType.REQUEST, samples=11, sample_ms=1000)
    assert request.record(Quota(10.0, ("", "app"), "clients/app"), 1e6, 0) == 1000


def test_a_consumers_fetch_is_bounded_by_what_its_quota_allows_in_a_window():
    """Kafka's getMaxValueInQuotaWindow: a consumer's fetch asks at most quota x (samples - 1)
    x window bytes, so one answer cannot take many windows' worth of its quota."""
    from tidelog.broker.context import RequestContext
    from tidelog.broker.security.quotas import QuotaEnforcer
    from tidelog.protocol.codec import ApiKey, RequestHeader

    seen = []
    quotas = ClientQuotas(lambda: {"clients/<default>": {"consumer_byte_rate": "1000"}}, lambda: 1)
    handle = QuotaEnforcer(quotas, clock=lambda: 0.0).instrument(lambda ctx, body: seen.append(body["max_bytes"]))
    ctx = RequestContext(RequestHeader(ApiKey.FETCH, 4, 1, "app"))
    for asked in (50 * 1024 * 1024, 5000):
        handle(ctx, {"replica_id": -1, "max_bytes": asked})
    handle(ctx, {"replica_id": 2, "max_bytes": 50 * 1024 * 1024})  # a follower's: never
    assert seen == [10_000, 5000, 50 * 1024 * 1024]


def test_sensors_record_and_count_throttle_time():
    sensors = QuotaSensors(QuotaType.PRODUCE, samples=2, sample_ms=1000)
    quota = Quota(1000.0, ("", "app"), "clients/app")
    assert sensors.record(quota, 500, 0) == 0  # 500 B over a 1 s window
    assert sensors.record(quota, 1500, 0) == 1000  # 2000 B/s: one more second
    assert sensors.sensors[("", "app")].throttle_time_ms == 1000
    sensors.expire(3_600_010)
    assert not sensors.sensors


# -- which quota applies -----------------------------------------------------------------------

LEVELS = ["users/alice/clients/app", "users/alice/clients/<default>", "users/alice",
          "users/<default>/clients/app", "users/<default>/clients/<default>", "users/<default>",
          "clients/app", "clients/<default>"]
SENSORS = [("alice", "app"), ("alice", "app"), ("alice", ""), ("alice", "app"), ("alice", "app"), ("alice", ""),
           ("", "app"), ("", "app")]


@pytest.mark.parametrize("level", range(len(LEVELS)))
def test_the_most_specific_entity_wins(level):
    configs = {path: {PRODUCER_BYTE_RATE: str(1000 * (i + 1))} for i, path in enumerate(LEVELS) if i >= level}
    quota = resolve(configs, "alice", "app", PRODUCER_BYTE_RATE)
    assert quota == Quota(1000.0 * (level + 1), SENSORS[level], LEVELS[level])


def test_each_quota_key_is_resolved_on_its_own():
    configs = {"users/alice": {REQUEST_PERCENTAGE: "50.0"}, "clients/app": {PRODUCER_BYTE_RATE: "1024"}}
    assert resolve(configs, "alice", "app", PRODUCER_BYTE_RATE).entity == "clients/app"
    assert resolve(configs, "alice", "app", REQUEST_PERCENTAGE).entity == "users/alice"
    assert resolve(configs, "bob", "other", PRODUCER_BYTE_RATE) is None
    assert resolve({"clients/app": {PRODUCER_BYTE_RATE: "garbage"}}, "alice", "app", PRODUCER_BYTE_RATE) is None


def test_names_are_sanitized_in_entity_paths():
    assert entity_path("alice smith", None) == "users/alice%20smith"
    assert entity_path("CN=a,O=b", "app*") == "users/CN%3Da%2CO%3Db/clients/app%2A"
    assert sanitize("<default>") != "<default>"
    assert parse_entity_path("users/CN%3Da%2CO%3Db/clients/<default>") == ("CN=a,O=b", "<default>")
    for bad in ("topics/x", "users", "users/a/clients", "users/a/topics/b", "clients/a/clients/b"):
        with pytest.raises(ValueError):
            parse_entity_path(bad)


def test_the_client_quotas_follow_the_store_generation():
    store = {"configs": {}, "generation": 0}
    quotas = ClientQuotas(lambda: store["configs"], lambda: store["generation"])
    assert not quotas.any
    store.update(configs={"clients/<default>": {PRODUCER_BYTE_RATE: "10"}}, generation=1)
    assert quotas.any
    assert quotas.quotas_for("ANONYMOUS", "x")[QuotaType.PRODUCE].sensor == ("", "x")


def test_change_notifications():
    assert decode_config_change(encode_config_change("users/alice")) == "users/alice"
    assert config_change_sequence("config_change_0000000012") == 12
    assert config_change_sequence("isr_change_0000000012") is None


def test_a_fetch_answer_counts_its_record_bytes_as_body_or_typed():
    # the fetch handler answers with the response's body; a refusal is the typed message
    typed = FetchResponse([FetchTopicResponse("a", [FetchPartitionResponse(0, 0, records=b"x" * 10),
                                                    FetchPartitionResponse(1, 0, records=None)]),
                           FetchTopicResponse("b", [FetchPartitionResponse(0, 0, records=b"y" * 5)])])
    assert fetch_bytes(typed) == fetch_bytes(typed.to_body()) == 15
    assert fetch_bytes({"error_code": 29}) == fetch_bytes(FetchResponse([], 29)) == 0


def test_a_response_reports_its_throttle_time():
    assert with_throttle(ProduceResponse([]), 250).throttle_time_ms == 250
    assert with_throttle({"error_code": 42}, 7) == {"error_code": 42, "throttle_time_ms": 7}
    assert user_of("User:alice") == "alice" and user_of("User:ANONYMOUS") == "ANONYMOUS"


# -- the API's checks --------------------------------------------------------------------------


def test_quota_entities_and_changes():
    user, client = ClientQuotaEntityData("user", "alice"), ClientQuotaEntityData("client-id", None)
    assert quota_entity_path([user, client]) == "users/alice/clients/<default>"
    assert quota_components("users/alice/clients/<default>") == {"user": "alice", "client-id": None}
    for bad in ([], [user, user], [ClientQuotaEntityData("ip", "1.2.3.4")], [ClientQuotaEntityData("user", "")]):
        with pytest.raises(TidelogError) as e:
            quota_entity_path(bad)
        assert e.value.error is INVALID_REQUEST
    change = quota_change(AlterClientQuotasEntry([user], [ClientQuotaOp("producer_byte_rate", 1024.0),
                                                          ClientQuotaOp("request_percentage", 0, True)]))
    assert change({"request_percentage": "5.0", "SCRAM-SHA-256": "kept"}) == \
        {"producer_byte_rate": "1024", "SCRAM-SHA-256": "kept"}
    for op in (ClientQuotaOp("producer_byte_rate", -1.0), ClientQuotaOp("producer_byte_rate", 1.5),
               ClientQuotaOp("controller_mutation_rate", 1.0), ClientQuotaOp("request_percentage", float("nan"))):
        with pytest.raises(TidelogError):
            quota_change(AlterClientQuotasEntry([user], [op]))


def test_scram_changes_are_checked_before_anything_is_written():
    with pytest.raises(TidelogError) as e:
        scram_change("alice", [ScramCredentialDeletion("alice", 1), ScramCredentialDeletion("alice", 1)])
    assert e.value.error is DUPLICATE_RESOURCE
    change = scram_change("alice", [ScramCredentialDeletion("alice", 2)])
    with pytest.raises(TidelogError) as e:
        change({"SCRAM-SHA-256": "x"})
    assert e.value.error is RESOURCE_NOT_FOUND


# -- kafka-configs' syntax ---------------------------------------------------------------------


def test_the_bracket_syntax():
    assert parse_add_config("SCRAM-SHA-256=[iterations=8192,password=alice-secret],producer_byte_rate=1024") == \
        {"SCRAM-SHA-256": "iterations=8192,password=alice-secret", "producer_byte_rate": "1024"}
    assert parse_add_config("a=1,b=[x=1,y=2],c=[]") == {"a": "1", "b": "x=1,y=2", "c": ""}
    assert parse_add_config("SCRAM-SHA-512=[password=p=q]") == {"SCRAM-SHA-512": "password=p=q"}
    assert parse_delete_config("SCRAM-SHA-256, producer_byte_rate") == ["SCRAM-SHA-256", "producer_byte_rate"]
    assert parse_scram("SCRAM-SHA-256", "iterations=8192,password=s") == (8192, "s")
    assert parse_scram("SCRAM-SHA-256", "password=s") == (4096, "s")
    for bad in ("novalue", "a=[1", "a=1,a=2", ""):
        with pytest.raises(UsageError):
            parse_add_config(bad)
    for bad in ("iterations=8192", "password=s,salt=x", "iterations=many,password=s"):
        with pytest.raises(UsageError):
            parse_scram("SCRAM-SHA-256", bad)


def test_a_client_without_a_client_id_gets_the_default_quotas():
    """A request with no client id (the envelope allows none) must resolve, not fail: only
    the <default> client entities can apply to it."""
    configs = {"clients/<default>": {"producer_byte_rate": "100"}, "users/alice": {"consumer_byte_rate": "7"}}
    assert resolve(configs, "alice", "", "producer_byte_rate").entity == "clients/<default>"
    assert resolve(configs, "alice", "", "consumer_byte_rate").entity == "users/alice"
    assert all("//" not in path and not path.endswith("/") for path, _ in quota_entities("alice", ""))


@pytest.mark.parametrize("name", [".", "..", "a.b", "*", "x" * 300])
def test_any_user_or_client_id_that_fits_is_an_entity_path_and_back(name):
    path = quota_entity_path([ClientQuotaEntityData("user", name)])
    assert parse_entity_path(path) == (name, None) and path.count("/") == 1


def test_a_name_too_long_for_a_znode_is_an_invalid_request():
    with pytest.raises(TidelogError) as e:
        quota_entity_path([ClientQuotaEntityData("client-id", "x" * 5000)])
    assert e.value.error is INVALID_REQUEST


# -- enforcement --------------------------------------------------------------------------------


class _LongPoll:
    """A deferred answer, completed by the test."""

    def attach(self, complete) -> None:
        self.complete = complete

    def cancel(self) -> None:
        pass


@pytest.mark.parametrize("client_throttles", [True, False])
def test_a_deferred_answer_to_a_client_that_throttles_itself_goes_out_at_once(client_throttles):
    # KIP-219: no delay (no enforcer task here); the connection is muted after it instead
    from tidelog.broker.context import RequestContext
    from tidelog.broker.deferred import Throttled
    from tidelog.broker.security.quotas import CONSUMER_BYTE_RATE, QuotaEnforcer
    from tidelog.protocol.codec import ApiKey, RequestHeader

    configs = {entity_path(None, "app"): {CONSUMER_BYTE_RATE: "100"}}
    enforcer = QuotaEnforcer(ClientQuotas(lambda: configs, lambda: 0, samples=2, sample_ms=1000), clock=lambda: 0.0)
    poll = _LongPoll()
    context = RequestContext(RequestHeader(ApiKey.FETCH, 0, 1, "app"), client_throttles=client_throttles)
    answers: list = []
    enforcer.instrument(lambda ctx, body: poll)(context, {"replica_id": -1}).attach(answers.append)
    poll.complete(FetchResponse([FetchTopicResponse("t", [FetchPartitionResponse(0, 0, records=b"x" * 1000)])]))
    [answer] = answers
    assert isinstance(answer, Throttled) is client_throttles
    if client_throttles:
        assert answer.throttle_ms == answer.response.throttle_time_ms == 9000  # 1000 B at 100 B/s


def test_a_waiting_produce_is_charged_its_bytes_without_keeping_its_records():
    # an acks=all produce is appended before it waits: holding its records through the wait
    # would pin what the request memory budget gave back when the request was handed over
    from tidelog.broker.context import RequestContext
    from tidelog.broker.security.quotas import QuotaEnforcer
    from tidelog.protocol.codec import ApiKey, RequestHeader

    configs = {entity_path(None, "app"): {PRODUCER_BYTE_RATE: "100"}}
    enforcer = QuotaEnforcer(ClientQuotas(lambda: configs, lambda: 0, samples=2, sample_ms=1000), clock=lambda: 0.0)
    wait = _LongPoll()
    context = RequestContext(RequestHeader(ApiKey.PRODUCE, 0, 1, "app"), client_throttles=True)
    records = b"r" * 1000
    body = {"acks": -1, "topic_data": [{"name": "t", "partition_data": [{"index": 0, "records": records}]}]}
    deferred = enforcer.instrument(lambda ctx, b: wait)(context, body)
    answers: list = []
    deferred.attach(answers.append)
    assert deferred.body == len(records)
    wait.complete(None)
    [answer] = answers
    assert answer.throttle_ms == 9000  # 1000 B at 100 B/s, as if it had kept the records


def test_a_user_or_client_id_named_default_is_not_the_default_entity():
    """Only a None name is the default (``<default>`` in ZooKeeper); a name that reads
    ``<default>`` is sanitized like any other (%3Cdefault%3E, as Kafka's Sanitizer): altering
    its quota or its SCRAM credentials must not change every user's default."""
    from tidelog.broker.security.credentials import make_credential
    from tidelog.broker.security.entity_configs import EntityConfigStore, checked_entity_path

    named, default = ClientQuotaEntityData("user", "<default>"), ClientQuotaEntityData("user", None)
    assert quota_entity_path([named]) == "users/%3Cdefault%3E"
    assert quota_entity_path([default]) == "users/<default>"
    assert quota_entity_path([ClientQuotaEntityData("client-id", "<default>"), default]) == \
        "users/<default>/clients/%3Cdefault%3E"
    assert quota_components("users/%3Cdefault%3E") == {"user": "<default>"}
    assert quota_components("users/<default>/clients/%3Cdefault%3E") == {"user": None, "client-id": "<default>"}
    assert entity_path("<default>", None) == "users/%3Cdefault%3E"
    assert parse_entity_path("users/alice/clients/app") == ("alice", "app")  # names stored before read back
    configs = {"users/<default>": {PRODUCER_BYTE_RATE: "10"}, "users/%3Cdefault%3E": {PRODUCER_BYTE_RATE: "20"}}
    assert resolve(configs, "<default>", "app", PRODUCER_BYTE_RATE).entity == "users/%3Cdefault%3E"
    assert resolve(configs, "bob", "app", PRODUCER_BYTE_RATE).entity == "users/<default>"
    path = checked_entity_path("<default>", None)  # a SCRAM user's
    assert path == "users/%3Cdefault%3E"
    store = EntityConfigStore(zk=None)
    store._apply(path, {"SCRAM-SHA-256": make_credential("SCRAM-SHA-256", "secret", iterations=4096).to_text()})
    assert store.scram_credential("<default>", "SCRAM-SHA-256") is not None


async def test_a_produce_whose_task_hands_over_a_replication_wait_is_charged_when_answered():
    from tidelog.broker.context import RequestContext
    from tidelog.broker.security.quotas import QuotaEnforcer
    from tidelog.protocol.codec import ApiKey, RequestHeader

    configs = {entity_path(None, "app"): {PRODUCER_BYTE_RATE: "100"}}
    enforcer = QuotaEnforcer(ClientQuotas(lambda: configs, lambda: 0, samples=2, sample_ms=1000), clock=lambda: 0.0)
    wait = _LongPoll()

    async def validated_then_appended():
        return wait

    context = RequestContext(RequestHeader(ApiKey.PRODUCE, 0, 1, "app"), client_throttles=True)
    body = {"acks": -1, "topic_data": [{"name": "t", "partition_data": [{"index": 0, "records": b"r" * 1000}]}]}
    deferred = await enforcer.instrument(lambda ctx, b: validated_then_appended())(context, body)
    assert deferred.body == 1000  # its byte count, not its records
    answers: list = []
    deferred.attach(answers.append)
    wait.complete(None)
    [answer] = answers
    assert answer.throttle_ms == 9000
