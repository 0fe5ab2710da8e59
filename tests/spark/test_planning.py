"""The connector's pure parts, without Spark or a cluster: options, offset and range
planning, reading a range against a scripted consumer, and the sink's sends against a fake
producer."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog import Record, TopicPartition
from tidelog.errors import OffsetOutOfRangeError, RequestTimedOut
from tidelog.spark.fetch import DataLossError, RangeReadTimeout, read_range
from tidelog.spark.options import EARLIEST, LATEST, OffsetSpec, OptionError, parse_sink_options, parse_source_options
from tidelog.spark.planning import (
    InvalidOffsetsError,
    OffsetRange,
    allocate,
    behind,
    next_end,
    offsets_from_json,
    offsets_to_json,
    plan_ranges,
    resolve_ending,
    resolve_starting,
    split_ranges,
)
from tidelog.spark.produce import OutRow, SinkWriteError, send_rows

pytestmark = pytest.mark.unit

B = {"bootstrap.servers": "h:1"}


# -- options --------------------------------------------------------------------------------------


def test_source_options_defaults_follow_spark():
    s = parse_source_options({**B, "subscribe": "a, b,a"}, streaming=True)
    assert s.subscription.topics == ("a", "b")
    assert s.starting == OffsetSpec("latest")
    assert s.fail_on_data_loss and not s.include_headers and s.max_offsets_per_trigger is None
    b = parse_source_options({**B, "subscribe": "a"}, streaming=False)
    assert b.starting == OffsetSpec("earliest") and b.ending == OffsetSpec("latest")


def test_option_names_are_case_insensitive_and_json_offsets_parse():
    s = parse_source_options({"BOOTSTRAP.SERVERS": "h:1", "subscribepattern": "t-.*",
                              "STARTINGOFFSETS": '{"t-1": {"0": 5, "1": -2}, "t-2": {"3": -1}}',
                              "maxoffsetspertrigger": "100", "minPartitions": "4", "failondataloss": "False",
                              "includeheaders": "true"}, streaming=True)
    assert s.subscription.matches("t-1") and not s.subscription.matches("xt-1")
    assert s.starting.offsets == {("t-1", 0): 5, ("t-1", 1): EARLIEST, ("t-2", 3): LATEST}
    assert (s.max_offsets_per_trigger, s.min_partitions, s.fail_on_data_loss, s.include_headers) == \
        (100, 4, False, True)


@pytest.mark.parametrize("options,streaming,fragment", [
    ({}, True, "bootstrap.servers is required"),
    ({**B}, True, "exactly one of"),
    ({**B, "subscribe": "a", "assign": '{"a": [0]}'}, True, "exactly one of"),
    ({**B, "subscribePattern": "("}, True, "not a valid regular expression"),
    ({**B, "assign": '{"a": [0, "x"]}'}, True, "list of partition numbers"),
    ({**B, "assign": "[1]"}, True, "JSON object"),
    ({**B, "subscribe": "a", "startingOffsets": "{bad"}, True, "not valid JSON"),
    ({**B, "subscribe": "a", "startingOffsets": '{"a": {"0": -3}}'}, True, "not a valid value"),
    ({**B, "subscribe": "a", "endingOffsets": "latest"}, True, "batch queries"),
    ({**B, "subscribe": "a", "startingOffsets": "latest"}, False, "not allowed"),
    ({**B, "subscribe": "a", "endingOffsets": '{"a": {"0": -2}}'}, False, "-2 (earliest) is not allowed"),
    ({**B, "subscribe": "a", "maxOffsetsPerTrigger": "0"}, True, "must be >= 1"),
    ({**B, "subscribe": "a", "maxOffsetsPerTrigger": "10"}, False, "streaming queries only"),
    ({**B, "subscribe": "a", "failOnDataLoss": "maybe"}, True, "true or false"),
    ({**B, "subscribe": "a", "kafka.no.such": "1"}, True, "unknown consumer option 'kafka.no.such'"),
    ({**B, "subscribe": "a", "kafka.auto.offset.reset": "earliest"}, True, "cannot be overridden"),
    ({**B, "assign": '{"a": [0]}', "startingOffsets": '{"a": {"1": 3}}'}, True, "not assigned"),
])
def test_bad_source_options_are_named(options, streaming, fragment):
    with pytest.raises(OptionError, match=None) as e:
        parse_source_options(options, streaming=streaming)
    assert fragment in str(e.value)


def test_kafka_prefixed_options_reach_the_clients():
    s = parse_source_options({**B, "subscribe": "a", "kafka.request.timeout.ms": "2000",
                              "kafka.max.partition.fetch.bytes": "4194304", "kafka.check.crcs": "false"},
                             streaming=True)
    assert s.consumer_options == {"request_timeout_ms": 2000, "max_partition_fetch_bytes": 4194304,
                                  "check_crcs": False}
    assert s.admin_options == {"request_timeout_ms": 2000}
    k = parse_sink_options({**B, "topic": "t", "kafka.linger.ms": "20"})
    assert (k.topic, k.producer_options) == ("t", {"linger_ms": 20})
    with pytest.raises(OptionError, match="cannot be overridden"):
        parse_sink_options({**B, "kafka.acks": "1"})
    with pytest.raises(OptionError, match="for reading"):
        parse_sink_options({**B, "subscribe": "t"})


def test_timestamp_options_win_over_starting_offsets():
    s = parse_source_options({**B, "subscribe": "a", "startingOffsets": "earliest",
                              "startingOffsetsByTimestamp": '{"a": {"0": 10}}', "startingTimestamp": "99"},
                             streaming=True)
    assert s.starting == OffsetSpec("timestamp", timestamp=99)
    s = parse_source_options({**B, "subscribe": "a", "startingOffsetsByTimestamp": '{"a": {"0": 10}}'},
                             streaming=True)
    assert s.starting.kind == "timestamps" and s.starting.timestamps == {("a", 0): 10}


# -- offsets JSON ---------------------------------------------------------------------------------


def test_offsets_json_is_canonical_and_string_keyed():
    a = offsets_to_json({("b", 10): 1, ("a", 2): 5, ("b", 9): 0, ("a", 10): 7})
    assert json.dumps(a) == '{"a": {"2": 5, "10": 7}, "b": {"9": 0, "10": 1}}'
    assert offsets_from_json(json.loads(json.dumps(a))) == {("b", 10): 1, ("a", 2): 5, ("b", 9): 0, ("a", 10): 7}
    same = offsets_to_json(offsets_from_json({"b": {"10": 1, "9": 0}, "a": {"10": 7, "2": 5}}))
    assert json.dumps(same) == json.dumps(a)


@pytest.mark.parametrize("bad", [[], {"t": [1]}, {"t": {"x": 1}}, {"t": {"0": -2}}, {"t": {"0": "5"}}])
def test_foreign_offsets_are_rejected(bad):
    with pytest.raises(InvalidOffsetsError):
        offsets_from_json(bad)


def test_latest_is_an_offset_of_a_streaming_query_not_positioned_yet():
    assert offsets_from_json({"t": {"0": -1, "1": 4}}) == {("t", 0): LATEST, ("t", 1): 4}


# -- starting and ending offsets ------------------------------------------------------------------

TPS = [("t", 0), ("t", 1)]
EARLY = {("t", 0): 10, ("t", 1): 0}
LATE = {("t", 0): 50, ("t", 1): 30}


def test_resolve_starting_offsets():
    assert resolve_starting(OffsetSpec("earliest"), TPS, EARLY, LATE) == EARLY
    assert resolve_starting(OffsetSpec("latest"), TPS, EARLY, LATE) == LATE
    spec = OffsetSpec("offsets", offsets={("t", 0): LATEST, ("t", 1): 7})
    assert resolve_starting(spec, TPS, EARLY, LATE) == {("t", 0): 50, ("t", 1): 7}
    spec = OffsetSpec("offsets", offsets={("t", 1): 7})  # unnamed partitions start at earliest
    assert resolve_starting(spec, TPS, EARLY, LATE) == {("t", 0): 10, ("t", 1): 7}
    with pytest.raises(OptionError, match="do not exist"):
        resolve_starting(OffsetSpec("offsets", offsets={("u", 0): 1}), TPS, EARLY, LATE)


def test_resolve_starting_by_timestamp():
    spec = OffsetSpec("timestamp", timestamp=1000)
    assert resolve_starting(spec, TPS, EARLY, LATE, {("t", 0): 12, ("t", 1): 3}) == {("t", 0): 12, ("t", 1): 3}
    with pytest.raises(OptionError, match="no record at or after timestamp 1000 in topic 't' partition 1"):
        resolve_starting(spec, TPS, EARLY, LATE, {("t", 0): 12, ("t", 1): None})
    assert resolve_starting(spec, TPS, EARLY, LATE, {("t", 0): 12, ("t", 1): None}, strategy="latest") == \
        {("t", 0): 12, ("t", 1): 30}
    per = OffsetSpec("timestamps", timestamps={("t", 1): 5})
    assert resolve_starting(per, TPS, EARLY, LATE, {("t", 1): 4}) == {("t", 0): 10, ("t", 1): 4}


def test_resolve_ending_never_passes_the_high_watermark():
    assert resolve_ending(OffsetSpec("latest"), TPS, LATE) == LATE
    spec = OffsetSpec("offsets", offsets={("t", 0): 20, ("t", 1): 999})
    assert resolve_ending(spec, TPS, LATE) == {("t", 0): 20, ("t", 1): 30}


# -- one trigger ----------------------------------------------------------------------------------


def test_next_end_reads_up_to_the_high_watermark():
    step = next_end({("t", 0): 5, ("t", 1): 30}, LATE)
    assert step.end == LATE and not step.lost and not step.notes


def test_next_end_starts_new_partitions_at_zero_and_reports_vanished_ones():
    step = next_end({("t", 0): 5, ("gone", 0): 8}, {("t", 0): 9, ("t", 1): 4})
    assert step.end == {("t", 0): 9, ("t", 1): 4}
    assert step.lost == ["topic 'gone' partition 0 (query at offset 8) no longer exists"]


def test_next_end_holds_a_partition_whose_new_leader_has_not_caught_up():
    """A new leader's HW below the query's position, its log end at or above it: the records
    are in its log and the HW will pass them, so the partition waits, with no loss."""
    start, latest = {("t", 0): 40}, {("t", 0): 25}
    assert behind(start, latest) == [("t", 0)]
    for log_end in (40, 55):
        step = next_end(start, latest, log_end={("t", 0): log_end}, earliest={("t", 0): 0})
        assert step.end == {("t", 0): 40} and not step.lost
        assert "below the query's position 40" in step.notes[0]


def test_next_end_reports_a_log_that_now_ends_below_the_query_and_goes_on_from_its_end():
    """An unclean election truncated the log (or the topic was deleted and re-created): the
    log ends below the query's position, so the records the query was heading for are gone.
    That is data loss, as Spark's "offset was changed from 5000 to 3000", and the query goes
    on from the high watermark, as Spark's does: reading the log again from its start would
    deliver 3000 records a second time."""
    start, latest = {("orders", 0): 5000, ("orders", 1): 70}, {("orders", 0): 3000, ("orders", 1): 90}
    step = next_end(start, latest, log_end={("orders", 0): 3010}, earliest={("orders", 0): 0})
    assert step.end == {("orders", 0): 3000, ("orders", 1): 90}
    assert len(step.lost) == 1 and "partition 0: the offset was changed from 5000 to 3000" in step.lost[0]
    assert "goes on from offset 3000" in step.lost[0]
    assert plan_ranges(start, step.end) == [OffsetRange("orders", 1, 70, 90)]
    later = next_end(step.end, {("orders", 0): 3010, ("orders", 1): 90})
    assert later.end == {("orders", 0): 3010, ("orders", 1): 90} and not later.lost
    assert plan_ranges(step.end, later.end) == [OffsetRange("orders", 0, 3000, 3010)]


def test_a_starting_offset_above_the_log_end_is_reported_as_such():
    """startingOffsets 1000 on a log that ends at 500: held while the leader's log end
    reaches 1000 (its high watermark catching up), otherwise reported as what it is, and the
    query starts at the high watermark (Spark's Kafka source fails on it too, or goes on from
    the end with failOnDataLoss=false)."""
    start, latest = {("t", 0): 1000}, {("t", 0): 500}
    held = next_end(start, latest, log_end={("t", 0): 1200}, starting=True)
    assert held.end == start and not held.lost
    step = next_end(start, latest, log_end={("t", 0): 500}, starting=True)
    assert step.begin == step.end == {("t", 0): 500}
    assert step.lost == ["topic 't' partition 0: startingOffsets 1000 is above the log end offset 500; the query "
                         "starts at the high watermark 500"]


def test_the_stream_reader_goes_on_from_the_end_of_a_truncated_log_or_fails_naming_it():
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from tidelog.spark.fetch import DataLossError

    view = ClusterState({("t", 0): 900})
    with pytest.raises(DataLossError, match="offset was changed from 1000 to 900"):
        stream_reader(view).latestOffset({"t": {"0": 1000}}, ReadAllAvailable())
    reader = stream_reader(view, failOnDataLoss="false")
    end = reader.latestOffset({"t": {"0": 1000}}, ReadAllAvailable())
    assert end == {"t": {"0": 900}} and _ranges(reader, {"t": {"0": 1000}}, end) == []
    view.hw = {("t", 0): 950}
    assert _ranges(reader, end, reader.latestOffset(end, ReadAllAvailable())) == [OffsetRange("t", 0, 900, 950)]
    # a startingOffsets above the end: named as such, or the query starts at the end
    with pytest.raises(DataLossError, match="startingOffsets 1000 is above the log end offset 950"):
        reader = stream_reader(view, startingOffsets='{"t": {"0": 1000}}')
        reader.latestOffset(reader.initialOffset(), ReadAllAvailable())
    reader = stream_reader(view, startingOffsets='{"t": {"0": 1000}}', failOnDataLoss="false")
    end = reader.latestOffset(reader.initialOffset(), ReadAllAvailable())
    assert end == {"t": {"0": 950}, "@from": {"t": {"0": 950}}}
    assert _ranges(reader, reader.initialOffset(), end) == []


def test_next_end_respects_the_read_limit_and_the_available_now_target():
    step = next_end({("t", 0): 0, ("t", 1): 0}, {("t", 0): 300, ("t", 1): 100}, max_offsets=100)
    assert step.end == {("t", 0): 75, ("t", 1): 25}
    target = {("t", 0): 200}
    step = next_end({("t", 0): 150}, {("t", 0): 300, ("t", 1): 100}, target=target)
    assert step.end == {("t", 0): 200}  # (t, 1) appeared after the target: next run
    step = next_end({("t", 0): 200}, {("t", 0): 300}, target=target)
    assert step.end == {("t", 0): 200}


def test_a_new_partition_shares_the_read_limit_from_its_log_start():
    """A partition new to the query whose log starts at 9,999,000 has 100 records, not
    9,999,100: it gets its share of maxOffsetsPerTrigger counted from its log start (the
    offsets below it are reported lost when its range [0, end) is read)."""
    start = {("t", 0): 100}
    latest = {("t", 0): 200, ("t", 1): 9_999_100}
    step = next_end(start, latest, max_offsets=100, earliest={("t", 1): 9_999_000})
    assert step.end == {("t", 0): 150, ("t", 1): 9_999_050} and step.size == 100
    assert plan_ranges(start, step.end) == [OffsetRange("t", 0, 100, 150), OffsetRange("t", 1, 0, 9_999_050)]
    assert next_end(start, latest, earliest={("t", 1): 9_999_000}).end == latest


def test_a_partition_at_latest_is_positioned_by_the_first_batch_that_sees_its_high_watermark():
    step = next_end({("t", 0): LATEST, ("t", 1): 10}, LATE)
    assert step.begin == {("t", 0): 50, ("t", 1): 10} and step.end == LATE
    assert plan_ranges({("t", 0): LATEST, ("t", 1): 10}, step.end) == [OffsetRange("t", 1, 10, 30)]
    assert next_end({("t", 0): LATEST, ("t", 1): 0}, LATE, max_offsets=10).end == {("t", 0): 50, ("t", 1): 10}
    # without a leader (the reader passes the start as its high watermark): not positioned yet
    step = next_end({("t", 0): LATEST}, {("t", 0): LATEST})
    assert step.end == {("t", 0): LATEST} and plan_ranges({("t", 0): LATEST}, step.end) == []


def test_next_end_of_nothing_new_is_the_start_itself():
    start = {("t", 0): 50, ("t", 1): 30}
    assert json.dumps(offsets_to_json(next_end(start, LATE).end)) == json.dumps(offsets_to_json(start))


@settings(max_examples=300)
@given(st.dictionaries(st.tuples(st.sampled_from("abc"), st.integers(0, 4)), st.integers(0, 10_000), max_size=8),
       st.integers(1, 5000))
def test_allocate_never_exceeds_the_budget_or_what_is_there(available, budget):
    grant = allocate(available, budget)
    assert set(grant) == set(available)
    assert all(0 <= grant[tp] <= n for tp, n in available.items())
    assert sum(grant.values()) == min(budget, sum(available.values()))


@settings(max_examples=200)
@given(st.lists(st.integers(0, 500), min_size=1, max_size=6), st.integers(1, 400))
def test_repeated_triggers_admit_everything_and_bound_every_batch(his, limit):
    latest = {("t", i): hw for i, hw in enumerate(his)}
    start: dict = {}
    batches = 0
    while True:
        end = next_end(start, latest, max_offsets=limit).end
        size = sum(end[tp] - start.get(tp, 0) for tp in end)
        assert size <= limit
        start = end
        if size == 0:
            break
        batches += 1
    assert start == latest and batches == -(-sum(his) // limit)


# -- the stream reader: batch 0 and its replays ---------------------------------------------------


class GrowingView:
    """The reader's ``ClusterView`` over a topic that a producer keeps writing: every look at
    the high watermarks finds ``step`` more records in each partition."""

    def __init__(self, hw: dict, step: int = 7):
        self.hw, self.step = dict(hw), step

    def partitions(self, subscription=None):
        return {tp: 1 for tp in self.hw}

    def earliest(self, tps):
        return {tp: 0 for tp in tps}

    def latest(self, tps):
        self.hw = {tp: o + self.step for tp, o in self.hw.items()}
        return {tp: self.hw[tp] for tp in tps}

    def commit(self, group_id, offsets):
        self.committed = (group_id, offsets)


def stream_reader(view: GrowingView, **options):
    datasource = pytest.importorskip("tidelog.spark.datasource")  # the Spark classes need pyspark
    reader = datasource.TidelogStreamReader(parse_source_options({**B, "subscribe": "t", **options}, streaming=True))
    reader._view = view
    return reader


@pytest.mark.parametrize("starting", ["latest", "earliest", '{"t": {"0": 3, "1": -1}}'])
def test_batch_0_reads_what_was_planned_however_often_its_start_is_asked(starting):
    """I14 for the first batch: Spark asks the source for the query's initial offset to plan
    batch 0, again to run it, and once more in the next run when the driver died before batch
    0 committed (the initial offset is not in the checkpoint). Records keep arriving in
    between, and every answer must give batch 0 the same ranges."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    view = GrowingView({("t", 0): 100, ("t", 1): 50})
    first = stream_reader(view, startingOffsets=starting)
    start = first.initialOffset()
    end = first.latestOffset(start, ReadAllAvailable())
    planned = [p.value for p in first.partitions(start, end)]
    assert [p.value for p in first.partitions(first.initialOffset(), end)] == planned  # running it
    restarted = stream_reader(view, startingOffsets=starting)  # a new driver on the checkpoint
    assert [p.value for p in restarted.partitions(restarted.initialOffset(), end)] == planned
    if starting == "latest":  # positioned at the high watermarks batch 0 saw: it reads nothing
        assert planned == [] and offsets_from_json(end) == {("t", 0): 107, ("t", 1): 57}


def test_the_group_commit_leaves_out_partitions_not_positioned_yet():
    view = GrowingView({("t", 0): 0, ("t", 1): 0})
    stream_reader(view, groupId="g").commit({"t": {"0": -1, "1": 5}})
    assert view.committed == ("g", {("t", 1): 5})


class ClusterState:
    """A ``ClusterView`` whose partitions (with their leaders), log starts, high watermarks
    and log ends a test sets as it goes."""

    def __init__(self, hw: dict | None = None, log_start: dict | None = None):
        self.hw = dict(hw or {})
        self.log_start = dict(log_start or {})
        self.leaders = dict.fromkeys(self.hw, 1)
        self.ends: dict = {}  # log end offsets ahead of the high watermark
        self.asked: list = []

    def partitions(self, subscription=None):
        return dict(self.leaders)

    def earliest(self, tps):
        return {tp: self.log_start.get(tp, 0) for tp in tps}

    def latest(self, tps):
        self.asked.append(sorted(tps))
        return {tp: self.hw[tp] for tp in tps}

    def log_end(self, tps):
        return {tp: self.ends.get(tp, self.hw[tp]) for tp in tps}

    def by_time(self, timestamps):
        return {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


def _ranges(reader, start, end):
    return [p.value for p in reader.partitions(start, end)]


def test_a_replay_of_batch_0_after_a_restart_reads_what_was_planned_though_the_topic_appeared_since():
    """startingOffsets=latest on a topic that does not exist yet: the query's initial offset
    names no partition. The topic is created and written before batch 0 is planned, and the
    driver dies before batch 0 commits; the next run asks for the initial offset again, now
    that the topic exists, and must read the same records as the planned batch 0."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    view = ClusterState()
    first = stream_reader(view)
    start = first.initialOffset()
    view.hw, view.leaders = {("t", 0): 10}, {("t", 0): 1}
    end = first.latestOffset(start, ReadAllAvailable())
    planned = _ranges(first, start, end)
    restarted = stream_reader(view)
    assert _ranges(restarted, restarted.initialOffset(), end) == planned


def test_a_replay_of_batch_0_keeps_its_start_when_retention_moved_the_log_start():
    """startingOffsets=earliest, batch 0 planned [0, 10); retention deletes offsets 0-4
    before the replay. The replay reads [0, 10) again, so that ``read`` reports 0-4 as data
    loss, instead of quietly reading [5, 10)."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    view = ClusterState({("t", 0): 10})
    first = stream_reader(view, startingOffsets="earliest")
    start = first.initialOffset()
    end = first.latestOffset(start, ReadAllAvailable())
    assert _ranges(first, start, end) == [OffsetRange("t", 0, 0, 10)]
    view.log_start = {("t", 0): 5}
    restarted = stream_reader(view, startingOffsets="earliest")
    assert _ranges(restarted, restarted.initialOffset(), end) == [OffsetRange("t", 0, 0, 10)]


def test_the_start_batch_0_carries_is_kept_while_nothing_follows_and_dropped_after():
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    view = ClusterState({("t", 0): 10})
    reader = stream_reader(view, startingOffsets="earliest")
    assert reader.initialOffset() == {"@initial": "startingOffsets"}
    end0 = reader.latestOffset(reader.initialOffset(), ReadAllAvailable())
    assert end0 == {"t": {"0": 10}, "@from": {"t": {"0": 0}}}
    assert reader.latestOffset(end0, ReadAllAvailable()) == end0  # nothing new: Spark runs no batch
    view.hw = {("t", 0): 25}
    end1 = reader.latestOffset(end0, ReadAllAvailable())
    assert end1 == {"t": {"0": 25}}
    assert _ranges(reader, end0, end1) == [OffsetRange("t", 0, 10, 25)]
    assert _ranges(reader, end0, end0) == []  # a restart tells the source the last end it planned so
    assert offsets_from_json(end0) == {("t", 0): 10} and offsets_from_json(reader.initialOffset()) == {}
    # a batch 0 end written before the end carried its start: startingOffsets is resolved again
    assert _ranges(reader, reader.initialOffset(), {"t": {"0": 10}}) == [OffsetRange("t", 0, 0, 10)]


class MetadataAdmin:
    """An Admin's metadata calls over ``{topic: {partition: leader}}``."""

    def __init__(self, topics: dict):
        self.topics = topics

    def list_topics(self):
        return sorted(self.topics)

    def describe_topics(self, names):
        from types import SimpleNamespace

        return [SimpleNamespace(name=t, partitions=[SimpleNamespace(topic=t, partition=p, leader=leader)
                                                    for p, leader in sorted(self.topics[t].items())])
                for t in names]


class OffsetsConsumer:
    """A Consumer's offset lookups; a partition without a leader or a deleted topic would
    block the lookup until its timeout, so asking for one fails the test."""

    def __init__(self, admin: MetadataAdmin, hw: dict):
        self.admin, self.hw = admin, hw

    def _check(self, tps):
        for tp in tps:
            if self.admin.topics.get(tp.topic, {}).get(tp.partition, -1) < 0:
                raise AssertionError(f"the lookup of {tp} would block until it times out")

    def end_offsets(self, tps):
        self._check(tps)
        return {tp: self.hw[(tp.topic, tp.partition)] for tp in tps}

    def beginning_offsets(self, tps):
        self._check(tps)
        return dict.fromkeys(tps, 0)


def assigned_view(topics: dict, hw: dict, **options):
    from tidelog.spark.cluster import ClusterView

    view = ClusterView(parse_source_options({**B, **options}, streaming=True))
    view._admin = MetadataAdmin(topics)
    view._consumer = OffsetsConsumer(view._admin, hw)
    return view


def test_assigned_partitions_are_listed_with_their_leaders_as_the_metadata_has_them():
    view = assigned_view({"t": {0: 1, 1: -1, 2: 3}, "other": {0: 1}}, {}, assign='{"t": [0, 1], "gone": [0]}')
    assert view.partitions() == {("t", 0): 1, ("t", 1): -1}


def test_an_assigned_partition_without_a_leader_is_held_and_a_deleted_topic_is_data_loss(monkeypatch):
    """With ``assign`` as with ``subscribe``: the offsets of a partition without a leader are
    not asked for (the lookup would block each trigger until its timeout) and the partition
    keeps its position; a deleted topic is data loss, or dropped with failOnDataLoss=false."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from tidelog.spark import datasource
    from tidelog.spark.fetch import DataLossError

    monkeypatch.setattr(datasource, "MISSING_RECHECK_S", 0)
    assign = '{"t": [0, 1], "gone": [0]}'
    start = {"gone": {"0": 3}, "t": {"0": 5, "1": 5}}
    for fail in ("true", "false"):
        view = assigned_view({"t": {0: 1, 1: -1}}, {("t", 0): 9}, assign=assign)
        reader = datasource.TidelogStreamReader(parse_source_options({**B, "assign": assign, "failOnDataLoss": fail},
                                                                     streaming=True))
        reader._view = view
        if fail == "true":
            with pytest.raises(DataLossError, match=r"topic 'gone' partition 0 \(query at offset 3\) no longer exists"):
                reader.latestOffset(start, ReadAllAvailable())
        else:
            assert reader.latestOffset(start, ReadAllAvailable()) == {"t": {"0": 9, "1": 5}}


def test_a_batch_read_of_an_assigned_partition_that_does_not_exist_fails_naming_it(monkeypatch):
    from tidelog.spark import datasource

    view = assigned_view({"t": {0: 1}}, {("t", 0): 9}, assign='{"t": [0], "gone": [0]}')
    view.close = lambda: None
    monkeypatch.setattr(datasource, "ClusterView", lambda opts: view)
    reader = datasource.TidelogBatchReader(parse_source_options({**B, "assign": '{"t": [0], "gone": [0]}'},
                                                                streaming=False))
    with pytest.raises(OptionError, match=r"assign names partitions that do not exist: \[\('gone', 0\)\]"):
        reader.partitions()


def test_batch_ending_offsets_above_the_high_watermark_fail_the_read_or_warn(monkeypatch, caplog):
    """endingOffsets 200 on a partition whose high watermark is 150: the read cannot deliver
    [150, 200), so it fails as data loss (Spark's Kafka source does), or with
    failOnDataLoss=false warns and reads up to the high watermark."""
    from tidelog.spark import datasource
    from tidelog.spark.fetch import DataLossError

    view = ClusterState({("t", 0): 150, ("t", 1): 30})
    monkeypatch.setattr(datasource, "ClusterView", lambda opts: view)
    options = {**B, "subscribe": "t", "endingOffsets": '{"t": {"0": 200, "1": 20}}'}
    with pytest.raises(DataLossError, match=r"topic 't' partition 0: endingOffsets 200 is above the high "
                                            r"watermark 150, offsets \[150, 200\) cannot be read"):
        datasource.TidelogBatchReader(parse_source_options(options, streaming=False)).partitions()
    reader = datasource.TidelogBatchReader(parse_source_options({**options, "failOnDataLoss": "false"},
                                                                streaming=False))
    with caplog.at_level("WARNING", logger="spark_connector"):
        ranges = [p.value for p in reader.partitions()]
    assert ranges == [OffsetRange("t", 0, 0, 150), OffsetRange("t", 1, 0, 20)]
    assert "endingOffsets 200 is above the high watermark 150" in caplog.text
    # a start above the high watermark but below the asked end: nothing to read, and a warning
    reader = datasource.TidelogBatchReader(parse_source_options(
        {**options, "failOnDataLoss": "false", "startingOffsets": '{"t": {"0": 180, "1": 0}}'}, streaming=False))
    assert [p.value for p in reader.partitions()] == [OffsetRange("t", 1, 0, 20)]
    with pytest.raises(OptionError, match="the starting offset 25 is after the ending offset 20"):
        datasource.TidelogBatchReader(parse_source_options(
            {**options, "failOnDataLoss": "false", "startingOffsets": '{"t": {"1": 25}}'}, streaming=False)).partitions()


# -- ranges ---------------------------------------------------------------------------------------


def test_plan_ranges_skips_empty_partitions():
    ranges = plan_ranges({("t", 0): 5, ("t", 1): 30}, {("t", 0): 50, ("t", 1): 30, ("u", 0): 3})
    assert ranges == [OffsetRange("t", 0, 5, 50), OffsetRange("u", 0, 0, 3)]


def test_min_partitions_splits_large_ranges():
    ranges = plan_ranges({("t", 0): 0, ("t", 1): 0}, {("t", 0): 900, ("t", 1): 100}, min_partitions=5)
    assert len(ranges) == 5
    assert [r for r in ranges if r.partition == 1] == [OffsetRange("t", 1, 0, 100)]
    assert [(r.start, r.end) for r in ranges if r.partition == 0] == [(0, 225), (225, 450), (450, 675),
                                                                         (675, 900)]


@settings(max_examples=300)
@given(st.lists(st.integers(1, 1000), min_size=1, max_size=6), st.integers(1, 50))
def test_split_ranges_covers_each_range_exactly(sizes, n):
    ranges = [OffsetRange("t", i, 100 * i, 100 * i + s) for i, s in enumerate(sizes)]
    out = split_ranges(ranges, n)
    assert len(out) >= min(n, sum(sizes))
    for r in ranges:
        pieces = [x for x in out if x.partition == r.partition]
        assert pieces[0].start == r.start and pieces[-1].end == r.end
        assert all(a.end == b.start for a, b in zip(pieces, pieces[1:]))
        assert all(x.size > 0 for x in pieces)
        assert max(x.size for x in pieces) - min(x.size for x in pieces) <= 1


# -- reading a range ------------------------------------------------------------------------------


class ScriptedConsumer:
    """A one-partition consumer over a log with offsets [log_start, hw); ``events`` maps a
    poll number to something that happens before that poll (retention, truncation)."""

    def __init__(self, log_start: int, hw: int, batch: int = 7, events=None, gaps=()):
        self.log_start, self.hw, self.batch, self.events = log_start, hw, batch, dict(events or {})
        self.log_end = None  # the leader's log end offset when ahead of the high watermark
        self.deleted = False  # the topic was deleted: fetches and offset lookups get nowhere
        self.pos = None
        self.polls = 0
        self.gaps = set(gaps)
        self.stopped = False

    def assign(self, tps):
        self.tp = tps[0]

    def seek(self, tp, offset):
        self.pos, self.stopped = offset, False

    def poll(self, timeout_ms=0, max_records=None):
        self.polls += 1
        if self.polls in self.events:
            self.events.pop(self.polls)(self)
        if self.stopped or self.deleted:
            return []
        if self.pos < self.log_start or self.pos > self.hw:
            self.stopped = True
            raise OffsetOutOfRangeError(f"partition {self.tp} at offset {self.pos}: OFFSET_OUT_OF_RANGE")
        # whole "batches" of ``batch`` offsets, starting with the one holding the position
        first = self.pos - self.pos % self.batch
        out = [Record("t", 0, o, 1000 + o, b"k", b"v%d" % o) for o in range(first, min(first + 2 * self.batch, self.hw))
               if o not in self.gaps]
        self.pos = max(self.pos, min(first + 2 * self.batch, self.hw))
        return out

    def position(self, tp, timeout_ms=None):
        return self.pos

    def beginning_offsets(self, tps):
        return {tps[0]: self.log_start}

    def end_offsets(self, tps):
        if self.deleted:
            raise RequestTimedOut("end offsets: UNKNOWN_TOPIC_OR_PARTITION until the timeout")
        return {tps[0]: self.hw}

    def partitions_for_topic(self, topic):
        return None if self.deleted else {0}

    def log_end_offsets(self, tps):
        return {tps[0]: self.hw if self.log_end is None else self.log_end}


def _offsets(chunks):
    return [r.offset for c in chunks for r in c]


def test_read_range_returns_exactly_the_range():
    c = ScriptedConsumer(0, 100)
    chunks = list(read_range(c, OffsetRange("t", 0, 10, 53), chunk=16))
    assert _offsets(chunks) == list(range(10, 53))
    assert all(len(x) <= 16 + 14 for x in chunks)


def test_read_range_steps_over_gaps():
    c = ScriptedConsumer(0, 100, gaps=range(20, 60))
    assert _offsets(read_range(c, OffsetRange("t", 0, 10, 70))) == list(range(10, 20)) + list(range(60, 70))


def test_read_range_data_loss_fails_naming_topic_partition_and_offsets():
    c = ScriptedConsumer(40, 100)
    with pytest.raises(DataLossError) as e:
        list(read_range(c, OffsetRange("t", 0, 10, 60)))
    assert "topic 't' partition 0: offsets [10, 40) of the planned range [10, 60)" in str(e.value)
    assert "failOnDataLoss=false" in str(e.value)


def test_read_range_skips_lost_offsets_with_a_warning():
    warnings = []
    c = ScriptedConsumer(40, 100)
    got = _offsets(read_range(c, OffsetRange("t", 0, 10, 60), fail_on_data_loss=False, warn=warnings.append))
    assert got == list(range(40, 60))
    assert "offsets [10, 40)" in warnings[0] and "skipping" in warnings[0]
    c = ScriptedConsumer(80, 100)  # the whole range is gone
    assert _offsets(read_range(c, OffsetRange("t", 0, 10, 60), fail_on_data_loss=False, warn=warnings.append)) == []


def test_read_range_notices_retention_in_the_middle_of_a_range():
    def retention(c):
        c.log_start = 45

    warnings = []
    c = ScriptedConsumer(0, 100, batch=5, events={3: retention})
    got = _offsets(read_range(c, OffsetRange("t", 0, 0, 70), fail_on_data_loss=False, warn=warnings.append))
    assert got == list(range(0, 20)) + list(range(45, 70))
    assert "offsets [20, 45)" in warnings[0]


def test_read_range_reports_truncation_below_the_planned_end():
    now = [0.0]

    class Truncated(ScriptedConsumer):
        def poll(self, timeout_ms=0, max_records=None):
            now[0] += 0.5
            return super().poll(timeout_ms, max_records)

    def truncate(c):
        c.hw = 15

    c = Truncated(0, 100, batch=5, events={2: truncate})
    with pytest.raises(DataLossError, match=r"offsets \[15, 30\) of the planned range \[0, 30\)"):
        list(read_range(c, OffsetRange("t", 0, 0, 30), poll_timeout_ms=1000, clock=lambda: now[0]))
    warnings = []
    c = Truncated(0, 100, batch=5, events={2: truncate})
    got = _offsets(read_range(c, OffsetRange("t", 0, 0, 30), poll_timeout_ms=1000, clock=lambda: now[0],
                              fail_on_data_loss=False, warn=warnings.append))
    assert got == list(range(15)) and "truncated" in warnings[0]


def test_read_range_times_out_when_nothing_comes_although_it_should():
    now = [0.0]

    class Stuck(ScriptedConsumer):
        def poll(self, timeout_ms=0, max_records=None):
            now[0] += 0.5
            return []

    with pytest.raises(RangeReadTimeout, match="no records read for 2000 ms at offset 0"):
        list(read_range(Stuck(0, 100), OffsetRange("t", 0, 0, 30), poll_timeout_ms=2000, clock=lambda: now[0]))


def test_a_high_watermark_held_below_the_range_is_a_timeout_not_data_loss():
    """RF 3, min ISR 2: a new leader whose ISR is below min ISR holds its HW, though its log
    holds the planned records; they become readable once a replica catches up. The task
    times out (Spark retries it) instead of reporting them lost, or skipping them for good."""
    now = [0.0]

    class Held(ScriptedConsumer):
        def poll(self, timeout_ms=0, max_records=None):
            now[0] += 0.5
            return super().poll(timeout_ms, max_records)

    def new_leader(c):
        c.hw, c.log_end = 10, 30

    for fail in (True, False):
        warnings = []
        c = Held(0, 100, batch=5, events={2: new_leader})
        with pytest.raises(RangeReadTimeout, match="high watermark 10 is held below the log end offset 30"):
            list(read_range(c, OffsetRange("t", 0, 0, 30), poll_timeout_ms=1000, clock=lambda: now[0],
                            fail_on_data_loss=fail, warn=warnings.append))
        assert warnings == []


def test_a_topic_deleted_during_a_read_is_data_loss_not_a_timeout():
    now = [0.0]

    class Deleted(ScriptedConsumer):
        def poll(self, timeout_ms=0, max_records=None):
            now[0] += 0.5
            return super().poll(timeout_ms, max_records)

    def delete(c):
        c.deleted = True

    def read(**kw):
        c = Deleted(0, 100, batch=5, events={2: delete})
        return _offsets(read_range(c, OffsetRange("t", 0, 0, 30), poll_timeout_ms=1000, clock=lambda: now[0], **kw))

    with pytest.raises(DataLossError, match=r"offsets \[10, 30\) of the planned range \[0, 30\).*deleted"):
        read()
    warnings = []
    assert read(fail_on_data_loss=False, warn=warnings.append) == list(range(10))
    assert "deleted" in warnings[0] and "skipping" in warnings[0]


# -- the sink's sends -----------------------------------------------------------------------------


class FakeFuture:
    def __init__(self, topic, partition, error=None):
        self.topic_partition = TopicPartition(topic, partition)
        self.error = error

    def exception(self, timeout=None):
        return self.error

    def add_done_callback(self, fn):
        fn(self)


class FakeProducer:
    instances: list = []

    def __init__(self, bootstrap, **options):
        self.options, self.sent, self.flushed, self.closed = options, [], False, None
        self.fail_at = options.pop("fail_at", None)
        FakeProducer.instances.append(self)

    def send(self, topic, value, key=None, headers=None, partition=None):
        self.sent.append((topic, key, value, partition, headers))
        error = RuntimeError("NOT_ENOUGH_REPLICAS: not enough replicas") if len(self.sent) == self.fail_at else None
        return FakeFuture(topic, partition or 0, error)

    def flush(self, timeout=None):
        self.flushed = True

    def close(self, timeout=None):
        self.closed = timeout


def test_send_rows_uses_acks_all_flushes_and_closes():
    opts = parse_sink_options({**B, "topic": "out"})
    rows = [OutRow("ignored", b"k", b"v", None, [("h", b"x")]), OutRow(None, None, "text", 2)]
    assert send_rows(opts, rows, producer_factory=FakeProducer) == 2
    p = FakeProducer.instances[-1]
    assert p.options["acks"] == "all" and p.flushed and p.closed is None
    assert p.sent == [("out", b"k", b"v", None, [("h", b"x")]), ("out", None, "text", 2, None)]


def test_send_rows_fails_with_the_brokers_error():
    opts = parse_sink_options({**B, "topic": "out", "kafka.client.id": "c"})

    def factory(bootstrap, **options):
        return FakeProducer(bootstrap, fail_at=2, **options)

    with pytest.raises(SinkWriteError, match="topic 'out' partition 0 failed: NOT_ENOUGH_REPLICAS"):
        send_rows(opts, [OutRow(None, None, b"v")] * 5, producer_factory=factory)
    assert FakeProducer.instances[-1].closed == 0 and len(FakeProducer.instances[-1].sent) == 2


def test_send_rows_needs_a_topic():
    opts = parse_sink_options(B)
    with pytest.raises(SinkWriteError, match="no topic"):
        send_rows(opts, [OutRow(None, None, b"v")], producer_factory=FakeProducer)


def test_send_rows_reports_unacknowledged_records():
    class Slow(FakeProducer):
        def flush(self, timeout=None):
            raise RequestTimedOut("flush did not complete within 1 s")

    with pytest.raises(SinkWriteError, match="not all were acknowledged"):
        send_rows(parse_sink_options({**B, "topic": "t"}), [OutRow(None, None, b"v")], producer_factory=Slow)
