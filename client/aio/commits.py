"""A group member's commits and the group's committed offsets.

* Commits carry the generation and member id (generation -1 and no member id when the
  partitions were assigned by hand: the coordinator then accepts them only while the group
  has no members). A commit while the member rebalances raises RebalanceInProgressError; one
  from a member no longer in a generation, or one the coordinator refuses because the group
  moved on, raises CommitFailedError saying so and what to do.
* Commits go through one lock in the order they were made, and a partition's offset from an
  older commit is never sent after a newer one's (``not_superseded``, ``coalesce_commit``),
  so the group's committed offsets never go backwards because of reordering; the automatic
  commit sends the consumed positions that differ from the last committed offsets
  (``auto_commit_offsets``), a position moved back by a ``seek`` included, as Kafka does.
* ``commit_async`` commits in the background; its callback runs in a later poll or commit
  (``invoke_completed_commits``), like Kafka's OffsetCommitCallback. Closing waits for the
  commits in flight, within the close's timeout, and runs every callback: one still in
  flight then fails with ClientClosedError (``settle_async_commits``).
* New partitions of a group's assignment start at the committed offset (OffsetFetch), else
  per ``auto_offset_reset`` (``refresh_committed_positions``).

Coordinator moves and lost connections are retried with backoff until the caller's deadline;
the member's generation and the group's reactions (reset, rejoin) come through the
constructor.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

import trio

from tidelog.aio.cluster import Backoff
from tidelog.aio.discovery import CoordinatorLink, GroupRetry
from tidelog.aio.membership import (
    COMMIT_ACTIONS,
    NO_GENERATION_INFO,
    OK,
    REDISCOVER,
    REJOIN,
    RESET_MEMBER,
    RETRY,
    Generation,
    Membership,
    MemberState,
    action_for,
)
from tidelog.aio.subscription import ConsumerConfig, PartitionState, SubscriptionState
from tidelog.errors import (
    BrokerConnectionError,
    ClientClosedError,
    CommitFailedError,
    RebalanceInProgressError,
    RequestTimedOut,
    TidelogError,
    broker_error,
)
from tidelog.protocol.codec import ApiKey
from tidelog.protocol.errors import NONE, for_code
from tidelog.protocol.messages import (
    NO_OFFSET,
    OffsetCommitPartition,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetCommitTopic,
    OffsetFetchRequest,
    OffsetFetchResponse,
    OffsetFetchTopic,
)
from tidelog.protocol.topics import TopicPartition
from tidelog.records import OffsetAndMetadata

__all__ = ["OffsetCommitter", "auto_commit_offsets", "not_superseded", "coalesce_commit",
           "commit_failed_message", "commit_request"]

log = logging.getLogger(__name__)


def auto_commit_offsets(positions: Mapping[TopicPartition, int],
                        committed: Mapping[TopicPartition, int]) -> dict[TopicPartition, int]:
    """The consumed positions an automatic commit sends: those that differ from the last
    committed offset. A position behind it (a ``seek`` back) is committed as it is, as Kafka
    does, so that the records after it are consumed again after a crash."""
    return {tp: pos for tp, pos in positions.items() if pos != committed.get(tp)}


def not_superseded(offsets: Mapping[TopicPartition, int], seq: int,
                   sent_seq: Mapping[TopicPartition, int]) -> dict[TopicPartition, int]:
    """The offsets of commit number ``seq`` still worth sending: a partition whose offset from
    a later commit (higher seq) was already stored is left out, so commits that reach the lock
    out of order never move a committed offset back."""
    return {tp: o for tp, o in offsets.items() if sent_seq.get(tp, 0) < seq}


def coalesce_commit(fresh: Mapping[TopicPartition, int], seq: int, generation: "Generation",
                    requested: Mapping[TopicPartition, tuple[int, int, "Generation"]]
                    ) -> tuple[dict[TopicPartition, int], dict[TopicPartition, int]]:
    """What commit number ``seq`` sends: for each of its partitions the offset of the latest
    commit requested so far for it (``requested``: partition -> (seq, offset, generation)),
    if that commit is of the same generation, else its own. Returns (offsets, seq per
    partition). Commits queued behind one in flight are thus sent together: the later one
    finds its offsets already stored (``not_superseded``) and returns at once; the stored
    offset is the one the latest commit asked for, so nothing moves back."""
    offsets, seqs = {}, {}
    for tp, offset in fresh.items():
        latest = requested.get(tp)
        if latest is not None and latest[0] > seq and latest[2] == generation:
            offsets[tp], seqs[tp] = latest[1], latest[0]
        else:
            offsets[tp], seqs[tp] = offset, seq
    return offsets, seqs


def commit_failed_message(group_id: str, detail: str) -> str:
    return (f"commit of group {group_id!r} failed: the group has rebalanced and the partitions "
            f"were reassigned to other members ({detail}). This happens when the time between "
            "polls is longer than max_poll_interval_ms (processing a batch took too long), or the "
            "member missed its session timeout. Increase max_poll_interval_ms or reduce the work "
            "per poll (max_poll_records); the records after the last successful commit will be "
            "delivered again to the partitions' new owners.")


def commit_request(group_id: str, offsets: Mapping[TopicPartition, int], generation: Generation,
                    group_instance_id: str | None,
                    metadata: Mapping[TopicPartition, str | None] | None = None) -> OffsetCommitRequest:
    """The OffsetCommit of ``offsets``; ``metadata[tp]`` (if any) is stored beside its offset."""
    by_topic: dict[str, list[OffsetCommitPartition]] = {}
    for tp, offset in sorted(offsets.items()):
        md = metadata.get(tp) if metadata else None
        by_topic.setdefault(tp.topic, []).append(OffsetCommitPartition(tp.partition, offset, committed_metadata=md))
    return OffsetCommitRequest(group_id, [OffsetCommitTopic(t, ps) for t, ps in by_topic.items()],
                               generation.generation_id, generation.member_id,
                               group_instance_id if generation.valid else None)


class OffsetCommitter:
    """Commits and committed offsets of one member of ``config.group_id``.

    ``is_managed()``: the partitions come from the group (else from assign());
    ``left_for_poll_timeout()``: the member left for want of a poll (said in the error);
    ``reset_generation(reason)`` and ``request_rejoin(reason)``: what a refused commit asks of
    the member; ``invoke(fn, *args)`` runs commit callbacks; ``wake_fetcher()``: positions
    changed; ``on_fatal(error)``: raised by the next poll; ``start_soon(fn)``: a background task."""

    def __init__(self, config: ConsumerConfig, link: CoordinatorLink, member: Membership,
                 subscriptions: SubscriptionState, *, is_managed: Callable[[], bool],
                 left_for_poll_timeout: Callable[[], bool], reset_generation: Callable[[str], None],
                 request_rejoin: Callable[[str], None], invoke: Callable[..., Awaitable[Any]],
                 wake_fetcher: Callable[[], None], on_fatal: Callable[[TidelogError], None],
                 start_soon: Callable[[Callable[[], Awaitable[None]]], None]):
        self.config = config
        self.group_id = config.group_id
        self.subscriptions = subscriptions
        self.committed: dict[TopicPartition, int] = {}  # the group's committed offsets as last seen
        self._link = link
        self._member = member
        self._is_managed = is_managed
        self._left_for_poll_timeout = left_for_poll_timeout
        self._reset_generation = reset_generation
        self._request_rejoin = request_rejoin
        self._invoke = invoke
        self._wake_fetcher = wake_fetcher
        self._on_fatal = on_fatal
        self._start_soon = start_soon
        self._backoff_s = config.retry_backoff_ms / 1000
        self._backoff_max_s = config.retry_backoff_max_ms / 1000
        self._commit_lock = trio.Lock()
        self._commit_seq = 0
        self._sent_seq: dict[TopicPartition, int] = {}
        self._requested: dict[TopicPartition, tuple[int, int, Generation]] = {}  # latest commit asked
        self._requested_metadata: dict[TopicPartition, str | None] = {}  # and its metadata string
        self._completed_commits: list[tuple[Callable, dict, BaseException | None]] = []
        # the async commits in flight, by number: their callback (or None) and reported offsets
        self._async_in_flight: dict[int, tuple[Callable | None, dict]] = {}
        self._async_settled = trio.Event()  # set (and replaced) as one of them ends
        self._async_count = 0
        self._next_auto_commit = time.monotonic() + config.auto_commit_interval_ms / 1000

    def _commit_generation(self) -> Generation:
        if not self._is_managed():
            return NO_GENERATION_INFO  # manual assignment: allowed while the group is empty
        if self._member.rebalancing:
            raise RebalanceInProgressError(
                f"commit of group {self.group_id!r} not done: the group is rebalancing. Call poll() "
                "to complete the rebalance (on_partitions_revoked is the place to commit before "
                "partitions move), then commit again.")
        if not self._member.generation.valid:
            raise CommitFailedError(commit_failed_message(
                self.group_id, "this member is no longer part of an active generation"
                + (": it left after max_poll_interval_ms without a poll" if self._left_for_poll_timeout() else "")))
        return self._member.generation

    async def commit(self, offsets: Mapping[TopicPartition, int], deadline: float,
                     metadata: Mapping[TopicPartition, str | None] | None = None) -> None:
        """Commit ``offsets`` (the next offset to read, per partition) with ``metadata``'s
        string per partition (none: no metadata) and wait for the coordinator's answer,
        retrying coordinator moves until ``deadline`` (trio time). A partition's metadata
        travels with its offset: when a later commit's offset is sent instead (see
        ``coalesce_commit``), so is that commit's metadata."""
        if not offsets:
            return
        for tp, offset in offsets.items():
            if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
                raise ValueError(f"offset to commit for {tp} must be an int >= 0, got {offset!r}")
        for tp, md in (metadata or {}).items():
            if md is not None and not isinstance(md, str):
                raise ValueError(f"metadata to commit for {tp} must be a str or None, got {type(md).__name__}")
        self._commit_seq += 1
        seq = self._commit_seq
        generation = self._commit_generation()
        for tp, offset in offsets.items():
            self._requested[tp] = (seq, offset, generation)
            self._requested_metadata[tp] = metadata.get(tp) if metadata else None
        with trio.move_on_at(deadline) as waiting:  # an earlier commit may hold the lock: wait only this long
            await self._commit_lock.acquire()
        if waiting.cancelled_caught:
            raise RequestTimedOut(f"commit of group {self.group_id!r} did not start in time: an earlier "
                                  "commit of this consumer was still waiting for the coordinator")
        try:
            fresh = not_superseded(offsets, seq, self._sent_seq)
            if not fresh:
                return
            sending, seqs = coalesce_commit(fresh, seq, generation, self._requested)
            sending_metadata = {tp: (metadata.get(tp) if metadata else None) if seqs[tp] == seq
                                else self._requested_metadata.get(tp) for tp in sending}
            await self._commit_with_retries(sending, generation, deadline, sending_metadata)
            for tp, offset in sending.items():
                self._sent_seq[tp] = max(self._sent_seq.get(tp, 0), seqs[tp])
                self.committed[tp] = offset
        finally:
            self._commit_lock.release()

    async def _commit_with_retries(self, offsets: dict[TopicPartition, int], generation: Generation,
                                   deadline: float, metadata: Mapping[TopicPartition, str | None]) -> None:
        backoff = Backoff(self._backoff_s, self._backoff_max_s)
        last: BaseException | None = None
        while True:
            if generation != NO_GENERATION_INFO and generation != self._member.generation:
                raise CommitFailedError(commit_failed_message(self.group_id, "the member's generation changed"))
            remaining = deadline - trio.current_time()
            if remaining <= 0:
                raise RequestTimedOut(f"commit of group {self.group_id!r} did not complete in time "
                                      f"(last error: {last or 'none'})")
            try:
                with trio.fail_after(remaining):
                    await self._link.ensure(deadline)
                    r = await self._link.request(commit_request(self.group_id, offsets, generation,
                                                                self.config.group_instance_id, metadata),
                                                        ApiKey.OFFSET_COMMIT,
                                                        min(remaining, self.config.request_timeout_ms / 1000))
                self._absorb_commit(r, generation)
                return
            except trio.TooSlowError:
                last = RequestTimedOut("the coordinator did not answer")
            except GroupRetry as e:
                last = e
                if e.rediscover:
                    self._link.mark_unknown(str(e))
            with trio.move_on_at(deadline):
                await trio.sleep(backoff.next_delay())

    def _absorb_commit(self, r: OffsetCommitResponse, generation: Generation) -> None:
        for t in r.topics:
            for p in t.partitions:
                action = action_for(COMMIT_ACTIONS, p.error_code)
                if action == OK:
                    continue
                name = for_code(p.error_code).name
                if action in (RETRY, REDISCOVER):
                    raise GroupRetry(f"OffsetCommit {t.name}-{p.partition_index}: {name}", rediscover=action == REDISCOVER)
                if action == RESET_MEMBER and generation.valid:
                    if generation == self._member.generation:
                        self._reset_generation(f"OffsetCommit: {name}")
                    raise CommitFailedError(commit_failed_message(self.group_id, f"the coordinator answered {name}"),
                                            error=for_code(p.error_code))
                if action == RESET_MEMBER:
                    raise CommitFailedError(
                        f"commit of group {self.group_id!r} refused ({name}): the group has active members, "
                        "and a consumer with assign() (no group membership) can commit offsets to a group "
                        "only while it has none. Use another group_id, or subscribe() to join the group.",
                        error=for_code(p.error_code))
                if action == REJOIN and generation.valid:
                    self._request_rejoin("the coordinator is rebalancing the group")
                    raise RebalanceInProgressError(
                        f"commit of group {self.group_id!r} not done: the group started rebalancing. "
                        "Call poll() to complete the rebalance, then commit again (or commit in "
                        "on_partitions_revoked).")
                raise broker_error(p.error_code, f"group {self.group_id!r} commit for {t.name}-{p.partition_index}",
                                   p.error_message)

    def commit_async(self, offsets: Mapping[TopicPartition, int], callback: Callable | None,
                     metadata: Mapping[TopicPartition, str | None] | None = None,
                     reported: Mapping[TopicPartition, Any] | None = None) -> None:
        """Send a commit in the background; ``callback(offsets, error_or_None)`` runs in a
        later poll (or commit), like Kafka's OffsetCommitCallback (``offsets``: ``reported``,
        the application's own mapping, if given)."""
        offsets = dict(offsets)
        report = dict(offsets if reported is None else reported)
        self._async_count += 1
        number = self._async_count
        self._async_in_flight[number] = (callback, report)

        async def run() -> None:
            error: BaseException | None = None
            try:
                await self.commit(offsets, trio.current_time() + self.config.request_timeout_ms / 1000, metadata)
            except TidelogError as e:
                error = e
                log.warning("group %r: asynchronous commit failed: %s", self.group_id, e)
            finally:
                mine = self._async_in_flight.pop(number, None)  # None: abandoned (reported)
                settled, self._async_settled = self._async_settled, trio.Event()
                settled.set()
            if mine is not None and callback is not None:
                self._completed_commits.append((callback, report, error))

        self._start_soon(run)

    async def invoke_completed_commits(self) -> None:
        """Run the callbacks of the commits completed since, in order; the first exception a
        callback raises propagates (the callbacks behind it run at the next call)."""
        await self._run_completed_callbacks(keep_going=False)

    async def _run_completed_callbacks(self, *, keep_going: bool) -> Exception | None:
        """The one loop over the completed commits' callbacks, in completion order. With
        ``keep_going`` every callback runs even after one raised: the first exception is
        returned and the later ones are logged; without, the first one propagates."""
        first: Exception | None = None
        while self._completed_commits:
            callback, offsets, error = self._completed_commits.pop(0)
            try:
                await self._invoke(callback, offsets, error)
            except Exception as e:
                if not keep_going:
                    raise
                if first is None:
                    first = e
                else:
                    log.warning("group %r: a commit callback raised while closing: %r", self.group_id, e)
        return first

    async def settle_async_commits(self, deadline: float) -> Exception | None:
        """Closing, as Kafka's close: wait while async commits are in flight, until
        ``deadline`` (trio time); those still in flight then fail with ClientClosedError
        (their tasks report nothing more). Then every callback runs, even after one raised:
        the first exception raised is returned, for close to raise once it is done."""
        with trio.move_on_at(deadline):
            while self._async_in_flight:
                await self._async_settled.wait()
        cut_short = ClientClosedError(f"the consumer closed before its commit to group {self.group_id!r} "
                                      "completed (close's timeout)")
        for callback, report in self._async_in_flight.values():
            if callback is not None:
                self._completed_commits.append((callback, report, cut_short))
        self._async_in_flight.clear()
        return await self._run_completed_callbacks(keep_going=True)

    def maybe_auto_commit(self) -> None:
        if not self.config.enable_auto_commit:
            return
        now = time.monotonic()
        if now < self._next_auto_commit:
            return
        self._next_auto_commit = now + self.config.auto_commit_interval_ms / 1000
        if self._is_managed() and (self._member.state is not MemberState.STABLE or not self._member.generation.valid):
            return
        offsets = auto_commit_offsets(self.subscriptions.consumed_positions(), self.committed)
        if offsets:
            self.commit_async(offsets, None)

    async def fetch_committed(self, partitions: Iterable[TopicPartition], deadline: float
                              ) -> dict[TopicPartition, int | None]:
        """The group's committed offset of each partition (None: nothing committed)."""
        found = await self.fetch_committed_metadata(partitions, deadline)
        return {tp: None if c is None else c.offset for tp, c in found.items()}

    async def fetch_committed_metadata(self, partitions: Iterable[TopicPartition], deadline: float
                                       ) -> dict[TopicPartition, OffsetAndMetadata | None]:
        """The group's committed offset and metadata string of each partition (None: nothing
        committed)."""
        wanted = list(dict.fromkeys(partitions))
        if not wanted:
            return {}
        by_topic: dict[str, list[int]] = {}
        for tp in wanted:
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        request = OffsetFetchRequest(self.group_id, [OffsetFetchTopic(t, ps) for t, ps in by_topic.items()])
        backoff = Backoff(self._backoff_s, self._backoff_max_s)
        last: BaseException | None = None
        while True:
            if not await self._link.ensure(deadline):
                raise RequestTimedOut(f"no coordinator for group {self.group_id!r} found in time "
                                      f"(last error: {last or 'none'})")
            try:
                r: OffsetFetchResponse = await self._link.request(
                    request, ApiKey.OFFSET_FETCH,
                    max(0.001, min(deadline - trio.current_time(), self.config.request_timeout_ms / 1000)))
                return self._absorb_offset_fetch(r, set(wanted))
            except GroupRetry as e:
                last = e
                if e.rediscover:
                    self._link.mark_unknown(str(e))
            if trio.current_time() + backoff.initial_s >= deadline:
                raise RequestTimedOut(f"committed offsets of group {self.group_id!r} not fetched in time "
                                      f"(last error: {last})")
            with trio.move_on_at(deadline):
                await trio.sleep(backoff.next_delay())

    def _absorb_offset_fetch(self, r: OffsetFetchResponse, wanted: set[TopicPartition]
                             ) -> dict[TopicPartition, OffsetAndMetadata | None]:
        errors = [r.error_code] + [p.error_code for t in r.topics for p in t.partitions]
        for code in errors:
            if code == NONE.code:
                continue
            action = action_for(COMMIT_ACTIONS, code)
            if action in (RETRY, REDISCOVER):
                raise GroupRetry(f"OffsetFetch: {for_code(code).name}", rediscover=action == REDISCOVER)
            raise broker_error(code, f"group {self.group_id!r} (OffsetFetch)")
        out: dict[TopicPartition, OffsetAndMetadata | None] = {tp: None for tp in wanted}
        for t in r.topics:
            for p in t.partitions:
                tp = TopicPartition(t.name, p.partition_index)
                if tp in wanted and p.committed_offset != NO_OFFSET:
                    out[tp] = OffsetAndMetadata(p.committed_offset, p.metadata or "", p.committed_leader_epoch)
        return out

    async def refresh_committed_positions(self) -> None:
        """New partitions start at the committed offset, else per auto_offset_reset."""
        waiting = self.subscriptions.awaiting_committed()
        asked = {tp: self.subscriptions.partitions[tp] for tp in waiting}
        try:
            found = await self.fetch_committed(waiting, trio.current_time() + self.config.request_timeout_ms / 1000)
        except (RequestTimedOut, BrokerConnectionError) as e:
            log.debug("group %r: committed offsets not fetched yet: %s", self.group_id, e)
            return
        except TidelogError as e:
            self._on_fatal(e)
            return
        for tp, offset in found.items():
            self.start_at_committed(tp, asked[tp], offset)
        self._wake_fetcher()

    def start_at_committed(self, tp: TopicPartition, asked: PartitionState, offset: int | None) -> None:
        """A partition awaiting its committed offset starts there (``offset`` None: per
        auto_offset_reset), unless it was revoked (maybe assigned again: it asks again) or the
        application seeked meanwhile (``asked``: its state when the lookup started)."""
        state = self.subscriptions.partitions.get(tp)
        if state is not asked or not state.awaiting_committed:
            return
        if offset is not None:
            self.committed[tp] = offset
            state.seek(offset)
        else:
            self.subscriptions.reset_to_default(tp)
