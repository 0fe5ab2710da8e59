"""The connector's options, parsed and checked once (pure: no Spark, no I/O).

Names follow Spark's Kafka source and sink where the meaning is the same::

    bootstrap.servers        host:port[,host:port]  (also kafka.bootstrap.servers)
    subscribe                t1,t2                   exactly one of subscribe,
    subscribePattern         regex (full match)      subscribePattern and assign
    assign                   {"t1": [0, 1]}
    startingOffsets          earliest | latest | {"t": {"0": 23, "1": -2}}   (-2 earliest, -1 latest)
    startingOffsetsByTimestamp  {"t": {"0": 1700000000000}}                    (ms)
    startingTimestamp        ms, for every partition (wins over the two above)
    startingOffsetsByTimestampStrategy  error (default) | latest: no record at or after the time
    endingOffsets            batch only: latest | {"t": {"0": 50, "1": -1}}; an offset above
                             the high watermark is data loss (failOnDataLoss)
    endingOffsetsByTimestamp batch only: {"t": {"0": ms}}: stop before the first record at or
                             after the time (latest when there is none)
    endingTimestamp          batch only: ms, for every partition (wins over the two above)
    maxOffsetsPerTrigger     streaming: at most this many offsets per micro-batch
    minOffsetsPerTrigger     streaming: skip a trigger until this many offsets are available...
    maxTriggerDelay          ...or this long has passed since the last batch (default 15m)
    minPartitions            split offset ranges so a batch has at least this many Spark partitions
    maxRecordsPerPartition   split offset ranges so no Spark partition reads more records
    failOnDataLoss           true (default) | false: skip lost ranges with a warning
    includeHeaders           false (default) | true: the headers column
    pollTimeoutMs            how long read() may go without progress (default 120000; also
                             kafkaConsumer.pollTimeoutMs, Spark's name)
    fetchOffset.numRetries   retries of a failed offset lookup on the driver (default 3)
    fetchOffset.retryIntervalMs  the wait between them (default 10)
    groupId                  report progress as the group's committed offsets (one micro-batch
                             behind: Spark commits a batch to the source when it plans the next);
                             Tidelog's own option: Spark's kafka.group.id is refused (REFUSED)
    topic                    sink: the default topic (overrides a topic column)
    kafka.<name>             an SDK client option by its Kafka name (kafka.request.timeout.ms)

Every other option is refused with an error naming it (Spark's Kafka source ignores unknown
options; a misspelt option silently ignored reads the wrong records). ``REFUSED`` lists the
Kafka connector's options Tidelog does not implement, each with the reason. The sink also
takes ``checkpointLocation`` and ``queryName``, which Spark puts among a streaming sink's
options itself (``writeStream.queryName(name)`` is the option ``queryName``).

Offsets in option JSON are keyed by topic then partition, as Spark's are. A partition that
a JSON offsets option does not mention starts at earliest (starting) or stops at latest
(ending); Spark's Kafka source rejects that instead.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from tidelog.aio.consumer import ConsumerConfig
from tidelog.aio.producer import ProducerConfig
from tidelog.commands.common import property_value
from tidelog.security import SecurityConfig, options_from_properties

__all__ = ["OptionError", "EARLIEST", "LATEST", "REFUSED", "OffsetSpec", "Subscription", "SourceOptions",
           "SinkOptions", "parse_source_options", "parse_sink_options", "parse_duration_ms"]

EARLIEST = -2  # Spark's sentinels in JSON offsets
LATEST = -1

# Client options the connector sets itself: a kafka.* option may not override them.
_RESERVED = {"bootstrap_servers", "group_id", "auto_offset_reset", "enable_auto_commit", "acks",
             "enable_idempotence"}
# The driver's Admin takes these of the kafka.* options: its own, and the security ones (a
# secured cluster answers nobody who has not authenticated).
_SECURITY = {f.name for f in fields(SecurityConfig)}
_ADMIN_KEYS = {"client_id", "request_timeout_ms", "retry_backoff_ms", "retry_backoff_max_ms",
               "default_api_timeout_ms"} | _SECURITY


class OptionError(ValueError):
    """An option is missing, unknown or malformed; the message names it."""


# Options of Spark's Kafka connector that Tidelog does not implement, and why.
REFUSED = {
    "groupidprefix": "the tidelog source's consumers are assigned their partitions and use no consumer "
                     "group, so there is no generated group id to prefix; to see a query's progress as a "
                     "group, name the group with groupId",
    # In Spark it only names the group its consumers present (group-based authorization); Spark
    # never commits offsets to it. Taking it for groupId would write into a real group's offsets.
    "kafka.group.id": "the tidelog source's consumers are assigned their partitions and use no consumer "
                      "group, so there is no group id to present (Spark's Kafka source uses kafka.group.id "
                      "only as its consumers' identity, and never commits offsets to it); to record a "
                      "query's progress as a group's committed offsets, name that group with groupId",
}

_SOURCE_OPTIONS = {
    "bootstrap.servers", "kafka.bootstrap.servers", "subscribe", "subscribepattern", "assign",
    "startingoffsets", "endingoffsets", "startingtimestamp", "endingtimestamp",
    "startingoffsetsbytimestamp", "endingoffsetsbytimestamp", "startingoffsetsbytimestampstrategy",
    "maxoffsetspertrigger", "minoffsetspertrigger", "maxtriggerdelay", "minpartitions",
    "maxrecordsperpartition", "failondataloss", "includeheaders", "polltimeoutms",
    "kafkaconsumer.polltimeoutms", "fetchoffset.numretries", "fetchoffset.retryintervalms", "groupid",
}
# Spark reads a streaming sink's checkpoint from its options, and writes its query name there
_SINK_OPTIONS = {"bootstrap.servers", "kafka.bootstrap.servers", "topic", "checkpointlocation", "queryname"}
_STREAMING_ONLY = ("maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay")
_BATCH_ONLY = ("endingOffsets", "endingOffsetsByTimestamp", "endingTimestamp")

_DURATION_UNITS = {"us": 0.001, "ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000,
                   "d": 86_400_000}


def parse_duration_ms(name: str, raw: str) -> int:
    """Spark's time strings (``15m``, ``10s``, ``500ms``; a bare number is milliseconds)."""
    m = re.fullmatch(r"\s*(\d+)\s*([a-z]*)\s*", raw.lower())
    if not m or m.group(2) not in {"", *_DURATION_UNITS}:
        raise OptionError(f"option {name} must be a duration such as 500ms, 30s, 15m or 1h, got {raw!r}")
    return int(int(m.group(1)) * _DURATION_UNITS.get(m.group(2) or "ms", 1))


def _refuse_unknown(options: Mapping[str, str], known: set[str], role: str) -> None:
    for key in options:
        name = key.lower()
        if name in REFUSED:
            raise OptionError(f"option {key} is not supported by the tidelog {role}: {REFUSED[name]}")
        if name in known or name.startswith("kafka."):
            continue  # kafka.* options are checked against the client's options
        if name in ("path", "paths"):
            raise OptionError(f"the tidelog {role} takes no path (got option {key}={options[key]!r}): "
                              + ("name topics with subscribe, subscribePattern or assign" if role == "source"
                                 else "name the topic with the option topic or a topic column"))
        other = _SINK_OPTIONS if role == "source" else _SOURCE_OPTIONS
        where = (f"; it is a {'sink' if role == 'source' else 'source'} option" if name in other else "")
        raise OptionError(f"unknown {role} option {key!r}{where} (options are refused rather than ignored; "
                          "see the connector's option list in README.md)")


@dataclass(frozen=True)
class OffsetSpec:
    """Where to start or stop: ``kind`` is "earliest", "latest", "offsets" (``offsets``:
    {(topic, partition): offset or EARLIEST/LATEST}), "timestamp" (``timestamp`` ms for every
    partition) or "timestamps" (``timestamps``: {(topic, partition): ms})."""

    kind: str
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    timestamp: int | None = None
    timestamps: dict[tuple[str, int], int] = field(default_factory=dict)


@dataclass(frozen=True)
class Subscription:
    """``kind`` is "subscribe" (``topics``), "pattern" (``pattern``) or "assign" (``assigned``)."""

    kind: str
    topics: tuple[str, ...] = ()
    pattern: str | None = None
    assigned: tuple[tuple[str, int], ...] = ()

    def matches(self, topic: str) -> bool:
        if self.kind == "subscribe":
            return topic in self.topics
        if self.kind == "pattern":
            return re.fullmatch(self.pattern, topic) is not None
        return any(t == topic for t, _ in self.assigned)

    def describe(self) -> str:
        if self.kind == "subscribe":
            return f"subscribe={','.join(self.topics)}"
        if self.kind == "pattern":
            return f"subscribePattern={self.pattern}"
        return f"assign={sorted(self.assigned)}"


@dataclass(frozen=True)
class SourceOptions:
    bootstrap_servers: str
    subscription: Subscription
    starting: OffsetSpec
    ending: OffsetSpec
    timestamp_strategy: str = "error"
    max_offsets_per_trigger: int | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = 15 * 60_000
    min_partitions: int | None = None
    max_records_per_partition: int | None = None
    fetch_offset_retries: int = 3
    fetch_offset_retry_interval_ms: int = 10
    fail_on_data_loss: bool = True
    include_headers: bool = False
    poll_timeout_ms: int = 120_000
    group_id: str | None = None
    consumer_options: dict[str, Any] = field(default_factory=dict)
    admin_options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SinkOptions:
    bootstrap_servers: str
    topic: str | None = None
    producer_options: dict[str, Any] = field(default_factory=dict)


def _get(options: Mapping[str, str], name: str) -> str | None:
    """Case-insensitive lookup (Spark hands a CaseInsensitiveDict; plain dicts in tests)."""
    want = name.lower()
    for k, v in options.items():
        if k.lower() == want:
            return None if v is None else str(v)
    return None


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = _get(options, name)
    if raw is None:
        return default
    if raw.strip().lower() in ("true", "false"):
        return raw.strip().lower() == "true"
    raise OptionError(f"option {name} must be true or false, got {raw!r}")


def _int(options: Mapping[str, str], name: str, *, minimum: int) -> int | None:
    raw = _get(options, name)
    if raw is None:
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        raise OptionError(f"option {name} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise OptionError(f"option {name} must be >= {minimum}, got {value}")
    return value


def _default(value: int | None, default: int) -> int:
    return default if value is None else value


def _json(name: str, raw: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError as e:
        raise OptionError(f"option {name} is not valid JSON ({e}): {raw!r}") from None


def _per_partition(name: str, raw: str, *, minimum: int) -> dict[tuple[str, int], int]:
    """``{"t": {"0": 23}}`` -> ``{("t", 0): 23}``."""
    data = _json(name, raw)
    if not isinstance(data, dict) or not data:
        raise OptionError(f"option {name} must be a non-empty JSON object "
                          f'{{"topic": {{"partition": value}}}}, got {raw!r}')
    out = {}
    for topic, parts in data.items():
        if not isinstance(parts, dict):
            raise OptionError(f"option {name}: topic {topic!r} must map partitions to values, got {parts!r}")
        for p, value in parts.items():
            try:
                partition = int(p)
            except (TypeError, ValueError):
                raise OptionError(f"option {name}: topic {topic!r}: partition {p!r} is not an integer") from None
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum or partition < 0:
                raise OptionError(f"option {name}: topic {topic!r} partition {p}: "
                                  f"{value!r} is not a valid value (integer >= {minimum})")
            out[(topic, partition)] = value
    return out


def _timestamp_spec(options: Mapping[str, str], which: str) -> OffsetSpec | None:
    """``<which>OffsetsByTimestamp`` or ``<which>Timestamp`` (which wins when both are
    given, as in Spark), both checked; None when neither is."""
    spec = None
    by_ts = _get(options, f"{which}OffsetsByTimestamp")
    if by_ts is not None:
        spec = OffsetSpec("timestamps", timestamps=_per_partition(f"{which}OffsetsByTimestamp", by_ts, minimum=0))
    ts = _int(options, f"{which}Timestamp", minimum=0)
    if ts is not None:
        spec = OffsetSpec("timestamp", timestamp=ts)
    return spec


def _offset_spec(options: Mapping[str, str], name: str, default: str, allowed: set[str]) -> OffsetSpec:
    raw = _get(options, name)
    if raw is None:
        return OffsetSpec(default)
    text = raw.strip()
    if text.lower() in ("earliest", "latest"):
        kind = text.lower()
        if kind not in allowed:
            raise OptionError(f"option {name}: {kind!r} is not allowed here (use {' or '.join(sorted(allowed))} "
                              "or JSON offsets)")
        return OffsetSpec(kind)
    offsets = _per_partition(name, text, minimum=EARLIEST)
    for tp, value in offsets.items():
        if value == LATEST and "latest" not in allowed:
            raise OptionError(f"option {name}: -1 (latest) is not allowed for {tp[0]} partition {tp[1]}")
        if value == EARLIEST and "earliest" not in allowed:
            raise OptionError(f"option {name}: -2 (earliest) is not allowed for {tp[0]} partition {tp[1]}")
    return OffsetSpec("offsets", offsets=offsets)


def _subscription(options: Mapping[str, str]) -> Subscription:
    given = {n: _get(options, n) for n in ("subscribe", "subscribePattern", "assign")}
    present = [n for n, v in given.items() if v is not None]
    if len(present) != 1:
        raise OptionError("exactly one of the options subscribe, subscribePattern and assign is required"
                          + (f" (got {', '.join(present)})" if present else ""))
    name = present[0]
    raw = given[name].strip()
    if name == "subscribe":
        topics = tuple(dict.fromkeys(t.strip() for t in raw.split(",") if t.strip()))
        if not topics:
            raise OptionError("option subscribe must name at least one topic")
        return Subscription("subscribe", topics=topics)
    if name == "subscribePattern":
        if not raw:
            raise OptionError("option subscribePattern must not be empty")
        try:
            re.compile(raw)
        except re.error as e:
            raise OptionError(f"option subscribePattern is not a valid regular expression ({e}): {raw!r}") from None
        return Subscription("pattern", pattern=raw)
    data = _json("assign", raw)
    if not isinstance(data, dict) or not data:
        raise OptionError(f'option assign must be a JSON object {{"topic": [partitions]}}, got {raw!r}')
    assigned = []
    for topic, parts in data.items():
        if not isinstance(parts, list) or not all(isinstance(p, int) and not isinstance(p, bool) and p >= 0
                                                  for p in parts):
            raise OptionError(f"option assign: topic {topic!r} needs a list of partition numbers, got {parts!r}")
        assigned += [(topic, p) for p in parts]
    if not assigned:
        raise OptionError("option assign names no partition")
    return Subscription("assign", assigned=tuple(sorted(set(assigned))))


def _client_options(options: Mapping[str, str], config_types: tuple[type, ...], role: str) -> dict[str, Any]:
    """``kafka.<name>`` options -> SDK keyword options known to ``config_types``."""
    known = set()
    for t in config_types:
        known |= {f.name for f in fields(t)}
    known -= _RESERVED
    out: dict[str, Any] = {}
    security: dict[str, str] = {}  # Kafka's Java names, as Spark's Kafka connector passes them on
    for key, raw in options.items():
        if not key.lower().startswith("kafka.") or key.lower() == "kafka.bootstrap.servers":
            continue
        if SecurityConfig.knows(key[6:].strip().lower()):
            security[key[6:].strip().lower()] = raw
            continue
        name = key[6:].strip().lower().replace(".", "_").replace("-", "_")
        if name in _RESERVED:
            raise OptionError(f"option {key} is set by the connector and cannot be overridden")
        if name not in known:
            raise OptionError(f"unknown {role} option {key!r} (known: "
                              f"{', '.join('kafka.' + k.replace('_', '.') for k in sorted(known))})")
        out[name] = property_value(raw)
    if security:  # merged with the kafka.* options named like the SDK's (kafka.sasl.plain.username)
        try:
            out.update({**options_from_properties(security), **{k: v for k, v in out.items() if k in _SECURITY}})
            SecurityConfig(**{k: v for k, v in out.items() if k in _SECURITY})
        except ValueError as e:
            raise OptionError(f"kafka.* security options: {e}") from None
    return out


def _bootstrap(options: Mapping[str, str]) -> str:
    servers = _get(options, "bootstrap.servers") or _get(options, "kafka.bootstrap.servers")
    if not servers or not servers.strip():
        raise OptionError("option bootstrap.servers is required (host:port[,host:port])")
    return servers.strip()


def parse_source_options(options: Mapping[str, str], *, streaming: bool | None) -> SourceOptions:
    """Check a source's options. Streaming defaults to startingOffsets=latest and forbids
    endingOffsets; batch defaults to earliest..latest and forbids the latest start. None
    checks what both have in common (the schema is asked for before the kind of query is
    known)."""
    _refuse_unknown(options, _SOURCE_OPTIONS, "source")
    bootstrap = _bootstrap(options)
    subscription = _subscription(options)
    if streaming:
        for name in _BATCH_ONLY:
            if _get(options, name) is not None:
                raise OptionError(f"option {name} is for batch queries (spark.read) only")
    elif streaming is False:
        for name in _STREAMING_ONLY:
            if _get(options, name) is not None:
                raise OptionError(f"option {name} is for streaming queries only")
    if streaming is None:
        starting = _offset_spec(options, "startingOffsets", "earliest", {"earliest", "latest"})
        ending = _offset_spec(options, "endingOffsets", "latest", {"latest"})
    elif streaming:
        starting = _offset_spec(options, "startingOffsets", "latest", {"earliest", "latest"})
        ending = OffsetSpec("latest")
    else:
        starting = _offset_spec(options, "startingOffsets", "earliest", {"earliest"})
        ending = _offset_spec(options, "endingOffsets", "latest", {"latest"})
    if streaming is not True:
        ending = _timestamp_spec(options, "ending") or ending
    starting = _timestamp_spec(options, "starting") or starting
    strategy = (_get(options, "startingOffsetsByTimestampStrategy") or "error").strip().lower()
    if strategy not in ("error", "latest"):
        raise OptionError(f"option startingOffsetsByTimestampStrategy must be error or latest, got {strategy!r}")
    if subscription.kind == "assign":
        assigned = set(subscription.assigned)
        for spec_map, name in ((starting.offsets, "startingOffsets"), (ending.offsets, "endingOffsets"),
                               (starting.timestamps, "startingOffsetsByTimestamp"),
                               (ending.timestamps, "endingOffsetsByTimestamp")):
            extra = sorted(set(spec_map) - assigned)
            if extra:
                raise OptionError(f"option {name} names partitions that are not assigned: {extra}")
    poll = _int(options, "pollTimeoutMs", minimum=1) or _int(options, "kafkaConsumer.pollTimeoutMs", minimum=1)
    group = _get(options, "groupId")
    max_offsets = _int(options, "maxOffsetsPerTrigger", minimum=1)
    min_offsets = _int(options, "minOffsetsPerTrigger", minimum=1)
    if min_offsets is not None and max_offsets is not None and min_offsets > max_offsets:
        raise OptionError(f"option minOffsetsPerTrigger ({min_offsets}) is higher than maxOffsetsPerTrigger "
                          f"({max_offsets})")
    delay = _get(options, "maxTriggerDelay")
    max_delay_ms = parse_duration_ms("maxTriggerDelay", delay) if delay is not None else 15 * 60_000
    consumer_options = _client_options(options, (ConsumerConfig,), "consumer")
    return SourceOptions(
        bootstrap_servers=bootstrap, subscription=subscription, starting=starting, ending=ending,
        timestamp_strategy=strategy,
        max_offsets_per_trigger=max_offsets,
        min_offsets_per_trigger=min_offsets,
        max_trigger_delay_ms=max_delay_ms,
        min_partitions=_int(options, "minPartitions", minimum=1),
        max_records_per_partition=_int(options, "maxRecordsPerPartition", minimum=1),
        fetch_offset_retries=_default(_int(options, "fetchOffset.numRetries", minimum=0), 3),
        fetch_offset_retry_interval_ms=_default(_int(options, "fetchOffset.retryIntervalMs", minimum=0), 10),
        fail_on_data_loss=_bool(options, "failOnDataLoss", True),
        include_headers=_bool(options, "includeHeaders", False),
        poll_timeout_ms=poll or 120_000,
        group_id=group.strip() if group and group.strip() else None,
        consumer_options=consumer_options,
        admin_options={k: v for k, v in consumer_options.items() if k in _ADMIN_KEYS})


def parse_sink_options(options: Mapping[str, str]) -> SinkOptions:
    for name in ("subscribe", "subscribePattern", "assign"):
        if _get(options, name) is not None:
            raise OptionError(f"option {name} is for reading; the sink takes topic (or a topic column)")
    _refuse_unknown(options, _SINK_OPTIONS, "sink")
    topic = _get(options, "topic")
    if topic is not None and not topic.strip():
        raise OptionError("option topic must not be empty")
    for name in ("subscribe", "subscribePattern", "assign"):
        if _get(options, name) is not None:
            raise OptionError(f"option {name} is for reading; the sink takes topic (or a topic column)")
    return SinkOptions(bootstrap_servers=_bootstrap(options), topic=topic.strip() if topic else None,
                       producer_options=_client_options(options, (ProducerConfig,), "producer"))
