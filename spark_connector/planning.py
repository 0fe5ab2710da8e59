"""Offset and range planning for the Spark source (pure: no Spark, no I/O, no clock).

Offsets. A Spark offset is the JSON object ``{topic: {partition: offset}}`` with string keys
(Spark stores it verbatim in ``<checkpoint>/offsets/<batch>`` and compares offsets by their
JSON text), so ``offsets_to_json`` always emits topics and partitions in one canonical
order: equal offsets give equal JSON. Inside the connector offsets are ``{(topic,
partition): offset}``; an offset is the next record to read, so a batch reads ``[start,
end)`` per partition.

The first batch (I14). Spark's offsets log holds each batch's end, and a batch starts where
the previous one ended; the first batch starts at the source's initial offset, which Spark
does not keep: it asks the source again to run the batch, and again in the next run when
the driver died before the batch committed. So the initial offset names no partition and
depends on nothing in the cluster: it is ``INITIAL`` (``{"@initial": "startingOffsets"}``),
the same answer in every run, and the first trigger (``latestOffset``) resolves
startingOffsets against the cluster. The end of the first batch carries that resolved start
under ``"@from"`` (``{"t": {"0": 10}, "@from": {"t": {"0": 0}}}``), so Spark's offsets log
holds both bounds of the first batch and ``batch_start`` gives a replay the same ranges,
whatever the cluster looks like by then: offsets removed since (retention) are reported as
data loss by ``read``, partitions added since are not read by it. ``"@from"`` stays in the
offsets while no batch follows, and a later end drops it. Topic names cannot start with
``@`` (letters, digits, ``.``, ``_`` and ``-`` only), so neither key is ever a topic.

The rules the driver follows each trigger (``next_end``):

* the end never passes a partition's high watermark (the caller passes the HWs it just
  asked the leaders for: records above the HW are not committed and are never read);
* a partition the query has not seen before (a new partition, or a topic that starts
  matching ``subscribePattern``) starts at offset 0, so its whole log is read; if the log no
  longer starts at 0, ``read`` reports the missing offsets as data loss, as Spark's Kafka
  source does for added partitions;
* a partition at ``LATEST`` (-1: a streaming query that starts at the latest offsets) is
  positioned by the first batch that sees its high watermark: that batch ends there and reads
  nothing of the partition (``plan_ranges`` makes its range empty). Without a leader the
  partition stays at ``LATEST``;
* a partition that is gone (its topic was deleted) is data loss; with failOnDataLoss=false
  it is dropped from the offsets;
* a high watermark below the query's position holds the partition where it is while the
  leader's log end offset is at or above that position (a new leader whose HW has not caught
  up yet: the records are in its log). A log end below the position means the records the
  query was heading for are gone (an unclean election truncated the log, or the topic was
  deleted and re-created): data loss, and the batch ends at the high watermark, so the query
  goes on from the log's new end, as Spark's Kafka source reports "offset was changed" and
  goes on. Offsets alone cannot tell a re-created topic from a truncated log (Tidelog has no
  topic ids), so the records a re-created topic holds below the old position are not read
  either (the data-loss message says it may be either). A streaming startingOffsets above the log end is
  the same case in the first batch, reported as such (Spark's Kafka source fails the query on
  it too, or goes on from the end with failOnDataLoss=false);
* ``ReadMaxRows`` (maxOffsetsPerTrigger) is shared among the partitions in proportion to
  what each has available, with the largest-remainder rule: a batch never spans more than
  the limit, and every offset available is eventually admitted. A new partition's records
  are counted from its log start (as Spark's rateLimit does), though its range starts at 0:
  a log that starts far from 0 does not take the whole budget for its missing offsets;
* under Trigger.AvailableNow the end never passes the target recorded when the trigger
  started, and partitions that appeared after it wait for the next run.

``admit`` is minOffsetsPerTrigger with maxTriggerDelay, as Spark's Kafka source does it: a
trigger with fewer offsets available than the minimum is skipped (``latestOffset`` answers
the start, so Spark runs no batch) unless maxTriggerDelay has passed since the last batch
was admitted; the first trigger of a run is always admitted, and Trigger.AvailableNow
ignores the minimum (it would wait for ever at the end of the data).

``plan_ranges`` turns a batch's ``[start, end)`` into one range per partition and splits
them: a range longer than ``maxRecordsPerPartition`` into pieces of at most that many
offsets, then (``minPartitions``) into at least that many nearly equal Spark partitions.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tidelog.spark.options import EARLIEST, LATEST, OffsetSpec, OptionError

__all__ = ["TP", "Offsets", "OffsetRange", "Step", "INITIAL", "FROM_KEY", "is_initial", "batch_start",
           "offsets_to_json", "offsets_from_json",
           "resolve_starting", "resolve_ending", "past_the_end", "behind", "next_end", "admit", "allocate", "plan_ranges",
           "cap_ranges", "split_ranges", "data_loss_message", "InvalidOffsetsError"]

TP = tuple[str, int]
Offsets = dict[TP, int]

INITIAL_KEY = "@initial"
INITIAL = {INITIAL_KEY: "startingOffsets"}  # the query's initial offset (the module's "first batch")
FROM_KEY = "@from"  # in the first batch's end: where that batch starts


class InvalidOffsetsError(ValueError):
    """Offsets JSON that the connector did not write (a damaged or foreign checkpoint)."""


@dataclass(frozen=True, slots=True)
class OffsetRange:
    """Records ``[start, end)`` of one partition: what one Spark task reads."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


def _key(tp: TP) -> tuple[str, int]:
    return tp[0], tp[1]


def offsets_to_json(offsets: Mapping[TP, int], *, first: Mapping[TP, int] | None = None) -> dict[str, Any]:
    """``{("t", 1): 5, ("t", 0): 3}`` -> ``{"t": {"0": 3, "1": 5}}``, canonically ordered.
    ``first`` (the first batch's end only) is that batch's start, kept under ``"@from"``."""
    out: dict[str, Any] = {}
    for (topic, partition) in sorted(offsets, key=_key):
        out.setdefault(topic, {})[str(partition)] = int(offsets[(topic, partition)])
    if first is not None:
        out[FROM_KEY] = offsets_to_json(first)
    return out


def is_initial(data: Any) -> bool:
    """Whether ``data`` is the query's initial offset (``INITIAL``)."""
    return isinstance(data, dict) and INITIAL_KEY in data


def offsets_from_json(data: Any) -> Offsets:
    """The positions ``data`` names: none for ``INITIAL``; a first batch's ``"@from"`` is
    not a position (``batch_start`` reads it)."""
    if not isinstance(data, dict):
        raise InvalidOffsetsError(f"offsets must be a JSON object {{topic: {{partition: offset}}}}, got {data!r}")
    if is_initial(data):
        if data != INITIAL:
            raise InvalidOffsetsError(f"an initial offset must be {INITIAL}, got {data!r}")
        return {}
    out: Offsets = {}
    for topic, parts in data.items():
        if topic == FROM_KEY:
            continue
        if not isinstance(parts, dict):
            raise InvalidOffsetsError(f"offsets for topic {topic!r} must be an object, got {parts!r}")
        for p, offset in parts.items():
            try:
                partition = int(p)
            except (TypeError, ValueError):
                raise InvalidOffsetsError(f"topic {topic!r}: partition {p!r} is not a number") from None
            if isinstance(offset, bool) or not isinstance(offset, int) or (offset < 0 and offset != LATEST):
                raise InvalidOffsetsError(f"topic {topic!r} partition {p}: offset {offset!r} is neither >= 0 nor "
                                          f"{LATEST} (latest, not positioned yet)")
            out[(topic, partition)] = offset
    return out


def batch_start(start: Any, end: Any) -> Offsets | None:
    """Where the batch ``start`` -> ``end`` starts: the first batch's ``"@from"``, else the
    positions of ``start``. None for a first batch whose end does not carry its start (written
    by a connector older than ``"@from"``): the caller resolves startingOffsets again, as that
    version did."""
    if isinstance(end, dict) and FROM_KEY in end:
        return offsets_from_json(end[FROM_KEY])
    if is_initial(start):
        return None
    return offsets_from_json(start)


# -- where a query or batch starts and stops ------------------------------------------------------


def _existing(spec: OffsetSpec, partitions: Iterable[TP], option: str) -> list[TP]:
    """``partitions`` in order; OptionError if ``spec`` names offsets of any other one."""
    parts = sorted(set(partitions), key=_key)
    missing = sorted(set(spec.offsets) - set(parts))
    if missing:
        raise OptionError(f"{option} names partitions that do not exist: {missing}")
    return parts


def resolve_starting(spec: OffsetSpec, partitions: Iterable[TP], earliest: Mapping[TP, int],
                     latest: Mapping[TP, int], by_time: Mapping[TP, int | None] | None = None,
                     *, strategy: str = "error") -> Offsets:
    """Concrete starting offsets of ``partitions`` for ``spec``. ``earliest``/``latest`` are
    the log start offsets and high watermarks; ``by_time`` the offsets found for the
    spec's timestamps (None: no record at or after it, which is an error unless
    ``strategy`` is "latest"). A specific offset is kept as given, even if below the log
    start (reading it is then data loss) or above the HW (streaming: ``next_end`` holds it
    while the leader's log end reaches it and reports it otherwise; batch: an error)."""
    parts = _existing(spec, partitions, "startingOffsets")
    out: Offsets = {}
    for tp in parts:
        if spec.kind == "earliest":
            out[tp] = earliest[tp]
        elif spec.kind == "latest":
            out[tp] = latest[tp]
        elif spec.kind == "offsets":
            value = spec.offsets.get(tp, EARLIEST)
            out[tp] = earliest[tp] if value == EARLIEST else latest[tp] if value == LATEST else value
        else:
            if spec.kind == "timestamps" and tp not in spec.timestamps:
                out[tp] = earliest[tp]
                continue
            found = (by_time or {}).get(tp)
            if found is None:
                if strategy != "latest":
                    when = spec.timestamp if spec.kind == "timestamp" else spec.timestamps[tp]
                    raise OptionError(f"no record at or after timestamp {when} in topic {tp[0]!r} partition "
                                      f"{tp[1]} (set startingOffsetsByTimestampStrategy=latest to start at "
                                      "the end instead)")
                out[tp] = latest[tp]
            else:
                out[tp] = found
    return out


def resolve_ending(spec: OffsetSpec, partitions: Iterable[TP], latest: Mapping[TP, int],
                   by_time: Mapping[TP, int | None] | None = None) -> Offsets:
    """Concrete ending offsets (batch): ``latest`` is the high watermarks; a specific offset
    above the HW is clamped to it (records above the HW are never read; ``past_the_end``
    names them, so that the read fails or warns instead of being quietly shorter). For
    endingTimestamp / endingOffsetsByTimestamp, ``by_time`` holds the offset of the first
    record at or after the time (the batch stops before it), None when there is none: the
    batch then reads to the end, as Spark's Kafka source does; a partition the timestamps
    do not mention reads to the end too."""
    parts = _existing(spec, partitions, "endingOffsets")
    out: Offsets = {}
    for tp in parts:
        if spec.kind == "offsets":
            value = spec.offsets.get(tp, LATEST)
        elif spec.kind in ("timestamp", "timestamps"):
            found = (by_time or {}).get(tp)
            value = LATEST if found is None else found
        else:
            value = LATEST
        out[tp] = latest[tp] if value == LATEST else min(value, latest[tp])
    return out


def past_the_end(spec: OffsetSpec, latest: Mapping[TP, int]) -> list[str]:
    """The specific endingOffsets above their partition's high watermark, one message each:
    those offsets cannot be read (not there, or not committed yet), so a batch read that
    stops at the HW would be incomplete. Spark's Kafka source reports them as data loss."""
    return [f"topic {tp[0]!r} partition {tp[1]}: endingOffsets {value} is above the high watermark "
            f"{latest[tp]}, offsets [{latest[tp]}, {value}) cannot be read"
            for tp, value in sorted(spec.offsets.items(), key=lambda kv: _key(kv[0]))
            if spec.kind == "offsets" and value != LATEST and tp in latest and value > latest[tp]]


# -- one trigger --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """What ``next_end`` decided: the batch's start with every partition at ``LATEST`` that
    it positioned (``begin``), its end, data loss (``lost``: a vanished partition, already
    dropped from both, or a partition whose log now ends below the query's position, which
    begins and ends at its high watermark), notes worth a warning, and ``size``, the offsets it
    admits from the logs (a new partition's offsets below its log start do not count)."""

    begin: Offsets
    end: Offsets
    lost: list[str]
    notes: list[str]
    size: int = 0


def behind(start: Mapping[TP, int], latest: Mapping[TP, int]) -> list[TP]:
    """The partitions whose high watermark is below the query's position: ``next_end``
    needs their log end offsets."""
    return sorted((tp for tp, hw in latest.items() if hw >= 0 and start.get(tp, 0) > hw), key=_key)


def next_end(start: Mapping[TP, int], latest: Mapping[TP, int], *, max_offsets: int | None = None,
             target: Mapping[TP, int] | None = None, log_end: Mapping[TP, int] | None = None,
             earliest: Mapping[TP, int] | None = None, starting: bool = False) -> Step:
    """The end of the next micro-batch from ``start`` (see the module's rules). ``latest``
    holds the high watermark of every partition the query reads now; ``target`` is the
    AvailableNow target, ``max_offsets`` the ReadMaxRows limit. ``log_end`` holds the log
    end offsets of the partitions ``behind``; one missing from it is held. ``earliest`` holds
    the log start offsets of the partitions new to the query (missing: 0). ``starting``: the
    start is the query's resolved startingOffsets (the first batch)."""
    log_end, earliest = log_end or {}, earliest or {}
    lost = [f"topic {t!r} partition {p} (query at offset {start[(t, p)]}) no longer exists"
            for (t, p) in sorted(set(start) - set(latest), key=_key)]
    notes = []
    begin: Offsets = {}
    avail: dict[TP, int] = {}
    base: Offsets = {}
    for tp in sorted(latest, key=_key):
        s = start.get(tp, 0)
        begin[tp] = s
        hw = latest[tp]
        if target is not None:
            if tp not in target:
                if tp not in start:
                    del begin[tp]  # appeared after the AvailableNow target was taken
                continue
            hw = min(hw, target[tp])
        if s == LATEST:
            if hw < 0:
                continue  # no high watermark known (no leader): not positioned yet
            s = begin[tp] = hw
        if hw < s:
            if latest[tp] >= s:
                continue  # held by the AvailableNow target
            if log_end.get(tp, s) >= s:
                notes.append(f"topic {tp[0]!r} partition {tp[1]}: high watermark {latest[tp]} is below the "
                             f"query's position {s}, log end offset {log_end.get(tp, 'unknown')}; waiting "
                             "for the leader's high watermark to catch up")
                continue
            hw = latest[tp]
            if starting:
                lost.append(f"topic {tp[0]!r} partition {tp[1]}: startingOffsets {s} is above the log end offset "
                            f"{log_end[tp]}; the query starts at the high watermark {hw}")
            else:
                lost.append(f"topic {tp[0]!r} partition {tp[1]}: the offset was changed from {s} to {hw} (the log "
                            f"now ends at {log_end[tp]}, below the query's position: truncated, or the topic was "
                            f"deleted and re-created), some data may have been missed; the query goes on from "
                            f"offset {hw}")
            begin[tp] = hw
            continue
        if tp not in start:  # its records start at its log start: count its share from there
            s = base[tp] = min(max(s, earliest.get(tp, 0)), hw)
        if hw > s:
            avail[tp] = hw - s
    grant = allocate(avail, max_offsets)
    end = {tp: base.get(tp, s) + grant.get(tp, 0) for tp, s in begin.items()}
    return Step(begin, end, lost, notes, sum(grant.values()))


def admit(available: int, *, min_offsets: int | None, max_delay_ms: int, now_ms: int,
          last_admitted_ms: int | None) -> bool:
    """Whether a trigger with ``available`` new offsets runs a batch (minOffsetsPerTrigger /
    maxTriggerDelay, see the module's rules). ``last_admitted_ms`` is when the last batch was
    admitted (None: none yet in this run); the caller records ``now_ms`` when this says yes."""
    if min_offsets is None or last_admitted_ms is None:
        return True
    return now_ms - last_admitted_ms >= max_delay_ms or available >= min_offsets


def allocate(available: Mapping[TP, int], budget: int | None) -> dict[TP, int]:
    """Share ``budget`` offsets among partitions in proportion to ``available`` (largest
    remainder, ties to the partition listed first). The grants never exceed what each
    has, and sum to ``min(budget, total)``; None means no limit."""
    total = sum(available.values())
    if budget is None or budget >= total:
        return dict(available)
    if budget <= 0:
        return {tp: 0 for tp in available}
    grant, remainders = {}, []
    for i, (tp, n) in enumerate(available.items()):
        share, rem = divmod(n * budget, total)
        grant[tp] = share
        remainders.append((-rem, i, tp))
    left = budget - sum(grant.values())
    for _, _, tp in sorted(remainders)[:left]:
        grant[tp] += 1
    return grant


# -- ranges -------------------------------------------------------------------------------------


def plan_ranges(start: Mapping[TP, int], end: Mapping[TP, int], min_partitions: int | None = None,
                max_records: int | None = None) -> list[OffsetRange]:
    """The non-empty ranges ``[start, end)`` of a batch (a partition missing from ``start``
    starts at 0; one at ``LATEST`` is positioned at ``end``: nothing to read), each split into
    pieces of at most ``max_records`` offsets, then split to give at least ``min_partitions``
    ranges when there are that many offsets to split."""
    ranges = []
    for tp in sorted(end, key=_key):
        s, e = start.get(tp, 0), end[tp]
        if e > s and s != LATEST:
            ranges.append(OffsetRange(tp[0], tp[1], s, e))
    return split_ranges(cap_ranges(ranges, max_records), min_partitions)


def cap_ranges(ranges: list[OffsetRange], max_records: int | None) -> list[OffsetRange]:
    """Each range split into ``ceil(size / max_records)`` nearly equal pieces, so no piece
    holds more than ``max_records`` offsets (maxRecordsPerPartition)."""
    if not max_records:
        return list(ranges)
    return [piece for r in ranges for piece in _split_evenly(r, -(-r.size // max_records))]


def _split_evenly(r: OffsetRange, n: int) -> list[OffsetRange]:
    """``r`` in ``n`` consecutive pieces whose sizes differ by at most one offset."""
    size, extra = divmod(r.size, n)
    out, s = [], r.start
    for k in range(n):
        e = s + size + (1 if k < extra else 0)
        out.append(OffsetRange(r.topic, r.partition, s, e))
        s = e
    return out


def split_ranges(ranges: list[OffsetRange], min_partitions: int | None) -> list[OffsetRange]:
    """Split ``ranges`` into ``min(min_partitions, total offsets)`` or more pieces: every
    range keeps at least one piece, the rest go to the ranges with the most offsets per
    piece. Pieces of one range differ in size by at most one offset."""
    if not min_partitions or len(ranges) >= min_partitions:
        return list(ranges)
    want = min(min_partitions, sum(r.size for r in ranges))
    parts = [1] * len(ranges)
    heap = [(-float(r.size), i) for i, r in enumerate(ranges) if r.size > 1]
    heapq.heapify(heap)
    for _ in range(want - len(ranges)):
        _, i = heapq.heappop(heap)
        parts[i] += 1
        if parts[i] < ranges[i].size:
            heapq.heappush(heap, (-(ranges[i].size / parts[i]), i))
    return [piece for r, n in zip(ranges, parts) for piece in _split_evenly(r, n)]


def data_loss_message(r: OffsetRange, lost_from: int, lost_to: int, why: str) -> str:
    """The message of a data-loss failure or warning: topic, partition, the lost offsets
    and the planned range they belong to."""
    return (f"data loss in topic {r.topic!r} partition {r.partition}: offsets [{lost_from}, {lost_to}) "
            f"of the planned range [{r.start}, {r.end}) are no longer available ({why})")
