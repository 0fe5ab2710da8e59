"""Every option of Spark's Kafka connector, without Spark or a cluster: each is either
implemented (and a test here or in test_planning.py / test_connector.py checks what it
does) or refused with an error that names it; and no other option is silently ignored.

The option list is the Structured Streaming + Kafka Integration Guide's (Spark 4): the
source's and the sink's tables and the ``kafka.*`` consumer and producer settings.
"""

from __future__ import annotations

import pytest

from tidelog.errors import RequestTimedOut
from tidelog.spark.cluster import retrying
from tidelog.spark.options import (
    REFUSED,
    OffsetSpec,
    OptionError,
    parse_duration_ms,
    parse_sink_options,
    parse_source_options,
)
from tidelog.spark.planning import OffsetRange, admit, cap_ranges, plan_ranges, resolve_ending

pytestmark = pytest.mark.unit

B = {"bootstrap.servers": "h:1"}
SUB = {**B, "subscribe": "t"}

# option -> (a valid value, "source" | "sink", how it is covered: the tests of its semantics,
# or "refused"). Tests named "module::name" live in tests/spark/<module>.py.
SPARK_KAFKA_OPTIONS: dict[str, tuple[str, str, list[str] | str]] = {
    "assign": ('{"t": [0]}', "source", ["test_planning::test_option_names_are_case_insensitive_and_json_offsets_parse",
                                        "test_connector::test_bad_options_fail_at_start_with_a_clear_message"]),
    "subscribe": ("t", "source", ["test_planning::test_source_options_defaults_follow_spark"]),
    "subscribePattern": ("t.*", "source",
                         ["test_connector::test_subscribe_pattern_picks_up_a_topic_created_while_the_query_runs"]),
    "kafka.bootstrap.servers": ("h:1", "both", ["test_options::test_bootstrap_servers_by_either_name"]),
    "startingTimestamp": ("1000", "source", ["test_planning::test_timestamp_options_win_over_starting_offsets",
                                             "test_connector::test_starting_timestamp"]),
    "startingOffsetsByTimestamp": ('{"t": {"0": 1000}}', "source",
                                   ["test_planning::test_resolve_starting_by_timestamp"]),
    "startingOffsets": ("earliest", "source", ["test_planning::test_resolve_starting_offsets",
                                               "test_connector::test_batch_read_of_explicit_offset_ranges"]),
    "endingTimestamp": ("1000", "batch", ["test_options::test_ending_timestamps_stop_before_the_first_later_record",
                                          "test_connector::test_batch_read_up_to_an_ending_timestamp"]),
    "endingOffsetsByTimestamp": ('{"t": {"0": 1000}}', "batch",
                                 ["test_options::test_ending_timestamps_stop_before_the_first_later_record"]),
    "endingOffsets": ("latest", "batch", ["test_planning::test_resolve_ending_never_passes_the_high_watermark"]),
    "failOnDataLoss": ("false", "source", ["test_planning::test_read_range_skips_lost_offsets_with_a_warning",
                                           "test_connector::test_data_loss_under_a_stopped_query"]),
    "kafkaConsumer.pollTimeoutMs": ("5000", "source", ["test_options::test_poll_timeout_by_either_name",
                                                       "test_planning::test_read_range_times_out_when_nothing_comes_"
                                                       "although_it_should"]),
    "fetchOffset.numRetries": ("2", "source", ["test_options::test_offset_lookups_are_retried"]),
    "fetchOffset.retryIntervalMs": ("5", "source", ["test_options::test_offset_lookups_are_retried"]),
    "maxOffsetsPerTrigger": ("100", "streaming", ["test_planning::test_next_end_respects_the_read_limit_and_the_"
                                                  "available_now_target",
                                                  "test_connector::test_max_offsets_per_trigger_bounds_every_"
                                                  "micro_batch"]),
    "minOffsetsPerTrigger": ("10", "streaming", ["test_options::test_min_offsets_per_trigger_waits_for_enough_"
                                                 "offsets_or_the_delay",
                                                 "test_connector::test_min_offsets_per_trigger_skips_small_triggers"]),
    "maxTriggerDelay": ("15m", "streaming", ["test_options::test_min_offsets_per_trigger_waits_for_enough_"
                                             "offsets_or_the_delay", "test_options::test_durations_read_as_spark_"
                                             "reads_them"]),
    "minPartitions": ("4", "source", ["test_planning::test_min_partitions_splits_large_ranges",
                                      "test_connector::test_min_partitions_splits_ranges_in_a_batch_read"]),
    "maxRecordsPerPartition": ("100", "source", ["test_options::test_max_records_per_partition_caps_every_range"]),
    "groupIdPrefix": ("spark-kafka-source", "source", "refused"),
    "kafka.group.id": ("g", "source", "refused"),
    "includeHeaders": ("true", "source", ["test_connector::test_sink_round_trip_with_keys_and_headers"]),
    "startingOffsetsByTimestampStrategy": ("latest", "source",
                                           ["test_planning::test_resolve_starting_by_timestamp"]),
    "topic": ("t", "sink", ["test_connector::test_streaming_sink_and_the_topic_column"]),
    # security settings by Kafka's Java names, as Spark's connector passes them on
    "kafka.security.protocol": ("SSL", "source", ["test_options::test_security_options_pass_through_by_kafkas_names"]),
    "kafka.sasl.mechanism": ("PLAIN", "source", ["test_options::test_security_options_pass_through_by_kafkas_names"]),
    "kafka.sasl.jaas.config": ('x required username="u" password="p";', "source",
                               ["test_options::test_security_options_pass_through_by_kafkas_names"]),
    "kafka.ssl.truststore.location": ("/ca.pem", "source",
                                      ["test_options::test_security_options_pass_through_by_kafkas_names"]),
    # kafka.* settings Tidelog's clients do not have are refused, with the list of those they have
    "kafka.sasl.kerberos.service.name": ("kafka", "source", "refused"),
}


def _parse(name: str, value: str, kind: str) -> None:
    if kind == "sink":
        parse_sink_options({**B, name: value})
    elif kind == "both":
        parse_sink_options({name: value})
        parse_source_options({"subscribe": "t", name: value}, streaming=True)
    else:
        base = B if name in ("subscribePattern", "assign") else SUB
        parse_source_options({**base, name: value}, streaming=kind != "batch")


@pytest.mark.parametrize("name", sorted(SPARK_KAFKA_OPTIONS))
def test_every_spark_kafka_option_is_tested_or_refused(name):
    value, kind, coverage = SPARK_KAFKA_OPTIONS[name]
    if coverage == "refused":
        with pytest.raises(OptionError) as e:
            _parse(name, value, kind)
        assert name in str(e.value)
        return
    _parse(name, value, kind)  # accepted
    from pathlib import Path

    here = Path(__file__).parent
    for ref in coverage:
        module, test = ref.split("::")
        text = (here / f"{module}.py").read_text()
        assert f"def {test}(" in text, f"{name}: {ref} does not exist"


def test_refused_options_say_why():
    with pytest.raises(OptionError, match="groupIdPrefix is not supported.*groupId"):
        parse_source_options({**SUB, "groupIdPrefix": "x"}, streaming=True)
    assert set(REFUSED) <= {n.lower() for n in SPARK_KAFKA_OPTIONS}


@pytest.mark.parametrize("options,role,fragment", [
    ({**SUB, "startingOffset": "earliest"}, "source", "unknown source option 'startingOffset'"),
    ({**SUB, "maxOffsetPerTrigger": "5"}, "source", "unknown source option 'maxOffsetPerTrigger'"),
    ({**SUB, "topic": "x"}, "source", "it is a sink option"),
    ({**SUB, "checkpointLocation": "/x"}, "source", "it is a sink option"),
    ({**SUB, "path": "/x"}, "source", "takes no path"),
    ({**B, "topic": "t", "startingOffsets": "earliest"}, "sink", "it is a source option"),
    ({**B, "topic": "t", "includeHeaders": "true"}, "sink", "it is a source option"),
    ({**B, "topic": "t", "path": "/x"}, "sink", "takes no path"),
    ({**B, "topic": "t", "kafka.no.such": "1"}, "sink", "unknown producer option 'kafka.no.such'"),
])
def test_unknown_options_are_refused_not_ignored(options, role, fragment):
    with pytest.raises(OptionError) as e:
        if role == "source":
            parse_source_options(options, streaming=True)
        else:
            parse_sink_options(options)
    assert fragment in str(e.value)


@pytest.mark.parametrize("option,value", [("checkpointLocation", "/tmp/c"), ("queryName", "orders-upper")])
def test_the_sink_takes_the_options_spark_puts_in_a_streaming_sinks_options(option, value):
    # writeStream.option("checkpointLocation", ...) and writeStream.queryName(...) both reach
    # the sink's options; refusing queryName failed every named query at its first batch
    assert parse_sink_options({**B, "topic": "t", option: value}).topic == "t"


def test_bootstrap_servers_by_either_name():
    assert parse_source_options({"kafka.bootstrap.servers": "a:1", "subscribe": "t"},
                                streaming=True).bootstrap_servers == "a:1"
    assert parse_sink_options({"kafka.bootstrap.servers": "a:1", "topic": "t"}).bootstrap_servers == "a:1"


def test_poll_timeout_by_either_name():
    assert parse_source_options({**SUB, "kafkaConsumer.pollTimeoutMs": "5000"}, streaming=True).poll_timeout_ms == 5000
    assert parse_source_options({**SUB, "pollTimeoutMs": "7000"}, streaming=True).poll_timeout_ms == 7000


def test_only_group_id_commits_and_kafka_group_id_is_refused():
    """In Spark, kafka.group.id is only the group id the consumers present: Spark never
    commits offsets to it. Taking it for groupId wrote the query's progress into a real
    consumer group's offsets; the tidelog source has no use for it, so it is refused."""
    assert parse_source_options({**SUB, "groupId": "g"}, streaming=True).group_id == "g"
    for options in ({**SUB, "kafka.group.id": "g"}, {**SUB, "groupId": "g", "kafka.group.id": "g"}):
        with pytest.raises(OptionError, match="kafka.group.id is not supported.*never commits.*groupId"):
            parse_source_options(options, streaming=True)
    with pytest.raises(OptionError, match="kafka.group.id is not supported by the tidelog sink"):
        parse_sink_options({**B, "topic": "t", "kafka.group.id": "g"})


# -- ending timestamps (batch) --------------------------------------------------------------------


def test_ending_timestamps_parse_for_batch_queries_only():
    s = parse_source_options({**SUB, "endingTimestamp": "1000", "endingOffsets": "latest"}, streaming=False)
    assert s.ending == OffsetSpec("timestamp", timestamp=1000)
    s = parse_source_options({**SUB, "endingOffsetsByTimestamp": '{"t": {"1": 5}}'}, streaming=False)
    assert s.ending == OffsetSpec("timestamps", timestamps={("t", 1): 5})
    for name, value in (("endingTimestamp", "1"), ("endingOffsetsByTimestamp", '{"t": {"0": 1}}')):
        with pytest.raises(OptionError, match=f"option {name} is for batch queries"):
            parse_source_options({**SUB, name: value}, streaming=True)
    with pytest.raises(OptionError, match="not assigned"):
        parse_source_options({**B, "assign": '{"t": [0]}', "endingOffsetsByTimestamp": '{"t": {"1": 5}}'},
                             streaming=False)


def test_ending_timestamps_stop_before_the_first_later_record():
    tps = [("t", 0), ("t", 1), ("t", 2)]
    hw = {("t", 0): 50, ("t", 1): 40, ("t", 2): 30}
    # the offset of the first record at or after the time; None: no such record (read to the end)
    found = {("t", 0): 12, ("t", 1): None, ("t", 2): 99}
    assert resolve_ending(OffsetSpec("timestamp", timestamp=1000), tps, hw, found) == \
        {("t", 0): 12, ("t", 1): 40, ("t", 2): 30}
    spec = OffsetSpec("timestamps", timestamps={("t", 0): 1000})
    assert resolve_ending(spec, tps, hw, {("t", 0): 7}) == {("t", 0): 7, ("t", 1): 40, ("t", 2): 30}


# -- minOffsetsPerTrigger / maxTriggerDelay -------------------------------------------------------


def test_min_offsets_per_trigger_waits_for_enough_offsets_or_the_delay():
    s = parse_source_options({**SUB, "minOffsetsPerTrigger": "10", "maxTriggerDelay": "30s"}, streaming=True)
    assert (s.min_offsets_per_trigger, s.max_trigger_delay_ms) == (10, 30_000)
    assert parse_source_options(SUB, streaming=True).max_trigger_delay_ms == 15 * 60_000  # Spark's default
    gate = dict(min_offsets=10, max_delay_ms=30_000)
    assert admit(0, **gate, now_ms=5, last_admitted_ms=None), "the first trigger of a run is admitted"
    assert not admit(9, **gate, now_ms=29_999, last_admitted_ms=0)
    assert admit(10, **gate, now_ms=1, last_admitted_ms=0)
    assert admit(1, **gate, now_ms=30_000, last_admitted_ms=0), "the delay passed"
    assert admit(0, min_offsets=None, max_delay_ms=0, now_ms=0, last_admitted_ms=0)
    with pytest.raises(OptionError, match="minOffsetsPerTrigger .10. is higher than maxOffsetsPerTrigger .5."):
        parse_source_options({**SUB, "minOffsetsPerTrigger": "10", "maxOffsetsPerTrigger": "5"}, streaming=True)
    for name in ("minOffsetsPerTrigger", "maxTriggerDelay"):
        with pytest.raises(OptionError, match=f"option {name} is for streaming queries only"):
            parse_source_options({**SUB, name: "10"}, streaming=False)


@pytest.mark.parametrize("raw,ms", [("500", 500), ("500ms", 500), ("30s", 30_000), ("15m", 900_000),
                                    ("2min", 120_000), ("1h", 3_600_000), ("1d", 86_400_000), (" 10 s ", 10_000)])
def test_durations_read_as_spark_reads_them(raw, ms):
    assert parse_duration_ms("maxTriggerDelay", raw) == ms


@pytest.mark.parametrize("raw", ["", "soon", "-5s", "1.5s", "10 parsecs"])
def test_bad_durations_are_named(raw):
    with pytest.raises(OptionError, match="maxTriggerDelay must be a duration"):
        parse_source_options({**SUB, "maxTriggerDelay": raw}, streaming=True)


# -- maxRecordsPerPartition -----------------------------------------------------------------------


def test_max_records_per_partition_caps_every_range():
    assert parse_source_options({**SUB, "maxRecordsPerPartition": "100"}, streaming=False).max_records_per_partition \
        == 100
    ranges = plan_ranges({("t", 0): 0, ("t", 1): 10}, {("t", 0): 250, ("t", 1): 60}, max_records=100)
    assert ranges == [OffsetRange("t", 0, 0, 84), OffsetRange("t", 0, 84, 167), OffsetRange("t", 0, 167, 250),
                      OffsetRange("t", 1, 10, 60)]
    # with minPartitions, about the larger of the two counts
    assert len(plan_ranges({("t", 0): 0}, {("t", 0): 250}, min_partitions=5, max_records=100)) == 5
    assert len(plan_ranges({("t", 0): 0}, {("t", 0): 250}, min_partitions=2, max_records=100)) == 3
    for n in range(1, 30):
        pieces = cap_ranges([OffsetRange("t", 0, 3, 3 + n)], 7)
        assert all(0 < p.size <= 7 for p in pieces) and sum(p.size for p in pieces) == n
        assert [p.start for p in pieces[1:]] == [p.end for p in pieces[:-1]]


# -- fetchOffset.numRetries / retryIntervalMs -----------------------------------------------------


def test_offset_lookups_are_retried():
    s = parse_source_options({**SUB, "fetchOffset.numRetries": "2", "fetchOffset.retryIntervalMs": "5"},
                             streaming=True)
    assert (s.fetch_offset_retries, s.fetch_offset_retry_interval_ms) == (2, 5)
    d = parse_source_options(SUB, streaming=True)
    assert (d.fetch_offset_retries, d.fetch_offset_retry_interval_ms) == (3, 10)  # Spark's defaults
    calls, sleeps = [], []

    def flaky(fail: int):
        def call():
            calls.append(1)
            if len(calls) <= fail:
                raise RequestTimedOut("no answer")
            return "offsets"
        return call

    assert retrying(flaky(2), retries=2, interval_ms=5, what="x", sleep=sleeps.append) == "offsets"
    assert (len(calls), sleeps) == (3, [0.005, 0.005])
    calls.clear()
    with pytest.raises(RequestTimedOut):
        retrying(flaky(3), retries=2, interval_ms=5, what="x", sleep=sleeps.append)
    assert len(calls) == 3
    calls.clear()
    with pytest.raises(RequestTimedOut):
        retrying(flaky(1), retries=0, interval_ms=5, what="x", sleep=sleeps.append)
    with pytest.raises(OptionError, match="fetchOffset.numRetries must be >= 0"):
        parse_source_options({**SUB, "fetchOffset.numRetries": "-1"}, streaming=True)


def test_security_options_pass_through_by_kafkas_names():
    jaas = 'org.apache.kafka.common.security.scram.ScramLoginModule required username="etl" password="etl-secret";'
    options = parse_source_options({**SUB, "kafka.security.protocol": "SASL_SSL", "kafka.sasl.mechanism": "SCRAM-SHA-512",
                                    "kafka.sasl.jaas.config": jaas, "kafka.ssl.truststore.location": "/pki/ca.pem"},
                                   streaming=True)
    for client in (options.consumer_options, options.admin_options):
        assert client["security_protocol"] == "SASL_SSL" and client["sasl_mechanism"] == "SCRAM-SHA-512"
        assert client["sasl_plain_username"] == "etl" and client["sasl_plain_password"] == "etl-secret"
        assert client["ssl_cafile"] == "/pki/ca.pem"
    sink = parse_sink_options({**B, "topic": "t", "kafka.security.protocol": "SSL", "kafka.ssl.ca.location": "/ca.pem"})
    assert sink.producer_options["security_protocol"] == "SSL" and sink.producer_options["ssl_cafile"] == "/ca.pem"
    with pytest.raises(OptionError, match="security_protocol SASL_SSL needs sasl_plain_username"):
        parse_source_options({**SUB, "kafka.security.protocol": "SASL_SSL"}, streaming=True)
