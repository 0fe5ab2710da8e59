"""What a consumer is configured with and what it has been assigned: pure, no I/O, no clock.

* ``ConsumerConfig`` holds every option of a consumer (Kafka's names) and checks them once.
* ``PartitionState`` is one assigned partition: the *position* (the offset of the next
  record ``poll`` returns), a pending *reset* (earliest/latest, from ``auto_offset_reset``,
  ``seek_to_beginning``/``seek_to_end`` or an out-of-range error), the *fetch offset* (where
  the next fetch starts: the position, or just past data already buffered), the buffered
  fetch results, and a *generation* that every seek bumps: a fetch or offset lookup answered
  for an older generation is discarded, so a seek is never undone by a response that was
  already on its way.
* ``SubscriptionState`` is the assignment: partitions kept across a new assignment keep
  their state; new ones start with a pending reset, or (a group's assignment) *awaiting
  their committed offset*: neither fetched nor reset until the coordinator's OffsetFetch
  answers, and with nothing committed they fall back to ``auto_offset_reset``.

The fetcher (``tidelog.aio.fetcher``) and the group member (``tidelog.aio.group``) both work
on this state; neither imports the other.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tidelog.aio.assignors import assignors_for
from tidelog.protocol.messages import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP
from tidelog.protocol.topics import TopicPartition
from tidelog.security import SecurityConfig

if TYPE_CHECKING:
    from tidelog.aio.fetcher import CompletedFetch
    from tidelog.records import Record

__all__ = ["ConsumerConfig", "PartitionState", "SubscriptionState", "RESET_STRATEGIES"]

RESET_STRATEGIES = {"earliest": EARLIEST_TIMESTAMP, "latest": LATEST_TIMESTAMP, "none": None}


@dataclass(frozen=True, slots=True)
class ConsumerConfig(SecurityConfig):
    """Every consumer option, with Kafka's name and default (the security options are
    ``SecurityConfig``'s)."""

    bootstrap_servers: str | Sequence[str] = "localhost:9092"
    client_id: str | None = None
    group_id: str | None = None
    group_instance_id: str | None = None  # static membership
    session_timeout_ms: int = 45000
    heartbeat_interval_ms: int = 3000
    max_poll_interval_ms: int = 300000
    rebalance_timeout_ms: int | None = None  # None: max_poll_interval_ms, as in Kafka
    partition_assignment_strategy: tuple[str, ...] | str = ("range", "cooperative-sticky")
    enable_auto_commit: bool = True
    auto_commit_interval_ms: int = 5000
    exclude_internal_topics: bool = True
    auto_offset_reset: str = "latest"
    fetch_min_bytes: int = 1
    fetch_max_wait_ms: int = 500
    fetch_max_bytes: int = 50 << 20
    max_partition_fetch_bytes: int = 1 << 20
    max_poll_records: int = 500
    request_timeout_ms: int = 30000
    default_api_timeout_ms: int = 60000
    retry_backoff_ms: int = 100
    retry_backoff_max_ms: int = 1000
    metadata_max_age_ms: int = 300000
    check_crcs: bool = True
    allow_auto_create_topics: bool = False

    def __post_init__(self) -> None:
        SecurityConfig.__post_init__(self)
        if self.auto_offset_reset not in RESET_STRATEGIES:
            raise ValueError(f"auto_offset_reset must be 'earliest', 'latest' or 'none', "
                             f"got {self.auto_offset_reset!r}")
        self._check_group_options()
        for name in ("fetch_max_wait_ms", "fetch_min_bytes", "retry_backoff_ms"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        for name in ("fetch_max_bytes", "max_partition_fetch_bytes", "max_poll_records",
                     "request_timeout_ms", "default_api_timeout_ms", "session_timeout_ms",
                     "heartbeat_interval_ms", "max_poll_interval_ms", "auto_commit_interval_ms"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0")

    def _check_group_options(self) -> None:
        if self.group_id is not None and (not isinstance(self.group_id, str) or not self.group_id):
            raise ValueError(f"group_id must be a non-empty string, got {self.group_id!r}")
        if self.group_instance_id is not None and self.group_id is None:
            raise ValueError("group_instance_id (static membership) needs a group_id")
        if self.group_instance_id is not None and not self.group_instance_id:
            raise ValueError("group_instance_id must be a non-empty string")
        if self.heartbeat_interval_ms >= self.session_timeout_ms:
            raise ValueError(f"heartbeat_interval_ms ({self.heartbeat_interval_ms}) must be lower than "
                             f"session_timeout_ms ({self.session_timeout_ms}); a third of it is usual")
        if self.rebalance_timeout_ms is not None and self.rebalance_timeout_ms <= 0:
            raise ValueError("rebalance_timeout_ms must be > 0")
        assignors_for(self.partition_assignment_strategy)  # ValueError for an unknown name



@dataclass(slots=True)
class PartitionState:
    position: int | None = None
    reset: int | None = None  # EARLIEST_TIMESTAMP / LATEST_TIMESTAMP pending
    fetch_offset: int | None = None
    generation: int = 0
    high_watermark: int = -1
    # the last fetch said the leader's ISR is below the effective min ISR: the high watermark
    # cannot move, so newer records stay invisible until the ISR grows back
    high_watermark_held: bool = False
    log_start_offset: int = -1
    retry_at: float = 0.0
    stopped: bool = False  # an error was raised; waits for a seek
    awaiting_committed: bool = False  # assigned by the group: the committed offset is looked up first
    fetching: bool = False
    resetting: bool = False
    # its last answer was empty below the high watermark while it was not first in its
    # fetch request: the next request to its leader puts it first (see handle_partition_response)
    fetch_first: bool = False
    paused: bool = False  # pause(): not fetched, its buffered records not returned, until resume()
    buffered: deque[CompletedFetch] = field(default_factory=deque)

    @property
    def has_position(self) -> bool:
        return self.position is not None and self.reset is None

    def seek(self, offset: int) -> None:
        self.position = self.fetch_offset = offset
        self.reset = None
        self.stopped = False
        self.awaiting_committed = False
        self.generation += 1
        self.buffered.clear()
        self.retry_at = 0.0

    def request_reset(self, strategy: int) -> None:
        self.reset = strategy
        self.stopped = False
        self.awaiting_committed = False
        self.generation += 1
        self.buffered.clear()


def rewind_offsets(records: Iterable[Record]) -> dict[TopicPartition, int]:
    """Where each partition of ``records`` (in offset order per partition) must go back to
    for all of them to be fetched again: the offset of its first one."""
    out: dict[TopicPartition, int] = {}
    for r in records:
        out.setdefault(TopicPartition(r.topic, r.partition), r.offset)
    return out


class SubscriptionState:
    """The assigned partitions and their positions. Pure: no I/O, no clock.

    The *unreturned* records are records a poll took from the fetcher that the application
    has not been handed yet: the rest of a poll's records an iterator (``for record in
    consumer``, ``getone``) yields one at a time, and the records of a poll whose caller left
    (an asyncio poll cancelled). A partition's position is past them, but what was
    *consumed* is not: commits (``consumed_positions``) and ``position`` count from the first
    of them, as kafka-python's iterator moves the position record by record; ``seek``,
    ``pause`` and a new assignment drop them (``give_back``), and the next poll returns
    them before fetching (``take_unreturned``), oldest first.

    The facades reach them from their own threads (an iterator's thread, the asyncio loop
    that takes a cancelled poll's records back) while the client's loop thread commits and
    seeks: every access to them holds ``_unreturned_lock`` (never held across a wait)."""

    def __init__(self, default_reset: int | None):
        self.default_reset = default_reset
        self.partitions: dict[TopicPartition, PartitionState] = {}
        self._rotation = 0
        self._unreturned: deque[Record] = deque()
        self._unreturned_lock = threading.Lock()

    @property
    def has_unreturned(self) -> bool:
        return bool(self._unreturned)

    def take_unreturned(self, limit: int) -> list[Record]:
        """Up to ``limit`` of the unreturned records, oldest first (see the class docstring)."""
        with self._unreturned_lock:
            unreturned = self._unreturned
            return [unreturned.popleft() for _ in range(min(limit, len(unreturned)))]

    def next_unreturned(self) -> Record | None:
        """The oldest unreturned record, taken; None when there is none."""
        with self._unreturned_lock:
            return self._unreturned.popleft() if self._unreturned else None

    def put_back(self, records: Sequence[Record]) -> None:
        """``records``, taken from the fetcher (or from here) before every record held here
        now, are unreturned again, ahead of those."""
        if records:
            with self._unreturned_lock:
                self._unreturned.extendleft(reversed(records))

    def give_back(self, tps: Iterable[TopicPartition] | None = None, rewind: bool = True) -> bool:
        """Drop the unreturned records of ``tps`` (None: all) and, with ``rewind``, move each
        assigned partition among them back to its first one (fetched again); whether any
        partition moved (the fetches are to be planned again)."""
        if not self._unreturned:
            return False
        wanted = None if tps is None else set(tps)
        with self._unreturned_lock:
            dropped: list[Record] = []
            kept: list[Record] = []
            for r in self._unreturned:
                (dropped if wanted is None or TopicPartition(r.topic, r.partition) in wanted else kept).append(r)
            if not dropped:
                return False
            self._unreturned.clear()
            self._unreturned.extend(kept)
        moved = False
        for tp, offset in rewind_offsets(dropped).items() if rewind else ():
            if tp in self.partitions:
                self.partitions[tp].seek(offset)
                moved = True
        return moved

    def consumed_position(self, tp: TopicPartition) -> int | None:
        """The partition's position less what was not returned yet: the next offset the
        application is handed."""
        if self._unreturned:
            with self._unreturned_lock:
                for r in self._unreturned:
                    if r.partition == tp.partition and r.topic == tp.topic:
                        return r.offset
        state = self.partitions.get(tp)
        return state.position if state is not None and state.has_position else None

    def assign(self, tps: Iterable[TopicPartition], need_committed: bool = False) -> None:
        """Replace the assignment; partitions kept keep their state, new ones need a position:
        from ``auto_offset_reset``, or (``need_committed``, a group's assignment) from the
        group's committed offset first."""
        wanted = list(dict.fromkeys(TopicPartition(*tp) for tp in tps))
        self.partitions = {tp: self.partitions.get(tp) or self._new_state(need_committed) for tp in wanted}
        if self._unreturned:  # a partition no longer assigned is not yielded any more
            with self._unreturned_lock:
                held = set(rewind_offsets(self._unreturned))
            self.give_back(held - self.partitions.keys(), rewind=False)

    def _new_state(self, need_committed: bool = False) -> PartitionState:
        state = PartitionState()
        if need_committed:
            state.awaiting_committed = True
        elif self.default_reset is not None:
            state.reset = self.default_reset
        return state

    def reset_to_default(self, tp: TopicPartition) -> None:
        """No committed offset: start per auto_offset_reset (or stay without a position)."""
        state = self.partitions[tp]
        state.awaiting_committed = False
        if self.default_reset is not None:
            state.request_reset(self.default_reset)

    def awaiting_committed(self) -> list[TopicPartition]:
        return [tp for tp, s in self.partitions.items() if s.awaiting_committed]

    def consumed_positions(self) -> dict[TopicPartition, int]:
        """The consumed position of every partition that has one (less the unreturned
        records): what a commit of the consumer's positions sends."""
        positions = {tp: s.position for tp, s in self.partitions.items() if s.has_position}
        if self._unreturned:
            with self._unreturned_lock:
                firsts = rewind_offsets(self._unreturned)
            positions.update((tp, offset) for tp, offset in firsts.items() if tp in positions)
        return positions

    def state(self, tp: TopicPartition) -> PartitionState:
        try:
            return self.partitions[tp]
        except KeyError:
            raise ValueError(f"partition {tp} is not assigned to this consumer") from None

    def metrics(self) -> dict[str, int]:
        """The consumer's partition gauges: how many are assigned, the largest lag (high
        watermark minus position) over those with both, and how many have a held high
        watermark (records written to them are invisible until their ISR grows back)."""
        lags = [s.high_watermark - s.position for s in self.partitions.values()
                if s.high_watermark >= 0 and s.position is not None]
        return {"assigned_partitions": len(self.partitions), "records_lag_max": max(lags, default=0),
                "partitions_high_watermark_held": sum(s.high_watermark_held for s in self.partitions.values())}

    def needing_reset(self) -> list[TopicPartition]:
        return [tp for tp, s in self.partitions.items() if s.reset is not None and not s.resetting]

    def missing_position(self) -> list[TopicPartition]:
        """Partitions with neither a position nor a pending reset (auto_offset_reset none)."""
        return [tp for tp, s in self.partitions.items()
                if s.position is None and s.reset is None and not s.awaiting_committed]

    def fetchable(self, now: float) -> list[TopicPartition]:
        return [tp for tp, s in self.partitions.items()
                if s.has_position and not s.fetching and not s.buffered and not s.stopped
                and not s.paused and s.retry_at <= now]

    def rotation(self) -> list[TopicPartition]:
        """The assigned partitions, starting one further along each call (fair polling)."""
        tps = list(self.partitions)
        if not tps:
            return tps
        self._rotation = (self._rotation + 1) % len(tps)
        return tps[self._rotation:] + tps[:self._rotation]

