"""The PySpark Python Data Source ``tidelog``: a thin adapter over the pure planning code.

Where each piece runs (FEASIBILITY 3):

* ``TidelogStreamReader`` lives in the driver-side streaming source runner (one process per
  query run): ``latestOffset``, ``partitions`` and ``commit`` ask the cluster through a
  lazily opened ``ClusterView`` and decide with ``planning``. ``initialOffset`` asks nothing:
  it is ``planning.INITIAL``, the same in every run, and the first ``latestOffset`` resolves
  startingOffsets; the first batch's end carries the start it resolved (``"@from"``), so that
  Spark's offsets log holds both bounds of every batch and a replay after a restart reads
  exactly what was planned (planning's "first batch").
* ``read(partition)`` runs in executor Python workers on an unpickled copy of the reader
  (no clients are pickled) with its own short-lived consumer, and yields Arrow record
  batches of exactly the planned range.
* ``TidelogBatchReader`` plans once (``partitions``) in Spark's planner process.
* The writers send each task's rows with one producer (``produce.send_rows``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from tidelog import Record
from tidelog.spark.cluster import ClusterView
from tidelog.spark.fetch import HINT, DataLossError, open_consumer, read_range
from tidelog.spark.options import (
    LATEST,
    OptionError,
    SinkOptions,
    SourceOptions,
    parse_sink_options,
    parse_source_options,
)
from tidelog.spark.planning import (
    FROM_KEY,
    INITIAL,
    OffsetRange,
    Offsets,
    admit,
    batch_start,
    behind,
    is_initial,
    next_end,
    offsets_from_json,
    offsets_to_json,
    past_the_end,
    plan_ranges,
    resolve_ending,
    resolve_starting,
)
from tidelog.spark.produce import OutRow, send_rows

__all__ = ["TidelogDataSource", "TidelogStreamReader", "TidelogBatchReader", "TidelogBatchWriter",
           "TidelogStreamWriter", "RangePartition", "source_schema", "HEADERS_TYPE"]

log = logging.getLogger("spark_connector")

HEADERS_TYPE = ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())]))
_BASE_FIELDS = [StructField("key", BinaryType()), StructField("value", BinaryType()),
                StructField("topic", StringType()), StructField("partition", IntegerType()),
                StructField("offset", LongType()), StructField("timestamp", TimestampType()),
                StructField("timestampType", IntegerType())]


def source_schema(include_headers: bool) -> StructType:
    """Spark's Kafka schema (+ headers with includeHeaders)."""
    return StructType(_BASE_FIELDS + ([StructField("headers", HEADERS_TYPE)] if include_headers else []))


MISSING_RECHECK_S = 1.0
_ARROW = {h: to_arrow_schema(source_schema(h), timezone="UTC") for h in (False, True)}


class RangePartition(InputPartition):
    """One Spark task: ``value`` is the ``OffsetRange`` it reads."""

    def __init__(self, value: OffsetRange):
        super().__init__(value)

    def __repr__(self) -> str:
        r = self.value
        return f"RangePartition({r.topic}-{r.partition} [{r.start}, {r.end}))"


def _to_arrow(records: list[Record], include_headers: bool) -> pa.RecordBatch:
    columns = [
        pa.array([r.key for r in records], pa.binary()),
        pa.array([r.value for r in records], pa.binary()),
        pa.array([r.topic for r in records], pa.string()),
        pa.array([r.partition for r in records], pa.int32()),
        pa.array([r.offset for r in records], pa.int64()),
        pa.array([r.timestamp * 1000 for r in records], pa.timestamp("us", tz="UTC")),
        pa.array([r.timestamp_type for r in records], pa.int32()),
    ]
    schema = _ARROW[include_headers]
    if include_headers:
        columns.append(pa.array([[{"key": k, "value": v if v is None or isinstance(v, bytes) else str(v).encode()}
                                  for k, v in r.headers] for r in records], schema.field("headers").type))
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _read(opts: SourceOptions, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    r = partition.value
    if not isinstance(r, OffsetRange) or r.end <= r.start:
        return
    consumer = open_consumer(opts, r)
    try:
        for chunk in read_range(consumer, r, fail_on_data_loss=opts.fail_on_data_loss,
                                poll_timeout_ms=opts.poll_timeout_ms):
            yield _to_arrow(chunk, opts.include_headers)
    finally:
        consumer.close()


# -- streaming source -----------------------------------------------------------------------------


class TidelogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, opts: SourceOptions):
        self.opts = opts
        self._view: ClusterView | None = None
        self._target: Offsets | None = None  # Trigger.AvailableNow
        self._latest: Offsets | None = None  # for reportLatestOffset
        self._commit_warned = False
        self._admitted_at_ms: int | None = None  # minOffsetsPerTrigger / maxTriggerDelay

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_view"] = None  # clients stay in the process that opened them
        return state

    @property
    def view(self) -> ClusterView:
        if self._view is None:
            self._view = ClusterView(self.opts)
        return self._view

    def initialOffset(self) -> dict:
        """``INITIAL``, whatever the cluster holds: Spark asks for it to plan batch 0, again to
        run it, and once more in the next run if the driver died before batch 0 committed
        (only batch ends are in the checkpoint). The first ``latestOffset`` resolves
        startingOffsets, and batch 0's end carries the start it resolved (I14)."""
        return dict(INITIAL)

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.opts.max_offsets_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._high_watermarks({})
        log.info("Trigger.AvailableNow: reading up to %s", offsets_to_json(self._target))

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        first = is_initial(start)
        begin = _resolve_start(self.view, self.opts, streaming=True) if first else offsets_from_json(start)
        latest = self._high_watermarks(begin)
        self._latest = latest
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        back = behind(begin, latest)
        new = [tp for tp in latest if tp not in begin]
        log_end = self.view.log_end(back) if back else {}
        earliest = self.view.earliest(new) if new else {}
        step = next_end(begin, latest, max_offsets=max_rows, target=self._target, log_end=log_end,
                        earliest=earliest, starting=first)
        if self._target is None and self.opts.min_offsets_per_trigger is not None:
            available = step.size
            now_ms = int(time.time() * 1000)
            if not admit(available, min_offsets=self.opts.min_offsets_per_trigger,
                         max_delay_ms=self.opts.max_trigger_delay_ms, now_ms=now_ms,
                         last_admitted_ms=self._admitted_at_ms):
                log.debug("%d offsets available, fewer than minOffsetsPerTrigger %d: skipping this trigger",
                          available, self.opts.min_offsets_per_trigger)
                return start
            self._admitted_at_ms = now_ms
        for note in step.notes:
            log.warning("%s", note)
        if step.lost:
            message = "data loss: " + "; ".join(step.lost)
            if self.opts.fail_on_data_loss:
                raise DataLossError(f"{message}. {HINT}")
            log.warning("%s; going on without them (failOnDataLoss=false)", message)
        if first:
            return offsets_to_json(step.end, first=step.begin)
        if FROM_KEY in start and step.end == begin:
            return start  # nothing new after the first batch: the same offset, so Spark runs no batch
        return offsets_to_json(step.end)

    def reportLatestOffset(self) -> dict | None:
        return None if self._latest is None else offsets_to_json(self._latest)

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        if start == end:  # Spark's setLatestSeenOffset on a restart: no batch, nothing to plan
            return []
        begin = batch_start(start, end)
        if begin is None:
            log.warning("the first batch's end %s does not say where the batch starts (written by an older "
                        "connector): resolving startingOffsets again", end)
            begin = _resolve_start(self.view, self.opts, streaming=True)
        ranges = plan_ranges(begin, offsets_from_json(end), self.opts.min_partitions,
                             self.opts.max_records_per_partition)
        return [RangePartition(r) for r in ranges]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.opts, partition)

    def commit(self, end: dict) -> None:
        """Spark calls this once a batch's output is committed (for the last batch of a run,
        possibly only at the next start). With ``groupId`` it stores ``end`` as the group's
        committed offsets, so ``tidelog groups describe`` shows the query's lag; the
        checkpoint stays the source of truth, so a failure is logged, never raised."""
        group = self.opts.group_id
        if group is None:
            return
        try:
            self.view.commit(group, {tp: o for tp, o in offsets_from_json(end).items() if o != LATEST})
        except Exception as e:  # advisory: never fail the query over it
            if not self._commit_warned:
                self._commit_warned = True
                log.warning("groupId %r: committing the query's progress failed: %s", group, e)
            else:
                log.debug("groupId %r: committing the query's progress failed: %s", group, e)

    def stop(self) -> None:
        if self._view is not None:
            self._view.close()
            self._view = None

    def _high_watermarks(self, start: Offsets) -> Offsets:
        """The HW of every partition read now. A partition without a leader right now keeps
        its position (``start``) instead of blocking the trigger, or is left for later. When
        the metadata no longer lists a partition the query reads, it is asked again after
        ``MISSING_RECHECK_S`` (the broker that answered may not have learnt of a new topic
        yet) before ``next_end`` reports the partition as lost."""
        leaders = self.view.partitions()
        if set(start) - set(leaders):
            time.sleep(MISSING_RECHECK_S)
            leaders = self.view.partitions()
        ready = [tp for tp, leader in leaders.items() if leader >= 0]
        latest = self.view.latest(ready)
        for tp, leader in leaders.items():
            if leader < 0 and tp in start:
                latest[tp] = start[tp]
        return latest


def _resolve_start(view: ClusterView, opts: SourceOptions, *, streaming: bool = False) -> Offsets:
    """The starting offsets; ``streaming``: a partition that starts at the latest offsets
    gets ``LATEST`` instead of its high watermark. With ``assign``, an assigned partition
    that does not exist fails a batch read, and a streaming query reads it from offset 0
    once it exists (as any partition new to the query)."""
    leaders = view.partitions()
    tps = sorted(leaders)
    if opts.subscription.kind == "assign":
        absent = sorted(set(opts.subscription.assigned) - set(leaders))
        if absent and not streaming:
            raise OptionError(f"option assign names partitions that do not exist: {absent}")
        if absent:
            log.warning("option assign names partitions that do not exist (yet): %s; each is read from offset 0 "
                        "once it exists", absent)
    spec = opts.starting
    earliest = view.earliest(tps) if spec.kind in ("earliest", "offsets", "timestamps") else {}
    if streaming:
        latest = dict.fromkeys(tps, LATEST)
    else:
        latest = view.latest(tps) if spec.kind != "earliest" else {}
    by_time = None
    if spec.kind == "timestamp":
        by_time = view.by_time({tp: spec.timestamp for tp in tps})
    elif spec.kind == "timestamps":
        by_time = view.by_time({tp: ts for tp, ts in spec.timestamps.items() if tp in set(tps)})
    return resolve_starting(spec, tps, earliest, latest, by_time, strategy=opts.timestamp_strategy)


# -- batch source ---------------------------------------------------------------------------------


class TidelogBatchReader(DataSourceReader):
    def __init__(self, opts: SourceOptions):
        self.opts = opts

    def partitions(self) -> list[InputPartition]:
        with ClusterView(self.opts) as view:
            start = _resolve_start(view, self.opts)
            spec = self.opts.ending
            by_time = None
            if spec.kind == "timestamp":
                by_time = view.by_time({tp: spec.timestamp for tp in start})
            elif spec.kind == "timestamps":
                by_time = view.by_time({tp: ts for tp, ts in spec.timestamps.items() if tp in start})
            latest = view.latest(sorted(start))
            end = resolve_ending(spec, list(start), latest, by_time)
        short = past_the_end(spec, latest)
        if short:
            message = "; ".join(short)
            if self.opts.fail_on_data_loss:
                raise DataLossError(f"{message}. {HINT}")
            log.warning("%s; reading up to the high watermark (failOnDataLoss=false)", message)
        for tp in sorted(start):
            asked = spec.offsets.get(tp, LATEST) if spec.kind == "offsets" else LATEST
            bound = end[tp] if asked == LATEST else asked  # past the HW: reported above, not an option error
            if start[tp] > bound:
                raise OptionError(f"topic {tp[0]!r} partition {tp[1]}: the starting offset {start[tp]} is after "
                                  f"the ending offset {bound}")
        return [RangePartition(r) for r in plan_ranges(start, end, self.opts.min_partitions,
                                                       self.opts.max_records_per_partition)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.opts, partition)


# -- sink -----------------------------------------------------------------------------------------


@dataclass
class WriteResult(WriterCommitMessage):
    records: int


_SINK_TYPES: dict[str, tuple[type[DataType], ...]] = {
    "value": (BinaryType, StringType), "key": (BinaryType, StringType), "topic": (StringType,),
    "partition": (IntegerType, LongType)}


def check_sink_schema(schema: StructType, opts: SinkOptions) -> None:
    """Spark's Kafka sink columns: value (required), key, topic, partition, headers; other
    columns are ignored."""
    by_name = {f.name.lower(): f for f in schema.fields}
    if "value" not in by_name:
        raise OptionError(f"the sink needs a value column (binary or string); the columns are {schema.fieldNames()}")
    for name, types in _SINK_TYPES.items():
        f = by_name.get(name)
        if f is not None and not isinstance(f.dataType, types):
            raise OptionError(f"sink column {name} must be {' or '.join(t.typeName() for t in types)}, "
                              f"not {f.dataType.simpleString()}")
    if "headers" in by_name and by_name["headers"].dataType.simpleString() != HEADERS_TYPE.simpleString():
        raise OptionError(f"sink column headers must be {HEADERS_TYPE.simpleString()}, "
                          f"not {by_name['headers'].dataType.simpleString()}")
    if opts.topic is None and "topic" not in by_name:
        raise OptionError("the sink needs a topic: set the option topic or add a topic column")


def _column(batch: pa.RecordBatch, names: dict[str, int], name: str) -> list:
    i = names.get(name)
    return [None] * batch.num_rows if i is None else batch.column(i).to_pylist()


def _rows(batches: Iterator[pa.RecordBatch]) -> Iterator[OutRow]:
    for batch in batches:
        names = {n.lower(): i for i, n in enumerate(batch.schema.names)}
        headers = [None if h is None else [(e["key"], e["value"]) for e in h]
                   for h in _column(batch, names, "headers")]
        yield from map(OutRow, _column(batch, names, "topic"), _column(batch, names, "key"),
                       _column(batch, names, "value"), _column(batch, names, "partition"), headers)


class _Writing:
    opts: SinkOptions

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteResult:
        return WriteResult(send_rows(self.opts, _rows(iterator)))


class TidelogBatchWriter(_Writing, DataSourceArrowWriter):
    def __init__(self, opts: SinkOptions):
        self.opts = opts

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        log.info("wrote %d records", sum(m.records for m in messages if isinstance(m, WriteResult)))


class TidelogStreamWriter(_Writing, DataSourceStreamArrowWriter):
    def __init__(self, opts: SinkOptions):
        self.opts = opts

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.info("batch %d: wrote %d records", batchId,
                 sum(m.records for m in messages if isinstance(m, WriteResult)))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning("batch %d aborted: records already written stay (the sink is at-least-once)", batchId)


# -- the data source ------------------------------------------------------------------------------


class TidelogDataSource(DataSource):
    """``spark.readStream.format("tidelog")``, ``spark.read``, ``df.writeStream`` and ``df.write``."""

    @classmethod
    def name(cls) -> str:
        return "tidelog"

    def schema(self) -> StructType:
        """Asked for by ``load()``: the options are checked here, so a bad one fails at once."""
        return source_schema(parse_source_options(self.options, streaming=None).include_headers)

    def reader(self, schema: StructType) -> DataSourceReader:
        return TidelogBatchReader(parse_source_options(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return TidelogStreamReader(parse_source_options(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> TidelogBatchWriter:
        if overwrite:
            raise OptionError("the tidelog sink appends: save mode overwrite is not supported")
        opts = parse_sink_options(self.options)
        check_sink_schema(schema, opts)
        return TidelogBatchWriter(opts)

    def streamWriter(self, schema: StructType, overwrite: bool) -> TidelogStreamWriter:
        opts = parse_sink_options(self.options)
        check_sink_schema(schema, opts)
        return TidelogStreamWriter(opts)
